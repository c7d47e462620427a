//! Parallel runs: `CompiledKernel::run` cuts a kernel into chunks fixed by its shape and
//! runs them on rayon's threads. Its outputs must be bit-identical on pools of 1, 2 and
//! 4 threads, and to one sequential call over the whole domain (`run_range`), for
//! element-wise kernels (chunks of positions), row kernels (chunks of whole rows) and
//! split kernels (chunks of rows, partials combined in chunk order);
//! argument checks still come first, and a kernel of one chunk runs inline.

mod builder;

use builder::{compiled, zeroed_outputs, KernelBuilder};
use ndfuse_codegen_cpu::{CodegenError, CompiledKernel};
use ndfuse_ir::{
    Accumulate, ArgReduceOp, BinaryOp, DType, HostArray, Kernel, Plan, Scalar, Shape, UnaryOp,
};

/// A small deterministic generator of floats in [-8, 8).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f64 / (1u64 << 31) as f64) * 16.0 - 8.0
        })
        .collect()
}

fn input(dtype: DType, shape: &[usize], seed: u64) -> HostArray {
    let n = shape.iter().product();
    HostArray::from_f64s(dtype, Shape::new(shape), &values(n, seed))
}

/// Every output's values as bit patterns (f32 widens to f64 exactly), so that equality
/// means bit-identical, NaNs and signed zeros included.
fn bits(outs: &[HostArray]) -> Vec<Vec<u64>> {
    outs.iter()
        .map(|a| a.to_f64s().into_iter().map(f64::to_bits).collect())
        .collect()
}

/// The outputs of one sequential call over the whole domain (or every row).
fn sequential(kernel: &Kernel, ck: &CompiledKernel, inputs: &[&HostArray]) -> Vec<HostArray> {
    let extent = if kernel.reduce_axes.is_empty() {
        kernel.domain.numel()
    } else {
        kernel.rows()
    };
    let mut outs = zeroed_outputs(kernel);
    let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
    ck.run_range(inputs, &mut refs, 0, extent)
        .unwrap_or_else(|e| panic!("{e}"));
    outs
}

/// The outputs of `run` inside a pool of `threads` threads.
fn parallel(
    kernel: &Kernel,
    ck: &CompiledKernel,
    inputs: &[&HostArray],
    threads: usize,
) -> Vec<HostArray> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap_or_else(|e| panic!("building a pool of {threads} threads: {e}"));
    pool.install(|| {
        assert_eq!(rayon::current_num_threads(), threads);
        let mut outs = zeroed_outputs(kernel);
        let mut refs: Vec<&mut HostArray> = outs.iter_mut().collect();
        ck.run(inputs, &mut refs).unwrap_or_else(|e| panic!("{e}"));
        outs
    })
}

/// Checks that `kernel` is cut into at least `min_chunks` chunks and that `run` on 1, 2
/// and 4 threads gives exactly the sequential result.
fn assert_deterministic(kernel: &Kernel, inputs: &[&HostArray], min_chunks: usize) {
    let ck = compiled(kernel);
    assert!(
        ck.chunks() >= min_chunks,
        "{}: {} chunks, expected at least {min_chunks}",
        kernel.name,
        ck.chunks()
    );
    let want = bits(&sequential(kernel, &ck, inputs));
    for threads in [1, 2, 4] {
        let got = bits(&parallel(kernel, &ck, inputs, threads));
        assert!(
            got == want,
            "{}: {threads} threads differ from the sequential run",
            kernel.name
        );
    }
}

/// `exp(a * b + c) * sqrt(abs(a)) - b / (1 + c * c)` over `n` positions.
fn chain(dtype: DType, n: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_chain", &[n]);
    let a = kb.load(dtype);
    let b = kb.load(dtype);
    let c = kb.load(dtype);
    let ab = kb.binary(BinaryOp::Mul, a, b);
    let abc = kb.binary(BinaryOp::Add, ab, c);
    let e = kb.unary(UnaryOp::Exp, abc);
    let abs = kb.unary(UnaryOp::Abs, a);
    let sq = kb.unary(UnaryOp::Sqrt, abs);
    let left = kb.binary(BinaryOp::Mul, e, sq);
    let one = kb.constant(dtype, Scalar::F(1.0).cast(dtype));
    let cc = kb.binary(BinaryOp::Mul, c, c);
    let den = kb.binary(BinaryOp::Add, one, cc);
    let right = kb.binary(BinaryOp::Div, b, den);
    let out = kb.binary(BinaryOp::Sub, left, right);
    kb.store(out);
    kb.build()
}

