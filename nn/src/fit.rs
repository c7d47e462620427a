//! Epochs over a data set: shuffled, prefetched mini-batches through
//! [`Trainer::step_batch`], a validation score after each epoch, the progress bar, and
//! the history of losses and scores that [`History::plot`] draws.

use crate::data::{Batch, Dataset};
use crate::error::Result;
use crate::layers::Layer;
use crate::plot::{plot_curves, Curve};
use crate::progress::{scale_status, Progress};
use crate::train::{Scores, Trainer};
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

/// How [`Trainer::fit`] runs.
#[derive(Debug, Clone, PartialEq)]
pub struct FitOptions {
    /// Passes over the training set.
    pub epochs: u64,
    /// Samples per step.
    pub batch_size: usize,
    /// The seed of the batch order (each epoch's order depends on it and the epoch).
    pub seed: u64,
    /// Leave out each epoch's last, smaller batch.
    pub drop_last: bool,
    /// Batches assembled ahead on a separate thread (0: none, assembled in the loop).
    pub prefetch: usize,
    /// Draw the progress bar (when stderr is a terminal and `NDFUSE_PROGRESS` is not 0).
    pub progress: bool,
    /// Samples per evaluation slice when scoring the validation set (0: all at once).
    pub eval_batch: usize,
}

impl Default for FitOptions {
    fn default() -> FitOptions {
        FitOptions {
            epochs: 10,
            batch_size: 32,
            seed: 0,
            drop_last: false,
            prefetch: 2,
            progress: true,
            eval_batch: 0,
        }
    }
}

/// What one epoch did.
#[derive(Debug, Clone, PartialEq)]
pub struct Epoch {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The mean of its steps' losses, weighted by batch size.
    pub train_loss: f64,
    /// The validation set's scores after the epoch, when there is one.
    pub validation: Option<Scores>,
    /// Wall time of the epoch's steps (the validation not included).
    pub seconds: f64,
    /// Training samples per second over the epoch.
    pub samples_per_sec: f64,
    /// With dynamic loss scaling (f16): the scale at the epoch's end.
    pub loss_scale: Option<f64>,
    /// The steps of the epoch skipped because a gradient was not finite (loss scaling).
    pub skipped_steps: u64,
}

/// Every epoch's record and every step's loss.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// One record per epoch, in order.
    pub epochs: Vec<Epoch>,
    /// The loss of every step, in order.
    pub step_losses: Vec<f64>,
}

impl History {
    /// Writes the loss curves (training, and validation when scored) and the validation
    /// accuracy, per epoch, as an SVG at `path`.
    pub fn plot(&self, path: &Path, title: &str) -> Result<()> {
        let per_epoch = |f: &dyn Fn(&Epoch) -> Option<f64>| -> Vec<(f64, f64)> {
            self.epochs
                .iter()
                .filter_map(|e| Some(((e.epoch + 1) as f64, f(e)?)))
                .collect()
        };
        let mut losses = vec![Curve::new("training", per_epoch(&|e| Some(e.train_loss)))];
        let val = per_epoch(&|e| e.validation.map(|v| v.loss));
        if !val.is_empty() {
            losses.push(Curve::new("validation", val));
        }
        let acc = per_epoch(&|e| e.validation.and_then(|v| v.accuracy));
        let accuracy = [Curve::new("validation", acc)];
        let mut panels: Vec<(&str, &[Curve])> = vec![("loss", &losses)];
        if !accuracy[0].points.is_empty() {
            panels.push(("accuracy", &accuracy));
        }
        plot_curves(path, title, "epoch", &panels)
    }
}

impl<M: Layer> Trainer<M> {
    /// One step on a batch, its arrays moved in (no copy).
    pub fn step_batch(&mut self, batch: Batch) -> Result<f64> {
        let ctx = self.context().clone();
        let (x, y) = (ctx.tensor(batch.features), ctx.tensor(batch.labels));
        self.step_tensors(&x, &y)
    }

    /// Scores on a whole data set (see [`Trainer::evaluate`]).
    pub fn evaluate_dataset(&self, data: &Dataset, batch: usize) -> Result<Scores> {
        self.evaluate(data.features(), data.labels(), batch)
    }

