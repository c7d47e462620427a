//! Index maps and domains: contiguous, broadcast, transposed, reversed and sliced loads,
//! several outputs, empty and rank-0 domains, sub-ranges, and positions beyond 2^32.

mod builder;

use builder::{array, compiled, iota, run, view, KernelBuilder};
use ndfuse_ir::{BinaryOp, DType, HostArray, Scalar, Shape, UnaryOp, View};

fn f32s(a: &HostArray) -> Vec<f32> {
    a.as_slice::<f32>().expect("an f32 array").to_vec()
}

#[test]
fn contiguous_mul_add() {
    let mut kb = KernelBuilder::new("k0_mul_add", &[3, 5]);
    let a = kb.load(DType::F32);
    let b = kb.load(DType::F32);
    let c = kb.load(DType::F32);
    let m = kb.binary(BinaryOp::Mul, a, b);
    let s = kb.binary(BinaryOp::Add, m, c);
    kb.store(s);
    let k = kb.build();
    let (x, y) = (
        iota(DType::F32, &[3, 5]),
        array(DType::F32, &[3, 5], &[0.5; 15]),
    );
    let z = array(DType::F32, &[3, 5], &[-1.0; 15]);
    let out = run(&k, &[&x, &y, &z]);
    let want: Vec<f32> = (0..15).map(|i| i as f32 * 0.5 - 1.0).collect();
    assert_eq!(f32s(&out[0]), want);
}

#[test]
fn broadcast_row_and_scalar_loads() {
    // out[i, j] = x[i, j] + row[j] * s, row broadcast along axis 0 (stride 0), s a
    // scalar broadcast along both (a fixed element at offset 2 of a 3-element buffer).
    let mut kb = KernelBuilder::new("k0_mul_add_bcast", &[4, 3]);
    let x = kb.load(DType::F64);
    let row = kb.load_view(DType::F64, 3, view(&[4, 3], &[0, 1], 0));
    let s = kb.load_view(DType::F64, 3, view(&[4, 3], &[0, 0], 2));
    let m = kb.binary(BinaryOp::Mul, row, s);
    let r = kb.binary(BinaryOp::Add, x, m);
    kb.store(r);
    let k = kb.build();
    let xs = iota(DType::F64, &[4, 3]);
    let rows = array(DType::F64, &[3], &[10.0, 20.0, 30.0]);
    let ss = array(DType::F64, &[3], &[0.0, 0.0, 2.0]);
    let out = run(&k, &[&xs, &rows, &ss]);
    let want: Vec<f64> = (0..12)
        .map(|i| i as f64 + [10.0, 20.0, 30.0][i % 3] * 2.0)
        .collect();
    assert_eq!(out[0].as_slice::<f64>(), Some(&want[..]));
}

#[test]
fn transposed_load() {
    // out[i, j] = in[j, i] for in of shape [5, 3].
    let mut kb = KernelBuilder::new("k0_transpose", &[3, 5]);
    let t = View::contiguous(Shape::new([5, 3])).permute(&[1, 0]);
    let v = kb.load_view(DType::I32, 15, t);
    kb.store(v);
    let k = kb.build();
    let input = iota(DType::I32, &[5, 3]);
    let out = run(&k, &[&input]);
    let want: Vec<i32> = (0..15).map(|p| (p % 5) * 3 + p / 5).collect();
    assert_eq!(out[0].as_slice::<i32>(), Some(&want[..]));
}

#[test]
fn permuted_3d_load_with_broadcast_axis() {
    // Domain [2, 3, 4]; the load reads a [4, 2] buffer as v[a, b, c] = in[c, a] (axis b
    // broadcast), so no two axes merge.
    let mut kb = KernelBuilder::new("k0_permute3", &[2, 3, 4]);
    let v = kb.load_view(DType::I64, 8, view(&[2, 3, 4], &[1, 0, 2], 0));
    kb.store(v);
    let k = kb.build();
    let input = iota(DType::I64, &[4, 2]);
    let out = run(&k, &[&input]);
    let mut want = Vec::new();
    for a in 0..2 {
        for _b in 0..3 {
            for c in 0..4 {
                want.push((c * 2 + a) as i64);
            }
        }
    }
    assert_eq!(out[0].as_slice::<i64>(), Some(&want[..]));
}

