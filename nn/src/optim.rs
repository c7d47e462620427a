//! Optimisers: SGD (with momentum, Nesterov, weight decay), Adam and AdamW, with weight
//! decay masks and global-norm gradient clipping. A step is a
//! lazy graph: the new value of every parameter and every state tensor from the
//! gradients, built here and evaluated by the caller (the training step evaluates it in
//! the same graph as the forward and backward passes, so each parameter's update fuses
//! into one kernel). The step's rate and Adam's bias corrections change every step, so
//! they enter as data (0-d leaves), never as constants: the compiled graph stays the
//! same from step to step.
//!
//! Mixed precision: parameters and state are f32 master copies in a half-precision
//! context (see [`Parameter::new`]), and in an f16 context the optimiser scales the
//! loss dynamically ([`LossScale`]): [`Optimizer::gradients`] takes the gradients of
//! the loss times the scale and divides them back, and [`Optimizer::update`] keeps the
//! old parameters and state, by a select in the same graph, when a gradient is not
//! finite; [`Optimizer::commit_checked`] then counts the step as skipped.

use crate::error::{Error, Result};
use crate::loss_scale::LossScale;
use crate::param::Parameter;
use crate::schedule::Schedule;
use ndfuse::{Array, Context, DType, Tensor};
use ndfuse_ir::{HostArray, Shape};

/// The update rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    /// `b = momentum * b + (1 - dampening) * g`; the step is `b`, or `g + momentum * b`
    /// with Nesterov; plain SGD when `momentum` is 0. The buffer starts at zero, so with
    /// `dampening` 0 the first step is PyTorch's (which starts the buffer at `g`).
    Sgd {
        /// The momentum factor (0: none).
        momentum: f64,
        /// The share of the gradient not added to the buffer.
        dampening: f64,
        /// Nesterov's look-ahead form.
        nesterov: bool,
    },
    /// Kingma and Ba (2015), PyTorch's form: weight decay (if any) is added to the
    /// gradient (L2 regularisation).
    Adam {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the square root of the second moment.
        eps: f64,
    },
    /// Loshchilov and Hutter (2019): Adam with decoupled weight decay,
    /// `p = p * (1 - rate * weight_decay)` before the Adam step.
    AdamW {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the square root of the second moment.
        eps: f64,
    },
}

impl Method {
    /// The names of the state tensors kept per parameter.
    fn slots(&self) -> &'static [&'static str] {
        match self {
            Method::Sgd { momentum, .. } if *momentum == 0.0 => &[],
            Method::Sgd { .. } => &["momentum"],
            Method::Adam { .. } | Method::AdamW { .. } => &["m", "v"],
        }
    }

    /// The name used in reports and checkpoints.
    pub fn name(&self) -> &'static str {
        match self {
            Method::Sgd { .. } => "sgd",
            Method::Adam { .. } => "adam",
            Method::AdamW { .. } => "adamw",
        }
    }
}

