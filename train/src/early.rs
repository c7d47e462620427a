//! Early stopping: scores every epoch, stops on a condition, keeps the best and latest model on disk.
//!
//! [`EarlyStopping`] drives any [`EpochTrainer`] (one [`ndfuse_nn::Trainer`], or a
//! parallel one) an epoch at a time, as Deeplearning4j's `EarlyStoppingTrainer` and
//! `EarlyStoppingParallelTrainer` do:
//!
//! 1. train epoch `e` (epochs count from 0) and save the state to `latest.safetensors`;
//! 2. when `(e + 1)` is a multiple of `evaluate_every`, score the validation set; a
//!    finite score strictly better than the best so far is saved to `best.safetensors`;
//! 3. check the [`Termination`] conditions in the order they were given; the first that
//!    holds ends training and becomes the [`StopReason`].
//!
//! To score every N iterations instead of every epoch, wrap the trainer in
//! [`crate::Iterations`]: its "epochs" are N mini-batches each.
//!
//! Both files are written by [`EpochTrainer::save`], which is atomic, so a crash never
//! leaves half a file. After [`EarlyStopping::fit`] the trainer holds the *latest*
//! parameters; [`EarlyStoppingResult::load_best`] loads the best ones back.
//!
//! ```no_run
//! use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
//! use ndfuse_train::{EarlyStopping, Score, Termination};
//! let data = Dataset::from_npy("x.npy".as_ref(), "labels.npy".as_ref())?;
//! let (train, validation) = data.split(0.2, 1)?;
//! let ctx = ndfuse::Context::new();
//! let model = Sequential::mlp(&ctx, &[64, 32, 10], Activation::Relu, 7)?;
//! let opt = Optimizer::adam(&model.parameters(), 3e-3);
//! let trainer = Trainer::new(model, opt, Loss::CrossEntropy)?;
//! let mut result = EarlyStopping::builder(trainer)
//!     .validation(validation)
//!     .batch_size(32)
//!     .score(Score::Loss)
//!     .directory("runs/digits")
//!     .stop_when(Termination::MaxEpochs(100))
//!     .stop_when(Termination::NoImprovement { patience: 5, min_delta: 0.0 })
//!     .on_epoch(|e| eprintln!("{e}"))
//!     .fit(&train)?;
//! println!("stopped: {} (best epoch {:?})", result.reason, result.best_epoch);
//! result.load_best()?;
//! # Ok::<(), ndfuse_train::Error>(())
//! ```

use crate::epoch::EpochTrainer;
use crate::error::{Error, Result};
use ndfuse_nn::{Dataset, Scores};
use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The file name of the best model in the early-stopping directory.
pub const BEST_FILE: &str = "best.safetensors";
/// The file name of the latest model in the early-stopping directory.
pub const LATEST_FILE: &str = "latest.safetensors";

/// Which validation score early stopping follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Score {
    /// The mean validation loss; lower is better.
    #[default]
    Loss,
    /// The validation accuracy (cross-entropy trainers only); higher is better.
    Accuracy,
}

impl Score {
    /// The followed number out of a trainer's scores; `Err` for [`Score::Accuracy`]
    /// when the trainer reports no accuracy.
    pub fn of(self, scores: &Scores) -> Result<f64> {
        match self {
            Score::Loss => Ok(scores.loss),
            Score::Accuracy => scores.accuracy.ok_or_else(|| Error::Argument {
                what: "EarlyStopping::fit",
                why: "Score::Accuracy, but the trainer reports no accuracy on the validation \
                      set (only cross-entropy trainers do); use Score::Loss"
                    .into(),
            }),
        }
    }

    /// How much better `new` is than `old` (negative when worse; NaN when either is).
    pub fn gain(self, new: f64, old: f64) -> f64 {
        match self {
            Score::Loss => old - new,
            Score::Accuracy => new - old,
        }
    }

    /// Whether `score` reaches or betters `target`.
    pub fn reaches(self, score: f64, target: f64) -> bool {
        match self {
            Score::Loss => score <= target,
            Score::Accuracy => score >= target,
        }
    }
}

