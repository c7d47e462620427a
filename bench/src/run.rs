//! Running the suite: each case timed end to end (warm-up, then timed runs within a
//! budget), set against the floors, one row each.

use crate::cases::{cases_on, Case, Versus};
use crate::machine::{
    cpu_model, measure_bandwidth, measure_compute_peak, measure_fma_peak, measure_read_bandwidth,
    measure_widest_compute_peak, Bandwidth, DeviceFloor, Machine,
};
use crate::options::{BenchOptions, Kind, Size};
use crate::peak::{measure_bf16_dot_peak, measure_tier_fma_peak};
use crate::training::{run_parallel, run_step, training_names, TrainingRow, STEP_NAME};
use ndfuse::{BackendKind, Context, Error, Report, Result, Tensor};
use ndfuse_runtime::{ProductTier, StepPath};
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    /// Steps of one evaluation run by a native routine of the backend (scatter-add,
    /// scans, sorts).
    pub routine_steps: usize,
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
    /// For a case that mostly reads ([`Case::mostly_reads`]: `sum`, `colsum`) on the
    /// host, `gbps` over the machine's read-only bandwidth measured in the same run:
    /// 1.0 is reading as fast as the machine can.
    pub read_fraction: Option<f64>,
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
    /// The wide compute floor, ms: the lane operations of `ops` (4 for each counted
    /// operation, which the cost model counts at 128 bits) at the lane rate of the
    /// widest-vector multiply/add probe on all threads ([`Machine::wide`]); that is,
    /// as if every counted operation became `lanes / 4` times fewer operations of the
    /// widest vectors, each as fast as the probe's multiplies and adds. For the matrix
    /// products, `flops` over the widest-vector FMA peak on all threads. The compute
    /// floor [`Row::floor`] and [`Row::x_floor`] use.
    pub compute_floor_ms: Option<f64>,
    /// The 128-bit floor, ms: `ops` at the f32x4 probe's rate on all threads
    /// ([`Machine::compute`], the JIT's width today); for the matrix products, `flops`
    /// at that probe's rate in FLOP/s (4 per vector multiply or add).
    pub floor_128_ms: Option<f64>,
    /// The case's floating-point operations ([`Case::flops`]); `None` but for the
    /// matrix products.
    pub flops: Option<f64>,
    /// `flops` over the time, GFLOP/s (10^9 a second).
    pub gflops: Option<f64>,
    /// `gflops` over this machine's widest-vector FMA peak on all threads, measured in
    /// the same run: 1.0 is the peak. `None` on a GPU (the peak is the host's).
    pub fma_peak_fraction: Option<f64>,
    /// For a product row on the CPU: the micro-kernels it ran on (`AVX-512F`,
    /// `AVX2+FMA`, `scalar`) and `gflops` over the FMA peak at their width, measured in
    /// the same run (`None` for the scalar tier); the same as `fma_peak_fraction` where
    /// the tier is the widest.
    pub product_tier: Option<(&'static str, Option<f64>)>,
    /// The time set against another measured in the same run ([`Case::versus`]).
    pub versus: Option<Compared>,
}

/// A row's time against another measured in the same run.
#[derive(Clone, Debug, PartialEq)]
pub struct Compared {
    /// What the other time is: `bare x @ w`, `f32 operands`.
    pub what: String,
    /// Its median, ms (device time on a GPU, as the row's own).
    pub median_ms: f64,
    /// The row's time over it: 1.05 is 5% slower. The median of the turns' ratios:
    /// each of the row's runs over the peer's run timed beside it, so a stretch
    /// of the machine's noise that slows one turn slows both of its runs and cancels
    /// (the ratio of the two medians moved by 6% between runs on the 2-core VM).
    pub ratio: f64,
    /// The lowest and highest of the turns' ratios.
    pub ratio_range: (f64, f64),
}

