//! The layers of a transformer: token [`Embedding`], learned [`PositionEmbedding`],
//! rotary position embedding ([`Rope`], both pair layouts), [`RmsNorm`],
//! [`MultiHeadAttention`] (grouped-query heads, causal, dropout, on the fused
//! `attention` op), [`FeedForward`] (GELU MLP or SwiGLU) and the pre-norm
//! [`TransformerBlock`]. Like every layer they only build lazy tensors.

use crate::error::{Error, Result};
use crate::init::Init;
use crate::layers::{autocast, in_f32, Dropout, Layer, LayerNorm, Linear, Mode};
use crate::param::Parameter;
use ndfuse::{Context, DType, SliceArg, Tensor};

/// A table of `vocab` learned vectors of `dim` features, read by token id: the forward
/// pass takes an integer (i32 or i64) tensor of ids `[...]` and gives `[..., dim]`. The
/// lookup is a `take` on the table's first axis, so its gradient is a scatter-add of
/// the output's gradient into the rows of the ids. In a context whose default dtype is
/// f16 or bf16 the output is in that dtype (the table stays f32: see [`autocast`]).
#[derive(Debug, Clone)]
pub struct Embedding {
    weight: Parameter,
}

impl Embedding {
    /// A table named `name` (`name.weight`, `[vocab, dim]`) drawn by `init` from `seed`
    /// (GPT-2 draws it from `Init::Normal(0.0, 0.02)`).
    ///
    /// ```
    /// use ndfuse_nn::{Embedding, Init, Layer, Mode};
    /// let ctx = ndfuse::Context::new();
    /// let e = Embedding::new(&ctx, "tok", 10, 4, Init::Normal(0.0, 0.02), 1)?;
    /// let ids = ctx.from_vec(vec![3i64, 1, 3], &[1, 3])?;
    /// assert_eq!(e.forward(&ids, &Mode::eval()).shape()?, &[1, 3, 4]);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn new(
        ctx: &Context,
        name: &str,
        vocab: usize,
        dim: usize,
        init: Init,
        seed: u64,
    ) -> Result<Embedding> {
        let w = init.tensor(ctx, &[vocab, dim], vocab, dim, seed);
        Ok(Embedding {
            weight: Parameter::new(format!("{name}.weight"), &w)?,
        })
    }

    /// A table holding `weight` (`[vocab, dim]`), shared, not copied.
    pub fn from_parameter(weight: Parameter) -> Embedding {
        Embedding { weight }
    }

    /// The table, `[vocab, dim]` (a tied language-model head reads it too).
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }
}

impl Layer for Embedding {
    #[track_caller]
    fn forward(&self, ids: &Tensor, _: &Mode) -> Tensor {
        // The rows taken, then cast: only the looked-up rows are converted, and the
        // gradient comes back through the cast into the f32 table's scatter-add.
        autocast(&self.weight.value().take(ids, 0))
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.weight.clone()]
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(Embedding::from_parameter(self.weight.duplicate()))
    }
}

/// The extent of axis `axis` (negative counts from the end) of `x`, if it has one.
fn extent(x: &Tensor, axis: i64) -> Option<usize> {
    let s = x.shape().ok()?;
    let i = if axis < 0 {
        s.len().checked_sub(axis.unsigned_abs() as usize)?
    } else {
        axis as usize
    };
    s.get(i).copied()
}

/// Learned absolute positions (GPT-2's `wpe`): the forward pass adds row `t` of a
/// `[max_len, dim]` table to position `t` of `x [..., T, dim]` (`T <= max_len`; a longer
/// input gives a tensor carrying the shape error).
#[derive(Debug, Clone)]
pub struct PositionEmbedding {
    weight: Parameter,
}

impl PositionEmbedding {
    /// A table named `name` (`name.weight`, `[max_len, dim]`) drawn by `init` from
    /// `seed`.
    pub fn new(
        ctx: &Context,
        name: &str,
        max_len: usize,
        dim: usize,
        init: Init,
        seed: u64,
    ) -> Result<PositionEmbedding> {
        let w = init.tensor(ctx, &[max_len, dim], max_len, dim, seed);
        Ok(PositionEmbedding {
            weight: Parameter::new(format!("{name}.weight"), &w)?,
        })
    }

    /// A table holding `weight` (`[max_len, dim]`), shared, not copied.
    pub fn from_parameter(weight: Parameter) -> PositionEmbedding {
        PositionEmbedding { weight }
    }

