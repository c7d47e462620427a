//! Convolutions with PyTorch's semantics (`torch.nn.functional.conv1d` / `conv2d`):
//! inputs `[N, C, L]` or `[N, C, H, W]`, weights `[O, C / groups, k...]`, stride,
//! padding (per side, or `same` / `valid`), dilation and groups, depthwise included.
//!
//! For now a convolution is a composite of ops the compiler already has, so it runs on
//! every backend and differentiates through their rules: every window's taps are one
//! gather along the flattened spatial axes (im2col's `[C * k, out]` matrix per batch
//! position, taps in the padding selected to zero), multiplied by the weights `[O, C *
//! k]` (per group, a batched product) with the bias in the product's epilogue, the
//! output already NCHW. `relu(conv2d(x, w, b))` is two kernels: the windows' matrix,
//! and the product with the bias and the relu as its epilogue (the relu reads the
//! product through the reshape of `[N, O, out]` to `[N, O, h, w]`, which the passes move
//! below it: `ndfuse_passes::SinkReshapes`). The
//! window matrix is materialised (`N * C * k * out` elements); an implicit GEMM that
//! packs the windows straight from the input is the next step (issue 36).

use crate::error::Error;
use crate::ops::SliceArg;
use crate::tensor::Tensor;
use ndfuse_ir::PadMode;
use std::panic::Location;

pub(crate) type At = &'static Location<'static>;

/// How a convolution pads its input's spatial axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Padding {
    /// No padding (PyTorch's `'valid'`).
    Valid,
    /// The output as long as the input on every spatial axis (stride 1 only):
    /// `dilation * (k - 1)` zeros in all, the odd one after (PyTorch's `'same'`).
    Same,
    /// `(before, after)` zeros on each spatial axis; one pair for all of them.
    Explicit(Vec<(usize, usize)>),
}

impl From<usize> for Padding {
    fn from(p: usize) -> Self {
        Padding::Explicit(vec![(p, p)])
    }
}

impl From<(usize, usize)> for Padding {
    /// `(p_h, p_w)`: symmetric padding per axis, as PyTorch's pair.
    fn from((a, b): (usize, usize)) -> Self {
        Padding::Explicit(vec![(a, a), (b, b)])
    }
}

impl From<&str> for Padding {
    /// `"same"` or `"valid"`; anything else is `Explicit` of nothing, refused by the
    /// convolution with the string named.
    fn from(s: &str) -> Self {
        match s {
            "same" => Padding::Same,
            "valid" => Padding::Valid,
            _ => Padding::Explicit(vec![]),
        }
    }
}

/// A per-axis setting given once for every spatial axis or per axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spatial(pub Vec<usize>);

impl From<usize> for Spatial {
    fn from(v: usize) -> Self {
        Spatial(vec![v])
    }
}

impl From<(usize, usize)> for Spatial {
    fn from((a, b): (usize, usize)) -> Self {
        Spatial(vec![a, b])
    }
}

impl From<&[usize]> for Spatial {
    fn from(v: &[usize]) -> Self {
        Spatial(v.to_vec())
    }
}

/// A convolution's settings (PyTorch's defaults: stride 1, no padding, dilation 1, one
/// group).
///
/// ```
/// use ndfuse::Conv;
/// let c = Conv::new().stride(2).padding(1).groups(4);
/// assert_eq!(c.groups_count(), 4);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv {
    pub(crate) stride: Spatial,
    pub(crate) padding: Padding,
    pub(crate) dilation: Spatial,
    pub(crate) groups: usize,
    pub(crate) output_padding: Spatial,
}

impl Default for Conv {
    fn default() -> Self {
        Conv {
            stride: Spatial(vec![1]),
            padding: Padding::Explicit(vec![(0, 0)]),
            dilation: Spatial(vec![1]),
            groups: 1,
            output_padding: Spatial(vec![0]),
        }
    }
}

impl Conv {
    /// Stride 1, no padding, dilation 1, one group.
    pub fn new() -> Self {
        Conv::default()
    }

    /// The step between windows: one for every axis, or one per axis.
    pub fn stride(mut self, s: impl Into<Spatial>) -> Self {
        self.stride = s.into();
        self
    }

