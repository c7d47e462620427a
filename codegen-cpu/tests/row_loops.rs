//! The row cache of row programs and the row loop of element-wise kernels with
//! broadcast loads: both must give the very bits of the loops they replace.

mod builder;

use builder::{array, compiled, run, view, zeroed_outputs, KernelBuilder};
use ndfuse_ir::{Accumulate, BinaryOp, DType, HostArray, Kernel, Shape, UnaryOp, View};

/// Deterministic values in about [-4, 4), with some repeats and exact zeros.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 17 == 0 {
                0.0
            } else {
                (s >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0
            }
        })
        .collect()
}

/// The output's bits as f64 (exact for every float dtype).
fn bits(a: &HostArray) -> Vec<u64> {
    a.to_f64s().iter().map(|x| x.to_bits()).collect()
}

/// softmax over the rows of [rows, cols], also storing each row's max and sum.
fn softmax_with_stats(dtype: DType, rows: usize, cols: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_max_sub_exp_sum_div", &[rows, cols]);
    kb.reduce_over(&[1]);
    let x = kb.load(dtype);
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let s = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    kb.store_rows(m);
    kb.store_rows(s);
    kb.build()
}

/// `exp(x - m) / s` element-wise, with `m` and `s` given per position.
fn exp_sub_div(dtype: DType, rows: usize, cols: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_sub_exp_div", &[rows, cols]);
    let x = kb.load(dtype);
    let m = kb.load(dtype);
    let s = kb.load(dtype);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    kb.build()
}

/// Each row value of `per_row` repeated `cols` times.
fn spread(dtype: DType, per_row: &HostArray, rows: usize, cols: usize) -> HostArray {
    let vals: Vec<f64> = per_row
        .to_f64s()
        .iter()
        .flat_map(|&v| std::iter::repeat_n(v, cols))
        .collect();
    array(dtype, &[rows, cols], &vals)
}

#[test]
fn softmax_through_the_row_cache_equals_exp_recomputed() {
    // Row lengths below, at and off the vector steps, and one too long for the cache
    // (20000 f32 = 80 KB > 64 KiB), which recomputes: both give the same bits. (Not
    // f16: its stored max and sum are rounded, the kernel's own are f32.)
    for dtype in [DType::F32, DType::F64] {
        for (rows, cols) in [(3, 5), (5, 16), (4, 37), (3, 1000), (2, 20000)] {
            let x = array(dtype, &[rows, cols], &values(rows * cols, cols as u64));
            let k = softmax_with_stats(dtype, rows, cols);
            let out = run(&k, &[&x]);
            let m = spread(dtype, &out[1], rows, cols);
            let s = spread(dtype, &out[2], rows, cols);
            let want = run(&exp_sub_div(dtype, rows, cols), &[&x, &m, &s]);
            assert_eq!(
                bits(&out[0]),
                bits(&want[0]),
                "{dtype} softmax over [{rows}, {cols}]"
            );
        }
    }
}

#[test]
fn the_row_cache_is_used_where_it_pays_and_fits() {
    let clif = |k: &Kernel| compiled(k).clif().to_string();
    // One f32 row of 4096: 16 KiB of cache, exp once per element.
    let sm = clif(&softmax_with_stats(DType::F32, 2, 4096));
    assert!(sm.contains("explicit_slot 16384"), "{sm}");
    // Too long a row: no cache.
    let long = clif(&softmax_with_stats(DType::F32, 2, 20000));
    assert!(!long.contains("explicit_slot"), "{long}");
    // Nothing transcendental to keep (variance): no cache.
    let mut kb = KernelBuilder::new("k0_var", &[2, 64]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::F32);
    let mean = kb.reduce(Accumulate::Sum, x);
    let d = kb.binary(BinaryOp::Sub, x, mean);
    let sq = kb.unary(UnaryOp::Square, d);
    let var = kb.reduce(Accumulate::Sum, sq);
    kb.store_rows(var);
    let v = clif(&kb.build());
    assert!(!v.contains("explicit_slot"), "{v}");
}