    /// The table, `[max_len, dim]`.
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }
}

impl Layer for PositionEmbedding {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let x = &autocast(x);
        let w = self.weight.value_like(x);
        match extent(x, -2) {
            Some(t) => x + &w.slice(&[(0..t as i64).into()]),
            // x carries its error already, or has no position axis (then the sum names
            // both shapes).
            None => x + &w,
        }
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.weight.clone()]
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(PositionEmbedding::from_parameter(self.weight.duplicate()))
    }
}

/// Which features a rotary embedding rotates together. Both rotate pair `i` by the
/// angle `t * base^(-2i / d)` at position `t`; they differ only in where the two
/// features of pair `i` sit, so one is the other with the features permuted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(2i, 2i + 1)`: the original RoFormer (Su et al. 2021) and GPT-J layout.
    Interleaved,
    /// Pairs `(i, i + d/2)` ("rotate half"): the Llama, GPT-NeoX and Hugging Face layout.
    HalfSplit,
}

/// Rotary position embedding (Su et al. 2021) on `x [..., T, d]` (positions on the
/// second-last axis, counted from 0): pair `i` of position `t` becomes
/// `(a cos θ - b sin θ, b cos θ + a sin θ)` with `θ = t * base^(-2i / d)` and `(a, b)`
/// the pair's features in the [`RopeLayout`]. The angles come from an iota of the
/// positions times a constant of `d / 2` frequencies, so any `T` works and the tables
/// fuse into the kernels that use them. No parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    head_dim: usize,
    base: f64,
    layout: RopeLayout,
}