    /// Zeros around the input: `p`, `(p_h, p_w)`, `"same"`, `"valid"` or
    /// [`Padding::Explicit`] with a `(before, after)` pair per axis.
    pub fn padding(mut self, p: impl Into<Padding>) -> Self {
        self.padding = p.into();
        self
    }

    /// The spacing of a window's taps: one for every axis, or one per axis.
    pub fn dilation(mut self, d: impl Into<Spatial>) -> Self {
        self.dilation = d.into();
        self
    }

    /// Groups of channels convolved apart (channels / groups inputs per output);
    /// `groups == channels` is a depthwise convolution.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }

    /// Zeros added after the output of a transposed convolution on each spatial axis
    /// (PyTorch's `output_padding`: which of the `stride` input sizes that give one
    /// output size to invert); less than the stride or the dilation. A convolution
    /// refuses a non-zero one.
    pub fn output_padding(mut self, p: impl Into<Spatial>) -> Self {
        self.output_padding = p.into();
        self
    }

    /// The number of groups.
    pub fn groups_count(&self) -> usize {
        self.groups
    }
}

impl Tensor {
    /// PyTorch's `conv1d`: `x [N, C, L]` with weights `w [O, C / groups, k]` and an
    /// optional bias `[O]`, to `[N, O, L_out]` with `L_out = (L + pads - dilation *
    /// (k - 1) - 1) / stride + 1`. Errors (channels that do not match, groups that do not divide
    /// them, a window longer than the padded input, `same` with a stride) name both
    /// shapes and the call site.
    #[track_caller]
    pub fn conv1d(&self, w: &Tensor, bias: Option<&Tensor>, conv: &Conv) -> Tensor {
        conv_at("conv1d", 1, self, w, bias, conv, Location::caller())
    }

    /// PyTorch's `conv2d`: `x [N, C, H, W]` with weights `w [O, C / groups, kh, kw]` and
    /// an optional bias `[O]`, to `[N, O, H_out, W_out]`; see [`Tensor::conv1d`].
    ///
    /// ```
    /// use ndfuse::Conv;
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.ones(&[1, 1, 4, 4]);
    /// let w = ctx.ones(&[2, 1, 3, 3]);
    /// let y = x.conv2d(&w, None, &Conv::new().padding(1)).eval()?;
    /// assert_eq!(y.shape(), &[1, 2, 4, 4]);
    /// // A corner sees 4 of the 9 taps, an edge 6, the middle all 9.
    /// assert_eq!(&y.to_vec::<f32>()?[..4], &[4.0, 6.0, 6.0, 4.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn conv2d(&self, w: &Tensor, bias: Option<&Tensor>, conv: &Conv) -> Tensor {
        conv_at("conv2d", 2, self, w, bias, conv, Location::caller())
    }
}

/// The checked geometry of one convolution.
struct Geometry {
    n: usize,
    c: usize,
    o: usize,
    groups: usize,
    kernel: Vec<usize>,
    pads: Vec<(usize, usize)>,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    out: Vec<usize>,
}

/// `setting` for `r` spatial axes: one value for all, or one each.
pub(crate) fn per_axis(what: &str, s: &Spatial, r: usize) -> Result<Vec<usize>, String> {
    match s.0.len() {
        1 => Ok(vec![s.0[0]; r]),
        l if l == r => Ok(s.0.clone()),
        l => Err(format!(
            "{what} has {l} values for {r} spatial axes (give 1 or {r})"
        )),
    }
}

/// Checks that the bias, if any, is `[o]`; `shapes` names the operands for the message.
pub(crate) fn check_bias(bias: Option<&[usize]>, o: usize, shapes: &str) -> Result<(), String> {
    match bias {
        Some(b) if b != [o] => Err(format!(
            "{shapes}: bias {b:?} must be [{o}], one per output channel"
        )),
        _ => Ok(()),
    }
}

/// The stride and dilation of `conv` for `r` spatial axes, each at least 1.
pub(crate) fn steps(conv: &Conv, r: usize) -> Result<(Vec<usize>, Vec<usize>), String> {
    let stride = per_axis("stride", &conv.stride, r)?;
    let dilation = per_axis("dilation", &conv.dilation, r)?;
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(format!(
            "stride {stride:?} and dilation {dilation:?} must be at least 1"
        ));
    }
    Ok((stride, dilation))
}

