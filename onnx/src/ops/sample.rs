//! Sampling: `GridSample` (indices and weights computed from the grid as tensor ops, one
//! gather), `AffineGrid` (a product with the host-built base grid), `Col2Im` (a
//! scatter-add of host-computed positions), and `RoiAlign` and `NonMaxSuppression`
//! computed from boxes known at import time.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{DType, SliceArg, Tensor};

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "GridSample",
        "any spatial rank (2-D, 3-D volumetric, ...); modes bilinear/linear, nearest (half to \
         even), bicubic/cubic; padding_mode zeros, border, reflection; align_corners; float \
         data and grid",
    ),
    Support::new(
        "AffineGrid",
        "2-D and 3-D; size known at import time; align_corners (computed in f64)",
    ),
    Support::new(
        "Col2Im",
        "any rank; image_shape and block_shape known at import time; dilations, pads, \
         strides (a scatter-add)",
    ),
    Support::new(
        "RoiAlign",
        "rois and batch_indices known at import time (the sampling grid depends on them); \
         modes avg and max, coordinate_transformation_mode half_pixel and \
         output_half_pixel, sampling_ratio, spatial_scale",
    ),
    Support::new(
        "NonMaxSuppression",
        "boxes, scores and thresholds known at import time only (the output's length \
         depends on them): computed on the host in f32 as the reference; center_point_box",
    ),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "GridSample" => grid_sample(n),
        "AffineGrid" => affine_grid(n),
        "Col2Im" => col2im(n),
        "RoiAlign" => roi_align(n),
        "NonMaxSuppression" => nms(n),
        _ => return None,
    })
}

fn i64_tensor(n: &Node, v: Vec<i64>, shape: &[usize]) -> Result<Tensor> {
    n.ctx.from_vec(v, shape).map_err(|e| n.bad(e.to_string()))
}

fn as_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&v| v as i64).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// `v` clamped to `[lo, hi]`.
fn clamp(v: &Tensor, lo: f64, hi: f64) -> Tensor {
    v.maximum(lo).minimum(hi)
}

/// `v` reflected by the borders `lo` and `hi` until inside (the reference's
/// `_gs_reflect`), for the values outside; a zero-width range gives `lo`.
fn reflect(v: &Tensor, lo: f64, hi: f64) -> Tensor {
    let rng = hi - lo;
    if rng <= 0.0 {
        return v.mul(0.0).add(lo);
    }
    let below = v.lt(lo);
    let dx = below.where_(v.neg().add(lo), v.sub(hi));
    let k = dx.div(rng).floor();
    let r = dx.sub(k.mul(rng));
    let odd = k.div(2.0).floor().mul(2.0).ne(&k);
    let from_lo = r.add(lo);
    let from_hi = r.neg().add(hi);
    let even = below.where_(&from_lo, &from_hi);
    let oddv = below.where_(&from_hi, &from_lo);
    let inside = v.ge(lo).and(v.le(hi));
    inside.where_(v, odd.where_(&oddv, &even))
}

/// The cubic convolution coefficients (a = -0.75) of the four taps around `t` in [0, 1).
fn cubic_coeffs(t: &Tensor) -> [Tensor; 4] {
    let a = -0.75;
    let far = |x: Tensor| {
        x.mul(a)
            .sub(5.0 * a)
            .mul(&x)
            .add(8.0 * a)
            .mul(&x)
            .sub(4.0 * a)
    };
    let near = |x: Tensor| x.mul(a + 2.0).sub(a + 3.0).mul(&x).mul(&x).add(1.0);
    let one_minus = t.neg().add(1.0);
    [
        far(t.add(1.0)),
        near(t.clone()),
        near(one_minus),
        far(t.neg().add(2.0)),
    ]
}

