//! The matrix product through the whole pipeline, whatever runs it: how many kernels
//! each graph around a `matmul` becomes (fused epilogues, the boundaries that remain and
//! the reason printed for each), every result checked against the interp backend; the
//! fusion report of `gelu(x @ w + b)` and `sum(x @ w, axis=1)` pinned as snapshots; the
//! user-facing errors with the caller's own line; and numpy's 1-D, batch and dtype
//! rules. Nothing here asserts which path (JIT, GEMM or interpreter) the cpu backend
//! takes for the product.
//!
//! Tolerances (f32; inputs uniform in [-1, 1], so a product's terms are at most 1 in
//! magnitude): the reference sums in f64 and rounds once, a GEMM accumulates K terms in
//! f32 in its own order, at most `K · 2^-24 · Σ|a·b| <= K² · 2^-24` apart ([`product`]).
//! An epilogue moves that by at most its Lipschitz constant, and adds its own rounding:
//! 2 ulp per f32 transcendental (the CPU backend's vmath bound), stated as a relative
//! 1e-6 with margin. Integer products are exact (wrapping), so compared bit for bit.

use ndfuse::{BackendKind, Context, DType, Error, Report, Tensor};
use ndfuse_tests::{assert_close, assert_matches};

const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// `(rtol, atol)` of an f32 product of K terms of magnitude <= 1 (see the module docs),
/// scaled by the Lipschitz constant `lip` of the epilogue that follows it.
fn product(k: usize, lip: f64) -> (f64, f64) {
    let k = k as f64;
    (1e-6, lip * (k * k * U32 + U32))
}

fn uniform(ctx: &Context, shape: &[usize], seed: u64) -> Tensor {
    ctx.rand_uniform(shape, -1.0, 1.0, seed)
}

/// Evaluates `outs` on the interp backend (the reference) and on cpu; asserts the
/// kernel count of the cpu schedule and that every output is within `(rtol, atol)`
/// (both 0: bit for bit). Returns the cpu report.
fn check(ctx: &Context, outs: &[&Tensor], kernels: usize, tol: (f64, f64), what: &str) -> Report {
    ctx.set_backend(BackendKind::Interp);
    let want = ctx
        .eval(outs)
        .unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx
        .eval_report(outs)
        .unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    assert_eq!(
        report.kernel_count(),
        kernels,
        "{what}: kernel count\n{}",
        report.annotated_graph()
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let msg = format!("{what}: output {i}\n{}", report.kernels_text());
        if tol == (0.0, 0.0) {
            assert_matches(g, w, 0, &msg);
        } else {
            assert_close(g, w, tol.0, tol.1, &msg);
        }
    }
    report
}

/// The fusion report, backend-independent: each node's kernel, whether it is stored and
/// why, then every kernel description with its plan and the reason for it.
fn fusion_report(ctx: &Context, outs: &[&Tensor]) -> String {
    let g = ctx.graph(outs).expect("builds");
    let s = ndfuse_passes::schedule(&g);
    format!("{}\n{}", s.annotate(&g, &|_| None), s.to_text(&g))
}

/// The annotation line of the first node whose text contains `op`.
fn line_of(report: &str, op: &str) -> String {
    report
        .lines()
        .find(|l| l.contains(op))
        .unwrap_or_else(|| panic!("no {op:?} in\n{report}"))
        .to_string()
}

fn xwb(ctx: &Context) -> (Tensor, Tensor, Tensor) {
    (
        uniform(ctx, &[6, 16], 1),
        uniform(ctx, &[16, 10], 2),
        uniform(ctx, &[10], 3),
    )
}

#[test]
fn gelu_of_a_biased_product_is_one_kernel() {
    let ctx = Context::new();
    let (x, w, b) = xwb(&ctx);
    let y = (x.matmul(&w) + &b).gelu();
    // gelu is 1.13-Lipschitz; the bias adds one rounding.
    check(&ctx, &[&y], 1, product(16 + 1, 1.13), "gelu(x @ w + b)");
    let r = uniform(&ctx, &[6, 10], 4);
    let y = (x.matmul(&w) + &b).gelu() + &r;
    check(&ctx, &[&y], 1, product(16 + 2, 1.13), "gelu(x @ w + b) + r");
}

