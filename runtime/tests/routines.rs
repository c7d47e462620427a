//! The native routines of scatter-add, scans and argsort against the reference
//! interpreter (`eval_node`): argsort and integer results bit for bit, float results
//! within the bounds their accumulation allows, on many shapes; and the same bits on
//! rayon pools of 1, 2 and 4 threads.

use ndfuse_ir::interp::{eval_node, InterpError};
use ndfuse_ir::{DType, Graph, HostArray, Node, Op, ScanOp, Shape, Storage};
use ndfuse_runtime::{run_routine, RuntimeError, RADIX_MIN, SCAN_BLOCK};
use std::collections::HashMap;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The node `op` applied to inputs of the operands' types.
fn node(op: Op, operands: &[&HostArray]) -> Node {
    let mut g = Graph::new();
    let ids: Vec<_> = operands
        .iter()
        .enumerate()
        .map(|(i, a)| g.add_input(format!("a{i}"), a.dtype(), a.shape().clone()))
        .collect();
    let id = g.add(op, &ids).expect("a well-typed node");
    g.node(id).clone()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool")
}

/// The routine's result on a pool of `threads`.
fn native(n: &Node, args: &[&HostArray], threads: usize) -> Result<HostArray, RuntimeError> {
    pool(threads).install(|| run_routine(n, args).expect("the op has a routine"))
}

/// Every element's bits (NaN payloads and -0 included).
fn bits(a: &HostArray) -> Vec<u64> {
    match a.storage() {
        Storage::F16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::BF16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
        Storage::I32(v) => v.iter().map(|&x| x as u64).collect(),
        Storage::I64(v) => v.iter().map(|&x| x as u64).collect(),
        Storage::Bool(v) => v.iter().map(|&x| u64::from(x)).collect(),
    }
}

/// The routine on 1, 2 and 4 threads, checked to give the same bits (or the same
/// error) on each; the 1-thread result.
fn deterministic(n: &Node, args: &[&HostArray]) -> Result<HostArray, RuntimeError> {
    let one = native(n, args, 1);
    for t in [2, 4] {
        let other = native(n, args, t);
        match (&one, &other) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.shape(), b.shape());
                assert_eq!(a.dtype(), b.dtype());
                assert!(
                    bits(a) == bits(b),
                    "{} of {:?}: 1 and {t} threads differ",
                    n.op.name(),
                    args[0].shape()
                );
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("1 and {t} threads disagree on failing"),
        }
    }
    one
}

/// Random values of `dtype`: floats in [lo, hi), integers in [lo, hi) truncated.
fn random(dtype: DType, dims: &[usize], lo: f64, hi: f64, rng: &mut Rng) -> HostArray {
    let shape = Shape::new(dims.to_vec());
    let vals: Vec<f64> = (0..shape.numel())
        .map(|_| {
            let v = rng.uniform(lo, hi);
            if dtype.is_int() || dtype == DType::Bool {
                v.floor()
            } else {
                v
            }
        })
        .collect();
    HostArray::from_f64s(dtype, shape, &vals)
}

/// Random indices of `dtype` in `-n..n`.
fn indices(dtype: DType, dims: &[usize], n: usize, rng: &mut Rng) -> HostArray {
    let shape = Shape::new(dims.to_vec());
    let vals: Vec<i64> = (0..shape.numel())
        .map(|_| rng.below(2 * n as u64) as i64 - n as i64)
        .collect();
    HostArray::new(shape, Storage::from_i64s(dtype, &vals)).expect("sized")
}

fn with_dim(dims: &[usize], axis: usize, extent: usize) -> Vec<usize> {
    let mut d = dims.to_vec();
    d[axis] = extent;
    d
}

const NUMERIC: [DType; 6] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
];

/// Unit roundoff of the dtype a routine accumulates in.
fn acc_eps(d: DType) -> f64 {
    match d {
        DType::F64 => f64::EPSILON / 2.0,
        _ => f32::EPSILON as f64 / 2.0,
    }
}

