//! Llama-architecture decoders (SmolLM2, Llama 2/3, ...) from a GGUF file: RMSNorm,
//! rotary positions, grouped-query attention and SwiGLU, built from `nn` layers and the
//! fused attention op.
//!
//! A generation runs two compiled graphs. The prefill takes the whole prompt (causal
//! attention) and returns the last position's logits and every layer's keys and values
//! padded into a cache of `capacity` positions. The decode step takes one token, its
//! position and the caches as data: it writes the new key and value at the position
//! (a select against an iota, fused into the copy that becomes the next cache), attends
//! over the first `position + 1` keys (the attention's key lengths) and returns the
//! logits and the new caches. Every shape in the step is fixed by the capacity, and the
//! position is data, so the step compiles once and is reused for every token.
//!
//! Weights: the GGUF's quantised matrices stay in their blocks ([`QuantLinear`], the
//! `quant_matmul` op dequantises each weight inside the product), the tied head reads
//! the embedding's blocks the same way; the embedding table for the lookups is
//! dequantised to f32 once (a lookup reads one row a token), the norms are f32 already.
//! Matrices stored as F32/F16/BF16 load as dense [`Linear`] layers.
//! llama.cpp stores the query and key projections permuted for its adjacent-pair rotary
//! embedding; the loader puts their rows back in Hugging Face's order
//! ([`unpermute_rows`], whole rows, so quantised blocks move untouched) and the rotation
//! is [`RopeLayout::HalfSplit`]: the same function, and its concatenation along the
//! last axis is a read of the attention's operand rather than three kernels.

use crate::error::Result;
use crate::gguf::Gguf;
use crate::gguf::TensorType;
use crate::tokenizer::Tokenizer;
use ndfuse::QuantMatrix;
use ndfuse::{Attention, AttentionLayout, Causal, Compiled, Context, SliceArg, Tensor};
use ndfuse_nn::{
    Angles, Embedding, Layer, Linear, Mode, Parameter, QuantLinear, RmsNorm, Rope, RopeLayout,
};
use std::path::Path;

/// The hyper-parameters of a Llama model, from the GGUF's `llama.*` metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Token vocabulary (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Decoder blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of the SwiGLU layer.
    pub d_ff: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Rotary base.
    pub rope_base: f64,
    /// The longest context the model was trained for.
    pub context_length: usize,
}

impl LlamaConfig {
    /// The per-head width.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    fn from_gguf(g: &Gguf) -> Result<LlamaConfig> {
        let arch = g.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(g.format_error(
                Some("general.architecture"),
                format!("{arch:?} is not supported (llama is)"),
            ));
        }
        let n = |key: &str| g.get_u64(&format!("llama.{key}")).map(|v| v as usize);
        let (_, emb) = g
            .tensor("token_embd.weight")
            .map(|t| ((), t.shape()))
            .ok_or_else(|| g.format_error(Some("token_embd.weight"), "no such tensor"))?;
        let c = LlamaConfig {
            vocab_size: emb[0],
            d_model: n("embedding_length")?,
            n_layers: n("block_count")?,
            n_heads: n("attention.head_count")?,
            n_kv_heads: n("attention.head_count_kv").or_else(|_| n("attention.head_count"))?,
            d_ff: n("feed_forward_length")?,
            rms_eps: g.get_f64("llama.attention.layer_norm_rms_epsilon")?,
            rope_base: g.get_f64("llama.rope.freq_base").unwrap_or(10_000.0),
            context_length: n("context_length")?,
        };
        let bad = c.n_heads == 0
            || c.n_kv_heads == 0
            || !c.d_model.is_multiple_of(c.n_heads)
            || !c.n_heads.is_multiple_of(c.n_kv_heads)
            || !c.head_dim().is_multiple_of(2);
        if bad {
            return Err(g.format_error(
                Some("llama.attention.head_count"),
                format!(
                    "{} heads and {} key/value heads do not fit d_model {}",
                    c.n_heads, c.n_kv_heads, c.d_model
                ),
            ));
        }
        Ok(c)
    }
}

/// One decoder block; the projections are [`QuantLinear`] or [`Linear`] layers.
#[derive(Debug)]
struct Block {
    attn_norm: RmsNorm,
    /// The query, key and value projections as one product (their rows side by side).
    qkv: Box<dyn Layer>,
    o: Box<dyn Layer>,
    ffn_norm: RmsNorm,
    gate_up: Box<dyn Layer>,
    down: Box<dyn Layer>,
}