/// A condition that ends training, checked after every epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Termination {
    /// Stop once this many epochs have been trained (at least 1).
    MaxEpochs(u64),
    /// Stop after `patience` evaluations in a row (at least 1) that did not better the
    /// reference score by more than `min_delta` (>= 0). The reference is the first
    /// score, then each score that bettered it by more than `min_delta`; a non-finite
    /// score never does. (The saved best model follows any strict improvement; with
    /// `min_delta` 0 the two agree.)
    NoImprovement {
        /// Evaluations without improvement that end training.
        patience: u64,
        /// The least gain that counts as an improvement.
        min_delta: f64,
    },
    /// Stop at the first evaluation whose score reaches or betters this target.
    TargetScore(f64),
    /// Stop at once on a NaN or infinite score; the best model stays as it was. On by
    /// default, checked first (see [`EarlyStoppingBuilder::stop_on_non_finite`]).
    NonFiniteScore,
    /// Stop once this much time has passed since `fit` began; checked after every
    /// epoch, evaluated or not, so `MaxTime(Duration::ZERO)` trains exactly one epoch.
    MaxTime(Duration),
}

/// Why early stopping ended: the condition that held, with its details.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StopReason {
    /// [`Termination::MaxEpochs`]: `max` epochs were trained.
    MaxEpochs {
        /// The limit.
        max: u64,
    },
    /// [`Termination::NoImprovement`]: `patience` evaluations without improvement.
    NoImprovement {
        /// The condition's patience (evaluations).
        patience: u64,
        /// The condition's least gain.
        min_delta: f64,
    },
    /// [`Termination::TargetScore`]: `score` reached `target`.
    TargetScore {
        /// The target.
        target: f64,
        /// The score that reached it.
        score: f64,
    },
    /// [`Termination::NonFiniteScore`]: the last evaluation gave `score`.
    NonFiniteScore {
        /// The NaN or infinite score.
        score: f64,
    },
    /// [`Termination::MaxTime`]: `elapsed` passed `limit`.
    MaxTime {
        /// The limit.
        limit: Duration,
        /// The time since `fit` began, when it was checked.
        elapsed: Duration,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::MaxEpochs { max } => write!(f, "trained the maximum of {max} epochs"),
            StopReason::NoImprovement {
                patience,
                min_delta,
            } => write!(
                f,
                "no improvement by more than {min_delta} in {patience} evaluations"
            ),
            StopReason::TargetScore { target, score } => {
                write!(f, "score {score} reached the target {target}")
            }
            StopReason::NonFiniteScore { score } => write!(f, "the score is {score}"),
            StopReason::MaxTime { limit, elapsed } => write!(
                f,
                "{:.3} s passed the limit of {:.3} s",
                elapsed.as_secs_f64(),
                limit.as_secs_f64()
            ),
        }
    }
}

/// What one epoch of early stopping did: what [`EarlyStoppingBuilder::on_epoch`] is
/// handed after every epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochReport {
    /// The epoch, from 0.
    pub epoch: u64,
    /// Its mean training loss.
    pub train_loss: f64,
    /// Its validation score, when it was evaluated.
    pub score: Option<f64>,
    /// Whether that score became the best (and was saved).
    pub improved: bool,
    /// The best so far: its epoch and score.
    pub best: Option<(u64, f64)>,
    /// Time since `fit` began.
    pub elapsed: Duration,
    /// Why training stops here, when it does.
    pub stop: Option<StopReason>,
}

impl fmt::Display for EpochReport {
    /// `epoch 3: loss 0.1234, score 0.2345 (best), 1.20 s`, then `; stopping: <reason>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {}: loss {:.4}", self.epoch, self.train_loss)?;
        if let Some(s) = self.score {
            write!(
                f,
                ", score {s:.4}{}",
                if self.improved { " (best)" } else { "" }
            )?;
        }
        write!(f, ", {:.2} s", self.elapsed.as_secs_f64())?;
        match &self.stop {
            Some(reason) => write!(f, "; stopping: {reason}"),
            None => Ok(()),
        }
    }
}

/// The callback of [`EarlyStoppingBuilder::on_epoch`] (a box has no `Debug`).
struct OnEpoch(Box<dyn FnMut(&EpochReport)>);

impl fmt::Debug for OnEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnEpoch(..)")
    }
}

/// Sets up an [`EarlyStopping`]; see [`EarlyStopping::builder`].
#[derive(Debug)]
pub struct EarlyStoppingBuilder<T> {
    trainer: T,
    validation: Option<Dataset>,
    batch_size: usize,
    evaluate_every: u64,
    score: Score,
    directory: Option<PathBuf>,
    conditions: Vec<Termination>,
    stop_on_non_finite: bool,
    on_epoch: Option<OnEpoch>,
}

