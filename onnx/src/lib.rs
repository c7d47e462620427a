//! # ndfuse-onnx
//!
//! ONNX models lowered into ndfuse's lazy graph: a `.onnx` file is parsed (prost, the
//! official `onnx.proto`), its initializers and `Constant`s become tensors, and each node
//! becomes ndfuse ops, so the whole model is one graph that fusion and the compiler see.
//! Values computed only from constants (shapes, axis lists) are folded at import time
//! through the f64 reference interpreter; a shape that depends on the data is an error
//! that names the node.
//!
//! ```no_run
//! let model = ndfuse_onnx::Model::load("model.onnx")?;
//! let ctx = ndfuse::Context::new();
//! let x = ndfuse::Array::from_vec(vec![0.0f32; 3 * 224 * 224], &[1, 3, 224, 224])?;
//! let outs = model.run(&ctx, &[("input".to_string(), x)])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod model;
mod node;
mod ops;
#[allow(missing_docs)]
pub mod proto;
pub mod suite;
mod support;
mod tensor;

pub use error::{OnnxError, Result};
pub use model::{Model, Signature};
pub use ops::{support_table, supported};
pub use support::Support;
pub use tensor::{dtype_of, from_array, read_tensor_file, to_array};
