//! `ParallelWrapper`: Deeplearning4j's data-parallel trainer. The model is replicated
//! once per worker; each worker is a thread bound to one device of the device set
//! (every GPU first, then CPU devices) and trains on its own mini-batches.
//!
//! - `averaging_frequency(1)` is synchronous data parallelism (Horovod, PyTorch DDP):
//!   every step each worker computes its batch's gradients, the gradients are averaged
//!   (weighted by batch size) and one optimiser step is taken and handed to every
//!   replica, so N workers of batch b take the steps of one worker of batch N * b.
//! - `averaging_frequency(k)`, k > 1, is DL4J's parameter averaging: each worker takes k
//!   whole steps with its own optimiser, then parameters (and, by default, optimiser
//!   state) are replaced by their mean over the workers.
//!
//! - Buffers (batch norm's running statistics, [`Layer::buffers`]) are averaged like
//!   parameters: each replica updates its own from its batches, and after every round
//!   their mean (weighted by batch size at frequency 1, equal at frequency k, and
//!   across ranks) becomes the model's and every replica's. At frequency 1 the running
//!   mean is then exactly the update by the mean of the round's batch means; the
//!   running variance is the mean of the batches' variances (as PyTorch's
//!   `BatchNorm2d` under DDP without `SyncBatchNorm`, whose statistics are per batch).
//!
//! The averaging is one evaluated graph: one fused kernel per parameter tensor. Workers
//! are given batches in a fixed order (batch j of a round to the j-th live worker) and
//! sums run in worker order, so given the seed and the worker count the trained
//! parameters are the same bits from run to run, whatever the threads inside a device.
//!
//! A worker whose device fails is reported with its device. With
//! [`OnFailure::Continue`] its batches go back to the queue and the remaining workers
//! train on them (no data is lost); with [`OnFailure::Stop`] the last good parameters
//! are saved (when a checkpoint path is set) and `fit` returns the error. Workers are
//! joined when `fit` returns, so repeated fits hold no memory between them.

use crate::epoch::EpochTrainer;
use crate::error::{Error, Result};
use crate::ranks::{hash_arrays, Ranks};
use crate::worker::{values, Job, Reply, Worker};
use ndfuse::{Array, Context, DeviceId, DeviceSet, Tensor};
use ndfuse_nn::{Batch, Dataset, Layer, Progress, Scores, Trainer};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What happens when a worker's device fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Go on with the remaining workers; the failed worker's batches are re-queued.
    Continue,
    /// Stop: save the last good parameters (with a checkpoint path) and return the error.
    Stop,
}

/// A worker's share of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerReport {
    /// The worker's index.
    pub index: usize,
    /// Its device.
    pub device: DeviceId,
    /// Samples it trained on.
    pub samples: usize,
    /// Batches it computed.
    pub batches: u64,
    /// Time it spent computing (not waiting for the others).
    pub busy: Duration,
    /// Whether it failed.
    pub failed: bool,
}

/// A worker that failed, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The worker's index.
    pub worker: usize,
    /// Its device.
    pub device: DeviceId,
    /// The global step (round) it failed at, from 0.
    pub step: u64,
    /// What the device reported.
    pub message: String,
}

/// A worker's answer to a gradients job: its loss, batch size, gradients and buffers.
type Done = (f64, usize, Vec<Array>, Vec<Tensor>);

/// One epoch of a parallel run.
#[derive(Debug, Clone, PartialEq)]
pub struct ParallelEpoch {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The mean training loss over the epoch's batches (weighted by batch size).
    pub score: f64,
    /// Samples trained.
    pub samples: usize,
    /// Wall time.
    pub seconds: f64,
}

/// What a run did: throughput, time spent averaging, each worker's share, failures.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParallelReport {
    /// Each epoch, in order.
    pub epochs: Vec<ParallelEpoch>,
    /// Each worker.
    pub workers: Vec<WorkerReport>,
    /// Workers that failed.
    pub failures: Vec<Failure>,
    /// Rounds run (a round: one batch per worker, or k of them with frequency k).
    pub rounds: u64,
    /// Time spent averaging (and taking the shared optimiser step, at frequency 1).
    pub averaging: Duration,
    /// Wall time of the run.
    pub total: Duration,
    /// The score after each round: the batch-weighted mean of the workers' losses
    /// (with `report_score_after_averaging`), else the first live worker's.
    pub scores: Vec<f64>,
}

