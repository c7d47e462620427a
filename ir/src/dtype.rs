//! Element types and the promotion rules that decide the dtype of a mixed operation.
//!
//! The rules follow numpy (NEP 50) where numpy defines them:
//!
//! | operands                      | result                                   |
//! |-------------------------------|------------------------------------------|
//! | same dtype                    | that dtype                               |
//! | two floats                    | the wider (`f16 + f32 -> f32`); `f16 + bf16 -> f32` |
//! | two ints                      | the wider (`i32 + i64 -> i64`)           |
//! | int and float               | f64 (numpy: `i32 + f32 -> f64`; no narrower float holds every i32) |
//! | bool in arithmetic            | an error: cast it first                  |
//!
//! Scalar literals are *weak* (numpy's NEP 50): `x * 2.0` keeps `x`'s dtype when `x` is a
//! float tensor; a float literal with an integer tensor gives `f64`, as numpy does.
//!
//! Half types (`f16`, `bf16`) are storage types: backends compute in `f32` and round once
//! when storing. The reference interpreter computes in `f64` and rounds to the node's
//! dtype after every node.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary16.
    F16,
    /// bfloat16: f32's exponent, 8 bits of mantissa.
    BF16,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// Signed 32-bit integer, wrapping arithmetic.
    I32,
    /// Signed 64-bit integer, wrapping arithmetic; the dtype of indices (`argmax`).
    I64,
    /// Boolean, stored as one byte (0 or 1); the dtype of comparisons and masks.
    Bool,
}

/// The broad family of a dtype, used by the promotion rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DKind {
    /// f16, bf16, f32, f64
    Float,
    /// i32, i64
    Int,
    /// bool
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order (useful for exhaustive tests).
    pub const ALL: [DType; 7] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The float dtypes.
    pub const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// The family of this dtype.
    pub const fn kind(self) -> DKind {
        match self {
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => DKind::Float,
            DType::I32 | DType::I64 => DKind::Int,
            DType::Bool => DKind::Bool,
        }
    }

    /// True for f16, bf16, f32, f64.
    pub const fn is_float(self) -> bool {
        matches!(self.kind(), DKind::Float)
    }

    /// True for i32, i64.
    pub const fn is_int(self) -> bool {
        matches!(self.kind(), DKind::Int)
    }

    /// True for the half-precision storage types, whose math runs in f32.
    pub const fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// The dtype arithmetic on this dtype is carried out in by a backend: f32 for the
    /// half types, the dtype itself otherwise.
    pub const fn compute_dtype(self) -> DType {
        if self.is_half() {
            DType::F32
        } else {
            self
        }
    }

    /// The short name used in IR dumps, the CLI and `.npy` headers' descriptions.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses a dtype name as printed by [`DType::name`].
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// The float dtype that a float-valued op (exp, sqrt, mean, true division...) of an
    /// operand of this dtype returns: float dtypes keep their own, integers give f64
    /// (numpy: `np.exp(np.int32(1)).dtype == float64`), bool gives `None` (an error).
    pub const fn float_result(self) -> Option<DType> {
        match self.kind() {
            DKind::Float => Some(self),
            DKind::Int => Some(DType::F64),
            DKind::Bool => None,
        }
    }

    /// Promotion of two dtypes for arithmetic (see the module docs); `None` when a
    /// bool meets arithmetic.
    pub fn promote(a: DType, b: DType) -> Option<DType> {
        use DType::*;
        if a == b {
            return if a == Bool { None } else { Some(a) };
        }
        match (a.kind(), b.kind()) {
            (DKind::Bool, _) | (_, DKind::Bool) => None,
            (DKind::Float, DKind::Float) => Some(match (a, b) {
                (F64, _) | (_, F64) => F64,
                // f16 and bf16 have no common 16-bit type; f32 holds both exactly.
                _ => F32,
            }),
            (DKind::Int, DKind::Int) => Some(I64),
            // An i32 or i64 does not fit any float narrower than f64.
            (DKind::Int, DKind::Float) | (DKind::Float, DKind::Int) => Some(F64),
        }
    }

    /// Promotion of two dtypes for a comparison or `maximum`-like selection: like
    /// [`DType::promote`], but bool with bool is allowed (comparisons of masks).
    pub fn promote_compare(a: DType, b: DType) -> Option<DType> {
        if a == DType::Bool && b == DType::Bool {
            Some(DType::Bool)
        } else {
            DType::promote(a, b)
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scalar value of any dtype, as held by constants in the graph.
///
/// Floats are kept as `f64` (every float dtype's values are exactly representable), ints
/// as `i64`. Equality and hashing are bitwise, so `NaN == NaN` and `-0.0 != 0.0` here:
/// two constants are the same constant exactly when they have the same bits.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// A float value.
    F(f64),
    /// An integer value.
    I(i64),
    /// A boolean value.
    B(bool),
}

impl Scalar {
    /// The value as f64 (ints converted, bools 0/1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::F(v) => v,
            Scalar::I(v) => v as f64,
            Scalar::B(v) => f64::from(u8::from(v)),
        }
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Scalar::F(a), Scalar::F(b)) => a.to_bits() == b.to_bits(),
            (Scalar::I(a), Scalar::I(b)) => a == b,
            (Scalar::B(a), Scalar::B(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Scalar {}

impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Scalar::F(v) => (0u8, v.to_bits()).hash(state),
            Scalar::I(v) => (1u8, *v).hash(state),
            Scalar::B(v) => (2u8, *v).hash(state),
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // `{:?}` keeps a decimal point (`2.0`, not `2`) and prints inf/NaN readably.
            Scalar::F(v) => write!(f, "{v:?}"),
            Scalar::I(v) => write!(f, "{v}"),
            Scalar::B(v) => write!(f, "{v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_table() {
        assert_eq!(DType::promote(F16, F32), Some(F32));
        assert_eq!(DType::promote(F16, BF16), Some(F32));
        assert_eq!(DType::promote(BF16, F64), Some(F64));
        assert_eq!(DType::promote(I32, I64), Some(I64));
        assert_eq!(DType::promote(I32, F32), Some(F64));
        assert_eq!(DType::promote(I64, F16), Some(F64));
        assert_eq!(DType::promote(Bool, F32), None);
        assert_eq!(DType::promote(Bool, Bool), None);
        assert_eq!(DType::promote_compare(Bool, Bool), Some(Bool));
        for d in DType::ALL {
            if d != Bool {
                assert_eq!(DType::promote(d, d), Some(d));
            }
            assert_eq!(DType::parse(d.name()), Some(d));
        }
    }
}
