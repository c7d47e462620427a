//! The suite's training rows (issues 14 and 15): one training step of an MLP (forward,
//! backward, Adam) set against this machine's FMA peak, and data-parallel training
//! (`ParallelWrapper`) over CPU devices set against one worker of one thread.

use crate::options::{BenchOptions, Size};
use ndfuse::{Array, Context, CpuDevice, Device, DeviceSet, Error, Result, Tensor};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::ParallelWrapper;
use std::panic::Location;
use std::sync::Arc;
use std::time::Instant;

/// Warm-up steps of the step row before its timed steps: the first compiles the step's
/// kernels; the next ones bring the optimiser's state and the host cache to their
/// steady state.
pub const WARMUP_STEPS: usize = 3;

/// The step row's name.
pub const STEP_NAME: &str = "train_step_mlp";

/// The model and batch of the training rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The MLP's layer widths: input, hidden layers, classes.
    pub widths: [usize; 4],
    /// Samples of one batch (per worker in the parallel rows).
    pub batch: usize,
    /// Batches of the parallel rows' data set (each of `batch` samples): enough that
    /// frequency 8 on 2 workers (16 batches a round) averages twice per epoch.
    pub batches: usize,
}

impl Shape {
    /// The shape of the rows at `size`: the issues' 784-512-512-10 ReLU MLP on batch 128,
    /// or a 16-32-32-10 one on batch 8 for tests.
    pub fn of(size: Size) -> Shape {
        match size {
            Size::Full => Shape {
                widths: [784, 512, 512, 10],
                batch: 128,
                batches: 32,
            },
            Size::Tiny => Shape {
                widths: [16, 32, 32, 10],
                batch: 8,
                batches: 32,
            },
        }
    }

    /// `784-512-512-10 relu`.
    pub fn model_text(&self) -> String {
        let w = self.widths.map(|w| w.to_string());
        format!("{} relu", w.join("-"))
    }

    /// Floating-point operations of the products of one training step, `2*M*N*K` each:
    ///
    /// `2*B*(2*(d0*d1 + d1*d2 + d2*d3) + d1*d2 + d2*d3)`
    ///
    /// that is, for each of the three layers the forward product `x @ w` and the weight
    /// gradient `xᵀ @ dy` (the first term), and the input gradients `dy @ wᵀ` of layers
    /// 2 and 3 only: the first layer's input is data, not a parameter, so its gradient
    /// is never asked for and no kernel computes it (the step's kernel list has five
    /// products beside the three forward ones, not six). Element-wise work (bias, ReLU,
    /// softmax, Adam) is not counted: it is memory-bound and small beside the products.
    /// For 784-512-512-10 on batch 128: 410,779,648.
    pub fn step_flops(&self) -> u64 {
        let [d0, d1, d2, d3] = self.widths.map(|w| w as u64);
        let b = self.batch as u64;
        2 * b * (2 * (d0 * d1 + d1 * d2 + d2 * d3) + d1 * d2 + d2 * d3)
    }
}

/// The parallel configurations: (row name, workers, threads per worker, averaging
/// frequency). The first is the baseline the others are set against.
const PARALLEL: [(&str, usize, usize, u64); 4] = [
    ("train_parallel_1w1t", 1, 1, 1),
    ("train_parallel_1w2t", 1, 2, 1),
    ("train_parallel_2w1t_f1", 2, 1, 1),
    ("train_parallel_2w1t_f8", 2, 1, 8),
];

/// The names of the training rows, in suite order.
pub fn training_names() -> Vec<&'static str> {
    std::iter::once(STEP_NAME)
        .chain(PARALLEL.iter().map(|p| p.0))
        .collect()
}