impl ParallelReport {
    /// Samples per second over the run.
    pub fn samples_per_sec(&self) -> f64 {
        let samples: usize = self.epochs.iter().map(|e| e.samples).sum();
        samples as f64 / self.total.as_secs_f64().max(1e-9)
    }
}

/// A model trained by several workers at once (see the module docs).
///
/// ```
/// use ndfuse::{Context, CpuDevice, Device, DeviceSet};
/// use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
/// use ndfuse_train::ParallelWrapper;
/// use std::sync::Arc;
/// let ctx = Context::new();
/// let x = ctx.rand_normal(&[64, 4], 0.0, 1.0, 1).eval()?;
/// let y = ctx.tensor(x.clone()).sum_keepdims(1).eval()?;
/// let model = Sequential::mlp(&ctx, &[4, 1], Activation::Relu, 2)?;
/// let opt = Optimizer::sgd(&model.parameters(), 0.05);
/// let trainer = Trainer::new(model, opt, Loss::Mse)?;
/// let devices: Vec<Arc<dyn Device>> =
///     CpuDevice::split(2, 2)?.into_iter().map(|d| Arc::new(d) as _).collect();
/// let set = Arc::new(DeviceSet::new(devices, &ndfuse::Config::load()?)?);
/// let mut pw = ParallelWrapper::builder(trainer)
///     .workers(2)
///     .devices(set)
///     .batch_size(8)
///     .averaging_frequency(1)
///     .build()?;
/// let report = pw.fit(&Dataset::new(x, y)?, 20)?;
/// assert!(report.epochs[19].score < report.epochs[0].score / 10.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ParallelWrapper<M: Layer> {
    trainer: Trainer<M>,
    workers: usize,
    frequency: u64,
    prefetch: usize,
    score_after_averaging: bool,
    average_state: bool,
    devices: Option<Arc<DeviceSet>>,
    on_failure: OnFailure,
    checkpoint: Option<PathBuf>,
    batch_size: usize,
    seed: u64,
    progress: bool,
    ranks: Option<Arc<dyn Ranks>>,
}

/// Builder of a [`ParallelWrapper`] (DL4J's `ParallelWrapper.Builder`).
#[derive(Debug)]
pub struct Builder<M: Layer>(ParallelWrapper<M>);

impl<M: Layer> Builder<M> {
    /// Workers (replicas), at least 1 (default: the device set's size).
    pub fn workers(mut self, n: usize) -> Builder<M> {
        self.0.workers = n;
        self
    }

    /// Steps between averagings: 1 averages gradients every step (synchronous data
    /// parallelism); k > 1 averages parameters every k steps. Default 1.
    pub fn averaging_frequency(mut self, k: u64) -> Builder<M> {
        self.0.frequency = k;
        self
    }

    /// Batches assembled ahead on a separate thread (0: none). Default 2.
    pub fn prefetch_buffer(mut self, batches: usize) -> Builder<M> {
        self.0.prefetch = batches;
        self
    }

    /// Report the batch-weighted mean of the workers' losses (true, the default) or
    /// the first live worker's.
    pub fn report_score_after_averaging(mut self, on: bool) -> Builder<M> {
        self.0.score_after_averaging = on;
        self
    }

    /// With frequency k > 1, average the optimisers' state too (default true).
    pub fn average_optimizer_state(mut self, on: bool) -> Builder<M> {
        self.0.average_state = on;
        self
    }

    /// The devices workers are placed on, in placement order (default: the trainer
    /// context's set: every GPU, then the CPU).
    pub fn devices(mut self, set: Arc<DeviceSet>) -> Builder<M> {
        self.0.devices = Some(set);
        self
    }

    /// What a failed worker does to the run (default [`OnFailure::Stop`]).
    pub fn on_failure(mut self, policy: OnFailure) -> Builder<M> {
        self.0.on_failure = policy;
        self
    }

    /// Where the last good parameters are saved when a failure stops the run.
    pub fn checkpoint(mut self, path: impl Into<PathBuf>) -> Builder<M> {
        self.0.checkpoint = Some(path.into());
        self
    }

