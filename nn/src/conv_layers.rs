//! The layers of convolutional networks: [`Conv2d`] (learned weights `[O, I / groups,
//! kh, kw]` and bias `[O]`), [`Conv1d`] (weights `[O, I / groups, k]` over NCL
//! sequences), [`ConvTranspose2d`] (weights `[I, O / groups, kh, kw]`), [`MaxPool2d`],
//! [`AvgPool2d`], [`GlobalAvgPool`] and [`Flatten`], over NCHW tensors with PyTorch's
//! semantics (`ndfuse::Tensor::conv2d`, `conv1d`, `conv_transpose2d`, `max_pool2d`,
//! `avg_pool2d`, `global_avg_pool2d`).

use crate::error::{Error, Result};
use crate::init::Init;
use crate::layers::{autocast, Layer, Mode};
use crate::param::Parameter;
use ndfuse::{Context, Conv, Pool, Tensor};

/// What a convolution layer learns and how it convolves: the weight, the bias (zeros
/// at first) and the settings.
#[derive(Debug, Clone)]
struct Learned {
    weight: Parameter,
    bias: Option<Parameter>,
    conv: Conv,
}

impl Learned {
    /// Weights of `shape` drawn by `init` from `seed` with fans `fans`, a bias of
    /// `outputs` zeros, named `name.weight` and `name.bias`.
    fn new(
        ctx: &Context,
        name: &str,
        (shape, fans): (&[usize], (usize, usize)),
        outputs: usize,
        conv: Conv,
        (init, seed): (Init, u64),
    ) -> Result<Learned> {
        let w = init.tensor(ctx, shape, fans.0, fans.1, seed);
        Ok(Learned {
            weight: Parameter::new(format!("{name}.weight"), &w)?,
            bias: Some(Parameter::new(
                format!("{name}.bias"),
                &ctx.zeros(&[outputs]),
            )?),
            conv,
        })
    }

    /// The input cast as the model computes, the weight and the bias in its dtype.
    fn operands(&self, x: &Tensor) -> (Tensor, Tensor, Option<Tensor>) {
        let x = autocast(x);
        let w = self.weight.value_like(&x);
        let b = self.bias.as_ref().map(|b| b.value_like(&x));
        (x, w, b)
    }

    fn parameters(&self) -> Vec<Parameter> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }

    fn duplicate(&self) -> Learned {
        Learned {
            weight: self.weight.duplicate(),
            bias: self.bias.as_ref().map(Parameter::duplicate),
            conv: self.conv.clone(),
        }
    }
}

/// A 2-D convolution: `conv2d(x, weight, bias)` with the settings of `conv`.
#[derive(Debug, Clone)]
pub struct Conv2d(Learned);

impl Conv2d {
    /// A layer from `inputs` to `outputs` channels with a `kernel` window (one extent,
    /// or `(kh, kw)`), named `name` (`name.weight`, `name.bias`), weights drawn by
    /// `init` from `seed` (fans as PyTorch counts them: `inputs / groups * kh * kw` in,
    /// `outputs / groups * kh * kw` out), bias zero.
    ///
    /// ```
    /// use ndfuse::Conv;
    /// use ndfuse_nn::{Conv2d, Init, Layer, Mode};
    /// let ctx = ndfuse::Context::new();
    /// let c = Conv2d::new(&ctx, "c1", 3, 8, (3, 3), Conv::new().padding(1), Init::HeUniform, 1)?;
    /// let y = c.forward(&ctx.ones(&[2, 3, 10, 10]), &Mode::eval());
    /// assert_eq!(y.shape()?, &[2, 8, 10, 10]);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        name: &str,
        inputs: usize,
        outputs: usize,
        kernel: impl Into<ndfuse::Spatial>,
        conv: Conv,
        init: Init,
        seed: u64,
    ) -> Result<Conv2d> {
        let (k, groups) = checked("Conv2d::new", kernel, 2, &conv, inputs, outputs)?;
        let (kh, kw) = (k[0], k[1]);
        let per_group = inputs / groups;
        let shape = [outputs, per_group, kh, kw];
        let fans = (per_group * kh * kw, outputs / groups * kh * kw);
        let learned = Learned::new(ctx, name, (&shape, fans), outputs, conv, (init, seed))?;
        Ok(Conv2d(learned))
    }

    /// The same layer without a bias.
    pub fn without_bias(mut self) -> Conv2d {
        self.0.bias = None;
        self
    }

    /// The weight, `[O, I / groups, kh, kw]`.
    pub fn weight(&self) -> &Parameter {
        &self.0.weight
    }

    /// The bias, `[O]`, if the layer has one.
    pub fn bias(&self) -> Option<&Parameter> {
        self.0.bias.as_ref()
    }
}

