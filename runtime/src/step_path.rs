//! `StepPath`: how one step of a schedule ran (JIT, interpreter, CUDA), as reports show it.

/// How one step of the schedule ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepPath {
    /// A JIT-compiled kernel; `cached` when the compiled code was reused.
    Jit {
        /// Whether compilation was skipped thanks to the kernel cache.
        cached: bool,
    },
    /// A kernel the codegen cannot compile yet, evaluated by the interpreter.
    KernelInterp {
        /// What the codegen cannot do.
        reason: String,
    },
    /// A node the passes left to the interpreter.
    Interp,
    /// A node run by a native routine of the backend (scatter-add, a scan, a sort);
    /// `device` names where: `cpu` or `cuda:N`.
    Routine {
        /// Where it ran.
        device: String,
    },
    /// A kernel compiled with NVRTC and launched on CUDA device `device`; `cached` when
    /// the loaded module was reused.
    Cuda {
        /// Whether compilation and loading were skipped thanks to the module cache.
        cached: bool,
        /// The device's ordinal.
        device: usize,
    },
    /// A kernel rendered as CUDA C by `explain`, which runs nothing.
    CudaSource,
}

impl StepPath {
    /// The path without its reason, for notes repeated on every node of a kernel.
    pub fn short(&self) -> &'static str {
        match self {
            StepPath::Jit { cached: false } => "jit",
            StepPath::Jit { cached: true } => "jit, cached",
            StepPath::KernelInterp { .. } | StepPath::Interp => "interp",
            StepPath::Routine { .. } => "routine",
            StepPath::Cuda { cached: false, .. } => "cuda",
            StepPath::Cuda { cached: true, .. } => "cuda, cached",
            StepPath::CudaSource => "cuda",
        }
    }
}

impl std::fmt::Display for StepPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepPath::Jit { cached: false } => f.write_str("jit"),
            StepPath::Jit { cached: true } => f.write_str("jit, cached"),
            StepPath::KernelInterp { reason } => write!(f, "interp: {reason}"),
            StepPath::Interp => f.write_str("interp"),
            StepPath::Routine { device } => write!(f, "routine ({device})"),
            StepPath::Cuda { cached, device } => {
                write!(f, "cuda:{device}{}", if *cached { ", cached" } else { "" })
            }
            StepPath::CudaSource => f.write_str("cuda (source only)"),
        }
    }
}
