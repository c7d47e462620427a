//! The vector-Jacobian rules of the LAPACK level ([`Op::Linalg`]), batched: every
//! matrix is in the last two axes, the leading ones are batch axes (`@` is the batched
//! [`Op::MatMul`], `^T` swaps the last two axes). `Xbar` is the gradient of the loss
//! with respect to `X`; a packed result's gradient is sliced into its parts the way
//! the result is ([`LinalgOp::parts`]). The sign conventions (`R`'s diagonal, `V`'s
//! and `U`'s columns) are piecewise constant, so they do not change the formulas:
//! they hold wherever the sign choice is locally constant (a column's entry of largest
//! magnitude is unique).
//!
//! - `cholesky` (Murray 2016, as JAX): `P = Φ(L^T Lbar)` (`Φ` keeps the lower triangle
//!   and halves the diagonal), `S = L^-T P L^-1` (two triangular solves); `S` is the
//!   gradient with respect to the symmetric matrix the factor sees. The forward reads
//!   only `a`'s lower triangle (`a_ij` for `i > j` stands for both `a_ij` and `a_ji`),
//!   so `abar = fold(S)`: `S + S^T` strictly below the diagonal, `S`'s diagonal on it,
//!   0 above (the upper triangle is never read).
//! - `solve` (`x = a^-1 b`): `bbar = solve(a^T, xbar)`, `abar = -bbar x^T`.
//! - `triangular_solve`: the same with the triangle `t` (`tbar = -bbar x^T` on the
//!   left, `bbar = xbar t^-T`, `tbar = -x^T bbar` on the right; `t^T` is the other
//!   triangle of `a^T`), `abar` = `tbar` on the triangle read (its strict part when
//!   `unit_diagonal`), 0 elsewhere.
//! - `det`: `abar = g det(a) a^-T`, as `solve(a^T, g det(a) I)`; `slogdet`: only
//!   `log|det|` has a gradient (the sign is piecewise constant):
//!   `abar = g_logabsdet a^-T`. A singular `a` has no inverse: its solve fails to
//!   evaluate (as the forward `solve` would).
//! - `qr` (reduced, `m >= n`; Liao et al. 2019, JAX's `qr_jvp` transposed):
//!   `M = R Rbar^T - Qbar^T Q`, `abar = (Qbar + Q copyltu(M)) R^-T` with
//!   `copyltu(M) = tril(M) + tril(M, -1)^T`, `R^-T` applied by a triangular solve from
//!   the right. `m < n`, and the complete mode with `m > n`, have no rule (as JAX);
//!   the complete mode of a square matrix is the reduced one.
//! - `eigh` (`a = V diag(w) V^T`): `G = V (diag(wbar) + F ∘ (V^T Vbar)) V^T` with
//!   `F_ij = 1 / (w_j - w_i)` off the diagonal, 0 on it; the forward reads one triangle,
//!   so `abar = fold(G)` onto the triangle read (the upper one when `upper`).
//!   `eigvalsh`: `G = V diag(wbar) V^T` with `V` from an `eigh` node the rule adds.
//! - `svd` (reduced; Townsend 2016, "Differentiating the singular value decomposition"):
//!   with `U [m, k]`, `S [k]`, `V = Vh^T`, `Vbar = Vhbar^T`,
//!   `F_ij = 1 / (s_j^2 - s_i^2)` off the diagonal (0 on it), `J = F ∘ (U^T Ubar)`,
//!   `K = F ∘ (V^T Vbar)`:
//!   `abar = U [(J + J^T) S + diag(Sbar) + S (K + K^T)] V^T
//!   + (I_m - U U^T) Ubar S^-1 V^T + U S^-1 Vbar^T (I_n - V V^T)`.
//!   The full mode of a non-square matrix has no rule (as JAX); that of a square one
//!   is the reduced one. `svdvals`: `abar = U diag(Sbar) Vh` with an `svd` node added.
//! - `lu` has no rule: its pivots are piecewise constant and its factors are rarely
//!   what a loss needs; differentiate through `solve`, `det` or `slogdet`.
//!
//! **Repeated eigen- and singular values.** `eigh`'s and `svd`'s gradients are
//! undefined where two eigenvalues (singular values) are equal, and `svd`'s where a
//! singular value is zero. The code divides by the gaps (and by `s`) regardless, as
//! JAX does: such a matrix gets inf or NaN entries, NaN even when the loss reads only
//! the values (`F_ij = inf` times a zero `(V^T Vbar)_ij`). `eigvalsh` and `svdvals`
//! never build `F`, so their gradient stays finite there; it is the true derivative
//! when the loss weighs the repeated values alike (e.g. their sum, a trace, a norm),
//! and otherwise depends on the basis of the eigenspace the forward returns.

