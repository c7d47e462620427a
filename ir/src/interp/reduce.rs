//! Reductions (sum, mean, max, norms, variance...) and arg-reductions over the lanes of
//! a contiguous tensor.

use super::elementwise::cast;
use super::scalar::{max_f64, min_f64};
use super::vals::Vals;
use super::views::Offsets;
use crate::dtype::DType;
use crate::op::{ArgReduceOp, ReduceOp};
use crate::round::wrap_int;
use crate::shape::Shape;
use std::borrow::Cow;

/// Neumaier's compensated sum: the rounding error of each addition is carried in `c`.
/// It starts from +0.0, as a backend's accumulator does, so a sum of -0.0s is +0.0.
#[derive(Default)]
struct Neumaier {
    sum: f64,
    c: f64,
}

impl Neumaier {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.c += (self.sum - t) + x;
        } else {
            self.c += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn total(&self) -> f64 {
        // Once the sum is inf or NaN the compensation is inf - inf garbage; the plain
        // sum already has the IEEE answer.
        if self.sum.is_finite() {
            self.sum + self.c
        } else {
            self.sum
        }
    }

    fn of(xs: impl Iterator<Item = f64>) -> f64 {
        let mut s = Neumaier::default();
        xs.for_each(|x| s.add(x));
        s.total()
    }
}

/// sqrt(sum x^2), scaled by a power of two near max |x| so that the squares neither
/// overflow nor underflow; the scaling is exact.
fn norm2(lane: &[f64]) -> f64 {
    if lane.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let big = lane.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if big == f64::INFINITY || big == 0.0 {
        return big;
    }
    let k = (big.log2().floor() as i32).clamp(-1022, 1023);
    let scale = 2f64.powi(k);
    Neumaier::of(lane.iter().map(|&x| (x / scale) * (x / scale))).sqrt() * scale
}

/// Population variance, two passes: the mean, then the mean of squared deviations.
fn variance(lane: &[f64]) -> f64 {
    let n = lane.len() as f64;
    let mean = Neumaier::of(lane.iter().copied()) / n;
    Neumaier::of(lane.iter().map(|&x| (x - mean) * (x - mean))) / n
}

/// One float reduction of a lane (unrounded).
pub(super) fn reduce_f64(op: ReduceOp, lane: &[f64]) -> f64 {
    let n = lane.len() as f64;
    match op {
        ReduceOp::Sum => Neumaier::of(lane.iter().copied()),
        // An empty lane is 0 / 0 = NaN.
        ReduceOp::Mean => Neumaier::of(lane.iter().copied()) / n,
        // Empty max/min is rejected when the graph is built; NaN is the honest value.
        ReduceOp::Max => lane.iter().copied().reduce(max_f64).unwrap_or(f64::NAN),
        ReduceOp::Min => lane.iter().copied().reduce(min_f64).unwrap_or(f64::NAN),
        ReduceOp::Prod => lane.iter().product(),
        ReduceOp::Norm1 => Neumaier::of(lane.iter().map(|x| x.abs())),
        ReduceOp::Norm2 => norm2(lane),
        ReduceOp::Var => variance(lane),
        ReduceOp::Std => variance(lane).sqrt(),
    }
}

/// One integer reduction of a lane (sum, prod, max, min), wrapping in i64.
pub(super) fn reduce_i64(op: ReduceOp, lane: &[i64]) -> i64 {
    match op {
        ReduceOp::Prod => lane.iter().fold(1i64, |a, &x| a.wrapping_mul(x)),
        // Empty max/min is rejected when the graph is built.
        ReduceOp::Max => lane.iter().copied().max().unwrap_or(0),
        ReduceOp::Min => lane.iter().copied().min().unwrap_or(0),
        _ => lane.iter().fold(0i64, |a, &x| a.wrapping_add(x)),
    }
}

/// The kept and reduced parts of a contiguous layout of `dims`: (dims, strides) of the
/// axes not in `axes`, then of the axes in `axes`, each in axis order.
type Split = ((Vec<usize>, Vec<isize>), (Vec<usize>, Vec<isize>));

