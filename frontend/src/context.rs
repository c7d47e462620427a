//! The context: default dtype (ND4J's `setDTypeForContext`), backend choice,
//! constructors, and evaluation of several outputs sharing one graph.
//!
//! The default dtype comes, highest first, from code ([`ContextBuilder::dtype`],
//! [`Context::set_default_dtype`]), then the `default_dtype` configuration key
//! (`NDFUSE_DEFAULT_DTYPE`, then `ndfuse.toml`), then f32; [`Context::dtype_origin`]
//! says which.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::random::SplitMix64;
use crate::tensor::{Inner, Tensor};
use ndfuse_ir::{DType, Element, Graph, HostArray, NodeId, Scalar, Shape, Storage};
use ndfuse_runtime::{BackendKind, Config, ConfigSource, DeviceId, DeviceSet, Evaluation};
use std::collections::HashMap;
use std::panic::Location;
use std::sync::{Arc, OnceLock, RwLock};

#[derive(Debug)]
struct Settings {
    dtype: DType,
    /// Where `dtype` came from: the builder or a setter (code), or the configuration.
    dtype_origin: ConfigSource,
    backend: BackendKind,
    /// The context's own device set; `None`: the process's ([`DeviceSet::global`]).
    devices: Option<Arc<DeviceSet>>,
}

/// Where tensors are made and evaluated: holds the default dtype used by constructors
/// and the backend `eval` runs on. Cheap to clone (shared); `Send + Sync`.
///
/// ```
/// use ndfuse::{Context, DType};
/// let ctx = Context::builder().dtype(DType::F64).build()?;
/// let x = ctx.ones(&[2, 3]);
/// assert_eq!(x.dtype()?, DType::F64);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Context(Arc<RwLock<Settings>>);

impl Default for Context {
    fn default() -> Context {
        Context::new()
    }
}

/// Builder for a [`Context`].
#[derive(Debug, Clone)]
pub struct ContextBuilder {
    dtype: Option<DType>,
    config: Option<Config>,
    backend: BackendKind,
    devices: Option<Arc<DeviceSet>>,
}

impl ContextBuilder {
    /// The default dtype of constructors and literals (a float dtype). Overrides the
    /// `default_dtype` configuration key; when not set, that key decides (f32 when
    /// nobody set it).
    pub fn dtype(mut self, dtype: DType) -> ContextBuilder {
        self.dtype = Some(dtype);
        self
    }

    /// Evaluations run on these devices instead of the process's set: a bound or
    /// round-robin placed thread on its device, others on the set's first device by
    /// priority, batches over all of them. The backend setting is then not used.
    pub fn devices(mut self, devices: Arc<DeviceSet>) -> ContextBuilder {
        self.devices = Some(devices);
        self
    }

    /// Reads the `default_dtype` key from this configuration instead of loading one from
    /// the file and the environment (for embedders that build their own [`Config`]).
    pub fn config(mut self, config: Config) -> ContextBuilder {
        self.config = Some(config);
        self
    }

    /// The backend `eval` uses (auto if not set).
    pub fn backend(mut self, backend: BackendKind) -> ContextBuilder {
        self.backend = backend;
        self
    }

    /// The context; `Err` when the dtype is not a float dtype, or when no dtype was
    /// given and the configuration cannot be loaded (an unknown key, a bad value).
    #[track_caller]
    pub fn build(self) -> Result<Context> {
        let at = Location::caller();
        let (dtype, dtype_origin) = match (self.dtype, self.config) {
            (Some(d), _) => (d, ConfigSource::Builder),
            (None, Some(cfg)) => from_config(&cfg),
            (None, None) => {
                from_config(&Config::load().map_err(ndfuse_runtime::RuntimeError::from)?)
            }
        };
        check_default_dtype(dtype, at)?;
        Ok(Context(Arc::new(RwLock::new(Settings {
            dtype,
            dtype_origin,
            backend: self.backend,
            devices: self.devices,
        }))))
    }
}

