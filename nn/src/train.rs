//! The training loop: a step evaluates the forward pass, the loss, the gradients and
//! the optimiser's update as one graph (so the backward pass and the update fuse like
//! any graph), then moves the new parameters and state in. Evaluation, epochs, history,
//! checkpoints and the progress bar sit on top of the step.

use crate::checkpoint::{load, save};
use crate::data::hash64;
use crate::error::{Error, Result};
use crate::layers::{Layer, Mode};
use crate::loss::{accuracy, cross_entropy_with_logits, mse};
use crate::optim::{flag, scalar_leaf, Gradients, Optimizer, Update};
use crate::param::Parameter;
use ndfuse::{Array, Compiled, Context, Report, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// What a model's output is scored with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// [`cross_entropy_with_logits`]; labels are class indices (accuracy is reported).
    CrossEntropy,
    /// [`mse`]; labels are targets of the output's shape.
    Mse,
}

impl Loss {
    /// The loss of `output` against `labels`, a lazy 0-d tensor.
    pub fn of(&self, output: &Tensor, labels: &Tensor) -> Tensor {
        match self {
            Loss::CrossEntropy => cross_entropy_with_logits(output, labels),
            Loss::Mse => mse(output, labels),
        }
    }
}

/// A model's scores on some data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    /// The mean loss per sample.
    pub loss: f64,
    /// The fraction classified right (cross-entropy only).
    pub accuracy: Option<f64>,
    /// The samples scored.
    pub samples: usize,
}

/// A model, its optimiser and its loss: what one training step needs.
///
/// ```
/// use ndfuse_nn::{Activation, Loss, Optimizer, Sequential, Trainer, Layer};
/// let ctx = ndfuse::Context::new();
/// let model = Sequential::mlp(&ctx, &[2, 8, 1], Activation::Tanh, 1)?;
/// let opt = Optimizer::adam(&model.parameters(), 0.05);
/// let mut t = Trainer::new(model, opt, Loss::Mse)?;
/// let x = ndfuse::Array::from_vec(vec![0.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], &[4, 2])?;
/// let y = ndfuse::Array::from_vec(vec![0.0f32, 1.0, 1.0, 0.0], &[4, 1])?;
/// let first = t.step(&x, &y)?;
/// let mut last = first;
/// for _ in 0..200 {
///     last = t.step(&x, &y)?;
/// }
/// assert!(last < first / 10.0, "xor: {first} -> {last}");
/// # Ok::<(), ndfuse_nn::Error>(())
/// ```
#[derive(Debug)]
pub struct Trainer<M: Layer> {
    ctx: Context,
    model: M,
    optimizer: Optimizer,
    loss: Loss,
    seed: u64,
    /// The step as a compiled graph, for batches of one type (see [`StepCache`]).
    cache: Option<StepCache>,
    /// [`Trainer::gradients`] and [`Trainer::apply_gradients`] compiled.
    grads_cache: Option<StepCache>,
    apply_cache: Option<StepCache>,
    /// Whether steps keep their compiled graph (on by default).
    reuse: bool,
}

/// The dtypes and shapes of a batch's features and labels.
type BatchType = [(ndfuse::DType, Vec<usize>); 2];

/// One training step lowered once: its slots are the batch, the step key, the
/// parameters, the optimiser state, the step scalars and the model's buffers, in that
/// order; a step with a batch of the same dtypes and shapes only binds new data to them.
#[derive(Debug, Clone)]
struct StepCache {
    /// The batch type it was compiled for (`None`: it reads no batch).
    batch: Option<BatchType>,
    step: Compiled,
    scalars: Vec<(ndfuse::DType, &'static str)>,
    /// Whether it was compiled with loss scaling (its last output is then the flag of
    /// finite gradients).
    scaled: bool,
}

impl StepCache {
    /// Whether this compiled step serves a batch of type `batch` with loss scaling on
    /// or off as `scaled` says.
    fn serves(&self, batch: &Option<BatchType>, scaled: bool) -> bool {
        self.batch.is_some() && self.batch == *batch && self.scaled == scaled
    }
}

impl<M: Layer> Trainer<M> {
    /// A trainer of `model` by `optimizer` (which must update exactly the model's
    /// parameters, in the model's order) on `loss`; the random seed (dropout) is 0.
    pub fn new(model: M, optimizer: Optimizer, loss: Loss) -> Result<Trainer<M>> {
        let params = model.parameters();
        let same = params.len() == optimizer.parameters().len()
            && params
                .iter()
                .zip(optimizer.parameters())
                .all(|(a, b)| a.same(b));
        if !same {
            return Err(Error::Argument {
                what: "Trainer::new",
                why: "the optimiser must update the model's parameters, in the order of model.parameters()".into(),
            });
        }
        let ctx = params
            .first()
            .map_or_else(Context::new, |p| p.value().context().clone());
        Ok(Trainer {
            ctx,
            model,
            optimizer,
            loss,
            seed: 0,
            cache: None,
            grads_cache: None,
            apply_cache: None,
            reuse: true,
        })
    }