    /// Samples per worker batch (default 32).
    pub fn batch_size(mut self, n: usize) -> Builder<M> {
        self.0.batch_size = n;
        self
    }

    /// The seed of the batch order (default 0).
    pub fn seed(mut self, seed: u64) -> Builder<M> {
        self.0.seed = seed;
        self
    }

    /// Draw the progress bar (when stderr is a terminal). Default true.
    pub fn progress(mut self, on: bool) -> Builder<M> {
        self.0.progress = on;
        self
    }

    /// Spans the processes of a multi-process run (MPI: [`crate::MpiRanks`]): every
    /// rank runs this many local workers on its own share of each round's batches, and
    /// gradients (frequency 1) or parameters (frequency k) are averaged locally, then
    /// summed across ranks. Only rank 0 draws the progress bar and writes the failure
    /// checkpoint. A failed worker then stops the run on every rank.
    pub fn ranks(mut self, ranks: Arc<dyn Ranks>) -> Builder<M> {
        self.0.ranks = Some(ranks);
        self
    }

    /// The wrapper; `Err` for 0 workers, frequency 0 or batch size 0.
    pub fn build(mut self) -> Result<ParallelWrapper<M>> {
        let w = &mut self.0;
        if w.workers == 0 {
            w.workers = match &w.devices {
                Some(set) => set.devices().len(),
                None => w.trainer.context().devices()?.devices().len(),
            };
        }
        let ranked = w.ranks.is_some();
        for (bad, why) in [
            (w.frequency == 0, "averaging_frequency must be at least 1"),
            (w.batch_size == 0, "batch_size must be at least 1"),
            (
                ranked && w.on_failure == OnFailure::Continue,
                "with ranks a failed worker stops the run (OnFailure::Stop): the ranks' shares of the data must stay in step",
            ),
        ] {
            if bad {
                return Err(Error::Argument {
                    what: "ParallelWrapper::build",
                    why: why.into(),
                });
            }
        }
        Ok(self.0)
    }
}

impl<M: Layer> ParallelWrapper<M> {
    /// A builder over `trainer`: its model is replicated, its optimiser drives the
    /// shared steps, and after `fit` it holds the averaged model.
    pub fn builder(trainer: Trainer<M>) -> Builder<M> {
        Builder(ParallelWrapper {
            trainer,
            workers: 0,
            frequency: 1,
            prefetch: 2,
            score_after_averaging: true,
            average_state: true,
            devices: None,
            on_failure: OnFailure::Stop,
            checkpoint: None,
            batch_size: 32,
            seed: 0,
            progress: true,
            ranks: None,
        })
    }

    /// This process's rank and the number of ranks ((0, 1) without ranks).
    pub fn rank(&self) -> (usize, usize) {
        self.ranks.as_ref().map_or((0, 1), |r| (r.rank(), r.size()))
    }

    /// The trainer holding the averaged model and optimiser.
    pub fn trainer(&self) -> &Trainer<M> {
        &self.trainer
    }

    /// The trainer, giving up the wrapper.
    pub fn into_trainer(self) -> Trainer<M> {
        self.trainer
    }

    /// Trains `epochs` passes over `data`.
    pub fn fit(&mut self, data: &Dataset, epochs: u64) -> Result<ParallelReport> {
        self.run(data, 0..epochs)
    }

    /// Trains epochs `epochs` (their indices seed the batch order).
    pub fn run(&mut self, data: &Dataset, epochs: std::ops::Range<u64>) -> Result<ParallelReport> {
        let start = Instant::now();
        let set = match &self.devices {
            Some(s) => Arc::clone(s),
            None => self.trainer.context().devices()?,
        };
        let mut workers = self.start_workers(&set)?;
        let per_epoch = data.len().div_ceil(self.batch_size) as u64;
        let total = per_epoch * (epochs.end - epochs.start);
        let bar = if self.progress && self.rank().0 == 0 {
            Progress::new(total, "parallel")
        } else {
            Progress::hidden(total, "parallel")
        };
        let mut run = Run {
            report: ParallelReport::default(),
            bar,
            batches_done: 0,
        };
        let result = (|| {
            for epoch in epochs {
                self.epoch(data, epoch, &mut workers, &mut run)?;
            }
            Ok(())
        })();
        let live: Vec<WorkerReport> = workers
            .iter()
            .map(|w| WorkerReport {
                index: w.index,
                device: w.device.clone(),
                samples: w.samples,
                batches: w.steps,
                busy: w.busy,
                failed: false,
            })
            .collect();
        // Workers removed after a failure reported themselves then.
        run.report.workers.extend(live);
        run.report.workers.sort_by_key(|w| w.index);
        drop(workers);
        run.report.total = start.elapsed();
        run.bar
            .finish(&format!("{:.0} samples/s", run.report.samples_per_sec()));
        result.map(|()| run.report)
    }

