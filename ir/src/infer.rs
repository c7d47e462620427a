//! Shape and dtype inference: the one place that decides whether an op is legal on its
//! operands and what it produces. Graph construction, the frontend and the verifier all
//! call [`infer`], so they cannot disagree.

use crate::dtype::DType;
use crate::error::{IntList, IrError, TensorType};
use crate::op::{AttentionSpec, BinaryOp, Op, PadMode, ReduceOp, UnaryOp, ViewOp};
use crate::shape::Shape;

const CAST_FIRST: &str = "bool has no arithmetic; cast it to a number first";

/// The result type of `op` applied to operands of the given types.
pub fn infer(op: &Op, operands: &[TensorType]) -> Result<TensorType, IrError> {
    let name = op.name();
    if operands.len() != op.arity() {
        return Err(IrError::Arity {
            op: name,
            expected: op.arity(),
            got: operands.len(),
        });
    }
    match op {
        Op::Input { .. } | Op::Const { .. } => Err(IrError::NotInferable { op: name }),
        Op::Unary(u) => infer_unary(*u, &operands[0]),
        Op::Binary(b) => infer_binary(*b, &operands[0], &operands[1]),
        Op::Where => {
            let (c, a, b) = (&operands[0], &operands[1], &operands[2]);
            if c.dtype != DType::Bool {
                return Err(IrError::BadDType {
                    op: name,
                    operand: c.clone(),
                    why: "the condition must be bool (compare, or cast to bool)",
                });
            }
            same_shape(name, c, a)?;
            same_shape(name, a, b)?;
            same_dtype(name, a, b)?;
            Ok(a.clone())
        }
        Op::Cast { to } => Ok(TensorType {
            dtype: *to,
            shape: operands[0].shape.clone(),
        }),
        Op::Reduce {
            op: r,
            axes,
            keepdims,
        } => infer_reduce(*r, axes, *keepdims, &operands[0]),
        Op::ArgReduce {
            op: r,
            axis,
            keepdims,
        } => {
            let x = &operands[0];
            check_axes(r.name(), &[*axis], x)?;
            check_nonempty(r.name(), &[*axis], x)?;
            Ok(TensorType {
                dtype: DType::I64,
                shape: reduced_shape(&x.shape, &[*axis], *keepdims),
            })
        }
        Op::View(v) => infer_view(v, &operands[0]),
        Op::MatMul => infer_matmul(&operands[0], &operands[1]),
        Op::RandomUniform { shape } => {
            let key = &operands[0];
            if key.dtype != DType::I64 || key.shape.rank() != 0 {
                return Err(IrError::BadDType {
                    op: name,
                    operand: key.clone(),
                    why: "the key must be a 0-d i64 tensor",
                });
            }
            Ok(TensorType {
                dtype: DType::F32,
                shape: shape.clone(),
            })
        }
        Op::Iota { len, start, step } => {
            let last = (*len as i128 - 1).max(0) * *step as i128 + *start as i128;
            if i64::try_from(last).is_err() || i64::try_from(*len).is_err() {
                return Err(IrError::NotInferable { op: name });
            }
            Ok(TensorType {
                dtype: DType::I64,
                shape: Shape::new([*len]),
            })
        }
        Op::Gather { axis } => {
            let (x, idx) = (&operands[0], &operands[1]);
            check_index(name, idx)?;
            agree_but(name, *axis, x, idx)?;
            Ok(TensorType {
                dtype: x.dtype,
                shape: idx.shape.clone(),
            })
        }
        Op::ScatterAdd { axis } => {
            let (x, idx, v) = (&operands[0], &operands[1], &operands[2]);
            check_index(name, idx)?;
            if x.dtype == DType::Bool {
                return Err(IrError::BadDType {
                    op: name,
                    operand: x.clone(),
                    why: CAST_FIRST,
                });
            }
            same_dtype(name, x, v)?;
            if idx.shape != v.shape {
                return Err(IrError::ShapeMismatch {
                    op: name,
                    lhs: idx.clone(),
                    rhs: v.clone(),
                });
            }
            agree_but(name, *axis, x, idx)?;
            Ok(x.clone())
        }
        Op::Concat { axis, .. } => {
            let first = &operands[0];
            let mut dims = first.shape.dims().to_vec();
            for part in &operands[1..] {
                same_dtype(name, first, part)?;
                agree_but(name, *axis, first, part)?;
                dims[*axis] += part.shape.dims()[*axis];
            }
            if *axis >= dims.len() {
                return Err(IrError::AxisOutOfRange {
                    op: name,
                    axis: *axis as i64,
                    operand: first.clone(),
                });
            }
            Ok(TensorType {
                dtype: first.dtype,
                shape: Shape::new(dims),
            })
        }
        Op::Pad {
            widths,
            mode,
            value,
        } => infer_pad(widths, *mode, *value, &operands[0]),
        Op::Scan { op, axis, .. } => {
            let x = &operands[0];
            check_axes(op.name(), &[*axis], x)?;
            let dtype = match x.dtype {
                DType::Bool => {
                    return Err(IrError::BadDType {
                        op: op.name(),
                        operand: x.clone(),
                        why: CAST_FIRST,
                    })
                }
                d if d.is_int() => DType::I64,
                d => d,
            };
            Ok(TensorType {
                dtype,
                shape: x.shape.clone(),
            })
        }
        Op::Attention(spec) => infer_attention(spec, operands, false),
        Op::AttentionBackward(spec) => infer_attention(spec, operands, true),
        Op::Linalg(l) => infer_linalg(*l, operands),
        Op::QuantMatMul(spec) => infer_quant_matmul(spec, operands),
        Op::Argsort { axis, k, .. } => {
            let x = &operands[0];
            check_axes(name, &[*axis], x)?;
            let n = x.shape.dims()[*axis];
            if *k > n {
                return Err(IrError::BadSlice {
                    why: format!("k = {k} is more than the {n} positions of axis {axis}"),
                    operand: x.clone(),
                });
            }
            let mut dims = x.shape.dims().to_vec();
            dims[*axis] = *k;
            Ok(TensorType {
                dtype: DType::I64,
                shape: Shape::new(dims),
            })
        }
    }
}

