//! `ndarray` interop (cargo feature `ndarray`, on by default): tensors from any
//! ndarray array or view, and evaluated results back as `ArrayD`.
//!
//! An ndarray array may be a transposed view, a slice with steps, or in Fortran order;
//! ndfuse's leaves are row-major, so elements are copied in logical (row-major) order,
//! which is what every index of the ndarray array means. Element types are those of
//! [`Element`]: `f32`, `f64`, `half::f16`, `half::bf16`, `i32`, `i64`, `bool`.
//!
//! ```
//! use ndarray::array;
//! use ndfuse::Context;
//! let ctx = Context::new();
//! let m = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
//! let t = ctx.from_ndarray(&m.t());                     // a transposed view: [3, 2]
//! let y = (&t * 10.0).eval()?.to_ndarray::<f32>()?;
//! assert_eq!(y.shape(), &[3, 2]);
//! assert_eq!(y[[0, 1]], 40.0);                          // y[i, j] is 10 * m[j, i]
//! # Ok::<(), ndfuse::Error>(())
//! ```

use crate::array::Array;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};
use ndfuse_ir::{Element, HostArray, Shape};
use std::panic::Location;

impl Context {
    /// A leaf tensor holding a copy of `a` (an owned array, a view, any dimension).
    /// Non-contiguous and Fortran-order arrays are copied in logical order, so element
    /// `[i, j]` of the tensor is `a[[i, j]]`.
    pub fn from_ndarray<T, S, D>(&self, a: &ArrayBase<S, D>) -> Tensor
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        // `as_slice` is only `Some` for standard (row-major, contiguous) layout, where
        // memory order is logical order; every other layout goes through `iter`, which
        // walks logical order whatever the strides.
        let data: Vec<T> = match a.as_slice() {
            Some(s) => s.to_vec(),
            None => a.iter().copied().collect(),
        };
        let host = HostArray::new(Shape::from(a.shape()), T::into_storage(data))
            .expect("an ndarray array holds exactly the elements of its shape (a bug otherwise)");
        Tensor::leaf(self, host)
    }
}

impl Tensor {
    /// A leaf tensor in the global context holding a copy of `a`; see
    /// [`Context::from_ndarray`].
    pub fn from_ndarray<T, S, D>(a: &ArrayBase<S, D>) -> Tensor
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        Context::global().from_ndarray(a)
    }
}

impl Array {
    /// The elements as an `ndarray::ArrayD<T>` (standard layout) of this array's shape;
    /// `T` must be the array's dtype (`half::f16` for f16, `bool` for bool...), as for
    /// [`Array::to_vec`].
    #[track_caller]
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
        let at = Location::caller();
        let data = self.to_vec::<T>().map_err(|e| match e {
            Error::TypeMismatch { want, got, .. } => Error::TypeMismatch {
                what: "to_ndarray",
                want,
                got,
            },
            other => other,
        })?;
        ArrayD::from_shape_vec(IxDyn(self.shape()), data).map_err(|e| Error::Argument {
            what: "to_ndarray",
            why: e.to_string(),
            at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use ndarray::{s, Array3, ShapeBuilder};

    #[test]
    fn round_trips_keep_values_and_shape() {
        let ctx = Context::new();
        let a = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |ix| {
            (ix[0] * 100 + ix[1] * 10 + ix[2]) as f64
        });
        let back = ctx.from_ndarray(&a).eval().expect("evaluates");
        assert_eq!(back.shape(), &[2, 3, 4]);
        assert_eq!(back.to_ndarray::<f64>().expect("f64"), a);

        let h = ArrayD::from_shape_vec(
            IxDyn(&[3]),
            vec![f16::from_f32(0.5), f16::NEG_INFINITY, f16::from_f32(-2.0)],
        )
        .expect("3 elements");
        let t = ctx.from_ndarray(&h);
        assert_eq!(t.dtype().expect("dtype"), ndfuse_ir::DType::F16);
        assert_eq!(
            t.eval()
                .expect("evaluates")
                .to_ndarray::<f16>()
                .expect("f16"),
            h
        );

        let b = ArrayD::from_elem(IxDyn(&[2, 2]), bf16::from_f32(1.5));
        assert_eq!(
            ctx.from_ndarray(&b)
                .eval()
                .expect("evaluates")
                .to_ndarray::<bf16>()
                .expect("bf16"),
            b
        );

        let m = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![true, false, false, true]).expect("4");
        assert_eq!(
            ctx.from_ndarray(&m)
                .eval()
                .expect("evaluates")
                .to_ndarray::<bool>()
                .expect("bool"),
            m
        );

        // A 0-d array is a scalar tensor.
        let z = ArrayD::from_elem(IxDyn(&[]), 7i64);
        let back = ctx.from_ndarray(&z).eval().expect("evaluates");
        assert_eq!(back.shape(), &[] as &[usize]);
        assert_eq!(back.to_ndarray::<i64>().expect("i64"), z);
    }

    #[test]
    fn non_standard_layouts_are_read_in_logical_order() {
        let ctx = Context::new();
        let a = ArrayD::from_shape_fn(IxDyn(&[3, 4]), |ix| (ix[0] * 4 + ix[1]) as f32);
        // A transposed (column-major) view and its owned copy in Fortran order.
        let t = a.t();
        assert!(!t.is_standard_layout());
        let got = ctx.from_ndarray(&t).eval().expect("evaluates");
        assert_eq!(got.shape(), &[4, 3]);
        assert_eq!(got.to_ndarray::<f32>().expect("f32"), t.to_owned());
        let mut f = ndarray::Array2::<f32>::zeros((3, 4).f());
        f.assign(&a.view().into_dimensionality::<ndarray::Ix2>().expect("2-d"));
        assert!(!f.is_standard_layout());
        let got = ctx
            .from_ndarray(&f)
            .eval()
            .expect("evaluates")
            .to_vec::<f32>()
            .expect("f32");
        assert_eq!(got, (0..12).map(|v| v as f32).collect::<Vec<_>>());
        // A reversed, stepped slice of a 3-d array: negative and non-unit strides.
        let c = Array3::from_shape_fn((4, 5, 6), |(i, j, k)| (i * 100 + j * 10 + k) as i32);
        let v = c.slice(s![..;-1, 1..5;2, ..;3]);
        let got = ctx.from_ndarray(&v).eval().expect("evaluates");
        assert_eq!(
            got.to_ndarray::<i32>().expect("i32"),
            v.to_owned().into_dyn()
        );
        // And the tensor computes with it like any other.
        let y = (ctx.from_ndarray(&t) * 2.0).eval().expect("evaluates");
        assert_eq!(y.to_ndarray::<f32>().expect("f32"), t.mapv(|x| x * 2.0));
    }

    #[test]
    fn asking_for_another_element_type_is_an_error() {
        let a = Context::new().ones(&[2]).eval().expect("evaluates");
        let e = a.to_ndarray::<f64>().expect_err("f32 array");
        assert!(
            e.to_string()
                .starts_with("to_ndarray::<f64>() on an array of f32"),
            "{e}"
        );
    }
}
