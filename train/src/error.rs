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
    /// A bad argument: what was asked and why it cannot be done.
    #[error("{what}: {why}")]
    Argument {
        /// The call.
        what: &'static str,
        /// Why it is refused.
        why: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
