//! Values by kind: the elements of a tensor as f64, i64 or bool, and a node's value
//! (dtype, shape, elements) as the interpreter carries it.

use crate::array::{HostArray, Storage};
use crate::dtype::{DType, Scalar};
use crate::round::round_f64;
use crate::shape::Shape;

/// The elements of a tensor by kind: floats already rounded to their dtype, ints wrapped
/// to their width.
#[derive(Clone, Debug)]
pub(super) enum Vals {
    F(Vec<f64>),
    I(Vec<i64>),
    B(Vec<bool>),
}

impl Vals {
    pub(super) fn len(&self) -> usize {
        match self {
            Vals::F(v) => v.len(),
            Vals::I(v) => v.len(),
            Vals::B(v) => v.len(),
        }
    }

    pub(super) fn from_storage(s: &Storage) -> Vals {
        match s {
            Storage::F16(v) => Vals::F(v.iter().map(|x| x.to_f64()).collect()),
            Storage::BF16(v) => Vals::F(v.iter().map(|x| x.to_f64()).collect()),
            Storage::F32(v) => Vals::F(v.iter().map(|&x| f64::from(x)).collect()),
            Storage::F64(v) => Vals::F(v.clone()),
            Storage::I32(v) => Vals::I(v.iter().map(|&x| i64::from(x)).collect()),
            Storage::I64(v) => Vals::I(v.clone()),
            Storage::Bool(v) => Vals::B(v.clone()),
        }
    }

    /// Storage of `dtype`; the values are already of that dtype, so nothing rounds.
    fn into_storage(self, dtype: DType) -> Storage {
        match self {
            Vals::F(v) => Storage::from_f64s(dtype, &v),
            Vals::I(v) => Storage::from_i64s(dtype, &v),
            Vals::B(v) => Storage::Bool(v),
        }
    }

    /// `len` copies of `value` converted to `dtype`, floats rounded to `round_to`.
    pub(super) fn fill(value: Scalar, dtype: DType, round_to: DType, len: usize) -> Vals {
        match value.cast(dtype) {
            Scalar::F(x) => Vals::F(vec![round_f64(x, round_to); len]),
            Scalar::I(x) => Vals::I(vec![x; len]),
            Scalar::B(x) => Vals::B(vec![x; len]),
        }
    }

    /// The elements at `offsets`, in that order.
    pub(super) fn gather(&self, offsets: impl Iterator<Item = usize>) -> Vals {
        match self {
            Vals::F(v) => Vals::F(offsets.map(|o| v[o]).collect()),
            Vals::I(v) => Vals::I(offsets.map(|o| v[o]).collect()),
            Vals::B(v) => Vals::B(offsets.map(|o| v[o]).collect()),
        }
    }

    /// `other`'s elements appended (of the same kind: one dtype).
    pub(super) fn extend(&mut self, other: &Vals) {
        match (self, other) {
            (Vals::F(a), Vals::F(b)) => a.extend_from_slice(b),
            (Vals::I(a), Vals::I(b)) => a.extend_from_slice(b),
            (Vals::B(a), Vals::B(b)) => a.extend_from_slice(b),
            _ => unreachable!("values of one dtype are of one kind (a bug otherwise)"),
        }
    }

    /// Bools as 0/1 integers, for ops that treat them as numbers.
    pub(super) fn bools_as_ints(v: &[bool]) -> Vec<i64> {
        v.iter().map(|&b| i64::from(b)).collect()
    }

    /// The values as f64 (ints converted exactly where they fit, bools 0/1).
    pub(super) fn to_f64s(&self) -> Vec<f64> {
        match self {
            Vals::F(v) => v.clone(),
            Vals::I(v) => v.iter().map(|&x| x as f64).collect(),
            Vals::B(v) => v.iter().map(|&b| f64::from(u8::from(b))).collect(),
        }
    }
}

/// A node's value: its dtype, shape and contiguous elements.
#[derive(Clone, Debug)]
pub(super) struct Tensor {
    pub(super) dtype: DType,
    pub(super) shape: Shape,
    pub(super) vals: Vals,
}

impl Tensor {
    pub(super) fn from_host(a: &HostArray) -> Tensor {
        Tensor {
            dtype: a.dtype(),
            shape: a.shape().clone(),
            vals: Vals::from_storage(a.storage()),
        }
    }

    pub(super) fn into_host(self) -> HostArray {
        HostArray::new(self.shape, self.vals.into_storage(self.dtype))
            .expect("the interpreter produces one value per element (a bug otherwise)")
    }
}