#[test]
fn negative_stride_loads() {
    // x[::-1, ::-2] of a [3, 6] buffer: shape [3, 3], strides (-6, -2), offset 17.
    let src = View::contiguous(Shape::new([3, 6]));
    let rev = src.slice(&[
        ndfuse_ir::AxisSlice::normalize(3, None, None, -1).expect("step -1"),
        ndfuse_ir::AxisSlice::normalize(6, None, None, -2).expect("step -2"),
    ]);
    assert_eq!((rev.strides.clone(), rev.offset), (vec![-6, -2], 17));
    let mut kb = KernelBuilder::new("k0_reverse", &[3, 3]);
    let v = kb.load_view(DType::F32, 18, rev);
    let n = kb.unary(UnaryOp::Neg, v);
    kb.store(n);
    let k = kb.build();
    let out = run(&k, &[&iota(DType::F32, &[3, 6])]);
    assert_eq!(
        f32s(&out[0]),
        vec![-17.0, -15.0, -13.0, -11.0, -9.0, -7.0, -5.0, -3.0, -1.0]
    );

    // A fully reversed 1-d view merges into one group: offset - i.
    let mut kb = KernelBuilder::new("k1_reverse", &[5]);
    let v = kb.load_view(DType::Bool, 5, view(&[5], &[-1], 4));
    kb.store(v);
    let out = run(
        &kb.build(),
        &[&array(DType::Bool, &[5], &[1.0, 0.0, 0.0, 1.0, 1.0])],
    );
    assert_eq!(
        out[0].as_slice::<bool>(),
        Some(&[true, true, false, false, true][..])
    );
}

#[test]
fn sliced_load_with_offset_and_size_one_axes() {
    // x[1:3, 2:4] of a [4, 5] buffer, seen as [2, 1, 2] (a size-1 axis with stride 99).
    let mut kb = KernelBuilder::new("k0_slice", &[2, 1, 2]);
    let v = kb.load_view(DType::F64, 20, view(&[2, 1, 2], &[5, 99, 1], 7));
    kb.store(v);
    let out = run(&kb.build(), &[&iota(DType::F64, &[4, 5])]);
    assert_eq!(out[0].as_slice::<f64>(), Some(&[7.0, 8.0, 12.0, 13.0][..]));
}

#[test]
fn two_outputs_from_one_body() {
    let mut kb = KernelBuilder::new("k0_exp_gt", &[6]);
    let x = kb.load(DType::F32);
    let zero = kb.constant(DType::F32, Scalar::F(0.0));
    let e = kb.unary(UnaryOp::Exp, x);
    let pos = kb.binary(BinaryOp::Gt, x, zero);
    assert_eq!(kb.store(e), 0);
    assert_eq!(kb.store(pos), 1);
    let k = kb.build();
    let xs = [-2.0, -0.5, 0.0, 0.5, 1.0, 3.0];
    let out = run(&k, &[&array(DType::F32, &[6], &xs)]);
    let e: Vec<f32> = xs.iter().map(|&v| (v as f32).exp()).collect();
    assert_eq!(f32s(&out[0]), e);
    assert_eq!(
        out[1].as_slice::<bool>(),
        Some(&[false, false, false, true, true, true][..])
    );
}

#[test]
fn empty_domain_runs_nothing() {
    let mut kb = KernelBuilder::new("k0_empty", &[3, 0]);
    let x = kb.load_view(DType::F32, 0, view(&[3, 0], &[0, 1], 0));
    let y = kb.unary(UnaryOp::Sqrt, x);
    kb.store(y);
    let k = kb.build();
    let ck = compiled(&k);
    let input = HostArray::zeros(DType::F32, Shape::new([0]));
    let mut out = HostArray::zeros(DType::F32, Shape::new([3, 0]));
    ck.run(&[&input], &mut [&mut out])
        .expect("an empty run is fine");
    ck.run_range(&[&input], &mut [&mut out], 0, 0)
        .expect("an empty range is fine");
    assert!(ck.run_range(&[&input], &mut [&mut out], 0, 1).is_err());
    assert!(ck.clif().contains("return"), "{}", ck.clif());
}

