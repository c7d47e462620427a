//! Convolutions against PyTorch: `tests/fixtures/conv` holds torch's conv1d / conv2d
//! outputs and the gradients of `sum(y * r)` for every combination the fixtures script
//! (`scripts/conv_fixtures.py`) lists: strides, per-side and per-axis padding, `same`
//! (odd total included) and `valid`, dilation, groups and depthwise, 1x1 kernels, a
//! kernel as large as the padded input, odd sizes, with and without a bias. The CPU
//! backend (f32) is checked under the bound of an f32 sum, the interpreter (f64 sums,
//! each node rounded to f32) to three roundings; gradients through the same rules as everything else. Bad arguments are errors
//! naming both shapes and the call site.

use ndfuse::{Array, BackendKind, Context, Conv, Padding, Tensor};
use std::path::{Path, PathBuf};

/// f32's unit roundoff.
const U: f64 = 5.960_464_477_539_063e-8;

struct Case {
    name: String,
    rank: usize,
    conv: Conv,
    bias: bool,
}

/// The fixtures of one script section: `conv` or `pool`.
fn fixtures(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(set)
}

/// The fields of each case line of `set`'s `cases.txt` (comments and blanks left out).
fn case_lines(set: &str) -> Vec<Vec<String>> {
    let path = fixtures(set).join("cases.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// `2,1` as `[2, 1]`.
fn nums(s: &str) -> Vec<usize> {
    s.split(',').map(|v| v.parse().expect("a number")).collect()
}

fn cases() -> Vec<Case> {
    case_lines("conv")
        .into_iter()
        .map(|f| {
            let rank: usize = f[1].parse().expect("a rank");
            let padding = match f[3].as_str() {
                "same" => Padding::Same,
                "valid" => Padding::Valid,
                p => Padding::Explicit(nums(p).into_iter().map(|v| (v, v)).collect()),
            };
            let conv = Conv::new()
                .stride(&nums(&f[2])[..])
                .padding(padding)
                .dilation(&nums(&f[4])[..])
                .groups(f[5].parse().expect("groups"));
            Case {
                name: f[0].to_string(),
                rank,
                conv,
                bias: f[6] == "bias",
            }
        })
        .collect()
}

/// Array `key` of case `case` of fixture set `set`.
fn load_from(set: &str, case: &str, key: &str) -> Array {
    ndfuse::npy::read_npy(fixtures(set).join(case).join(format!("{key}.npy")))
        .unwrap_or_else(|e| panic!("{set}/{case}/{key}.npy: {e}"))
}

fn load(case: &str, key: &str) -> Array {
    load_from("conv", case, key)
}

fn conv(case: &Case, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    if case.rank == 1 {
        x.conv1d(w, b, &case.conv)
    } else {
        x.conv2d(w, b, &case.conv)
    }
}

/// Checks `got` against `want` element by element: `|got - want| <= bound`.
fn close(what: &str, got: &Array, want: &Array, bound: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let worst = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0.0f64), |m, (i, d)| if d > m.1 { (i, d) } else { m });
    assert!(
        worst.1 <= bound,
        "{what}: element {} is {} against torch's {} (|diff| {:e} > {bound:e})",
        worst.0,
        g[worst.0],
        w[worst.0],
        worst.1
    );
}

/// The bound of an f32 sum of `terms` products of values of magnitude at most `mag`
/// each (gamma_K * sum |a||b|, with K + 2 for the bias add and the final rounding).
fn f32_bound(terms: usize, mag: f64) -> f64 {
    (terms as f64 + 2.0) * U * (terms as f64 * mag + 1.0)
}