/// The configuration's `default_dtype` and where it came from. The parser accepts only
/// float dtypes, so the value needs no further check.
fn from_config(cfg: &Config) -> (DType, ConfigSource) {
    let origin = cfg
        .origin("default_dtype")
        .cloned()
        .unwrap_or(ConfigSource::Default);
    (cfg.default_dtype(), origin)
}

fn check_default_dtype(dtype: DType, at: &'static Location<'static>) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::Argument {
            what: "default dtype",
            why: format!("{dtype} is not a float dtype (use f16, bf16, f32 or f64)"),
            at,
        })
    }
}

impl Context {
    /// A context with the auto backend and the configured default dtype
    /// (`default_dtype`: `NDFUSE_DEFAULT_DTYPE`, else `ndfuse.toml`, else f32).
    ///
    /// A configuration that cannot be loaded (an unknown key, a bad value) gives f32
    /// here; every `eval` loads the configuration too and returns that error, so the
    /// mistake is reported rather than lost. [`ContextBuilder::build`] returns it at once.
    pub fn new() -> Context {
        let (dtype, dtype_origin) = match Config::load() {
            Ok(cfg) => from_config(&cfg),
            Err(_) => (DType::F32, ConfigSource::Default),
        };
        Context(Arc::new(RwLock::new(Settings {
            dtype,
            dtype_origin,
            backend: BackendKind::Auto,
            devices: None,
        })))
    }

    /// A builder for a context with other settings.
    pub fn builder() -> ContextBuilder {
        ContextBuilder {
            dtype: None,
            config: None,
            backend: BackendKind::Auto,
            devices: None,
        }
    }

