//! The CUDA backend on a real GPU, differential against the reference interpreter:
//! every catalogue graph, every unary and binary op on every dtype over contiguous and
//! strided inputs, determinism from run to run, the device cache's limits, and running
//! out of device memory as an error.
//!
//! Without a GPU these tests print why and pass, unless `NDFUSE_REQUIRE_CUDA=1` (set by
//! `scripts/gpu-check.sh` on the GPU machine), which turns a missing GPU into a failure.
//!
//! Tolerances. Element-wise arithmetic is IEEE and compiled without FMA contraction, so
//! it matches the reference bit for bit; math functions come from CUDA's libdevice,
//! whose documented error bounds (`ndfuse_codegen_cuda`'s scalar module has the table)
//! are the budgets in [`ulp_budget`]. Half results are computed in f32 and rounded once,
//! so they may differ from the reference's single rounding of the exact value by one
//! half ulp step. Reductions combine in a tree instead of the reference's exact sum:
//! the catalogue's `F32_ACC` bound covers any summation order of those rows.

use ndfuse::{BackendKind, Context, DType, SliceArg, Tensor};
use ndfuse_ir::UnaryOp;
use ndfuse_runtime::{Config, Registry};
use ndfuse_tests::catalogue::{Tol, CATALOGUE};
use ndfuse_tests::{assert_close, ulp_distance};

/// Whether a CUDA device can run here; panics when one is required and absent.
fn gpu_or_skip(test: &str) -> bool {
    let cfg = Config::load().expect("configuration loads");
    let reg = Registry::discover(&cfg);
    let entry = reg.get(BackendKind::Cuda).expect("cuda is registered");
    if entry.is_available() {
        return true;
    }
    let why = format!("{entry:?}");
    if std::env::var("NDFUSE_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        panic!("NDFUSE_REQUIRE_CUDA=1 but the CUDA backend is unavailable: {why}");
    }
    eprintln!("{test}: skipped: no CUDA device ({why})");
    false
}

fn eval_on(ctx: &Context, outs: &[&Tensor], b: BackendKind) -> Vec<ndfuse::Array> {
    ctx.set_backend(b);
    ctx.eval(outs).unwrap_or_else(|e| panic!("{b:?}: {e}"))
}

/// Max ulp error of `op` computed in `dtype` by the CUDA backend (see the module docs).
fn ulp_budget(op: UnaryOp, dtype: DType) -> u64 {
    if matches!(dtype, DType::F16 | DType::BF16) {
        return 1;
    }
    let f32 = dtype == DType::F32;
    match op {
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Sqrt
        | UnaryOp::Square
        | UnaryOp::Recip
        | UnaryOp::Relu
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Not => 0,
        UnaryOp::Rsqrt | UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Expm1 => 1,
        UnaryOp::Exp | UnaryOp::Tanh => {
            if f32 {
                2
            } else {
                1
            }
        }
        UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Erf => 2,
        UnaryOp::Sigmoid => {
            if f32 {
                4
            } else {
                3
            }
        }
    }
}

#[test]
fn every_catalogue_graph_matches_the_reference_on_the_gpu() {
    if !gpu_or_skip("every_catalogue_graph_matches_the_reference_on_the_gpu") {
        return;
    }
    for case in CATALOGUE {
        let ctx = Context::new();
        let outs = (case.build)(&ctx);
        let refs: Vec<&Tensor> = outs.iter().collect();
        let want = eval_on(&ctx, &refs, BackendKind::Interp);
        let got = eval_on(&ctx, &refs, BackendKind::Cuda);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let what = format!("{} output {i} (cuda)", case.name);
            // Exact on the CPU means "the same steps": on the GPU the math functions
            // may differ by their documented ulp budget (4 at most, relative 5e-7).
            let (rtol, atol) = match case.tol {
                Tol::Exact => (5e-7, 1e-30),
                Tol::Close(r, a) => (r, a),
            };
            assert_close(g, w, rtol, atol, &what);
        }
    }
}

