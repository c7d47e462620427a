//! Text generation with a [`LlamaModel`]: the prompt in one prefill graph, then one
//! compiled decode step per token over a key/value cache of fixed capacity (the prompt
//! and the tokens asked for, rounded up to [`CAPACITY_STEP`] positions, so generations
//! of nearby lengths share the compiled step).

use crate::error::{Error, Result};
use crate::llama::LlamaModel;
use crate::sample::{Sampler, Sampling};
use std::time::Instant;

/// Cache capacities are rounded up to a multiple of this.
pub const CAPACITY_STEP: usize = 128;

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Whether the end-of-sequence token ends the generation (it is not returned).
    pub stop_at_eos: bool,
}

impl Default for GenerateOptions {
    /// 128 greedy tokens, stopping at EOS.
    fn default() -> GenerateOptions {
        GenerateOptions {
            max_tokens: 128,
            sampling: Sampling::default(),
            stop_at_eos: true,
        }
    }
}

/// A finished generation and its figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The prompt's ids.
    pub prompt_tokens: Vec<u32>,
    /// The generated ids (EOS excluded).
    pub tokens: Vec<u32>,
    /// The generated text.
    pub text: String,
    /// Seconds of the prefill (the prompt through the model, first token's logits).
    pub prefill_seconds: f64,
    /// Seconds of the decode steps.
    pub decode_seconds: f64,
    /// Decode steps run (each gives one token's logits).
    pub decode_steps: usize,
    /// Kernels compiled after the first decode step (the step is compiled once).
    pub decode_compiles: u64,
}

impl Generation {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens.len() as f64 / self.prefill_seconds.max(1e-12)
    }

    /// Generated tokens per second of decode.
    pub fn decode_tok_s(&self) -> f64 {
        self.decode_steps as f64 / self.decode_seconds.max(1e-12)
    }
}

/// Generates from the prompt `prompt` (token ids) with `model`, calling `on_text` with
/// each piece of new text as soon as it decodes to whole characters.
///
/// # Errors
/// [`Error::Argument`] for an empty prompt or one that with `max_tokens` exceeds the
/// model's context; a tensor error from an evaluation.
pub fn generate(
    model: &LlamaModel,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    let ctx = model.context();
    let context = model.config().context_length;
    if prompt.is_empty() || prompt.len() + opts.max_tokens > context {
        return Err(Error::Argument {
            what: "generate",
            why: format!(
                "a prompt of {} tokens and {} new ones must be non-empty and fit the context of {context}",
                prompt.len(),
                opts.max_tokens
            ),
        });
    }
    let capacity = (prompt.len() + opts.max_tokens)
        .div_ceil(CAPACITY_STEP)
        .saturating_mul(CAPACITY_STEP)
        .min(context);
    let mut sampler = Sampler::new(opts.sampling.clone());
    let eos = model.tokenizer().eos().filter(|_| opts.stop_at_eos);

    let started = Instant::now();
    let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    let ids = ctx.from_vec(ids, &[1, prompt.len()])?;
    let outs = model.prefill(&ids, capacity);
    let refs: Vec<&ndfuse::Tensor> = outs.iter().collect();
    let mut results = ctx.eval(&refs)?;
    let prefill_seconds = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut tokens = Vec::new();
    let mut shown = String::new();
    let mut steps = 0;
    let mut compiles_after_first = None;
    let step = if opts.max_tokens > 1 {
        Some(model.compile_decode(capacity)?)
    } else {
        None
    };
    loop {
        let logits = results[0].to_vec::<f32>()?;
        let next = sampler.next(&logits);
        if Some(next) == eos {
            break;
        }
        tokens.push(next);
        let text = model.tokenizer().decode(&tokens, false)?;
        if !text.ends_with('\u{fffd}') && text.len() > shown.len() && text.starts_with(&shown) {
            on_text(&text[shown.len()..]);
            shown = text;
        }
        if tokens.len() >= opts.max_tokens {
            break;
        }
        let Some(step) = &step else { break };
        let position = (prompt.len() + tokens.len() - 1) as i64;
        let id = ctx.from_vec(vec![i64::from(next)], &[1, 1])?;
        let pos = ctx.from_vec(vec![position], &[1])?;
        let caches: Vec<ndfuse::Tensor> = results.drain(1..).map(|a| ctx.tensor(a)).collect();
        let mut inputs: Vec<&ndfuse::Tensor> = vec![&id, &pos];
        inputs.extend(caches.iter());
        results = step.step.run(&inputs)?;
        steps += 1;
        if compiles_after_first.is_none() {
            compiles_after_first = Some(ctx.compile_cache_stats().kernels.misses);
        }
    }
    let decode_compiles = compiles_after_first
        .map(|first| ctx.compile_cache_stats().kernels.misses - first)
        .unwrap_or(0);
    let text = model.tokenizer().decode(&tokens, false)?;
    if text.len() > shown.len() && text.starts_with(&shown) {
        on_text(&text[shown.len()..]);
    }
    Ok(Generation {
        prompt_tokens: prompt.to_vec(),
        tokens,
        text,
        prefill_seconds,
        decode_seconds: started.elapsed().as_secs_f64(),
        decode_steps: steps,
        decode_compiles,
    })
}
