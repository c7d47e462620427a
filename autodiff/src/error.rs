//! Why a gradient cannot be built: a loss that is not a 0-d float, an id not in the
//! graph, a non-float `wrt`, or (a bug) a rule that built an ill-typed node.

use ndfuse_ir::{IrError, NodeId, TensorType};

/// Everything `grad` can refuse.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    /// The loss is not a 0-d float value (reduce it first, e.g. with `sum`).
    #[error("grad: the loss must be a 0-d float value, got {ty} (reduce it to a scalar first)")]
    LossNotScalar {
        /// The loss's dtype and shape.
        ty: TensorType,
    },
    /// A `wrt` that is not a float value: integers and bools have no gradient.
    #[error("grad: cannot differentiate with respect to {node} of type {ty}: only float values have gradients")]
    NotFloat {
        /// The node asked for.
        node: NodeId,
        /// Its dtype and shape.
        ty: TensorType,
    },
    /// An op whose gradient rule is not written.
    #[error("grad: {op} has no gradient rule yet")]
    NoRule {
        /// The op.
        op: &'static str,
    },
    /// An id that is not a node of the graph.
    #[error("grad: node {node} is not in the graph")]
    UnknownNode {
        /// The stale id.
        node: NodeId,
    },
    /// The graph has a cycle, so it has no reverse order.
    #[error("grad: the graph has a cycle through {node}")]
    Cycle {
        /// A node on the cycle.
        node: NodeId,
    },
    /// A rule built a node its operands do not allow (a bug in the rule).
    #[error("grad: the {rule} rule built an illegal node (a bug in autodiff): {source}")]
    Rule {
        /// The op whose rule failed.
        rule: &'static str,
        /// What the IR said.
        #[source]
        source: IrError,
    },
}