#[test]
fn rank0_domain() {
    let mut kb = KernelBuilder::new("k0_rank0", &[]);
    // A scalar read at offset 2 of a 3-element buffer, plus a contiguous scalar.
    let a = kb.load_view(DType::I64, 3, view(&[], &[], 2));
    let b = kb.load(DType::I64);
    let s = kb.binary(BinaryOp::Sub, a, b);
    kb.store(s);
    let k = kb.build();
    let av = HostArray::from_f64s(DType::I64, Shape::new([3]), &[0.0, 0.0, 50.0]);
    let bv = HostArray::from_f64s(DType::I64, Shape::scalar(), &[8.0]);
    let out = run(&k, &[&av, &bv]);
    assert_eq!(out[0].shape(), &Shape::scalar());
    assert_eq!(out[0].as_slice::<i64>(), Some(&[42i64][..]));
}

#[test]
fn run_range_writes_only_its_range() {
    let mut kb = KernelBuilder::new("k0_square", &[4, 4]);
    let t = kb.load_view(
        DType::F64,
        16,
        View::contiguous(Shape::new([4, 4])).permute(&[1, 0]),
    );
    let y = kb.unary(UnaryOp::Square, t);
    kb.store(y);
    let ck = compiled(&kb.build());
    let input = iota(DType::F64, &[4, 4]);
    let mut out = array(DType::F64, &[4, 4], &[-1.0; 16]);
    ck.run_range(&[&input], &mut [&mut out], 5, 11)
        .expect("in range");
    let got = out.as_slice::<f64>().expect("f64").to_vec();
    for (p, &g) in got.iter().enumerate() {
        let t = ((p % 4) * 4 + p / 4) as f64;
        let want = if (5..11).contains(&p) { t * t } else { -1.0 };
        assert_eq!(g, want, "position {p}");
    }
    // Two halves give the same as one run: what threads will rely on.
    let mut whole = HostArray::zeros(DType::F64, Shape::new([4, 4]));
    ck.run(&[&input], &mut [&mut whole]).expect("run");
    let mut halves = HostArray::zeros(DType::F64, Shape::new([4, 4]));
    ck.run_range(&[&input], &mut [&mut halves], 0, 7)
        .expect("first half");
    ck.run_range(&[&input], &mut [&mut halves], 7, 16)
        .expect("second half");
    assert_eq!(whole, halves);
}

#[test]
fn compiled_kernels_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ndfuse_codegen_cpu::CompiledKernel>();
}

/// Positions and offsets beyond 2^32 must be computed in i64. The buffers are
/// zero-filled allocations the OS maps lazily, so only the pages touched cost memory.
#[test]
fn positions_beyond_2_pow_32_index_correctly() {
    const ROWS: usize = 5;
    const COLS: usize = (1 << 30) + 3; // ROWS * COLS > 2^32
    let n = ROWS * COLS;
    // out[r, c] = in[c, r] with in of shape [COLS, ROWS]: the transposed offset
    // c * ROWS + r spans the whole buffer, and the reversed 1-d load n - 1 - i.
    let mut kb = KernelBuilder::new("k0_huge", &[ROWS, COLS]);
    let t = kb.load_view(
        DType::Bool,
        n,
        View::contiguous(Shape::new([COLS, ROWS])).permute(&[1, 0]),
    );
    let r = kb.reload(
        0,
        view(&[ROWS, COLS], &[-(COLS as isize), -1], n as isize - 1),
    );
    let both = kb.binary(BinaryOp::And, t, r);
    kb.store(t);
    kb.store(both);
    let ck = compiled(&kb.build());

    let mut input = HostArray::zeros(DType::Bool, Shape::new([COLS, ROWS]));
    let set = [n - 1, n - 3, n - 2 * ROWS + 4, 0, 2, 1];
    if let ndfuse_ir::Storage::Bool(v) = input.storage_mut() {
        for &s in &set {
            v[s] = true;
        }
    }
    let mut out_t = HostArray::zeros(DType::Bool, Shape::new([ROWS, COLS]));
    let mut out_and = HostArray::zeros(DType::Bool, Shape::new([ROWS, COLS]));
    let ranges = [(0, 8), (COLS - 4, COLS + 4), (n - 8, n)];
    for &(s, e) in &ranges {
        ck.run_range(&[&input], &mut [&mut out_t, &mut out_and], s, e)
            .expect("in range");
    }
    let inp = input.as_slice::<bool>().expect("bool");
    let (ot, oa) = (
        out_t.as_slice::<bool>().expect("bool"),
        out_and.as_slice::<bool>().expect("bool"),
    );
    let mut seen_true = 0;
    for &(s, e) in &ranges {
        for p in s..e {
            let (row, col) = (p / COLS, p % COLS);
            let want_t = inp[col * ROWS + row];
            assert_eq!(ot[p], want_t, "transposed load at position {p}");
            assert_eq!(
                oa[p],
                want_t && inp[n - 1 - p],
                "reversed load at position {p}"
            );
            seen_true += usize::from(want_t);
        }
    }
    assert!(seen_true >= 2, "the test should read some set elements");
}