impl Rope {
    /// The rotary embedding of head dimension `head_dim` (even) in `layout`, base 10000.
    /// `Err` naming `head_dim` when it is odd or zero.
    ///
    /// ```
    /// use ndfuse_nn::{Rope, RopeLayout};
    /// let ctx = ndfuse::Context::new();
    /// let rope = Rope::new(8, RopeLayout::HalfSplit)?;
    /// let x = ctx.ones(&[2, 5, 8]);
    /// // Position 0 is not rotated.
    /// let y = rope.apply(&x).eval()?.to_vec::<f32>()?;
    /// assert!(y[..8].iter().all(|&v| (v - 1.0).abs() < 1e-6));
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn new(head_dim: usize, layout: RopeLayout) -> Result<Rope> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::Argument {
                what: "Rope::new",
                why: format!(
                    "head dimension {head_dim}: rotary embedding needs an even, non-zero one"
                ),
            });
        }
        Ok(Rope {
            head_dim,
            base: 10_000.0,
            layout,
        })
    }

    /// The same embedding with another base (10000 by default; Llama 3 uses 500000).
    pub fn base(mut self, base: f64) -> Rope {
        self.base = base;
        self
    }

    /// The layout.
    pub fn layout(&self) -> RopeLayout {
        self.layout
    }

    /// The head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// `x [..., T, d]` rotated (a tensor carrying the error when `x` is not of that
    /// form).
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        self.rotate(x, false, None)
    }

    /// `x [..., T, H, d]` rotated (the heads after the positions, as a `[B, T, H * d]`
    /// projection splits into them): the same angles for every head of a position.
    #[track_caller]
    pub fn apply_heads(&self, x: &Tensor) -> Tensor {
        self.rotate(x, true, None)
    }

    /// [`Rope::apply_heads`] at the positions `positions` (an integer tensor `[T]`)
    /// instead of `0..T`: a decode step's token at its place in the sequence. The
    /// positions are data, so one compiled graph serves every position.
    #[track_caller]
    pub fn apply_heads_at(&self, x: &Tensor, positions: &Tensor) -> Tensor {
        self.rotate(x, true, Some(Angles::at(self, positions, DType::F32)))
    }

    /// [`Rope::apply_heads`] with angles computed once ([`Rope::angles`]) and shared by
    /// every layer's queries and keys: one table for the whole model, not one per use.
    #[track_caller]
    pub fn apply_heads_with(&self, x: &Tensor, angles: &Angles) -> Tensor {
        self.rotate(x, true, Some(angles.clone()))
    }

    /// The angles of positions `positions` (an integer tensor `[T]`), in f32 (f64 for an
    /// f64 model: `wide`), for [`Rope::apply_heads_with`].
    pub fn angles(&self, positions: &Tensor, wide: DType) -> Angles {
        Angles::at(self, positions, wide)
    }

    /// [`Rope::apply`], or with a heads axis between the positions and the features,
    /// at `angles` or those of `0..T`.
    #[track_caller]
    fn rotate(&self, x: &Tensor, heads: bool, angles: Option<Angles>) -> Tensor {
        let (Ok(shape), Ok(dtype)) = (x.shape(), x.dtype()) else {
            return x.clone();
        };
        let (rank, half) = (shape.len(), self.head_dim / 2);
        let t_axis = if heads { 3 } else { 2 };
        if rank < t_axis || shape[rank - 1] != self.head_dim {
            // Multiplying by a table of the wrong width names both shapes.
            return x * &x.context().ones(&[1, self.head_dim + 1]);
        }
        let ctx = x.context();
        let t = shape[rank - t_axis];
        // The angles in f32 at least: in f16 or bf16, t * freq would be off by a
        // sizeable fraction of a radian at positions in the hundreds.
        let wide = if dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let angles = angles.unwrap_or_else(|| Angles::at(self, &ctx.arange_n(t), wide));
        let (cos, sin) = (angles.cos.cast(dtype), angles.sin.cast(dtype));
        // [T, 1, d/2] against [..., T, H, d/2]: one angle for every head.
        let (cos, sin) = if heads {
            (cos.expand_dims(-2), sin.expand_dims(-2))
        } else {
            (cos, sin)
        };
        let last = |r: std::ops::Range<i64>, of: &Tensor, rank: usize| {
            let mut args = vec![SliceArg::all(); rank - 1];
            args.push(r.into());
            of.slice(&args)
        };
        match self.layout {
            RopeLayout::HalfSplit => {
                let (h, d) = (half as i64, self.head_dim as i64);
                let a = last(0..h, x, rank);
                let b = last(h..d, x, rank);
                // x [cos, cos] + [b, a] [-sin, sin]: every concatenation is of slices of
                // an operand or of the tables, a read the one kernel makes (a
                // concatenation of computed halves would store both first).
                let cos2 = ndfuse::concat(&[&cos, &cos], -1);
                let sin2 = ndfuse::concat(&[&-&sin, &sin], -1);
                let swapped = ndfuse::concat(&[&b, &a], -1);
                &(x * &cos2) + &(&swapped * &sin2)
            }
            RopeLayout::Interleaved => {
                // [..., T, d/2, 2]: the pair on the last axis.
                let mut pairs: Vec<i64> = shape[..rank - 1].iter().map(|&e| e as i64).collect();
                pairs.extend([half as i64, 2]);
                let p = x.reshape(&pairs);
                let (a, b) = (last(0..1, &p, rank + 1), last(1..2, &p, rank + 1));
                let (cos, sin) = (cos.expand_dims(-1), sin.expand_dims(-1));
                let ra = &(&a * &cos) - &(&b * &sin);
                let rb = &(&b * &cos) + &(&a * &sin);
                let dims: Vec<i64> = shape.iter().map(|&e| e as i64).collect();
                ndfuse::concat(&[&ra, &rb], -1).reshape(&dims)
            }
        }
    }
}

/// A rotary embedding's `cos` and `sin` tables at some positions, `[T, d/2]` each
/// ([`Rope::angles`]).
#[derive(Debug, Clone)]
pub struct Angles {
    cos: Tensor,
    sin: Tensor,
}

impl Angles {
    /// θ[t, i] = positions[t] * freq[i] in `wide`, then its cosine and sine. The
    /// frequencies `base^(-2i / d) = exp(-2i ln(base) / d)` come from an iota in f64:
    /// no data, so every layer's table is the same expression (one after CSE).
    fn at(rope: &Rope, positions: &Tensor, wide: DType) -> Angles {
        let ctx = positions.context();
        let half = rope.head_dim / 2;
        let rate = -2.0 * rope.base.ln() / rope.head_dim as f64;
        let freqs = (ctx.arange_n(half).cast(DType::F64) * rate)
            .exp()
            .cast(wide);
        let theta = &positions.cast(wide).expand_dims(-1) * &freqs;
        Angles {
            cos: theta.cos(),
            sin: theta.sin(),
        }
    }
}

