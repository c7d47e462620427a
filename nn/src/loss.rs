//! Losses and metrics: mean-squared error, cross-entropy with logits (stable: through
//! `log_softmax`, which subtracts the row's maximum) and accuracy. Each returns a lazy
//! 0-d tensor, so a loss and its gradient fuse with the model in one graph. f16 and
//! bf16 inputs are widened to f32 first: the loss reduces in f32 (a mean of a few
//! thousand terms in bf16 keeps 2 or 3 digits), and its gradient goes back through the
//! cast to the half-precision model.

use ndfuse::{DType, Tensor};

/// The mean over every element of `(prediction - target)^2`.
///
/// ```
/// let ctx = ndfuse::Context::new();
/// let p = ctx.from_vec(vec![1.0f32, 2.0], &[2])?;
/// let t = ctx.from_vec(vec![0.0f32, 4.0], &[2])?;
/// assert_eq!(ndfuse_nn::mse(&p, &t).eval()?.to_vec::<f32>()?, vec![2.5]);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[track_caller]
pub fn mse(prediction: &Tensor, target: &Tensor) -> Tensor {
    (&wide(prediction) - &wide(target)).square().mean(..)
}

/// The mean over the batch of `-sum(target * log_softmax(logits))` over the last axis.
/// `labels` are class indices (an integer tensor of the batch's shape, `[B]` for logits
/// `[B, C]`) or target probabilities of the logits' shape (a float tensor).
///
/// Stable for any logits: `log_softmax` subtracts the row's maximum before `exp`.
/// f16 and bf16 logits (and target probabilities) are computed on in f32.
///
/// ```
/// let ctx = ndfuse::Context::new();
/// let logits = ctx.from_vec(vec![0.0f32, 0.0, 1000.0, 0.0], &[2, 2])?;
/// let labels = ctx.from_vec(vec![1i64, 0], &[2])?;
/// let loss = ndfuse_nn::cross_entropy_with_logits(&logits, &labels).eval()?;
/// assert!((loss.to_vec::<f32>()?[0] - std::f32::consts::LN_2 / 2.0).abs() < 1e-6);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[track_caller]
pub fn cross_entropy_with_logits(logits: &Tensor, labels: &Tensor) -> Tensor {
    let logits = &wide(logits);
    let target = match labels.dtype() {
        Ok(d) if !d.is_float() => one_hot(logits, labels),
        _ => wide(labels),
    };
    -(&target * &logits.log_softmax(-1)).sum(-1).mean(..)
}

/// The fraction of rows of `logits` whose largest entry is at the row's label (class
/// indices, an integer tensor), as a 0-d f32 tensor. Ties go to the first index.
#[track_caller]
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> Tensor {
    logits
        .argmax(-1)
        .eq(labels.cast(DType::I64))
        .cast(DType::F32)
        .mean(..)
}

/// `t` in f32 when it is f16 or bf16, else `t` itself.
fn wide(t: &Tensor) -> Tensor {
    match t.dtype() {
        Ok(d) if d.is_half() => t.cast(DType::F32),
        _ => t.clone(),
    }
}

/// `labels` (class indices) as rows of the logits' dtype: 1 at the label, 0 elsewhere.
/// A label outside `[0, classes)` gives a row of zeros (so it adds nothing to the loss).
#[track_caller]
fn one_hot(logits: &Tensor, labels: &Tensor) -> Tensor {
    let ctx = logits.context();
    let (classes, dtype) = match (logits.shape(), logits.dtype()) {
        (Ok(s), Ok(d)) => (s.last().copied().unwrap_or(1), d),
        _ => return logits.clone(),
    };
    let ids = ctx
        .arange(0.0, classes as f64, 1.0)
        .map(|t| t.cast(DType::I64))
        .unwrap_or_else(|_| ctx.zeros(&[classes]).cast(DType::I64));
    labels.cast(DType::I64).expand_dims(-1).eq(&ids).cast(dtype)
}
