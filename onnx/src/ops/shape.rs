//! Operators that move data without arithmetic: shapes, views, joins, gathers, padding,
//! constants and ranges.

use crate::error::Result;
use crate::node::Node;
use ndfuse::{Array, DType, PadMode, SliceArg, Tensor};

/// `Shape` (with `start`/`end`) and `Size`: known from the static shape.
pub fn shape_of(n: &Node) -> Result<Array> {
    let dims: Vec<i64> = n.shape(0)?.iter().map(|&d| d as i64).collect();
    if n.op() == "Size" {
        let size: i64 = dims.iter().product();
        return Array::from_vec(vec![size], &[]).map_err(|e| n.bad(e.to_string()));
    }
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(n.int_or("start", 0)?);
    let end = clamp(n.int_or("end", r)?);
    let v: Vec<i64> = if start < end {
        dims[start..end].to_vec()
    } else {
        vec![]
    };
    let len = v.len();
    Array::from_vec(v, &[len]).map_err(|e| n.bad(e.to_string()))
}

/// `Constant`: one of its value attributes.
pub fn constant(n: &Node) -> Result<Vec<Tensor>> {
    let a = if let Some(a) = n.tensor_attr("value")? {
        a
    } else if let Some(v) = n.float("value_float")? {
        Array::from_vec(vec![v as f32], &[]).map_err(|e| n.bad(e.to_string()))?
    } else if let Some(v) = n.floats("value_floats")? {
        let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        let len = f.len();
        Array::from_vec(f, &[len]).map_err(|e| n.bad(e.to_string()))?
    } else if let Some(v) = n.int("value_int")? {
        Array::from_vec(vec![v], &[]).map_err(|e| n.bad(e.to_string()))?
    } else if let Some(v) = n.ints("value_ints")? {
        let len = v.len();
        Array::from_vec(v, &[len]).map_err(|e| n.bad(e.to_string()))?
    } else if n.has("sparse_value") {
        return Err(n.unsupported("attribute 'sparse_value'"));
    } else if n.has("value_string") || n.has("value_strings") {
        return Err(n.unsupported("string tensors"));
    } else {
        return Err(n.bad("no value attribute"));
    };
    Ok(vec![n.tensor(&a)])
}

/// `ConstantOfShape`: a fill of the shape given as a known input.
pub fn constant_of_shape(n: &Node) -> Result<Vec<Tensor>> {
    let dims = n
        .ints_input(0)?
        .ok_or_else(|| n.bad("input 0 (the shape) is required"))?;
    let dims = to_dims(n, &dims)?;
    let (value, dtype) = match n.tensor_attr("value")? {
        Some(a) => (a.to_f64_vec().first().copied().unwrap_or(0.0), a.dtype()),
        None => (0.0, DType::F32),
    };
    Ok(vec![n.ctx.full_dtype(&dims, value, dtype)])
}

fn to_dims(n: &Node, v: &[i64]) -> Result<Vec<usize>> {
    v.iter()
        .map(|&d| usize::try_from(d).map_err(|_| n.bad(format!("negative extent in {v:?}"))))
        .collect()
}

/// `Reshape`: `0` copies the input's extent (unless `allowzero`), `-1` is inferred.
pub fn reshape(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let target = match n.ints("shape")? {
        Some(s) if n.opset < 5 => s,
        _ => n
            .ints_input(1)?
            .ok_or_else(|| n.bad("input 1 (the shape) is required"))?,
    };
    let allowzero = n.int_or("allowzero", 0)? != 0;
    let mut shape = Vec::with_capacity(target.len());
    for (i, &d) in target.iter().enumerate() {
        shape.push(if d == 0 && !allowzero {
            *dims
                .get(i)
                .ok_or_else(|| n.bad(format!("shape {target:?}: 0 at axis {i} copies nothing")))?
                as i64
        } else {
            d
        });
    }
    Ok(vec![x.reshape(&shape)])
}

/// `Flatten`: the axes before `axis` and from it on, each into one.
pub fn flatten(n: &Node) -> Result<Vec<Tensor>> {
    let dims = n.shape(0)?;
    let axis = n.int_or("axis", 1)?;
    let a = if axis < 0 {
        axis + dims.len() as i64
    } else {
        axis
    };
    if !(0..=dims.len() as i64).contains(&a) {
        return Err(n.bad(format!("axis {axis} for rank {}", dims.len())));
    }
    let outer: usize = dims[..a as usize].iter().product();
    let inner: usize = dims[a as usize..].iter().product();
    Ok(vec![n.input(0)?.reshape(&[outer as i64, inner as i64])])
}

