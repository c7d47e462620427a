//! Scatters and N-D gathers (through flat indices and ndfuse's scatter-add), rearranging
//! operators (`DepthToSpace`, `SpaceToDepth`, `CenterCropPad`, `ReverseSequence`,
//! `Compress`), `Det`, and the activations with more than one spelling.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{DType, PadMode, SliceArg, Tensor};

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "ScatterElements",
        "reduction none (unique indices, as the spec requires) and add; negative indices",
    ),
    Support::new("ScatterND", "reduction none (unique indices) and add"),
    Support::new("GatherND", "batch_dims 0; negative indices"),
    Support::new("DepthToSpace", "DCR and CRD"),
    Support::new("SpaceToDepth", ""),
    Support::new("CenterCropPad", "axes"),
    Support::new("ReverseSequence", "lengths known at import time"),
    Support::new(
        "Compress",
        "condition known at import time; axis or flattened",
    ),
    Support::new("Det", "batched (the LAPACK level's LU)"),
    Support::new("Swish", "alpha"),
    Support::new("Asinh", "also Acosh, Atanh, as logarithms"),
    Support::new("Acosh", ""),
    Support::new("Atanh", ""),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "ScatterElements" | "Scatter" => scatter_elements(n),
        "ScatterND" => scatter_nd(n),
        "GatherND" => gather_nd(n),
        "DepthToSpace" => depth_to_space(n),
        "SpaceToDepth" => space_to_depth(n),
        "CenterCropPad" => center_crop_pad(n),
        "ReverseSequence" => reverse_sequence(n),
        "Compress" => compress(n),
        "Det" => n.input(0).map(|a| vec![ndfuse::linalg::det(a)]),
        "Swish" => n.input(0).and_then(|x| {
            let a = n.float_or("alpha", 1.0)?;
            Ok(vec![x.mul(x.mul(a).sigmoid())])
        }),
        "Asinh" => n
            .input(0)
            .map(|x| vec![x.add(x.mul(x).add(1.0).sqrt()).log()]),
        "Acosh" => n
            .input(0)
            .map(|x| vec![x.add(x.mul(x).sub(1.0).sqrt()).log()]),
        "Atanh" => n
            .input(0)
            .map(|x| vec![x.add(1.0).div(x.neg().add(1.0)).log().mul(0.5)]),
        _ => return None,
    })
}

fn strides(dims: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as i64;
    }
    s
}

/// `data` with `updates` written (or added) at flat positions `flat` (any shape, i64).
fn scatter_flat(n: &Node, data: &Tensor, flat: &Tensor, updates: &Tensor) -> Result<Tensor> {
    let dims = n.shape(0)?;
    let total: usize = dims.iter().product();
    let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let flat = flat.reshape(&[-1]);
    let upd = updates.reshape(&[-1]).cast(n.dtype(0)?);
    let reduction = n.string("reduction")?.unwrap_or_else(|| "none".into());
    let flat_data = data.reshape(&[total as i64]);
    Ok(match reduction.as_str() {
        "add" => flat_data.index_add(&flat, &upd, 0).reshape(&shape),
        "none" => {
            let dt = n.dtype(0)?;
            let zeros = n.ctx.full_dtype(
                &[total],
                0.0,
                if dt == DType::Bool { DType::I32 } else { dt },
            );
            let upd = if dt == DType::Bool {
                upd.cast(DType::I32)
            } else {
                upd
            };
            let written = zeros.index_add(&flat, &upd, 0);
            let ones =
                n.ctx
                    .full_dtype(&[flat.shape().map(|s| s[0]).unwrap_or(0)], 1.0, DType::I32);
            let hit = n
                .ctx
                .full_dtype(&[total], 0.0, DType::I32)
                .index_add(&flat, &ones, 0)
                .gt(0);
            let written = if dt == DType::Bool {
                written.ne(0)
            } else {
                written
            };
            hit.where_(written, &flat_data).reshape(&shape)
        }
        other => return Err(n.unsupported(format!("reduction='{other}'"))),
    })
}

