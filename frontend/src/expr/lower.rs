//! Lowering of a parsed expression to a lazy [`Tensor`] through the public `ndfuse` API,
//! node by node, so that the first node whose op is illegal (shapes that do not
//! broadcast, an axis out of range...) is reported at its own column.
//!
//! Literals stay literals as long as possible: `2 * 3` folds, `x * 2.0` passes a weak
//! scalar to the API (numpy's NEP 50: it keeps `x`'s dtype), and a literal that has to
//! become a tensor on its own (`exp(1)`, a whole expression `1 + 2`) becomes a 0-d
//! tensor of the context's default dtype (floats), i64 (integers) or bool.

use super::call::{
    axes_literal, axis_literal, bind, bool_literal, causal_literal, dtype_literal, float_literal,
    int_list, int_literal, is_linalg, is_none, opt, pad_mode, pad_widths, req, unknown_function,
    FUNCTIONS, LINALG_TUPLES,
};
use super::parse::{BinOp, ExprError, IndexItem, Kind, Kwarg, Lit, Node};
use crate::context::Context;
use crate::error::Error;
use crate::index::{concat, stack};
use crate::ops::{Axes, Operand, SliceArg};
use crate::tensor::Tensor;
use ndfuse_ir::DType;
use std::collections::BTreeMap;

/// A value during lowering: a tensor or a literal not yet given a dtype.
#[derive(Clone, Debug)]
enum Value {
    T(Tensor),
    L(Lit),
}

/// Binary ops reachable from operators and function calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bin {
    Op(BinOp),
    Max,
    Min,
    And,
    Or,
}

impl Bin {
    fn commutes(self) -> bool {
        matches!(
            self,
            Bin::Op(BinOp::Add | BinOp::Mul | BinOp::Eq | BinOp::Ne)
                | Bin::Max
                | Bin::Min
                | Bin::And
                | Bin::Or
        )
    }

    /// The op with its operands swapped (`2 < x` is `x > 2`), when there is one.
    fn mirrored(self) -> Option<Bin> {
        if self.commutes() {
            return Some(self);
        }
        Some(Bin::Op(match self {
            Bin::Op(BinOp::Lt) => BinOp::Gt,
            Bin::Op(BinOp::Le) => BinOp::Ge,
            Bin::Op(BinOp::Gt) => BinOp::Lt,
            Bin::Op(BinOp::Ge) => BinOp::Le,
            _ => return None,
        }))
    }
}

/// Lowers expressions over named input tensors in one context.
pub(super) struct Lowerer<'a> {
    ctx: &'a Context,
    inputs: &'a BTreeMap<String, Tensor>,
    /// Input names in the order the expression first uses them, left to right. The
    /// graph numbers its inputs (`in0`, `in1`...) in the same order.
    pub used: Vec<String>,
    /// How inputs are given on this command line, for "unknown input" messages.
    input_flags: &'static str,
}