#[test]
fn relu_then_scale_is_one_kernel() {
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let y = x.matmul(&w).relu() * 2.0;
    check(&ctx, &[&y], 1, product(16, 2.0), "relu(x @ w) * 2");
}

#[test]
fn a_reduction_of_the_product_is_a_second_kernel_and_the_report_names_the_boundary() {
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let y = x.matmul(&w).sum(1);
    // A row sum of 10 products: their errors add, plus the sum's own f32 rounding.
    check(
        &ctx,
        &[&y],
        2,
        product(16, 10.0 + 1.0),
        "sum(x @ w, axis=1)",
    );
    let report = fusion_report(&ctx, &[&y]);
    let mm = line_of(&report, "= matmul");
    assert!(
        mm.contains("stored: read by sum in another kernel"),
        "{report}"
    );
}

#[test]
fn a_product_of_a_product_is_two_kernels() {
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let v = uniform(&ctx, &[10, 3], 5);
    let y = x.matmul(&w).matmul(&v);
    // The first product's error (K = 16) is summed over 10 terms of |v| <= 1, and the
    // second adds 10 · 2^-24 · Σ|p·v| with |p| <= 16.
    let (_, first) = product(16, 1.0);
    let atol = 10.0 * first + 10.0 * 10.0 * 16.0 * U32;
    check(&ctx, &[&y], 2, (1e-6, atol), "(x @ w) @ v");
    let report = fusion_report(&ctx, &[&y]);
    assert!(
        line_of(&report, "= matmul %0").contains("stored: read by matmul in another kernel"),
        "{report}"
    );
}

#[test]
fn a_transposed_product_is_stored_and_read_through_a_view() {
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let y = x.matmul(&w).transpose();
    check(&ctx, &[&y], 2, product(16, 1.0), "transpose(x @ w)");
    let report = fusion_report(&ctx, &[&y]);
    assert!(
        line_of(&report, "= matmul").contains("stored: read through a view"),
        "{report}"
    );
    // An element-wise op on the transposed product reads it through strides: still 2.
    let y = x.matmul(&w).transpose() + 1.0;
    check(&ctx, &[&y], 2, product(16 + 1, 1.0), "transpose(x @ w) + 1");
}

#[test]
fn a_computed_operand_is_stored_first() {
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let y = x.exp().matmul(&w);
    // |exp(x)| <= e: the product's bound scales by e, plus exp's 2 ulp on each term.
    let e = std::f64::consts::E;
    let (_, atol) = product(16, e);
    check(
        &ctx,
        &[&y],
        2,
        (1e-6, atol + 16.0 * e * 4.0 * U32),
        "exp(x) @ w",
    );
    let report = fusion_report(&ctx, &[&y]);
    assert!(
        line_of(&report, "= exp").contains("stored: read by matmul in another kernel"),
        "{report}"
    );
    // The right operand too.
    let y = x.matmul(&w.exp());
    check(
        &ctx,
        &[&y],
        2,
        (1e-6, atol + 16.0 * e * 4.0 * U32),
        "x @ exp(w)",
    );
}

#[test]
fn an_optimiser_update_is_the_epilogue_of_the_gradients_product() {
    // m' = 0.9 m + 0.1 g, p' = p - 0.01 m' with g = x^T @ w: `0.9 m` reads inputs only,
    // so it forms its own group first; it joins the product's epilogue with m'.
    let ctx = Context::new();
    let (x, _, _) = xwb(&ctx);
    let dy = uniform(&ctx, &[6, 10], 23);
    let g = x.transpose().matmul(&dy);
    let shape = g.shape().unwrap().to_vec();
    let (m, p) = (uniform(&ctx, &shape, 21), uniform(&ctx, &shape, 22));
    let m2 = &(&m * 0.9) + &(&g * 0.1);
    let p2 = &p - &(&m2 * 0.01);
    let (_, atol) = product(6, 1.0);
    check(
        &ctx,
        &[&p2, &m2],
        1,
        (1e-6, atol),
        "momentum update of x^T @ dy",
    );
}