fn grid_sample(n: &Node) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    let gs = n.shape(1)?;
    if xs.len() < 3 {
        return Err(n.bad(format!("input {xs:?} must be [N, C, spatial...]")));
    }
    let r = xs.len() - 2;
    if gs.len() != r + 2 || gs[0] != xs[0] || gs[r + 1] != r {
        return Err(n.bad(format!("grid {gs:?} for input {xs:?}")));
    }
    let (xdt, gdt) = (n.dtype(0)?, n.dtype(1)?);
    if !xdt.is_float() || !gdt.is_float() {
        return Err(n.unsupported(format!("GridSample of {xdt:?} data on a {gdt:?} grid")));
    }
    let default_mode = if n.opset < 20 { "bilinear" } else { "linear" };
    let mode = match n.string("mode")?.as_deref().unwrap_or(default_mode) {
        "bilinear" | "linear" => Mode::Linear,
        "nearest" => Mode::Nearest,
        "bicubic" | "cubic" => Mode::Cubic,
        other => return Err(n.bad(format!("mode '{other}'"))),
    };
    let padding = match n.string("padding_mode")?.as_deref().unwrap_or("zeros") {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => return Err(n.bad(format!("padding_mode '{other}'"))),
    };
    let align = n.int_or("align_corners", 0)? != 0;
    let (nb, c) = (xs[0], xs[1]);
    let out_sp = &gs[1..=r];
    let q: usize = out_sp.iter().product();
    let mut out_shape = vec![nb, c];
    out_shape.extend_from_slice(out_sp);
    if q == 0 || nb == 0 || c == 0 {
        return Ok(vec![n.ctx.full_dtype(&out_shape, 0.0, xdt)]);
    }
    let taps_per_dim: usize = match mode {
        Mode::Nearest => 1,
        Mode::Linear => 2,
        Mode::Cubic => 4,
    };
    let grid = n.input(1)?.reshape(&[nb as i64, q as i64, r as i64]);
    // Per spatial axis: the taps' indices and weights, [nb, q, taps] each.
    let mut flat: Option<Tensor> = None;
    let mut weight: Option<Tensor> = None;
    let mut stride = 1i64;
    for i in (0..r).rev() {
        let len = xs[2 + i];
        let lf = len as f64;
        let k = (r - 1 - i) as i64;
        let coord = grid
            .slice(&[
                SliceArg::all(),
                SliceArg::all(),
                SliceArg::new(Some(k), Some(k + 1), 1),
            ])
            .reshape(&[nb as i64, q as i64]);
        let mut v = if align {
            coord.add(1.0).div(2.0).mul(lf - 1.0)
        } else {
            coord.add(1.0).mul(lf).sub(1.0).div(2.0)
        };
        if mode == Mode::Nearest {
            v = v.round();
        }
        let (lo, hi) = if align {
            (0.0, lf - 1.0)
        } else {
            (-0.5, lf - 0.5)
        };
        match padding {
            Padding::Zeros => {}
            Padding::Border => {
                let outside = v.lt(lo).or(v.gt(hi));
                v = outside.where_(clamp(&v, 0.0, lf - 1.0), &v);
            }
            Padding::Reflection => v = reflect(&v, lo, hi),
        }
        // Each tap's position (float) and coefficient.
        let taps: Vec<(Tensor, Option<Tensor>)> = match mode {
            Mode::Nearest => vec![(v.clone(), None)],
            Mode::Linear => {
                let x0 = v.floor();
                let t = v.sub(&x0);
                vec![(x0.clone(), Some(t.neg().add(1.0))), (x0.add(1.0), Some(t))]
            }
            Mode::Cubic => {
                let x0 = v.floor();
                let t = v.sub(&x0);
                let cs = cubic_coeffs(&t);
                cs.into_iter()
                    .enumerate()
                    .map(|(j, cw)| (x0.add(j as f64 - 1.0), Some(cw)))
                    .collect()
            }
        };
        let mut idx_parts = Vec::new();
        let mut w_parts = Vec::new();
        for (pos, w) in taps {
            // Keep far-away positions finite and outside before the integer cast.
            let pos = clamp(&pos, -2.0, lf + 1.0);
            let (idx, valid) = match padding {
                Padding::Zeros => (
                    clamp(&pos, 0.0, lf - 1.0),
                    Some(pos.ge(0.0).and(pos.le(lf - 1.0))),
                ),
                Padding::Border => (clamp(&pos, 0.0, lf - 1.0), None),
                Padding::Reflection => (clamp(&reflect(&pos, lo, hi), 0.0, lf - 1.0), None),
            };
            idx_parts.push(idx.cast(DType::I64).mul(stride));
            let w = match (w, valid) {
                (Some(w), Some(ok)) => Some(ok.where_(&w, 0.0)),
                (None, Some(ok)) => Some(ok.where_(1.0, 0.0).cast(gdt)),
                (w, None) => w,
            };
            w_parts.push(w);
        }
        let mut tshape = vec![nb as i64, q as i64];
        tshape.extend(std::iter::repeat_n(1, r));
        tshape[2 + i] = taps_per_dim as i64;
        let refs: Vec<&Tensor> = idx_parts.iter().collect();
        let it = ndfuse::stack(&refs, -1).reshape(&tshape);
        flat = Some(match flat {
            Some(f) => f.add(it),
            None => it,
        });
        if w_parts.iter().all(Option::is_some) {
            let ws: Vec<Tensor> = w_parts.into_iter().flatten().collect();
            let refs: Vec<&Tensor> = ws.iter().collect();
            let wt = ndfuse::stack(&refs, -1).reshape(&tshape);
            weight = Some(match weight {
                Some(w) => w.mul(wt),
                None => wt,
            });
        }
        stride *= len as i64;
    }
    let flat = flat.ok_or_else(|| n.bad("no spatial axes"))?;
    let taps = taps_per_dim.pow(r as u32);
    let p: usize = xs[2..].iter().product();
    let idx = flat.reshape(&[nb as i64, 1, (q * taps) as i64]);
    let x = n.input(0)?.reshape(&[nb as i64, c as i64, p as i64]);
    let g = x.take_along_axis(&idx, 2);
    let y = match weight {
        Some(w) => {
            let g = g.reshape(&[nb as i64, c as i64, q as i64, taps as i64]);
            let w = w.reshape(&[nb as i64, 1, q as i64, taps as i64]).cast(xdt);
            g.mul(w).sum(&[3i64][..])
        }
        None => g,
    };
    Ok(vec![y.reshape(&as_i64(&out_shape))])
}

