//! What emission produces and the limits it respects: the options, the launches, and
//! the kernel as CUDA C (the crate's public output types).

/// Limits the emitted launches respect (the runtime's `max_block_size` and
/// `max_grid_size` configuration keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaOptions {
    /// Most threads per block (rounded down to a power of two, at least 32).
    pub max_block_size: u32,
    /// Most blocks per launch (grid-stride loops cover the rest).
    pub max_grid_size: u32,
    /// The target device's compute capability `(major, minor)`, when known. It decides
    /// whether matrix products of f16 (sm_70 and newer) or bf16 (sm_80 and newer)
    /// operands use tensor cores (`emit/gemm_wmma.rs`); `None`, the default, emits code
    /// for any device (no tensor cores).
    pub compute_capability: Option<(u32, u32)>,
}

impl Default for CudaOptions {
    /// ND4J's defaults: 256 threads, 4096 blocks; no tensor cores.
    fn default() -> CudaOptions {
        CudaOptions {
            max_block_size: 256,
            max_grid_size: 4096,
            compute_capability: None,
        }
    }
}

/// One kernel launch: which function, and its shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    /// The `extern "C" __global__` function's name.
    pub function: String,
    /// Blocks (x only: every grid here is one-dimensional).
    pub grid: u32,
    /// Threads per block (x, y).
    pub block: (u32, u32),
}

/// A kernel as CUDA C: the source, and the launches that run it, in order. Every
/// function takes the kernel's input pointers (but none for a contraction's product,
/// the last input, which never exists in memory), then its output pointers, then (when
/// `scratch_bytes > 0`) a scratch buffer of that many bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaKernel {
    /// The kernel's name (`k2_mul_add_exp_sum`).
    pub name: String,
    /// The whole translation unit: includes, helpers, functions.
    pub source: String,
    /// Launches in order.
    pub launches: Vec<Launch>,
    /// Bytes of scratch memory the launches share (split reductions' partials).
    pub scratch_bytes: usize,
    /// How the work is laid out, for dumps (`"block per row, 256 threads, row in registers"`).
    pub strategy: String,
    /// Whether any buffer or value is f16/bf16 (so NVRTC needs the CUDA headers).
    pub uses_half: bool,
}