impl Clone for Block {
    fn clone(&self) -> Block {
        Block {
            attn_norm: self.attn_norm.clone(),
            qkv: self.qkv.duplicate(),
            o: self.o.duplicate(),
            ffn_norm: self.ffn_norm.clone(),
            gate_up: self.gate_up.duplicate(),
            down: self.down.duplicate(),
        }
    }
}

/// A Llama decoder with its tokenizer.
#[derive(Debug, Clone)]
pub struct LlamaModel {
    ctx: Context,
    config: LlamaConfig,
    tokenizer: Tokenizer,
    embedding: Embedding,
    /// The head (`output.weight`, or the embedding's own blocks when tied).
    head: std::sync::Arc<dyn Layer>,
    norm: RmsNorm,
    rope: Rope,
    blocks: Vec<Block>,
}

/// The keys or values of one layer for a decode step: `[1, capacity, Hkv, Dh]`.
pub type Cache = Tensor;

impl LlamaModel {
    /// Loads a Llama-architecture GGUF into `ctx`.
    ///
    /// # Errors
    /// [`Error::Io`]/[`Error::Format`] naming the file and the key or tensor that is
    /// missing, malformed, of an unsupported type or of the wrong shape;
    /// [`Error::Tokenizer`] when its tokenizer cannot be built.
    pub fn load(ctx: &Context, path: impl AsRef<Path>) -> Result<LlamaModel> {
        let g = Gguf::open(path)?;
        let config = LlamaConfig::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        let (c, f, v) = (config.d_model, config.d_ff, config.vocab_size);
        let (hq, hkv, dh) = (config.n_heads, config.n_kv_heads, config.head_dim());
        let load = Loader { ctx, g: &g };
        let embedding = Embedding::from_parameter(load.tensor("token_embd.weight", &[v, c])?);
        let head_name = match g.tensor("output.weight") {
            Some(_) => "output.weight",
            None => "token_embd.weight",
        };
        let head = std::sync::Arc::from(load.projection(&[head_name], c, &[v], &[])?);
        let norm =
            RmsNorm::from_parameter(load.tensor("output_norm.weight", &[c])?, config.rms_eps);
        let mut blocks = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            let eps = config.rms_eps;
            blocks.push(Block {
                attn_norm: RmsNorm::from_parameter(load.tensor(&name("attn_norm"), &[c])?, eps),
                qkv: load.projection(
                    &[&name("attn_q"), &name("attn_k"), &name("attn_v")],
                    c,
                    &[hq * dh, hkv * dh, hkv * dh],
                    &[Some(hq), Some(hkv), None],
                )?,
                o: load.projection(&[&name("attn_output")], hq * dh, &[c], &[])?,
                ffn_norm: RmsNorm::from_parameter(load.tensor(&name("ffn_norm"), &[c])?, eps),
                gate_up: load.projection(&[&name("ffn_gate"), &name("ffn_up")], c, &[f, f], &[])?,
                down: load.projection(&[&name("ffn_down")], f, &[c], &[])?,
            });
        }
        let rope = Rope::new(dh, RopeLayout::HalfSplit)?.base(config.rope_base);
        Ok(LlamaModel {
            ctx: ctx.clone(),
            config,
            tokenizer,
            embedding,
            head,
            norm,
            rope,
            blocks,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The context the model computes in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The logits `[1, vocab]` of hidden states `x [1, T, C]`' last position.
    fn logits(&self, x: &Tensor) -> Tensor {
        let t = x.shape().map(|s| s[1]).unwrap_or(1) as i64;
        let last = x.slice(&[SliceArg::all(), (t - 1..t).into(), SliceArg::all()]);
        let h = self.norm.forward(&last, &Mode::eval());
        let c = self.config.d_model as i64;
        let h = h.reshape(&[1, c]);
        self.head.forward(&h, &Mode::eval())
    }

    /// One block on `x [1, T, C]` whose positions' rotation angles are `angles`; `kv` makes
    /// the keys and values `[1, T, Hkv, Dh]` into what the attention reads (the prompt's
    /// own, or a cache with them written in), and the attention options go with it.
    fn block(
        &self,
        b: &Block,
        x: &Tensor,
        angles: &Angles,
        kv: impl FnOnce(Tensor, Tensor) -> (Tensor, Tensor),
        opts: &Attention,
    ) -> (Tensor, Tensor, Tensor) {
        let eval = Mode::eval();
        let t = x.shape().map(|s| s[1]).unwrap_or(1) as i64;
        let (hq, hkv, dh) = (
            self.config.n_heads as i64,
            self.config.n_kv_heads as i64,
            self.config.head_dim() as i64,
        );
        let h = b.attn_norm.forward(x, &eval);
        let qkv = b.qkv.forward(&h, &eval);
        let part = |from: i64, heads: i64| {
            qkv.slice(&[
                SliceArg::all(),
                SliceArg::all(),
                (from * dh..(from + heads) * dh).into(),
            ])
            .reshape(&[1, t, heads, dh])
        };
        let (q, k, v) = (part(0, hq), part(hq, hkv), part(hq + hkv, hkv));
        let q = self.rope.apply_heads_with(&q, angles);
        let k = self.rope.apply_heads_with(&k, angles);
        let (k, v) = kv(k, v);
        let a = q
            .attention_with(&k, &v, &opts.clone().layout(AttentionLayout::Bthd))
            .reshape(&[1, t, hq * dh]);
        let x = x + &b.o.forward(&a, &eval);
        let h = b.ffn_norm.forward(&x, &eval);
        let gu = b.gate_up.forward(&h, &eval);
        let f = self.config.d_ff as i64;
        let gate = gu.slice(&[SliceArg::all(), SliceArg::all(), (0..f).into()]);
        let up = gu.slice(&[SliceArg::all(), SliceArg::all(), (f..2 * f).into()]);
        let x = &x + &b.down.forward(&(&(&gate * &gate.sigmoid()) * &up), &eval);
        (x, k, v)
    }

    /// The prefill graph for a prompt of `ids` (i64 `[1, P]`): the last position's
    /// logits `[1, vocab]`, then each layer's keys and values padded to `capacity`
    /// positions (`[1, capacity, Hkv, Dh]` each, keys then values per layer).
    pub fn prefill(&self, ids: &Tensor, capacity: usize) -> Vec<Tensor> {
        let p = ids.shape().map(|s| s[1]).unwrap_or(0);
        let mut x = self.embedding.forward(ids, &Mode::eval());
        let angles = self.rope.angles(&self.ctx.arange_n(p), ndfuse::DType::F32);
        let opts = Attention::new().causal(Causal::TopLeft);
        let pad = capacity.saturating_sub(p);
        let widths = [(0, 0), (0, pad), (0, 0), (0, 0)];
        let mut caches = Vec::with_capacity(2 * self.blocks.len());
        for b in &self.blocks {
            let (y, k, v) = self.block(b, &x, &angles, |k, v| (k, v), &opts);
            caches.push(k.pad(&widths, ndfuse::PadMode::Constant, 0.0));
            caches.push(v.pad(&widths, ndfuse::PadMode::Constant, 0.0));
            x = y;
        }
        let mut out = vec![self.logits(&x)];
        out.extend(caches);
        out
    }

    /// The decode step's graph: token `id` (i64 `[1, 1]`) at `position` (i64 `[1]`)
    /// against `caches` (keys then values per layer, `[1, capacity, Hkv, Dh]`), giving
    /// the logits `[1, vocab]` and the caches with this position's keys and values
    /// written in, in the same order.
    pub fn decode_step(&self, id: &Tensor, position: &Tensor, caches: &[Cache]) -> Vec<Tensor> {
        let capacity = caches
            .first()
            .and_then(|c| c.shape().ok().map(|s| s[1]))
            .unwrap_or(1);
        let mut x = self.embedding.forward(id, &Mode::eval());
        // at[t] = (t == position): where the new key and value go.
        let at = self
            .ctx
            .arange_n(capacity)
            .cast(ndfuse::DType::I64)
            .eq(position)
            .reshape(&[1, capacity as i64, 1, 1]);
        let lengths = position + 1i64;
        let opts = Attention::new().key_lengths(&lengths);
        let angles = self.rope.angles(position, ndfuse::DType::F32);
        let mut new_caches = Vec::with_capacity(caches.len());
        for (l, b) in self.blocks.iter().enumerate() {
            let (kc, vc) = (&caches[2 * l], &caches[2 * l + 1]);
            let (y, k, v) = self.block(
                b,
                &x,
                &angles,
                |k, v| (at.where_(&k, kc), at.where_(&v, vc)),
                &opts,
            );
            new_caches.push(k);
            new_caches.push(v);
            x = y;
        }
        let mut out = vec![self.logits(&x)];
        out.extend(new_caches);
        out
    }
}

/// Reads GGUF tensors into f32 parameters.
struct Loader<'a> {
    ctx: &'a Context,
    g: &'a Gguf,
}

impl Loader<'_> {
    /// Tensor `name`, dequantised, checked to have the row-major `shape`.
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Parameter> {
        let (s, v) = self.g.to_f32(name)?;
        if s != shape {
            return Err(self.g.format_error(
                Some(name),
                format!("shape {s:?}, but the metadata makes it {shape:?}"),
            ));
        }
        Ok(Parameter::new(name, &self.ctx.from_vec(v, shape)?)?)
    }

