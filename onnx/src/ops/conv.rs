//! Convolutions, pooling and normalizations: `Conv` and `ConvTranspose` through the
//! frontend's convolutions, pools through host-computed window gathers, and the
//! normalizations (batch, instance, layer, group, RMS, Lp, MVN, LRN) as reductions.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{Conv, DType, PadMode, Padding, Pool, SliceArg, Spatial, Tensor};

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "Conv",
        "1-D, 2-D and 3-D (3-D as 2-D convolutions summed over the depth taps); auto_pad \
         NOTSET/SAME_UPPER/SAME_LOWER/VALID, asymmetric pads, strides, dilations, group, \
         optional bias",
    ),
    Support::new(
        "ConvTranspose",
        "1-D, 2-D and 3-D as a stride-1 convolution of the zero-inserted input with the \
         flipped kernel; strides, pads, output_padding, output_shape, dilations, group, auto_pad",
    ),
    Support::new(
        "MaxPool",
        "any rank; kernel_shape, strides, pads (asymmetric too), ceil_mode, dilations, \
         auto_pad; the Indices output (storage_order 0 and 1)",
    ),
    Support::new(
        "AveragePool",
        "any rank; kernel_shape, strides, pads (asymmetric too), ceil_mode, \
         count_include_pad, dilations, auto_pad",
    ),
    Support::new(
        "LpPool",
        "any rank; p, kernel_shape, strides, pads, ceil_mode, dilations, auto_pad",
    ),
    Support::new("GlobalAveragePool", "any rank >= 3"),
    Support::new("GlobalMaxPool", "any rank >= 3"),
    Support::new("GlobalLpPool", "any rank >= 3; p"),
    Support::new(
        "BatchNormalization",
        "inference; training_mode=1 with batch statistics and the running mean/var outputs; \
         spatial=0 (opset < 9) is not supported",
    ),
    Support::new("InstanceNormalization", "epsilon"),
    Support::new(
        "LayerNormalization",
        "axis, epsilon, stash_type; the Mean and InvStdDev outputs",
    ),
    Support::new(
        "GroupNormalization",
        "num_groups, epsilon, stash_type; scale per group (18) or channel (21)",
    ),
    Support::new("RMSNormalization", "axis, epsilon, stash_type"),
    Support::new("LpNormalization", "axis, p = 1 or 2"),
    Support::new("MeanVarianceNormalization", "axes"),
    Support::new("LRN", "alpha, beta, bias, size"),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "Conv" => conv(n),
        "ConvTranspose" => conv_transpose(n),
        "MaxPool" | "AveragePool" | "LpPool" => pool(n),
        "MaxUnpool" => max_unpool(n),
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => global_pool(n),
        "BatchNormalization" => batch_norm(n),
        "InstanceNormalization" => instance_norm(n),
        "LayerNormalization" | "RMSNormalization" => layer_norm(n),
        "GroupNormalization" => group_norm(n),
        "LpNormalization" => lp_norm(n),
        "MeanVarianceNormalization" => mvn(n),
        "LRN" => lrn(n),
        _ => return None,
    })
}

/// An integer-list attribute of one value per spatial axis, `default` when absent.
fn per_axis(n: &Node, name: &str, r: usize, default: usize) -> Result<Vec<usize>> {
    match n.ints(name)? {
        None => Ok(vec![default; r]),
        // Only output_padding may be 0 (strides, dilations and kernels are at least 1).
        Some(v) if v.len() == r && v.iter().all(|&x| x >= i64::from(name != "output_padding")) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => Err(n.bad(format!("attribute '{name}' {v:?} for {r} spatial axes"))),
    }
}

/// The spatial rank of input `i` (`[N, C, spatial...]`).
fn spatial_rank(n: &Node, i: usize) -> Result<(Vec<usize>, usize)> {
    let s = n.shape(i)?;
    if s.len() < 3 {
        return Err(n.bad(format!("input {i} {s:?} must be [N, C, spatial...]")));
    }
    let r = s.len() - 2;
    Ok((s, r))
}

/// `auto_pad`, upper-cased (`NOTSET` when absent).
fn auto_pad(n: &Node) -> Result<String> {
    let a = n.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    match a.as_str() {
        "NOTSET" | "SAME_UPPER" | "SAME_LOWER" | "VALID" => Ok(a),
        "" => Ok("NOTSET".into()),
        other => Err(n.bad(format!("auto_pad '{other}'"))),
    }
}