use crate::emit::{Built, Emit};
use crate::error::AutodiffError;
use ndfuse_ir::{BinaryOp, LinalgOp, NodeId, Op, Shape, UnaryOp, ViewOp};

type Grads = Result<Vec<Option<NodeId>>, AutodiffError>;

/// The gradients of `y = op(x...)`'s operands given `g`, the gradient of `y`.
pub(crate) fn vjp(
    e: &mut Emit,
    op: LinalgOp,
    x: &[NodeId],
    y: NodeId,
    g: NodeId,
) -> Result<Vec<Option<NodeId>>, AutodiffError> {
    let a = x[0];
    let dims = e.shape(a).dims().to_vec();
    let rank = dims.len();
    let (m, n) = (dims[rank - 2], dims[rank - 1]);
    let batch = dims[..rank - 2].to_vec();
    let one = |n: NodeId| -> Grads { Ok(vec![Some(n)]) };
    match op {
        LinalgOp::Cholesky => one(cholesky(e, y, g)?),
        LinalgOp::Solve => solve(e, a, y, g),
        LinalgOp::TriangularSolve {
            lower,
            left,
            unit_diagonal,
        } => triangular_solve(e, a, y, g, lower, left, unit_diagonal),
        LinalgOp::Lu => Err(AutodiffError::NoRule {
            op: "lu (its factors are not differentiated: differentiate through solve, det or slogdet instead)",
        }),
        // y = a^-1: abar = -y^T g y^T
        LinalgOp::Inv => {
            let yt = e.matrix_transpose(y)?;
            let p = e.op(Op::MatMul, &[yt, g])?;
            let p = e.op(Op::MatMul, &[p, yt])?;
            one(e.unary(ndfuse_ir::UnaryOp::Neg, p)?)
        }
        // abar = g det a^-T
        LinalgOp::Det => {
            let c = e.mul(g, y)?;
            one(inverse_transpose_times(e, a, c)?)
        }
        // abar = g_logabsdet a^-T; the sign has no gradient
        LinalgOp::Slogdet => {
            let gl = e.slice_axis(g, batch.len(), 1, 1)?;
            let gl = e.reshape(gl, &Shape::new(batch.clone()))?;
            one(inverse_transpose_times(e, a, gl)?)
        }
        LinalgOp::Qr { complete } => {
            if m < n {
                return Err(AutodiffError::NoRule {
                    op: "qr of a wide matrix (m < n; only m >= n is differentiated)",
                });
            }
            if complete && m != n {
                return Err(AutodiffError::NoRule {
                    op: "qr in complete mode of a non-square matrix (use the reduced mode)",
                });
            }
            let ys = unpack(e, y, &batch, &op.parts(m, n))?;
            let gs = unpack(e, g, &batch, &op.parts(m, n))?;
            one(qr(e, ys[0], ys[1], gs[0], gs[1])?)
        }
        LinalgOp::Svd { full } => {
            if full && m != n {
                return Err(AutodiffError::NoRule {
                    op: "svd with full_matrices of a non-square matrix (use the reduced mode)",
                });
            }
            let ys = unpack(e, y, &batch, &op.parts(m, n))?;
            let gs = unpack(e, g, &batch, &op.parts(m, n))?;
            one(svd(e, [ys[0], ys[1], ys[2]], [gs[0], gs[1], gs[2]])?)
        }
        // abar = U diag(Sbar) Vh
        LinalgOp::Svdvals => {
            let f = LinalgOp::Svd { full: false };
            let usv = e.op(Op::Linalg(f), &[a])?;
            let ys = unpack(e, usv, &batch, &f.parts(m, n))?;
            let us = scale_cols(e, ys[0], g)?;
            one(e.op(Op::MatMul, &[us, ys[2]])?)
        }
        LinalgOp::Eigh { upper } => {
            let ys = unpack(e, y, &batch, &op.parts(m, n))?;
            let gs = unpack(e, g, &batch, &op.parts(m, n))?;
            one(eigh(e, ys[0], ys[1], gs[0], gs[1], upper)?)
        }
        // abar = fold(V diag(wbar) V^T)
        LinalgOp::Eigvalsh { upper } => {
            let f = LinalgOp::Eigh { upper };
            let wv = e.op(Op::Linalg(f), &[a])?;
            let ys = unpack(e, wv, &batch, &f.parts(m, n))?;
            let v = ys[1];
            let vw = scale_cols(e, v, g)?;
            let vt = e.matrix_transpose(v)?;
            let gm = e.op(Op::MatMul, &[vw, vt])?;
            one(fold(e, gm, upper)?)
        }
    }
}

