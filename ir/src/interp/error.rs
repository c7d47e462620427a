//! The interpreter's error: a missing or mismatched input, an invalid graph or node,
//! arrays that do not fit a kernel, or a step too large for memory (and the check that
//! finds it before the step allocates).

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
    /// An index of a gather or scatter-add outside `-n..n` for an axis of extent `n`.
    #[error("{op}: index {value} is out of range for axis {axis} of extent {extent} (at position {position:?} of the indices)")]
    IndexOutOfRange {
        /// The op reading through the index.
        op: &'static str,
        /// The axis indexed.
        axis: usize,
        /// The index as given.
        value: i64,
        /// Its position in the index tensor.
        position: Vec<usize>,
        /// The extent of the axis.
        extent: usize,
    },
    /// A matrix of a LAPACK-level op that has no result (numpy's `LinAlgError`): singular,
    /// not positive definite, or not converging.
    #[error("{op}: {failure} in the matrix at batch position {batch:?}")]
    Linalg {
        /// The op.
        op: &'static str,
        /// The matrix's position among the batch axes (`[]` without batch axes).
        batch: Vec<usize>,
        /// What went wrong.
        failure: crate::linalg::LinalgFailure,
    },
    /// A step's result (a node's value, a kernel's outputs), whose size comes from the
    /// user's shapes, is larger than this platform can address or than the memory to
    /// be had; nothing of it was allocated.
    #[error("out of memory: {} for {what}", bytes_text(*.bytes))]
    OutOfMemory {
        /// The bytes the step would hold (`u128::MAX`: more than any count of bytes).
        bytes: u128,
        /// The step (`add f64[1048576, 1048576, 1048576]`).
        what: String,
    },
}

/// `N bytes`, or what a count beyond the address space means.
fn bytes_text(bytes: u128) -> String {
    if bytes > usize::MAX as u128 {
        "more bytes than this platform can address".into()
    } else {
        format!("{bytes} bytes")
    }
}

/// Checks, before a step computes, that its result can be held: `dims` elements of
/// `elem_bytes` bytes each. The count must fit the address space (shapes whose product
/// overflows never do), and an allocation of that many bytes must succeed now; that
/// probe is freed at once and the step then allocates its own vectors, so memory taken
/// by another thread in between can still abort, but a size the allocator refuses
/// outright (larger than memory and swap, or than the address space) is an error.
pub(super) fn room_for(
    dims: &[usize],
    elem_bytes: usize,
    what: impl FnOnce() -> String,
) -> Result<(), InterpError> {
    let bytes = dims
        .iter()
        .try_fold(elem_bytes as u128, |a, &d| a.checked_mul(d as u128))
        .unwrap_or(u128::MAX);
    let fail = || InterpError::OutOfMemory {
        bytes,
        what: what(),
    };
    if bytes > isize::MAX as u128 {
        return Err(fail());
    }
    let mut probe: Vec<u8> = Vec::new();
    probe.try_reserve_exact(bytes as usize).map_err(|_| fail())
}