    /// One worker per replica, placed on the set's devices in placement order.
    fn start_workers(&self, set: &Arc<DeviceSet>) -> Result<Vec<Worker>> {
        let mut workers = Vec::with_capacity(self.workers);
        for (i, device) in set.placement(self.workers).into_iter().enumerate() {
            let ctx = Context::builder().devices(Arc::clone(set)).build()?;
            // Worker i draws its own dropout masks (worker 0 those of the trainer).
            let seed = self.trainer.random_seed() ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let replica = self.trainer.replica(ctx.clone())?.seed(seed);
            workers.push(Worker::start(i, device, ctx, replica)?);
        }
        Ok(workers)
    }

    fn epoch(
        &mut self,
        data: &Dataset,
        epoch: u64,
        workers: &mut Vec<Worker>,
        run: &mut Run,
    ) -> Result<()> {
        let start = Instant::now();
        let batches = data.batches(self.batch_size, self.seed, epoch, false)?;
        let mut source: Box<dyn Iterator<Item = ndfuse_nn::Result<Batch>>> = if self.prefetch > 0 {
            Box::new(batches.prefetch(self.prefetch))
        } else {
            Box::new(batches)
        };
        let mut queue: VecDeque<Batch> = VecDeque::new();
        let (mut loss_sum, mut samples) = (0.0, 0usize);
        let (rank, ranks) = self.rank();
        // With ranks every rank runs the same number of rounds, computed from the data
        // set's size: rank r takes the r-th share of each round's batches (none, at the
        // end of an epoch, is a share too: it still takes part in the collectives).
        let per_rank = workers.len() * self.frequency as usize;
        let mut rounds_left = (ranks > 1).then(|| {
            data.len()
                .div_ceil(self.batch_size)
                .div_ceil(per_rank * ranks)
        });
        loop {
            let live = workers.len();
            if live == 0 || rounds_left == Some(0) {
                break;
            }
            let want = live * self.frequency as usize;
            let round: Vec<Batch> = if let Some(left) = &mut rounds_left {
                *left -= 1;
                let mut mine = Vec::new();
                for j in 0..per_rank * ranks {
                    match source.next() {
                        Some(b) if j / per_rank == rank => mine.push(b?),
                        Some(b) => drop(b?),
                        None => break,
                    }
                }
                mine
            } else {
                while queue.len() < want {
                    match source.next() {
                        Some(b) => queue.push_back(b?),
                        None => break,
                    }
                }
                if queue.is_empty() {
                    break;
                }
                queue.drain(..want.min(queue.len())).collect()
            };
            let (l, n) = if self.frequency == 1 {
                self.sync_round(data, round, workers, &mut queue, run)?
            } else {
                self.averaging_round(data, round, workers, &mut queue, run)?
            };
            loss_sum += l * n as f64;
            samples += n;
            run.report.rounds += 1;
            let secs = start.elapsed().as_secs_f64();
            run.bar
                .update(run.batches_done, l, samples as f64 / secs.max(1e-9));
        }
        let seconds = start.elapsed().as_secs_f64();
        let per_worker: Vec<String> = workers
            .iter()
            .map(|w| {
                format!(
                    "{} {:.0}/s",
                    w.device,
                    w.samples as f64 / w.busy.as_secs_f64().max(1e-9)
                )
            })
            .collect();
        let score = loss_sum / samples.max(1) as f64;
        run.bar.message(&format!(
            "epoch {}: loss {score:.4}, {:.0} samples/s ({})",
            epoch + 1,
            samples as f64 / seconds.max(1e-9),
            per_worker.join(", ")
        ));
        run.report.epochs.push(ParallelEpoch {
            epoch,
            score,
            samples,
            seconds,
        });
        Ok(())
    }