/// An index operand must hold integers (numpy refuses float and bool indices).
fn check_index(op: &'static str, idx: &TensorType) -> Result<(), IrError> {
    if matches!(idx.dtype, DType::I32 | DType::I64) {
        Ok(())
    } else {
        Err(IrError::BadDType {
            op,
            operand: idx.clone(),
            why: "indices must be integers (i32 or i64); cast them first",
        })
    }
}

/// `a` and `b` have one rank, `axis` is one of its axes, and they agree on every other.
fn agree_but(op: &'static str, axis: usize, a: &TensorType, b: &TensorType) -> Result<(), IrError> {
    if axis >= a.shape.rank() {
        return Err(IrError::AxisOutOfRange {
            op,
            axis: axis as i64,
            operand: a.clone(),
        });
    }
    let agree = a.shape.rank() == b.shape.rank()
        && a.shape
            .dims()
            .iter()
            .zip(b.shape.dims())
            .enumerate()
            .all(|(i, (x, y))| i == axis || x == y);
    if agree {
        Ok(())
    } else {
        Err(IrError::AxisMismatch {
            op,
            axis,
            lhs: a.clone(),
            rhs: b.clone(),
        })
    }
}

fn infer_pad(
    widths: &[(usize, usize)],
    mode: PadMode,
    value: crate::dtype::Scalar,
    x: &TensorType,
) -> Result<TensorType, IrError> {
    let bad = |why: String| {
        Err(IrError::BadPad {
            why,
            operand: x.clone(),
        })
    };
    if widths.len() != x.shape.rank() {
        return bad(format!(
            "{} pairs of widths given for {} axes",
            widths.len(),
            x.shape.rank()
        ));
    }
    if mode == PadMode::Constant && value.cast(x.dtype) != value {
        return bad(format!("the fill {value} is not a {} value", x.dtype));
    }
    let mut dims = Vec::with_capacity(widths.len());
    for (axis, (&(lo, hi), &n)) in widths.iter().zip(x.shape.dims()).enumerate() {
        let padded = lo > 0 || hi > 0;
        match mode {
            PadMode::Edge if padded && n == 0 => {
                return bad(format!("axis {axis} is empty: it has no edge to repeat"))
            }
            PadMode::Reflect if padded && (lo >= n.max(1) || hi >= n.max(1)) => {
                return bad(format!(
                    "reflect widths ({lo}, {hi}) on axis {axis} of extent {n}: at most {} each",
                    n.saturating_sub(1)
                ))
            }
            _ => {}
        }
        match n.checked_add(lo).and_then(|d| d.checked_add(hi)) {
            Some(d) => dims.push(d),
            None => return bad(format!("widths ({lo}, {hi}) on axis {axis} overflow")),
        }
    }
    Ok(TensorType {
        dtype: x.dtype,
        shape: Shape::new(dims),
    })
}