#[test]
fn row_cache_results_do_not_depend_on_the_row_range() {
    // Rows run one call at a time give the bits of one call over all rows.
    let (rows, cols) = (6, 333);
    let x = array(DType::F32, &[rows, cols], &values(rows * cols, 9));
    let k = softmax_with_stats(DType::F32, rows, cols);
    let whole = run(&k, &[&x]);
    let ck = compiled(&k);
    let mut outs = zeroed_outputs(&k);
    for r in 0..rows {
        let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
        ck.run_range(&[&x], &mut refs, r, r + 1).expect("runs");
    }
    for (a, b) in whole.iter().zip(&outs) {
        assert_eq!(bits(a), bits(b));
    }
}

/// `tanh(a * b + c)` over [n, m]: `b` a row `[m]` broadcast along axis 0 (through
/// `bview`), `c` one value per row `[n, 1]` (through `cview`).
fn broadcast_kernel(dtype: DType, n: usize, m: usize, bview: View, cview: View) -> Kernel {
    let lens = (bview.shape.numel(), cview.shape.numel());
    let lens = if bview.is_contiguous() { lens } else { (m, n) };
    let mut kb = KernelBuilder::new("k0_mul_add_tanh", &[n, m]);
    let a = kb.load(dtype);
    let b = kb.load_view(dtype, lens.0, bview);
    let c = kb.load_view(dtype, lens.1, cview);
    let ab = kb.binary(BinaryOp::Mul, a, b);
    let abc = kb.binary(BinaryOp::Add, ab, c);
    let t = kb.unary(UnaryOp::Tanh, abc);
    kb.store(t);
    kb.store(abc);
    kb.build()
}

/// The same kernel over three contiguous inputs (the vector loop of every position).
fn contiguous_kernel(dtype: DType, n: usize, m: usize) -> Kernel {
    let c = View::contiguous(Shape::new([n, m]));
    broadcast_kernel(dtype, n, m, c.clone(), c)
}

#[test]
fn broadcast_rows_equal_the_contiguous_loop_bit_for_bit() {
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for (n, m) in [(3, 8), (5, 37), (7, 64), (2, 1001)] {
            let a = array(dtype, &[n, m], &values(n * m, 1));
            let bv = values(m, 2);
            let cv = values(n, 3);
            let b = array(dtype, &[m], &bv);
            let c = array(dtype, &[n], &cv);
            // b read backwards (negative stride, offset m - 1), c forwards.
            let k = broadcast_kernel(
                dtype,
                n,
                m,
                view(&[n, m], &[0, -1], m as isize - 1),
                view(&[n, m], &[1, 0], 0),
            );
            let got = run(&k, &[&a, &b, &c]);
            let bfull: Vec<f64> = (0..n * m).map(|i| bv[m - 1 - i % m]).collect();
            let cfull: Vec<f64> = (0..n * m).map(|i| cv[i / m]).collect();
            let want = run(
                &contiguous_kernel(dtype, n, m),
                &[
                    &a,
                    &array(dtype, &[n, m], &bfull),
                    &array(dtype, &[n, m], &cfull),
                ],
            );
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(bits(g), bits(w), "{dtype} [{n}, {m}]");
            }
        }
    }
}