/// The explicit `pads` attribute as (begin, end) pairs, zeros when absent.
fn pads_attr(n: &Node, r: usize) -> Result<Vec<(i64, i64)>> {
    match n.ints("pads")? {
        None => Ok(vec![(0, 0); r]),
        Some(p) if p.len() == 2 * r => Ok((0..r).map(|i| (p[i], p[i + r])).collect()),
        Some(p) => Err(n.bad(format!("pads {p:?} for {r} spatial axes (need {})", 2 * r))),
    }
}

/// `SAME_*` padding: the output `ceil(in / stride)` long, the odd pad after (`UPPER`)
/// or before (`LOWER`).
fn same_pads(upper: bool, input: usize, k: usize, s: usize, d: usize) -> (i64, i64) {
    let out = input.div_ceil(s);
    let span = d * (k.max(1) - 1) + 1;
    let total = ((out.max(1) - 1) * s + span).saturating_sub(input) as i64;
    if upper {
        (total / 2, total - total / 2)
    } else {
        (total - total / 2, total / 2)
    }
}

/// The (begin, end) pads of a window op over `spatial` with `kernel`.
fn window_pads(
    n: &Node,
    spatial: &[usize],
    kernel: &[usize],
    s: &[usize],
    d: &[usize],
) -> Result<Vec<(i64, i64)>> {
    let r = spatial.len();
    Ok(match auto_pad(n)?.as_str() {
        "VALID" => vec![(0, 0); r],
        a @ ("SAME_UPPER" | "SAME_LOWER") => (0..r)
            .map(|i| same_pads(a == "SAME_UPPER", spatial[i], kernel[i], s[i], d[i]))
            .collect(),
        _ => pads_attr(n, r)?,
    })
}

fn conv(n: &Node) -> Result<Vec<Tensor>> {
    let (xs, r) = spatial_rank(n, 0)?;
    let ws = n.shape(1)?;
    if ws.len() != r + 2 {
        return Err(n.bad(format!("weights {ws:?} for input {xs:?}")));
    }
    let group = n.int_or("group", 1)?;
    if group < 1 {
        return Err(n.bad(format!("group {group}")));
    }
    let kernel = ws[2..].to_vec();
    if let Some(k) = n.ints("kernel_shape")? {
        if k.iter().zip(&kernel).any(|(&a, &b)| a != b as i64) || k.len() != r {
            return Err(n.bad(format!("kernel_shape {k:?} but the weights are {ws:?}")));
        }
    }
    let strides = per_axis(n, "strides", r, 1)?;
    let dilations = per_axis(n, "dilations", r, 1)?;
    let pads = window_pads(n, &xs[2..], &kernel, &strides, &dilations)?;
    let y = conv_nd(
        n,
        n.input(0)?,
        n.input(1)?,
        n.opt_input(2),
        &strides,
        &dilations,
        &pads,
        group as usize,
    )?;
    Ok(vec![y])
}

/// `x` with negative pads cropped (a slice), and the pads left (all >= 0).
fn crop(x: &Tensor, pads: &[(i64, i64)], spatial: &[usize]) -> (Tensor, Vec<(usize, usize)>) {
    let mut args = vec![SliceArg::all(); 2];
    let mut cropped = false;
    for (i, &(b, e)) in pads.iter().enumerate() {
        let stop = spatial[i] as i64 + e.min(0);
        cropped |= b < 0 || e < 0;
        args.push(SliceArg::new(Some(-b.min(0)), Some(stop), 1));
    }
    let x = if cropped { x.slice(&args) } else { x.clone() };
    (
        x,
        pads.iter()
            .map(|&(b, e)| (b.max(0) as usize, e.max(0) as usize))
            .collect(),
    )
}

