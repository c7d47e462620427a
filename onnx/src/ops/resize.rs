//! `Resize` and `Upsample`: per resized axis, the source taps and weights of every output
//! coordinate are computed on the host (the shapes are static), then one gather along
//! that axis and, for linear and cubic, a weighted sum of the taps.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::Tensor;

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "Resize",
        "modes nearest (round_prefer_floor/round_prefer_ceil/floor/ceil), linear and cubic \
         (cubic_coeff_a, exclude_outside, antialias) over any axes; coordinate modes \
         half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric, \
         tf_crop_and_resize (roi, extrapolation_value); scales or sizes, axes, \
         keep_aspect_ratio_policy; linear and cubic on float tensors only",
    ),
    Support::new(
        "Upsample",
        "nearest and linear (asymmetric coordinates); scales as attribute or input",
    ),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "Resize" => resize(n),
        "Upsample" => upsample(n),
        _ => return None,
    })
}

/// How output coordinates read the input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// One tap: `round_prefer_floor`, `round_prefer_ceil`, `floor`, `ceil`, or (Resize
    /// 10, Upsample) floor when upsampling and ceil when downsampling.
    Nearest(Rounding),
    /// Two taps (more with antialias).
    Linear,
    /// Four taps with coefficient `a` (more with antialias).
    Cubic(f64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rounding {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
    Simple,
}

/// Everything about the resize that is the same for every axis.
struct Spec {
    mode: Mode,
    coord: String,
    exclude_outside: bool,
    antialias: bool,
}

/// One axis: each output coordinate's taps (`n` of them, index and weight), and whether
/// it lies inside the input (only `tf_crop_and_resize` can leave it).
struct Taps {
    n: usize,
    idx: Vec<i64>,
    weight: Vec<f64>,
    inside: Vec<bool>,
}

fn resize(n: &Node) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    let rank = xs.len();
    let nonempty = |v: Option<Vec<f64>>| v.filter(|v| !v.is_empty());
    let (roi, scales, sizes) = if n.opset < 11 {
        (None, nonempty(n.floats_input(1)?), None)
    } else {
        let sizes = n.ints_input(3)?.filter(|v| !v.is_empty());
        (
            nonempty(n.floats_input(1)?),
            nonempty(n.floats_input(2)?),
            sizes,
        )
    };
    let mode_name = n.string("mode")?.unwrap_or_else(|| "nearest".into());
    let coord = if n.opset < 11 {
        "asymmetric".to_owned()
    } else {
        n.string("coordinate_transformation_mode")?
            .unwrap_or_else(|| "half_pixel".into())
    };
    let mode = match mode_name.as_str() {
        "nearest" if n.opset < 11 => Mode::Nearest(Rounding::Simple),
        "nearest" => Mode::Nearest(
            match n
                .string("nearest_mode")?
                .as_deref()
                .unwrap_or("round_prefer_floor")
            {
                "round_prefer_floor" => Rounding::PreferFloor,
                "round_prefer_ceil" => Rounding::PreferCeil,
                "floor" => Rounding::Floor,
                "ceil" => Rounding::Ceil,
                other => return Err(n.bad(format!("nearest_mode '{other}'"))),
            },
        ),
        "linear" => Mode::Linear,
        "cubic" => Mode::Cubic(n.float_or("cubic_coeff_a", -0.75)?),
        other => return Err(n.bad(format!("mode '{other}'"))),
    };
    let spec = Spec {
        mode,
        coord,
        exclude_outside: n.int_or("exclude_outside", 0)? != 0,
        antialias: n.int_or("antialias", 0)? != 0 && !matches!(mode, Mode::Nearest(_)),
    };
    let axes: Vec<usize> = match n.ints("axes")? {
        Some(a) => a.iter().map(|&a| n.axis(a, rank)).collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    let mut scale = vec![1.0f64; rank];
    let mut out: Vec<usize> = xs.clone();
    if let Some(s) = scales {
        if s.len() != axes.len() {
            return Err(n.bad(format!("{} scales for {} axes", s.len(), axes.len())));
        }
        for (i, &a) in axes.iter().enumerate() {
            if s[i] <= 0.0 {
                return Err(n.bad(format!("scale {}", s[i])));
            }
            scale[a] = s[i];
            // numpy multiplies the f32 scales in f32.
            out[a] = (xs[a] as f32 * s[i] as f32).floor() as usize;
        }
    } else if let Some(sz) = sizes {
        if sz.len() != axes.len() || sz.iter().any(|&v| v < 0) {
            return Err(n.bad(format!("sizes {sz:?} for {} axes", axes.len())));
        }
        let ratio: Vec<f64> = axes
            .iter()
            .zip(&sz)
            .map(|(&a, &s)| s as f64 / xs[a] as f64)
            .collect();
        let policy = n
            .string("keep_aspect_ratio_policy")?
            .unwrap_or_else(|| "stretch".into());
        let common = match policy.as_str() {
            "stretch" => None,
            "not_larger" => ratio.iter().copied().reduce(f64::min),
            "not_smaller" => ratio.iter().copied().reduce(f64::max),
            other => return Err(n.bad(format!("keep_aspect_ratio_policy '{other}'"))),
        };
        for (i, &a) in axes.iter().enumerate() {
            match common {
                Some(c) => {
                    scale[a] = c;
                    out[a] = (c * xs[a] as f64 + 0.5).floor() as usize;
                }
                None => {
                    scale[a] = ratio[i];
                    out[a] = sz[i] as usize;
                }
            }
        }
    } else {
        return Err(n.bad("neither scales nor sizes are given"));
    }
    let mut rois = vec![(0.0, 1.0); rank];
    if spec.coord == "tf_crop_and_resize" {
        let roi = roi.ok_or_else(|| n.bad("tf_crop_and_resize needs roi"))?;
        let k = axes.len();
        if roi.len() != 2 * k {
            return Err(n.bad(format!("roi of {} values for {k} axes", roi.len())));
        }
        for (i, &a) in axes.iter().enumerate() {
            rois[a] = (roi[i], roi[i + k]);
        }
    }
    let extrapolation = n.float_or("extrapolation_value", 0.0)?;
    apply(n, &spec, &xs, &scale, &out, &rois, extrapolation)
}

fn upsample(n: &Node) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    let scales = match n.floats("scales")? {
        Some(s) => s,
        None => n
            .floats_input(1)?
            .ok_or_else(|| n.bad("scales are required"))?,
    };
    if scales.len() != xs.len() || scales.iter().any(|&s| s <= 0.0) {
        return Err(n.bad(format!("scales {scales:?} for input {xs:?}")));
    }
    let mode = match n.string("mode")?.as_deref().unwrap_or("nearest") {
        "nearest" => Mode::Nearest(Rounding::Simple),
        "linear" | "bilinear" => Mode::Linear,
        other => return Err(n.unsupported(format!("mode '{other}'"))),
    };
    let spec = Spec {
        mode,
        coord: "asymmetric".into(),
        exclude_outside: false,
        antialias: false,
    };
    let out: Vec<usize> = xs
        .iter()
        .zip(&scales)
        .map(|(&d, &s)| (d as f32 * s as f32).floor() as usize)
        .collect();
    let rois = vec![(0.0, 1.0); xs.len()];
    apply(n, &spec, &xs, &scales, &out, &rois, 0.0)
}