/// The lazy result of one step: the new value of each parameter and of each state
/// tensor, in the orders of [`Optimizer::parameters`] and [`Optimizer::state`].
#[derive(Debug, Clone)]
pub struct Update {
    /// New parameter values.
    pub params: Vec<Tensor>,
    /// New optimiser state.
    pub state: Vec<Tensor>,
    /// The step's scalars, the data leaves the update reads: (dtype, role, leaf).
    /// Their values at a later step are [`Optimizer::scalar`] of the role.
    pub scalars: Vec<(DType, &'static str, Tensor)>,
    /// With loss scaling, whether every gradient was finite (a 0-d bool): when it is
    /// false, `params` and `state` are the old values, and the step is to be committed
    /// as skipped ([`Optimizer::commit_checked`]). `None` without loss scaling.
    pub finite: Option<Tensor>,
}

/// Gradients for [`Optimizer::update`] and the data leaves they read (the loss scale,
/// when scaling): [`Optimizer::gradients`]'s result.
#[derive(Debug, Clone)]
pub struct Gradients {
    /// One per parameter asked for, of the loss itself (unscaled).
    pub grads: Vec<Tensor>,
    /// The step scalars the graph reads: (dtype, role, leaf), as in [`Update::scalars`].
    pub scalars: Vec<(DType, &'static str, Tensor)>,
}

/// An optimiser over a fixed list of parameters, with its state and step count.
///
/// ```
/// use ndfuse_nn::{Optimizer, Parameter};
/// let ctx = ndfuse::Context::new();
/// let w = Parameter::new("w", &ctx.from_vec(vec![1.0f32, -2.0], &[2])?)?;
/// let mut opt = Optimizer::sgd(&[w.clone()], 0.5);
/// // loss = sum(w^2): gradient 2w, so w <- w - 0.5 * 2w = 0.
/// let loss = w.value().square().sum(..);
/// let g = ndfuse::grad(&loss, &[&w.value()])?;
/// opt.step(&g)?;
/// assert_eq!(w.array()?.to_vec::<f32>()?, vec![0.0, 0.0]);
/// # Ok::<(), ndfuse_nn::Error>(())
/// ```
#[derive(Debug)]
pub struct Optimizer {
    method: Method,
    schedule: Schedule,
    weight_decay: f64,
    /// Whether parameter `i` takes weight decay (all by default; see
    /// [`Optimizer::no_decay`]).
    decay: Vec<bool>,
    /// The global gradient norm the step clips to, if any.
    clip: Option<f64>,
    params: Vec<Parameter>,
    /// `state[i][k]`: slot `k` of parameter `i` (zeros until the first step).
    state: Vec<Vec<Tensor>>,
    steps: u64,
    /// Dynamic loss scaling, if on (by default in an f16 context).
    scaler: Option<LossScale>,
}

impl Optimizer {
    fn with(method: Method, params: &[Parameter], rate: f64) -> Optimizer {
        let state = params
            .iter()
            .map(|p| {
                let v = p.value();
                let ctx = v.context();
                method
                    .slots()
                    .iter()
                    // Zeros as data, not a constant: the first step's graph is then
                    // the graph of every step, compiled once.
                    // Evaluated, so the buffers come from the host cache and go back
                    // to it: the second step then allocates nothing either.
                    // (When memory runs out here, the lazy zeros stay: the step that
                    // needs them reports the failure as an error.)
                    .map(|_| {
                        let zeros = ctx.full_dtype(&p.shape(), 0.0, p.dtype());
                        zeros.eval().map_or(zeros, |a| ctx.tensor(a))
                    })
                    .collect()
            })
            .collect();
        Optimizer {
            method,
            schedule: Schedule::Constant(rate),
            weight_decay: 0.0,
            decay: vec![true; params.len()],
            clip: None,
            params: params.to_vec(),
            state,
            steps: 0,
            // f16's range needs the loss scaled; bf16 has f32's exponent range.
            scaler: params
                .iter()
                .any(|p| p.value().context().default_dtype() == DType::F16)
                .then(LossScale::new),
        }
    }

    /// Plain SGD with rate `rate` (add [`Optimizer::momentum`], [`Optimizer::nesterov`]).
    pub fn sgd(params: &[Parameter], rate: f64) -> Optimizer {
        let sgd = Method::Sgd {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
        };
        Optimizer::with(sgd, params, rate)
    }

    /// Adam with rate `rate`, betas (0.9, 0.999) and eps 1e-8 (PyTorch's defaults).
    pub fn adam(params: &[Parameter], rate: f64) -> Optimizer {
        let adam = Method::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        Optimizer::with(adam, params, rate)
    }

    /// AdamW with rate `rate`, decoupled weight decay `weight_decay`, betas (0.9, 0.999)
    /// and eps 1e-8.
    pub fn adamw(params: &[Parameter], rate: f64, weight_decay: f64) -> Optimizer {
        let adamw = Method::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        Optimizer::with(adamw, params, rate).weight_decay(weight_decay)
    }