#[test]
fn broadcast_rows_in_ranges_that_cut_rows() {
    // Ranges starting and ending mid-row give the bits of one run over all positions.
    let (n, m) = (9, 45);
    let dtype = DType::F32;
    let a = array(dtype, &[n, m], &values(n * m, 4));
    let b = array(dtype, &[m], &values(m, 5));
    let c = array(dtype, &[n], &values(n, 6));
    let k = broadcast_kernel(
        dtype,
        n,
        m,
        view(&[n, m], &[0, 1], 0),
        view(&[n, m], &[1, 0], 0),
    );
    let whole = run(&k, &[&a, &b, &c]);
    let ck = compiled(&k);
    let mut outs = zeroed_outputs(&k);
    let cuts = [0, 7, 44, 45, 46, 100, 101, 230, 405];
    for w in cuts.windows(2) {
        let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
        ck.run_range(&[&a, &b, &c], &mut refs, w[0], w[1])
            .expect("runs");
    }
    for (x, y) in whole.iter().zip(&outs) {
        assert_eq!(bits(x), bits(y));
    }
    // The row loop took it: one udiv per row segment, none per element.
    let clif = ck.clif();
    assert!(clif.contains("f32x4"), "{clif}");
}

/// Rows of `cols` values that a float max or min must get exactly right: NaN in the
/// vector part, in a far stream and in the scalar tail; zero results from -0 and +0
/// mixed in either order; all -0; all +0; infinities.
fn min_max_rows(cols: usize) -> Vec<Vec<f64>> {
    let plain = values(cols, 7);
    let with = |at: usize, v: f64| {
        let mut r = plain.clone();
        r[at] = v;
        r
    };
    let nonpos = |first: f64, rest: f64| {
        let mut r: Vec<f64> = plain.iter().map(|x| -x.abs() - 1.0).collect();
        r[0] = first;
        r[cols / 2] = rest;
        r[cols - 1] = rest;
        r
    };
    let nonneg = |first: f64, rest: f64| {
        let mut r: Vec<f64> = plain.iter().map(|x| x.abs() + 1.0).collect();
        r[0] = first;
        r[cols / 2] = rest;
        r[cols - 1] = rest;
        r
    };
    let same_lane = |mut r: Vec<f64>, v: f64| {
        r[8] = v;
        r
    };
    vec![
        plain.clone(),
        with(5, f64::NAN),
        with(cols / 2 + 3, f64::NAN),
        with(cols - 1, f64::NAN),
        vec![-0.0; cols],
        vec![0.0; cols],
        nonpos(-0.0, 0.0),
        nonpos(0.0, -0.0),
        nonpos(-0.0, -0.0),
        nonneg(0.0, -0.0),
        nonneg(-0.0, 0.0),
        nonneg(0.0, 0.0),
        // -0 then +0 (and the reverse) where the same accumulator lane reads both:
        // elements 0 and 8 for f32 and f64 alike.
        same_lane(nonpos(-0.0, -1.0), 0.0),
        same_lane(nonneg(0.0, 1.0), -0.0),
        with(9, f64::INFINITY),
        with(11, f64::NEG_INFINITY),
    ]
}

#[test]
fn vector_max_and_min_keep_nan_and_the_sign_of_zero() {
    // 203 columns: the vector loop's streams and a scalar tail.
    let cols = 203;
    let rows = min_max_rows(cols);
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for op in [Accumulate::Max, Accumulate::Min] {
            let mut kb = KernelBuilder::new("k0_minmax", &[rows.len(), cols]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let m = kb.reduce(op, x);
            kb.store_rows(m);
            let k = kb.build();
            let a = array(dtype, &[rows.len(), cols], &flat);
            let got = run(&k, &[&a]);
            let want = ndfuse_ir::interp::eval_kernel(&k, &[&a]).expect("reference");
            let (got, want) = (got[0].to_f64s(), want[0].to_f64s());
            for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                assert!(same, "{dtype:?} {op:?} row {r}: got {g:?}, reference {w:?}");
            }
        }
    }
}

