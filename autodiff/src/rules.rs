//! The vector-Jacobian rules, one per op, kept together as one table: given a node
//! `y = op(x...)` and the gradient `g` of the loss with respect to `y`, the gradient
//! with respect to each operand (`None`: no gradient flows into that operand).
//!
//! Conventions, the documented choices at non-smooth points:
//! - `abs'(0) = 0` (`sign(0)`), `relu'(0) = 0`.
//! - `maximum`/`minimum` and the `reduce_max`/`reduce_min` reductions split the gradient
//!   evenly between tied operands (or tied positions), as tinygrad and JAX do.
//! - `sign`, `floor`, `ceil`, `round` have zero derivative; comparisons, logical ops,
//!   arg-reductions and casts to non-float types give bool or integer values, through
//!   which no gradient flows (the operands get none from them).
//! - `pow(a, b)`: `d/da` is 0 where `b == 0`; `d/db = y log a` is 0 where `a == 0`
//!   (NaN where `a < 0`, as the real function has no derivative there).
//! - `norm2`, `std` at a zero result give 0 (a subgradient), not NaN.
//! - Indices (`gather`, `scatter_add`'s `idx`), positions (`iota`) and orders
//!   (`argsort`) are integers: no gradient. A position read (or written) several times
//!   gets the sum of the gradients of its reads; the same for a source that `pad`'s
//!   edge and reflect modes repeat.
//!
//! `cumprod` without dividing by zero. For `y = cumprod(x)` along a row,
//! `dx_i = sum_{j>=i} g_j prod_{k<=j, k!=i} x_k`. Let `z` be the row's first zero (in
//! scan order; past the end when there is none) and `w = cumprod(x with x_z := 1)`, so
//! `w_j = prod_{k<=j, k!=z} x_k` for every `j` (and `w_j = y_j` for `j < z`). Every
//! term with `j >= z` and `i != z` has the factor `x_z = 0`, so
//! - `i < z`: `dx_i = (sum_{i<=j<z} g_j w_j) / x_i`, dividing only by a nonzero `x_i`;
//! - `i = z`: `dx_z = sum_{j>=z} g_j w_j` (no division; later zeros sit inside `w`);
//! - `i > z`: `dx_i = 0` (each of its products keeps the factor `x_z`).
//!
//! Both sums are reversed cumsums of `g w` masked to one side of `z`; `z` is where the
//! running count of zeros first reaches 1. This is torch's `cumprod_backward` as a
//! handful of scans and selects (O(n) work and memory); a row with two or more zeros
//! is exact too. Its one approximation is the division for `i < z`: `w_j / x_i` stands
//! for `prod_{k<=j, k!=i} x_k`, equal up to rounding unless `w_j` under- or
//! overflows where the product without `x_i` would not (as in torch).

use crate::emit::Emit;
use crate::error::AutodiffError;
use ndfuse_ir::{
    AxisSlice, BinaryOp, HostArray, NodeId, Op, PadMode, ReduceOp, Scalar, ScanOp, Shape, UnaryOp,
    ViewOp,
};

type Grads = Result<Vec<Option<NodeId>>, AutodiffError>;

