//! ndfuse-models: models someone else trained, on ndfuse.
//!
//! - Loaders: [`Gguf`] (llama.cpp's files: metadata, F32/F16/BF16 and the Q8_0, Q4_0
//!   and Q4_1 block formats of [`ndfuse_ir::quant`]) and [`SafetensorsFile`] (Hugging Face's),
//!   memory-mapped, every offset checked;
//! - [`Tokenizer`]: Hugging Face's `tokenizers` crate, from a `tokenizer.json` or a
//!   GGUF's vocabulary and merges, with the chat template;
//! - [`BertModel`] (sentence embeddings) and [`LlamaModel`] (text generation with a
//!   key/value cache: [`generate`]), built from `ndfuse-nn` layers;
//! - [`Sampler`]: greedy, temperature, top-k and top-p, seeded.

pub mod bert;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod llama;
mod mapped;
pub mod safetensors;
pub mod sample;
pub mod tokenizer;

pub use bert::{BertConfig, BertModel};
pub use error::{Error, Result};
pub use generate::{generate, GenerateOptions, Generation};
pub use gguf::{Gguf, TensorInfo, TensorType, Value};
pub use llama::{LlamaConfig, LlamaModel};
pub use ndfuse_ir::quant::BlockFormat;
pub use safetensors::SafetensorsFile;
pub use sample::{Sampler, Sampling};
pub use tokenizer::Tokenizer;