    /// Matrices `names` (`[out_i, inputs]` each, llama.cpp's `[rows, cols]`) as one
    /// product to `sum out_i` features without bias: their blocks side by side in a
    /// [`QuantLinear`] when all are of one block format, else a dense [`Linear`]. Matrix
    /// `i` with `heads[i]` has the rows of each head put back in Hugging Face's order
    /// (see [`unpermute_rows`]) so that the half-split rotation applies.
    fn projection(
        &self,
        names: &[&str],
        inputs: usize,
        outputs: &[usize],
        heads: &[Option<usize>],
    ) -> Result<Box<dyn Layer>> {
        let mut parts = Vec::with_capacity(names.len());
        for (i, (name, &o)) in names.iter().zip(outputs).enumerate() {
            let (t, b) = self.g.bytes(name)?;
            if t.shape() != [o, inputs] {
                return Err(self.g.format_error(
                    Some(name),
                    format!(
                        "shape {:?}, but the metadata makes it {:?}",
                        t.shape(),
                        [o, inputs]
                    ),
                ));
            }
            let b = match heads.get(i).copied().flatten() {
                Some(h) => unpermute_rows(b, o, h),
                None => b.to_vec(),
            };
            parts.push((t.kind, b));
        }
        let format = match parts[0].0 {
            TensorType::Quant(f) if parts.iter().all(|p| p.0 == parts[0].0) => Some(f),
            _ => None,
        };
        let total: usize = outputs.iter().sum();
        if let Some(format) = format {
            let bytes: Vec<u8> = parts.into_iter().flat_map(|p| p.1).collect();
            let w = QuantMatrix::from_blocks(self.ctx, format, total, inputs, &bytes)?;
            return Ok(Box::new(QuantLinear::new(w)));
        }
        // Dense: `[inputs, sum out_i]`, each matrix transposed into its columns.
        let mut w = vec![0f32; inputs * total];
        let mut first = 0;
        for ((kind, bytes), &o) in parts.iter().zip(outputs) {
            let v = crate::gguf::decode(*kind, bytes);
            for r in 0..o {
                for i in 0..inputs {
                    w[i * total + first + r] = v[r * inputs + i];
                }
            }
            first += o;
        }
        let weight = Parameter::new(names[0], &self.ctx.from_vec(w, &[inputs, total])?)?;
        Ok(Box::new(Linear::from_parameters(weight, None)?))
    }
}