/// `op` applied through its method.
fn apply(x: &Tensor, op: UnaryOp) -> Tensor {
    match op {
        UnaryOp::Neg => x.neg(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sign => x.sign(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.log(),
        UnaryOp::Log1p => x.log1p(),
        UnaryOp::Expm1 => x.expm1(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => x.rsqrt(),
        UnaryOp::Square => x.square(),
        UnaryOp::Recip => x.recip(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => x.sigmoid(),
        UnaryOp::Relu => x.relu(),
        UnaryOp::Erf => x.erf(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round(),
        UnaryOp::Not => x.logical_not(),
    }
}

#[test]
fn every_unary_op_on_every_float_dtype_contiguous_and_strided() {
    if !gpu_or_skip("every_unary_op_on_every_float_dtype_contiguous_and_strided") {
        return;
    }
    for &dtype in &[DType::F32, DType::F64, DType::F16, DType::BF16] {
        for op in UnaryOp::ALL.into_iter().filter(|&op| op != UnaryOp::Not) {
            let ctx = Context::new();
            // Positive inputs for the logs and roots, both signs for the rest.
            let x = if matches!(
                op,
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log1p
            ) {
                ctx.rand_uniform(&[96, 80], 0.01, 50.0, 7)
            } else {
                ctx.rand_normal(&[96, 80], 0.0, 3.0, 7)
            };
            let x = x.cast(dtype);
            let contiguous = apply(&x, op);
            let strided = apply(&x.transpose().slice(&[SliceArg::new(None, None, -2)]), op);
            let want = eval_on(&ctx, &[&contiguous, &strided], BackendKind::Interp);
            let got = eval_on(&ctx, &[&contiguous, &strided], BackendKind::Cuda);
            let budget = ulp_budget(op, dtype);
            for (layout, (g, w)) in ["contiguous", "strided"].iter().zip(got.iter().zip(&want)) {
                let (gv, wv) = (g.to_f64_vec(), w.to_f64_vec());
                assert_eq!(gv.len(), wv.len());
                for (k, (a, b)) in gv.iter().zip(&wv).enumerate() {
                    let d = ulp_distance(*a, *b, dtype);
                    assert!(
                        d <= budget,
                        "{op:?} {dtype} {layout} [{k}]: cuda {a:e} vs reference {b:e}: {d} ulp > {budget}"
                    );
                }
            }
        }
    }
}

#[test]
fn integer_and_bool_ops_are_exact() {
    if !gpu_or_skip("integer_and_bool_ops_are_exact") {
        return;
    }
    for &dtype in &[DType::I32, DType::I64] {
        let ctx = Context::new();
        let a = ctx.rand_uniform(&[64, 33], -1e6, 1e6, 1).cast(dtype);
        let b = ctx.rand_uniform(&[33], -50.0, 50.0, 2).cast(dtype);
        let outs = vec![
            &a + &b,
            &a - &b,
            &a * &b,
            a.maximum(&b),
            a.minimum(&b),
            a.abs(),
            -&a,
            a.lt(&b).cast(dtype),
            a.sum(1),
            a.max(0),
            a.argmax(1),
            a.cast(DType::F32),
            (a.cast(DType::F64) * 1e13).cast(dtype),
        ];
        let refs: Vec<&Tensor> = outs.iter().collect();
        let want = eval_on(&ctx, &refs, BackendKind::Interp);
        let got = eval_on(&ctx, &refs, BackendKind::Cuda);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(g, w, 0.0, 0.0, &format!("{dtype} op {i}"));
        }
    }
}

#[test]
fn results_are_bit_identical_run_to_run() {
    if !gpu_or_skip("results_are_bit_identical_run_to_run") {
        return;
    }
    let ctx = Context::new();
    let x = ctx.rand_normal(&[1 << 20], 0.0, 1.0, 3);
    let m = ctx.rand_normal(&[512, 2048], 0.0, 1.0, 4);
    let outs = [
        x.sum(0),
        x.var(0),
        m.softmax(-1),
        m.sum(0),
        m.layernorm(-1, 1e-5),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let first = eval_on(&ctx, &refs, BackendKind::Cuda);
    for _ in 0..5 {
        let again = eval_on(&ctx, &refs, BackendKind::Cuda);
        for (a, b) in again.iter().zip(&first) {
            assert_close(a, b, 0.0, 0.0, "run to run");
        }
    }
}

#[test]
fn running_out_of_device_memory_is_an_error() {
    if !gpu_or_skip("running_out_of_device_memory_is_an_error") {
        return;
    }
    let ctx = Context::new();
    // 2^38 f32 elements: a terabyte, more than any GPU has; the input is one broadcast
    // constant, so the host never holds it.
    let huge = ctx.full(&[1 << 38], 1.0).exp();
    ctx.set_backend(BackendKind::Cuda);
    let err = huge.eval().expect_err("a terabyte does not fit");
    let msg = err.to_string();
    assert!(msg.contains("out of memory"), "{msg}");
    // The device still works afterwards.
    let ok = (ctx.full(&[1024], 2.0) * 3.0)
        .eval()
        .expect("small evals still run");
    assert_eq!(ok.to_f64_vec()[0], 6.0);
}

#[test]
fn the_device_cache_reuses_buffers_and_honours_its_limits() {
    if !gpu_or_skip("the_device_cache_reuses_buffers_and_honours_its_limits") {
        return;
    }
    let cfg = Config::load().expect("configuration loads");
    let dev = ndfuse_runtime::cuda_device(0, &cfg).expect("device 0");
    let ctx = Context::new();
    let a = ctx.rand_normal(&[1 << 18], 0.0, 1.0, 5);
    let y = (&a * 2.0).exp().sum(0);
    ctx.set_backend(BackendKind::Cuda);
    y.eval().expect("first eval");
    let before = dev.cache().stats();
    y.eval().expect("second eval");
    let after = dev.cache().stats();
    assert!(
        after.hits > before.hits,
        "a repeated eval takes its buffers from the cache: {before:?} -> {after:?}"
    );
    assert!(after.bytes_cached <= dev.cache().limits().max_cache);
    dev.cache().trim();
    assert_eq!(dev.cache().stats().bytes_cached, 0);
}

#[test]
fn data_kept_on_the_device_is_read_there_until_it_is_dropped() {
    if !gpu_or_skip("data_kept_on_the_device_is_read_there_until_it_is_dropped") {
        return;
    }
    let cfg = Config::load().expect("configuration loads");
    let dev = ndfuse_runtime::cuda_device(0, &cfg).expect("device 0");
    let ctx = Context::new();
    let w = ctx.rand_normal(&[512, 512], 0.0, 1.0, 9);
    let before = dev.resident_bytes();
    ctx.keep_on_device(&w, &ndfuse::DeviceId::cuda(0))
        .expect("kept on cuda:0");
    assert_eq!(dev.resident_bytes(), before + 512 * 512 * 4);
    let y = (&w * 2.0).sum(1);
    let want = eval_on(&ctx, &[&y], BackendKind::Interp);
    let got = eval_on(&ctx, &[&y], BackendKind::Cuda);
    assert_close(&got[0], &want[0], 1e-5, 1e-5, "resident input");
    drop((w, y));
    assert_eq!(
        dev.resident_bytes(),
        before,
        "the copy goes once the data is dropped"
    );
}

#[test]
fn every_launch_strategy_matches_the_reference_on_the_gpu() {
    if !gpu_or_skip("every_launch_strategy_matches_the_reference_on_the_gpu") {
        return;
    }
    let ctx = Context::new();
    let x = |shape: &[usize]| ctx.rand_normal(shape, 0.5, 2.0, shape.iter().sum::<usize>() as u64);
    // Shapes that reach every strategy of the emitter at the default launch limits.
    let cases: Vec<(&str, Tensor, f64)> = vec![
        (
            "softmax rows of 4096, in registers",
            x(&[64, 4096]).softmax(-1),
            1e-5,
        ),
        (
            "softmax rows of 40000, three passes",
            x(&[4, 40000]).softmax(-1),
            1e-5,
        ),
        (
            "layernorm rows of 1024",
            x(&[256, 1024]).layernorm(-1, 1e-5),
            2e-5,
        ),
        ("full sum of 2^24, split", x(&[1 << 24]).sum(0), 1e-5),
        ("full var, split in two sweeps", x(&[1 << 20]).var(0), 1e-5),
        (
            "argmax of long rows, split",
            x(&[16, 50_000]).argmax(1).cast(DType::F64),
            0.0,
        ),
        ("column sum, tile", x(&[2048, 256]).sum(0), 1e-5),
        ("middle axis sum, tile", x(&[8, 64, 32]).sum(1), 1e-5),
        ("rows of 7, thread per row", x(&[10_000, 7]).max(1), 0.0),
        (
            "broadcast, vectorised",
            &(&x(&[1024, 512]) * &x(&[512])) + &x(&[1024, 1]),
            0.0,
        ),
        (
            "f16 gelu, 16-byte loads",
            x(&[1 << 20]).cast(DType::F16).gelu(),
            2e-3,
        ),
    ];
    for (name, y, rtol) in &cases {
        let want = eval_on(&ctx, &[y], BackendKind::Interp);
        let got = eval_on(&ctx, &[y], BackendKind::Cuda);
        assert_close(&got[0], &want[0], rtol.max(5e-7), 1e-5, name);
    }
}
