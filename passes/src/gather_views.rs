//! Views of a gather move below it: `broadcast_to(take(pos, arange(T)), [B, T, D])`
//! becomes a gather of a broadcast table through broadcast indices, so the gather's
//! consumer reads it at its own positions and the two fuse (a view of a kernel's value
//! would otherwise be stored and read back). A gather's operands agree on every axis but
//! the gathered one, so a view that keeps that axis applies to both: the indices take
//! the view as it is, the table takes it with the gathered axis left whole.

use crate::pass::{live_order, Pass, PassCx, PassError};
use ndfuse_ir::{AxisSlice, Graph, NodeId, Op, Shape, ViewOp};

/// Rewrites views of gathers into gathers of views.
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherViews;

impl Pass for GatherViews {
    fn name(&self) -> &'static str {
        "gather_views"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        let pass = self.name();
        let mut changed = false;
        // One sweep in topological order: a chain of views moves down one view at a
        // time, each new gather the operand of the next view.
        for id in live_order(g, pass)? {
            let Op::View(v) = g.node(id).op.clone() else {
                continue;
            };
            let x = g.operands(id)[0];
            let Op::Gather { axis } = g.node(x).op else {
                continue;
            };
            let [data, idx] = [0, 1].map(|i| g.operands(x)[i]);
            let Some((axis2, data_view)) = through(&v, axis, g, data, idx) else {
                continue;
            };
            let err = |source| PassError::Ir { pass, source };
            let d = g.add(Op::View(data_view), &[data]).map_err(err)?;
            let i = g.add(Op::View(v), &[idx]).map_err(err)?;
            let new = g.add(Op::Gather { axis: axis2 }, &[d, i]).map_err(err)?;
            g.replace_all_uses(id, new);
            changed = true;
        }
        Ok(changed)
    }
}

/// The gathered axis after view `v` of a gather over `axis`, and the view the table
/// (`data`) takes; `None` when the view does not keep the axis whole (a reshape that
/// merges it, a squeeze of it).
fn through(
    v: &ViewOp,
    axis: usize,
    g: &Graph,
    data: NodeId,
    idx: NodeId,
) -> Option<(usize, ViewOp)> {
    let n = g.node(data).shape.dims()[axis];
    let out = g.node(idx).shape.clone();
    Some(match v {
        ViewOp::ExpandDims(a) => (axis + usize::from(*a <= axis), v.clone()),
        ViewOp::Squeeze(axes) if !axes.contains(&axis) => {
            (axis - axes.iter().filter(|&&a| a < axis).count(), v.clone())
        }
        ViewOp::Squeeze(_) => return None,
        ViewOp::Permute(p) => (p.iter().position(|&a| a == axis)?, v.clone()),
        ViewOp::BroadcastTo(to) => {
            let axis2 = axis + (to.rank() - out.rank());
            let mut dims = to.dims().to_vec();
            dims[axis2] = n;
            (axis2, ViewOp::BroadcastTo(Shape::new(dims)))
        }
        ViewOp::Slice(s) => {
            let mut s2 = s.clone();
            s2[axis] = AxisSlice::full(n);
            (axis, ViewOp::Slice(s2))
        }
        ViewOp::Reshape(to) => {
            // Only reshapes that add or drop size-1 axes, with the gathered axis not
            // of size 1: it keeps its place among the other axes.
            let big = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
            if out.dims()[axis] == 1 || big(out.dims()) != big(to.dims()) {
                return None;
            }
            let rank_among = out.dims()[..axis].iter().filter(|&&d| d != 1).count();
            let axis2 = to
                .dims()
                .iter()
                .enumerate()
                .filter(|&(_, &d)| d != 1)
                .nth(rank_among)?
                .0;
            let mut dims = to.dims().to_vec();
            dims[axis2] = n;
            (axis2, ViewOp::Reshape(Shape::new(dims)))
        }
    })
}