/// A convolution of `x [N, C, s...]` with `w [O, C / group, k...]` for 1 to 3 spatial
/// axes; negative pads crop.
#[allow(clippy::too_many_arguments)]
fn conv_nd(
    n: &Node,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    strides: &[usize],
    dilations: &[usize],
    pads: &[(i64, i64)],
    group: usize,
) -> Result<Tensor> {
    let xs = n
        .check(x.clone())?
        .shape()
        .map(<[usize]>::to_vec)
        .unwrap_or_default();
    let r = xs.len().saturating_sub(2);
    let (x, pads) = crop(x, pads, &xs[2..]);
    let c = |s: &[usize], d: &[usize], p: Vec<(usize, usize)>| {
        Conv::new()
            .stride(Spatial(s.to_vec()))
            .dilation(Spatial(d.to_vec()))
            .padding(Padding::Explicit(p))
            .groups(group)
    };
    match r {
        1 => Ok(x.conv1d(w, b, &c(strides, dilations, pads))),
        2 => Ok(x.conv2d(w, b, &c(strides, dilations, pads))),
        3 => {
            // The depth axis as a sum of 2-D convolutions, one per depth tap.
            let ws = n
                .check(w.clone())?
                .shape()
                .map(<[usize]>::to_vec)
                .unwrap_or_default();
            let x = x.pad(
                &[(0, 0), (0, 0), pads[0], (0, 0), (0, 0)],
                PadMode::Constant,
                0.0,
            );
            let depth = xs[2] + pads[0].0 + pads[0].1;
            let span = dilations[0] * (ws[2].max(1) - 1) + 1;
            if ws[2] == 0 || span > depth {
                return Err(n.bad(format!(
                    "the kernel {ws:?} spans more than the padded depth {depth}"
                )));
            }
            let od = (depth - span) / strides[0] + 1;
            let (nb, ch) = (xs[0] as i64, xs[1] as i64);
            let conv2 = c(&strides[1..], &dilations[1..], pads[1..].to_vec());
            let mut acc: Option<Tensor> = None;
            for kd in 0..ws[2] {
                let start = (kd * dilations[0]) as i64;
                let stop = start + ((od - 1) * strides[0]) as i64 + 1;
                let xk = x.slice(&[
                    SliceArg::all(),
                    SliceArg::all(),
                    SliceArg::new(Some(start), Some(stop), strides[0] as i64),
                ]);
                let xk = xk.permute(&[0, 2, 1, 3, 4]).reshape(&[
                    nb * od as i64,
                    ch,
                    xs[3] as i64,
                    xs[4] as i64,
                ]);
                let wk = w
                    .slice(&[
                        SliceArg::all(),
                        SliceArg::all(),
                        SliceArg::new(Some(kd as i64), Some(kd as i64 + 1), 1),
                    ])
                    .squeeze(&[2]);
                let y = xk.conv2d(&wk, if kd == 0 { b } else { None }, &conv2);
                acc = Some(match acc {
                    Some(a) => a.add(&y),
                    None => y,
                });
            }
            let y = n.check(acc.ok_or_else(|| n.bad("an empty kernel"))?)?;
            let ys = y.shape().map(<[usize]>::to_vec).unwrap_or_default();
            Ok(
                y.reshape(&[nb, od as i64, ys[1] as i64, ys[2] as i64, ys[3] as i64])
                    .permute(&[0, 2, 1, 3, 4]),
            )
        }
        _ => Err(n.unsupported(format!("convolutions over {r} spatial axes"))),
    }
}

