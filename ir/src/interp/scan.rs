//! Scans (running sums and products) and stable sorts along one axis of a contiguous
//! tensor.

use super::vals::Vals;
use crate::dtype::DType;
use crate::op::ScanOp;
use crate::round::{round_f64, wrap_int};
use crate::shape::Shape;
use std::cmp::Ordering;

/// The positions of the lanes along `axis`: for each lane, its first offset and stride.
fn lanes(shape: &Shape, axis: usize) -> (Vec<usize>, usize, usize) {
    let d = shape.dims();
    let (outer, n, inner): (usize, usize, usize) = (
        d[..axis].iter().product(),
        d[axis],
        d[axis + 1..].iter().product(),
    );
    let starts = (0..outer)
        .flat_map(|o| (0..inner).map(move |i| o * n * inner + i))
        .collect();
    (starts, n, inner)
}

/// The inclusive running `op` along `axis` (backwards when `reverse`): floats run in f64
/// and each output rounds to `dtype`; integers run in i64, wrapping.
pub(super) fn scan(
    op: ScanOp,
    x: &Vals,
    shape: &Shape,
    axis: usize,
    reverse: bool,
    dtype: DType,
) -> Vals {
    let (starts, n, stride) = lanes(shape, axis);
    let order = |s: usize| -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).map(|j| s + j * stride).collect();
        if reverse {
            v.reverse();
        }
        v
    };
    match x {
        Vals::F(v) => {
            let mut out = vec![0.0; v.len()];
            for &s in &starts {
                let mut acc = match op {
                    ScanOp::Sum => 0.0,
                    ScanOp::Prod => 1.0,
                };
                for o in order(s) {
                    acc = match op {
                        ScanOp::Sum => acc + v[o],
                        ScanOp::Prod => acc * v[o],
                    };
                    out[o] = round_f64(acc, dtype);
                }
            }
            Vals::F(out)
        }
        Vals::I(v) => {
            let mut out = vec![0; v.len()];
            for &s in &starts {
                let mut acc: i64 = match op {
                    ScanOp::Sum => 0,
                    ScanOp::Prod => 1,
                };
                for o in order(s) {
                    acc = match op {
                        ScanOp::Sum => acc.wrapping_add(v[o]),
                        ScanOp::Prod => acc.wrapping_mul(v[o]),
                    };
                    out[o] = wrap_int(acc, dtype);
                }
            }
            Vals::I(out)
        }
        Vals::B(_) => unreachable!("scans of bool are refused by infer"),
    }
}

/// numpy's order of floats: NaN after everything (every NaN equal).
pub fn total_order_f64(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        // -0 and +0 compare equal, as in numpy.
        _ => a.partial_cmp(&b).expect("neither is NaN"),
    }
}

/// The first `k` positions along `axis` that sort each lane stably (ties in increasing
/// position); `descending` reverses the order of values, not of ties.
pub(super) fn argsort(x: &Vals, shape: &Shape, axis: usize, descending: bool, k: usize) -> Vals {
    let (starts, n, stride) = lanes(shape, axis);
    let d = shape.dims();
    let inner: usize = d[axis + 1..].iter().product();
    let mut out = vec![0i64; starts.len() * k];
    for (li, &s) in starts.iter().enumerate() {
        let mut pos: Vec<usize> = (0..n).collect();
        let cmp = |a: &usize, b: &usize| -> Ordering {
            let (oa, ob) = (s + a * stride, s + b * stride);
            let o = match x {
                Vals::F(v) => total_order_f64(v[oa], v[ob]),
                Vals::I(v) => v[oa].cmp(&v[ob]),
                Vals::B(v) => v[oa].cmp(&v[ob]),
            };
            if descending {
                o.reverse()
            } else {
                o
            }
        };
        pos.sort_by(cmp);
        // Lane li is (outer o, inner i); its output lane has extent k.
        let (o, i) = (li / inner.max(1), li % inner.max(1));
        for (j, &p) in pos.iter().take(k).enumerate() {
            out[(o * k + j) * inner + i] = p as i64;
        }
    }
    Vals::I(out)
}