impl Row {
    /// The larger of the memory floor and the wide compute floor, ms, and which it is
    /// (`memory` or `compute`).
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
    /// The training rows run (names containing the filter), after the cases: the step
    /// row, then the parallel rows.
    pub training: Vec<TrainingRow>,
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
    /// A training row is about to run.
    TrainingStart {
        /// The row's name.
        name: &'static str,
    },
    /// A training row finished.
    TrainingDone(&'a TrainingRow),
}

/// Runs the cases and training rows whose name contains `filter` (every one for `None`)
/// and returns a row for each, after measuring the machine's bandwidth and peaks.
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
    let all = cases_on(opts.size, opts.backend == BackendKind::Cuda);
    let selected: Vec<&Case> = all
        .iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .collect();
    let keep = |name: &str| filter.is_none_or(|f| name.contains(f));
    let training: Vec<&str> = training_names().into_iter().filter(|n| keep(n)).collect();
    if selected.is_empty() && training.is_empty() {
        let names: Vec<&str> = all.iter().map(|c| c.name).chain(training_names()).collect();
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
    let read = measure_read_bandwidth(opts.read_bytes, opts.stream_trials);
    on_event(Event::Bandwidth(&bandwidth));
    let compute = measure_compute_peak(opts.peak_iterations, opts.stream_trials);
    let wide = measure_widest_compute_peak(opts.peak_iterations, opts.stream_trials, &compute);
    let fma = measure_fma_peak(opts.peak_iterations, opts.stream_trials, &compute);
    // The products' own tier: its peak is the widest one's unless the tier is narrower
    // (`NDFUSE_CPU_WIDE=avx2` on an AVX-512 host), when it is measured too.
    let tier = ProductTier::current();
    let tier_fma = if tier.f32_lanes() == fma.lanes {
        Some(fma.clone())
    } else {
        measure_tier_fma_peak(tier, opts.peak_iterations, opts.stream_trials)
    };
    let device = device_floor(opts)?;
    let floor = device.as_ref().map_or(bandwidth.gbps(), |d| d.copy_gbps);
    // A GPU's products are set against the GPU's FMA peak, not the host's.
    let fma_flops = device
        .as_ref()
        .map_or(fma.flops_all, |d| d.fma_gflops * 1e9);
    let ctx = Context::builder().backend(opts.backend).build()?;
    let mut rows = Vec::with_capacity(selected.len());
    for (i, case) in selected.iter().enumerate() {
        on_event(Event::CaseStart {
            index: i + 1,
            total: selected.len(),
            case,
        });
        let peaks = Peaks {
            bandwidth_gbps: floor,
            read_gbps: device.is_none().then(|| read.gbps()),
            vector_ops: compute.ops_all,
            f32x4_flops: compute.flops_all(),
            wide_lane_ops: wide.flops_all(),
            fma_flops,
            // A GPU's products run on the GPU: no CPU tier.
            product_tier: device
                .is_none()
                .then(|| (tier.name(), tier_fma.as_ref().map_or(0.0, |f| f.flops_all))),
        };
        let row = run_case(&ctx, case, opts, &peaks)?;
        on_event(Event::CaseDone(&row));
        rows.push(row);
    }
    let mut training_rows = Vec::new();
    if training.contains(&STEP_NAME) {
        on_event(Event::TrainingStart { name: STEP_NAME });
        // The FMA peak is the host's: no fraction of it for a step run on a GPU.
        let host_peak = (opts.backend != BackendKind::Cuda).then_some(fma.flops_all);
        let row = TrainingRow::Step(run_step(&ctx, opts, host_peak)?);
        on_event(Event::TrainingDone(&row));
        training_rows.push(row);
    }
    let parallel: Vec<&str> = training
        .iter()
        .copied()
        .filter(|n| *n != STEP_NAME)
        .collect();
    if !parallel.is_empty() {
        let rows = run_parallel(opts, &|n| parallel.contains(&n), &mut |name| {
            on_event(Event::TrainingStart { name })
        })?;
        for row in rows {
            let row = TrainingRow::Parallel(row);
            on_event(Event::TrainingDone(&row));
            training_rows.push(row);
        }
    }
    Ok(BenchReport {
        machine: Machine {
            cores: bandwidth.threads,
            arch: std::env::consts::ARCH,
            os: std::env::consts::OS,
            cpu: cpu_model(),
            bandwidth,
            read,
            compute,
            wide,
            fma,
            product_tier: (tier.name(), tier_fma),
            bf16_dot: measure_bf16_dot_peak(opts.peak_iterations, opts.stream_trials),
            device,
        },
        size: opts.size,
        rows,
        training: training_rows,
        host_cache: ndfuse_runtime::host_cache_stats(),
    })
}

/// For `--backend cuda`: device 0, its copy bandwidth over 2^26 f32 (256 MiB), best
/// of five copies, and its f32 FMA peak, best of five probes; `None` for the other
/// backends.
#[cfg(feature = "cuda")]
fn device_floor(opts: &BenchOptions) -> Result<Option<DeviceFloor>> {
    if opts.backend != BackendKind::Cuda {
        return Ok(None);
    }
    let cfg = ndfuse_runtime::Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
    let dev = ndfuse_runtime::cuda_device(0, &cfg)?;
    let bytes = match opts.size {
        Size::Full => 1 << 28,
        Size::Tiny => 1 << 20,
    };
    Ok(Some(DeviceFloor {
        name: dev.describe(),
        copy_gbps: dev.copy_bandwidth(bytes, 5)?,
        fma_gflops: dev.fma_peak(5)?,
    }))
}

#[cfg(not(feature = "cuda"))]
fn device_floor(_: &BenchOptions) -> Result<Option<DeviceFloor>> {
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

pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median, lowest and highest of `own[i] / peer[i]` over the turns where the peer
/// took time; `None` when it took none in any.
pub(crate) fn paired_ratios(own: &[f64], peer: &[f64]) -> Option<(f64, (f64, f64))> {
    let ratios: Vec<f64> = own
        .iter()
        .zip(peer)
        .filter(|(_, &p)| p > 0.0)
        .map(|(&o, &p)| o / p)
        .collect();
    let lo = ratios.iter().copied().reduce(f64::min)?;
    let hi = ratios.iter().copied().reduce(f64::max)?;
    Some((median(&ratios), (lo, hi)))
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

/// The machine's rates a row is set against.
struct Peaks {
    /// Bandwidth of the memory floor, GB/s.
    bandwidth_gbps: f64,
    /// The host's read-only bandwidth, GB/s; `None` on a GPU.
    read_gbps: Option<f64>,
    /// 128-bit vector operations a second on all threads (the JIT kernels' 128-bit
    /// floor).
    vector_ops: f64,
    /// The same in FLOP/s (4 per operation): the products' 128-bit floor.
    f32x4_flops: f64,
    /// Widest-vector multiply/add lane operations a second on all threads (the wide
    /// floor).
    wide_lane_ops: f64,
    /// Widest-vector f32 FLOP/s on all threads (the matrix products' floor).
    fma_flops: f64,
    /// The CPU products' micro-kernel tier and the f32 FMA peak at its width, FLOP/s on
    /// all threads (0 for the scalar tier); `None` on a GPU.
    product_tier: Option<(&'static str, f64)>,
}

/// The timed runs of one output: a warm-up, then runs within the options' budget.
struct Runs {
    /// Minor page faults of the warm-up.
    warmup_faults: Option<u64>,
    /// Wall time of each run, ms.
    walls: Vec<f64>,
    /// The runtime's own step time of each run, ms.
    runs: Vec<f64>,
    /// JIT compile time of each run, ms.
    compiles: Vec<f64>,
    /// Minor page faults of each run (empty where the OS does not count them).
    faults: Vec<f64>,
    /// The last run's report.
    report: Report,
}

/// Times `output`: up to `max_runs` runs, fewer once the time budget is spent; or,
/// `all_turns`, three times `max_runs`, all of them (see [`time_interleaved`]).
fn time_runs(
    ctx: &Context,
    output: &dyn Fn() -> Tensor,
    opts: &BenchOptions,
    all_turns: bool,
) -> Result<Runs> {
    let [runs] = time_interleaved(ctx, [output], opts, all_turns)?;
    Ok(runs)
}

/// Times each of `outputs` as [`time_runs`] does, taking turns (one run of each, in
/// the reverse order every other turn): what slows the machine for a while slows them
/// alike, so the ratio within a
/// turn is steadier than that of two series timed one after the other (the row's ratio
/// is the median of the turns', [`paired_ratios`]). The budget is per output. With `all_turns` (always with a peer) each output runs three times
/// `max_runs` times, whatever the budget.
fn time_interleaved<const N: usize>(
    ctx: &Context,
    outputs: [&dyn Fn() -> Tensor; N],
    opts: &BenchOptions,
    all_turns: bool,
) -> Result<[Runs; N]> {
    // Warm-up: compiles the kernels (and, for the compile case, initialises whatever
    // the first JIT of the process initialises), so compile time stays out of the
    // timed runs of the others.
    let mut warmup_faults = [None; N];
    for (w, output) in warmup_faults.iter_mut().zip(&outputs) {
        *w = timed_eval(ctx, &output())?.faults;
    }
    let mut walls: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    let mut runs: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    let mut compiles: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    let mut faults: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    let mut last: [Option<Report>; N] = std::array::from_fn(|_| None);
    let started = Instant::now();
    let budget = opts.time_budget * N as u32;
    // Outputs timed in turns make a ratio, the row's point, and the products' rows a
    // fraction of the FMA peak their targets are close to: they take three times the
    // turns `max_runs` gives a row, and all of them. On the shared development VM one
    // turn's ratio of `gelu(x @ w + b)` to `x @ w` ranged from 0.80x to 1.27x within a
    // run, and the median of 10 turns read 1.03x, 1.04x and 1.06x in three runs; of 30
    // turns, 1.035x to 1.045x. A stretch of noise took the median of 10 runs of the
    // 2048^3 product from 88% of the peak to 73% in one run.
    let all_turns = all_turns || N > 1;
    let max_runs = if all_turns { 3 } else { 1 } * opts.max_runs.max(1);
    let min_runs = if all_turns {
        max_runs
    } else {
        opts.min_runs.clamp(1, max_runs)
    };
    while walls[0].len() < max_runs && (walls[0].len() < min_runs || started.elapsed() < budget) {
        // Every other turn in the reverse order (A B, B A, ...): the second run of a
        // turn finds what the first left in the caches (the shared inputs), so a fixed
        // order would favour one side.
        let turn = walls[0].len();
        for k in 0..N {
            let i = if turn.is_multiple_of(2) { k } else { N - 1 - k };
            let out = outputs[i]();
            let Timed {
                wall,
                faults: f,
                report,
            } = timed_eval(ctx, &out)?;
            walls[i].push(wall);
            faults[i].extend(f.map(|f| f as f64));
            runs[i].push(ms(report.evaluation().run_time));
            compiles[i].push(ms(report.evaluation().compile_time));
            last[i] = Some(report);
        }
    }
    let mut parts = walls
        .into_iter()
        .zip(runs)
        .zip(compiles)
        .zip(faults)
        .zip(last);
    Ok(std::array::from_fn(|i| {
        let ((((walls, runs), compiles), faults), report) =
            parts.next().expect("one of each per output");
        Runs {
            warmup_faults: warmup_faults[i],
            walls,
            runs,
            compiles,
            faults,
            report: report.expect("at least one timed run (min_runs >= 1)"),
        }
    }))
}

fn run_case(ctx: &Context, case: &Case, opts: &BenchOptions, peaks: &Peaks) -> Result<Row> {
    let bandwidth_gbps = peaks.bandwidth_gbps;
    let inputs = case.make_inputs(ctx)?;
    let ideal_bytes = case.ideal_bytes(ctx)?;
    let mostly_reads = case.mostly_reads(ctx)?;
    // The cached case's graph, built once; the compile case builds a new one per run.
    let fixed = case.build(&inputs, 1.0);
    let output = || match case.kind {
        Kind::CompileNew => case.build(&inputs, fresh_salt()),
        Kind::Throughput | Kind::Cached => fixed.clone(),
    };
    // A case compared with another build of the same inputs takes turns with it.
    let other = match case.versus {
        Some(Versus::Build(what, build)) => Some((what, build(&inputs, 1.0))),
        Some(Versus::Dtype(what, dtype)) => {
            let casts: Vec<Tensor> = inputs.iter().map(|t| t.cast(dtype)).collect();
            let values = ctx.eval(&casts.iter().collect::<Vec<_>>())?;
            let peers: Vec<Tensor> = values.into_iter().map(|a| ctx.tensor(a)).collect();
            Some((what, case.build(&peers, 1.0)))
        }
        None => None,
    };
    let (mine, theirs) = match &other {
        Some((_, t)) => {
            let [mine, theirs] = time_interleaved(ctx, [&output, &|| t.clone()], opts, true)?;
            (mine, Some(theirs))
        }
        None => {
            // A product's row is read against the FMA peak: all of its turns.
            let product = case.flops.is_some() && case.kind == Kind::Throughput;
            (time_runs(ctx, &output, opts, product)?, None)
        }
    };
    let Runs {
        warmup_faults,
        walls,
        runs,
        compiles,
        faults,
        report,
    } = mine;
    let ev = report.evaluation();
    let median_ms = median(&walls);
    // On a GPU the wall time is mostly the inputs' upload and the output's download
    // over PCIe; the kernels' own device time (CUDA events) is what meets the floor.
    let on_device = ev.backend == BackendKind::Cuda;
    let timed_ms = if on_device { median(&runs) } else { median_ms };
    // The other output of the same inputs, timed in turns with this one; rows are
    // filled in by `run_suite_with`.
    let versus = match (other, theirs) {
        (Some((what, _)), Some(r)) => {
            let (own, peer) = if on_device {
                (&runs, &r.runs)
            } else {
                (&walls, &r.walls)
            };
            let base = median(peer);
            paired_ratios(own, peer).map(|(ratio, ratio_range)| Compared {
                what: what.to_string(),
                median_ms: base,
                ratio,
                ratio_range,
            })
        }
        _ => None,
    };
    let flops = case.flops.map(|f| f as f64);
    // An f64 case's FLOPs run at half the f32 rate (half the lanes a vector, the same
    // FMAs a cycle): its peaks and floors are the f32 probes' halves.
    let lanes = if case.inputs.first().map(|i| i.2) == Some(ndfuse_ir::DType::F64) {
        0.5
    } else {
        1.0
    };
    let gflops = flops
        .filter(|_| timed_ms > 0.0)
        .map(|f| f / (timed_ms * 1e-3) / 1e9);
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
        routine_steps: ev
            .paths
            .iter()
            .filter(|p| matches!(p, StepPath::Routine { .. }))
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
        read_fraction: gbps
            .zip(peaks.read_gbps)
            .filter(|_| mostly_reads && !on_device)
            .map(|(g, read)| g / read),
        faults_per_eval: (faults.len() == walls.len()).then(|| median(&faults)),
        warmup_faults,
        ops: ops.map(|(o, _)| o),
        ops_per_element: ops.map(|(o, n)| o / n),
        memory_floor_ms: throughput.then(|| ideal_bytes as f64 / (bandwidth_gbps * 1e9) * 1e3),
        compute_floor_ms: match flops {
            Some(f) if throughput => Some(f / (peaks.fma_flops * lanes) * 1e3),
            _ => ops.map(|(o, _)| 4.0 * o / peaks.wide_lane_ops * 1e3),
        },
        // The host's 128-bit probe: no floor of a GPU's rows.
        floor_128_ms: match flops {
            _ if on_device => None,
            Some(f) if throughput => Some(f / (peaks.f32x4_flops * lanes) * 1e3),
            _ => ops.map(|(o, _)| o / peaks.vector_ops * 1e3),
        },
        flops,
        gflops,
        fma_peak_fraction: gflops
            .filter(|_| peaks.fma_flops > 0.0)
            .map(|g| g * 1e9 / (peaks.fma_flops * lanes)),
        product_tier: gflops.and(peaks.product_tier).map(|(name, peak)| {
            (
                name,
                gflops
                    .filter(|_| peak > 0.0)
                    .map(|g| g * 1e9 / (peak * lanes)),
            )
        }),
        versus,
    })
}