    /// SGD's momentum factor (state is made when it becomes non-zero).
    pub fn momentum(mut self, momentum: f64) -> Optimizer {
        if let Method::Sgd {
            momentum: m,
            dampening,
            nesterov,
        } = self.method
        {
            let was = m;
            self.method = Method::Sgd {
                momentum,
                dampening,
                nesterov,
            };
            if (was == 0.0) != (momentum == 0.0) {
                let (decay, clip, scaler) = (self.decay.clone(), self.clip, self.scaler.take());
                self = Optimizer::with(self.method, &self.params, 0.0)
                    .schedule(self.schedule.clone())
                    .weight_decay(self.weight_decay);
                (self.decay, self.clip, self.scaler) = (decay, clip, scaler);
            }
        }
        self
    }

    /// SGD's dampening.
    pub fn dampening(mut self, dampening: f64) -> Optimizer {
        if let Method::Sgd { dampening: d, .. } = &mut self.method {
            *d = dampening;
        }
        self
    }

    /// SGD with Nesterov momentum.
    pub fn nesterov(mut self, on: bool) -> Optimizer {
        if let Method::Sgd { nesterov, .. } = &mut self.method {
            *nesterov = on;
        }
        self
    }

    /// Adam's and AdamW's moment decays.
    pub fn betas(mut self, b1: f64, b2: f64) -> Optimizer {
        if let Method::Adam { beta1, beta2, .. } | Method::AdamW { beta1, beta2, .. } =
            &mut self.method
        {
            (*beta1, *beta2) = (b1, b2);
        }
        self
    }

    /// Adam's and AdamW's eps.
    pub fn eps(mut self, e: f64) -> Optimizer {
        if let Method::Adam { eps, .. } | Method::AdamW { eps, .. } = &mut self.method {
            *eps = e;
        }
        self
    }

    /// Weight decay: added to the gradient (SGD, Adam) or decoupled (AdamW).
    pub fn weight_decay(mut self, weight_decay: f64) -> Optimizer {
        self.weight_decay = weight_decay;
        self
    }

    /// Exempts from weight decay every parameter for which `exempt` is true (the others
    /// keep theirs). GPT-2's recipe (nanoGPT's) decays only the matrices and embedding
    /// tables, not biases and normalisation scales:
    ///
    /// ```
    /// use ndfuse_nn::{Optimizer, Parameter};
    /// let ctx = ndfuse::Context::new();
    /// let w = Parameter::new("w", &ctx.ones(&[2, 2]))?;
    /// let b = Parameter::new("b", &ctx.ones(&[2]))?;
    /// let opt = Optimizer::adamw(&[w, b], 1e-3, 0.1).no_decay(|p| p.shape().len() < 2);
    /// assert_eq!(opt.decays(), &[true, false]);
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn no_decay(mut self, exempt: impl Fn(&Parameter) -> bool) -> Optimizer {
        for (d, p) in self.decay.iter_mut().zip(&self.params) {
            *d = *d && !exempt(p);
        }
        self
    }

    /// Which parameters take weight decay, in order.
    pub fn decays(&self) -> &[bool] {
        &self.decay
    }

    /// Clips the gradients to a global norm of `max_norm` before every step, as torch's
    /// `clip_grad_norm_` does (see [`clip_grad_norm`]): in the step's graph, so the step
    /// stays one compiled graph.
    pub fn clip_grad_norm(mut self, max_norm: f64) -> Optimizer {
        self.clip = Some(max_norm);
        self
    }

    /// The global norm the gradients are clipped to, if any.
    pub fn max_grad_norm(&self) -> Option<f64> {
        self.clip
    }

