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
    /// Memory for a buffer whose size the user chose (a constructor's data, a `.npy`
    /// file's array, an output or intermediate of an evaluation) could not be had, even
    /// after the host cache freed what it held; or its size does not fit this
    /// platform's address space. Nothing was allocated.
    #[error("out of memory: {} for {what}", bytes_text(*.bytes))]
    OutOfMemory {
        /// The size asked for (`u128::MAX`: more than any count of bytes).
        bytes: u128,
        /// What the memory was for (`rand_uniform f32[100000, 100000]`).
        what: String,
    },
    /// Evaluation failed in a backend.
    #[error(transparent)]
    Runtime(Arc<ndfuse_runtime::RuntimeError>),
}

impl From<ndfuse_runtime::RuntimeError> for Error {
    /// A buffer the runtime could not allocate becomes [`Error::OutOfMemory`]: its size
    /// came from the user's shapes. Every other failure stays a runtime error.
    fn from(e: ndfuse_runtime::RuntimeError) -> Error {
        use ndfuse_runtime::{AllocError, RuntimeError};
        match e {
            RuntimeError::Alloc(
                AllocError::OutOfMemory { memory, bytes } | AllocError::TooLarge { memory, bytes },
            ) => Error::OutOfMemory {
                bytes: bytes as u128,
                what: format!("a {memory} buffer of the evaluation"),
            },
            RuntimeError::Interp(ndfuse_ir::interp::InterpError::OutOfMemory { bytes, what }) => {
                Error::OutOfMemory { bytes, what }
            }
            RuntimeError::Codegen(ndfuse_runtime::CodegenError::OutOfMemory { kernel, bytes }) => {
                Error::OutOfMemory {
                    bytes,
                    what: format!("the split-reduction scratch of kernel {kernel}"),
                }
            }
            e => Error::Runtime(Arc::new(e)),
        }
    }
}

/// `N bytes`, or what a byte count beyond the address space means.
fn bytes_text(bytes: u128) -> String {
    if bytes > usize::MAX as u128 {
        "more bytes than this platform can address".into()
    } else {
        format!("{bytes} bytes")
    }
}

/// The bytes `dims` of `dtype` hold, saturating at `u128::MAX` (which no allocation
/// can have, so an overflowing shape is refused like any other huge one).
pub(crate) fn shape_bytes(dims: &[usize], dtype: DType) -> u128 {
    dims.iter()
        .try_fold(dtype.size_bytes() as u128, |a, &d| a.checked_mul(d as u128))
        .unwrap_or(u128::MAX)
}

/// Storage of `dtype` for `dims`, element `i` being `f(i)` (converted by the cast
/// rules), allocated fallibly: when memory is short the host cache is emptied and the
/// allocation tried once more (as the runtime does for its own buffers), then
/// [`Error::OutOfMemory`] naming `what`. An element count or byte size beyond `usize`
/// is refused before anything is allocated.
pub(crate) fn try_storage(
    dtype: DType,
    dims: &[usize],
    what: impl FnOnce() -> String,
    mut f: impl FnMut(usize) -> f64,
) -> Result<ndfuse_ir::Storage> {
    let bytes = shape_bytes(dims, dtype);
    let oom = |what: String| Error::OutOfMemory { bytes, what };
    if bytes > isize::MAX as u128 {
        return Err(oom(what()));
    }
    let len: usize = dims.iter().product();
    if let Some(s) = ndfuse_ir::Storage::try_from_fn(dtype, len, &mut f) {
        return Ok(s);
    }
    ndfuse_runtime::host_cache().trim();
    ndfuse_ir::Storage::try_from_fn(dtype, len, f).ok_or_else(|| oom(what()))
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
