//! Kernels with reduce axes (row programs) against the reference interpreter: every
//! reduction on every dtype over several axis sets, fused row programs (softmax, var),
//! sibling reductions, row-level loads, broadcast and per-row stores, strided layouts,
//! empty rows, every plan, and ranges of rows.
//!
//! Tolerances:
//! - exact (bit-equal, or both NaN) for max, min, argmax, argmin, integers, and every
//!   output that involves no float sum or product;
//! - float sums and products: the JIT accumulates in the value's dtype in element order,
//!   the reference in f64 (sums compensated) rounded once. Sequential accumulation of `n`
//!   terms errs by at most about `n * eps * sum|x|`, so an output `g` may differ from the
//!   reference `w` by `rel * |w| + abs * S`, where `S` is the same kernel evaluated by the
//!   interpreter with every summed term replaced by its absolute value (the sum of |terms|,
//!   propagated through what follows). f32: `rel = 1e-5`, `abs = 1e-6`; f64: `rel = 1e-12`,
//!   `abs = 1e-12`. Products use only the relative part (their terms are kept in
//!   `[0.5, 2]`, far from overflow).

mod builder;

use builder::{compiled, run, view, zeroed_outputs, KernelBuilder};
use ndfuse_ir::interp::eval_kernel;
use ndfuse_ir::{
    Accumulate, ArgReduceOp, BinaryOp, DType, Expr, HostArray, Instr, Kernel, Plan, Scalar, Shape,
    UnaryOp, ValueId, View,
};

/// How closely a test's outputs must match the reference (see the module docs).
#[derive(Clone, Copy, Debug)]
enum Tol {
    Exact,
    /// Float sums/products: relative plus absolute times the sum of |terms|.
    Accumulated,
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 31) as f64
    }
}

/// `n` test values of `dtype`: floats in [-8, 8) with ties and signed zeros, integers
/// spanning the width (wrapping sums), bools.
fn values(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Lcg(seed);
    (0..n)
        .map(|_| match dtype {
            DType::Bool => (rng.next() % 2) as f64,
            DType::I32 => {
                if rng.next().is_multiple_of(4) {
                    2147483647.0 - (rng.next() % 3) as f64
                } else {
                    (rng.next() % 2001) as f64 - 1000.0
                }
            }
            DType::I64 => {
                if rng.next().is_multiple_of(4) {
                    9.2e18 - (rng.next() % 3) as f64 * 1e18
                } else {
                    (rng.next() % 2001) as f64 - 1000.0
                }
            }
            _ => match rng.next() % 16 {
                0 => 0.0,
                1 => -0.0,
                2 => 3.0, // ties for max/min and their arg versions
                _ => (rng.unit() * 16.0 - 8.0) * 0.999,
            },
        })
        .collect()
}

/// Values in [0.5, 2]: products of dozens stay far from overflow and underflow.
fn near_one(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Lcg(seed);
    (0..n).map(|_| 0.5 + 1.5 * rng.unit()).collect()
}

fn host(dtype: DType, shape: &[usize], vals: &[f64]) -> HostArray {
    HostArray::from_f64s(dtype, Shape::new(shape), vals)
}

/// Bit-equal, or both NaN.
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `kernel` with every summed term replaced by its absolute value (see the module docs).
fn abs_terms(kernel: &Kernel) -> Kernel {
    let mut k = kernel.clone();
    let mut body: Vec<Instr> = Vec::new();
    let mut map: Vec<ValueId> = Vec::new();
    let re = |map: &[ValueId], v: ValueId| map[v.index()];
    for ins in &kernel.body {
        let expr = match &ins.expr {
            Expr::Reduce(Accumulate::Sum, a) => {
                body.push(Instr {
                    dtype: ins.dtype,
                    expr: Expr::Unary(UnaryOp::Abs, re(&map, *a)),
                });
                Expr::Reduce(Accumulate::Sum, ValueId(body.len() as u32 - 1))
            }
            e => e.map_operands(|v| re(&map, v)),
        };
        body.push(Instr {
            dtype: ins.dtype,
            expr,
        });
        map.push(ValueId(body.len() as u32 - 1));
    }
    for s in &mut k.stores {
        s.value = map[s.value.index()];
    }
    k.body = body;
    k
}

