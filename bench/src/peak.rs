//! This machine's compute peaks with the widest vectors the CPU has (AVX-512F, else
//! AVX2), chosen at run time: the f32 FMA peak, the compute floor of the matrix products,
//! which a GEMM runs at that width whatever width the JIT's own code has; and the rate of
//! independent multiply/add chains at that width, the element-wise rows' *wide* floor
//! (the same probe as the 128-bit one in `machine.rs`, [`ComputePeak`] both).
//!
//! The loops are hand-written assembly (`std::arch::asm!`), not intrinsics: the probe
//! must be exactly the instructions it names, 12 chains in 14 registers, whatever the
//! compiler would make of intrinsics. The assembler takes the instructions whatever the
//! compile-time target; `is_x86_feature_detected!` decides at run time whether they may
//! run.

use std::time::Instant;

/// Independent accumulator chains of the FMA loop. An FMA's latency is 4 cycles on
/// current x86 cores and there are at most 2 FMA pipes, so at most 8 chains are in
/// flight at the throughput; 12 leave room for a 5-6 cycle latency, and with the
/// multiplier and addend they take 14 of the 16 registers every x86-64 has (no
/// AVX-512-only register named, so the clobbers need no target feature).
pub(crate) const CHAINS: usize = 12;

/// This machine's f32 FMA peak with its widest vectors, on one thread and on all of
/// them. FLOP/s count an FMA as 2 operations per lane, as GEMM FLOP counts (`2*M*N*K`)
/// do.
#[derive(Clone, Debug, PartialEq)]
pub struct FmaPeak {
    /// What was measured: `AVX-512F zmm FMA`, `AVX2+FMA ymm FMA`, or, where the CPU has
    /// neither, `f32x4 mul+add` (the 128-bit probe's figure, converted to FLOP/s).
    pub isa: &'static str,
    /// f32 lanes of one vector: 16, 8 or 4.
    pub lanes: usize,
    /// Independent chains of the loop.
    pub chains: usize,
    /// Trials; each figure is the best of them.
    pub trials: usize,
    /// The threads of the "all threads" figure.
    pub threads: usize,
    /// f32 FLOP/s on one thread.
    pub flops_1t: f64,
    /// f32 FLOP/s on `threads` threads together.
    pub flops_all: f64,
}

/// A peak rate of independent f32 multiply/add chains (`a = a * m + c`, a multiply and
/// an add each step, no FMA), on one thread and on all of them: the 128-bit probe
/// (`measure_compute_peak`, the JIT's width today) and the same probe with the widest
/// vectors ([`measure_wide_compute_peak`]). A vector operation is one multiply or one
/// add of `lanes` f32.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputePeak {
    /// What was measured: `f32x4 mul/add` (SSE, as compiled for baseline x86-64),
    /// `AVX-512F zmm mul/add`, `AVX2 ymm mul/add`.
    pub isa: &'static str,
    /// f32 lanes of one vector operation: 4, 8 or 16.
    pub lanes: usize,
    /// Independent chains of the loop.
    pub chains: usize,
    /// Trials; each figure is the best of them.
    pub trials: usize,
    /// The threads of the "all threads" figure.
    pub threads: usize,
    /// Vector operations a second on one thread.
    pub ops_1t: f64,
    /// Vector operations a second on `threads` threads together.
    pub ops_all: f64,
}

impl ComputePeak {
    /// Lane operations (f32 multiplies or adds) a second on all threads: `lanes` per
    /// vector operation. The unit in which probes of different widths compare, and the
    /// FLOP/s to set beside [`FmaPeak::flops_all`].
    pub fn flops_all(&self) -> f64 {
        self.lanes as f64 * self.ops_all
    }

    /// The same on one thread.
    pub fn flops_1t(&self) -> f64 {
        self.lanes as f64 * self.ops_1t
    }
}

/// The widest FMA the CPU offers, detected at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    /// AVX-512F: 16 f32 lanes (zmm).
    Zmm,
    /// AVX2 and FMA: 8 f32 lanes (ymm).
    Ymm,
}

