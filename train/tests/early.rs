//! Early stopping: scripted fake trainers whose stop epoch, best epoch and files are
//! worked out by hand, and a real digits MLP whose best model, loaded back into a fresh
//! trainer, scores exactly what was recorded.

use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Scores, Sequential, Trainer};
use ndfuse_train::{
    EarlyStopping, EarlyStoppingBuilder, EpochReport, EpochTrainer, Error, Result, Score,
    StopReason, Termination, BEST_FILE, LATEST_FILE,
};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// A trainer whose whole state is the number of epochs it has trained; after epoch `e`
/// (from 0) its validation loss is `losses[e]` and its accuracy `accuracies[e]`. Its
/// file holds that count as text, so what was saved is plain to read.
#[derive(Debug, Clone)]
struct Scripted {
    trained: u64,
    losses: Vec<f64>,
    accuracies: Option<Vec<f64>>,
}

impl Scripted {
    fn losses(losses: &[f64]) -> Scripted {
        Scripted {
            trained: 0,
            losses: losses.to_vec(),
            accuracies: None,
        }
    }

    fn with_accuracies(mut self, acc: &[f64]) -> Scripted {
        self.accuracies = Some(acc.to_vec());
        self
    }
}

fn fake_error(why: String) -> Error {
    Error::Argument {
        what: "Scripted",
        why,
    }
}

impl EpochTrainer for Scripted {
    fn train_epoch(&mut self, _data: &Dataset, epoch: u64, batch_size: usize) -> Result<f64> {
        // Early stopping must hand out epochs 0, 1, 2, ... with no gap or repeat.
        if epoch != self.trained || batch_size != 4 {
            return Err(fake_error(format!(
                "asked for epoch {epoch} (batch {batch_size}) after {} epochs",
                self.trained
            )));
        }
        self.trained += 1;
        Ok(100.0 + epoch as f64)
    }

    fn score(&self, data: &Dataset) -> Result<Scores> {
        let e = self
            .trained
            .checked_sub(1)
            .ok_or_else(|| fake_error("scored before any epoch was trained".into()))?
            as usize;
        let loss = *self
            .losses
            .get(e)
            .ok_or_else(|| fake_error(format!("no scripted score for epoch {e}")))?;
        Ok(Scores {
            loss,
            accuracy: self.accuracies.as_ref().map(|a| a[e]),
            samples: data.len(),
        })
    }

    fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let io = |e: std::io::Error| fake_error(format!("{}: {e}", path.display()));
        std::fs::write(&tmp, self.trained.to_string()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        self.trained = saved_epochs(path);
        Ok(())
    }
}