/// The rows of a query or key projection (`rows` rows, `heads` heads of `rows / heads`)
/// in Hugging Face's order: llama.cpp's converter permuted each head's rows so that its
/// rotation pairs adjacent features (2j, 2j + 1); Hugging Face's pairs j with j + D/2.
/// Row `h D + i D/2 + j` here is row `h D + 2 j + i` of the file (transformers'
/// `reverse_permute`). Whole rows move, so quantised blocks move with them untouched.
pub fn unpermute_rows(bytes: &[u8], rows: usize, heads: usize) -> Vec<u8> {
    let rb = bytes.len() / rows;
    let d = rows / heads;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..d / 2 {
                let (to, from) = (h * d + i * d / 2 + j, h * d + 2 * j + i);
                out[to * rb..(to + 1) * rb].copy_from_slice(&bytes[from * rb..(from + 1) * rb]);
            }
        }
    }
    out
}

/// Compiled graphs of one capacity, reused by every generation that fits it.
#[derive(Debug)]
pub struct DecodeGraphs {
    /// The capacity (positions) of the caches.
    pub capacity: usize,
    /// The decode step, slots: token, position, then the caches.
    pub step: Compiled,
}

impl LlamaModel {
    /// The decode step compiled for caches of `capacity` positions.
    pub fn compile_decode(&self, capacity: usize) -> Result<DecodeGraphs> {
        let (hkv, dh) = (self.config.n_kv_heads, self.config.head_dim());
        let id = self.ctx.from_vec(vec![0i64], &[1, 1])?;
        let pos = self.ctx.from_vec(vec![0i64], &[1])?;
        let caches = (0..2 * self.blocks.len())
            .map(|_| {
                self.ctx
                    .from_vec(vec![0f32; capacity * hkv * dh], &[1, capacity, hkv, dh])
            })
            .collect::<ndfuse::Result<Vec<_>>>()?;
        let outs = self.decode_step(&id, &pos, &caches);
        let out_refs: Vec<&Tensor> = outs.iter().collect();
        let mut ins: Vec<&Tensor> = vec![&id, &pos];
        ins.extend(caches.iter());
        let step = self.ctx.compile(&out_refs, &ins)?;
        Ok(DecodeGraphs { capacity, step })
    }
}