/// The gradients of `y = op(x...)`'s operands given `g`, the gradient of `y`.
pub(crate) fn vjp(e: &mut Emit, op: &Op, x: &[NodeId], y: NodeId, g: NodeId) -> Grads {
    let one = |n: NodeId| Ok(vec![Some(n)]);
    match op {
        // leaves have no operands
        Op::Input { .. } | Op::Const { .. } => Ok(vec![]),
        Op::Unary(u) => unary(e, *u, x[0], y, g),
        Op::Binary(b) => binary(e, *b, x[0], x[1], y, g),
        // where(c, a, b): g to a where c holds, to b elsewhere; none to the bool c
        Op::Where => {
            let z = e.full_like(g, 0.0);
            let ga = e.select(x[0], g, z)?;
            let gb = e.select(x[0], z, g)?;
            Ok(vec![None, Some(ga), Some(gb)])
        }
        // cast: the gradient cast back to a float operand's dtype; none to an int or bool
        Op::Cast { .. } => {
            let from = e.dtype(x[0]);
            if !from.is_float() {
                return Ok(vec![None]);
            }
            one(e.cast(g, from)?)
        }
        Op::Reduce {
            op,
            axes,
            keepdims: _,
        } => one(reduce(e, *op, axes, x[0], y, g)?),
        // argmax/argmin: integer positions, no gradient
        Op::ArgReduce { .. } => Ok(vec![None]),
        // random_uniform: a function of an integer key, no gradient
        Op::RandomUniform { .. } => Ok(vec![None]),
        Op::View(v) => one(view(e, v, x[0], g)?),
        // a @ b: g @ b^T to a and a^T @ g to b, batch-broadcast axes summed back
        Op::MatMul => {
            let (a, b) = (x[0], x[1]);
            let bt = e.matrix_transpose(b)?;
            let ga = e.op(Op::MatMul, &[g, bt])?;
            let ga = e.sum_to(ga, &e.shape(a))?;
            let at = e.matrix_transpose(a)?;
            let gb = e.op(Op::MatMul, &[at, g])?;
            let gb = e.sum_to(gb, &e.shape(b))?;
            Ok(vec![Some(ga), Some(gb)])
        }
        // positions and orders: integers, no gradient
        Op::Iota { .. } => Ok(vec![]),
        Op::Argsort { .. } => Ok(vec![None]),
        // gather(x, idx): g scatter-added into zeros at the positions read (duplicates
        // accumulate); none to the integer idx
        Op::Gather { axis } => {
            let z = e.full_like(x[0], 0.0);
            let gx = e.op(Op::ScatterAdd { axis: *axis }, &[z, x[1], g])?;
            Ok(vec![Some(gx), None])
        }
        // scatter_add(x, idx, v): g to x, g gathered at the positions written to v
        Op::ScatterAdd { axis } => {
            let gv = e.op(Op::Gather { axis: *axis }, &[g, x[1]])?;
            Ok(vec![Some(g), None, Some(gv)])
        }
        // concat: each part gets its own range of g along the axis
        Op::Concat { axis, .. } => {
            let mut start = 0;
            let mut gs = Vec::with_capacity(x.len());
            for &part in x {
                let n = e.shape(part).dims()[*axis];
                gs.push(Some(e.slice_axis(g, *axis, start, n)?));
                start += n;
            }
            Ok(gs)
        }
        // pad: constant, g's interior; edge/reflect, g summed onto the source each
        // padded position reads
        Op::Pad { widths, mode, .. } => one(pad(e, widths, *mode, x[0], g)?),
        // cumsum: the running sum of g the other way
        Op::Scan {
            op: ScanOp::Sum,
            axis,
            reverse,
        } => one(e.scan(ScanOp::Sum, g, *axis, !reverse)?),
        // cumprod: the first zero's identity, dividing only by nonzeros (module docs)
        Op::Scan {
            op: ScanOp::Prod,
            axis,
            reverse,
        } => one(cumprod(e, x[0], g, *axis, *reverse)?),
        // attention: one fused backward node (the probabilities recomputed per block),
        // its packed result split into dq, dk, dv; none to the bias (the caller refuses
        // a bias that needs one), the key lengths and the dropout key
        Op::Attention(spec) => {
            let n = spec.layout.tensors();
            let mut operands = x[..n].to_vec();
            operands.extend([y, g]);
            operands.extend(&x[n..]);
            let packed = e.op(Op::AttentionBackward(*spec), &operands)?;
            if n == 1 {
                // qkv packed: the backward's result is its gradient.
                let mut gs = vec![Some(packed)];
                gs.extend(x[1..].iter().map(|_| None));
                return Ok(gs);
            }
            let mut gs = Vec::with_capacity(x.len());
            let mut start = 0;
            for &t in &x[..3] {
                let shape = e.shape(t);
                let part = e.slice_axis(packed, 0, start, shape.numel())?;
                gs.push(Some(e.reshape(part, &shape)?));
                start += shape.numel();
            }
            gs.extend(x[3..].iter().map(|_| None));
            Ok(gs)
        }
        Op::AttentionBackward(_) => Err(AutodiffError::NoRule {
            op: "attention_backward (a second derivative of attention)",
        }),
        Op::QuantMatMul(_) => Err(AutodiffError::NoRule {
            op: "quant_matmul (quantised weights are for inference; train on float weights)",
        }),
        // the LAPACK level: the standard formulas, in `linalg`
        Op::Linalg(l) => crate::linalg::vjp(e, *l, x, y, g),
    }
}