impl<T: EpochTrainer> EarlyStoppingBuilder<T> {
    /// The data set scored after each evaluated epoch (required).
    pub fn validation(mut self, data: Dataset) -> Self {
        self.validation = Some(data);
        self
    }

    /// Training samples per step (default 32).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Score the validation set after every `n`-th epoch (default 1): after epochs
    /// `n - 1`, `2n - 1`, ... counted from 0, so `evaluate_every(2)` scores epochs
    /// 1, 3, 5, .... The last epoch is scored only when it falls on this schedule.
    pub fn evaluate_every(mut self, n: u64) -> Self {
        self.evaluate_every = n;
        self
    }

    /// The score followed (default [`Score::Loss`]).
    pub fn score(mut self, score: Score) -> Self {
        self.score = score;
        self
    }

    /// The directory that holds `best.safetensors` and `latest.safetensors`
    /// (required; made when missing; those two files from an earlier run are removed
    /// when `fit` begins).
    pub fn directory(mut self, path: impl Into<PathBuf>) -> Self {
        self.directory = Some(path.into());
        self
    }

    /// Adds a termination condition; conditions are checked in the order added.
    pub fn stop_when(mut self, condition: Termination) -> Self {
        self.conditions.push(condition);
        self
    }

    /// Whether a NaN or infinite score stops training at once (default true; the
    /// condition is then checked before the others). When false, such a score is
    /// recorded, never becomes the best, and counts as no improvement.
    pub fn stop_on_non_finite(mut self, on: bool) -> Self {
        self.stop_on_non_finite = on;
        self
    }

    /// Calls `f` after every epoch, once its conditions are checked (to print progress,
    /// say: an [`EpochReport`] displays as one line).
    pub fn on_epoch(mut self, f: impl FnMut(&EpochReport) + 'static) -> Self {
        self.on_epoch = Some(OnEpoch(Box::new(f)));
        self
    }

    /// Checks the settings. `Err` without a validation set (or with an empty one),
    /// without a directory, without a condition that can end training (anything but
    /// `NonFiniteScore`), for a zero batch size, evaluation interval, `MaxEpochs` or
    /// patience, a negative or NaN `min_delta`, or a NaN target.
    pub fn build(self) -> Result<EarlyStopping<T>> {
        let refuse = |why: String| {
            Err(Error::Argument {
                what: "EarlyStopping::build",
                why,
            })
        };
        let Some(validation) = self.validation else {
            return refuse(
                "no validation set: call .validation(dataset); early stopping scores it".into(),
            );
        };
        if validation.is_empty() {
            return refuse("the validation set has no samples".into());
        }
        let Some(directory) = self.directory else {
            return refuse(
                "no directory: call .directory(path) for best.safetensors and latest.safetensors"
                    .into(),
            );
        };
        if self.batch_size == 0 {
            return refuse("batch_size is 0".into());
        }
        if self.evaluate_every == 0 {
            return refuse("evaluate_every is 0".into());
        }
        if !self
            .conditions
            .iter()
            .any(|c| *c != Termination::NonFiniteScore)
        {
            return refuse(
                "no termination condition that can end training: add MaxEpochs, MaxTime, \
                 NoImprovement or TargetScore with .stop_when(...) (NonFiniteScore alone \
                 may never hold)"
                    .into(),
            );
        }
        for c in &self.conditions {
            match *c {
                Termination::MaxEpochs(0) => return refuse("MaxEpochs(0) trains nothing".into()),
                Termination::NoImprovement { patience: 0, .. } => {
                    return refuse("NoImprovement with patience 0".into())
                }
                Termination::NoImprovement { min_delta, .. }
                    if min_delta.is_nan() || min_delta < 0.0 =>
                {
                    return refuse(format!(
                        "NoImprovement with min_delta {min_delta} (must be >= 0)"
                    ))
                }
                Termination::TargetScore(t) if t.is_nan() => {
                    return refuse("TargetScore(NaN)".into())
                }
                _ => {}
            }
        }
        let mut conditions = self.conditions;
        if self.stop_on_non_finite && !conditions.contains(&Termination::NonFiniteScore) {
            conditions.insert(0, Termination::NonFiniteScore);
        }
        Ok(EarlyStopping {
            trainer: self.trainer,
            validation,
            batch_size: self.batch_size,
            evaluate_every: self.evaluate_every,
            score: self.score,
            directory,
            conditions,
            on_epoch: self.on_epoch,
        })
    }