/// Unit roundoff of a stored element.
fn store_eps(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        _ => 0.0,
    }
}

/// `got` equals `want` element by element: exactly for integers, within `tol[i]` for
/// floats (NaN where `want` has NaN).
fn assert_close(what: &str, got: &HostArray, want: &HostArray, tol: &[f64]) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    assert_eq!(got.dtype(), want.dtype(), "{what}");
    if !got.dtype().is_float() {
        assert!(bits(got) == bits(want), "{what}: integers differ");
        return;
    }
    let (g, w) = (got.to_f64s(), want.to_f64s());
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol[i];
        assert!(
            ok,
            "{what}: element {i}: got {a}, want {b} (tolerance {})",
            tol[i]
        );
    }
}

// ---------------------------------------------------------------------------------------
// Scatter-add.
// ---------------------------------------------------------------------------------------

/// Scatter-add of `m` random indices per lane into `x` of `dims` along `axis`, checked
/// against the interpreter.
fn check_scatter(dtype: DType, index: DType, dims: &[usize], axis: usize, m: usize, rng: &mut Rng) {
    let n = dims[axis];
    let x = random(dtype, dims, -8.0, 8.0, rng);
    let idx = indices(index, &with_dim(dims, axis, m), n.max(1), rng);
    let v = random(dtype, idx.shape().dims(), -8.0, 8.0, rng);
    let op = Op::ScatterAdd { axis };
    let nd = node(op.clone(), &[&x, &idx, &v]);
    let got = deterministic(&nd, &[&x, &idx, &v]).expect("indices in range");
    let want = eval_node(&nd, &[&x, &idx, &v]).expect("indices in range");
    // The size of what each element sums: the same scatter of magnitudes, in f64.
    let abs = |a: &HostArray| {
        let m: Vec<f64> = a.to_f64s().iter().map(|v| v.abs()).collect();
        HostArray::from_f64s(DType::F64, a.shape().clone(), &m)
    };
    let (ax, av) = (abs(&x), abs(&v));
    let mag = eval_node(&node(op, &[&ax, &idx, &av]), &[&ax, &idx, &av]).expect("in range");
    // Each element is at most m + 1 additions in the accumulator, then one rounding.
    let tol: Vec<f64> = mag
        .to_f64s()
        .iter()
        .map(|s| s * ((m + 1) as f64 * acc_eps(dtype) + 2.0 * store_eps(dtype)))
        .collect();
    assert_close(
        &format!("scatter_add {dtype} idx {index} {dims:?} axis {axis} m {m}"),
        &got,
        &want,
        &tol,
    );
}

#[test]
fn scatter_add_matches_the_interpreter() {
    let mut rng = Rng(1);
    for dtype in NUMERIC {
        for index in [DType::I32, DType::I64] {
            check_scatter(dtype, index, &[5], 0, 7, &mut rng);
            for axis in 0..3 {
                check_scatter(dtype, index, &[3, 4, 5], axis, 6, &mut rng);
                check_scatter(dtype, index, &[3, 4, 5], axis, 0, &mut rng);
                check_scatter(
                    dtype,
                    index,
                    &with_dim(&[3, 4, 5], axis, 1),
                    axis,
                    3,
                    &mut rng,
                );
            }
        }
    }
    // Empty data, size-1 axes, long lanes, wide inner extents (several bands).
    for dtype in [DType::F32, DType::F64, DType::I64, DType::BF16] {
        check_scatter(dtype, DType::I64, &[0, 3], 1, 4, &mut rng);
        check_scatter(dtype, DType::I64, &[1], 0, 1, &mut rng);
        check_scatter(dtype, DType::I64, &[1000], 0, 20_000, &mut rng);
        check_scatter(dtype, DType::I32, &[2, 1000, 40], 1, 3000, &mut rng);
        check_scatter(dtype, DType::I64, &[4, 3, 1300], 1, 50, &mut rng);
        check_scatter(dtype, DType::I64, &[300, 2, 7], 0, 400, &mut rng);
    }
}

