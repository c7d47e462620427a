//! Indexed reads and writes along one axis: numpy's `take` and `take_along_axis`,
//! torch's `index_add`, `concat`/`stack`, `pad`, and the positions op (`iota`) that
//! `arange`, `one_hot` and `tril`/`triu` are built from. Each is one IR op on views of
//! its operands: the broadcasting numpy does implicitly becomes `reshape` and
//! `broadcast_to` views here, as `ops.rs` does for arithmetic, so that the op itself
//! sees operands that agree on every axis but the indexed one.

use crate::context::Context;
use crate::error::Error;
use crate::ops::norm_axis;
use crate::tensor::Tensor;
use ndfuse_ir::{DType, IrError, Op, PadMode, Scalar, Shape, TensorType, ViewOp};
use std::panic::Location;

type At = &'static Location<'static>;

/// What an index of a float or bool dtype is told.
pub(crate) const INT_INDEX: &str = "indices must be integers (i32 or i64); cast them first";

/// `t`'s type, or the tensor to return in its place (carrying `t`'s error).
fn ty(t: &Tensor) -> Result<TensorType, Tensor> {
    t.ty().map_err(|e| Tensor::poisoned(&t.ctx, e))
}

/// `Ok` for an i32 or i64 index; else `anchor` poisoned with an error naming `idx`.
pub(crate) fn check_index(
    op: &'static str,
    anchor: &Tensor,
    idx: &TensorType,
    at: At,
) -> Result<(), Tensor> {
    if matches!(idx.dtype, DType::I32 | DType::I64) {
        Ok(())
    } else {
        Err(anchor.fail(
            IrError::BadDType {
                op,
                operand: idx.clone(),
                why: INT_INDEX,
            },
            at,
        ))
    }
}

/// `axis` (negative counts from the end) of `x`, or `anchor` carrying the error.
fn axis_of(
    op: &'static str,
    anchor: &Tensor,
    axis: i64,
    x: &TensorType,
    at: At,
) -> Result<usize, Tensor> {
    norm_axis(op, axis, x.shape.rank(), x).map_err(|e| anchor.fail(e, at))
}

/// `t` as `dims` (a reshape view, none when the shape is already `dims`).
fn reshaped(t: &Tensor, dims: Vec<usize>, at: At) -> Tensor {
    match t.shape() {
        Ok(s) if s == dims.as_slice() => t.clone(),
        _ => t.view(ViewOp::Reshape(Shape(dims)), at),
    }
}

/// `[1; before] ++ mid ++ [1; after]`.
fn padded_ones(before: usize, mid: &[usize], after: usize) -> Vec<usize> {
    let mut d = vec![1; before];
    d.extend_from_slice(mid);
    d.extend(std::iter::repeat_n(1, after));
    d
}

/// `start + step * i` for `i` in `0..len`, as i64: the IR's iota, a read that every
/// kernel consuming it computes from the position. `Err` (as a tensor) when a value
/// does not fit i64.
pub(crate) fn iota_at(ctx: &Context, len: usize, start: i64, step: i64, at: At) -> Tensor {
    let last = (len as i128 - 1).max(0) * i128::from(step) + i128::from(start);
    if i64::try_from(len).is_err() || i64::try_from(last).is_err() {
        return Tensor::poisoned(
            ctx,
            Error::Argument {
                what: "arange",
                why: format!("{len} values from {start} by {step} do not fit i64"),
                at,
            },
        );
    }
    Tensor::build_in(ctx, Op::Iota { len, start, step }, &[], at)
}

