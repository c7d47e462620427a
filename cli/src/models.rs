//! `ndfuse generate` and `ndfuse embed`: pretrained models (ndfuse-models) from the
//! shell. `generate` streams the text to stdout and the prefill and decode speeds to
//! stderr, or prints one JSON object with `--json`; `embed` prints one embedding a line,
//! or `{"embeddings": [[...], ...]}` with `--json`.

use crate::choices::Backend;
use crate::failure::Failure;
use ndfuse::Context;
use ndfuse_models::{generate, BertModel, GenerateOptions, LlamaModel, Sampling};
use std::io::Write as _;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A Llama-architecture GGUF file (SmolLM2's: scripts/fetch_models.sh).
    #[arg(long, value_name = "FILE.gguf")]
    model: PathBuf,
    /// The prompt (with --chat, the user's message).
    #[arg(long, allow_hyphen_values = true)]
    prompt: String,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample only from the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample only from the most likely tokens whose probabilities reach P.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// The sampler's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Wrap the prompt in the model's chat template as a user's message.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object: prompt_tokens, tokens, text, prefill_tok_s, decode_tok_s,
    /// decode_compiles.
    #[arg(long)]
    json: bool,
    /// Backend: auto picks the highest-priority one present.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
}

#[derive(clap::Args, Debug)]
pub struct EmbedArgs {
    /// A BERT folder: config.json, model.safetensors, tokenizer.json (all-MiniLM-L6-v2's:
    /// scripts/fetch_models.sh).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// A text to embed (repeat for several; they run as one batch).
    #[arg(long = "text", required = true, allow_hyphen_values = true)]
    texts: Vec<String>,
    /// Print `{"embeddings": [[...], ...]}`.
    #[arg(long)]
    json: bool,
    /// Backend: auto picks the highest-priority one present.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
}

fn context(backend: Backend) -> Result<Context, Failure> {
    Context::builder()
        .backend(backend.into())
        .build()
        .map_err(|e| Failure::plain(e.reason()))
}

pub fn generate_cmd(a: &GenerateArgs) -> Result<(), Failure> {
    let ctx = context(a.backend)?;
    let model = LlamaModel::load(&ctx, &a.model).map_err(Failure::plain)?;
    let tok = model.tokenizer();
    let text = if a.chat {
        tok.apply_chat_template(&[("user", &a.prompt)])
            .map_err(Failure::plain)?
    } else {
        a.prompt.clone()
    };
    let prompt = tok.encode(&text, true).map_err(Failure::plain)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: Sampling {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop_at_eos: true,
    };
    let mut out = std::io::stdout().lock();
    let g = generate(&model, &prompt, &opts, |piece| {
        if !a.json {
            // A closed stdout (`| head`) is not worth a panic.
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    })
    .map_err(Failure::plain)?;
    if a.json {
        let obj = serde_json::json!({
            "prompt_tokens": g.prompt_tokens,
            "tokens": g.tokens,
            "text": g.text,
            "prefill_tok_s": g.prefill_tok_s(),
            "decode_tok_s": g.decode_tok_s(),
            "decode_compiles": g.decode_compiles,
        });
        let _ = writeln!(out, "{obj}");
    } else {
        let _ = writeln!(out);
        eprintln!(
            "prefill: {} tokens, {:.1} tok/s; decode: {} tokens, {:.1} tok/s; kernels compiled after the first decode step: {}",
            g.prompt_tokens.len(),
            g.prefill_tok_s(),
            g.decode_steps,
            g.decode_tok_s(),
            g.decode_compiles
        );
    }
    Ok(())
}

pub fn embed_cmd(a: &EmbedArgs) -> Result<(), Failure> {
    let ctx = context(a.backend)?;
    let model = BertModel::load(&ctx, &a.model).map_err(Failure::plain)?;
    let texts: Vec<&str> = a.texts.iter().map(String::as_str).collect();
    let e = model.embed(&texts).map_err(Failure::plain)?;
    let text = if a.json {
        format!("{}\n", serde_json::json!({ "embeddings": e }))
    } else {
        e.iter()
            .map(|v| {
                let row: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
                row.join(" ") + "\n"
            })
            .collect()
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}