    /// Dynamic loss scaling with `scale`'s settings and state (`LossScale::new()`: start
    /// at 2^16, double after 2000 finite steps), or none. On by default when a
    /// parameter's context has f16 as its default dtype; bf16 needs none (it has f32's
    /// exponent range). Set it before the first step: a trainer's compiled step keeps
    /// the setting it was compiled with.
    ///
    /// ```
    /// use ndfuse::DType;
    /// use ndfuse_nn::{LossScale, Optimizer, Parameter};
    /// let ctx = ndfuse::Context::builder().dtype(DType::F16).build()?;
    /// let w = Parameter::new("w", &ctx.ones(&[2]))?;
    /// let opt = Optimizer::adam(&[w.clone()], 1e-3);
    /// assert_eq!((w.dtype(), opt.loss_scale()), (DType::F32, 65536.0));
    /// let opt = opt.with_loss_scale(Some(LossScale::new().growth_interval(100)));
    /// assert_eq!(opt.loss_scaler().map(LossScale::interval), Some(100));
    /// # Ok::<(), ndfuse_nn::Error>(())
    /// ```
    pub fn with_loss_scale(mut self, scale: Option<LossScale>) -> Optimizer {
        self.scaler = scale;
        self
    }

    /// The loss-scaling state, if scaling is on.
    pub fn loss_scaler(&self) -> Option<&LossScale> {
        self.scaler.as_ref()
    }

    /// The loss-scaling state, to change between steps ([`LossScale::set_scale`]).
    pub fn loss_scaler_mut(&mut self) -> Option<&mut LossScale> {
        self.scaler.as_mut()
    }

    /// The scale the next step multiplies the loss by (1 without scaling).
    pub fn loss_scale(&self) -> f64 {
        self.scaler.as_ref().map_or(1.0, LossScale::scale)
    }

    /// The steps skipped so far because a gradient was not finite (0 without scaling).
    pub fn skipped_steps(&self) -> u64 {
        self.scaler.as_ref().map_or(0, LossScale::skipped_steps)
    }

    /// The learning-rate schedule (replaces the constant rate given at construction).
    pub fn schedule(mut self, schedule: impl Into<Schedule>) -> Optimizer {
        self.schedule = schedule.into();
        self
    }

    /// The rule.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The parameters this optimiser updates.
    pub fn parameters(&self) -> &[Parameter] {
        &self.params
    }

    /// Steps taken so far (skipped ones not counted).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the step count (the schedule's position and Adam's bias corrections), as
    /// replicas kept in step by data-parallel training need.
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    /// The learning rate the next step uses.
    pub fn rate(&self) -> f64 {
        self.schedule.rate(self.steps)
    }

    /// The state tensors with their names (`fc0.weight.m`, ...), parameter by parameter.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let slots = self.method.slots();
        self.params
            .iter()
            .zip(&self.state)
            .flat_map(|(p, s)| {
                s.iter()
                    .zip(slots)
                    .map(move |(t, k)| (format!("{}.{k}", p.name()), t.clone()))
            })
            .collect()
    }

    /// The gradients of `loss` with respect to `wrt` (lazy), as [`Optimizer::update`]
    /// takes them. With loss scaling they are taken of `loss * S`, `S` a 0-d f32 data
    /// leaf (role `loss_scale`, in the returned scalars) holding
    /// [`Optimizer::loss_scale`], and multiplied by `1 / S` (role `inv_loss_scale`, in
    /// f32 at least) again, so that
    /// the backward pass of an f16 model runs on gradients `S` times larger: those too
    /// small for f16 survive, and those that overflow make the step's gradients
    /// non-finite, which the update detects. Without scaling: `ndfuse::grad`.
    pub fn gradients(&self, loss: &Tensor, wrt: &[&Tensor]) -> Result<Gradients> {
        let Some(scaler) = &self.scaler else {
            return Ok(Gradients {
                grads: ndfuse::grad(loss, wrt)?,
                scalars: Vec::new(),
            });
        };
        let s = scalar_leaf(loss.context(), DType::F32, scaler.scale());
        let inv = scalar_leaf(loss.context(), DType::F32, 1.0 / scaler.scale());
        let grads = ndfuse::grad(&(loss * &s), wrt)?
            .into_iter()
            .map(|g| {
                let d = g.dtype()?;
                let wide = if d == DType::F64 { d } else { DType::F32 };
                // S is a power of two: multiplying by 1 / S is exact (short of
                // underflow), and a product is cheaper than a quotient.
                Ok((&g.cast(wide) * &inv).cast(d))
            })
            .collect::<Result<_>>()?;
        Ok(Gradients {
            grads,
            scalars: vec![
                (DType::F32, "loss_scale", s),
                (DType::F32, "inv_loss_scale", inv),
            ],
        })
    }

