//! `grad`: reverse-mode gradients of a scalar tensor as new lazy tensors. The loss's
//! expression is lowered to an IR graph, `ndfuse-autodiff` adds the gradient nodes,
//! and those nodes come back as tensors over the caller's own tensors, so evaluating
//! a loss and its gradients together is one graph that fuses forward and backward.

use crate::error::{Error, Result};
use crate::graph_cache::lower_tensors;
use crate::tensor::Tensor;
use ndfuse_ir::{Graph, HostArray, NodeId, Op};
use std::collections::HashMap;
use std::panic::Location;

/// The gradients of `loss`, a 0-d float tensor, with respect to each of `wrt`, as lazy
/// tensors (nothing is evaluated) of the `wrt`'s dtypes and shapes.
///
/// A `wrt` the loss does not depend on gets zeros. Rules at non-smooth points
/// (`abs`, `relu`, ties of `maximum` and `max`, which split evenly) and the ops through
/// which no gradient flows (comparisons, `argmax`, `floor`, `round`, `sign`, casts to
/// integers) are listed in `ndfuse-autodiff`'s rule table.
///
/// ```
/// use ndfuse::Context;
/// let ctx = Context::new();
/// let w = ctx.from_vec(vec![1.0f64, 2.0, 3.0], &[3])?;
/// let loss = (&w * &w).sum(..);
/// let g = ndfuse::grad(&loss, &[&w])?;
/// assert_eq!(g[0].eval()?.to_vec::<f64>()?, vec![2.0, 4.0, 6.0]);
/// # Ok::<(), ndfuse::Error>(())
/// ```
///
/// # Errors
/// `Error::Argument` naming the loss's type when it is not a 0-d float, or a `wrt`'s
/// when it is not a float; the error a poisoned tensor carries.
#[track_caller]
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    let at = Location::caller();
    let mut outputs = vec![loss];
    outputs.extend_from_slice(wrt);
    let (mut graph, tensors) = lower(&outputs)?;
    // Attention written with the primitives becomes the fused node first, so its
    // gradient is the fused backward node rather than the primitives' (which would keep
    // the [Tq, Tk] probabilities for the backward pass).
    ndfuse_passes::fuse_attention(&mut graph).map_err(|e| Error::Argument {
        what: "grad",
        why: e.to_string(),
        at,
    })?;
    let ids = graph.outputs();
    let b = ndfuse_autodiff::grad(&graph, ids[0], &ids[1..]).map_err(|e| Error::Argument {
        what: "grad",
        // The autodiff message starts with "grad: " too; say it once.
        why: e.to_string().trim_start_matches("grad: ").to_string(),
        at,
    })?;
    let mut made: HashMap<NodeId, Tensor> = tensors.into_iter().collect();
    let constants: HashMap<NodeId, HostArray> = b.constants.into_iter().collect();
    let order = b.graph.topo_order().map_err(|_| Error::Argument {
        what: "grad",
        why: "the gradient graph has a cycle (a bug in autodiff)".into(),
        at,
    })?;
    let needed = ancestors(&b.graph, &b.grads);
    let ctx = &loss.ctx;
    for n in order {
        if made.contains_key(&n) || !needed.contains(&n) {
            continue;
        }
        let node = b.graph.node(n);
        let t = match (&node.op, constants.get(&n)) {
            (Op::Input { .. }, Some(data)) => Tensor::leaf(ctx, data.clone()),
            (Op::Const { value }, _) => {
                Tensor::constant(ctx, *value, node.dtype, node.shape.clone())
            }
            (op, _) => {
                let src: Vec<Tensor> = b
                    .graph
                    .operands(n)
                    .iter()
                    .map(|o| made[o].clone())
                    .collect();
                let src: Vec<&Tensor> = src.iter().collect();
                // In `ctx`: a rule may emit an op without operands (an iota).
                Tensor::build_in(ctx, op.clone(), &src, at)
            }
        };
        made.insert(n, t);
    }
    Ok(b.grads.iter().map(|g| made[g].clone()).collect())
}

/// Every node `roots` depend on, themselves included.
fn ancestors(g: &Graph, roots: &[NodeId]) -> std::collections::HashSet<NodeId> {
    let mut seen = std::collections::HashSet::new();
    let mut stack = roots.to_vec();
    while let Some(n) = stack.pop() {
        if seen.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    seen
}

/// The IR graph of `outputs` (as `graph_cache::build_graph` lowers it) and the tensor
/// behind each of its nodes, so the gradient nodes can point at the caller's tensors.
fn lower(outputs: &[&Tensor]) -> Result<(Graph, Vec<(NodeId, Tensor)>)> {
    let mut tensors = Vec::new();
    let g = lower_tensors(outputs, |id, t, _| tensors.push((id, t.clone())))?;
    Ok((g, tensors))
}
