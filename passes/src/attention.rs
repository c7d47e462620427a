//! Recognises attention written with the primitives, `softmax(scale * q @ k^T + bias) @ v`
//! (the softmax as the frontend builds it: max, subtract, exp, sum, divide along the last
//! axis), and replaces it with one [`Op::Attention`] node, so the scores never reach
//! memory. Run before autodiff as well (by the frontend's `grad`), the pattern's gradient
//! is then the fused backward node.
//!
//! What it matches, on the scores `x` of `[..., Tq, Tk]`:
//! - `x = q @ permute(k)` (the permutation swapping the last two axes), optionally times
//!   or divided by a constant fill (the scale);
//! - optionally plus a float tensor (the bias), or `where(mask, x, -inf)` (the mask
//!   becomes the bias `where(mask, 0, -inf)`); a bias that is a broadcast of something
//!   constant over the leading axes is taken before the broadcast;
//! - q, k and v of one float dtype and rank, with the same leading axes (no broadcast
//!   between them: grouped heads are [`Op::Attention`]'s own business);
//! - every intermediate (scores, max, exp, sum, probabilities) used by the pattern alone:
//!   where the probabilities are used elsewhere, the `[Tq, Tk]` matrix must exist anyway.

use crate::pass::{live_order, Pass, PassCx, PassError};
use crate::rewrite::const_value;
use ndfuse_ir::{
    AttentionLayout, AttentionSpec, BinaryOp, CausalMask, Graph, NodeId, Op, ReduceOp, Scalar,
    Shape, UnaryOp, ViewOp,
};

/// Replaces `softmax(scale * q @ k^T + bias) @ v` with one attention node.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseAttention;

impl Pass for FuseAttention {
    fn name(&self) -> &'static str {
        "fuse_attention"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        let mut changed = false;
        for o in live_order(g, self.name())? {
            let Some(m) = matched(g, o) else { continue };
            let new = build(g, &m).map_err(|source| PassError::Ir {
                pass: "fuse_attention",
                source,
            })?;
            g.replace_all_uses(o, new);
            changed = true;
        }
        Ok(changed)
    }
}

/// Runs [`FuseAttention`] once over `g` (the frontend's `grad`, before autodiff);
/// `Ok(changed)`.
pub fn fuse_attention(g: &mut Graph) -> Result<bool, PassError> {
    FuseAttention.run(g, &PassCx::default())
}

/// The additive bias of a match.
enum Bias {
    /// A float tensor (maybe the source of a broadcast).
    Add(NodeId),
    /// `where(mask, 0, fill)`, the mask and the fill (`-inf`).
    Mask(NodeId, Scalar),
}

/// One matched attention.
struct Match {
    q: NodeId,
    k: NodeId,
    v: NodeId,
    scale: f64,
    bias: Option<Bias>,
    /// The result's shape `[..., Tq, Dv]`.
    out: Shape,
}

fn op(g: &Graph, n: NodeId) -> &Op {
    &g.node(n).op
}

fn operands(g: &Graph, n: NodeId) -> Vec<NodeId> {
    g.operands(n)
}

/// `n`'s users are exactly `count` nodes, none an output.
fn used(g: &Graph, n: NodeId, count: usize) -> bool {
    !g.is_output(n) && g.users(n).len() == count
}

/// A reduction of the last axis with kept dims, of the given op, and its operand.
fn last_axis_reduce(g: &Graph, n: NodeId, want: ReduceOp) -> Option<NodeId> {
    let rank = g.node(n).shape.rank();
    match op(g, n) {
        Op::Reduce { op, axes, keepdims } if *op == want && *keepdims && axes[..] == [rank - 1] => {
            Some(operands(g, n)[0])
        }
        _ => None,
    }
}

/// The operand of a broadcast view.
fn broadcast_of(g: &Graph, n: NodeId) -> Option<NodeId> {
    match op(g, n) {
        Op::View(ViewOp::BroadcastTo(_)) => Some(operands(g, n)[0]),
        _ => None,
    }
}