#[test]
fn conv_matches_pytorch_forward_and_backward() {
    let cases = cases();
    assert_eq!(cases.len(), 13, "every case of scripts/conv_fixtures.py");
    for case in &cases {
        let name = &case.name;
        for backend in [BackendKind::Cpu, BackendKind::Interp] {
            let ctx = Context::builder()
                .backend(backend)
                .build()
                .expect("a context");
            let x = ctx.from_array(&load(name, "x"));
            let w = ctx.from_array(&load(name, "w"));
            let b = case.bias.then(|| ctx.from_array(&load(name, "b")));
            let r = ctx.from_array(&load(name, "r"));
            let y = conv(case, &x, &w, b.as_ref());
            let w_shape = w.shape().expect("w");
            let (groups, o) = (case.conv.groups_count(), w_shape[0]);
            // Terms of one output: C/g * taps; of dL/dx: O/g * taps (at most); of dL/dw
            // and dL/db: N * output positions.
            let taps: usize = w_shape[2..].iter().product();
            let y_ref = load(name, "y");
            let positions = y_ref.len() / o;
            let fwd_terms = w_shape[1] * taps;
            let tol = |terms: usize, mag: f64| match backend {
                // f64 sums, each node's result rounded to f32 once: the product, then
                // the bias add.
                BackendKind::Interp => 3.0 * U * (terms as f64 * mag + 1.0),
                _ => f32_bound(terms, mag),
            };
            let what = format!("{name} on {backend:?}");
            close(
                &format!("{what}: y"),
                &y.eval().expect("y"),
                &y_ref,
                tol(fwd_terms, 1.0),
            );
            let loss = (&y * &r).sum(..);
            let mut wrt = vec![&x, &w];
            if let Some(b) = &b {
                wrt.push(b);
            }
            let grads = ndfuse::grad(&loss, &wrt).expect("gradients");
            let gx = grads[0].eval().expect("dx");
            close(
                &format!("{what}: dL/dx"),
                &gx,
                &load(name, "gx"),
                tol(o / groups * taps, 1.0),
            );
            let gw = grads[1].eval().expect("dw");
            close(
                &format!("{what}: dL/dw"),
                &gw,
                &load(name, "gw"),
                tol(positions, 1.0),
            );
            if case.bias {
                let gb = grads[2].eval().expect("db");
                close(
                    &format!("{what}: dL/db"),
                    &gb,
                    &load(name, "gb"),
                    tol(positions, 1.0),
                );
            }
        }
    }
}

#[test]
fn relu_of_a_convolution_with_bias_is_the_products_epilogue() {
    // The CNN's block, conv + bias + relu + max-pool: the windows' matrix (the gather
    // and the padding's select, one kernel), the product with the bias and the relu as
    // its epilogue (the relu reads the product through the reshape to [N, O, h, w],
    // which moves below it: passes' `sink_reshapes`), then the pool's kernels. The
    // relu was a kernel of its own before. An implicit GEMM would take the windows'
    // kernel away too.
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[2, 8, 10, 10], -1.0, 1.0, 1);
    let w = ctx.rand_uniform(&[16, 8, 3, 3], -1.0, 1.0, 2);
    let b = ctx.rand_uniform(&[16], -1.0, 1.0, 3);
    let (x, w, b) = (
        ctx.from_array(&x.eval().expect("x")),
        ctx.from_array(&w.eval().expect("w")),
        ctx.from_array(&b.eval().expect("b")),
    );
    let same = Conv::new().padding(1);
    let pool = ndfuse::Pool::new(2);
    let y = x.conv2d(&w, Some(&b), &same).relu().max_pool2d(&pool);
    let (out, report) = ctx.eval_report(&[&y]).expect("eval");
    assert_eq!(out[0].shape(), &[2, 16, 5, 5]);
    let text = report.kernels_text();
    assert!(text.contains("matmul_add_relu"), "{text}");
    assert!(!text.contains("kernel k2_relu"), "{text}");
    // The same bits as the convolution evaluated alone, then rectified and pooled.
    let alone = x.conv2d(&w, Some(&b), &same).eval().expect("conv");
    let want = ctx
        .from_array(&alone)
        .relu()
        .max_pool2d(&pool)
        .eval()
        .expect("pool");
    assert_eq!(out[0].to_f64_vec(), want.to_f64_vec());
}