/// The epoch count a [`Scripted`] file holds.
fn saved_epochs(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .parse()
        .unwrap()
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-early-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Four samples: the fake trainer never looks at them.
fn tiny() -> Dataset {
    let x = Array::from_vec(vec![0.0f32; 8], &[4, 2]).unwrap();
    let y = Array::from_vec(vec![0i64, 1, 0, 1], &[4]).unwrap();
    Dataset::new(x, y).unwrap()
}

fn scripted(t: Scripted, dir: &Path) -> EarlyStoppingBuilder<Scripted> {
    EarlyStopping::builder(t)
        .validation(tiny())
        .batch_size(4)
        .directory(dir)
}

#[test]
fn patience_stops_at_the_hand_computed_epoch_and_keeps_best_and_latest() {
    let dir = scratch("patience");
    // Best 3.0 at epoch 2; epochs 3, 4, 5 do not better it: the third of them (epoch 5)
    // exhausts a patience of 3, so 6 epochs are trained and 3.05 is never seen.
    let script = [5.0, 4.0, 3.0, 3.5, 3.2, 3.1, 3.05, 1.0, 0.5];
    let reports = Rc::new(RefCell::new(Vec::new()));
    let seen = reports.clone();
    let mut r = scripted(Scripted::losses(&script), &dir)
        .on_epoch(move |e: &EpochReport| seen.borrow_mut().push(*e))
        .stop_when(Termination::MaxEpochs(100))
        .stop_when(Termination::NoImprovement {
            patience: 3,
            min_delta: 0.0,
        })
        .fit(&tiny())
        .unwrap();
    assert_eq!(
        r.reason,
        StopReason::NoImprovement {
            patience: 3,
            min_delta: 0.0
        }
    );
    assert_eq!(r.epochs_trained, 6);
    assert_eq!(
        r.scores,
        vec![(0, 5.0), (1, 4.0), (2, 3.0), (3, 3.5), (4, 3.2), (5, 3.1)]
    );
    assert_eq!(
        r.train_losses,
        vec![100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    );
    assert_eq!((r.best_epoch, r.best_score), (Some(2), Some(3.0)));
    // The callback saw every epoch, which ones improved, and the stop on the last.
    let reports = reports.borrow();
    let seen: Vec<(u64, Option<f64>, bool)> = reports
        .iter()
        .map(|e| (e.epoch, e.score, e.improved))
        .collect();
    let improved = [true, true, true, false, false, false];
    let expected: Vec<(u64, Option<f64>, bool)> = (0..6)
        .map(|e| (e, Some(script[e as usize]), improved[e as usize]))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(reports[4].best, Some((2, 3.0)));
    assert!(reports[..5].iter().all(|e| e.stop.is_none()));
    assert_eq!(reports[5].stop, Some(r.reason));
    let line = reports[5].to_string();
    assert!(
        line.starts_with("epoch 5: loss 105.0000, score 3.1000, ")
            && line.ends_with("; stopping: no improvement by more than 0 in 3 evaluations"),
        "{line}"
    );
    // The files: the best is the state after epoch 2 (3 epochs), the latest after 6.
    let best = r.best_path.clone().unwrap();
    assert_eq!(best, dir.join(BEST_FILE));
    assert_eq!(r.latest_path, dir.join(LATEST_FILE));
    assert_eq!(saved_epochs(&best), 3);
    assert_eq!(saved_epochs(&r.latest_path), 6);
    // The trainer holds the latest state until the best is loaded back.
    assert_eq!(r.trainer().trained, 6);
    r.load_best().unwrap();
    assert_eq!(r.trainer().trained, 3);
    assert_eq!(r.trainer().score(&tiny()).unwrap().loss, 3.0);
    let mut other = Scripted::losses(&script);
    r.load_best_into(&mut other).unwrap();
    assert_eq!(other.trained, 3);
    assert_eq!(r.into_trainer().trained, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn min_delta_counts_small_gains_as_no_improvement() {
    let dir = scratch("min-delta");
    // Reference 1.0 (epoch 0); 0.95 and 0.92 gain 0.05 and 0.08, not more than 0.1:
    // patience 2 ends after epoch 2. The best model still follows strict gains: 0.92.
    let mut r = scripted(Scripted::losses(&[1.0, 0.95, 0.92, 0.1]), &dir)
        .stop_when(Termination::NoImprovement {
            patience: 2,
            min_delta: 0.1,
        })
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.epochs_trained, 3);
    assert_eq!(r.scores, vec![(0, 1.0), (1, 0.95), (2, 0.92)]);
    assert_eq!((r.best_epoch, r.best_score), (Some(2), Some(0.92)));
    assert!(matches!(
        r.reason,
        StopReason::NoImprovement { patience: 2, .. }
    ));
    r.load_best().unwrap();
    assert_eq!(r.trainer().trained, 3);
    // A gain of more than min_delta resets the count: 1.0, 0.85 (gain 0.15), 0.8, 0.79
    // -> stale after epochs 2 and 3, stop after epoch 3.
    let r = scripted(Scripted::losses(&[1.0, 0.85, 0.8, 0.79, 0.0]), &dir)
        .stop_when(Termination::NoImprovement {
            patience: 2,
            min_delta: 0.1,
        })
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.epochs_trained, 4);
    assert_eq!(r.best_epoch, Some(3));
    // A tie is no improvement: the first epoch to reach the best score keeps it.
    let r = scripted(Scripted::losses(&[2.0, 1.0, 1.0]), &dir)
        .stop_when(Termination::MaxEpochs(3))
        .fit(&tiny())
        .unwrap();
    assert_eq!((r.best_epoch, r.best_score), (Some(1), Some(1.0)));
    assert_eq!(saved_epochs(r.best_path.as_ref().unwrap()), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn target_score_stops_at_the_first_epoch_reaching_it() {
    let dir = scratch("target");
    // Loss: 3.0 reaches the target 3.0 (equal counts) at epoch 2.
    let r = scripted(Scripted::losses(&[5.0, 4.0, 3.0, 2.0, 1.0]), &dir)
        .stop_when(Termination::MaxEpochs(10))
        .stop_when(Termination::TargetScore(3.0))
        .fit(&tiny())
        .unwrap();
    assert_eq!(
        r.reason,
        StopReason::TargetScore {
            target: 3.0,
            score: 3.0
        }
    );
    assert_eq!(r.epochs_trained, 3);
    assert_eq!(r.scores.len(), 3);
    // Accuracy: higher is better; 0.95 is the first at or above 0.9 (epoch 2).
    let t = Scripted::losses(&[9.0; 5]).with_accuracies(&[0.5, 0.8, 0.95, 0.97, 0.99]);
    let r = scripted(t, &dir)
        .score(Score::Accuracy)
        .stop_when(Termination::TargetScore(0.9))
        .stop_when(Termination::MaxEpochs(10))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.epochs_trained, 3);
    assert_eq!(
        r.reason,
        StopReason::TargetScore {
            target: 0.9,
            score: 0.95
        }
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn conditions_are_checked_in_the_order_given() {
    let dir = scratch("order");
    // After epoch 2 both MaxEpochs(3) and TargetScore(3.0) hold: the first listed wins.
    let script = [5.0, 4.0, 3.0, 2.0];
    let r = scripted(Scripted::losses(&script), &dir)
        .stop_when(Termination::MaxEpochs(3))
        .stop_when(Termination::TargetScore(3.0))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.reason, StopReason::MaxEpochs { max: 3 });
    let r = scripted(Scripted::losses(&script), &dir)
        .stop_when(Termination::TargetScore(3.0))
        .stop_when(Termination::MaxEpochs(3))
        .fit(&tiny())
        .unwrap();
    assert!(matches!(r.reason, StopReason::TargetScore { .. }));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_non_finite_score_stops_at_once_and_keeps_the_previous_best() {
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let dir = scratch("non-finite");
        let mut r = scripted(Scripted::losses(&[5.0, 4.0, bad, 3.0, 2.0]), &dir)
            .stop_when(Termination::MaxEpochs(10))
            .fit(&tiny())
            .unwrap();
        match r.reason {
            StopReason::NonFiniteScore { score } => {
                assert!(score.is_nan() == bad.is_nan() && (bad.is_nan() || score == bad))
            }
            other => panic!("{bad}: stopped by {other:?}"),
        }
        assert_eq!(r.epochs_trained, 3, "{bad}");
        assert_eq!(r.scores.len(), 3);
        assert_eq!(r.scores[1], (1, 4.0));
        assert_eq!(r.scores[2].0, 2);
        assert_eq!((r.best_epoch, r.best_score), (Some(1), Some(4.0)), "{bad}");
        assert_eq!(saved_epochs(r.best_path.as_ref().unwrap()), 2);
        assert_eq!(saved_epochs(&r.latest_path), 3);
        r.load_best().unwrap();
        assert_eq!(r.trainer().trained, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn with_non_finite_stopping_off_a_nan_is_recorded_and_never_best() {
    let dir = scratch("non-finite-off");
    let r = scripted(Scripted::losses(&[5.0, f64::NAN, 4.5, 6.0]), &dir)
        .stop_on_non_finite(false)
        .stop_when(Termination::MaxEpochs(4))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.reason, StopReason::MaxEpochs { max: 4 });
    assert_eq!(r.scores.len(), 4);
    assert!(r.scores[1].1.is_nan());
    assert_eq!((r.best_epoch, r.best_score), (Some(2), Some(4.5)));
    assert_eq!(saved_epochs(r.best_path.as_ref().unwrap()), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn max_time_zero_stops_after_the_first_epoch() {
    let dir = scratch("max-time");
    let r = scripted(Scripted::losses(&[5.0, 4.0, 3.0]), &dir)
        .stop_when(Termination::MaxTime(Duration::ZERO))
        .fit(&tiny())
        .unwrap();
    assert!(matches!(
        r.reason,
        StopReason::MaxTime { limit, .. } if limit == Duration::ZERO
    ));
    assert_eq!(r.epochs_trained, 1);
    assert_eq!(r.scores, vec![(0, 5.0)]);
    assert_eq!(r.train_losses.len(), 1);
    // A long limit does not stop anything: MaxEpochs does.
    let r = scripted(Scripted::losses(&[5.0, 4.0, 3.0]), &dir)
        .stop_when(Termination::MaxTime(Duration::from_secs(3600)))
        .stop_when(Termination::MaxEpochs(3))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.reason, StopReason::MaxEpochs { max: 3 });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn accuracy_mode_keeps_the_highest_score_and_loss_mode_the_lowest() {
    let dir = scratch("accuracy");
    let losses = [1.0, 0.8, 0.6, 0.9];
    let acc = [0.5, 0.9, 0.7, 0.8];
    let t = Scripted::losses(&losses).with_accuracies(&acc);
    let r = scripted(t.clone(), &dir)
        .score(Score::Accuracy)
        .stop_when(Termination::MaxEpochs(4))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.scores, vec![(0, 0.5), (1, 0.9), (2, 0.7), (3, 0.8)]);
    assert_eq!((r.best_epoch, r.best_score), (Some(1), Some(0.9)));
    assert_eq!(saved_epochs(r.best_path.as_ref().unwrap()), 2);
    let r = scripted(t, &dir)
        .score(Score::Loss)
        .stop_when(Termination::MaxEpochs(4))
        .fit(&tiny())
        .unwrap();
    assert_eq!((r.best_epoch, r.best_score), (Some(2), Some(0.6)));
    assert_eq!(saved_epochs(r.best_path.as_ref().unwrap()), 3);
    // Patience in accuracy mode: 0.9 at epoch 1 is not bettered by 0.7 and 0.8.
    let t = Scripted::losses(&losses).with_accuracies(&acc);
    let r = scripted(t, &dir)
        .score(Score::Accuracy)
        .stop_when(Termination::NoImprovement {
            patience: 2,
            min_delta: 0.0,
        })
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.epochs_trained, 4);
    assert_eq!(r.best_epoch, Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn evaluate_every_two_scores_epochs_1_3_5_counted_from_0() {
    let dir = scratch("every");
    let script = [9.0, 5.0, 9.0, 4.0, 9.0, 6.0, 9.0, 7.0, 9.0, 1.0];
    let r = scripted(Scripted::losses(&script), &dir)
        .evaluate_every(2)
        .stop_when(Termination::MaxEpochs(6))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.scores, vec![(1, 5.0), (3, 4.0), (5, 6.0)]);
    assert_eq!(r.epochs_trained, 6);
    assert_eq!(r.train_losses.len(), 6);
    assert_eq!((r.best_epoch, r.best_score), (Some(3), Some(4.0)));
    assert_eq!(saved_epochs(r.best_path.as_ref().unwrap()), 4);
    // Patience counts evaluations: 4.0 (epoch 3), then 6.0 (5) and 7.0 (7) -> stop
    // after epoch 7, never scoring the 1.0 of epoch 9.
    let r = scripted(Scripted::losses(&script), &dir)
        .evaluate_every(2)
        .stop_when(Termination::NoImprovement {
            patience: 2,
            min_delta: 0.0,
        })
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.epochs_trained, 8);
    assert_eq!(r.scores, vec![(1, 5.0), (3, 4.0), (5, 6.0), (7, 7.0)]);
    // MaxEpochs on an unscored epoch: no extra evaluation, the latest file is epoch 4's.
    let r = scripted(Scripted::losses(&script), &dir)
        .evaluate_every(2)
        .stop_when(Termination::MaxEpochs(5))
        .fit(&tiny())
        .unwrap();
    assert_eq!(r.scores, vec![(1, 5.0), (3, 4.0)]);
    assert_eq!(saved_epochs(&r.latest_path), 5);
    // Nothing scored at all: no best file, and load_best says so.
    let mut r = scripted(Scripted::losses(&script), &dir)
        .evaluate_every(2)
        .stop_when(Termination::MaxEpochs(1))
        .fit(&tiny())
        .unwrap();
    assert!(r.scores.is_empty());
    assert_eq!(
        (r.best_epoch, r.best_score, r.best_path.clone()),
        (None, None, None)
    );
    assert!(
        !dir.join(BEST_FILE).exists(),
        "an earlier run's best file is removed"
    );
    let e = r.load_best().unwrap_err().to_string();
    assert!(e.contains("no best model"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_settings_are_errors_with_clear_messages() {
    let dir = scratch("settings");
    let t = || Scripted::losses(&[1.0]);
    let message = |b: EarlyStoppingBuilder<Scripted>| b.build().unwrap_err().to_string();
    let e = message(
        EarlyStopping::builder(t())
            .directory(&dir)
            .stop_when(Termination::MaxEpochs(3)),
    );
    assert!(e.contains("no validation set"), "{e}");
    let e = message(scripted(t(), &dir));
    assert!(e.contains("no termination condition"), "{e}");
    let e = message(scripted(t(), &dir).stop_when(Termination::NonFiniteScore));
    assert!(e.contains("no termination condition"), "{e}");
    let e = message(
        EarlyStopping::builder(t())
            .validation(tiny())
            .stop_when(Termination::MaxEpochs(3)),
    );
    assert!(e.contains("no directory"), "{e}");
    let e = message(scripted(t(), &dir).stop_when(Termination::MaxEpochs(0)));
    assert!(e.contains("MaxEpochs(0)"), "{e}");
    let e = message(scripted(t(), &dir).stop_when(Termination::NoImprovement {
        patience: 0,
        min_delta: 0.0,
    }));
    assert!(e.contains("patience 0"), "{e}");
    let e = message(scripted(t(), &dir).stop_when(Termination::NoImprovement {
        patience: 1,
        min_delta: -1.0,
    }));
    assert!(e.contains("min_delta -1"), "{e}");
    let e = message(
        scripted(t(), &dir)
            .evaluate_every(0)
            .stop_when(Termination::MaxEpochs(1)),
    );
    assert!(e.contains("evaluate_every is 0"), "{e}");
    // The default NonFiniteScore comes first; listing it again does not repeat it.
    let es = scripted(t(), &dir)
        .stop_when(Termination::MaxEpochs(2))
        .stop_when(Termination::NonFiniteScore)
        .build()
        .unwrap();
    assert_eq!(
        es.conditions(),
        &[Termination::MaxEpochs(2), Termination::NonFiniteScore]
    );
    let es = scripted(t(), &dir)
        .stop_when(Termination::MaxEpochs(2))
        .build()
        .unwrap();
    assert_eq!(
        es.conditions(),
        &[Termination::NonFiniteScore, Termination::MaxEpochs(2)]
    );
    // Accuracy from a trainer that reports none is refused when first scored.
    let e = scripted(t(), &dir)
        .score(Score::Accuracy)
        .stop_when(Termination::MaxEpochs(1))
        .fit(&tiny())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no accuracy"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_that_cannot_be_made_is_an_error_naming_it() {
    let base = scratch("unwritable");
    std::fs::create_dir_all(&base).unwrap();
    // A directory below a regular file cannot be made, whoever runs the test.
    let file = base.join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let dir = file.join("runs");
    let e = scripted(Scripted::losses(&[1.0]), &dir)
        .stop_when(Termination::MaxEpochs(1))
        .fit(&tiny())
        .unwrap_err();
    assert!(
        matches!(e, Error::Directory { ref path, .. } if *path == dir),
        "{e:?}"
    );
    assert!(e.to_string().contains(&dir.display().to_string()), "{e}");
    let _ = std::fs::remove_dir_all(&base);
}

/// The digits (features / 16), split 80/20 as in nn/examples/train_digits.rs.
fn digits() -> (Context, Dataset, Dataset) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy")).unwrap();
    let ctx = Context::new();
    let x = (ctx.tensor(raw.features().clone()) / 16.0).eval().unwrap();
    let (train, test) = Dataset::new(x, raw.labels().clone())
        .unwrap()
        .split(0.2, 2026)
        .unwrap();
    (ctx, train, test)
}

fn mlp(ctx: &Context, seed: u64) -> Trainer<Sequential> {
    let model = Sequential::mlp(ctx, &[64, 32, 10], Activation::Relu, seed).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 3e-3);
    Trainer::new(model, opt, Loss::CrossEntropy).unwrap()
}

#[test]
fn a_digits_mlp_for_5_epochs_records_5_scores_and_its_best_reloads_to_the_same_score() {
    let (ctx, train, test) = digits();
    let dir = scratch("digits");
    let r = EarlyStopping::builder(mlp(&ctx, 7))
        .validation(test.clone())
        .batch_size(32)
        .directory(&dir)
        .stop_when(Termination::MaxEpochs(5))
        .fit(&train)
        .unwrap();
    assert_eq!(r.reason, StopReason::MaxEpochs { max: 5 });
    assert_eq!(r.epochs_trained, 5);
    assert_eq!(r.train_losses.len(), 5);
    let epochs: Vec<u64> = r.scores.iter().map(|s| s.0).collect();
    assert_eq!(epochs, vec![0, 1, 2, 3, 4]);
    // It learns: the training loss falls, the validation loss is far below ln 10.
    assert!(
        r.train_losses[4] < r.train_losses[0],
        "{:?}",
        r.train_losses
    );
    let (best_epoch, best) = r
        .scores
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert!(best < 0.5 * 10f64.ln(), "{:?}", r.scores);
    assert_eq!((r.best_epoch, r.best_score), (Some(best_epoch), Some(best)));
    // The trainer holds the latest parameters: it scores the last recorded score.
    let latest = r.trainer().evaluate_dataset(&test, 0).unwrap().loss;
    assert!(
        (latest - r.scores[4].1).abs() <= 1e-12,
        "{latest} vs {:?}",
        r.scores
    );
    // A fresh model of other initial weights, loaded from the best file, scores exactly
    // the recorded best; from the latest file, the last score.
    let mut fresh = mlp(&ctx, 99);
    let before = fresh.evaluate_dataset(&test, 0).unwrap().loss;
    assert!(
        (before - best).abs() > 1e-3,
        "the fresh model already scores {before}"
    );
    r.load_best_into(&mut fresh).unwrap();
    let loaded = fresh.evaluate_dataset(&test, 0).unwrap().loss;
    assert!(
        (loaded - best).abs() <= 1e-12,
        "best {best}, loaded back {loaded}"
    );
    let mut fresh = mlp(&ctx, 98);
    EpochTrainer::load(&mut fresh, &r.latest_path).unwrap();
    let loaded = fresh.evaluate_dataset(&test, 0).unwrap().loss;
    assert!((loaded - r.scores[4].1).abs() <= 1e-12);
    // The held-out accuracy after 5 epochs.
    let acc = r.trainer().score(&test).unwrap().accuracy.unwrap();
    assert!(acc > 0.8, "held-out accuracy {acc}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_digits_mlp_that_overfits_stops_at_the_patience_and_keeps_its_best_epoch() {
    let (ctx, train, test) = digits();
    // 60 training images and a large step: the validation loss bottoms out early, then
    // climbs as the model learns the 60 by heart.
    let small = train.subset(&(0..60).collect::<Vec<_>>()).unwrap();
    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 2e-2);
    let trainer = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let dir = scratch("overfit");
    let patience = 3;
    let mut r = EarlyStopping::builder(trainer)
        .validation(test.clone())
        .batch_size(10)
        .directory(&dir)
        .stop_when(Termination::MaxEpochs(60))
        .stop_when(Termination::NoImprovement {
            patience,
            min_delta: 0.0,
        })
        .fit(&small)
        .unwrap();
    assert_eq!(
        r.reason,
        StopReason::NoImprovement {
            patience,
            min_delta: 0.0
        },
        "{:?}",
        r.scores
    );
    // By hand from the recorded scores: the best is their minimum, and training ended
    // exactly `patience` epochs after it, with every epoch scored.
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
    // The trainer holds the latest (worse) parameters; the best file, loaded back,
    // scores the recorded best.
    let last = r.scores.last().unwrap().1;
    assert!(last > best, "{:?}", r.scores);
    let latest = r.trainer().evaluate_dataset(&test, 0).unwrap().loss;
    assert!((latest - last).abs() <= 1e-12, "{latest} vs {last}");
    r.load_best().unwrap();
    let loaded = r.trainer().evaluate_dataset(&test, 0).unwrap().loss;
    assert!(
        (loaded - best).abs() <= 1e-12,
        "best {best}, loaded back {loaded}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
