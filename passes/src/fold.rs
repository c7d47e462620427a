//! Constant folding: an element-wise op or view whose operands are all constant fills
//! becomes one constant fill, computed with the reference interpreter's own scalar
//! functions and rounding, so the folded value is bit-for-bit what
//! `ndfuse_ir::interp::eval` would have computed for every element.
//!
//! Reductions are not folded in general: a sum or product of a fill depends on the
//! order of additions, which backends choose differently. Only reductions whose result
//! is the fill's value whatever the order are folded (max, min, exact means, arg
//! reductions).

use crate::pass::{Pass, PassCx, PassError};
use crate::rewrite::{const_value, run_to_fixed_point, Rewrite};
use ndfuse_ir::interp::{binary_f64, compare_f64, compare_i64, unary_f64, unary_i64};
use ndfuse_ir::round::{round_f64, wrap_int};
use ndfuse_ir::{ArgReduceOp, DType, Graph, NodeId, Op, ReduceOp, Scalar};

/// Replaces ops on constant fills by constant fills.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fold;

impl Pass for Fold {
    fn name(&self) -> &'static str {
        "fold"
    }

    fn run(&self, g: &mut Graph, cx: &PassCx) -> Result<bool, PassError> {
        run_to_fixed_point(g, cx, self.name(), fold_node)
    }
}

/// The folded value of `id`, when all its operands are constant fills.
fn fold_node(g: &Graph, id: NodeId) -> Option<Rewrite> {
    let node = g.node(id);
    let operands = g.operands(id);
    if operands.is_empty() {
        // Inputs, and constants that are folded already.
        return None;
    }
    // Each operand's value as the interpreter fills it: cast to the operand's dtype.
    let values: Vec<Scalar> = operands
        .iter()
        .map(|&o| const_value(g, o).map(|v| v.cast(g.node(o).dtype)))
        .collect::<Option<_>>()?;
    let operand_dtype = g.node(operands[0]).dtype;
    let value = match (&node.op, values.as_slice()) {
        (Op::Unary(u), &[x]) => match x {
            Scalar::F(a) => Scalar::F(round_f64(unary_f64(*u, a), node.dtype)),
            Scalar::I(a) => Scalar::I(wrap_int(unary_i64(*u, a), node.dtype)),
            Scalar::B(a) => Scalar::B(unary_i64(*u, i64::from(a)) != 0),
        },
        (Op::Binary(b), &[x, y]) => {
            let to_bool = b.is_comparison() || b.is_logical();
            match (x, y) {
                (Scalar::F(p), Scalar::F(q)) if to_bool => Scalar::B(compare_f64(*b, p, q)),
                // The interpreter rounds arithmetic to the operands' dtype.
                (Scalar::F(p), Scalar::F(q)) => {
                    Scalar::F(round_f64(binary_f64(*b, p, q), operand_dtype))
                }
                (Scalar::I(p), Scalar::I(q)) if to_bool => Scalar::B(compare_i64(*b, p, q)),
                (Scalar::I(p), Scalar::I(q)) => Scalar::I(wrap_int(
                    ndfuse_ir::interp::binary_i64(*b, p, q),
                    operand_dtype,
                )),
                // Bools only meet logical ops and comparisons (inference says so).
                (Scalar::B(p), Scalar::B(q)) => {
                    Scalar::B(compare_i64(*b, i64::from(p), i64::from(q)))
                }
                // Operands of different kinds do not verify; leave them to the verifier.
                _ => return None,
            }
        }
        (Op::Where, &[c, a, b]) => match c {
            Scalar::B(true) => a,
            Scalar::B(false) => b,
            _ => return None,
        },
        // Scalar::cast is documented as the rule Op::Cast follows.
        (Op::Cast { to }, &[x]) => x.cast(*to),
        // Every element of a view of a fill is the fill's value.
        (Op::View(_), &[x]) => x,
        (Op::Reduce { op, axes, .. }, &[x]) => {
            let dims = g.node(operands[0]).shape.dims().to_vec();
            let lane: usize = axes.iter().map(|&a| dims[a]).product();
            fold_reduce(*op, x, node.dtype, lane)?
        }
        // The first index among ties (numpy's rule) of a fill is 0 (also for NaN, the
        // first NaN). Empty lanes only occur when the result is empty.
        (
            Op::ArgReduce {
                op: ArgReduceOp::ArgMax | ArgReduceOp::ArgMin,
                ..
            },
            &[_],
        ) => Scalar::I(0),
        // Arity mismatches do not verify; leave them to the verifier.
        _ => return None,
    };
    Some(Rewrite::Const(value))
}

/// The reduction of `lane` copies of `x` when it is `x` itself whatever the order of
/// evaluation; `None` for every other reduction (sums and products round by order).
fn fold_reduce(op: ReduceOp, x: Scalar, dtype: DType, lane: usize) -> Option<Scalar> {
    if lane == 0 {
        return None;
    }
    match op {
        // max(v, v, ...) and min(v, v, ...) are v, NaN included.
        ReduceOp::Max | ReduceOp::Min => Some(x),
        ReduceOp::Mean => match x {
            // inf + inf + ... stays inf, NaN stays NaN; divided by n: unchanged.
            Scalar::F(v) if v.is_nan() || v.is_infinite() => Some(x),
            // The accumulator starts at +0, so a mean of -0s is +0, and in f64 the sum
            // of copies can round or overflow. A half or f32 value times n < 2^29 is
            // exact in f64 (24 significant bits + 29 < 53), so sum / n gives it back.
            Scalar::F(v)
                if dtype != DType::F64 && !(v == 0.0 && v.is_sign_negative()) && lane < 1 << 29 =>
            {
                Some(x)
            }
            _ => None,
        },
        ReduceOp::Sum
        | ReduceOp::Prod
        | ReduceOp::Norm1
        | ReduceOp::Norm2
        | ReduceOp::Var
        | ReduceOp::Std => None,
    }
}
