//! View collapsing: chains of views of the same kind become one view, and views that
//! change nothing disappear, as a table of rewrite rules run to a fixed point. Fusion
//! composes any remaining chain of mixed views into one index map when it builds
//! loads, so this pass only has to leave fewer, simpler views behind (and give CSE
//! identical chains in one canonical form).
//!
//! Every view is exact (it moves elements, never computes), so each rule only has to
//! select the same elements in the same order.

use crate::pass::{Pass, PassCx, PassError};
use crate::rewrite::{run_to_fixed_point, sole_operand, Rewrite};
use ndfuse_ir::{AxisSlice, Graph, NodeId, Op, ViewOp};

/// Merges chains of views and removes identity views.
#[derive(Clone, Copy, Debug, Default)]
pub struct Views;

impl Pass for Views {
    fn name(&self) -> &'static str {
        "views"
    }

    fn run(&self, g: &mut Graph, cx: &PassCx) -> Result<bool, PassError> {
        run_to_fixed_point(g, cx, self.name(), collapse_view)
    }
}

/// The rule table.
fn collapse_view(g: &Graph, id: NodeId) -> Option<Rewrite> {
    use Rewrite::Use;
    let Op::View(v) = &g.node(id).op else {
        return None;
    };
    let x = sole_operand(g, id)?;
    let inner = match &g.node(x).op {
        Op::View(w) => Some(w),
        _ => None,
    };
    let rewrite = match (v, inner) {
        // reshape, permute, slice, broadcast_to or squeeze that changes nothing => x
        (v, _) if is_identity(g, v, x) => Use(x),
        // reshape(reshape y) => reshape y; the same through expand_dims and squeeze,
        // which only add or drop size-1 axes: all three keep row-major order
        (
            ViewOp::Reshape(s),
            Some(ViewOp::Reshape(_) | ViewOp::ExpandDims(_) | ViewOp::Squeeze(_)),
        ) => view_of(g, ViewOp::Reshape(s.clone()), sole_operand(g, x)?),
        // permute(permute(y, p), q) => permute(y, [p[q[0]], p[q[1]], ...])
        (ViewOp::Permute(q), Some(ViewOp::Permute(p))) => view_of(
            g,
            ViewOp::Permute(q.iter().map(|&i| p[i]).collect()),
            sole_operand(g, x)?,
        ),
        // slice(slice(y, s), t) => slice(y, s∘t), axis by axis
        (ViewOp::Slice(t), Some(ViewOp::Slice(s))) => view_of(
            g,
            ViewOp::Slice(
                s.iter()
                    .zip(t)
                    .map(|(s, t)| compose_slices(s, t))
                    .collect::<Option<_>>()?,
            ),
            sole_operand(g, x)?,
        ),
        // broadcast_to(broadcast_to(y, s), t) => broadcast_to(y, t)   (y broadcasts to t)
        (ViewOp::BroadcastTo(t), Some(ViewOp::BroadcastTo(_))) => {
            view_of(g, ViewOp::BroadcastTo(t.clone()), sole_operand(g, x)?)
        }
        // squeeze(expand_dims(y, a), [a]) => y
        (ViewOp::Squeeze(axes), Some(ViewOp::ExpandDims(a))) if axes.as_slice() == [*a] => {
            Use(sole_operand(g, x)?)
        }
        // expand_dims(squeeze(y, [a]), a) => y
        (ViewOp::ExpandDims(a), Some(ViewOp::Squeeze(axes))) if axes.as_slice() == [*a] => {
            Use(sole_operand(g, x)?)
        }
        _ => return None,
    };
    Some(rewrite)
}

/// Whether view `v` of `x` is `x` itself.
fn is_identity(g: &Graph, v: &ViewOp, x: NodeId) -> bool {
    let shape = &g.node(x).shape;
    match v {
        ViewOp::Reshape(s) | ViewOp::BroadcastTo(s) => s == shape,
        ViewOp::Permute(p) => p.iter().enumerate().all(|(i, &a)| i == a),
        ViewOp::Slice(sl) => {
            sl.len() == shape.rank() && sl.iter().zip(shape.dims()).all(|(s, &d)| s.is_full(d))
        }
        ViewOp::Squeeze(axes) => axes.is_empty(),
        ViewOp::ExpandDims(_) => false,
    }
}

/// The view `v` of `y`, or `y` itself when `v` changes nothing (so a chain that
/// composes to the identity disappears in one step).
fn view_of(g: &Graph, v: ViewOp, y: NodeId) -> Rewrite {
    if is_identity(g, &v, y) {
        Rewrite::Use(y)
    } else {
        Rewrite::New(Op::View(v), vec![y])
    }
}

/// Slice `t` of the result of slice `s` as one slice of `s`'s operand: element `k` is
/// `s.start + (t.start + k * t.step) * s.step`. `None` on i64 overflow (the rule then
/// does not apply).
fn compose_slices(s: &AxisSlice, t: &AxisSlice) -> Option<AxisSlice> {
    let step = s.step.checked_mul(t.step)?;
    if t.len == 0 {
        // No element is taken, so the start means nothing; 0 keeps it printable.
        return Some(AxisSlice {
            start: 0,
            step,
            len: 0,
        });
    }
    let start = s.start.checked_add(t.start.checked_mul(s.step)?)?;
    Some(AxisSlice {
        start,
        step,
        len: t.len,
    })
}