fn affine_grid(n: &Node) -> Result<Vec<Tensor>> {
    let ts = n.shape(0)?;
    let dtype = n.dtype(0)?;
    if !dtype.is_float() {
        return Err(n.unsupported(format!("AffineGrid of {dtype:?}")));
    }
    let size = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input size is required"))?;
    let r = size.len().saturating_sub(2);
    if !(r == 2 || r == 3) || size.iter().any(|&v| v < 0) {
        return Err(n.bad(format!(
            "size {size:?} must be [N, C, H, W] or [N, C, D, H, W]"
        )));
    }
    if ts != [size[0] as usize, r, r + 1] {
        return Err(n.bad(format!("theta {ts:?} for size {size:?}")));
    }
    let align = n.int_or("align_corners", 0)? != 0;
    let sp: Vec<usize> = size[2..].iter().map(|&v| v as usize).collect();
    let coords: Vec<Vec<f64>> = sp
        .iter()
        .map(|&l| {
            let lf = l as f64;
            (0..l)
                .map(|k| {
                    if align {
                        if k == 0 {
                            -1.0
                        } else {
                            -1.0 + k as f64 * (2.0 / (lf - 1.0))
                        }
                    } else {
                        let step = 2.0 / lf;
                        -1.0 + step / 2.0 + k as f64 * step
                    }
                })
                .collect()
        })
        .collect();
    let p: usize = sp.iter().product();
    let mut base = Vec::with_capacity(p * (r + 1));
    for flat in 0..p {
        let mut rem = flat;
        let mut idx = vec![0usize; r];
        for a in (0..r).rev() {
            idx[a] = rem % sp[a];
            rem /= sp[a];
        }
        // (x, y[, z], 1): the last spatial axis first.
        for a in (0..r).rev() {
            base.push(coords[a][idx[a]]);
        }
        base.push(1.0);
    }
    let b = n.host(base, &[p, r + 1], DType::F64)?;
    let theta = n.input(0)?.cast(DType::F64).permute(&[0, 2, 1]);
    let mut shape = vec![ts[0] as i64];
    shape.extend(sp.iter().map(|&v| v as i64));
    shape.push(r as i64);
    Ok(vec![b.matmul(&theta).reshape(&shape).cast(dtype)])
}

