//! Row programs on the wide path (their wide values made a whole row at a time in the
//! row cache by the AVX-512/AVX2 routines) against the same kernels on the 128-bit
//! code alone: the same bits for every output, for softmax on f32, f16 and bf16 at rows
//! of 4096, 1007 and 5 elements, a log-sum-exp, a row program whose tanh and sigmoid
//! are cached, a chain of two wide ops in one sweep, and a row read across a
//! transposed view; on 1, 2 and 4 threads. Each checks that the wide path called the
//! routine and that the 128-bit code did not.
//! Kernels below 2^16 positions stay on the 128-bit code (as element-wise ones do).
//! Tolerance: the same bits (two NaNs count as equal whatever their payload).

mod builder;

use builder::{view, zeroed_outputs, KernelBuilder};
use ndfuse_codegen_cpu::wide::{self, Tier};
use ndfuse_codegen_cpu::{compile_with, CompiledKernel};
use ndfuse_ir::{Accumulate, BinaryOp, DType, HostArray, Kernel, Shape, UnaryOp};

fn tiers() -> Vec<Tier> {
    let t = wide::available();
    if t.is_empty() {
        eprintln!("no wide tier on this host: nothing to compare");
    }
    t
}

/// Inputs of `kernel`: values over [-12, 12] with a few specials (NaN, inf, -0, 100).
fn inputs(kernel: &Kernel) -> Vec<HostArray> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    kernel
        .inputs
        .iter()
        .map(|b| {
            let vals: Vec<f64> = (0..b.len)
                .map(|i| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    match i % 4999 {
                        0 => f64::NAN,
                        1 => f64::INFINITY,
                        2 => -0.0,
                        3 => 100.0,
                        _ => ((s >> 11) as f64 / (1u64 << 53) as f64) * 24.0 - 12.0,
                    }
                })
                .collect();
            HostArray::from_f64s(b.dtype, Shape::new([b.len]), &vals)
        })
        .collect()
}

fn run_on(
    ck: &CompiledKernel,
    kernel: &Kernel,
    ins: &[HostArray],
    threads: usize,
) -> Vec<HostArray> {
    let mut outs = zeroed_outputs(kernel);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    pool.install(|| {
        let refs: Vec<&HostArray> = ins.iter().collect();
        let mut out_refs: Vec<&mut HostArray> = outs.iter_mut().collect();
        ck.run(&refs, &mut out_refs).expect("runs");
    });
    outs
}

fn bits(a: &HostArray) -> Vec<u64> {
    (0..a.len())
        .map(|i| {
            let v = a.storage().get_f64(i);
            if v.is_nan() {
                u64::MAX
            } else {
                v.to_bits()
            }
        })
        .collect()
}

/// `kernel` with the wide routines of every tier gives the bits of the 128-bit code,
/// and calls each routine of `routines` only on the wide path.
fn check(kernel: &Kernel, routines: &[UnaryOp]) {
    let ins = inputs(kernel);
    let narrow = compile_with(kernel, None).expect("compiles on the 128-bit code");
    for &op in routines {
        let name = format!("ndfuse_wide_{}", op.name());
        assert!(
            !narrow.clif().contains(&name),
            "{}: None calls {name}",
            kernel.name
        );
    }
    let want: Vec<Vec<u64>> = run_on(&narrow, kernel, &ins, 2).iter().map(bits).collect();
    // A row with an ordinary value somewhere: the comparison is not of NaNs only.
    assert!(
        want.iter().any(|o| o.iter().any(|&b| b != u64::MAX)),
        "{}: every output is NaN",
        kernel.name
    );
    for tier in tiers() {
        let ck = compile_with(kernel, Some(tier)).expect("compiles on the wide path");
        for &op in routines {
            let name = format!("ndfuse_wide_{}", op.name());
            assert!(
                ck.clif().contains(&name),
                "{} ({}): no call of {name}\n{}",
                kernel.name,
                tier.name(),
                ck.clif()
            );
        }
        for threads in [1, 2, 4] {
            let got = run_on(&ck, kernel, &ins, threads);
            for (o, (g, w)) in got.iter().map(bits).zip(&want).enumerate() {
                if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
                    panic!(
                        "{} ({}, {threads} threads) output {o} position {i}: {} against {} \
                         on the 128-bit code",
                        kernel.name,
                        tier.name(),
                        got[o].storage().get_f64(i),
                        f64::from_bits(w[i])
                    );
                }
            }
        }
    }
}