    /// One synchronous step: batch j to live worker j for its gradients, their
    /// batch-weighted mean, one optimiser step, the new values to every replica.
    /// Returns the round's mean loss and samples.
    fn sync_round(
        &mut self,
        data: &Dataset,
        round: Vec<Batch>,
        workers: &mut Vec<Worker>,
        queue: &mut VecDeque<Batch>,
        run: &mut Run,
    ) -> Result<(f64, usize)> {
        let step = run.report.rounds;
        let mut sent = Vec::new();
        for (w, b) in workers.iter().zip(round) {
            sent.push(b.indices.clone());
            w.send(Job::Gradients(b))?;
        }
        let mut done: Vec<Done> = Vec::new();
        let mut failed = Vec::new();
        for (i, backup) in sent.into_iter().enumerate() {
            match workers[i].receive() {
                Ok(Reply::Gradients {
                    loss,
                    samples,
                    grads,
                    buffers,
                }) => {
                    workers[i].samples += samples;
                    workers[i].steps += 1;
                    done.push((loss, samples, grads, buffers));
                }
                Ok(_) => unreachable!("a gradients job is answered with gradients"),
                Err(e) => failed.push((i, e, vec![backup])),
            }
        }
        self.handle_failures(data, failed, workers, queue, step, run)?;
        if let Some(ranks) = self.ranks.clone() {
            return self.sync_across(&*ranks, done, data, workers, queue, step, run);
        }
        if done.is_empty() {
            return Ok((0.0, 0));
        }
        let averaging = Instant::now();
        let total: usize = done.iter().map(|d| d.1).sum();
        let weights: Vec<f64> = done.iter().map(|d| d.1 as f64 / total as f64).collect();
        let ctx = self.trainer.context().clone();
        let sets: Vec<Vec<Tensor>> = done
            .iter_mut()
            .map(|d| {
                std::mem::take(&mut d.2)
                    .into_iter()
                    .map(|g| ctx.tensor(g))
                    .collect()
            })
            .collect();
        let buffers: Vec<Vec<Tensor>> = done.iter_mut().map(|d| std::mem::take(&mut d.3)).collect();
        let grads = mean(&ctx, &sets, &weights)?;
        self.trainer.apply_gradients(grads)?;
        self.store_buffers(mean(&ctx, &buffers, &weights)?)?;
        self.share(data, workers, None, queue, step, run)?;
        run.report.averaging += averaging.elapsed();
        run.batches_done += done.len() as u64;
        Ok(self.score(
            &done.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
            total,
            run,
        ))
    }

    /// The cross-rank half of a synchronous step: this rank's batch-weighted gradient
    /// sums (zeros when it had no batch) and sample count are summed over the ranks,
    /// divided by the total count, and one optimiser step is taken on every rank (the
    /// same bits everywhere: the same sums in, the same step out). The score is the
    /// global batch-weighted mean loss; the samples returned are this rank's.
    #[allow(clippy::too_many_arguments)]
    fn sync_across(
        &mut self,
        ranks: &dyn Ranks,
        mut done: Vec<Done>,
        data: &Dataset,
        workers: &mut Vec<Worker>,
        queue: &mut VecDeque<Batch>,
        step: u64,
        run: &mut Run,
    ) -> Result<(f64, usize)> {
        let averaging = Instant::now();
        let ctx = self.trainer.context().clone();
        let local: usize = done.iter().map(|d| d.1).sum();
        // The gradients' sums, then the buffers' (batch norm's running statistics,
        // weighted by batch size like the gradients).
        let model = self.trainer.model();
        let params = model.parameters().len();
        let mut sums: Vec<Array> = if done.is_empty() {
            let zeros: Vec<Tensor> = model
                .parameters()
                .iter()
                .chain(&model.buffers())
                .map(|p| ctx.full_dtype(&p.shape(), 0.0, p.dtype()))
                .collect();
            ctx.eval(&zeros.iter().collect::<Vec<_>>())?
        } else {
            // Moved into the graph's leaves, not copied.
            let sets: Vec<Vec<Tensor>> = done
                .iter_mut()
                .map(|d| {
                    std::mem::take(&mut d.2)
                        .into_iter()
                        .map(|g| ctx.tensor(g))
                        .chain(std::mem::take(&mut d.3))
                        .collect()
                })
                .collect();
            let counts: Vec<f64> = done.iter().map(|d| d.1 as f64).collect();
            weighted_sum(&ctx, &sets, &counts)?
        };
        ranks.allreduce_sum(&mut sums)?;
        let loss: f64 = done.iter().map(|d| d.0 * d.1 as f64).sum();
        let mut totals = [local as f64, loss];
        ranks.allreduce_sum_f64(&mut totals)?;
        if totals[0] == 0.0 {
            return Ok((0.0, local));
        }
        let scaled: Vec<Tensor> = sums
            .into_iter()
            .map(|a| ctx.tensor(a) / totals[0])
            .collect();
        let mut grads = ctx.eval(&scaled.iter().collect::<Vec<_>>())?;
        let buffers = grads.split_off(params);
        self.trainer.apply_gradients(grads)?;
        self.store_buffers(buffers)?;
        self.share(data, workers, None, queue, step, run)?;
        run.report.averaging += averaging.elapsed();
        run.batches_done += done.len() as u64;
        let score = totals[1] / totals[0];
        run.report.scores.push(score);
        Ok((score, local))
    }