/// `[..., M, K] @ [..., K, N] -> [..., M, N]` with the batch axes broadcast.
fn infer_matmul(a: &TensorType, b: &TensorType) -> Result<TensorType, IrError> {
    const OP: &str = "matmul";
    for x in [a, b] {
        if x.shape.rank() < 2 {
            return Err(IrError::BadDType {
                op: OP,
                operand: x.clone(),
                why: "the IR's matmul takes operands of rank 2 or more (the frontend promotes 1-D operands; 0-d operands have no matrix product)",
            });
        }
        if x.dtype == DType::Bool {
            return Err(IrError::BadDType {
                op: OP,
                operand: x.clone(),
                why: CAST_FIRST,
            });
        }
    }
    same_dtype(OP, a, b)?;
    let (ad, bd) = (a.shape.dims(), b.shape.dims());
    let (ra, rb) = (ad.len(), bd.len());
    let (m, k) = (ad[ra - 2], ad[ra - 1]);
    let (k2, n) = (bd[rb - 2], bd[rb - 1]);
    if k != k2 {
        return Err(IrError::Contraction {
            op: OP,
            lhs: a.clone(),
            rhs: b.clone(),
            lhs_k: k,
            rhs_k: k2,
        });
    }
    let batch = Shape::broadcast(&Shape::new(&ad[..ra - 2]), &Shape::new(&bd[..rb - 2]))
        .ok_or_else(|| IrError::Broadcast {
            op: OP,
            lhs: a.clone(),
            rhs: b.clone(),
        })?;
    let mut dims = batch.dims().to_vec();
    dims.extend([m, n]);
    Ok(TensorType {
        dtype: a.dtype,
        shape: Shape::new(dims),
    })
}

fn infer_unary(u: UnaryOp, x: &TensorType) -> Result<TensorType, IrError> {
    let bad = |why| {
        Err(IrError::BadDType {
            op: u.name(),
            operand: x.clone(),
            why,
        })
    };
    match (u, x.dtype) {
        (UnaryOp::Not, DType::Bool) => Ok(x.clone()),
        (UnaryOp::Not, _) => bad("`not` takes bool; compare with 0 first"),
        (_, DType::Bool) => bad(CAST_FIRST),
        (_, d) if u.is_float_only() && !d.is_float() => {
            bad("defined on floats only; cast the integer operand to a float dtype first")
        }
        _ => Ok(x.clone()),
    }
}

fn infer_binary(b: BinaryOp, x: &TensorType, y: &TensorType) -> Result<TensorType, IrError> {
    let name = b.name();
    same_shape(name, x, y)?;
    same_dtype(name, x, y)?;
    let bad = |why| {
        Err(IrError::BadDType {
            op: name,
            operand: x.clone(),
            why,
        })
    };
    if b.is_logical() {
        return if x.dtype == DType::Bool {
            Ok(x.clone())
        } else {
            bad("logical ops take bool operands; compare first")
        };
    }
    if b.is_comparison() {
        return Ok(TensorType {
            dtype: DType::Bool,
            shape: x.shape.clone(),
        });
    }
    match (b, x.dtype) {
        (_, DType::Bool) => bad(CAST_FIRST),
        (BinaryOp::Div, d) if d.is_int() => {
            bad("`/` is true division; cast integer operands to a float dtype first")
        }
        _ => Ok(x.clone()),
    }
}

