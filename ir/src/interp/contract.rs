//! The reference matrix product: sums in f64 (rounded once to the result dtype) or, for
//! integers, sums that wrap at the result's width, as numpy's integer matmul does.

use super::vals::{Tensor, Vals};
use super::views::Offsets;
use crate::dtype::DType;
use crate::kernel::Contraction;
use crate::round::{round_f64, wrap_int};
use crate::shape::Shape;

/// `a @ b` for operands of rank >= 2 whose batch axes broadcast to `out`'s.
pub(super) fn matmul(a: &Tensor, b: &Tensor, out: &Shape, dtype: DType) -> Vals {
    let (ad, bd, od) = (a.shape.dims(), b.shape.dims(), out.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = &od[..od.len() - 2];
    let nbatch: usize = batch.iter().product();
    // Element offset of each output batch position in an operand whose batch axes
    // broadcast to `batch` (right-aligned; an extent-1 axis stays at index 0).
    let batch_offset = |dims: &[usize], mat: usize, pos: usize| -> usize {
        let own = &dims[..dims.len() - 2];
        let (mut rest, mut off, mut stride) = (pos, 0, mat);
        for (i, &d) in batch.iter().enumerate().rev() {
            let idx = rest % d;
            rest /= d;
            let j = i as isize - (batch.len() - own.len()) as isize;
            if j >= 0 {
                let e = own[j as usize];
                if e != 1 {
                    off += idx * stride;
                }
                stride *= e;
            }
        }
        off
    };
    match (&a.vals, &b.vals) {
        (Vals::F(x), Vals::F(y)) => {
            let mut out = Vec::with_capacity(nbatch * m * n);
            for p in 0..nbatch {
                let (xa, yb) = (batch_offset(ad, m * k, p), batch_offset(bd, k * n, p));
                for i in 0..m {
                    for j in 0..n {
                        let s: f64 = (0..k).map(|l| x[xa + i * k + l] * y[yb + l * n + j]).sum();
                        out.push(round_f64(s, dtype));
                    }
                }
            }
            Vals::F(out)
        }
        (Vals::I(x), Vals::I(y)) => {
            let mut out = Vec::with_capacity(nbatch * m * n);
            for p in 0..nbatch {
                let (xa, yb) = (batch_offset(ad, m * k, p), batch_offset(bd, k * n, p));
                for i in 0..m {
                    for j in 0..n {
                        let s = (0..k).fold(0i64, |s, l| {
                            s.wrapping_add(x[xa + i * k + l].wrapping_mul(y[yb + l * n + j]))
                        });
                        out.push(wrap_int(s, dtype));
                    }
                }
            }
            Vals::I(out)
        }
        _ => panic!(
            "matmul of {} and {} passed inference (a bug)",
            a.dtype, b.dtype
        ),
    }
}

/// The product buffer of a kernel's contraction from its operand buffers, read through
/// the contraction's views: sums in f64 rounded once to the product's dtype (integers
/// wrap), row-major over `[batch..., M, N]`.
pub(super) fn product(c: &Contraction, bufs: &[Vals]) -> Vals {
    let (nbatch, m, n, k) = c.extents();
    let lhs = bufs[c.lhs].gather(Offsets::of_view(&c.lhs_view));
    let rhs = bufs[c.rhs].gather(Offsets::of_view(&c.rhs_view));
    match (&lhs, &rhs) {
        (Vals::F(x), Vals::F(y)) => {
            let mut out = Vec::with_capacity(nbatch * m * n);
            for p in 0..nbatch {
                let (xa, yb) = (p * m * k, p * k * n);
                for i in 0..m {
                    for j in 0..n {
                        let s: f64 = (0..k).map(|l| x[xa + i * k + l] * y[yb + l * n + j]).sum();
                        out.push(round_f64(s, c.dtype));
                    }
                }
            }
            Vals::F(out)
        }
        (Vals::I(x), Vals::I(y)) => {
            let mut out = Vec::with_capacity(nbatch * m * n);
            for p in 0..nbatch {
                let (xa, yb) = (p * m * k, p * k * n);
                for i in 0..m {
                    for j in 0..n {
                        let s = (0..k).fold(0i64, |s, l| {
                            s.wrapping_add(x[xa + i * k + l].wrapping_mul(y[yb + l * n + j]))
                        });
                        out.push(wrap_int(s, c.dtype));
                    }
                }
            }
            Vals::I(out)
        }
        _ => panic!("a contraction of mixed kinds passed Kernel::check (a bug)"),
    }
}