    /// The lazy new parameters and state after a step with `grads` (one per parameter,
    /// in order; with loss scaling, the unscaled gradients [`Optimizer::gradients`]
    /// gives). Nothing changes until [`Optimizer::commit`] or
    /// [`Optimizer::commit_checked`].
    pub fn update(&self, grads: &[Tensor]) -> Result<Update> {
        if grads.len() != self.params.len() {
            return Err(Error::Argument {
                what: "Optimizer::update",
                why: format!(
                    "{} gradients for {} parameters",
                    grads.len(),
                    self.params.len()
                ),
            });
        }
        // With loss scaling: a step whose gradients are not all finite keeps the old
        // values, by a select in the graph (no host round trip before the update).
        // The sum of the gradients' squares serves both: its square root is the norm
        // clipping divides by, and it is finite exactly when every gradient is (short
        // of an f32 overflow of the squares, gradients beyond 1e19, which would not
        // make a sane step either). One pass over the gradients, not two.
        let squares = (self.scaler.is_some() || self.clip.is_some())
            .then(|| sum_of_squares(grads))
            .flatten();
        let finite = match (&self.scaler, &squares) {
            (Some(_), Some(sq)) => Some(sq.lt(f64::INFINITY)),
            (Some(_), None) => Some(Context::global().full_dtype(&[], 1.0, DType::Bool)),
            (None, _) => None,
        };
        let keep = |new: Tensor, old: &Tensor| match &finite {
            Some(f) => f.where_(&new, old),
            None => new,
        };
        let clipped;
        let grads = match (self.clip, &squares) {
            (Some(max_norm), Some(sq)) => {
                clipped = clip_by_norm(grads, max_norm, &sq.sqrt());
                &clipped[..]
            }
            _ => grads,
        };
        let mut scalars = Scalars::default();
        let (mut params, mut state) = (Vec::new(), Vec::new());
        let items = self.params.iter().zip(grads).zip(&self.state);
        for (((p, g), s), &decays) in items.zip(&self.decay) {
            let p = p.value();
            let ctx = p.context().clone();
            let dtype = p.dtype()?;
            let mut data = |role| scalars.get(&ctx, dtype, role, self.scalar(role));
            let wd = if decays { self.weight_decay } else { 0.0 };
            match self.method {
                Method::Sgd {
                    momentum,
                    dampening,
                    nesterov,
                } => {
                    let d = if wd != 0.0 { g + &(&p * wd) } else { g.clone() };
                    let d = if momentum == 0.0 {
                        d
                    } else {
                        let b = &(&s[0] * momentum) + &(&d * (1.0 - dampening));
                        state.push(keep(b.clone(), &s[0]));
                        if nesterov {
                            &d + &(&b * momentum)
                        } else {
                            b
                        }
                    };
                    params.push(keep(&p - &(&d * &data("rate")), &p));
                }
                Method::Adam { beta1, beta2, eps } | Method::AdamW { beta1, beta2, eps } => {
                    let decoupled = matches!(self.method, Method::AdamW { .. });
                    let g = if wd != 0.0 && !decoupled {
                        g + &(&p * wd)
                    } else {
                        g.clone()
                    };
                    let m = &(&s[0] * beta1) + &(&g * (1.0 - beta1));
                    let v = &(&s[1] * beta2) + &(&g.square() * (1.0 - beta2));
                    // PyTorch's form: p -= rate / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
                    let step =
                        &(&m * &data("rate_over_bc1")) / &(&v.sqrt() * &data("inv_sqrt_bc2") + eps);
                    let base = if decoupled && wd != 0.0 {
                        &p * &data("decay")
                    } else {
                        p.clone()
                    };
                    params.push(keep(&base - &step, &p));
                    state.push(keep(m, &s[0]));
                    state.push(keep(v, &s[1]));
                }
            }
        }
        Ok(Update {
            params,
            state,
            scalars: scalars.0,
            finite,
        })
    }