/// One training step (forward, backward, Adam) of the MLP, timed.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRow {
    /// `train_step_mlp`.
    pub name: &'static str,
    /// `784-512-512-10 relu`.
    pub model: String,
    /// Samples of the batch.
    pub batch: usize,
    /// The backend that ran it.
    pub backend: &'static str,
    /// Kernels launched by one step ([`ndfuse::Report::kernel_count`]).
    pub kernels: usize,
    /// Timed steps (after [`WARMUP_STEPS`] warm-up steps).
    pub runs: usize,
    /// Median wall time of a step (`Trainer::step_report`, end to end), ms.
    pub median_ms: f64,
    /// Fastest step, ms.
    pub min_ms: f64,
    /// The products' FLOPs of one step ([`Shape::step_flops`]).
    pub flops: f64,
    /// `flops` over the median, GFLOP/s.
    pub gflops: f64,
    /// `gflops` over this machine's widest-vector FMA peak on all threads, measured in
    /// the same run (the matmul rows' peak); `None` on a GPU (the peak is the host's).
    pub fma_peak_fraction: Option<f64>,
    /// Host buffers allocated per timed step: the host cache's misses over the timed
    /// steps, divided by the steps (0: every buffer came from the cache).
    pub allocations_per_step: f64,
    /// The loss of the last timed step (finite, or the step is broken).
    pub loss: f64,
}

/// Data-parallel training (`ParallelWrapper`) over CPU devices: one epoch per timed run.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelRow {
    /// `train_parallel_2w1t_f8`.
    pub name: &'static str,
    /// `784-512-512-10 relu`.
    pub model: String,
    /// Workers (replicas), one per CPU device.
    pub workers: usize,
    /// Threads of each worker's device.
    pub threads_per_worker: usize,
    /// Averaging frequency: 1 averages gradients every step, k averages parameters
    /// every k steps.
    pub frequency: u64,
    /// Samples of a worker's batch.
    pub batch: usize,
    /// Samples of the data set (one epoch).
    pub samples: usize,
    /// Timed epochs (after one warm-up epoch).
    pub runs: usize,
    /// Median samples a second of a timed epoch ([`ndfuse_train::ParallelReport::samples_per_sec`]).
    pub samples_per_sec: f64,
    /// Averaging rounds of one epoch.
    pub rounds: u64,
    /// Time spent averaging (and, at frequency 1, taking the shared optimiser step) per
    /// round, ms: the median epoch's.
    pub averaging_ms_per_round: f64,
    /// Each worker's busy time over the epoch's wall time (median epoch).
    pub busy_fraction: Vec<f64>,
    /// `samples_per_sec / (threads * baseline samples_per_sec)`, where `threads` is
    /// `workers * threads_per_worker` (the workers for the 2 x 1-thread rows) and the
    /// baseline is one worker of one thread (`train_parallel_1w1t`) in the same run;
    /// `None` when the baseline did not run. 1.0 is linear scaling in the threads, so
    /// one worker of 2 threads is judged by the same measure as 2 workers of 1.
    pub efficiency: Option<f64>,
    /// The mean training loss of the last timed epoch.
    pub loss: f64,
}

/// A training row: one step, or data-parallel training.
#[derive(Clone, Debug, PartialEq)]
pub enum TrainingRow {
    /// [`StepRow`].
    Step(StepRow),
    /// [`ParallelRow`].
    Parallel(ParallelRow),
}

impl TrainingRow {
    /// The row's name.
    pub fn name(&self) -> &'static str {
        match self {
            TrainingRow::Step(r) => r.name,
            TrainingRow::Parallel(r) => r.name,
        }
    }
}

/// The bench's errors are the tensor library's: a training error that is not one is
/// reported as the bench's, with its message.
#[track_caller]
fn bench_error(e: ndfuse_train::Error) -> Error {
    let at = Location::caller();
    match e {
        ndfuse_train::Error::Tensor(e) | ndfuse_train::Error::Nn(ndfuse_nn::Error::Tensor(e)) => e,
        e => Error::Argument {
            what: "bench training",
            why: e.to_string(),
            at,
        },
    }
}