/// Runs `kernel` through the JIT and the interpreter and compares every output within
/// `tol`; returns the largest relative difference seen, for the record.
fn compare(kernel: &Kernel, inputs: &[&HostArray], tol: Tol) -> f64 {
    let want = eval_kernel(kernel, inputs).unwrap_or_else(|e| panic!("interpreter: {e}"));
    let got = run(kernel, inputs);
    let scale = match tol {
        Tol::Exact => None,
        Tol::Accumulated => Some(eval_kernel(&abs_terms(kernel), inputs).expect("abs kernel")),
    };
    let mut worst = 0.0f64;
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.dtype(), w.dtype(), "out{o} dtype");
        assert_eq!(g.len(), w.len(), "out{o} length");
        let dtype = g.dtype();
        if !dtype.is_float() {
            assert_eq!(g.storage(), w.storage(), "out{o}\n{kernel}");
            continue;
        }
        let (rel, abs) = if dtype == DType::F32 {
            (1e-5, 1e-6)
        } else {
            (1e-12, 1e-12)
        };
        for i in 0..g.len() {
            let (gv, wv) = (g.storage().get_f64(i), w.storage().get_f64(i));
            if same(gv, wv) {
                continue;
            }
            let s = match &scale {
                None => panic!("out{o}[{i}] = {gv:?}, reference {wv:?} (exact)\n{kernel}"),
                Some(sc) => sc[o].storage().get_f64(i).abs(),
            };
            let limit = rel * wv.abs() + abs * s;
            assert!(
                (gv - wv).abs() <= limit,
                "out{o}[{i}] = {gv:?}, reference {wv:?} (limit {limit:e})\n{kernel}"
            );
            worst = worst.max((gv - wv).abs() / wv.abs().max(f64::MIN_POSITIVE));
        }
    }
    worst
}

/// Axis sets over a [4, 5, 6] domain: last, first, middle, two non-adjacent, all.
const AXES: [&[usize]; 5] = [&[2], &[0], &[1], &[0, 2], &[0, 1, 2]];
const DOMAIN: [usize; 3] = [4, 5, 6];

/// `reduce acc (cast? x)` over `axes`, stored one per row and broadcast to every
/// position.
fn reduce_kernel(acc: Accumulate, load: DType, compute: DType, axes: &[usize]) -> Kernel {
    let mut kb = KernelBuilder::new(&format!("k0_{}", acc.name()), &DOMAIN);
    kb.reduce_over(axes);
    let x = kb.load(load);
    let x = if load == compute {
        x
    } else {
        kb.cast(x, compute)
    };
    let r = kb.reduce(acc, x);
    kb.store_rows(r);
    kb.store(r);
    kb.build()
}

#[test]
fn every_reduction_every_dtype_every_axis_set() {
    let n: usize = DOMAIN.iter().product();
    let cases = [
        (DType::F32, DType::F32),
        (DType::F64, DType::F64),
        (DType::I32, DType::I32),
        (DType::I32, DType::I64),
        (DType::I64, DType::I64),
    ];
    for acc in [
        Accumulate::Sum,
        Accumulate::Prod,
        Accumulate::Max,
        Accumulate::Min,
    ] {
        for (load, compute) in cases {
            for (t, axes) in AXES.iter().enumerate() {
                let vals = if acc == Accumulate::Prod && load.is_float() {
                    near_one(n, 3 + t as u64)
                } else {
                    values(load, n, 3 + t as u64)
                };
                let x = host(load, &DOMAIN, &vals);
                let k = reduce_kernel(acc, load, compute, axes);
                let tol = match acc {
                    Accumulate::Sum | Accumulate::Prod => Tol::Accumulated,
                    _ => Tol::Exact,
                };
                let worst = compare(&k, &[&x], tol);
                eprintln!(
                    "{} {load}->{compute} over {axes:?}: worst relative difference {worst:e}",
                    acc.name()
                );
            }
        }
    }
}

#[test]
fn argmax_argmin_every_dtype_and_single_axis() {
    let n: usize = DOMAIN.iter().product();
    for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool] {
            for (t, axes) in AXES[..3].iter().enumerate() {
                let x = host(dtype, &DOMAIN, &values(dtype, n, 11 + t as u64));
                let mut kb = KernelBuilder::new("k0_arg", &DOMAIN);
                kb.reduce_over(axes);
                let v = kb.load(dtype);
                let a = kb.arg_reduce(op, v);
                kb.store_rows(a);
                compare(&kb.build(), &[&x], Tol::Exact);
            }
        }
    }
}

