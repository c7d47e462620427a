//! EarlyStoppingParallelTrainer: early stopping over a ParallelWrapper of two CPU
//! workers, on 60 digits with a large step so the validation loss bottoms out and
//! climbs: it stops at the patience, records every epoch's score, and its best file,
//! loaded back into the wrapper's trainer, scores the recorded best.

mod support;

use ndfuse::Context;
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::{
    EarlyStopping, EarlyStoppingParallelTrainer, ParallelWrapper, StopReason, Termination,
};
use std::path::Path;

#[test]
fn early_stopping_over_two_workers_stops_at_the_patience_and_keeps_the_best() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy")).unwrap();
    let ctx = Context::new();
    let x = (ctx.tensor(raw.features().clone()) / 16.0).eval().unwrap();
    let (train, test) = Dataset::new(x, raw.labels().clone())
        .unwrap()
        .split(0.2, 2026)
        .unwrap();
    let small = train.subset(&(0..60).collect::<Vec<_>>()).unwrap();
    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 2e-2);
    let trainer = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let set = support::cpus(2, 2);
    let pw = ParallelWrapper::builder(trainer)
        .workers(2)
        .devices(set)
        .progress(false)
        .build()
        .unwrap();
    let out = std::env::temp_dir().join(format!("ndfuse-early-parallel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let patience = 3;
    let es: EarlyStoppingParallelTrainer<Sequential> = EarlyStopping::builder(pw)
        .validation(test.clone())
        .batch_size(5)
        .directory(&out)
        .stop_when(Termination::MaxEpochs(60))
        .stop_when(Termination::NoImprovement {
            patience,
            min_delta: 0.0,
        })
        .build()
        .unwrap();
    let mut r = es.fit(&small).unwrap();
    assert_eq!(
        r.reason,
        StopReason::NoImprovement {
            patience,
            min_delta: 0.0
        },
        "{:?}",
        r.scores
    );
    let epochs: Vec<u64> = r.scores.iter().map(|s| s.0).collect();
    assert_eq!(epochs, (0..r.epochs_trained).collect::<Vec<_>>());
    let (best_epoch, best) = r
        .scores
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert_eq!((r.best_epoch, r.best_score), (Some(best_epoch), Some(best)));
    assert_eq!(r.epochs_trained, best_epoch + 1 + patience);
    r.load_best().unwrap();
    let loaded = r
        .trainer()
        .trainer()
        .evaluate_dataset(&test, 0)
        .unwrap()
        .loss;
    assert!(
        (loaded - best).abs() <= 1e-12,
        "best {best}, loaded back {loaded}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