#[test]
fn vector_argmax_and_argmin_give_the_first_best_index() {
    // 203 columns: the vector loop's streams and a scalar tail; the rows of the max/min
    // test plus ties of the best value in other lanes, accumulators, streams and the
    // tail, and NaN twice (the first counts).
    let cols = 203;
    let mut rows = min_max_rows(cols);
    let plain = values(cols, 7);
    let peak = |at: &[usize], v: f64| {
        let mut r = plain.clone();
        for &i in at {
            r[i] = v;
        }
        r
    };
    for v in [100.0, -100.0] {
        rows.push(peak(&[150, 3, 9, 120, 200], v));
        rows.push(peak(&[200, 150], v));
        rows.push(peak(&[8, 0], v));
        rows.push(peak(&[102, 101], v));
    }
    rows.push(peak(&[77, 12], f64::NAN));
    rows.push(peak(&[201, 190], f64::NAN));
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for op in [
            ndfuse_ir::ArgReduceOp::ArgMax,
            ndfuse_ir::ArgReduceOp::ArgMin,
        ] {
            let mut kb = KernelBuilder::new("k0_arg", &[rows.len(), cols]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let m = kb.arg_reduce(op, x);
            kb.store_rows(m);
            let k = kb.build();
            let a = array(dtype, &[rows.len(), cols], &flat);
            let got = run(&k, &[&a]);
            let want = ndfuse_ir::interp::eval_kernel(&k, &[&a]).expect("reference");
            assert_eq!(
                got[0].to_f64s(),
                want[0].to_f64s(),
                "{dtype:?} {op:?}: the indices"
            );
        }
    }
}

#[test]
fn integer_vector_loops_wrap_like_the_reference() {
    // Rows of 203 (vector streams and a scalar tail) with the extremes, so sums and
    // products wrap, and max/min meet MIN and MAX in every lane position.
    let (rows, cols) = (6, 203);
    for dtype in [DType::I32, DType::I64] {
        let (lo, hi) = if dtype == DType::I32 {
            (f64::from(i32::MIN), f64::from(i32::MAX))
        } else {
            // i64 extremes exactly representable in f64.
            (-(2f64.powi(63)), 2f64.powi(62))
        };
        let vals: Vec<f64> = (0..rows * cols)
            .map(|i| match i % 29 {
                0 => lo,
                7 => hi,
                k => ((i * 7919) % 2001) as f64 - 1000.0 + k as f64,
            })
            .collect();
        let a = array(dtype, &[rows, cols], &vals);
        for op in [
            Accumulate::Sum,
            Accumulate::Prod,
            Accumulate::Max,
            Accumulate::Min,
        ] {
            let mut kb = KernelBuilder::new("k0_int_reduce", &[rows, cols]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let r = kb.reduce(op, x);
            kb.store_rows(r);
            let k = kb.build();
            let got = run(&k, &[&a]);
            let want = ndfuse_ir::interp::eval_kernel(&k, &[&a]).expect("reference");
            assert_eq!(got[0].storage(), want[0].storage(), "{dtype:?} {op:?}");
        }
        // Element-wise: x * x - (-x) + max(x, 3) - min(x, -3), wrapping.
        let mut kb = KernelBuilder::new("k0_int_elementwise", &[rows * cols]);
        let x = kb.load(dtype);
        let sq = kb.binary(BinaryOp::Mul, x, x);
        let nx = kb.unary(UnaryOp::Neg, x);
        let d = kb.binary(BinaryOp::Sub, sq, nx);
        let three = kb.constant(dtype, ndfuse_ir::Scalar::I(3));
        let m = kb.binary(BinaryOp::Max, x, three);
        let minus_three = kb.constant(dtype, ndfuse_ir::Scalar::I(-3));
        let n = kb.binary(BinaryOp::Min, x, minus_three);
        let s = kb.binary(BinaryOp::Add, d, m);
        let out = kb.binary(BinaryOp::Sub, s, n);
        kb.store(out);
        let k = kb.build();
        let flat = array(dtype, &[rows * cols], &vals);
        let got = run(&k, &[&flat]);
        let want = ndfuse_ir::interp::eval_kernel(&k, &[&flat]).expect("reference");
        assert_eq!(
            got[0].storage(),
            want[0].storage(),
            "{dtype:?} element-wise"
        );
    }
}