    /// Trains for `opts.epochs` epochs over `train`, scoring `validation` after each.
    ///
    /// ```
    /// use ndfuse_nn::{Activation, Dataset, FitOptions, Layer, Loss, Optimizer, Sequential, Trainer};
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.rand_normal(&[64, 4], 0.0, 1.0, 1).eval()?;
    /// let y = ctx.tensor(x.clone()).sum_keepdims(1).eval()?; // learn the row sum
    /// let data = Dataset::new(x, y)?;
    /// let model = Sequential::mlp(&ctx, &[4, 1], Activation::Relu, 2)?;
    /// let opt = Optimizer::sgd(&model.parameters(), 0.1);
    /// let mut t = Trainer::new(model, opt, Loss::Mse)?;
    /// let opts = FitOptions { epochs: 20, batch_size: 16, ..FitOptions::default() };
    /// let h = t.fit(&data, Some(&data), &opts)?;
    /// assert_eq!(h.epochs.len(), 20);
    /// assert!(h.epochs[19].validation.unwrap().loss < 1e-3);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn fit(
        &mut self,
        train: &Dataset,
        validation: Option<&Dataset>,
        opts: &FitOptions,
    ) -> Result<History> {
        self.fit_with(train, validation, opts, |_| ControlFlow::Continue(()))
    }

    /// [`Trainer::fit`], calling `after_epoch` with each epoch's record; returning
    /// `ControlFlow::Break` stops after that epoch (early stopping decides here).
    pub fn fit_with(
        &mut self,
        train: &Dataset,
        validation: Option<&Dataset>,
        opts: &FitOptions,
        mut after_epoch: impl FnMut(&Epoch) -> ControlFlow<()>,
    ) -> Result<History> {
        let per_epoch = if opts.drop_last {
            train.len() / opts.batch_size.max(1)
        } else {
            train.len().div_ceil(opts.batch_size.max(1))
        } as u64;
        let label = "train";
        let total = per_epoch * opts.epochs;
        let bar = if opts.progress {
            Progress::new(total, label)
        } else {
            Progress::hidden(total, label)
        };
        let mut history = History::default();
        let mut step = 0;
        for epoch in 0..opts.epochs {
            let batches = train.batches(opts.batch_size, opts.seed, epoch, opts.drop_last)?;
            let batches: Box<dyn Iterator<Item = Result<Batch>>> = if opts.prefetch > 0 {
                Box::new(batches.prefetch(opts.prefetch))
            } else {
                Box::new(batches)
            };
            let start = Instant::now();
            let skipped_before = self.optimizer().skipped_steps();
            let (mut loss_sum, mut samples) = (0.0, 0usize);
            for batch in batches {
                let batch = batch?;
                let n = batch.indices.len();
                let loss = self.step_batch(batch)?;
                history.step_losses.push(loss);
                loss_sum += loss * n as f64;
                samples += n;
                step += 1;
                let rate = samples as f64 / start.elapsed().as_secs_f64().max(1e-9);
                match self.optimizer().loss_scaler() {
                    Some(s) => bar.update_scaled(step, loss, rate, s.scale(), s.skipped_steps()),
                    None => bar.update(step, loss, rate),
                }
            }
            let seconds = start.elapsed().as_secs_f64();
            let validation = match validation {
                Some(v) => Some(self.evaluate_dataset(v, opts.eval_batch)?),
                None => None,
            };
            let record = Epoch {
                epoch,
                train_loss: loss_sum / samples.max(1) as f64,
                validation,
                seconds,
                samples_per_sec: samples as f64 / seconds.max(1e-9),
                loss_scale: self.optimizer().loss_scaler().map(|s| s.scale()),
                skipped_steps: self.optimizer().skipped_steps() - skipped_before,
            };
            bar.message(&epoch_line(&record));
            let flow = after_epoch(&record);
            history.epochs.push(record);
            if flow.is_break() {
                break;
            }
        }
        let summary = history.epochs.last().map(epoch_line).unwrap_or_default();
        bar.finish(&summary);
        Ok(history)
    }
}

/// `epoch 3: loss 0.1234, validation loss 0.2345, accuracy 96.1%, 51234 samples/s`,
/// and with loss scaling `, scale 2^15, 1 skipped` (the steps of this epoch).
pub fn epoch_line(e: &Epoch) -> String {
    let mut s = format!("epoch {}: loss {:.4}", e.epoch + 1, e.train_loss);
    if let Some(v) = e.validation {
        s += &format!(", validation loss {:.4}", v.loss);
        if let Some(a) = v.accuracy {
            s += &format!(", accuracy {:.1}%", a * 100.0);
        }
    }
    s += &format!(", {:.0} samples/s", e.samples_per_sec);
    if let Some(scale) = e.loss_scale {
        s += &format!(", {}", scale_status(scale, e.skipped_steps));
    }
    s
}