impl Width {
    #[cfg(target_arch = "x86_64")]
    fn detect() -> Option<Width> {
        if std::arch::is_x86_feature_detected!("avx512f") {
            Some(Width::Zmm)
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            Some(Width::Ymm)
        } else {
            None
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> Option<Width> {
        None
    }

    fn lanes(self) -> usize {
        match self {
            Width::Zmm => 16,
            Width::Ymm => 8,
        }
    }

    fn isa(self) -> &'static str {
        match self {
            Width::Zmm => "AVX-512F zmm FMA",
            Width::Ymm => "AVX2+FMA ymm FMA",
        }
    }

    fn mul_add_isa(self) -> &'static str {
        match self {
            Width::Zmm => "AVX-512F zmm mul/add",
            Width::Ymm => "AVX2 ymm mul/add",
        }
    }
}

/// The loop of [`fma_chains`] for one register prefix (`zmm`, `ymm`): 12 chains
/// `acc = acc * m + c` (`vfmadd213ps`), then lane 0 of the last chain out. The chains
/// start at `c` and converge to `c / (1 - m)` = 1: no overflow, no subnormals.
#[cfg(target_arch = "x86_64")]
macro_rules! fma_loop {
    ($r:literal, $iterations:expr, $m:expr, $c:expr) => {{
        let lane0: u32;
        // SAFETY: the caller detected the instruction set ([`Width::detect`]); the
        // block reads and writes only the registers it names: vector registers 0-13,
        // all declared clobbered (an xmm clobber is the whole zmm/ymm register), the
        // counter and the two inputs' general registers, and the flags (not declared
        // preserved); it touches no memory and no stack, and `vzeroupper` leaves the
        // upper halves clean for SSE code after it.
        unsafe {
            std::arch::asm!(
                concat!("vmovd xmm12, {m:e}"),
                concat!("vbroadcastss ", $r, "12, xmm12"),
                concat!("vmovd xmm13, {c:e}"),
                concat!("vbroadcastss ", $r, "13, xmm13"),
                concat!("vmovaps ", $r, "0, ", $r, "13"),
                concat!("vmovaps ", $r, "1, ", $r, "13"),
                concat!("vmovaps ", $r, "2, ", $r, "13"),
                concat!("vmovaps ", $r, "3, ", $r, "13"),
                concat!("vmovaps ", $r, "4, ", $r, "13"),
                concat!("vmovaps ", $r, "5, ", $r, "13"),
                concat!("vmovaps ", $r, "6, ", $r, "13"),
                concat!("vmovaps ", $r, "7, ", $r, "13"),
                concat!("vmovaps ", $r, "8, ", $r, "13"),
                concat!("vmovaps ", $r, "9, ", $r, "13"),
                concat!("vmovaps ", $r, "10, ", $r, "13"),
                concat!("vmovaps ", $r, "11, ", $r, "13"),
                "2:",
                concat!("vfmadd213ps ", $r, "0, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "1, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "2, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "3, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "4, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "5, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "6, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "7, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "8, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "9, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "10, ", $r, "12, ", $r, "13"),
                concat!("vfmadd213ps ", $r, "11, ", $r, "12, ", $r, "13"),
                "dec {n}",
                "jnz 2b",
                "vmovd {lane0:e}, xmm11",
                "vzeroupper",
                n = inout(reg) $iterations => _,
                m = in(reg) $m,
                c = in(reg) $c,
                lane0 = lateout(reg) lane0,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _,
                options(nomem, nostack),
            );
        }
        lane0
    }};
}

