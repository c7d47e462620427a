//! The interpreter's error: a missing or mismatched input, an invalid graph or node, or
//! arrays that do not fit a kernel.

use crate::error::TensorType;
use crate::graph::NodeId;
use crate::verify::VerifyErrors;

/// Why the interpreter could not evaluate a graph, node or kernel.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// An input node reachable from the outputs has no array bound to it.
    #[error("input {name:?} ({node}) has no array bound to it")]
    MissingInput {
        /// The input node.
        node: NodeId,
        /// Its name.
        name: String,
    },
    /// The array bound to an input has another dtype or shape than the input node.
    #[error("input {name:?} expects {expected}, got {got}")]
    InputMismatch {
        /// The input's name.
        name: String,
        /// The input node's type.
        expected: TensorType,
        /// The bound array's type.
        got: TensorType,
    },
    /// The graph (or, for `eval_node`, the node with its operands) fails verification.
    #[error(transparent)]
    Invalid(#[from] VerifyErrors),
    /// The arrays passed to `eval_kernel` do not fit the kernel, or the kernel
    /// description is malformed.
    #[error("kernel {kernel}: {detail}")]
    KernelArgs {
        /// The kernel's name.
        kernel: String,
        /// What does not fit.
        detail: String,
    },
}
