//! This machine's f32 FMA peak with the widest vectors the CPU has (AVX-512F, else
//! AVX2+FMA), chosen at run time: the compute floor of the matrix products, which a
//! GEMM runs at that width whatever width the JIT's own code has.
//!
//! The loop is hand-written assembly (`std::arch::asm!`, stable since Rust 1.59), not
//! intrinsics: the workspace promises Rust 1.85 and the AVX-512 intrinsics and
//! `#[target_feature(enable = "avx512f")]` became stable only later. The assembler takes
//! the instructions whatever the compile-time target; `is_x86_feature_detected!` decides
//! at run time whether they may run.

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
    let width = Width::detect()?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let iterations = iterations.max(1);
    let flops_per_run = (2 * width.lanes() * CHAINS) as f64 * iterations as f64;
    let best = |threads: usize| {
        let fastest = fastest_run(threads, trials, || {
            std::hint::black_box(fma_chains(width, std::hint::black_box(iterations)));
        });
        flops_per_run * threads as f64 / fastest
    };
    Some(FmaPeak {
        isa: width.isa(),
        lanes: width.lanes(),
        chains: CHAINS,
        trials: trials.max(1),
        threads,
        flops_1t: best(1),
        flops_all: best(threads),
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
}