    /// The process-wide context used by [`Tensor::from_vec`] and friends.
    pub fn global() -> &'static Context {
        static GLOBAL: OnceLock<Context> = OnceLock::new();
        GLOBAL.get_or_init(Context::new)
    }

    fn settings(&self) -> std::sync::RwLockReadGuard<'_, Settings> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn settings_mut(&self) -> std::sync::RwLockWriteGuard<'_, Settings> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The dtype constructors and float literals use when none is given.
    pub fn default_dtype(&self) -> DType {
        self.settings().dtype
    }

    /// Where the default dtype came from: [`ConfigSource::Builder`] when code chose it
    /// (the builder or [`Context::set_default_dtype`]), else the configuration's source
    /// of `default_dtype` (an environment variable, the file, or the default).
    ///
    /// ```
    /// use ndfuse::{Context, ConfigSource, DType};
    /// let ctx = Context::builder().dtype(DType::F16).build()?;
    /// assert_eq!(ctx.dtype_origin(), ConfigSource::Builder);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn dtype_origin(&self) -> ConfigSource {
        self.settings().dtype_origin.clone()
    }

    /// Sets the default dtype, like ND4J's `setDTypeForContext`. Affects tensors made
    /// afterwards; `Err` for a non-float dtype.
    #[track_caller]
    pub fn set_default_dtype(&self, dtype: DType) -> Result<()> {
        check_default_dtype(dtype, Location::caller())?;
        let mut s = self.settings_mut();
        s.dtype = dtype;
        s.dtype_origin = ConfigSource::Builder;
        Ok(())
    }

    /// The backend `eval` uses.
    pub fn backend(&self) -> BackendKind {
        self.settings().backend
    }

    /// Chooses the backend `eval` uses.
    pub fn set_backend(&self, backend: BackendKind) {
        self.settings_mut().backend = backend;
    }

    // ----- constructors -----

    /// A tensor holding `data` (row-major) with `shape`; `Err` when the element count
    /// does not match. The dtype is `T`'s (`f32` -> F32, `half::f16` -> F16, ...).
    #[track_caller]
    pub fn from_vec<T: Element>(&self, data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        // Taken here: a closure would report its own location, not the caller's.
        let at = Location::caller();
        let shape = Shape::from(shape);
        let count = data.len();
        let arr = HostArray::new(shape.clone(), T::into_storage(data)).ok_or_else(|| {
            Error::ElementCount {
                what: "from_vec",
                count,
                shape: shape.clone(),
                expected: shape.numel(),
                at,
            }
        })?;
        Ok(Tensor::leaf(self, arr))
    }

    /// Like [`Context::from_vec`], copying from a slice.
    #[track_caller]
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        self.from_vec(data.to_vec(), shape)
    }

    /// A tensor of an evaluated array's data (to feed results back in).
    pub fn from_array(&self, a: &Array) -> Tensor {
        Tensor::leaf(self, a.0.clone())
    }

    /// A scalar (shape `[]`) of the default dtype.
    pub fn scalar(&self, value: f64) -> Tensor {
        Tensor::constant(
            self,
            Scalar::F(value),
            self.default_dtype(),
            Shape::scalar(),
        )
    }

    /// `shape` filled with `value`, of the default dtype.
    pub fn full(&self, shape: &[usize], value: f64) -> Tensor {
        self.full_dtype(shape, value, self.default_dtype())
    }

    /// `shape` filled with `value` converted to `dtype` (numpy's cast rules).
    pub fn full_dtype(&self, shape: &[usize], value: f64, dtype: DType) -> Tensor {
        Tensor::constant(self, Scalar::F(value), dtype, Shape::from(shape))
    }

    /// Zeros of the default dtype.
    pub fn zeros(&self, shape: &[usize]) -> Tensor {
        self.full(shape, 0.0)
    }

    /// Ones of the default dtype.
    pub fn ones(&self, shape: &[usize]) -> Tensor {
        self.full(shape, 1.0)
    }

    /// `start, start + step, ...` below `stop` (above it for a negative step), like
    /// numpy's `arange`, of the default dtype. `Err` for a zero or non-finite step.
    #[track_caller]
    pub fn arange(&self, start: f64, stop: f64, step: f64) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
            return Err(Error::Argument {
                what: "arange",
                why: format!("start {start}, stop {stop}, step {step}: need finite values and a non-zero step"),
                at: Location::caller(),
            });
        }
        let n = ((stop - start) / step).ceil().max(0.0) as usize;
        let vals: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
        Ok(self.leaf_f64(&vals, Shape(vec![n])))
    }

    /// Uniform random values in `[low, high)` of the default dtype, from `seed`: the
    /// same seed gives the same tensor in every release.
    pub fn rand_uniform(&self, shape: &[usize], low: f64, high: f64, seed: u64) -> Tensor {
        let mut rng = SplitMix64::new(seed);
        let shape = Shape::from(shape);
        let vals: Vec<f64> = (0..shape.numel())
            .map(|_| low + (high - low) * rng.next_f64())
            .collect();
        self.leaf_f64(&vals, shape)
    }

    /// Normal random values with `mean` and `std` of the default dtype, from `seed`.
    pub fn rand_normal(&self, shape: &[usize], mean: f64, std: f64, seed: u64) -> Tensor {
        let mut rng = SplitMix64::new(seed);
        let shape = Shape::from(shape);
        let vals: Vec<f64> = (0..shape.numel())
            .map(|_| mean + std * rng.next_normal())
            .collect();
        self.leaf_f64(&vals, shape)
    }

    fn leaf_f64(&self, vals: &[f64], shape: Shape) -> Tensor {
        let arr = HostArray::new(shape, Storage::from_f64s(self.default_dtype(), vals))
            .expect("value count matches the shape by construction");
        Tensor::leaf(self, arr)
    }

    // ----- evaluation -----

    /// Evaluates several tensors in one graph (shared subexpressions are computed once)
    /// on this context's backend.
    pub fn eval(&self, outputs: &[&Tensor]) -> Result<Vec<Array>> {
        Ok(self.eval_report(outputs)?.0)
    }

    /// Like [`Context::eval`], also returning what happened: the kernels, the path each
    /// part took, and timings.
    pub fn eval_report(&self, outputs: &[&Tensor]) -> Result<(Vec<Array>, Report)> {
        let (graph, inputs) = crate::graph_cache::graph_of(outputs)?;
        let own = self.settings().devices.clone();
        let ev = match own {
            Some(set) => {
                let cfg = Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
                set.execute(&graph, &inputs, &cfg)?
            }
            // The runtime places bound threads (and every thread under
            // `allow_multi_gpu`) on the process's device set.
            None => ndfuse_runtime::execute(&graph, &inputs, self.backend())?,
        };
        Ok(report(graph, ev))
    }

    /// The device set this context's evaluations use: its own
    /// ([`ContextBuilder::devices`]) or the process's ([`DeviceSet::global`]: every
    /// CUDA device found, then the whole CPU as `cpu:0`).
    pub fn devices(&self) -> Result<Arc<DeviceSet>> {
        if let Some(set) = &self.settings().devices {
            return Ok(Arc::clone(set));
        }
        let cfg = Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
        Ok(DeviceSet::global(&cfg).map_err(ndfuse_runtime::RuntimeError::from)?)
    }

    /// Binds the current thread to `device` (ND4J's thread <-> device affinity): this
    /// thread's evaluations run there until [`crate::unbind_thread`]. `Err` when this
    /// context's device set has no such device.
    ///
    /// ```
    /// use ndfuse::{Context, DeviceId};
    /// let ctx = Context::new();
    /// ctx.bind_thread(&DeviceId::cpu(0))?;
    /// let (_, report) = ctx.eval_report(&[&ctx.ones(&[4]).exp()])?;
    /// assert_eq!(report.device(), &DeviceId::cpu(0));
    /// assert!(ctx.bind_thread(&DeviceId::cuda(99)).is_err());
    /// ndfuse::unbind_thread();
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn bind_thread(&self, device: &DeviceId) -> Result<()> {
        self.devices()?
            .get(device)
            .map_err(ndfuse_runtime::RuntimeError::from)?;
        ndfuse_runtime::bind_thread(device.clone());
        Ok(())
    }

    /// Evaluates independent groups of outputs (each group one graph, as
    /// [`Context::eval`]) over every device of the context's set at once: one group per
    /// device in priority order, GPUs before CPUs with the default priorities. The
    /// first error, if any, is returned.
    pub fn eval_batch(&self, batch: &[&[&Tensor]]) -> Result<Vec<Vec<Array>>> {
        Ok(self
            .eval_batch_report(batch)?
            .into_iter()
            .map(|(a, _)| a)
            .collect())
    }

    /// Like [`Context::eval_batch`], with each group's report (its device, and the
    /// devices it left because they ran out of memory).
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.arange(0.0, 4.0, 1.0)?;
    /// let (a, b) = (x.exp(), &x * 2.0);
    /// let out = ctx.eval_batch_report(&[&[&a], &[&b]])?;
    /// assert_eq!(out[1].0[0].to_vec::<f32>()?, vec![0.0, 2.0, 4.0, 6.0]);
    /// assert!(out.iter().all(|(_, r)| r.moves().is_empty()));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn eval_batch_report(&self, batch: &[&[&Tensor]]) -> Result<Vec<(Vec<Array>, Report)>> {
        let built = batch
            .iter()
            .map(|outputs| crate::graph_cache::graph_of(outputs))
            .collect::<Result<Vec<_>>>()?;
        let cfg = Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
        let set = self.devices()?;
        let jobs: Vec<_> = built.iter().map(|(g, i)| (&**g, i)).collect();
        let results = set.execute_batch(&jobs, &cfg);
        built
            .into_iter()
            .zip(results)
            .map(|((graph, _), r)| Ok(report(graph, r?)))
            .collect()
    }

    /// A copy of `a` made for `device` of this context's set, which records where it
    /// went. On a CPU device the copy is written by that device's threads (first touch
    /// places its pages near them); on a GPU it is a host copy (an `Array` handed back by
    /// value cannot be tracked): [`Context::keep_on_device`] keeps a tensor's data on
    /// a GPU between evaluations. `Err` when the set has no such device.
    ///
    /// ```
    /// use ndfuse::{Context, DeviceId};
    /// let ctx = Context::new();
    /// let a = ctx.ones(&[3]).eval()?;
    /// let on = ctx.to_device(&a, &DeviceId::cpu(0))?;
    /// assert_eq!((on.device(), on.array()), (&DeviceId::cpu(0), &a));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn to_device(&self, a: &Array, device: &DeviceId) -> Result<DeviceArray> {
        self.to_device_copy(a, device)
    }

    /// Keeps the data of `t`, a tensor made from data (`from_vec`, `from_array`, the
    /// random constructors...), on `device` for the evaluations that follow, as long as
    /// `t` (or a tensor built from it) lives: a GPU uploads it once now instead of at
    /// every evaluation; on the host there is nothing to move. `Err` for a tensor that
    /// holds no data of its own (an expression: evaluate it and make a tensor of the
    /// result) or a device not in the set.
    ///
    /// ```
    /// use ndfuse::{Context, DeviceId};
    /// let ctx = Context::new();
    /// let w = ctx.rand_normal(&[256, 256], 0.0, 1.0, 7);
    /// ctx.keep_on_device(&w, &DeviceId::cpu(0))?;
    /// assert!(ctx.keep_on_device(&(&w * 2.0), &DeviceId::cpu(0)).is_err());
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn keep_on_device(&self, t: &Tensor, device: &DeviceId) -> Result<()> {
        let at = std::panic::Location::caller();
        let e = t.expr()?;
        let Some(data) = &e.data else {
            return Err(Error::Argument {
                what: "keep_on_device",
                why: "the tensor is an expression, not data: evaluate it and keep a tensor of the result".into(),
                at,
            });
        };
        self.devices()?.make_resident(data, device)?;
        Ok(())
    }

    fn to_device_copy(&self, a: &Array, device: &DeviceId) -> Result<DeviceArray> {
        let copy = self.devices()?.to_device(&a.0, device)?;
        Ok(DeviceArray {
            array: Array(copy),
            device: device.clone(),
        })
    }

    /// What the host buffer cache did so far and holds now: hits, misses, bytes cached,
    /// high-water mark and limits. The cache is shared by every context of the process
    /// (outputs and intermediates of every eval come from it).
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.rand_uniform(&[1000], -1.0, 1.0, 1);
    /// drop(ctx.eval(&[&x.exp()])?); // the output's buffer goes back to the cache
    /// drop(ctx.eval(&[&x.exp()])?); // and serves the second eval
    /// assert!(ctx.cache_stats().hits >= 1);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn cache_stats(&self) -> ndfuse_runtime::CacheStats {
        ndfuse_runtime::host_cache_stats()
    }

    /// Frees every buffer the host cache holds (buffers in use stay); returns the bytes
    /// freed.
    pub fn trim_cache(&self) -> u64 {
        ndfuse_runtime::host_cache().trim()
    }

    /// The graph the given tensors compile to, in the stable text form, before any
    /// pass ran (`%4 = add %2, %3 : f32[4,8]`).
    pub fn graph_text(&self, outputs: &[&Tensor]) -> Result<String> {
        Ok(build_graph(outputs)?.0.to_string())
    }
}

