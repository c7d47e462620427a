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
//! 3. `lower` writes Cranelift functions: for an element-wise kernel, a loop over
//!    `[start, end)` (vectors where every load is contiguous and every op has a vector
//!    form, scalars for the rest); for a kernel with reduce axes, one of the plan's
//!    loops: rows one after another with one sweep per group of sibling reductions and
//!    one for element stores, float reductions over contiguous elements in vectors with
//!    several accumulators (`lower::rows`, `lower::vector`); a `Columns` plan as bands of
//!    columns accumulated together while sweeping down the reduced axes
//!    (`lower::columns`); a `Split` plan as phases, partials per chunk of a row then
//!    their combination in chunk order (`lower::split`);
//! 4. `jit` compiles them with the host ISA, owns the code memory, and runs them (in
//!    parallel chunks, or one range).
//!
//! Every kernel compiles to functions with the C ABI
//! `fn(ptrs: *const *mut u8, start: i64, end: i64)`: `ptrs` holds the input buffer
//! pointers and then the output buffer pointers (and, for a split kernel, scratch
//! memory for its partials). A range rather than the whole domain is the unit of work
//! so that threads split the domain without recompiling: [`CompiledKernel::run`] cuts
//! it into chunks fixed by the kernel's shape and runs them on rayon's threads, with
//! bit-identical results whatever the thread count. For a kernel with reduce axes,
//! `start..end` count rows (`Kernel::rows`), never positions: a row is reduced whole by
//! one call, or under a `Split` plan by one call per chunk of the row and one more
//! that combines their partials in chunk order.
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
//!     contraction: None,
//! };
//! let compiled = compile(&kernel).expect("f32 add compiles");
//! let a = HostArray::from_f64s(DType::F32, shape.clone(), &[1.0, 2.0, 3.0, 4.0]);
//! let b = HostArray::from_f64s(DType::F32, shape.clone(), &[10.0, 20.0, 30.0, 40.0]);
//! let mut out = HostArray::zeros(DType::F32, shape);
//! compiled.run(&[&a, &b], &mut [&mut out]).expect("arguments match the kernel");
//! assert_eq!(out.as_slice::<f32>(), Some(&[11.0f32, 22.0, 33.0, 44.0][..]));
//! ```

mod blocks;
mod cost;
mod error;
mod index;
mod isa;
mod jit;
mod libcalls;
mod lower;
mod prepared;
mod shared_math;
mod support;
mod units;
mod vmath;
pub mod wide;

pub use error::CodegenError;
pub use jit::{compile, compile_with, CompiledKernel};
pub use support::supports;
pub use vmath::builder::use_fma;
pub use vmath::{f32_ulp_bound, f64_ulp_bound, POW_F32_ULP};