#[test]
fn a_rectified_convolution_as_the_output_is_two_kernels() {
    // The relu moves above the output's reshape, into the product's epilogue; the
    // output is the product's buffer under the NCHW shape (no copy).
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[2, 8, 10, 10], -1.0, 1.0, 1);
    let w = ctx.rand_uniform(&[16, 8, 3, 3], -1.0, 1.0, 2);
    let (x, w) = (
        ctx.from_array(&x.eval().expect("x")),
        ctx.from_array(&w.eval().expect("w")),
    );
    let same = Conv::new().padding(1);
    let y = x.conv2d(&w, None, &same).relu();
    let (out, report) = ctx.eval_report(&[&y]).expect("eval");
    let graph = report.evaluation().annotated_graph();
    assert_eq!(report.kernel_count(), 2, "{graph}");
    assert!(graph.contains("reshaped (no copy)"), "{graph}");
    assert_eq!(out[0].shape(), &[2, 16, 10, 10]);
    let alone = x.conv2d(&w, None, &same).eval().expect("conv");
    let want = ctx.from_array(&alone).relu().eval().expect("relu");
    assert_eq!(out[0].to_f64_vec(), want.to_f64_vec());
}

#[test]
fn conv_batch_norm_relu_and_a_residual_are_the_products_epilogue() {
    // Inference batch norm folds into a per-channel scale and shift (one kernel of O
    // elements); the scale and shift, the relu and the residual add join the product's
    // epilogue, and the global pool after them reads its result: four kernels where
    // the chain was a kernel of its own.
    let ctx = Context::new();
    let arr = |shape: &[usize], seed: u64, lo: f64| {
        let t = ctx.rand_uniform(shape, lo, lo + 1.0, seed);
        ctx.from_array(&t.eval().expect("input"))
    };
    let (x, w) = (arr(&[2, 8, 6, 6], 1, -0.5), arr(&[8, 8, 3, 3], 2, -0.5));
    let skip = arr(&[2, 8, 6, 6], 3, -0.5);
    let (m, v) = (arr(&[8], 4, -0.5), arr(&[8], 5, 0.5));
    let (g, b) = (arr(&[8], 6, 0.5), arr(&[8], 7, -0.5));
    let bn = ndfuse::BatchNorm::new();
    let same = Conv::new().padding(1);
    let block = |c: &Tensor| {
        (c.batch_norm(Some(&m), Some(&v), Some(&g), Some(&b), &bn)
            .relu()
            + &skip)
            .global_avg_pool2d()
    };
    let y = block(&x.conv2d(&w, None, &same));
    let (out, report) = ctx.eval_report(&[&y]).expect("eval");
    let text = report.kernels_text();
    assert_eq!(report.kernel_count(), 4, "{text}");
    assert!(text.contains("k2_matmul_mul_add_relu"), "{text}");
    // The epilogue's values are the separate chain's bits; the pool may add the 36
    // taps in another order: each mean within 36 roundings of f32 on taps below 2.
    let alone = ctx.from_array(&x.conv2d(&w, None, &same).eval().expect("conv"));
    let want = block(&alone).eval().expect("block");
    let bound = 36.0 * 2.0 * f64::from(f32::EPSILON);
    ndfuse_tests::assert_near("pooled block", &out[0], &want, 0.0, bound);
}