    /// One averaging round: each live worker takes up to k whole steps on its own
    /// batches (batch j to worker j mod live), then parameters (and optimiser state)
    /// are averaged over the workers that trained and handed to every replica.
    fn averaging_round(
        &mut self,
        data: &Dataset,
        round: Vec<Batch>,
        workers: &mut Vec<Worker>,
        queue: &mut VecDeque<Batch>,
        run: &mut Run,
    ) -> Result<(f64, usize)> {
        let step = run.report.rounds;
        let live = workers.len();
        let mut shares: Vec<Vec<Batch>> = vec![Vec::new(); live];
        for (j, b) in round.into_iter().enumerate() {
            shares[j % live].push(b);
        }
        let mut sent = Vec::new();
        for (w, share) in workers.iter().zip(shares) {
            sent.push(share.iter().map(|b| b.indices.clone()).collect::<Vec<_>>());
            if !share.is_empty() {
                w.send(Job::Steps(share))?;
            }
        }
        let mut losses: Vec<(f64, usize)> = Vec::new();
        let (mut params, mut buffers, mut states, mut steps) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        let mut failed = Vec::new();
        for (i, share) in sent.into_iter().enumerate() {
            if share.is_empty() {
                continue;
            }
            match workers[i].receive() {
                Ok(Reply::Stepped {
                    losses: l,
                    params: p,
                    buffers: b,
                    state: s,
                    steps: n,
                }) => {
                    workers[i].samples += l.iter().map(|x| x.1).sum::<usize>();
                    workers[i].steps += l.len() as u64;
                    losses.extend(l);
                    params.push(p);
                    buffers.push(b);
                    states.push(s);
                    steps = steps.max(n);
                }
                Ok(_) => unreachable!("a steps job is answered with steps"),
                Err(e) => failed.push((i, e, share)),
            }
        }
        self.handle_failures(data, failed, workers, queue, step, run)?;
        let ranks = self.ranks.clone();
        if params.is_empty() {
            match &ranks {
                // No batch here this round: this rank's replicas hold the trainer's
                // values, and it takes part in the averaging with them.
                Some(_) => {
                    let model = self.trainer.model();
                    params.push(values(&model.parameters()));
                    buffers.push(values(&model.buffers()));
                    states.push(
                        self.trainer
                            .optimizer()
                            .state()
                            .into_iter()
                            .map(|(_, t)| t)
                            .collect(),
                    );
                    steps = self.trainer.optimizer().steps();
                }
                None => return Ok((0.0, 0)),
            }
        }
        let averaging = Instant::now();
        let ctx = self.trainer.context().clone();
        let equal = vec![1.0 / params.len() as f64; params.len()];
        let mut avg = mean(&ctx, &params, &equal)?;
        if let Some(r) = &ranks {
            avg = across(&**r, &ctx, avg)?;
            let mut s = [steps as f64];
            r.allreduce_max_f64(&mut s)?;
            steps = s[0] as u64;
        }
        for (p, a) in self.trainer.model().parameters().iter().zip(avg) {
            p.replace(a)?;
        }
        let mut avg = mean(&ctx, &buffers, &equal)?;
        if let Some(r) = &ranks {
            avg = across(&**r, &ctx, avg)?;
        }
        self.store_buffers(avg)?;
        let state = if self.average_state && !states[0].is_empty() {
            let mut avg = mean(&ctx, &states, &equal)?;
            if let Some(r) = &ranks {
                avg = across(&**r, &ctx, avg)?;
            }
            let shared: Vec<Tensor> = avg.into_iter().map(|a| ctx.tensor(a)).collect();
            self.trainer.optimizer_mut().share_state(&shared)?;
            Some(shared)
        } else {
            None
        };
        self.trainer.optimizer_mut().set_steps(steps);
        self.share(data, workers, state, queue, step, run)?;
        run.report.averaging += averaging.elapsed();
        run.batches_done += losses.len() as u64;
        let total = losses.iter().map(|x| x.1).sum();
        Ok(self.score(&losses, total, run))
    }