/// `iterations` (at least 1) steps of [`CHAINS`] FMA chains at `width`; returns lane 0
/// of the last chain (about 1.0), so a test can see the loop computed.
#[cfg(target_arch = "x86_64")]
fn fma_chains(width: Width, iterations: u64) -> f32 {
    let iterations = iterations.max(1); // `dec; jnz` from 0 would run 2^64 times
    let (m, c) = (0.999_f32.to_bits(), 0.001_f32.to_bits());
    let lane0 = match width {
        Width::Zmm => fma_loop!("zmm", iterations, m, c),
        Width::Ymm => fma_loop!("ymm", iterations, m, c),
    };
    f32::from_bits(lane0)
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_chains(_: Width, _: u64) -> f32 {
    unreachable!("Width::detect finds no wide FMA off x86-64")
}

/// The loop of [`mul_add_chains`] for one register prefix (`zmm`, `ymm`): 12
/// chains `acc = acc * m + c` as a multiply then an add (`vmulps`, `vaddps`: the
/// operations the JIT's vector code is made of, and no FMA), then lane 0 of the last
/// chain out. With a multiply and an add of 3-4 cycles each, 12 chains keep 24
/// operations in flight, enough for 2-4 vector pipes. Same registers as [`fma_loop`].
#[cfg(target_arch = "x86_64")]
macro_rules! mul_add_loop {
    ($r:literal, $iterations:expr, $m:expr, $c:expr) => {{
        let lane0: u32;
        // SAFETY: as for `fma_loop!`: the caller detected the instruction set
        // ([`Width::detect`]); the block reads and writes only the
        // registers it names (vector registers 0-13, declared clobbered; the counter
        // and the inputs' general registers; the flags), touches no memory and no
        // stack, and ends with `vzeroupper`.
        unsafe {
            std::arch::asm!(
                concat!("vmovd xmm12, {m:e}"),
                concat!("vbroadcastss ", $r, "12, xmm12"),
                concat!("vmovd xmm13, {c:e}"),
                concat!("vbroadcastss ", $r, "13, xmm13"),
                concat!("vmovaps ", $r, "0, ", $r, "13"),
                concat!("vmovaps ", $r, "1, ", $r, "13"),
                concat!("vmovaps ", $r, "2, ", $r, "13"),
                concat!("vmovaps ", $r, "3, ", $r, "13"),
                concat!("vmovaps ", $r, "4, ", $r, "13"),
                concat!("vmovaps ", $r, "5, ", $r, "13"),
                concat!("vmovaps ", $r, "6, ", $r, "13"),
                concat!("vmovaps ", $r, "7, ", $r, "13"),
                concat!("vmovaps ", $r, "8, ", $r, "13"),
                concat!("vmovaps ", $r, "9, ", $r, "13"),
                concat!("vmovaps ", $r, "10, ", $r, "13"),
                concat!("vmovaps ", $r, "11, ", $r, "13"),
                "2:",
                concat!("vmulps ", $r, "0, ", $r, "0, ", $r, "12"),
                concat!("vmulps ", $r, "1, ", $r, "1, ", $r, "12"),
                concat!("vmulps ", $r, "2, ", $r, "2, ", $r, "12"),
                concat!("vmulps ", $r, "3, ", $r, "3, ", $r, "12"),
                concat!("vmulps ", $r, "4, ", $r, "4, ", $r, "12"),
                concat!("vmulps ", $r, "5, ", $r, "5, ", $r, "12"),
                concat!("vmulps ", $r, "6, ", $r, "6, ", $r, "12"),
                concat!("vmulps ", $r, "7, ", $r, "7, ", $r, "12"),
                concat!("vmulps ", $r, "8, ", $r, "8, ", $r, "12"),
                concat!("vmulps ", $r, "9, ", $r, "9, ", $r, "12"),
                concat!("vmulps ", $r, "10, ", $r, "10, ", $r, "12"),
                concat!("vmulps ", $r, "11, ", $r, "11, ", $r, "12"),
                concat!("vaddps ", $r, "0, ", $r, "0, ", $r, "13"),
                concat!("vaddps ", $r, "1, ", $r, "1, ", $r, "13"),
                concat!("vaddps ", $r, "2, ", $r, "2, ", $r, "13"),
                concat!("vaddps ", $r, "3, ", $r, "3, ", $r, "13"),
                concat!("vaddps ", $r, "4, ", $r, "4, ", $r, "13"),
                concat!("vaddps ", $r, "5, ", $r, "5, ", $r, "13"),
                concat!("vaddps ", $r, "6, ", $r, "6, ", $r, "13"),
                concat!("vaddps ", $r, "7, ", $r, "7, ", $r, "13"),
                concat!("vaddps ", $r, "8, ", $r, "8, ", $r, "13"),
                concat!("vaddps ", $r, "9, ", $r, "9, ", $r, "13"),
                concat!("vaddps ", $r, "10, ", $r, "10, ", $r, "13"),
                concat!("vaddps ", $r, "11, ", $r, "11, ", $r, "13"),
                "dec {n}",
                "jnz 2b",
                "vmovd {lane0:e}, xmm11",
                "vzeroupper",
                n = inout(reg) $iterations => _,
                m = in(reg) $m,
                c = in(reg) $c,
                lane0 = lateout(reg) lane0,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _,
                options(nomem, nostack),
            );
        }
        lane0
    }};
}

/// The 128-bit probe's loop on x86-64: the chains of [`mul_add_loop`] in SSE
/// (`mulps`, `addps`: x86-64's baseline, which every x86-64 runs and the JIT's vector
/// code is made of), `iterations` (at least 1) steps; returns lane 0 of the last chain.
/// Hand-written for the same reason as the wide loops: compiled from Rust, 12 chains of
/// `[f32; 4]` spill to the stack, and 8 chains are bound by the multiply's and the
/// add's latency on a core with 4 vector pipes (AMD Zen 4 ran them at 2/3 of its rate).
#[cfg(target_arch = "x86_64")]
pub(crate) fn f32x4_mul_add_chains(iterations: u64) -> f32 {
    let iterations = iterations.max(1); // `dec; jnz` from 0 would run 2^64 times
    let (m, c) = (0.999_f32.to_bits(), 0.001_f32.to_bits());
    let lane0: u32;
    // SAFETY: SSE and SSE2 are x86-64's baseline; the block reads and writes only the
    // registers it names (xmm0-13, declared clobbered; the counter and the inputs'
    // general registers; the flags) and touches no memory and no stack.
    unsafe {
        std::arch::asm!(
            "movd xmm12, {m:e}",
            "shufps xmm12, xmm12, 0",
            "movd xmm13, {c:e}",
            "shufps xmm13, xmm13, 0",
            "movaps xmm0, xmm13",
            "movaps xmm1, xmm13",
            "movaps xmm2, xmm13",
            "movaps xmm3, xmm13",
            "movaps xmm4, xmm13",
            "movaps xmm5, xmm13",
            "movaps xmm6, xmm13",
            "movaps xmm7, xmm13",
            "movaps xmm8, xmm13",
            "movaps xmm9, xmm13",
            "movaps xmm10, xmm13",
            "movaps xmm11, xmm13",
            "2:",
            "mulps xmm0, xmm12",
            "mulps xmm1, xmm12",
            "mulps xmm2, xmm12",
            "mulps xmm3, xmm12",
            "mulps xmm4, xmm12",
            "mulps xmm5, xmm12",
            "mulps xmm6, xmm12",
            "mulps xmm7, xmm12",
            "mulps xmm8, xmm12",
            "mulps xmm9, xmm12",
            "mulps xmm10, xmm12",
            "mulps xmm11, xmm12",
            "addps xmm0, xmm13",
            "addps xmm1, xmm13",
            "addps xmm2, xmm13",
            "addps xmm3, xmm13",
            "addps xmm4, xmm13",
            "addps xmm5, xmm13",
            "addps xmm6, xmm13",
            "addps xmm7, xmm13",
            "addps xmm8, xmm13",
            "addps xmm9, xmm13",
            "addps xmm10, xmm13",
            "addps xmm11, xmm13",
            "dec {n}",
            "jnz 2b",
            "movd {lane0:e}, xmm11",
            n = inout(reg) iterations => _,
            m = in(reg) m,
            c = in(reg) c,
            lane0 = lateout(reg) lane0,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _,
            options(nomem, nostack),
        );
    }
    f32::from_bits(lane0)
}

/// Vector operations of one iteration of [`mul_add_chains`]: a multiply and an add for
/// each of the [`CHAINS`].
pub(crate) const MUL_ADD_OPS: u64 = 2 * CHAINS as u64;

/// `iterations` (at least 1) steps of [`CHAINS`] multiply/add chains at `width`;
/// returns lane 0 of the last chain (about 1.0), so a test can see the loop computed.
#[cfg(target_arch = "x86_64")]
fn mul_add_chains(width: Width, iterations: u64) -> f32 {
    let iterations = iterations.max(1); // `dec; jnz` from 0 would run 2^64 times
    let (m, c) = (0.999_f32.to_bits(), 0.001_f32.to_bits());
    let lane0 = match width {
        Width::Zmm => mul_add_loop!("zmm", iterations, m, c),
        Width::Ymm => mul_add_loop!("ymm", iterations, m, c),
    };
    f32::from_bits(lane0)
}

#[cfg(not(target_arch = "x86_64"))]
fn mul_add_chains(_: Width, _: u64) -> f32 {
    unreachable!("Width::detect finds no wide vectors off x86-64")
}

/// The fastest of `trials` runs (at least one) of `work` on each of `threads` threads at
/// once (`std::thread::scope`), in seconds (never below a nanosecond).
pub(crate) fn fastest_run(threads: usize, trials: usize, work: impl Fn() + Sync) -> f64 {
    let mut fastest = f64::INFINITY;
    for _ in 0..trials.max(1) {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(&work);
            }
        });
        fastest = fastest.min(start.elapsed().as_secs_f64());
    }
    fastest.max(1e-9)
}