fn unary(e: &mut Emit, u: UnaryOp, x: NodeId, y: NodeId, g: NodeId) -> Grads {
    use UnaryOp as U;
    let d = match u {
        // -x: -g
        U::Neg => return Ok(vec![Some(e.unary(U::Neg, g)?)]),
        // |x|: g sign(x) (0 at 0)
        U::Abs => e.unary(U::Sign, x)?,
        // piecewise constant: no gradient flows
        U::Sign | U::Floor | U::Ceil | U::Round | U::Not => return Ok(vec![None]),
        // e^x: g y
        U::Exp => y,
        // log x: g / x
        U::Log => return Ok(vec![Some(e.div(g, x)?)]),
        // log(1 + x): g / (1 + x)
        U::Log1p => {
            let x1 = e.offset(x, 1.0)?;
            return Ok(vec![Some(e.div(g, x1)?)]);
        }
        // e^x - 1: g (y + 1)
        U::Expm1 => e.offset(y, 1.0)?,
        // sqrt x: g / (2 y)
        U::Sqrt => {
            let y2 = e.scale(y, 2.0)?;
            return Ok(vec![Some(e.div(g, y2)?)]);
        }
        // x^-1/2: g (-y / 2x)
        U::Rsqrt => {
            let x2 = e.scale(x, -2.0)?;
            e.div(y, x2)?
        }
        // x^2: g 2x
        U::Square => e.scale(x, 2.0)?,
        // 1/x: g (-y^2)
        U::Recip => {
            let yy = e.mul(y, y)?;
            e.unary(U::Neg, yy)?
        }
        // sin x: g cos x
        U::Sin => e.unary(U::Cos, x)?,
        // cos x: g (-sin x)
        U::Cos => {
            let s = e.unary(U::Sin, x)?;
            e.unary(U::Neg, s)?
        }
        // tanh x: g (1 - y^2)
        U::Tanh => {
            let yy = e.mul(y, y)?;
            let one = e.full_like(y, 1.0);
            e.sub(one, yy)?
        }
        // sigmoid x: g y (1 - y)
        U::Sigmoid => {
            let one = e.full_like(y, 1.0);
            let c = e.sub(one, y)?;
            e.mul(y, c)?
        }
        // relu x: g where x > 0, else 0 (0 at 0)
        U::Relu => {
            let z = e.full_like(x, 0.0);
            let pos = e.binary(BinaryOp::Gt, x, z)?;
            return Ok(vec![Some(e.keep(pos, g)?)]);
        }
        // erf x: g (2 / sqrt pi) e^(-x^2)
        U::Erf => {
            let xx = e.mul(x, x)?;
            let m = e.unary(U::Neg, xx)?;
            let ex = e.unary(U::Exp, m)?;
            e.scale(ex, std::f64::consts::FRAC_2_SQRT_PI)?
        }
    };
    Ok(vec![Some(e.mul(g, d)?)])
}

