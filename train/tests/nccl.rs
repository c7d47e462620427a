//! NCCL reductions on a real GPU (feature `nccl`; needs `NDFUSE_REQUIRE_CUDA=1`, a CUDA
//! driver, a GPU and libnccl; otherwise the test says so and passes): one rank's NCCL
//! sum is the identity, and a ParallelWrapper over `NcclRanks` trains the digits.
#![cfg(feature = "nccl")]

use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::{MpiRanks, NcclRanks, ParallelWrapper, Ranks};
use std::path::Path;
use std::sync::Arc;

#[test]
fn one_rank_sums_through_nccl_and_trains() {
    if std::env::var("NDFUSE_REQUIRE_CUDA").as_deref() != Ok("1") {
        eprintln!("skipped: set NDFUSE_REQUIRE_CUDA=1 on a machine with a GPU and libnccl");
        return;
    }
    let ranks = NcclRanks::new(MpiRanks::init().unwrap(), 0).unwrap();
    assert_eq!((ranks.rank(), ranks.size()), (0, 1));
    let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut arrays = vec![Array::from_vec(values.clone(), &[10, 100]).unwrap()];
    ranks.allreduce_sum(&mut arrays).unwrap();
    assert_eq!(arrays[0].to_vec::<f32>().unwrap(), values);

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy")).unwrap();
    let ctx = Context::new();
    let x = (ctx.tensor(raw.features().clone()) / 16.0).eval().unwrap();
    let (train, test) = Dataset::new(x, raw.labels().clone())
        .unwrap()
        .split(0.2, 2026)
        .unwrap();
    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 3e-3);
    let trainer = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let mut pw = ParallelWrapper::builder(trainer)
        .workers(1)
        .batch_size(32)
        .progress(false)
        .ranks(Arc::new(ranks))
        .build()
        .unwrap();
    pw.fit(&train, 12).unwrap();
    let acc = pw
        .trainer()
        .evaluate_dataset(&test, 0)
        .unwrap()
        .accuracy
        .unwrap();
    assert!(acc >= 0.96, "held-out accuracy {acc}");
}