/// The kernel's extent on each of `rank` spatial axes (one extent is every axis's) and
/// the groups of a layer's settings, checked.
fn checked(
    what: &'static str,
    kernel: impl Into<ndfuse::Spatial>,
    rank: usize,
    conv: &Conv,
    inputs: usize,
    outputs: usize,
) -> Result<(Vec<usize>, usize)> {
    let k = kernel.into().0;
    let k = match k[..] {
        [e] => vec![e; rank],
        _ if k.len() == rank => k,
        _ => {
            let per_axis = if rank == 2 { " or (kh, kw)" } else { "" };
            return Err(Error::Argument {
                what,
                why: format!("kernel {k:?}: give one extent{per_axis}"),
            });
        }
    };
    let groups = conv.groups_count();
    if groups == 0 || !inputs.is_multiple_of(groups) || !outputs.is_multiple_of(groups) {
        return Err(Error::Argument {
            what,
            why: format!(
                "groups = {groups} must divide the {inputs} input and {outputs} output channels"
            ),
        });
    }
    Ok((k, groups))
}

/// A 1-D convolution over sequences `[N, C, L]`: `conv1d(x, weight, bias)` with the
/// settings of `conv` (PyTorch's `Conv1d`).
#[derive(Debug, Clone)]
pub struct Conv1d(Learned);

impl Conv1d {
    /// A layer from `inputs` to `outputs` channels with a window of `kernel` taps, named
    /// `name` (`name.weight`, `name.bias`), weights `[outputs, inputs / groups, kernel]`
    /// drawn by `init` from `seed` (fans as PyTorch counts them: `inputs / groups *
    /// kernel` in, `outputs / groups * kernel` out), bias zero.
    ///
    /// ```
    /// use ndfuse::Conv;
    /// use ndfuse_nn::{Conv1d, Init, Layer, Mode};
    /// let ctx = ndfuse::Context::new();
    /// let c = Conv1d::new(&ctx, "c1", 4, 8, 5, Conv::new().padding("same"), Init::HeUniform, 1)?;
    /// let y = c.forward(&ctx.ones(&[2, 4, 30]), &Mode::eval());
    /// assert_eq!(y.shape()?, &[2, 8, 30]);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        name: &str,
        inputs: usize,
        outputs: usize,
        kernel: usize,
        conv: Conv,
        init: Init,
        seed: u64,
    ) -> Result<Conv1d> {
        let (_, groups) = checked("Conv1d::new", kernel, 1, &conv, inputs, outputs)?;
        let per_group = inputs / groups;
        let shape = [outputs, per_group, kernel];
        let fans = (per_group * kernel, outputs / groups * kernel);
        let learned = Learned::new(ctx, name, (&shape, fans), outputs, conv, (init, seed))?;
        Ok(Conv1d(learned))
    }

    /// The same layer without a bias.
    pub fn without_bias(mut self) -> Conv1d {
        self.0.bias = None;
        self
    }

    /// The weight, `[O, I / groups, k]`.
    pub fn weight(&self) -> &Parameter {
        &self.0.weight
    }

    /// The bias, `[O]`, if the layer has one.
    pub fn bias(&self) -> Option<&Parameter> {
        self.0.bias.as_ref()
    }
}

