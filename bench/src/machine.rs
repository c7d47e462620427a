//! This machine's floors, measured in the same run as the cases: memory bandwidth
//! (STREAM copy and triad, and a read-only sum), the peak rate of vector multiplies and
//! adds at 128 bits (the JIT's width) and with the widest vectors the CPU has, and the
//! f32 FMA peak with the widest vectors.

use crate::peak::{self, fastest_run, measure_wide_fma_peak, ComputePeak, FmaPeak};
use ndfuse_ir::{DType, Storage};
use ndfuse_runtime::{HostAlloc, RawAlloc};
use std::time::Instant;

// ----- memory bandwidth -----

/// This machine's memory bandwidth, measured by a STREAM-like copy (`a = b`) and triad
/// (`a = b + s * c`) over three f32 arrays, on one thread and on all of them. Bytes are
/// counted as STREAM counts them: 2 arrays for copy, 3 for triad (the cache's extra
/// read of each written line is not counted, as it is not for ndfuse's kernels).
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidth {
    /// Bytes of each array.
    pub array_bytes: usize,
    /// Trials; each figure is the best of them.
    pub trials: usize,
    /// The threads of the "all threads" figures.
    pub threads: usize,
    /// Copy on one thread, GB/s (10^9 bytes a second).
    pub copy_1t_gbps: f64,
    /// Triad on one thread, GB/s.
    pub triad_1t_gbps: f64,
    /// Copy on `threads` threads, GB/s.
    pub copy_all_gbps: f64,
    /// Triad on `threads` threads, GB/s.
    pub triad_all_gbps: f64,
}

impl Bandwidth {
    /// The largest of the four figures: the machine's bandwidth, and so the most
    /// demanding floor.
    pub fn gbps(&self) -> f64 {
        self.best().0
    }

    /// Which figure [`Bandwidth::gbps`] is (`triad, 2 threads`).
    pub fn source(&self) -> String {
        self.best().1
    }

    fn best(&self) -> (f64, String) {
        let n = self.threads;
        let all = format!("{n} thread{}", if n == 1 { "" } else { "s" });
        [
            (self.copy_1t_gbps, "copy, 1 thread".to_string()),
            (self.triad_1t_gbps, "triad, 1 thread".to_string()),
            (self.copy_all_gbps, format!("copy, {all}")),
            (self.triad_all_gbps, format!("triad, {all}")),
        ]
        .into_iter()
        .fold(
            (0.0, String::new()),
            |best, x| if x.0 > best.0 { x } else { best },
        )
    }
}

/// `n` f32 of `value` in memory from ndfuse's own host allocator, which asks for
/// transparent huge pages for large buffers as it does for the cases' tensors: the
/// bandwidths are measured on the same kind of memory the cases read and write (on the
/// development machine 4 KiB pages cost a sweep 10-40% in TLB misses). Filled, which
/// touches every page before timing: page faults are not bandwidth.
fn host_buffer(n: usize, value: f32) -> Vec<f32> {
    let mut xs = match HostAlloc::default().alloc(DType::F32, n * 4) {
        Ok(Storage::F32(v)) => v,
        // Out of memory here is out of memory for the cases too; a plain vector says so
        // in the usual way.
        _ => vec![0.0; n],
    };
    xs.truncate(n);
    xs.fill(value);
    xs
}

/// One STREAM kernel over a thread's parts of the arrays `a`, `b`, `c`.
type StreamOp = dyn Fn(&mut [f32], &[f32], &[f32]) + Sync;