/// Measures [`FmaPeak`] with the widest FMA the CPU has: `iterations` of the loop per
/// thread, best of `trials`, on one thread and on every thread the OS offers. `None`
/// where the CPU has neither AVX-512F nor AVX2+FMA (or is not x86-64): the 128-bit
/// probe's figure is then the widest.
pub fn measure_wide_fma_peak(iterations: u64, trials: usize) -> Option<FmaPeak> {
    fma_peak_at(Width::detect()?, iterations, trials)
}

/// Measures [`FmaPeak`] at the width of the micro-kernels the products run on
/// (`ProductTier::current`): zmm for AVX-512F, ymm for AVX2+FMA, so a run with
/// `NDFUSE_CPU_WIDE=avx2` sets its products against the AVX2 peak beside the machine's.
/// `None` for the scalar tier.
pub fn measure_tier_fma_peak(
    tier: ndfuse_runtime::ProductTier,
    iterations: u64,
    trials: usize,
) -> Option<FmaPeak> {
    use ndfuse_runtime::ProductTier;
    let width = match tier {
        ProductTier::Avx512 => Width::Zmm,
        ProductTier::Fma => Width::Ymm,
        ProductTier::Scalar => return None,
    };
    fma_peak_at(width, iterations, trials)
}

/// The widest FMA width's figure if `width` is the widest the host has, else `None`.
fn fma_peak_at(width: Width, iterations: u64, trials: usize) -> Option<FmaPeak> {
    Some(chains_peak(
        (width.isa(), width.lanes(), 2),
        iterations,
        trials,
        |n| fma_chains(width, n),
    ))
}