/// `S = L^-T Φ(L^T Lbar) L^-1`, folded onto the lower triangle the forward reads.
fn cholesky(e: &mut Emit, l: NodeId, lb: NodeId) -> Built {
    let lt = e.matrix_transpose(l)?;
    let p = e.op(Op::MatMul, &[lt, lb])?;
    // Φ: the strict lower triangle, half the diagonal, 0 above.
    let shape = e.shape(p);
    let below = tri(e, &shape, BinaryOp::Gt)?;
    let on = tri(e, &shape, BinaryOp::Eq)?;
    let half = e.scale(p, 0.5)?;
    let half = e.keep(on, half)?;
    let p = e.select(below, p, half)?;
    // L^T X = P, then S L = X.
    let x = tsolve(e, lt, p, false, true, false)?;
    let s = tsolve(e, l, x, true, false, false)?;
    fold(e, s, false)
}

/// `x = a^-1 b`: `bbar = solve(a^T, xbar)`, `abar = -bbar x^T`.
fn solve(e: &mut Emit, a: NodeId, x: NodeId, xb: NodeId) -> Grads {
    let at = e.matrix_transpose(a)?;
    let bb = e.op(Op::Linalg(LinalgOp::Solve), &[at, xb])?;
    let xt = e.matrix_transpose(x)?;
    let p = e.op(Op::MatMul, &[bb, xt])?;
    let ab = e.unary(UnaryOp::Neg, p)?;
    Ok(vec![Some(ab), Some(bb)])
}

/// `t x = b` (`left`) or `x t = b`, `t` the triangle of `a` read: `bbar = t^-T xbar`
/// and `tbar = -bbar x^T` (left), or `bbar = xbar t^-T` and `tbar = -x^T bbar`;
/// `abar` is `tbar` on the entries the forward reads.
fn triangular_solve(
    e: &mut Emit,
    a: NodeId,
    x: NodeId,
    xb: NodeId,
    lower: bool,
    left: bool,
    unit: bool,
) -> Grads {
    // t^T is the other triangle of a^T (the unit diagonal stays unread).
    let at = e.matrix_transpose(a)?;
    let bb = tsolve(e, at, xb, !lower, left, unit)?;
    let tb = if left {
        let xt = e.matrix_transpose(x)?;
        e.op(Op::MatMul, &[bb, xt])?
    } else {
        let xt = e.matrix_transpose(x)?;
        e.op(Op::MatMul, &[xt, bb])?
    };
    let tb = e.unary(UnaryOp::Neg, tb)?;
    let shape = e.shape(tb);
    let cmp = match (lower, unit) {
        (true, false) => BinaryOp::Ge,
        (true, true) => BinaryOp::Gt,
        (false, false) => BinaryOp::Le,
        (false, true) => BinaryOp::Lt,
    };
    let read = tri(e, &shape, cmp)?;
    Ok(vec![Some(e.keep(read, tb)?), Some(bb)])
}

/// `c a^-T` for a batch of scalars `c` (shape: `a`'s batch axes), as
/// `solve(a^T, c I)`.
fn inverse_transpose_times(e: &mut Emit, a: NodeId, c: NodeId) -> Built {
    let shape = e.shape(a);
    let rank = shape.rank();
    let mut kept = shape.dims().to_vec();
    kept[rank - 2] = 1;
    kept[rank - 1] = 1;
    let c = e.reshape(c, &Shape::new(kept))?;
    let c = e.view(ViewOp::BroadcastTo(shape.clone()), c)?;
    let i = eye(e, &shape, e.dtype(a))?;
    let ci = e.mul(c, i)?;
    let at = e.matrix_transpose(a)?;
    e.op(Op::Linalg(LinalgOp::Solve), &[at, ci])
}

