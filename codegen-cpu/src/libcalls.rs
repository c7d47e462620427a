//! Math functions that JIT code calls: transcendentals and integer `pow`, as Rust
//! functions with the C ABI registered as JIT symbols.
//!
//! Each has one f32 and one f64 version (integer pow: i32 and i64). They stand in until
//! an inline vector math library replaces the calls; until then their accuracy is that
//! of the host's libm (the f32 versions of `sigmoid` and `pow` go through f64 to round
//! once; `sigmoid` uses the `libm` crate's exp, as the reference does). The tolerance per
//! op is in `tests/differential.rs`.

use ndfuse_ir::interp::{binary_f64, binary_i64, unary_f64};
use ndfuse_ir::{BinaryOp, DType, UnaryOp};

/// A function the generated code calls, by symbol name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Libcall {
    /// The JIT symbol.
    pub name: &'static str,
    /// Number of arguments, all of the kernel value's dtype, as is the result.
    pub arity: usize,
}

/// The function computing unary `op` on `dtype`, `None` when the op is inline code.
pub(crate) fn unary(op: UnaryOp, dtype: DType) -> Option<Libcall> {
    let (f32_name, f64_name) = match op {
        UnaryOp::Exp => ("ndfuse_expf", "ndfuse_exp"),
        UnaryOp::Log => ("ndfuse_logf", "ndfuse_log"),
        UnaryOp::Log1p => ("ndfuse_log1pf", "ndfuse_log1p"),
        UnaryOp::Expm1 => ("ndfuse_expm1f", "ndfuse_expm1"),
        UnaryOp::Sin => ("ndfuse_sinf", "ndfuse_sin"),
        UnaryOp::Cos => ("ndfuse_cosf", "ndfuse_cos"),
        UnaryOp::Tanh => ("ndfuse_tanhf", "ndfuse_tanh"),
        UnaryOp::Erf => ("ndfuse_erff", "ndfuse_erf"),
        UnaryOp::Sigmoid => ("ndfuse_sigmoidf", "ndfuse_sigmoid"),
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Square
        | UnaryOp::Recip
        | UnaryOp::Relu
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Not => return None,
    };
    let name = match dtype {
        DType::F32 => f32_name,
        DType::F64 => f64_name,
        _ => return None,
    };
    Some(Libcall { name, arity: 1 })
}

/// The function computing binary `op` on `dtype`, `None` when the op is inline code.
pub(crate) fn binary(op: BinaryOp, dtype: DType) -> Option<Libcall> {
    if op != BinaryOp::Pow {
        return None;
    }
    let name = match dtype {
        DType::F32 => "ndfuse_powf",
        DType::F64 => "ndfuse_pow",
        DType::I32 => "ndfuse_ipow32",
        DType::I64 => "ndfuse_ipow64",
        _ => return None,
    };
    Some(Libcall { name, arity: 2 })
}

