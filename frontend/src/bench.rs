//! The built-in benchmark suite of `ndfuse bench`: each case is built with the library
//! API, timed end to end, and set against the ideal bytes it must move and this
//! machine's memory bandwidth, measured in the same run by a STREAM-like copy and triad.
//!
//! The floor of a memory-bound kernel is `ideal bytes / bandwidth`, where the ideal
//! bytes are every input read once plus every output written once (from the shapes and
//! dtypes, whatever the kernels actually did). A row's fraction of the bandwidth is how
//! close the case came to that floor: 1.0 is at the floor.
//!
//! A kernel can be bound by compute instead (Cranelift's x86 vectors are 128 bits wide,
//! and a transcendental costs tens of vector operations): each row also has a compute
//! floor, the operations its compiled kernels execute
//! ([`ndfuse_runtime::jit_ops_per_element`] times the elements of each kernel's domain)
//! over this machine's peak rate of f32x4 multiplies and adds on all threads, measured
//! in the same run ([`measure_compute_peak`]). A row's time is reported against the
//! larger of the two floors, and the table says which binds.
//!
//! Each row also counts the minor page faults of one evaluation (`getrusage`, median
//! over the timed runs): with outputs and intermediates recycled by the host cache, a
//! steady-state loop touches no fresh page, so the figure is about zero; a buffer
//! larger than `max_host_cacheable_length` is fresh memory in every run and shows up
//! here (about 32 faults per 64 MiB with huge pages, 16 384 without).
//!
//! ```
//! use ndfuse::bench::{run_suite, BenchOptions};
//! // The tiny variant: the same cases on small shapes, for tests and smoke runs.
//! let report = run_suite(Some("gelu"), &BenchOptions::tiny())?;
//! assert_eq!(report.rows.len(), 2); // gelu and gelu_f16
//! assert!(report.rows.iter().all(|r| r.kernels >= 1));
//! println!("{}", report.table());
//! # Ok::<(), ndfuse::Error>(())
//! ```

use crate::context::{Context, Report};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::f16;
use ndfuse_ir::DType;
use ndfuse_runtime::{BackendKind, StepPath};
use std::fmt::Write as _;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Which shapes the suite runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// The shapes of the issue: 16M-element vectors, 4096x4096 matrices, ...
    Full,
    /// Small shapes of the same cases: the suite in well under a second, for tests.
    Tiny,
}

/// How the suite runs.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Full or tiny shapes.
    pub size: Size,
    /// The most timed runs of a case (after one warm-up run).
    pub max_runs: usize,
    /// A case stops early once it has run this long and at least `min_runs` times,
    /// so that slow cases do not take minutes.
    pub time_budget: Duration,
    /// The fewest timed runs of a case (capped by `max_runs`).
    pub min_runs: usize,
    /// Bytes of each of the three STREAM arrays.
    pub stream_array_bytes: usize,
    /// STREAM trials; the best of them is reported, as STREAM does.
    pub stream_trials: usize,
    /// The backend of the cases.
    pub backend: BackendKind,
    /// Iterations of the compute-peak loop per thread and trial (16 vector operations
    /// each); its trials are `stream_trials`.
    pub peak_iterations: u64,
}

impl Default for BenchOptions {
    /// Full shapes, at most 10 runs or about 1 s a case, 3 x 64 MiB STREAM arrays.
    fn default() -> BenchOptions {
        BenchOptions {
            size: Size::Full,
            max_runs: 10,
            time_budget: Duration::from_secs(1),
            min_runs: 3,
            // Far beyond the L2 of the development machine; its nominal L3 (260 MiB,
            // shared with the whole host) gave the same triad from 32 MiB to 512 MiB.
            stream_array_bytes: 64 << 20,
            stream_trials: 5,
            backend: BackendKind::Auto,
            // About 10-30 ms a trial on the development machine.
            peak_iterations: 1 << 22,
        }
    }
}

impl BenchOptions {
    /// Tiny shapes, 3 runs, 1 MiB STREAM arrays: the whole suite in a moment.
    pub fn tiny() -> BenchOptions {
        BenchOptions {
            size: Size::Tiny,
            max_runs: 3,
            time_budget: Duration::ZERO,
            min_runs: 1,
            stream_array_bytes: 1 << 20,
            stream_trials: 2,
            backend: BackendKind::Auto,
            peak_iterations: 1 << 12,
        }
    }
}

/// What a case measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Time of a warm evaluation (kernels cached) against the bytes it must move.
    Throughput,
    /// First evaluation of a graph never seen before: passes, JIT and run.
    CompileNew,
    /// Re-evaluation of a graph whose kernels are cached: the fixed overhead.
    Cached,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Throughput => "throughput",
            Kind::CompileNew => "compile_new",
            Kind::Cached => "cached",
        }
    }
}