impl Tensor {
    /// numpy's `take(x, idx, axis)`: the slices of `x` at positions `idx` (i32 or i64,
    /// any shape; negative counts from the end) along `axis`. The result's shape is
    /// `x.shape[..axis] ++ idx.shape ++ x.shape[axis+1..]`. An index outside `-n..n` is
    /// an error of the evaluation, naming the index and its position. An index of
    /// several axes is taken as one axis and the result split, so the gradient with
    /// respect to `x` is a scatter-add into `x`'s own shape (an embedding table's, not
    /// the table's times the sequence length).
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![10.0f32, 11.0, 12.0, 20.0, 21.0, 22.0], &[2, 3])?;
    /// let idx = ctx.from_vec(vec![2i64, 0, -1], &[3])?;
    /// let y = x.take(&idx, 1).eval()?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![12.0, 10.0, 12.0, 22.0, 20.0, 22.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn take(&self, idx: &Tensor, axis: i64) -> Tensor {
        take_at(self, idx, axis, Location::caller()).unwrap_or_else(|t| t)
    }

    /// numpy's `take_along_axis(x, idx, axis)`: `out[p] = x[p with p[axis] :=
    /// idx[p]]`. `x` and `idx` have one rank; on every other axis their extents
    /// broadcast (equal, or one of them 1); the result has `idx`'s extent on `axis`.
    #[track_caller]
    pub fn take_along_axis(&self, idx: &Tensor, axis: i64) -> Tensor {
        take_along_at(self, idx, axis, Location::caller()).unwrap_or_else(|t| t)
    }

    /// torch's `index_add`: this tensor with slice `i` of `v` along `axis` added at
    /// position `idx[i]` (negative counts from the end). `idx` is 1-D (i32 or i64) with
    /// one entry per slice of `v`, and `v` agrees with this tensor on every other axis;
    /// repeated positions accumulate. `v` is cast to this tensor's dtype when that loses
    /// nothing (an integer `v` into floats), else it is an error.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.zeros(&[3]);
    /// let idx = ctx.from_vec(vec![0i64, 2, 0], &[3])?;
    /// let v = ctx.from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(x.index_add(&idx, &v, 0).eval()?.to_vec::<f32>()?, vec![4.0, 0.0, 2.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn index_add(&self, idx: &Tensor, v: &Tensor, axis: i64) -> Tensor {
        index_add_at(self, idx, v, axis, Location::caller()).unwrap_or_else(|t| t)
    }

    /// numpy's `pad`: `widths[a] = (before, after)` positions added on each side of
    /// axis `a` (one pair per axis), filled with `value` (converted to this tensor's
    /// dtype; [`PadMode::Constant`] only), the edge element ([`PadMode::Edge`]) or the
    /// mirror image about the edge ([`PadMode::Reflect`], at most `n - 1` on each side).
    ///
    /// ```
    /// use ndfuse::PadMode;
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// let y = x.pad(&[(2, 1)], PadMode::Reflect, 0.0).eval()?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn pad(&self, widths: &[(usize, usize)], mode: PadMode, value: f64) -> Tensor {
        let at = Location::caller();
        let dtype = match self.dtype() {
            Ok(d) => d,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let fill = match mode {
            PadMode::Constant => value,
            PadMode::Edge | PadMode::Reflect => 0.0,
        };
        let op = Op::Pad {
            widths: widths.to_vec(),
            mode,
            value: Scalar::F(fill).cast(dtype),
        };
        Tensor::build(op, &[self], at)
    }
}

/// numpy's `concatenate`: `parts` joined along `axis` (negative counts from the end).
/// The parts have one rank and equal extents on every other axis; their dtypes promote
/// as arithmetic does (bool joins only bool). An empty list gives a tensor (of the
/// global context) carrying the error.
///
/// ```
/// let ctx = ndfuse::Context::new();
/// let a = ctx.from_vec(vec![1.0f32, 2.0], &[1, 2])?;
/// let b = ctx.from_vec(vec![3.0f32, 4.0, 5.0, 6.0], &[2, 2])?;
/// let c = ndfuse::concat(&[&a, &b], 0).eval()?;
/// assert_eq!((c.shape(), c.to_vec::<f32>()?), (&[3usize, 2][..], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[track_caller]
pub fn concat(parts: &[&Tensor], axis: i64) -> Tensor {
    concat_at(parts, axis, Location::caller()).unwrap_or_else(|t| t)
}

/// numpy's `stack`: tensors of one shape joined along a new axis `axis` of the result
/// (negative counts from the end of the result's axes).
#[track_caller]
pub fn stack(parts: &[&Tensor], axis: i64) -> Tensor {
    stack_at(parts, axis, Location::caller()).unwrap_or_else(|t| t)
}

