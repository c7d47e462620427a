//! The operator table: each ONNX operator the importer lowers, the file that lowers it,
//! and what of it is supported (the crate README's support table is printed from here).

mod attention;
mod conv;
mod elementwise;
mod index;
mod loss;
mod matmul;
mod reduce;
mod resize;
mod rnn;
mod sample;
mod shape;
mod signal;

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{Array, Tensor};

/// The operators of this file's families (the others list their own).
const OPS: &[Support] = &[
    Support::new(
        "Add",
        "multidirectional broadcasting (also Sub, Mul, Div; integer Div truncates)",
    ),
    Support::new("Sub", ""),
    Support::new("Mul", ""),
    Support::new("Div", ""),
    Support::new("Pow", "the exponent may have another type"),
    Support::new("Mod", "fmod=0 (integers) and fmod=1"),
    Support::new("Equal", "also Less, LessOrEqual, Greater, GreaterOrEqual"),
    Support::new("Less", ""),
    Support::new("LessOrEqual", ""),
    Support::new("Greater", ""),
    Support::new("GreaterOrEqual", ""),
    Support::new("And", "also Or, Xor, Not"),
    Support::new("Or", ""),
    Support::new("Xor", ""),
    Support::new("Not", ""),
    Support::new("Max", "variadic, broadcast (also Min, Sum, Mean)"),
    Support::new("Min", ""),
    Support::new("Sum", ""),
    Support::new("Mean", ""),
    Support::new("Abs", ""),
    Support::new("Neg", ""),
    Support::new("Exp", ""),
    Support::new("Log", ""),
    Support::new("Sqrt", ""),
    Support::new("Reciprocal", ""),
    Support::new("Sin", ""),
    Support::new("Cos", ""),
    Support::new("Tan", ""),
    Support::new("Sinh", ""),
    Support::new("Cosh", ""),
    Support::new("Tanh", ""),
    Support::new("Sigmoid", ""),
    Support::new("Relu", ""),
    Support::new("Erf", ""),
    Support::new("Floor", ""),
    Support::new("Ceil", ""),
    Support::new("Round", "half to even"),
    Support::new("Sign", ""),
    Support::new("Identity", "tensors (not sequences or optionals)"),
    Support::new("Softsign", ""),
    Support::new("Softplus", "computed without overflow"),
    Support::new("Mish", ""),
    Support::new("Elu", "alpha"),
    Support::new("Celu", "alpha"),
    Support::new("Selu", "alpha, gamma"),
    Support::new("LeakyRelu", "alpha"),
    Support::new("ThresholdedRelu", "alpha"),
    Support::new("HardSigmoid", "alpha, beta"),
    Support::new("HardSwish", ""),
    Support::new("Gelu", "approximate none and tanh"),
    Support::new("PRelu", "slope broadcast"),
    Support::new("IsNaN", ""),
    Support::new("IsInf", "detect_positive, detect_negative"),
    Support::new("Shrink", "lambd, bias"),
    Support::new(
        "Cast",
        "to f16, bf16, f32, f64, i32, i64, bool (floats truncate to integers)",
    ),
    Support::new("CastLike", ""),
    Support::new("Where", ""),
    Support::new("Clip", "bounds as attributes (< 11) or inputs"),
    Support::new(
        "Dropout",
        "inference only (training_mode false); the mask output",
    ),
    Support::new("Constant", "value, value_float(s), value_int(s)"),
    Support::new("ConstantOfShape", ""),
    Support::new("Shape", "start, end"),
    Support::new("Size", ""),
    Support::new("Reshape", "0 copies, -1 infers, allowzero"),
    Support::new("Flatten", ""),
    Support::new("Transpose", ""),
    Support::new("Squeeze", "axes as attribute (< 13) or input"),
    Support::new("Unsqueeze", "axes as attribute (< 13) or input"),
    Support::new("Expand", ""),
    Support::new("Tile", "a broadcast view, no copy"),
    Support::new("Concat", ""),
    Support::new("Split", "split as attribute or input, num_outputs"),
    Support::new("Slice", "starts, ends, axes, steps (negative steps too)"),
    Support::new("Gather", "negative indices"),
    Support::new("GatherElements", "negative indices"),
    Support::new(
        "Pad",
        "constant, edge, reflect, wrap; negative pads crop; axes",
    ),
    Support::new("Range", "known scalars"),
    Support::new("EyeLike", "k, dtype"),
    Support::new("Trilu", "upper, k"),
    Support::new("OneHot", "axis, negative indices"),
    Support::new(
        "ReduceSum",
        "axes as attribute or input, keepdims, noop_with_empty_axes",
    ),
    Support::new("ReduceMean", ""),
    Support::new("ReduceMax", ""),
    Support::new("ReduceMin", ""),
    Support::new("ReduceProd", ""),
    Support::new("ReduceL1", ""),
    Support::new("ReduceL2", ""),
    Support::new("ReduceSumSquare", ""),
    Support::new("ReduceLogSum", ""),
    Support::new("ReduceLogSumExp", "max-shifted"),
    Support::new("ArgMax", "keepdims, select_last_index"),
    Support::new("ArgMin", ""),
    Support::new(
        "Softmax",
        "one axis (>= 13) or the flattened trailing axes (< 13)",
    ),
    Support::new("LogSoftmax", ""),
    Support::new("Hardmax", ""),
    Support::new("CumSum", "exclusive, reverse"),
    Support::new("TopK", "largest, sorted, axis; ties keep the lower index"),
];

