//! A worker: a replica trainer on a thread of its own, bound to its device for the
//! whole run, driven by messages from the wrapper (compute gradients, take steps, adopt
//! averaged values, stop). A worker whose device fails replies with the error and ends;
//! dropping a worker stops and joins its thread.

use crate::error::{Error, Result};
use ndfuse::{Array, Context, DeviceId, Tensor};
use ndfuse_nn::{Batch, Layer, Parameter, Trainer};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The replica type every worker trains.
pub(crate) type Replica = Trainer<Box<dyn Layer>>;

/// What a worker is asked to do.
pub(crate) enum Job {
    /// The loss and gradients on a batch (synchronous data parallelism).
    Gradients(Batch),
    /// Whole steps (forward, backward, the replica's own optimiser) on each batch.
    Steps(Vec<Batch>),
    /// Adopt these values: parameters, buffers (batch norm's running statistics),
    /// optimiser state, the step count (which also draws the step's random key).
    Adopt {
        params: Vec<Tensor>,
        buffers: Vec<Tensor>,
        state: Option<Vec<Tensor>>,
        steps: u64,
    },
}

/// A worker's answer.
pub(crate) enum Reply {
    Gradients {
        loss: f64,
        samples: usize,
        grads: Vec<Array>,
        /// The replica's buffers after the batch's training pass.
        buffers: Vec<Tensor>,
    },
    Stepped {
        /// Each step's loss and batch size.
        losses: Vec<(f64, usize)>,
        /// The replica's parameters, buffers and optimiser state after the steps.
        params: Vec<Tensor>,
        buffers: Vec<Tensor>,
        state: Vec<Tensor>,
        steps: u64,
    },
    Adopted,
}

/// The wrapper's handle on one worker thread.
pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) device: DeviceId,
    jobs: Option<Sender<Job>>,
    replies: Receiver<(Result<Reply>, Duration)>,
    thread: Option<JoinHandle<()>>,
    /// Time spent computing (not waiting), samples trained and steps taken.
    pub(crate) busy: Duration,
    pub(crate) samples: usize,
    pub(crate) steps: u64,
}

impl Worker {
    /// Starts worker `index` training `replica` on `device` (evaluations in `ctx`, whose
    /// device set holds `device`).
    pub(crate) fn start(
        index: usize,
        device: DeviceId,
        ctx: Context,
        replica: Replica,
    ) -> Result<Worker> {
        let (jobs, inbox) = channel::<Job>();
        let (outbox, replies) = channel();
        let bound = device.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ndfuse-worker-{index}"))
            .spawn(move || serve(replica, &ctx, &bound, &inbox, &outbox))
            .map_err(|e| Error::Argument {
                what: "ParallelWrapper",
                why: format!("could not start worker {index}: {e}"),
            })?;
        Ok(Worker {
            index,
            device,
            jobs: Some(jobs),
            replies,
            thread: Some(thread),
            busy: Duration::ZERO,
            samples: 0,
            steps: 0,
        })
    }

    /// Sends `job`; `Err` when the worker has ended.
    pub(crate) fn send(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| self.gone())
    }

    /// The reply to the last job sent, adding its time to the worker's busy time.
    pub(crate) fn receive(&mut self) -> Result<Reply> {
        let (reply, took) = self.replies.recv().map_err(|_| self.gone())?;
        self.busy += took;
        reply
    }

    fn gone(&self) -> Error {
        Error::Argument {
            what: "ParallelWrapper",
            why: format!("worker {} on {} has ended", self.index, self.device),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the channel ends the worker's loop; joining it returns its memory.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The worker thread: bound to its device, answering jobs until the channel closes or a
/// job fails.
fn serve(
    mut replica: Replica,
    ctx: &Context,
    device: &DeviceId,
    inbox: &Receiver<Job>,
    outbox: &Sender<(Result<Reply>, Duration)>,
) {
    if let Err(e) = ctx.bind_thread(device) {
        let _ = outbox.send((Err(e.into()), Duration::ZERO));
        return;
    }
    while let Ok(job) = inbox.recv() {
        let start = Instant::now();
        let reply = work(&mut replica, job);
        let failed = reply.is_err();
        if outbox.send((reply, start.elapsed())).is_err() || failed {
            break;
        }
    }
    ndfuse::unbind_thread();
}

fn work(replica: &mut Replica, job: Job) -> Result<Reply> {
    match job {
        Job::Gradients(batch) => {
            let ctx = replica.context().clone();
            let samples = batch.indices.len();
            let (x, y) = (ctx.tensor(batch.features), ctx.tensor(batch.labels));
            let (loss, grads) = replica.gradients(&x, &y)?;
            Ok(Reply::Gradients {
                loss,
                samples,
                grads,
                buffers: values(&replica.model().buffers()),
            })
        }
        Job::Steps(batches) => {
            let mut losses = Vec::with_capacity(batches.len());
            for b in batches {
                let n = b.indices.len();
                losses.push((replica.step_batch(b)?, n));
            }
            let model = replica.model();
            let (params, buffers) = (values(&model.parameters()), values(&model.buffers()));
            let opt = replica.optimizer();
            let state = opt.state().into_iter().map(|(_, t)| t).collect();
            Ok(Reply::Stepped {
                losses,
                params,
                buffers,
                state,
                steps: opt.steps(),
            })
        }
        Job::Adopt {
            params,
            buffers,
            state,
            steps,
        } => {
            let model = replica.model();
            for (p, v) in model.parameters().iter().zip(&params) {
                p.share(v)?;
            }
            for (b, v) in model.buffers().iter().zip(&buffers) {
                b.share(v)?;
            }
            let opt = replica.optimizer_mut();
            if let Some(state) = state {
                opt.share_state(&state)?;
            }
            opt.set_steps(steps);
            Ok(Reply::Adopted)
        }
    }
}

/// The current values of `params` (parameters or buffers), in order.
pub(crate) fn values(params: &[Parameter]) -> Vec<Tensor> {
    params.iter().map(Parameter::value).collect()
}