    /// The value of the step scalar `role` at the current step: `rate` (the
    /// schedule's), Adam's `rate_over_bc1` and `inv_sqrt_bc2` (the bias corrections of
    /// step t + 1), AdamW's `decay` (`1 - rate * weight_decay`), `loss_scale` (see
    /// [`Optimizer::gradients`]) and `inv_loss_scale`. Unknown roles are NaN.
    pub fn scalar(&self, role: &str) -> f64 {
        let rate = self.schedule.rate(self.steps);
        let n = i32::try_from(self.steps + 1).unwrap_or(i32::MAX);
        let (beta1, beta2) = match self.method {
            Method::Adam { beta1, beta2, .. } | Method::AdamW { beta1, beta2, .. } => {
                (beta1, beta2)
            }
            Method::Sgd { .. } => (0.0, 0.0),
        };
        match role {
            "rate" => rate,
            "rate_over_bc1" => rate / (1.0 - beta1.powi(n)),
            "inv_sqrt_bc2" => 1.0 / (1.0 - beta2.powi(n)).sqrt(),
            "decay" => 1.0 - rate * self.weight_decay,
            "loss_scale" => self.loss_scale(),
            "inv_loss_scale" => 1.0 / self.loss_scale(),
            _ => f64::NAN,
        }
    }

    /// Takes a step's evaluated results: `params` replace the parameters' values and
    /// `state` the optimiser's (both moved, no copy), and the step count advances. `Err`
    /// (changing nothing) when the counts or shapes do not match. With loss scaling the
    /// step counts as finite ([`Optimizer::commit_checked`] takes the flag).
    pub fn commit(&mut self, params: Vec<Array>, state: Vec<Array>) -> Result<()> {
        self.commit_checked(params, state, true)
    }

    /// [`Optimizer::commit`] of a step whose gradients were all finite or not
    /// ([`Update::finite`]). A step that was not is skipped: the parameters, the state
    /// and the step count (the schedule's position, Adam's bias corrections) stay as
    /// they were, bit for bit; the loss scale halves and the skip is counted
    /// ([`Optimizer::skipped_steps`]). A finite step counts towards the scale's growth.
    /// Without loss scaling, `finite` false skips the step as well, uncounted.
    pub fn commit_checked(
        &mut self,
        params: Vec<Array>,
        state: Vec<Array>,
        finite: bool,
    ) -> Result<()> {
        let slots = self.method.slots().len();
        if params.len() != self.params.len() || state.len() != self.params.len() * slots {
            return Err(Error::Argument {
                what: "Optimizer::commit",
                why: format!(
                    "{} parameters and {} state tensors for {} parameters with {slots} state tensors each",
                    params.len(),
                    state.len(),
                    self.params.len()
                ),
            });
        }
        self.check_state(&state)?;
        for (p, a) in self.params.iter().zip(&params) {
            if a.shape() != p.shape().as_slice() || a.dtype() != p.dtype() {
                return Err(mismatch(p.name(), p, a));
            }
        }
        if let Some(scaler) = &mut self.scaler {
            scaler.record(finite);
        }
        if !finite {
            return Ok(());
        }
        for (p, a) in self.params.iter().zip(params) {
            p.replace(a)?;
        }
        self.set_state(state);
        self.steps += 1;
        Ok(())
    }

    /// Evaluates a step with `grads` on its own and commits it (a training step that
    /// evaluates the forward and backward passes in the same graph calls
    /// [`Optimizer::update`] and [`Optimizer::commit`] itself).
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        let Update {
            params,
            state,
            finite,
            ..
        } = self.update(grads)?;
        let Some(first) = self.params.first() else {
            return Ok(());
        };
        let ctx = first.value().context().clone();
        let all: Vec<&Tensor> = params.iter().chain(&state).chain(&finite).collect();
        let mut out = ctx.eval(&all)?;
        let finite = match finite {
            Some(_) => out.pop().is_some_and(|f| flag(&f)),
            None => true,
        };
        let state_out = out.split_off(params.len());
        self.commit_checked(out, state_out, finite)
    }

