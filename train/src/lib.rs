//! # ndfuse-train
//!
//! Training above one trainer: [`ParallelWrapper`], a model replicated over the
//! devices of a [`ndfuse::DeviceSet`] (every GPU first, then CPU devices), each replica
//! fed its own mini-batches, with gradients averaged every step or parameters every
//! `k` steps (Deeplearning4j's `ParallelWrapper`); and early stopping over one trainer
//! or a parallel one (`EarlyStoppingParallelTrainer`).

mod early;
mod epoch;
mod error;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod ranks;
mod worker;
mod wrapper;

pub use early::{
    EarlyStopping, EarlyStoppingBuilder, EarlyStoppingResult, EpochReport, Score, StopReason,
    Termination, BEST_FILE, LATEST_FILE,
};
pub use epoch::{EpochTrainer, Iterations};

/// Deeplearning4j's `EarlyStoppingParallelTrainer`: early stopping over a
/// [`ParallelWrapper`] (each epoch trained by every worker, scored on the averaged
/// model).
pub type EarlyStoppingParallelTrainer<M> = EarlyStopping<ParallelWrapper<M>>;
#[cfg(feature = "mpi")]
pub use crate::mpi::MpiRanks;
#[cfg(feature = "nccl")]
pub use crate::nccl::NcclRanks;
pub use error::{Error, Result};
pub use ranks::Ranks;
pub use wrapper::{
    Builder, Failure, OnFailure, ParallelEpoch, ParallelReport, ParallelWrapper, WorkerReport,
};