fn conv_transpose(n: &Node) -> Result<Vec<Tensor>> {
    let (xs, r) = spatial_rank(n, 0)?;
    let ws = n.shape(1)?;
    if ws.len() != r + 2 {
        return Err(n.bad(format!("weights {ws:?} for input {xs:?}")));
    }
    let group = n.int_or("group", 1)?;
    if group < 1 || xs[1] % group as usize != 0 || ws[0] != xs[1] {
        return Err(n.bad(format!(
            "group {group} with input {xs:?} and weights {ws:?}"
        )));
    }
    let g = group as usize;
    let kernel = ws[2..].to_vec();
    let strides = per_axis(n, "strides", r, 1)?;
    let dilations = per_axis(n, "dilations", r, 1)?;
    let out_pad = per_axis(n, "output_padding", r, 0)?;
    let ap = auto_pad(n)?;
    let full = |i: usize| -> i64 {
        (strides[i] * (xs[2 + i].max(1) - 1)
            + out_pad[i]
            + dilations[i] * (kernel[i].max(1) - 1)
            + 1) as i64
    };
    let split = |total: i64| -> (i64, i64) {
        if ap == "SAME_UPPER" {
            (total.div_euclid(2), total - total.div_euclid(2))
        } else {
            (total - total.div_euclid(2), total.div_euclid(2))
        }
    };
    let pads: Vec<(i64, i64)> = if let Some(os) = n.ints("output_shape")? {
        let os = if os.len() == r + 2 {
            os[2..].to_vec()
        } else {
            os
        };
        if os.len() != r {
            return Err(n.bad(format!("output_shape {os:?} for {r} spatial axes")));
        }
        (0..r).map(|i| split(full(i) - os[i])).collect()
    } else if ap == "SAME_UPPER" || ap == "SAME_LOWER" {
        (0..r)
            .map(|i| split(full(i) - (xs[2 + i] * strides[i]) as i64))
            .collect()
    } else if ap == "VALID" {
        vec![(0, 0); r]
    } else {
        pads_attr(n, r)?
    };
    // The input with stride - 1 zeros between its elements.
    let mut x = n.input(0)?.clone();
    let mut dims: Vec<i64> = xs.iter().map(|&d| d as i64).collect();
    for (i, &s) in strides.iter().enumerate() {
        let a = 2 + i;
        if s == 1 || xs[a] == 0 {
            continue;
        }
        let mut widths = vec![(0, 0); dims.len() + 1];
        widths[a + 1] = (0, s - 1);
        x = x
            .expand_dims(a as i64 + 1)
            .pad(&widths, PadMode::Constant, 0.0);
        let mut merged = dims.clone();
        merged[a] *= s as i64;
        x = x.reshape(&merged);
        let mut args = vec![SliceArg::all(); a];
        args.push(SliceArg::new(
            Some(0),
            Some((xs[a] as i64 - 1) * s as i64 + 1),
            1,
        ));
        x = x.slice(&args);
        dims[a] = (xs[a] as i64 - 1) * s as i64 + 1;
    }
    // The kernel flipped, in and out channels swapped within each group.
    let (cg, og) = ((xs[1] / g) as i64, ws[1] as i64);
    let k: Vec<i64> = kernel.iter().map(|&k| k as i64).collect();
    let w = n.input(1)?;
    let mut split_w = vec![g as i64, cg, og];
    split_w.extend(&k);
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend((0..r as i64).map(|i| 3 + i));
    let mut joined = vec![g as i64 * og, cg];
    joined.extend(&k);
    let mut flip = vec![SliceArg::all(); 2];
    flip.extend(std::iter::repeat_n(SliceArg::new(None, None, -1), r));
    let w = w
        .reshape(&split_w)
        .permute(&perm)
        .reshape(&joined)
        .slice(&flip);
    let conv_pads: Vec<(i64, i64)> = (0..r)
        .map(|i| {
            let e = (dilations[i] * (kernel[i].max(1) - 1)) as i64;
            (e - pads[i].0, e - pads[i].1 + out_pad[i] as i64)
        })
        .collect();
    let ones = vec![1; r];
    let y = conv_nd(n, &x, &w, n.opt_input(2), &ones, &dilations, &conv_pads, g)?;
    Ok(vec![y])
}

/// The geometry of a pooling window: its kernel, strides, dilations, pads and output.
struct Window {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads: Vec<(i64, i64)>,
    out: Vec<usize>,
}

fn window(n: &Node, spatial: &[usize]) -> Result<Window> {
    let r = spatial.len();
    let kernel = match n.ints("kernel_shape")? {
        Some(k) if k.len() == r && k.iter().all(|&v| v >= 1) => {
            k.iter().map(|&v| v as usize).collect::<Vec<_>>()
        }
        Some(k) => return Err(n.bad(format!("kernel_shape {k:?} for {r} spatial axes"))),
        None => return Err(n.bad("attribute 'kernel_shape' is required")),
    };
    let strides = per_axis(n, "strides", r, 1)?;
    let dilations = per_axis(n, "dilations", r, 1)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(n.bad("strides and dilations must be at least 1"));
    }
    let ceil = n.int_or("ceil_mode", 0)? != 0;
    let ap = auto_pad(n)?;
    let pads = window_pads(n, spatial, &kernel, &strides, &dilations)?;
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let span = (dilations[i] * (kernel[i] - 1) + 1) as i64;
        let s = strides[i] as i64;
        let o = if ap == "SAME_UPPER" || ap == "SAME_LOWER" {
            spatial[i].div_ceil(strides[i]) as i64
        } else {
            let room = spatial[i] as i64 + pads[i].0 + pads[i].1 - span;
            if room < 0 {
                return Err(n.bad(format!(
                    "the window spans {span}, more than the padded input on spatial axis {i}"
                )));
            }
            let mut o = if ceil {
                (room + s - 1) / s + 1
            } else {
                room / s + 1
            };
            // The last window starts inside the input or its leading padding.
            if ceil && (o - 1) * s >= spatial[i] as i64 + pads[i].0 {
                o -= 1;
            }
            o
        };
        out.push(o.max(0) as usize);
    }
    Ok(Window {
        kernel,
        strides,
        dilations,
        pads,
        out,
    })
}

