//! Dynamic loss scaling for f16 training (Micikevicius et al. 2018, "Mixed Precision
//! Training"), with `torch.cuda.amp.GradScaler`'s rule and defaults: the loss is
//! multiplied by a scale `S` before the backward pass, so that small gradients do not
//! flush to zero in f16's 5 exponent bits, and the gradients are divided by `S` again
//! before clipping and the update. A step whose gradients are not all finite is
//! skipped (parameters, state and step count unchanged), counted, and `S` halves;
//! after `growth_interval` finite steps in a row `S` doubles.
//!
//! This file is the host side, the state between steps; the optimiser builds the graph
//! side (`crate::Optimizer::gradients` scales and unscales, `crate::Optimizer::update`
//! selects the old values when a gradient is not finite) and reads the flag back.

use crate::error::{Error, Result};

/// The state of dynamic loss scaling: the current scale, the finite steps since it last
/// changed, and the steps skipped so far.
///
/// ```
/// use ndfuse_nn::LossScale;
/// let mut s = LossScale::new().growth_interval(2);
/// assert_eq!(s.scale(), 65536.0);
/// s.record(false); // an overflow: skipped, the scale halves
/// assert_eq!((s.scale(), s.skipped_steps()), (32768.0, 1));
/// s.record(true);
/// s.record(true); // two finite steps in a row: it doubles
/// assert_eq!(s.scale(), 65536.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LossScale {
    scale: f64,
    growth_interval: u64,
    /// Finite steps since the scale last changed.
    good: u64,
    skipped: u64,
}

impl Default for LossScale {
    fn default() -> LossScale {
        LossScale::new()
    }
}

impl LossScale {
    /// The first scale, 2^16 (GradScaler's `init_scale`).
    pub const INITIAL: f64 = 65536.0;
    /// Finite steps in a row after which the scale doubles (GradScaler's
    /// `growth_interval`).
    pub const GROWTH_INTERVAL: u64 = 2000;
    /// The largest scale: it stays finite in f32, in which the scale enters the step.
    pub const MAX: f64 = (1u128 << 127) as f64;
    /// The smallest scale: f32's smallest normal number, 2^-126.
    pub const MIN: f64 = f32::MIN_POSITIVE as f64;

    /// Scale 2^16, growth after 2000 finite steps, nothing skipped.
    pub fn new() -> LossScale {
        LossScale {
            scale: LossScale::INITIAL,
            growth_interval: LossScale::GROWTH_INTERVAL,
            good: 0,
            skipped: 0,
        }
    }

    /// The same state growing after `steps` finite steps in a row (at least 1).
    pub fn growth_interval(mut self, steps: u64) -> LossScale {
        self.growth_interval = steps.max(1);
        self
    }

    /// The finite steps in a row after which the scale doubles.
    pub fn interval(&self) -> u64 {
        self.growth_interval
    }

    /// The current scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Sets the scale (a test forcing an overflow, a run resumed from a checkpoint);
    /// the count of finite steps restarts. `Err` naming the value unless it is in
    /// `[LossScale::MIN, LossScale::MAX]`; then nothing changes.
    pub fn set_scale(&mut self, scale: f64) -> Result<()> {
        if !(LossScale::MIN..=LossScale::MAX).contains(&scale) {
            return Err(Error::Argument {
                what: "LossScale::set_scale",
                why: format!(
                    "scale {scale} is outside [2^-126, 2^127] (it must stay a finite, normal f32)"
                ),
            });
        }
        self.scale = scale;
        self.good = 0;
        Ok(())
    }

    /// The finite steps since the scale last changed.
    pub fn good_steps(&self) -> u64 {
        self.good
    }

    /// The steps skipped so far because a gradient was not finite.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    /// Restores counters saved with a checkpoint: the finite steps since the scale last
    /// changed and the steps skipped.
    pub fn set_counts(&mut self, good_steps: u64, skipped_steps: u64) {
        self.good = good_steps.min(self.growth_interval.saturating_sub(1));
        self.skipped = skipped_steps;
    }

    /// Takes a step's outcome: a finite one counts towards growth (the scale doubles,
    /// up to [`LossScale::MAX`], when the count reaches the interval); a skipped one
    /// halves the scale (down to [`LossScale::MIN`]) and is counted.
    pub fn record(&mut self, finite: bool) {
        if finite {
            self.good += 1;
            if self.good >= self.growth_interval {
                self.scale = (self.scale * 2.0).min(LossScale::MAX);
                self.good = 0;
            }
        } else {
            self.scale = (self.scale * 0.5).max(LossScale::MIN);
            self.good = 0;
            self.skipped += 1;
        }
    }
}
