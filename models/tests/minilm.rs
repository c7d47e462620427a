//! all-MiniLM-L6-v2 from its safetensors folder against sentence-transformers' own
//! outputs (models/tests/fixtures/minilm.json, made by scripts/model_fixtures.py): the
//! WordPiece ids, and embeddings of cosine >= 0.9999 with the reference.

use ndfuse_models::BertModel;

mod support;

#[test]
fn minilm_embeds_like_sentence_transformers() {
    let Some(dir) = support::model_file("all-minilm-l6-v2") else {
        return;
    };
    let fx = support::fixture("minilm.json");
    let ctx = ndfuse::Context::new();
    let model = BertModel::load(&ctx, &dir).unwrap();
    let sentences: Vec<&str> = fx["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for (s, want) in sentences.iter().zip(fx["ids"].as_array().unwrap()) {
        assert_eq!(
            model.tokenizer().encode(s, true).unwrap(),
            support::ids(want),
            "{s:?}"
        );
    }
    // One batch of all six (padding masked), and one sentence alone: the same vectors.
    let batch = model.embed(&sentences).unwrap();
    let alone = model.embed(&sentences[..1]).unwrap();
    for (i, (got, want)) in batch
        .iter()
        .zip(fx["embeddings"].as_array().unwrap())
        .enumerate()
    {
        let want: Vec<f64> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let dot: f64 = got.iter().zip(&want).map(|(&a, &b)| f64::from(a) * b).sum();
        let norm: f64 = got
            .iter()
            .map(|&a| f64::from(a) * f64::from(a))
            .sum::<f64>()
            .sqrt();
        let cos = dot / norm / want.iter().map(|b| b * b).sum::<f64>().sqrt();
        assert!(
            cos >= 0.9999,
            "sentence {i}: cosine {cos} with sentence-transformers'"
        );
        assert!((norm - 1.0).abs() < 1e-5, "sentence {i}: norm {norm}");
    }
    let diff = batch[0]
        .iter()
        .zip(&alone[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        diff < 1e-5,
        "sentence 0 padded in a batch vs alone: max difference {diff}"
    );
}
