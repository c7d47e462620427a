//! The one error type of the CUDA code generator.

use std::path::PathBuf;

/// Why a kernel could not be rendered or compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The kernel description fails `Kernel::check` (a bug in the passes).
    #[error("kernel {kernel}: malformed description: {problems}")]
    Invalid {
        /// The kernel's name.
        kernel: String,
        /// Every problem found.
        problems: String,
    },
    /// NVRTC could not be loaded; the reason says what was looked for.
    #[error("NVRTC is not available: {reason}")]
    NvrtcMissing {
        /// What was looked for and where.
        reason: String,
    },
    /// NVRTC rejected the source. The source is saved at `source_path` so that the log's
    /// line numbers can be read against it.
    #[error("kernel {kernel}: NVRTC failed ({options}):\n{log}\nsource saved at {}", source_path.display())]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// The options NVRTC was given.
        options: String,
        /// NVRTC's program log.
        log: String,
        /// Where the failing source was written.
        source_path: PathBuf,
    },
    /// An NVRTC call other than the compile itself failed.
    #[error("NVRTC {call} failed: {detail}")]
    Nvrtc {
        /// The call.
        call: &'static str,
        /// NVRTC's error.
        detail: String,
    },
    /// The on-disk kernel cache could not be written (reading failures are misses).
    #[error("kernel cache {}: {detail}", path.display())]
    Cache {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        detail: String,
    },
}
