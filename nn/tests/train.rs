//! Training end to end on small synthetic data: the CPU backend and the reference
//! interpreter give the same loss curve, a step compiles once and fuses, and a bad
//! pairing of model and optimiser is an error.

use ndfuse::{Array, BackendKind, Context, DType};
use ndfuse_nn::{Activation, Init, Layer, LayerNorm, Linear, Loss, Optimizer, Sequential, Trainer};

/// A seeded classification problem: `n` samples of `d` features, `classes` labels
/// given by a fixed random linear rule (learnable).
fn problem(n: usize, d: usize, classes: usize, seed: u64) -> (Array, Array) {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[n, d], 0.0, 1.0, seed).eval().unwrap();
    let w = ctx.rand_normal(&[d, classes], 0.0, 1.0, seed + 1);
    let y = ctx
        .tensor(x.clone())
        .matmul(&w)
        .argmax(-1)
        .cast(DType::I64)
        .eval()
        .unwrap();
    (x, y)
}

fn trainer(ctx: &Context) -> Trainer<Sequential> {
    let model = Sequential::new()
        .push(Linear::new(ctx, "fc0", 16, 32, Init::HeUniform, 3).unwrap())
        .push(LayerNorm::new(ctx, "ln0", 32, 1e-5).unwrap())
        .push(Activation::Gelu)
        .push(Linear::new(ctx, "fc1", 32, 4, Init::GlorotUniform, 4).unwrap());
    let opt = Optimizer::adam(&model.parameters(), 1e-2);
    Trainer::new(model, opt, Loss::CrossEntropy).unwrap()
}

fn curve(backend: BackendKind, steps: usize) -> Vec<f64> {
    let ctx = Context::builder().backend(backend).build().unwrap();
    let mut t = trainer(&ctx);
    let (x, y) = problem(64, 16, 4, 11);
    (0..steps).map(|_| t.step(&x, &y).unwrap()).collect()
}

#[test]
fn cpu_and_interpreter_give_the_same_loss_curve_for_50_steps() {
    let cpu = curve(BackendKind::Cpu, 50);
    let interp = curve(BackendKind::Interp, 50);
    for (i, (a, b)) in cpu.iter().zip(&interp).enumerate() {
        // f32 tolerance: the two differ only in rounding (the interpreter computes each
        // op in f64 and rounds once; the JIT rounds fused chains and sums in its own order).
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "step {i}: cpu {a} vs interp {b}\n{cpu:?}\n{interp:?}"
        );
    }
    assert!(
        cpu[49] < 0.5 * cpu[0],
        "it learns: {} -> {}",
        cpu[0],
        cpu[49]
    );
}

#[test]
fn a_step_compiles_once_and_fuses() {
    let ctx = Context::new();
    let mut t = trainer(&ctx);
    let (x, y) = problem(64, 16, 4, 12);
    let (x, y) = (ctx.tensor(x), ctx.tensor(y));
    let (_, first) = t.step_report(&x, &y).unwrap();
    let (_, second) = t.step_report(&x, &y).unwrap();
    assert!(
        second.evaluation().compile_cached,
        "the second step recompiled"
    );
    // Forward (2 products, layernorm, gelu), backward (4 products, layernorm's backward,
    // softmax-cross-entropy's) and six Adam updates: the updates of the biases and the
    // layernorm parameters fuse into the kernels that reduce their gradients.
    let k = first.kernel_count();
    assert!(k <= 20, "{k} kernels:\n{}", first.kernels_text());
}

#[test]
fn the_optimiser_must_update_the_models_parameters() {
    let ctx = Context::new();
    let a = Sequential::mlp(&ctx, &[4, 3], Activation::Relu, 1).unwrap();
    let b = Sequential::mlp(&ctx, &[4, 3], Activation::Relu, 1).unwrap();
    let err = Trainer::new(a, Optimizer::sgd(&b.parameters(), 0.1), Loss::Mse).unwrap_err();
    assert!(err.to_string().contains("model's parameters"), "{err}");
}

#[test]
fn evaluation_scores_every_sample_in_slices() {
    let ctx = Context::new();
    let t = trainer(&ctx);
    let (x, y) = problem(50, 16, 4, 13);
    let whole = t.evaluate(&x, &y, 0).unwrap();
    let sliced = t.evaluate(&x, &y, 16).unwrap();
    assert_eq!(whole.samples, 50);
    assert!(
        (whole.loss - sliced.loss).abs() < 1e-5,
        "{whole:?} vs {sliced:?}"
    );
    assert_eq!(whole.accuracy, sliced.accuracy);
}

#[test]
fn reusing_the_compiled_step_gives_the_bits_of_building_it_every_step() {
    let run = |reuse: bool| {
        let ctx = Context::new();
        let model = Sequential::new()
            .push(Linear::new(&ctx, "fc0", 16, 32, Init::HeUniform, 3).unwrap())
            .push(Activation::Relu)
            .push(ndfuse_nn::Dropout::new(0.2))
            .push(LayerNorm::new(&ctx, "ln0", 32, 1e-5).unwrap())
            .push(Linear::new(&ctx, "fc1", 32, 4, Init::GlorotUniform, 4).unwrap());
        let schedule = ndfuse_nn::Schedule::Cosine {
            base: 1e-2,
            floor: 1e-4,
            steps: 10,
        }
        .with_warmup(2);
        let opt = Optimizer::adamw(&model.parameters(), 1e-2, 0.05).schedule(schedule);
        let mut t = Trainer::new(model, opt, Loss::CrossEntropy)
            .unwrap()
            .seed(5)
            .reuse_steps(reuse);
        let mut losses = Vec::new();
        for s in 0..10 {
            let (x, y) = problem(64, 16, 4, 20 + s);
            losses.push(t.step(&x, &y).unwrap().to_bits());
        }
        let params: Vec<Vec<u32>> = t
            .model()
            .parameters()
            .iter()
            .map(|p| {
                p.array()
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            })
            .collect();
        (losses, params)
    };
    assert_eq!(run(true), run(false));
}
