//! The user-facing API: constructors, the context's default dtype, operator syntax,
//! several outputs sharing one graph, thread-safety and deep graphs.

use ndfuse::{BackendKind, Context, DType, Tensor};

#[test]
fn handles_are_send_sync_and_cheap_to_clone() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
    assert_send_sync::<Context>();
    assert_send_sync::<ndfuse::Array>();
    // A tensor built on one thread evaluates on another.
    let ctx = Context::new();
    let a = ctx.arange(0.0, 4.0, 1.0).expect("finite");
    let y = std::thread::spawn(move || (&a * 2.0).eval().expect("runs"))
        .join()
        .expect("no panic");
    assert_eq!(y.to_vec::<f32>().expect("f32"), vec![0.0, 2.0, 4.0, 6.0]);
}

#[test]
// `.sum(&[1])` is the documented spelling this test pins; `[1]` works too.
#[allow(clippy::needless_borrows_for_generic_args)]
fn the_mission_example_reads_as_written() {
    let ctx = Context::new();
    let a = ctx
        .from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])
        .expect("6");
    let b = ctx.full(&[3], 0.5);
    let y = (&a * &b + 1.0).exp().sum(&[1]);
    let z = a.max(..);
    let out = ctx.eval(&[&y, &z]).expect("runs");
    let want: Vec<f32> = [[0.0f32, 1.0, 2.0], [3.0, 4.0, 5.0]]
        .iter()
        .map(|r| r.iter().map(|x| (x * 0.5 + 1.0).exp()).sum())
        .collect();
    let got = out[0].to_vec::<f32>().expect("f32");
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "{g} vs {w}");
    }
    assert_eq!(out[1].shape(), &[] as &[usize]);
    assert_eq!(out[1].to_vec::<f32>().expect("f32"), vec![5.0]);
}

#[test]
fn constructors_fill_shapes_and_dtypes() {
    let ctx = Context::new();
    assert_eq!(
        ctx.zeros(&[2, 2])
            .eval()
            .expect("runs")
            .to_vec::<f32>()
            .expect("f32"),
        vec![0.0; 4]
    );
    assert_eq!(
        ctx.ones(&[3])
            .eval()
            .expect("runs")
            .to_vec::<f32>()
            .expect("f32"),
        vec![1.0; 3]
    );
    let f = ctx.full_dtype(&[2], 7.9, DType::I32).eval().expect("runs");
    assert_eq!(
        f.to_vec::<i32>().expect("i32"),
        vec![7, 7],
        "casts truncate toward zero"
    );
    let r = ctx
        .arange(5.0, 0.0, -1.5)
        .expect("finite")
        .eval()
        .expect("runs");
    assert_eq!(r.to_vec::<f32>().expect("f32"), vec![5.0, 3.5, 2.0, 0.5]);
    assert_eq!(
        ctx.arange(0.0, 0.0, 1.0)
            .expect("empty")
            .eval()
            .expect("runs")
            .len(),
        0
    );
    let s = ctx.scalar(2.5).eval().expect("runs");
    assert_eq!(
        (s.shape(), s.to_vec::<f32>().expect("f32")),
        (&[] as &[usize], vec![2.5])
    );
    let t = Tensor::from_slice(&[true, false, true], &[3]).expect("3");
    assert_eq!(
        t.eval().expect("runs").to_vec::<bool>().expect("bool"),
        vec![true, false, true]
    );
    let h = ctx
        .from_vec(vec![ndfuse::f16::from_f32(1.5); 2], &[2])
        .expect("2");
    assert_eq!(h.dtype().expect("ok"), DType::F16);
}

