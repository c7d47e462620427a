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
use ndfuse_tests::{assert_close, check_close, ulp_distance};

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

/// Max ulp distance between `op` computed in `dtype` by the CUDA backend and the
/// reference (see the module docs): CUDA's documented bound, plus, for f64, the
/// reference's own error. An f64 reference is no exact oracle for the transcendental
/// functions: Rust's `f64` methods call glibc, whose x86-64 bounds (`libm-test-ulps`)
/// are 2 ulp for `tanh` and 1 for the other functions here (`erf` comes from the `libm`
/// crate, within 1). Two results each within its own bound of the exact value are
/// within the sum of the bounds of each other (seen on an H100: tanh f64 at 2 ulp).
/// f32 and half references are computed in f64 and rounded once, so they add nothing.
fn ulp_budget(op: UnaryOp, dtype: DType) -> u64 {
    let cuda = cuda_ulp_bound(op, dtype);
    if dtype != DType::F64 {
        return cuda;
    }
    let reference = match op {
        UnaryOp::Tanh => 2,
        UnaryOp::Exp
        | UnaryOp::Log
        | UnaryOp::Log1p
        | UnaryOp::Expm1
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Erf
        | UnaryOp::Sigmoid => 1,
        _ => 0,
    };
    cuda + reference
}