    /// [`EarlyStoppingBuilder::build`], then [`EarlyStopping::fit`].
    pub fn fit(self, train: &Dataset) -> Result<EarlyStoppingResult<T>> {
        self.build()?.fit(train)
    }
}

/// A trainer driven epoch by epoch until a [`Termination`] condition holds, keeping the
/// best and the latest model on disk (Deeplearning4j's `EarlyStoppingTrainer`; over a
/// parallel trainer, its `EarlyStoppingParallelTrainer`).
#[derive(Debug)]
pub struct EarlyStopping<T> {
    trainer: T,
    validation: Dataset,
    batch_size: usize,
    evaluate_every: u64,
    score: Score,
    directory: PathBuf,
    conditions: Vec<Termination>,
    on_epoch: Option<OnEpoch>,
}

/// The reference score and the evaluations since it, of one `NoImprovement` condition.
#[derive(Debug, Clone, Copy, Default)]
struct Patience {
    reference: Option<f64>,
    stale: u64,
}

impl<T: EpochTrainer> EarlyStopping<T> {
    /// Starts setting up early stopping of `trainer`.
    pub fn builder(trainer: T) -> EarlyStoppingBuilder<T> {
        EarlyStoppingBuilder {
            trainer,
            validation: None,
            batch_size: 32,
            evaluate_every: 1,
            score: Score::Loss,
            directory: None,
            conditions: Vec::new(),
            stop_on_non_finite: true,
            on_epoch: None,
        }
    }

    /// The trainer.
    pub fn trainer(&self) -> &T {
        &self.trainer
    }

    /// The conditions, in the order they are checked (`NonFiniteScore` first when on).
    pub fn conditions(&self) -> &[Termination] {
        &self.conditions
    }

    /// The directory of `best.safetensors` and `latest.safetensors`.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// Trains on `train` until a condition holds (see the module's documentation for
    /// the order of one epoch). `Err` when the directory cannot be made or written
    /// (naming it), or the trainer fails; the trainer is then dropped.
    pub fn fit(mut self, train: &Dataset) -> Result<EarlyStoppingResult<T>> {
        prepare_directory(&self.directory)?;
        let best_path = self.directory.join(BEST_FILE);
        let latest_path = self.directory.join(LATEST_FILE);
        let start = Instant::now();
        let mut patience = vec![Patience::default(); self.conditions.len()];
        let mut best: Option<(u64, f64)> = None;
        let (mut scores, mut train_losses) = (Vec::new(), Vec::new());
        let mut epoch = 0u64;
        let reason = loop {
            let loss = self.trainer.train_epoch(train, epoch, self.batch_size)?;
            train_losses.push(loss);
            self.trainer.save(&latest_path)?;
            let mut improved = false;
            let score = if (epoch + 1).is_multiple_of(self.evaluate_every) {
                let s = self.score.of(&self.trainer.score(&self.validation)?)?;
                scores.push((epoch, s));
                if s.is_finite() && best.is_none_or(|(_, b)| self.score.gain(s, b) > 0.0) {
                    self.trainer.save(&best_path)?;
                    best = Some((epoch, s));
                    improved = true;
                }
                for (c, p) in self.conditions.iter().zip(&mut patience) {
                    if let Termination::NoImprovement { min_delta, .. } = *c {
                        p.observe(self.score, s, min_delta);
                    }
                }
                Some(s)
            } else {
                None
            };
            let trained = epoch + 1;
            let stop = self
                .conditions
                .iter()
                .zip(&patience)
                .find_map(|(c, p)| check(*c, p, self.score, trained, score, start.elapsed()));
            if let Some(OnEpoch(f)) = &mut self.on_epoch {
                f(&EpochReport {
                    epoch,
                    train_loss: loss,
                    score,
                    improved,
                    best,
                    elapsed: start.elapsed(),
                    stop,
                });
            }
            if let Some(reason) = stop {
                break reason;
            }
            epoch += 1;
        };
        Ok(EarlyStoppingResult {
            reason,
            best_epoch: best.map(|(e, _)| e),
            best_score: best.map(|(_, s)| s),
            scores,
            epochs_trained: epoch + 1,
            train_losses,
            best_path: best.map(|_| best_path),
            latest_path,
            elapsed: start.elapsed(),
            trainer: self.trainer,
        })
    }
}

