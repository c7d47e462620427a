//! Issue 36: `conv_transpose1d` / `conv_transpose2d` with PyTorch's semantics, checked
//! against torch's outputs and gradients (`tests/fixtures/conv_transpose`, from
//! `scripts/conv_fixtures.py`: strides, padding wider than the kernel's reach,
//! output padding, dilation, groups, depthwise, one and two spatial axes), as the
//! adjoint of the convolution with the same settings (<conv(x), y> = <x, conv_t(y)>,
//! in f64 on the interpreter), the CPU against the interpreter, in expressions, and bad
//! settings as errors naming the call site.

use ndfuse::{Array, BackendKind, Context, Conv, DType, Padding, Tensor};
use ndfuse_tests::assert_near;

/// Within an absolute `bound` of torch's value.
fn near(what: &str, got: &Array, want: &Array, bound: f64) {
    assert_near(what, got, want, 0.0, bound);
}

/// f32's unit roundoff.
const U: f64 = 5.960_464_477_539_063e-8;

fn fixture(case: &str, key: &str) -> Array {
    ndfuse_tests::fixture("conv_transpose", case, key)
}

/// `2,1` as a `Spatial`.
fn spatial(s: &str) -> ndfuse::Spatial {
    ndfuse::Spatial(s.split(',').map(|v| v.parse().expect("a number")).collect())
}

#[test]
fn conv_transpose_matches_pytorch_forward_and_backward() {
    let lines = ndfuse_tests::fixture_cases("conv_transpose");
    assert_eq!(lines.len(), 8, "every case of scripts/conv_fixtures.py");
    for f in &lines {
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        let (name, rank, bias) = (f[0], f[1].parse::<usize>().unwrap(), f[7] == "bias");
        let pads: Vec<(usize, usize)> = spatial(f[3]).0.iter().map(|&p| (p, p)).collect();
        let conv = Conv::new()
            .stride(spatial(f[2]))
            .padding(Padding::Explicit(pads))
            .output_padding(spatial(f[4]))
            .dilation(spatial(f[5]))
            .groups(f[6].parse().unwrap());
        for backend in [BackendKind::Cpu, BackendKind::Interp] {
            let ctx = Context::builder().backend(backend).build().unwrap();
            let x = ctx.from_array(&fixture(name, "x"));
            let w = ctx.from_array(&fixture(name, "w"));
            let b = bias.then(|| ctx.from_array(&fixture(name, "b")));
            let r = ctx.from_array(&fixture(name, "r"));
            let y = if rank == 1 {
                x.conv_transpose1d(&w, b.as_ref(), &conv)
            } else {
                x.conv_transpose2d(&w, b.as_ref(), &conv)
            };
            // The most terms of any one sum: an output sums C * taps products; dL/dw
            // and dL/db sum over N * output positions (dL/dx fewer); every value is below
            // 1 in magnitude. The CPU sums in f32 (gamma_K of the sum of magnitudes, K + 2
            // for the bias and the final rounding); the interpreter in f64, each node
            // rounded to f32 once (three roundings).
            let ws = w.shape().unwrap().to_vec();
            let ys = fixture(name, "y").shape().to_vec();
            let taps: usize = ws[2..].iter().product();
            let terms = (ws[0] * taps).max(ys[0] * ys[2..].iter().product::<usize>());
            let bound = match backend {
                BackendKind::Interp => 3.0 * U * (terms as f64 + 1.0),
                _ => (terms as f64 + 2.0) * U * (terms as f64 + 1.0),
            };
            let what = format!("{name} on {backend:?}");
            near(
                &format!("{what}: y"),
                &y.eval().unwrap(),
                &fixture(name, "y"),
                bound,
            );
            let loss = (&y * &r).sum(..);
            let mut wrt = vec![&x, &w];
            if let Some(b) = &b {
                wrt.push(b);
            }
            let grads = ndfuse::grad(&loss, &wrt).expect("gradients");
            for (g, key) in grads.iter().zip(["gx", "gw", "gb"]) {
                near(
                    &format!("{what}: {key}"),
                    &g.eval().unwrap(),
                    &fixture(name, key),
                    bound,
                );
            }
        }
    }
}