#[test]
fn nan_infinities_and_signed_zeros_in_max_min_and_arg() {
    // One row a case: NaN first, NaN late (the first NaN wins), two NaNs, infinities
    // only, signed zeros in both orders, ties.
    let rows: [[f64; 4]; 7] = [
        [f64::NAN, 1.0, 5.0, -1.0],
        [1.0, 7.0, f64::NAN, 9.0],
        [2.0, f64::NAN, 3.0, f64::NAN],
        [f64::NEG_INFINITY; 4],
        [-0.0, 0.0, -0.0, 0.0],
        [0.0, -0.0, 0.0, -0.0],
        [3.0, 3.0, -3.0, -3.0],
    ];
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    for dtype in [DType::F32, DType::F64] {
        let x = host(dtype, &[7, 4], &flat);
        let mut kb = KernelBuilder::new("k0_specials", &[7, 4]);
        kb.reduce_over(&[1]);
        let v = kb.load(dtype);
        for acc in [Accumulate::Max, Accumulate::Min] {
            let r = kb.reduce(acc, v);
            kb.store_rows(r);
        }
        for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
            let r = kb.arg_reduce(op, v);
            kb.store_rows(r);
        }
        let k = kb.build();
        compare(&k, &[&x], Tol::Exact);
        // And the signed zeros are the IEEE ones, not just equal values.
        let got = run(&k, &[&x]);
        assert!(
            got[0].storage().get_f64(4).is_sign_positive(),
            "max(-0, +0)"
        );
        assert!(
            got[1].storage().get_f64(5).is_sign_negative(),
            "min(+0, -0)"
        );
        assert_eq!(got[2].storage().get_i64(1), 2, "first NaN wins argmax");
        assert_eq!(got[3].storage().get_i64(2), 1, "first NaN wins argmin");
    }
}

#[test]
fn empty_rows_give_identities_and_zero_rows_do_nothing() {
    for dtype in [DType::F32, DType::F64, DType::I64] {
        // [3, 0]: three rows of nothing.
        let mut kb = KernelBuilder::new("k0_empty", &[3, 0]);
        kb.reduce_over(&[1]);
        let x = kb.load(dtype);
        for acc in [
            Accumulate::Sum,
            Accumulate::Prod,
            Accumulate::Max,
            Accumulate::Min,
        ] {
            let r = kb.reduce(acc, x);
            kb.store_rows(r);
        }
        let a = kb.arg_reduce(ArgReduceOp::ArgMax, x);
        kb.store_rows(a);
        let e = kb.unary(UnaryOp::Neg, x);
        kb.store(e); // an element store of nothing
        let k = kb.build();
        let input = host(dtype, &[3, 0], &[]);
        compare(&k, &[&input], Tol::Exact);
        let got = run(&k, &[&input]);
        assert_eq!(got[0].to_f64s(), vec![0.0; 3], "sum of nothing");
        assert_eq!(got[1].to_f64s(), vec![1.0; 3], "product of nothing");
        assert_eq!(got[4].storage().get_i64(2), 0, "argmax of nothing");

        // [0, 4]: no rows at all.
        let mut kb = KernelBuilder::new("k0_no_rows", &[0, 4]);
        kb.reduce_over(&[1]);
        let x = kb.load(dtype);
        let r = kb.reduce(Accumulate::Sum, x);
        kb.store_rows(r);
        kb.store(r);
        let k = kb.build();
        let input = host(dtype, &[0, 4], &[]);
        compare(&k, &[&input], Tol::Exact);
    }
}

/// `softmax(x)` over `axis` of a [rows, cols]-shaped domain read through `xview`:
/// m = max x; e = exp(x - m); s = sum e; out = e / s.
fn softmax(dtype: DType, domain: &[usize], axis: usize, len: usize, xview: View) -> Kernel {
    let mut kb = KernelBuilder::new("k0_max_sub_exp_sum_div", domain);
    kb.reduce_over(&[axis]);
    let x = kb.load_view(dtype, len, xview);
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let s = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    kb.build()
}

#[test]
fn softmax_rows_and_columns() {
    for dtype in [DType::F32, DType::F64] {
        let x = host(dtype, &[9, 37], &values(dtype, 9 * 37, 5));
        let k = softmax(
            dtype,
            &[9, 37],
            1,
            333,
            View::contiguous(Shape::new([9, 37])),
        );
        compare(&k, &[&x], Tol::Accumulated);
        // Over axis 0 of the same buffer: a strided row.
        let k = softmax(
            dtype,
            &[9, 37],
            0,
            333,
            View::contiguous(Shape::new([9, 37])),
        );
        compare(&k, &[&x], Tol::Accumulated);
        // Over the rows of the transpose: a row is a column of the buffer.
        let t = View::contiguous(Shape::new([9, 37])).permute(&[1, 0]);
        let k = softmax(dtype, &[37, 9], 1, 333, t);
        compare(&k, &[&x], Tol::Accumulated);
    }
}