/// The outputs moved out of `ev` and the report that keeps the rest.
fn report(graph: Arc<Graph>, mut ev: Evaluation) -> (Vec<Array>, Report) {
    // Moved, not copied: the arrays are the host cache's buffers and go back to it
    // when the caller drops them (the report's evaluation keeps no outputs).
    let arrays = std::mem::take(&mut ev.outputs)
        .into_iter()
        .map(Array)
        .collect();
    (arrays, Report { graph, ev })
}

/// An array copied to a device with [`Context::to_device`].
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceArray {
    array: Array,
    device: DeviceId,
}

impl DeviceArray {
    /// The data.
    pub fn array(&self) -> &Array {
        &self.array
    }

    /// The device it was copied to.
    pub fn device(&self) -> &DeviceId {
        &self.device
    }

    /// The data, without the device.
    pub fn into_array(self) -> Array {
        self.array
    }
}

/// What an evaluation did: see [`Context::eval_report`].
#[derive(Debug)]
pub struct Report {
    graph: Arc<Graph>,
    ev: Evaluation,
}

impl Report {
    /// The graph that was evaluated.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The graph with each node's kernel, whether it was stored and why, and the path it
    /// took (`jit`, or `interp: ...` with the reason).
    pub fn annotated_graph(&self) -> String {
        self.ev.annotated_graph()
    }