/// Builds a case's output from its inputs; `salt` is a literal the latency cases vary
/// to make a graph the kernel cache has never seen (the other cases ignore it).
type Build = fn(&[Tensor], f64) -> Tensor;

/// One case of the suite: its inputs (by type) and how its output is built.
#[derive(Clone, Debug)]
pub struct Case {
    /// The name `ndfuse bench SUITE` matches against.
    pub name: &'static str,
    /// The expression, in the CLI's language.
    pub expr: &'static str,
    /// Each input: name, shape and dtype.
    pub inputs: Vec<(&'static str, Vec<usize>, DType)>,
    /// What is measured.
    pub kind: Kind,
    build: Build,
}

/// The 10-op element-wise graph of the latency cases: ten element-wise ops on `x`, with
/// `salt` as one of its literals.
fn ten_ops(x: &Tensor, salt: f64) -> Tensor {
    let y = x * salt; // 1 mul
    let y = (y + 1.0).tanh(); // 2 add, 3 tanh
    let y = (&y * x - 0.5).abs(); // 4 mul, 5 sub, 6 abs
    let y = (y.sqrt() + x) * 0.25; // 7 sqrt, 8 add, 9 mul
    y.maximum(x) // 10 maximum
}

const TEN_OPS: &str =
    "maximum((sqrt(abs(tanh(x * k + 1) * x - 0.5)) + x) * 0.25, x), k new each run";

/// The cases of the suite at `size`, in the order they run.
pub fn cases(size: Size) -> Vec<Case> {
    let full = size == Size::Full;
    let pick = |big: &[usize], small: &[usize]| if full { big.to_vec() } else { small.to_vec() };
    let vec16m = pick(&[16 << 20], &[1024]);
    let sq = pick(&[4096, 4096], &[16, 16]);
    let (f32_, f16_) = (DType::F32, DType::F16);
    let case = |name, expr, inputs, kind, build| Case {
        name,
        expr,
        inputs,
        kind,
        build,
    };
    let tp = Kind::Throughput;
    vec![
        case(
            "gelu",
            "gelu(x)",
            vec![("x", vec16m.clone(), f32_)],
            tp,
            |t, _| t[0].gelu(),
        ),
        case(
            "chain",
            "exp(a * b + c) * sqrt(abs(a)) - b / (1 + c * c)",
            vec![
                ("a", vec16m.clone(), f32_),
                ("b", vec16m.clone(), f32_),
                ("c", vec16m.clone(), f32_),
            ],
            tp,
            |t, _| {
                let (a, b, c) = (&t[0], &t[1], &t[2]);
                (a * b + c).exp() * a.abs().sqrt() - b / (1.0 + c * c)
            },
        ),
        case(
            "softmax",
            "softmax(x, axis=-1)",
            vec![("x", sq.clone(), f32_)],
            tp,
            |t, _| t[0].softmax(-1),
        ),
        case(
            "layernorm",
            "layernorm(x, axis=-1, eps=1e-5)",
            vec![("x", pick(&[8192, 1024], &[32, 16]), f32_)],
            tp,
            |t, _| t[0].layernorm(-1, 1e-5),
        ),
        case(
            "sum",
            "sum(x)",
            vec![("x", pick(&[64 << 20], &[4096]), f32_)],
            tp,
            |t, _| t[0].sum(..),
        ),
        case(
            "colsum",
            "sum(x, axis=0)",
            vec![("x", sq.clone(), f32_)],
            tp,
            |t, _| t[0].sum(0),
        ),
        case(
            "broadcast",
            "a * b + c",
            vec![
                ("a", sq.clone(), f32_),
                ("b", vec![sq[1]], f32_),
                ("c", vec![sq[0], 1], f32_),
            ],
            tp,
            |t, _| &t[0] * &t[1] + &t[2],
        ),
        case(
            "gelu_f16",
            "gelu(x)",
            vec![("x", vec16m, f16_)],
            tp,
            |t, _| t[0].gelu(),
        ),
        case(
            "compile_new",
            TEN_OPS,
            vec![("x", vec![1000], f32_)],
            Kind::CompileNew,
            |t, salt| ten_ops(&t[0], salt),
        ),
        case(
            "compile_cached",
            "maximum((sqrt(abs(tanh(x * 1.5 + 1) * x - 0.5)) + x) * 0.25, x), again",
            vec![("x", vec![1000], f32_)],
            Kind::Cached,
            |t, _| ten_ops(&t[0], 1.5),
        ),
    ]
}

/// `dtype[d0,d1]`, as the IR prints types.
fn type_text(shape: &[usize], dtype: DType) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("{dtype}[{}]", dims.join(","))
}

fn nbytes(shape: &[usize], dtype: DType) -> u64 {
    shape.iter().product::<usize>() as u64 * dtype.size_bytes() as u64
}