/// Measures [`Bandwidth`] with three arrays of `array_bytes` each (on huge pages where
/// the OS gives them, as the cases' tensors are), best of `trials`. Plain Rust (the
/// loops vectorise; copy is a `memcpy`), threads from `std::thread::scope`, each
/// working on its own contiguous part of the arrays.
pub fn measure_bandwidth(array_bytes: usize, trials: usize) -> Bandwidth {
    let n = (array_bytes / 4).max(1024);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut a = host_buffer(n, 0.5);
    let b = host_buffer(n, 1.5);
    let c = host_buffer(n, 2.5);
    let bytes = (n * 4) as f64;
    let mut best = |threads: usize, op: &StreamOp| -> f64 {
        let chunk = n.div_ceil(threads);
        let mut fastest = f64::INFINITY;
        for _ in 0..trials.max(1) {
            let start = Instant::now();
            std::thread::scope(|s| {
                for ((ac, bc), cc) in a
                    .chunks_mut(chunk)
                    .zip(b.chunks(chunk))
                    .zip(c.chunks(chunk))
                {
                    s.spawn(move || op(ac, bc, cc));
                }
            });
            fastest = fastest.min(start.elapsed().as_secs_f64());
            std::hint::black_box(&mut a);
        }
        fastest.max(1e-9)
    };
    let copy = |a: &mut [f32], b: &[f32], _: &[f32]| a.copy_from_slice(b);
    let triad = |a: &mut [f32], b: &[f32], c: &[f32]| {
        for ((x, &y), &z) in a.iter_mut().zip(b).zip(c) {
            *x = y + 3.0 * z;
        }
    };
    let copy_1t = 2.0 * bytes / best(1, &copy) / 1e9;
    let triad_1t = 3.0 * bytes / best(1, &triad) / 1e9;
    let copy_all = 2.0 * bytes / best(threads, &copy) / 1e9;
    let triad_all = 3.0 * bytes / best(threads, &triad) / 1e9;
    Bandwidth {
        array_bytes: n * 4,
        trials: trials.max(1),
        threads,
        copy_1t_gbps: copy_1t,
        triad_1t_gbps: triad_1t,
        copy_all_gbps: copy_all,
        triad_all_gbps: triad_all,
    }
}

// ----- read-only bandwidth -----

/// This machine's read-only bandwidth: the sum of one f32 buffer, each thread summing
/// its own contiguous part with the widest loads the CPU has and 8 independent vector
/// accumulators, on one thread and on all of them. Bytes are the buffer's: read once,
/// nothing written. The floor of a reduction that reads much and writes little (`sum`),
/// which STREAM's copy and triad, writing a third to a half of their bytes, understate.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadBandwidth {
    /// Bytes of the buffer.
    pub bytes: usize,
    /// The loads: `AVX-512F zmm`, `AVX2 ymm`, or `f32x4` (plain Rust, vectorised at the
    /// baseline width).
    pub isa: &'static str,
    /// Trials; each figure is the best of them.
    pub trials: usize,
    /// The threads of the "all threads" figure.
    pub threads: usize,
    /// GB/s (10^9 bytes a second) on one thread.
    pub read_1t_gbps: f64,
    /// GB/s on `threads` threads together.
    pub read_all_gbps: f64,
}

impl ReadBandwidth {
    /// The larger of the two figures: the machine's read-only bandwidth.
    pub fn gbps(&self) -> f64 {
        self.read_1t_gbps.max(self.read_all_gbps)
    }
}

/// The widest loads the CPU has, for [`read_sum`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loads {
    /// AVX-512F: 16 f32 a load.
    Zmm,
    /// AVX2: 8 f32 a load.
    Ymm,
    /// Plain Rust over `[f32; 32]` blocks, which the compiler vectorises at the
    /// target's baseline width (SSE on x86-64).
    Portable,
}

impl Loads {
    pub(crate) fn detect() -> Loads {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Loads::Zmm;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Loads::Ymm;
            }
        }
        Loads::Portable
    }

    fn isa(self) -> &'static str {
        match self {
            Loads::Zmm => "AVX-512F zmm",
            Loads::Ymm => "AVX2 ymm",
            Loads::Portable => "f32x4",
        }
    }
}

