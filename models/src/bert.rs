//! BERT encoders (Devlin et al. 2019) from a Hugging Face folder (`config.json`,
//! `model.safetensors`, `tokenizer.json`), and sentence embeddings the way
//! sentence-transformers makes them for all-MiniLM-L6-v2: the mean of the last hidden
//! states over the real tokens, L2-normalised.
//!
//! The model is built from `nn` layers (`Embedding`, `Linear`, `LayerNorm`) and the fused
//! attention with per-sentence key lengths: a batch of sentences is padded to a common
//! length, rounded up to a multiple of [`PAD_MULTIPLE`] so that batches of nearby lengths
//! share one compiled graph; the padding is masked out of the attention and the mean, so
//! it changes no embedding.

use crate::error::{Error, Result};
use crate::safetensors::SafetensorsFile;
use crate::tokenizer::Tokenizer;
use ndfuse::{Attention, Context, Tensor};
use ndfuse_nn::{Embedding, Layer, LayerNorm, Linear, Mode, Parameter};
use std::path::{Path, PathBuf};

/// Padded lengths are rounded up to a multiple of this.
pub const PAD_MULTIPLE: usize = 16;

/// The fields of a BERT `config.json` the encoder needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Token vocabulary.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Positions the learned position table covers.
    pub max_position_embeddings: usize,
    /// Segment types.
    pub type_vocab_size: usize,
    /// The layer norms' epsilon.
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// Parses a `config.json`. `Err` naming the file and key when a field is missing,
    /// or the activation is not GELU (erf) or the position embedding not absolute.
    pub fn from_file(path: &Path) -> Result<BertConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let fail = |at: &str, why: String| Error::Format {
            path: path.to_path_buf(),
            at: Some(at.to_string()),
            why,
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| fail("config", e.to_string()))?;
        let int = |key: &str| {
            json.get(key)
                .and_then(serde_json::Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| fail(key, "missing or not a non-negative integer".into()))
        };
        let text_of = |key: &str, default: &str| {
            json.get(key)
                .and_then(serde_json::Value::as_str)
                .unwrap_or(default)
                .to_string()
        };
        let act = text_of("hidden_act", "gelu");
        if act != "gelu" {
            return Err(fail(
                "hidden_act",
                format!("{act:?} is not supported (gelu is)"),
            ));
        }
        let pos = text_of("position_embedding_type", "absolute");
        if pos != "absolute" {
            return Err(fail(
                "position_embedding_type",
                format!("{pos:?} is not supported (absolute is)"),
            ));
        }
        let config = BertConfig {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size")?,
            layer_norm_eps: json
                .get("layer_norm_eps")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(1e-12),
        };
        let heads = config.num_attention_heads;
        if heads == 0 || !config.hidden_size.is_multiple_of(heads) {
            return Err(fail(
                "num_attention_heads",
                format!(
                    "{heads} heads do not divide hidden_size {}",
                    config.hidden_size
                ),
            ));
        }
        Ok(config)
    }
}

/// One encoder layer: self-attention (the three projections as one `[C, 3C]` product),
/// output projection, residual and norm; GELU feed-forward, residual and norm.
#[derive(Debug, Clone)]
struct BertLayer {
    qkv: Linear,
    out: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    ffn_norm: LayerNorm,
}

/// A BERT encoder with its tokenizer.
#[derive(Debug, Clone)]
pub struct BertModel {
    ctx: Context,
    config: BertConfig,
    tokenizer: Tokenizer,
    words: Embedding,
    positions: Parameter,
    segments: Parameter,
    norm: LayerNorm,
    layers: Vec<BertLayer>,
}

/// Reads the tensors of a safetensors file into parameters.
struct Weights<'a> {
    ctx: &'a Context,
    file: &'a SafetensorsFile,
}