/// Attribute `name` with one value per spatial axis, `default` when absent.
fn per_axis(n: &Node, name: &str, r: usize, default: i64, min: i64) -> Result<Vec<i64>> {
    match n.ints(name)? {
        None => Ok(vec![default; r]),
        Some(v) if v.len() == r && v.iter().all(|&x| x >= min) => Ok(v),
        Some(v) => Err(n.bad(format!("attribute '{name}' {v:?} for {r} spatial axes"))),
    }
}

fn col2im(n: &Node) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    let image = n
        .ints_input(1)?
        .ok_or_else(|| n.bad("input image_shape is required"))?;
    let block = n
        .ints_input(2)?
        .ok_or_else(|| n.bad("input block_shape is required"))?;
    let r = image.len();
    if xs.len() != 3 || block.len() != r || r == 0 {
        return Err(n.bad(format!(
            "input {xs:?}, image_shape {image:?}, block_shape {block:?}"
        )));
    }
    if image.iter().chain(&block).any(|&v| v <= 0) {
        return Err(n.bad(format!("image_shape {image:?}, block_shape {block:?}")));
    }
    let dil = per_axis(n, "dilations", r, 1, 1)?;
    let strides = per_axis(n, "strides", r, 1, 1)?;
    let pads = match n.ints("pads")? {
        None => vec![0; 2 * r],
        Some(p) if p.len() == 2 * r && p.iter().all(|&v| v >= 0) => p,
        Some(p) => return Err(n.bad(format!("pads {p:?} for {r} spatial axes"))),
    };
    let k: i64 = block.iter().product();
    if xs[1] as i64 % k != 0 {
        return Err(n.bad(format!("input {xs:?} for blocks of {k}")));
    }
    let c = xs[1] / k as usize;
    let blocks: Vec<i64> = (0..r)
        .map(|i| (image[i] + pads[i] + pads[i + r] - dil[i] * (block[i] - 1) - 1) / strides[i] + 1)
        .collect();
    let lb: i64 = blocks.iter().product();
    if blocks.iter().any(|&b| b < 1) || lb != xs[2] as i64 {
        return Err(n.bad(format!(
            "input {xs:?} has {} blocks, the attributes give {blocks:?}",
            xs[2]
        )));
    }
    let unravel = |mut f: i64, dims: &[i64]| {
        let mut v = vec![0i64; dims.len()];
        for a in (0..dims.len()).rev() {
            v[a] = f % dims[a];
            f /= dims[a];
        }
        v
    };
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for kk in 0..k {
        let off = unravel(kk, &block);
        for col in 0..lb {
            let ci = unravel(col, &blocks);
            let mut flat = 0i64;
            let mut inside = true;
            for i in 0..r {
                let p = ci[i] * strides[i] - pads[i] + off[i] * dil[i];
                inside &= (0..image[i]).contains(&p);
                flat = flat * image[i] + p;
            }
            if inside {
                src.push(kk * lb + col);
                dst.push(flat);
            }
        }
    }
    let nb = xs[0];
    let p: i64 = image.iter().product();
    let dtype = n.dtype(0)?;
    let mut out = vec![nb as i64, c as i64];
    out.extend(&image);
    let zeros = n.ctx.full_dtype(&[nb, c, p as usize], 0.0, dtype);
    if src.is_empty() {
        return Ok(vec![zeros.reshape(&out)]);
    }
    let x = n.input(0)?.reshape(&[nb as i64, c as i64, k * lb]);
    let v = x.take(&n.i64s(&src)?, 2);
    Ok(vec![zeros.index_add(&n.i64s(&dst)?, &v, 2).reshape(&out)])
}

