//! What can go wrong importing or running an ONNX model. Every error names what the user
//! can act on: the file, the node (its name and operator, the opset), the input.

use std::path::PathBuf;
use std::sync::Arc;

/// An error of `ndfuse-onnx`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OnnxError {
    /// A file that could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: Arc<std::io::Error>,
    },
    /// Bytes that are not an ONNX model or tensor (truncated, another format).
    #[error("{what} is not a valid ONNX {kind}: {why}")]
    Decode {
        /// The file (or `<bytes>`).
        what: String,
        /// `model` or `tensor`.
        kind: &'static str,
        /// What the protobuf decoder said.
        why: String,
    },
    /// A tensor (initializer, `Constant`, test data) that ndfuse cannot hold or whose
    /// data does not match its shape.
    #[error("tensor '{name}': {why}")]
    Tensor {
        /// The tensor's name in the file.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// An operator, attribute or dtype the importer does not support.
    #[error("node '{node}' ({op}, opset {opset}): {what} is not supported")]
    Unsupported {
        /// The node's name (or its index when unnamed).
        node: String,
        /// The operator.
        op: String,
        /// The opset the model imports for the operator's domain.
        opset: i64,
        /// What is missing.
        what: String,
    },
    /// A node whose attributes or inputs break the operator's specification.
    #[error("node '{node}' ({op}, opset {opset}): {why}")]
    Node {
        /// The node's name (or its index when unnamed).
        node: String,
        /// The operator.
        op: String,
        /// The opset.
        opset: i64,
        /// What is wrong.
        why: String,
    },
    /// A graph input given with the wrong shape or dtype, or not given.
    #[error("input '{name}': {why}")]
    Input {
        /// The graph input.
        name: String,
        /// Both shapes or dtypes, or what is missing.
        why: String,
    },
    /// A graph that refers to a value nothing defines, or similar structural faults.
    #[error("graph: {0}")]
    Graph(String),
    /// An op ndfuse refused while building or evaluating a node's graph.
    #[error("node '{node}' ({op}): {source}")]
    Op {
        /// The node's name.
        node: String,
        /// The operator.
        op: String,
        /// ndfuse's error (it names the shapes).
        source: Box<ndfuse::Error>,
    },
    /// Evaluating the model's graph failed.
    #[error(transparent)]
    Eval(Box<ndfuse::Error>),
}

impl From<ndfuse::Error> for OnnxError {
    fn from(e: ndfuse::Error) -> OnnxError {
        OnnxError::Eval(Box::new(e))
    }
}

/// `Result` with [`OnnxError`].
pub type Result<T, E = OnnxError> = std::result::Result<T, E>;