#[test]
fn scatter_add_duplicates_accumulate_in_position_order() {
    // f32 sums that depend on the order: 1e8 + 1 - 1e8 is 0 in f32 in this order.
    let x = HostArray::from_f64s(DType::F32, Shape::new([2]), &[0.0, 5.0]);
    let idx = HostArray::new(
        Shape::new([4]),
        Storage::from_i64s(DType::I64, &[0, 0, -2, 1]),
    )
    .expect("sized");
    let v = HostArray::from_f64s(DType::F32, Shape::new([4]), &[1e8, 1.0, -1e8, 2.0]);
    let nd = node(Op::ScatterAdd { axis: 0 }, &[&x, &idx, &v]);
    let got = deterministic(&nd, &[&x, &idx, &v]).expect("in range");
    assert_eq!(got.to_f64s(), vec![0.0, 7.0]);
}

#[test]
fn scatter_add_index_out_of_range_is_the_interpreters_error() {
    let mut rng = Rng(2);
    let x = random(DType::F32, &[3, 4, 5], -1.0, 1.0, &mut rng);
    let v = random(DType::F32, &[3, 6, 5], -1.0, 1.0, &mut rng);
    let mut ks: Vec<i64> = (0..90).map(|i| i % 4).collect();
    // Two bad indices: the first in row-major order is reported.
    ks[37] = -5;
    ks[80] = 4;
    let idx =
        HostArray::new(Shape::new([3, 6, 5]), Storage::from_i64s(DType::I64, &ks)).expect("sized");
    let nd = node(Op::ScatterAdd { axis: 1 }, &[&x, &idx, &v]);
    let want = eval_node(&nd, &[&x, &idx, &v]).expect_err("index out of range");
    assert!(matches!(
        want,
        InterpError::IndexOutOfRange {
            value: -5,
            extent: 4,
            ..
        }
    ));
    match deterministic(&nd, &[&x, &idx, &v]) {
        Err(RuntimeError::Interp(e)) => assert_eq!(e, want),
        other => panic!("expected the interpreter's error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Scans.
// ---------------------------------------------------------------------------------------

/// A scan of random values of `dims` along `axis`, checked against the interpreter:
/// integers exactly, floats within the accumulation's bound.
fn check_scan(op: ScanOp, dtype: DType, dims: &[usize], axis: usize, reverse: bool, rng: &mut Rng) {
    let (lo, hi) = match (op, dtype.is_int()) {
        (ScanOp::Sum, _) => (-100.0, 100.0),
        (ScanOp::Prod, true) => (-3.0, 4.0),
        (ScanOp::Prod, false) => (0.9, 1.1),
    };
    let x = random(dtype, dims, lo, hi, rng);
    let nd = node(Op::Scan { op, axis, reverse }, &[&x]);
    let got = deterministic(&nd, &[&x]).expect("scans cannot fail");
    let want = eval_node(&nd, &[&x]).expect("scans cannot fail");
    let what = format!(
        "{} {dtype} {dims:?} axis {axis} reverse {reverse}",
        op.name()
    );
    if dtype.is_int() {
        assert_close(&what, &got, &want, &[]);
        return;
    }
    // Bounds: a running sum of j terms is off by at most j eps times the running sum
    // of magnitudes; a product by j eps relatively; plus one rounding at each store.
    let d = x.shape().dims();
    let (n, inner) = (d[axis], d[axis + 1..].iter().product::<usize>());
    let outer = x.len() / (n * inner).max(1);
    let (xs, ws) = (x.to_f64s(), want.to_f64s());
    let mut tol = vec![0.0; xs.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut run = 0.0;
            for step in 0..n {
                let j = if reverse { n - 1 - step } else { step };
                let p = (o * n + j) * inner + i;
                run += xs[p].abs();
                let size = match op {
                    ScanOp::Sum => run,
                    ScanOp::Prod => ws[p].abs(),
                };
                let count = (step + 1) as f64;
                tol[p] = size * (count * acc_eps(dtype) * 1.01 + 2.0 * store_eps(dtype));
            }
        }
    }
    assert_close(&what, &got, &want, &tol);
}

#[test]
fn scans_match_the_interpreter() {
    let mut rng = Rng(3);
    for dtype in NUMERIC {
        for op in [ScanOp::Sum, ScanOp::Prod] {
            for reverse in [false, true] {
                check_scan(op, dtype, &[0], 0, reverse, &mut rng);
                check_scan(op, dtype, &[1], 0, reverse, &mut rng);
                check_scan(op, dtype, &[7], 0, reverse, &mut rng);
                check_scan(op, dtype, &[3, 0, 4], 1, reverse, &mut rng);
                for axis in 0..3 {
                    check_scan(op, dtype, &[4, 5, 6], axis, reverse, &mut rng);
                    check_scan(
                        op,
                        dtype,
                        &with_dim(&[4, 5, 6], axis, 1),
                        axis,
                        reverse,
                        &mut rng,
                    );
                }
                // Many rows; bands of a wide inner extent.
                check_scan(op, dtype, &[64, 300], 1, reverse, &mut rng);
                check_scan(op, dtype, &[5, 7, 600], 1, reverse, &mut rng);
            }
        }
    }
}

#[test]
fn long_scans_run_blocked_and_match() {
    let mut rng = Rng(4);
    let long = 2 * SCAN_BLOCK + 123;
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::F16] {
        for reverse in [false, true] {
            // One lane, a few rows, a few inner lanes, and the axis first.
            check_scan(ScanOp::Sum, dtype, &[long], 0, reverse, &mut rng);
            check_scan(ScanOp::Sum, dtype, &[3, long], 1, reverse, &mut rng);
            check_scan(ScanOp::Sum, dtype, &[long, 3], 0, reverse, &mut rng);
            check_scan(ScanOp::Sum, dtype, &[2, long, 2], 1, reverse, &mut rng);
        }
    }
    // Integer products wrap in i64, exactly as the interpreter's.
    check_scan(ScanOp::Prod, DType::I64, &[long], 0, false, &mut rng);
    check_scan(ScanOp::Prod, DType::I32, &[2, long], 1, true, &mut rng);
}

#[test]
fn f64_scans_of_short_lanes_are_the_interpreters_bits() {
    // Not blocked: the same f64 additions in the same order as the interpreter.
    let mut rng = Rng(5);
    let x = random(DType::F64, &[6, 777], -1.0, 1.0, &mut rng);
    for reverse in [false, true] {
        let nd = node(
            Op::Scan {
                op: ScanOp::Sum,
                axis: 1,
                reverse,
            },
            &[&x],
        );
        let got = deterministic(&nd, &[&x]).expect("ok");
        let want = eval_node(&nd, &[&x]).expect("ok");
        assert!(bits(&got) == bits(&want));
    }
}

// ---------------------------------------------------------------------------------------
// Argsort.
// ---------------------------------------------------------------------------------------

/// Values with many ties, signed zeros, infinities and NaNs (for float dtypes).
fn keys(dtype: DType, dims: &[usize], rng: &mut Rng) -> HostArray {
    let shape = Shape::new(dims.to_vec());
    let specials = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
    ];
    let vals: Vec<f64> = (0..shape.numel())
        .map(|_| match rng.below(10) {
            0 if dtype.is_float() => specials[rng.below(6) as usize],
            1..=4 => (rng.below(7) as f64) - 3.0,
            _ if dtype == DType::Bool => rng.below(2) as f64,
            _ => rng.uniform(-1e6, 1e6).floor() / 8.0,
        })
        .collect();
    match dtype {
        // Varied NaN payloads: every NaN must still tie.
        DType::F32 => {
            let v: Vec<f32> = vals
                .iter()
                .map(|&a| {
                    if a.is_nan() {
                        f32::from_bits(
                            0x7FC0_0000 | rng.below(1 << 20) as u32 | (rng.below(2) as u32) << 31,
                        )
                    } else {
                        a as f32
                    }
                })
                .collect();
            HostArray::new(shape, Storage::F32(v)).expect("sized")
        }
        DType::Bool => {
            let v: Vec<bool> = vals.iter().map(|&a| a != 0.0).collect();
            HostArray::new(shape, Storage::Bool(v)).expect("sized")
        }
        DType::I32 | DType::I64 => {
            let v: Vec<i64> = vals.iter().map(|&a| a as i64).collect();
            HostArray::new(shape, Storage::from_i64s(dtype, &v)).expect("sized")
        }
        _ => HostArray::from_f64s(dtype, shape, &vals),
    }
}