fn take_at(x: &Tensor, idx: &Tensor, axis: i64, at: At) -> Result<Tensor, Tensor> {
    const OP: &str = "take";
    let (xt, it) = (ty(x)?, ty(idx)?);
    check_index(OP, x, &it, at)?;
    let axis = axis_of(OP, x, axis, &xt, at)?;
    if it.shape.rank() == 0 {
        // A 0-d index removes the axis: take one position, then drop it.
        let one = reshaped(idx, vec![1], at);
        let taken = take_at(x, &one, axis as i64, at)?;
        return Ok(taken.view(ViewOp::Squeeze(vec![axis]), at));
    }
    let (xd, id) = (xt.shape.dims(), it.shape.dims());
    let (before, n, after) = (&xd[..axis], xd[axis], &xd[axis + 1..]);
    let out: Vec<usize> = [before, id, after].concat();
    if id.len() > 1 {
        // An index of several axes: taken as one axis, then split. Read along the
        // first of its axes and broadcast along the rest, x would be a view as large
        // as the result, and the gradient of the gather a scatter-add into that view's
        // shape (an embedding table times the sequence length) before its sum.
        let flat = reshaped(idx, vec![id.iter().product()], at);
        let taken = take_at(x, &flat, axis as i64, at)?;
        return Ok(reshaped(&taken, out, at));
    }
    // The index spans its own axes; x is read along the first of them, and repeated
    // (a broadcast view) along the rest.
    let idx_v =
        reshaped(idx, padded_ones(axis, id, after.len()), at).broadcast_at(&Shape(out.clone()), at);
    let x_dims = padded_ones(0, &[before, &[n][..]].concat(), id.len() - 1)
        .into_iter()
        .chain(after.iter().copied())
        .collect();
    let mut x_to = out;
    x_to[axis] = n;
    let x_v = reshaped(x, x_dims, at).broadcast_at(&Shape(x_to), at);
    Ok(Tensor::build(Op::Gather { axis }, &[&x_v, &idx_v], at))
}

fn take_along_at(x: &Tensor, idx: &Tensor, axis: i64, at: At) -> Result<Tensor, Tensor> {
    const OP: &str = "take_along_axis";
    let (xt, it) = (ty(x)?, ty(idx)?);
    check_index(OP, x, &it, at)?;
    let axis = axis_of(OP, x, axis, &xt, at)?;
    let mismatch = || {
        x.fail(
            IrError::AxisMismatch {
                op: OP,
                axis,
                lhs: xt.clone(),
                rhs: it.clone(),
            },
            at,
        )
    };
    if xt.shape.rank() != it.shape.rank() {
        return Err(mismatch());
    }
    let (mut xs, mut is) = (Vec::new(), Vec::new());
    for (a, (&xn, &in_)) in xt.shape.dims().iter().zip(it.shape.dims()).enumerate() {
        let b = match (xn, in_) {
            _ if a == axis => {
                xs.push(xn);
                is.push(in_);
                continue;
            }
            (p, q) if p == q => p,
            (1, q) => q,
            (p, 1) => p,
            _ => return Err(mismatch()),
        };
        xs.push(b);
        is.push(b);
    }
    let x_v = x.broadcast_at(&Shape(xs), at);
    let idx_v = idx.broadcast_at(&Shape(is), at);
    Ok(Tensor::build(Op::Gather { axis }, &[&x_v, &idx_v], at))
}

fn index_add_at(x: &Tensor, idx: &Tensor, v: &Tensor, axis: i64, at: At) -> Result<Tensor, Tensor> {
    const OP: &str = "index_add";
    let (xt, it, vt) = (ty(x)?, ty(idx)?, ty(v)?);
    check_index(OP, x, &it, at)?;
    let axis = axis_of(OP, x, axis, &xt, at)?;
    if it.shape.rank() != 1 {
        return Err(x.fail(
            IrError::BadDType {
                op: OP,
                operand: it,
                why: "the index must be 1-D: one position per slice of v along the axis",
            },
            at,
        ));
    }
    let agrees = vt.shape.rank() == xt.shape.rank()
        && (0..xt.shape.rank()).all(|a| a == axis || xt.shape.dims()[a] == vt.shape.dims()[a]);
    if !agrees {
        return Err(x.fail(
            IrError::AxisMismatch {
                op: OP,
                axis,
                lhs: xt,
                rhs: vt,
            },
            at,
        ));
    }
    let (m, k) = (it.shape.dims()[0], vt.shape.dims()[axis]);
    if m != k {
        return Err(Tensor::poisoned(
            &x.ctx,
            Error::Argument {
                what: OP,
                why: format!(
                    "the index {it} holds {m} positions but v {vt} has {k} slices along axis {axis} (x is {xt})"
                ),
                at,
            },
        ));
    }
    let v = if vt.dtype == xt.dtype {
        v.clone()
    } else if DType::promote(xt.dtype, vt.dtype) == Some(xt.dtype) {
        v.cast_at(xt.dtype, at)
    } else {
        return Err(x.fail(
            IrError::DTypeMismatch {
                op: OP,
                lhs: xt,
                rhs: vt,
            },
            at,
        ));
    };
    let rank = xt.shape.rank();
    let idx_v =
        reshaped(idx, padded_ones(axis, &[m], rank - axis - 1), at).broadcast_at(&vt.shape, at);
    Ok(Tensor::build(Op::ScatterAdd { axis }, &[x, &idx_v, &v], at))
}