#[test]
fn a_group_that_computes_an_operand_does_not_join_the_epilogue() {
    // t = 2x is both the product's operand and read by its epilogue: the product runs
    // before its epilogue, so t must be stored first.
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let t = &x * 2.0;
    let y = &t.matmul(&w.matmul(&w.transpose())) + &t.sum_keepdims(1);
    // The operand 2x and the inner product's entries (at most 10) scale the bound.
    let (_, atol) = product(16, 20.0);
    check(&ctx, &[&y], 3, (1e-6, atol), "2x @ (w w^T) + rowsum(2x)");
    let y = &(&x * 2.0).matmul(&w.matmul(&w.transpose())) + &(&x * 2.0).exp();
    check(&ctx, &[&y], 3, (1e-6, atol * 8.0), "2x @ (w w^T) + exp(2x)");
}

#[test]
fn a_constant_operand_is_filled_into_a_buffer() {
    let ctx = Context::new();
    let (_, w, _) = xwb(&ctx);
    let y = ctx.ones(&[6, 16]).matmul(&w);
    // Column sums of w: 16 terms.
    let report = check(&ctx, &[&y], 2, product(16, 1.0), "ones @ w");
    assert!(
        report.kernels_text().contains("_fill"),
        "{}",
        report.kernels_text()
    );
    let text = fusion_report(&ctx, &[&y]);
    assert!(
        line_of(&text, "= const").contains("a constant operand of matmul (a GEMM reads memory)"),
        "{text}"
    );
}

#[test]
fn fusion_report_of_gelu_of_a_biased_product() {
    let ctx = Context::new();
    let (x, w, b) = xwb(&ctx);
    let y = (x.matmul(&w) + &b).gelu();
    let report = fusion_report(&ctx, &[&y]);
    // One kernel holds the product and every op of the epilogue.
    let kernels: Vec<&str> = report
        .lines()
        .filter(|l| l.contains(": kernel k"))
        .collect();
    assert_eq!(kernels.len(), 1, "{report}");
    insta::assert_snapshot!(report);
}

#[test]
fn fusion_report_of_a_row_sum_of_a_product() {
    let ctx = Context::new();
    let (x, w, _) = xwb(&ctx);
    let report = fusion_report(&ctx, &[&x.matmul(&w).sum(1)]);
    insta::assert_snapshot!(report);
}

#[test]
fn batched_broadcast_and_transposed_operands() {
    let ctx = Context::new();
    // [2,1,5,7] @ [3,7,4] -> [2,3,5,4]: each operand broadcasts over the other's batch.
    let a = uniform(&ctx, &[2, 1, 5, 7], 6);
    let b = uniform(&ctx, &[3, 7, 4], 7);
    let y = a.matmul(&b);
    assert_eq!(y.shape().expect("valid"), &[2, 3, 5, 4]);
    check(&ctx, &[&y], 1, product(7, 1.0), "[2,1,5,7] @ [3,7,4]");
    // Transposed operands are views the product reads through strides: one kernel.
    let at = uniform(&ctx, &[7, 5], 8);
    let bt = uniform(&ctx, &[4, 7], 9);
    let y = at.transpose().matmul(&bt.transpose());
    check(
        &ctx,
        &[&y],
        1,
        product(7, 1.0),
        "transpose(a) @ transpose(b)",
    );
}

