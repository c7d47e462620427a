//! `Context::random_uniform_keyed`, `Context::key` and `Tensor::dropout` from the
//! user's side: the CPU backend (JIT) against the interpreter and against
//! `ndfuse_ir::op::random_uniform` (pinned by the IR's tests to an independent
//! transcription of the hash), bit for bit, on 1, 2 and 4 threads (`cpu_threads`), read
//! contiguously and through a transpose, a broadcast and a slice in one kernel; the
//! fused kernel count; dropout's mask statistics, kept values and gradient; the errors.

use ndfuse::{grad, BackendKind, Config, Context, SliceArg, Tensor};
use ndfuse_ir::op::random_uniform;

fn cpu(threads: usize) -> Context {
    let cfg = Config::builder()
        .config_file(None)
        .set("cpu_threads", threads.to_string())
        .build()
        .expect("valid configuration");
    Context::builder()
        .config(cfg)
        .backend(BackendKind::Cpu)
        .build()
        .expect("a CPU context")
}

fn interp() -> Context {
    Context::builder()
        .backend(BackendKind::Interp)
        .build()
        .expect("an interpreter context")
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.eval()
        .expect("evaluates")
        .to_vec::<f32>()
        .expect("f32")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// Deterministic f32 data in [-4, 4).
fn data(ctx: &Context, shape: &[usize], seed: u64) -> Tensor {
    ctx.rand_uniform(shape, -4.0, 4.0, seed)
}

/// The graphs compared across backends: random values alone, fused with `* x + y`,
/// and read through a transpose, a broadcast and a slice in the same kernel.
fn graphs(ctx: &Context, shape: &[usize], key: u64) -> Vec<Tensor> {
    let k = ctx.key(key);
    let r = ctx.random_uniform_keyed(shape, &k);
    let (x, y) = (data(ctx, shape, 1), data(ctx, shape, 2));
    let mut v = vec![r.clone(), &(&r * &x) + &y];
    if let [m, n] = *shape {
        let t = ctx.random_uniform_keyed(&[n, m], &k).transpose();
        let b = ctx.random_uniform_keyed(&[n], &k).broadcast_to(&[m, n]);
        let s = ctx.random_uniform_keyed(&[2 * m + 1, n + 5], &k).slice(&[
            SliceArg::new(Some(1), None, 2),
            SliceArg::new(Some(3), Some(3 + n as i64), 1),
        ]);
        v.push(&(&(&t * &x) + &b) - &s);
    }
    v
}

#[test]
fn cpu_equals_the_interpreter_bit_for_bit_on_1_2_and_4_threads() {
    let shapes: [&[usize]; 4] = [&[1], &[7], &[1000], &[4096, 33]];
    for shape in shapes {
        for key in [3u64, u64::MAX - 1] {
            let want: Vec<Vec<u32>> = graphs(&interp(), shape, key).iter().map(bits).collect();
            // The random values themselves, from the reference hash.
            let own: Vec<u32> = (0..shape.iter().product::<usize>())
                .map(|i| random_uniform(key as i64, i as u64).to_bits())
                .collect();
            assert_eq!(want[0], own, "{shape:?}");
            for threads in [1, 2, 4] {
                let ctx = cpu(threads);
                let outs = graphs(&ctx, shape, key);
                for (i, t) in outs.iter().enumerate() {
                    let (_, report) = ctx.eval_report(&[t]).expect("evaluates");
                    let annotated = report.annotated_graph();
                    assert!(
                        !annotated.contains("interp"),
                        "graph {i} of {shape:?} ran in the interpreter:\n{annotated}"
                    );
                    assert_eq!(bits(t), want[i], "graph {i}, {shape:?}, {threads} threads");
                }
            }
        }
    }
}

#[test]
fn random_times_x_plus_y_is_one_kernel() {
    let ctx = cpu(2);
    let outs = graphs(&ctx, &[4096, 33], 5);
    for (i, want) in [(1, 1), (2, 1)] {
        let (_, report) = ctx.eval_report(&[&outs[i]]).expect("evaluates");
        assert_eq!(report.kernel_count(), want, "{}", report.kernels_text());
    }
}

#[test]
fn new_keys_do_not_change_the_graph() {
    let ctx = cpu(1);
    let x = data(&ctx, &[10, 10], 1);
    let a = x.dropout(0.5, &ctx.key(1));
    let b = x.dropout(0.5, &ctx.key(2));
    assert_eq!(
        ctx.graph(&[&a]).unwrap().fingerprint(),
        ctx.graph(&[&b]).unwrap().fingerprint()
    );
    assert_ne!(bits(&a), bits(&b));
}

const N: usize = 1 << 20;

/// (mask, values) of `dropout(x, p, key)` over `N` elements on the CPU backend.
fn dropped(ctx: &Context, x: &Tensor, p: f64, key: u64) -> (Vec<bool>, Vec<f32>) {
    let y = x
        .dropout(p, &ctx.key(key))
        .eval()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    (y.iter().map(|&v| v != 0.0).collect(), y)
}

#[test]
fn dropout_keeps_one_minus_p_and_scales_exactly() {
    let ctx = cpu(2);
    // Values away from 0, so that a kept element is never 0.
    let x = (data(&ctx, &[N], 7).abs() + 0.5).cast(ndfuse::DType::F32);
    let xs = x.eval().unwrap().to_vec::<f32>().unwrap();
    for (p, key) in [(0.3, 11u64), (0.75, 12), (0.5, 13)] {
        let (mask, y) = dropped(&ctx, &x, p, key);
        let kept = mask.iter().filter(|&&m| m).count() as f64 / N as f64;
        assert!((kept - (1.0 - p)).abs() < 0.01, "p {p}: kept {kept}");
        let scale = (1.0 / (1.0 - p)) as f32;
        for i in 0..N {
            // The mask is the reference random value against p (compared in f32).
            let keep = random_uniform(key as i64, i as u64) >= p as f32;
            assert_eq!(mask[i], keep, "p {p}, element {i}");
            let want = if keep { xs[i] * scale } else { 0.0 };
            assert_eq!(y[i].to_bits(), want.to_bits(), "p {p}, element {i}");
        }
        if p == 0.75 {
            // 1 / (1 - p) = 4 is exact: kept values are exactly x / (1 - p).
            assert!((0..N).all(|i| !mask[i] || y[i] == xs[i] / 0.25));
        }
    }
}

#[test]
fn the_same_key_gives_the_same_mask_and_another_key_another() {
    let ctx = cpu(4);
    let x = ctx.ones(&[N]);
    let (a, _) = dropped(&ctx, &x, 0.5, 99);
    let (b, _) = dropped(&ctx, &x, 0.5, 99);
    let (c, _) = dropped(&ctx, &x, 0.5, 100);
    assert_eq!(a, b);
    // Independent masks differ in half the positions.
    let differ = a.iter().zip(&c).filter(|(p, q)| p != q).count() as f64 / N as f64;
    assert!((differ - 0.5).abs() < 0.01, "{differ}");
    // p == 0 is the identity.
    assert_eq!(bits(&x.dropout(0.0, &ctx.key(1))), bits(&x));
}

#[test]
fn the_gradient_is_the_mask_over_one_minus_p() {
    let ctx = cpu(2);
    let n = 100_000;
    let x = data(&ctx, &[n], 3);
    for p in [0.75, 0.3] {
        let key = ctx.key(21);
        let loss = x.dropout(p, &key).sum(..);
        let g = grad(&loss, &[&x]).expect("differentiable")[0]
            .eval()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let scale = (1.0 / (1.0 - p)) as f32;
        for (i, gi) in g.iter().enumerate() {
            let keep = random_uniform(21, i as u64) >= p as f32;
            let want = if keep { scale } else { 0.0 };
            assert_eq!(gi.to_bits(), want.to_bits(), "p {p}, element {i}");
        }
    }
}

#[test]
fn a_key_that_is_not_a_0d_i64_and_a_bad_p_are_errors() {
    let ctx = cpu(1);
    for (key, ty) in [
        (ctx.full(&[], 1.0), "f32[]"),
        (ctx.from_vec(vec![1i64], &[1]).unwrap(), "i64[1]"),
        (ctx.from_vec(vec![1i32], &[]).unwrap(), "i32[]"),
    ] {
        let r = ctx.random_uniform_keyed(&[4], &key);
        let e = r.eval().expect_err("a bad key").to_string();
        assert!(e.contains(ty) && e.contains("0-d i64"), "{e}");
        assert!(e.contains("dropout.rs"), "the call site: {e}");
    }
    let x = ctx.ones(&[4]);
    for p in [1.0, -0.1, f64::NAN, 2.5] {
        let e = x
            .dropout(p, &ctx.key(0))
            .eval()
            .expect_err("bad p")
            .to_string();
        assert!(
            e.contains("dropout") && e.contains(&format!("p = {p}")),
            "{e}"
        );
        assert!(e.contains("dropout.rs"), "the call site: {e}");
    }
}

#[test]
fn the_expression_language_has_dropout() {
    let ctx = cpu(2);
    let x = data(&ctx, &[1000], 5);
    let key = ctx.key(17);
    let want = bits(&x.dropout(0.25, &key));
    let with_input = ctx
        .evaluate("dropout(x, 0.25, k)", &[("x", &x), ("k", &key)])
        .expect("evaluates");
    let with_seed = ctx
        .evaluate("dropout(x, p=0.25, key=17)", &[("x", &x)])
        .expect("evaluates");
    for got in [with_input, with_seed] {
        let got: Vec<u32> = got
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect();
        assert_eq!(got, want);
    }
    let e = ctx
        .evaluate("dropout(x, 1.5, 1)", &[("x", &x)])
        .expect_err("p outside [0, 1)")
        .to_string();
    assert!(e.contains("p = 1.5"), "{e}");
    let e = ctx
        .evaluate("dropout(x, 0.5, x)", &[("x", &x)])
        .expect_err("an f32 key")
        .to_string();
    assert!(e.contains("f32[1000]") && e.contains("0-d i64"), "{e}");
}