/// Every symbol, for `JITBuilder::symbols`.
pub(crate) fn symbols() -> [(&'static str, *const u8); 22] {
    [
        ("ndfuse_expf", ndfuse_expf as *const u8),
        ("ndfuse_exp", ndfuse_exp as *const u8),
        ("ndfuse_logf", ndfuse_logf as *const u8),
        ("ndfuse_log", ndfuse_log as *const u8),
        ("ndfuse_log1pf", ndfuse_log1pf as *const u8),
        ("ndfuse_log1p", ndfuse_log1p as *const u8),
        ("ndfuse_expm1f", ndfuse_expm1f as *const u8),
        ("ndfuse_expm1", ndfuse_expm1 as *const u8),
        ("ndfuse_sinf", ndfuse_sinf as *const u8),
        ("ndfuse_sin", ndfuse_sin as *const u8),
        ("ndfuse_cosf", ndfuse_cosf as *const u8),
        ("ndfuse_cos", ndfuse_cos as *const u8),
        ("ndfuse_tanhf", ndfuse_tanhf as *const u8),
        ("ndfuse_tanh", ndfuse_tanh as *const u8),
        ("ndfuse_erff", ndfuse_erff as *const u8),
        ("ndfuse_erf", ndfuse_erf as *const u8),
        ("ndfuse_sigmoidf", ndfuse_sigmoidf as *const u8),
        ("ndfuse_sigmoid", ndfuse_sigmoid as *const u8),
        ("ndfuse_powf", ndfuse_powf as *const u8),
        ("ndfuse_pow", ndfuse_pow as *const u8),
        ("ndfuse_ipow32", ndfuse_ipow32 as *const u8),
        ("ndfuse_ipow64", ndfuse_ipow64 as *const u8),
    ]
}

/// Defines the f32 and f64 wrapper of a unary op. Both call the reference
/// interpreter's own scalar function: f64 directly, f32 computed in f64 and rounded
/// once. So the JIT and the reference agree bit for bit, and the property tests can
/// demand exact equality until the inline vector library brings its own ulp budget.
macro_rules! unary_libcalls {
    ($($op:ident => $f32:ident, $f64:ident;)*) => {$(
        extern "C" fn $f32(x: f32) -> f32 {
            unary_f64(UnaryOp::$op, f64::from(x)) as f32
        }
        extern "C" fn $f64(x: f64) -> f64 {
            unary_f64(UnaryOp::$op, x)
        }
    )*};
}
unary_libcalls! {
    Exp => ndfuse_expf, ndfuse_exp;
    Log => ndfuse_logf, ndfuse_log;
    Log1p => ndfuse_log1pf, ndfuse_log1p;
    Expm1 => ndfuse_expm1f, ndfuse_expm1;
    Sin => ndfuse_sinf, ndfuse_sin;
    Cos => ndfuse_cosf, ndfuse_cos;
    Tanh => ndfuse_tanhf, ndfuse_tanh;
    Erf => ndfuse_erff, ndfuse_erf;
    Sigmoid => ndfuse_sigmoidf, ndfuse_sigmoid;
}

/// `pow` in f64 (exact for f32 operands up to the final rounding), as the reference.
extern "C" fn ndfuse_powf(x: f32, y: f32) -> f32 {
    binary_f64(BinaryOp::Pow, f64::from(x), f64::from(y)) as f32
}
extern "C" fn ndfuse_pow(x: f64, y: f64) -> f64 {
    binary_f64(BinaryOp::Pow, x, y)
}

/// Wrapping integer power, the reference's rule (see `interp::binary_i64`).
extern "C" fn ndfuse_ipow64(base: i64, exp: i64) -> i64 {
    binary_i64(BinaryOp::Pow, base, exp)
}

/// The i64 power wrapped to i32: wrapping products agree modulo 2^32.
extern "C" fn ndfuse_ipow32(base: i32, exp: i32) -> i32 {
    ndfuse_ipow64(i64::from(base), i64::from(exp)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_libcall_is_registered() {
        let names: Vec<&str> = symbols().iter().map(|(n, _)| *n).collect();
        for d in [DType::F32, DType::F64, DType::I32, DType::I64] {
            for op in UnaryOp::ALL {
                if let Some(c) = unary(op, d) {
                    assert!(names.contains(&c.name), "{} missing", c.name);
                }
            }
            if let Some(c) = binary(BinaryOp::Pow, d) {
                assert!(names.contains(&c.name), "{} missing", c.name);
            }
        }
    }

    #[test]
    fn integer_pow_follows_the_reference_rule() {
        assert_eq!(ndfuse_ipow64(3, 4), 81);
        assert_eq!(ndfuse_ipow64(-2, 3), -8);
        assert_eq!(ndfuse_ipow64(7, 0), 1);
        assert_eq!(ndfuse_ipow64(0, 0), 1);
        assert_eq!(ndfuse_ipow64(2, 64), 0); // wraps
        assert_eq!(ndfuse_ipow64(1, -5), 1);
        assert_eq!(ndfuse_ipow64(-1, -3), -1);
        assert_eq!(ndfuse_ipow64(-1, -4), 1);
        assert_eq!(ndfuse_ipow64(2, -1), 0);
        assert_eq!(ndfuse_ipow64(0, -1), 0);
        assert_eq!(ndfuse_ipow32(2, 31), i32::MIN);
        assert_eq!(ndfuse_ipow32(3, 21), 3i32.wrapping_pow(21));
    }

    #[test]
    fn sigmoid_saturates_without_nan() {
        assert_eq!(ndfuse_sigmoid(1000.0), 1.0);
        assert_eq!(ndfuse_sigmoid(-1000.0), 0.0);
        assert_eq!(ndfuse_sigmoid(f64::INFINITY), 1.0);
        assert_eq!(ndfuse_sigmoid(f64::NEG_INFINITY), 0.0);
        assert_eq!(ndfuse_sigmoidf(-200.0), 0.0);
        assert!(ndfuse_sigmoid(f64::NAN).is_nan());
        // e^-720 is a subnormal the naive form would flush to 0.
        assert!(ndfuse_sigmoid(-720.0) > 0.0);
    }
}