fn geometry(
    r: usize,
    x: &[usize],
    w: &[usize],
    bias: Option<&[usize]>,
    conv: &Conv,
) -> Result<Geometry, String> {
    let shapes = || format!("x {x:?}, w {w:?}");
    if x.len() != r + 2 || w.len() != r + 2 {
        return Err(format!(
            "{}: x must be [N, C, {}] and w [O, C / groups, {}]",
            shapes(),
            ["L", "H, W", "D, H, W"][r - 1],
            ["k", "kh, kw", "kd, kh, kw"][r - 1]
        ));
    }
    let (n, c, o, per_group) = (x[0], x[1], w[0], w[1]);
    let groups = conv.groups;
    if groups == 0 || c % groups != 0 || o % groups != 0 {
        return Err(format!(
            "{}: groups = {groups} must divide the {c} input channels and the {o} output channels",
            shapes()
        ));
    }
    if per_group != c / groups {
        return Err(format!(
            "{}: x has {c} channels, so w's second axis must be {c} / groups = {}, not {per_group}",
            shapes(),
            c / groups
        ));
    }
    check_bias(bias, o, &shapes())?;
    let (stride, dilation) = steps(conv, r)?;
    if per_axis("output_padding", &conv.output_padding, r)?
        .iter()
        .any(|&p| p != 0)
    {
        return Err(format!(
            "output_padding {:?} is for transposed convolutions only",
            conv.output_padding.0
        ));
    }
    let kernel = w[2..].to_vec();
    let pads = match &conv.padding {
        Padding::Valid => vec![(0, 0); r],
        Padding::Same => {
            if stride.iter().any(|&s| s != 1) {
                return Err(format!(
                    "padding 'same' needs stride 1, not {stride:?} (as PyTorch)"
                ));
            }
            (0..r)
                .map(|i| {
                    let total = dilation[i] * kernel[i].saturating_sub(1);
                    (total / 2, total - total / 2)
                })
                .collect()
        }
        Padding::Explicit(p) if p.len() == 1 => vec![p[0]; r],
        Padding::Explicit(p) if p.len() == r => p.clone(),
        Padding::Explicit(p) => {
            return Err(format!(
                "padding has {} pairs for {r} spatial axes (give 1 or {r}, or 'same' / 'valid')",
                p.len()
            ))
        }
    };
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let padded = x[2 + i] + pads[i].0 + pads[i].1;
        let span = dilation[i] * kernel[i].saturating_sub(1) + 1;
        if kernel[i] == 0 || span > padded {
            return Err(format!(
                "{}: spatial axis {i}: the window spans {span} (kernel {} at dilation {}), longer than the padded input's {padded}",
                shapes(),
                kernel[i],
                dilation[i]
            ));
        }
        out.push((padded - span) / stride[i] + 1);
    }
    Ok(Geometry {
        n,
        c,
        o,
        groups,
        kernel,
        pads,
        stride,
        dilation,
        out,
    })
}

