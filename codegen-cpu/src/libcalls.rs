//! Math functions that JIT code calls: transcendentals and integer `pow`, as Rust
//! functions with the C ABI registered as JIT symbols.
//!
//! Each has one f32 and one f64 version (integer pow: i32 and i64). They stand in until
//! an inline vector math library replaces the calls; until then their accuracy is that
//! of the host's libm (the f32 versions of `sigmoid` and `pow` go through f64 to round
//! once). The measured bound per op is in `tests/differential.rs`.

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

extern "C" fn ndfuse_expf(x: f32) -> f32 {
    x.exp()
}
extern "C" fn ndfuse_exp(x: f64) -> f64 {
    x.exp()
}
extern "C" fn ndfuse_logf(x: f32) -> f32 {
    x.ln()
}
extern "C" fn ndfuse_log(x: f64) -> f64 {
    x.ln()
}
extern "C" fn ndfuse_log1pf(x: f32) -> f32 {
    x.ln_1p()
}
extern "C" fn ndfuse_log1p(x: f64) -> f64 {
    x.ln_1p()
}
extern "C" fn ndfuse_expm1f(x: f32) -> f32 {
    x.exp_m1()
}
extern "C" fn ndfuse_expm1(x: f64) -> f64 {
    x.exp_m1()
}
extern "C" fn ndfuse_sinf(x: f32) -> f32 {
    x.sin()
}
extern "C" fn ndfuse_sin(x: f64) -> f64 {
    x.sin()
}
extern "C" fn ndfuse_cosf(x: f32) -> f32 {
    x.cos()
}
extern "C" fn ndfuse_cos(x: f64) -> f64 {
    x.cos()
}
extern "C" fn ndfuse_tanhf(x: f32) -> f32 {
    x.tanh()
}
extern "C" fn ndfuse_tanh(x: f64) -> f64 {
    x.tanh()
}
extern "C" fn ndfuse_erff(x: f32) -> f32 {
    libm::erff(x)
}
extern "C" fn ndfuse_erf(x: f64) -> f64 {
    libm::erf(x)
}

/// Computed in f64 so the f32 result is rounded once, like the reference.
extern "C" fn ndfuse_sigmoidf(x: f32) -> f32 {
    ndfuse_sigmoid(f64::from(x)) as f32
}

/// The reference's split form: `1 / (1 + e^-x)` for `x >= 0`, `e^x / (1 + e^x)` below,
/// which keeps the tiny results the first form loses once `e^-x` overflows (x < -709)
/// and, unlike `e^x / (1 + e^x)` everywhere, never computes inf/inf: no NaN from a
/// number.
extern "C" fn ndfuse_sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Computed in f64 (exact for f32 operands up to the final rounding) so that the f32
/// result is rounded once instead of carrying powf's own error.
extern "C" fn ndfuse_powf(x: f32, y: f32) -> f32 {
    f64::from(x).powf(f64::from(y)) as f32
}
extern "C" fn ndfuse_pow(x: f64, y: f64) -> f64 {
    x.powf(y)
}

/// Wrapping integer power, the reference's rule: a non-negative exponent multiplies by
/// squaring with wrap-around; a negative one gives `1 / base` truncated toward zero,
/// i.e. 1 for base 1, ±1 for base -1 by the exponent's parity, and 0 otherwise.
extern "C" fn ndfuse_ipow64(base: i64, exp: i64) -> i64 {
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
    let (mut acc, mut b, mut e) = (1i64, base, exp);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    acc
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
