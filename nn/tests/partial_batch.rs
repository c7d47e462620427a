//! Issue 31: a training step on the last, shorter batch of an epoch reuses the code
//! compiled for the full batches wherever a kernel differs from a full batch's only in
//! its leading extent (`kernel_families`): the forward pass, the loss's rows, the
//! activations' gradients. Kernels that reduce over the batch (a bias's gradient, the
//! weights' gradient `x^T @ dy`, the mean loss) still compile for the new batch size.
//!
//! One test in this file: the compile counters are the process's.

use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Layer, Loss, Optimizer, Sequential, Trainer};

fn batch(rows: usize, seed: u64) -> (Array, Array) {
    let x: Vec<f32> = (0..rows * 64)
        .map(|i| ((i as u64 * 2_654_435_761 + seed) % 1000) as f32 / 1000.0)
        .collect();
    let y: Vec<i64> = (0..rows).map(|i| ((i as u64 + seed) % 10) as i64).collect();
    (
        Array::from_vec(x, &[rows, 64]).unwrap(),
        Array::from_vec(y, &[rows]).unwrap(),
    )
}

#[test]
fn the_partial_last_batch_reuses_the_full_batches_code() {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 3e-3);
    let mut t = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let counters = || {
        let s = ctx.compile_cache_stats().kernels;
        (s.misses, s.rebound)
    };
    let (c0, _) = counters();
    for seed in 0..2 {
        let (x, y) = batch(32, seed);
        t.step(&x, &y).unwrap();
    }
    let (c1, r1) = counters();
    let (x, y) = batch(23, 9);
    let loss = t.step(&x, &y).unwrap();
    assert!(loss.is_finite());
    let (c2, r2) = counters();
    let (full, partial, rebound) = (c1 - c0, c2 - c1, r2 - r1);
    println!(
        "full batches of 32: {full} kernels compiled; the partial batch of 23: {partial} \
         compiled, {rebound} rebound to the full batches' code"
    );
    assert!(rebound > 0, "nothing rebound");
    assert!(
        partial < full,
        "{partial} compiles for the partial batch, {full} for the full"
    );
}
