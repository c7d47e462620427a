//! Host arrays: a shape plus a typed, contiguous (row-major) buffer. They are what users
//! hand to and get back from `eval`, what the interpreter reads and writes, and what the
//! CPU backend passes to JIT code.
//!
//! An array may have a *home* ([`Recycle`]): a buffer cache its storage goes back to
//! when the array is dropped, so that the next evaluation writes into memory that is
//! already mapped instead of a fresh allocation. Arrays built by users have none.

use crate::dtype::DType;
use crate::round::{to_bf16, to_f16, wrap_int};
use crate::shape::Shape;
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;

/// Typed element storage of a [`HostArray`].
#[derive(Clone, PartialEq)]
pub enum Storage {
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
    /// bool elements (one byte each).
    Bool(Vec<bool>),
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Storage::{}(len {})", self.dtype(), self.len())
    }
}

macro_rules! each_storage {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            Storage::F16($v) => $body,
            Storage::BF16($v) => $body,
            Storage::F32($v) => $body,
            Storage::F64($v) => $body,
            Storage::I32($v) => $body,
            Storage::I64($v) => $body,
            Storage::Bool($v) => $body,
        }
    };
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_storage!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` zero elements of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Storage {
        match dtype {
            DType::F16 => Storage::F16(vec![f16::ZERO; len]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; len]),
            DType::F32 => Storage::F32(vec![0.0; len]),
            DType::F64 => Storage::F64(vec![0.0; len]),
            DType::I32 => Storage::I32(vec![0; len]),
            DType::I64 => Storage::I64(vec![0; len]),
            DType::Bool => Storage::Bool(vec![false; len]),
        }
    }

    /// Element `i` as f64 (ints converted, bools 0/1).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Storage::F16(v) => v[i].to_f64(),
            Storage::BF16(v) => v[i].to_f64(),
            Storage::F32(v) => f64::from(v[i]),
            Storage::F64(v) => v[i],
            Storage::I32(v) => f64::from(v[i]),
            Storage::I64(v) => v[i] as f64,
            Storage::Bool(v) => f64::from(u8::from(v[i])),
        }
    }

    /// Element `i` as i64 (floats truncated and saturated, NaN 0; bools 0/1).
    pub fn get_i64(&self, i: usize) -> i64 {
        match self {
            Storage::I32(v) => i64::from(v[i]),
            Storage::I64(v) => v[i],
            Storage::Bool(v) => i64::from(v[i]),
            _ => self.get_f64(i) as i64,
        }
    }

    /// Element `i` as bool (non-zero is true, NaN is true).
    pub fn get_bool(&self, i: usize) -> bool {
        match self {
            Storage::Bool(v) => v[i],
            Storage::I32(v) => v[i] != 0,
            Storage::I64(v) => v[i] != 0,
            _ => self.get_f64(i) != 0.0,
        }
    }

    /// Storage of `dtype` from f64 values, each converted by the cast rules: floats
    /// rounded once; ints truncated toward zero, saturated to i64 (NaN: 0), then wrapped
    /// to the width; bools non-zero.
    pub fn from_f64s(dtype: DType, vals: &[f64]) -> Storage {
        match dtype {
            DType::F16 => Storage::F16(vals.iter().map(|&v| to_f16(v)).collect()),
            DType::BF16 => Storage::BF16(vals.iter().map(|&v| to_bf16(v)).collect()),
            DType::F32 => Storage::F32(vals.iter().map(|&v| v as f32).collect()),
            DType::F64 => Storage::F64(vals.to_vec()),
            DType::I32 => Storage::I32(vals.iter().map(|&v| v as i64 as i32).collect()),
            DType::I64 => Storage::I64(vals.iter().map(|&v| v as i64).collect()),
            DType::Bool => Storage::Bool(vals.iter().map(|&v| v != 0.0).collect()),
        }
    }

    /// `len` elements of `dtype`, element `i` being `f(i)` converted as by
    /// [`Storage::from_f64s`], in one allocation that may fail: `None` when the memory
    /// cannot be had (or `len` elements of `dtype` exceed the address space), where
    /// `from_f64s` and `zeros` abort the process. For sizes a user chose.
    pub fn try_from_fn(
        dtype: DType,
        len: usize,
        mut f: impl FnMut(usize) -> f64,
    ) -> Option<Storage> {
        fn fill<T>(len: usize, g: impl FnMut(usize) -> T) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(len).ok()?;
            v.extend((0..len).map(g));
            Some(v)
        }
        Some(match dtype {
            DType::F16 => Storage::F16(fill(len, |i| to_f16(f(i)))?),
            DType::BF16 => Storage::BF16(fill(len, |i| to_bf16(f(i)))?),
            DType::F32 => Storage::F32(fill(len, |i| f(i) as f32)?),
            DType::F64 => Storage::F64(fill(len, f)?),
            DType::I32 => Storage::I32(fill(len, |i| f(i) as i64 as i32)?),
            DType::I64 => Storage::I64(fill(len, |i| f(i) as i64)?),
            DType::Bool => Storage::Bool(fill(len, |i| f(i) != 0.0)?),
        })
    }

    /// Storage of an int `dtype` (or bool) from i64 values, wrapped to the dtype.
    pub fn from_i64s(dtype: DType, vals: &[i64]) -> Storage {
        match dtype {
            DType::I32 => Storage::I32(vals.iter().map(|&v| wrap_int(v, dtype) as i32).collect()),
            DType::I64 => Storage::I64(vals.to_vec()),
            DType::Bool => Storage::Bool(vals.iter().map(|&v| v != 0).collect()),
            _ => Storage::from_f64s(dtype, &vals.iter().map(|&v| v as f64).collect::<Vec<_>>()),
        }
    }

    /// Raw pointer to the first element, for handing to compiled kernels.
    pub fn as_ptr(&self) -> *const u8 {
        each_storage!(self, v => v.as_ptr().cast::<u8>())
    }

    /// Raw mutable pointer to the first element, for handing to compiled kernels.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        each_storage!(self, v => v.as_mut_ptr().cast::<u8>())
    }
}

/// A Rust element type that a [`HostArray`] can hold.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Wraps a vector as storage.
    fn into_storage(v: Vec<Self>) -> Storage;
    /// The elements, when the storage holds this type.
    fn slice(s: &Storage) -> Option<&[Self]>;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn into_storage(v: Vec<Self>) -> Storage {
                Storage::$d(v)
            }
            fn slice(s: &Storage) -> Option<&[Self]> {
                match s {
                    Storage::$d(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f16, F16);
element!(bf16, BF16);
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(i64, I64);
element!(bool, Bool);

/// Where the storage of a [`HostArray`] goes when the array is dropped: a buffer cache
/// (the runtime's host cache implements it). The `ir` crate only calls it; what is kept
/// and for how long is the cache's business.
pub trait Recycle: Send + Sync + fmt::Debug {
    /// Takes back the storage of a dropped array.
    fn recycle(&self, data: Storage);
}

/// A contiguous row-major array on the host.
pub struct HostArray {
    shape: Shape,
    data: Storage,
    /// Where `data` goes on drop; `None`: it is freed.
    home: Option<Arc<dyn Recycle>>,
}

impl Clone for HostArray {
    /// A copy in freshly allocated memory, with no home: only the cache that issued a
    /// buffer takes it back.
    fn clone(&self) -> HostArray {
        HostArray {
            shape: self.shape.clone(),
            data: self.data.clone(),
            home: None,
        }
    }
}

impl PartialEq for HostArray {
    /// Equal shapes and elements; where the memory came from does not matter.
    fn eq(&self, other: &HostArray) -> bool {
        self.shape == other.shape && self.data == other.data
    }
}

impl fmt::Debug for HostArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostArray")
            .field("shape", &self.shape)
            .field("data", &self.data)
            .field("cached", &self.home.is_some())
            .finish()
    }
}

impl Drop for HostArray {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // An empty Vec does not allocate: the replacement costs nothing.
            home.recycle(std::mem::replace(&mut self.data, Storage::Bool(Vec::new())));
        }
    }
}

impl HostArray {
    /// An array from storage and shape; `None` when the element count does not match.
    pub fn new(shape: Shape, data: Storage) -> Option<HostArray> {
        (shape.numel() == data.len()).then_some(HostArray {
            shape,
            data,
            home: None,
        })
    }

    /// An array from storage and shape whose storage goes back to `home` when it is
    /// dropped; `None` when the element count does not match (the storage is then
    /// handed to `home` at once).
    pub fn with_home(shape: Shape, data: Storage, home: Arc<dyn Recycle>) -> Option<HostArray> {
        let a = HostArray {
            shape,
            data,
            home: Some(home),
        };
        (a.shape.numel() == a.data.len()).then_some(a)
    }

    /// Whether the storage goes back to a cache when the array is dropped.
    pub fn has_home(&self) -> bool {
        self.home.is_some()
    }

    /// An array of zeros.
    pub fn zeros(dtype: DType, shape: Shape) -> HostArray {
        let data = Storage::zeros(dtype, shape.numel());
        HostArray {
            shape,
            data,
            home: None,
        }
    }

    /// An array of `dtype` from f64 values, rounded once (see [`Storage::from_f64s`]).
    ///
    /// # Panics
    /// When `vals.len()` differs from the shape's element count (a bug in the caller).
    pub fn from_f64s(dtype: DType, shape: Shape, vals: &[f64]) -> HostArray {
        assert_eq!(
            shape.numel(),
            vals.len(),
            "HostArray::from_f64s: length is a bug"
        );
        HostArray {
            shape,
            data: Storage::from_f64s(dtype, vals),
            home: None,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The typed storage.
    pub fn storage(&self) -> &Storage {
        &self.data
    }

    /// The typed storage, mutable (the shape cannot change).
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.data
    }

    /// The elements as a slice of `T`, `None` when `T` is not the array's dtype.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::slice(&self.data)
    }

    /// All elements converted to f64 (see [`Storage::get_f64`]).
    pub fn to_f64s(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.data.get_f64(i)).collect()
    }

    /// The same data (and home) with another shape of equal element count.
    pub fn reshaped(mut self, shape: Shape) -> Option<HostArray> {
        (shape.numel() == self.data.len()).then(|| {
            self.shape = shape;
            self
        })
    }
}
