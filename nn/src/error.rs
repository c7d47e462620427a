//! The errors of ndfuse-nn.

use std::path::PathBuf;

/// What went wrong in a layer, a loss, an optimiser, a data set or a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the tensor library (a shape error names both shapes and the call site).
    #[error(transparent)]
    Tensor(#[from] ndfuse::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
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
    /// The prefetch thread of a data set failed (it panicked, or could not start).
    #[error("prefetch: {why}")]
    Prefetch {
        /// What happened, with the panic's message.
        why: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