/// `Transpose`: `perm`, or the axes reversed.
pub fn transpose(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let r = n.shape(0)?.len() as i64;
    let perm = n.ints("perm")?.unwrap_or_else(|| (0..r).rev().collect());
    Ok(vec![x.permute(&perm)])
}

fn axes_arg(n: &Node, input: usize) -> Result<Option<Vec<i64>>> {
    match n.ints("axes")? {
        Some(a) => Ok(Some(a)),
        None => n.ints_input(input),
    }
}

/// `Squeeze`: the given axes, or every axis of extent 1.
pub fn squeeze(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    Ok(vec![match axes_arg(n, 1)? {
        Some(a) => x.squeeze(&a),
        None => x.squeeze_all(),
    }])
}

/// `Unsqueeze`: size-1 axes at positions of the result.
pub fn unsqueeze(n: &Node) -> Result<Vec<Tensor>> {
    let rank = n.shape(0)?.len();
    let axes = axes_arg(n, 1)?.ok_or_else(|| n.bad("axes are required"))?;
    let out_rank = rank + axes.len();
    let mut norm: Vec<usize> = axes
        .iter()
        .map(|&a| n.axis(a, out_rank))
        .collect::<Result<_>>()?;
    norm.sort_unstable();
    if norm.windows(2).any(|w| w[0] == w[1]) {
        return Err(n.bad(format!("axes {axes:?} repeat an axis")));
    }
    let mut y = n.input(0)?.clone();
    for a in norm {
        y = y.expand_dims(a as i64);
    }
    Ok(vec![y])
}

/// Numpy's broadcast of two shapes.
fn broadcast(n: &Node, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let out = super::elementwise::broadcast_shape(a, b);
    let fits = |s: &[usize]| {
        s.iter()
            .rev()
            .zip(out.iter().rev())
            .all(|(&x, &o)| x == o || x == 1)
    };
    if fits(a) && fits(b) {
        Ok(out)
    } else {
        Err(n.bad(format!("shapes {a:?} and {b:?} do not broadcast")))
    }
}

/// `Expand`: broadcast to the shape given (itself broadcast with the input's).
pub fn expand(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let want = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input 1 (the shape) is required"))?;
    let want = to_dims(n, &want)?;
    let shape = broadcast(n, &n.shape(0)?, &want)?;
    Ok(vec![x.broadcast_to(&shape)])
}

/// `Tile`: each axis repeated, as a broadcast view and a reshape.
pub fn tile(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let reps = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input 1 (repeats) is required"))?;
    if reps.len() != dims.len() {
        return Err(n.bad(format!("{} repeats for rank {}", reps.len(), dims.len())));
    }
    let reps = to_dims(n, &reps)?;
    let mut y = x.clone();
    let mut wide = Vec::new();
    for (i, &d) in dims.iter().enumerate() {
        y = y.expand_dims((2 * i) as i64);
        wide.push(reps[i]);
        wide.push(d);
    }
    let out: Vec<i64> = dims
        .iter()
        .zip(&reps)
        .map(|(&d, &r)| (d * r) as i64)
        .collect();
    Ok(vec![y.broadcast_to(&wide).reshape(&out)])
}

/// `Concat` along `axis`.
pub fn concat(n: &Node) -> Result<Vec<Tensor>> {
    let ins = n.all_inputs()?;
    let rank = n.shape(0)?.len();
    let axis = n.axis(
        n.int("axis")?
            .ok_or_else(|| n.bad("attribute 'axis' is required"))?,
        rank,
    )?;
    // Empty parts join nothing (the suite concatenates a [0] with others).
    let parts: Vec<&Tensor> = ins
        .iter()
        .copied()
        .filter(|t| {
            t.shape()
                .map(|s| s.get(axis).copied() != Some(0))
                .unwrap_or(true)
        })
        .collect();
    if parts.is_empty() {
        return Ok(vec![ins[0].clone()]);
    }
    Ok(vec![ndfuse::concat(&parts, axis as i64)])
}

/// `Split` into `split` sizes (attribute or input), `num_outputs` parts, or as many
/// equal parts as the node has outputs.
pub fn split(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let axis = n.axis(n.int_or("axis", 0)?, dims.len())?;
    let len = dims[axis];
    let sizes = match n.ints("split")? {
        Some(s) => s,
        None => match n.ints_input(1)? {
            Some(s) => s,
            None => {
                let parts = n
                    .int("num_outputs")?
                    .unwrap_or(n.proto.output.len() as i64)
                    .max(1) as usize;
                let each = len.div_ceil(parts);
                (0..parts)
                    .map(|i| each.min(len.saturating_sub(i * each)) as i64)
                    .collect()
            }
        },
    };
    if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != len as i64 {
        return Err(n.bad(format!(
            "split sizes {sizes:?} do not add up to the axis' {len}"
        )));
    }
    let mut outs = Vec::with_capacity(sizes.len());
    let mut at = 0i64;
    for s in sizes {
        let mut args = vec![SliceArg::all(); axis];
        args.push(SliceArg::new(Some(at), Some(at + s), 1));
        outs.push(x.slice(&args));
        at += s;
    }
    Ok(outs)
}

