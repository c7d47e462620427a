//! Layers: Linear, activations, LayerNorm, Dropout and Sequential. A layer's forward
//! pass only builds lazy tensors; the training step evaluates forward, backward and the
//! optimiser together as one graph.
//!
//! Mixed precision: in a context whose default dtype is f16 or bf16, a layer computes
//! in that dtype ([`autocast`] of its input, [`Parameter::value_like`] of its f32
//! parameters), and normalisation statistics are taken in f32 ([`in_f32`]).

use crate::data::hash64;
use crate::error::Result;
use crate::init::Init;
use crate::param::Parameter;
use ndfuse::{Context, DType, Tensor};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

/// `x` in the dtype layers compute in: the default dtype of `x`'s context when that is
/// f16 or bf16 and `x` is a float tensor of another dtype (autocast: a half-precision
/// context computes in half precision whatever its data comes in), else `x` itself.
///
/// ```
/// use ndfuse::DType;
/// let ctx = ndfuse::Context::builder().dtype(DType::BF16).build()?;
/// let x = ctx.from_vec(vec![1.0f32, 2.0], &[2])?;
/// assert_eq!(ndfuse_nn::autocast(&x).dtype()?, DType::BF16);
/// # Ok::<(), ndfuse::Error>(())
/// ```
pub fn autocast(x: &Tensor) -> Tensor {
    let half = x.context().default_dtype();
    match x.dtype() {
        Ok(d) if half.is_half() && d.is_float() && d != half => x.cast(half),
        _ => x.clone(),
    }
}

/// `f(x)` computed in f32 when `x` is f16 or bf16 (cast up, then the result back to
/// `x`'s dtype): for statistics such as a normalisation's mean and variance, whose sums
/// and differences lose too much in 8 or 11 bits of mantissa. Other dtypes as they are.
pub fn in_f32(x: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
    match x.dtype() {
        Ok(d) if d.is_half() => f(&x.cast(DType::F32)).cast(d),
        _ => f(x),
    }
}

/// Whether a forward pass trains (Dropout drops) or evaluates (Dropout passes through),
/// and the random key of the step, from which each layer draws its own.
#[derive(Debug, Clone)]
pub struct Mode {
    /// The step's key (a 0-d i64 data tensor) when training.
    key: Option<Tensor>,
    /// This layer's offset from the step's key (each container gives each of its
    /// layers its own): a constant of the graph, so the graph stays the same.
    salt: i64,
    /// The new values of buffers the pass computed ([`Mode::record`]), shared by the
    /// modes of every layer of one training pass.
    updates: Option<Updates>,
}

/// The buffer values a training pass recorded, shared by its layers' modes.
type Updates = Arc<Mutex<Vec<(Parameter, Tensor)>>>;

impl Mode {
    /// Evaluation: no randomness.
    pub fn eval() -> Mode {
        Mode {
            key: None,
            salt: 0,
            updates: None,
        }
    }

    /// Training with the step's `key`, a 0-d i64 data tensor ([`Context::key`]) that
    /// changes every step: as data, a new key does not change the compiled graph.
    pub fn train(key: Tensor) -> Mode {
        Mode {
            key: Some(key),
            salt: 0,
            updates: Some(Arc::default()),
        }
    }

    /// Whether this pass trains.
    pub fn is_train(&self) -> bool {
        self.key.is_some()
    }

    /// The mode of sub-layer `i` of a container: its own offset, so two Dropout layers
    /// of one model draw different masks.
    pub fn child(&self, i: usize) -> Mode {
        Mode {
            key: self.key.clone(),
            salt: hash64(self.salt as u64 ^ hash64(i as u64 + 1)) as i64,
            updates: self.updates.clone(),
        }
    }

    /// Records `value` as the new value of `buffer` (a layer's state that is not
    /// trained by gradients: batch norm's running statistics) when this pass trains;
    /// the trainer evaluates it with the step and stores it. Nothing when evaluating.
    pub fn record(&self, buffer: &Parameter, value: Tensor) {
        if let Some(updates) = &self.updates {
            updates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((buffer.clone(), value));
        }
    }

