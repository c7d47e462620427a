//! Batch normalisation with PyTorch's semantics (`torch.nn.functional.batch_norm`) over
//! `[N, C, ...]`: per channel (axis 1), statistics over the batch and every spatial
//! axis. The training form normalises by the batch's mean and (biased) variance; the
//! inference form by running statistics. PyTorch's training form also updates the
//! running statistics in place: here tensors are values, so
//! [`Tensor::batch_norm_running`] gives the updated ones for the caller to keep.
//!
//! A composite of reductions and element-wise ops: the training form is a row program
//! over each channel's statistics, then one element-wise kernel; the inference form is
//! element-wise alone, so it fuses into the kernel of whatever consumes it (a ReLU, a
//! residual add) and into a convolution's epilogue.

use crate::conv::At;
use crate::error::Error;
use crate::tensor::Tensor;
use std::panic::Location;

/// A batch normalisation's settings (PyTorch's defaults: the inference form, momentum
/// 0.1, eps 1e-5).
///
/// ```
/// use ndfuse::BatchNorm;
/// let bn = BatchNorm::new().training(true).eps(1e-3);
/// assert!(bn.is_training());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm {
    training: bool,
    momentum: f64,
    eps: f64,
}

impl Default for BatchNorm {
    fn default() -> Self {
        BatchNorm {
            training: false,
            momentum: 0.1,
            eps: 1e-5,
        }
    }
}

impl BatchNorm {
    /// The inference form, momentum 0.1, eps 1e-5.
    pub fn new() -> Self {
        BatchNorm::default()
    }

    /// The training form (batch statistics) or the inference form (running ones).
    pub fn training(mut self, yes: bool) -> Self {
        self.training = yes;
        self
    }

    /// The weight of the batch's statistics in the running ones'
    /// ([`Tensor::batch_norm_running`]).
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }

    /// Added to the variance before its square root.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Whether this is the training form.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

/// The axes the statistics run over: the batch and every spatial axis.
fn stat_axes(rank: usize) -> Vec<i64> {
    std::iter::once(0).chain(2..rank as i64).collect()
}

/// Checks `x` and the per-channel tensors; the shape `[1, C, 1...]` they broadcast as
/// and the elements each channel's statistics run over.
fn checked(
    x: &Tensor,
    per_channel: &[(&str, Option<&Tensor>)],
    training: bool,
) -> Result<(Vec<i64>, usize), String> {
    let xs = x.shape().map_err(|e| e.to_string())?.to_vec();
    if xs.len() < 2 {
        return Err(format!("x {xs:?} must be [N, C, ...]"));
    }
    let c = xs[1];
    for (name, t) in per_channel {
        if let Some(t) = t {
            let s = t.shape().map_err(|e| e.to_string())?;
            if s != [c] {
                return Err(format!(
                    "x {xs:?}, {name} {s:?}: {name} must be [{c}], one per channel"
                ));
            }
        }
    }
    let n = xs.iter().product::<usize>() / c.max(1);
    if training && n < 2 {
        return Err(format!(
            "x {xs:?}: the training form needs more than 1 value per channel (as PyTorch)"
        ));
    }
    let mut shape = vec![1i64; xs.len()];
    shape[1] = c as i64;
    Ok((shape, n))
}

impl Tensor {
    /// PyTorch's `batch_norm(x, running_mean, running_var, weight, bias, training,
    /// momentum, eps)` on `x [N, C, ...]`: `(x - mean) / sqrt(var + eps) * weight +
    /// bias` per channel, with the batch's mean and biased variance in the training
    /// form and `running_mean`, `running_var` (required) in the inference form.
    /// Errors (a per-channel tensor that is not `[C]`, missing running statistics, one
    /// value per channel in training) name the shapes and the call site.
    ///
    /// ```
    /// use ndfuse::BatchNorm;
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![1.0f32, 3.0, 10.0, 30.0], &[2, 2])?;
    /// let y = x.batch_norm(None, None, None, None, &BatchNorm::new().training(true).eps(0.0));
    /// assert_eq!(y.eval()?.to_vec::<f32>()?, [-1.0, -1.0, 1.0, 1.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        bn: &BatchNorm,
    ) -> Tensor {
        let at: At = Location::caller();
        let bad = |why: String| {
            Tensor::poisoned(
                &self.ctx,
                Error::Argument {
                    what: "batch_norm",
                    why,
                    at,
                },
            )
        };
        let per_channel = [
            ("running_mean", running_mean),
            ("running_var", running_var),
            ("weight", weight),
            ("bias", bias),
        ];
        let (shape, _) = match checked(self, &per_channel, bn.training) {
            Ok(s) => s,
            Err(why) => return bad(why),
        };
        let as_channels = |t: &Tensor| t.reshape(&shape);
        if bn.training {
            let axes = stat_axes(shape.len());
            let centered = self - &self.mean_keepdims(&axes[..]);
            let y = &centered * &(self.var_keepdims(&axes[..]) + bn.eps).rsqrt();
            let y = match weight {
                Some(w) => y * &as_channels(w),
                None => y,
            };
            return match bias {
                Some(b) => y + &as_channels(b),
                None => y,
            };
        }
        let (Some(m), Some(v)) = (running_mean, running_var) else {
            return bad("the inference form needs running_mean and running_var".into());
        };
        // Folded into a per-channel scale and shift (one kernel of C elements), so
        // each element costs one multiply-add wherever it fuses.
        let scale = (v + bn.eps).rsqrt();
        let scale = match weight {
            Some(w) => scale * w,
            None => scale,
        };
        let shift = match bias {
            Some(b) => b - &(m * &scale),
            None => -(m * &scale),
        };
        self * &as_channels(&scale) + &as_channels(&shift)
    }

    /// The running statistics a training-form [`Tensor::batch_norm`] over this batch
    /// leaves, as PyTorch updates them in place: `(1 - momentum) * running + momentum *
    /// batch`, with the batch's variance unbiased (`n / (n - 1)` times the biased one).
    #[track_caller]
    pub fn batch_norm_running(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        bn: &BatchNorm,
    ) -> (Tensor, Tensor) {
        let at: At = Location::caller();
        let per_channel = [
            ("running_mean", Some(running_mean)),
            ("running_var", Some(running_var)),
        ];
        let n = match checked(self, &per_channel, true) {
            Ok((_, n)) => n,
            Err(why) => {
                let e = Tensor::poisoned(
                    &self.ctx,
                    Error::Argument {
                        what: "batch_norm_running",
                        why,
                        at,
                    },
                );
                return (e.clone(), e);
            }
        };
        let axes = stat_axes(self.shape().map_or(2, <[usize]>::len));
        let m = bn.momentum;
        let unbiased = self.var(&axes[..]) * (n as f64 / (n as f64 - 1.0));
        (
            running_mean * (1.0 - m) + &(self.mean(&axes[..]) * m),
            running_var * (1.0 - m) + &(unbiased * m),
        )
    }
}