impl Case {
    /// The output for the given inputs.
    pub fn build(&self, inputs: &[Tensor], salt: f64) -> Tensor {
        (self.build)(inputs, salt)
    }

    /// The case's input tensors, filled with the suite's seeded uniform data in
    /// [-1, 1) (the same in every run).
    pub fn make_inputs(&self, ctx: &Context) -> Result<Vec<Tensor>> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, (_, s, d))| input_data(ctx, s, *d, i as u64 + 1))
            .collect()
    }

    /// `x: f32[4096,4096], b: f32[4096]`: the inputs as text.
    pub fn inputs_text(&self) -> String {
        let parts: Vec<String> = self
            .inputs
            .iter()
            .map(|(n, s, d)| format!("{n}: {}", type_text(s, *d)))
            .collect();
        parts.join(", ")
    }

    /// The bytes the case must move at the least: every input read once and the output
    /// written once, from shapes and dtypes alone (nothing is allocated or evaluated).
    pub fn ideal_bytes(&self, ctx: &Context) -> Result<u64> {
        // Constants stand in for the inputs: they carry the types without the data.
        let standins: Vec<Tensor> = self
            .inputs
            .iter()
            .map(|(_, s, d)| ctx.full_dtype(s, 0.0, *d))
            .collect();
        let out = self.build(&standins, 1.0);
        let input_bytes: u64 = self.inputs.iter().map(|(_, s, d)| nbytes(s, *d)).sum();
        Ok(input_bytes + nbytes(out.shape()?, out.dtype()?))
    }
}

/// Uniform values in [-1, 1) from a fixed seed, made straight into the dtype (no f64
/// staging: the largest input is 256 MiB of f32). A SplitMix64 stream, so the data is
/// the same in every run and release.
fn input_data(ctx: &Context, shape: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // The top 24 bits: exactly representable in f32, uniform in [-1, 1).
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    match dtype {
        DType::F16 => ctx.from_vec((0..n).map(|_| f16::from_f32(next())).collect(), shape),
        DType::F64 => ctx.from_vec((0..n).map(|_| f64::from(next())).collect(), shape),
        _ => ctx.from_vec((0..n).map(|_| next()).collect(), shape),
    }
}

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
    let best = |threads: usize| -> f64 {
        let mut fastest = f64::INFINITY;
        for _ in 0..trials.max(1) {
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        std::hint::black_box(vector_chains(std::hint::black_box(iterations)))
                    });
                }
            });
            fastest = fastest.min(start.elapsed().as_secs_f64());
        }
        (CHAIN_OPS * iterations) as f64 * threads as f64 / fastest.max(1e-9)
    };
    ComputePeak {
        trials: trials.max(1),
        threads,
        ops_1t: best(1),
        ops_all: best(threads),
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
    /// Peak vector-operation rate measured at the start of the run.
    pub compute: ComputePeak,
    /// For a CUDA run: the device (`NVIDIA H100 80GB HBM3 (sm_90)`) and its
    /// device-to-device copy bandwidth in GB/s (bytes read plus written), measured in
    /// the same run: the floor the CUDA rows are measured against.
    pub device: Option<(String, f64)>,
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// One row of the results.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The case's name.
    pub name: &'static str,
    /// The case's expression.
    pub expr: &'static str,
    /// Its inputs (`x: f32[4096,4096]`).
    pub inputs: String,
    /// What was measured.
    pub kind: Kind,
    /// The backend that ran it.
    pub backend: &'static str,
    /// Kernels launched by one evaluation ([`Report::kernel_count`]).
    pub kernels: usize,
    /// Steps of one evaluation that ran in the reference interpreter (whole nodes, or
    /// kernels the codegen cannot compile yet).
    pub interp_steps: usize,
    /// Kernels JIT-compiled by the last timed run (cache misses): one or more for
    /// `compile_new`, none for the cases whose kernels the warm-up cached.
    pub compiled_kernels: usize,
    /// Timed runs (the warm-up excluded).
    pub runs: usize,
    /// Median wall time of one evaluation (`Context::eval_report`, end to end), ms.
    pub median_ms: f64,
    /// Fastest run, ms.
    pub min_ms: f64,
    /// Median of the runtime's own time running steps, ms: `median_ms` less this is
    /// the fixed overhead (graph building, scheduling, cache look-ups, copies).
    pub run_ms: f64,
    /// Median JIT compile time of a run, ms (zero when every kernel was cached).
    pub compile_ms: f64,
    /// Bytes that must move: inputs read once, output written once.
    pub ideal_bytes: u64,
    /// `ideal_bytes / median`, GB/s; `None` for the latency cases.
    pub gbps: Option<f64>,
    /// `gbps` over the machine's bandwidth: 1.0 is the memory floor.
    pub fraction: Option<f64>,
    /// Median minor page faults of one timed evaluation; `None` where the OS does not
    /// count them.
    pub faults_per_eval: Option<f64>,
    /// Minor page faults of the warm-up evaluation (fresh buffers, and the JIT's own
    /// memory when it compiled).
    pub warmup_faults: Option<u64>,
    /// Operations one evaluation's compiled kernels execute: for each kernel,
    /// [`ndfuse_runtime::jit_ops_per_element`] times its domain's elements; `None` for
    /// the latency cases and where a kernel was not JIT-compiled or not measurable.
    pub ops: Option<f64>,
    /// `ops` over the elements of the kernels' domains (the table's *ops/elem*).
    pub ops_per_element: Option<f64>,
    /// `ideal_bytes` over the machine's bandwidth, ms (throughput cases).
    pub memory_floor_ms: Option<f64>,
    /// `ops` over the machine's peak vector rate on all threads, ms.
    pub compute_floor_ms: Option<f64>,
}

