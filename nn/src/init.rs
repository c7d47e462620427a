//! Seeded initialisers: Glorot (Xavier) and He (Kaiming), uniform and normal, and
//! constants. The same seed gives the same bits in every release: the draws come from
//! the frontend's hand-written generator, not from a dependency. In a context whose
//! default dtype is f16 or bf16 the draws are f32 (the parameters' master dtype), the
//! same bits an f32 context draws from the seed.

use crate::param::Parameter;
use ndfuse::{Context, Tensor};

/// How a parameter's first values are drawn. `fan_in` and `fan_out` are the layer's
/// input and output widths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Every element `value`.
    Constant(f64),
    /// Glorot and Bengio (2010): uniform in `±sqrt(6 / (fan_in + fan_out))`.
    GlorotUniform,
    /// Glorot and Bengio (2010): normal with std `sqrt(2 / (fan_in + fan_out))`.
    GlorotNormal,
    /// He et al. (2015), for ReLU layers: uniform in `±sqrt(6 / fan_in)`.
    HeUniform,
    /// He et al. (2015), for ReLU layers: normal with std `sqrt(2 / fan_in)`.
    HeNormal,
    /// Uniform in `[low, high)`.
    Uniform(f64, f64),
    /// Normal with this mean and std.
    Normal(f64, f64),
}

impl Init {
    /// A data tensor of `shape` in the dtype `ctx` keeps parameters in
    /// ([`Parameter::master_dtype`]: the default dtype, or f32 when that is f16 or
    /// bf16), drawn from `seed`.
    ///
    /// ```
    /// use ndfuse_nn::Init;
    /// let ctx = ndfuse::Context::new();
    /// let w = Init::GlorotUniform.tensor(&ctx, &[64, 128], 64, 128, 7).eval()?;
    /// let bound = (6.0f32 / 192.0).sqrt();
    /// assert!(w.as_slice::<f32>()?.iter().all(|v| v.abs() <= bound));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn tensor(
        &self,
        ctx: &Context,
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        seed: u64,
    ) -> Tensor {
        let dtype = Parameter::master_dtype(ctx);
        if dtype == ctx.default_dtype() {
            return self.draw(ctx, shape, fan_in, fan_out, seed);
        }
        // Drawn where the default dtype is the master dtype (the generator draws in the
        // default dtype), then moved into `ctx` as data.
        let wide = Context::builder()
            .dtype(dtype)
            .backend(ctx.backend())
            .build();
        match wide.map(|w| self.draw(&w, shape, fan_in, fan_out, seed).eval()) {
            Ok(Ok(a)) => ctx.tensor(a),
            // Out of memory, say: the draw in `ctx`, widened, carries the error on.
            _ => self.draw(ctx, shape, fan_in, fan_out, seed).cast(dtype),
        }
    }

    fn draw(
        &self,
        ctx: &Context,
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        seed: u64,
    ) -> Tensor {
        let (fi, fo) = (fan_in.max(1) as f64, fan_out.max(1) as f64);
        match *self {
            Init::Constant(v) => ctx.full(shape, v),
            Init::GlorotUniform => {
                let a = (6.0 / (fi + fo)).sqrt();
                ctx.rand_uniform(shape, -a, a, seed)
            }
            Init::GlorotNormal => ctx.rand_normal(shape, 0.0, (2.0 / (fi + fo)).sqrt(), seed),
            Init::HeUniform => {
                let a = (6.0 / fi).sqrt();
                ctx.rand_uniform(shape, -a, a, seed)
            }
            Init::HeNormal => ctx.rand_normal(shape, 0.0, (2.0 / fi).sqrt(), seed),
            Init::Uniform(low, high) => ctx.rand_uniform(shape, low, high, seed),
            Init::Normal(mean, std) => ctx.rand_normal(shape, mean, std, seed),
        }
    }
}
