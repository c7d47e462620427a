//! SmolLM2-135M-Instruct from its 4-bit GGUF against Hugging Face transformers on the
//! same file's dequantised weights (models/tests/fixtures/smollm2.json, made by
//! scripts/model_fixtures.py): the tokenizer's ids, the chat template, the first
//! logits, and 32 greedy tokens per prompt with a decode step compiled once.

use ndfuse_models::{generate, GenerateOptions, LlamaModel};

mod support;

fn model() -> Option<(ndfuse::Context, LlamaModel)> {
    let path = support::model_file("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")?;
    let ctx = ndfuse::Context::new();
    let model = LlamaModel::load(&ctx, &path).unwrap();
    Some((ctx, model))
}

#[test]
fn smollm2_tokenizes_and_generates_like_transformers() {
    let Some((_ctx, model)) = model() else {
        return;
    };
    let fx = support::fixture("smollm2.json");
    let tok = model.tokenizer();
    for case in fx["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = support::ids(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want, "{text:?}");
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            text,
            "decode of {text:?}"
        );
    }
    assert_eq!(tok.bos(), Some(fx["bos_id"].as_u64().unwrap() as u32));
    assert_eq!(tok.eos(), Some(fx["eos_id"].as_u64().unwrap() as u32));
    let chat = &fx["chat"];
    let msg = &chat["messages"][0];
    let text = tok
        .apply_chat_template(&[(
            msg["role"].as_str().unwrap(),
            msg["content"].as_str().unwrap(),
        )])
        .unwrap();
    assert_eq!(text, chat["text"].as_str().unwrap());
    assert_eq!(
        tok.encode(&text, false).unwrap(),
        support::ids(&chat["ids"])
    );

    for case in fx["greedy"].as_array().unwrap() {
        let prompt = support::ids(&case["prompt_ids"]);
        let want = support::ids(&case["tokens"]);
        let opts = GenerateOptions {
            max_tokens: want.len(),
            stop_at_eos: false,
            ..GenerateOptions::default()
        };
        let g = generate(&model, &prompt, &opts, |_| {}).unwrap();
        assert_eq!(
            g.tokens, want,
            "greedy continuation of {:?}",
            case["prompt"]
        );
        assert_eq!(
            g.decode_compiles, 0,
            "kernels compiled after the first decode step"
        );
    }
}