fn pool(n: &Node) -> Result<Vec<Tensor>> {
    let (xs, r) = spatial_rank(n, 0)?;
    let x = n.input(0)?;
    let w = window(n, &xs[2..])?;
    let kind = n.op();
    let wants_indices = kind == "MaxPool" && n.proto.output.get(1).is_some_and(|o| !o.is_empty());
    let count_pad = n.int_or("count_include_pad", 0)? != 0;
    // The frontend's 2-D pools cover symmetric padding of at most half the window with
    // no ceil-mode overhang.
    let simple = (kind == "MaxPool" || kind == "AveragePool")
        && !wants_indices
        && r <= 2
        && (0..r).all(|i| {
            let (b, e) = w.pads[i];
            let span = (w.dilations[i] * (w.kernel[i] - 1) + 1) as i64;
            let room = xs[2 + i] as i64 + b + e - span;
            b == e
                && b >= 0
                && 2 * b <= span
                && room >= 0
                && room / w.strides[i] as i64 + 1 == w.out[i] as i64
        });
    if simple {
        let lift = |v: &[usize], one: usize| if r == 1 { vec![one, v[0]] } else { v.to_vec() };
        let p = Pool::new(Spatial(lift(&w.kernel, 1)))
            .stride(Spatial(lift(&w.strides, 1)))
            .dilation(Spatial(lift(&w.dilations, 1)))
            .padding(Spatial(lift(
                &w.pads.iter().map(|p| p.0 as usize).collect::<Vec<_>>(),
                0,
            )))
            .count_include_pad(count_pad);
        let x2 = if r == 1 { x.expand_dims(2) } else { x.clone() };
        let y = if kind == "MaxPool" {
            x2.max_pool2d(&p)
        } else {
            x2.avg_pool2d(&p)
        };
        return Ok(vec![if r == 1 { y.squeeze(&[2]) } else { y }]);
    }
    // The general case: every window's taps as one gather of the flattened spatial axes.
    let spatial = &xs[2..];
    let taps: usize = w.kernel.iter().product();
    let positions: usize = w.out.iter().product();
    let mut index = Vec::with_capacity(taps * positions);
    let mut inside = Vec::with_capacity(taps * positions);
    let mut counts = Vec::with_capacity(positions);
    let mut col_major = Vec::new();
    let storage = n.int_or("storage_order", 0)? != 0;
    let mut oc = vec![0usize; r];
    let mut kc = vec![0usize; r];
    for p in 0..positions {
        unravel(p, &w.out, &mut oc);
        let mut count = 0usize;
        for t in 0..taps {
            unravel(t, &w.kernel, &mut kc);
            let (mut flat, mut cm, mut stride_cm, mut ok, mut counted) =
                (0i64, 0i64, 1i64, true, true);
            for i in 0..r {
                let q = (oc[i] * w.strides[i] + kc[i] * w.dilations[i]) as i64 - w.pads[i].0;
                let ext = spatial[i] as i64;
                ok &= (0..ext).contains(&q);
                counted &= (-w.pads[i].0..ext + w.pads[i].1).contains(&q);
                let qc = q.clamp(0, (ext - 1).max(0));
                flat = flat * ext + qc;
                cm += qc * stride_cm;
                stride_cm *= ext;
            }
            count += usize::from(if count_pad { counted } else { ok });
            index.push(if ok { flat } else { 0 });
            col_major.push(if ok { cm } else { 0 });
            inside.push(ok);
        }
        counts.push(count.max(1) as f64);
    }
    let (nb, c) = (xs[0] as i64, xs[1] as i64);
    let s: usize = spatial.iter().product();
    let idx = n.i64s(&index)?;
    let mask = n
        .ctx
        .from_vec(inside, &[taps * positions])
        .map_err(|e| n.bad(e.to_string()))?;
    let taken = x.reshape(&[nb, c, s as i64]).take(&idx, 2);
    let (p, t) = (positions as i64, taps as i64);
    let mut out_dims = vec![nb, c];
    out_dims.extend(w.out.iter().map(|&o| o as i64));
    let y = match kind {
        "MaxPool" => {
            let cols = mask
                .where_(&taken, f64::NEG_INFINITY)
                .reshape(&[nb, c, p, t]);
            if wants_indices {
                let tap = cols.argmax(3);
                let table = n.i64s(if storage { &col_major } else { &index })?;
                let at = n
                    .ctx
                    .arange_n(positions)
                    .cast(DType::I64)
                    .mul(t)
                    .reshape(&[1, 1, p]);
                let spatial_idx = table.take(&tap.add(&at), 0);
                let base = n
                    .ctx
                    .arange_n(xs[0] * xs[1])
                    .cast(DType::I64)
                    .mul(s as i64)
                    .reshape(&[nb, c, 1]);
                let y = cols.max(&[3i64][..]).reshape(&out_dims);
                return Ok(vec![y, spatial_idx.add(&base).reshape(&out_dims)]);
            }
            cols.max(&[3i64][..])
        }
        "AveragePool" => {
            let sum = mask
                .where_(&taken, 0.0)
                .reshape(&[nb, c, p, t])
                .sum(&[3i64][..]);
            if let Some(&first) = counts.first().filter(|&&f| counts.iter().all(|&v| v == f)) {
                sum.div(first)
            } else {
                let d = n.dtype(0)?;
                let k = n
                    .ctx
                    .from_vec(counts, &[positions])
                    .map_err(|e| n.bad(e.to_string()))?;
                sum.div(k.cast(d))
            }
        }
        _ => {
            let pw = lp_p(n)?;
            let a = mask.where_(&taken, 0.0).reshape(&[nb, c, p, t]).abs();
            if pw == 2.0 {
                a.square().sum(&[3i64][..]).sqrt()
            } else {
                a.pow(pw).sum(&[3i64][..]).pow(1.0 / pw)
            }
        }
    };
    Ok(vec![y.reshape(&out_dims)])
}

