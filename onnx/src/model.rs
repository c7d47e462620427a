//! A model file: parsed once, then lowered into a lazy ndfuse graph for given inputs and
//! evaluated as one graph (fusion sees the whole model).

use crate::error::{OnnxError, Result};
use crate::node::{Node, Value};
use crate::ops;
use crate::proto::{type_proto, GraphProto, ModelProto, ValueInfoProto};
use crate::tensor::{dtype_of, to_array};
use ndfuse::{Array, BackendKind, Context, DType, Report, Tensor};
use prost::Message;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Values computed only from constants with at most this many input elements are
/// folded at import time through the reference interpreter (shapes, axis lists, small
/// weight transforms); larger ones stay in the graph.
const FOLD_LIMIT: usize = 1 << 22;

/// Graph inputs up to this many elements are known at import time, for the nodes that
/// take a shape, axes, a count or a fill value as an input (the others read the tensor).
const KNOWN_INPUT_LIMIT: usize = 64;

/// Nodes on known values that are not all constants are computed at import too (their
/// values known to the nodes after them) when their inputs hold at most this many
/// elements; they stay in the graph as well, computed from the inputs at run time.
const KNOWN_FOLD_LIMIT: usize = 4096;

/// A graph input or output as the file declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    /// Its name.
    pub name: String,
    /// Its element type, when the file gives one ndfuse holds.
    pub dtype: Option<DType>,
    /// Its extents: a number, or `None` for a symbolic or unknown one.
    pub dims: Option<Vec<Option<usize>>>,
    /// Whether it is a tensor (not a sequence, map or optional), or its type is unknown.
    pub tensor: bool,
}

/// An ONNX model, parsed.
#[derive(Debug, Clone)]
pub struct Model {
    proto: ModelProto,
    dir: Option<PathBuf>,
    opsets: HashMap<String, i64>,
    /// The constants' data by value name (initializers decoded, `Constant`s and what
    /// was folded from them), kept from the first build for the next: they do not
    /// depend on the inputs.
    constants: Arc<Mutex<HashMap<String, Array>>>,
}

