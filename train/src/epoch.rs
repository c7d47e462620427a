//! What early stopping drives: anything that trains an epoch, scores a data set and
//! saves and loads its state. A [`Trainer`] is one; `ParallelWrapper` is another.

use crate::error::Result;
use ndfuse_nn::{Dataset, Layer, Scores, Trainer};
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