/// softmax over the rows of [rows, len]: m = max x; e = exp(x - m); s = sum e; e / s.
fn softmax(dtype: DType, rows: usize, len: usize) -> Kernel {
    let mut kb = KernelBuilder::new(&format!("k_softmax_{dtype}_{len}"), &[rows, len]);
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

#[test]
fn softmax_on_every_float_type_and_row_length_matches_the_128_bit_code() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, len) in [(24, 4096), (67, 1000 + 7), (13_200, 5)] {
            check(&softmax(dtype, rows, len), &[UnaryOp::Exp]);
        }
    }
}

#[test]
fn softmax_across_a_transposed_view_matches() {
    // Rows read with a stride: the fill pass and the sweeps stay scalar.
    let (rows, len) = (130, 515);
    let mut kb = KernelBuilder::new("k_softmax_transposed", &[rows, len]);
    kb.reduce_over(&[1]);
    let x = kb.load_view(
        DType::F32,
        rows * len,
        view(&[rows, len], &[1, rows as isize], 0),
    );
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let s = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    check(&kb.build(), &[UnaryOp::Exp]);
}

#[test]
fn log_sum_exp_matches() {
    // exp(x - m) feeds one sweep only: not cached on the 128-bit code, made wide here.
    for dtype in [DType::F32, DType::BF16] {
        for (rows, len) in [(40, 4096), (66, 1007)] {
            let mut kb = KernelBuilder::new(&format!("k_lse_{dtype}_{len}"), &[rows, len]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let m = kb.reduce(Accumulate::Max, x);
            let d = kb.binary(BinaryOp::Sub, x, m);
            let e = kb.unary(UnaryOp::Exp, d);
            let s = kb.reduce(Accumulate::Sum, e);
            let l = kb.unary(UnaryOp::Log, s);
            let y = kb.binary(BinaryOp::Add, l, m);
            kb.store_rows(y);
            check(&kb.build(), &[UnaryOp::Exp]);
        }
    }
}

#[test]
fn cached_tanh_and_sigmoid_match() {
    // t = tanh(x) is made before sweep 0 and read by the stores; sigmoid(t - mean t)
    // is made from the cached t before the stores.
    for dtype in [DType::F32, DType::F16] {
        for (rows, len) in [(33, 2048), (66, 1007), (13_200, 5)] {
            let mut kb = KernelBuilder::new(&format!("k_tanh_sig_{dtype}_{len}"), &[rows, len]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let t = kb.unary(UnaryOp::Tanh, x);
            let s = kb.reduce(Accumulate::Sum, t);
            let n = kb.constant(dtype, ndfuse_ir::Scalar::F(len as f64));
            let mean = kb.binary(BinaryOp::Div, s, n);
            let c = kb.binary(BinaryOp::Sub, t, mean);
            let g = kb.unary(UnaryOp::Sigmoid, c);
            let y = kb.binary(BinaryOp::Mul, g, t);
            kb.store(y);
            kb.store(t);
            check(&kb.build(), &[UnaryOp::Tanh, UnaryOp::Sigmoid]);
        }
    }
}

#[test]
fn a_chain_of_wide_ops_in_one_sweep_matches() {
    // softplus(x) = log1p(exp(x)): exp is made first, then log1p from its row.
    let (rows, len) = (30, 3000 + 1);
    let mut kb = KernelBuilder::new("k_softplus_norm", &[rows, len]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::F32);
    let e = kb.unary(UnaryOp::Exp, x);
    let p = kb.unary(UnaryOp::Log1p, e);
    let s = kb.reduce(Accumulate::Sum, p);
    let mx = kb.reduce(Accumulate::Max, e);
    let o = kb.binary(BinaryOp::Div, p, s);
    let q = kb.binary(BinaryOp::Div, e, mx);
    kb.store(o);
    kb.store(q);
    check(&kb.build(), &[UnaryOp::Exp, UnaryOp::Log1p]);
}

#[test]
fn small_row_programs_stay_on_the_128_bit_code() {
    // Below 2^16 positions (`blocks::BLOCKS_FROM`), as element-wise kernels.
    let k = softmax(DType::F32, 15, 4096);
    assert!(k.domain.numel() < 1 << 16);
    for tier in tiers() {
        let ck = compile_with(&k, Some(tier)).expect("compiles");
        assert!(!ck.clif().contains("ndfuse_wide_"), "{}", tier.name());
    }
    check(&k, &[]);
}