#[test]
fn vector_loops_give_the_scalar_results_at_every_length_and_offset() {
    // `(a * b - s) / sqrt(|a| + 1)` then `max(_, b)`, `neg`: a contiguous load, a slice
    // starting at any element (not 16-byte aligned), a broadcast scalar, constants;
    // lengths with every remainder of the vector step, and run_range starting anywhere.
    for dtype in [DType::F32, DType::F64] {
        for n in [1usize, 3, 4, 7, 8, 9, 15, 16, 17, 33, 100] {
            for offset in 0..3isize {
                let mut kb = KernelBuilder::new("k0_vec_chain", &[n]);
                let a = kb.load(dtype);
                let b = kb.load_view(dtype, n + 3, view(&[n], &[1], offset));
                let s = kb.load_view(dtype, 1, view(&[n], &[0], 0));
                let ab = kb.binary(BinaryOp::Mul, a, b);
                let num = kb.binary(BinaryOp::Sub, ab, s);
                let abs = kb.unary(UnaryOp::Abs, a);
                let one = kb.constant(dtype, Scalar::F(1.0));
                let den = kb.binary(BinaryOp::Add, abs, one);
                let root = kb.unary(UnaryOp::Sqrt, den);
                let q = kb.binary(BinaryOp::Div, num, root);
                let m = kb.binary(BinaryOp::Max, q, b);
                let out = kb.unary(UnaryOp::Neg, m);
                kb.store(out);
                let k = kb.build();
                let vt = if dtype == DType::F32 {
                    "f32x4"
                } else {
                    "f64x2"
                };
                assert!(compiled(&k).clif().contains(vt), "a vector loop");
                let av: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
                let bv: Vec<f64> = (0..n + 3).map(|i| (i as f64 * 0.11).cos()).collect();
                let (x, y, z) = (
                    array(dtype, &[n], &av),
                    array(dtype, &[n + 3], &bv),
                    array(dtype, &[1], &[0.25]),
                );
                let got = run(&k, &[&x, &y, &z]);
                let want = ndfuse_ir::interp::eval_kernel(&k, &[&x, &y, &z]).expect("reference");
                assert_eq!(
                    got[0].storage(),
                    want[0].storage(),
                    "n {n}, offset {offset}"
                );
                // A range that starts off the vector grid.
                let ck = compiled(&k);
                let mut part = HostArray::zeros(dtype, Shape::new([n]));
                ck.run_range(&[&x, &y, &z], &mut [&mut part], n / 3, n)
                    .expect("a range inside the domain");
                for i in 0..n {
                    let w = if i >= n / 3 {
                        want[0].storage().get_f64(i)
                    } else {
                        0.0
                    };
                    assert_eq!(part.storage().get_f64(i).to_bits(), w.to_bits(), "{i}");
                }
            }
        }
    }
}