fn infer_reduce(
    r: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: &TensorType,
) -> Result<TensorType, IrError> {
    let name = r.name();
    check_axes(name, axes, x)?;
    if r.needs_nonempty() {
        check_nonempty(name, axes, x)?;
    }
    let dtype = match (r, x.dtype) {
        (_, DType::Bool) => {
            return Err(IrError::BadDType {
                op: name,
                operand: x.clone(),
                why: CAST_FIRST,
            })
        }
        // numpy accumulates integer sums and products in the platform integer (i64).
        (ReduceOp::Sum | ReduceOp::Prod, d) if d.is_int() => DType::I64,
        (ReduceOp::Max | ReduceOp::Min | ReduceOp::Sum | ReduceOp::Prod, d) => d,
        (_, d) if d.is_float() => d,
        _ => {
            return Err(IrError::BadDType {
                op: name,
                operand: x.clone(),
                why: "float-valued reduction; cast the integer operand to a float dtype first",
            })
        }
    };
    Ok(TensorType {
        dtype,
        shape: reduced_shape(&x.shape, axes, keepdims),
    })
}

fn infer_view(v: &ViewOp, x: &TensorType) -> Result<TensorType, IrError> {
    let rank = x.shape.rank();
    let shape = match v {
        ViewOp::Reshape(to) => {
            if to.numel() != x.shape.numel() {
                return Err(IrError::Reshape {
                    from: x.clone(),
                    to: IntList(to.dims().iter().map(|&d| d as i64).collect()),
                    why: "element counts differ",
                });
            }
            to.clone()
        }
        ViewOp::Permute(perm) => {
            let mut seen = vec![false; rank];
            let ok = perm.len() == rank
                && perm
                    .iter()
                    .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
            if !ok {
                return Err(IrError::BadPermutation {
                    perm: IntList(perm.iter().map(|&p| p as i64).collect()),
                    operand: x.clone(),
                });
            }
            Shape(perm.iter().map(|&p| x.shape.dims()[p]).collect())
        }
        ViewOp::Slice(slices) => {
            let bad = |why: String| IrError::BadSlice {
                why,
                operand: x.clone(),
            };
            if slices.len() != rank {
                return Err(bad(format!(
                    "{} slices given for {rank} axes",
                    slices.len()
                )));
            }
            for (axis, (s, &dim)) in slices.iter().zip(x.shape.dims()).enumerate() {
                if s.step == 0 {
                    return Err(bad(format!("step 0 on axis {axis}")));
                }
                let last = s.start + (s.len as i64 - 1) * s.step;
                let inside = |i: i64| (0..dim as i64).contains(&i);
                if s.len > 0 && !(inside(s.start) && inside(last)) {
                    return Err(bad(format!("{s} leaves axis {axis} of extent {dim}")));
                }
            }
            Shape(slices.iter().map(|s| s.len).collect())
        }
        ViewOp::BroadcastTo(to) => {
            if !x.shape.broadcasts_to(to) {
                return Err(IrError::BroadcastTo {
                    operand: x.clone(),
                    to: to.clone(),
                });
            }
            to.clone()
        }
        ViewOp::ExpandDims(axis) => {
            if *axis > rank {
                return Err(IrError::AxisOutOfRange {
                    op: "expand_dims",
                    axis: *axis as i64,
                    operand: x.clone(),
                });
            }
            let mut d = x.shape.dims().to_vec();
            d.insert(*axis, 1);
            Shape(d)
        }
        ViewOp::Squeeze(axes) => {
            check_axes("squeeze", axes, x)?;
            if let Some(&axis) = axes.iter().find(|&&a| x.shape.dims()[a] != 1) {
                return Err(IrError::SqueezeNotOne {
                    axis,
                    operand: x.clone(),
                });
            }
            Shape(
                (0..rank)
                    .filter(|i| !axes.contains(i))
                    .map(|i| x.shape.dims()[i])
                    .collect(),
            )
        }
    };
    Ok(TensorType {
        dtype: x.dtype,
        shape,
    })
}

