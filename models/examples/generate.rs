//! Text from SmolLM2 (or any Llama-architecture GGUF) through the library, as
//! `ndfuse generate` does it:
//!
//! ```sh
//! bash scripts/fetch_models.sh ~/ndfuse-models
//! cargo run --release -p ndfuse-models --example generate -- \
//!     ~/ndfuse-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 'What is the capital of France?'
//! ```

use ndfuse_models::{generate, GenerateOptions, LlamaModel, Sampling};
use std::io::Write as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(prompt)) = (args.next(), args.next()) else {
        eprintln!("usage: generate MODEL.gguf PROMPT");
        std::process::exit(2);
    };
    let ctx = ndfuse::Context::new();
    let model = LlamaModel::load(&ctx, &path)?;
    let text = model
        .tokenizer()
        .apply_chat_template(&[("user", &prompt)])?;
    let ids = model.tokenizer().encode(&text, true)?;
    let opts = GenerateOptions {
        max_tokens: 64,
        sampling: Sampling {
            temperature: 0.7,
            top_p: 0.9,
            seed: 1,
            ..Sampling::default()
        },
        stop_at_eos: true,
    };
    let g = generate(&model, &ids, &opts, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!(
        "{} prompt tokens at {:.0} tok/s, {} new at {:.1} tok/s, {} kernels compiled after the first step",
        g.prompt_tokens.len(),
        g.prefill_tok_s(),
        g.tokens.len(),
        g.decode_tok_s(),
        g.decode_compiles
    );
    Ok(())
}
