//! Element-wise maps over values: unary and binary ops, `where`, and casts.

use super::scalar::{binary_f64, binary_i64, compare_f64, compare_i64, unary_f64, unary_i64};
use super::vals::Vals;
use crate::dtype::DType;
use crate::op::{BinaryOp, UnaryOp};
use crate::round::{int_to_float, round_f64, wrap_int};

/// Unary `op` element-wise; floats rounded to `round_to`, ints wrapped to its width.
pub(super) fn map_unary(op: UnaryOp, x: &Vals, round_to: DType) -> Vals {
    match x {
        Vals::F(v) => Vals::F(
            v.iter()
                .map(|&a| round_f64(unary_f64(op, a), round_to))
                .collect(),
        ),
        Vals::I(v) => Vals::I(
            v.iter()
                .map(|&a| wrap_int(unary_i64(op, a), round_to))
                .collect(),
        ),
        Vals::B(v) => Vals::B(
            v.iter()
                .map(|&a| unary_i64(op, i64::from(a)) != 0)
                .collect(),
        ),
    }
}

/// Binary `op` element-wise on operands of one kind; comparisons and logical ops give
/// bools, arithmetic keeps the kind (floats rounded to `round_to`, ints wrapped).
pub(super) fn map_binary(op: BinaryOp, a: &Vals, b: &Vals, round_to: DType) -> Vals {
    let to_bool = op.is_comparison() || op.is_logical();
    match (a, b) {
        (Vals::F(x), Vals::F(y)) if to_bool => Vals::B(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| compare_f64(op, p, q))
                .collect(),
        ),
        (Vals::F(x), Vals::F(y)) => Vals::F(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| round_f64(binary_f64(op, p, q), round_to))
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) if to_bool => Vals::B(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| compare_i64(op, p, q))
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) => Vals::I(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| wrap_int(binary_i64(op, p, q), round_to))
                .collect(),
        ),
        (Vals::B(x), Vals::B(y)) => Vals::B(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| compare_i64(op, i64::from(p), i64::from(q)))
                .collect(),
        ),
        _ => panic!(
            "{} on operands of different kinds passed validation (a bug)",
            op.name()
        ),
    }
}

/// `where(c, a, b)` element-wise.
pub(super) fn select(c: &Vals, a: &Vals, b: &Vals) -> Vals {
    let Vals::B(c) = c else {
        panic!("a non-bool where condition passed validation (a bug)");
    };
    match (a, b) {
        (Vals::F(x), Vals::F(y)) => Vals::F(
            c.iter()
                .zip(x.iter().zip(y))
                .map(|(&k, (&p, &q))| if k { p } else { q })
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) => Vals::I(
            c.iter()
                .zip(x.iter().zip(y))
                .map(|(&k, (&p, &q))| if k { p } else { q })
                .collect(),
        ),
        (Vals::B(x), Vals::B(y)) => Vals::B(
            c.iter()
                .zip(x.iter().zip(y))
                .map(|(&k, (&p, &q))| if k { p } else { q })
                .collect(),
        ),
        _ => panic!("where branches of different kinds passed validation (a bug)"),
    }
}

/// Conversion to `to` with the rules of [`Scalar::cast`](crate::Scalar::cast); floats are
/// rounded to `round_to` (the target itself in a graph, its compute dtype in a kernel).
/// Integers convert to floats with one rounding ([`int_to_float`]).
pub(super) fn cast(x: &Vals, to: DType, round_to: DType) -> Vals {
    use crate::dtype::DKind;
    match (x, to.kind()) {
        (Vals::F(v), DKind::Float) => Vals::F(v.iter().map(|&a| round_f64(a, round_to)).collect()),
        // `as i64` truncates toward zero, saturates and maps NaN to 0 (Scalar::cast).
        (Vals::F(v), DKind::Int) => Vals::I(v.iter().map(|&a| wrap_int(a as i64, to)).collect()),
        (Vals::F(v), DKind::Bool) => Vals::B(v.iter().map(|&a| a != 0.0).collect()),
        (Vals::I(v), DKind::Float) => {
            Vals::F(v.iter().map(|&a| int_to_float(a, round_to)).collect())
        }
        (Vals::I(v), DKind::Int) => Vals::I(v.iter().map(|&a| wrap_int(a, to)).collect()),
        (Vals::I(v), DKind::Bool) => Vals::B(v.iter().map(|&a| a != 0).collect()),
        (Vals::B(v), DKind::Float) => Vals::F(v.iter().map(|&a| f64::from(u8::from(a))).collect()),
        (Vals::B(v), DKind::Int) => Vals::I(Vals::bools_as_ints(v)),
        (Vals::B(v), DKind::Bool) => Vals::B(v.clone()),
    }
}