/// The input `i`'s data, which these host computations need.
fn needed<'a>(n: &'a Node, i: usize, what: &str) -> Result<Option<&'a ndfuse::Array>> {
    n.known(i).map_err(|_| {
        n.unsupported(format!(
            "{what} computed in the graph (only {what} known at import time are supported: \
             they decide the shape of the computation)"
        ))
    })
}

fn roi_align(n: &Node) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    if xs.len() != 4 {
        return Err(n.bad(format!("input {xs:?} must be [N, C, H, W]")));
    }
    let dtype = n.dtype(0)?;
    if !dtype.is_float() {
        return Err(n.unsupported(format!("RoiAlign of {dtype:?}")));
    }
    let rois = needed(n, 1, "rois")?
        .ok_or_else(|| n.bad("input rois is required"))?
        .to_f64_vec();
    let batch: Vec<i64> = {
        let a = needed(n, 2, "batch_indices")?
            .ok_or_else(|| n.bad("input batch_indices is required"))?;
        a.to_f64_vec().iter().map(|&v| v as i64).collect()
    };
    let nr = batch.len();
    if rois.len() != 4 * nr {
        return Err(n.bad(format!("{} roi values for {nr} batch indices", rois.len())));
    }
    let half = if n.opset < 16 {
        false
    } else {
        match n
            .string("coordinate_transformation_mode")?
            .as_deref()
            .unwrap_or("half_pixel")
        {
            "half_pixel" => true,
            "output_half_pixel" => false,
            other => return Err(n.bad(format!("coordinate_transformation_mode '{other}'"))),
        }
    };
    let max_mode = match n.string("mode")?.as_deref().unwrap_or("avg") {
        "avg" => false,
        "max" => true,
        other => return Err(n.bad(format!("mode '{other}'"))),
    };
    let ph = n.int_or("output_height", 1)?;
    let pw = n.int_or("output_width", 1)?;
    let ratio = n.int_or("sampling_ratio", 0)?;
    let scale = n.float_or("spatial_scale", 1.0)? as f32;
    if ph < 1 || pw < 1 || ratio < 0 {
        return Err(n.bad(format!("output {ph}x{pw}, sampling_ratio {ratio}")));
    }
    let (b, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (hf, wf) = (h as f32, w as f32);
    // Per roi: its samples (4 positions and weights each), as the reference in f32.
    struct Roi {
        samples: Vec<([i64; 4], [f32; 4])>,
        grid: usize,
        count: f32,
    }
    let mut all = Vec::with_capacity(nr);
    for (ri, &bi) in batch.iter().enumerate() {
        if bi < 0 || bi as usize >= b {
            return Err(n.bad(format!("batch index {bi} for a batch of {b}")));
        }
        let off = if half { 0.5f32 } else { 0.0 };
        let v = |j: usize| rois[4 * ri + j] as f32 * scale - off;
        let (sw, sh, ew, eh) = (v(0), v(1), v(2), v(3));
        let (mut rw, mut rh) = (ew - sw, eh - sh);
        if !half {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / ph as f32, rw / pw as f32);
        let gh = if ratio > 0 {
            ratio
        } else {
            (rh / ph as f32).ceil() as i64
        }
        .max(0) as usize;
        let gw = if ratio > 0 {
            ratio
        } else {
            (rw / pw as f32).ceil() as i64
        }
        .max(0) as usize;
        let mut samples = Vec::new();
        for py in 0..ph {
            for px in 0..pw {
                for iy in 0..gh {
                    let yy = sh + py as f32 * bh + (iy as f32 + 0.5) * bh / gh as f32;
                    for ix in 0..gw {
                        let xx = sw + px as f32 * bw + (ix as f32 + 0.5) * bw / gw as f32;
                        if yy < -1.0 || yy > hf || xx < -1.0 || xx > wf {
                            samples.push(([0; 4], [0.0; 4]));
                            continue;
                        }
                        let (mut y, mut x) = (yy.max(0.0), xx.max(0.0));
                        let (mut yl, mut xl) = (y as i64, x as i64);
                        let yh = if yl >= h as i64 - 1 {
                            yl = h as i64 - 1;
                            y = yl as f32;
                            yl
                        } else {
                            yl + 1
                        };
                        let xh = if xl >= w as i64 - 1 {
                            xl = w as i64 - 1;
                            x = xl as f32;
                            xl
                        } else {
                            xl + 1
                        };
                        let (ly, lx) = (y - yl as f32, x - xl as f32);
                        let (hy, hx) = (1.0 - ly, 1.0 - lx);
                        let base = bi * (h * w) as i64;
                        let wi = w as i64;
                        samples.push((
                            [
                                base + yl * wi + xl,
                                base + yl * wi + xh,
                                base + yh * wi + xl,
                                base + yh * wi + xh,
                            ],
                            [hy * hx, hy * lx, ly * hx, ly * lx],
                        ));
                    }
                }
            }
        }
        all.push(Roi {
            samples,
            grid: gh * gw,
            count: (gh * gw).max(1) as f32,
        });
    }
    // Every roi padded to the most samples per bin (weight 0, masked for max).
    let s = all.iter().map(|r| r.grid).max().unwrap_or(0).max(1);
    let bins = (ph * pw) as usize;
    let total = nr * bins * s;
    let (mut idx, mut wts, mut mask) = (
        Vec::with_capacity(total * 4),
        Vec::with_capacity(total * 4),
        Vec::with_capacity(total),
    );
    let mut counts = Vec::with_capacity(nr);
    for roi in &all {
        counts.push(f64::from(roi.count));
        for bin in 0..bins {
            for j in 0..s {
                let (real, (pos, wt)) = if j < roi.grid {
                    (true, roi.samples[bin * roi.grid + j])
                } else {
                    // A bin without samples reads 0 (one zero-weight sample).
                    (roi.grid == 0 && j == 0, ([0; 4], [0.0; 4]))
                };
                idx.extend(pos);
                wts.extend(wt.iter().map(|&v| f64::from(v)));
                mask.push(real);
            }
        }
    }
    let dims = [nr, bins, s, 4];
    let xc = n
        .input(0)?
        .permute(&[1, 0, 2, 3])
        .reshape(&[c as i64, (b * h * w) as i64]);
    let g = xc.take(&i64_tensor(n, idx, &[total * 4])?, 1).reshape(&[
        c as i64,
        nr as i64,
        bins as i64,
        s as i64,
        4,
    ]);
    let wt = n.host(wts, &dims, dtype)?.expand_dims(0);
    let prod = g.mul(wt);
    let y = if max_mode {
        let m = n
            .ctx
            .from_vec(mask, &[1, nr, bins, s])
            .map_err(|e| n.bad(e.to_string()))?;
        m.where_(prod.max(&[4i64][..]), f64::NEG_INFINITY)
            .max(&[3i64][..])
    } else {
        let cnt = n.host(counts, &[1, nr, 1], dtype)?;
        prod.sum(&[3i64, 4][..]).div(cnt)
    };
    Ok(vec![y
        .reshape(&[c as i64, nr as i64, ph, pw])
        .permute(&[1, 0, 2, 3])])
}