#[track_caller]
pub(crate) fn conv_at(
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
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Tensor::poisoned(&x.ctx, e),
    };
    let g = match geometry(r, xs, ws, bs, conv) {
        Ok(g) => g,
        Err(why) => return Tensor::poisoned(&x.ctx, Error::Argument { what, why, at }),
    };
    let Geometry {
        n,
        c,
        o,
        groups,
        ref kernel,
        ref pads,
        ref stride,
        ref dilation,
        ref out,
    } = g;
    let taps: usize = kernel.iter().product();
    let dims: Vec<i64> = [n, o].iter().chain(out).map(|&d| d as i64).collect();
    let with_bias = |y: Tensor| match bias {
        Some(b) => {
            let mut shape = vec![1i64; r + 1];
            shape[0] = o as i64;
            y + b.reshape(&shape)
        }
        None => y,
    };
    let unit = |v: &[usize]| v.iter().all(|&s| s == 1);
    let unpadded = pads.iter().all(|&p| p == (0, 0));
    if taps == 1 && groups == 1 && unit(stride) && unpadded {
        // Pointwise: the input is already the windows' matrix, [N, C, H*W]: no gather.
        let positions: usize = out.iter().product();
        let y = w.reshape(&[o as i64, c as i64]).matmul(&x.reshape(&[
            n as i64,
            c as i64,
            positions as i64,
        ]));
        return with_bias(y.reshape(&dims));
    }
    if groups == c && groups == o && taps > 1 {
        return with_bias(depthwise(x, w, kernel, pads, stride, dilation, out));
    }
    let positions: usize = out.iter().product();
    if groups == 1 && positions * 4 <= n {
        // Few positions in many batch items (a sequence of short frames): one product
        // over every (item, position), [N * P, C * k] @ [C * k, O], not N products of
        // P columns each (313 of 4 columns in silero-vad: the GEMM's worst shape).
        let rows = match rows_of_windows(x, xs, &taps_of(xs, kernel, stride, dilation, pads, out)) {
            Ok(r) => r,
            Err(e) => return Tensor::poisoned(&x.ctx, e),
        };
        let ck = (c * taps) as i64;
        let y = rows
            .reshape(&[(n * positions) as i64, ck])
            .matmul(&w.reshape(&[o as i64, ck]).transpose())
            .reshape(&[n as i64, positions as i64, o as i64])
            .permute(&[0, 2, 1]);
        return with_bias(y.reshape(&dims));
    }
    let cols = match windows(
        x,
        xs,
        &taps_of(xs, kernel, stride, dilation, pads, out),
        0.0,
    ) {
        Ok((cols, _)) => cols,
        Err(e) => return Tensor::poisoned(&x.ctx, e),
    };
    let positions: usize = out.iter().product();
    // [N, C, k.., out..] -> [N, G, Cg * k, out] @ by w [G, Og, Cg * k] -> [N, G, Og, out].
    let (cg, og) = (c / groups, o / groups);
    let (n, g, o, cgk, p) = (
        n as i64,
        groups as i64,
        o as i64,
        (cg * taps) as i64,
        positions as i64,
    );
    let y = if groups == 1 {
        let cols = cols.reshape(&[n, cgk, p]);
        w.reshape(&[o, cgk]).matmul(&cols)
    } else {
        let cols = cols.reshape(&[n, g, cgk, p]);
        w.reshape(&[g, og as i64, cgk])
            .matmul(&cols)
            .reshape(&[n, o, p])
    };
    let y = match bias {
        Some(b) => y + b.reshape(&[o, 1]),
        None => y,
    };
    y.reshape(&dims)
}

/// A depthwise convolution (one filter per channel) as the sum over the taps of the
/// weight times a strided view of the padded input: one element-wise kernel reading the
/// input in place, where the windows' gather and a product of one row per channel
/// wrote (and read back) `taps` times the input. Measured on PP-OCR's detector.
fn depthwise(
    x: &Tensor,
    w: &Tensor,
    kernel: &[usize],
    pads: &[(usize, usize)],
    stride: &[usize],
    dilation: &[usize],
    out: &[usize],
) -> Tensor {
    let r = kernel.len();
    let widths: Vec<(usize, usize)> = [(0, 0), (0, 0)]
        .into_iter()
        .chain(pads.iter().copied())
        .collect();
    let padded = if widths.iter().all(|&p| p == (0, 0)) {
        x.clone()
    } else {
        x.pad(&widths, PadMode::Constant, 0.0)
    };
    let channels = w.shape().map(|s| s[0]).unwrap_or(0) as i64;
    let mut wshape = vec![1i64; r + 1];
    wshape[0] = channels;
    let taps: usize = kernel.iter().product();
    let mut acc: Option<Tensor> = None;
    for t in 0..taps {
        let mut rest = t;
        let mut tap = vec![0usize; r];
        for a in (0..r).rev() {
            tap[a] = rest % kernel[a];
            rest /= kernel[a];
        }
        let mut view = vec![SliceArg::all(), SliceArg::all()];
        let mut wsel = vec![SliceArg::all(), SliceArg::all()];
        for a in 0..r {
            let start = (tap[a] * dilation[a]) as i64;
            let stop = start + (stride[a] * (out[a] - 1)) as i64 + 1;
            view.push(SliceArg::new(Some(start), Some(stop), stride[a] as i64));
            wsel.push(SliceArg::new(
                Some(tap[a] as i64),
                Some(tap[a] as i64 + 1),
                1,
            ));
        }
        let term = padded.slice(&view) * w.slice(&wsel).reshape(&wshape);
        acc = Some(match acc {
            Some(a) => a + term,
            None => term,
        });
    }
    acc.expect("a depthwise kernel has at least two taps")
}