    /// The seed of the step keys (dropout masks): step `t` uses a key drawn from
    /// `(seed, t)`, so a resumed run draws the masks a straight run would.
    pub fn seed(mut self, seed: u64) -> Trainer<M> {
        self.seed = seed;
        self
    }

    /// Whether a step reuses the graph the first step of its batch type compiled (on by
    /// default); off, every step builds, differentiates and lowers its graph again (the
    /// same results, more host time: for checking the reuse).
    pub fn reuse_steps(mut self, on: bool) -> Trainer<M> {
        self.reuse = on;
        self.forget_compiled();
        self
    }

    fn forget_compiled(&mut self) {
        (self.cache, self.grads_cache, self.apply_cache) = (None, None, None);
    }

    /// Evaluations of this trainer run in `ctx` (its backend or device set, and a thread
    /// bound there), wherever its parameters were made.
    pub fn in_context(mut self, ctx: Context) -> Trainer<M> {
        self.ctx = ctx;
        self.forget_compiled();
        self
    }

    /// A replica for another worker: the model duplicated ([`Layer::duplicate`]), the
    /// optimiser's state and step count shared, the same loss and seed, evaluated in
    /// `ctx`.
    pub fn replica(&self, ctx: Context) -> Result<Trainer<Box<dyn Layer>>> {
        let model = self.model.duplicate();
        let optimizer = self.optimizer.replica(&model.parameters())?;
        Ok(Trainer {
            ctx,
            model,
            optimizer,
            loss: self.loss,
            seed: self.seed,
            cache: None,
            grads_cache: None,
            apply_cache: None,
            reuse: self.reuse,
        })
    }

    /// The loss and the gradients of every parameter on `x`, `y` (a training-mode
    /// forward pass), evaluated as one graph, without changing anything: what
    /// synchronous data parallelism averages across workers. Compiled once per batch
    /// type, like a step. With loss scaling the gradients are taken of the scaled loss
    /// and scaled back ([`Optimizer::gradients`]): an overflow shows as a non-finite
    /// gradient, which [`Trainer::apply_gradients`] skips.
    pub fn gradients(&mut self, x: &Tensor, y: &Tensor) -> Result<(f64, Vec<Array>)> {
        let batch = self.batch_type(x, y)?;
        let key = self.step_key();
        let params = self.param_values();
        let buffers = self.buffer_values();
        let scaled = self.optimizer.loss_scaler().is_some();
        let hit = self
            .grads_cache
            .as_ref()
            .filter(|c| c.serves(&batch, scaled));
        let mut out = match hit {
            Some(c) => {
                let scalars = self.scalars_now(&c.scalars);
                let inputs: Vec<&Tensor> = [x, y, &key]
                    .into_iter()
                    .chain(&params)
                    .chain(&scalars)
                    .chain(&buffers)
                    .collect();
                c.step.run(&inputs)?
            }
            None => {
                let mode = Mode::train(key.clone());
                let loss = self.loss.of(&self.model.forward(x, &mode), y);
                let wrt: Vec<&Tensor> = params.iter().collect();
                let Gradients { grads, scalars } = self.optimizer.gradients(&loss, &wrt)?;
                let new_buffers = self.recorded_buffers(&mode, &buffers);
                let outputs: Vec<&Tensor> = std::iter::once(&loss)
                    .chain(&grads)
                    .chain(&new_buffers)
                    .collect();
                match batch {
                    Some(batch) => {
                        let inputs: Vec<&Tensor> = [x, y, &key]
                            .into_iter()
                            .chain(&params)
                            .chain(scalars.iter().map(|s| &s.2))
                            .chain(&buffers)
                            .collect();
                        let step = self.ctx.compile(&outputs, &inputs)?;
                        let out = step.run(&inputs)?;
                        self.grads_cache = Some(StepCache {
                            batch: Some(batch),
                            step,
                            scalars: scalars.iter().map(|s| (s.0, s.1)).collect(),
                            scaled,
                        });
                        out
                    }
                    None => self.ctx.eval(&outputs)?,
                }
            }
        };
        self.store_buffers(&mut out)?;
        let grads = out.split_off(1);
        Ok((out[0].to_f64_vec()[0], grads))
    }