impl Layer for Rope {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        self.apply(x)
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

/// Root-mean-square normalisation over the last axis (Zhang and Sennrich 2019) with a
/// learned scale (`name.weight`, ones): `x * rsqrt(mean(x^2) + eps) * weight`, torch's
/// `nn.RMSNorm`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Parameter,
    eps: f64,
}

impl RmsNorm {
    /// Normalisation of `features` features with `eps` added to the mean square.
    pub fn new(ctx: &Context, name: &str, features: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: Parameter::new(format!("{name}.weight"), &ctx.ones(&[features]))?,
            eps,
        })
    }

    /// A normalisation holding `weight` (`[features]`), shared, not copied: a
    /// pretrained model's.
    pub fn from_parameter(weight: Parameter, eps: f64) -> RmsNorm {
        RmsNorm { weight, eps }
    }
}

impl Layer for RmsNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor, _: &Mode) -> Tensor {
        let x = autocast(x);
        let n = in_f32(&x, |x| {
            x * &(x.square().mean_keepdims(-1) + self.eps).rsqrt()
        });
        &n * &self.weight.value_like(&x)
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.weight.clone()]
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(RmsNorm {
            weight: self.weight.duplicate(),
            eps: self.eps,
        })
    }
}

/// The settings of a [`MultiHeadAttention`]; [`AttentionConfig::new`] gives the
/// defaults, and fields are changed with struct-update syntax:
///
/// ```
/// use ndfuse_nn::AttentionConfig;
/// let gqa = AttentionConfig { n_kv_heads: 2, ..AttentionConfig::new(64, 8) };
/// assert_eq!(gqa.head_dim(), 8);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    /// The width of the input and output, `C`.
    pub d_model: usize,
    /// Query heads; must divide `d_model`.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`); must
    /// divide `n_heads`.
    pub n_kv_heads: usize,
    /// Whether a position sees only itself and earlier positions.
    pub causal: bool,
    /// Dropout on the attention probabilities in training.
    pub dropout: f64,
    /// Rotary embedding of queries and keys (none: positions come from elsewhere).
    pub rope: Option<RopeLayout>,
    /// Whether the four projections have biases.
    pub bias: bool,
    /// How the query, key and value projections are drawn.
    pub init: Init,
    /// How the output projection is drawn (GPT-2 scales it down by the depth).
    pub out_init: Init,
}

impl AttentionConfig {
    /// `n_heads` heads over `d_model` features: as many key/value heads, causal, no
    /// dropout, no rotary embedding, biases, weights `Normal(0, 0.02)` (GPT-2's).
    pub fn new(d_model: usize, n_heads: usize) -> AttentionConfig {
        AttentionConfig {
            d_model,
            n_heads,
            n_kv_heads: n_heads,
            causal: true,
            dropout: 0.0,
            rope: None,
            bias: true,
            init: Init::Normal(0.0, 0.02),
            out_init: Init::Normal(0.0, 0.02),
        }
    }

    /// The features per head, `d_model / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// `Err` naming the numbers when the heads do not divide.
    fn check(&self) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::Argument {
                what: "MultiHeadAttention::new",
                why,
            })
        };
        let (c, h, kv) = (self.d_model, self.n_heads, self.n_kv_heads);
        if h == 0 || !c.is_multiple_of(h) {
            return refuse(format!(
                "n_heads = {h} must divide d_model = {c} (and not be 0)"
            ));
        }
        if kv == 0 || !h.is_multiple_of(kv) {
            return refuse(format!(
                "n_kv_heads = {kv} must divide n_heads = {h} (and not be 0)"
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return refuse(format!("dropout {} is outside [0, 1)", self.dropout));
        }
        Ok(())
    }
}

/// Multi-head self-attention on `x [B, T, C]`: one `qkv` projection to
/// `[B, T, (H + 2 Hkv) Dh]` (GPT-2's `c_attn`: the query heads, then the key heads, then
/// the value heads), rotary embedding on queries and keys when configured, the fused
/// attention on the packed projection ([`Tensor::attention_qkv`], scale `1 / sqrt(Dh)`:
/// no transposes, and the projection's gradient straight from the attention's backward
/// node), the heads' `[B, T, H, Dh]` read as `[B, T, C]` and the `o` projection.
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    qkv: Linear,
    o: Linear,
    config: AttentionConfig,
    rope: Option<Rope>,
}

