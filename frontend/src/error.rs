//! The errors a user of `ndfuse` can get. Each op error names the shapes and dtypes
//! involved and the user's own call site.

use ndfuse_ir::{DType, IrError, Shape};
use std::panic::Location;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong in the `ndfuse` API.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An op that is not legal on its operands (shape, axis or dtype), at the call that
    /// built it. Ops on such a tensor carry this first error on to `eval`.
    #[error("{source} (at {at})")]
    Op {
        /// What is wrong, with the shapes and dtypes involved.
        source: IrError,
        /// The user's call that built the op.
        at: &'static Location<'static>,
    },
    /// Data whose length does not match the shape it was given.
    #[error("{what}: {count} elements given for shape {shape}, which holds {expected} (at {at})")]
    ElementCount {
        /// The constructor.
        what: &'static str,
        /// Elements supplied.
        count: usize,
        /// Shape requested.
        shape: Shape,
        /// Elements that shape holds.
        expected: usize,
        /// The user's call.
        at: &'static Location<'static>,
    },
    /// A bad argument to a constructor or setting (zero step, non-float default dtype).
    #[error("{what}: {why} (at {at})")]
    Argument {
        /// The function called.
        what: &'static str,
        /// What is wrong.
        why: String,
        /// The user's call.
        at: &'static Location<'static>,
    },
    /// Reading an array as an element type it does not hold.
    #[error("{what}::<{want}>() on an array of {got} (cast the tensor before eval)")]
    TypeMismatch {
        /// The accessor.
        what: &'static str,
        /// Type asked for.
        want: DType,
        /// Type held.
        got: DType,
    },
    /// A file could not be read or written (`.npy` load and save). Nothing is left
    /// behind by a failed write.
    #[error("cannot {action} {}: {}", .path.display(), io_reason(.source))]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// What the operating system said (shared so that `Error` stays `Clone`).
        source: Arc<std::io::Error>,
    },
    /// A `.npy` file that is malformed or holds a dtype ndfuse lacks, or an array that
    /// `.npy` cannot hold (bf16: numpy has no such dtype).
    #[error("{}: {why}", .path.display())]
    Npy {
        /// The file.
        path: PathBuf,
        /// What is wrong, in one line (`corrupt .npy: truncated: ...`).
        why: String,
    },
    /// An expression of the expression language ([`crate::Expr`]) that does not parse,
    /// names an unknown input or function, or builds an op that is not legal.
    #[error("at column {column}: {message}")]
    Expr {
        /// 1-based column, in characters, of the expression's text (0: not tied to
        /// one place, such as an input given twice).
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// Evaluation failed in a backend.
    #[error(transparent)]
    Runtime(Arc<ndfuse_runtime::RuntimeError>),
}

impl From<ndfuse_runtime::RuntimeError> for Error {
    fn from(e: ndfuse_runtime::RuntimeError) -> Error {
        Error::Runtime(Arc::new(e))
    }
}

impl Error {
    /// The message without the Rust call site that op errors end with: for a tool whose
    /// user wrote no Rust (the CLI names the column of the expression instead).
    pub fn reason(&self) -> String {
        match self {
            Error::Op { source, .. } => source.to_string(),
            other => {
                let s = other.to_string();
                match s.rfind(" (at ") {
                    Some(i) if s.ends_with(')') => s[..i].to_string(),
                    _ => s,
                }
            }
        }
    }
}

/// An I/O error's reason without Rust's " (os error 2)" suffix, which says nothing
/// more to a user than the words before it.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