#[test]
fn seeded_random_is_reproducible_and_in_range() {
    let ctx = Context::builder().dtype(DType::F64).build().expect("float");
    let u1 = ctx
        .rand_uniform(&[1000], -2.0, 3.0, 42)
        .eval()
        .expect("runs")
        .to_vec::<f64>()
        .expect("f64");
    let u2 = ctx
        .rand_uniform(&[1000], -2.0, 3.0, 42)
        .eval()
        .expect("runs")
        .to_vec::<f64>()
        .expect("f64");
    let u3 = ctx
        .rand_uniform(&[1000], -2.0, 3.0, 43)
        .eval()
        .expect("runs")
        .to_vec::<f64>()
        .expect("f64");
    assert_eq!(u1, u2);
    assert_ne!(u1, u3);
    assert!(u1.iter().all(|&x| (-2.0..3.0).contains(&x)));
    let n = ctx
        .rand_normal(&[20000], 1.0, 2.0, 7)
        .eval()
        .expect("runs")
        .to_vec::<f64>()
        .expect("f64");
    let mean = n.iter().sum::<f64>() / n.len() as f64;
    let var = n.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n.len() as f64;
    assert!(
        (mean - 1.0).abs() < 0.05 && (var - 4.0).abs() < 0.15,
        "mean {mean} var {var}"
    );
}

#[test]
fn the_context_dtype_applies_to_constructors_and_literals_stay_weak() {
    let ctx = Context::new();
    assert_eq!(ctx.default_dtype(), DType::F32);
    ctx.set_default_dtype(DType::F16).expect("float");
    let h = ctx.ones(&[2]);
    assert_eq!(h.dtype().expect("ok"), DType::F16);
    assert_eq!(
        (&h * 3.5).dtype().expect("ok"),
        DType::F16,
        "a literal does not widen"
    );
    ctx.set_default_dtype(DType::BF16).expect("float");
    assert_eq!(
        ctx.rand_normal(&[2], 0.0, 1.0, 1).dtype().expect("ok"),
        DType::BF16
    );
    // Tensors made before the change keep their dtype.
    assert_eq!(h.dtype().expect("ok"), DType::F16);
}

#[test]
fn operators_on_owned_borrowed_and_literal_operands() {
    let ctx = Context::new();
    let a = ctx.from_vec(vec![1.0f32, 2.0, 4.0], &[3]).expect("3");
    let y = 1.0 - &a / 2.0 * a.clone() + (-&a) * 2 - 3.0 / a.clone();
    let got = y.eval().expect("runs").to_vec::<f32>().expect("f32");
    let want: Vec<f32> = [1.0f32, 2.0, 4.0]
        .iter()
        .map(|&x| 1.0 - x / 2.0 * x + (-x) * 2.0 - 3.0 / x)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn every_backend_gives_the_same_answer() {
    let ctx = Context::new();
    let a = ctx.rand_normal(&[16, 16], 0.0, 1.0, 3);
    let y = (a.softmax(-1) * 2.0 + a.layernorm(0, 1e-5)).sum(1);
    let mut results = Vec::new();
    for b in [BackendKind::Interp, BackendKind::Cpu, BackendKind::Auto] {
        ctx.set_backend(b);
        results.push(y.eval().expect("runs"));
    }
    // The fused kernels compute mean and variance in f32 steps that round between them,
    // where the reference computes each node in f64 and rounds once; the row sums of the
    // layernorm term cancel to about 0, so the error is absolute at the terms' scale (1).
    ndfuse_tests::assert_close(&results[1], &results[0], 1e-5, 1e-5, "cpu vs reference");
    assert_eq!(
        results[1], results[2],
        "auto is the cpu backend: bit-identical"
    );
    ctx.set_backend(BackendKind::Cuda);
    let err = y.eval().expect_err("no CUDA backend in this version");
    assert!(err.to_string().contains("cuda"), "{err}");
}

#[test]
fn deep_graphs_build_evaluate_and_drop_without_recursion() {
    let ctx = Context::new();
    let mut t = ctx.ones(&[4]);
    // Deep enough that a recursive build or drop would overflow a 2 MiB test stack.
    for _ in 0..50_000 {
        t = &t + 1.0;
    }
    assert_eq!(
        t.eval().expect("runs").to_vec::<f32>().expect("f32"),
        vec![50_001.0; 4]
    );
    drop(t);
}