impl Row {
    /// The larger floor, ms, and which it is (`memory` or `compute`).
    pub fn floor(&self) -> Option<(f64, &'static str)> {
        let memory = self.memory_floor_ms?;
        Some(match self.compute_floor_ms {
            Some(c) if c > memory => (c, "compute"),
            _ => (memory, "memory"),
        })
    }

    /// The time compared with the larger floor: 1.0 is at the floor. On a GPU the
    /// kernels' device time, on the host the wall time.
    pub fn x_floor(&self) -> Option<f64> {
        let (floor, _) = self.floor()?;
        let timed = if self.backend == BackendKind::Cuda.name() {
            self.run_ms
        } else {
            self.median_ms
        };
        (floor > 0.0).then(|| timed / floor)
    }
}

/// What [`run_suite`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// The machine and its bandwidth.
    pub machine: Machine,
    /// Full or tiny shapes.
    pub size: Size,
    /// One row per case run, in suite order.
    pub rows: Vec<Row>,
    /// The host buffer cache after the last case: its limits and traffic.
    pub host_cache: ndfuse_runtime::CacheStats,
}

/// Progress of [`run_suite_with`], for a progress line.
#[derive(Debug)]
pub enum Event<'a> {
    /// The bandwidth measurement is about to start.
    MeasuringBandwidth {
        /// Bytes of each array.
        array_bytes: usize,
    },
    /// The bandwidth was measured.
    Bandwidth(&'a Bandwidth),
    /// A case is about to run.
    CaseStart {
        /// 1-based position among the selected cases.
        index: usize,
        /// How many cases were selected.
        total: usize,
        /// The case.
        case: &'a Case,
    },
    /// A case finished.
    CaseDone(&'a Row),
}

/// Runs the cases whose name contains `filter` (every case for `None`) and returns a
/// row for each, after measuring the machine's bandwidth.
pub fn run_suite(filter: Option<&str>, opts: &BenchOptions) -> Result<BenchReport> {
    run_suite_with(filter, opts, &mut |_| {})
}

/// Like [`run_suite`], calling `on_event` as it goes.
#[track_caller]
pub fn run_suite_with(
    filter: Option<&str>,
    opts: &BenchOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<BenchReport> {
    let at = Location::caller();
    let all = cases(opts.size);
    let selected: Vec<&Case> = all
        .iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        return Err(Error::Argument {
            what: "bench",
            why: format!(
                "no case matches '{}' (cases: {})",
                filter.unwrap_or_default(),
                names.join(", ")
            ),
            at,
        });
    }
    on_event(Event::MeasuringBandwidth {
        array_bytes: opts.stream_array_bytes,
    });
    let bandwidth = measure_bandwidth(opts.stream_array_bytes, opts.stream_trials);
    on_event(Event::Bandwidth(&bandwidth));
    let compute = measure_compute_peak(opts.peak_iterations, opts.stream_trials);
    let device = device_floor(opts)?;
    let floor = device.as_ref().map_or(bandwidth.gbps(), |d| d.1);
    let ctx = Context::builder().backend(opts.backend).build()?;
    let mut rows = Vec::with_capacity(selected.len());
    for (i, case) in selected.iter().enumerate() {
        on_event(Event::CaseStart {
            index: i + 1,
            total: selected.len(),
            case,
        });
        let row = run_case(&ctx, case, opts, floor, compute.ops_all)?;
        on_event(Event::CaseDone(&row));
        rows.push(row);
    }
    Ok(BenchReport {
        machine: Machine {
            cores: bandwidth.threads,
            arch: std::env::consts::ARCH,
            os: std::env::consts::OS,
            cpu: cpu_model(),
            bandwidth,
            compute,
            device,
        },
        size: opts.size,
        rows,
        host_cache: ndfuse_runtime::host_cache_stats(),
    })
}

/// For `--backend cuda`: device 0 and its copy bandwidth over 2^26 f32 (256 MiB), best
/// of five copies; `None` for the other backends.
#[cfg(feature = "cuda")]
fn device_floor(opts: &BenchOptions) -> Result<Option<(String, f64)>> {
    if opts.backend != BackendKind::Cuda {
        return Ok(None);
    }
    let cfg = ndfuse_runtime::Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
    let dev = ndfuse_runtime::cuda_device(0, &cfg)?;
    let bytes = match opts.size {
        Size::Full => 1 << 28,
        Size::Tiny => 1 << 20,
    };
    let gbps = dev.copy_bandwidth(bytes, 5)?;
    Ok(Some((dev.describe(), gbps)))
}

#[cfg(not(feature = "cuda"))]
fn device_floor(_: &BenchOptions) -> Result<Option<(String, f64)>> {
    Ok(None)
}

/// What one timed evaluation measured.
struct Timed {
    /// Wall time, ms.
    wall: f64,
    /// Minor page faults of the process during the evaluation.
    faults: Option<u64>,
    report: Report,
}

/// One timed evaluation; its output is dropped (back into the host cache) before it
/// returns, as a loop that consumes each result would.
fn timed_eval(ctx: &Context, out: &Tensor) -> Result<Timed> {
    let faults_before = ndfuse_runtime::minor_page_faults();
    let start = Instant::now();
    let (arrays, report) = ctx.eval_report(&[out])?;
    let wall = start.elapsed().as_secs_f64() * 1e3;
    let faults = ndfuse_runtime::minor_page_faults()
        .zip(faults_before)
        .map(|(after, before)| after.saturating_sub(before));
    drop(arrays);
    Ok(Timed {
        wall,
        faults,
        report,
    })
}

/// A literal no earlier evaluation in this process used, for a graph the kernel cache
/// cannot have seen.
fn fresh_salt() -> f64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    1.0 + NEXT.fetch_add(1, Ordering::Relaxed) as f64 * 1e-6
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Operations the compiled kernels of an evaluation execute (see [`Row::ops`]), and
/// the elements of their domains.
fn kernel_ops(report: &Report) -> Option<(f64, f64)> {
    let schedule = report.evaluation().schedule.as_ref()?;
    let (mut ops, mut elements) = (0.0, 0.0);
    for step in &schedule.steps {
        if let ndfuse_passes::Step::Kernel { kernel, .. } = step {
            let n = kernel.domain.numel() as f64;
            ops += ndfuse_runtime::jit_ops_per_element(kernel)? * n;
            elements += n;
        }
    }
    (elements > 0.0).then_some((ops, elements))
}

fn run_case(
    ctx: &Context,
    case: &Case,
    opts: &BenchOptions,
    bandwidth_gbps: f64,
    peak_ops: f64,
) -> Result<Row> {
    let inputs = case.make_inputs(ctx)?;
    let ideal_bytes = case.ideal_bytes(ctx)?;
    // The cached case's graph, built once; the compile case builds a new one per run.
    let fixed = case.build(&inputs, 1.0);
    let output = || match case.kind {
        Kind::CompileNew => case.build(&inputs, fresh_salt()),
        Kind::Throughput | Kind::Cached => fixed.clone(),
    };
    // Warm-up: compiles the kernels (and, for the compile case, initialises whatever
    // the first JIT of the process initialises), so compile time stays out of the
    // timed runs of the others.
    let warmup_faults = timed_eval(ctx, &output())?.faults;
    let (mut walls, mut runs, mut compiles) = (Vec::new(), Vec::new(), Vec::new());
    let mut faults = Vec::new();
    let mut last: Option<Report> = None;
    let started = Instant::now();
    let max_runs = opts.max_runs.max(1);
    let min_runs = opts.min_runs.clamp(1, max_runs);
    while walls.len() < max_runs && (walls.len() < min_runs || started.elapsed() < opts.time_budget)
    {
        let out = output();
        let Timed {
            wall,
            faults: f,
            report,
        } = timed_eval(ctx, &out)?;
        walls.push(wall);
        faults.extend(f.map(|f| f as f64));
        runs.push(ms(report.evaluation().run_time));
        compiles.push(ms(report.evaluation().compile_time));
        last = Some(report);
    }
    let report = last.expect("at least one timed run (min_runs >= 1)");
    let ev = report.evaluation();
    let median_ms = median(&walls);
    // On a GPU the wall time is mostly the inputs' upload and the output's download
    // over PCIe; the kernels' own device time (CUDA events) is what meets the floor.
    let on_device = ev.backend == BackendKind::Cuda;
    let timed_ms = if on_device { median(&runs) } else { median_ms };
    let gbps = (case.kind == Kind::Throughput && timed_ms > 0.0)
        .then(|| ideal_bytes as f64 / (timed_ms * 1e-3) / 1e9);
    let throughput = case.kind == Kind::Throughput;
    let ops = if throughput && !on_device {
        kernel_ops(&report)
    } else {
        None
    };
    Ok(Row {
        name: case.name,
        expr: case.expr,
        inputs: case.inputs_text(),
        kind: case.kind,
        backend: ev.backend.name(),
        kernels: report.kernel_count(),
        interp_steps: ev
            .paths
            .iter()
            .filter(|p| matches!(p, StepPath::Interp | StepPath::KernelInterp { .. }))
            .count(),
        compiled_kernels: ev
            .paths
            .iter()
            .filter(|p| {
                matches!(
                    p,
                    StepPath::Jit { cached: false } | StepPath::Cuda { cached: false, .. }
                )
            })
            .count(),
        runs: walls.len(),
        median_ms,
        min_ms: walls.iter().copied().fold(f64::INFINITY, f64::min),
        run_ms: median(&runs),
        compile_ms: median(&compiles),
        ideal_bytes,
        gbps,
        fraction: gbps.map(|g| g / bandwidth_gbps),
        faults_per_eval: (faults.len() == walls.len()).then(|| median(&faults)),
        warmup_faults,
        ops: ops.map(|(o, _)| o),
        ops_per_element: ops.map(|(o, n)| o / n),
        memory_floor_ms: throughput.then(|| ideal_bytes as f64 / (bandwidth_gbps * 1e9) * 1e3),
        compute_floor_ms: ops.map(|(o, _)| o / peak_ops * 1e3),
    })
}

// ----- output -----

impl BenchReport {
    /// The whole report as one JSON object: `machine` (cores, CPU, the four measured
    /// bandwidths and the one used), `size`, and `rows`.
    pub fn to_json(&self) -> serde_json::Value {
        let m = &self.machine;
        let bw = &m.bandwidth;
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "expr": r.expr,
                    "inputs": r.inputs,
                    "kind": r.kind.name(),
                    "backend": r.backend,
                    "kernels": r.kernels,
                    "interp_steps": r.interp_steps,
                    "compiled_kernels": r.compiled_kernels,
                    "runs": r.runs,
                    "median_ms": r.median_ms,
                    "min_ms": r.min_ms,
                    "run_ms": r.run_ms,
                    "compile_ms": r.compile_ms,
                    "ideal_bytes": r.ideal_bytes,
                    "gbps": r.gbps,
                    "fraction_of_bandwidth": r.fraction,
                    "minor_faults_per_eval": r.faults_per_eval,
                    "warmup_minor_faults": r.warmup_faults,
                    "ops": r.ops,
                    "ops_per_element": r.ops_per_element,
                    "memory_floor_ms": r.memory_floor_ms,
                    "compute_floor_ms": r.compute_floor_ms,
                    "x_floor": r.x_floor(),
                    "floor_binds": r.floor().map(|(_, which)| which),
                })
            })
            .collect();
        serde_json::json!({
            "machine": {
                "cores": m.cores,
                "arch": m.arch,
                "os": m.os,
                "cpu": m.cpu,
                "bandwidth": {
                    "array_bytes": bw.array_bytes,
                    "trials": bw.trials,
                    "threads": bw.threads,
                    "copy_1t_gbps": bw.copy_1t_gbps,
                    "triad_1t_gbps": bw.triad_1t_gbps,
                    "copy_all_gbps": bw.copy_all_gbps,
                    "triad_all_gbps": bw.triad_all_gbps,
                    "gbps": bw.gbps(),
                    "source": bw.source(),
                },
                "compute": {
                    "trials": m.compute.trials,
                    "threads": m.compute.threads,
                    "vector_ops_per_s_1t": m.compute.ops_1t,
                    "vector_ops_per_s": m.compute.ops_all,
                },
                "device": m.device.as_ref().map(|(name, gbps)| serde_json::json!({
                    "name": name,
                    "copy_gbps": gbps,
                })),
            },
            "size": match self.size { Size::Full => "full", Size::Tiny => "tiny" },
            "rows": rows,
            "host_cache": {
                "hits": self.host_cache.hits,
                "misses": self.host_cache.misses,
                "uncacheable": self.host_cache.uncacheable,
                "bytes_cached": self.host_cache.bytes_cached,
                "high_water_mark": self.host_cache.high_water_mark,
                "max_host_cacheable_length": self.host_cache.limits.max_cacheable_length,
                "max_host_cache": self.host_cache.limits.max_cache,
            },
        })
    }

    /// The machine, its bandwidth and a Markdown table of the rows.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let bw = &m.bandwidth;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "machine: {} cores, {} {}{}",
            m.cores,
            m.os,
            m.arch,
            m.cpu
                .as_deref()
                .map(|c| format!(", {c}"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            s,
            "memory bandwidth (STREAM-like, 3 x {} MiB f32, best of {}): copy {:.1} GB/s, triad {:.1} GB/s on 1 thread; copy {:.1} GB/s, triad {:.1} GB/s on {} threads",
            bw.array_bytes >> 20,
            bw.trials,
            bw.copy_1t_gbps,
            bw.triad_1t_gbps,
            bw.copy_all_gbps,
            bw.triad_all_gbps,
            bw.threads
        );
        let _ = writeln!(
            s,
            "machine bandwidth = the largest: {:.1} GB/s ({})",
            bw.gbps(),
            bw.source()
        );
        let _ = writeln!(
            s,
            "compute peak (independent f32x4 mul/add chains, best of {}): {:.2} G vector ops/s on 1 thread, {:.2} G on {} threads: the compute floor's rate",
            m.compute.trials,
            m.compute.ops_1t / 1e9,
            m.compute.ops_all / 1e9,
            m.compute.threads
        );
        if let Some((name, gbps)) = &m.device {
            let _ = writeln!(
                s,
                "device: {name}, device-to-device copy {gbps:.1} GB/s (read + written): the floor of the rows below, timed by CUDA events (transfers excluded)"
            );
        }
        s.push('\n');
        s.push_str("| case | expression | inputs | kernels | runs | median ms | ideal MB | GB/s | of bandwidth | ops/elem | compute floor ms | x floor | faults/eval | note |\n");
        s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for r in &self.rows {
            let kernels = match r.interp_steps {
                0 => r.kernels.to_string(),
                n => format!(
                    "{} ({n} step{} interpreted)",
                    r.kernels,
                    if n == 1 { "" } else { "s" }
                ),
            };
            let note = match r.kind {
                Kind::Throughput => String::new(),
                Kind::CompileNew => format!("JIT {:.3} ms of it", r.compile_ms),
                Kind::Cached => format!(
                    "overhead {:.1} µs (wall less kernel time)",
                    (r.median_ms - r.run_ms).max(0.0) * 1e3
                ),
            };
            let _ = writeln!(
                s,
                "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.expr,
                r.inputs,
                kernels,
                r.runs,
                if r.median_ms < 10.0 {
                    format!("{:.3}", r.median_ms)
                } else {
                    format!("{:.1}", r.median_ms)
                },
                if r.kind == Kind::Throughput {
                    format!("{:.1}", r.ideal_bytes as f64 / 1e6)
                } else {
                    "-".into()
                },
                r.gbps.map_or_else(|| "-".into(), |g| format!("{g:.2}")),
                r.fraction
                    .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
                r.ops_per_element
                    .map_or_else(|| "-".into(), |o| format!("{o:.1}")),
                r.compute_floor_ms
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                r.x_floor()
                    .zip(r.floor())
                    .map_or_else(|| "-".into(), |(x, (_, which))| format!("{x:.2}x {which}")),
                r.faults_per_eval
                    .map_or_else(|| "-".into(), |f| format!("{f:.0}")),
                note
            );
        }
        let _ = writeln!(
            s,
            "\nfaults/eval: minor page faults of one timed eval (median); host buffer cache after the run: {}",
            self.host_cache
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_bytes_are_inputs_once_plus_the_output_once() {
        let ctx = Context::new();
        const M: u64 = 1 << 20;
        let want: &[(&str, u64)] = &[
            ("gelu", 2 * 64 * M),                     // 16M f32 in, 16M f32 out
            ("chain", 4 * 64 * M),                    // three inputs, one output
            ("softmax", 2 * 64 * M),                  // [4096,4096] in and out
            ("layernorm", 2 * 32 * M),                // [8192,1024] in and out
            ("sum", 256 * M + 4),                     // 64M f32 in, one f32 out
            ("colsum", 64 * M + 4096 * 4),            // [4096,4096] in, [4096] out
            ("broadcast", 2 * 64 * M + 2 * 4096 * 4), // a and out, b and c
            ("gelu_f16", 2 * 32 * M),                 // 16M f16 in and out
            ("compile_new", 2 * 4000),
            ("compile_cached", 2 * 4000),
        ];
        let all = cases(Size::Full);
        assert_eq!(all.len(), want.len());
        for (case, (name, bytes)) in all.iter().zip(want) {
            assert_eq!(case.name, *name);
            assert_eq!(case.ideal_bytes(&ctx).expect("builds"), *bytes, "{name}");
        }
        // The tiny cases are the same cases.
        let names: Vec<_> = cases(Size::Tiny).iter().map(|c| c.name).collect();
        assert_eq!(names, all.iter().map(|c| c.name).collect::<Vec<_>>());
    }

    #[test]
    fn the_cases_compute_what_they_say() {
        let ctx = Context::new();
        for case in cases(Size::Tiny) {
            let inputs = case.make_inputs(&ctx).expect("data");
            let out = case.build(&inputs, 2.0).eval().expect("evaluates");
            // The same graph on the f64 reference interpreter agrees.
            let interp = Context::builder()
                .backend(BackendKind::Interp)
                .build()
                .expect("context");
            let want = interp
                .eval(&[&case.build(&inputs, 2.0)])
                .expect("reference");
            let (got, want) = (out.to_f64_vec(), want[0].to_f64_vec());
            assert_eq!(got.len(), want.len(), "{}", case.name);
            let tol = if case.name.ends_with("f16") {
                1e-2
            } else {
                1e-4
            };
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= tol * w.abs().max(1.0),
                    "{}: {g} vs {w}",
                    case.name
                );
            }
        }
    }

    #[test]
    fn input_data_is_seeded_and_in_range() {
        let ctx = Context::new();
        let a = input_data(&ctx, &[1000], DType::F32, 3)
            .and_then(|t| t.eval())
            .expect("a");
        let b = input_data(&ctx, &[1000], DType::F32, 3)
            .and_then(|t| t.eval())
            .expect("b");
        assert_eq!(a, b);
        assert!(a.to_f64_vec().iter().all(|v| (-1.0..1.0).contains(v)));
        let h = input_data(&ctx, &[4], DType::F16, 3).expect("f16");
        assert_eq!(h.dtype().expect("dtype"), DType::F16);
    }

    #[test]
    fn bandwidth_picks_the_largest_figure_and_says_which() {
        let bw = Bandwidth {
            array_bytes: 1 << 20,
            trials: 1,
            threads: 2,
            copy_1t_gbps: 9.0,
            triad_1t_gbps: 10.0,
            copy_all_gbps: 11.0,
            triad_all_gbps: 10.5,
        };
        assert_eq!(bw.gbps(), 11.0);
        assert_eq!(bw.source(), "copy, 2 threads");
        let measured = measure_bandwidth(1 << 20, 1);
        assert_eq!(measured.array_bytes, 1 << 20);
        for g in [
            measured.copy_1t_gbps,
            measured.triad_1t_gbps,
            measured.copy_all_gbps,
            measured.triad_all_gbps,
        ] {
            assert!(g.is_finite() && g > 0.0, "{measured:?}");
        }
    }

    #[test]
    fn rows_have_a_compute_floor_and_say_which_floor_binds() {
        let report = run_suite(None, &BenchOptions::tiny()).expect("runs");
        let peak = &report.machine.compute;
        assert!(
            peak.ops_1t > 0.0 && peak.ops_all >= peak.ops_1t * 0.5,
            "{peak:?}"
        );
        let row = |name: &str| {
            report
                .rows
                .iter()
                .find(|r| r.name == name)
                .unwrap_or_else(|| panic!("no row {name}"))
        };
        let ops = |name: &str| row(name).ops_per_element.expect("ops counted");
        // A tanh per element costs many times a multiply-add streamed through.
        assert!(
            ops("gelu") > 3.0 * ops("broadcast"),
            "{} vs {}",
            ops("gelu"),
            ops("broadcast")
        );
        // A vector sum: a load and an add per 4 lanes, plus the loop's share.
        assert!(ops("sum") > 0.2 && ops("sum") < 3.0, "{}", ops("sum"));
        for r in report.rows.iter().filter(|r| r.kind == Kind::Throughput) {
            let (floor, which) = r.floor().expect("throughput rows have floors");
            let larger = r
                .memory_floor_ms
                .expect("memory")
                .max(r.compute_floor_ms.expect("compute"));
            assert_eq!(floor, larger, "{}", r.name);
            assert_eq!(which == "compute", r.compute_floor_ms > r.memory_floor_ms);
            assert!(r.x_floor().expect("ratio") > 0.0);
        }
        assert!(row("compile_cached").floor().is_none());
        let table = report.table();
        assert!(
            table.contains("| ops/elem | compute floor ms | x floor |"),
            "{table}"
        );
        assert!(table.contains("compute peak (independent f32x4"), "{table}");
        let json = report.to_json();
        assert!(json["rows"][0]["compute_floor_ms"].is_number(), "{json}");
        assert!(
            json["machine"]["compute"]["vector_ops_per_s"].is_number(),
            "{json}"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn a_filter_that_matches_nothing_lists_the_cases() {
        let e = run_suite(Some("nope"), &BenchOptions::tiny()).expect_err("no case");
        let text = e.to_string();
        assert!(
            text.contains("no case matches 'nope'") && text.contains("colsum"),
            "{text}"
        );
    }

    #[test]
    fn rows_count_page_faults_and_timed_runs_reuse_cached_buffers() {
        let report = run_suite(Some("gelu"), &BenchOptions::tiny()).expect("runs");
        assert!(report.rows.iter().all(|r| r.faults_per_eval.is_some()));
        // Each timed run drops its output before the next: the next one reuses it.
        assert!(report.host_cache.hits >= report.rows.len() as u64);
        let table = report.table();
        assert!(table.contains("| faults/eval |"), "{table}");
        assert!(
            table.contains("host buffer cache after the run: "),
            "{table}"
        );
    }
}