fn nms(n: &Node) -> Result<Vec<Tensor>> {
    let bs = n.shape(0)?;
    let ss = n.shape(1)?;
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(n.bad(format!("boxes {bs:?} and scores {ss:?}")));
    }
    let boxes: Vec<f32> = needed(n, 0, "boxes")?
        .ok_or_else(|| n.bad("input boxes is required"))?
        .to_f64_vec()
        .iter()
        .map(|&v| v as f32)
        .collect();
    let scores: Vec<f32> = needed(n, 1, "scores")?
        .ok_or_else(|| n.bad("input scores is required"))?
        .to_f64_vec()
        .iter()
        .map(|&v| v as f32)
        .collect();
    let first_f = |i: usize, what: &str| -> Result<Option<f32>> {
        Ok(needed(n, i, what)?
            .map(ndfuse::Array::to_f64_vec)
            .and_then(|v| v.first().map(|&x| x as f32)))
    };
    let max_out = match needed(n, 2, "max_output_boxes_per_class")? {
        Some(a) => a.to_f64_vec().first().map_or(0, |&v| (v as i64).max(0)),
        None => 0,
    };
    let iou = first_f(3, "iou_threshold")?.unwrap_or(0.0);
    let score_min = first_f(4, "score_threshold")?;
    let center = n.int_or("center_point_box", 0)? != 0;
    let (nbatch, nclass, nbox) = (bs[0], ss[1], bs[1]);
    let mut out: Vec<i64> = Vec::new();
    for bi in 0..nbatch {
        let bx = &boxes[bi * nbox * 4..(bi + 1) * nbox * 4];
        for ci in 0..nclass {
            let sc = &scores[(bi * nclass + ci) * nbox..(bi * nclass + ci + 1) * nbox];
            let mut cand: Vec<usize> = (0..nbox)
                .filter(|&j| score_min.is_none_or(|t| sc[j] > t))
                .collect();
            cand.sort_by(|&a, &b| {
                sc[b]
                    .partial_cmp(&sc[a])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(&b))
            });
            let mut kept: Vec<usize> = Vec::new();
            for j in cand {
                if kept.len() as i64 >= max_out {
                    break;
                }
                if kept.iter().all(|&k| !suppress(bx, j, k, center, iou)) {
                    kept.push(j);
                    out.extend([bi as i64, ci as i64, j as i64]);
                }
            }
        }
    }
    let rows = out.len() / 3;
    Ok(vec![i64_tensor(n, out, &[rows, 3])?])
}

