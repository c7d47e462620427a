//! This machine's floors, measured in the same run as the cases: memory bandwidth
//! (STREAM copy and triad), the peak rate of 128-bit vector multiplies and adds (the
//! JIT's width), and the f32 FMA peak with the widest vectors the CPU has.

use crate::peak::{fastest_run, measure_wide_fma_peak, FmaPeak};
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

/// One STREAM kernel over a thread's parts of the arrays `a`, `b`, `c`.
type StreamOp = dyn Fn(&mut [f32], &[f32], &[f32]) + Sync;

/// Measures [`Bandwidth`] with three arrays of `array_bytes` each, best of `trials`.
/// Plain Rust (the loops vectorise; copy is a `memcpy`), threads from
/// `std::thread::scope`, each working on its own contiguous part of the arrays.
pub fn measure_bandwidth(array_bytes: usize, trials: usize) -> Bandwidth {
    let n = (array_bytes / 4).max(1024);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    // Filled with non-zero values, which touches every page before timing: page
    // faults are not memory bandwidth.
    let mut a = vec![0.5f32; n];
    let b = vec![1.5f32; n];
    let c = vec![2.5f32; n];
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

// ----- compute peak -----

/// This machine's peak rate of 128-bit vector operations (the width Cranelift's x86
/// vectors have), measured on one thread and on all of them.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputePeak {
    /// Trials; each figure is the best of them.
    pub trials: usize,
    /// The threads of the "all threads" figure.
    pub threads: usize,
    /// Vector operations a second on one thread.
    pub ops_1t: f64,
    /// Vector operations a second on `threads` threads together.
    pub ops_all: f64,
}

/// Vector operations of one iteration of [`vector_chains`]: 8 chains, a multiply and
/// an add each.
const CHAIN_OPS: u64 = 16;

/// `iterations` steps of 8 independent chains `a = a * m + c` on `[f32; 4]` values,
/// which the compiler keeps in eight SSE registers (`mulps`, `addps`; x86-64's baseline
/// has no FMA, and neither does ndfuse's JIT code): enough chains in flight to hide
/// the latency of each operation, so the loop runs at the machine's throughput.
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

/// Measures [`ComputePeak`]: `iterations` of [`vector_chains`] per thread, best of
/// `trials`, on one thread and on every thread the OS offers (`std::thread::scope`).
pub fn measure_compute_peak(iterations: u64, trials: usize) -> ComputePeak {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let iterations = iterations.max(1);
    let best = |threads: usize| {
        let fastest = fastest_run(threads, trials, || {
            std::hint::black_box(vector_chains(std::hint::black_box(iterations)));
        });
        (CHAIN_OPS * iterations) as f64 * threads as f64 / fastest
    };
    ComputePeak {
        trials: trials.max(1),
        threads,
        ops_1t: best(1),
        ops_all: best(threads),
    }
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

impl ComputePeak {
    /// The 128-bit figure on all threads in f32 FLOP/s (4 per vector operation), to set
    /// beside [`FmaPeak::flops_all`].
    pub fn flops_all(&self) -> f64 {
        4.0 * self.ops_all
    }

    /// The same on one thread.
    pub fn flops_1t(&self) -> f64 {
        4.0 * self.ops_1t
    }
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
    /// Peak 128-bit vector-operation rate measured at the start of the run.
    pub compute: ComputePeak,
    /// f32 FMA peak with the widest vectors, measured at the start of the run: the
    /// compute floor of the matrix products.
    pub fma: FmaPeak,
    /// For a CUDA run: the device (`NVIDIA H100 80GB HBM3 (sm_90)`) and its
    /// device-to-device copy bandwidth in GB/s (bytes read plus written), measured in
    /// the same run: the floor the CUDA rows are measured against.
    pub device: Option<(String, f64)>,
}

pub(crate) fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}
