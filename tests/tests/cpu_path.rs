//! The first end-to-end path: element-wise graphs become ONE Cranelift kernel, run by
//! the CPU runtime; what the JIT cannot run yet goes to the interpreter and the dump
//! says so. Every test checks the kernel count AND the values against the reference
//! interpreter.

use ndfuse::{BackendKind, Context, DType, SliceArg, Tensor};
use ndfuse_tests::assert_matches;

/// Evaluates on the CPU backend and on the interpreter; returns the CPU report after
/// checking every output equals the reference within `ulp`.
fn check(ctx: &Context, outs: &[&Tensor], ulp: u64) -> ndfuse::Report {
    ctx.set_backend(BackendKind::Interp);
    let want = ctx.eval(outs).expect("reference evaluates");
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx.eval_report(outs).expect("cpu evaluates");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_matches(g, w, ulp, &format!("output {i}"));
    }
    report
}

/// Like [`check`] for outputs of f32 reductions, which accumulate in f32 in the kernel
/// and exactly in the reference: relative 1e-5 plus absolute 1e-6.
fn check_close(ctx: &Context, outs: &[&Tensor]) -> ndfuse::Report {
    ctx.set_backend(BackendKind::Interp);
    let want = ctx.eval(outs).expect("reference evaluates");
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx.eval_report(outs).expect("cpu evaluates");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ndfuse_tests::assert_close(g, w, 1e-5, 1e-6, &format!("output {i}"));
    }
    report
}

/// Like [`check`] within `|got - want| <= rtol * |want| + atol`, for f32 graphs whose
/// inline transcendentals (`ndfuse_codegen_cpu::f32_ulp_bound`: at most 2 ulp) feed ops
/// that may cancel; each caller derives its tolerance from those bounds.
fn check_within(ctx: &Context, outs: &[&Tensor], rtol: f64, atol: f64) -> ndfuse::Report {
    ctx.set_backend(BackendKind::Interp);
    let want = ctx.eval(outs).expect("reference evaluates");
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx.eval_report(outs).expect("cpu evaluates");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ndfuse_tests::assert_close(g, w, rtol, atol, &format!("output {i}"));
    }
    report
}

fn jit_kernels(r: &ndfuse::Report) -> usize {
    r.evaluation()
        .paths
        .iter()
        .filter(|p| matches!(p, ndfuse_runtime::StepPath::Jit { .. }))
        .count()
}

#[test]
fn elementwise_chain_f32_is_one_jit_kernel() {
    let ctx = Context::new();
    let a = ctx.rand_uniform(&[64, 33], -2.0, 2.0, 1);
    let b = ctx.rand_uniform(&[64, 33], -2.0, 2.0, 2);
    let c = ctx.rand_uniform(&[33], 0.1, 2.0, 3);
    let y = ((&a * &b + &c).tanh() - (&a / &c).abs().sqrt()).maximum(b.sin()) * 0.5;
    // tanh (2 ulp) and sin (1 ulp) of values below 1 in magnitude err by at most 2^-23
    // absolute, which the subtraction may leave next to a small result; the result's
    // own roundings are 2 · 2^-24 relative.
    let r = check_within(&ctx, &[&y], 1.2e-7, 1.2e-7);
    assert_eq!(r.kernel_count(), 1, "{}", r.annotated_graph());
    assert_eq!(jit_kernels(&r), 1, "{}", r.annotated_graph());
}

#[test]
fn elementwise_chain_f64_with_every_unary_is_one_jit_kernel() {
    let ctx = Context::builder()
        .dtype(DType::F64)
        .build()
        .expect("f64 is a float");
    let x = ctx.rand_uniform(&[1000], 0.05, 3.0, 9);
    let mut acc = x.clone();
    for t in [
        x.exp(),
        x.log(),
        x.log1p(),
        x.expm1(),
        x.sqrt(),
        x.rsqrt(),
        x.square(),
        x.recip(),
        x.sin(),
        x.cos(),
        x.tanh(),
        x.sigmoid(),
        x.relu(),
        x.erf(),
        x.floor(),
        x.ceil(),
        x.round(),
        x.sign(),
        x.abs(),
        -&x,
        x.gelu(),
        x.gelu_erf(),
        x.pow(1.5),
    ] {
        acc = &acc + &t;
    }
    // exp, log, log1p, expm1, tanh, sigmoid (inside gelu too), sin and cos are inline
    // f64 code within 1-3 ulp (`ndfuse_codegen_cpu::f64_ulp_bound`); the rest is exact.
    // Their terms are at most e^3 (exp), 19 (expm1), 3 (log, gelu) and 1.4 in magnitude,
    // so the sum errs by at most (20·1 + 19·2 + 3·1 + 1.4·2 + 1·3 + 1·2 + 3·3 + 1·2 +
    // 1·2)·2^-52 < 2e-14 absolute, plus up to an ulp of the running sum in each of the
    // 23 additions.
    let r = check_within(&ctx, &[&acc], 23.0 * f64::EPSILON, 2e-14);
    assert_eq!(
        (r.kernel_count(), jit_kernels(&r)),
        (1, 1),
        "{}",
        r.annotated_graph()
    );
}

