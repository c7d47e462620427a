//! The digits MLP learns: 64-128-10, Adam, cross-entropy, on the fixed held-out 20% of
//! the UCI digits (what `cargo run --release --example train_digits` does, fewer epochs).

use ndfuse::Context;
use ndfuse_nn::{Activation, Dataset, FitOptions, Layer, Loss, Optimizer, Sequential, Trainer};
use std::path::Path;

#[test]
fn a_64_128_10_mlp_reaches_96_percent_on_held_out_digits() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy")).unwrap();
    let ctx = Context::new();
    let x = (ctx.tensor(raw.features().clone()) / 16.0).eval().unwrap();
    let (train, test) = Dataset::new(x, raw.labels().clone())
        .unwrap()
        .split(0.2, 2026)
        .unwrap();
    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 3e-3);
    let mut t = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let opts = FitOptions {
        epochs: 12,
        batch_size: 32,
        seed: 1,
        progress: false,
        ..FitOptions::default()
    };
    let h = t.fit(&train, Some(&test), &opts).unwrap();
    let acc = h
        .epochs
        .last()
        .unwrap()
        .validation
        .unwrap()
        .accuracy
        .unwrap();
    assert!(acc >= 0.96, "held-out accuracy {acc}");
    // Every epoch is recorded, and the training loss falls.
    assert_eq!(h.epochs.len(), 12);
    assert!(h.epochs[11].train_loss < h.epochs[0].train_loss / 5.0);
    assert_eq!(h.step_losses.len(), 12 * train.len().div_ceil(32));
}