    /// One optimiser step with the given gradients (one per parameter, in order, moved
    /// in), evaluated and committed. Compiled once. With loss scaling, a step with a
    /// gradient that is not finite is skipped ([`Optimizer::commit_checked`]).
    pub fn apply_gradients(&mut self, grads: Vec<Array>) -> Result<()> {
        let grads: Vec<Tensor> = grads.into_iter().map(|g| self.ctx.tensor(g)).collect();
        let params = self.param_values();
        let state = self.state_values();
        let scaled = self.optimizer.loss_scaler().is_some();
        let cached = self.apply_cache.as_ref().filter(|c| c.scaled == scaled);
        let mut out = match (cached, self.reuse) {
            (Some(c), true) => {
                let scalars = self.scalars_now(&c.scalars);
                let data: Vec<&Tensor> = grads
                    .iter()
                    .chain(&params)
                    .chain(&state)
                    .chain(&scalars)
                    .collect();
                c.step.run(&data)?
            }
            _ => {
                let update = self.optimizer.update(&grads)?;
                let outputs: Vec<&Tensor> = update
                    .params
                    .iter()
                    .chain(&update.state)
                    .chain(&update.finite)
                    .collect();
                let inputs: Vec<&Tensor> = grads
                    .iter()
                    .chain(&params)
                    .chain(&state)
                    .chain(update.scalars.iter().map(|s| &s.2))
                    .collect();
                let step = self.ctx.compile(&outputs, &inputs)?;
                let out = step.run(&inputs)?;
                if self.reuse {
                    self.apply_cache = Some(StepCache {
                        batch: None,
                        step,
                        scalars: update.scalars.iter().map(|s| (s.0, s.1)).collect(),
                        scaled: update.finite.is_some(),
                    });
                }
                out
            }
        };
        let finite = self.take_flag(&mut out, scaled);
        let state = out.split_off(self.optimizer.parameters().len());
        self.optimizer.commit_checked(out, state, finite)
    }

    /// The flag of finite gradients, the last of a step's outputs when the step was
    /// compiled with loss scaling (`scaled`), taken off them; `true` otherwise.
    fn take_flag(&self, out: &mut Vec<Array>, scaled: bool) -> bool {
        if !scaled {
            return true;
        }
        out.pop().is_some_and(|f| flag(&f))
    }

    /// The model's buffers' current values, in order ([`Layer::buffers`]).
    fn buffer_values(&self) -> Vec<Tensor> {
        self.model.buffers().iter().map(Parameter::value).collect()
    }

    /// Each buffer's new value as the training pass `mode` recorded it (the last
    /// record), or its value `now` when the pass recorded none.
    fn recorded_buffers(&self, mode: &Mode, now: &[Tensor]) -> Vec<Tensor> {
        let recorded = mode.recorded();
        self.model
            .buffers()
            .iter()
            .zip(now)
            .map(|(b, now)| {
                recorded
                    .iter()
                    .rev()
                    .find(|(r, _)| r.same(b))
                    .map_or_else(|| now.clone(), |(_, t)| t.clone())
            })
            .collect()
    }

    /// Takes the buffers' new values off the end of a step's outputs and stores them.
    fn store_buffers(&self, out: &mut Vec<Array>) -> Result<()> {
        let buffers = self.model.buffers();
        let values = out.split_off(out.len() - buffers.len());
        for (b, v) in buffers.iter().zip(values) {
            b.replace(v)?;
        }
        Ok(())
    }

    /// The parameters' current values, in order.
    fn param_values(&self) -> Vec<Tensor> {
        self.optimizer
            .parameters()
            .iter()
            .map(Parameter::value)
            .collect()
    }

    /// The optimiser state's current values, in order.
    fn state_values(&self) -> Vec<Tensor> {
        self.optimizer.state().into_iter().map(|(_, t)| t).collect()
    }

