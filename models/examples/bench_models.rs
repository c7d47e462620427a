//! SmolLM2 prefill and decode and MiniLM sentences per second, warm (the graphs
//! compiled by a first run), printed as one JSON object: what bench/RESULTS.md compares
//! with llama.cpp (`scripts/llama_cpp_peer.py`) and sentence-transformers in the same
//! minutes.
//!
//! ```sh
//! cargo run --release -p ndfuse-models --example bench_models -- ~/ndfuse-models
//! ```

use ndfuse_models::{generate, BertModel, GenerateOptions, LlamaModel};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: bench_models DIR"));
    let ctx = ndfuse::Context::new();
    let model = LlamaModel::load(&ctx, dir.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))?;
    let text = "The history of computing is a story of machines that learned to follow \
                instructions ever faster, from mechanical calculators to electronic computers. "
        .repeat(12);
    let mut ids = model.tokenizer().encode(&text, false)?;
    ids.truncate(128);
    let opts = GenerateOptions {
        max_tokens: 128,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    // A first run compiles the prefill and the decode step; the best of three after it.
    generate(&model, &ids, &opts, |_| {})?;
    let (mut prefill, mut decode, mut compiles) = (0f64, 0f64, 0);
    for _ in 0..3 {
        let g = generate(&model, &ids, &opts, |_| {})?;
        prefill = prefill.max(g.prefill_tok_s());
        decode = decode.max(g.decode_tok_s());
        compiles += g.decode_compiles;
    }
    // Bytes a decode step reads of weights: the quantised blocks (the lookup's one row
    // of the f32 embedding table aside).
    let weight_bytes =
        std::fs::metadata(dir.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))?.len();

    let bert = BertModel::load(&ctx, dir.join("all-minilm-l6-v2"))?;
    let sentence = "A compiler for tensor programs fuses element-wise work into the kernels around it, so the data is read once.";
    let sentences: Vec<&str> = (0..64).map(|_| sentence).collect();
    bert.embed(&sentences)?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        bert.embed(&sentences)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let tokens = bert.tokenizer().encode(sentence, true)?.len();
    println!(
        "{}",
        serde_json::json!({
            "smollm2_prompt_tokens": ids.len(),
            "smollm2_prefill_tok_s": prefill,
            "smollm2_decode_tok_s": decode,
            "smollm2_decode_compiles": compiles,
            "smollm2_file_bytes": weight_bytes,
            "minilm_sentences": sentences.len(),
            "minilm_tokens_per_sentence": tokens,
            "minilm_sentences_s": sentences.len() as f64 / best,
        })
    );
    Ok(())
}