/// `Slice` with starts, ends, axes and steps (inputs from opset 10, attributes before).
pub fn slice(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let rank = n.shape(0)?.len();
    let (starts, ends, axes, steps) = if n.opset < 10 {
        (
            n.ints("starts")?.unwrap_or_default(),
            n.ints("ends")?.unwrap_or_default(),
            n.ints("axes")?,
            None,
        )
    } else {
        (
            n.ints_input(1)?.unwrap_or_default(),
            n.ints_input(2)?.unwrap_or_default(),
            n.ints_input(3)?,
            n.ints_input(4)?,
        )
    };
    if starts.len() != ends.len() {
        return Err(n.bad(format!("{} starts and {} ends", starts.len(), ends.len())));
    }
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    let mut args = vec![SliceArg::all(); rank];
    for (i, &a) in axes.iter().enumerate() {
        let a = n.axis(a, rank)?;
        let step = *steps.get(i).ok_or_else(|| n.bad("fewer steps than axes"))?;
        if step == 0 {
            return Err(n.bad("a step of 0"));
        }
        args[a] = SliceArg::new(Some(starts[i]), Some(ends[i]), step);
    }
    Ok(vec![x.slice(&args)])
}

/// `Gather` (numpy's take) and `GatherElements` (take_along_axis).
pub fn gather(n: &Node) -> Result<Vec<Tensor>> {
    let (x, idx) = (n.input(0)?, n.input(1)?);
    let dims = n.shape(0)?;
    let axis = n.axis(n.int_or("axis", 0)?, dims.len())?;
    if n.op() == "Gather" {
        return Ok(vec![x.take(idx, axis as i64)]);
    }
    // GatherElements: indices may be shorter than the data on the other axes.
    let idims = n.shape(1)?;
    if idims.len() != dims.len() {
        return Err(n.bad(format!(
            "indices of rank {} for data of rank {}",
            idims.len(),
            dims.len()
        )));
    }
    let args: Vec<SliceArg> = (0..dims.len())
        .map(|a| {
            if a == axis {
                SliceArg::all()
            } else {
                SliceArg::new(Some(0), Some(idims[a] as i64), 1)
            }
        })
        .collect();
    let idx = wrap_negative(idx, dims[axis]);
    Ok(vec![x.slice(&args).take_along_axis(&idx, axis as i64)])
}

fn wrap_negative(idx: &Tensor, n: usize) -> Tensor {
    idx.lt(0).where_(idx.add(n as i64), idx)
}