impl Layer for Conv1d {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let (x, w, b) = self.0.operands(x);
        x.conv1d(&w, b.as_ref(), &self.0.conv)
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.0.parameters()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(Conv1d(self.0.duplicate()))
    }
}

/// A 2-D transposed convolution (`conv_transpose2d(x, weight, bias)` with the settings
/// of `conv`, its output padding included): the layer that upsamples in decoders and
/// generators.
#[derive(Debug, Clone)]
pub struct ConvTranspose2d(Learned);

impl ConvTranspose2d {
    /// A layer from `inputs` to `outputs` channels with a `kernel` window, named `name`,
    /// weights `[inputs, outputs / groups, kh, kw]` drawn by `init` from `seed` (fans
    /// as PyTorch counts them for this layout: `outputs / groups * kh * kw` in,
    /// `inputs / groups * kh * kw` out), bias zero.
    ///
    /// ```
    /// use ndfuse::Conv;
    /// use ndfuse_nn::{ConvTranspose2d, Init, Layer, Mode};
    /// let ctx = ndfuse::Context::new();
    /// let up = Conv::new().stride(2).padding(1).output_padding(1);
    /// let c = ConvTranspose2d::new(&ctx, "up", 8, 4, 3, up, Init::HeUniform, 1)?;
    /// let y = c.forward(&ctx.ones(&[2, 8, 5, 5]), &Mode::eval());
    /// assert_eq!(y.shape()?, &[2, 4, 10, 10]);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        name: &str,
        inputs: usize,
        outputs: usize,
        kernel: impl Into<ndfuse::Spatial>,
        conv: Conv,
        init: Init,
        seed: u64,
    ) -> Result<ConvTranspose2d> {
        let (k, groups) = checked("ConvTranspose2d::new", kernel, 2, &conv, inputs, outputs)?;
        let (kh, kw) = (k[0], k[1]);
        let per_group = outputs / groups;
        let shape = [inputs, per_group, kh, kw];
        let fans = (per_group * kh * kw, inputs / groups * kh * kw);
        let learned = Learned::new(ctx, name, (&shape, fans), outputs, conv, (init, seed))?;
        Ok(ConvTranspose2d(learned))
    }

    /// The same layer without a bias.
    pub fn without_bias(mut self) -> ConvTranspose2d {
        self.0.bias = None;
        self
    }

    /// The weight, `[I, O / groups, kh, kw]`.
    pub fn weight(&self) -> &Parameter {
        &self.0.weight
    }
}

impl Layer for ConvTranspose2d {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let (x, w, b) = self.0.operands(x);
        x.conv_transpose2d(&w, b.as_ref(), &self.0.conv)
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.0.parameters()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(ConvTranspose2d(self.0.duplicate()))
    }
}

impl Layer for Conv2d {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let (x, w, b) = self.0.operands(x);
        x.conv2d(&w, b.as_ref(), &self.0.conv)
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.0.parameters()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(Conv2d(self.0.duplicate()))
    }
}

/// Batch normalisation over the channels of `[N, C, ...]` (PyTorch's `BatchNorm2d`,
/// and `BatchNorm1d` over `[N, C]` or `[N, C, L]`): in training, each batch is
/// normalised by its own statistics and the running mean and variance move towards
/// them by `momentum` (the variance unbiased), recorded through [`Mode::record`] and
/// stored by the trainer with the step; in evaluation, the running statistics are
/// used. Learned scale `weight` (ones) and shift `bias` (zeros); the running
/// statistics are the layer's buffers (`name.running_mean`, zeros, and
/// `name.running_var`, ones), saved in checkpoints.
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    weight: Parameter,
    bias: Parameter,
    running_mean: Parameter,
    running_var: Parameter,
    settings: ndfuse::BatchNorm,
}