impl MultiHeadAttention {
    /// The layer named `name` (`name.qkv`, `name.o`), weights drawn from `seed` and
    /// `seed + 3`. `Err` naming the numbers when `n_heads` does not
    /// divide `d_model`, `n_kv_heads` does not divide `n_heads`, the dropout is outside
    /// `[0, 1)` or a rotary embedding meets an odd head dimension.
    ///
    /// ```
    /// use ndfuse_nn::{AttentionConfig, Layer, Mode, MultiHeadAttention};
    /// let ctx = ndfuse::Context::new();
    /// let mha = MultiHeadAttention::new(&ctx, "attn", &AttentionConfig::new(16, 4), 1)?;
    /// assert_eq!(mha.forward(&ctx.ones(&[2, 5, 16]), &Mode::eval()).shape()?, &[2, 5, 16]);
    /// assert!(MultiHeadAttention::new(&ctx, "a", &AttentionConfig::new(16, 3), 1).is_err());
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn new(
        ctx: &Context,
        name: &str,
        config: &AttentionConfig,
        seed: u64,
    ) -> Result<MultiHeadAttention> {
        config.check()?;
        let (c, dh) = (config.d_model, config.head_dim());
        let kv = config.n_kv_heads * dh;
        let rope = config.rope.map(|l| Rope::new(dh, l)).transpose()?;
        let linear = |part: &str, out: usize, init: Init, seed: u64| -> Result<Linear> {
            let l = Linear::new(ctx, &format!("{name}.{part}"), c, out, init, seed)?;
            Ok(if config.bias { l } else { l.without_bias() })
        };
        Ok(MultiHeadAttention {
            qkv: linear("qkv", c + 2 * kv, config.init, seed)?,
            o: linear("o", c, config.out_init, seed + 3)?,
            config: config.clone(),
            rope,
        })
    }

    /// The settings.
    pub fn config(&self) -> &AttentionConfig {
        &self.config
    }

    /// The projections `qkv` (weight `[C, (H + 2 Hkv) Dh]`) and `o` (`[C, C]`).
    pub fn projections(&self) -> [&Linear; 2] {
        [&self.qkv, &self.o]
    }

    /// The settings of the attention op in `mode`: the causal mask, scale
    /// `1 / sqrt(Dh)`, and dropout on the probabilities under the layer's key when
    /// training.
    pub fn options(&self, mode: &Mode) -> ndfuse::Attention {
        let dh = self.config.head_dim();
        let opts = ndfuse::Attention::new()
            .causal(self.config.causal)
            .scale(1.0 / (dh as f64).sqrt());
        match mode.key() {
            Some(key) if self.config.dropout > 0.0 => opts.dropout(self.config.dropout, &key),
            _ => opts,
        }
    }

    /// The queries, keys and values of `x [B, T, C]` as `[B, T, H, Dh]` (`Hkv` heads for
    /// keys and values), rotary embedding applied: slices of the packed projection.
    #[track_caller]
    pub fn heads(&self, x: &Tensor, mode: &Mode) -> Option<[Tensor; 3]> {
        self.split(&self.qkv.forward(x, mode))
    }

    /// The packed projection `y [B, T, (H + 2 Hkv) Dh]` as q, k, v `[B, T, H, Dh]`,
    /// queries and keys rotated when configured.
    fn split(&self, y: &Tensor) -> Option<[Tensor; 3]> {
        let s = y.shape().ok()?;
        let [b, t, _] = s[..] else { return None };
        let dh = self.config.head_dim();
        let (h, hkv) = (self.config.n_heads, self.config.n_kv_heads);
        let part = |first: usize, heads: usize| {
            let (lo, hi) = ((first * dh) as i64, ((first + heads) * dh) as i64);
            y.slice(&[SliceArg::all(), SliceArg::all(), (lo..hi).into()])
                .reshape(&[b as i64, t as i64, heads as i64, dh as i64])
        };
        let (mut q, mut k, v) = (part(0, h), part(h, hkv), part(h + hkv, hkv));
        if let Some(r) = &self.rope {
            (q, k) = (r.apply_heads(&q), r.apply_heads(&k));
        }
        Some([q, k, v])
    }
}