/// Resamples every axis whose taps are not the identity, one after the other.
fn apply(
    n: &Node,
    spec: &Spec,
    xs: &[usize],
    scale: &[f64],
    out: &[usize],
    rois: &[(f64, f64)],
    extrapolation: f64,
) -> Result<Vec<Tensor>> {
    let mut y = n.input(0)?.clone();
    let dtype = n.dtype(0)?;
    if !matches!(spec.mode, Mode::Nearest(_)) && !dtype.is_float() {
        return Err(n.unsupported(format!("linear and cubic resizing of {dtype:?}")));
    }
    let rank = xs.len();
    for a in 0..rank {
        if out[a] == 0 || xs[a] == 0 {
            if out[a] != xs[a] {
                let mut dims = y.shape().map(<[usize]>::to_vec).unwrap_or_default();
                dims[a] = out[a];
                y = n.ctx.full_dtype(&dims, 0.0, dtype);
            }
            continue;
        }
        let taps = axis_taps(n, spec, xs[a], out[a], scale[a], rois[a])?;
        let identity = out[a] == xs[a]
            && taps.inside.iter().all(|&i| i)
            && (0..out[a]).all(|x| {
                (0..taps.n).all(|j| {
                    let (i, w) = (taps.idx[x * taps.n + j], taps.weight[x * taps.n + j]);
                    w == 0.0 || (i == x as i64 && w == 1.0)
                })
            });
        if identity {
            continue;
        }
        let m = out[a] as i64;
        let mut bshape = vec![1i64; rank];
        bshape[a] = m;
        if taps.n == 1 {
            y = y.take(&n.i64s(&taps.idx)?, a as i64);
        } else {
            let idx = n.i64s(&taps.idx)?.reshape(&[m, taps.n as i64]);
            let mut wshape = vec![1i64; rank + 1];
            wshape[a] = m;
            wshape[a + 1] = taps.n as i64;
            let w = n
                .ctx
                .from_vec(taps.weight.clone(), &[taps.weight.len()])
                .map_err(|e| n.bad(e.to_string()))?;
            let w = w.cast(dtype).reshape(&wshape);
            y = y.take(&idx, a as i64).mul(&w).sum(&[a as i64 + 1][..]);
        }
        if taps.inside.iter().any(|&i| !i) {
            let mask = n
                .ctx
                .from_vec(taps.inside.clone(), &[out[a]])
                .map_err(|e| n.bad(e.to_string()))?;
            y = mask.reshape(&bshape).where_(&y, extrapolation);
        }
    }
    Ok(vec![y])
}

