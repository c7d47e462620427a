//! Issue 36: `batch_norm` with PyTorch's semantics against torch's outputs, gradients and
//! updated running statistics (`tests/fixtures/batch_norm`, from
//! `scripts/batch_norm_fixtures.py`: the training and inference forms, with and without
//! the affine parameters, over [N, C], [N, C, L] and [N, C, H, W]); the inference form
//! fusing with what follows it; expressions; bad arguments as errors naming the call site.

use ndfuse::{Array, BackendKind, BatchNorm, Context, Tensor};
use ndfuse_tests::assert_near;

fn fixture(case: &str, key: &str) -> Array {
    ndfuse_tests::fixture("batch_norm", case, key)
}

/// The tolerance of every comparison: relative to 1 + |torch's value|. The inputs are at
/// most 3.5 in magnitude and every value compared (outputs, gradients, statistics) comes
/// out of f32 sums over at most 100 terms (a channel's positions) and a reciprocal
/// square root; gamma_100 is 6e-6 of the sum of the terms' magnitudes, which a channel's
/// standard deviation (above 1 here) at most divides: 1e-4 holds with margin, on the
/// CPU (f32 throughout) and on the interpreter (each node rounded to f32).
const RTOL: f64 = 1e-4;

fn close(what: &str, got: &Array, want: &Array) {
    assert_near(what, got, want, RTOL, RTOL);
}

#[test]
fn batch_norm_matches_pytorch_forward_backward_and_running_statistics() {
    let lines = ndfuse_tests::fixture_cases("batch_norm");
    assert_eq!(
        lines.len(),
        4,
        "every case of scripts/batch_norm_fixtures.py"
    );
    for f in &lines {
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        let (name, training, affine) = (f[0], f[1] == "train", f[2] == "affine");
        let bn = BatchNorm::new()
            .training(training)
            .momentum(f[3].parse().unwrap())
            .eps(f[4].parse().unwrap());
        for backend in [BackendKind::Cpu, BackendKind::Interp] {
            let ctx = Context::builder().backend(backend).build().unwrap();
            let load = |key: &str| ctx.from_array(&fixture(name, key));
            let (x, rm, rv, r) = (load("x"), load("rm"), load("rv"), load("r"));
            let (w, b) = (load("w"), load("b"));
            let affine_of = |t: &Tensor| affine.then(|| t.clone());
            let (wo, bo) = (affine_of(&w), affine_of(&b));
            let y = x.batch_norm(Some(&rm), Some(&rv), wo.as_ref(), bo.as_ref(), &bn);
            let what = format!("{name} on {backend:?}");
            close(
                &format!("{what}: y"),
                &y.eval().unwrap(),
                &fixture(name, "y"),
            );
            let loss = (&y * &r).sum(..);
            let mut wrt = vec![&x];
            if affine {
                wrt.extend([&w, &b]);
            }
            let grads = ndfuse::grad(&loss, &wrt).expect("gradients");
            for (g, key) in grads.iter().zip(["gx", "gw", "gb"]) {
                let got = g.eval().unwrap();
                close(&format!("{what}: {key}"), &got, &fixture(name, key));
            }
            if training {
                let (m, v) = x.batch_norm_running(&rm, &rv, &bn);
                close(
                    &format!("{what}: running mean"),
                    &m.eval().unwrap(),
                    &fixture(name, "rm_out"),
                );
                close(
                    &format!("{what}: running var"),
                    &v.eval().unwrap(),
                    &fixture(name, "rv_out"),
                );
            }
        }
    }
}

#[test]
fn inference_batch_norm_relu_and_a_residual_are_one_kernel_over_the_elements() {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[2, 8, 6, 6], -1.0, 1.0, 1);
    let stats = |seed: u64, lo: f64| ctx.rand_uniform(&[8], lo, lo + 1.0, seed);
    let (m, v, w, b) = (stats(2, -0.5), stats(3, 0.5), stats(4, 0.5), stats(5, -0.5));
    let skip = ctx.rand_uniform(&[2, 8, 6, 6], -1.0, 1.0, 6);
    let y = x
        .batch_norm(Some(&m), Some(&v), Some(&w), Some(&b), &BatchNorm::new())
        .relu()
        + &skip;
    let (_, report) = ctx.eval_report(&[&y]).expect("eval");
    // The statistics fold into a scale and a shift per channel (one kernel of 8
    // elements); every element of x is read, normalised, rectified and added to the
    // residual in one kernel.
    let text = report.kernels_text();
    assert_eq!(report.kernel_count(), 2, "{text}");
    assert_eq!(text.matches("domain=[2,8,6,6]").count(), 1, "{text}");
}

#[test]
fn expressions_and_bad_arguments() {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[4, 3, 2], -1.0, 1.0, 1);
    let w = ctx.rand_uniform(&[3], 0.5, 1.5, 2);
    let got = ctx
        .evaluate(
            "batch_norm(x, None, None, w, training=true, eps=0.001)",
            &[("x", &x), ("w", &w)],
        )
        .unwrap();
    let bn = BatchNorm::new().training(true).eps(1e-3);
    let want = x
        .batch_norm(None, None, Some(&w), None, &bn)
        .eval()
        .unwrap();
    assert_eq!(got.to_f64_vec(), want.to_f64_vec());
    let bad: Vec<(Tensor, &str)> = vec![
        (
            x.batch_norm(None, None, None, None, &BatchNorm::new()),
            "needs running_mean and running_var",
        ),
        (
            x.batch_norm(None, None, Some(&ctx.ones(&[4])), None, &bn),
            "weight [4]: weight must be [3]",
        ),
        (
            ctx.ones(&[1, 3]).batch_norm(None, None, None, None, &bn),
            "more than 1 value per channel",
        ),
        (
            ctx.ones(&[3]).batch_norm(None, None, None, None, &bn),
            "must be [N, C, ...]",
        ),
    ];
    for (t, want) in bad {
        let e = t.eval().expect_err(want).to_string();
        assert!(e.contains(want) && e.contains("batch_norm.rs"), "{e}");
    }
}