/// Every supported operator, in the order of the files.
pub fn supported() -> impl Iterator<Item = &'static Support> {
    OPS.iter()
        .chain(matmul::OPS)
        .chain(loss::OPS)
        .chain(index::OPS)
        .chain(attention::OPS)
        .chain(conv::OPS)
        .chain(resize::OPS)
        .chain(rnn::OPS)
        .chain(signal::OPS)
        .chain(sample::OPS)
}

/// Whether the operator draws random numbers (never folded at import time).
pub fn is_random(op: &str) -> bool {
    matches!(
        op,
        "RandomNormal"
            | "RandomUniform"
            | "RandomNormalLike"
            | "RandomUniformLike"
            | "Bernoulli"
            | "Multinomial"
    )
}

/// Values a node gives that are known without the graph's data (`Shape`, `Size`).
pub fn known_without_data(n: &Node) -> Result<Option<Array>> {
    match n.op() {
        "Shape" | "Size" => Ok(Some(shape::shape_of(n)?)),
        _ => Ok(None),
    }
}

/// Lowers node `n` into tensors of its context, one per output.
pub fn map(n: &Node) -> Result<Vec<Tensor>> {
    use elementwise as e;
    use reduce as r;
    use shape as s;
    let outs = match n.op() {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "LessOrEqual" | "Greater"
        | "GreaterOrEqual" | "And" | "Or" | "Xor" => e::binary(n)?,
        "Mod" => e::modulo(n)?,
        "Max" | "Min" | "Sum" | "Mean" => e::variadic(n)?,
        "Abs" | "Neg" | "Exp" | "Log" | "Sqrt" | "Reciprocal" | "Sin" | "Cos" | "Tan" | "Sinh"
        | "Cosh" | "Tanh" | "Sigmoid" | "Relu" | "Erf" | "Floor" | "Ceil" | "Round" | "Sign"
        | "Not" | "Identity" | "Softsign" | "Softplus" | "Mish" | "Elu" | "Celu" | "Selu"
        | "LeakyRelu" | "ThresholdedRelu" | "HardSigmoid" | "HardSwish" | "Gelu" | "IsNaN"
        | "IsInf" | "Shrink" => e::unary(n)?,
        "PRelu" => e::prelu(n)?,
        "Cast" | "CastLike" => e::cast(n)?,
        "Where" => e::where_(n)?,
        "Clip" => e::clip(n)?,
        "Dropout" => e::dropout(n)?,
        "Constant" => s::constant(n)?,
        "ConstantOfShape" => s::constant_of_shape(n)?,
        "Shape" | "Size" => vec![n.tensor(&s::shape_of(n)?)],
        "Reshape" => s::reshape(n)?,
        "Flatten" => s::flatten(n)?,
        "Transpose" => s::transpose(n)?,
        "Squeeze" => s::squeeze(n)?,
        "Unsqueeze" => s::unsqueeze(n)?,
        "Expand" => s::expand(n)?,
        "Tile" => s::tile(n)?,
        "Concat" => s::concat(n)?,
        "Split" => s::split(n)?,
        "Slice" => s::slice(n)?,
        "Gather" | "GatherElements" => s::gather(n)?,
        "Pad" => s::pad(n)?,
        "Range" => s::range(n)?,
        "EyeLike" => s::eye_like(n)?,
        "Trilu" => s::trilu(n)?,
        "OneHot" => s::one_hot(n)?,
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
        | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => r::reduce(n)?,
        "ArgMax" | "ArgMin" => r::arg(n)?,
        "Softmax" | "LogSoftmax" | "Hardmax" => r::softmax(n)?,
        "CumSum" => r::cumsum(n)?,
        "TopK" => r::top_k(n)?,
        _ => match matmul::map(n)
            .or_else(|| loss::map(n))
            .or_else(|| index::map(n))
            .or_else(|| attention::map(n))
            .or_else(|| conv::map(n))
            .or_else(|| resize::map(n))
            .or_else(|| rnn::map(n))
            .or_else(|| signal::map(n))
            .or_else(|| sample::map(n))
        {
            Some(r) => r?,
            None => return Err(n.unsupported("the operator")),
        },
    };
    outs.into_iter().map(|t| n.check(t)).collect()
}

/// The support table as Markdown rows (the crate README's, checked by a test).
pub fn support_table() -> String {
    let mut rows: Vec<&Support> = supported().collect();
    rows.sort_by_key(|s| s.op);
    let mut s = String::from("| operator | notes |\n| --- | --- |\n");
    for r in rows {
        s += &format!("| {} | {} |\n", r.op, r.notes);
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_operator_is_listed_once() {
        let mut seen = std::collections::BTreeSet::new();
        for s in super::supported() {
            assert!(seen.insert(s.op), "{} is listed twice", s.op);
        }
    }
}
