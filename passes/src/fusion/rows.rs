//! Row-local fusion (rule 3): a view of a row value that only adds or removes size-1
//! axes, or broadcasts its keepdims form back over the reduced axes, is the same value
//! inside the kernel, so softmax, log_softmax, layernorm, var and std are ONE kernel.

use super::group::{Fuser, Role};
use ndfuse_ir::{reduced_shape, Level, NodeId, Shape, ViewOp};

/// `dims` without its size-1 axes: two shapes with equal results hold the same
/// elements in the same order.
fn strip_ones(s: &Shape) -> Vec<usize> {
    s.dims().iter().copied().filter(|&d| d != 1).collect()
}

/// `domain` with every reduced axis set to 1: the keepdims shape of a row value.
pub(super) fn keepdims_shape(domain: &Shape, reduce: &[usize]) -> Shape {
    reduced_shape(domain, reduce, true)
}

impl Fuser<'_> {
    /// Rule 3: a view of a row value that stays the same value inside its kernel.
    pub(super) fn try_alias(&mut self, n: NodeId, v: &ViewOp) {
        let o = self.g.operands(n)[0];
        let Some(gi) = self.group_of(o).filter(|_| self.fuse) else {
            return;
        };
        if self.level[&o] != Level::Row {
            return;
        }
        let grp = &self.groups[gi];
        let Some(reduce) = &grp.reduce else { return };
        let (shape, from) = (&self.g.node(n).shape, &self.g.node(o).shape);
        let level = match v {
            // keepdims row value broadcast back over the reduced axes.
            ViewOp::BroadcastTo(_)
                if shape == &grp.domain && from == &keepdims_shape(&grp.domain, reduce) =>
            {
                Level::Element
            }
            // Adding or removing size-1 axes keeps one value per row, in row order.
            ViewOp::Reshape(_) | ViewOp::ExpandDims(_) | ViewOp::Squeeze(_)
                if strip_ones(shape) == strip_ones(from) =>
            {
                Level::Row
            }
            _ => return,
        };
        if self.convex_union(&[gi], Some(n)) {
            self.role.insert(n, Role::Member(usize::MAX));
            self.merge(&[gi], Some(n));
            self.level.insert(n, level);
            self.alias.insert(n, o);
        }
    }
}