fn split_axes(shape: &Shape, axes: &[usize]) -> Split {
    let strides = shape.contiguous_strides();
    let (mut kept, mut red) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for (a, (&d, &s)) in shape.dims().iter().zip(&strides).enumerate() {
        let part = if axes.contains(&a) {
            &mut red
        } else {
            &mut kept
        };
        part.0.push(d);
        part.1.push(s);
    }
    (kept, red)
}

/// Reduces a contiguous tensor of `shape` over `axes`; output elements come in
/// row-major order of the kept axes (the same with or without keepdims).
pub(super) fn reduce(op: ReduceOp, x: &Vals, shape: &Shape, axes: &[usize], out: DType) -> Vals {
    let ((kd, ks), (rd, rs)) = split_axes(shape, axes);
    // Offsets of a lane's elements from its first one, shared by every lane.
    let rel: Vec<usize> = Offsets::new(&rd, &rs, 0).collect();
    let int_path = matches!(
        op,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min
    );
    let ints: Option<Cow<'_, [i64]>> = match x {
        Vals::I(v) if int_path => Some(Cow::Borrowed(v)),
        Vals::B(v) if int_path => Some(Cow::Owned(Vals::bools_as_ints(v))),
        _ => None,
    };
    if let Some(v) = ints {
        let mut lane = Vec::new();
        let r = Offsets::new(&kd, &ks, 0)
            .map(|base| {
                lane.clear();
                lane.extend(rel.iter().map(|&o| v[base + o]));
                wrap_int(reduce_i64(op, &lane), out)
            })
            .collect();
        // Max/min of bools (never built) would come back as 0/1 ints: cast them.
        return cast(&Vals::I(r), out, out);
    }
    let v: Cow<'_, [f64]> = match x {
        Vals::F(v) => Cow::Borrowed(v),
        _ => Cow::Owned(x.to_f64s()),
    };
    let mut lane = Vec::new();
    let r = Offsets::new(&kd, &ks, 0)
        .map(|base| {
            lane.clear();
            lane.extend(rel.iter().map(|&o| v[base + o]));
            reduce_f64(op, &lane)
        })
        .collect();
    cast(&Vals::F(r), out, out)
}

/// Index of the first maximum (or minimum) of a lane, or of its first NaN.
pub(super) fn arg_f64(op: ArgReduceOp, lane: impl Iterator<Item = f64>) -> i64 {
    let mut best: Option<(usize, f64)> = None;
    for (i, x) in lane.enumerate() {
        if x.is_nan() {
            return i as i64;
        }
        let better = match (best, op) {
            (None, _) => true,
            (Some((_, b)), ArgReduceOp::ArgMax) => x > b,
            (Some((_, b)), ArgReduceOp::ArgMin) => x < b,
        };
        if better {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as i64)
}

/// Index of the first maximum (or minimum) of a lane of integers.
pub(super) fn arg_i64(op: ArgReduceOp, lane: impl Iterator<Item = i64>) -> i64 {
    let mut best: Option<(usize, i64)> = None;
    for (i, x) in lane.enumerate() {
        let better = match (best, op) {
            (None, _) => true,
            (Some((_, b)), ArgReduceOp::ArgMax) => x > b,
            (Some((_, b)), ArgReduceOp::ArgMin) => x < b,
        };
        if better {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as i64)
}

/// argmax/argmin of a contiguous tensor of `shape` along `axis`.
pub(super) fn arg_reduce(op: ArgReduceOp, x: &Vals, shape: &Shape, axis: usize) -> Vals {
    let ((kd, ks), (rd, rs)) = split_axes(shape, &[axis]);
    let lanes = Offsets::new(&kd, &ks, 0);
    let rel: Vec<usize> = Offsets::new(&rd, &rs, 0).collect();
    let lane = |base: usize| rel.iter().map(move |&o| base + o);
    Vals::I(match x {
        Vals::F(v) => lanes.map(|b| arg_f64(op, lane(b).map(|o| v[o]))).collect(),
        Vals::I(v) => lanes.map(|b| arg_i64(op, lane(b).map(|o| v[o]))).collect(),
        Vals::B(v) => lanes
            .map(|b| arg_i64(op, lane(b).map(|o| i64::from(v[o]))))
            .collect(),
    })
}