/// softmax over the last axis of `[rows, cols]`.
fn softmax(dtype: DType, rows: usize, cols: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_max_sub_exp_sum_div", &[rows, cols]);
    kb.reduce_over(&[1]);
    let x = kb.load(dtype);
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let s = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    kb.build()
}

/// The sum over `axis` of `[rows, cols]`, one element per kept position, with the plan
/// the passes would pick (rows for the last axis, columns for the first).
fn sum(dtype: DType, rows: usize, cols: usize, axis: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_sum", &[rows, cols]);
    kb.reduce_over(&[axis]);
    if axis == 0 {
        kb.plan(Plan::Columns {
            cols,
            col_len: rows,
        });
    }
    let x = kb.load(dtype);
    let s = kb.reduce(Accumulate::Sum, x);
    kb.store_rows(s);
    kb.build()
}

/// A per-row store and an element store in one row kernel: the row mean, and `x - mean`.
fn centre(dtype: DType, rows: usize, cols: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_sum_div_sub", &[rows, cols]);
    kb.reduce_over(&[1]);
    let x = kb.load(dtype);
    let s = kb.reduce(Accumulate::Sum, x);
    let n = kb.constant(dtype, Scalar::F(cols as f64).cast(dtype));
    let mean = kb.binary(BinaryOp::Div, s, n);
    let centred = kb.binary(BinaryOp::Sub, x, mean);
    kb.store_rows(mean);
    kb.store(centred);
    kb.build()
}

#[test]
fn elementwise_is_bit_identical_on_1_2_4_threads() {
    // Not a multiple of the chunk, so the last chunk is short.
    let n = 1_000_003;
    for dtype in [DType::F32, DType::F64] {
        let (a, b, c) = (
            input(dtype, &[n], 1),
            input(dtype, &[n], 2),
            input(dtype, &[n], 3),
        );
        assert_deterministic(&chain(dtype, n), &[&a, &b, &c], 15);
    }
}

#[test]
fn softmax_rows_are_bit_identical_on_1_2_4_threads() {
    for dtype in [DType::F32, DType::F64] {
        let x = input(dtype, &[2001, 500], 4);
        assert_deterministic(&softmax(dtype, 2001, 500), &[&x], 15);
    }
}

#[test]
fn sums_over_either_axis_are_bit_identical_on_1_2_4_threads() {
    for dtype in [DType::F32, DType::F64] {
        let x = input(dtype, &[1000, 1000], 5);
        // Over the last axis: contiguous rows, one sum each.
        assert_deterministic(&sum(dtype, 1000, 1000, 1), &[&x], 15);
        // Over the first axis: columns, swept in bands of 1024 columns (a call covers
        // whole bands, so 5000 columns are 5 chunks, the last one short).
        let wide = input(dtype, &[500, 5000], 5);
        assert_deterministic(&sum(dtype, 500, 5000, 0), &[&wide], 5);
    }
}

#[test]
fn row_and_element_stores_are_bit_identical_on_1_2_4_threads() {
    let x = input(DType::F32, &[999, 1001], 6);
    assert_deterministic(&centre(DType::F32, 999, 1001), &[&x], 15);
}

#[test]
fn a_split_row_runs_in_chunks_and_is_bit_identical_on_1_2_4_threads() {
    // One long row cut into 16 chunks: each chunk is reduced by its own call (on any
    // thread), and the partials are combined in chunk order, so the thread count does
    // not change a bit. Two sweeps (sum, then the sum of squared deviations), argmax,
    // and an element store, so every phase runs.
    let n = 1 << 20;
    for dtype in [DType::F32, DType::F64] {
        let mut kb = KernelBuilder::new("k0_split", &[n]);
        kb.reduce_over(&[0]);
        kb.plan(Plan::Split {
            rows: 1,
            row_len: n,
            splits: 16,
        });
        let x = kb.load(dtype);
        let s = kb.reduce(Accumulate::Sum, x);
        let d = kb.binary(BinaryOp::Sub, x, s);
        let d2 = kb.binary(BinaryOp::Mul, d, d);
        let ss = kb.reduce(Accumulate::Sum, d2);
        let am = kb.arg_reduce(ArgReduceOp::ArgMax, x);
        kb.store_rows(s);
        kb.store_rows(ss);
        kb.store_rows(am);
        kb.store(d);
        let k = kb.build();
        let x = input(dtype, &[n], 7);
        assert_deterministic(&k, &[&x], 16);
    }
}

