//! The errors of ndfuse-train.

use ndfuse::DeviceId;
use std::path::PathBuf;

/// What went wrong in parallel training or early stopping.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of a trainer, a data set or a checkpoint.
    #[error(transparent)]
    Nn(#[from] ndfuse_nn::Error),
    /// An error of the tensor library.
    #[error(transparent)]
    Tensor(#[from] ndfuse::Error),
    /// A worker failed on its device; training stopped (the last good parameters were
    /// saved when a checkpoint path was set).
    #[error("worker {worker} on {device} failed at step {step}: {source}")]
    Worker {
        /// The worker's index.
        worker: usize,
        /// Its device.
        device: DeviceId,
        /// The global step it failed at (from 0).
        step: u64,
        /// What the device reported.
        source: Box<Error>,
    },
    /// Every worker failed.
    #[error("every worker failed; the last: {0}")]
    NoWorkers(Box<Error>),
    /// Early stopping's directory (for `best.safetensors` and `latest.safetensors`)
    /// cannot be made or written.
    #[error("early stopping cannot write its directory {}: {source}", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A collective across ranks did not complete in time: the ranks named did not
    /// arrive (they died, hang, or are stuck earlier). The run cannot go on.
    #[error(
        "rank {rank}: {what} (collective #{sequence}) did not complete within {seconds} s: {}",
        missing_ranks(missing)
    )]
    Rank {
        /// This process's rank.
        rank: usize,
        /// The collective.
        what: &'static str,
        /// Its sequence number (collectives called so far, from 0).
        sequence: u64,
        /// The ranks that did not arrive, when they are known.
        missing: Vec<usize>,
        /// The bound waited.
        seconds: f64,
    },
    /// A collective across ranks failed because ranks are gone: the launcher reported
    /// that a process of the run ended, or MPI returned an error. The ranks named did not
    /// arrive at this collective. The run cannot go on.
    #[error(
        "rank {rank}: {what} (collective #{sequence}) failed: {} ({why})",
        lost_ranks(lost)
    )]
    RankLost {
        /// This process's rank.
        rank: usize,
        /// The collective.
        what: &'static str,
        /// Its sequence number (collectives called so far, from 0).
        sequence: u64,
        /// The ranks that did not arrive.
        lost: Vec<usize>,
        /// What reported the loss: the launcher's notice, or MPI's error message.
        why: String,
    },
    /// A bad argument: what was asked and why it cannot be done.
    #[error("{what}: {why}")]
    Argument {
        /// The call.
        what: &'static str,
        /// Why it is refused.
        why: String,
    },
}

/// "rank 3 did not arrive", or why no rank could be named.
fn missing_ranks(missing: &[usize]) -> String {
    match missing {
        [] => "every rank arrived but the reduction did not finish".into(),
        [r] => format!("rank {r} did not arrive (dead or hung)"),
        rs => format!("ranks {rs:?} did not arrive (dead or hung)"),
    }
}

/// "rank 2 died or is unreachable", or why no rank could be named.
fn lost_ranks(lost: &[usize]) -> String {
    match lost {
        [] => "every rank arrived at this collective, so the one that ended cannot be named".into(),
        [r] => format!("rank {r} died or is unreachable"),
        rs => format!("ranks {rs:?} died or are unreachable"),
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