#[test]
fn variance_row_program() {
    // mean = sum x / n; d = x - mean; v = sum(d*d) / n, stored per row.
    for dtype in [DType::F32, DType::F64] {
        for (domain, axes) in [(&[6, 50][..], &[1][..]), (&[5, 4, 6][..], &[0, 2][..])] {
            let mut kb = KernelBuilder::new("k0_var", domain);
            kb.reduce_over(axes);
            let x = kb.load(dtype);
            let s = kb.reduce(Accumulate::Sum, x);
            let n = axes.iter().map(|&a| domain[a]).product::<usize>() as f64;
            let nv = kb.constant(dtype, Scalar::F(n));
            let mean = kb.binary(BinaryOp::Div, s, nv);
            let d = kb.binary(BinaryOp::Sub, x, mean);
            let sq = kb.unary(UnaryOp::Square, d);
            let ss = kb.reduce(Accumulate::Sum, sq);
            let v = kb.binary(BinaryOp::Div, ss, nv);
            kb.store_rows(v);
            let k = kb.build();
            let numel: usize = domain.iter().product();
            let x = host(dtype, domain, &values(dtype, numel, 17));
            compare(&k, &[&x], Tol::Accumulated);
        }
    }
}

/// The number of element loads of `ty` (`f32`, `f64`) in the CLIF: one per load per
/// sweep, since element values are recomputed rather than kept.
fn loads_of(clif: &str, ty: &str) -> usize {
    clif.matches(&format!("load.{ty} ")).count()
}

#[test]
fn sibling_reductions_share_a_sweep() {
    // sum x, max x, sum x*x: independent of each other, one sweep; then mean-centred
    // max depends on the sum: a second sweep.
    let mut kb = KernelBuilder::new("k0_siblings", &[7, 33]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::F32);
    let s = kb.reduce(Accumulate::Sum, x);
    let m = kb.reduce(Accumulate::Max, x);
    let sq = kb.binary(BinaryOp::Mul, x, x);
    let ss = kb.reduce(Accumulate::Sum, sq);
    kb.store_rows(s);
    kb.store_rows(m);
    kb.store_rows(ss);
    let k = kb.build();
    assert_eq!(loads_of(compiled(&k).clif(), "f32"), 1, "one sweep");
    let xs = host(DType::F32, &[7, 33], &values(DType::F32, 231, 23));
    compare(&k, &[&xs], Tol::Accumulated);

    let mut kb = KernelBuilder::new("k0_two_sweeps", &[7, 33]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::F32);
    let s = kb.reduce(Accumulate::Sum, x);
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, s);
    let dm = kb.reduce(Accumulate::Max, d);
    let r = kb.binary(BinaryOp::Add, dm, m);
    kb.store_rows(r);
    let k = kb.build();
    assert_eq!(loads_of(compiled(&k).clif(), "f32"), 2, "two sweeps");
    compare(&k, &[&xs], Tol::Accumulated);

    // Softmax: max, then sum, then the element stores.
    let sm = softmax(
        DType::F32,
        &[4, 8],
        1,
        32,
        View::contiguous(Shape::new([4, 8])),
    );
    assert_eq!(loads_of(compiled(&sm).clif(), "f32"), 3, "three sweeps");
}

#[test]
fn row_level_loads_and_both_store_kinds() {
    // x: [6, 10] reduced over axis 1; b: one value per row (stride 0 along the row),
    // used by the element values (x - b) and in the epilogue (sum * b). The row value is
    // stored both per row and broadcast to every position; x - b is stored too.
    for dtype in [DType::F32, DType::F64, DType::I64] {
        let mut kb = KernelBuilder::new("k0_rowload", &[6, 10]);
        kb.reduce_over(&[1]);
        let x = kb.load(dtype);
        let b = kb.load_view(dtype, 6, view(&[6, 10], &[1, 0], 0));
        let d = kb.binary(BinaryOp::Sub, x, b);
        let s = kb.reduce(Accumulate::Sum, d);
        let sb = kb.binary(BinaryOp::Mul, s, b);
        kb.store_rows(sb);
        kb.store(sb);
        kb.store(d);
        let mx = kb.reduce(Accumulate::Max, x);
        kb.store(mx);
        let k = kb.build();
        let xs = host(dtype, &[6, 10], &values(dtype, 60, 29));
        let bs = host(dtype, &[6], &values(dtype, 6, 31));
        let tol = if dtype.is_float() {
            Tol::Accumulated
        } else {
            Tol::Exact
        };
        compare(&k, &[&xs, &bs], tol);
    }
}

