//! # ndfuse
//!
//! Lazy n-dimensional array expressions compiled into fused kernels. Build tensor
//! expressions with ordinary Rust operators and methods; nothing runs until `eval`,
//! which compiles the whole graph into as few kernels as possible (Cranelift JIT on the
//! CPU) and runs them.
//!
//! ```
//! use ndfuse::Context;
//! let ctx = Context::new();
//! let a = ctx.rand_uniform(&[4, 8], -1.0, 1.0, 7);
//! let b = ctx.rand_uniform(&[8], -1.0, 1.0, 8);
//! let y = (&a * &b + 1.0).exp().sum(1);      // broadcast, fuse, reduce
//! let z = a.softmax(-1);
//! let out = ctx.eval(&[&y, &z])?;            // one graph, two outputs
//! assert_eq!(out[0].shape(), &[4]);
//! assert_eq!(out[1].shape(), &[4, 8]);
//! # Ok::<(), ndfuse::Error>(())
//! ```
//!
//! Errors never panic: an op that is not legal on its operands gives a tensor that
//! carries the error (with the shapes and your call site), and `eval` returns it.

mod array;
mod attention;
mod batch_norm;
mod compiled;
mod composite;
mod constructors;
mod context;
mod contract;
mod conv;
mod conv_transpose;
mod error;
mod eval;
pub mod expr;
mod grad;
mod graph_cache;
mod index;
#[cfg(feature = "ndarray")]
mod interop;
pub mod linalg;
pub mod npy;
mod ops;
mod quant;
mod random;
mod report;
mod scan;
mod tensor;

pub use array::Array;
pub use attention::{attention, Attention, Causal};
pub use batch_norm::BatchNorm;
pub use compiled::Compiled;
pub use composite::{one_hot, tril, triu};
pub use context::{Context, ContextBuilder};
pub use contract::matmul;
pub use conv::{Conv, Padding, Pool, Spatial};
pub use error::{Error, Result};
pub use expr::{Expr, ExprError};
pub use grad::grad;
pub use index::{concat, stack};
pub use ndfuse_ir::{AttentionLayout, BlockFormat, DType, PadMode, ReduceOp};
pub use ndfuse_runtime::{
    bind_thread, bound_device, unbind_thread, BackendKind, CacheStats, CodeCacheStats,
    CompileCacheStats, Config, ConfigSource, CpuDevice, Device, DeviceId, DeviceKind, DeviceMove,
    DeviceSet, GpuDevice,
};
pub use ops::{where_, Axes, Operand, SliceArg};
pub use quant::QuantMatrix;
pub use report::{DeviceArray, Report};
pub use tensor::Tensor;

/// Re-exported half-precision types for typed access to f16 / bf16 arrays.
pub use half::{bf16, f16};

impl Tensor {
    /// A tensor of `data` with `shape` in the global context ([`Context::global`]).
    #[track_caller]
    pub fn from_vec<T: ndfuse_ir::Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Context::global().from_vec(data, shape)
    }

    /// Like [`Tensor::from_vec`], copying a slice.
    #[track_caller]
    pub fn from_slice<T: ndfuse_ir::Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Context::global().from_slice(data, shape)
    }
}
