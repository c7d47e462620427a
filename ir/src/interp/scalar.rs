//! Scalar semantics of every unary and binary op in f64 and i64, shared by the graph and
//! kernel paths (and by constant folding and the backends' libcalls).

use crate::op::{BinaryOp, UnaryOp};

/// `op` applied to `x` in f64, not rounded (the caller rounds to the dtype).
///
/// `not` treats 0 as false and anything else (NaN included) as true, returning 0 or 1.
///
/// ```
/// use ndfuse_ir::{interp::unary_f64, UnaryOp};
/// assert_eq!(unary_f64(UnaryOp::Sigmoid, -1000.0), 0.0);
/// assert_eq!(unary_f64(UnaryOp::Round, 2.5), 2.0);
/// ```
pub fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        // The comparisons fail for ±0 and NaN, which are returned as they are.
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Square => x * x,
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => {
            // For x < 0, e^x / (1 + e^x) keeps the tiny results that 1 / (1 + e^-x)
            // loses once e^-x overflows; neither form can produce NaN from a non-NaN.
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                let e = x.exp();
                e / (1.0 + e)
            }
        }
        UnaryOp::Relu => {
            // maximum(-0, +0) is +0, so relu never returns -0; NaN passes through.
            if x.is_nan() || x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Not => f64::from(u8::from(x == 0.0)),
    }
}

/// `op` on integers with i64 wrapping arithmetic (wrap to a narrower dtype afterwards
/// with [`crate::round::wrap_int`]; two's-complement wrapping commutes with that).
///
/// Ops a verified graph never applies to integers (the float-only unary ops) are
/// computed in f64 and truncated like a cast, so the function is total.
pub fn unary_i64(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        // abs(MIN) wraps to MIN, as numpy's does.
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Sign => x.signum(),
        UnaryOp::Square => x.wrapping_mul(x),
        UnaryOp::Relu => x.max(0),
        UnaryOp::Not => i64::from(x == 0),
        _ => unary_f64(op, x as f64) as i64,
    }
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and +0 is greater than -0.
pub(super) fn max_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else if a.is_sign_negative() {
        // Equal values: only ±0 differ, and the positive one wins.
        b
    } else {
        a
    }
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN, and -0 is less than +0.
pub(super) fn min_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else if a.is_sign_negative() {
        a
    } else {
        b
    }
}

/// Arithmetic `op` on f64 values, not rounded. `max`/`min` propagate NaN and order
/// -0 below +0; `pow` follows IEEE `pow` (`pow(x, 0) = 1` even for NaN).
///
/// Comparisons return 1 or 0 and logical ops treat non-zero (NaN included) as true, so
/// the function is total; [`compare_f64`] is the intended way to compare.
pub fn binary_f64(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => max_f64(a, b),
        BinaryOp::Min => min_f64(a, b),
        _ => f64::from(u8::from(compare_f64(op, a, b))),
    }
}

/// Comparison `op` on f64 values: NaN compares false except for `ne`. Logical ops
/// treat non-zero (NaN included) as true; arithmetic ops give "result is non-zero".
pub fn compare_f64(op: BinaryOp, a: f64, b: f64) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        BinaryOp::And => a != 0.0 && b != 0.0,
        BinaryOp::Or => a != 0.0 || b != 0.0,
        _ => binary_f64(op, a, b) != 0.0,
    }
}

/// `base ** exp` on integers: wrapping power by squaring for `exp >= 0`; for `exp < 0`
/// the exact result truncated toward zero (1 for base 1, ±1 for base -1, else 0), where
/// numpy raises instead.
fn pow_i64(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut acc, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    acc
}

/// Arithmetic `op` on integers with i64 wrapping (wrap to a narrower dtype afterwards
/// with [`crate::round::wrap_int`]). `pow` with a negative exponent gives the exact power
/// truncated toward zero (1 for base 1, ±1 for base -1, else 0), where numpy raises.
///
/// `div` never reaches integers in a verified graph (it is true division); here it
/// truncates toward zero and gives 0 for a zero divisor, so the function is total.
/// Comparisons and logical ops give 1 or 0.
pub fn binary_i64(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::Pow => pow_i64(a, b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        _ => i64::from(compare_i64(op, a, b)),
    }
}

/// Comparison `op` on integers (bools compare as 0 < 1). Logical ops treat non-zero as
/// true; arithmetic ops give "result is non-zero".
pub fn compare_i64(op: BinaryOp, a: i64, b: i64) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        BinaryOp::And => a != 0 && b != 0,
        BinaryOp::Or => a != 0 || b != 0,
        _ => binary_i64(op, a, b) != 0,
    }
}