/// The sum of `xs` with `loads` (which [`Loads::detect`] found), in 8 vector
/// accumulators, added together at the end, then the tail: the order differs from a
/// sequential sum, so the result is the sum to f32 rounding, exact for small integers.
pub(crate) fn read_sum(xs: &[f32], loads: Loads) -> f32 {
    match loads {
        // SAFETY: `Loads::detect` found AVX-512F on this CPU.
        #[cfg(target_arch = "x86_64")]
        Loads::Zmm => unsafe { sum_zmm(xs) },
        // SAFETY: `Loads::detect` found AVX2 on this CPU.
        #[cfg(target_arch = "x86_64")]
        Loads::Ymm => unsafe { sum_ymm(xs) },
        _ => sum_portable(xs),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_zmm(xs: &[f32]) -> f32 {
    use std::arch::x86_64::{__m512, _mm512_add_ps, _mm512_loadu_ps, _mm512_reduce_add_ps};
    let mut acc: [__m512; 8] = [std::arch::x86_64::_mm512_setzero_ps(); 8];
    let blocks = xs.chunks_exact(128);
    let tail = blocks.remainder();
    for block in blocks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `block` holds 128 f32 and `16 * k + 16 <= 128`; an unaligned load.
            let v = unsafe { _mm512_loadu_ps(block.as_ptr().add(16 * k)) };
            *a = _mm512_add_ps(*a, v);
        }
    }
    let total = acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum::<f32>();
    total + tail.iter().sum::<f32>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_ymm(xs: &[f32]) -> f32 {
    use std::arch::x86_64::{__m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_setzero_ps};
    let mut acc: [__m256; 8] = [_mm256_setzero_ps(); 8];
    let blocks = xs.chunks_exact(64);
    let tail = blocks.remainder();
    for block in blocks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `block` holds 64 f32 and `8 * k + 8 <= 64`; an unaligned load.
            let v = unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * k)) };
            *a = _mm256_add_ps(*a, v);
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut total = 0.0f32;
    for a in acc {
        // SAFETY: `lanes` holds 8 f32; an unaligned store.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), a) };
        total += lanes.iter().sum::<f32>();
    }
    total + tail.iter().sum::<f32>()
}

