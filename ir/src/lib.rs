//! # ndfuse-ir
//!
//! The intermediate representation every other ndfuse crate speaks: element types and
//! promotion ([`DType`]), shapes and zero-copy views ([`Shape`], [`View`]), the one closed
//! op enum ([`Op`]), the graph on petgraph ([`Graph`]) with shape/dtype inference
//! ([`infer()`]), a verifier that reports every problem ([`verify()`]), a stable text
//! printer and Graphviz output, the kernel description handed from passes to codegens
//! ([`Kernel`]), and the f64 reference interpreter ([`interp`]) that every backend is
//! tested against.

pub mod array;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod kernel;
mod kernel_check;
pub mod linalg;
pub mod op;
mod print;
pub mod quant;
pub mod round;
pub mod shape;
pub mod verify;

pub use array::{Element, HostArray, Recycle, Storage};
pub use dtype::{DKind, DType, Scalar};
pub use error::{IntList, IrError, TensorType};
pub use graph::{Graph, NodeId, Slot};
pub use infer::{infer, reduced_shape};
pub use kernel::{
    Accumulate, Buffer, Contraction, Expr, GatherAxis, IndexCheck, Instr, Kernel, Level, Plan,
    Prologue, Store, ValueId,
};
pub use linalg::{LinalgFailure, LinalgOp};
pub use op::{
    ArgReduceOp, AttentionLayout, AttentionSpec, BinaryOp, CausalMask, Node, Op, PadMode, ReduceOp,
    ScanOp, UnaryOp, ViewOp,
};
pub use quant::{BlockFormat, QuantSpec};
pub use shape::{AxisSlice, Shape, View};
pub use verify::{verify, VerifyError, VerifyErrors};
