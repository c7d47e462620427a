//! Errors of graph construction and checking. Every variant names the op and the shapes
//! or dtypes involved, so the frontend only has to add the user's call site.

use crate::dtype::DType;
use crate::shape::Shape;
use std::fmt;

/// A dtype and a shape, printed as `f32[4,8]` in messages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Prints a list of signed integers as `[2,-1]` (user-supplied axes or shapes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntList(pub Vec<i64>);

impl fmt::Display for IntList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{v}")?;
        }
        f.write_str("]")
    }
}

/// Why an op cannot be built on the given operands.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum IrError {
    /// Two operands whose shapes do not broadcast together.
    #[error("{op}: shapes {lhs} and {rhs} do not broadcast")]
    Broadcast {
        /// The op being built.
        op: &'static str,
        /// First operand.
        lhs: TensorType,
        /// Second operand.
        rhs: TensorType,
    },
    /// Element-wise operands of different shapes reached the IR (the frontend
    /// broadcasts explicitly, so this is an error in graph construction).
    #[error("{op}: operands {lhs} and {rhs} must have the same shape")]
    ShapeMismatch {
        /// The op being built.
        op: &'static str,
        /// First operand.
        lhs: TensorType,
        /// Second operand.
        rhs: TensorType,
    },
    /// Operands of different dtypes where one dtype is required.
    #[error("{op}: operands {lhs} and {rhs} must have the same dtype")]
    DTypeMismatch {
        /// The op being built.
        op: &'static str,
        /// First operand.
        lhs: TensorType,
        /// Second operand.
        rhs: TensorType,
    },
    /// A dtype the op does not accept.
    #[error("{op}: {operand} is not allowed: {why}")]
    BadDType {
        /// The op being built.
        op: &'static str,
        /// The offending operand.
        operand: TensorType,
        /// What to do instead.
        why: &'static str,
    },
    /// An axis outside `-rank..rank`.
    #[error("{op}: axis {axis} is out of range for {operand} (rank {rank})", rank = operand.shape.rank())]
    AxisOutOfRange {
        /// The op being built.
        op: &'static str,
        /// The axis as given.
        axis: i64,
        /// The operand.
        operand: TensorType,
    },
    /// The same axis named twice.
    #[error("{op}: axis {axis} is given more than once for {operand}")]
    DuplicateAxis {
        /// The op being built.
        op: &'static str,
        /// The repeated axis, normalised.
        axis: usize,
        /// The operand.
        operand: TensorType,
    },
    /// A reshape to a different element count, or with a bad `-1`.
    #[error("reshape: cannot reshape {from} ({n} elements) into {to}: {why}", n = from.shape.numel())]
    Reshape {
        /// The operand.
        from: TensorType,
        /// The requested shape as given.
        to: IntList,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Not a permutation of the axes.
    #[error("permute: {perm} is not a permutation of the {rank} axes of {operand}", rank = operand.shape.rank())]
    BadPermutation {
        /// The requested order as given.
        perm: IntList,
        /// The operand.
        operand: TensorType,
    },
    /// A slice with the wrong number of axes or a zero step.
    #[error("slice: {why} for {operand}")]
    BadSlice {
        /// What is wrong.
        why: String,
        /// The operand.
        operand: TensorType,
    },
    /// `broadcast_to` a shape the operand does not broadcast to.
    #[error("broadcast_to: {operand} cannot broadcast to {to}")]
    BroadcastTo {
        /// The operand.
        operand: TensorType,
        /// The target shape.
        to: Shape,
    },
    /// `squeeze` of an axis whose extent is not 1.
    #[error("squeeze: axis {axis} of {operand} has extent {dim}, not 1", dim = operand.shape.dims()[*axis])]
    SqueezeNotOne {
        /// The axis.
        axis: usize,
        /// The operand.
        operand: TensorType,
    },
    /// A max/min/argmax/argmin over zero elements (no identity, like numpy's error).
    #[error(
        "{op}: cannot reduce {operand} over axes {axes:?}: zero-size reduction has no identity"
    )]
    EmptyReduction {
        /// The op being built.
        op: &'static str,
        /// The operand.
        operand: TensorType,
        /// The reduced axes.
        axes: Vec<usize>,
    },
    /// A matrix product whose operands disagree on the contracted extent.
    #[error("{op}: {lhs} @ {rhs}: {lhs_k} != {rhs_k} (the last axis of the left operand must equal the second-to-last of the right)")]
    Contraction {
        /// The op being built.
        op: &'static str,
        /// Left operand (after 1-D promotion).
        lhs: TensorType,
        /// Right operand (after 1-D promotion).
        rhs: TensorType,
        /// Contracted extent of the left operand (its last axis).
        lhs_k: usize,
        /// Contracted extent of the right operand (its second-to-last axis).
        rhs_k: usize,
    },
    /// Wrong number of operands for the op.
    #[error("{op} takes {expected} operands, got {got}")]
    Arity {
        /// The op being built.
        op: &'static str,
        /// Operands it takes.
        expected: usize,
        /// Operands given.
        got: usize,
    },
    /// Operands of an indexed op (gather, scatter-add, concat) whose extents must agree
    /// on every axis but one, and do not.
    #[error("{op}: {lhs} and {rhs} must agree on every axis but axis {axis}")]
    AxisMismatch {
        /// The op being built.
        op: &'static str,
        /// The axis that may differ.
        axis: usize,
        /// First operand (the data, or the first part of a concat).
        lhs: TensorType,
        /// The operand that does not agree with it.
        rhs: TensorType,
    },
    /// Pad widths or a fill the operand does not allow.
    #[error("pad: {why} for {operand}")]
    BadPad {
        /// What is wrong.
        why: String,
        /// The operand.
        operand: TensorType,
    },
    /// Attention operands that do not fit together (head counts, head dimensions, key
    /// counts, the mask's or bias's shape); `why` names the shapes.
    #[error("attention: {why}")]
    Attention {
        /// What is wrong, with the shapes involved.
        why: String,
    },
    /// Operands of the LAPACK level that do not fit (not matrices, not square, `b` not
    /// fitting `a`); `why` names the shapes.
    #[error("{op}: {why}")]
    Linalg {
        /// The op.
        op: &'static str,
        /// What is wrong, with the shapes involved.
        why: String,
    },
    /// Input and const nodes have no operands to infer from.
    #[error("{op} nodes are created with an explicit dtype and shape, not inferred")]
    NotInferable {
        /// The op.
        op: &'static str,
    },
}