fn sum_portable(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let blocks = xs.chunks_exact(32);
    let tail = blocks.remainder();
    for block in blocks {
        for (a, x) in acc.iter_mut().zip(block) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// Measures [`ReadBandwidth`] over a buffer of `bytes` (at least 4 KiB), best of
/// `trials`, on one thread and on every thread the OS offers, each thread summing its
/// own contiguous part.
pub fn measure_read_bandwidth(bytes: usize, trials: usize) -> ReadBandwidth {
    let n = (bytes / 4).max(1024);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let loads = Loads::detect();
    let xs = host_buffer(n, 1.0);
    let gbps = |threads: usize| {
        let chunk = n.div_ceil(threads);
        let mut fastest = f64::INFINITY;
        for _ in 0..trials.max(1) {
            let start = Instant::now();
            std::thread::scope(|s| {
                for part in xs.chunks(chunk) {
                    s.spawn(move || {
                        std::hint::black_box(read_sum(std::hint::black_box(part), loads))
                    });
                }
            });
            fastest = fastest.min(start.elapsed().as_secs_f64());
        }
        (n * 4) as f64 / fastest.max(1e-9) / 1e9
    };
    ReadBandwidth {
        bytes: n * 4,
        isa: loads.isa(),
        trials: trials.max(1),
        threads,
        read_1t_gbps: gbps(1),
        read_all_gbps: gbps(threads),
    }
}

// ----- compute peak -----

/// The 128-bit probe's loop: on x86-64 the hand-written SSE loop of `peak.rs` (12
/// chains); elsewhere [`vector_chains`] (8). Returns the chains, the vector operations
/// of one iteration, and the loop.
fn f32x4_probe() -> (usize, u64, fn(u64) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        (peak::CHAINS, peak::MUL_ADD_OPS, peak::f32x4_mul_add_chains)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (8, 16, vector_chains)
    }
}

/// `iterations` steps of 8 independent chains `a = a * m + c` on `[f32; 4]` values,
/// which the compiler keeps in eight vector registers: the 128-bit probe where the
/// hand-written SSE loop does not exist (off x86-64).
#[cfg(not(target_arch = "x86_64"))]
fn vector_chains(iterations: u64) -> f32 {
    let m = std::hint::black_box([0.999_f32; 4]);
    let c = std::hint::black_box([0.001_f32; 4]);
    let mut acc = [[1.0_f32; 4]; 8];
    for _ in 0..iterations {
        for a in &mut acc {
            for k in 0..4 {
                a[k] = a[k] * m[k] + c[k];
            }
        }
    }
    // The chains converge to 1: no overflow, no subnormals.
    acc.iter().flatten().sum()
}

/// Measures the 128-bit [`ComputePeak`]: independent chains `a = a * m + c` of f32x4
/// multiplies and adds (`mulps`, `addps`: x86-64's baseline has no FMA, and neither
/// does ndfuse's JIT code), enough chains in flight to hide each operation's latency,
/// so the loop runs at the machine's throughput; `iterations` per thread, best of
/// `trials`, on one thread and on every thread the OS offers (`std::thread::scope`).
pub fn measure_compute_peak(iterations: u64, trials: usize) -> ComputePeak {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let iterations = iterations.max(1);
    let (chains, ops_per_iteration, probe) = f32x4_probe();
    let best = |threads: usize| {
        let fastest = fastest_run(threads, trials, || {
            std::hint::black_box(probe(std::hint::black_box(iterations)));
        });
        (ops_per_iteration * iterations) as f64 * threads as f64 / fastest
    };
    ComputePeak {
        isa: "f32x4 mul/add",
        lanes: 4,
        chains,
        trials: trials.max(1),
        threads,
        ops_1t: best(1),
        ops_all: best(threads),
    }
}

/// Measures the multiply/add chains of [`measure_compute_peak`] with the widest vectors
/// the CPU has (AVX-512F, else AVX2: see `peak.rs`), 12 chains; where it has neither,
/// the 128-bit probe `f32x4` already measured is the widest, and is the answer.
pub fn measure_widest_compute_peak(
    iterations: u64,
    trials: usize,
    f32x4: &ComputePeak,
) -> ComputePeak {
    peak::measure_wide_compute_peak(iterations, trials).unwrap_or_else(|| f32x4.clone())
}

/// Measures [`FmaPeak`] with the widest FMA the CPU has (AVX-512F, else AVX2+FMA: see
/// `peak.rs`); where it has neither, the 128-bit probe `f32x4` already measured is the
/// widest, and its vector operations (a multiply or an add of 4 lanes) are 4 FLOPs each.
pub fn measure_fma_peak(iterations: u64, trials: usize, f32x4: &ComputePeak) -> FmaPeak {
    measure_wide_fma_peak(iterations, trials).unwrap_or(FmaPeak {
        isa: "f32x4 mul+add",
        lanes: 4,
        chains: 8,
        trials: f32x4.trials,
        threads: f32x4.threads,
        flops_1t: 4.0 * f32x4.ops_1t,
        flops_all: 4.0 * f32x4.ops_all,
    })
}

// ----- running the suite -----

/// The machine the suite ran on.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Threads the OS offers this process (`available_parallelism`).
    pub cores: usize,
    /// `x86_64`, `aarch64`, ...
    pub arch: &'static str,
    /// `linux`, `macos`, ...
    pub os: &'static str,
    /// The CPU model when the OS says it (`/proc/cpuinfo` on Linux).
    pub cpu: Option<String>,
    /// Memory bandwidth measured at the start of the run.
    pub bandwidth: Bandwidth,
    /// Peak 128-bit vector-operation rate measured at the start of the run: the rows'
    /// 128-bit floor.
    pub compute: ComputePeak,
    /// The same multiply/add probe with the widest vectors the CPU has (the 128-bit
    /// one again where it has none wider): the rows' wide floor.
    pub wide: ComputePeak,
    /// Read-only bandwidth, measured at the start of the run.
    pub read: ReadBandwidth,
    /// f32 FMA peak with the widest vectors, measured at the start of the run: the
    /// compute floor of the matrix products.
    pub fma: FmaPeak,
    /// The micro-kernels the CPU's products ran on (`ndfuse_runtime::ProductTier`:
    /// `AVX-512F`, `AVX2+FMA`, `scalar`), and the f32 FMA peak at their width, measured
    /// in the same run (the figure of `fma` where that is the widest width); `None`
    /// for the scalar tier.
    pub product_tier: (&'static str, Option<FmaPeak>),
    /// The bf16 dot-product peak of AVX512_BF16 (`vdpbf16ps`), f32-equivalent FLOP/s;
    /// `None` without it. bf16 products widen to f32 while packing and run on the f32
    /// kernels: on the Intel VM of 2026-11-29 this was 0.49x the f32 FMA peak.
    pub bf16_dot: Option<FmaPeak>,
    /// For a CUDA run: the device and its floors, measured in the same run.
    pub device: Option<DeviceFloor>,
}

/// A GPU's floors, measured at the start of a CUDA run: what the CUDA rows are set
/// against instead of the host's.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceFloor {
    /// `NVIDIA H100 80GB HBM3 (sm_90)`.
    pub name: String,
    /// Device-to-device copy bandwidth, GB/s (bytes read plus written): the memory
    /// floor.
    pub copy_gbps: f64,
    /// f32 FMA peak of the CUDA cores (independent FMA chains at full occupancy),
    /// GFLOP/s: the compute floor of the matrix products.
    pub fma_gflops: f64,
}

pub(crate) fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}
