//! Orderings along one axis: running sums and products (numpy's `cumsum`, `cumprod`)
//! and stable sorts (`argsort`, `sort`, `top_k`). Each is one IR op of its own kind;
//! the values of `sort` and `top_k` are a gather of the operand through the positions
//! the sort found, so the gather fuses into whatever reads them.

use crate::error::Error;
use crate::ops::norm_axis;
use crate::tensor::Tensor;
use ndfuse_ir::{Op, ScanOp};
use std::panic::Location;

type At = &'static Location<'static>;

impl Tensor {
    /// Inclusive running sum along `axis` (numpy's `cumsum`); integers accumulate in
    /// i64, floats in their own dtype.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![1i32, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.cumsum(-1).eval()?.to_vec::<i64>()?, vec![1, 3, 3, 7]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn cumsum(&self, axis: i64) -> Tensor {
        self.scan_at(ScanOp::Sum, axis, Location::caller())
    }

    /// Inclusive running product along `axis` (numpy's `cumprod`); integers in i64.
    #[track_caller]
    pub fn cumprod(&self, axis: i64) -> Tensor {
        self.scan_at(ScanOp::Prod, axis, Location::caller())
    }

    /// The positions (i64) that sort this tensor along `axis`, ascending and stable:
    /// numpy's `argsort(kind='stable')`, NaN last.
    #[track_caller]
    pub fn argsort(&self, axis: i64) -> Tensor {
        let at = Location::caller();
        match self.sort_axis("argsort", axis, at) {
            Ok((axis, n)) => self.argsort_node(axis, false, n, at),
            Err(t) => t,
        }
    }

    /// This tensor sorted along `axis`, ascending (numpy's `sort`, NaN last).
    #[track_caller]
    pub fn sort(&self, axis: i64) -> Tensor {
        let at = Location::caller();
        match self.sort_axis("sort", axis, at) {
            Ok((axis, n)) => {
                let idx = self.argsort_node(axis, false, n, at);
                Tensor::build(Op::Gather { axis }, &[self, &idx], at)
            }
            Err(t) => t,
        }
    }

    /// The `k` largest values along the last axis, largest first, and their positions
    /// (i64): `(values, indices)`. Equal values keep their order (the first position
    /// first); NaN counts as the largest. `k` above the extent of the last axis gives
    /// two tensors carrying the error.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![1.0f32, 5.0, 3.0, 5.0], &[4])?;
    /// let (v, i) = x.top_k(2);
    /// assert_eq!(v.eval()?.to_vec::<f32>()?, vec![5.0, 5.0]);
    /// assert_eq!(i.eval()?.to_vec::<i64>()?, vec![1, 3]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn top_k(&self, k: usize) -> (Tensor, Tensor) {
        let at = Location::caller();
        let (axis, n) = match self.sort_axis("top_k", -1, at) {
            Ok(a) => a,
            Err(t) => return (t.clone(), t),
        };
        if k > n {
            let shape = self.ty().map(|t| t.to_string()).unwrap_or_default();
            let e = Tensor::poisoned(
                &self.ctx,
                Error::Argument {
                    what: "top_k",
                    why: format!(
                        "k = {k} is more than the {n} positions of the last axis (axis {axis}) of {shape}"
                    ),
                    at,
                },
            );
            return (e.clone(), e);
        }
        let idx = self.argsort_node(axis, true, k, at);
        let values = Tensor::build(Op::Gather { axis }, &[self, &idx], at);
        (values, idx)
    }

    fn scan_at(&self, op: ScanOp, axis: i64, at: At) -> Tensor {
        match self.sort_axis(op.name(), axis, at) {
            Ok((axis, _)) => Tensor::build(
                Op::Scan {
                    op,
                    axis,
                    reverse: false,
                },
                &[self],
                at,
            ),
            Err(t) => t,
        }
    }

    /// `axis` normalised and its extent, or the tensor to return (carrying the error).
    fn sort_axis(&self, op: &'static str, axis: i64, at: At) -> Result<(usize, usize), Tensor> {
        let ty = self.ty().map_err(|e| Tensor::poisoned(&self.ctx, e))?;
        let a = norm_axis(op, axis, ty.shape.rank(), &ty).map_err(|e| self.fail(e, at))?;
        Ok((a, ty.shape.dims()[a]))
    }

    fn argsort_node(&self, axis: usize, descending: bool, k: usize, at: At) -> Tensor {
        Tensor::build(
            Op::Argsort {
                axis,
                descending,
                k,
            },
            &[self],
            at,
        )
    }
}