fn max_unpool(n: &Node) -> Result<Vec<Tensor>> {
    let (xs, r) = spatial_rank(n, 0)?;
    let kernel = per_axis(n, "kernel_shape", r, 0)?;
    let strides = per_axis(n, "strides", r, 1)?;
    let pads = pads_attr(n, r)?;
    let inferred: Vec<usize> = (0..r)
        .map(|i| ((xs[2 + i].max(1) - 1) * strides[i] + kernel[i]) as i64 - pads[i].0 - pads[i].1)
        .map(|v| v.max(0) as usize)
        .collect();
    // The indices address the inferred shape; a given output_shape pads (or crops) its end.
    let out: Vec<usize> = match n.ints_input(2)? {
        Some(s) if s.len() == r + 2 && s.iter().all(|&v| v >= 0) => {
            s[2..].iter().map(|&v| v as usize).collect()
        }
        Some(s) => return Err(n.bad(format!("output_shape {s:?} for input {xs:?}"))),
        None => inferred.clone(),
    };
    let total = xs[0] * xs[1] * inferred.iter().product::<usize>();
    let d = n.dtype(0)?;
    let idx = n.input(1)?.cast(DType::I64).reshape(&[-1]);
    let vals = n.input(0)?.reshape(&[-1]);
    let zeros = n.ctx.full_dtype(&[total], 0.0, d);
    let sum = zeros.index_add(&idx, &vals, 0);
    let count = zeros.index_add(
        &idx,
        &n.ctx.full_dtype(&[idx.shape().map_or(0, |s| s[0])], 1.0, d),
        0,
    );
    let mut dims = vec![xs[0] as i64, xs[1] as i64];
    dims.extend(inferred.iter().map(|&o| o as i64));
    let y = sum.div(count.maximum(1.0)).reshape(&dims);
    let grow: Vec<(i64, i64)> = (0..r)
        .map(|i| (0, out[i] as i64 - inferred[i] as i64))
        .collect();
    let (y, widths) = crop(&y, &grow, &inferred);
    let mut all = vec![(0, 0); 2];
    all.extend(widths);
    Ok(vec![y.pad(&all, PadMode::Constant, 0.0)])
}