/// The taps of each output coordinate of one axis, as ONNX's reference computes them:
/// the input coordinate `x_ori`, the `n` nearest input positions (edge-clamped; the
/// smaller preferred) and their coefficients.
fn axis_taps(
    n: &Node,
    spec: &Spec,
    len: usize,
    out: usize,
    scale: f64,
    roi: (f64, f64),
) -> Result<Taps> {
    let width = scale * len as f64;
    let last = len as f64 - 1.0;
    let count = match spec.mode {
        Mode::Nearest(_) => 1,
        Mode::Linear if spec.antialias => {
            let sc = scale.min(1.0);
            (2 - 2 * ((-1.0 / sc).floor() as i64 + 1)) as usize
        }
        Mode::Cubic(_) if spec.antialias => {
            let sc = scale.min(1.0);
            (2 - 2 * ((-2.0 / sc).floor() as i64 + 1)) as usize
        }
        Mode::Linear => 2,
        Mode::Cubic(_) => 4,
    };
    let mut taps = Taps {
        n: count,
        idx: Vec::with_capacity(out * count),
        weight: Vec::with_capacity(out * count),
        inside: Vec::with_capacity(out),
    };
    let clamp = |i: i64| i.clamp(0, len as i64 - 1);
    for x in 0..out {
        let xf = x as f64;
        let x_ori = match spec.coord.as_str() {
            "half_pixel" => (xf + 0.5) / scale - 0.5,
            "pytorch_half_pixel" if width == 1.0 || out == 1 => -0.5,
            "pytorch_half_pixel" => (xf + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let adjustment = out as f64 / width;
                let offset = len as f64 / 2.0 * (1.0 - adjustment);
                offset + (xf + 0.5) / scale - 0.5
            }
            "align_corners" if width == 1.0 || out == 1 => 0.0,
            "align_corners" => xf * last / (width - 1.0),
            "asymmetric" => xf / scale,
            "tf_crop_and_resize" => {
                let span = (roi.1 - roi.0) * last;
                let v = if width == 1.0 || out == 1 {
                    span / 2.0
                } else {
                    xf * span / (width - 1.0)
                };
                v + roi.0 * last
            }
            other => return Err(n.unsupported(format!("coordinate_transformation_mode '{other}'"))),
        };
        taps.inside
            .push(spec.coord != "tf_crop_and_resize" || (0.0..=last).contains(&x_ori));
        // ratio in (0, 1]: the position just left of x_ori is `base`.
        let is_int = x_ori.fract() == 0.0;
        let base = if is_int {
            x_ori as i64 - 1
        } else {
            x_ori.floor() as i64
        };
        let ratio = x_ori - base as f64;
        if let Mode::Nearest(r) = spec.mode {
            let pick = match r {
                _ if is_int => x_ori as i64,
                Rounding::PreferFloor => base + i64::from(ratio > 0.5),
                Rounding::PreferCeil => base + i64::from(ratio >= 0.5),
                Rounding::Floor => base,
                Rounding::Ceil => base + 1,
                Rounding::Simple if scale < 1.0 => x_ori.ceil() as i64,
                Rounding::Simple => x_ori.floor() as i64,
            };
            taps.idx.push(clamp(pick));
            taps.weight.push(1.0);
            continue;
        }
        let mut c: Vec<f64> = match spec.mode {
            Mode::Linear if spec.antialias => {
                let sc = scale.min(1.0);
                let start = 1 - (count / 2) as i64;
                (0..count as i64)
                    .map(|j| (1.0 - (((start + j) as f64 - ratio) * sc).abs()).clamp(0.0, 1.0))
                    .collect()
            }
            Mode::Linear => vec![1.0 - ratio, ratio],
            Mode::Cubic(a) if spec.antialias => {
                let sc = scale.min(1.0);
                let start = 1 - (count / 2) as i64;
                (0..count as i64)
                    .map(|j| cubic(((start + j) as f64 - ratio) * sc, a))
                    .collect()
            }
            Mode::Cubic(a) => (-1..3).map(|j| cubic(j as f64 - ratio, a)).collect(),
            Mode::Nearest(_) => unreachable!("nearest handled above"),
        };
        if spec.antialias {
            let s: f64 = c.iter().sum();
            c.iter_mut().for_each(|v| *v /= s);
        }
        let start = base + 1 - (count / 2) as i64;
        let idx: Vec<i64> = (0..count as i64).map(|j| start + j).collect();
        if spec.exclude_outside {
            for (w, &i) in c.iter_mut().zip(&idx) {
                if i < 0 || i >= len as i64 {
                    *w = 0.0;
                }
            }
            let s: f64 = c.iter().sum();
            if s != 0.0 {
                c.iter_mut().for_each(|v| *v /= s);
            }
        }
        taps.idx.extend(idx.into_iter().map(clamp));
        taps.weight.extend(c);
    }
    Ok(taps)
}

/// The cubic convolution kernel with coefficient `a` at distance `x`.
fn cubic(x: f64, a: f64) -> f64 {
    let x = x.abs();
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}
