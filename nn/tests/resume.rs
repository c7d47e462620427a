//! Save, load, resume: 20 steps, a checkpoint, a fresh context and trainer loading it,
//! 20 more steps equal 40 straight steps bit for bit; bad checkpoints are errors that
//! name the file (and the tensor, and both shapes) and leave the parameters untouched.

use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Layer, Loss, Optimizer, Sequential, Trainer};
use std::path::PathBuf;

fn trainer(ctx: &Context, init_seed: u64, widths: &[usize]) -> Trainer<Sequential> {
    let model = Sequential::mlp(ctx, widths, Activation::Gelu, init_seed).unwrap();
    let opt = Optimizer::adamw(&model.parameters(), 3e-3, 0.01);
    Trainer::new(model, opt, Loss::CrossEntropy)
        .unwrap()
        .seed(99)
}

/// The batch of step `t`: a different one every step.
fn batch(t: u64) -> (Array, Array) {
    let ctx = Context::new();
    let x = ctx
        .rand_normal(&[16, 8], 0.0, 1.0, 1000 + t)
        .eval()
        .unwrap();
    let y: Vec<i64> = (0..16).map(|i| ((i as u64 * 7 + t) % 3) as i64).collect();
    (x, Array::from_vec(y, &[16]).unwrap())
}

fn steps(t: &mut Trainer<Sequential>, range: std::ops::Range<u64>) -> Vec<f64> {
    range
        .map(|s| {
            let (x, y) = batch(s);
            t.step(&x, &y).unwrap()
        })
        .collect()
}

fn bits(t: &Trainer<Sequential>) -> Vec<Vec<u32>> {
    t.model()
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
        .collect()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn twenty_steps_saved_loaded_and_twenty_more_equal_forty_straight() {
    let straight_ctx = Context::new();
    let mut straight = trainer(&straight_ctx, 1, &[8, 16, 3]);
    let all = steps(&mut straight, 0..40);

    let path = temp("resume.safetensors");
    let first_ctx = Context::new();
    let mut first = trainer(&first_ctx, 1, &[8, 16, 3]);
    let head = steps(&mut first, 0..20);
    first.save(&path).unwrap();
    drop(first);

    // A fresh context and a model initialised differently: everything must come from
    // the file (parameters, Adam's moments, the step count for the bias corrections).
    let ctx = Context::new();
    let mut resumed = trainer(&ctx, 12345, &[8, 16, 3]);
    resumed.load(&path).unwrap();
    assert_eq!(resumed.optimizer().steps(), 20);
    let tail = steps(&mut resumed, 20..40);

    let losses: Vec<u64> = head.iter().chain(&tail).map(|l| l.to_bits()).collect();
    assert_eq!(losses, all.iter().map(|l| l.to_bits()).collect::<Vec<_>>());
    assert_eq!(bits(&resumed), bits(&straight));
}

#[test]
fn bad_checkpoints_are_errors_that_change_nothing() {
    let ctx = Context::new();
    let mut t = trainer(&ctx, 1, &[8, 16, 3]);
    steps(&mut t, 0..3);
    let path = temp("good.safetensors");
    t.save(&path).unwrap();
    let before = bits(&t);

    // Truncated: the error names the file.
    let bytes = std::fs::read(&path).unwrap();
    let cut = temp("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = t.load(&cut).unwrap_err().to_string();
    assert!(err.contains("cut.safetensors"), "{err}");
    assert_eq!(bits(&t), before);

    // Another model's shapes: the error names the tensor and both shapes.
    let other_ctx = Context::new();
    let mut wide = trainer(&other_ctx, 1, &[8, 32, 3]);
    let wide_before = bits(&wide);
    let err = wide.load(&path).unwrap_err().to_string();
    assert!(
        err.contains("fc0.weight") && err.contains("[8, 16]") && err.contains("[8, 32]"),
        "{err}"
    );
    assert_eq!(bits(&wide), wide_before);
    assert_eq!(wide.optimizer().steps(), 0);

    // Another optimiser.
    let model = Sequential::mlp(&other_ctx, &[8, 16, 3], Activation::Gelu, 1).unwrap();
    let opt = Optimizer::sgd(&model.parameters(), 0.1);
    let mut sgd = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let err = sgd.load(&path).unwrap_err().to_string();
    assert!(err.contains("adamw") && err.contains("sgd"), "{err}");

    // A file that is not there.
    let err = t
        .load(&temp("missing.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.safetensors"), "{err}");
    assert_eq!(bits(&t), before);
}