#[test]
fn strided_and_negative_stride_loads() {
    // x[::-1, ::2] of a [5, 16] buffer as a [5, 8] domain, reduced along either axis,
    // plus a transposed second input: negative strides, steps and permutations.
    let rev = view(&[5, 8], &[-16, 2], 64);
    let tr = View::contiguous(Shape::new([8, 5])).permute(&[1, 0]);
    for axis in [0, 1] {
        for dtype in [DType::F32, DType::F64, DType::I32] {
            let mut kb = KernelBuilder::new("k0_strided", &[5, 8]);
            kb.reduce_over(&[axis]);
            let x = kb.load_view(dtype, 80, rev.clone());
            let y = kb.load_view(dtype, 40, tr.clone());
            let p = kb.binary(BinaryOp::Mul, x, y);
            let s = kb.reduce(Accumulate::Sum, p);
            let m = kb.reduce(Accumulate::Min, x);
            let a = kb.arg_reduce(ArgReduceOp::ArgMax, y);
            kb.store_rows(s);
            kb.store(m);
            kb.store_rows(a);
            let k = kb.build();
            let xs = host(dtype, &[80], &values(dtype, 80, 37));
            let ys = host(dtype, &[40], &values(dtype, 40, 41));
            let tol = if dtype.is_float() {
                Tol::Accumulated
            } else {
                Tol::Exact
            };
            compare(&k, &[&xs, &ys], tol);
        }
    }
}

#[test]
fn every_plan_gives_the_same_results() {
    let x = host(DType::F64, &[8, 12], &values(DType::F64, 96, 43));
    let base = softmax(
        DType::F64,
        &[8, 12],
        0,
        96,
        View::contiguous(Shape::new([8, 12])),
    );
    let want = run(&base, &[&x]);
    for plan in [
        Plan::Columns {
            cols: 12,
            col_len: 8,
        },
        Plan::Split {
            rows: 12,
            row_len: 8,
            splits: 2,
        },
        Plan::Rows {
            rows: 12,
            row_len: 8,
            contiguous: false,
        },
    ] {
        let mut k = base.clone();
        k.plan = plan;
        let got = run(&k, &[&x]);
        // A split sums each chunk apart and then the partials: another order of
        // additions, so only the tolerance applies; the other plans add in row order.
        if !matches!(k.plan, Plan::Split { .. }) {
            assert_eq!(got[0].storage(), want[0].storage(), "{}", k.plan);
        }
        compare(&k, &[&x], Tol::Accumulated);
    }
}

/// A row program with two sweeps, every reduction kind, per-row and element stores:
/// `mean`, `var = sum((x - mean)^2) / n`, max, min, argmax, argmin, and `x - mean`.
fn split_program(dtype: DType, domain: &[usize], axes: &[usize], splits: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_split", domain);
    kb.reduce_over(axes);
    let x = kb.load(dtype);
    let s = kb.reduce(Accumulate::Sum, x);
    let row_len: usize = axes.iter().map(|&a| domain[a]).product();
    let n = kb.constant(dtype, Scalar::F(row_len as f64).cast(dtype));
    let mean = kb.binary(BinaryOp::Div, s, n);
    let d = kb.binary(BinaryOp::Sub, x, mean);
    let d2 = kb.unary(UnaryOp::Square, d);
    let ss = kb.reduce(Accumulate::Sum, d2);
    let var = kb.binary(BinaryOp::Div, ss, n);
    let mx = kb.reduce(Accumulate::Max, x);
    let mn = kb.reduce(Accumulate::Min, x);
    kb.store_rows(mean);
    kb.store_rows(var);
    kb.store_rows(mx);
    kb.store_rows(mn);
    if axes.len() == 1 {
        let am = kb.arg_reduce(ArgReduceOp::ArgMax, x);
        let an = kb.arg_reduce(ArgReduceOp::ArgMin, x);
        kb.store_rows(am);
        kb.store_rows(an);
    }
    kb.store(d);
    let rows = kb.domain().numel() / row_len;
    kb.plan(Plan::Split {
        rows,
        row_len,
        splits,
    });
    kb.build()
}

#[test]
fn split_rows_match_the_reference() {
    // One long row in uneven chunks, a chunk count that leaves the last chunk empty
    // (9 in 4 chunks of 3), several contiguous rows, and strided rows (axis 0).
    let cases: [(&[usize], &[usize], usize); 5] = [
        (&[1000], &[0], 7),
        (&[9], &[0], 4),
        (&[3, 1000], &[1], 16),
        (&[1000, 3], &[0], 5),
        (&[4, 50, 6], &[0, 2], 3),
    ];
    for dtype in [DType::F32, DType::F64] {
        for (t, &(domain, axes, splits)) in cases.iter().enumerate() {
            let n: usize = domain.iter().product();
            let x = host(dtype, domain, &values(dtype, n, 53 + t as u64));
            let k = split_program(dtype, domain, axes, splits);
            let ck = compiled(&k);
            assert!(
                ck.clif().contains("_partial1("),
                "two sweeps, two partial phases"
            );
            compare(&k, &[&x], Tol::Accumulated);
        }
    }
    // Integers: the split changes no result at all (wrapping sums are associative).
    for dtype in [DType::I32, DType::I64] {
        let x = host(dtype, &[1000], &values(dtype, 1000, 59));
        let mut kb = KernelBuilder::new("k0_isplit", &[1000]);
        kb.reduce_over(&[0]);
        let v = kb.load(dtype);
        for acc in [
            Accumulate::Sum,
            Accumulate::Prod,
            Accumulate::Max,
            Accumulate::Min,
        ] {
            let r = kb.reduce(acc, v);
            kb.store_rows(r);
        }
        let a = kb.arg_reduce(ArgReduceOp::ArgMin, v);
        kb.store_rows(a);
        kb.plan(Plan::Split {
            rows: 1,
            row_len: 1000,
            splits: 9,
        });
        compare(&kb.build(), &[&x], Tol::Exact);
    }
}