/// The geometry of a convolution's or pooling's windows over the spatial axes.
#[derive(Clone, Copy)]
struct Taps<'a> {
    spatial: &'a [usize],
    kernel: &'a [usize],
    stride: &'a [usize],
    dilation: &'a [usize],
    pads: &'a [(usize, usize)],
    out: &'a [usize],
}

/// The windows' geometry of an input of shape `xs` (`[N, C, spatial...]`).
fn taps_of<'a>(
    xs: &'a [usize],
    kernel: &'a [usize],
    stride: &'a [usize],
    dilation: &'a [usize],
    pads: &'a [(usize, usize)],
    out: &'a [usize],
) -> Taps<'a> {
    Taps {
        spatial: &xs[2..],
        kernel,
        stride,
        dilation,
        pads,
        out,
    }
}

impl Taps<'_> {
    /// The flat spatial position that tap `tap` of the window at output position
    /// `position` reads (both row-major over their axes), or `None` in the padding.
    fn read(&self, mut tap: usize, mut position: usize) -> Option<i64> {
        let (mut flat, mut step, mut inside) = (0i64, 1i64, true);
        for a in (0..self.kernel.len()).rev() {
            let (t, o) = (tap % self.kernel[a], position % self.out[a]);
            tap /= self.kernel[a];
            position /= self.out[a];
            let q = (o * self.stride[a] + t * self.dilation[a]) as i64 - self.pads[a].0 as i64;
            let extent = self.spatial[a] as i64;
            inside &= (0..extent).contains(&q);
            flat += q * step;
            step *= extent;
        }
        inside.then_some(flat)
    }
}

/// The taps of every window of `x` (`xs`: `[N, C, spatial...]`) as one gather along the
/// flattened spatial axes: `[N, C, k_1..k_r, o_1..o_r]` (im2col's order, so the windows'
/// matrix per batch position is `[C * k, out]` with no transpose), and the mask of the
/// taps inside the input (`None` when every tap is). A tap in the padding reads
/// position 0 and is replaced by `fill` (a select, so an inf or NaN there does not
/// leak into it, as padding does not). One kernel: padded slices stacked instead took
/// 3.4x as long (the stack's copy of nine parts is slower than the gather).
#[track_caller]
fn windows(
    x: &Tensor,
    xs: &[usize],
    at: &Taps<'_>,
    fill: f64,
) -> Result<(Tensor, Option<Tensor>), Error> {
    let Taps { kernel, out, .. } = *at;
    let spatial = &xs[2..];
    let taps: usize = kernel.iter().product();
    let positions: usize = out.iter().product();
    let mut index = Vec::with_capacity(taps * positions);
    let mut inside = Vec::with_capacity(taps * positions);
    // Row-major over [k_1..k_r, o_1..o_r].
    for t in 0..taps * positions {
        let read = at.read(t / positions, t % positions);
        index.push(read.unwrap_or(0));
        inside.push(read.is_some());
    }
    let dims: Vec<usize> = kernel.iter().chain(out.iter()).copied().collect();
    let padded = inside.contains(&false);
    // A 1-d index and mask: the select runs on the gather's own shape, then the result
    // is split into taps and positions (a view between them would store the gather
    // and make the select a kernel of its own).
    let idx = x.ctx.from_vec(index, &[taps * positions])?;
    let mask = x.ctx.from_vec(inside, &[taps * positions])?;
    let flat = x.reshape(&[
        xs[0] as i64,
        xs[1] as i64,
        spatial.iter().product::<usize>() as i64,
    ]);
    let split: Vec<i64> = [xs[0], xs[1]]
        .iter()
        .chain(&dims)
        .map(|&d| d as i64)
        .collect();
    let taken = flat.take(&idx, 2);
    Ok(if padded {
        let m: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let cols = mask.where_(&taken, fill).reshape(&split);
        (cols, Some(mask.reshape(&m)))
    } else {
        (taken.reshape(&split), None)
    })
}