    /// What each clean-up pass did (absent on the interpreter backend).
    pub fn passes_text(&self) -> Option<String> {
        self.ev.passes.as_ref().map(ToString::to_string)
    }

    /// Number of kernels launched (interpreter-only steps excluded).
    pub fn kernel_count(&self) -> usize {
        self.ev.schedule.as_ref().map_or(0, |s| s.kernel_count())
    }

    /// The kernels as text (each kernel description in full).
    pub fn kernels_text(&self) -> String {
        self.ev
            .schedule
            .as_ref()
            .map_or_else(String::new, |s| s.to_text(&self.ev.graph))
    }

    /// The device that ran the evaluation (`cpu:0` is the whole host outside a device
    /// set).
    pub fn device(&self) -> &DeviceId {
        &self.ev.device
    }

    /// The devices the evaluation left because they ran out of memory, in order; each
    /// move was also logged on stderr.
    pub fn moves(&self) -> &[ndfuse_runtime::DeviceMove] {
        &self.ev.moves
    }

    /// The backend-level details: schedule, paths, timings.
    pub fn evaluation(&self) -> &Evaluation {
        &self.ev
    }

    /// Bytes every step read and wrote: for a kernel its input and output buffers; for
    /// a node the interpreter ran (an interpreter step of the schedule, or every node
    /// under the interp backend) its operands and its result.
    pub fn bytes_moved(&self) -> u64 {
        use ndfuse_passes::Step;
        let g = &self.ev.graph;
        let node_bytes = |n: NodeId| {
            let ty = g.ty(n);
            (ty.shape.numel() * ty.dtype.size_bytes()) as u64
        };
        let node_io = |node: NodeId, operands: &[NodeId]| {
            operands.iter().map(|&o| node_bytes(o)).sum::<u64>() + node_bytes(node)
        };
        match &self.ev.schedule {
            Some(s) => s
                .steps
                .iter()
                .map(|step| match step {
                    Step::Kernel { kernel, .. } => (kernel.bytes_in() + kernel.bytes_out()) as u64,
                    Step::Interp { node, operands, .. } => node_io(*node, operands),
                })
                .sum(),
            None => g
                .live_nodes()
                .into_iter()
                .filter(|&n| !g.node(n).op.is_input())
                .map(|n| node_io(n, &g.operands(n)))
                .sum(),
        }
    }
}

