//! Learning-rate schedules: the rate of step `t` (counted from 0), computed on the host
//! in f64 and fed to the optimiser's graph as data, so a changing rate never changes
//! the compiled graph.

/// How the learning rate changes with the step.
///
/// ```
/// use ndfuse_nn::Schedule;
/// let s = Schedule::Cosine { base: 0.1, floor: 0.0, steps: 100 }.with_warmup(10);
/// assert!((s.rate(0) - 0.01).abs() < 1e-12); // warm-up starts at base / warmup
/// assert!((s.rate(10) - 0.1).abs() < 1e-12);
/// assert!(s.rate(109) < 1e-3 && s.rate(500) == 0.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// The same rate at every step.
    Constant(f64),
    /// `base * gamma^(t / every)` (integer division): PyTorch's `StepLR`.
    Step {
        /// The rate of the first steps.
        base: f64,
        /// The factor applied every `every` steps.
        gamma: f64,
        /// The period, in steps (at least 1).
        every: u64,
    },
    /// `base * gamma^t`: PyTorch's `ExponentialLR`.
    Exponential {
        /// The rate of step 0.
        base: f64,
        /// The factor per step.
        gamma: f64,
    },
    /// Half a cosine from `base` at step 0 down to `floor` at step `steps`, then `floor`:
    /// PyTorch's `CosineAnnealingLR` without restarts.
    Cosine {
        /// The rate of step 0.
        base: f64,
        /// The rate from step `steps` on.
        floor: f64,
        /// The length of the decay.
        steps: u64,
    },
    /// A linear warm-up from `inner.rate(0) / steps` to `inner.rate(0)` over `steps`
    /// steps, then `inner` from its own step 0.
    Warmup {
        /// The warm-up's length in steps.
        steps: u64,
        /// The schedule after the warm-up.
        inner: Box<Schedule>,
    },
}

impl Schedule {
    /// The rate of step `t`.
    pub fn rate(&self, t: u64) -> f64 {
        match self {
            Schedule::Constant(r) => *r,
            Schedule::Step { base, gamma, every } => {
                // Saturating: a huge exponent is just a huge power, not a wrap.
                let k = i32::try_from(t / (*every).max(1)).unwrap_or(i32::MAX);
                base * gamma.powi(k)
            }
            Schedule::Exponential { base, gamma } => {
                base * gamma.powi(i32::try_from(t).unwrap_or(i32::MAX))
            }
            Schedule::Cosine { base, floor, steps } => {
                if t >= *steps {
                    *floor
                } else {
                    let phase = std::f64::consts::PI * t as f64 / *steps as f64;
                    floor + (base - floor) * 0.5 * (1.0 + phase.cos())
                }
            }
            Schedule::Warmup { steps, inner } => {
                if t < *steps {
                    inner.rate(0) * (t + 1) as f64 / *steps as f64
                } else {
                    inner.rate(t - steps)
                }
            }
        }
    }

    /// This schedule after a linear warm-up of `steps` steps.
    pub fn with_warmup(self, steps: u64) -> Schedule {
        if steps == 0 {
            return self;
        }
        Schedule::Warmup {
            steps,
            inner: Box::new(self),
        }
    }
}

impl From<f64> for Schedule {
    fn from(rate: f64) -> Schedule {
        Schedule::Constant(rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_give_the_textbook_rates() {
        let s = Schedule::Step {
            base: 1.0,
            gamma: 0.5,
            every: 3,
        };
        let rates: Vec<f64> = (0..7).map(|t| s.rate(t)).collect();
        assert_eq!(rates, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]);
        let e = Schedule::Exponential {
            base: 2.0,
            gamma: 0.9,
        };
        assert!((e.rate(2) - 2.0 * 0.81).abs() < 1e-15);
        let c = Schedule::Cosine {
            base: 1.0,
            floor: 0.1,
            steps: 4,
        };
        // Half way down the half cosine: the mean of base and floor.
        assert!((c.rate(2) - 0.55).abs() < 1e-15);
        assert_eq!(c.rate(4), 0.1);
        let w = Schedule::Constant(0.3).with_warmup(3);
        let rates: Vec<f64> = (0..5).map(|t| w.rate(t)).collect();
        assert!((rates[0] - 0.1).abs() < 1e-15 && (rates[1] - 0.2).abs() < 1e-15);
        assert_eq!(&rates[2..], &[0.3, 0.3, 0.3]);
        assert_eq!(
            Schedule::Constant(0.5).with_warmup(0),
            Schedule::Constant(0.5)
        );
    }
}
