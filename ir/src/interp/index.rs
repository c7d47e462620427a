//! Indexed reads and writes: gather (with numpy's wrap of negative indices and an error
//! for any index outside `-n..n`), scatter-add, concat, pad and iota, on contiguous
//! tensors.

use super::error::InterpError;
use super::vals::{Tensor, Vals};
use crate::dtype::{DType, Scalar};
use crate::op::PadMode;
use crate::round::{round_f64, wrap_int};
use crate::shape::Shape;

/// The index `k` along an axis of extent `n`, wrapped when negative; the error names
/// the op, the axis, the value and the position of the index in its tensor.
pub(super) fn wrap_index(
    op: &'static str,
    axis: usize,
    k: i64,
    n: usize,
    at: impl FnOnce() -> Vec<usize>,
) -> Result<usize, InterpError> {
    let n_i = n as i64;
    let w = if k < 0 { k + n_i } else { k };
    if (0..n_i).contains(&w) {
        Ok(w as usize)
    } else {
        Err(InterpError::IndexOutOfRange {
            op,
            axis,
            value: k,
            position: at(),
            extent: n,
        })
    }
}

fn ints(v: &Vals) -> &[i64] {
    match v {
        Vals::I(v) => v,
        _ => unreachable!("indices are integers (infer checks)"),
    }
}

/// For each index of `idx` (in its row-major order), the offset into `x` it names:
/// the index's own position with its `axis` coordinate replaced by the index, wrapped
/// when negative; an index outside `-n..n` is `op`'s error.
fn indexed_offsets(
    op: &'static str,
    x: &Shape,
    idx: &Tensor,
    axis: usize,
) -> Result<Vec<usize>, InterpError> {
    let (_, n, inner) = x.around_axis(axis);
    let (_, m, _) = idx.shape.around_axis(axis);
    let ks = ints(&idx.vals);
    let mut offsets = Vec::with_capacity(ks.len());
    for (p, &k) in ks.iter().enumerate() {
        let (o, i) = (p / (m * inner).max(1), p % inner.max(1));
        let kk = wrap_index(op, axis, k, n, || idx.shape.unravel(p))?;
        offsets.push((o * n + kk) * inner + i);
    }
    Ok(offsets)
}

/// `out[p] = x[p with p[axis] := idx[p]]`.
pub(super) fn gather(x: &Tensor, idx: &Tensor, axis: usize) -> Result<Vals, InterpError> {
    let offsets = indexed_offsets("gather", &x.shape, idx, axis)?;
    Ok(x.vals.gather(offsets.into_iter()))
}

/// `x` with `v[p]` added at `p with p[axis] := idx[p]`, in increasing position order;
/// floats accumulate in f64 and round once to `dtype`, integers wrap to it.
pub(super) fn scatter_add(
    x: &Tensor,
    idx: &Tensor,
    v: &Tensor,
    axis: usize,
    dtype: DType,
) -> Result<Vals, InterpError> {
    let targets = indexed_offsets("scatter_add", &x.shape, idx, axis)?;
    Ok(match (&x.vals, &v.vals) {
        (Vals::F(xs), Vals::F(vs)) => {
            let mut out = xs.clone();
            for (&t, &a) in targets.iter().zip(vs) {
                out[t] += a;
            }
            Vals::F(out.into_iter().map(|a| round_f64(a, dtype)).collect())
        }
        (Vals::I(xs), Vals::I(vs)) => {
            let mut out = xs.clone();
            for (&t, &a) in targets.iter().zip(vs) {
                out[t] = out[t].wrapping_add(a);
            }
            Vals::I(out.into_iter().map(|a| wrap_int(a, dtype)).collect())
        }
        _ => unreachable!("scatter_add's data and values share a numeric dtype (infer checks)"),
    })
}

/// The parts joined along `axis` (`out` is the result's shape): all of them one after
/// the other, read in the result's order.
pub(super) fn concat(parts: &[&Tensor], axis: usize, out: &Shape) -> Vals {
    let (outer, _, inner) = out.around_axis(axis);
    let mut all = parts[0].vals.clone();
    let mut starts = vec![0];
    for part in &parts[1..] {
        starts.push(all.len());
        all.extend(&part.vals);
    }
    let offsets = (0..outer).flat_map(|o| {
        parts.iter().zip(&starts).flat_map(move |(part, &start)| {
            let run = part.shape.dims()[axis] * inner;
            (0..run).map(move |j| start + o * run + j)
        })
    });
    all.gather(offsets)
}

/// Where position `c` of a padded axis reads its operand of extent `n` padded by `lo`
/// before: `Some(index)`, or `None` for the constant fill.
pub fn pad_source(mode: PadMode, c: usize, lo: usize, n: usize) -> Option<usize> {
    let k = c as i64 - lo as i64;
    let last = n as i64 - 1;
    let inside = (0..n as i64).contains(&k);
    match mode {
        PadMode::Constant => inside.then_some(k as usize),
        PadMode::Edge => Some(k.clamp(0, last.max(0)) as usize),
        // Widths are at most n - 1 (infer checks), so one reflection reaches every
        // position: -k for k < 0, 2 * last - k past the end.
        PadMode::Reflect => Some((last - (last - k.abs()).abs()) as usize),
    }
}

/// `x` padded by `widths` in `mode` (the fill `value` for the constant mode).
pub(super) fn pad(
    x: &Tensor,
    widths: &[(usize, usize)],
    mode: PadMode,
    value: Scalar,
    out: &Shape,
    dtype: DType,
) -> Vals {
    let strides = x.shape.contiguous_strides();
    let source = |p: usize| -> Option<usize> {
        let idx = out.unravel(p);
        let mut off = 0isize;
        for (a, &c) in idx.iter().enumerate() {
            let k = pad_source(mode, c, widths[a].0, x.shape.dims()[a])?;
            off += k as isize * strides[a];
        }
        Some(off as usize)
    };
    let fill = Vals::fill(value, dtype, dtype, 1);
    let n = out.numel();
    match (&x.vals, fill) {
        (Vals::F(v), Vals::F(f)) => {
            Vals::F((0..n).map(|p| source(p).map_or(f[0], |o| v[o])).collect())
        }
        (Vals::I(v), Vals::I(f)) => {
            Vals::I((0..n).map(|p| source(p).map_or(f[0], |o| v[o])).collect())
        }
        (Vals::B(v), Vals::B(f)) => {
            Vals::B((0..n).map(|p| source(p).map_or(f[0], |o| v[o])).collect())
        }
        _ => unreachable!("the fill has the operand's dtype (infer checks)"),
    }
}

/// `start + step * i` for `i` in `0..len`.
pub(super) fn iota(len: usize, start: i64, step: i64) -> Vals {
    Vals::I((0..len as i64).map(|i| start + step * i).collect())
}