    /// Hands the trainer's parameters (and `state`) and step count to every replica.
    fn share(
        &mut self,
        data: &Dataset,
        workers: &mut Vec<Worker>,
        state: Option<Vec<Tensor>>,
        queue: &mut VecDeque<Batch>,
        step: u64,
        run: &mut Run,
    ) -> Result<()> {
        let params = values(&self.trainer.model().parameters());
        let buffers = values(&self.trainer.model().buffers());
        let steps = self.trainer.optimizer().steps();
        if cfg!(debug_assertions) {
            if let Some(r) = &self.ranks {
                let values = self
                    .trainer
                    .context()
                    .eval(&params.iter().collect::<Vec<_>>())?;
                if !r.all_equal(hash_arrays(&values))? {
                    return Err(Error::Argument {
                        what: "ParallelWrapper",
                        why: format!(
                            "after step {step} the ranks hold different parameters (a bug)"
                        ),
                    });
                }
            }
        }
        for w in workers.iter() {
            w.send(Job::Adopt {
                params: params.clone(),
                buffers: buffers.clone(),
                state: state.clone(),
                steps,
            })?;
        }
        let mut failed = Vec::new();
        for (i, w) in workers.iter_mut().enumerate() {
            if let Err(e) = w.receive() {
                failed.push((i, e, Vec::<Vec<usize>>::new()));
            }
        }
        self.handle_failures(data, failed, workers, queue, step, run)
    }

    /// Stores averaged values of the model's buffers (batch norm's running statistics)
    /// in the trainer's model, from which `share` hands them to every replica.
    fn store_buffers(&self, averaged: Vec<Array>) -> Result<()> {
        for (b, v) in self.trainer.model().buffers().iter().zip(averaged) {
            b.replace(v)?;
        }
        Ok(())
    }

    /// The round's score: the batch-weighted mean of the losses, or the first one's.
    fn score(&self, losses: &[(f64, usize)], total: usize, run: &mut Run) -> (f64, usize) {
        let mean = losses.iter().map(|(l, n)| l * *n as f64).sum::<f64>() / total.max(1) as f64;
        let score = if self.score_after_averaging {
            mean
        } else {
            losses.first().map_or(mean, |x| x.0)
        };
        run.report.scores.push(score);
        (mean, total)
    }