    /// The buffer values recorded by the layers of this pass so far, in order.
    pub fn recorded(&self) -> Vec<(Parameter, Tensor)> {
        self.updates.as_ref().map_or_else(Vec::new, |u| {
            u.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }

    /// This layer's random key (the step's key plus the layer's offset, wrapping), when
    /// training.
    pub fn key(&self) -> Option<Tensor> {
        self.key.as_ref().map(|k| k + self.salt)
    }
}

/// A differentiable function of one tensor with its own parameters.
pub trait Layer: Debug + Send + Sync {
    /// The output for input `x` (lazy; an illegal shape gives a tensor carrying the
    /// error with the call site, as every ndfuse op does).
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor;

    /// The trainable parameters, in a fixed order.
    fn parameters(&self) -> Vec<Parameter> {
        Vec::new()
    }

    /// The state that is not trained by gradients but saved and restored with the
    /// parameters (batch norm's running statistics), in a fixed order; a training pass
    /// gives their new values through [`Mode::record`].
    fn buffers(&self) -> Vec<Parameter> {
        Vec::new()
    }

    /// A replica: the same layer with parameters of its own that start at this layer's
    /// current values (shared data, no copy: a step replaces a parameter's value, never
    /// writes into it). Data-parallel training keeps one replica per worker.
    fn duplicate(&self) -> Box<dyn Layer>;
}

impl Layer for Box<dyn Layer> {
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        (**self).forward(x, mode)
    }

    fn parameters(&self) -> Vec<Parameter> {
        (**self).parameters()
    }

    fn buffers(&self) -> Vec<Parameter> {
        (**self).buffers()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        (**self).duplicate()
    }
}

/// `y = x @ weight + bias`, with `weight` of shape `[in, out]` (so the product needs no
/// transpose) and `bias` of shape `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Parameter,
    bias: Option<Parameter>,
}

impl Linear {
    /// A layer from `inputs` to `outputs` features named `name` (`name.weight`,
    /// `name.bias`), weights drawn by `init` from `seed`, bias zero.
    ///
    /// ```
    /// use ndfuse_nn::{Init, Layer, Linear, Mode};
    /// let ctx = ndfuse::Context::new();
    /// let fc = Linear::new(&ctx, "fc", 3, 2, Init::GlorotUniform, 1)?;
    /// let y = fc.forward(&ctx.ones(&[4, 3]), &Mode::eval());
    /// assert_eq!(y.shape()?, &[4, 2]);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn new(
        ctx: &Context,
        name: &str,
        inputs: usize,
        outputs: usize,
        init: Init,
        seed: u64,
    ) -> Result<Linear> {
        let w = init.tensor(ctx, &[inputs, outputs], inputs, outputs, seed);
        Ok(Linear {
            weight: Parameter::new(format!("{name}.weight"), &w)?,
            bias: Some(Parameter::new(
                format!("{name}.bias"),
                &ctx.zeros(&[outputs]),
            )?),
        })
    }

    /// A layer holding `weight` (`[in, out]`) and `bias` (`[out]`), shared, not copied:
    /// a pretrained model's projections. `Err` naming both shapes when they do not fit.
    pub fn from_parameters(weight: Parameter, bias: Option<Parameter>) -> Result<Linear> {
        let (w, b) = (weight.shape(), bias.as_ref().map(Parameter::shape));
        let fits = w.len() == 2 && b.as_ref().is_none_or(|b| b[..] == w[1..]);
        if !fits {
            return Err(crate::error::Error::Argument {
                what: "Linear::from_parameters",
                why: format!("weight {w:?} must be [in, out] and bias {b:?} [out]"),
            });
        }
        Ok(Linear { weight, bias })
    }

    /// The same layer without a bias.
    pub fn without_bias(mut self) -> Linear {
        self.bias = None;
        self
    }

    /// The weight, `[in, out]`.
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }

    /// The bias, `[out]`, if the layer has one.
    pub fn bias(&self) -> Option<&Parameter> {
        self.bias.as_ref()
    }

    /// A replica (see [`Layer::duplicate`]), as a `Linear`.
    pub fn replica(&self) -> Linear {
        Linear {
            weight: self.weight.duplicate(),
            bias: self.bias.as_ref().map(Parameter::duplicate),
        }
    }
}

impl Layer for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let x = autocast(x);
        let y = x.matmul(&self.weight.value_like(&x));
        match &self.bias {
            Some(b) => &y + &b.value_like(&x),
            None => y,
        }
    }

    fn parameters(&self) -> Vec<Parameter> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.replica())
    }
}

/// `y = x @ weight^T` with a block-quantised `weight` (`[out, in]`, llama.cpp's Q8_0,
/// Q4_0 or Q4_1 rows: [`ndfuse::QuantMatrix`]), dequantised inside the product: a
/// pretrained model's projection read at 4.5 or 8.5 bits a weight. f32 out. Frozen: it
/// has no trainable parameters (quantised weights are for inference).
#[derive(Debug, Clone)]
pub struct QuantLinear {
    weight: ndfuse::QuantMatrix,
}

impl QuantLinear {
    /// The layer over `weight` (shared, not copied).
    pub fn new(weight: ndfuse::QuantMatrix) -> QuantLinear {
        QuantLinear { weight }
    }

