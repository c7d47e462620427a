//! A training step allocates nothing after the first: the new parameters and state
//! are written into buffers the host cache takes back from the previous step's values.
//! Alone in its own test binary: the host cache is the process's, shared by every test
//! thread.

use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Layer, Loss, Optimizer, Sequential, Trainer};

#[test]
fn steps_after_the_first_allocate_nothing() {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[32, 64, 64, 10], Activation::Relu, 5).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 1e-3);
    let mut t = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let x = ctx.rand_normal(&[128, 32], 0.0, 1.0, 1).eval().unwrap();
    let labels: Vec<i64> = (0..128).map(|i| i % 10).collect();
    let y = Array::from_vec(labels, &[128]).unwrap();
    let (x, y) = (ctx.tensor(x), ctx.tensor(y));
    // The first step fills the cache (the first step takes what it needs; the values it replaced go back).
    for _ in 0..1 {
        t.step_tensors(&x, &y).unwrap();
    }
    let before = ctx.cache_stats();
    for _ in 0..10 {
        t.step_tensors(&x, &y).unwrap();
    }
    let after = ctx.cache_stats();
    assert_eq!(
        after.misses, before.misses,
        "steps 2-11 allocated: {before:?} -> {after:?}"
    );
    assert!(
        after.hits > before.hits,
        "the steps took their buffers from the cache"
    );
}
