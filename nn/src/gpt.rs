//! A decoder-only language model in GPT-2's shape: token embedding plus positions
//! (learned or rotary), a stack of pre-norm [`TransformerBlock`]s, a final
//! normalisation and a language-model head, optionally tied to the token embedding.
//! Its forward pass takes token ids `[B, T]` and gives logits `[B, T, V]`, so it trains
//! with [`crate::Trainer`] and [`crate::Loss::CrossEntropy`] on next-token targets.

use crate::error::{Error, Result};
use crate::init::Init;
use crate::layers::{Dropout, Layer, Linear, Mode};
use crate::param::Parameter;
use crate::transformer::{
    AttentionConfig, BlockConfig, Embedding, FeedForwardKind, NormKind, PositionEmbedding,
    RopeLayout, TransformerBlock,
};
use ndfuse::{Context, Tensor};

/// How a [`Gpt`] knows positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// A learned `[context, d_model]` table added to the token embedding (GPT-2).
    Learned,
    /// Rotary embedding of queries and keys in every attention (no table).
    Rope(RopeLayout),
}

/// The shape and recipe of a [`Gpt`].
///
/// ```
/// use ndfuse_nn::{GptConfig, Positions, RopeLayout};
/// let c = GptConfig { positions: Positions::Rope(RopeLayout::HalfSplit), ..GptConfig::new(65, 128, 128, 4, 4) };
/// assert_eq!(c.hidden, 512);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    /// The number of token ids, `V`.
    pub vocab: usize,
    /// The longest sequence, `T` (the learned position table's length).
    pub context: usize,
    /// The width, `C`.
    pub d_model: usize,
    /// The number of blocks.
    pub n_layers: usize,
    /// Query heads per attention.
    pub n_heads: usize,
    /// Key/value heads per attention (grouped-query attention when fewer).
    pub n_kv_heads: usize,
    /// The position-wise network.
    pub feed_forward: FeedForwardKind,
    /// Its inner width.
    pub hidden: usize,
    /// The normalisation (before each half of a block, and after the last block).
    pub norm: NormKind,
    /// The normalisation's eps.
    pub eps: f64,
    /// How positions enter.
    pub positions: Positions,
    /// Whether the head is the token embedding's transpose (one shared parameter).
    pub tied: bool,
    /// Dropout after the embedding, on attention probabilities and on each block
    /// half's output, in training.
    pub dropout: f64,
    /// Whether the projections have biases.
    pub bias: bool,
    /// The seed the weights are drawn from.
    pub seed: u64,
}

impl GptConfig {
    /// GPT-2's recipe at the given size: `vocab` tokens, `context` positions,
    /// `n_layers` blocks of `d_model` features and `n_heads` heads; a GELU MLP of
    /// `4 * d_model`, LayerNorm (eps 1e-5), learned positions, a tied head, no dropout,
    /// biases, seed 0.
    pub fn new(
        vocab: usize,
        context: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
    ) -> GptConfig {
        GptConfig {
            vocab,
            context,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads: n_heads,
            feed_forward: FeedForwardKind::GeluMlp,
            hidden: 4 * d_model,
            norm: NormKind::LayerNorm,
            eps: 1e-5,
            positions: Positions::Learned,
            tied: true,
            dropout: 0.0,
            bias: true,
            seed: 0,
        }
    }

    /// The settings of each block: GPT-2's initialisation, weights `Normal(0, 0.02)`
    /// and the output projections of each half `Normal(0, 0.02 / sqrt(2 n_layers))`.
    pub fn block(&self) -> BlockConfig {
        let out_std = 0.02 / (2.0 * self.n_layers.max(1) as f64).sqrt();
        BlockConfig {
            attention: AttentionConfig {
                n_kv_heads: self.n_kv_heads,
                causal: true,
                dropout: self.dropout,
                rope: match self.positions {
                    Positions::Learned => None,
                    Positions::Rope(l) => Some(l),
                },
                bias: self.bias,
                init: Init::Normal(0.0, 0.02),
                out_init: Init::Normal(0.0, out_std),
                ..AttentionConfig::new(self.d_model, self.n_heads)
            },
            feed_forward: self.feed_forward,
            hidden: self.hidden,
            norm: self.norm,
            eps: self.eps,
            dropout: self.dropout,
        }
    }
}