/// A tensor of the global context carrying "no tensors" for `what`.
fn no_parts(what: &'static str, at: At) -> Tensor {
    Tensor::poisoned(
        Context::global(),
        Error::Argument {
            what,
            why: "no tensors to join (the list is empty)".into(),
            at,
        },
    )
}

fn concat_at(parts: &[&Tensor], axis: i64, at: At) -> Result<Tensor, Tensor> {
    const OP: &str = "concat";
    let Some(&first) = parts.first() else {
        return Err(no_parts(OP, at));
    };
    let types = parts.iter().map(|p| ty(p)).collect::<Result<Vec<_>, _>>()?;
    let ft = &types[0];
    let axis = axis_of(OP, first, axis, ft, at)?;
    let mut dtype = ft.dtype;
    for t in &types[1..] {
        let agrees = t.shape.rank() == ft.shape.rank()
            && (0..ft.shape.rank()).all(|a| a == axis || ft.shape.dims()[a] == t.shape.dims()[a]);
        if !agrees {
            return Err(first.fail(
                IrError::AxisMismatch {
                    op: OP,
                    axis,
                    lhs: ft.clone(),
                    rhs: t.clone(),
                },
                at,
            ));
        }
        dtype = DType::promote_compare(dtype, t.dtype).ok_or_else(|| {
            first.fail(
                IrError::DTypeMismatch {
                    op: OP,
                    lhs: ft.clone(),
                    rhs: t.clone(),
                },
                at,
            )
        })?;
    }
    let cast: Vec<Tensor> = parts.iter().map(|p| p.cast_at(dtype, at)).collect();
    if let [only] = cast.as_slice() {
        return Ok(only.clone());
    }
    Ok(join(&cast.iter().collect::<Vec<_>>(), axis, at))
}

/// The most parts one `Concat` node joins. Its kernel reads every part at every
/// position and keeps the one whose range holds it, so the cost per element grows with
/// the parts: longer joins (an unrolled RNN stacks one part per time step) become a tree
/// of joins of [`GROUP`] parts, each stored. 313 parts in one node (below the 256
/// operands a node can have, would it not be for this) took 16 ms of silero-vad's 70.
const MAX_PARTS: usize = 32;
/// The parts of one inner join of a tree.
const GROUP: usize = 16;

/// Parts joined by `Concat` nodes: one node up to [`MAX_PARTS`], a tree beyond.
fn join(parts: &[&Tensor], axis: usize, at: At) -> Tensor {
    if parts.len() <= MAX_PARTS {
        return Tensor::build(
            Op::Concat {
                axis,
                parts: parts.len(),
            },
            parts,
            at,
        );
    }
    let groups: Vec<Tensor> = parts
        .chunks(GROUP)
        .map(|c| match c {
            [one] => (*one).clone(),
            many => join(many, axis, at),
        })
        .collect();
    join(&groups.iter().collect::<Vec<_>>(), axis, at)
}

fn stack_at(parts: &[&Tensor], axis: i64, at: At) -> Result<Tensor, Tensor> {
    const OP: &str = "stack";
    let Some(&first) = parts.first() else {
        return Err(no_parts(OP, at));
    };
    let types = parts.iter().map(|p| ty(p)).collect::<Result<Vec<_>, _>>()?;
    let ft = &types[0];
    if let Some(t) = types.iter().find(|t| t.shape != ft.shape) {
        return Err(first.fail(
            IrError::ShapeMismatch {
                op: OP,
                lhs: ft.clone(),
                rhs: t.clone(),
            },
            at,
        ));
    }
    let axis = norm_axis(OP, axis, ft.shape.rank() + 1, ft).map_err(|e| first.fail(e, at))?;
    let expanded: Vec<Tensor> = parts
        .iter()
        .map(|p| p.view(ViewOp::ExpandDims(axis), at))
        .collect();
    let refs: Vec<&Tensor> = expanded.iter().collect();
    concat_at(&refs, axis as i64, at)
}
