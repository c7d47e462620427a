//! # ndfuse-codegen-cuda
//!
//! The CUDA code generator: it turns the same kernel descriptions the CPU codegen
//! consumes ([`ndfuse_ir::Kernel`]) into CUDA C ([`emit`], pure Rust producing text, no
//! CUDA needed) and compiles that with NVRTC ([`compile`], behind the default-on `nvrtc`
//! feature; NVRTC is loaded at run time through cudarc, so this crate builds and links
//! on a machine with no CUDA installed).
//!
//! ```
//! use ndfuse_codegen_cuda::{emit, CudaOptions};
//! use ndfuse_ir::{Buffer, DType, Expr, Instr, Kernel, Plan, Shape, Store, ValueId, View, UnaryOp};
//!
//! let shape = Shape::new([1024]);
//! let kernel = Kernel {
//!     name: "k0_exp".into(),
//!     domain: shape.clone(),
//!     inputs: vec![Buffer { dtype: DType::F32, len: 1024 }],
//!     outputs: vec![Buffer { dtype: DType::F32, len: 1024 }],
//!     body: vec![
//!         Instr { dtype: DType::F32, expr: Expr::Load { input: 0, view: View::contiguous(shape) } },
//!         Instr { dtype: DType::F32, expr: Expr::Unary(UnaryOp::Exp, ValueId(0)) },
//!     ],
//!     stores: vec![Store { value: ValueId(1), output: 0 }],
//!     reduce_axes: vec![],
//!     plan: Plan::Elementwise,
//!     plan_reason: "element-wise".into(),
//!     contraction: None,
//! };
//! let cuda = emit(&kernel, &CudaOptions::default()).expect("a valid kernel renders");
//! assert!(cuda.source.contains("extern \"C\" __global__ void __launch_bounds__(256) k0_exp("));
//! assert!(cuda.source.contains("expf(v0)"));
//! assert_eq!(cuda.launches.len(), 1);
//! ```

mod emit;
mod error;
mod index;
#[cfg(feature = "nvrtc")]
mod nvrtc;
mod scalar;

pub use emit::attention::ATTENTION_MAX_HEAD_DIM;
pub use emit::emit;
pub use emit::launch::{CudaKernel, CudaOptions, Launch};
pub use emit::routine::{
    emit_routine, RoutineCode, ARGSORT_MAX_ROW, SCAN_CHUNK, SCAN_SHORT, SCAN_SLOTS,
};
pub use error::CudaError;
#[cfg(feature = "nvrtc")]
pub use nvrtc::{
    clear_memory_cache, compile, include_dirs, nvrtc_supported_archs, nvrtc_version,
    CompileOptions, Compiled, ImageKind, Origin,
};
