//! Tensors made from data and constants in a context: from vectors and arrays, scalars,
//! fills, ranges and seeded random tensors (in the context's default dtype), and the
//! counter-based random op with its key.

use crate::array::Array;
use crate::context::Context;
use crate::error::{shape_bytes, try_storage, Error, Result};
use crate::index::iota_at;
use crate::random::SplitMix64;
use crate::tensor::Tensor;
use ndfuse_ir::{DType, Element, HostArray, Op, Scalar, Shape, Storage};
use std::panic::Location;

impl Context {
    /// A tensor holding `data` (row-major) with `shape`; `Err` when the element count
    /// does not match. The dtype is `T`'s (`f32` -> F32, `half::f16` -> F16, ...).
    #[track_caller]
    pub fn from_vec<T: Element>(&self, data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        // Taken here: a closure would report its own location, not the caller's.
        let at = Location::caller();
        let shape = Shape::from(shape);
        let count = data.len();
        let arr = HostArray::new(shape.clone(), T::into_storage(data)).ok_or_else(|| {
            Error::ElementCount {
                what: "from_vec",
                count,
                shape: shape.clone(),
                expected: shape.numel(),
                at,
            }
        })?;
        Ok(Tensor::leaf(self, arr))
    }

    /// Like [`Context::from_vec`], copying from a slice.
    #[track_caller]
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        self.from_vec(data.to_vec(), shape)
    }

    /// A tensor of an evaluated array's data (to feed results back in).
    pub fn from_array(&self, a: &Array) -> Tensor {
        Tensor::leaf(self, a.0.clone())
    }

    /// A tensor of an evaluated array's data, moved, not copied: what a training loop
    /// uses to feed a step's results into the next step without a copy (a buffer of the
    /// host cache goes back to it when the last tensor over it drops).
    pub fn tensor(&self, a: Array) -> Tensor {
        Tensor::leaf(self, a.0)
    }

    /// A scalar (shape `[]`) of the default dtype.
    pub fn scalar(&self, value: f64) -> Tensor {
        Tensor::constant(
            self,
            Scalar::F(value),
            self.default_dtype(),
            Shape::scalar(),
        )
    }

    /// `shape` filled with `value`, of the default dtype.
    pub fn full(&self, shape: &[usize], value: f64) -> Tensor {
        self.full_dtype(shape, value, self.default_dtype())
    }

    /// `shape` filled with `value` converted to `dtype` (numpy's cast rules). Nothing is
    /// allocated until `eval`; a shape whose byte size exceeds the address space gives a
    /// tensor carrying [`Error::OutOfMemory`].
    pub fn full_dtype(&self, shape: &[usize], value: f64, dtype: DType) -> Tensor {
        if shape_bytes(shape, dtype) > isize::MAX as u128 {
            return Tensor::poisoned(
                self,
                Error::OutOfMemory {
                    bytes: shape_bytes(shape, dtype),
                    what: format!("full {dtype}{}", Shape::from(shape)),
                },
            );
        }
        Tensor::constant(self, Scalar::F(value), dtype, Shape::from(shape))
    }

    /// Zeros of the default dtype.
    pub fn zeros(&self, shape: &[usize]) -> Tensor {
        self.full(shape, 0.0)
    }

    /// Ones of the default dtype.
    pub fn ones(&self, shape: &[usize]) -> Tensor {
        self.full(shape, 1.0)
    }

    /// `start, start + step, ...` below `stop` (above it for a negative step), like
    /// numpy's `arange`, of the default dtype. `Err` for a zero or non-finite step.
    #[track_caller]
    pub fn arange(&self, start: f64, stop: f64, step: f64) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
            return Err(Error::Argument {
                what: "arange",
                why: format!("start {start}, stop {stop}, step {step}: need finite values and a non-zero step"),
                at: Location::caller(),
            });
        }
        // `as usize` saturates: a range too long to hold is refused by the allocation.
        let n = ((stop - start) / step).ceil().max(0.0) as usize;
        let dtype = self.default_dtype();
        let data = try_storage(
            dtype,
            &[n],
            || format!("arange {dtype}[{n}]"),
            |i| start + i as f64 * step,
        )?;
        Ok(self.leaf(data, Shape(vec![n])))
    }

    /// `start, start + step, ...` below `stop` (above it for a negative step) as i64,
    /// numpy's integer `arange`: `ceil((stop - start) / step)` values (none when that
    /// is not positive). Nothing is stored: every kernel that reads the values computes
    /// them from their positions. `Err` for a zero step.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let r = ctx.arange_i64(5, -2, -3)?.eval()?;
    /// assert_eq!(r.to_vec::<i64>()?, vec![5, 2, -1]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn arange_i64(&self, start: i64, stop: i64, step: i64) -> Result<Tensor> {
        let at = Location::caller();
        if step == 0 {
            return Err(Error::Argument {
                what: "arange",
                why: format!("start {start}, stop {stop}, step 0: the step must not be zero"),
                at,
            });
        }
        let (span, stride) = if step > 0 {
            (i128::from(stop) - i128::from(start), i128::from(step))
        } else {
            (i128::from(start) - i128::from(stop), -i128::from(step))
        };
        let len = if span <= 0 {
            0
        } else {
            (span + stride - 1) / stride
        };
        // `len` is below 2^64 and its last value lies between start and stop.
        let t = iota_at(self, len as usize, start, step, at);
        match t.error() {
            Some(e) => Err(e.clone()),
            None => Ok(t),
        }
    }

    /// `0, 1, ..., n - 1` as i64: numpy's `arange(n)` (see [`Context::arange_i64`]).
    #[track_caller]
    pub fn arange_n(&self, n: usize) -> Tensor {
        iota_at(self, n, 0, 1, Location::caller())
    }

    /// Uniform random values in `[low, high)` of the default dtype, from `seed`: the
    /// same seed gives the same tensor in every release. A shape too large for the
    /// memory gives a tensor carrying [`Error::OutOfMemory`] (after the host cache freed
    /// what it held).
    pub fn rand_uniform(&self, shape: &[usize], low: f64, high: f64, seed: u64) -> Tensor {
        let dtype = self.default_dtype();
        self.rand_leaf("rand_uniform", shape, dtype, uniform(low, high, seed))
    }

    /// The values [`Context::rand_uniform`] draws for `shape`, in f64 before they are
    /// rounded into a dtype: for callers that map them their own way (the command's
    /// integer and bool inputs). `Err(Error::OutOfMemory)` when they do not fit.
    pub fn rand_uniform_f64s(
        &self,
        shape: &[usize],
        low: f64,
        high: f64,
        seed: u64,
    ) -> Result<Vec<f64>> {
        let what = || format!("rand_uniform f64{}", Shape::from(shape));
        match try_storage(DType::F64, shape, what, uniform(low, high, seed))? {
            Storage::F64(v) => Ok(v),
            _ => unreachable!("try_storage of F64 gives F64 storage (a bug otherwise)"),
        }
    }

    /// Normal random values with `mean` and `std` of the default dtype, from `seed`.
    /// A shape too large for the memory gives a tensor carrying [`Error::OutOfMemory`].
    pub fn rand_normal(&self, shape: &[usize], mean: f64, std: f64, seed: u64) -> Tensor {
        let mut rng = SplitMix64::new(seed);
        let dtype = self.default_dtype();
        self.rand_leaf("rand_normal", shape, dtype, move |_| {
            mean + std * rng.next_normal()
        })
    }

    /// The key of [`Context::random_uniform_keyed`]: a 0-d i64 leaf holding `seed`'s
    /// bits. It is data, not a constant, so a training loop that makes a new key each
    /// step evaluates the same graph (no recompiling).
    pub fn key(&self, seed: u64) -> Tensor {
        self.leaf(Storage::I64(vec![seed as i64]), Shape::scalar())
    }

    /// f32 values uniform in `[0, 1)` of `shape`, computed in whatever kernel reads them
    /// from `key` (a 0-d i64 tensor, [`Context::key`]) and each element's row-major
    /// position: the same bits on every backend and thread count, and the same values
    /// whatever view a consumer reads them through (the IR's `random_uniform`; see
    /// `ndfuse_ir::op::random_uniform` for the hash). A key that is not a 0-d i64 gives
    /// a tensor carrying the error, naming its type.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let u = ctx.random_uniform_keyed(&[2, 3], &ctx.key(7));
    /// let a = u.eval()?.to_vec::<f32>()?;
    /// assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
    /// assert_eq!(a, ctx.random_uniform_keyed(&[2, 3], &ctx.key(7)).eval()?.to_vec::<f32>()?);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn random_uniform_keyed(&self, shape: &[usize], key: &Tensor) -> Tensor {
        let at = Location::caller();
        if shape_bytes(shape, DType::F32) > isize::MAX as u128 {
            return Tensor::poisoned(
                self,
                Error::OutOfMemory {
                    bytes: shape_bytes(shape, DType::F32),
                    what: format!("random_uniform f32{}", Shape::from(shape)),
                },
            );
        }
        let op = Op::RandomUniform {
            shape: Shape::from(shape),
        };
        Tensor::build(op, &[key], at)
    }

    /// A leaf of `dtype` and `shape` whose element `i` is `f(i)`, or a tensor carrying
    /// the allocation's failure.
    fn rand_leaf(
        &self,
        what: &str,
        shape: &[usize],
        dtype: DType,
        f: impl FnMut(usize) -> f64,
    ) -> Tensor {
        let shape = Shape::from(shape);
        let what = || format!("{what} {dtype}{shape}");
        match try_storage(dtype, shape.dims(), what, f) {
            Ok(data) => self.leaf(data, shape),
            Err(e) => Tensor::poisoned(self, e),
        }
    }

    fn leaf(&self, data: Storage, shape: Shape) -> Tensor {
        let arr =
            HostArray::new(shape, data).expect("value count matches the shape by construction");
        Tensor::leaf(self, arr)
    }
}

/// The stream of `rand_uniform`: element `i` is the `i`-th draw (called in order).
fn uniform(low: f64, high: f64, seed: u64) -> impl FnMut(usize) -> f64 {
    let mut rng = SplitMix64::new(seed);
    move |_| low + (high - low) * rng.next_f64()
}
