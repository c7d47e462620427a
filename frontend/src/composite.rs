//! Composite ops built from primitives, so that fusion, not a hand-written kernel, is
//! what makes them fast: softmax, log_softmax, layernorm, gelu.

use crate::tensor::Tensor;

impl Tensor {
    /// `exp(x - max) / sum(exp(x - max))` along `axis` (max-subtracted for stability).
    #[track_caller]
    pub fn softmax(&self, axis: i64) -> Tensor {
        let shifted = self - &self.max_keepdims(axis);
        let e = shifted.exp();
        &e / &e.sum_keepdims(axis)
    }

    /// `x - max - log(sum(exp(x - max)))` along `axis`.
    #[track_caller]
    pub fn log_softmax(&self, axis: i64) -> Tensor {
        let shifted = self - &self.max_keepdims(axis);
        &shifted - &shifted.exp().sum_keepdims(axis).log()
    }

    /// `(x - mean) / sqrt(var + eps)` along `axis`, without affine parameters.
    #[track_caller]
    pub fn layernorm(&self, axis: i64, eps: f64) -> Tensor {
        let centered = self - &self.mean_keepdims(axis);
        &centered * &(self.var_keepdims(axis) + eps).rsqrt()
    }

    /// GELU, tanh form: `0.5 x (1 + tanh(u))` with `u = sqrt(2/pi) (x + 0.044715 x^3)`,
    /// built as `x sigmoid(2u)`, the same function (`(1 + tanh u) / 2 = sigmoid(2u)`):
    /// one exponential and one division instead of tanh's two branches and the `+ 1`,
    /// and no cancellation in `1 + tanh(u)` where `u` is large and negative (there the
    /// tanh form in f32 loses most of its digits; this one keeps them).
    #[track_caller]
    pub fn gelu(&self) -> Tensor {
        let c = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
        let inner = (self + &(self * &self.square() * 0.044715)) * c;
        self * &inner.sigmoid()
    }

    /// GELU, erf form: `0.5 x (1 + erf(x / sqrt 2))`.
    #[track_caller]
    pub fn gelu_erf(&self) -> Tensor {
        self * 0.5 * ((self * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0)
    }
}