impl<'a> Lowerer<'a> {
    /// `input_flags` names the flags that give inputs (`--input NAME=FILE.npy or
    /// --random NAME=SHAPE`), for the hint when the expression names none.
    pub fn new(
        ctx: &'a Context,
        inputs: &'a BTreeMap<String, Tensor>,
        input_flags: &'static str,
    ) -> Lowerer<'a> {
        Lowerer {
            ctx,
            inputs,
            used: Vec::new(),
            input_flags,
        }
    }

    /// The tensor `node` computes; `Err` names the column of the first node that fails.
    pub fn lower(&mut self, node: &Node) -> Result<Tensor, ExprError> {
        match self.value(node)? {
            Value::T(t) => Ok(t),
            Value::L(l) => self.checked(self.lit_tensor(l), node.pos),
        }
    }

    pub(super) fn checked(&self, t: Tensor, pos: usize) -> Result<Tensor, ExprError> {
        match t.error() {
            Some(e) => Err(ExprError::new(pos, e.reason())),
            None => Ok(t),
        }
    }

    /// A literal on its own as a 0-d tensor.
    fn lit_tensor(&self, l: Lit) -> Tensor {
        match l {
            Lit::Float(v) => self.ctx.scalar(v),
            Lit::Int(v) => self.ctx.full_dtype(&[], v as f64, DType::I64),
            Lit::Bool(v) => self
                .ctx
                .full_dtype(&[], f64::from(u8::from(v)), DType::Bool),
        }
    }

    /// A literal meeting a tensor of `dtype`, as a 0-d tensor of the dtype numpy's weak
    /// promotion gives it: the tensor's own when the kinds agree, f64 for a float with
    /// integers. A bool tensor keeps a non-bool literal's natural dtype so that the op
    /// reports bool arithmetic as the API does.
    fn weak_tensor(&self, l: Lit, dtype: DType) -> Tensor {
        let d = match (l, dtype.is_float(), dtype.is_int()) {
            (Lit::Bool(_), _, _) => dtype,
            (Lit::Float(_), true, _) | (Lit::Int(_), true, _) | (Lit::Int(_), _, true) => dtype,
            (Lit::Float(_), _, _) => DType::F64,
            (Lit::Int(_), _, _) => DType::I64,
        };
        let v = match l {
            Lit::Float(v) => v,
            Lit::Int(v) => v as f64,
            Lit::Bool(v) => f64::from(u8::from(v)),
        };
        self.ctx.full_dtype(&[], v, d)
    }

    fn as_tensor(&self, v: Value, pos: usize) -> Result<Tensor, ExprError> {
        match v {
            Value::T(t) => Ok(t),
            Value::L(l) => self.checked(self.lit_tensor(l), pos),
        }
    }

    fn value(&mut self, node: &Node) -> Result<Value, ExprError> {
        let pos = node.pos;
        match &node.kind {
            Kind::Lit(l) => Ok(Value::L(*l)),
            Kind::Name(name) => match self.inputs.get(name) {
                Some(t) => {
                    if !self.used.contains(name) {
                        self.used.push(name.clone());
                    }
                    Ok(Value::T(t.clone()))
                }
                None => Err(ExprError::new(pos, self.unknown_name(name))),
            },
            Kind::List(_) => Err(ExprError::new(
                pos,
                "a list is only allowed as an argument: a shape or axes (reshape(x, [2, 3]), axis=[0, 1]), pad widths, or the tensors of concat([a, b]) and stack",
            )),
            Kind::Str(_) => Err(ExprError::new(
                pos,
                "a string is only allowed as an argument such as mode='reflect'",
            )),
            Kind::Unary { negate, operand } => {
                let v = self.value(operand)?;
                match (v, negate) {
                    (v, false) => Ok(v),
                    (Value::L(l), true) => fold_neg(l, pos).map(Value::L),
                    (Value::T(t), true) => self.checked(t.neg(), pos).map(Value::T),
                }
            }
            Kind::Binary { op, lhs, rhs } => {
                let l = self.value(lhs)?;
                let r = self.value(rhs)?;
                self.binary(Bin::Op(*op), l, r, pos)
            }
            Kind::Call { name, args, kwargs } => self.call(name, args, kwargs, pos),
            Kind::Subscript { base, items } => {
                if let Kind::Call { name, args, kwargs } = &base.kind {
                    if LINALG_TUPLES.iter().any(|(n, _)| n == name) {
                        let t = self.linalg_item(name, args, kwargs, items, pos)?;
                        return self.checked(t, pos).map(Value::T);
                    }
                }
                let b = self.value(base)?;
                let Value::T(t) = b else {
                    return Err(ExprError::new(pos, "cannot index a literal"));
                };
                self.subscript(&t, items, pos).map(Value::T)
            }
        }
    }

    fn unknown_name(&self, name: &str) -> String {
        let mut msg = format!("unknown input '{name}'");
        if FUNCTIONS.contains(&name) {
            msg.push_str(&format!(" ({name} is a function: call it as {name}(...))"));
        } else if self.inputs.is_empty() {
            msg.push_str(&format!(" (no inputs given: add {})", self.input_flags));
        } else {
            let names: Vec<&str> = self.inputs.keys().map(String::as_str).collect();
            msg.push_str(&format!(" (inputs: {})", names.join(", ")));
        }
        msg
    }

    fn binary(&mut self, op: Bin, l: Value, r: Value, pos: usize) -> Result<Value, ExprError> {
        if op == Bin::Op(BinOp::MatMul) {
            return match (l, r) {
                (Value::T(a), Value::T(b)) => self.checked(a.matmul(&b), pos).map(Value::T),
                _ => Err(ExprError::new(
                    pos,
                    "matmul: a literal has no matrix product (multiply with * to scale)",
                )),
            };
        }
        let (a, rhs) = match (l, r) {
            (Value::L(a), Value::L(b)) => return fold_binary(op, a, b, pos).map(Value::L),
            (Value::T(a), Value::T(b)) => (a, Operand::Tensor(b)),
            (Value::T(a), Value::L(b)) => (a, lit_operand(b)),
            (Value::L(a), Value::T(b)) => match op.mirrored() {
                Some(m) => return self.binary(m, Value::T(b), Value::L(a), pos),
                None => {
                    // `2 - x`, `2 / x`, `2 ** x`: the literal becomes a 0-d tensor of the
                    // dtype weak promotion gives it, then the op is tensor-tensor.
                    let dtype = b.dtype().map_err(|e| ExprError::new(pos, e.reason()))?;
                    (self.weak_tensor(a, dtype), Operand::Tensor(b))
                }
            },
        };
        let t = match op {
            Bin::Op(BinOp::Add) => a.add(rhs),
            Bin::Op(BinOp::Sub) => a.sub(rhs),
            Bin::Op(BinOp::Mul) => a.mul(rhs),
            Bin::Op(BinOp::Div) => a.div(rhs),
            Bin::Op(BinOp::MatMul) => unreachable!("matmul is lowered above"),
            Bin::Op(BinOp::Pow) => a.pow(rhs),
            Bin::Op(BinOp::Lt) => a.lt(rhs),
            Bin::Op(BinOp::Le) => a.le(rhs),
            Bin::Op(BinOp::Gt) => a.gt(rhs),
            Bin::Op(BinOp::Ge) => a.ge(rhs),
            Bin::Op(BinOp::Eq) => a.eq(rhs),
            Bin::Op(BinOp::Ne) => a.ne(rhs),
            Bin::Max => a.maximum(rhs),
            Bin::Min => a.minimum(rhs),
            Bin::And => a.and(rhs),
            Bin::Or => a.or(rhs),
        };
        self.checked(t, pos).map(Value::T)
    }

    fn subscript(
        &mut self,
        t: &Tensor,
        items: &[IndexItem],
        pos: usize,
    ) -> Result<Tensor, ExprError> {
        let ty_err = |e: Error| ExprError::new(pos, e.reason());
        let dims = t.shape().map_err(ty_err)?.to_vec();
        if items.len() > dims.len() {
            return Err(ExprError::new(
                pos,
                format!(
                    "too many indices: {} given for {} of rank {}",
                    items.len(),
                    describe(t),
                    dims.len()
                ),
            ));
        }
        let mut args = Vec::with_capacity(items.len());
        let mut drop_axes = Vec::new();
        for (axis, item) in items.iter().enumerate() {
            match item {
                IndexItem::Index(n) => {
                    let i = int_literal(n, "an index")?;
                    let dim = dims[axis] as i64;
                    if i < -dim || i >= dim {
                        return Err(ExprError::new(
                            n.pos,
                            format!("index {i} is out of bounds for axis {axis} with size {dim}"),
                        ));
                    }
                    let i = if i < 0 { i + dim } else { i };
                    args.push(SliceArg::new(Some(i), Some(i + 1), 1));
                    drop_axes.push(axis as i64);
                }
                IndexItem::Slice {
                    start, stop, step, ..
                } => {
                    let bound = |b: &Option<Box<Node>>, what| {
                        b.as_deref().map(|n| int_literal(n, what)).transpose()
                    };
                    let step_v = bound(step, "a slice step")?.unwrap_or(1);
                    if step_v == 0 {
                        let at = step.as_deref().map_or(pos, |n| n.pos);
                        return Err(ExprError::new(at, "slice step cannot be zero"));
                    }
                    args.push(SliceArg::new(
                        bound(start, "a slice start")?,
                        bound(stop, "a slice stop")?,
                        step_v,
                    ));
                }
            }
        }
        let mut out = t.slice(&args);
        if !drop_axes.is_empty() {
            out = out.squeeze(&drop_axes);
        }
        self.checked(out, pos)
    }

    fn call(
        &mut self,
        name: &str,
        args: &[Node],
        kwargs: &[Kwarg],
        pos: usize,
    ) -> Result<Value, ExprError> {
        let unary = |f: fn(&Tensor) -> Tensor| Some(f);
        let unary_fn: Option<fn(&Tensor) -> Tensor> = match name {
            "neg" | "negative" => unary(Tensor::neg),
            "abs" | "absolute" => unary(Tensor::abs),
            "sign" => unary(Tensor::sign),
            "exp" => unary(Tensor::exp),
            "log" => unary(Tensor::log),
            "log1p" => unary(Tensor::log1p),
            "expm1" => unary(Tensor::expm1),
            "sqrt" => unary(Tensor::sqrt),
            "rsqrt" => unary(Tensor::rsqrt),
            "square" => unary(Tensor::square),
            "recip" | "reciprocal" => unary(Tensor::recip),
            "sin" => unary(Tensor::sin),
            "cos" => unary(Tensor::cos),
            "tanh" => unary(Tensor::tanh),
            "sigmoid" => unary(Tensor::sigmoid),
            "relu" => unary(Tensor::relu),
            "gelu" => unary(Tensor::gelu),
            "gelu_erf" => unary(Tensor::gelu_erf),
            "erf" => unary(Tensor::erf),
            "floor" => unary(Tensor::floor),
            "ceil" => unary(Tensor::ceil),
            "round" => unary(Tensor::round),
            "not" | "logical_not" => unary(Tensor::logical_not),
            _ => None,
        };
        if let Some(f) = unary_fn {
            let a = bind(name, pos, args, kwargs, &["x"])?;
            let x = self.tensor_arg(req(&a, 0))?;
            return self.checked(f(&x), pos).map(Value::T);
        }
        let bin = match name {
            "maximum" => Some(Bin::Max),
            "minimum" => Some(Bin::Min),
            "pow" | "power" => Some(Bin::Op(BinOp::Pow)),
            "and" | "logical_and" => Some(Bin::And),
            "or" | "logical_or" => Some(Bin::Or),
            "add" => Some(Bin::Op(BinOp::Add)),
            "subtract" => Some(Bin::Op(BinOp::Sub)),
            "multiply" => Some(Bin::Op(BinOp::Mul)),
            "matmul" => Some(Bin::Op(BinOp::MatMul)),
            "divide" => Some(Bin::Op(BinOp::Div)),
            "equal" => Some(Bin::Op(BinOp::Eq)),
            "not_equal" => Some(Bin::Op(BinOp::Ne)),
            "less" => Some(Bin::Op(BinOp::Lt)),
            "less_equal" => Some(Bin::Op(BinOp::Le)),
            "greater" => Some(Bin::Op(BinOp::Gt)),
            "greater_equal" => Some(Bin::Op(BinOp::Ge)),
            _ => None,
        };
        if let Some(op) = bin {
            let a = bind(name, pos, args, kwargs, &["a", "b"])?;
            let l = self.value(req(&a, 0))?;
            let r = self.value(req(&a, 1))?;
            if matches!(op, Bin::And | Bin::Or) {
                // Logical ops on literals fold only for bools; numbers are an error,
                // as for tensors.
                if let (Value::L(x), Value::L(y)) = (&l, &r) {
                    if !matches!((x, y), (Lit::Bool(_), Lit::Bool(_))) {
                        return Err(ExprError::new(
                            pos,
                            format!("{name}() takes bool operands, got {x} and {y}"),
                        ));
                    }
                }
            }
            return self.binary(op, l, r, pos);
        }
        let reduce: Option<fn(&Tensor, Axes, bool) -> Tensor> = match name {
            "sum" => Some(|x, a, k| if k { x.sum_keepdims(a) } else { x.sum(a) }),
            "mean" => Some(|x, a, k| if k { x.mean_keepdims(a) } else { x.mean(a) }),
            "max" | "amax" => Some(|x, a, k| if k { x.max_keepdims(a) } else { x.max(a) }),
            "min" | "amin" => Some(|x, a, k| if k { x.min_keepdims(a) } else { x.min(a) }),
            "prod" => Some(|x, a, k| if k { x.prod_keepdims(a) } else { x.prod(a) }),
            "norm1" => Some(|x, a, k| if k { x.norm1_keepdims(a) } else { x.norm1(a) }),
            "norm2" => Some(|x, a, k| if k { x.norm2_keepdims(a) } else { x.norm2(a) }),
            "var" => Some(|x, a, k| if k { x.var_keepdims(a) } else { x.var(a) }),
            "std" => Some(|x, a, k| if k { x.std_keepdims(a) } else { x.std(a) }),
            _ => None,
        };
        if let Some(f) = reduce {
            let a = bind(
                name,
                pos,
                args,
                kwargs,
                &["x", "axis=None", "keepdims=false"],
            )?;
            let x = self.tensor_arg(req(&a, 0))?;
            let axes = opt(&a, 1)
                .map(axes_literal)
                .transpose()?
                .unwrap_or(Axes::All);
            let keep = opt(&a, 2).map(bool_literal).transpose()?.unwrap_or(false);
            return self.checked(f(&x, axes, keep), pos).map(Value::T);
        }
        let t = match name {
            "where" => {
                let a = bind(name, pos, args, kwargs, &["condition", "x", "y"])?;
                let c = self.tensor_arg(req(&a, 0))?;
                let x = self.operand_arg(req(&a, 1))?;
                let y = self.operand_arg(req(&a, 2))?;
                c.where_(x, y)
            }
            "cast" | "astype" => {
                let a = bind(name, pos, args, kwargs, &["x", "dtype"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                x.cast(dtype_literal(req(&a, 1))?)
            }
            "argmax" | "argmin" => {
                let a = bind(
                    name,
                    pos,
                    args,
                    kwargs,
                    &["x", "axis=None", "keepdims=false"],
                )?;
                let x = self.tensor_arg(req(&a, 0))?;
                let keep = opt(&a, 2).map(bool_literal).transpose()?.unwrap_or(false);
                let is_max = name == "argmax";
                let arg = |t: &Tensor, axis: i64, keep: bool| match (is_max, keep) {
                    (true, false) => t.argmax(axis),
                    (true, true) => t.argmax_keepdims(axis),
                    (false, false) => t.argmin(axis),
                    (false, true) => t.argmin_keepdims(axis),
                };
                match opt(&a, 1).map(|n| axis_literal(n, "axis")).transpose()? {
                    Some(axis) => arg(&x, axis, keep),
                    None => {
                        // numpy: no axis means the index into the flattened array.
                        let rank = x.rank().map_err(|e| ExprError::new(pos, e.reason()))?;
                        let flat = arg(&x.reshape(&[-1]), 0, false);
                        if keep {
                            flat.reshape(&vec![1; rank])
                        } else {
                            flat
                        }
                    }
                }
            }
            "reshape" => {
                let a = bind(name, pos, args, kwargs, &["x", "shape"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                x.reshape(&int_list(req(&a, 1), "shape")?)
            }
            "transpose" | "permute" => {
                let params: &[&str] = if name == "permute" {
                    &["x", "axes"]
                } else {
                    &["x", "axes=None"]
                };
                let a = bind(name, pos, args, kwargs, params)?;
                let x = self.tensor_arg(req(&a, 0))?;
                match opt(&a, 1) {
                    Some(n) if !is_none(n) => x.permute(&int_list(n, "axes")?),
                    _ => x.transpose(),
                }
            }
            "broadcast_to" => {
                let a = bind(name, pos, args, kwargs, &["x", "shape"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let shape_node = req(&a, 1);
                let dims = int_list(shape_node, "shape")?;
                let dims: Vec<usize> = dims
                    .iter()
                    .map(|&d| usize::try_from(d))
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        ExprError::new(shape_node.pos, "broadcast_to(): shape dims must be >= 0")
                    })?;
                x.broadcast_to(&dims)
            }
            "expand_dims" => {
                let a = bind(name, pos, args, kwargs, &["x", "axis"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                x.expand_dims(axis_literal(req(&a, 1), "axis")?)
            }
            "squeeze" => {
                let a = bind(name, pos, args, kwargs, &["x", "axis=None"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                match opt(&a, 1).map(axes_literal).transpose()? {
                    Some(Axes::These(axes)) => x.squeeze(&axes),
                    Some(Axes::All) | None => x.squeeze_all(),
                }
            }
            "softmax" | "log_softmax" => {
                let a = bind(name, pos, args, kwargs, &["x", "axis=-1"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let axis = opt(&a, 1)
                    .map(|n| axis_literal(n, "axis"))
                    .transpose()?
                    .unwrap_or(-1);
                if name == "softmax" {
                    x.softmax(axis)
                } else {
                    x.log_softmax(axis)
                }
            }
            "layernorm" => {
                let a = bind(name, pos, args, kwargs, &["x", "axis=-1", "eps=1e-5"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let axis = opt(&a, 1)
                    .map(|n| axis_literal(n, "axis"))
                    .transpose()?
                    .unwrap_or(-1);
                let eps = opt(&a, 2)
                    .map(|n| float_literal(n, "eps"))
                    .transpose()?
                    .unwrap_or(1e-5);
                x.layernorm(axis, eps)
            }
            "dropout" => {
                // dropout(x, p, key): the key an i64 0-d input, or an integer literal seed.
                let a = bind(name, pos, args, kwargs, &["x", "p", "key"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let p = float_literal(req(&a, 1), "p")?;
                let key = match int_literal(req(&a, 2), "key") {
                    Ok(seed) => self.ctx.key(seed as u64),
                    Err(_) => self.tensor_arg(req(&a, 2))?,
                };
                x.dropout(p, &key)
            }
            "take" | "take_along_axis" | "index_add" | "concat" | "concatenate" | "stack"
            | "pad" | "cumsum" | "cumprod" | "sort" | "argsort" | "top_k" | "arange"
            | "one_hot" | "tril" | "triu" => self.index_call(name, args, kwargs, pos)?,
            "conv1d" | "conv2d" | "conv_transpose1d" | "conv_transpose2d" | "max_pool2d"
            | "avg_pool2d" | "global_avg_pool2d" | "batch_norm" => {
                self.conv_call(name, args, kwargs, pos)?
            }
            "attention" => self.attention_call(args, kwargs, pos)?,
            n if is_linalg(n) => self.linalg_call(n, args, kwargs, pos)?,
            "grad" => {
                // grad(f, x): the gradient of the 0-d float `f` with respect to input `x`.
                let a = bind(name, pos, args, kwargs, &["f", "x"])?;
                let wrt = req(&a, 1);
                if !matches!(wrt.kind, Kind::Name(_)) {
                    return Err(ExprError::new(
                        wrt.pos,
                        "grad(f, x): x must be an input name (the gradient is with respect to an input)",
                    ));
                }
                let f = self.tensor_arg(req(&a, 0))?;
                let x = self.tensor_arg(wrt)?;
                let g =
                    crate::grad::grad(&f, &[&x]).map_err(|e| ExprError::new(pos, e.reason()))?;
                match g.into_iter().next() {
                    Some(g) => g,
                    None => return Err(ExprError::new(pos, "grad gave no gradient (a bug)")),
                }
            }
            _ => return Err(ExprError::new(pos, unknown_function(name))),
        };
        self.checked(t, pos).map(Value::T)
    }

    /// The indexing, padding, scan and sort functions. Out of [`Lowerer::call`] and
    /// never inlined: `call` is on the stack once per nesting level, and these arms'
    /// locals would grow every level's frame (100 levels must fit a 2 MiB thread).
    #[inline(never)]
    fn index_call(
        &mut self,
        name: &str,
        args: &[Node],
        kwargs: &[Kwarg],
        pos: usize,
    ) -> Result<Tensor, ExprError> {
        Ok(match name {
            "take" => {
                // numpy: no axis takes from the flattened array.
                let a = bind(name, pos, args, kwargs, &["x", "idx", "axis=None"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let idx = self.tensor_arg(req(&a, 1))?;
                match opt(&a, 2).map(|n| axis_literal(n, "axis")).transpose()? {
                    Some(axis) => x.take(&idx, axis),
                    None => x.reshape(&[-1]).take(&idx, 0),
                }
            }
            "take_along_axis" => {
                let a = bind(name, pos, args, kwargs, &["x", "idx", "axis=-1"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let idx = self.tensor_arg(req(&a, 1))?;
                x.take_along_axis(&idx, self.axis_or(&a, 2, -1)?)
            }
            "index_add" => {
                let a = bind(name, pos, args, kwargs, &["x", "idx", "v", "axis=0"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let idx = self.tensor_arg(req(&a, 1))?;
                let v = self.tensor_arg(req(&a, 2))?;
                x.index_add(&idx, &v, self.axis_or(&a, 3, 0)?)
            }
            "concat" | "concatenate" | "stack" => {
                let a = bind(name, pos, args, kwargs, &["arrays", "axis=0"])?;
                let parts = self.tensor_list(req(&a, 0), name)?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                let axis = self.axis_or(&a, 1, 0)?;
                if name == "stack" {
                    stack(&refs, axis)
                } else {
                    concat(&refs, axis)
                }
            }
            "pad" => {
                let a = bind(
                    name,
                    pos,
                    args,
                    kwargs,
                    &["x", "pad_width", "mode='constant'", "value=0"],
                )?;
                let x = self.tensor_arg(req(&a, 0))?;
                let rank = x.rank().map_err(|e| ExprError::new(pos, e.reason()))?;
                let widths = pad_widths(req(&a, 1), rank)?;
                let mode = opt(&a, 2)
                    .map(pad_mode)
                    .transpose()?
                    .unwrap_or(ndfuse_ir::PadMode::Constant);
                let value = opt(&a, 3)
                    .map(|n| float_literal(n, "value"))
                    .transpose()?
                    .unwrap_or(0.0);
                x.pad(&widths, mode, value)
            }
            "cumsum" | "cumprod" | "sort" | "argsort" => {
                // numpy: cumsum and cumprod default to the flattened array, sorts to
                // the last axis; axis=None flattens for all four.
                let default = if name.starts_with("cum") {
                    "axis=None"
                } else {
                    "axis=-1"
                };
                let a = bind(name, pos, args, kwargs, &["x", default])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let axis = match a[1] {
                    Some(n) if is_none(n) => None,
                    Some(n) => Some(axis_literal(n, "axis")?),
                    None if name.starts_with("cum") => None,
                    None => Some(-1),
                };
                let (x, axis) = match axis {
                    Some(axis) => (x, axis),
                    None => (x.reshape(&[-1]), 0),
                };
                match name {
                    "cumsum" => x.cumsum(axis),
                    "cumprod" => x.cumprod(axis),
                    "sort" => x.sort(axis),
                    _ => x.argsort(axis),
                }
            }
            "top_k" => {
                let a = bind(name, pos, args, kwargs, &["x", "k"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let k = count_literal(req(&a, 1), "k")?;
                x.top_k(k).0
            }
            "arange" => {
                // arange(n) or arange(start, stop, step): i64, numpy's integer arange.
                let a = bind(name, pos, args, kwargs, &["start", "stop=None", "step=1"])?;
                let first = int_literal(req(&a, 0), "start")?;
                let (start, stop) = match opt(&a, 1) {
                    Some(n) => (first, int_literal(n, "stop")?),
                    None => (0, first),
                };
                let step = match opt(&a, 2) {
                    Some(n) => {
                        let s = int_literal(n, "step")?;
                        if s == 0 {
                            return Err(ExprError::new(
                                n.pos,
                                "arange(): the step must not be zero",
                            ));
                        }
                        s
                    }
                    None => 1,
                };
                self.ctx
                    .arange_i64(start, stop, step)
                    .map_err(|e| ExprError::new(pos, e.reason()))?
            }
            "one_hot" => {
                let a = bind(name, pos, args, kwargs, &["idx", "n"])?;
                let idx = self.tensor_arg(req(&a, 0))?;
                idx.one_hot(count_literal(req(&a, 1), "n")?)
            }
            "tril" | "triu" => {
                let a = bind(name, pos, args, kwargs, &["x", "k=0"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                let k = opt(&a, 1)
                    .map(|n| int_literal(n, "k"))
                    .transpose()?
                    .unwrap_or(0);
                if name == "tril" {
                    x.tril(k)
                } else {
                    x.triu(k)
                }
            }
            _ => unreachable!("call sends only the indexing functions here"),
        })
    }

    /// `attention(q, k, v, causal=false, scale=None, bias=None, key_lengths=None,
    /// dropout=0.0, key=0)`: [`Tensor::attention_with`]; the key an i64 0-d input or an
    /// integer literal seed.
    #[inline(never)]
    fn attention_call(
        &mut self,
        args: &[Node],
        kwargs: &[Kwarg],
        pos: usize,
    ) -> Result<Tensor, ExprError> {
        let names = [
            "q",
            "k",
            "v",
            "causal=false",
            "scale=None",
            "bias=None",
            "key_lengths=None",
            "dropout=0.0",
            "key=0",
        ];
        let a = bind("attention", pos, args, kwargs, &names)?;
        let (q, k, v) = (
            self.tensor_arg(req(&a, 0))?,
            self.tensor_arg(req(&a, 1))?,
            self.tensor_arg(req(&a, 2))?,
        );
        let mut opts = crate::Attention::new();
        if let Some(n) = opt(&a, 3) {
            opts = opts.causal(causal_literal(n)?);
        }
        if let Some(n) = opt(&a, 4) {
            opts = opts.scale(float_literal(n, "scale")?);
        }
        if let Some(n) = opt(&a, 5) {
            opts = opts.bias(&self.tensor_arg(n)?);
        }
        if let Some(n) = opt(&a, 6) {
            opts = opts.key_lengths(&self.tensor_arg(n)?);
        }
        if let Some(n) = opt(&a, 7) {
            let p = float_literal(n, "dropout")?;
            let key = match opt(&a, 8).map(|n| (n, int_literal(n, "key"))) {
                None => self.ctx.key(0),
                Some((_, Ok(seed))) => self.ctx.key(seed as u64),
                Some((n, Err(_))) => self.tensor_arg(n)?,
            };
            if p > 0.0 {
                opts = opts.dropout(p, &key);
            }
        }
        Ok(q.attention_with(&k, &v, &opts))
    }

    /// The axis in slot `i`, or `default` when it is not given.
    fn axis_or(&self, slots: &[Option<&Node>], i: usize, default: i64) -> Result<i64, ExprError> {
        Ok(opt(slots, i)
            .map(|n| axis_literal(n, "axis"))
            .transpose()?
            .unwrap_or(default))
    }

    /// `[a, b, ...]`: the tensors of `concat` and `stack`.
    fn tensor_list(&mut self, n: &Node, name: &str) -> Result<Vec<Tensor>, ExprError> {
        let Kind::List(items) = &n.kind else {
            return Err(ExprError::new(
                n.pos,
                format!("{name}() takes a list of tensors like [a, b]"),
            ));
        };
        items.iter().map(|i| self.tensor_arg(i)).collect()
    }

    pub(super) fn tensor_arg(&mut self, n: &Node) -> Result<Tensor, ExprError> {
        let v = self.value(n)?;
        self.as_tensor(v, n.pos)
    }

    fn operand_arg(&mut self, n: &Node) -> Result<Operand, ExprError> {
        Ok(match self.value(n)? {
            Value::T(t) => Operand::Tensor(t),
            Value::L(l) => lit_operand(l),
        })
    }
}

/// A non-negative integer literal (a count such as `k` or `n`).
pub(super) fn count_literal(n: &Node, what: &str) -> Result<usize, ExprError> {
    let v = int_literal(n, what)?;
    usize::try_from(v).map_err(|_| ExprError::new(n.pos, format!("{what} = {v} is negative")))
}

fn lit_operand(l: Lit) -> Operand {
    match l {
        Lit::Float(v) => Operand::from(v),
        Lit::Int(v) => Operand::from(v),
        Lit::Bool(v) => Operand::from(v),
    }
}

fn describe(t: &Tensor) -> String {
    match (t.dtype(), t.shape()) {
        (Ok(d), Ok(s)) => {
            let dims: Vec<String> = s.iter().map(ToString::to_string).collect();
            format!("{d}[{}]", dims.join(","))
        }
        _ => "the operand".into(),
    }
}

fn fold_neg(l: Lit, pos: usize) -> Result<Lit, ExprError> {
    match l {
        Lit::Int(v) => v
            .checked_neg()
            .map(Lit::Int)
            .ok_or_else(|| ExprError::new(pos, "integer literal out of range")),
        Lit::Float(v) => Ok(Lit::Float(-v)),
        Lit::Bool(_) => Err(ExprError::new(pos, "cannot negate a bool (use not(x))")),
    }
}

/// Folds an op on two literals with Python's rules (ints stay ints except for `/` and
/// negative powers; comparisons give bools).
fn fold_binary(op: Bin, a: Lit, b: Lit, pos: usize) -> Result<Lit, ExprError> {
    let overflow = || ExprError::new(pos, "integer overflow in a literal expression");
    if let (Bin::And | Bin::Or, Lit::Bool(x), Lit::Bool(y)) = (op, a, b) {
        return Ok(Lit::Bool(if op == Bin::And { x && y } else { x || y }));
    }
    let num = |l: Lit| match l {
        Lit::Int(v) => v as f64,
        Lit::Float(v) => v,
        Lit::Bool(v) => f64::from(u8::from(v)),
    };
    let cmp = |f: fn(f64, f64) -> bool| Ok(Lit::Bool(f(num(a), num(b))));
    match op {
        Bin::Op(BinOp::Lt) => return cmp(|x, y| x < y),
        Bin::Op(BinOp::Le) => return cmp(|x, y| x <= y),
        Bin::Op(BinOp::Gt) => return cmp(|x, y| x > y),
        Bin::Op(BinOp::Ge) => return cmp(|x, y| x >= y),
        Bin::Op(BinOp::Eq) => return cmp(|x, y| x == y),
        Bin::Op(BinOp::Ne) => return cmp(|x, y| x != y),
        _ => {}
    }
    if matches!(a, Lit::Bool(_)) || matches!(b, Lit::Bool(_)) {
        return Err(ExprError::new(
            pos,
            "bool has no arithmetic; cast it to a number first",
        ));
    }
    if let (Lit::Int(x), Lit::Int(y)) = (a, b) {
        return match op {
            Bin::Op(BinOp::Add) => x.checked_add(y).map(Lit::Int).ok_or_else(overflow),
            Bin::Op(BinOp::Sub) => x.checked_sub(y).map(Lit::Int).ok_or_else(overflow),
            Bin::Op(BinOp::Mul) => x.checked_mul(y).map(Lit::Int).ok_or_else(overflow),
            Bin::Op(BinOp::Div) if y == 0 => Err(ExprError::new(
                pos,
                "division by zero in a literal expression",
            )),
            Bin::Op(BinOp::Div) => Ok(Lit::Float(x as f64 / y as f64)),
            Bin::Op(BinOp::Pow) if y >= 0 => u32::try_from(y)
                .ok()
                .and_then(|e| x.checked_pow(e))
                .map(Lit::Int)
                .ok_or_else(overflow),
            Bin::Op(BinOp::Pow) => Ok(Lit::Float((x as f64).powf(y as f64))),
            Bin::Max => Ok(Lit::Int(x.max(y))),
            Bin::Min => Ok(Lit::Int(x.min(y))),
            _ => Err(ExprError::new(pos, "this op takes bool operands")),
        };
    }
    let (x, y) = (num(a), num(b));
    Ok(Lit::Float(match op {
        Bin::Op(BinOp::Add) => x + y,
        Bin::Op(BinOp::Sub) => x - y,
        Bin::Op(BinOp::Mul) => x * y,
        Bin::Op(BinOp::Div) => x / y,
        Bin::Op(BinOp::Pow) => x.powf(y),
        // NaN-propagating, like numpy's maximum/minimum.
        Bin::Max if x.is_nan() || y.is_nan() => f64::NAN,
        Bin::Max => x.max(y),
        Bin::Min if x.is_nan() || y.is_nan() => f64::NAN,
        Bin::Min => x.min(y),
        _ => return Err(ExprError::new(pos, "this op takes bool operands")),
    }))
}