impl Layer for MultiHeadAttention {
    #[track_caller]
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        let y = self.qkv.forward(x, mode);
        let (b, t) = (extent(x, 0).unwrap_or(0), extent(x, 1).unwrap_or(0));
        let (h, hkv) = (self.config.n_heads, self.config.n_kv_heads);
        let packed = match (&self.rope, self.split(&y)) {
            // Rotated queries and keys packed again with the values: one element-wise
            // kernel (the rotation and the concatenation) writes the packed operand.
            (Some(_), Some([q, k, v])) => {
                let width = ((h + 2 * hkv) * self.config.head_dim()) as i64;
                ndfuse::concat(&[&q, &k, &v], 2).reshape(&[b as i64, t as i64, width])
            }
            // Not [B, T, C]: the attention names the shapes (or carries x's error).
            _ => y,
        };
        let a = packed.attention_qkv(h, hkv, &self.options(mode));
        let a = a.reshape(&[b as i64, t as i64, self.config.d_model as i64]);
        self.o.forward(&a, mode)
    }

    fn parameters(&self) -> Vec<Parameter> {
        [&self.qkv, &self.o]
            .into_iter()
            .flat_map(Layer::parameters)
            .collect()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.replica())
    }
}

impl MultiHeadAttention {
    /// A replica (see [`Layer::duplicate`]), as this type.
    pub fn replica(&self) -> MultiHeadAttention {
        MultiHeadAttention {
            qkv: self.qkv.replica(),
            o: self.o.replica(),
            config: self.config.clone(),
            rope: self.rope.clone(),
        }
    }
}

/// The position-wise network of a transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedForwardKind {
    /// `fc2(gelu(fc1(x)))` with the exact (erf) GELU: GPT-2's MLP as PyTorch's
    /// `nn.GELU()` computes it.
    GeluMlp,
    /// `w2(silu(w1 x) * w3 x)` without biases (Shazeer 2020; Llama's MLP).
    SwiGlu,
}

/// A transformer's position-wise network from `d_model` to `hidden` and back.
#[derive(Debug, Clone)]
pub struct FeedForward {
    kind: FeedForwardKind,
    up: Linear,
    gate: Option<Linear>,
    down: Linear,
}

impl FeedForward {
    /// The network named `name` (`name.fc1`/`name.fc2`, or `name.w1`/`name.w3`/`name.w2`
    /// for SwiGLU), inner projections drawn by `init`, the output one by `out_init`,
    /// from `seed`, `seed + 1`, ...
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        name: &str,
        kind: FeedForwardKind,
        d_model: usize,
        hidden: usize,
        init: Init,
        out_init: Init,
        seed: u64,
    ) -> Result<FeedForward> {
        let lin = |part: &str, i: usize, o: usize, init: Init, s: u64| {
            Linear::new(ctx, &format!("{name}.{part}"), i, o, init, s)
        };
        Ok(match kind {
            FeedForwardKind::GeluMlp => FeedForward {
                kind,
                up: lin("fc1", d_model, hidden, init, seed)?,
                gate: None,
                down: lin("fc2", hidden, d_model, out_init, seed + 1)?,
            },
            FeedForwardKind::SwiGlu => FeedForward {
                kind,
                up: lin("w1", d_model, hidden, init, seed)?.without_bias(),
                gate: Some(lin("w3", d_model, hidden, init, seed + 2)?.without_bias()),
                down: lin("w2", hidden, d_model, out_init, seed + 1)?.without_bias(),
            },
        })
    }

    /// The variant.
    pub fn kind(&self) -> FeedForwardKind {
        self.kind
    }
}

impl Layer for FeedForward {
    #[track_caller]
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        let h = self.up.forward(x, mode);
        let h = match &self.gate {
            None => h.gelu_erf(),
            Some(g) => &(&h * &h.sigmoid()) * &g.forward(x, mode),
        };
        self.down.forward(&h, mode)
    }

    fn parameters(&self) -> Vec<Parameter> {
        std::iter::once(&self.up)
            .chain(&self.gate)
            .chain(std::iter::once(&self.down))
            .flat_map(Layer::parameters)
            .collect()
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.replica())
    }
}

impl FeedForward {
    /// A replica (see [`Layer::duplicate`]), as this type.
    pub fn replica(&self) -> FeedForward {
        FeedForward {
            kind: self.kind,
            up: self.up.replica(),
            gate: self.gate.as_ref().map(Linear::replica),
            down: self.down.replica(),
        }
    }
}

