//! Composite ops built from primitives, so that fusion, not a hand-written kernel, is
//! what makes them fast: softmax, log_softmax, layernorm, gelu, dropout, and the masks
//! made from positions (`one_hot`, `tril`, `triu`: comparisons of iotas).

use crate::error::Error;
use crate::index::{check_index, iota_at};
use crate::ops::Operand;
use crate::tensor::Tensor;
use ndfuse_ir::{DType, IrError};
use std::panic::Location;

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

    /// Inverted dropout: `where(u >= p, x * (1 / (1 - p)), 0)` in this tensor's dtype,
    /// with `u` = [`Context::random_uniform_keyed`](crate::Context::random_uniform_keyed)
    /// of this shape under `key` (compared in f32): each element is kept with
    /// probability `1 - p` and scaled so the expectation is unchanged. The same key
    /// gives the same mask; the random op fuses into the kernel that applies it, and the
    /// gradient flows through the kept elements only (`where`). `p == 0` returns this
    /// tensor; `p` outside `[0, 1)` gives a tensor carrying [`Error::Argument`] naming
    /// `p` and the call site.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.ones(&[1000]);
    /// let y = x.dropout(0.5, &ctx.key(1)).eval()?.to_vec::<f32>()?;
    /// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn dropout(&self, p: f64, key: &Tensor) -> Tensor {
        let at = Location::caller();
        if !(0.0..1.0).contains(&p) {
            return Tensor::poisoned(
                &self.ctx,
                Error::Argument {
                    what: "dropout",
                    why: format!("p = {p} is outside [0, 1)"),
                    at,
                },
            );
        }
        if p == 0.0 {
            return self.clone();
        }
        let shape = match self.shape() {
            Ok(s) => s.to_vec(),
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let u = self.ctx.random_uniform_keyed(&shape, key);
        u.ge(p).where_(self * (1.0 / (1.0 - p)), 0.0)
    }

    /// GELU, erf form: `0.5 x (1 + erf(x / sqrt 2))`.
    #[track_caller]
    pub fn gelu_erf(&self) -> Tensor {
        self * 0.5 * ((self * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0)
    }

    /// One-hot rows: `out[..., j] = (self[...] == j)` for `j` in `0..n`, in the
    /// context's default float dtype (`cast(eq(idx[..., None], arange(n)))`). The index
    /// is i32 or i64; an index outside `0..n` gives a row of zeros.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let idx = ctx.from_vec(vec![2i64, 0], &[2])?;
    /// let y = idx.one_hot(3).eval()?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn one_hot(&self, n: usize) -> Tensor {
        let at = Location::caller();
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        if let Err(t) = check_index("one_hot", self, &ty, at) {
            return t;
        }
        let classes = iota_at(&self.ctx, n, 0, 1, at);
        self.expand_dims(-1)
            .eq(&classes)
            .cast(self.ctx.default_dtype())
    }

    /// The lower triangle over the last two axes (numpy's `tril`): elements with
    /// `column - row <= k` kept, the rest zero (false for bool). `k = 0` keeps the
    /// diagonal, `k < 0` drops diagonals below it too.
    #[track_caller]
    pub fn tril(&self, k: i64) -> Tensor {
        self.triangle("tril", k, Location::caller())
    }

    /// The upper triangle over the last two axes (numpy's `triu`): elements with
    /// `column - row >= k` kept, the rest zero (false for bool).
    #[track_caller]
    pub fn triu(&self, k: i64) -> Tensor {
        self.triangle("triu", k, Location::caller())
    }

    /// `where(cols - rows <= k, x, 0)` (tril) or `>= k` (triu), the positions from iotas.
    fn triangle(&self, op: &'static str, k: i64, at: &'static Location<'static>) -> Tensor {
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let d = ty.shape.dims();
        if d.len() < 2 {
            return self.fail(
                IrError::BadDType {
                    op,
                    operand: ty,
                    why: "it takes a tensor of 2 axes or more (rows and columns last)",
                },
                at,
            );
        }
        let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
        let rows = iota_at(&self.ctx, m, 0, 1, at).expand_dims(-1);
        let cols = iota_at(&self.ctx, n, 0, 1, at);
        let diff = &cols - &rows;
        let keep = if op == "tril" { diff.le(k) } else { diff.ge(k) };
        let zero = if ty.dtype == DType::Bool {
            Operand::from(false)
        } else {
            Operand::from(0i64)
        };
        keep.where_(self, zero)
    }
}

/// [`Tensor::one_hot`] as a free function: `one_hot(idx, n)`.
#[track_caller]
pub fn one_hot(idx: &Tensor, n: usize) -> Tensor {
    idx.one_hot(n)
}

/// [`Tensor::tril`] as a free function (numpy spelling).
#[track_caller]
pub fn tril(x: &Tensor, k: i64) -> Tensor {
    x.tril(k)
}

/// [`Tensor::triu`] as a free function (numpy spelling).
#[track_caller]
pub fn triu(x: &Tensor, k: i64) -> Tensor {
    x.triu(k)
}