fn check_argsort(
    dtype: DType,
    dims: &[usize],
    axis: usize,
    descending: bool,
    k: usize,
    rng: &mut Rng,
) {
    let x = keys(dtype, dims, rng);
    let nd = node(
        Op::Argsort {
            axis,
            descending,
            k,
        },
        &[&x],
    );
    let got = deterministic(&nd, &[&x]).expect("argsort cannot fail");
    let want = eval_node(&nd, &[&x]).expect("argsort cannot fail");
    assert!(
        got == want,
        "argsort {dtype} {dims:?} axis {axis} descending {descending} k {k}"
    );
}

const KEYED: [DType; 7] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::Bool,
];

#[test]
fn argsort_matches_the_interpreter_on_short_rows() {
    let mut rng = Rng(6);
    for dtype in KEYED {
        for descending in [false, true] {
            check_argsort(dtype, &[0], 0, descending, 0, &mut rng);
            check_argsort(dtype, &[1], 0, descending, 1, &mut rng);
            check_argsort(dtype, &[5, 0], 1, descending, 0, &mut rng);
            check_argsort(dtype, &[5, 3], 1, descending, 0, &mut rng);
            check_argsort(dtype, &[33], 0, descending, 33, &mut rng);
            for axis in 0..3 {
                let dims = [4, 5, 6];
                for k in [dims[axis], 2, 1] {
                    check_argsort(dtype, &dims, axis, descending, k, &mut rng);
                }
                check_argsort(
                    dtype,
                    &with_dim(&dims, axis, 1),
                    axis,
                    descending,
                    1,
                    &mut rng,
                );
            }
            check_argsort(dtype, &[300, 20], 1, descending, 20, &mut rng);
            // A top-k of few positions is a selection, then a sort of those.
            check_argsort(dtype, &[300, 20], 1, descending, 2, &mut rng);
            check_argsort(dtype, &[40], 0, descending, 5, &mut rng);
            check_argsort(dtype, &[7, 41, 3], 1, descending, 4, &mut rng);
        }
    }
}