/// `abar = (Qbar + Q copyltu(R Rbar^T - Qbar^T Q)) R^-T` (`m >= n`).
fn qr(e: &mut Emit, q: NodeId, r: NodeId, qb: NodeId, rb: NodeId) -> Built {
    let rbt = e.matrix_transpose(rb)?;
    let rr = e.op(Op::MatMul, &[r, rbt])?;
    let qbt = e.matrix_transpose(qb)?;
    let qq = e.op(Op::MatMul, &[qbt, q])?;
    let mm = e.sub(rr, qq)?;
    // copyltu: the lower triangle (with the diagonal) mirrored above it.
    let mt = e.matrix_transpose(mm)?;
    let shape = e.shape(mm);
    let lower = tri(e, &shape, BinaryOp::Ge)?;
    let c = e.select(lower, mm, mt)?;
    let qc = e.op(Op::MatMul, &[q, c])?;
    let y = e.add(qb, qc)?;
    // Z R^T = Y, R^T lower triangular.
    let rt = e.matrix_transpose(r)?;
    tsolve(e, rt, y, true, false, false)
}

/// `fold(V (diag(wbar) + F ∘ (V^T Vbar)) V^T)`, `F_ij = 1 / (w_j - w_i)` off the
/// diagonal.
fn eigh(e: &mut Emit, w: NodeId, v: NodeId, wb: NodeId, vb: NodeId, upper: bool) -> Built {
    let f = inverse_gaps(e, w)?;
    let vt = e.matrix_transpose(v)?;
    let vtvb = e.op(Op::MatMul, &[vt, vb])?;
    let inner = e.mul(f, vtvb)?;
    let d = diag_embed(e, wb)?;
    let inner = e.add(inner, d)?;
    let vi = e.op(Op::MatMul, &[v, inner])?;
    let gm = e.op(Op::MatMul, &[vi, vt])?;
    fold(e, gm, upper)
}

/// Townsend's reverse formula for the reduced `a = U diag(S) Vh` (module docs).
fn svd(e: &mut Emit, [u, s, vh]: [NodeId; 3], [ub, sb, vhb]: [NodeId; 3]) -> Built {
    let sq = e.mul(s, s)?;
    let f = inverse_gaps(e, sq)?;
    let ut = e.matrix_transpose(u)?;
    let utub = e.op(Op::MatMul, &[ut, ub])?;
    // V^T Vbar = Vh Vhbar^T.
    let vhbt = e.matrix_transpose(vhb)?;
    let vtvb = e.op(Op::MatMul, &[vh, vhbt])?;
    let j = e.mul(f, utub)?;
    let jt = e.matrix_transpose(j)?;
    let j = e.add(j, jt)?;
    let k = e.mul(f, vtvb)?;
    let kt = e.matrix_transpose(k)?;
    let k = e.add(k, kt)?;
    let js = scale_cols(e, j, s)?;
    let sk = scale_rows(e, k, s)?;
    let d = diag_embed(e, sb)?;
    let inner = e.add(js, d)?;
    let inner = e.add(inner, sk)?;
    let ui = e.op(Op::MatMul, &[u, inner])?;
    let core = e.op(Op::MatMul, &[ui, vh])?;
    let inv_s = e.unary(UnaryOp::Recip, s)?;
    // (I - U U^T) Ubar S^-1 Vh
    let uutub = e.op(Op::MatMul, &[u, utub])?;
    let pu = e.sub(ub, uutub)?;
    let pu = scale_cols(e, pu, inv_s)?;
    let left = e.op(Op::MatMul, &[pu, vh])?;
    // U S^-1 Vbar^T (I - V V^T) = U S^-1 (Vhbar - Vhbar Vh^T Vh)
    let vt = e.matrix_transpose(vh)?;
    let vhbv = e.op(Op::MatMul, &[vhb, vt])?;
    let vhbvvh = e.op(Op::MatMul, &[vhbv, vh])?;
    let pv = e.sub(vhb, vhbvvh)?;
    let pv = scale_rows(e, pv, inv_s)?;
    let right = e.op(Op::MatMul, &[u, pv])?;
    let r = e.add(core, left)?;
    e.add(r, right)
}

// ---------------------------------------------------------------------------------------
// Matrix helpers over the last two axes.
// ---------------------------------------------------------------------------------------

/// The bool mask `row cmp col` over the last two axes of `shape` (`Ge`: the lower
/// triangle, `Gt`: its strict part, `Eq`: the diagonal...).
fn tri(e: &mut Emit, shape: &Shape, cmp: BinaryOp) -> Built {
    let r = shape.rank();
    let row = e.positions(shape, r - 2, 0)?;
    let col = e.positions(shape, r - 1, 0)?;
    e.binary(cmp, row, col)
}

/// The identity matrices of `shape` (`[..., n, n]`) in `dt`.
fn eye(e: &mut Emit, shape: &Shape, dt: ndfuse_ir::DType) -> Built {
    let on = tri(e, shape, BinaryOp::Eq)?;
    e.cast(on, dt)
}