fn binary(e: &mut Emit, op: BinaryOp, a: NodeId, b: NodeId, y: NodeId, g: NodeId) -> Grads {
    use BinaryOp as B;
    Ok(match op {
        // a + b: g, g
        B::Add => vec![Some(g), Some(g)],
        // a - b: g, -g
        B::Sub => vec![Some(g), Some(e.unary(UnaryOp::Neg, g)?)],
        // a b: g b, g a
        B::Mul => vec![Some(e.mul(g, b)?), Some(e.mul(g, a)?)],
        // a / b: g / b, -g y / b
        B::Div => {
            let ga = e.div(g, b)?;
            let gy = e.mul(ga, y)?;
            vec![Some(ga), Some(e.unary(UnaryOp::Neg, gy)?)]
        }
        // a^b: g b a^(b-1) (0 where b == 0), g y log a (0 where a == 0)
        B::Pow => {
            let bm1 = e.offset(b, -1.0)?;
            let p = e.binary(B::Pow, a, bm1)?;
            let da = e.mul(b, p)?;
            let b0 = e.equals(b, 0.0)?;
            let z = e.full_like(da, 0.0);
            let da = e.select(b0, z, da)?;
            let ln = e.unary(UnaryOp::Log, a)?;
            let db = e.mul(y, ln)?;
            let a0 = e.equals(a, 0.0)?;
            let db = e.select(a0, z, db)?;
            vec![Some(e.mul(g, da)?), Some(e.mul(g, db)?)]
        }
        // maximum / minimum: g to the winner, split evenly on a tie
        B::Max | B::Min => {
            let win = if op == B::Max { B::Gt } else { B::Lt };
            let tie = e.binary(B::Eq, a, b)?;
            let half = e.scale(g, 0.5)?;
            let z = e.full_like(g, 0.0);
            let mut share = |x: NodeId, o: NodeId| -> Result<NodeId, AutodiffError> {
                let w = e.binary(win, x, o)?;
                let t = e.select(tie, half, z)?;
                e.select(w, g, t)
            };
            vec![Some(share(a, b)?), Some(share(b, a)?)]
        }
        // comparisons and logical ops: bool results, no gradient
        B::Eq | B::Ne | B::Lt | B::Le | B::Gt | B::Ge | B::And | B::Or => vec![None, None],
    })
}

fn reduce(
    e: &mut Emit,
    op: ReduceOp,
    axes: &[usize],
    x: NodeId,
    y: NodeId,
    g: NodeId,
) -> Result<NodeId, AutodiffError> {
    let shape = e.shape(x);
    let n: usize = axes.iter().map(|&a| shape.dims()[a]).product();
    let gs = e.spread(g, axes, &shape)?;
    let ys = e.spread(y, axes, &shape)?;
    Ok(match op {
        // sum: g broadcast back
        ReduceOp::Sum => gs,
        // mean: g / n broadcast back
        ReduceOp::Mean => e.scale(gs, 1.0 / n as f64)?,
        // max/min: g to the positions equal to the result, split evenly between ties
        ReduceOp::Max | ReduceOp::Min => {
            let at = e.binary(BinaryOp::Eq, x, ys)?;
            let dt = e.dtype(x);
            let count = e.cast(at, dt)?;
            let count = e.reduce(ReduceOp::Sum, count, axes, true)?;
            let count = e.spread(count, axes, &shape)?;
            let share = e.div(gs, count)?;
            e.keep(at, share)?
        }
        // prod: g y / x; at a zero, g times the product of the others (0 if 2+ zeros)
        ReduceOp::Prod => {
            let zero = e.equals(x, 0.0)?;
            let ones = e.full_like(x, 1.0);
            let nz = e.select(zero, ones, x)?;
            let others = e.reduce(ReduceOp::Prod, nz, axes, true)?;
            let dt = e.dtype(x);
            let zeros = e.cast(zero, dt)?;
            let zeros = e.reduce(ReduceOp::Sum, zeros, axes, true)?;
            let single = e.equals(zeros, 1.0)?;
            let at_zero = e.keep(single, others)?;
            let at_zero = e.spread(at_zero, axes, &shape)?;
            let y_over_x = e.div(ys, x)?;
            let d = e.select(zero, at_zero, y_over_x)?;
            e.mul(gs, d)?
        }
        // norm1: g sign(x)
        ReduceOp::Norm1 => {
            let s = e.unary(UnaryOp::Sign, x)?;
            e.mul(gs, s)?
        }
        // norm2: g x / y (0 where y == 0)
        ReduceOp::Norm2 => {
            let d = e.div(x, ys)?;
            let y0 = e.equals(ys, 0.0)?;
            let z = e.full_like(d, 0.0);
            let d = e.select(y0, z, d)?;
            e.mul(gs, d)?
        }
        // var: g 2 (x - mean) / n
        ReduceOp::Var => {
            let c = centered(e, x, axes, &shape)?;
            let d = e.scale(c, 2.0 / n as f64)?;
            e.mul(gs, d)?
        }
        // std: g (x - mean) / (n y) (0 where y == 0)
        ReduceOp::Std => {
            let c = centered(e, x, axes, &shape)?;
            let ny = e.scale(ys, n as f64)?;
            let d = e.div(c, ny)?;
            let y0 = e.equals(ys, 0.0)?;
            let z = e.full_like(d, 0.0);
            let d = e.select(y0, z, d)?;
            e.mul(gs, d)?
        }
    })
}

