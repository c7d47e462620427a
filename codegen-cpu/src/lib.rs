//! # ndfuse-codegen-cpu
//!
//! The CPU code generator: turns a [`Kernel`](ndfuse_ir::Kernel) (the contract handed
//! down by the passes) into machine code through Cranelift's JIT and runs it on host
//! arrays.
//!
//! The pipeline inside this crate is a straight line:
//!
//! 1. [`supports`] decides whether the kernel can be compiled at all (dtypes, plan, a
//!    well-formed description whose loads stay inside their buffers);
//! 2. `index` plans how each load turns the flat domain position into a buffer offset
//!    (contiguous, fixed, or strided with merged axes);
//! 3. `lower` writes one Cranelift function, a scalar loop over `[start, end)` (for a
//!    kernel with reduce axes, a loop over rows with one sweep over each row per group
//!    of sibling reductions and one for element stores: `lower::rows`);
//! 4. `jit` compiles it with the host ISA, owns the code memory, and runs it (in
//!    parallel chunks, or one range).
//!
//! Every kernel compiles to one function with the C ABI
//! `fn(ptrs: *const *mut u8, start: i64, end: i64)`: `ptrs` holds the input buffer
//! pointers and then the output buffer pointers. A range rather than the whole domain
//! is the unit of work so that threads split the domain without recompiling:
//! [`CompiledKernel::run`] cuts it into chunks fixed by the kernel's shape and runs them
//! on rayon's threads, with bit-identical results whatever the thread count.
//! For a kernel with reduce axes, `start..end` count rows (`Kernel::rows`), never
//! positions: a row is always reduced whole, by one call.
//!
//! ```
//! use ndfuse_codegen_cpu::compile;
//! use ndfuse_ir::{Buffer, DType, Expr, HostArray, Instr, Kernel, Plan, Shape, Store, ValueId, View, BinaryOp};
//!
//! let shape = Shape::new([4]);
//! let load = |input| Instr { dtype: DType::F32, expr: Expr::Load { input, view: View::contiguous(shape.clone()) } };
//! let kernel = Kernel {
//!     name: "k0_add".into(),
//!     domain: shape.clone(),
//!     inputs: vec![Buffer { dtype: DType::F32, len: 4 }; 2],
//!     outputs: vec![Buffer { dtype: DType::F32, len: 4 }],
//!     body: vec![load(0), load(1), Instr { dtype: DType::F32, expr: Expr::Binary(BinaryOp::Add, ValueId(0), ValueId(1)) }],
//!     stores: vec![Store { value: ValueId(2), output: 0 }],
//!     reduce_axes: vec![],
//!     plan: Plan::Elementwise,
//!     plan_reason: "element-wise".into(),
//! };
//! let compiled = compile(&kernel).expect("f32 add compiles");
//! let a = HostArray::from_f64s(DType::F32, shape.clone(), &[1.0, 2.0, 3.0, 4.0]);
//! let b = HostArray::from_f64s(DType::F32, shape.clone(), &[10.0, 20.0, 30.0, 40.0]);
//! let mut out = HostArray::zeros(DType::F32, shape);
//! compiled.run(&[&a, &b], &mut [&mut out]).expect("arguments match the kernel");
//! assert_eq!(out.as_slice::<f32>(), Some(&[11.0f32, 22.0, 33.0, 44.0][..]));
//! ```

mod error;
mod index;
mod jit;
mod libcalls;
mod lower;
mod support;

pub use error::CodegenError;
pub use jit::{compile, CompiledKernel};
pub use support::supports;