fn scatter_elements(n: &Node) -> Result<Vec<Tensor>> {
    let (data, idx, upd) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dims = n.shape(0)?;
    let idims = n.shape(1)?;
    let rank = dims.len();
    let axis = n.axis(n.int_or("axis", 0)?, rank)?;
    if idims.len() != rank {
        return Err(n.bad(format!(
            "indices of rank {} for data of rank {rank}",
            idims.len()
        )));
    }
    let st = strides(&dims);
    let idx = idx.cast(DType::I64);
    let idx = idx.lt(0).where_(idx.add(dims[axis] as i64), &idx);
    let mut flat = idx.mul(st[axis]);
    for a in (0..rank).filter(|&a| a != axis) {
        let mut shape = vec![1i64; rank];
        shape[a] = idims[a] as i64;
        let coord = n
            .ctx
            .arange_n(idims[a])
            .cast(DType::I64)
            .reshape(&shape)
            .mul(st[a]);
        flat = flat.add(coord);
    }
    Ok(vec![scatter_flat(n, data, &flat, upd)?])
}

/// Flat positions of the index tuples in the last axis of `idx` into `dims`' first
/// `k` axes, times the inner size.
fn nd_flat(n: &Node, idx: &Tensor, dims: &[usize], k: usize) -> Result<Tensor> {
    let st = strides(&dims[..k]);
    let idims = idx.shape().map(<[usize]>::to_vec).unwrap_or_default();
    let r = idims.len();
    let idx = idx.cast(DType::I64);
    let mut flat: Option<Tensor> = None;
    for (j, &s) in st.iter().enumerate() {
        let mut args = vec![SliceArg::all(); r - 1];
        args.push(SliceArg::new(Some(j as i64), Some(j as i64 + 1), 1));
        let c = idx.slice(&args).squeeze(&[r as i64 - 1]);
        let c = c.lt(0).where_(c.add(dims[j] as i64), &c).mul(s);
        flat = Some(match flat {
            Some(f) => f.add(c),
            None => c,
        });
    }
    flat.ok_or_else(|| n.bad("index tuples of length 0"))
}

fn scatter_nd(n: &Node) -> Result<Vec<Tensor>> {
    let (data, idx, upd) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dims = n.shape(0)?;
    let idims = n.shape(1)?;
    let k = *idims.last().ok_or_else(|| n.bad("indices of rank 0"))?;
    if k > dims.len() {
        return Err(n.bad(format!(
            "index tuples of length {k} for data of rank {}",
            dims.len()
        )));
    }
    let inner: usize = dims[k..].iter().product();
    let flat = nd_flat(n, idx, &dims, k)?.reshape(&[-1]);
    let m = flat.shape().map(|s| s[0]).unwrap_or(0);
    // Rows of `inner` elements: scatter whole rows through the flat element positions.
    let rows = flat.mul(inner as i64).reshape(&[m as i64, 1]);
    let cols = n
        .ctx
        .arange_n(inner)
        .cast(DType::I64)
        .reshape(&[1, inner as i64]);
    let elem = rows.add(cols);
    Ok(vec![scatter_flat(n, data, &elem, upd)?])
}

fn gather_nd(n: &Node) -> Result<Vec<Tensor>> {
    let (data, idx) = (n.input(0)?, n.input(1)?);
    if n.int_or("batch_dims", 0)? != 0 {
        return Err(n.unsupported("batch_dims != 0"));
    }
    let dims = n.shape(0)?;
    let idims = n.shape(1)?;
    let k = *idims.last().ok_or_else(|| n.bad("indices of rank 0"))?;
    if k > dims.len() {
        return Err(n.bad(format!(
            "index tuples of length {k} for data of rank {}",
            dims.len()
        )));
    }
    let outer: usize = dims[..k].iter().product();
    let mut rest: Vec<i64> = vec![outer as i64];
    rest.extend(dims[k..].iter().map(|&d| d as i64));
    let flat = nd_flat(n, idx, &dims, k)?;
    Ok(vec![data.reshape(&rest).take(&flat, 0)])
}

/// `[N, C, H, W]` and the block size of a `DepthToSpace` / `SpaceToDepth` node.
fn blocks(n: &Node) -> Result<([i64; 4], i64)> {
    let d = n.shape(0)?;
    if d.len() != 4 {
        return Err(n.bad(format!("input of rank {} (needs [N, C, H, W])", d.len())));
    }
    let b = n
        .int("blocksize")?
        .ok_or_else(|| n.bad("attribute 'blocksize' is required"))?;
    if b <= 0 {
        return Err(n.bad(format!("blocksize {b}")));
    }
    Ok(([d[0] as i64, d[1] as i64, d[2] as i64, d[3] as i64], b))
}

