//! Transposed convolutions with PyTorch's semantics (`torch.nn.functional.
//! conv_transpose1d` / `conv_transpose2d`): inputs `[N, C, L]` or `[N, C, H, W]`,
//! weights `[C, O / groups, k...]`, stride, padding, output padding, dilation and
//! groups; the adjoint of the convolution with the same settings (the gradient of
//! `conv2d` with respect to its input).
//!
//! Composed from the convolution: the input with `stride - 1` zeros between its
//! elements (an expand, a pad and a reshape: views and one pad, which the consumer's
//! gather reads through), convolved at stride 1 with the kernel flipped and its
//! channels swapped within each group, padded by `dilation * (k - 1) - padding`
//! (cropped where that is negative) plus the output padding after.

use crate::conv::{check_bias, conv_at, per_axis, steps, At, Conv, Padding, Spatial};
use crate::error::Error;
use crate::ops::SliceArg;
use crate::tensor::Tensor;
use ndfuse_ir::PadMode;
use std::panic::Location;

impl Tensor {
    /// PyTorch's `conv_transpose1d`: `x [N, C, L]` with weights `w [C, O / groups, k]`
    /// and an optional bias `[O]`, to `[N, O, L_out]` with `L_out = (L - 1) * stride -
    /// pads + dilation * (k - 1) + output_padding + 1`. Padding is `p`, a pair per
    /// axis or `'valid'` (`'same'` is refused, as by PyTorch). Errors name both shapes
    /// and the call site.
    #[track_caller]
    pub fn conv_transpose1d(&self, w: &Tensor, bias: Option<&Tensor>, conv: &Conv) -> Tensor {
        conv_transpose_at(
            "conv_transpose1d",
            1,
            self,
            w,
            bias,
            conv,
            Location::caller(),
        )
    }

    /// PyTorch's `conv_transpose2d`: `x [N, C, H, W]` with weights `w [C, O / groups,
    /// kh, kw]` and an optional bias `[O]`, to `[N, O, H_out, W_out]`; see
    /// [`Tensor::conv_transpose1d`].
    ///
    /// ```
    /// use ndfuse::Conv;
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2])?;
    /// let w = ctx.ones(&[1, 1, 2, 2]);
    /// let y = x.conv_transpose2d(&w, None, &Conv::new()).eval()?;
    /// assert_eq!(y.shape(), &[1, 1, 3, 3]);
    /// assert_eq!(y.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn conv_transpose2d(&self, w: &Tensor, bias: Option<&Tensor>, conv: &Conv) -> Tensor {
        conv_transpose_at(
            "conv_transpose2d",
            2,
            self,
            w,
            bias,
            conv,
            Location::caller(),
        )
    }
}

/// The checked settings of a transposed convolution: groups, the kernel, and per
/// spatial axis the stride, the dilation, the output padding and the padding's pairs.
struct Settings {
    groups: usize,
    out_channels: usize,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    output_padding: Vec<usize>,
    pads: Vec<(usize, usize)>,
}

fn settings(
    r: usize,
    x: &[usize],
    w: &[usize],
    bias: Option<&[usize]>,
    conv: &Conv,
) -> Result<Settings, String> {
    let shapes = || format!("x {x:?}, w {w:?}");
    if x.len() != r + 2 || w.len() != r + 2 {
        return Err(format!(
            "{}: x must be [N, C, {}] and w [C, O / groups, {}]",
            shapes(),
            ["L", "H, W"][r - 1],
            ["k", "kh, kw"][r - 1]
        ));
    }
    let (c, groups) = (x[1], conv.groups);
    if groups == 0 || c % groups != 0 {
        return Err(format!(
            "{}: groups = {groups} must divide the {c} input channels",
            shapes()
        ));
    }
    if w[0] != c {
        return Err(format!(
            "{}: x has {c} channels, so w's first axis must be {c}, not {}",
            shapes(),
            w[0]
        ));
    }
    let out_channels = w[1] * groups;
    check_bias(bias, out_channels, &shapes())?;
    let (stride, dilation) = steps(conv, r)?;
    let output_padding = per_axis("output_padding", &conv.output_padding, r)?;
    for i in 0..r {
        if output_padding[i] >= stride[i].max(dilation[i]) {
            return Err(format!(
                "output_padding {output_padding:?} must be smaller than the stride {stride:?} or the dilation {dilation:?} on each axis"
            ));
        }
    }
    let pads = match &conv.padding {
        Padding::Valid => vec![(0, 0); r],
        Padding::Same => {
            return Err("padding 'same' is not defined for a transposed convolution".into())
        }
        Padding::Explicit(p) if p.len() == 1 => vec![p[0]; r],
        Padding::Explicit(p) if p.len() == r => p.clone(),
        Padding::Explicit(p) => {
            return Err(format!(
                "padding has {} pairs for {r} spatial axes (give 1 or {r}, or 'valid')",
                p.len()
            ))
        }
    };
    let kernel = w[2..].to_vec();
    for i in 0..r {
        let full = (x[2 + i].max(1) - 1) * stride[i]
            + dilation[i] * kernel[i].saturating_sub(1)
            + output_padding[i]
            + 1;
        if kernel[i] == 0 || x[2 + i] == 0 || pads[i].0 + pads[i].1 >= full {
            return Err(format!(
                "{}: spatial axis {i}: padding {:?} leaves no output of the {full} positions (kernel {}, stride {}, dilation {})",
                shapes(),
                pads[i],
                kernel[i],
                stride[i],
                dilation[i]
            ));
        }
    }
    Ok(Settings {
        groups,
        out_channels,
        kernel,
        stride,
        dilation,
        output_padding,
        pads,
    })
}

