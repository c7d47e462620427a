//! Reductions, arg-reductions, the softmax family, scans and top-k.

use crate::error::Result;
use crate::node::Node;
use ndfuse::{DType, ReduceOp, SliceArg, Tensor};

/// `ReduceSum`, `ReduceMean`, ... with `axes` as attribute (or input: `ReduceSum` from
/// opset 13, the others from 18), `keepdims` and `noop_with_empty_axes`.
pub fn reduce(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let rank = n.shape(0)?.len();
    let keep = n.int_or("keepdims", 1)? != 0;
    let axes = match n.ints("axes")? {
        Some(a) => Some(a),
        None => n.ints_input(1)?,
    };
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&a| n.axis(a, rank)).collect::<Result<_>>()?,
        _ if n.int_or("noop_with_empty_axes", 0)? != 0 => return Ok(vec![x.clone()]),
        _ => (0..rank).collect(),
    };
    let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
    let dims = n.shape(0)?;
    let empty = axes.iter().any(|&a| dims[a] == 0);
    // Bool max/min are any/all: reduced as integers and cast back below.
    let as_int = n.dtype(0)? == DType::Bool;
    let x = &if as_int {
        x.cast(DType::I32)
    } else {
        x.clone()
    };
    let red = |op: ReduceOp, t: &Tensor| t.reduce(op, ax.as_slice(), keep);
    let t = match n.op() {
        "ReduceSum" => red(ReduceOp::Sum, x),
        "ReduceMean" => red(ReduceOp::Mean, x),
        "ReduceMax" if empty => empty_fill(n, x, &axes, keep, f64::NEG_INFINITY)?,
        "ReduceMin" if empty => empty_fill(n, x, &axes, keep, f64::INFINITY)?,
        "ReduceMax" => red(ReduceOp::Max, x),
        "ReduceMin" => red(ReduceOp::Min, x),
        "ReduceProd" => red(ReduceOp::Prod, x),
        "ReduceL1" => red(ReduceOp::Norm1, x),
        "ReduceL2" => red(ReduceOp::Norm2, x),
        "ReduceSumSquare" => red(ReduceOp::Sum, &x.mul(x)),
        "ReduceLogSum" => red(ReduceOp::Sum, x).log(),
        "ReduceLogSumExp" => {
            if empty {
                empty_fill(n, x, &axes, keep, f64::NEG_INFINITY)?
            } else {
                let m = x.reduce(ReduceOp::Max, ax.as_slice(), true);
                let s = x
                    .sub(&m)
                    .exp()
                    .reduce(ReduceOp::Sum, ax.as_slice(), true)
                    .log()
                    .add(&m);
                if keep {
                    s
                } else {
                    s.squeeze(&ax)
                }
            }
        }
        op => unreachable!("reduce() called for {op}"),
    };
    // Integer sums accumulate in i64; ONNX keeps the input's type.
    let d = n.dtype(0)?;
    Ok(vec![if t.dtype().ok() != Some(d) {
        t.cast(d)
    } else {
        t
    }])
}

