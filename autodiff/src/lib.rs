//! # ndfuse-autodiff
//!
//! Reverse-mode automatic differentiation over the IR graph: [`grad`] takes a graph, a
//! 0-d float loss node and the nodes to differentiate with respect to, and returns a
//! copy of the graph with gradient nodes of the same IR added, so the backward pass
//! goes through the same passes and fuses like any other graph (tinygrad's model).
//! The rules, one per op, are one table in `rules.rs`.

mod backward;
mod emit;
mod error;
mod linalg;
mod rules;

pub use backward::{grad, Backward};
pub use error::AutodiffError;
