//! The reverse sweep: seeds the loss with 1, walks the graph in reverse topological
//! order applying each node's rule (`rules::vjp`), and sums the contributions of a
//! node's several users.

use crate::emit::Emit;
use crate::error::AutodiffError;
use crate::rules::vjp;
use ndfuse_ir::{Graph, HostArray, NodeId, Op, Scalar, Shape};
use std::collections::HashMap;

/// A graph with gradient nodes added, as [`grad`] returns it.
#[derive(Debug)]
pub struct Backward {
    /// The original graph with the gradient nodes added; its outputs are the
    /// original's followed by one per `wrt`, in order.
    pub graph: Graph,
    /// The gradient of the loss with respect to each `wrt`, in order: a node of
    /// `graph` with the `wrt`'s dtype and shape.
    pub grads: Vec<NodeId>,
    /// Input nodes the gradient graph added, with the data to bind to them: the 0/1
    /// selection matrices that scatter a slice's gradient back (the IR has no pad).
    pub constants: Vec<(NodeId, HostArray)>,
}

/// Reverse-mode gradients of `loss` (a 0-d float node of `graph`) with respect to
/// each of `wrt` (float nodes of `graph`), as new nodes of the same IR in a copy of
/// the graph, so the backward pass is compiled and fused like any graph.
///
/// A `wrt` the loss does not depend on (or depends on only through comparisons,
/// arg-reductions, casts to non-float types or piecewise-constant ops) gets a zero
/// constant of its dtype and shape.
///
/// ```
/// use ndfuse_ir::{DType, Graph, Op, ReduceOp, Shape, UnaryOp};
/// let mut g = Graph::new();
/// let x = g.add_input("x", DType::F64, Shape::new([3]));
/// let y = g.add(Op::Unary(UnaryOp::Square), &[x])?;
/// let l = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdims: false }, &[y])?;
/// let b = ndfuse_autodiff::grad(&g, l, &[x])?;
/// assert_eq!(b.graph.node(b.grads[0]).shape, Shape::new([3]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn grad(graph: &Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Backward, AutodiffError> {
    for &n in std::iter::once(&loss).chain(wrt) {
        if !graph.contains(n) {
            return Err(AutodiffError::UnknownNode { node: n });
        }
    }
    let lt = graph.ty(loss);
    if lt.shape.rank() != 0 || !lt.dtype.is_float() {
        return Err(AutodiffError::LossNotScalar { ty: lt });
    }
    if let Some(&w) = wrt.iter().find(|&&w| !graph.node(w).dtype.is_float()) {
        return Err(AutodiffError::NotFloat {
            node: w,
            ty: graph.ty(w),
        });
    }
    let order = graph
        .topo_order()
        .map_err(|node| AutodiffError::Cycle { node })?;
    // A node needs a gradient when it is a float value that depends on some `wrt`.
    let mut needs: HashMap<NodeId, bool> = HashMap::new();
    for &n in &order {
        let float = graph.node(n).dtype.is_float();
        let from = wrt.contains(&n) || graph.operands(n).iter().any(|o| needs[o]);
        needs.insert(n, float && from);
    }
    let mut e = Emit {
        g: &mut graph.clone(),
        rule: "seed",
        constants: Vec::new(),
    };
    let mut grads: HashMap<NodeId, NodeId> = HashMap::new();
    if needs[&loss] {
        let seed = e.g.add_const(Scalar::F(1.0), lt.dtype, Shape::scalar());
        grads.insert(loss, seed);
    }
    for &n in order.iter().rev() {
        let Some(&g) = grads.get(&n) else { continue };
        let operands = graph.operands(n);
        if !operands.iter().any(|o| needs[o]) {
            continue;
        }
        let op = graph.node(n).op.clone();
        if let Op::Attention(spec) = &op {
            if spec.bias && needs[&operands[spec.layout.tensors()]] {
                return Err(AutodiffError::NoRule {
                    op: "the bias of fused attention (build it with Attention::unfused() to learn a bias)",
                });
            }
        }
        e.rule = op.name();
        let gs = vjp(&mut e, &op, &operands, n, g)?;
        for (o, go) in operands.iter().zip(gs) {
            let Some(go) = go else { continue };
            if !needs[o] {
                continue;
            }
            let sum = match grads.get(o) {
                Some(&prev) => e.add(prev, go)?,
                None => go,
            };
            grads.insert(*o, sum);
        }
    }
    let ids: Vec<NodeId> = wrt
        .iter()
        .map(|w| match grads.get(w) {
            Some(&g) => g,
            None => {
                let t = graph.ty(*w);
                e.g.add_const(Scalar::F(0.0), t.dtype, t.shape)
            }
        })
        .collect();
    for &g in &ids {
        e.g.add_output(g);
    }
    let constants = std::mem::take(&mut e.constants);
    let graph = std::mem::take(e.g);
    Ok(Backward {
        graph,
        grads: ids,
        constants,
    })
}
