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
    /// A checkpoint file is malformed, lacks a tensor, or cannot be made from the tensors.
    #[error("{}: {}{why}", path.display(), tensor.as_ref().map(|t| format!("tensor {t:?}: ")).unwrap_or_default())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// The tensor at fault, when one is.
        tensor: Option<String>,
        /// What is wrong.
        why: String,
    },
    /// A checkpoint's tensor does not have the shape or dtype the model expects.
    #[error(
        "{}: tensor {tensor:?} is {file_dtype}{file_shape:?} in the file but the model's is {model_dtype}{model_shape:?}",
        path.display()
    )]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape in the file.
        file_shape: Vec<usize>,
        /// Its dtype in the file.
        file_dtype: ndfuse::DType,
        /// The shape the model expects.
        model_shape: Vec<usize>,
        /// The dtype the model expects.
        model_dtype: ndfuse::DType,
    },
    /// A data file is missing, unreadable or malformed: which file and what is wrong
    /// (for a missing data set, where it comes from).
    #[error("{}: {why}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A plot could not be drawn (the drawing library's reason) or its input is unusable.
    #[error("{}: {why}", path.display())]
    Plot {
        /// The SVG file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