/// Values of `shape` from `seed`, in [-1, 1), f64.
fn data(ctx: &Context, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD1B5);
            ((h >> 11) % 2000) as f64 / 1000.0 - 1.0
        })
        .collect();
    ctx.from_vec(vals, shape).unwrap()
}

fn dot(ctx: &Context, a: &Tensor, b: &Tensor) -> f64 {
    let s = (a * b).reshape(&[-1]).sum(0);
    ctx.eval(&[&s]).unwrap()[0].to_f64_vec()[0]
}

/// (input spatial, kernel, stride, padding, dilation, groups).
type Case2d = ([usize; 2], [usize; 2], [usize; 2], usize, [usize; 2], usize);

const CASES: &[Case2d] = &[
    ([5, 5], [3, 3], [1, 1], 0, [1, 1], 1),
    ([6, 7], [3, 2], [2, 2], 1, [1, 1], 1),
    ([7, 6], [3, 3], [2, 3], 2, [1, 2], 2),
    ([9, 8], [2, 4], [3, 2], 0, [2, 1], 4),
    ([4, 4], [4, 4], [1, 1], 3, [1, 1], 1),
    // Padding wider than the kernel's reach: the zero-inserted input is cropped.
    ([6, 5], [2, 2], [2, 1], 2, [1, 1], 1),
];

#[test]
fn conv_transpose2d_is_the_adjoint_of_conv2d() {
    let ctx = Context::builder()
        .backend(BackendKind::Interp)
        .dtype(DType::F64)
        .build()
        .unwrap();
    for (k, &(hw, kernel, stride, pad, dil, groups)) in CASES.iter().enumerate() {
        let (n, c, o) = (2, 4, 8);
        let conv = Conv::new()
            .stride((stride[0], stride[1]))
            .padding(pad)
            .dilation((dil[0], dil[1]))
            .groups(groups);
        let x = data(&ctx, &[n, c, hw[0], hw[1]], 3 * k as u64);
        let w = data(
            &ctx,
            &[o, c / groups, kernel[0], kernel[1]],
            3 * k as u64 + 1,
        );
        let y = x.conv2d(&w, None, &conv);
        let ys = y.shape().unwrap().to_vec();
        // The output padding that gives back x's size.
        let op: Vec<usize> = (0..2)
            .map(|i| (hw[i] + 2 * pad - dil[i] * (kernel[i] - 1) - 1) % stride[i])
            .collect();
        let g = data(&ctx, &ys, 3 * k as u64 + 2);
        let back = g.conv_transpose2d(&w, None, &conv.clone().output_padding((op[0], op[1])));
        assert_eq!(back.shape().unwrap(), &[n, c, hw[0], hw[1]], "case {k}");
        let (lhs, rhs) = (dot(&ctx, &y, &g), dot(&ctx, &x, &back));
        assert!(
            (lhs - rhs).abs() <= 1e-9 * lhs.abs().max(1.0),
            "case {k}: <conv(x), g> = {lhs}, <x, conv_t(g)> = {rhs}"
        );
    }
}