/// `v [..., k]` laid along the last axis of a `[..., r, k]` shape `to` (`along_cols`:
/// `v_j` in column `j`) or along the one before (`[..., k, c]`: `v_i` in row `i`),
/// broadcast to `to`.
fn spread_vec(e: &mut Emit, v: NodeId, to: &Shape, along_cols: bool) -> Built {
    let mut kept = e.shape(v).dims().to_vec();
    let k = kept.pop().expect("a vector axis");
    kept.extend(if along_cols { [1, k] } else { [k, 1] });
    let v = e.reshape(v, &Shape::new(kept))?;
    if &e.shape(v) == to {
        return Ok(v);
    }
    e.view(ViewOp::BroadcastTo(to.clone()), v)
}

/// `x diag(v)`: column `j` of `x [..., r, k]` times `v [..., k]`'s `j`.
fn scale_cols(e: &mut Emit, x: NodeId, v: NodeId) -> Built {
    let shape = e.shape(x);
    let v = spread_vec(e, v, &shape, true)?;
    e.mul(x, v)
}

/// `diag(v) x`: row `i` of `x [..., k, c]` times `v [..., k]`'s `i`.
fn scale_rows(e: &mut Emit, x: NodeId, v: NodeId) -> Built {
    let shape = e.shape(x);
    let v = spread_vec(e, v, &shape, false)?;
    e.mul(x, v)
}

/// `diag(v)` for `v [..., k]`: `[..., k, k]`.
fn diag_embed(e: &mut Emit, v: NodeId) -> Built {
    let mut dims = e.shape(v).dims().to_vec();
    let k = *dims.last().expect("a vector axis");
    dims.push(k);
    let shape = Shape::new(dims);
    let cols = spread_vec(e, v, &shape, true)?;
    let on = tri(e, &shape, BinaryOp::Eq)?;
    e.keep(on, cols)
}

/// `F_ij = 1 / (w_j - w_i)` for `i != j`, 0 on the diagonal (`w [..., k]`; inf where
/// two values are equal).
fn inverse_gaps(e: &mut Emit, w: NodeId) -> Built {
    let mut dims = e.shape(w).dims().to_vec();
    let k = *dims.last().expect("a vector axis");
    dims.push(k);
    let shape = Shape::new(dims);
    let wj = spread_vec(e, w, &shape, true)?;
    let wi = spread_vec(e, w, &shape, false)?;
    let gap = e.sub(wj, wi)?;
    let on = tri(e, &shape, BinaryOp::Eq)?;
    let ones = e.full_like(gap, 1.0);
    let gap = e.select(on, ones, gap)?;
    let f = e.unary(UnaryOp::Recip, gap)?;
    let z = e.full_like(f, 0.0);
    e.select(on, z, f)
}

/// The gradient `gm` with respect to a symmetric matrix, as the gradient with respect
/// to the matrix whose one triangle (the lower, or the upper when `upper`) stands for
/// it: `gm + gm^T` strictly inside that triangle, `gm`'s diagonal, 0 in the other.
fn fold(e: &mut Emit, gm: NodeId, upper: bool) -> Built {
    let gt = e.matrix_transpose(gm)?;
    let sum = e.add(gm, gt)?;
    let shape = e.shape(gm);
    let inside = tri(e, &shape, if upper { BinaryOp::Lt } else { BinaryOp::Gt })?;
    let on = tri(e, &shape, BinaryOp::Eq)?;
    let d = e.keep(on, gm)?;
    e.select(inside, sum, d)
}

/// A triangular solve with `a`'s `lower` (else upper) triangle: `t x = b` (`left`) or
/// `x t = b`.
fn tsolve(e: &mut Emit, a: NodeId, b: NodeId, lower: bool, left: bool, unit: bool) -> Built {
    e.op(
        Op::Linalg(LinalgOp::TriangularSolve {
            lower,
            left,
            unit_diagonal: unit,
        }),
        &[a, b],
    )
}

/// The parts of a packed `p` (`batch + [len]`), each reshaped to `batch + part`.
fn unpack(
    e: &mut Emit,
    p: NodeId,
    batch: &[usize],
    parts: &[Vec<usize>],
) -> Result<Vec<NodeId>, AutodiffError> {
    let axis = batch.len();
    let mut start = 0;
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let len: usize = part.iter().product();
        let s = e.slice_axis(p, axis, start, len)?;
        start += len;
        let mut dims = batch.to_vec();
        dims.extend(part);
        out.push(e.reshape(s, &Shape::new(dims))?);
    }
    Ok(out)
}
