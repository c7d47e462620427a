//! Evaluated results: an [`Array`] is a shape, a dtype and contiguous host data.

use crate::error::{Error, Result};
use ndfuse_ir::{DType, Element, HostArray, Shape};

/// A contiguous row-major array on the host, as returned by `eval`.
#[derive(Clone, Debug, PartialEq)]
pub struct Array(pub(crate) HostArray);

impl Array {
    /// The extent of each axis.
    pub fn shape(&self) -> &[usize] {
        self.0.shape().dims()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The elements as `T`, which must be the array's dtype (`f32` for `F32`,
    /// `half::f16` for `F16`, `bool` for `Bool`...).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.0.as_slice::<T>().ok_or(Error::TypeMismatch {
            what: "as_slice",
            want: T::DTYPE,
            got: self.dtype(),
        })
    }

    /// The elements copied into a `Vec<T>`; `T` must be the array's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.as_slice::<T>()
            .map(<[T]>::to_vec)
            .map_err(|_| Error::TypeMismatch {
                what: "to_vec",
                want: T::DTYPE,
                got: self.dtype(),
            })
    }

    /// Every element converted to f64 (ints exactly up to 2^53, bools 0/1), whatever
    /// the dtype: convenient for printing and comparing.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.0.to_f64s()
    }

    /// The underlying IR host array.
    pub fn as_host(&self) -> &HostArray {
        &self.0
    }

    /// The shape as an IR shape.
    pub fn ir_shape(&self) -> &Shape {
        self.0.shape()
    }

    /// An array holding `data` (row-major) with `shape`; `Err` when the element count
    /// does not match. The dtype is `T`'s.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Array> {
        let at = std::panic::Location::caller();
        let shape = Shape::from(shape);
        let count = data.len();
        HostArray::new(shape.clone(), T::into_storage(data))
            .map(Array)
            .ok_or_else(|| Error::ElementCount {
                what: "Array::from_vec",
                count,
                expected: shape.numel(),
                shape,
                at,
            })
    }

    /// Wraps an IR host array (moved, not copied).
    pub fn from_host(a: HostArray) -> Array {
        Array(a)
    }

    /// The IR host array (moved, not copied: a buffer of the host cache still goes back
    /// to it when the host array drops).
    pub fn into_host(self) -> HostArray {
        self.0
    }
}
