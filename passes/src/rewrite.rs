//! The driver shared by the rule-table passes (`fold`, `simplify`, `views`): sweeps the
//! live nodes in topological order, asks the pass's rule function for a rewrite of each,
//! redirects the node's uses to the replacement, and repeats until a sweep rewrites
//! nothing. Replaced nodes are left for DCE.

use crate::pass::{live_order, PassCx, PassError};
use ndfuse_ir::{Graph, NodeId, Op, Scalar};

/// What a rule replaces a node with. Every replacement has the node's exact dtype and
/// shape (the driver checks, since a retyped output would pass the verifier).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Rewrite {
    /// An existing node.
    Use(NodeId),
    /// A new node `op(operands)`, typed by inference.
    New(Op, Vec<NodeId>),
    /// A new constant fill of the node's dtype and shape.
    Const(Scalar),
}

/// A rule table: the rewrite of one node, if a rule matches it.
pub(crate) type Rules = fn(&Graph, NodeId) -> Option<Rewrite>;

/// Applies `rules` to `g` until a sweep changes nothing; `Ok(changed)`.
pub(crate) fn run_to_fixed_point(
    g: &mut Graph,
    cx: &PassCx,
    pass: &'static str,
    rules: Rules,
) -> Result<bool, PassError> {
    let mut changed_any = false;
    for _ in 0..cx.max_sweeps {
        let mut changed = false;
        for id in live_order(g, pass)? {
            // A node whose uses an earlier rewrite of this sweep took over is dead now;
            // rewriting it would only make garbage.
            if !g.is_output(id) && g.users(id).is_empty() {
                continue;
            }
            let Some(rw) = rules(g, id) else {
                continue;
            };
            let new = match rw {
                Rewrite::Use(n) => n,
                Rewrite::New(op, operands) => g
                    .add(op, &operands)
                    .map_err(|source| PassError::Ir { pass, source })?,
                Rewrite::Const(value) => {
                    let n = g.node(id);
                    let (dtype, shape) = (n.dtype, n.shape.clone());
                    g.add_const(value, dtype, shape)
                }
            };
            if new == id {
                continue;
            }
            let (from, to) = (g.ty(id), g.ty(new));
            if from != to {
                return Err(PassError::Retype {
                    pass,
                    op: g.node(id).op.name(),
                    from,
                    to,
                });
            }
            g.replace_all_uses(id, new);
            changed = true;
        }
        if !changed {
            return Ok(changed_any);
        }
        changed_any = true;
    }
    Err(PassError::SweepLimit {
        pass,
        sweeps: cx.max_sweeps,
    })
}

/// The value of `id` when it is a constant fill.
pub(crate) fn const_value(g: &Graph, id: NodeId) -> Option<Scalar> {
    match g.node(id).op {
        Op::Const { value } => Some(value),
        _ => None,
    }
}

/// The single operand of a unary-like node (unary, cast, view), when it is one.
pub(crate) fn sole_operand(g: &Graph, id: NodeId) -> Option<NodeId> {
    match g.operands(id).as_slice() {
        &[x] => Some(x),
        _ => None,
    }
}