/// Lowers the expression DAG under `outputs` into an IR graph plus the data of its
/// leaves. Shared subexpressions become one node. Leaves are named `in0, in1, ...` in
/// the order they are first reached, so equal expressions print identically.
pub(crate) fn build_graph(outputs: &[&Tensor]) -> Result<(Graph, HashMap<NodeId, Arc<HostArray>>)> {
    let mut g = Graph::new();
    let mut ids: HashMap<*const Inner, NodeId> = HashMap::new();
    let mut data = HashMap::new();
    for &t in outputs {
        t.expr()?;
    }
    for &out in outputs {
        // Iterative post-order: deep expression chains must not overflow the stack.
        let mut stack: Vec<(&Tensor, bool)> = vec![(out, false)];
        while let Some((t, expanded)) = stack.pop() {
            let key = Arc::as_ptr(&t.inner);
            if ids.contains_key(&key) {
                continue;
            }
            let e = t.expr()?;
            if !expanded {
                stack.push((t, true));
                for s in e.src.iter().rev() {
                    stack.push((s, false));
                }
                continue;
            }
            let id = match &e.data {
                Some(arr) => {
                    let id = g.add_input(format!("in{}", data.len()), e.dtype, e.shape.clone());
                    data.insert(id, Arc::clone(arr));
                    id
                }
                None => {
                    let srcs: Vec<NodeId> =
                        e.src.iter().map(|s| ids[&Arc::as_ptr(&s.inner)]).collect();
                    g.add_node(
                        ndfuse_ir::Node {
                            op: e.op.clone(),
                            dtype: e.dtype,
                            shape: e.shape.clone(),
                        },
                        &srcs,
                    )
                }
            };
            ids.insert(key, id);
        }
        g.add_output(ids[&Arc::as_ptr(&out.inner)]);
    }
    Ok((g, data))
}