impl BatchNorm2d {
    /// A layer over `features` channels named `name`, with PyTorch's momentum 0.1 and
    /// eps 1e-5 unless `settings` says otherwise (its training flag is ignored: the
    /// pass's [`Mode`] decides).
    ///
    /// ```
    /// use ndfuse_nn::{BatchNorm2d, Layer, Mode};
    /// let ctx = ndfuse::Context::new();
    /// let bn = BatchNorm2d::new(&ctx, "bn1", 3, ndfuse::BatchNorm::new())?;
    /// // Running statistics of zero mean and unit variance: evaluation passes x through.
    /// let x = ctx.ones(&[2, 3, 4, 4]);
    /// let y = bn.forward(&x, &Mode::eval()).eval()?;
    /// assert!(y.to_f64_vec().iter().all(|&v| (v - 1.0).abs() < 1e-4));
    /// assert_eq!(bn.buffers().len(), 2);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn new(
        ctx: &Context,
        name: &str,
        features: usize,
        settings: ndfuse::BatchNorm,
    ) -> Result<BatchNorm2d> {
        let vector = |what: &str, one: bool| {
            let v = if one {
                ctx.ones(&[features])
            } else {
                ctx.zeros(&[features])
            };
            Parameter::new(format!("{name}.{what}"), &v)
        };
        Ok(BatchNorm2d {
            weight: vector("weight", true)?,
            bias: vector("bias", false)?,
            running_mean: vector("running_mean", false)?,
            running_var: vector("running_var", true)?,
            settings,
        })
    }
}

impl Layer for BatchNorm2d {
    #[track_caller]
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        let x = autocast(x);
        let (w, b) = (self.weight.value_like(&x), self.bias.value_like(&x));
        let (rm, rv) = (
            self.running_mean.value_like(&x),
            self.running_var.value_like(&x),
        );
        let training = mode.is_train();
        let bn = self.settings.clone().training(training);
        if training {
            let (m, v) = x.batch_norm_running(&rm, &rv, &bn);
            mode.record(&self.running_mean, m.cast(self.running_mean.dtype()));
            mode.record(&self.running_var, v.cast(self.running_var.dtype()));
        }
        x.batch_norm(Some(&rm), Some(&rv), Some(&w), Some(&b), &bn)
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.weight.clone(), self.bias.clone()]
    }

    fn buffers(&self) -> Vec<Parameter> {
        vec![self.running_mean.clone(), self.running_var.clone()]
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(BatchNorm2d {
            weight: self.weight.duplicate(),
            bias: self.bias.duplicate(),
            running_mean: self.running_mean.duplicate(),
            running_var: self.running_var.duplicate(),
            settings: self.settings.clone(),
        })
    }
}

/// Max pooling over NCHW windows (`Tensor::max_pool2d`).
#[derive(Debug, Clone)]
pub struct MaxPool2d(pub Pool);

impl Layer for MaxPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        x.max_pool2d(&self.0)
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

/// Average pooling over NCHW windows (`Tensor::avg_pool2d`).
#[derive(Debug, Clone)]
pub struct AvgPool2d(pub Pool);

impl Layer for AvgPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        x.avg_pool2d(&self.0)
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

/// The mean over the spatial axes, `[N, C, H, W]` to `[N, C, 1, 1]`.
#[derive(Debug, Clone, Copy)]
pub struct GlobalAvgPool;

impl Layer for GlobalAvgPool {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        x.global_avg_pool2d()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(*self)
    }
}

/// Every axis after the first as one: `[N, ...]` to `[N, product]`.
#[derive(Debug, Clone, Copy)]
pub struct Flatten;

impl Layer for Flatten {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        match x.shape() {
            Ok(s) if !s.is_empty() => x.reshape(&[s[0] as i64, -1]),
            _ => x.reshape(&[-1]),
        }
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(*self)
    }
}
