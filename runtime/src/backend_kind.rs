//! `BackendKind`: which backend evaluates a graph, as code, the config and reports name it.

/// Which backend evaluates a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// The best backend present (the CPU backend in this version).
    #[default]
    Auto,
    /// Fused kernels JIT-compiled with Cranelift; what the JIT cannot compile yet runs
    /// in the interpreter, and the report says so.
    Cpu,
    /// The CUDA backend.
    Cuda,
    /// The f64 reference interpreter, node by node, no fusion.
    Interp,
}

impl BackendKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Interp => "interp",
        }
    }
}
