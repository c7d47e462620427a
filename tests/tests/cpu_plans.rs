//! The plan-specific CPU loops end to end: a reduction of few long rows runs as a
//! two-stage split (partials per chunk on every thread, combined in chunk order), a
//! reduction over leading axes sweeps bands of columns, and both give the reference's
//! values within the f32-accumulation tolerance, in ONE JIT-compiled kernel per graph,
//! bit-identically on 1, 2 and 4 threads.

use ndfuse::{BackendKind, Context, Tensor};

/// f32 sums accumulate in f32 in the kernel and exactly in the reference: the
/// catalogue's `F32_ACC`, relative 1e-5 plus absolute 1e-5.
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-5;

/// Evaluates on the interpreter and on the CPU backend; checks every output within the
/// tolerance and returns the CPU report.
fn check_close(ctx: &Context, outs: &[&Tensor]) -> ndfuse::Report {
    ctx.set_backend(BackendKind::Interp);
    let want = ctx.eval(outs).expect("reference evaluates");
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx.eval_report(outs).expect("cpu evaluates");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ndfuse_tests::assert_close(g, w, RTOL, ATOL, &format!("output {i}"));
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

/// The outputs of `outs` evaluated in a pool of `threads` threads, as bit patterns.
fn bits_on(ctx: &Context, outs: &[&Tensor], threads: usize) -> Vec<Vec<u64>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    let got = pool.install(|| ctx.eval(outs).expect("evaluates"));
    got.iter()
        .map(|a| a.to_f64_vec().into_iter().map(f64::to_bits).collect())
        .collect()
}

#[test]
fn a_full_sum_is_split_and_matches_the_reference() {
    let ctx = Context::new();
    // Not a multiple of any chunk or vector: short last chunk, scalar tails.
    let x = ctx.rand_uniform(&[(3 << 20) + 77], -1.0, 2.0, 1);
    for (what, y) in [
        ("sum", x.sum(..)),
        ("mean", x.mean(..)),
        ("max", x.max(..)),
        ("argmax", x.argmax(0)),
        ("var", x.var(..)),
    ] {
        let r = check_close(&ctx, &[&y]);
        assert_eq!(r.kernel_count(), 1, "{what}: {}", r.annotated_graph());
        assert_eq!(jit_kernels(&r), 1, "{what}: {}", r.annotated_graph());
        let kernels = r.kernels_text();
        assert!(
            kernels.contains("plan=split(1 x 3145805 in 49 chunks)"),
            "{what}: {kernels}"
        );
    }
}

#[test]
fn a_softmax_over_one_long_row_is_split_sweep_by_sweep() {
    // softmax over 300k elements: a two-stage max, a two-stage sum of exp, then the
    // element stores chunk by chunk.
    let ctx = Context::new();
    let x = ctx.rand_normal(&[300_000], 0.0, 3.0, 2);
    let y = x.softmax(-1);
    let r = check_close(&ctx, &[&y]);
    assert_eq!(r.kernel_count(), 1, "{}", r.annotated_graph());
    assert_eq!(jit_kernels(&r), 1, "{}", r.annotated_graph());
    assert!(
        r.kernels_text().contains("plan=split("),
        "{}",
        r.kernels_text()
    );
}

#[test]
fn column_reductions_sweep_bands_and_match_the_reference() {
    let ctx = Context::new();
    // Wider than one band (1024 columns), not a multiple of the vector width.
    let a = ctx.rand_uniform(&[300, 2501], -1.0, 1.0, 3);
    for (what, y) in [
        ("sum", a.sum(0)),
        ("mean", a.mean(0)),
        ("max", a.max(0)),
        ("norm2", a.norm2(0)),
        ("sum of a product", (&a * &a - 0.5).sum(0)),
    ] {
        let r = check_close(&ctx, &[&y]);
        assert_eq!(r.kernel_count(), 1, "{what}: {}", r.annotated_graph());
        assert_eq!(jit_kernels(&r), 1, "{what}: {}", r.annotated_graph());
        assert!(
            r.kernels_text().contains("plan=columns(2501 x 300)"),
            "{what}: {}",
            r.kernels_text()
        );
    }
    // Outside the band loop (two sweeps): still right, row by row.
    let v = a.var(0);
    let r = check_close(&ctx, &[&v]);
    assert_eq!(jit_kernels(&r), 1, "{}", r.annotated_graph());
}

#[test]
fn split_and_band_kernels_give_the_same_bits_on_1_2_4_threads() {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[(1 << 21) + 5], 0.0, 1.0, 4);
    let a = ctx.rand_normal(&[200, 5000], 0.0, 1.0, 5);
    let outs = [x.sum(..), x.var(..), x.argmax(0), a.sum(0), a.max(0)];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let one = bits_on(&ctx, &refs, 1);
    for threads in [2, 4] {
        assert!(
            bits_on(&ctx, &refs, threads) == one,
            "{threads} threads differ from 1"
        );
    }
}
