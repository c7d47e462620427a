//! Tokenizers through Hugging Face's own `tokenizers` crate (never a hand-written BPE or
//! WordPiece): a `tokenizer.json` as it is, or the byte-level BPE a GGUF file describes
//! in its metadata (`tokenizer.ggml.*`: the tokens, their types and the merges), built
//! the way Hugging Face `transformers` builds it from the same file. Chat templates
//! (Jinja, `tokenizer.chat_template`) are rendered with minijinja.

use crate::error::{Error, Result};
use crate::gguf::{Gguf, Value};
use serde_json::{json, Map};
use std::path::Path;

/// A tokenizer and the ids and template a model's prompts need.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    chat_template: Option<String>,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer { why: e.to_string() }
}

impl Tokenizer {
    /// The tokenizer of a `tokenizer.json`, without its padding (batches are padded by
    /// the model) and truncating to `max_len` tokens.
    pub fn from_json_file(path: &Path, max_len: usize) -> Result<Tokenizer> {
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        inner.with_padding(None);
        inner
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(tok_err)?;
        Ok(Tokenizer {
            inner,
            bos: None,
            eos: None,
            add_bos: false,
            chat_template: None,
        })
    }

    /// The byte-level BPE tokenizer of a GGUF file (`tokenizer.ggml.model` `gpt2`):
    /// the vocabulary in id order, the merges, the control and user-defined tokens as
    /// special tokens, the BOS/EOS ids, whether a BOS is added, and the chat template.
    ///
    /// # Errors
    /// [`Error::Format`] naming the key when the metadata lacks or mistypes one;
    /// [`Error::Tokenizer`] for another tokenizer model than `gpt2`.
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(tok_err(format!(
                "{}: tokenizer.ggml.model {model:?} is not supported (gpt2, byte-level BPE, is)",
                gguf.path().display()
            )));
        }
        let tokens = gguf.get_strings("tokenizer.ggml.tokens")?;
        let merges = gguf.get_strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = match gguf.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let id = |key: &str| gguf.get(key).and_then(Value::as_u64).map(|v| v as u32);
        let (bos, eos) = (
            id("tokenizer.ggml.bos_token_id"),
            id("tokenizer.ggml.eos_token_id"),
        );
        let add_bos = matches!(
            gguf.get("tokenizer.ggml.add_bos_token"),
            Some(Value::Bool(true))
        );

        let mut vocab = Map::new();
        for (i, t) in tokens.iter().enumerate() {
            vocab.insert((*t).to_string(), json!(i));
        }
        let merges: Vec<serde_json::Value> = merges.iter().map(|m| json!(m)).collect();
        // Control (3) and user-defined (4) tokens match whole before the BPE, as
        // transformers adds them; control ones are special (skipped when decoding with
        // skip_special_tokens).
        let added: Vec<serde_json::Value> = tokens
            .iter()
            .enumerate()
            .filter(|&(i, _)| matches!(types.get(i), Some(3 | 4)))
            .map(|(i, t)| {
                json!({
                    "id": i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": types[i] == 4, "special": types[i] == 3
                })
            })
            .collect();
        let post = if add_bos {
            let bos_id = bos.ok_or_else(|| {
                gguf.format_error(
                    Some("tokenizer.ggml.bos_token_id"),
                    "missing, but add_bos_token is true",
                )
            })?;
            let bos_tok = tokens.get(bos_id as usize).copied().unwrap_or_default();
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos_tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos_tok: {"id": bos_tok, "ids": [bos_id], "tokens": [bos_tok]}}
            })
        } else {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true})
        };
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": merges
            }
        });
        let inner: tokenizers::Tokenizer = spec.to_string().parse().map_err(tok_err)?;
        let chat_template = gguf
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Tokenizer {
            inner,
            bos,
            eos,
            add_bos,
            chat_template,
        })
    }

    /// The ids of `text`; with `special`, the model's added tokens around it (BERT's
    /// `[CLS]` and `[SEP]`, a BOS where the model adds one).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let e = self.inner.encode(text, special).map_err(tok_err)?;
        Ok(e.get_ids().to_vec())
    }

    /// The text of `ids`; special tokens kept unless `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    /// The vocabulary's size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether [`Tokenizer::encode`] with `special` puts a BOS first.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// The token string of `id`.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// `messages` (role, content) rendered by the model's chat template with the
    /// assistant's turn opened (`add_generation_prompt`), as Hugging Face's
    /// `apply_chat_template(..., tokenize=False, add_generation_prompt=True)` renders it.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the model has no template or it fails to render.
    pub fn apply_chat_template(&self, messages: &[(&str, &str)]) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| tok_err("the model has no chat template"))?;
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", template).map_err(tok_err)?;
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let token = |id: Option<u32>| id.and_then(|i| self.token(i)).unwrap_or_default();
        env.get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => token(self.bos),
                    eos_token => token(self.eos),
                })
            })
            .map_err(tok_err)
    }
}