#[test]
fn diamond_with_two_outputs_shares_one_kernel() {
    let ctx = Context::new();
    let a = ctx.rand_normal(&[8, 8], 0.0, 1.0, 4);
    let t = (&a * 3.0).tanh();
    let (u, v) = (&t + 1.0, &t * &t);
    // t: tanh's 2 ulp (2^-23 absolute below 1); t + 1 cancels near t = -1, so its error
    // is t's plus one rounding (2^-22 absolute); t * t: 2 + 2 + 1/2 ulp, under 6e-7
    // relative.
    let r = check_within(&ctx, &[&u, &v, &t], 6e-7, 2.4e-7);
    assert_eq!(r.kernel_count(), 1, "{}", r.annotated_graph());
    let k = r.kernels_text();
    assert!(k.contains("out2"), "three stores expected:\n{k}");
}

#[test]
fn views_of_inputs_fold_into_loads() {
    let ctx = Context::new();
    let a = ctx.rand_uniform(&[6, 10], -1.0, 1.0, 5);
    let b = ctx.rand_uniform(&[10, 6], -1.0, 1.0, 6);
    let row = ctx.rand_uniform(&[6, 1], -1.0, 1.0, 7);
    let rev = a.slice(&[SliceArg::new(None, None, -1), SliceArg::from(1..9).step(2)]);
    let y = &rev
        * &b.transpose()
            .slice(&[SliceArg::all(), SliceArg::from(0..4)])
        + &row;
    let r = check(&ctx, &[&y], 0);
    assert_eq!(
        (r.kernel_count(), jit_kernels(&r)),
        (1, 1),
        "{}",
        r.annotated_graph()
    );
    let dump = r.annotated_graph();
    assert!(dump.contains("folded into loads"), "{dump}");
}

#[test]
fn reshape_of_a_transpose_is_copied_first() {
    let ctx = Context::new();
    let a = ctx.rand_uniform(&[4, 6], -1.0, 1.0, 8);
    let y = a.transpose().reshape(&[24]).exp();
    // exp is inline f32 code within 1 ulp (`ndfuse_codegen_cpu::f32_ulp_bound`).
    let r = check(&ctx, &[&y], 1);
    assert_eq!(r.kernel_count(), 2, "copy + exp:\n{}", r.annotated_graph());
    assert!(r.kernels_text().contains("copy"), "{}", r.kernels_text());
}

#[test]
fn reductions_are_jit_compiled_and_the_dump_says_so() {
    let ctx = Context::new();
    let a = ctx.rand_uniform(&[4, 8], -1.0, 1.0, 10);
    let b = ctx.rand_uniform(&[4, 8], -1.0, 1.0, 11);
    let c = ctx.rand_uniform(&[8], -1.0, 1.0, 12);
    let y = (&a * &b + &c).exp().sum(1);
    let r = check_close(&ctx, &[&y]);
    assert_eq!(r.kernel_count(), 1);
    insta::assert_snapshot!(r.annotated_graph());
}

#[test]
fn softmax_log_softmax_and_layernorm_are_one_jit_kernel_each() {
    let ctx = Context::new();
    let a = ctx.rand_normal(&[5, 7], 0.0, 3.0, 13);
    // Sums accumulate in f32 in the kernel, exactly in the reference; layernorm's mean
    // and variance also round between f32 steps, and x - mean cancels: tolerances are
    // relative plus absolute at the outputs' scale (about 1).
    for (name, t) in [
        ("softmax", a.softmax(-1)),
        ("log_softmax", a.log_softmax(0)),
        ("layernorm", a.layernorm(-1, 1e-5)),
    ] {
        ctx.set_backend(BackendKind::Interp);
        let want = t.eval().expect("reference evaluates");
        ctx.set_backend(BackendKind::Cpu);
        let (got, r) = ctx.eval_report(&[&t]).expect("cpu evaluates");
        ndfuse_tests::assert_close(&got[0], &want, 1e-5, 1e-6, name);
        assert_eq!(
            (r.kernel_count(), jit_kernels(&r)),
            (1, 1),
            "{name}: {}",
            r.annotated_graph()
        );
    }
}