#[test]
fn a_small_kernel_runs_inline_and_correctly() {
    let n = 1000;
    let mut kb = KernelBuilder::new("k0_add", &[n]);
    let a = kb.load(DType::F64);
    let b = kb.load(DType::F64);
    let s = kb.binary(BinaryOp::Add, a, b);
    kb.store(s);
    let k = kb.build();
    let ck = compiled(&k);
    assert_eq!(ck.chunks(), 1);
    let (a, b) = (input(DType::F64, &[n], 8), input(DType::F64, &[n], 9));
    let mut out = HostArray::zeros(DType::F64, Shape::new([n]));
    ck.run(&[&a, &b], &mut [&mut out])
        .unwrap_or_else(|e| panic!("{e}"));
    let want: Vec<f64> = a
        .to_f64s()
        .iter()
        .zip(b.to_f64s())
        .map(|(x, y)| x + y)
        .collect();
    assert_eq!(out.to_f64s(), want);
    // Inside a pool too.
    let outs = parallel(&k, &ck, &[&a, &b], 2);
    assert_eq!(outs[0].to_f64s(), want);
}

#[test]
fn an_empty_kernel_has_no_chunks() {
    let mut kb = KernelBuilder::new("k0_neg", &[0]);
    let a = kb.load(DType::F32);
    let n = kb.unary(UnaryOp::Neg, a);
    kb.store(n);
    let k = kb.build();
    let ck = compiled(&k);
    assert_eq!(ck.chunks(), 0);
    let a = HostArray::zeros(DType::F32, Shape::new([0]));
    let mut out = HostArray::zeros(DType::F32, Shape::new([0]));
    ck.run(&[&a], &mut [&mut out])
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn arguments_are_checked_before_any_chunk_runs() {
    let n = 1 << 20;
    let k = chain(DType::F32, n);
    let ck = compiled(&k);
    let (a, b, c) = (
        input(DType::F32, &[n], 1),
        input(DType::F32, &[n], 2),
        input(DType::F32, &[n], 3),
    );
    let short = input(DType::F32, &[n - 1], 3);
    let wrong_dtype = input(DType::F64, &[n], 3);
    let mut out = HostArray::zeros(DType::F32, Shape::new([n]));
    let untouched = bits(std::slice::from_ref(&out));
    let is_args = |r: Result<(), CodegenError>| matches!(r, Err(CodegenError::Args { .. }));
    assert!(is_args(ck.run(&[&a, &b], &mut [&mut out])));
    assert!(is_args(ck.run(&[&a, &b, &short], &mut [&mut out])));
    assert!(is_args(ck.run(&[&a, &b, &wrong_dtype], &mut [&mut out])));
    let mut short_out = HostArray::zeros(DType::F32, Shape::new([n - 1]));
    assert!(is_args(ck.run(&[&a, &b, &c], &mut [&mut short_out])));
    assert!(is_args(ck.run(&[&a, &b, &c], &mut [])));
    assert!(is_args(ck.run_range(
        &[&a, &b, &c],
        &mut [&mut out],
        0,
        n + 1
    )));
    // Nothing ran: the output is still all zeros.
    assert!(bits(std::slice::from_ref(&out)) == untouched);
}

#[test]
fn run_range_is_one_sequential_call_over_its_range() {
    let k = softmax(DType::F32, 2001, 500);
    let ck = compiled(&k);
    let x = input(DType::F32, &[2001, 500], 10);
    let whole = parallel(&k, &ck, &[&x], 4);
    // Rows 100..1500 span several chunks and start and end inside one.
    let mut part = HostArray::zeros(DType::F32, Shape::new([2001, 500]));
    ck.run_range(&[&x], &mut [&mut part], 100, 1500)
        .unwrap_or_else(|e| panic!("{e}"));
    let (got, want) = (part.to_f64s(), whole[0].to_f64s());
    for (p, (g, w)) in got.iter().zip(&want).enumerate() {
        let row = p / 500;
        if (100..1500).contains(&row) {
            assert_eq!(g.to_bits(), w.to_bits(), "position {p}");
        } else {
            assert_eq!(*g, 0.0, "position {p} outside the range was written");
        }
    }
}