/// `p` of the Lp ops: an int (a float before opset 11).
fn lp_p(n: &Node) -> Result<f64> {
    match n.int("p") {
        Ok(v) => Ok(v.unwrap_or(2) as f64),
        Err(_) => Ok(n.float_or("p", 2.0)?),
    }
}

/// `flat` as row-major coordinates over `dims`.
fn unravel(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for i in (0..dims.len()).rev() {
        out[i] = flat % dims[i].max(1);
        flat /= dims[i].max(1);
    }
}

fn global_pool(n: &Node) -> Result<Vec<Tensor>> {
    let (xs, _) = spatial_rank(n, 0)?;
    let x = n.input(0)?;
    let axes: Vec<i64> = (2..xs.len() as i64).collect();
    Ok(vec![match n.op() {
        "GlobalAveragePool" => x.mean_keepdims(axes),
        "GlobalMaxPool" => x.max_keepdims(axes),
        _ => {
            let p = lp_p(n)?;
            if p == 2.0 {
                x.norm2_keepdims(axes)
            } else {
                x.abs().pow(p).sum_keepdims(axes).pow(1.0 / p)
            }
        }
    }])
}

/// A per-channel `[C]` tensor shaped to broadcast against `[N, C, ...]` of `rank`.
fn per_channel(t: &Tensor, rank: usize) -> Tensor {
    let mut s = vec![-1i64];
    s.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    t.reshape(&s)
}

fn batch_norm(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let rank = n.shape(0)?.len();
    if rank < 2 {
        return Err(n.bad("input of rank < 2"));
    }
    if n.int_or("spatial", 1)? == 0 {
        return Err(n.unsupported("spatial=0"));
    }
    let eps = n.float_or("epsilon", 1e-5)?;
    let momentum = n.float_or("momentum", 0.9)?;
    let pc = |i: usize| -> Result<Tensor> { Ok(per_channel(n.input(i)?, rank)) };
    let (scale, bias, mean, var) = (pc(1)?, pc(2)?, pc(3)?, pc(4)?);
    let outs = n.proto.output.iter().filter(|o| !o.is_empty()).count();
    let training = n.int_or("training_mode", 0)? != 0
        || (n.opset < 14 && outs > 1 && n.int_or("is_test", 0)? == 0);
    if !training {
        let y = x
            .sub(&mean)
            .mul(var.add(eps).rsqrt())
            .mul(&scale)
            .add(&bias);
        return Ok(vec![y]);
    }
    let axes: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
    let bm = x.mean(axes.clone());
    let bv = x.var(axes);
    let y = x
        .sub(per_channel(&bm, rank))
        .mul(per_channel(&bv, rank).add(eps).rsqrt())
        .mul(&scale)
        .add(&bias);
    let run_mean = n.input(3)?.mul(momentum).add(bm.mul(1.0 - momentum));
    let run_var = n.input(4)?.mul(momentum).add(bv.mul(1.0 - momentum));
    Ok(vec![y, run_mean, run_var, bm, bv])
}

fn instance_norm(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let (xs, _) = spatial_rank(n, 0)?;
    let eps = n.float_or("epsilon", 1e-5)?;
    let axes: Vec<i64> = (2..xs.len() as i64).collect();
    let y = x
        .sub(x.mean_keepdims(axes.clone()))
        .mul(x.var_keepdims(axes).add(eps).rsqrt());
    let rank = xs.len();
    Ok(vec![y
        .mul(per_channel(n.input(1)?, rank))
        .add(per_channel(n.input(2)?, rank))])
}

/// `x` in f32 when `stash_type` asks for it (the default), and its dtype.
fn stashed(n: &Node) -> Result<(Tensor, DType)> {
    let x = n.input(0)?;
    let d = n.dtype(0)?;
    let stash = n.int_or("stash_type", 1)?;
    Ok(match stash {
        1 if d != DType::F32 && d != DType::F64 => (x.cast(DType::F32), d),
        _ => (x.clone(), d),
    })
}