fn matched(g: &Graph, o: NodeId) -> Option<Match> {
    if !matches!(op(g, o), Op::MatMul) {
        return None;
    }
    let [p, v] = operands(g, o)[..] else {
        return None;
    };
    // p = e / broadcast(sum(e)), e = exp(x - broadcast(max(x))).
    let Op::Binary(BinaryOp::Div) = op(g, p) else {
        return None;
    };
    let [e, bs] = operands(g, p)[..] else {
        return None;
    };
    let sum = broadcast_of(g, bs)?;
    if last_axis_reduce(g, sum, ReduceOp::Sum)? != e {
        return None;
    }
    let Op::Unary(UnaryOp::Exp) = op(g, e) else {
        return None;
    };
    let sub = operands(g, e)[0];
    let Op::Binary(BinaryOp::Sub) = op(g, sub) else {
        return None;
    };
    let [x, bm] = operands(g, sub)[..] else {
        return None;
    };
    let mx = broadcast_of(g, bm)?;
    if last_axis_reduce(g, mx, ReduceOp::Max)? != x {
        return None;
    }
    let single = [
        (p, 1),
        (bs, 1),
        (sum, 1),
        (e, 2),
        (sub, 1),
        (bm, 1),
        (mx, 1),
        (x, 2),
    ];
    if !single.iter().all(|&(n, c)| used(g, n, c)) {
        return None;
    }
    let (scaled, bias) = split_bias(g, x)?;
    let (mm, scale) = split_scale(g, scaled)?;
    let Op::MatMul = op(g, mm) else { return None };
    let [q, kt] = operands(g, mm)[..] else {
        return None;
    };
    let Op::View(ViewOp::Permute(perm)) = op(g, kt) else {
        return None;
    };
    let r = perm.len();
    let swap = (0..r).all(|i| match i {
        _ if i + 2 == r => perm[i] == r - 1,
        _ if i + 1 == r => perm[i] == r - 2,
        _ => perm[i] == i,
    });
    let k = operands(g, kt)[0];
    let (qn, kn, vn) = (g.node(q), g.node(k), g.node(v));
    let (qd, kd, vd) = (qn.shape.dims(), kn.shape.dims(), vn.shape.dims());
    let fits = swap
        && r >= 2
        && qd.len() == r
        && kd.len() == r
        && vd.len() == r
        && qd[..r - 2] == kd[..r - 2]
        && qd[..r - 2] == vd[..r - 2]
        && kd[r - 2] == vd[r - 2]
        && qn.dtype.is_float()
        && kn.dtype == qn.dtype
        && vn.dtype == qn.dtype
        && g.node(o).dtype == qn.dtype;
    let users_ok = (scaled == x || used(g, scaled, 1)) && (mm == scaled || used(g, mm, 1));
    (fits && users_ok && used(g, kt, 1)).then(|| Match {
        q,
        k,
        v,
        scale,
        bias,
        out: g.node(o).shape.clone(),
    })
}

/// `x = s + bias`, `x = where(mask, s, -inf)` or `x = s`: `(s, bias)`.
fn split_bias(g: &Graph, x: NodeId) -> Option<(NodeId, Option<Bias>)> {
    match op(g, x) {
        Op::Binary(BinaryOp::Add) => {
            let [a, b] = operands(g, x)[..] else {
                return None;
            };
            let is_product =
                |n: NodeId| split_scale(g, n).is_some_and(|(m, _)| matches!(op(g, m), Op::MatMul));
            if is_product(a) {
                Some((a, Some(Bias::Add(b))))
            } else if is_product(b) {
                Some((b, Some(Bias::Add(a))))
            } else {
                None
            }
        }
        Op::Where => {
            let [c, s, f] = operands(g, x)[..] else {
                return None;
            };
            let fill = const_value(g, f)?;
            (fill.to_f64() == f64::NEG_INFINITY).then_some((s, Some(Bias::Mask(c, fill))))
        }
        _ => Some((x, None)),
    }
}

