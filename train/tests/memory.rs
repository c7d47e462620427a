//! Memory stays flat across repeated `fit` calls (DL4J users saw it grow until out of
//! memory): workers are joined and their buffers go back to the host cache. Alone in its
//! own test binary: the host cache is the process's.

mod support;

use ndfuse::Context;
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::ParallelWrapper;

fn data() -> Dataset {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[8 * 30, 5], 0.0, 1.0, 1).eval().unwrap();
    let y = ctx.tensor(x.clone()).sum_keepdims(1).eval().unwrap();
    Dataset::new(x, y).unwrap()
}

fn trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[5, 8, 1], Activation::Tanh, 2).unwrap();
    let opt = Optimizer::sgd(&model.parameters(), 0.05);
    Trainer::new(model, opt, Loss::Mse).unwrap()
}

#[test]
fn repeated_fits_do_not_grow_memory() {
    let mut pw = ParallelWrapper::builder(trainer())
        .workers(2)
        .devices(support::cpus(2, 2))
        .batch_size(8)
        .progress(false)
        .build()
        .unwrap();
    let data = data();
    let ctx = Context::new();
    for _ in 0..3 {
        pw.fit(&data, 1).unwrap();
    }
    let before = ctx.cache_stats();
    for _ in 0..5 {
        pw.fit(&data, 1).unwrap();
    }
    let after = ctx.cache_stats();
    // Buffers come back to the cache and serve the next fit: no new allocation, and
    // the cache holds no more than it did.
    assert_eq!(after.misses, before.misses, "{before:?} -> {after:?}");
    assert!(
        after.bytes_cached <= before.high_water_mark,
        "{before:?} -> {after:?}"
    );
}
