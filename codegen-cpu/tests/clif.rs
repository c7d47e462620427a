//! The generated Cranelift IR as text: snapshots of representative kernels (a change in
//! codegen shows up in review), and determinism of the text.

mod builder;

use builder::{compiled, iota, view, KernelBuilder};
use ndfuse_ir::{Accumulate, BinaryOp, DType, HostArray, Kernel, Plan, Shape, UnaryOp, View};

/// `a * b + c`, all contiguous f32: no index math, the flat position addresses all.
fn mul_add_f32() -> Kernel {
    let mut kb = KernelBuilder::new("k0_mul_add", &[4, 8]);
    let a = kb.load(DType::F32);
    let b = kb.load(DType::F32);
    let c = kb.load(DType::F32);
    let m = kb.binary(BinaryOp::Mul, a, b);
    let s = kb.binary(BinaryOp::Add, m, c);
    kb.store(s);
    kb.build()
}

/// `exp(x + row) * s` in f64: `row` broadcast along axis 0 (one division by the row
/// length), `s` a broadcast scalar loaded once before the loop, exp a call.
fn broadcast_exp_f64() -> Kernel {
    let mut kb = KernelBuilder::new("k1_add_exp_mul", &[4, 8]);
    let x = kb.load(DType::F64);
    let row = kb.load_view(DType::F64, 8, view(&[4, 8], &[0, 1], 0));
    let s = kb.load_view(DType::F64, 1, view(&[4, 8], &[0, 0], 0));
    let t = kb.binary(BinaryOp::Add, x, row);
    let e = kb.unary(UnaryOp::Exp, t);
    let r = kb.binary(BinaryOp::Mul, e, s);
    kb.store(r);
    kb.build()
}

/// `cast(transpose(x), i64)` from f32: a full decomposition into row and column and the
/// saturating conversion.
fn transpose_cast_i64() -> Kernel {
    let mut kb = KernelBuilder::new("k2_cast", &[3, 5]);
    let t = kb.load_view(
        DType::F32,
        15,
        View::contiguous(Shape::new([5, 3])).permute(&[1, 0]),
    );
    let c = kb.cast(t, DType::I64);
    kb.store(c);
    kb.build()
}

/// The full sum of 64 f32 in 4 chunks: a partial phase (a vector loop with four
/// accumulators, combined pairwise, and a scalar tail) and a combine phase.
fn split_sum_f32() -> Kernel {
    let mut kb = KernelBuilder::new("k3_sum", &[64]);
    kb.reduce_over(&[0]);
    kb.plan(Plan::Split {
        rows: 1,
        row_len: 64,
        splits: 4,
    });
    let x = kb.load(DType::F32);
    let s = kb.reduce(Accumulate::Sum, x);
    kb.store_rows(s);
    kb.build()
}

/// The column sums of `[6, 10]` f64: the band loop (accumulators on the stack; four rows
/// at a time, then the last two one at a time; vectors unrolled, vectors, scalars) and
/// the per-column stores.
fn column_sum_f64() -> Kernel {
    let mut kb = KernelBuilder::new("k4_sum", &[6, 10]);
    kb.reduce_over(&[0]);
    kb.plan(Plan::Columns {
        cols: 10,
        col_len: 6,
    });
    let x = kb.load(DType::F64);
    let s = kb.reduce(Accumulate::Sum, x);
    kb.store_rows(s);
    kb.build()
}

#[test]
fn clif_split_sum_f32() {
    let ck = compiled(&split_sum_f32());
    insta::assert_snapshot!(ck.clif());
    let x = iota(DType::F32, &[64]);
    let mut out = HostArray::zeros(DType::F32, Shape::new([1]));
    ck.run(&[&x], &mut [&mut out]).expect("arguments fit");
    assert_eq!(out.as_slice::<f32>(), Some(&[2016.0f32][..]));
}

#[test]
fn clif_column_sum_f64() {
    let ck = compiled(&column_sum_f64());
    insta::assert_snapshot!(ck.clif());
    let x = iota(DType::F64, &[6, 10]);
    let mut out = HostArray::zeros(DType::F64, Shape::new([10]));
    ck.run(&[&x], &mut [&mut out]).expect("arguments fit");
    let want: Vec<f64> = (0..10)
        .map(|c| (0..6).map(|r| (r * 10 + c) as f64).sum())
        .collect();
    assert_eq!(out.as_slice::<f64>(), Some(&want[..]));
}

#[test]
fn clif_mul_add_f32() {
    insta::assert_snapshot!(compiled(&mul_add_f32()).clif());
}

#[test]
fn clif_broadcast_exp_f64() {
    insta::assert_snapshot!(compiled(&broadcast_exp_f64()).clif());
}

#[test]
fn clif_transpose_cast_i64() {
    let k = transpose_cast_i64();
    let ck = compiled(&k);
    insta::assert_snapshot!(ck.clif());
    // And it computes what the snapshot says.
    let x = iota(DType::F32, &[5, 3]);
    let mut out = HostArray::zeros(DType::I64, Shape::new([3, 5]));
    ck.run(&[&x], &mut [&mut out]).expect("arguments fit");
    let want: Vec<i64> = (0..15).map(|p| ((p % 5) * 3 + p / 5) as i64).collect();
    assert_eq!(out.as_slice::<i64>(), Some(&want[..]));
}

#[test]
fn same_kernel_same_text() {
    for k in [
        mul_add_f32(),
        broadcast_exp_f64(),
        transpose_cast_i64(),
        split_sum_f32(),
        column_sum_f64(),
    ] {
        let (a, b) = (compiled(&k), compiled(&k));
        assert_eq!(a.clif(), b.clif());
        assert_eq!(a.name(), k.name);
        assert!(
            a.clif().contains(&format!("function %{}", k.name)),
            "{}",
            a.clif()
        );
    }
}

#[test]
fn compiling_a_small_kernel_takes_milliseconds() {
    // Warm the host ISA (built once per process), then time a typical compile. The
    // bound is loose (debug builds of this crate, shared CI machines); the number is
    // printed for the record.
    let _ = compiled(&mul_add_f32());
    let ck = compiled(&broadcast_exp_f64());
    eprintln!("compile time of {}: {:?}", ck.name(), ck.compile_time());
    assert!(
        ck.compile_time().as_millis() < 500,
        "{:?}",
        ck.compile_time()
    );
}