/// `x - mean(x, axes)`, the mean broadcast back.
fn centered(
    e: &mut Emit,
    x: NodeId,
    axes: &[usize],
    shape: &Shape,
) -> Result<NodeId, AutodiffError> {
    let m = e.reduce(ReduceOp::Mean, x, axes, true)?;
    let m = e.spread(m, axes, shape)?;
    e.sub(x, m)
}

/// The gradient of `pad(x, widths, mode)`. Constant mode reads each source position
/// once, at `lo` on every axis: the interior slice of `g`. Edge and reflect read some
/// sources several times: one axis at a time, `g` is scatter-added into zeros of the
/// source extent at the source each padded position reads (`ir::interp::pad_source`),
/// an i64 index computed from the position (an iota from `-lo`, so `k = c - lo`):
/// edge `clamp(k, 0, n - 1)`, reflect `(n - 1) - |(n - 1) - |k||`.
fn pad(
    e: &mut Emit,
    widths: &[(usize, usize)],
    mode: PadMode,
    x: NodeId,
    g: NodeId,
) -> Result<NodeId, AutodiffError> {
    let dims = e.shape(x).dims().to_vec();
    let mut g = g;
    for (axis, (&(lo, hi), &n)) in widths.iter().zip(&dims).enumerate() {
        if lo == 0 && hi == 0 {
            continue;
        }
        if mode == PadMode::Constant {
            g = e.slice_axis(g, axis, lo, n)?;
            continue;
        }
        let gshape = e.shape(g);
        let k = e.positions(&gshape, axis, -(lo as i64))?;
        let last = e.full_like(k, (n as f64) - 1.0);
        let src = match mode {
            PadMode::Edge => {
                let z = e.full_like(k, 0.0);
                let k = e.binary(BinaryOp::Max, k, z)?;
                e.binary(BinaryOp::Min, k, last)?
            }
            _ => {
                let a = e.unary(UnaryOp::Abs, k)?;
                let d = e.sub(last, a)?;
                let d = e.unary(UnaryOp::Abs, d)?;
                e.sub(last, d)?
            }
        };
        let mut to = gshape.dims().to_vec();
        to[axis] = n;
        let dt = e.dtype(g);
        let zeros = e.g.add_const(Scalar::F(0.0), dt, Shape::new(to));
        g = e.op(Op::ScatterAdd { axis }, &[zeros, src, g])?;
    }
    Ok(g)
}