impl Patience {
    /// Takes in one evaluation's score.
    fn observe(&mut self, score: Score, s: f64, min_delta: f64) {
        let improved = s.is_finite() && self.reference.is_none_or(|r| score.gain(s, r) > min_delta);
        if improved {
            *self = Patience {
                reference: Some(s),
                stale: 0,
            };
        } else {
            self.stale += 1;
        }
    }
}

/// Whether `condition` holds after `trained` epochs (`score`: this epoch's, when it was
/// evaluated).
fn check(
    condition: Termination,
    patience: &Patience,
    kind: Score,
    trained: u64,
    score: Option<f64>,
    elapsed: Duration,
) -> Option<StopReason> {
    match condition {
        Termination::MaxEpochs(max) => (trained >= max).then_some(StopReason::MaxEpochs { max }),
        Termination::MaxTime(limit) => {
            (elapsed >= limit).then_some(StopReason::MaxTime { limit, elapsed })
        }
        Termination::TargetScore(target) => score
            .filter(|&s| kind.reaches(s, target))
            .map(|score| StopReason::TargetScore { target, score }),
        Termination::NonFiniteScore => score
            .filter(|s| !s.is_finite())
            .map(|score| StopReason::NonFiniteScore { score }),
        Termination::NoImprovement {
            patience: p,
            min_delta,
        } => (score.is_some() && patience.stale >= p).then_some(StopReason::NoImprovement {
            patience: p,
            min_delta,
        }),
    }
}

/// Makes `dir`, removes the best and latest files of an earlier run, and checks that a
/// file can be written there, so a bad directory fails before the first epoch.
fn prepare_directory(dir: &Path) -> Result<()> {
    let fail = |source| Error::Directory {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    for name in [BEST_FILE, LATEST_FILE] {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
    }
    let probe = dir.join(format!(".early-stopping-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(fail)?;
    std::fs::remove_file(&probe).map_err(fail)
}

/// What [`EarlyStopping::fit`] did, and the trainer, holding the latest parameters.
#[derive(Debug)]
pub struct EarlyStoppingResult<T> {
    /// The condition that ended training.
    pub reason: StopReason,
    /// The epoch (from 0) of the best finite score; `None` when none was scored.
    pub best_epoch: Option<u64>,
    /// The best finite score.
    pub best_score: Option<f64>,
    /// `(epoch, score)` of every evaluated epoch, in order, epochs from 0.
    pub scores: Vec<(u64, f64)>,
    /// Epochs trained: the last epoch is `epochs_trained - 1`.
    pub epochs_trained: u64,
    /// The mean training loss of every epoch, in order.
    pub train_losses: Vec<f64>,
    /// `best.safetensors`, when a finite score was recorded.
    pub best_path: Option<PathBuf>,
    /// `latest.safetensors`: the state after the last epoch.
    pub latest_path: PathBuf,
    /// Wall time of the whole fit.
    pub elapsed: Duration,
    trainer: T,
}

impl<T: EpochTrainer> EarlyStoppingResult<T> {
    /// The trainer (the latest parameters, unless [`Self::load_best`] was called).
    pub fn trainer(&self) -> &T {
        &self.trainer
    }

    /// The trainer, to change.
    pub fn trainer_mut(&mut self) -> &mut T {
        &mut self.trainer
    }

    /// The trainer, moved out.
    pub fn into_trainer(self) -> T {
        self.trainer
    }

    /// Loads the best model from disk into this result's trainer.
    pub fn load_best(&mut self) -> Result<()> {
        let path = self.best_file()?;
        self.trainer.load(&path)
    }

    /// Loads the best model from disk into `other` (a fresh trainer of the same model).
    pub fn load_best_into<U: EpochTrainer>(&self, other: &mut U) -> Result<()> {
        other.load(&self.best_file()?)
    }

    /// The best file; `Err` when no finite score was recorded.
    fn best_file(&self) -> Result<PathBuf> {
        self.best_path.clone().ok_or_else(|| Error::Argument {
            what: "EarlyStoppingResult::load_best",
            why: format!(
                "no best model: none of the {} scored epochs gave a finite score",
                self.scores.len()
            ),
        })
    }
}