/// The normalisation of a transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// [`LayerNorm`] (GPT-2).
    LayerNorm,
    /// [`RmsNorm`] (Llama).
    RmsNorm,
}

impl NormKind {
    /// The normalisation layer of `features` features named `name`.
    pub fn layer(
        self,
        ctx: &Context,
        name: &str,
        features: usize,
        eps: f64,
    ) -> Result<Box<dyn Layer>> {
        Ok(match self {
            NormKind::LayerNorm => Box::new(LayerNorm::new(ctx, name, features, eps)?),
            NormKind::RmsNorm => Box::new(RmsNorm::new(ctx, name, features, eps)?),
        })
    }
}

/// The settings of a [`TransformerBlock`].
#[derive(Debug, Clone, PartialEq)]
pub struct BlockConfig {
    /// The attention's settings.
    pub attention: AttentionConfig,
    /// The position-wise network.
    pub feed_forward: FeedForwardKind,
    /// Its inner width (GPT-2: `4 * d_model`).
    pub hidden: usize,
    /// The normalisation before each half.
    pub norm: NormKind,
    /// The normalisation's eps.
    pub eps: f64,
    /// Dropout on each half's output before the residual sum, in training.
    pub dropout: f64,
}

impl BlockConfig {
    /// GPT-2's block over `d_model` features and `n_heads` heads: causal attention,
    /// GELU MLP of `4 * d_model`, LayerNorm with eps 1e-5, no dropout.
    pub fn new(d_model: usize, n_heads: usize) -> BlockConfig {
        BlockConfig {
            attention: AttentionConfig::new(d_model, n_heads),
            feed_forward: FeedForwardKind::GeluMlp,
            hidden: 4 * d_model,
            norm: NormKind::LayerNorm,
            eps: 1e-5,
            dropout: 0.0,
        }
    }
}

/// A pre-norm transformer block: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`.
#[derive(Debug)]
pub struct TransformerBlock {
    norm1: Box<dyn Layer>,
    attn: MultiHeadAttention,
    norm2: Box<dyn Layer>,
    mlp: FeedForward,
    dropout: Dropout,
}

impl TransformerBlock {
    /// The block named `name` (`name.ln1`, `name.attn`, `name.ln2`, `name.mlp`),
    /// weights drawn from `seed` on. `Err` as [`MultiHeadAttention::new`] gives.
    pub fn new(
        ctx: &Context,
        name: &str,
        config: &BlockConfig,
        seed: u64,
    ) -> Result<TransformerBlock> {
        let d = config.attention.d_model;
        let a = &config.attention;
        Ok(TransformerBlock {
            norm1: config
                .norm
                .layer(ctx, &format!("{name}.ln1"), d, config.eps)?,
            attn: MultiHeadAttention::new(ctx, &format!("{name}.attn"), a, seed)?,
            norm2: config
                .norm
                .layer(ctx, &format!("{name}.ln2"), d, config.eps)?,
            mlp: FeedForward::new(
                ctx,
                &format!("{name}.mlp"),
                config.feed_forward,
                d,
                config.hidden,
                a.init,
                a.out_init,
                seed + 4,
            )?,
            dropout: Dropout::new(config.dropout),
        })
    }

    /// The attention.
    pub fn attention(&self) -> &MultiHeadAttention {
        &self.attn
    }
}

impl Layer for TransformerBlock {
    #[track_caller]
    fn forward(&self, x: &Tensor, mode: &Mode) -> Tensor {
        let a = self
            .attn
            .forward(&self.norm1.forward(x, mode), &mode.child(0));
        let x = x + &self.dropout.forward(&a, &mode.child(1));
        let m = self.mlp.forward(&self.norm2.forward(&x, mode), mode);
        &x + &self.dropout.forward(&m, &mode.child(2))
    }

    fn parameters(&self) -> Vec<Parameter> {
        let mut p = self.norm1.parameters();
        p.extend(self.attn.parameters());
        p.extend(self.norm2.parameters());
        p.extend(self.mlp.parameters());
        p
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.replica())
    }
}

impl TransformerBlock {
    /// A replica (see [`Layer::duplicate`]), as a block.
    pub fn replica(&self) -> TransformerBlock {
        TransformerBlock {
            norm1: self.norm1.duplicate(),
            attn: self.attn.replica(),
            norm2: self.norm2.duplicate(),
            mlp: self.mlp.replica(),
            dropout: self.dropout,
        }
    }
}
