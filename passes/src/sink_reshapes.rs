//! Reshapes of a product's value move below the element-wise ops that read them:
//! `relu(reshape(x @ w + b, [N, O, H, W]))` becomes `reshape(relu(x @ w + b), [N, O, H,
//! W])`, so the relu is computed over the product's own shape and joins its epilogue (a
//! value read through a view is stored first: fusion's rule 8). A convolution is a
//! product `[N, O, H * W]` reshaped to NCHW, so this is what makes its bias, batch norm
//! (inference: a per-channel scale and shift), activation and residual add one kernel
//! with the product.
//!
//! The op's other operands (each of its shape, as element-wise operands are) follow
//! the same reshape: a constant becomes a constant of the new shape, a broadcast of a
//! smaller value (a per-channel `[1, C, 1, 1]`) a broadcast of that value reshaped, a
//! reshape of a value of the new shape that value, and anything else a reshape view of
//! it. A broadcast that a reshape cannot carry (its axes split across a merged group:
//! `[1, 1, 1, W]` into `[.., H * W]` is fine only whole) leaves the op where it is.
//! An output moves too: a reshape of a whole buffer as an output is that buffer under
//! the output's shape, with no copy (`Placement::Alias`). Every rewrite computes the same op on the same elements in the same order, so
//! values are bit for bit unchanged.

use crate::pass::{live_order, Pass, PassCx, PassError};
use ndfuse_ir::{Graph, NodeId, Op, Shape, ViewOp};

/// Moves reshapes of products below their element-wise readers.
#[derive(Clone, Copy, Debug, Default)]
pub struct SinkReshapes;

/// How many element-wise ops a value may be above a product and still count as the
/// product's epilogue.
const EPILOGUE_DEPTH: usize = 8;

impl Pass for SinkReshapes {
    fn name(&self) -> &'static str {
        "sink_reshapes"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        let pass = self.name();
        let mut changed = false;
        // One sweep in topological order: a reshape moves below one op at a time, and
        // the new reshape is an operand of the next op down the chain.
        for id in live_order(g, pass)? {
            // A dead node (an earlier rewrite took its uses) is skipped. An output of
            // the graph moves too: the reshape then becomes the output, which the
            // schedule hands back as the op's buffer under the output's shape
            // (`Placement::Alias`), with no copy.
            if !g.is_output(id) && g.users(id).is_empty() {
                continue;
            }
            let op = g.node(id).op.clone();
            if !op.is_elementwise() || matches!(op, Op::Const { .. }) {
                continue;
            }
            let Some(plan) = plan(g, id) else {
                continue;
            };
            let err = |source| PassError::Ir { pass, source };
            let mut operands = Vec::with_capacity(plan.len());
            for o in plan {
                operands.push(match o {
                    Operand::Node(n) => n,
                    Operand::Const(value, dtype, shape) => g.add_const(value, dtype, shape),
                    Operand::Views(base, views) => {
                        let mut n = base;
                        for v in views {
                            n = g.add(Op::View(v), &[n]).map_err(err)?;
                        }
                        n
                    }
                });
            }
            let inner = g.add(op, &operands).map_err(err)?;
            let shape = g.node(id).shape.clone();
            let out = g
                .add(Op::View(ViewOp::Reshape(shape)), &[inner])
                .map_err(err)?;
            g.replace_all_uses(id, out);
            changed = true;
        }
        Ok(changed)
    }
}

/// One operand of the op over the product's shape.
enum Operand {
    /// An existing node of that shape.
    Node(NodeId),
    /// A constant fill.
    Const(ndfuse_ir::Scalar, ndfuse_ir::DType, Shape),
    /// Views applied in order to a node.
    Views(NodeId, Vec<ViewOp>),
}

/// The operands of element-wise op `id` over the shape of the product value one of its
/// operands reshapes, when every operand can follow the reshape; `None` otherwise.
fn plan(g: &Graph, id: NodeId) -> Option<Vec<Operand>> {
    let shape = &g.node(id).shape;
    let ops = g.operands(id);
    let inner = ops.iter().find_map(|&o| {
        let Op::View(ViewOp::Reshape(_)) = g.node(o).op else {
            return None;
        };
        let src = g.operands(o)[0];
        above_product(g, src, EPILOGUE_DEPTH).then(|| g.node(src).shape.clone())
    })?;
    let groups = groups(shape.dims(), inner.dims())?;
    ops.iter()
        .map(|&o| {
            let node = g.node(o);
            match &node.op {
                Op::View(ViewOp::Reshape(_)) if g.node(g.operands(o)[0]).shape == inner => {
                    Some(Operand::Node(g.operands(o)[0]))
                }
                Op::Const { value } => Some(Operand::Const(*value, node.dtype, inner.clone())),
                Op::View(ViewOp::BroadcastTo(_)) => {
                    let small = g.operands(o)[0];
                    let dims = small_dims(
                        g.node(small).shape.dims(),
                        shape.dims(),
                        inner.dims(),
                        &groups,
                    )?;
                    let mut views = Vec::new();
                    if dims != g.node(small).shape.dims() {
                        views.push(ViewOp::Reshape(Shape::new(dims)));
                    }
                    views.push(ViewOp::BroadcastTo(inner.clone()));
                    Some(Operand::Views(small, views))
                }
                _ => Some(Operand::Views(o, vec![ViewOp::Reshape(inner.clone())])),
            }
        })
        .collect()
}

/// Whether `n` is a matrix product, or an element-wise op (at most `depth` deep) over
/// one: a value the product's epilogue computes.
fn above_product(g: &Graph, n: NodeId, depth: usize) -> bool {
    let op = &g.node(n).op;
    if op.is_contraction() {
        return true;
    }
    depth > 0
        && op.is_elementwise()
        && g.operands(n)
            .iter()
            .any(|&o| above_product(g, o, depth - 1))
}

/// The axes of `outer` and `inner` (row-major reshapes of each other) in matching
/// groups: `(outer range, inner range)` with equal products, each group as small as the
/// two shapes allow. `None` for shapes that do not reshape into each other.
type Groups = Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>;

fn groups(outer: &[usize], inner: &[usize]) -> Option<Groups> {
    let (n, m) = (outer.len(), inner.len());
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        let (i0, j0) = (i, j);
        let (mut a, mut b) = (1usize, 1usize);
        if i < n {
            a *= outer[i];
            i += 1;
        }
        if j < m {
            b *= inner[j];
            j += 1;
        }
        while a != b {
            if a < b && i < n {
                a *= outer[i];
                i += 1;
            } else if b < a && j < m {
                b *= inner[j];
                j += 1;
            } else {
                return None;
            }
        }
        out.push((i0..i, j0..j));
    }
    Some(out)
}

/// The dims of a value broadcast to `outer` (`small`, aligned to its trailing axes)
/// after the reshape to `inner`: per group, ones where `small` is 1 on all of the
/// group's axes, the group's inner dims where it is whole on all of them; `None` when
/// a group mixes the two.
fn small_dims(
    small: &[usize],
    outer: &[usize],
    inner: &[usize],
    groups: &Groups,
) -> Option<Vec<usize>> {
    let pad = outer.len().checked_sub(small.len())?;
    let at = |a: usize| if a < pad { 1 } else { small[a - pad] };
    let mut dims = Vec::new();
    for (o, i) in groups {
        if o.clone().all(|a| at(a) == 1) {
            dims.extend(std::iter::repeat_n(1, i.len()));
        } else if o.clone().all(|a| at(a) == outer[a]) {
            dims.extend_from_slice(&inner[i.clone()]);
        } else {
            return None;
        }
    }
    Some(dims)
}
