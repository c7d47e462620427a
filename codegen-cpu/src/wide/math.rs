//! Which wide routine computes which unary op (filled in by the exp and log files).

use super::tier::{Tier, UnaryFn};
use ndfuse_ir::UnaryOp;

/// The routine of `op` at `tier`, where the wide path has one.
pub(super) fn unary_fn(op: UnaryOp, tier: Tier) -> Option<UnaryFn> {
    let _ = (op, tier);
    None
}