#[test]
fn split_arg_reductions_keep_the_first_nan_and_the_first_tie() {
    // Ties and NaNs that straddle chunk boundaries (chunks of 4).
    let cases: [(&[f64], i64, i64); 4] = [
        (&[1.0, 2.0, 3.0, 9.0, 9.0, 0.0, -5.0, -5.0, 9.0, -5.0], 3, 6),
        (
            &[1.0, 2.0, 3.0, 4.0, 5.0, f64::NAN, 7.0, 8.0, f64::NAN, 0.0],
            5,
            5,
        ),
        (&[f64::NEG_INFINITY; 10], 0, 0),
        (
            &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, f64::NAN, 0.0, 0.0],
            7,
            7,
        ),
    ];
    for dtype in [DType::F32, DType::F64] {
        for (vals, amax, amin) in cases {
            let x = host(dtype, &[10], vals);
            let mut kb = KernelBuilder::new("k0_args", &[10]);
            kb.reduce_over(&[0]);
            let v = kb.load(dtype);
            let a = kb.arg_reduce(ArgReduceOp::ArgMax, v);
            let b = kb.arg_reduce(ArgReduceOp::ArgMin, v);
            let m = kb.reduce(Accumulate::Max, v);
            kb.store_rows(a);
            kb.store_rows(b);
            kb.store_rows(m);
            kb.plan(Plan::Split {
                rows: 1,
                row_len: 10,
                splits: 3,
            });
            let k = kb.build();
            compare(&k, &[&x], Tol::Exact);
            let got = run(&k, &[&x]);
            assert_eq!(got[0].storage().get_i64(0), amax, "argmax of {vals:?}");
            assert_eq!(got[1].storage().get_i64(0), amin, "argmin of {vals:?}");
        }
    }
}

#[test]
fn vector_sweeps_match_the_reference() {
    // Rows long enough for the vector loop, with every length of scalar tail; a row
    // value (the mean) broadcast into the second sweep and stored along the row;
    // element ops with vector forms; element stores.
    for dtype in [DType::F32, DType::F64] {
        let vt = if dtype == DType::F32 {
            "f32x4"
        } else {
            "f64x2"
        };
        for (t, row_len) in [16usize, 17, 23, 31, 64, 77, 1000].into_iter().enumerate() {
            let domain = [3, row_len];
            let mut kb = KernelBuilder::new("k0_vec", &domain);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let y = kb.load(dtype);
            let xy = kb.binary(BinaryOp::Mul, x, y);
            let ax = kb.unary(UnaryOp::Abs, x);
            let e = kb.binary(BinaryOp::Sub, xy, ax);
            let s = kb.reduce(Accumulate::Sum, e);
            let mx = kb.reduce(Accumulate::Max, x);
            let mn = kb.reduce(Accumulate::Min, e);
            let n = kb.constant(dtype, Scalar::F(row_len as f64).cast(dtype));
            let mean = kb.binary(BinaryOp::Div, s, n);
            let d = kb.binary(BinaryOp::Sub, x, mean);
            let d2 = kb.unary(UnaryOp::Square, d);
            let ss = kb.reduce(Accumulate::Sum, d2);
            for r in [s, mx, mn, ss] {
                kb.store_rows(r);
            }
            // Element stores: a vector store sweep, a row value broadcast along it.
            kb.store(d);
            kb.store(mean);
            let k = kb.build();
            assert!(compiled(&k).clif().contains(vt), "a vector sweep");
            let nv = 3 * row_len;
            let xs = host(dtype, &domain, &values(dtype, nv, 61 + t as u64));
            let ys = host(dtype, &domain, &values(dtype, nv, 67 + t as u64));
            compare(&k, &[&xs, &ys], Tol::Accumulated);

            // Products of values near one.
            let mut kb = KernelBuilder::new("k0_vprod", &domain);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let p = kb.reduce(Accumulate::Prod, x);
            kb.store_rows(p);
            let xs = host(dtype, &domain, &near_one(nv, 71 + t as u64));
            compare(&kb.build(), &[&xs], Tol::Accumulated);
        }
    }
}

