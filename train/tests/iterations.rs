//! Early stopping every N iterations: `Iterations` presents chunks of N mini-batches as
//! the unit early stopping counts, trains exactly the batches a plain epoch loop would
//! (across epoch boundaries), and scores after each chunk.

use ndfuse::Context;
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::{EarlyStopping, EpochTrainer, Iterations, StopReason, Termination};

fn data(n: usize) -> Dataset {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[n, 6], 0.0, 1.0, 1).eval().unwrap();
    let y = ctx.tensor(x.clone()).sum_keepdims(1).tanh().eval().unwrap();
    Dataset::new(x, y).unwrap()
}

fn trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[6, 8, 1], Activation::Tanh, 3).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 1e-2);
    Trainer::new(model, opt, Loss::Mse).unwrap().seed(4)
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

#[test]
fn chunks_train_the_batches_of_the_epoch_loop_across_epoch_boundaries() {
    // 76 samples in batches of 8: 10 batches an epoch, the last of 4.
    let d = data(76);
    let mut chunks = Iterations::new(trainer(), 7);
    for c in 0..3 {
        chunks.train_epoch(&d, c, 8).unwrap();
    }
    // 21 iterations: epochs 0 and 1 whole, then the first batch of epoch 2.
    let mut plain = trainer();
    for epoch in 0..3 {
        let take = if epoch < 2 { 10 } else { 1 };
        for b in d
            .batches(8, plain.random_seed(), epoch, false)
            .unwrap()
            .take(take)
        {
            plain.step_batch(b.unwrap()).unwrap();
        }
    }
    assert_eq!(chunks.trainer().optimizer().steps(), 21);
    assert_eq!(bits(chunks.trainer()), bits(&plain));
}

#[test]
fn early_stopping_scores_every_n_iterations() {
    let d = data(80);
    let dir = std::env::temp_dir().join(format!("ndfuse-iterations-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let r = EarlyStopping::builder(Iterations::new(trainer(), 5))
        .validation(data(40))
        .batch_size(8)
        .directory(&dir)
        .stop_when(Termination::MaxEpochs(4))
        .fit(&d)
        .unwrap();
    assert_eq!(r.reason, StopReason::MaxEpochs { max: 4 });
    // Four scores, one after every 5 iterations; 20 steps in all.
    assert_eq!(
        r.scores.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(r.trainer().trainer().optimizer().steps(), 20);
    let _ = std::fs::remove_dir_all(&dir);
}