impl Model {
    /// Reads and parses a `.onnx` file; external data is looked up beside it.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| OnnxError::Io {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let mut m = Model::from_bytes(&bytes, &path.display().to_string())?;
        m.dir = path.parent().map(Path::to_owned);
        Ok(m)
    }

    /// Parses a model from bytes; `what` names them in errors.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Model> {
        let proto = ModelProto::decode(bytes).map_err(|e| OnnxError::Decode {
            what: what.to_owned(),
            kind: "model",
            why: e.to_string(),
        })?;
        if proto.graph.is_none() {
            return Err(OnnxError::Decode {
                what: what.to_owned(),
                kind: "model",
                why: "it has no graph".into(),
            });
        }
        let mut opsets = HashMap::new();
        for o in &proto.opset_import {
            let domain = o.domain.clone().unwrap_or_default();
            let domain = if domain == "ai.onnx" {
                String::new()
            } else {
                domain
            };
            opsets.insert(domain, o.version.unwrap_or(1));
        }
        if opsets.is_empty() {
            // IR version 2 files predate opset_import: opset 1.
            opsets.insert(String::new(), 1);
        }
        Ok(Model {
            proto,
            dir: None,
            opsets,
            constants: Arc::default(),
        })
    }

    fn graph(&self) -> &GraphProto {
        self.proto.graph.as_ref().expect("checked at load")
    }

    /// The opset the model imports for the default (`ai.onnx`) domain.
    pub fn opset(&self) -> i64 {
        self.opsets.get("").copied().unwrap_or(1)
    }

    /// The graph's real inputs (initializers that are also listed as inputs excluded).
    pub fn inputs(&self) -> Vec<Signature> {
        let g = self.graph();
        let init: std::collections::HashSet<&str> = g
            .initializer
            .iter()
            .filter_map(|t| t.name.as_deref())
            .collect();
        g.input
            .iter()
            .filter(|v| !init.contains(v.name.as_deref().unwrap_or("")))
            .map(signature)
            .collect()
    }

    /// The operator of a one-node graph, else `composite` (the suite's label).
    pub fn operator_summary(&self) -> String {
        match self.graph().node.as_slice() {
            [one] => one.op_type.clone().unwrap_or_default(),
            _ => "composite".into(),
        }
    }

    /// The graph's outputs.
    pub fn outputs(&self) -> Vec<Signature> {
        self.graph().output.iter().map(signature).collect()
    }

    /// The graph's outputs as lazy tensors of `ctx`, for the given inputs (by name).
    /// Nothing runs but the folding of values known at import time.
    pub fn build(
        &self,
        ctx: &Context,
        inputs: &[(String, Array)],
    ) -> Result<Vec<(String, Tensor)>> {
        let g = self.graph();
        let fold = Context::new();
        fold.set_backend(BackendKind::Interp);
        let mut values: HashMap<String, Value> = HashMap::new();
        let mut constants = self.constants.lock().unwrap_or_else(|p| p.into_inner());
        let mut fixed: std::collections::HashSet<String> = std::collections::HashSet::new();
        for t in &g.initializer {
            let name = t.name.clone().unwrap_or_default();
            let a = match constants.get(&name) {
                Some(a) => a.clone(),
                None => {
                    let a = to_array(t, self.dir.as_deref())?;
                    constants.insert(name.clone(), a.clone());
                    a
                }
            };
            fixed.insert(name.clone());
            values.insert(
                name,
                Value {
                    tensor: ctx.from_array(&a),
                    known: Some(a),
                    constant: true,
                },
            );
        }
        for sig in self.inputs() {
            let Some((_, a)) = inputs.iter().find(|(n, _)| *n == sig.name) else {
                return Err(OnnxError::Input {
                    name: sig.name.clone(),
                    why: "not given (the model's inputs are: ".to_owned()
                        + &self
                            .inputs()
                            .iter()
                            .map(|s| s.name.clone())
                            .collect::<Vec<_>>()
                            .join(", ")
                        + ")",
                });
            };
            check_input(&sig, a)?;
            let small = a.len() <= KNOWN_INPUT_LIMIT;
            values.insert(
                sig.name.clone(),
                Value {
                    tensor: ctx.from_array(a),
                    known: small.then(|| a.clone()),
                    constant: false,
                },
            );
        }
        for (n, _) in inputs {
            if !self.inputs().iter().any(|s| s.name == *n) {
                return Err(OnnxError::Input {
                    name: n.clone(),
                    why: "the model has no such input".into(),
                });
            }
        }
        for (index, proto) in g.node.iter().enumerate() {
            let domain = proto.domain.clone().unwrap_or_default();
            let domain = if domain == "ai.onnx" {
                String::new()
            } else {
                domain
            };
            let name = match proto.name.as_deref() {
                Some(n) if !n.is_empty() => n.to_owned(),
                _ => format!("#{index}"),
            };
            let Some(&opset) = self.opsets.get(&domain) else {
                return Err(OnnxError::Unsupported {
                    node: name,
                    op: proto.op_type.clone().unwrap_or_default(),
                    opset: 0,
                    what: format!("operator domain '{domain}'"),
                });
            };
            let mut ins = Vec::with_capacity(proto.input.len());
            for n in &proto.input {
                if n.is_empty() {
                    ins.push(None);
                    continue;
                }
                let v = values.get(n).cloned().ok_or_else(|| {
                    OnnxError::Graph(format!(
                        "node '{name}' reads '{n}', which nothing defines before it"
                    ))
                })?;
                ins.push(Some(v));
            }
            let node = Node {
                proto,
                name,
                opset,
                ctx,
                inputs: ins,
            };
            if !domain.is_empty() {
                return Err(node.unsupported(format!("operator domain '{domain}'")));
            }
            // Input-independent: computed from initializers and constants only (a value
            // from `Shape` depends on an input's shape, which the next build may change).
            let independent = proto
                .input
                .iter()
                .all(|n| n.is_empty() || fixed.contains(n.as_str()))
                && !ops::is_random(node.op());
            let cached: Option<Vec<Value>> = independent
                .then(|| {
                    proto
                        .output
                        .iter()
                        .map(|n| {
                            constants.get(n).map(|a| Value {
                                tensor: ctx.from_array(a),
                                known: Some(a.clone()),
                                constant: true,
                            })
                        })
                        .collect()
                })
                .flatten();
            let outs = match cached {
                Some(v) if !v.is_empty() => v,
                _ => lower(&node, &fold)?,
            };
            for (i, v) in outs.into_iter().enumerate() {
                if let Some(n) = proto.output.get(i).filter(|n| !n.is_empty()) {
                    if independent && v.constant {
                        if let Some(a) = &v.known {
                            constants.entry(n.clone()).or_insert_with(|| a.clone());
                        }
                        fixed.insert(n.clone());
                    }
                    values.insert(n.clone(), v);
                }
            }
        }
        let mut outs = Vec::new();
        for o in &g.output {
            let name = o.name.clone().unwrap_or_default();
            let v = values
                .get(&name)
                .ok_or_else(|| OnnxError::Graph(format!("output '{name}' is never computed")))?;
            outs.push((name, v.tensor.clone()));
        }
        Ok(outs)
    }

    /// Runs the model on `ctx`'s backend: every output, evaluated as one graph.
    pub fn run(&self, ctx: &Context, inputs: &[(String, Array)]) -> Result<Vec<(String, Array)>> {
        Ok(self.run_report(ctx, inputs)?.0)
    }

    /// [`Model::run`] with the evaluation's report (kernels, fusion).
    pub fn run_report(
        &self,
        ctx: &Context,
        inputs: &[(String, Array)],
    ) -> Result<(Vec<(String, Array)>, Report)> {
        let outs = self.build(ctx, inputs)?;
        let tensors: Vec<&Tensor> = outs.iter().map(|(_, t)| t).collect();
        let (arrays, report) = ctx.eval_report(&tensors)?;
        Ok((
            outs.into_iter().map(|(n, _)| n).zip(arrays).collect(),
            report,
        ))
    }
}