#[track_caller]
fn conv_transpose_at(
    what: &'static str,
    r: usize,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    conv: &Conv,
    at: At,
) -> Tensor {
    let shapes = (x.shape(), w.shape(), bias.map(|b| b.shape()).transpose());
    let (xs, ws, bs) = match shapes {
        (Ok(a), Ok(b), Ok(c)) => (a.to_vec(), b.to_vec(), c.map(<[usize]>::to_vec)),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Tensor::poisoned(&x.ctx, e),
    };
    let s = match settings(r, &xs, &ws, bs.as_deref(), conv) {
        Ok(s) => s,
        Err(why) => return Tensor::poisoned(&x.ctx, Error::Argument { what, why, at }),
    };
    // The input with stride - 1 zeros between its elements, cropped where the padding
    // is wider than the kernel's reach.
    let mut up = x.clone();
    let mut dims: Vec<i64> = xs.iter().map(|&d| d as i64).collect();
    let mut conv_pads = Vec::with_capacity(r);
    for i in 0..r {
        let a = 2 + i;
        let st = s.stride[i];
        if st > 1 {
            let mut widths = vec![(0, 0); dims.len() + 1];
            widths[a + 1] = (0, st - 1);
            let mut merged = dims.clone();
            merged[a] *= st as i64;
            let mut keep = vec![SliceArg::all(); a];
            keep.push(SliceArg::new(
                Some(0),
                Some((dims[a] - 1) * st as i64 + 1),
                1,
            ));
            up = up
                .expand_dims(a as i64 + 1)
                .pad(&widths, PadMode::Constant, 0.0)
                .reshape(&merged)
                .slice(&keep);
            dims[a] = (dims[a] - 1) * st as i64 + 1;
        }
        let reach = (s.dilation[i] * (s.kernel[i] - 1)) as i64;
        let before = reach - s.pads[i].0 as i64;
        let after = reach - s.pads[i].1 as i64 + s.output_padding[i] as i64;
        if before < 0 || after < 0 {
            let mut keep = vec![SliceArg::all(); a];
            let start = (-before).max(0);
            keep.push(SliceArg::new(
                Some(start),
                Some(dims[a] - (-after).max(0)),
                1,
            ));
            up = up.slice(&keep);
            dims[a] -= start + (-after).max(0);
        }
        conv_pads.push((before.max(0) as usize, after.max(0) as usize));
    }
    // The kernel flipped, its in and out channels swapped within each group.
    let g = s.groups as i64;
    let (cg, og) = (xs[1] as i64 / g, ws[1] as i64);
    let k: Vec<i64> = s.kernel.iter().map(|&k| k as i64).collect();
    let split: Vec<i64> = [g, cg, og].into_iter().chain(k.iter().copied()).collect();
    let perm: Vec<i64> = [0, 2, 1]
        .into_iter()
        .chain((0..r as i64).map(|i| 3 + i))
        .collect();
    let joined: Vec<i64> = [s.out_channels as i64, cg].into_iter().chain(k).collect();
    let mut flip = vec![SliceArg::all(); 2];
    flip.extend(std::iter::repeat_n(SliceArg::new(None, None, -1), r));
    let wt = w
        .reshape(&split)
        .permute(&perm)
        .reshape(&joined)
        .slice(&flip);
    let forward = Conv {
        stride: Spatial(vec![1]),
        padding: Padding::Explicit(conv_pads),
        dilation: Spatial(s.dilation.clone()),
        groups: s.groups,
        output_padding: Spatial(vec![0]),
    };
    conv_at(what, r, &up, &wt, bias, &forward, at)
}