#[test]
fn one_d_operands_dtype_promotion_and_integers() {
    let ctx = Context::new();
    let v = uniform(&ctx, &[7], 10);
    let m = uniform(&ctx, &[7, 4], 11);
    let n = uniform(&ctx, &[3, 7], 12);
    // numpy: a vector on the left is a row, on the right a column; the axis goes.
    let cases = [
        (v.matmul(&m), vec![4], "v @ m"),
        (n.matmul(&v), vec![3], "n @ v"),
        (v.matmul(&v), vec![], "v @ v"),
    ];
    // The squeeze that removes the added axis is a view of the whole product: the
    // output is the product's buffer under its shape (no copy kernel).
    for (t, s, what) in &cases {
        assert_eq!(t.shape().expect("valid"), &s[..], "{what}");
        check(&ctx, &[t], 1, product(7, 1.0), what);
    }
    // f16 @ f32 promotes to f32, as `mul` does.
    let y = m.cast(DType::F16).transpose().matmul(&n.transpose());
    assert_eq!(y.dtype().expect("valid"), DType::F32);
    // Two kernels: the cast to f16 (a rounding, so a value of its own), then the
    // product, which reads the f16 buffer through the transpose and widens it itself:
    // the promoting cast back to f32 is a prologue, not a kernel.
    check(&ctx, &[&y], 2, product(7, 1.0), "f16 @ f32");
    // i32 products are exact (and wrap): bit for bit.
    let a = ctx
        .from_vec((0..12).map(|i| i * 7 - 40).collect::<Vec<i32>>(), &[3, 4])
        .expect("12 values");
    let b = ctx
        .from_vec((0..8).map(|i| 1 << (i * 3)).collect::<Vec<i32>>(), &[4, 2])
        .expect("8 values");
    check(&ctx, &[&(a.matmul(&b) + 1)], 1, (0.0, 0.0), "i32 @ i32 + 1");
}

/// Evaluates `t` expecting an error; checks it contains each needle and `(at FILE:LINE`.
fn expect_err(t: &Tensor, line: u32, needles: &[&str]) -> String {
    let msg = t.eval().expect_err("an invalid matmul").to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
    let site = format!("(at {}:{line}:", file!());
    assert!(msg.contains(&site), "{msg:?} lacks the call site {site:?}");
    msg
}

#[test]
fn errors_name_both_operands_and_the_callers_line() {
    let ctx = Context::new();
    let (a, b) = (ctx.zeros(&[4, 8]), ctx.zeros(&[7, 3]));
    let (y, line) = (a.matmul(&b), line!());
    let msg = expect_err(&y, line, &[]);
    assert!(
        msg.starts_with("matmul: f32[4,8] @ f32[7,3]: 8 != 7"),
        "{msg}"
    );
    assert!(matches!(y.error(), Some(Error::Op { .. })), "{msg}");
    // The free function reports its own caller too, and the error travels through the
    // ops built on the bad product.
    let (y, line) = (ndfuse::matmul(&a, &b), line!());
    expect_err(
        &(y.relu() + 1.0),
        line,
        &["matmul: f32[4,8] @ f32[7,3]: 8 != 7"],
    );
    // A 1-D right operand is named as given (f32[7], not f32[7,1]).
    let (y, line) = (a.matmul(&ctx.zeros(&[7])), line!());
    expect_err(&y, line, &["matmul: f32[4,8] @ f32[7]: 8 != 7"]);
    // 0-d operands: no matrix product, as in numpy.
    let s = ctx.scalar(2.0);
    let (y, line) = (s.matmul(&a), line!());
    expect_err(&y, line, &["matmul", "f32[]", "0-d"]);
    let (y, line) = (a.matmul(&s), line!());
    expect_err(&y, line, &["matmul", "f32[]", "0-d"]);
    // Bool operands.
    let m = a.gt(0.0);
    let (y, line) = (m.matmul(&ctx.zeros(&[8, 2])), line!());
    expect_err(
        &y,
        line,
        &["matmul", "bool[4,8]", "cast it to a number first"],
    );
    // Batch axes that do not broadcast (2 against 3) though K agrees.
    let (p, q) = (ctx.zeros(&[2, 4, 8]), ctx.zeros(&[3, 8, 5]));
    let (y, line) = (p.matmul(&q), line!());
    expect_err(
        &y,
        line,
        &["matmul", "f32[2,4,8]", "f32[3,8,5]", "do not broadcast"],
    );
}

