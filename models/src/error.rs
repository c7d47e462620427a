//! The errors of ndfuse-models.

use std::path::PathBuf;

/// What went wrong loading or running a pretrained model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the tensor library.
    #[error(transparent)]
    Tensor(#[from] ndfuse::Error),
    /// An error of a layer.
    #[error(transparent)]
    Layer(#[from] ndfuse_nn::Error),
    /// A file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A model file is malformed: truncated, corrupt, or of a kind not supported; names
    /// the file and, where one is at fault, the tensor or metadata key.
    #[error("{}: {}{why}", path.display(), at.as_ref().map(|t| format!("{t}: ")).unwrap_or_default())]
    Format {
        /// The file.
        path: PathBuf,
        /// The tensor or metadata key at fault, when one is.
        at: Option<String>,
        /// What is wrong.
        why: String,
    },
    /// The tokenizer could not be built or could not encode or decode.
    #[error("tokenizer: {why}")]
    Tokenizer {
        /// What went wrong, with the tokenizers library's message.
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

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