#[test]
fn vector_loads_at_any_alignment() {
    // Rows starting at every element offset from a 16-byte boundary: vector loads must
    // not assume alignment (an aligned SSE operand would fault).
    for dtype in [DType::F32, DType::F64] {
        for offset in 0..4isize {
            let len = 3 * 35 + 4;
            let xs = host(dtype, &[len], &values(dtype, len, 73 + offset as u64));
            let mut kb = KernelBuilder::new("k0_unaligned", &[3, 35]);
            kb.reduce_over(&[1]);
            let x = kb.load_view(dtype, len, view(&[3, 35], &[35, 1], offset));
            let s = kb.reduce(Accumulate::Sum, x);
            kb.store_rows(s);
            compare(&kb.build(), &[&xs], Tol::Accumulated);
        }
    }
}

#[test]
fn vector_max_and_min_keep_nan_and_signed_zeros() {
    // 40 elements a row: NaN in some lane of some accumulator, or in the scalar tail;
    // signed zeros only; infinities.
    let mut rows: Vec<Vec<f64>> = Vec::new();
    for at in [0usize, 5, 17, 38] {
        let mut r: Vec<f64> = (0..40).map(|i| i as f64 - 20.0).collect();
        r[at] = f64::NAN;
        rows.push(r);
    }
    rows.push(
        (0..40)
            .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
            .collect(),
    );
    rows.push(vec![f64::NEG_INFINITY; 40]);
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    for dtype in [DType::F32, DType::F64] {
        let x = host(dtype, &[rows.len(), 40], &flat);
        let mut kb = KernelBuilder::new("k0_vspecials", &[rows.len(), 40]);
        kb.reduce_over(&[1]);
        let v = kb.load(dtype);
        let mx = kb.reduce(Accumulate::Max, v);
        let mn = kb.reduce(Accumulate::Min, v);
        kb.store_rows(mx);
        kb.store_rows(mn);
        let k = kb.build();
        compare(&k, &[&x], Tol::Exact);
        let got = run(&k, &[&x]);
        assert!(
            got[0].storage().get_f64(4).is_sign_positive(),
            "max of zeros"
        );
        assert!(
            got[1].storage().get_f64(4).is_sign_negative(),
            "min of zeros"
        );
    }
}

/// `[rows, cols]` reduced over axis 0 with the Columns plan: sums, max, min of an
/// element expression with a column-broadcast operand (one element per row for every
/// column) and a sliced input, and the mean as an epilogue.
fn column_program(dtype: DType, rows: usize, cols: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_cols", &[rows, cols]);
    kb.reduce_over(&[0]);
    kb.plan(Plan::Columns {
        cols,
        col_len: rows,
    });
    let x = kb.load(dtype);
    // y[1:, 2:] of a [rows + 1, cols + 2] buffer.
    let y = kb.load_view(
        dtype,
        (rows + 1) * (cols + 2),
        view(&[rows, cols], &[cols as isize + 2, 1], cols as isize + 4),
    );
    let b = kb.load_view(dtype, rows, view(&[rows, cols], &[1, 0], 0));
    let xy = kb.binary(BinaryOp::Mul, x, y);
    let e = kb.binary(BinaryOp::Sub, xy, b);
    let s = kb.reduce(Accumulate::Sum, x);
    let n = kb.constant(dtype, Scalar::F(rows as f64).cast(dtype));
    let mean = kb.binary(BinaryOp::Div, s, n);
    let se = kb.reduce(Accumulate::Sum, e);
    let mx = kb.reduce(Accumulate::Max, e);
    let mn = kb.reduce(Accumulate::Min, x);
    for r in [mean, se, mx, mn] {
        kb.store_rows(r);
    }
    kb.build()
}

#[test]
fn column_bands_match_row_by_row_bit_for_bit() {
    // Widths below one vector, with scalar columns after the vectors, spanning bands.
    for dtype in [DType::F32, DType::F64] {
        for (t, &(rows, cols)) in [(5usize, 3usize), (7, 13), (33, 300), (3, 517), (2, 8)]
            .iter()
            .enumerate()
        {
            let k = column_program(dtype, rows, cols);
            assert!(
                compiled(&k).clif().contains("stack_addr"),
                "the band loop: {}",
                k.plan
            );
            let seed = 79 + t as u64;
            let x = host(dtype, &[rows, cols], &values(dtype, rows * cols, seed));
            let ny = (rows + 1) * (cols + 2);
            let y = host(dtype, &[ny], &values(dtype, ny, seed + 1));
            let b = host(dtype, &[rows], &values(dtype, rows, seed + 2));
            let inputs = [&x, &y, &b];
            compare(&k, &inputs, Tol::Accumulated);
            // The same additions in the same order as one column at a time.
            let mut by_rows = k.clone();
            by_rows.plan = Plan::Rows {
                rows: cols,
                row_len: rows,
                contiguous: false,
            };
            let (got, want) = (run(&k, &inputs), run(&by_rows, &inputs));
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.storage(), w.storage(), "{rows} x {cols}");
            }
        }
    }
}

