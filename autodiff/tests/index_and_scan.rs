//! The rules of the indexed and running ops (gather, scatter-add, concat, pad, cumsum,
//! cumprod) against central finite differences in f64 on the reference interpreter
//! (step and tolerance in `common`), plus exact sums for repeated reads and cumprod's
//! rows with zeros.

mod common;

use common::{Case, Rng};
use ndfuse_ir::{DType, NodeId, Op, PadMode, ReduceOp, Scalar, ScanOp, UnaryOp};

/// `(x shape, axis, idx shape, idx values)` for gather and scatter-add.
type IndexCase = (&'static [usize], usize, &'static [usize], &'static [i64]);

/// `(x shape, widths)` for pad.
type PadCase = (&'static [usize], &'static [(usize, usize)]);

/// An integer input of `shape` holding `vals` (row-major).
fn indices(c: &mut Case, dt: DType, shape: &[usize], vals: &[i64]) -> NodeId {
    let mut it = vals.iter();
    c.input_of(dt, shape, &mut || {
        *it.next().expect("one value per position") as f64
    })
}

/// An f64 input of `shape` holding `vals` (row-major).
fn values(c: &mut Case, shape: &[usize], vals: &[f64]) -> NodeId {
    let mut it = vals.iter();
    c.input(shape, || *it.next().expect("one value per position"))
}

#[test]
fn gather_with_negative_and_duplicate_indices() {
    // Every case repeats and wraps some index.
    let cases: [IndexCase; 4] = [
        (&[5], 0, &[7], &[0, -1, 4, 0, 2, -5, 0]),
        (
            &[3, 4],
            1,
            &[3, 5],
            &[0, 1, -1, 1, 3, 2, 2, 2, -4, 0, -2, 3, 0, 3, -1],
        ),
        (&[4, 2], 0, &[3, 2], &[3, -1, 0, 0, -4, 1]),
        (&[2, 3, 2], 1, &[2, 2, 2], &[2, -3, 0, 0, -1, 1, 1, 1]),
    ];
    for (k, (xs, axis, is, iv)) in cases.into_iter().enumerate() {
        for dt in [DType::I64, DType::I32] {
            let mut rng = Rng(k as u64 + 3);
            let mut c = Case::new();
            let x = c.input(xs, || rng.uniform(-2.0, 2.0));
            let idx = indices(&mut c, dt, is, iv);
            let y = c.op(Op::Gather { axis }, &[x, idx]);
            let y = c.un(UnaryOp::Sin, y);
            let l = c.weighted_loss(y, &mut rng);
            c.check(
                &format!("gather {xs:?} axis {axis} by {dt} {iv:?}"),
                l,
                &[x],
            );
        }
    }
}

#[test]
fn gather_sums_the_gradient_of_every_read() {
    let mut c = Case::new();
    let x = values(&mut c, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let idx = indices(&mut c, DType::I64, &[5], &[0, 0, -1, 2, -4]);
    let y = c.op(Op::Gather { axis: 0 }, &[x, idx]);
    let l = c.reduce(ReduceOp::Sum, y, &[0], false);
    assert_eq!(c.grads(l, &[x]), vec![vec![3.0, 0.0, 1.0, 1.0]]);
}

#[test]
fn sorting_through_argsort_and_gather_routes_the_gradient_back() {
    let mut rng = Rng(21);
    let mut c = Case::new();
    let x = c.input(&[3, 5], || rng.uniform(-2.0, 2.0));
    let order = c.op(
        Op::Argsort {
            axis: 1,
            descending: true,
            k: 3,
        },
        &[x],
    );
    let top = c.op(Op::Gather { axis: 1 }, &[x, order]);
    let top = c.un(UnaryOp::Square, top);
    let l = c.weighted_loss(top, &mut rng);
    c.check("top 3 of [3, 5] by argsort and gather", l, &[x]);
}

#[test]
fn scatter_add_to_both_the_data_and_the_values() {
    let cases: [IndexCase; 3] = [
        (&[4], 0, &[6], &[0, 3, -1, 0, 1, 0]),
        (&[4, 3], 0, &[2, 3], &[1, -1, 1, 1, 0, -4]),
        (
            &[2, 3, 2],
            2,
            &[2, 3, 3],
            &[0, 1, 1, -1, 0, -2, 1, 1, 1, 0, 0, 0, -1, 0, 1, 1, -2, 0],
        ),
    ];
    for (k, (xs, axis, is, iv)) in cases.into_iter().enumerate() {
        for dt in [DType::I64, DType::I32] {
            let mut rng = Rng(k as u64 + 30);
            let mut c = Case::new();
            let x = c.input(xs, || rng.uniform(-2.0, 2.0));
            let idx = indices(&mut c, dt, is, iv);
            let v = c.input(is, || rng.uniform(-2.0, 2.0));
            let y = c.op(Op::ScatterAdd { axis }, &[x, idx, v]);
            let y = c.un(UnaryOp::Sin, y);
            let l = c.weighted_loss(y, &mut rng);
            c.check(
                &format!("scatter_add {xs:?} axis {axis} by {dt} {iv:?}"),
                l,
                &[x, v],
            );
        }
    }
}

#[test]
fn concat_gives_each_part_its_range() {
    let cases: [(usize, &[&[usize]]); 4] = [
        (0, &[&[3], &[1], &[4]]),
        (1, &[&[2, 3], &[2, 1], &[2, 2]]),
        (0, &[&[2, 3], &[1, 3]]),
        (2, &[&[2, 1, 2], &[2, 1, 3], &[2, 1, 1], &[2, 1, 2]]),
    ];
    for (k, (axis, shapes)) in cases.into_iter().enumerate() {
        let mut rng = Rng(k as u64 + 50);
        let mut c = Case::new();
        let parts: Vec<NodeId> = shapes
            .iter()
            .map(|s| c.input(s, || rng.uniform(-2.0, 2.0)))
            .collect();
        let y = c.op(
            Op::Concat {
                axis,
                parts: parts.len(),
            },
            &parts,
        );
        let y = c.un(UnaryOp::Sin, y);
        let l = c.weighted_loss(y, &mut rng);
        c.check(&format!("concat {shapes:?} axis {axis}"), l, &parts);
    }
    // The same operand twice gets both ranges.
    let mut rng = Rng(57);
    let mut c = Case::new();
    let a = c.input(&[2, 3], || rng.uniform(-2.0, 2.0));
    let y = c.op(Op::Concat { axis: 1, parts: 2 }, &[a, a]);
    let y = c.un(UnaryOp::Sin, y);
    let l = c.weighted_loss(y, &mut rng);
    c.check("concat [a, a]", l, &[a]);
}

#[test]
fn pad_in_every_mode() {
    let cases: [PadCase; 6] = [
        (&[4], &[(2, 3)]),
        (&[3, 4], &[(1, 2), (0, 0)]),
        (&[3, 4], &[(2, 0), (3, 1)]),
        (&[2, 3, 4], &[(1, 1), (2, 2), (0, 3)]),
        (&[5], &[(4, 4)]),
        (&[1, 2], &[(0, 0), (1, 1)]),
    ];
    for mode in [PadMode::Constant, PadMode::Edge, PadMode::Reflect] {
        for (k, (xs, widths)) in cases.into_iter().enumerate() {
            // Reflect allows at most n - 1 on each side.
            let widths: Vec<(usize, usize)> = widths
                .iter()
                .zip(xs.iter())
                .map(|(&(lo, hi), &n)| match mode {
                    PadMode::Reflect => (lo.min(n - 1), hi.min(n - 1)),
                    _ => (lo, hi),
                })
                .collect();
            let mut rng = Rng(k as u64 + 70);
            let mut c = Case::new();
            let x = c.input(xs, || rng.uniform(-2.0, 2.0));
            let value = if mode == PadMode::Constant {
                Scalar::F(1.5)
            } else {
                Scalar::F(0.0)
            };
            let y = c.op(
                Op::Pad {
                    widths: widths.clone(),
                    mode,
                    value,
                },
                &[x],
            );
            let y = c.un(UnaryOp::Sin, y);
            let l = c.weighted_loss(y, &mut rng);
            c.check(
                &format!("pad {} {xs:?} by {widths:?}", mode.name()),
                l,
                &[x],
            );
        }
    }
}

#[test]
fn pad_sums_onto_each_repeated_source() {
    // [a, b, c] padded by (2, 2): edge reads a a [a b c] c c, reflect c b [a b c] b a.
    for (mode, want) in [
        (PadMode::Edge, vec![3.0, 1.0, 3.0]),
        (PadMode::Reflect, vec![2.0, 3.0, 2.0]),
        (PadMode::Constant, vec![1.0, 1.0, 1.0]),
    ] {
        let mut c = Case::new();
        let x = values(&mut c, &[3], &[1.0, 2.0, 3.0]);
        let y = c.op(
            Op::Pad {
                widths: vec![(2, 2)],
                mode,
                value: Scalar::F(0.0),
            },
            &[x],
        );
        let l = c.reduce(ReduceOp::Sum, y, &[0], false);
        assert_eq!(c.grads(l, &[x]), vec![want], "{}", mode.name());
    }
}

fn scan_case(op: ScanOp, xs: &[usize], axis: usize, reverse: bool, x_vals: &[f64], seed: u64) {
    let mut rng = Rng(seed);
    let mut c = Case::new();
    let x = values(&mut c, xs, x_vals);
    let y = c.op(Op::Scan { op, axis, reverse }, &[x]);
    let y = c.un(UnaryOp::Sin, y);
    let l = c.weighted_loss(y, &mut rng);
    let dir = if reverse { "reverse" } else { "forward" };
    c.check(
        &format!("{} {dir} {xs:?} axis {axis} of {x_vals:?}", op.name()),
        l,
        &[x],
    );
}

#[test]
fn cumsum_forward_and_reverse() {
    let shapes: [(&[usize], usize); 4] = [(&[5], 0), (&[3, 4], 0), (&[3, 4], 1), (&[2, 3, 2], 1)];
    for (k, (xs, axis)) in shapes.into_iter().enumerate() {
        for reverse in [false, true] {
            let mut rng = Rng(k as u64 + 90);
            let n: usize = xs.iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
            scan_case(ScanOp::Sum, xs, axis, reverse, &v, k as u64 + 1);
        }
    }
}

#[test]
fn cumprod_without_zeros() {
    let shapes: [(&[usize], usize); 4] = [(&[5], 0), (&[3, 4], 0), (&[3, 4], 1), (&[2, 3, 2], 1)];
    for (k, (xs, axis)) in shapes.into_iter().enumerate() {
        for reverse in [false, true] {
            let mut rng = Rng(k as u64 + 110);
            let n: usize = xs.iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.away_from_zero()).collect();
            scan_case(ScanOp::Prod, xs, axis, reverse, &v, k as u64 + 1);
        }
    }
}

#[test]
fn cumprod_with_zeros_in_the_row() {
    // Rows of 5 with zeros at these positions: one (first, middle, last), two (apart,
    // adjacent, at both ends), three, and all.
    let zero_sets: [&[usize]; 9] = [
        &[0],
        &[2],
        &[4],
        &[1, 3],
        &[2, 3],
        &[0, 4],
        &[0, 1],
        &[0, 2, 4],
        &[0, 1, 2, 3, 4],
    ];
    for (k, zeros) in zero_sets.into_iter().enumerate() {
        for reverse in [false, true] {
            let mut rng = Rng(k as u64 + 130);
            let row = |rng: &mut Rng| -> Vec<f64> {
                (0..5)
                    .map(|i| {
                        if zeros.contains(&i) {
                            0.0
                        } else {
                            rng.away_from_zero()
                        }
                    })
                    .collect()
            };
            // Along a row of 5 alone, and along axis 1 of [2, 5, 2] beside rows with
            // other zeros or none.
            scan_case(ScanOp::Prod, &[5], 0, reverse, &row(&mut rng), k as u64 + 7);
            let mut v = vec![0.0; 20];
            let plain: Vec<f64> = (0..5).map(|_| rng.away_from_zero()).collect();
            let mirrored: Vec<f64> = row(&mut rng).into_iter().rev().collect();
            let lanes = [row(&mut rng), plain, mirrored, row(&mut rng)];
            for (lane, vals) in lanes.iter().enumerate() {
                let (o, i) = (lane / 2, lane % 2);
                for (j, &a) in vals.iter().enumerate() {
                    v[(o * 5 + j) * 2 + i] = a;
                }
            }
            scan_case(ScanOp::Prod, &[2, 5, 2], 1, reverse, &v, k as u64 + 8);
        }
    }
}

#[test]
fn cumprod_at_zeros_exactly() {
    // y = cumprod([2, 0, 3, 0, 5]) = [2, 0, 0, 0, 0]; with g = 1 everywhere:
    // dx_0 = 1 (only y_0 keeps x_1 = 0 out), dx_1 = 2 + 2*3 + 0 + 0 = 8 (x_0 times the
    // running products after it, through the second zero), dx_2.. = 0.
    let mut c = Case::new();
    let x = values(&mut c, &[5], &[2.0, 0.0, 3.0, 0.0, 5.0]);
    let y = c.op(
        Op::Scan {
            op: ScanOp::Prod,
            axis: 0,
            reverse: false,
        },
        &[x],
    );
    let l = c.reduce(ReduceOp::Sum, y, &[0], false);
    assert_eq!(c.grads(l, &[x]), vec![vec![1.0, 8.0, 0.0, 0.0, 0.0]]);
    // The same backwards: y = [0, 0, 0, 0, 5] from the end, dx_4 = 1, dx_3 = 5 + 15 = 20.
    let y = c.op(
        Op::Scan {
            op: ScanOp::Prod,
            axis: 0,
            reverse: true,
        },
        &[x],
    );
    let l = c.reduce(ReduceOp::Sum, y, &[0], false);
    assert_eq!(c.grads(l, &[x]), vec![vec![0.0, 0.0, 0.0, 20.0, 1.0]]);
    // All zeros: only the first position's own term survives, and no NaN appears.
    let z = values(&mut c, &[2, 3], &[0.0; 6]);
    let y = c.op(
        Op::Scan {
            op: ScanOp::Prod,
            axis: 1,
            reverse: false,
        },
        &[z],
    );
    let l = c.reduce(ReduceOp::Sum, y, &[0, 1], false);
    assert_eq!(c.grads(l, &[z]), vec![vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0]]);
}