/// A reduction over an empty axis: the identity of max/min (ONNX's reference gives the
/// lowest/highest value of the type).
fn empty_fill(n: &Node, x: &Tensor, axes: &[usize], keep: bool, v: f64) -> Result<Tensor> {
    let mut dims = n.shape(0)?;
    for &a in axes {
        dims[a] = 1;
    }
    let shape: Vec<usize> = if keep {
        dims
    } else {
        dims.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    Ok(n.ctx.full_dtype(&shape, v, x.dtype().unwrap_or(DType::F32)))
}

/// `ArgMax`, `ArgMin` with `keepdims` and `select_last_index`.
pub fn arg(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let axis = n.axis(n.int_or("axis", 0)?, dims.len())?;
    let keep = n.int_or("keepdims", 1)? != 0;
    let last = n.int_or("select_last_index", 0)? != 0;
    let max = n.op() == "ArgMax";
    let (x, flip) = if last {
        let mut args = vec![SliceArg::all(); dims.len()];
        args[axis] = SliceArg::new(None, None, -1);
        (x.slice(&args), true)
    } else {
        (x.clone(), false)
    };
    let mut i = match (max, keep) {
        (true, true) => x.argmax_keepdims(axis as i64),
        (true, false) => x.argmax(axis as i64),
        (false, true) => x.argmin_keepdims(axis as i64),
        (false, false) => x.argmin(axis as i64),
    };
    if flip {
        i = i.neg().add(dims[axis] as i64 - 1);
    }
    Ok(vec![i.cast(DType::I64)])
}

/// `Softmax`, `LogSoftmax`, `Hardmax`: over one axis from opset 13, over the flattened
/// axes from `axis` on before it (default axis 1).
pub fn softmax(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let rank = dims.len();
    let legacy = n.opset < 13;
    let axis = n.axis(n.int_or("axis", if legacy { 1 } else { -1 })?, rank)?;
    let (t, back) = if legacy {
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis..].iter().product();
        (x.reshape(&[outer as i64, inner as i64]), true)
    } else {
        (x.clone(), false)
    };
    let ax = if legacy { 1 } else { axis as i64 };
    let y = match n.op() {
        "Softmax" => t.softmax(ax),
        "LogSoftmax" => t.log_softmax(ax),
        _ => {
            // Hardmax: 1 at the first maximum.
            let i = t.argmax_keepdims(ax).cast(DType::I64);
            let len = t.shape().map(|s| s[ax as usize]).unwrap_or(1);
            let r = t.rank().unwrap_or(1);
            let mut shape = vec![1i64; r];
            shape[ax as usize] = len as i64;
            let pos = n.ctx.arange_n(len).cast(DType::I64).reshape(&shape);
            i.eq(pos).cast(n.dtype(0)?)
        }
    };
    let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    Ok(vec![if back { y.reshape(&shape) } else { y }])
}

/// `CumSum` with `exclusive` and `reverse`.
pub fn cumsum(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let axis = n
        .ints_input(1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| n.bad("input 1 (axis) is required"))?;
    let axis = n.axis(axis, dims.len())?;
    let exclusive = n.int_or("exclusive", 0)? != 0;
    let reverse = n.int_or("reverse", 0)? != 0;
    let flip = |t: &Tensor| {
        let mut args = vec![SliceArg::all(); dims.len()];
        args[axis] = SliceArg::new(None, None, -1);
        t.slice(&args)
    };
    let t = if reverse { flip(x) } else { x.clone() };
    let mut s = t.cumsum(axis as i64);
    if exclusive {
        s = s.sub(&t);
    }
    if reverse {
        s = flip(&s);
    }
    let d = n.dtype(0)?;
    Ok(vec![if s.dtype().ok() != Some(d) {
        s.cast(d)
    } else {
        s
    }])
}

/// `TopK(x, k)` along `axis`, largest or smallest, sorted.
pub fn top_k(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let rank = dims.len();
    let axis = n.axis(n.int_or("axis", -1)?, rank)?;
    let k = if n.opset < 10 {
        n.int("k")?
            .ok_or_else(|| n.bad("attribute 'k' is required"))?
    } else {
        n.ints_input(1)?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| n.bad("input 1 (k) is required"))?
    };
    let k = usize::try_from(k).map_err(|_| n.bad(format!("k = {k}")))?;
    let largest = n.int_or("largest", 1)? != 0;
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    perm.swap(axis, rank - 1);
    let t = if axis == rank - 1 {
        x.clone()
    } else {
        x.permute(&perm)
    };
    let (v, i) = if largest {
        t.top_k(k)
    } else {
        let (v, i) = t.neg().top_k(k);
        (v.neg(), i)
    };
    let back = |t: Tensor| {
        if axis == rank - 1 {
            t
        } else {
            t.permute(&perm)
        }
    };
    Ok(vec![back(v), back(i.cast(DType::I64))])
}
