//! Sentence embeddings from all-MiniLM-L6-v2 (or any BERT folder) through the library,
//! as `ndfuse embed` does it, and their cosine similarities:
//!
//! ```sh
//! bash scripts/fetch_models.sh ~/ndfuse-models
//! cargo run --release -p ndfuse-models --example embed -- ~/ndfuse-models/all-minilm-l6-v2
//! ```

use ndfuse_models::BertModel;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: embed MODEL_DIR");
        std::process::exit(2);
    };
    let ctx = ndfuse::Context::new();
    let model = BertModel::load(&ctx, &dir)?;
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awesome.",
    ];
    let e = model.embed(&texts)?;
    for (i, a) in e.iter().enumerate() {
        for (j, b) in e.iter().enumerate().skip(i + 1) {
            let cos: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            println!("{:.3}  {:?} / {:?}", cos, texts[i], texts[j]);
        }
    }
    Ok(())
}