#[track_caller]
fn nn_error(e: ndfuse_nn::Error) -> Error {
    bench_error(e.into())
}

/// Seeded random normal features `[n, d]` and labels `i % classes` (i64).
fn data(ctx: &Context, n: usize, d: usize, classes: usize) -> Result<(Array, Array)> {
    let x = ctx.rand_normal(&[n, d], 0.0, 1.0, 7).eval()?;
    let labels: Vec<i64> = (0..n).map(|i| (i % classes) as i64).collect();
    let y = Array::from_vec(labels, &[n])?;
    Ok((x, y))
}

/// The MLP of `shape` with Adam, in `ctx`.
fn trainer(ctx: &Context, shape: &Shape) -> Result<Trainer<Sequential>> {
    let model = Sequential::mlp(ctx, &shape.widths, Activation::Relu, 1).map_err(nn_error)?;
    let opt = Optimizer::adam(&model.parameters(), 1e-3);
    Trainer::new(model, opt, Loss::CrossEntropy).map_err(nn_error)
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

/// Whether another timed run is due: fewer than `min_runs`, or fewer than `max_runs`
/// within the time budget (the rules of the other rows).
fn more_runs(done: usize, started: Instant, opts: &BenchOptions) -> bool {
    let max_runs = opts.max_runs.max(1);
    let min_runs = opts.min_runs.clamp(1, max_runs);
    done < max_runs && (done < min_runs || started.elapsed() < opts.time_budget)
}

/// Times one training step of the MLP in `ctx`; `fma_flops` is the machine's
/// widest-vector FMA peak on all threads (FLOP/s), `None` on a GPU.
pub fn run_step(ctx: &Context, opts: &BenchOptions, fma_flops: Option<f64>) -> Result<StepRow> {
    let shape = Shape::of(opts.size);
    let mut t = trainer(ctx, &shape)?;
    let (x, y) = data(ctx, shape.batch, shape.widths[0], shape.widths[3])?;
    let (x, y): (Tensor, Tensor) = (ctx.tensor(x), ctx.tensor(y));
    for _ in 0..WARMUP_STEPS {
        t.step_report(&x, &y).map_err(nn_error)?;
    }
    let misses = ctx.cache_stats().misses;
    let (mut walls, mut last) = (Vec::new(), None);
    let started = Instant::now();
    while more_runs(walls.len(), started, opts) {
        let start = Instant::now();
        let step = t.step_report(&x, &y).map_err(nn_error)?;
        walls.push(start.elapsed().as_secs_f64() * 1e3);
        last = Some(step);
    }
    let allocations = ctx.cache_stats().misses.saturating_sub(misses);
    let (loss, report) = last.expect("at least one timed step (more_runs runs one)");
    let median_ms = median(&walls);
    let flops = shape.step_flops() as f64;
    let gflops = flops / (median_ms * 1e-3).max(1e-12) / 1e9;
    Ok(StepRow {
        name: STEP_NAME,
        model: shape.model_text(),
        batch: shape.batch,
        backend: report.evaluation().backend.name(),
        kernels: report.kernel_count(),
        runs: walls.len(),
        median_ms,
        min_ms: walls.iter().copied().fold(f64::INFINITY, f64::min),
        flops,
        gflops,
        fma_peak_fraction: fma_flops.filter(|p| *p > 0.0).map(|p| gflops * 1e9 / p),
        allocations_per_step: allocations as f64 / walls.len() as f64,
        loss,
    })
}

/// Times data-parallel training of the MLP for the parallel rows whose name `keep`
/// accepts, on CPU devices made for each (`CpuDevice::split`); the baseline runs too
/// when any of them is kept, so that each has its efficiency. `on_start` is called with
/// each configuration's name before it runs.
pub fn run_parallel(
    opts: &BenchOptions,
    keep: &dyn Fn(&str) -> bool,
    on_start: &mut dyn FnMut(&'static str),
) -> Result<Vec<ParallelRow>> {
    let shape = Shape::of(opts.size);
    let host = Context::new();
    let (x, y) = data(
        &host,
        shape.batch * shape.batches,
        shape.widths[0],
        shape.widths[3],
    )?;
    let dataset = Dataset::new(x, y).map_err(nn_error)?;
    let mut rows: Vec<ParallelRow> = Vec::new();
    let mut baseline = None;
    let any = PARALLEL.iter().any(|p| keep(p.0));
    for (i, &(name, workers, threads, frequency)) in PARALLEL.iter().enumerate() {
        let is_baseline = i == 0;
        let runs = keep(name) || (is_baseline && any);
        if !runs {
            continue;
        }
        on_start(name);
        let row = run_parallel_one(opts, &shape, &dataset, (name, workers, threads, frequency))?;
        if is_baseline {
            baseline = Some(row.samples_per_sec);
        }
        if keep(name) {
            rows.push(row);
        }
    }
    for r in &mut rows {
        r.efficiency = baseline
            .filter(|b| *b > 0.0)
            .map(|b| r.samples_per_sec / ((r.workers * r.threads_per_worker) as f64 * b));
    }
    Ok(rows)
}

fn run_parallel_one(
    opts: &BenchOptions,
    shape: &Shape,
    dataset: &Dataset,
    (name, workers, threads, frequency): (&'static str, usize, usize, u64),
) -> Result<ParallelRow> {
    let cfg = ndfuse::Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
    let devices: Vec<Arc<dyn Device>> = CpuDevice::split(workers, workers * threads)
        .map_err(ndfuse_runtime::RuntimeError::from)?
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    let set = Arc::new(DeviceSet::new(devices, &cfg).map_err(ndfuse_runtime::RuntimeError::from)?);
    // The averaged model lives on the same devices as the workers: the shared optimiser
    // step of frequency 1 runs on the set's first device, not on the whole host.
    let ctx = Context::builder().devices(Arc::clone(&set)).build()?;
    let t = trainer(&ctx, shape)?.in_context(ctx);
    let mut pw = ParallelWrapper::builder(t)
        .workers(workers)
        .devices(set)
        .averaging_frequency(frequency)
        .batch_size(shape.batch)
        .progress(false)
        .build()
        .map_err(bench_error)?;
    // Warm-up epoch: compiles every kernel of the workers' steps and the averaging.
    pw.fit(dataset, 1).map_err(bench_error)?;
    let mut epochs = Vec::new();
    let started = Instant::now();
    while more_runs(epochs.len(), started, opts) {
        epochs.push(pw.fit(dataset, 1).map_err(bench_error)?);
    }
    let rates: Vec<f64> = epochs.iter().map(|r| r.samples_per_sec()).collect();
    let samples_per_sec = median(&rates);
    // The epoch whose rate is the median (the lower of the middle two for an even
    // count) gives the averaging time and the busy fractions.
    let mut order: Vec<usize> = (0..epochs.len()).collect();
    order.sort_by(|&a, &b| rates[a].total_cmp(&rates[b]));
    let mid = &epochs[order[(order.len() - 1) / 2]];
    let total = mid.total.as_secs_f64().max(1e-12);
    let last = epochs.last().expect("at least one timed epoch");
    Ok(ParallelRow {
        name,
        model: shape.model_text(),
        workers,
        threads_per_worker: threads,
        frequency,
        batch: shape.batch,
        samples: dataset.len(),
        runs: epochs.len(),
        samples_per_sec,
        rounds: mid.rounds,
        averaging_ms_per_round: mid.averaging.as_secs_f64() * 1e3 / mid.rounds.max(1) as f64,
        busy_fraction: mid
            .workers
            .iter()
            .map(|w| w.busy.as_secs_f64() / total)
            .collect(),
        efficiency: None,
        loss: last.epochs.last().map_or(f64::NAN, |e| e.score),
    })
}
