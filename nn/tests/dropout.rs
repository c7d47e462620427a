//! Dropout in models: the identity when evaluating; in training, a fresh mask each step
//! from the step's seed, different for each Dropout layer, the same bits on the CPU
//! backend and the interpreter, and fused (only the layer's key costs a one-element
//! kernel).

use ndfuse::{Array, BackendKind, Context, DType};
use ndfuse_nn::{
    Activation, Dropout, Init, Layer, Linear, Loss, Mode, Optimizer, Sequential, Trainer,
};

fn model(ctx: &Context, dropout: bool) -> Sequential {
    let mut m = Sequential::new().push(Linear::new(ctx, "fc0", 8, 32, Init::HeUniform, 1).unwrap());
    m = m.push(Activation::Relu);
    if dropout {
        m = m.push(Dropout::new(0.25));
    }
    m.push(Linear::new(ctx, "fc1", 32, 3, Init::GlorotUniform, 2).unwrap())
}

#[test]
fn masks_follow_the_step_seed_and_differ_between_layers() {
    let ctx = Context::new();
    let x = ctx.ones(&[1000, 64]);
    let d = Dropout::new(0.25);
    assert_eq!(
        d.forward(&x, &Mode::eval())
            .eval()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0; 64000]
    );
    let a = d
        .forward(&x, &Mode::train(ctx.key(7)))
        .eval()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / a.len() as f64;
    assert!((kept - 0.75).abs() < 0.01, "kept {kept}");
    assert!(
        a.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75),
        "kept values are x / (1 - p)"
    );
    let again = d
        .forward(&x, &Mode::train(ctx.key(7)))
        .eval()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, again, "the same seed, the same mask");
    let other = d
        .forward(&x, &Mode::train(ctx.key(8)))
        .eval()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(a, other, "another step, another mask");
    // Two layers of one model: children of the mode, each its own seed.
    let two = Sequential::new()
        .push(Dropout::new(0.5))
        .push(Dropout::new(0.5));
    let y = two
        .forward(&x, &Mode::train(ctx.key(7)))
        .eval()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / y.len() as f64;
    assert!(
        (kept - 0.25).abs() < 0.01,
        "independent masks keep a quarter: {kept}"
    );
}

fn curve(backend: BackendKind) -> Vec<f64> {
    let ctx = Context::builder().backend(backend).build().unwrap();
    let m = model(&ctx, true);
    let opt = Optimizer::adam(&m.parameters(), 1e-2);
    let mut t = Trainer::new(m, opt, Loss::CrossEntropy).unwrap().seed(3);
    let data = Context::new();
    let x = data.rand_normal(&[32, 8], 0.0, 1.0, 4).eval().unwrap();
    let y = data
        .tensor(x.clone())
        .sum(1)
        .gt(0.0)
        .cast(DType::I64)
        .eval()
        .unwrap();
    (0..20).map(|_| t.step(&x, &y).unwrap()).collect()
}

#[test]
fn training_with_dropout_gives_the_same_curve_on_cpu_and_interpreter() {
    let cpu = curve(BackendKind::Cpu);
    let interp = curve(BackendKind::Interp);
    for (i, (a, b)) in cpu.iter().zip(&interp).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "step {i}: cpu {a} vs interp {b}"
        );
    }
    // The masks change every step: the curve is not the deterministic one.
    let ctx = Context::new();
    let m = model(&ctx, false);
    let opt = Optimizer::adam(&m.parameters(), 1e-2);
    let mut t = Trainer::new(m, opt, Loss::CrossEntropy).unwrap();
    let x = ctx.rand_normal(&[32, 8], 0.0, 1.0, 4).eval().unwrap();
    let y = ctx
        .tensor(x.clone())
        .sum(1)
        .gt(0.0)
        .cast(DType::I64)
        .eval()
        .unwrap();
    assert_ne!(
        cpu[1],
        t.step(&x, &y).map(|_| t.step(&x, &y).unwrap()).unwrap()
    );
}

#[test]
fn dropout_adds_only_its_keys_scalar_kernel_to_a_step() {
    let counts: Vec<usize> = [false, true]
        .into_iter()
        .map(|d| {
            let ctx = Context::new();
            let m = model(&ctx, d);
            let opt = Optimizer::adam(&m.parameters(), 1e-2);
            let mut t = Trainer::new(m, opt, Loss::CrossEntropy).unwrap();
            let x = ctx.tensor(ctx.rand_normal(&[32, 8], 0.0, 1.0, 4).eval().unwrap());
            let y = ctx.tensor(
                Array::from_vec((0..32).map(|i| i % 3).collect::<Vec<i64>>(), &[32]).unwrap(),
            );
            t.step_report(&x, &y).unwrap().1.kernel_count()
        })
        .collect();
    // The mask itself fuses into the kernels around it; the layer's key (the step's
    // key plus the layer's offset, one i64) is computed once, by a one-element kernel.
    assert_eq!(counts[0] + 1, counts[1], "without and with dropout");
}
