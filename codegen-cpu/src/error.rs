//! The one error type of the CPU code generator.

/// Why a kernel could not be compiled or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// The kernel uses something this code generator does not compile (yet); the
    /// runtime falls back to the interpreter.
    #[error("kernel {kernel}: the CPU code generator cannot compile it: {reason}")]
    Unsupported {
        /// The kernel's name.
        kernel: String,
        /// The first thing that is not supported.
        reason: String,
    },
    /// Cranelift rejected the generated function or failed to compile or link it; the
    /// message carries Cranelift's own report (with the annotated function text when
    /// the verifier failed).
    #[error("kernel {kernel}: Cranelift failed: {message}")]
    Cranelift {
        /// The kernel's name.
        kernel: String,
        /// Cranelift's report.
        message: String,
    },
    /// The arrays passed to [`crate::CompiledKernel::run`] do not match the kernel.
    #[error("kernel {kernel}: bad arguments: {detail}")]
    Args {
        /// The kernel's name.
        kernel: String,
        /// Which argument is wrong and how.
        detail: String,
    },
    /// The scratch of a split reduction (result and partial slots of every row, so
    /// sized by the user's shapes) could not be allocated; nothing ran.
    #[error("kernel {kernel}: out of memory: {bytes} bytes of split-reduction scratch")]
    OutOfMemory {
        /// The kernel's name.
        kernel: String,
        /// The bytes asked for (more than `usize` can count when the slot count is
        /// near `usize::MAX`).
        bytes: u128,
    },
}