/// CUDA's documented max ulp error of `op` in `dtype` (the CUDA C Programming Guide's
/// tables for libdevice; `nd_sigmoid` adds the division's rounding to `exp`'s).
fn cuda_ulp_bound(op: UnaryOp, dtype: DType) -> u64 {
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
    let mut failures = Vec::new();
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
                // The worst element of each op, dtype and layout, so one run on a GPU
                // shows every op that misses its budget, not only the first.
                let worst = gv
                    .iter()
                    .zip(&wv)
                    .enumerate()
                    .map(|(k, (a, b))| (ulp_distance(*a, *b, dtype), k, *a, *b))
                    .max_by_key(|w| w.0);
                if let Some((d, k, a, b)) = worst.filter(|w| w.0 > budget) {
                    failures.push(format!(
                        "{op:?} {dtype} {layout} [{k}]: cuda {a:e} vs reference {b:e}: {d} ulp > {budget}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} op/dtype/layouts over budget:\n{}",
        failures.len(),
        failures.join("\n")
    );
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
    ];
    let mut failures = Vec::new();
    for (name, y, rtol) in &cases {
        let want = eval_on(&ctx, &[y], BackendKind::Interp);
        let got = eval_on(&ctx, &[y], BackendKind::Cuda);
        if let Err(why) = check_close(&got[0], &want[0], rtol.max(5e-7), 1e-5, name) {
            failures.push(why);
        }
    }
    // f16 gelu: the kernel computes the whole chain in f32 and rounds once (kernel
    // semantics), while the graph reference rounds each of its seven nodes to f16 (seen
    // on an H100: 3 f16 ulp apart). The oracle is the same chain in f64 on the f16
    // inputs with gelu's constants as f16 holds them, rounded once: within one f16 ulp
    // (the f32 chain's own error can move a value across a rounding boundary, no
    // further).
    let h = x(&[1 << 20]).cast(DType::F16);
    let got = eval_on(&ctx, &[&h.gelu()], BackendKind::Cuda);
    let want = eval_on(
        &ctx,
        &[&gelu_with_constants_of(&h.cast(DType::F64), DType::F16).cast(DType::F16)],
        BackendKind::Interp,
    );
    let (g, w) = (got[0].to_f64_vec(), want[0].to_f64_vec());
    if let Some((k, a, b)) = g
        .iter()
        .zip(&w)
        .enumerate()
        .find(|(_, (a, b))| ulp_distance(**a, **b, DType::F16) > 1)
        .map(|(k, (a, b))| (k, *a, *b))
    {
        failures.push(format!(
            "f16 gelu, 16-byte loads: element {k} is {a:e}, the f32 chain rounded once says {b:e} (> 1 f16 ulp)"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} strategies differ from the reference:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `Tensor::gelu`'s steps on `x` with its two constants rounded to `dtype`, as a graph
/// of `dtype` holds them (a half gelu's literals are half values: 0.044708252 for
/// 0.044715).
fn gelu_with_constants_of(x: &Tensor, dtype: DType) -> Tensor {
    let round = |c: f64| match dtype {
        DType::F16 => half::f16::from_f64(c).to_f64(),
        DType::BF16 => half::bf16::from_f64(c).to_f64(),
        DType::F32 => f64::from(c as f32),
        _ => c,
    };
    let c = round(2.0 * (2.0 / std::f64::consts::PI).sqrt());
    let inner = (x + &(x * &x.square() * round(0.044715))) * c;
    x * &inner.sigmoid()
}

/// An expression over a case's operands, with the gelu to use (the dtype's own, or the
/// reference's with the same constants).
type Build = fn(&[Tensor], &dyn Fn(&Tensor) -> Tensor) -> Tensor;

/// A matrix product on the GPU: the expression, and the sum of its first product's
/// absolute terms (`|x| @ |w|` with the same views), whose scale bounds the rounding.
struct Product {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    /// The contracted extent.
    k: usize,
    build: Build,
    magnitude: Build,
}

/// Matrix products on the GPU against the f64 reference: every dtype, the SIMT GEMM
/// (f32, f64) and the tensor-core one (f16, bf16 on sm_80+), sizes 1, 7, 65 and 1023 on
/// M, N and K, K = 0, transposed and broadcast batch operands, and epilogues (bias +
/// gelu, relu, residual add). Tolerance of each element, from K, the accumulator's
/// unit roundoff `u` (2^-24 for f32 and half operands, whose products are exact in f32;
/// 2^-53 for f64) and the output dtype's `u_out`:
/// `1.13 * ((K + 2) * u * (S + B) + 2 * u_out * (2|P| + B)) + (2 * u_out + 16 * u) * |want|
/// + 2^-24`, where `S` is the element's sum of absolute products, `P` the exact product,
/// `B` the largest other input (a bias, a residual), 1.13 gelu's steepest slope,
/// `2 u_out (2|P| + B)` the roundings of the product and of the bias sum to the output
/// dtype inside the epilogue (as the emulated tensor-core tests allow), `16 u` the
/// epilogue's own f32 steps (gelu's chain) and 2^-24 f16's smallest subnormal. Half
/// operands are half arrays, so the reference reads the same values, and its gelu has
/// the constants the half graph has; the output's rounding is one ulp (`2 u_out`).
#[test]
fn matrix_products_match_the_reference_on_the_gpu() {
    if !gpu_or_skip("matrix_products_match_the_reference_on_the_gpu") {
        return;
    }
    let ctx = Context::new();
    let seed = std::cell::Cell::new(100u64);
    let operand = |shape: &[usize], dtype: DType| {
        seed.set(seed.get() + 1);
        let a = ctx.rand_normal(shape, 0.25, 1.0, seed.get()).cast(dtype);
        ctx.from_array(&a.eval().expect("an operand"))
    };
    let bare: Build = |t, _| t[0].matmul(&t[1]);
    let product = |name, shapes: &[&[usize]], k, build: Build, magnitude: Build| Product {
        name,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        k,
        build,
        magnitude,
    };
    let cases = vec![
        product("1x1x1", &[&[1, 1], &[1, 1]], 1, bare, bare),
        product("7x65x1023", &[&[7, 1023], &[1023, 65]], 1023, bare, bare),
        product("1023x7x65", &[&[1023, 65], &[65, 7]], 65, bare, bare),
        product("65x1023x7", &[&[65, 7], &[7, 1023]], 7, bare, bare),
        product(
            "260x130x1023, several tiles",
            &[&[260, 1023], &[1023, 130]],
            1023,
            bare,
            bare,
        ),
        product(
            "K = 0, plus 1",
            &[&[5, 0], &[0, 6]],
            0,
            |t, _| &t[0].matmul(&t[1]) + 1.0,
            bare,
        ),
        product(
            "gelu(x @ w + b), 130x257x65",
            &[&[130, 65], &[65, 257], &[257]],
            65,
            |t, gelu| gelu(&(&t[0].matmul(&t[1]) + &t[2])),
            bare,
        ),
        product(
            "relu(x @ w) + r, 65x65x65",
            &[&[65, 65], &[65, 65], &[65, 65]],
            65,
            |t, _| &t[0].matmul(&t[1]).relu() + &t[2],
            bare,
        ),
        product(
            "x @ w.T, 65x33x130",
            &[&[65, 130], &[33, 130]],
            130,
            |t, _| t[0].matmul(&t[1].transpose()),
            |t, _| t[0].matmul(&t[1].transpose()),
        ),
        product(
            "x.T @ w, 33x65x130",
            &[&[130, 33], &[130, 65]],
            130,
            |t, _| t[0].transpose().matmul(&t[1]),
            |t, _| t[0].transpose().matmul(&t[1]),
        ),
        product(
            "batch of 5 @ w, rhs broadcast",
            &[&[5, 33, 65], &[65, 17]],
            65,
            bare,
            bare,
        ),
        product(
            "batch 2x3 broadcast both ways, lhs transposed",
            &[&[2, 1, 65, 7], &[3, 65, 17]],
            65,
            |t, _| t[0].permute(&[0, 1, 3, 2]).matmul(&t[1]),
            |t, _| t[0].permute(&[0, 1, 3, 2]).matmul(&t[1]),
        ),
    ];
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let u = if dtype == DType::F64 {
            2f64.powi(-53)
        } else {
            2f64.powi(-24)
        };
        let u_out = match dtype {
            DType::F16 => 2f64.powi(-11),
            DType::BF16 => 2f64.powi(-8),
            _ => u,
        };
        for case in &cases {
            let name = case.name;
            let ops: Vec<Tensor> = case.shapes.iter().map(|s| operand(s, dtype)).collect();
            let wide: Vec<Tensor> = ops.iter().map(|t| t.cast(DType::F64)).collect();
            let abs: Vec<Tensor> = wide.iter().map(Tensor::abs).collect();
            let y = (case.build)(&ops, &Tensor::gelu);
            let want = (case.build)(&wide, &|t: &Tensor| gelu_with_constants_of(t, dtype));
            let s = (case.magnitude)(&abs, &Tensor::gelu);
            let p = (case.magnitude)(&wide, &Tensor::gelu);
            let mut refs: Vec<&Tensor> = vec![&want, &s, &p];
            let others: Vec<Tensor> = abs[2..].iter().map(|a| a.max(..)).collect();
            refs.extend(&others);
            let got = eval_on(&ctx, &[&y], BackendKind::Cuda);
            let refs = eval_on(&ctx, &refs, BackendKind::Interp);
            let (g, w) = (got[0].to_f64_vec(), refs[0].to_f64_vec());
            let s_all = refs[1].to_f64_vec();
            let p_all = refs[2].to_f64_vec();
            let b = refs[3..]
                .iter()
                .map(|a| a.to_f64_vec()[0])
                .fold(0.0f64, f64::max);
            checked += 1;
            if g.len() != w.len() || got[0].dtype() != dtype {
                failures.push(format!(
                    "{dtype} {name}: {} {:?}, the reference has {} elements",
                    got[0].dtype(),
                    got[0].shape(),
                    w.len()
                ));
                continue;
            }
            let bad = g.iter().zip(&w).enumerate().find_map(|(e, (a, want))| {
                let (s, p) = (s_all[e], p_all[e].abs());
                let bound = 1.13 * ((case.k as f64 + 2.0) * u * (s + b) + 2.0 * u_out * (2.0 * p + b))
                    + (2.0 * u_out + 16.0 * u) * want.abs()
                    + 2f64.powi(-24);
                // NaN fails too.
                let ok = (a - want).abs() <= bound;
                (!ok).then(|| {
                    format!(
                        "{dtype} {name}: element {e} is {a:e}, the f64 reference says {want:e}: off by {:e} > {bound:e} (K = {}, S = {s:e})",
                        (a - want).abs(),
                        case.k
                    )
                })
            });
            failures.extend(bad);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} products differ from the reference:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