    /// A replica over `params` (another model's parameters, in the same order and of the
    /// same shapes): the same rule, schedule and step count, its state starting at this
    /// one's (shared data, no copy). `Err` when the parameters do not match.
    pub fn replica(&self, params: &[Parameter]) -> Result<Optimizer> {
        let same = params.len() == self.params.len()
            && params
                .iter()
                .zip(&self.params)
                .all(|(a, b)| a.shape() == b.shape() && a.dtype() == b.dtype());
        if !same {
            return Err(Error::Argument {
                what: "Optimizer::replica",
                why: "the parameters differ in number, shape or dtype from the optimiser's".into(),
            });
        }
        Ok(Optimizer {
            method: self.method,
            schedule: self.schedule.clone(),
            weight_decay: self.weight_decay,
            decay: self.decay.clone(),
            clip: self.clip,
            params: params.to_vec(),
            state: self.state.clone(),
            steps: self.steps,
            scaler: self.scaler.clone(),
        })
    }

    /// Sets the state to `state` (data tensors, shared, in the order of
    /// [`Optimizer::state`]), as averaging replicas does. `Err` naming the tensor and
    /// both shapes when one differs, and then nothing changes.
    pub fn share_state(&mut self, state: &[Tensor]) -> Result<()> {
        let current = self.state();
        if state.len() != current.len() {
            return Err(Error::Argument {
                what: "Optimizer::share_state",
                why: format!("{} state tensors; {} expected", state.len(), current.len()),
            });
        }
        for ((name, old), new) in current.iter().zip(state) {
            if old.shape().ok() != new.shape().ok()
                || old.dtype().ok() != new.dtype().ok()
                || !new.is_data()
            {
                return Err(Error::Argument {
                    what: "Optimizer::share_state",
                    why: format!(
                        "`{name}` is {:?}{:?}; the value given is {:?}{:?} (data: {})",
                        old.dtype().ok(),
                        old.shape().ok(),
                        new.dtype().ok(),
                        new.shape().ok(),
                        new.is_data()
                    ),
                });
            }
        }
        let mut it = state.iter();
        for s in &mut self.state {
            for slot in s.iter_mut() {
                if let Some(t) = it.next() {
                    *slot = t.clone();
                }
            }
        }
        Ok(())
    }

    /// Replaces the state and step count (from a checkpoint): `state` in the order of
    /// [`Optimizer::state`]. `Err` naming both shapes when one does not match, and then
    /// nothing changes.
    pub fn load_state(&mut self, state: Vec<Array>, steps: u64) -> Result<()> {
        if state.len() != self.params.len() * self.method.slots().len() {
            return Err(Error::Argument {
                what: "Optimizer::load_state",
                why: format!(
                    "{} state tensors; {} expected",
                    state.len(),
                    self.params.len() * self.method.slots().len()
                ),
            });
        }
        self.check_state(&state)?;
        self.set_state(state);
        self.steps = steps;
        Ok(())
    }

    fn check_state(&self, state: &[Array]) -> Result<()> {
        let slots = self.method.slots().len();
        for (i, a) in state.iter().enumerate() {
            let p = &self.params[i / slots.max(1)];
            if a.shape() != p.shape().as_slice() || a.dtype() != p.dtype() {
                return Err(mismatch(&self.state()[i].0, p, a));
            }
        }
        Ok(())
    }

    fn set_state(&mut self, state: Vec<Array>) {
        let slots = self.method.slots().len();
        let mut it = state.into_iter();
        for (p, s) in self.params.iter().zip(&mut self.state) {
            let ctx: Context = p.value().context().clone();
            for slot in s.iter_mut().take(slots) {
                if let Some(a) = it.next() {
                    *slot = ctx.tensor(a);
                }
            }
        }
    }
}