    /// The step scalars `roles` at the current step, as data leaves.
    fn scalars_now(&self, roles: &[(ndfuse::DType, &'static str)]) -> Vec<Tensor> {
        roles
            .iter()
            .map(|(dtype, role)| scalar_leaf(&self.ctx, *dtype, self.optimizer.scalar(role)))
            .collect()
    }

    /// The dtypes and shapes of a data batch, `None` for an expression batch (or with
    /// reuse off): the key of the compiled steps.
    fn batch_type(&self, x: &Tensor, y: &Tensor) -> Result<Option<BatchType>> {
        Ok(if x.is_data() && y.is_data() && self.reuse {
            Some([
                (x.dtype()?, x.shape()?.to_vec()),
                (y.dtype()?, y.shape()?.to_vec()),
            ])
        } else {
            None
        })
    }

    /// The seed of the step keys.
    pub fn random_seed(&self) -> u64 {
        self.seed
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The optimiser.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// The optimiser, to change (its schedule, say) between steps.
    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        &mut self.optimizer
    }

    /// The context the parameters live in (its backend runs every step).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The step's random seed, drawn from the trainer's seed and the step count.
    fn step_seed(&self) -> u64 {
        hash64(self.seed ^ hash64(self.optimizer.steps()))
    }

    /// The step's random key: a 0-d i64 data tensor holding [`Trainer::step_seed`].
    fn step_key(&self) -> Tensor {
        self.ctx.key(self.step_seed())
    }

    /// The lazy graph of one step on `x` and `y`: the loss, then the update (whose
    /// scalars include the loss scale's leaf, with loss scaling).
    pub fn step_graph(&self, x: &Tensor, y: &Tensor) -> Result<(Tensor, Update)> {
        self.step_graph_with(x, y, &Mode::train(self.step_key()))
    }

    fn step_graph_with(&self, x: &Tensor, y: &Tensor, mode: &Mode) -> Result<(Tensor, Update)> {
        let out = self.model.forward(x, mode);
        let loss = self.loss.of(&out, y);
        let params = self.param_values();
        let wrt: Vec<&Tensor> = params.iter().collect();
        let Gradients { grads, scalars } = self.optimizer.gradients(&loss, &wrt)?;
        let mut update = self.optimizer.update(&grads)?;
        update.scalars.extend(scalars);
        Ok((loss, update))
    }

    /// One step on the batch `x`, `y` (copied in): forward, loss, backward and the
    /// optimiser's update, evaluated as one graph; returns the batch's loss (before the
    /// update). With loss scaling (f16), a step whose gradients are not all finite
    /// changes nothing but the scale and the count of skipped steps
    /// ([`Optimizer::commit_checked`]); its loss is returned all the same.
    pub fn step(&mut self, x: &Array, y: &Array) -> Result<f64> {
        let (x, y) = (self.ctx.tensor(x.clone()), self.ctx.tensor(y.clone()));
        self.step_tensors(&x, &y)
    }

    /// [`Trainer::step`] on tensors (data or expressions).
    pub fn step_tensors(&mut self, x: &Tensor, y: &Tensor) -> Result<f64> {
        Ok(self.step_report(x, y)?.0)
    }

    /// [`Trainer::step_tensors`], also returning the evaluation's report: the kernels
    /// the step compiled to, the path each took, and timings.
    ///
    /// The first step on a batch of given dtypes and shapes builds the step's graph
    /// (forward, loss, gradients, update) and lowers it once ([`Context::compile`]);
    /// later steps on data batches of the same type bind the new batch, key,
    /// parameters, state and scalars to it and evaluate it directly: no tensors are
    /// built, nothing is differentiated or lowered again.
    pub fn step_report(&mut self, x: &Tensor, y: &Tensor) -> Result<(f64, Report)> {
        let batch = self.batch_type(x, y)?;
        let key = self.step_key();
        let params = self.param_values();
        let state = self.state_values();
        let buffers = self.buffer_values();
        let scaled = self.optimizer.loss_scaler().is_some();
        let hit = self.cache.as_ref().filter(|c| c.serves(&batch, scaled));
        let (out, report) = match hit {
            Some(c) => {
                let scalars = self.scalars_now(&c.scalars);
                let data: Vec<&Tensor> = [x, y, &key]
                    .into_iter()
                    .chain(&params)
                    .chain(&state)
                    .chain(&scalars)
                    .chain(&buffers)
                    .collect();
                c.step.run_report(&data)?
            }
            None => {
                let mode = Mode::train(key.clone());
                let (loss, update) = self.step_graph_with(x, y, &mode)?;
                let new_buffers = self.recorded_buffers(&mode, &buffers);
                let outputs: Vec<&Tensor> = std::iter::once(&loss)
                    .chain(&update.params)
                    .chain(&update.state)
                    .chain(&new_buffers)
                    .chain(&update.finite)
                    .collect();
                let Some(batch) = batch else {
                    // An expression batch: evaluated as it is, nothing kept.
                    return self.finish(self.ctx.eval_report(&outputs)?, scaled);
                };
                let inputs: Vec<&Tensor> = [x, y, &key]
                    .into_iter()
                    .chain(&params)
                    .chain(&state)
                    .chain(update.scalars.iter().map(|s| &s.2))
                    .chain(&buffers)
                    .collect();
                let step = self.ctx.compile(&outputs, &inputs)?;
                let result = step.run_report(&inputs)?;
                self.cache = Some(StepCache {
                    batch: Some(batch),
                    step,
                    scalars: update.scalars.iter().map(|s| (s.0, s.1)).collect(),
                    scaled,
                });
                result
            }
        };
        self.finish((out, report), scaled)
    }

    /// Commits a step's evaluated outputs (the loss, new parameters, new state, and
    /// with loss scaling (`scaled`) the flag of finite gradients). The loss returned is
    /// the batch's, unscaled (NaN or infinite when the forward pass overflowed).
    fn finish(
        &mut self,
        (mut out, report): (Vec<Array>, Report),
        scaled: bool,
    ) -> Result<(f64, Report)> {
        let finite = self.take_flag(&mut out, scaled);
        // Stored whether or not the gradients were finite: the forward pass ran either
        // way (as PyTorch's running statistics move in every training forward).
        self.store_buffers(&mut out)?;
        let n = self.optimizer.parameters().len();
        let state = out.split_off(1 + n);
        let params = out.split_off(1);
        let loss = out[0].to_f64_vec()[0];
        self.optimizer.commit_checked(params, state, finite)?;
        Ok((loss, report))
    }

    /// The model's loss (and accuracy, for cross-entropy) on `x`, `y` in evaluation
    /// mode (no dropout), in slices of at most `batch` samples (0: all at once).
    pub fn evaluate(&self, x: &Array, y: &Array, batch: usize) -> Result<Scores> {
        let n = x.shape().first().copied().unwrap_or(0);
        let batch = if batch == 0 { n.max(1) } else { batch };
        let (xt, yt) = (self.ctx.tensor(x.clone()), self.ctx.tensor(y.clone()));
        let (mut loss, mut right) = (0.0, 0.0);
        let mut start = 0;
        while start < n {
            let end = (start + batch).min(n);
            let (xs, ys) = (rows(&xt, start, end), rows(&yt, start, end));
            let out = self.model.forward(&xs, &Mode::eval());
            let l = self.loss.of(&out, &ys);
            let scored = match self.loss {
                Loss::CrossEntropy => {
                    // A count (exact in f32 up to 2^24), not a mean: slices add up exactly.
                    let a = accuracy(&out, &ys) * (end - start) as f64;
                    let r = self.ctx.eval(&[&l, &a])?;
                    right += r[1].to_f64_vec()[0].round();
                    r[0].to_f64_vec()[0]
                }
                Loss::Mse => l.eval()?.to_f64_vec()[0],
            };
            loss += scored * (end - start) as f64;
            start = end;
        }
        let denom = n.max(1) as f64;
        Ok(Scores {
            loss: loss / denom,
            accuracy: (self.loss == Loss::CrossEntropy).then_some(right / denom),
            samples: n,
        })
    }
}

/// The `format` metadata of a trainer's checkpoint.
const FORMAT: &str = "ndfuse-nn/1";
/// The prefix of optimiser state tensors in a checkpoint (parameters have none).
const STATE: &str = "optimizer.";

impl<M: Layer> Trainer<M> {
    /// Saves the parameters and the model's buffers (by name), the optimiser's state
    /// (`optimizer.<name>.<slot>`), its step count and the seed to a safetensors file at
    /// `path`, atomically; with loss scaling also the scale and its counters (metadata
    /// `loss_scale`, `loss_scale_good_steps`, `skipped_steps`).
    pub fn save(&self, path: &Path) -> Result<()> {
        // The parameters, then the model's buffers (batch norm's running statistics),
        // by name; then the optimiser's state.
        let mut params = self.optimizer.parameters().to_vec();
        params.extend(self.model.buffers());
        let state = self.optimizer.state();
        let values: Vec<Tensor> = params
            .iter()
            .map(Parameter::value)
            .chain(state.iter().map(|(_, t)| t.clone()))
            .collect();
        let arrays = self.ctx.eval(&values.iter().collect::<Vec<_>>())?;
        let names: Vec<String> = params
            .iter()
            .map(|p| p.name().to_string())
            .chain(state.iter().map(|(n, _)| format!("{STATE}{n}")))
            .collect();
        let tensors: Vec<(&str, &Array)> = names.iter().map(String::as_str).zip(&arrays).collect();
        let mut metadata = BTreeMap::from([
            ("format".to_string(), FORMAT.to_string()),
            (
                "optimizer".to_string(),
                self.optimizer.method().name().to_string(),
            ),
            ("steps".to_string(), self.optimizer.steps().to_string()),
            ("seed".to_string(), self.seed.to_string()),
        ]);
        if let Some(s) = self.optimizer.loss_scaler() {
            metadata.insert("loss_scale".into(), s.scale().to_string());
            metadata.insert("loss_scale_good_steps".into(), s.good_steps().to_string());
            metadata.insert("skipped_steps".into(), s.skipped_steps().to_string());
        }
        save(path, &tensors, &metadata)
    }

    /// Loads what [`Trainer::save`] wrote: parameters, optimiser state, step count and
    /// seed. Everything is checked before anything changes: a missing tensor, a shape or
    /// dtype that differs from the model's (the error names the file, the tensor and
    /// both shapes), another optimiser, or a corrupt file leave the trainer untouched.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let mut ck = load(path)?;
        let refuse = |why: String| Error::Checkpoint {
            path: path.to_path_buf(),
            tensor: None,
            why,
        };
        let meta = |k: &str| ck.metadata().get(k).cloned();
        if meta("format").as_deref() != Some(FORMAT) {
            return Err(refuse(format!(
                "not a trainer checkpoint (format {:?}, expected {FORMAT:?})",
                meta("format")
            )));
        }
        let method = self.optimizer.method().name();
        if meta("optimizer").as_deref() != Some(method) {
            return Err(refuse(format!(
                "saved by optimiser {:?}; this trainer's is {method:?}",
                meta("optimizer")
            )));
        }
        let number = |k: &str| -> Result<u64> {
            meta(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| refuse(format!("metadata {k:?} is missing or not a number")))
        };
        let (steps, seed) = (number("steps")?, number("seed")?);
        // The loss scale, when this trainer scales and the file has one (a file from a
        // run without scaling starts the scale afresh).
        let scale = match (self.optimizer.loss_scaler(), meta("loss_scale")) {
            (Some(current), Some(v)) => {
                let mut s = current.clone();
                let v: f64 = v
                    .parse()
                    .map_err(|_| refuse(format!("metadata \"loss_scale\" is {v:?}")))?;
                s.set_scale(v).map_err(|e| refuse(e.to_string()))?;
                s.set_counts(number("loss_scale_good_steps")?, number("skipped_steps")?);
                Some(s)
            }
            _ => None,
        };
        let params = self.optimizer.parameters().to_vec();
        let buffers = self.model.buffers();
        for p in params.iter().chain(&buffers) {
            ck.expect_shape(p.name(), &p.shape(), p.dtype())?;
        }
        let state = self.optimizer.state();
        for (i, (name, _)) in state.iter().enumerate() {
            let p = &params[i * params.len() / state.len().max(1)];
            ck.expect_shape(&format!("{STATE}{name}"), &p.shape(), p.dtype())?;
        }
        // Checked: from here nothing fails.
        let state: Vec<Array> = state
            .iter()
            .map(|(name, _)| ck.take(&format!("{STATE}{name}")))
            .collect::<Result<_>>()?;
        let values: Vec<Array> = params
            .iter()
            .chain(&buffers)
            .map(|p| ck.take(p.name()))
            .collect::<Result<_>>()?;
        self.optimizer.load_state(state, steps)?;
        for (p, a) in params.iter().chain(&buffers).zip(values) {
            p.replace(a)?;
        }
        self.seed = seed;
        if let (Some(s), Some(target)) = (scale, self.optimizer.loss_scaler_mut()) {
            *target = s;
        }
        Ok(())
    }
}

/// Rows `start..end` of `t` along its first axis.
fn rows(t: &Tensor, start: usize, end: usize) -> Tensor {
    if start == 0 && Some(end) == t.shape().ok().and_then(|s| s.first().copied()) {
        return t.clone();
    }
    t.slice(&[(start as i64..end as i64).into()])
}