#[test]
fn half_kernels_run_in_the_jit() {
    // They fell back to the interpreter (with a reason) until f16/bf16 were lowered:
    // now every kernel of a half graph is JIT-compiled, and none is interpreted.
    let ctx = Context::builder()
        .dtype(DType::F16)
        .build()
        .expect("f16 is a float");
    let a = ctx.rand_uniform(&[16], -1.0, 1.0, 14);
    let y = (&a * 2.0 + 1.0).exp();
    ctx.set_backend(BackendKind::Cpu);
    let (got, r) = ctx.eval_report(&[&y]).expect("cpu evaluates");
    let dump = r.annotated_graph();
    assert_eq!((r.kernel_count(), jit_kernels(&r)), (1, 1), "{dump}");
    let interpreted = r
        .evaluation()
        .paths
        .iter()
        .any(|p| matches!(p, ndfuse_runtime::StepPath::KernelInterp { .. }));
    assert!(!interpreted, "{dump}");
    // Inside a kernel, half values compute in f32 and round once at the store, so the
    // oracle is the same graph computed in f32 and rounded to f16 at the end: exact up
    // to the f32 exp's few ulps (the inline math library), which can move the result
    // across one f16 rounding boundary.
    let a32 = a.cast(DType::F32);
    let y32 = ((&a32 * 2.0 + 1.0).exp()).cast(DType::F16);
    ctx.set_backend(BackendKind::Interp);
    let want = ctx.eval(&[&y32]).expect("reference evaluates");
    assert_matches(
        &got[0],
        &want[0],
        1,
        "f16 kernel vs f32-then-round reference",
    );
}

#[test]
fn integer_and_bool_kernels_run_in_the_jit() {
    let ctx = Context::new();
    let a = ctx
        .from_vec((0..24).map(|i| i - 12).collect::<Vec<i32>>(), &[4, 6])
        .expect("24");
    let b = ctx
        .from_vec((0..6).map(|i| i * 7 - 20).collect::<Vec<i64>>(), &[6])
        .expect("6");
    let m = a.gt(0).and(b.lt(10));
    let y = m.where_(&(&a * &b - 3), a.abs().maximum(&b)).pow(2);
    let z = (&a.cast(DType::F32) / 3.0).round().cast(DType::I32);
    let r = check(&ctx, &[&y, &z, &m.logical_not()], 0);
    assert_eq!(jit_kernels(&r), r.kernel_count(), "{}", r.annotated_graph());
}

#[test]
fn edge_shapes_empty_scalar_and_size_one() {
    let ctx = Context::new();
    let e = ctx.from_vec(Vec::<f32>::new(), &[0, 4]).expect("empty");
    let s = ctx.from_vec(vec![2.5f32], &[]).expect("scalar");
    let one = ctx.rand_uniform(&[1, 5, 1], -1.0, 1.0, 15);
    let r = check(
        &ctx,
        &[
            &(&e * 2.0).exp(),
            &(&s * &s + 1.0),
            &(&one - &s).abs(),
            &e.broadcast_to(&[3, 0, 4]),
        ],
        0,
    );
    assert!(r.kernel_count() >= 3);
}

#[test]
fn outputs_that_are_inputs_views_or_constants() {
    let ctx = Context::new();
    let a = ctx.rand_uniform(&[3, 4], -1.0, 1.0, 16);
    let r = check(
        &ctx,
        &[
            &a,
            &a.transpose(),
            &ctx.full(&[2, 2], 7.0),
            &ctx.scalar(1.5).broadcast_to(&[3]),
        ],
        0,
    );
    assert_eq!(
        r.kernel_count(),
        3,
        "copy + two fills:\n{}",
        r.annotated_graph()
    );
}

#[test]
fn special_values_propagate_like_ieee() {
    let ctx = Context::new();
    let v = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        1e-40,
        -1e-40,
        88.7,
        -103.0,
        1.0,
    ];
    let x = ctx.from_vec(v.clone(), &[10]).expect("10");
    let y = ctx
        .from_vec(v.into_iter().rev().collect(), &[10])
        .expect("10");
    let outs = [
        x.maximum(&y),
        x.minimum(&y),
        &x / &y,
        x.exp(),
        x.log(),
        x.sqrt(),
        x.sign(),
        x.relu(),
        x.sigmoid(),
        x.tanh(),
        x.ge(&y),
        x.ne(&y),
        x.round(),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let r = check(&ctx, &refs, 0);
    assert_eq!(r.kernel_count(), 1, "{}", r.annotated_graph());
}

#[test]
fn a_cached_graph_skips_cranelift() {
    let ctx = Context::new();
    let a = ctx.rand_uniform(&[128], -1.0, 1.0, 17);
    let y = (&a * 1.25 + 0.5).sigmoid();
    ctx.set_backend(BackendKind::Cpu);
    let first = ctx.eval_report(&[&y]).expect("runs").1;
    let second = ctx.eval_report(&[&y]).expect("runs").1;
    assert!(
        first.annotated_graph().contains("[jit"),
        "{}",
        first.annotated_graph()
    );
    assert!(
        second.annotated_graph().contains("[jit, cached]"),
        "{}",
        second.annotated_graph()
    );
    assert_eq!(second.evaluation().compile_time, std::time::Duration::ZERO);
    // The passes and fusion are skipped too: the compiled graph is reused.
    assert!(!first.evaluation().compile_cached || first.kernel_count() == 1);
    assert!(second.evaluation().compile_cached);
}
