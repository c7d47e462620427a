//! Rounding of f64 values to a float dtype and wrapping of integers to an int dtype:
//! the one definition of "round to the node's dtype" that the interpreter, constant
//! folding and host arrays share.

use crate::dtype::{DKind, DType};
use half::{bf16, f16};

/// `v` rounded (to nearest, ties to even) to `dtype`'s precision and returned as f64.
/// Non-float dtypes return `v` unchanged.
pub fn round_f64(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => f64::from(v as f32),
        _ => v,
    }
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