#[test]
fn bad_convolutions_are_errors_naming_both_shapes_and_the_call_site() {
    let ctx = Context::new();
    let x = ctx.zeros(&[2, 6, 8, 8]);
    let cases: Vec<(Tensor, &str)> = vec![
        (
            x.conv2d(&ctx.zeros(&[4, 4, 3, 3]), None, &Conv::new()),
            "x [2, 6, 8, 8], w [4, 4, 3, 3]: x has 6 channels, so w's second axis must be 6 / groups = 6, not 4",
        ),
        (
            x.conv2d(&ctx.zeros(&[4, 2, 3, 3]), None, &Conv::new().groups(4)),
            "groups = 4 must divide the 6 input channels and the 4 output channels",
        ),
        (
            x.conv2d(&ctx.zeros(&[4, 6, 11, 3]), None, &Conv::new().padding(1)),
            "spatial axis 0: the window spans 11 (kernel 11 at dilation 1), longer than the padded input's 10",
        ),
        (
            x.conv2d(&ctx.zeros(&[4, 6, 3, 3]), None, &Conv::new().stride(2).padding("same")),
            "padding 'same' needs stride 1",
        ),
        (
            x.conv2d(&ctx.zeros(&[4, 6, 3, 3]), None, &Conv::new().padding("full")),
            "padding has 0 pairs for 2 spatial axes",
        ),
        (
            x.conv1d(&ctx.zeros(&[4, 6, 3]), None, &Conv::new()),
            "x must be [N, C, L] and w [O, C / groups, k]",
        ),
        (
            x.conv2d(&ctx.zeros(&[4, 6, 3, 3]), Some(&ctx.zeros(&[5])), &Conv::new()),
            "bias [5] must be [4]",
        ),
    ];
    for (t, says) in cases {
        let err = t.eval().expect_err(says).to_string();
        assert!(err.contains(says), "{err:?} should say {says:?}");
        assert!(err.contains("tests/tests/conv.rs"), "the call site: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

/// Gradients against central differences in f64: a strided, padded, dilated, grouped
/// conv2d with a bias, loss `sum(y * r)`; every element of dL/dw and dL/db and every
/// seventh of dL/dx. The loss is linear in each input, so a central difference is exact
/// up to rounding: tolerance 1e-7 relative to the largest gradient.
#[test]
fn gradients_match_central_differences() {
    let ctx = Context::new();
    let conv = Conv::new()
        .stride((2, 1))
        .padding((1, 2))
        .dilation(2)
        .groups(2);
    let vals = |n: usize, seed: u64| -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect()
    };
    let (xs, ws) = ([2usize, 4, 7, 6], [6usize, 2, 3, 2]);
    let xv = vals(xs.iter().product(), 1);
    let wv = vals(ws.iter().product(), 2);
    let bv = vals(6, 3);
    let loss_of = |xv: &[f64], wv: &[f64], bv: &[f64], r: Option<&Tensor>| {
        let x = ctx.from_slice(xv, &xs).expect("x");
        let w = ctx.from_slice(wv, &ws).expect("w");
        let b = ctx.from_slice(bv, &[6]).expect("b");
        let y = x.conv2d(&w, Some(&b), &conv);
        let r = match r {
            Some(r) => r.clone(),
            None => ctx
                .from_slice(
                    &vals(y.shape().expect("y").iter().product(), 4),
                    y.shape().expect("y"),
                )
                .expect("r"),
        };
        ((&y * &r).sum(..), x, w, b, r)
    };
    let (loss, x, w, b, r) = loss_of(&xv, &wv, &bv, None);
    let grads = ndfuse::grad(&loss, &[&x, &w, &b]).expect("gradients");
    let got: Vec<Vec<f64>> = grads
        .iter()
        .map(|g| g.eval().expect("grad").to_f64_vec())
        .collect();
    let value = |xv: &[f64], wv: &[f64], bv: &[f64]| {
        loss_of(xv, wv, bv, Some(&r))
            .0
            .eval()
            .expect("loss")
            .to_f64_vec()[0]
    };
    let h = 1e-3;
    for (which, len, step) in [
        (0usize, xv.len(), 7usize),
        (1, wv.len(), 1),
        (2, bv.len(), 1),
    ] {
        let scale = got[which].iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for i in (0..len).step_by(step) {
            let mut vs = [xv.clone(), wv.clone(), bv.clone()];
            vs[which][i] += h;
            let up = value(&vs[0], &vs[1], &vs[2]);
            vs[which][i] -= 2.0 * h;
            let down = value(&vs[0], &vs[1], &vs[2]);
            let fd = (up - down) / (2.0 * h);
            assert!(
                (fd - got[which][i]).abs() <= 1e-7 * scale,
                "input {which} element {i}: autodiff {} against central difference {fd}",
                got[which][i]
            );
        }
    }
}

/// `tests/fixtures/pool`: torch's max_pool2d and avg_pool2d (window, stride, padding,
/// dilation, count_include_pad; one max case with ties) and the gradients of `sum(y *
/// r)`. A max is one of its taps: exact; the gradient of a max goes to the first
/// largest tap of each window, as torch's (the ties case checks it), summed where
/// windows overlap; averages within an f32 sum's bound.
#[test]
fn pooling_matches_pytorch_forward_and_backward() {
    let load = |case: &str, key: &str| load_from("pool", case, key);
    let mut seen = 0;
    for f in case_lines("pool") {
        let (name, kind) = (f[0].as_str(), f[1].as_str());
        let kernel = nums(&f[2]);
        let pool = ndfuse::Pool::new(&kernel[..])
            .stride(&nums(&f[3])[..])
            .padding(&nums(&f[4])[..])
            .dilation(&nums(&f[5])[..])
            .count_include_pad(f[6] == "counted");
        let taps = kernel[0] * kernel[1];
        for backend in [BackendKind::Cpu, BackendKind::Interp] {
            let ctx = Context::builder()
                .backend(backend)
                .build()
                .expect("a context");
            let x = ctx.from_array(&load(name, "x"));
            let r = ctx.from_array(&load(name, "r"));
            let y = if kind == "max" {
                x.max_pool2d(&pool)
            } else {
                x.avg_pool2d(&pool)
            };
            let what = format!("{name} on {backend:?}");
            let (y_tol, g_tol) = if kind == "max" {
                (0.0, f32_bound(taps, 1.0))
            } else {
                (f32_bound(taps, 1.0), f32_bound(taps, 1.0))
            };
            close(
                &format!("{what}: y"),
                &y.eval().expect("y"),
                &load(name, "y"),
                y_tol,
            );
            let loss = (&y * &r).sum(..);
            let g = ndfuse::grad(&loss, &[&x]).expect("gradient");
            close(
                &format!("{what}: dL/dx"),
                &g[0].eval().expect("dx"),
                &load(name, "gx"),
                g_tol,
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 8, "every case of scripts/conv_fixtures.py");
}

#[test]
fn global_average_pooling_is_the_spatial_mean() {
    let ctx = Context::new();
    let x = ctx
        .from_vec(
            (0..2 * 3 * 4 * 5).map(|v| v as f32).collect(),
            &[2, 3, 4, 5],
        )
        .expect("x");
    let y = x.global_avg_pool2d().eval().expect("y");
    assert_eq!(y.shape(), &[2, 3, 1, 1]);
    // Channel (n, c) holds 20 consecutive values starting at 20 * (3n + c).
    let want: Vec<f64> = (0..6).map(|i| 20.0 * i as f64 + 9.5).collect();
    assert_eq!(y.to_f64_vec(), want);
    let err = ctx
        .zeros(&[2, 3])
        .global_avg_pool2d()
        .eval()
        .expect_err("rank 2");
    assert!(err.to_string().contains("must be [N, C, H, W]"), "{err}");
}

#[test]
fn bad_poolings_are_errors_naming_the_shape_and_the_call_site() {
    let ctx = Context::new();
    let x = ctx.zeros(&[1, 2, 5, 5]);
    let cases: Vec<(Tensor, &str)> = vec![
        (
            x.max_pool2d(&ndfuse::Pool::new(3).padding(2)),
            "must be at most half the window",
        ),
        (
            x.avg_pool2d(&ndfuse::Pool::new(7)),
            "the window spans 7, longer than the padded input's 5",
        ),
        (x.max_pool2d(&ndfuse::Pool::new(0)), "must be at least 1"),
        (
            ctx.zeros(&[2, 5, 5]).max_pool2d(&ndfuse::Pool::new(2)),
            "must be [N, C, H, W]",
        ),
    ];
    for (t, says) in cases {
        let err = t.eval().expect_err(says).to_string();
        assert!(err.contains(says), "{err:?} should say {says:?}");
        assert!(err.contains("tests/tests/conv.rs"), "the call site: {err}");
    }
}

/// The textbook sum of a 1-D or 2-D convolution (groups 1), in f64: `[N, O, out...]`.
#[allow(clippy::too_many_arguments)]
fn direct_conv(
    x: &[f32],
    xs: &[usize],
    w: &[f32],
    ws: &[usize],
    b: &[f32],
    stride: usize,
    pad: usize,
) -> (Vec<usize>, Vec<f64>) {
    let r = xs.len() - 2;
    let (n, c, o) = (xs[0], xs[1], ws[0]);
    let sp = &xs[2..];
    let k = &ws[2..];
    let out: Vec<usize> = (0..r)
        .map(|a| (sp[a] + 2 * pad - k[a]) / stride + 1)
        .collect();
    let (h, wd) = (if r == 2 { sp[0] } else { 1 }, sp[r - 1]);
    let (kh, kw) = (if r == 2 { k[0] } else { 1 }, k[r - 1]);
    let (oh, ow) = (if r == 2 { out[0] } else { 1 }, out[r - 1]);
    let mut y = Vec::new();
    for ni in 0..n {
        for oi in 0..o {
            for py in 0..oh {
                for px in 0..ow {
                    let mut s = f64::from(b[oi]);
                    for ci in 0..c {
                        for ty in 0..kh {
                            for tx in 0..kw {
                                let iy =
                                    (py * stride + ty) as i64 - if r == 2 { pad as i64 } else { 0 };
                                let ix = (px * stride + tx) as i64 - pad as i64;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                    continue;
                                }
                                let xv = x[((ni * c + ci) * h + iy as usize) * wd + ix as usize];
                                let wv = w[((oi * c + ci) * kh + ty) * kw + tx];
                                s += f64::from(xv) * f64::from(wv);
                            }
                        }
                    }
                    y.push(s);
                }
            }
        }
    }
    let mut shape = vec![n, o];
    shape.extend(out);
    (shape, y)
}

/// Many batch items of few output positions (a sequence of short frames, as silero-vad
/// convolves) take one product over every item and position: the values of the sum.
#[test]
fn many_items_of_few_positions_match_the_direct_sum() {
    let ctx = Context::new();
    let vals = |n: usize, s: f32| (0..n).map(|i| ((i as f32) * s).sin()).collect::<Vec<f32>>();
    for (xs, ws, stride, pad) in [
        (vec![12usize, 3, 5], vec![4usize, 3, 3], 2usize, 1usize),
        (vec![70, 2, 3, 3], vec![3, 2, 2, 2], 1, 1),
        (vec![9, 1, 16], vec![5, 1, 8], 4, 0),
    ] {
        let (xn, wn) = (xs.iter().product(), ws.iter().product());
        let (xv, wv, bv) = (vals(xn, 0.37), vals(wn, 0.91), vals(ws[0], 1.3));
        let x = ctx.from_vec(xv.clone(), &xs).unwrap();
        let w = ctx.from_vec(wv.clone(), &ws).unwrap();
        let b = ctx.from_vec(bv.clone(), &[ws[0]]).unwrap();
        let conv = Conv::new().stride(stride).padding(pad);
        let y = if xs.len() == 3 {
            x.conv1d(&w, Some(&b), &conv)
        } else {
            x.conv2d(&w, Some(&b), &conv)
        };
        let got = y.eval().unwrap();
        let (shape, want) = direct_conv(&xv, &xs, &wv, &ws, &bv, stride, pad);
        assert_eq!(got.shape(), shape.as_slice());
        for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{xs:?}: {g} vs {w}"
            );
        }
    }
}