fn depth_to_space(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let ([nb, c, h, w], b) = blocks(n)?;
    if c % (b * b) != 0 {
        return Err(n.bad(format!("blocksize {b} for {c} channels")));
    }
    let crd = n.string("mode")?.as_deref() == Some("CRD");
    let y = if crd {
        x.reshape(&[nb, c / (b * b), b, b, h, w])
            .permute(&[0, 1, 4, 2, 5, 3])
    } else {
        x.reshape(&[nb, b, b, c / (b * b), h, w])
            .permute(&[0, 3, 4, 1, 5, 2])
    };
    Ok(vec![y.reshape(&[nb, c / (b * b), h * b, w * b])])
}

fn space_to_depth(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let ([nb, c, h, w], b) = blocks(n)?;
    if h % b != 0 || w % b != 0 {
        return Err(n.bad(format!("blocksize {b} for {h}x{w}")));
    }
    let y = x
        .reshape(&[nb, c, h / b, b, w / b, b])
        .permute(&[0, 3, 5, 1, 2, 4]);
    Ok(vec![y.reshape(&[nb, c * b * b, h / b, w / b])])
}

fn center_crop_pad(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let rank = dims.len();
    let shape = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input 1 (shape) is required"))?;
    let axes: Vec<usize> = match n.ints("axes")? {
        Some(a) => a.iter().map(|&a| n.axis(a, rank)).collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if axes.len() != shape.len() {
        return Err(n.bad(format!("{} extents for {} axes", shape.len(), axes.len())));
    }
    let mut crop = vec![SliceArg::all(); rank];
    let mut widths = vec![(0usize, 0usize); rank];
    for (&a, &want) in axes.iter().zip(&shape) {
        let (dim, want) = (dims[a] as i64, want.max(0));
        if want < dim {
            let start = (dim - want) / 2;
            crop[a] = SliceArg::new(Some(start), Some(start + want), 1);
        } else if want > dim {
            let before = (want - dim) / 2;
            widths[a] = (before as usize, (want - dim - before) as usize);
        }
    }
    Ok(vec![x.slice(&crop).pad(&widths, PadMode::Constant, 0.0)])
}

fn reverse_sequence(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let dims = n.shape(0)?;
    let lens = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input 1 (sequence_lens) is required"))?;
    let tax = n.int_or("time_axis", 0)? as usize;
    let bax = n.int_or("batch_axis", 1)? as usize;
    if dims.len() < 2 || tax > 1 || bax > 1 || tax == bax {
        return Err(n.bad("time_axis and batch_axis must be 0 and 1 in some order"));
    }
    let (t, b) = (dims[tax], dims[bax]);
    if lens.len() != b {
        return Err(n.bad(format!("{} lengths for a batch of {b}", lens.len())));
    }
    // Source position along time for each (time, batch).
    let mut src = vec![0i64; t * b];
    for (j, &l) in lens.iter().enumerate() {
        let l = l.clamp(0, t as i64) as usize;
        for i in 0..t {
            let s = if i < l { l - 1 - i } else { i };
            let at = if tax == 0 { i * b + j } else { j * t + i };
            src[at] = s as i64;
        }
    }
    let mut ishape = vec![1usize; dims.len()];
    ishape[tax] = t;
    ishape[bax] = b;
    let idx = n
        .i64s(&src)?
        .reshape(&ishape.iter().map(|&d| d as i64).collect::<Vec<_>>());
    Ok(vec![x.take_along_axis(&idx.broadcast_to(&dims), tax as i64)])
}

fn compress(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let cond = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input 1 (condition) is required"))?;
    let dims = n.shape(0)?;
    let (src, axis) = match n.int("axis")? {
        Some(a) => (x.clone(), n.axis(a, dims.len())?),
        None => (x.reshape(&[-1]), 0),
    };
    let len = src.shape().map(|s| s[axis]).unwrap_or(0);
    let keep: Vec<i64> = cond
        .iter()
        .take(len)
        .enumerate()
        .filter(|(_, &c)| c != 0)
        .map(|(i, _)| i as i64)
        .collect();
    Ok(vec![src.take(&n.i64s(&keep)?, axis as i64)])
}