/// The gradient of `y = cumprod(x)` along `axis` (scanning backwards when `reverse`;
/// "first" and "before" below are in scan order), zero-safe (see the module docs):
/// `w` is the running product with the row's first zero replaced by 1, `u = g w`;
/// before the first zero `dx = rcumsum(u masked to before) / x` (those `x` are
/// nonzero), at the first zero `dx = rcumsum(u masked to from it on)`, after it 0.
fn cumprod(
    e: &mut Emit,
    x: NodeId,
    g: NodeId,
    axis: usize,
    reverse: bool,
) -> Result<NodeId, AutodiffError> {
    let dt = e.dtype(x);
    let zero = e.equals(x, 0.0)?;
    // The number of zeros up to each position: counts of 0/1 in the float dtype, exact
    // at 0, 1 and 2, and it never falls back to 1 once past it.
    let count = e.cast(zero, dt)?;
    let count = e.scan(ScanOp::Sum, count, axis, reverse)?;
    let before = e.equals(count, 0.0)?;
    let one_so_far = e.equals(count, 1.0)?;
    let first = e.binary(BinaryOp::And, zero, one_so_far)?;
    let ones = e.full_like(x, 1.0);
    let w = e.select(first, ones, x)?;
    let w = e.scan(ScanOp::Prod, w, axis, reverse)?;
    let u = e.mul(g, w)?;
    let zeros = e.full_like(x, 0.0);
    let u_before = e.select(before, u, zeros)?;
    let s_before = e.scan(ScanOp::Sum, u_before, axis, !reverse)?;
    let x_before = e.select(before, x, ones)?;
    let d_before = e.div(s_before, x_before)?;
    let u_after = e.select(before, zeros, u)?;
    let s_after = e.scan(ScanOp::Sum, u_after, axis, !reverse)?;
    let d_first = e.select(first, s_after, zeros)?;
    e.select(before, d_before, d_first)
}

fn view(e: &mut Emit, v: &ViewOp, x: NodeId, g: NodeId) -> Result<NodeId, AutodiffError> {
    let shape = e.shape(x);
    match v {
        // reshape, expand_dims, squeeze: reshape back (same elements, same order)
        ViewOp::Reshape(_) | ViewOp::ExpandDims(_) | ViewOp::Squeeze(_) => e.reshape(g, &shape),
        // permute: the inverse permutation
        ViewOp::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            e.view(ViewOp::Permute(inv), g)
        }
        // slice: scattered back into zeros, one 0/1 selection matmul per sliced axis
        ViewOp::Slice(slices) => {
            let mut g = g;
            for (axis, s) in slices.iter().enumerate() {
                if !s.is_full(shape.dims()[axis]) {
                    g = scatter_axis(e, g, axis, *s, shape.dims()[axis])?;
                }
            }
            Ok(g)
        }
        // broadcast_to: summed over the broadcast axes
        ViewOp::BroadcastTo(_) => e.sum_to(g, &shape),
    }
}

/// `g` with axis `axis` (of extent `s.len`) scattered into an axis of extent `dim`
/// at the positions `s` took, zeros elsewhere: `g @ S` with the 0/1 matrix
/// `S[j, s.start + j s.step] = 1` after moving the axis last (the IR has no pad or
/// scatter op; the matrix is a constant input, `len x dim` elements).
fn scatter_axis(
    e: &mut Emit,
    g: NodeId,
    axis: usize,
    s: AxisSlice,
    dim: usize,
) -> Result<NodeId, AutodiffError> {
    let rank = e.shape(g).rank();
    let mut sel = vec![0.0; s.len * dim];
    for j in 0..s.len {
        let i = s.start + j as i64 * s.step;
        if let Ok(i) = usize::try_from(i) {
            if i < dim {
                sel[j * dim + i] = 1.0;
            }
        }
    }
    let dt = e.dtype(g);
    let m = e.constant(HostArray::from_f64s(dt, Shape::new([s.len, dim]), &sel));
    let mut perm: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
    perm.push(axis);
    let moved = axis + 1 != rank;
    let gp = if moved {
        e.view(ViewOp::Permute(perm.clone()), g)?
    } else {
        g
    };
    let lone = rank == 1;
    let gp = if lone {
        e.view(ViewOp::ExpandDims(0), gp)?
    } else {
        gp
    };
    let r = e.op(Op::MatMul, &[gp, m])?;
    let r = if lone {
        e.view(ViewOp::Squeeze(vec![0]), r)?
    } else {
        r
    };
    if !moved {
        return Ok(r);
    }
    let mut inv = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    e.view(ViewOp::Permute(inv), r)
}