impl Weights<'_> {
    /// Tensor `name`, checked to have `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Parameter> {
        let (s, v) = self.file.to_f32(name)?;
        if s != shape {
            return Err(Error::Format {
                path: self.file.path().to_path_buf(),
                at: Some(name.to_string()),
                why: format!("shape {s:?}, but the config makes it {shape:?}"),
            });
        }
        Ok(Parameter::new(name, &self.ctx.from_vec(v, shape)?)?)
    }

    /// A Hugging Face `nn.Linear` (`{name}.weight` `[out, in]`, `{name}.bias`) as
    /// `[in, out]` and `[out]`; several of them side by side (`[in, sum of outs]`).
    fn linear(&self, names: &[String], inputs: usize, outputs: usize) -> Result<Linear> {
        let n = names.len();
        let mut w = vec![0f32; inputs * outputs * n];
        let mut b = Vec::with_capacity(outputs * n);
        for (k, name) in names.iter().enumerate() {
            let (s, v) = self.file.to_f32(&format!("{name}.weight"))?;
            if s != [outputs, inputs] {
                return Err(Error::Format {
                    path: self.file.path().to_path_buf(),
                    at: Some(format!("{name}.weight")),
                    why: format!(
                        "shape {s:?}, but the config makes it {:?}",
                        [outputs, inputs]
                    ),
                });
            }
            for o in 0..outputs {
                for i in 0..inputs {
                    w[i * outputs * n + k * outputs + o] = v[o * inputs + i];
                }
            }
            let (bs, bv) = self.file.to_f32(&format!("{name}.bias"))?;
            if bs != [outputs] {
                return Err(Error::Format {
                    path: self.file.path().to_path_buf(),
                    at: Some(format!("{name}.bias")),
                    why: format!("shape {bs:?}, but the config makes it [{outputs}]"),
                });
            }
            b.extend(bv);
        }
        let weight = Parameter::new(
            format!("{}.weight", names[0]),
            &self.ctx.from_vec(w, &[inputs, outputs * n])?,
        )?;
        let bias = Parameter::new(
            format!("{}.bias", names[0]),
            &self.ctx.from_vec(b, &[outputs * n])?,
        )?;
        Ok(Linear::from_parameters(weight, Some(bias))?)
    }

    fn norm(&self, name: &str, features: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm::from_parameters(
            self.get(&format!("{name}.weight"), &[features])?,
            self.get(&format!("{name}.bias"), &[features])?,
            eps,
        )?)
    }
}

impl BertModel {
    /// Loads the encoder in folder `dir` (`config.json`, `model.safetensors`,
    /// `tokenizer.json`; sentence-transformers' `sentence_bert_config.json`, when present,
    /// gives the longest input) into `ctx`.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Format`] naming the file (and tensor) that is missing,
    /// malformed or of the wrong shape; [`Error::Tokenizer`] when `tokenizer.json` cannot
    /// be read.
    pub fn load(ctx: &Context, dir: impl AsRef<Path>) -> Result<BertModel> {
        let dir = dir.as_ref();
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let max_len = sentence_max_len(dir).unwrap_or(config.max_position_embeddings);
        let tokenizer = Tokenizer::from_json_file(
            &dir.join("tokenizer.json"),
            max_len.min(config.max_position_embeddings),
        )?;
        let file = SafetensorsFile::open(dir.join("model.safetensors"))?;
        // Checkpoints saved from BertForX carry a `bert.` prefix; sentence-transformers'
        // from BertModel do not.
        let prefix = if file
            .shape("bert.embeddings.word_embeddings.weight")
            .is_some()
        {
            "bert."
        } else {
            ""
        };
        let w = Weights { ctx, file: &file };
        let (c, ff, eps) = (
            config.hidden_size,
            config.intermediate_size,
            config.layer_norm_eps,
        );
        let e = format!("{prefix}embeddings");
        let words = Embedding::from_parameter(w.get(
            &format!("{e}.word_embeddings.weight"),
            &[config.vocab_size, c],
        )?);
        let positions = w.get(
            &format!("{e}.position_embeddings.weight"),
            &[config.max_position_embeddings, c],
        )?;
        let segments = w.get(
            &format!("{e}.token_type_embeddings.weight"),
            &[config.type_vocab_size, c],
        )?;
        let norm = w.norm(&format!("{e}.LayerNorm"), c, eps)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("{prefix}encoder.layer.{l}");
            let qkv = ["query", "key", "value"].map(|n| format!("{p}.attention.self.{n}"));
            layers.push(BertLayer {
                qkv: w.linear(&qkv, c, c)?,
                out: w.linear(&[format!("{p}.attention.output.dense")], c, c)?,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"), c, eps)?,
                up: w.linear(&[format!("{p}.intermediate.dense")], c, ff)?,
                down: w.linear(&[format!("{p}.output.dense")], ff, c)?,
                ffn_norm: w.norm(&format!("{p}.output.LayerNorm"), c, eps)?,
            });
        }
        Ok(BertModel {
            ctx: ctx.clone(),
            config,
            tokenizer,
            words,
            positions,
            segments,
            norm,
            layers,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The last hidden states `[B, T, C]` of token ids `[B, T]` (i64, padded on the
    /// right) whose first `lengths[b]` (i64 `[B]`) are real: a lazy tensor.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor, lengths: &Tensor) -> Tensor {
        let t = ids
            .shape()
            .map(|s| s.get(1).copied().unwrap_or(0))
            .unwrap_or(0);
        let c = self.config.hidden_size;
        let eval = Mode::eval();
        let pos = self
            .positions
            .value()
            .slice(&[(0..t as i64).into(), ndfuse::SliceArg::all()]);
        let seg = self
            .segments
            .value()
            .slice(&[(0..1).into(), ndfuse::SliceArg::all()]);
        let mut x = self
            .norm
            .forward(&(&(&self.words.forward(ids, &eval) + &pos) + &seg), &eval);
        let heads = self.config.num_attention_heads;
        let attention = Attention::new().key_lengths(lengths);
        let b = ids.shape().map(|s| s[0]).unwrap_or(0);
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x, &eval);
            let a = qkv
                .attention_qkv(heads, heads, &attention)
                .reshape(&[b as i64, t as i64, c as i64]);
            x = layer
                .attn_norm
                .forward(&(&x + &layer.out.forward(&a, &eval)), &eval);
            let h = layer.up.forward(&x, &eval).gelu_erf();
            x = layer
                .ffn_norm
                .forward(&(&x + &layer.down.forward(&h, &eval)), &eval);
        }
        x
    }