#[test]
fn the_cpu_gives_the_interpreters_transposed_convolutions() {
    let ctx = Context::new();
    for (k, &(hw, kernel, stride, pad, dil, groups)) in CASES.iter().enumerate() {
        let conv = Conv::new()
            .stride((stride[0], stride[1]))
            .padding(pad)
            .dilation((dil[0], dil[1]))
            .groups(groups)
            .output_padding(usize::from(
                stride[0].max(dil[0]) > 1 && stride[1].max(dil[1]) > 1,
            ));
        let x = data(&ctx, &[2, 4, hw[0], hw[1]], 7 * k as u64).cast(DType::F32);
        let w = data(
            &ctx,
            &[4, 8 / groups, kernel[0], kernel[1]],
            7 * k as u64 + 1,
        )
        .cast(DType::F32);
        let b = data(&ctx, &[8], 7 * k as u64 + 2).cast(DType::F32);
        let y = x.conv_transpose2d(&w, Some(&b), &conv).relu();
        ctx.set_backend(BackendKind::Interp);
        let want = ctx.eval(&[&y]).unwrap_or_else(|e| panic!("case {k}: {e}"))[0].to_f64_vec();
        ctx.set_backend(BackendKind::Cpu);
        let got = ctx.eval(&[&y]).unwrap()[0].to_f64_vec();
        assert_eq!(got.len(), want.len());
        for (i, (a, e)) in got.iter().zip(&want).enumerate() {
            // f32 sums of at most 4 * 4 * 4 products of terms below 1.
            assert!(
                (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "case {k}, element {i}: {a} vs {e}"
            );
        }
    }
    // One dimension, with a stride and padding.
    let x = data(&ctx, &[1, 2, 5], 1).cast(DType::F32);
    let w = data(&ctx, &[2, 3, 3], 2).cast(DType::F32);
    let y = x.conv_transpose1d(&w, None, &Conv::new().stride(2).padding(1));
    assert_eq!(y.shape().unwrap(), &[1, 3, 9]);
}

#[test]
fn bad_transposed_convolutions_are_errors_naming_the_call_site() {
    let ctx = Context::new();
    let x = ctx.ones(&[1, 4, 5, 5]);
    let cases: Vec<(Tensor, &str)> = vec![
        (
            x.conv_transpose2d(&ctx.ones(&[3, 2, 3, 3]), None, &Conv::new()),
            "first axis must be 4",
        ),
        (
            x.conv_transpose2d(&ctx.ones(&[4, 2, 3, 3]), None, &Conv::new().groups(3)),
            "groups = 3",
        ),
        (
            x.conv_transpose2d(
                &ctx.ones(&[4, 2, 3, 3]),
                None,
                &Conv::new().stride(2).output_padding(2),
            ),
            "output_padding",
        ),
        (
            x.conv_transpose2d(&ctx.ones(&[4, 2, 3, 3]), None, &Conv::new().padding("same")),
            "'same'",
        ),
        (
            x.conv_transpose2d(
                &ctx.ones(&[4, 2, 3, 3]),
                None,
                &Conv::new().padding(Padding::Explicit(vec![(4, 4)])),
            ),
            "leaves no output",
        ),
        (
            x.conv2d(
                &ctx.ones(&[2, 4, 3, 3]),
                None,
                &Conv::new().output_padding(1),
            ),
            "transposed convolutions only",
        ),
    ];
    for (t, want) in cases {
        let e = t.eval().expect_err(want).to_string();
        assert!(e.contains(want), "{e}");
        assert!(e.contains("conv_transpose.rs"), "no call site in: {e}");
    }
}

#[test]
fn expressions_spell_transposed_convolutions_as_pytorch() {
    let ctx = Context::new();
    let x = data(&ctx, &[1, 4, 5, 5], 1).cast(DType::F32);
    let w = data(&ctx, &[4, 3, 3, 3], 2).cast(DType::F32);
    let b = data(&ctx, &[6], 3).cast(DType::F32);
    // PyTorch's positional order: stride, padding, output_padding, groups, dilation.
    let got = ctx
        .evaluate(
            "conv_transpose2d(x, w, b, 2, 1, 1, 2, 1)",
            &[("x", &x), ("w", &w), ("b", &b)],
        )
        .unwrap();
    let conv = Conv::new().stride(2).padding(1).output_padding(1).groups(2);
    let want = x.conv_transpose2d(&w, Some(&b), &conv).eval().unwrap();
    assert_eq!(got.shape(), &[1, 6, 10, 10]);
    assert_eq!(got.to_f64_vec(), want.to_f64_vec());
    let kw = ctx
        .evaluate(
            "conv_transpose2d(x, w, bias=b, stride=2, padding=1, output_padding=1, groups=2)",
            &[("x", &x), ("w", &w), ("b", &b)],
        )
        .unwrap();
    assert_eq!(kw.to_f64_vec(), want.to_f64_vec());
    let x1 = data(&ctx, &[1, 2, 5], 4).cast(DType::F32);
    let w1 = data(&ctx, &[2, 3, 3], 5).cast(DType::F32);
    let y1 = ctx
        .evaluate(
            "conv_transpose1d(x, w, dilation=2)",
            &[("x", &x1), ("w", &w1)],
        )
        .unwrap();
    assert_eq!(y1.shape(), &[1, 3, 9]);
}