#[test]
fn argsort_matches_the_interpreter_on_long_rows() {
    let mut rng = Rng(7);
    let long = 4 * RADIX_MIN + 17;
    for dtype in KEYED {
        for descending in [false, true] {
            // One row (radix split over the threads), three rows (split or not
            // depending on the pool), columns (strided lanes), and top_k.
            check_argsort(dtype, &[long], 0, descending, long, &mut rng);
            check_argsort(dtype, &[3, long], 1, descending, long, &mut rng);
            check_argsort(dtype, &[long, 2], 0, descending, long, &mut rng);
            check_argsort(dtype, &[2, long], 1, descending, 10, &mut rng);
            check_argsort(dtype, &[long], 0, descending, 10, &mut rng);
        }
    }
    // Many rows of radix length.
    check_argsort(DType::F32, &[6, RADIX_MIN], 1, false, RADIX_MIN, &mut rng);
}

#[test]
fn argsort_orders_specials_as_numpy() {
    let x = HostArray::new(
        Shape::new([9]),
        Storage::F32(vec![
            f32::NAN,
            0.0,
            -0.0,
            f32::NEG_INFINITY,
            1.5,
            -f32::NAN,
            f32::INFINITY,
            -0.0,
            -1.5,
        ]),
    )
    .expect("sized");
    let run = |descending: bool| {
        let nd = node(
            Op::Argsort {
                axis: 0,
                descending,
                k: 9,
            },
            &[&x],
        );
        let got = deterministic(&nd, &[&x]).expect("ok");
        assert!(got == eval_node(&nd, &[&x]).expect("ok"));
        got.as_slice::<i64>().expect("i64").to_vec()
    };
    // Ascending: -inf, -1.5, the zeros in position order, 1.5, inf, the NaNs.
    assert_eq!(run(false), vec![3, 8, 1, 2, 7, 4, 6, 0, 5]);
    // Descending: the NaNs first, then inf, 1.5, the zeros (ties in position order).
    assert_eq!(run(true), vec![0, 5, 6, 4, 1, 2, 7, 8, 3]);
}