    /// Sentence embeddings `[B, C]` of hidden states `[B, T, C]`: the mean over each
    /// sentence's first `lengths[b]` positions, L2-normalised.
    pub fn pool(hidden: &Tensor, lengths: &Tensor) -> Tensor {
        let t = hidden.shape().map(|s| s[1]).unwrap_or(0);
        let ctx = hidden.context();
        // mask[b, t] = t < lengths[b], as the hidden states' dtype.
        let mask = ctx
            .arange_n(t)
            .lt(lengths.expand_dims(-1))
            .cast(hidden.dtype().unwrap_or(ndfuse::DType::F32));
        let sum = (hidden * &mask.expand_dims(-1)).sum(1);
        let mean = &sum / &mask.sum_keepdims(-1).maximum(1.0);
        // sentence-transformers' Normalize: x / max(||x||, 1e-12).
        &mean / &mean.norm2_keepdims(-1).maximum(1e-12)
    }

    /// The embeddings of `texts`, one `hidden_size` vector each, in order.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when a text cannot be encoded; a tensor error from the
    /// evaluation.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encoded = texts
            .iter()
            .map(|t| self.tokenizer.encode(t, true))
            .collect::<Result<Vec<_>>>()?;
        let longest = encoded.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let t = longest
            .div_ceil(PAD_MULTIPLE)
            .saturating_mul(PAD_MULTIPLE)
            .min(self.config.max_position_embeddings)
            .max(longest);
        let b = texts.len();
        let mut ids = vec![0i64; b * t];
        for (row, e) in ids.chunks_exact_mut(t).zip(&encoded) {
            for (dst, &id) in row.iter_mut().zip(e) {
                *dst = i64::from(id);
            }
        }
        let lengths: Vec<i64> = encoded.iter().map(|e| e.len() as i64).collect();
        let ids = self.ctx.from_vec(ids, &[b, t])?;
        let lengths = self.ctx.from_vec(lengths, &[b])?;
        let pooled = BertModel::pool(&self.forward(&ids, &lengths), &lengths).eval()?;
        let c = self.config.hidden_size;
        Ok(pooled
            .to_vec::<f32>()?
            .chunks_exact(c)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

/// sentence-transformers' `max_seq_length`, from `sentence_bert_config.json` if the
/// folder has one.
fn sentence_max_len(dir: &Path) -> Option<usize> {
    let path: PathBuf = dir.join("sentence_bert_config.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("max_seq_length")?.as_u64().map(|v| v as usize)
}