/// Axes must be in range, sorted and unique (the frontend normalises user axes).
fn check_axes(op: &'static str, axes: &[usize], x: &TensorType) -> Result<(), IrError> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= x.shape.rank() {
            return Err(IrError::AxisOutOfRange {
                op,
                axis: a as i64,
                operand: x.clone(),
            });
        }
        if i > 0 && axes[i - 1] >= a {
            return Err(IrError::DuplicateAxis {
                op,
                axis: a,
                operand: x.clone(),
            });
        }
    }
    Ok(())
}

/// A reduction without identity over zero elements is an error unless the result is
/// itself empty (numpy: `zeros((0,3)).max(axis=1)` is fine, `.max(axis=0)` is not).
fn check_nonempty(op: &'static str, axes: &[usize], x: &TensorType) -> Result<(), IrError> {
    let reduced: usize = axes.iter().map(|&a| x.shape.dims()[a]).product();
    let kept = reduced_shape(&x.shape, axes, false).numel();
    if reduced == 0 && kept > 0 {
        return Err(IrError::EmptyReduction {
            op,
            operand: x.clone(),
            axes: axes.to_vec(),
        });
    }
    Ok(())
}

/// The shape after reducing `axes`, with them kept as 1s or dropped.
pub fn reduced_shape(shape: &Shape, axes: &[usize], keepdims: bool) -> Shape {
    Shape(
        shape
            .dims()
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect(),
    )
}

fn same_shape(op: &'static str, a: &TensorType, b: &TensorType) -> Result<(), IrError> {
    if a.shape == b.shape {
        Ok(())
    } else {
        Err(IrError::ShapeMismatch {
            op,
            lhs: a.clone(),
            rhs: b.clone(),
        })
    }
}

fn same_dtype(op: &'static str, a: &TensorType, b: &TensorType) -> Result<(), IrError> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(IrError::DTypeMismatch {
            op,
            lhs: a.clone(),
            rhs: b.clone(),
        })
    }
}

/// [`Op::Attention`]'s result (`backward`: [`Op::AttentionBackward`]'s, the packed
/// gradients of q, k and v).
fn infer_attention(
    spec: &AttentionSpec,
    operands: &[TensorType],
    backward: bool,
) -> Result<TensorType, IrError> {
    let fail = |why: String| Err(IrError::Attention { why });
    if let crate::op::AttentionLayout::Packed { q_heads, kv_heads } = spec.layout {
        return infer_packed(spec, operands, backward, q_heads, kv_heads);
    }
    let (q, k, v) = (&operands[0], &operands[1], &operands[2]);
    let shapes = format!("q {q}, k {k}, v {v}");
    let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        let axes = match spec.layout {
            crate::op::AttentionLayout::Bhtd => "[B, H, T, D]",
            _ => "[B, T, H, D]",
        };
        return fail(format!("{shapes}: q, k and v must be {axes}"));
    }
    if !q.dtype.is_float() || k.dtype != q.dtype || v.dtype != q.dtype {
        return fail(format!("{shapes}: q, k and v must be one float dtype"));
    }
    let split = |d: &[usize]| spec.layout.split(d);
    let (b, hq, tq, d) = split(qd);
    let (kb, hkv, tk, dk) = split(kd);
    let (vb, hv, tv, dv) = split(vd);
    if kb != b || vb != b {
        return fail(format!("{shapes}: the batch extents differ"));
    }
    if hv != hkv || hkv == 0 || hq % hkv != 0 {
        return fail(format!(
            "{shapes}: the key/value heads ({hkv} and {hv}) must be equal and divide the {hq} query heads"
        ));
    }
    if dk != d {
        return fail(format!(
            "{shapes}: the head dimensions of q ({d}) and k ({dk}) differ"
        ));
    }
    if tv != tk {
        return fail(format!("{shapes}: {tk} keys and {tv} values"));
    }
    if spec.scale.to_f64().is_nan() || !(0.0..1.0).contains(&spec.dropout_p()) {
        return fail(format!(
            "scale {} must be a number and the dropout rate {} in [0, 1)",
            spec.scale.to_f64(),
            spec.dropout_p()
        ));
    }
    let out = Shape::new(spec.layout.shape(b, hq, tq, dv));
    check_extras(spec, operands, backward, &shapes, q, &out, (b, hq, tq, tk))?;
    Ok(TensorType {
        dtype: q.dtype,
        shape: if backward {
            Shape::new([q.shape.numel() + k.shape.numel() + v.shape.numel()])
        } else {
            out
        },
    })
}

