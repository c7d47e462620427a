//! What early stopping drives: anything that trains an epoch, scores a data set and
//! saves and loads its state. A [`Trainer`] is one; `ParallelWrapper` is another.

use crate::error::Result;
use ndfuse_nn::{Batch, Dataset, Layer, Scores, Trainer};
use std::path::Path;

/// A trainer early stopping can drive, one epoch at a time.
pub trait EpochTrainer {
    /// Trains one pass over `data` (epoch `epoch`, from 0, which seeds its batch order)
    /// in batches of `batch_size`; returns the mean training loss.
    fn train_epoch(&mut self, data: &Dataset, epoch: u64, batch_size: usize) -> Result<f64>;
    /// The model's scores on `data` (evaluation mode).
    fn score(&self, data: &Dataset) -> Result<Scores>;
    /// Saves the whole training state (parameters, optimiser state) to `path`,
    /// atomically.
    fn save(&self, path: &Path) -> Result<()>;
    /// Loads what [`EpochTrainer::save`] wrote.
    fn load(&mut self, path: &Path) -> Result<()>;
}

impl<M: Layer> EpochTrainer for Trainer<M> {
    fn train_epoch(&mut self, data: &Dataset, epoch: u64, batch_size: usize) -> Result<f64> {
        let (mut sum, mut n) = (0.0, 0usize);
        for batch in data.batches(batch_size, self.random_seed(), epoch, false)? {
            let batch = batch?;
            let k = batch.indices.len();
            sum += self.step_batch(batch)? * k as f64;
            n += k;
        }
        Ok(sum / n.max(1) as f64)
    }

    fn score(&self, data: &Dataset) -> Result<Scores> {
        Ok(self.evaluate_dataset(data, 0)?)
    }

    fn save(&self, path: &Path) -> Result<()> {
        Ok(Trainer::save(self, path)?)
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        Ok(Trainer::load(self, path)?)
    }
}

/// A [`Trainer`] whose "epochs", as early stopping counts them, are `every` iterations
/// (mini-batches) each: wrapped in this, [`crate::EarlyStopping`] scores the validation
/// set, counts patience and applies `MaxEpochs` every `every` iterations instead of
/// every epoch (Deeplearning4j's scoring every N iterations). Iteration `i` of the run
/// is batch `i mod b` of data epoch `i / b` (`b` batches an epoch, the last one
/// possibly short): the batches a plain epoch loop would train, in the same order, so
/// chunk boundaries do not change the result.
#[derive(Debug)]
pub struct Iterations<M: Layer> {
    trainer: Trainer<M>,
    every: usize,
}

impl<M: Layer> Iterations<M> {
    /// `trainer`, scored every `every` iterations (at least 1).
    pub fn new(trainer: Trainer<M>, every: usize) -> Iterations<M> {
        Iterations {
            trainer,
            every: every.max(1),
        }
    }

    /// The trainer.
    pub fn trainer(&self) -> &Trainer<M> {
        &self.trainer
    }

    /// The trainer, giving up the wrapper.
    pub fn into_trainer(self) -> Trainer<M> {
        self.trainer
    }
}

impl<M: Layer> EpochTrainer for Iterations<M> {
    /// Trains chunk `chunk` of `every` iterations; returns their mean loss (weighted by
    /// batch size).
    fn train_epoch(&mut self, data: &Dataset, chunk: u64, batch_size: usize) -> Result<f64> {
        let n = data.len();
        let per_epoch = n.div_ceil(batch_size.max(1)).max(1);
        let seed = self.trainer.random_seed();
        let first = chunk as usize * self.every;
        let (mut sum, mut samples) = (0.0, 0usize);
        let mut order: Option<(usize, Vec<usize>)> = None;
        for i in first..first + self.every {
            let (epoch, b) = (i / per_epoch, i % per_epoch);
            if order.as_ref().is_none_or(|(e, _)| *e != epoch) {
                order = Some((epoch, data.epoch_order(seed, epoch as u64)));
            }
            let Some((_, o)) = &order else { continue };
            let indices = o[b * batch_size..((b + 1) * batch_size).min(n)].to_vec();
            let part = data.subset(&indices)?;
            let k = indices.len();
            let batch = Batch {
                features: part.features().clone(),
                labels: part.labels().clone(),
                indices,
            };
            sum += self.trainer.step_batch(batch)? * k as f64;
            samples += k;
        }
        Ok(sum / samples.max(1) as f64)
    }

    fn score(&self, data: &Dataset) -> Result<Scores> {
        Ok(self.trainer.evaluate_dataset(data, 0)?)
    }

    fn save(&self, path: &Path) -> Result<()> {
        Ok(self.trainer.save(path)?)
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        Ok(self.trainer.load(path)?)
    }
}