/// Whether boxes `a` and `b` overlap by more than `iou` (the reference's f32 arithmetic).
fn suppress(bx: &[f32], a: usize, b: usize, center: bool, iou: f32) -> bool {
    let (p, q) = (&bx[4 * a..4 * a + 4], &bx[4 * b..4 * b + 4]);
    let span = |lo: f32, hi: f32| if lo >= hi { (hi, lo) } else { (lo, hi) };
    let (px, py, qx, qy) = if center {
        let c = |v: &[f32], i: usize, j: usize| (v[i] - v[j] / 2.0, v[i] + v[j] / 2.0);
        (c(p, 0, 2), c(p, 1, 3), c(q, 0, 2), c(q, 1, 3))
    } else {
        (
            span(p[1], p[3]),
            span(p[0], p[2]),
            span(q[1], q[3]),
            span(q[0], q[2]),
        )
    };
    let (ix0, ix1) = (px.0.max(qx.0), px.1.min(qx.1));
    if ix1 <= ix0 {
        return false;
    }
    let (iy0, iy1) = (py.0.max(qy.0), py.1.min(qy.1));
    if iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    if inter <= 0.0 {
        return false;
    }
    let area1 = (px.1 - px.0) * (py.1 - py.0);
    let area2 = (qx.1 - qx.0) * (qy.1 - qy.0);
    let union = area1 + area2 - inter;
    if area1 <= 0.0 || area2 <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > iou
}