impl Context {
    /// The IR graph the given tensors compile to, before any pass ran, without
    /// evaluating anything: for tools that schedule or inspect it (`ndfuse explain`).
    /// Inputs are named `in0, in1, ...` as in [`Context::graph_text`].
    pub fn graph(&self, outputs: &[&Tensor]) -> Result<Graph> {
        Ok(build_graph(outputs)?.0)
    }

    /// What evaluating `outputs` on this context's backend does, without running it: the
    /// graph, where each node goes (kernel, stored and why, or the interpreter), every
    /// kernel description with the path it takes and the bytes it moves, and the
    /// generated Cranelift IR. Kernels are compiled into the cache on the way.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.rand_uniform(&[4, 8], -1.0, 1.0, 0);
    /// let text = ctx.explain(&[&(x.exp() * 2.0).sum(1)])?;
    /// assert!(text.contains("== kernels") && text.contains("k0_exp_mul_sum"));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn explain(&self, outputs: &[&Tensor]) -> Result<String> {
        let g = self.graph(outputs)?;
        let ex = ndfuse_runtime::explain(&g, self.backend())?;
        Ok(explain_text(&ex))
    }
}

/// Formats an explanation in sections (`== graph`, `== passes`, `== schedule`,
/// `== kernels`, `== code`).
fn explain_text(ex: &ndfuse_runtime::Explanation) -> String {
    use ndfuse_passes::Step;
    use std::fmt::Write as _;
    let mut s = String::new();
    let g = &ex.graph;
    if let Some(log) = &ex.passes {
        let input = log.input.clone().unwrap_or_default();
        let _ = writeln!(s, "== graph\n{input}");
        let _ = writeln!(
            s,
            "== passes (IR after each; unchanged passes marked)\n{}",
            log.to_text(false)
        );
    } else {
        let _ = writeln!(s, "== graph\n{g}");
    }
    let Some(sched) = &ex.schedule else {
        let _ = writeln!(
            s,
            "== schedule (backend {})\nnone: every node is evaluated by the f64 reference interpreter, one at a time; nothing is fused or compiled",
            ex.backend.name()
        );
        return s;
    };
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let kernels = sched.kernel_count();
    let _ = writeln!(
        s,
        "== schedule (backend {}: {}, {})",
        ex.backend.name(),
        plural(kernels, "kernel"),
        plural(sched.steps.len() - kernels, "interpreter step")
    );
    s.push_str(&sched.annotate(g, &|i| ex.paths.get(i).map(|p| p.short().to_string())));
    let _ = writeln!(s, "\n== kernels");
    let num = g.print_numbering();
    for (i, (step, path)) in sched.steps.iter().zip(&ex.paths).enumerate() {
        match step {
            Step::Kernel { kernel, .. } => {
                let _ = writeln!(
                    s,
                    "step {i}: {} [{path}] reads {} B, writes {} B",
                    kernel.name,
                    kernel.bytes_in(),
                    kernel.bytes_out()
                );
                let _ = write!(s, "{kernel}");
            }
            Step::Interp { node, reason, .. } => {
                let n = num
                    .get(node)
                    .map_or_else(|| "?".into(), ToString::to_string);
                let _ = writeln!(
                    s,
                    "step {i}: interp %{n} {} ; {reason}",
                    g.node(*node).op.name()
                );
            }
        }
    }
    let cuda = ex.backend == BackendKind::Cuda;
    let _ = writeln!(
        s,
        "\n== code ({})",
        if cuda {
            "CUDA C, as NVRTC compiles it, with its launches"
        } else {
            "Cranelift IR, before Cranelift's own optimisations"
        }
    );
    if ex.code.is_empty() {
        let _ = writeln!(s, "(no kernel is compiled)");
    }
    let comment = if cuda { "//" } else { ";" };
    for (name, code) in &ex.code {
        let _ = writeln!(s, "{comment} {name}\n{}", code.trim_end());
    }
    s
}
