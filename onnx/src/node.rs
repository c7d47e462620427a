//! One ONNX node as the operator mappings see it: its inputs as ndfuse tensors (with the
//! values known at import time), its attributes, and errors that name it.

use crate::error::{OnnxError, Result};
use crate::proto::attribute_proto::AttributeType;
use crate::proto::{AttributeProto, NodeProto};
use crate::tensor::to_array;
use ndfuse::{Array, Context, DType, Tensor};

/// A value of the graph: the lazy tensor, and its data when it is known at import time:
/// initializers, `Constant`s, shapes and whatever is computed only from them (these are
/// *constant*: folded through the interpreter), and the graph's own integer inputs,
/// which the graph is built for (a shape, an axis list or a `k` given as an input
/// specialises the graph to its value, as a tracing compiler's graph is).
#[derive(Clone, Debug)]
pub struct Value {
    /// The tensor in the model's context.
    pub tensor: Tensor,
    /// The data, when known at import time.
    pub known: Option<Array>,
    /// Whether it is computed from constants only (so nodes on it can be folded).
    pub constant: bool,
}

/// A node being lowered.
#[derive(Debug)]
pub struct Node<'a> {
    /// The node's message.
    pub proto: &'a NodeProto,
    /// Its name, or `#index` when the file gives none.
    pub name: String,
    /// The opset imported for its domain.
    pub opset: i64,
    /// The context its tensors are built in.
    pub ctx: &'a Context,
    /// Its inputs in order; `None` for an omitted optional input (an empty name).
    pub inputs: Vec<Option<Value>>,
}