/// `Pad`: constant, edge or reflect; negative widths crop.
pub fn pad(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let rank = dims.len();
    let mode = n.string("mode")?.unwrap_or_else(|| "constant".into());
    let wrap = mode == "wrap";
    let mode = match mode.as_str() {
        "constant" | "wrap" => PadMode::Constant,
        "edge" => PadMode::Edge,
        "reflect" => PadMode::Reflect,
        other => return Err(n.unsupported(format!("mode='{other}'"))),
    };
    let (pads, value, axes) = if n.opset < 11 {
        (
            n.ints("pads")?
                .ok_or_else(|| n.bad("attribute 'pads' is required"))?,
            n.float_or("value", 0.0)?,
            None,
        )
    } else {
        let pads = n
            .ints_input(1)?
            .ok_or_else(|| n.bad("input 1 (pads) is required"))?;
        let value = n
            .floats_input(2)?
            .and_then(|v| v.first().copied())
            .unwrap_or(0.0);
        (pads, value, n.ints_input(3)?)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| n.axis(a, rank)).collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(n.bad(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    let k = axes.len();
    let mut widths = vec![(0usize, 0usize); rank];
    let mut crop = vec![SliceArg::all(); rank];
    let mut cropped = false;
    for (i, &a) in axes.iter().enumerate() {
        let (b, e) = (pads[i], pads[i + k]);
        widths[a] = (b.max(0) as usize, e.max(0) as usize);
        if b < 0 || e < 0 {
            cropped = true;
            let stop = dims[a] as i64 + e.min(0);
            crop[a] = SliceArg::new(Some(-b.min(0)), Some(stop), 1);
        }
    }
    let x = if cropped { x.slice(&crop) } else { x.clone() };
    if wrap {
        return wrap_pad(n, &x, &widths);
    }
    Ok(vec![x.pad(&widths, mode, value)])
}

/// `Pad` with mode `wrap` (numpy's): each axis extended by its own far end, as a concat
/// of slices (a width may exceed the extent: the axis repeats).
fn wrap_pad(n: &Node, x: &Tensor, widths: &[(usize, usize)]) -> Result<Vec<Tensor>> {
    let mut y = x.clone();
    for (a, &(before, after)) in widths.iter().enumerate() {
        if before == 0 && after == 0 {
            continue;
        }
        let len = y.shape().map(|s| s[a]).unwrap_or(0);
        if len == 0 {
            return Err(n.bad(format!("wrap padding of the empty axis {a}")));
        }
        let take = |from: usize, count: usize| {
            let idx: Vec<i64> = (0..count).map(|i| ((from + i) % len) as i64).collect();
            n.i64s(&idx).map(|i| y.take(&i, a as i64))
        };
        let head = take((len - before % len) % len, before)?;
        let tail = take(0, after)?;
        y = ndfuse::concat(&[&head, &y, &tail], a as i64);
    }
    Ok(vec![y])
}

/// `Range(start, limit, delta)` with known scalars.
pub fn range(n: &Node) -> Result<Vec<Tensor>> {
    let d = n.dtype(0)?;
    if d.is_float() {
        let v = |i| -> Result<f64> {
            n.floats_input(i)?
                .and_then(|v| v.first().copied())
                .ok_or_else(|| n.bad(format!("input {i} is required")))
        };
        let (s, l, st) = (v(0)?, v(1)?, v(2)?);
        let count = ((l - s) / st).ceil().max(0.0) as usize;
        let vals: Vec<f64> = (0..count).map(|i| s + i as f64 * st).collect();
        let a = ndfuse_ir::HostArray::from_f64s(d, ndfuse_ir::Shape::from(&[count][..]), &vals);
        return Ok(vec![n.tensor(&Array::from_host(a))]);
    }
    let v = |i| -> Result<i64> {
        n.ints_input(i)?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| n.bad(format!("input {i} is required")))
    };
    let (s, l, st) = (v(0)?, v(1)?, v(2)?);
    if st == 0 {
        return Err(n.bad("delta 0"));
    }
    let count = ((l - s) as f64 / st as f64).ceil().max(0.0) as usize;
    let vals: Vec<i64> = (0..count as i64).map(|i| s + i * st).collect();
    Ok(vec![n.i64s(&vals)?.cast(d)])
}

/// `EyeLike`: ones on diagonal `k` of a 2-D shape.
pub fn eye_like(n: &Node) -> Result<Vec<Tensor>> {
    let dims = n.shape(0)?;
    if dims.len() != 2 {
        return Err(n.bad(format!("input of rank {} (EyeLike takes 2-D)", dims.len())));
    }
    let k = n.int_or("k", 0)?;
    let dtype = match n.int("dtype")? {
        Some(c) => crate::tensor::dtype_of(c as i32).map_err(|w| n.unsupported(w))?,
        None => n.dtype(0)?,
    };
    let rows = n
        .ctx
        .arange_n(dims[0])
        .cast(DType::I64)
        .reshape(&[dims[0] as i64, 1]);
    let cols = n
        .ctx
        .arange_n(dims[1])
        .cast(DType::I64)
        .reshape(&[1, dims[1] as i64]);
    Ok(vec![cols.sub(rows).eq(k).cast(dtype)])
}

/// `Trilu`: the lower or upper triangle from diagonal `k`.
pub fn trilu(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let k = n
        .ints_input(1)?
        .and_then(|v| v.first().copied())
        .unwrap_or(0);
    Ok(vec![if n.int_or("upper", 1)? != 0 {
        x.triu(k)
    } else {
        x.tril(k)
    }])
}

/// `OneHot(indices, depth, values)` along `axis`.
pub fn one_hot(n: &Node) -> Result<Vec<Tensor>> {
    let idx = n.input(0)?;
    let depth = n
        .floats_input(1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| n.bad("input 1 (depth) is required"))? as i64;
    let values = n.input(2)?;
    let rank = n.shape(0)?.len();
    let axis = n.axis(n.int_or("axis", -1)?, rank + 1)?;
    let idx = idx.cast(DType::I64);
    let idx = idx.lt(0).where_(idx.add(depth), &idx);
    let classes = n.ctx.arange_n(depth as usize).cast(DType::I64);
    let mut shape = vec![1i64; rank + 1];
    shape[axis] = depth;
    let hot = idx.expand_dims(axis as i64).eq(classes.reshape(&shape));
    let off = values
        .slice(&[SliceArg::new(Some(0), Some(1), 1)])
        .reshape(&[]);
    let on = values
        .slice(&[SliceArg::new(Some(1), Some(2), 1)])
        .reshape(&[]);
    Ok(vec![hot.where_(on, off)])
}