/// A half operand promoted to f32 for the product is read as half by the product, which
/// widens it itself (exact): no kernel computes the cast. A cast with another user stays
/// a value of its own.
#[test]
fn widening_casts_of_operands_fold_into_the_product() {
    let ctx = Context::new();
    for half in [DType::F16, DType::BF16] {
        let x = uniform(&ctx, &[33, 17], 61).cast(half);
        let w = uniform(&ctx, &[17, 9], 62);
        let b = uniform(&ctx, &[9], 63);
        // `x` is an input of the product's kernel: its cast to `half` is the one kernel
        // before it (a rounding); the promotion back to f32 is folded.
        let x = ctx.from_array(&x.eval().expect("x"));
        let y = x.matmul(&w) + &b;
        let report = check(
            &ctx,
            &[&y],
            1,
            product(17, 1.0),
            &format!("{half} @ f32 + b"),
        );
        assert!(
            report.kernels_text().contains(&format!("in0: {half}[561]")),
            "the product reads the {half} buffer itself:\n{}",
            report.kernels_text()
        );
        // Both operands half: the same, with the f32 product cast back to `half`.
        let wh = ctx.from_array(&w.cast(half).eval().expect("w"));
        check(
            &ctx,
            &[&x.matmul(&wh)],
            1,
            (1e-2, 1e-2),
            &format!("{half} @ {half}"),
        );
        // The promoted cast also feeds a sum: it is not folded but computed once, in
        // the sum's kernel (its prologue), and stored for the product's kernel.
        let xf = x.cast(DType::F32);
        let s = xf.sum(1);
        let y = xf.matmul(&w);
        let report = check(
            &ctx,
            &[&y, &s],
            2,
            product(17, 1.0),
            &format!("cast {half} shared"),
        );
        assert!(
            report.kernels_text().contains("in0: f32[561]"),
            "the product reads the stored f32 cast:
{}",
            report.kernels_text()
        );
    }
}