/// An [`FmaPeak`] of `chains(n)`, which runs `n` steps of [`CHAINS`] chains of `lanes`
/// f32 lanes, `flops` a lane a step: `iterations` (at least 1) steps a thread, best of
/// `trials`, on one thread and on every thread the OS offers.
fn chains_peak(
    (isa, lanes, flops): (&'static str, usize, usize),
    iterations: u64,
    trials: usize,
    chains: impl Fn(u64) -> f32 + Sync,
) -> FmaPeak {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let iterations = iterations.max(1);
    let flops_per_run = (flops * lanes * CHAINS) as f64 * iterations as f64;
    let best = |threads: usize| {
        let fastest = fastest_run(threads, trials, || {
            std::hint::black_box(chains(std::hint::black_box(iterations)));
        });
        flops_per_run * threads as f64 / fastest
    };
    FmaPeak {
        isa,
        lanes,
        chains: CHAINS,
        trials: trials.max(1),
        threads,
        flops_1t: best(1),
        flops_all: best(threads),
    }
}

/// The loop of [`bf16_dot_chains`]: 12 chains `acc += x0 * y0 + x1 * y1` over the 16
/// f32 lanes of a zmm register (`vdpbf16ps`: each lane takes a pair of bf16 products,
/// 4 FLOPs, twice an f32 FMA's 2), then lane 0 of the last chain out. The pairs are
/// bf16 1/256 each, so a chain grows by 2^-15 a step: `iterations` up to 2^30 stay far
/// from overflow. Registers as [`fma_loop`]'s.
#[cfg(target_arch = "x86_64")]
fn bf16_dot_chains(iterations: u64) -> f32 {
    let iterations = iterations.max(1); // `dec; jnz` from 0 would run 2^64 times
                                        // Two bf16 1/256 (0x3b80) in each 32-bit lane.
    let pair: u32 = 0x3b80_3b80;
    let lane0: u32;
    // SAFETY: the caller detected AVX512_BF16 and AVX-512F ([`measure_bf16_dot_peak`]);
    // the block reads and writes only the registers it names (vector registers 0-13,
    // declared clobbered; the counter and the input's general register; the flags),
    // touches no memory and no stack, and ends with `vzeroupper`.
    unsafe {
        std::arch::asm!(
            "vmovd xmm12, {p:e}",
            "vpbroadcastd zmm12, xmm12",
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm2, zmm2, zmm2",
            "vpxord zmm3, zmm3, zmm3",
            "vpxord zmm4, zmm4, zmm4",
            "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6",
            "vpxord zmm7, zmm7, zmm7",
            "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9",
            "vpxord zmm10, zmm10, zmm10",
            "vpxord zmm11, zmm11, zmm11",
            "vmovaps zmm13, zmm12",
            "2:",
            "vdpbf16ps zmm0, zmm12, zmm13",
            "vdpbf16ps zmm1, zmm12, zmm13",
            "vdpbf16ps zmm2, zmm12, zmm13",
            "vdpbf16ps zmm3, zmm12, zmm13",
            "vdpbf16ps zmm4, zmm12, zmm13",
            "vdpbf16ps zmm5, zmm12, zmm13",
            "vdpbf16ps zmm6, zmm12, zmm13",
            "vdpbf16ps zmm7, zmm12, zmm13",
            "vdpbf16ps zmm8, zmm12, zmm13",
            "vdpbf16ps zmm9, zmm12, zmm13",
            "vdpbf16ps zmm10, zmm12, zmm13",
            "vdpbf16ps zmm11, zmm12, zmm13",
            "dec {n}",
            "jnz 2b",
            "vmovd {lane0:e}, xmm11",
            "vzeroupper",
            n = inout(reg) iterations => _,
            p = in(reg) pair,
            lane0 = lateout(reg) lane0,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _,
            options(nomem, nostack),
        );
    }
    f32::from_bits(lane0)
}

/// Measures the bf16 dot-product peak of AVX512_BF16 (`vdpbf16ps` on zmm, 12
/// independent chains, f32 accumulation), as an [`FmaPeak`] in f32-equivalent FLOP/s
/// (4 a lane an instruction): what bf16 products could reach on the dot-product units
/// instead of widening to f32 while packing. `None` without AVX512_BF16.
pub fn measure_bf16_dot_peak(iterations: u64, trials: usize) -> Option<FmaPeak> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx512f") && has!("avx512bf16")) {
            return None;
        }
        Some(chains_peak(
            ("AVX512_BF16 zmm vdpbf16ps", 16, 4),
            iterations,
            trials,
            bf16_dot_chains,
        ))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (iterations, trials);
        None
    }
}