/// `s = m * c`, `c * m`, `m / c` (c a constant fill) or `s = m`: `(m, scale)`.
fn split_scale(g: &Graph, s: NodeId) -> Option<(NodeId, f64)> {
    let constant = |n: NodeId| const_value(g, n).map(Scalar::to_f64);
    match op(g, s) {
        Op::Binary(BinaryOp::Mul) => {
            let [a, b] = operands(g, s)[..] else {
                return None;
            };
            match (constant(a), constant(b)) {
                (_, Some(c)) => Some((a, c)),
                (Some(c), _) => Some((b, c)),
                _ => None,
            }
        }
        Op::Binary(BinaryOp::Div) => {
            let [a, b] = operands(g, s)[..] else {
                return None;
            };
            constant(b).map(|c| (a, 1.0 / c))
        }
        Op::MatMul => Some((s, 1.0)),
        _ => None,
    }
}

/// `n` as `[lead, rest, rows, cols]`: its leading axes split as the queries' are.
fn four(g: &mut Graph, n: NodeId, lead: (usize, usize)) -> Result<NodeId, ndfuse_ir::IrError> {
    let d = g.node(n).shape.dims().to_vec();
    let r = d.len();
    let shape = Shape::new([lead.0, lead.1, d[r - 2], d[r - 1]]);
    if g.node(n).shape == shape {
        return Ok(n);
    }
    g.add(Op::View(ViewOp::Reshape(shape)), &[n])
}

/// The bias as `[B|1, H|1, Tq|1, Tk|1]`: a broadcast's source when it does not vary
/// over the leading axes, else the full bias.
fn bias_operand(
    g: &mut Graph,
    b: NodeId,
    lead: (usize, usize),
    rank: usize,
) -> Result<NodeId, ndfuse_ir::IrError> {
    if let Some(src) = broadcast_of(g, b) {
        let d = g.node(src).shape.dims().to_vec();
        if d.len() <= rank && d.len() >= 2 && d[..d.len() - 2].iter().all(|&e| e == 1) {
            return four(g, src, (1, 1));
        }
    }
    four(g, b, lead)
}

fn build(g: &mut Graph, m: &Match) -> Result<NodeId, ndfuse_ir::IrError> {
    let qd = g.node(m.q).shape.dims().to_vec();
    let r = qd.len();
    // Rank 4 keeps [B, H]; other ranks become [1, prod(leading)].
    let lead = if r == 4 {
        (qd[0], qd[1])
    } else {
        (1, qd[..r - 2].iter().product())
    };
    let mut ops = vec![
        four(g, m.q, lead)?,
        four(g, m.k, lead)?,
        four(g, m.v, lead)?,
    ];
    match m.bias {
        None => {}
        Some(Bias::Add(b)) => ops.push(bias_operand(g, b, lead, r)?),
        Some(Bias::Mask(c, fill)) => {
            let c4 = bias_operand(g, c, lead, r)?;
            let (dtype, shape) = (g.node(m.q).dtype, g.node(c4).shape.clone());
            let zero = g.add_const(Scalar::F(0.0), dtype, shape.clone());
            let f = g.add_const(fill, dtype, shape);
            ops.push(g.add(Op::Where, &[c4, zero, f])?);
        }
    }
    let spec = AttentionSpec {
        layout: AttentionLayout::Bhtd,
        causal: CausalMask::None,
        scale: Scalar::F(m.scale),
        bias: m.bias.is_some(),
        key_lengths: false,
        dropout: None,
    };
    let att = g.add(Op::Attention(spec), &ops)?;
    if g.node(att).shape == m.out {
        return Ok(att);
    }
    g.add(Op::View(ViewOp::Reshape(m.out.clone())), &[att])
}
