//! Errors of evaluating a graph on a backend, and of building or using a device set.

use crate::alloc::AllocError;
use crate::config::ConfigError;
use crate::device_id::DeviceId;
use ndfuse_ir::{TensorType, VerifyErrors};

/// Why an evaluation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The graph does not verify (a bug in whoever built it).
    #[error(transparent)]
    Invalid(#[from] VerifyErrors),
    /// An input node has no data bound to it.
    #[error("input {name:?} ({expected}) has no data bound to it")]
    MissingInput {
        /// The input's name.
        name: String,
        /// Its declared type.
        expected: TensorType,
    },
    /// Data bound to an input does not match its declared type.
    #[error("input {name:?} is declared {expected} but the data bound to it is {got}")]
    InputMismatch {
        /// The input's name.
        name: String,
        /// Its declared type.
        expected: TensorType,
        /// The bound data's type.
        got: TensorType,
    },
    /// The requested backend cannot run here.
    #[error("backend {backend} is not available: {reason}")]
    Unavailable {
        /// The backend asked for.
        backend: &'static str,
        /// Why it is absent.
        reason: String,
    },
    /// The reference interpreter failed.
    #[error(transparent)]
    Interp(#[from] ndfuse_ir::interp::InterpError),
    /// A buffer for an output or intermediate could not be allocated.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// CPU code generation or a JIT call failed.
    #[error(transparent)]
    Codegen(#[from] ndfuse_codegen_cpu::CodegenError),
    /// CUDA code generation or NVRTC failed (the error carries NVRTC's log and the path
    /// of the saved source).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    CudaCodegen(#[from] ndfuse_codegen_cuda::CudaError),
    /// A CUDA driver call failed: the call and the driver's error code.
    #[error("CUDA driver: {0}")]
    Cuda(String),
    /// A pass failed (or broke the graph, which the pass manager caught).
    #[error(transparent)]
    Pass(#[from] ndfuse_passes::PassError),
    /// The configuration (file, environment or builder) has an unknown key or a bad value.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A device set could not be built or used (an unknown device, every device out of
    /// memory).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// `auto` found no backend that can run; each rejected backend with its reason.
    #[error("no backend can run here: {reasons}")]
    NoBackend {
        /// `name: reason` for every rejected backend, `; `-separated.
        reasons: String,
    },
}

/// Mistakes in building or using a device set.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A device set with no device.
    #[error("a device set needs at least one device")]
    Empty,
    /// Two devices with the same id.
    #[error("device {device} appears twice in the device set")]
    Duplicate {
        /// The repeated id.
        device: DeviceId,
    },
    /// A device asked for (bound to the thread, or named in a call) that the set lacks.
    #[error("device {device} is not in the device set (it has {available})")]
    NotInSet {
        /// The id asked for.
        device: DeviceId,
        /// The set's devices, `, `-separated.
        available: String,
    },
    /// The CPU cannot be split as asked.
    #[error("cannot make {devices} CPU devices from {threads} threads: {reason}")]
    CpuSplit {
        /// Devices asked for.
        devices: usize,
        /// Threads to share among them.
        threads: usize,
        /// What is wrong.
        reason: String,
    },
    /// Every device of the set ran out of memory for one evaluation.
    #[error("out of memory on every device: {}", .attempts.join("; "))]
    OutOfMemoryEverywhere {
        /// `device: error` for each device tried, in the order tried.
        attempts: Vec<String>,
    },
}