/// [`infer_attention`] for the packed layout: `qkv [B, T, (Hq + 2 Hkv) D]`.
fn infer_packed(
    spec: &AttentionSpec,
    operands: &[TensorType],
    backward: bool,
    hq: usize,
    hkv: usize,
) -> Result<TensorType, IrError> {
    let fail = |why: String| Err(IrError::Attention { why });
    let qkv = &operands[0];
    let shapes = format!("qkv {qkv}");
    let d3 = qkv.shape.dims();
    let per = hq + 2 * hkv;
    if d3.len() != 3 || !qkv.dtype.is_float() {
        return fail(format!(
            "{shapes}: the packed q, k and v must be a float [B, T, (Hq + 2 Hkv) D]"
        ));
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) || !d3[2].is_multiple_of(per) {
        return fail(format!(
            "{shapes}: {hkv} key/value heads must divide the {hq} query heads, and Hq + 2 Hkv = {per} the last extent"
        ));
    }
    let (b, t, d) = (d3[0], d3[1], d3[2] / per);
    let out = Shape::new([b, t, hq, d]);
    check_extras(spec, operands, backward, &shapes, qkv, &out, (b, hq, t, t))?;
    Ok(TensorType {
        dtype: qkv.dtype,
        shape: if backward { qkv.shape.clone() } else { out },
    })
}

/// The operands after q, k and v: the backward's o and do (of the result's type), the
/// bias, the key lengths and the dropout key.
fn check_extras(
    spec: &AttentionSpec,
    operands: &[TensorType],
    backward: bool,
    shapes: &str,
    q: &TensorType,
    out: &Shape,
    (b, hq, tq, tk): (usize, usize, usize, usize),
) -> Result<(), IrError> {
    let fail = |why: String| Err(IrError::Attention { why });
    let mut next = spec.layout.tensors();
    if backward {
        for (what, t) in [("o", &operands[next]), ("do", &operands[next + 1])] {
            if t.shape != *out || t.dtype != q.dtype {
                return fail(format!(
                    "{shapes}: {what} {t} must be the result's {} {out}",
                    q.dtype
                ));
            }
        }
        next += 2;
    }
    if spec.bias {
        let bias = &operands[next];
        let want = [b, hq, tq, tk];
        let bd = bias.shape.dims();
        let fits = bd.len() == 4 && bd.iter().zip(want).all(|(&e, w)| e == w || e == 1);
        if !fits || !bias.dtype.is_float() {
            return fail(format!(
                "{shapes}: the bias {bias} must be a float of extents {want:?} (or 1)"
            ));
        }
        next += 1;
    }
    if spec.key_lengths {
        let l = &operands[next];
        if l.dtype != DType::I64 || l.shape.dims() != [b] {
            return fail(format!("{shapes}: the key lengths {l} must be i64 [{b}]"));
        }
        next += 1;
    }
    if spec.dropout.is_some() {
        let key = &operands[next];
        if key.dtype != DType::I64 || key.shape.rank() != 0 {
            return fail(format!("the dropout key {key} must be a 0-d i64"));
        }
    }
    Ok(())
}