// ---------------------------------------------------------------------------------------
// Through the CPU executor.
// ---------------------------------------------------------------------------------------

#[test]
fn cpu_executor_runs_the_routines() {
    let mut rng = Rng(8);
    let mut g = Graph::new();
    let xi = g.add_input("x", DType::F32, Shape::new([4, 50]));
    let ii = g.add_input("i", DType::I64, Shape::new([4, 30]));
    let vi = g.add_input("v", DType::F32, Shape::new([4, 30]));
    let s = g
        .add(Op::ScatterAdd { axis: 1 }, &[xi, ii, vi])
        .expect("typed");
    let c = g
        .add(
            Op::Scan {
                op: ScanOp::Sum,
                axis: 1,
                reverse: false,
            },
            &[s],
        )
        .expect("typed");
    let a = g
        .add(
            Op::Argsort {
                axis: 1,
                descending: true,
                k: 5,
            },
            &[c],
        )
        .expect("typed");
    g.add_output(c);
    g.add_output(a);
    let x = random(DType::F32, &[4, 50], -1.0, 1.0, &mut rng);
    let idx = indices(DType::I64, &[4, 30], 50, &mut rng);
    let v = random(DType::F32, &[4, 30], -1.0, 1.0, &mut rng);
    // The routines by hand, one after another.
    let s_val = run_routine(g.node(s), &[&x, &idx, &v])
        .expect("routine")
        .expect("ok");
    let c_val = run_routine(g.node(c), &[&s_val])
        .expect("routine")
        .expect("ok");
    let a_val = run_routine(g.node(a), &[&c_val])
        .expect("routine")
        .expect("ok");
    let inputs = HashMap::from([
        (xi, Arc::new(x.clone())),
        (ii, Arc::new(idx.clone())),
        (vi, Arc::new(v.clone())),
    ]);
    let ev =
        ndfuse_runtime::execute(&g, &inputs, ndfuse_runtime::BackendKind::Cpu).expect("evaluates");
    assert!(bits(&ev.outputs[0]) == bits(&c_val));
    assert!(ev.outputs[1] == a_val);
    // An index out of range fails the evaluation with the interpreter's error.
    let mut bad = idx.as_slice::<i64>().expect("i64").to_vec();
    bad[45] = 50;
    let bad = HostArray::new(Shape::new([4, 30]), Storage::I64(bad)).expect("sized");
    let inputs = HashMap::from([(xi, Arc::new(x)), (ii, Arc::new(bad)), (vi, Arc::new(v))]);
    match ndfuse_runtime::execute(&g, &inputs, ndfuse_runtime::BackendKind::Cpu) {
        Err(RuntimeError::Interp(InterpError::IndexOutOfRange {
            value: 50,
            position,
            ..
        })) => assert_eq!(position, vec![1, 15]),
        other => panic!("expected an index error, got {other:?}"),
    }
}
