//! The reference matrix product: sums in f64 (rounded once to the result dtype) or, for
//! integers, sums that wrap at the result's width, as numpy's integer matmul does.

use super::vals::{Tensor, Vals};
use super::views::Offsets;
use crate::dtype::DType;
use crate::kernel::{Contraction, Prologue};
use crate::round::{round_f64, wrap_int};
use crate::shape::{Shape, View};

/// `a @ b` for graph operands of rank >= 2 whose batch axes broadcast to `out`'s.
pub(super) fn matmul(a: &Tensor, b: &Tensor, out: &Shape, dtype: DType) -> Vals {
    let od = out.dims();
    let batch = &od[..od.len() - 2];
    // Each operand as a view over `[batch..., rows, cols]`: padded with leading axes,
    // then broadcast along the batch axes (stride 0), as a kernel's contraction reads it.
    let spread = |t: &Tensor| {
        let mut view = View::contiguous(t.shape.clone());
        while view.shape.rank() < od.len() {
            view = view.expand_dims(0);
        }
        let mut dims = batch.to_vec();
        dims.extend_from_slice(&view.shape.dims()[batch.len()..]);
        t.vals
            .gather(Offsets::of_view(&view.broadcast_to(&Shape::new(dims))))
    };
    let (ad, bd) = (a.shape.dims(), b.shape.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    product_of(
        &spread(a),
        &spread(b),
        batch.iter().product(),
        (m, n, k),
        dtype,
    )
}

/// The product buffer of a kernel's contraction from its operand buffers, read through
/// the contraction's views, row-major over `[batch..., M, N]` in the product's dtype.
/// Each operand element goes through its prologue steps first (`dtypes`: the dtype of
/// each buffer).
pub(super) fn product(c: &Contraction, bufs: &[Vals], dtypes: &[DType]) -> Vals {
    let (nbatch, m, n, k) = c.extents();
    let operand = |input: usize, view: &View, steps: &[Prologue]| {
        let vals = bufs[input].gather(Offsets::of_view(view));
        match (vals, steps.is_empty()) {
            (Vals::F(v), false) => Vals::F(
                v.into_iter()
                    .map(|x| {
                        steps
                            .iter()
                            .fold((x, dtypes[input]), |(x, d), s| s.apply(x, d))
                            .0
                    })
                    .collect(),
            ),
            (vals, _) => vals,
        }
    };
    let lhs = operand(c.lhs, &c.lhs_view, &c.lhs_prologue);
    let rhs = operand(c.rhs, &c.rhs_view, &c.rhs_prologue);
    product_of(&lhs, &rhs, nbatch, (m, n, k), c.dtype)
}

/// `nbatch` products of contiguous `[M, K]` and `[K, N]` matrices: f64 sums rounded
/// once to `dtype`, or wrapping integer sums.
fn product_of(
    x: &Vals,
    y: &Vals,
    nbatch: usize,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
) -> Vals {
    let cells = (0..nbatch).flat_map(|p| (0..m).flat_map(move |i| (0..n).map(move |j| (p, i, j))));
    // The `l`-th term of cell (p, i, j): its offsets into the two operands.
    let at = move |(p, i, j): (usize, usize, usize), l: usize| {
        (p * m * k + i * k + l, p * k * n + l * n + j)
    };
    match (x, y) {
        (Vals::F(x), Vals::F(y)) => Vals::F(
            cells
                .map(|c| {
                    // From +0.0, as BLAS and numpy do: `Iterator::sum` starts at -0.0,
                    // so an empty (K = 0) or all -0.0 sum would come out as -0.0.
                    let s = (0..k)
                        .map(|l| at(c, l))
                        .fold(0.0, |s, (u, v)| s + x[u] * y[v]);
                    round_f64(s, dtype)
                })
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) => Vals::I(
            cells
                .map(|c| {
                    let s = (0..k)
                        .map(|l| at(c, l))
                        .fold(0i64, |s, (u, v)| s.wrapping_add(x[u].wrapping_mul(y[v])));
                    wrap_int(s, dtype)
                })
                .collect(),
        ),
        _ => panic!("a matmul of mixed or bool operands passed inference (a bug)"),
    }
}