/// torch's `clip_grad_norm_` as lazy tensors: every gradient scaled by
/// `min(1, max_norm / (total + 1e-6))`, `total` the Euclidean norm of all of them
/// together; returns the scaled gradients and `total` (a 0-d tensor, f64 when a gradient
/// is f64, else f32, in which the squares are summed; in the global context when there
/// is no gradient).
///
/// ```
/// let ctx = ndfuse::Context::new();
/// let g = [ctx.from_vec(vec![3.0f32], &[1])?, ctx.from_vec(vec![4.0f32], &[1])?];
/// let (clipped, total) = ndfuse_nn::clip_grad_norm(&g, 1.0);
/// assert_eq!(total.eval()?.to_vec::<f32>()?, vec![5.0]);
/// assert!((clipped[1].eval()?.to_vec::<f32>()?[0] - 0.8).abs() < 1e-6);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[track_caller]
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> (Vec<Tensor>, Tensor) {
    let Some(total) = sum_of_squares(grads).map(|sq| sq.sqrt()) else {
        // No gradient: a norm of 0, in the global context (there is no other).
        return (
            Vec::new(),
            Context::global().full_dtype(&[], 0.0, accumulator(grads)),
        );
    };
    (clip_by_norm(grads, max_norm, &total), total)
}

/// The dtype gradients' squares are summed in: f64 when a gradient is f64, else f32.
fn accumulator(grads: &[Tensor]) -> DType {
    let wide = grads.iter().any(|g| g.dtype().ok() == Some(DType::F64));
    if wide {
        DType::F64
    } else {
        DType::F32
    }
}

/// The sum of the squares of every element of every gradient, a 0-d tensor in
/// [`accumulator`]'s dtype (`None` for no gradient): NaN or infinite when an element is.
#[track_caller]
fn sum_of_squares(grads: &[Tensor]) -> Option<Tensor> {
    let acc = accumulator(grads);
    grads
        .iter()
        // Squared in the wide dtype: an f16 gradient of 300 would overflow its square.
        .map(|g| g.cast(acc).square().sum(..))
        .reduce(|a, b| &a + &b)
}

/// Every gradient scaled by `min(1, max_norm / (total + 1e-6))`.
#[track_caller]
fn clip_by_norm(grads: &[Tensor], max_norm: f64, total: &Tensor) -> Vec<Tensor> {
    let factor = ((total + 1e-6).recip() * max_norm).minimum(1.0);
    grads
        .iter()
        .map(|g| g * &factor.cast(g.dtype().unwrap_or(DType::F32)))
        .collect()
}

/// The value of an evaluated 0-d bool (false when it is not one).
pub(crate) fn flag(a: &Array) -> bool {
    a.to_f64_vec().first().is_some_and(|&v| v != 0.0)
}

fn mismatch(name: &str, p: &Parameter, a: &Array) -> Error {
    Error::Argument {
        what: "Optimizer",
        why: format!(
            "`{name}` is {}{:?} in the model; the value given is {}{:?}",
            p.dtype(),
            p.shape(),
            a.dtype(),
            a.shape()
        ),
    }
}

/// The step's scalars as 0-d data tensors, one per (dtype, role), shared by every
/// parameter's update. Keyed by role, not value: two roles that happen to share a value
/// at one step must still be two leaves, or the graph would change from step to step.
#[derive(Default)]
struct Scalars(Vec<(DType, &'static str, Tensor)>);

impl Scalars {
    fn get(&mut self, ctx: &Context, dtype: DType, role: &'static str, v: f64) -> Tensor {
        if let Some((_, _, t)) = self.0.iter().find(|(d, r, _)| *d == dtype && *r == role) {
            return t.clone();
        }
        // Rounded into the parameter's dtype here: a cast node would be a kernel of
        // its own, shared by every parameter's update.
        let t = scalar_leaf(ctx, dtype, v);
        self.0.push((dtype, role, t.clone()));
        t
    }
}

/// A 0-d data tensor of `dtype` holding `v` (rounded into the dtype): a step scalar.
pub(crate) fn scalar_leaf(ctx: &Context, dtype: DType, v: f64) -> Tensor {
    let a = HostArray::from_f64s(dtype, Shape::scalar(), &[v]);
    ctx.tensor(Array::from_host(a))
}