fn layer_norm(n: &Node) -> Result<Vec<Tensor>> {
    let (x, d) = stashed(n)?;
    let rank = n.shape(0)?.len();
    let axis = n.axis(n.int_or("axis", -1)?, rank)?;
    let eps = n.float_or("epsilon", 1e-5)?;
    let axes: Vec<i64> = (axis as i64..rank as i64).collect();
    let scale = n.input(1)?;
    if n.op() == "RMSNormalization" {
        let inv = x.square().mean_keepdims(axes).add(eps).rsqrt();
        return Ok(vec![x.mul(inv).cast(d).mul(scale)]);
    }
    let mean = x.mean_keepdims(axes.clone());
    let centered = x.sub(&mean);
    let inv = centered.square().mean_keepdims(axes).add(eps).rsqrt();
    let mut y = centered.mul(&inv).cast(d).mul(scale);
    if let Some(b) = n.opt_input(2) {
        y = y.add(b);
    }
    Ok(vec![y, mean, inv])
}

fn group_norm(n: &Node) -> Result<Vec<Tensor>> {
    let (x, d) = stashed(n)?;
    let (xs, _) = spatial_rank(n, 0)?;
    let g = n
        .int("num_groups")?
        .ok_or_else(|| n.bad("attribute 'num_groups' is required"))?;
    let c = xs[1] as i64;
    if g < 1 || c % g != 0 {
        return Err(n.bad(format!("num_groups {g} for {c} channels")));
    }
    let eps = n.float_or("epsilon", 1e-5)?;
    let nb = xs[0] as i64;
    let xg = x.reshape(&[nb, g, -1]);
    let y = xg
        .sub(xg.mean_keepdims(2))
        .mul(xg.var_keepdims(2).add(eps).rsqrt());
    let rank = xs.len();
    let dims: Vec<i64> = xs.iter().map(|&v| v as i64).collect();
    let (scale, bias) = (n.input(1)?, n.input(2)?);
    let sl = n.shape(1)?.iter().product::<usize>() as i64;
    if sl == c {
        let y = y.reshape(&dims).cast(d);
        Ok(vec![y
            .mul(per_channel(scale, rank))
            .add(per_channel(bias, rank))])
    } else if sl == g {
        let y = y.mul(scale.reshape(&[g, 1])).add(bias.reshape(&[g, 1]));
        Ok(vec![y.reshape(&dims).cast(d)])
    } else {
        Err(n.bad(format!(
            "scale of {sl} values for {c} channels in {g} groups"
        )))
    }
}

fn lp_norm(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let rank = n.shape(0)?.len();
    let axis = n.axis(n.int_or("axis", -1)?, rank)? as i64;
    Ok(vec![match n.int_or("p", 2)? {
        1 => x.div(x.norm1_keepdims(axis)),
        2 => x.div(x.norm2_keepdims(axis)),
        p => return Err(n.unsupported(format!("p={p} (1 or 2)"))),
    }])
}

fn mvn(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let rank = n.shape(0)?.len();
    let axes = n.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let axes: Vec<i64> = axes
        .iter()
        .map(|&a| n.axis(a, rank).map(|a| a as i64))
        .collect::<Result<_>>()?;
    let mean = x.mean_keepdims(axes.clone());
    let std = x.sub(&mean).square().mean_keepdims(axes).sqrt();
    Ok(vec![x.sub(&mean).div(std.add(1e-9))])
}

fn lrn(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let (xs, _) = spatial_rank(n, 0)?;
    let size = n
        .int("size")?
        .ok_or_else(|| n.bad("attribute 'size' is required"))?;
    if size < 1 {
        return Err(n.bad(format!("size {size}")));
    }
    let (alpha, beta, bias) = (
        n.float_or("alpha", 1e-4)?,
        n.float_or("beta", 0.75)?,
        n.float_or("bias", 1.0)?,
    );
    let size = size as usize;
    let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
    let mut widths = vec![(0, 0); xs.len()];
    widths[1] = (lo, hi);
    let sq = x.square().pad(&widths, PadMode::Constant, 0.0);
    let c = xs[1] as i64;
    let mut sum: Option<Tensor> = None;
    for j in 0..size as i64 {
        let part = sq.slice(&[SliceArg::all(), SliceArg::new(Some(j), Some(j + c), 1)]);
        sum = Some(match sum {
            Some(s) => s.add(&part),
            None => part,
        });
    }
    let sum = sum.ok_or_else(|| n.bad("size 0"))?;
    Ok(vec![x.div(sum.mul(alpha / size as f64).add(bias).pow(beta))])
}
