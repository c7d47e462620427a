//! # ndfuse-passes
//!
//! Turns a verified graph into a [`Schedule`]: the fewest kernels the current fusion
//! rules allow, each a [`ndfuse_ir::Kernel`] description that every codegen consumes as
//! is, plus the nodes that still run in the reference interpreter.
//!
//! This version fuses element-wise DAGs (with views folded into loads) into one kernel
//! each; reductions run in the interpreter. The pass manager, clean-up passes,
//! reduction fusion and parallel plans grow here (see `fusion.rs` for the rules).

pub mod fusion;
pub mod schedule;

pub use fusion::schedule;
pub use schedule::{Placement, Schedule, Step};