/// Lowers one node. Its outputs are computed through the interpreter when every input
/// is known and small: they are then known too (for the nodes after it that need a
/// shape or a count), and when every input is a constant they are constants, with no
/// node in the model's graph.
fn lower(node: &Node, fold: &Context) -> Result<Vec<Value>> {
    let given: Vec<&Value> = node.inputs.iter().flatten().collect();
    let constant = given.iter().all(|v| v.constant);
    let known = given.iter().all(|v| v.known.is_some());
    let size: usize = given
        .iter()
        .filter_map(|v| v.known.as_ref())
        .map(Array::len)
        .sum();
    let limit = if constant {
        FOLD_LIMIT
    } else {
        KNOWN_FOLD_LIMIT
    };
    let folded = if known && size <= limit && !ops::is_random(node.op()) {
        Some(fold_node(node, fold)?)
    } else {
        None
    };
    if let (true, Some(arrays)) = (constant, &folded) {
        return Ok(arrays
            .iter()
            .map(|a| Value {
                tensor: node.ctx.from_array(a),
                known: Some(a.clone()),
                constant: true,
            })
            .collect());
    }
    let outs = ops::map(node)?;
    let mut vals = Vec::with_capacity(outs.len());
    for (i, t) in outs.into_iter().enumerate() {
        vals.push(Value {
            tensor: node.check(t)?,
            known: folded.as_ref().and_then(|f| f.get(i).cloned()),
            constant: false,
        });
    }
    // A shape is known from the static shapes even when the data is not.
    if let Some(k) = ops::known_without_data(node)? {
        vals[0] = Value {
            tensor: node.ctx.from_array(&k),
            known: Some(k),
            constant: true,
        };
    }
    Ok(vals)
}

/// The node's outputs computed by the reference interpreter from its inputs' known data.
fn fold_node(node: &Node, fold: &Context) -> Result<Vec<Array>> {
    let folded = Node {
        proto: node.proto,
        name: node.name.clone(),
        opset: node.opset,
        ctx: fold,
        inputs: node
            .inputs
            .iter()
            .map(|v| {
                v.as_ref().map(|v| Value {
                    tensor: fold
                        .from_array(v.known.as_ref().expect("only known inputs are folded")),
                    known: v.known.clone(),
                    constant: v.constant,
                })
            })
            .collect(),
    };
    let outs = ops::map(&folded)?;
    let refs: Vec<&Tensor> = outs.iter().collect();
    fold.eval(&refs).map_err(|e| OnnxError::Op {
        node: node.name.clone(),
        op: node.op().to_owned(),
        source: Box::new(e),
    })
}

fn signature(v: &ValueInfoProto) -> Signature {
    let mut sig = Signature {
        name: v.name.clone().unwrap_or_default(),
        dtype: None,
        dims: None,
        tensor: true,
    };
    if let Some(v) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        sig.tensor = matches!(v, type_proto::Value::TensorType(_));
    }
    if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref())
    {
        sig.dtype = t.elem_type.and_then(|c| dtype_of(c).ok());
        sig.dims = t.shape.as_ref().map(|s| {
            s.dim
                .iter()
                .map(|d| match d.value {
                    Some(crate::proto::tensor_shape_proto::dimension::Value::DimValue(n)) => {
                        usize::try_from(n).ok()
                    }
                    _ => None,
                })
                .collect()
        });
    }
    sig
}

/// An input's dtype and fixed extents against what the file declares.
fn check_input(sig: &Signature, a: &Array) -> Result<()> {
    if let Some(d) = sig.dtype {
        if d != a.dtype() {
            return Err(OnnxError::Input {
                name: sig.name.clone(),
                why: format!("the model declares {d}, the array given is {}", a.dtype()),
            });
        }
    }
    if let Some(dims) = &sig.dims {
        let fits = dims.len() == a.shape().len()
            && dims
                .iter()
                .zip(a.shape())
                .all(|(d, &n)| d.is_none_or(|d| d == n));
        if !fits {
            let want: Vec<String> = dims
                .iter()
                .map(|d| d.map_or("?".to_owned(), |n| n.to_string()))
                .collect();
            return Err(OnnxError::Input {
                name: sig.name.clone(),
                why: format!(
                    "the model declares shape [{}], the array given has {:?}",
                    want.join(", "),
                    a.shape()
                ),
            });
        }
    }
    Ok(())
}