    /// Records failed workers; re-queues their batches and removes them
    /// ([`OnFailure::Continue`]), or saves the last good state and returns the first
    /// failure ([`OnFailure::Stop`]). `Err(NoWorkers)` when none is left.
    fn handle_failures(
        &mut self,
        data: &Dataset,
        failed: Vec<(usize, Error, Vec<Vec<usize>>)>,
        workers: &mut Vec<Worker>,
        queue: &mut VecDeque<Batch>,
        step: u64,
        run: &mut Run,
    ) -> Result<()> {
        if failed.is_empty() {
            return Ok(());
        }
        let mut first = None;
        let mut gone = Vec::new();
        for (i, e, batches) in failed.into_iter().rev() {
            let w = &workers[i];
            run.bar.message(&format!(
                "worker {} on {} failed at step {step}: {e}",
                w.index, w.device
            ));
            run.report.failures.push(Failure {
                worker: w.index,
                device: w.device.clone(),
                step,
                message: e.to_string(),
            });
            // The batches it was given go back to the queue, gathered again from the
            // data set by their sample indices.
            for indices in batches.into_iter().rev() {
                let part = data.subset(&indices)?;
                queue.push_front(Batch {
                    features: part.features().clone(),
                    labels: part.labels().clone(),
                    indices,
                });
            }
            gone.push(i);
            first = Some(Error::Worker {
                worker: w.index,
                device: w.device.clone(),
                step,
                source: Box::new(e),
            });
        }
        let error = first.expect("at least one failure");
        if self.on_failure == OnFailure::Stop {
            if let (Some(path), 0) = (&self.checkpoint, self.rank().0) {
                self.trainer.save(path)?;
            }
            return Err(error);
        }
        gone.sort_unstable();
        for i in gone.into_iter().rev() {
            let w = workers.remove(i);
            run.report.workers.push(WorkerReport {
                index: w.index,
                device: w.device.clone(),
                samples: w.samples,
                batches: w.steps,
                busy: w.busy,
                failed: true,
            });
        }
        if workers.is_empty() {
            return Err(Error::NoWorkers(Box::new(error)));
        }
        Ok(())
    }
}

/// What a run accumulates.
struct Run {
    report: ParallelReport,
    bar: Progress,
    batches_done: u64,
}

/// `sum_i weights[i] * sets[i][k]` for every k, evaluated as one graph (one fused
/// kernel per tensor). Equal weights are a plain mean: the sum in set order, then
/// divided by the count, so a mean of replicas is exactly that.
fn mean(ctx: &Context, sets: &[Vec<Tensor>], weights: &[f64]) -> Result<Vec<Array>> {
    let equal = weights.windows(2).all(|w| w[0] == w[1]);
    let n = sets.first().map_or(0, Vec::len);
    if n == 0 {
        return Ok(Vec::new());
    }
    let outs: Vec<Tensor> = (0..n)
        .map(|k| {
            if equal {
                let mut acc = sets[0][k].clone();
                for s in &sets[1..] {
                    acc = &acc + &s[k];
                }
                acc / sets.len() as f64
            } else {
                let mut acc = &sets[0][k] * weights[0];
                for (s, w) in sets[1..].iter().zip(&weights[1..]) {
                    acc = &acc + &(&s[k] * *w);
                }
                acc
            }
        })
        .collect();
    Ok(ctx.eval(&outs.iter().collect::<Vec<_>>())?)
}

/// `sum_i counts[i] * sets[i][k]` for every k, as one evaluated graph.
fn weighted_sum(ctx: &Context, sets: &[Vec<Tensor>], counts: &[f64]) -> Result<Vec<Array>> {
    let n = sets.first().map_or(0, Vec::len);
    let outs: Vec<Tensor> = (0..n)
        .map(|k| {
            let mut acc = &sets[0][k] * counts[0];
            for (s, c) in sets[1..].iter().zip(&counts[1..]) {
                acc = &acc + &(&s[k] * *c);
            }
            acc
        })
        .collect();
    Ok(ctx.eval(&outs.iter().collect::<Vec<_>>())?)
}

/// The mean across ranks of each rank's `local` arrays: summed by the ranks, then
/// divided by their count in one evaluated graph.
fn across(ranks: &dyn Ranks, ctx: &Context, mut local: Vec<Array>) -> Result<Vec<Array>> {
    ranks.allreduce_sum(&mut local)?;
    let n = ranks.size() as f64;
    let outs: Vec<Tensor> = local.into_iter().map(|a| ctx.tensor(a) / n).collect();
    Ok(ctx.eval(&outs.iter().collect::<Vec<_>>())?)
}

impl<M: Layer> EpochTrainer for ParallelWrapper<M> {
    fn train_epoch(&mut self, data: &Dataset, epoch: u64, batch_size: usize) -> Result<f64> {
        self.batch_size = batch_size;
        let report = self.run(data, epoch..epoch + 1)?;
        Ok(report.epochs.first().map_or(f64::NAN, |e| e.score))
    }

    fn score(&self, data: &Dataset) -> Result<Scores> {
        Ok(self.trainer.evaluate_dataset(data, 0)?)
    }

    fn save(&self, path: &Path) -> Result<()> {
        Ok(self.trainer.save(path)?)
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        Ok(self.trainer.load(path)?)
    }
}