/// Scalings by a constant and float casts of an operand, read only by products, are the
/// product's operand prologue (`ndfuse_ir::Prologue`): applied as the GEMM reads the
/// operand, so no kernel writes the scaled or rounded operand first. Each step rounds as
/// the graph's own op does, so the fused product has the bits of the product of the
/// operand computed on its own (same GEMM, same values: compared bit for bit).
#[test]
fn scalings_and_rounding_casts_of_operands_fold_into_the_product() {
    let ctx = Context::new();
    let (x, w, b) = xwb(&ctx);
    let fused_and_apart = |ctx: &Context, y: &Tensor, apart: &Tensor, what: &str| {
        ctx.set_backend(BackendKind::Cpu);
        let got = y.eval().unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = apart
            .eval()
            .unwrap_or_else(|e| panic!("{what}: apart: {e}"));
        assert_matches(&got, &want, 0, &format!("{what}: fused against apart"));
    };
    // A scale of the left operand (attention's q / sqrt(d)), with an epilogue.
    let y = (&x * 0.125).matmul(&w) + &b;
    let report = check(&ctx, &[&y], 1, product(16, 1.0), "(x * 0.125) @ w + b");
    let text = report.kernels_text();
    assert!(text.contains("|> mul 0.125"), "{text}");
    let report = fusion_report(&ctx, &[&y]);
    assert!(!line_of(&report, "= mul").contains("stored"), "{report}");
    let xs = ctx.from_array(&(&x * 0.125).eval().expect("x * 0.125"));
    fused_and_apart(&ctx, &y, &(xs.matmul(&w) + &b), "(x * 0.125) @ w + b");
    // A quotient on the right, a scale from the left side of the product, a chain.
    let y = x.matmul(&(&w / 3.0));
    check(&ctx, &[&y], 1, product(16, 1.0), "x @ (w / 3)");
    let wd = ctx.from_array(&(&w / 3.0).eval().expect("w / 3"));
    fused_and_apart(&ctx, &y, &x.matmul(&wd), "x @ (w / 3)");
    let y = (&x * 3.0 * 0.5).matmul(&w);
    check(&ctx, &[&y], 1, product(16, 1.5), "(x * 3 * 0.5) @ w");
    // A transpose below the scale is read through (x.T * 2); a transpose above it is a
    // view of a computed value, stored first.
    let xt = x.transpose();
    let y = (&xt * 2.0).matmul(&x);
    check(&ctx, &[&y], 1, product(32, 2.0), "(x.T * 2) @ x");
    let y = (&x * 2.0).transpose().matmul(&x);
    check(&ctx, &[&y], 2, product(32, 2.0), "(x * 2).T @ x");
    // Rounding casts: f32 operands rounded to a half type for a half product, alone
    // and after a scale.
    for half in [DType::F16, DType::BF16] {
        let wh = ctx.from_array(&w.cast(half).eval().expect("w"));
        let y = x.cast(half).matmul(&wh);
        let report = check(
            &ctx,
            &[&y],
            1,
            (1e-2, 1e-2),
            &format!("cast(x, {half}) @ w"),
        );
        assert!(
            report.kernels_text().contains(&format!("|> cast {half}")),
            "{}",
            report.kernels_text()
        );
        let xh = ctx.from_array(&x.cast(half).eval().expect("x"));
        fused_and_apart(&ctx, &y, &xh.matmul(&wh), &format!("cast(x, {half}) @ w"));
        let y = (&x * 3.0).cast(half).matmul(&wh);
        check(
            &ctx,
            &[&y],
            1,
            (3e-2, 3e-2),
            &format!("cast(x * 3, {half}) @ w"),
        );
        let xh = ctx.from_array(&(&x * 3.0).cast(half).eval().expect("x"));
        fused_and_apart(
            &ctx,
            &y,
            &xh.matmul(&wh),
            &format!("cast(x * 3, {half}) @ w"),
        );
    }
    // A rounding widened back for an f32 product: both casts are the prologue.
    let y = x.cast(DType::F16).cast(DType::F32).matmul(&w);
    check(
        &ctx,
        &[&y],
        1,
        product(16, 1.0),
        "cast(cast(x, f16), f32) @ w",
    );
    let xh = ctx.from_array(&x.cast(DType::F16).eval().expect("x"));
    fused_and_apart(
        &ctx,
        &y,
        &xh.cast(DType::F32).matmul(&w),
        "f16 round trip @ w",
    );
    // A scaled operand that another op reads too is a value of its own (computed once,
    // stored); an f64 product takes no prologue.
    let xs = &x * 0.5;
    let y = xs.matmul(&w);
    let s = xs.sum(1);
    check(&ctx, &[&y, &s], 2, product(16, 1.0), "x * 0.5 shared");
    let (x64, w64) = (x.cast(DType::F64), w.cast(DType::F64));
    let x64 = ctx.from_array(&x64.eval().expect("x64"));
    let w64 = ctx.from_array(&w64.eval().expect("w64"));
    let y = (&x64 * 2.0).matmul(&w64);
    check(&ctx, &[&y], 2, (1e-12, 1e-12), "(x64 * 2) @ w64");
    // Batched, with a broadcast batch operand and a transposed right one.
    let q = uniform(&ctx, &[3, 5, 8], 71);
    let k = uniform(&ctx, &[5, 8], 72);
    let y = (&q * 0.125).matmul(&k.transpose());
    check(
        &ctx,
        &[&y],
        1,
        product(8, 1.0),
        "(q * 0.125) @ k.T, batched",
    );
}
