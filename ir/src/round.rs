//! Rounding of f64 values to a float dtype and wrapping of integers to an int dtype:
//! the one definition of "round to the node's dtype" that the interpreter, constant
//! folding ([`Scalar::cast`]) and host arrays share.

use crate::dtype::{DKind, DType, Scalar};
use half::{bf16, f16};

/// `v` rounded (to nearest, ties to even) to `dtype`'s precision and returned as f64.
/// Non-float dtypes return `v` unchanged.
pub fn round_f64(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => to_f16(v).to_f64(),
        DType::BF16 => to_bf16(v).to_f64(),
        DType::F32 => f64::from(v as f32),
        _ => v,
    }
}

/// `v` as f16 with one rounding. `half`'s own f64 conversion goes through f32 (or drops
/// low bits), rounding twice near ties: 2049 + 2^-30 must give 2050, not 2048.
pub fn to_f16(v: f64) -> f16 {
    f16::from_f32(f32_round_odd(v))
}

/// `v` as bf16 with one rounding (see [`to_f16`]).
pub fn to_bf16(v: f64) -> bf16 {
    bf16::from_f32(f32_round_odd(v))
}

/// `v` rounded to f32 by round-to-odd: the result is exact, or the f32 below `|v|` with
/// its last bit set as a sticky bit. One round-to-nearest step from there to any format
/// of at most 22 significant bits (f16: 11, bf16: 8) equals rounding `v` directly.
fn f32_round_odd(v: f64) -> f32 {
    let r = v as f32;
    if r.is_nan() || f64::from(r) == v {
        return r;
    }
    // Step toward zero when round-to-nearest went away from it (or overflowed).
    let t = if r.is_infinite() || f64::from(r).abs() > v.abs() {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f32::from_bits(t.to_bits() | 1)
}

/// `v` wrapped to `dtype`'s width (two's complement), returned as i64. Non-int dtypes
/// return `v` unchanged.
pub fn wrap_int(v: i64, dtype: DType) -> i64 {
    match dtype {
        DType::I32 => i64::from(v as i32),
        _ => v,
    }
}

/// Whether `dtype` rounds floats (`round_f64` is not the identity).
pub fn rounds(dtype: DType) -> bool {
    dtype.kind() == DKind::Float && dtype != DType::F64
}

/// `v` converted to the float `dtype` with ONE rounding (to nearest, ties to even) and
/// returned as f64. Going through `v as f64` would round twice for |v| > 2^53.
///
/// Non-float dtypes return `v as f64`.
pub fn int_to_float(v: i64, dtype: DType) -> f64 {
    let precision = match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F32 => 24,
        DType::F64 => 53,
        DType::I32 | DType::I64 | DType::Bool => return v as f64,
    };
    let mag = v.unsigned_abs();
    let bits = 64 - mag.leading_zeros();
    let rounded: u128 = if bits <= precision {
        u128::from(mag)
    } else {
        let shift = bits - precision;
        let (q, rem, half) = (
            mag >> shift,
            mag & ((1u64 << shift) - 1),
            1u64 << (shift - 1),
        );
        let q = if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        };
        u128::from(q) << shift
    };
    // `rounded` has at most `precision` significant bits, so it converts to f64 exactly
    // and round_f64 only has the dtype's range left to apply (f16 overflows to inf).
    let exact = rounded as f64;
    round_f64(if v < 0 { -exact } else { exact }, dtype)
}

/// The rounding of constants: a [`Scalar`] cast follows the same rules as the values of
/// a node.
impl Scalar {
    /// This value converted to `dtype` with the same rules as [`crate::Op::Cast`]
    /// and rounded to the dtype's precision.
    pub fn cast(self, dtype: DType) -> Scalar {
        match dtype.kind() {
            DKind::Float => Scalar::F(match self {
                // Through f64 first would round twice for |v| > 2^53.
                Scalar::I(v) => int_to_float(v, dtype),
                _ => round_f64(self.to_f64(), dtype),
            }),
            DKind::Int => {
                let wide = match self {
                    Scalar::F(v) => v as i64, // saturating, NaN -> 0 (documented cast rule)
                    Scalar::I(v) => v,
                    Scalar::B(v) => i64::from(v),
                };
                Scalar::I(wrap_int(wide, dtype))
            }
            DKind::Bool => Scalar::B(match self {
                Scalar::F(v) => v != 0.0,
                Scalar::I(v) => v != 0,
                Scalar::B(v) => v,
            }),
        }
    }
}