impl Node<'_> {
    /// The operator's name (`Conv`).
    pub fn op(&self) -> &str {
        self.proto.op_type.as_deref().unwrap_or("")
    }

    /// An error: what this node needs that the importer does not support.
    pub fn unsupported(&self, what: impl Into<String>) -> OnnxError {
        OnnxError::Unsupported {
            node: self.name.clone(),
            op: self.op().to_owned(),
            opset: self.opset,
            what: what.into(),
        }
    }

    /// An error: this node breaks its operator's specification.
    pub fn bad(&self, why: impl Into<String>) -> OnnxError {
        OnnxError::Node {
            node: self.name.clone(),
            op: self.op().to_owned(),
            opset: self.opset,
            why: why.into(),
        }
    }

    /// `t`, or the ndfuse error it carries, named with this node.
    pub fn check(&self, t: Tensor) -> Result<Tensor> {
        match t.error() {
            Some(e) => Err(OnnxError::Op {
                node: self.name.clone(),
                op: self.op().to_owned(),
                source: Box::new(e.clone()),
            }),
            None => Ok(t),
        }
    }

    /// The number of inputs given (trailing omitted ones included).
    pub fn arity(&self) -> usize {
        self.inputs.len()
    }

    /// Input `i`, which the operator requires.
    pub fn input(&self, i: usize) -> Result<&Tensor> {
        self.opt_input(i)
            .ok_or_else(|| self.bad(format!("input {i} is required")))
    }

    /// Input `i` when given.
    pub fn opt_input(&self, i: usize) -> Option<&Tensor> {
        self.inputs
            .get(i)
            .and_then(|v| v.as_ref())
            .map(|v| &v.tensor)
    }

    /// Every given input, in order.
    pub fn all_inputs(&self) -> Result<Vec<&Tensor>> {
        (0..self.arity()).map(|i| self.input(i)).collect()
    }

    /// The shape of input `i`.
    pub fn shape(&self, i: usize) -> Result<Vec<usize>> {
        let t = self.input(i)?;
        self.check(t.clone())?;
        Ok(t.shape().map(<[usize]>::to_vec).unwrap_or_default())
    }

    /// The dtype of input `i`.
    pub fn dtype(&self, i: usize) -> Result<DType> {
        let t = self.input(i)?;
        t.dtype().map_err(|e| OnnxError::Op {
            node: self.name.clone(),
            op: self.op().to_owned(),
            source: Box::new(e),
        })
    }

    /// The data of input `i`, which must be known at import time (a shape, an axis list).
    pub fn known(&self, i: usize) -> Result<Option<&Array>> {
        match self.inputs.get(i).and_then(|v| v.as_ref()) {
            None => Ok(None),
            Some(Value { known: Some(a), .. }) => Ok(Some(a)),
            Some(Value { known: None, .. }) => Err(self.unsupported(format!(
                "input {i} ('{}') computed from the graph's inputs (it must be known when the \
                 model is imported: a data-dependent shape)",
                self.proto.input[i]
            ))),
        }
    }

    /// Input `i` as integers known at import time, when given.
    pub fn ints_input(&self, i: usize) -> Result<Option<Vec<i64>>> {
        Ok(self.known(i)?.map(|a| {
            let h = a.as_host();
            (0..h.len()).map(|j| h.storage().get_i64(j)).collect()
        }))
    }

    /// Input `i` as floats known at import time, when given.
    pub fn floats_input(&self, i: usize) -> Result<Option<Vec<f64>>> {
        Ok(self.known(i)?.map(Array::to_f64_vec))
    }

    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.proto
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
    }

    fn typed(&self, name: &str, want: AttributeType) -> Result<Option<&AttributeProto>> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        if a.ref_attr_name.is_some() {
            return Err(self.unsupported(format!("attribute '{name}' referring to a function's")));
        }
        match a.r#type {
            Some(t) if t != want as i32 => Err(self.bad(format!(
                "attribute '{name}' has type {}, expected {}",
                AttributeType::try_from(t)
                    .map(|t| t.as_str_name())
                    .unwrap_or("unknown"),
                want.as_str_name()
            ))),
            _ => Ok(Some(a)),
        }
    }

    /// An integer attribute.
    pub fn int(&self, name: &str) -> Result<Option<i64>> {
        Ok(self.typed(name, AttributeType::Int)?.and_then(|a| a.i))
    }

    /// An integer attribute with a default.
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    /// A float attribute with a default.
    pub fn float_or(&self, name: &str, default: f64) -> Result<f64> {
        Ok(self
            .typed(name, AttributeType::Float)?
            .and_then(|a| a.f)
            .map_or(default, f64::from))
    }

    /// A float attribute.
    pub fn float(&self, name: &str) -> Result<Option<f64>> {
        Ok(self
            .typed(name, AttributeType::Float)?
            .and_then(|a| a.f)
            .map(f64::from))
    }

    /// An integer-list attribute.
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .typed(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    /// A float-list attribute.
    pub fn floats(&self, name: &str) -> Result<Option<Vec<f64>>> {
        Ok(self
            .typed(name, AttributeType::Floats)?
            .map(|a| a.floats.iter().map(|&f| f64::from(f)).collect()))
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Result<Option<String>> {
        Ok(self
            .typed(name, AttributeType::String)?
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).into_owned()))
    }

    /// A string-list attribute.
    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        Ok(self.typed(name, AttributeType::Strings)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }

    /// A tensor attribute.
    pub fn tensor_attr(&self, name: &str) -> Result<Option<Array>> {
        match self
            .typed(name, AttributeType::Tensor)?
            .and_then(|a| a.t.as_ref())
        {
            Some(t) => Ok(Some(to_array(t, None)?)),
            None => Ok(None),
        }
    }

    /// Whether the node sets attribute `name` at all.
    pub fn has(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    /// An axis attribute or value, normalised into `0..rank` (negative counts from the end).
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize> {
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        if (0..r.max(1)).contains(&a) {
            Ok(a as usize)
        } else {
            Err(self.bad(format!("axis {axis} is out of range for rank {rank}")))
        }
    }

    /// A tensor of `a`'s data in this node's context.
    pub fn tensor(&self, a: &Array) -> Tensor {
        self.ctx.from_array(a)
    }

    /// A tensor of `v` (computed in f64 on the host) with `shape`, in `dtype`.
    pub fn host(&self, v: Vec<f64>, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let t = self
            .ctx
            .from_vec(v, shape)
            .map_err(|e| self.bad(e.to_string()))?;
        Ok(if dtype == DType::F64 {
            t
        } else {
            t.cast(dtype)
        })
    }

    /// A 1-D i64 tensor in this node's context.
    pub fn i64s(&self, v: &[i64]) -> Result<Tensor> {
        let t = self.ctx.from_vec(v.to_vec(), &[v.len()]);
        t.map_err(|e| OnnxError::Op {
            node: self.name.clone(),
            op: self.op().to_owned(),
            source: Box::new(e),
        })
    }
}