/// Measures a [`ComputePeak`] of multiply/add chains with the widest vectors the CPU
/// has: `iterations` of the loop per thread, best of `trials`, on one thread and on
/// every thread the OS offers. `None` where the CPU has neither AVX-512F nor AVX2+FMA
/// (or is not x86-64): the 128-bit probe is then the widest.
pub fn measure_wide_compute_peak(iterations: u64, trials: usize) -> Option<ComputePeak> {
    let width = Width::detect()?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let iterations = iterations.max(1);
    let best = |threads: usize| {
        let fastest = fastest_run(threads, trials, || {
            std::hint::black_box(mul_add_chains(width, std::hint::black_box(iterations)));
        });
        (MUL_ADD_OPS * iterations) as f64 * threads as f64 / fastest
    };
    Some(ComputePeak {
        isa: width.mul_add_isa(),
        lanes: width.lanes(),
        chains: CHAINS,
        trials: trials.max(1),
        threads,
        ops_1t: best(1),
        ops_all: best(threads),
    })
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn the_loop_computes_the_chains_it_times() {
        let Some(width) = Width::detect() else {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2+FMA");
            return;
        };
        // acc_n = 1 - 0.999^(n+1) in exact arithmetic (acc_0 = 0.001): 0.001999 after
        // one step, ~0.0961 after 100, ~1 after 20 000.
        let one = fma_chains(width, 1);
        assert!((one - (0.001 * 0.999 + 0.001)).abs() < 1e-6, "{one}");
        let hundred = fma_chains(width, 100);
        assert!(
            (hundred - (1.0 - 0.999_f32.powi(101))).abs() < 1e-4,
            "{hundred}"
        );
        let many = fma_chains(width, 20_000);
        assert!((many - 1.0).abs() < 1e-3, "{many}");
        // Zero iterations run one (not 2^64).
        assert_eq!(fma_chains(width, 0), one);
    }

    #[test]
    fn the_bf16_dot_loop_computes_the_chains_it_times() {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx512f") && has!("avx512bf16")) {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        // Each step adds 2 * (1/256)^2 = 2^-15 to every lane, exactly.
        assert_eq!(bf16_dot_chains(1), 2f32.powi(-15));
        assert_eq!(bf16_dot_chains(1000), 1000.0 * 2f32.powi(-15));
        assert_eq!(bf16_dot_chains(0), bf16_dot_chains(1));
        let peak = measure_bf16_dot_peak(1000, 1).expect("AVX512_BF16 is there");
        assert!(peak.flops_1t > 0.0 && peak.flops_all > 0.0, "{peak:?}");
    }

    #[test]
    fn the_mul_add_loop_computes_the_chains_it_times() {
        let Some(width) = Width::detect() else {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2+FMA");
            return;
        };
        // The same recurrence as the FMA loop's, rounded twice a step instead of once:
        // acc_n = 1 - 0.999^(n+1) to f32 rounding.
        let one = mul_add_chains(width, 1);
        assert!((one - (0.001 * 0.999 + 0.001)).abs() < 1e-6, "{one}");
        let hundred = mul_add_chains(width, 100);
        assert!(
            (hundred - (1.0 - 0.999_f32.powi(101))).abs() < 1e-4,
            "{hundred}"
        );
        let many = mul_add_chains(width, 20_000);
        assert!((many - 1.0).abs() < 1e-3, "{many}");
        assert_eq!(mul_add_chains(width, 0), one);
        // The 128-bit loop computes the same chains.
        for n in [0, 1, 100, 20_000] {
            assert_eq!(f32x4_mul_add_chains(n), mul_add_chains(width, n), "{n}");
        }
        let peak = measure_wide_compute_peak(1 << 10, 1).expect("detected above");
        assert_eq!((peak.lanes, peak.chains), (width.lanes(), CHAINS));
        assert!(peak.ops_1t > 0.0 && peak.ops_all > 0.0, "{peak:?}");
        assert_eq!(peak.flops_all(), peak.ops_all * width.lanes() as f64);
    }
}