/// The windows of `x` in the transposed order, `[N, P, C * k]` (one row per output
/// position, the taps of every channel along it), as one gather over the flattened
/// channels and spatial axes; taps in the padding are 0. For few positions only: the
/// index holds P * C * k entries.
#[track_caller]
fn rows_of_windows(x: &Tensor, xs: &[usize], at: &Taps<'_>) -> Result<Tensor, Error> {
    let Taps { kernel, out, .. } = *at;
    let (n, c) = (xs[0], xs[1]);
    let spatial = &xs[2..];
    let size: usize = spatial.iter().product();
    let taps: usize = kernel.iter().product();
    let positions: usize = out.iter().product();
    let mut index = Vec::with_capacity(positions * c * taps);
    let mut inside = Vec::with_capacity(positions * c * taps);
    for p in 0..positions {
        for ch in 0..c {
            for tap in 0..taps {
                let read = at.read(tap, p);
                index.push(read.map_or(0, |f| (ch * size) as i64 + f));
                inside.push(read.is_some());
            }
        }
    }
    let count = index.len();
    let idx = x.ctx.from_vec(index, &[count])?;
    let taken = x.reshape(&[n as i64, (c * size) as i64]).take(&idx, 1);
    Ok(if inside.contains(&false) {
        let mask = x.ctx.from_vec(inside, &[count])?;
        mask.where_(&taken, 0.0)
    } else {
        taken
    })
}

/// A pooling's settings (PyTorch's `max_pool2d` / `avg_pool2d`): the window, its stride
/// (the window by default), zeros (or, for max, minus infinity) on both sides of each
/// axis, the taps' spacing (max only) and whether an average counts the padding.
///
/// ```
/// use ndfuse::Pool;
/// let ctx = ndfuse::Context::new();
/// let x = ctx.from_vec((0..16).map(|v| v as f32).collect(), &[1, 1, 4, 4])?;
/// let y = x.max_pool2d(&Pool::new(2)).eval()?;
/// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
/// let a = x.avg_pool2d(&Pool::new(3).stride(1).padding(1).count_include_pad(false)).eval()?;
/// assert_eq!(a.to_vec::<f32>()?[0], (0.0 + 1.0 + 4.0 + 5.0) / 4.0);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    kernel: Spatial,
    stride: Option<Spatial>,
    padding: Spatial,
    dilation: Spatial,
    count_include_pad: bool,
}

impl Pool {
    /// A window of `kernel` (one extent for every axis, or one per axis), stride equal
    /// to it, no padding, dilation 1, averages counting the padding.
    pub fn new(kernel: impl Into<Spatial>) -> Self {
        Pool {
            kernel: kernel.into(),
            stride: None,
            padding: Spatial(vec![0]),
            dilation: Spatial(vec![1]),
            count_include_pad: true,
        }
    }

    /// The step between windows.
    pub fn stride(mut self, s: impl Into<Spatial>) -> Self {
        self.stride = Some(s.into());
        self
    }

    /// Padding on both sides of each axis: at most half the window, as PyTorch.
    pub fn padding(mut self, p: impl Into<Spatial>) -> Self {
        self.padding = p.into();
        self
    }

    /// The spacing of a window's taps (max pooling).
    pub fn dilation(mut self, d: impl Into<Spatial>) -> Self {
        self.dilation = d.into();
        self
    }

    /// Whether an average divides by the whole window (true, PyTorch's default) or by
    /// the taps inside the input.
    pub fn count_include_pad(mut self, yes: bool) -> Self {
        self.count_include_pad = yes;
        self
    }
}

/// Which reduction a pooling takes over each window.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PoolKind {
    Max,
    Avg,
}

impl Tensor {
    /// PyTorch's `max_pool2d`: the largest tap of each window of `x [N, C, H, W]`, to
    /// `[N, C, H_out, W_out]`; padding is minus infinity. The gradient goes to the first
    /// largest tap of each window (row-major within it), as PyTorch's does.
    #[track_caller]
    pub fn max_pool2d(&self, pool: &Pool) -> Tensor {
        pool_at("max_pool2d", PoolKind::Max, self, pool, Location::caller())
    }

    /// PyTorch's `avg_pool2d`: the mean of each window of `x [N, C, H, W]`, dividing by
    /// the whole window or, with `count_include_pad(false)`, by its taps inside `x`.
    #[track_caller]
    pub fn avg_pool2d(&self, pool: &Pool) -> Tensor {
        pool_at("avg_pool2d", PoolKind::Avg, self, pool, Location::caller())
    }