    /// The weight.
    pub fn weight(&self) -> &ndfuse::QuantMatrix {
        &self.weight
    }
}

impl Layer for QuantLinear {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        x.quant_matmul(&self.weight)
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

/// An element-wise non-linearity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh form (`Tensor::gelu`).
    Gelu,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
}

impl Layer for Activation {
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(*self)
    }
}

/// Layer normalisation over the last axis with a learned scale (`name.weight`, ones)
/// and shift (`name.bias`, zeros): `(x - mean) / sqrt(var + eps) * weight + bias`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Parameter,
    bias: Parameter,
    eps: f64,
}

impl LayerNorm {
    /// Normalisation of `features` features with `eps` added to the variance.
    pub fn new(ctx: &Context, name: &str, features: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: Parameter::new(format!("{name}.weight"), &ctx.ones(&[features]))?,
            bias: Parameter::new(format!("{name}.bias"), &ctx.zeros(&[features]))?,
            eps,
        })
    }

    /// A normalisation holding `weight` and `bias` (`[features]` each), shared, not
    /// copied: a pretrained model's. `Err` naming both shapes when they differ.
    pub fn from_parameters(weight: Parameter, bias: Parameter, eps: f64) -> Result<LayerNorm> {
        let (w, b) = (weight.shape(), bias.shape());
        if w.len() != 1 || w != b {
            return Err(crate::error::Error::Argument {
                what: "LayerNorm::from_parameters",
                why: format!("weight {w:?} and bias {b:?} must be the same [features]"),
            });
        }
        Ok(LayerNorm { weight, bias, eps })
    }
}

impl Layer for LayerNorm {
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let x = autocast(x);
        let n = in_f32(&x, |x| x.layernorm(-1, self.eps));
        &(&n * &self.weight.value_like(&x)) + &self.bias.value_like(&x)
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.weight.clone(), self.bias.clone()]
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(LayerNorm {
            weight: self.weight.duplicate(),
            bias: self.bias.duplicate(),
            eps: self.eps,
        })
    }
}

/// Inverted dropout: in training, each element is zeroed with probability `p` and the
/// kept ones scaled by `1 / (1 - p)`; in evaluation, the identity. The mask comes from
/// the IR's counter-based random op keyed by the step's seed (see [`Mode`]), so it is
/// the same bits on every backend and thread count, and fuses into the kernels around
/// it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f64,
}

impl Dropout {
    /// Dropout of probability `p` in `[0, 1)` (checked when the layer runs: another
    /// value gives a tensor carrying the error, with the call site).
    pub fn new(p: f64) -> Dropout {
        Dropout { p }
    }
}

impl Layer for Dropout {
    #[track_caller]
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        match mode.key() {
            Some(key) => x.dropout(self.p, &key),
            None => x.clone(),
        }
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(*self)
    }
}

/// Layers applied one after another.
#[derive(Debug, Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
}

impl Sequential {
    /// No layers (the identity).
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// This model with `layer` appended.
    pub fn push(mut self, layer: impl Layer + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// The layers in order.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }

    /// A multi-layer perceptron of `widths` (`[64, 128, 10]`: one hidden layer of 128):
    /// Linear layers named `fc0`, `fc1`, ... (He-uniform weights for ReLU and GELU,
    /// Glorot-uniform otherwise, seeds `seed`, `seed + 1`, ...) with `activation`
    /// between them and none after the last.
    pub fn mlp(
        ctx: &Context,
        widths: &[usize],
        activation: Activation,
        seed: u64,
    ) -> Result<Sequential> {
        let init = match activation {
            Activation::Relu | Activation::Gelu => Init::HeUniform,
            Activation::Tanh | Activation::Sigmoid => Init::GlorotUniform,
        };
        let mut m = Sequential::new();
        for (i, w) in widths.windows(2).enumerate() {
            if i > 0 {
                m = m.push(activation);
            }
            let name = format!("fc{i}");
            m = m.push(Linear::new(ctx, &name, w[0], w[1], init, seed + i as u64)?);
        }
        Ok(m)
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        self.layers
            .iter()
            .enumerate()
            .fold(x.clone(), |x, (i, layer)| layer.forward(&x, &mode.child(i)))
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }

    fn buffers(&self) -> Vec<Parameter> {
        self.layers.iter().flat_map(|l| l.buffers()).collect()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.replica())
    }
}

impl Sequential {
    /// A replica of the model (see [`Layer::duplicate`]), as a `Sequential`.
    pub fn replica(&self) -> Sequential {
        Sequential {
            layers: self.layers.iter().map(|l| l.duplicate()).collect(),
        }
    }
}