#[test]
fn column_programs_outside_the_band_loop_still_run() {
    // Two sweeps (the variance of columns) and an element store: row by row.
    for dtype in [DType::F32, DType::F64] {
        let (rows, cols) = (9, 21);
        let mut kb = KernelBuilder::new("k0_colvar", &[rows, cols]);
        kb.reduce_over(&[0]);
        kb.plan(Plan::Columns {
            cols,
            col_len: rows,
        });
        let x = kb.load(dtype);
        let s = kb.reduce(Accumulate::Sum, x);
        let n = kb.constant(dtype, Scalar::F(rows as f64).cast(dtype));
        let mean = kb.binary(BinaryOp::Div, s, n);
        let d = kb.binary(BinaryOp::Sub, x, mean);
        let d2 = kb.unary(UnaryOp::Square, d);
        let ss = kb.reduce(Accumulate::Sum, d2);
        kb.store_rows(ss);
        kb.store(d);
        let k = kb.build();
        assert!(!compiled(&k).clif().contains("stack_addr"));
        let x = host(dtype, &[rows, cols], &values(dtype, rows * cols, 89));
        compare(&k, &[&x], Tol::Accumulated);
    }
}

#[test]
fn run_range_counts_rows() {
    let mut kb = KernelBuilder::new("k0_range", &[7, 3, 5]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::I64);
    let s = kb.reduce(Accumulate::Sum, x);
    kb.store_rows(s);
    let d = kb.binary(BinaryOp::Sub, x, s);
    kb.store(d);
    let k = kb.build();
    assert_eq!(k.rows(), 35);
    let xs = host(DType::I64, &[7, 3, 5], &values(DType::I64, 105, 47));
    let want = eval_kernel(&k, &[&xs]).expect("reference");
    let ck = compiled(&k);
    let mut outs = zeroed_outputs(&k);
    let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
    ck.run_range(&[&xs], &mut refs, 9, 23).expect("rows 9..23");
    // Row r is kept index (i, k) = (r / 5, r % 5): per-row output r, and the
    // positions (i, j, k) for every j.
    for r in 0..35 {
        let inside = (9..23).contains(&r);
        let got = outs[0].storage().get_i64(r);
        let w = want[0].storage().get_i64(r);
        assert_eq!(got, if inside { w } else { 0 }, "row {r}");
        for j in 0..3 {
            let p = (r / 5) * 15 + j * 5 + r % 5;
            let got = outs[1].storage().get_i64(p);
            let w = want[1].storage().get_i64(p);
            assert_eq!(got, if inside { w } else { 0 }, "row {r}, position {p}");
        }
    }
    let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
    let e = ck
        .run_range(&[&xs], &mut refs, 30, 36)
        .expect_err("past the rows");
    assert!(
        e.to_string()
            .contains("range 30..36 is not within the kernel's rows 0..35"),
        "{e}"
    );
}

#[test]
fn refused_row_programs_say_why() {
    // Empty rows with a row-level load: the load's view cannot be bounds-checked.
    let mut kb = KernelBuilder::new("k0_empty_rowload", &[3, 0]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::F32);
    let b = kb.load_view(DType::F32, 3, view(&[3, 0], &[1, 0], 0));
    let s = kb.reduce(Accumulate::Sum, x);
    let t = kb.binary(BinaryOp::Add, s, b);
    kb.store_rows(t);
    let k = kb.build();
    let why = ndfuse_codegen_cpu::supports(&k).expect_err("refused");
    assert!(why.contains("row_len 0"), "{why}");

    // An element-wise plan with reduce axes is a malformed description.
    let mut k = softmax(
        DType::F32,
        &[2, 3],
        1,
        6,
        View::contiguous(Shape::new([2, 3])),
    );
    k.plan = Plan::Elementwise;
    let why = ndfuse_codegen_cpu::supports(&k).expect_err("refused");
    assert!(why.contains("element-wise plan with reduce axes"), "{why}");
}

#[test]
fn clif_softmax_f32() {
    let k = softmax(
        DType::F32,
        &[4, 8],
        1,
        32,
        View::contiguous(Shape::new([4, 8])),
    );
    insta::assert_snapshot!(compiled(&k).clif());
}