    /// Global average pooling (PyTorch's `adaptive_avg_pool2d(x, 1)`): the mean over the
    /// spatial axes of `x [N, C, H, W]`, to `[N, C, 1, 1]`.
    #[track_caller]
    pub fn global_avg_pool2d(&self) -> Tensor {
        let at = Location::caller();
        match self.shape() {
            Ok(s) if s.len() == 4 => self.mean_keepdims(&[2i64, 3][..]),
            Ok(s) => Tensor::poisoned(
                &self.ctx,
                Error::Argument {
                    what: "global_avg_pool2d",
                    why: format!("x {s:?} must be [N, C, H, W]"),
                    at,
                },
            ),
            Err(e) => Tensor::poisoned(&self.ctx, e),
        }
    }
}

#[track_caller]
fn pool_at(what: &'static str, kind: PoolKind, x: &Tensor, pool: &Pool, at: At) -> Tensor {
    let fail = |why: String| Tensor::poisoned(&x.ctx, Error::Argument { what, why, at });
    let xs = match x.shape() {
        Ok(s) => s,
        Err(e) => return Tensor::poisoned(&x.ctx, e),
    };
    let r = 2;
    if xs.len() != r + 2 {
        return fail(format!("x {xs:?} must be [N, C, H, W]"));
    }
    let axes = |what: &str, s: &Spatial| per_axis(what, s, r);
    let settings = (
        axes("kernel", &pool.kernel),
        axes("stride", pool.stride.as_ref().unwrap_or(&pool.kernel)),
        axes("padding", &pool.padding),
        axes("dilation", &pool.dilation),
    );
    let (kernel, stride, padding, dilation) = match settings {
        (Ok(k), Ok(s), Ok(p), Ok(d)) => (k, s, p, d),
        (Err(e), ..) | (_, Err(e), ..) | (_, _, Err(e), _) | (.., Err(e)) => return fail(e),
    };
    if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
        return fail(format!(
            "kernel {kernel:?}, stride {stride:?} and dilation {dilation:?} must be at least 1"
        ));
    }
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let span = dilation[i] * (kernel[i] - 1) + 1;
        if 2 * padding[i] > span {
            return fail(format!(
                "padding {padding:?} must be at most half the window's span on each axis (as PyTorch)"
            ));
        }
        let padded = xs[2 + i] + 2 * padding[i];
        if span > padded {
            return fail(format!(
                "x {xs:?}: axis {}: the window spans {span}, longer than the padded input's {padded}",
                2 + i
            ));
        }
        out.push((padded - span) / stride[i] + 1);
    }
    let pads: Vec<(usize, usize)> = padding.iter().map(|&p| (p, p)).collect();
    let fill = match kind {
        PoolKind::Max => f64::NEG_INFINITY,
        PoolKind::Avg => 0.0,
    };
    let (cols, mask) = match windows(
        x,
        xs,
        &taps_of(xs, &kernel, &stride, &dilation, &pads, &out),
        fill,
    ) {
        Ok(w) => w,
        Err(e) => return Tensor::poisoned(&x.ctx, e),
    };
    // [N, C, k_h, k_w, out_h, out_w] -> [N, C, k, out_h, out_w].
    let taps = (kernel[0] * kernel[1]) as i64;
    let (n, c) = (xs[0] as i64, xs[1] as i64);
    let (oh, ow) = (out[0] as i64, out[1] as i64);
    let cols = cols.reshape(&[n, c, taps, oh, ow]);
    match kind {
        // The first largest tap: argmax, then that tap (its gradient goes there alone).
        PoolKind::Max => {
            let first = cols.argmax_keepdims(2);
            cols.take_along_axis(&first, 2).reshape(&[n, c, oh, ow])
        }
        PoolKind::Avg => {
            let sum = cols.sum(&[2i64][..]);
            match (pool.count_include_pad, mask) {
                (false, Some(mask)) => {
                    let dtype = sum.dtype().unwrap_or(ndfuse_ir::DType::F32);
                    let counts = mask
                        .cast(dtype)
                        .sum(&[0i64, 1][..])
                        .reshape(&[1, 1, oh, ow]);
                    sum / counts
                }
                _ => sum / taps as f64,
            }
        }
    }
}