/// A GPT: `ids [B, T]` (i32 or i64) to logits `[B, T, V]`. Parameters are named
/// `tok.weight`, `pos.weight` (learned positions), `h{i}.…` per block, `ln_f.…` and
/// `head.weight` (untied only).
///
/// ```
/// use ndfuse_nn::{Gpt, GptConfig, Layer, Mode};
/// let ctx = ndfuse::Context::new();
/// let gpt = Gpt::new(&ctx, &GptConfig::new(16, 8, 32, 2, 4))?;
/// let ids = ctx.from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3])?;
/// assert_eq!(gpt.forward(&ids, &Mode::eval()).shape()?, &[2, 3, 16]);
/// # Ok::<(), ndfuse_nn::Error>(())
/// ```
#[derive(Debug)]
pub struct Gpt {
    config: GptConfig,
    tok: Embedding,
    pos: Option<PositionEmbedding>,
    blocks: Vec<TransformerBlock>,
    ln_f: Box<dyn Layer>,
    head: Option<Linear>,
    dropout: Dropout,
}

impl Gpt {
    /// The model of `config`, weights drawn from `config.seed`. `Err` naming the
    /// numbers for a zero vocabulary, context or depth, heads that do not divide, or a
    /// rotary embedding with an odd head dimension.
    pub fn new(ctx: &Context, config: &GptConfig) -> Result<Gpt> {
        let c = config;
        if c.vocab == 0 || c.context == 0 || c.n_layers == 0 {
            return Err(Error::Argument {
                what: "Gpt::new",
                why: format!(
                    "vocab = {}, context = {}, n_layers = {}: each must be at least 1",
                    c.vocab, c.context, c.n_layers
                ),
            });
        }
        let std = Init::Normal(0.0, 0.02);
        let seed = c.seed.wrapping_mul(1000);
        let tok = Embedding::new(ctx, "tok", c.vocab, c.d_model, std, seed)?;
        let pos = match c.positions {
            Positions::Learned => Some(PositionEmbedding::new(
                ctx,
                "pos",
                c.context,
                c.d_model,
                std,
                seed + 1,
            )?),
            Positions::Rope(_) => None,
        };
        let block = c.block();
        let blocks = (0..c.n_layers)
            .map(|i| {
                TransformerBlock::new(ctx, &format!("h{i}"), &block, seed + 10 * (i as u64 + 1))
            })
            .collect::<Result<Vec<_>>>()?;
        let ln_f = c.norm.layer(ctx, "ln_f", c.d_model, c.eps)?;
        let head = if c.tied {
            None
        } else {
            let seed = seed + 10 * (c.n_layers as u64 + 1);
            Some(Linear::new(ctx, "head", c.d_model, c.vocab, std, seed)?.without_bias())
        };
        Ok(Gpt {
            config: c.clone(),
            tok,
            pos,
            blocks,
            ln_f,
            head,
            dropout: Dropout::new(c.dropout),
        })
    }

    /// The settings.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The token embedding (the tied head's weight too).
    pub fn embedding(&self) -> &Embedding {
        &self.tok
    }

    /// The blocks.
    pub fn blocks(&self) -> &[TransformerBlock] {
        &self.blocks
    }

    /// The number of trainable scalars (a tied table counted once).
    pub fn parameter_count(&self) -> usize {
        self.parameters().iter().map(Parameter::numel).sum()
    }

    /// A replica (see [`Layer::duplicate`]), as a `Gpt`.
    pub fn replica(&self) -> Gpt {
        Gpt {
            config: self.config.clone(),
            tok: Embedding::from_parameter(self.tok.weight().duplicate()),
            pos: self
                .pos
                .as_ref()
                .map(|p| PositionEmbedding::from_parameter(p.weight().duplicate())),
            blocks: self.blocks.iter().map(TransformerBlock::replica).collect(),
            ln_f: self.ln_f.duplicate(),
            head: self.head.as_ref().map(Linear::replica),
            dropout: self.dropout,
        }
    }
}

impl Layer for Gpt {
    #[track_caller]
    fn forward(&self, ids: &Tensor, mode: &Mode) -> Tensor {
        let mut h = self.tok.forward(ids, mode);
        if let Some(p) = &self.pos {
            h = p.forward(&h, mode);
        }
        h = self.dropout.forward(&h, &mode.child(0));
        for (i, b) in self.blocks.iter().enumerate() {
            h = b.forward(&h, &mode.child(i + 1));
        }
        let h = self.ln_f.forward(&h, mode);
        match &self.head {
            Some(head) => head.forward(&h, mode),
            // logits = h @ E^T: the table's gradient sums the lookup's scatter-add and
            // this product's.
            None => h.matmul(&self.tok.weight().value_like(&h).transpose()),
        }
    }

    fn parameters(&self) -> Vec<Parameter> {
        let mut p = self.tok.parameters();
        if let Some(pos) = &self.pos {
            p.extend(pos.parameters());
        }
        for b in &self.blocks {
            p.extend(b.parameters());
        }
        p.extend(self.ln_f.parameters());
        if let Some(head) = &self.head {
            p.extend(head.parameters());
        }
        p
    }

    fn duplicate(&self) -> Box<dyn Layer> {
        Box::new(self.replica())
    }
}