/// [`Op::QuantMatMul`]'s result: `x` f32 `[..., k]`, `w` i32 `[n, spec.row_words()]`,
/// `k` a whole number of blocks; f32 `[..., n]`.
fn infer_quant_matmul(
    spec: &crate::quant::QuantSpec,
    operands: &[TensorType],
) -> Result<TensorType, IrError> {
    let (x, w) = (&operands[0], &operands[1]);
    let fail = |why: String| {
        Err(IrError::Linalg {
            op: "quant_matmul",
            why,
        })
    };
    let k = spec.k;
    if k == 0 || !k.is_multiple_of(crate::quant::BLOCK) {
        return fail(format!(
            "{} rows of {k} weights: k must be a positive multiple of the block of {}",
            spec.format.name(),
            crate::quant::BLOCK
        ));
    }
    let xd = x.shape.dims();
    if x.dtype != DType::F32 || xd.last() != Some(&k) {
        return fail(format!(
            "x is {x} and w is {w}: x must be f32 [..., {k}] for {} rows of {k} weights",
            spec.format.name()
        ));
    }
    let wd = w.shape.dims();
    if w.dtype != DType::I32 || wd.len() != 2 || wd[1] != spec.row_words() {
        return fail(format!(
            "w is {w}: {} rows of {k} weights are i32 [n, {}] (the blocks' bytes in words)",
            spec.format.name(),
            spec.row_words()
        ));
    }
    let mut shape = xd[..xd.len() - 1].to_vec();
    shape.push(wd[0]);
    Ok(TensorType {
        dtype: DType::F32,
        shape: Shape::new(shape),
    })
}

/// [`Op::Linalg`]'s result: float operands of one dtype, matrices in the last two axes
/// with equal batch axes, square where the op needs it, `b` fitting `a`.
fn infer_linalg(
    op: crate::linalg::LinalgOp,
    operands: &[TensorType],
) -> Result<TensorType, IrError> {
    use crate::linalg::LinalgOp;
    let name = op.name();
    let a = &operands[0];
    if !a.dtype.is_float() {
        return Err(IrError::BadDType {
            op: name,
            operand: a.clone(),
            why: "the LAPACK level takes float matrices (cast integers first)",
        });
    }
    let fail = |why: String| Err(IrError::Linalg { op: name, why });
    let d = a.shape.dims();
    if d.len() < 2 {
        return fail(format!("a is {a}: it needs two matrix axes at least"));
    }
    let (batch, m, n) = (&d[..d.len() - 2], d[d.len() - 2], d[d.len() - 1]);
    if op.square() && m != n {
        return fail(format!("a is {a}: its last two axes are not square"));
    }
    let shape = match op {
        LinalgOp::Solve | LinalgOp::TriangularSolve { .. } => {
            let b = &operands[1];
            if b.dtype != a.dtype {
                return fail(format!("a is {a} and b is {b}: one dtype is needed"));
            }
            let bd = b.shape.dims();
            let left = !matches!(op, LinalgOp::TriangularSolve { left: false, .. });
            let fits = bd.len() == d.len()
                && &bd[..bd.len() - 2] == batch
                && if left {
                    bd[bd.len() - 2] == n
                } else {
                    bd[bd.len() - 1] == n
                };
            if !fits {
                return fail(format!(
                    "a is {a} and b is {b}: b must be [..., {n}, k]{} with a's batch axes",
                    if left {
                        ""
                    } else {
                        " (right side: [..., k, n])"
                    }
                ));
            }
            b.shape.clone()
        }
        LinalgOp::Det => Shape::new(batch),
        LinalgOp::Cholesky | LinalgOp::Inv => a.shape.clone(),
        _ => {
            let mut s = batch.to_vec();
            s.push(if op.packed() {
                op.packed_len(m, n)
            } else {
                m.min(n)
            });
            Shape::new(s)
        }
    };
    Ok(TensorType {
        dtype: a.dtype,
        shape,
    })
}
