//! The executor: runs a schedule step by step on host buffers and reports which path
//! (JIT or interpreter) every step took and how long compiling and running took.
//!
//! Kernel outputs are written into buffers of the host cache ([`crate::host_cache`]):
//! an intermediate goes back to the cache as soon as its last reader ran (so a later
//! step of the same eval may write into it), an output when the caller drops it, and
//! the next eval of the same graph finds its buffers there, already mapped.

use crate::devices::{DeviceId, DeviceMove};
use crate::error::RuntimeError;
use ndfuse_codegen_cpu::CompiledKernel;
use ndfuse_ir::interp;
use ndfuse_ir::{verify, Graph, HostArray, Kernel, NodeId, Op, TensorType};
use ndfuse_passes::{PassLog, Schedule, Step};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Which backend evaluates a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// The best backend present (the CPU backend in this version).
    #[default]
    Auto,
    /// Fused kernels JIT-compiled with Cranelift; what the JIT cannot compile yet runs
    /// in the interpreter, and the report says so.
    Cpu,
    /// The CUDA backend.
    Cuda,
    /// The f64 reference interpreter, node by node, no fusion.
    Interp,
}

impl BackendKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Interp => "interp",
        }
    }
}

/// How one step of the schedule ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepPath {
    /// A JIT-compiled kernel; `cached` when the compiled code was reused.
    Jit {
        /// Whether compilation was skipped thanks to the kernel cache.
        cached: bool,
    },
    /// A kernel the codegen cannot compile yet, evaluated by the interpreter.
    KernelInterp {
        /// What the codegen cannot do.
        reason: String,
    },
    /// A node the passes left to the interpreter.
    Interp,
    /// A kernel compiled with NVRTC and launched on CUDA device `device`; `cached` when
    /// the loaded module was reused.
    Cuda {
        /// Whether compilation and loading were skipped thanks to the module cache.
        cached: bool,
        /// The device's ordinal.
        device: usize,
    },
    /// A kernel rendered as CUDA C by `explain`, which runs nothing.
    CudaSource,
}

impl StepPath {
    /// The path without its reason, for notes repeated on every node of a kernel.
    pub fn short(&self) -> &'static str {
        match self {
            StepPath::Jit { cached: false } => "jit",
            StepPath::Jit { cached: true } => "jit, cached",
            StepPath::KernelInterp { .. } | StepPath::Interp => "interp",
            StepPath::Cuda { cached: false, .. } => "cuda",
            StepPath::Cuda { cached: true, .. } => "cuda, cached",
            StepPath::CudaSource => "cuda",
        }
    }
}

impl std::fmt::Display for StepPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepPath::Jit { cached: false } => f.write_str("jit"),
            StepPath::Jit { cached: true } => f.write_str("jit, cached"),
            StepPath::KernelInterp { reason } => write!(f, "interp: {reason}"),
            StepPath::Interp => f.write_str("interp"),
            StepPath::Cuda { cached, device } => {
                write!(f, "cuda:{device}{}", if *cached { ", cached" } else { "" })
            }
            StepPath::CudaSource => f.write_str("cuda (source only)"),
        }
    }
}

/// The result of one evaluation.
#[derive(Debug)]
pub struct Evaluation {
    /// One array per graph output, in order (kernel outputs live in host-cache
    /// buffers, which go back to the cache when dropped).
    pub outputs: Vec<HostArray>,
    /// The backend that ran.
    pub backend: BackendKind,
    /// The graph that ran: after the clean-up passes on a compiling backend, the graph
    /// as given on the interpreter.
    pub graph: Arc<Graph>,
    /// What each pass did (absent for the interpreter backend, which runs none).
    pub passes: Option<Arc<PassLog>>,
    /// The schedule (absent for the interpreter backend, which does not fuse).
    pub schedule: Option<Arc<Schedule>>,
    /// Whether passes and fusion were skipped because this graph was compiled before.
    pub compile_cached: bool,
    /// How each step ran, parallel to `schedule.steps`.
    pub paths: Vec<StepPath>,
    /// Time spent compiling kernels (zero when all came from the cache).
    pub compile_time: Duration,
    /// Time spent running steps.
    pub run_time: Duration,
    /// The device that ran it (`cpu:0` is the whole host outside a device set).
    pub device: DeviceId,
    /// Devices that ran out of memory before `device` ran it, in order (empty outside
    /// a [`crate::DeviceSet`], which makes the moves).
    pub moves: Vec<DeviceMove>,
}

impl Evaluation {
    /// The graph that ran, with, after each node, its kernel and the path it took.
    pub fn annotated_graph(&self) -> String {
        let g = &self.graph;
        match &self.schedule {
            Some(s) => s.annotate(g, &|i| self.paths.get(i).map(|p| p.short().to_string())),
            None => g.to_text_with(&|id| (!g.node(id).op.is_input()).then(|| "interp".to_string())),
        }
    }
}

/// Compiled kernels by description: a hit skips Cranelift entirely. Descriptions carry
/// shapes, strides and dtypes, so equal descriptions compile to identical code.
fn kernel_cache() -> &'static Mutex<HashMap<Kernel, Arc<CompiledKernel>>> {
    static CACHE: OnceLock<Mutex<HashMap<Kernel, Arc<CompiledKernel>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Operations per element of the CPU JIT's compiled code for `kernel`
/// ([`CompiledKernel::ops_per_element`]), when the kernel cache holds it (any
/// evaluation that ran it compiled it); `None` otherwise.
pub fn jit_ops_per_element(kernel: &Kernel) -> Option<f64> {
    kernel_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(kernel)
        .and_then(|c| c.ops_per_element())
}

/// Checks that every input the outputs need has data of the declared type.
fn check_inputs(g: &Graph, inputs: &HashMap<NodeId, Arc<HostArray>>) -> Result<(), RuntimeError> {
    // In id order, which is the order `live_nodes` lists inputs in (all of them are
    // ready from the start of its topological walk, which takes the lowest id first).
    for &n in g.live_inputs() {
        let node = g.node(n);
        let Op::Input { name } = &node.op else {
            continue;
        };
        let data = inputs.get(&n).ok_or_else(|| RuntimeError::MissingInput {
            name: name.clone(),
            expected: g.ty(n),
        })?;
        if data.dtype() != node.dtype || *data.shape() != node.shape {
            return Err(RuntimeError::InputMismatch {
                name: name.clone(),
                expected: g.ty(n),
                got: TensorType {
                    dtype: data.dtype(),
                    shape: data.shape().clone(),
                },
            });
        }
    }
    Ok(())
}

/// The environment and configuration file an evaluation's [`Config`] was built from.
#[derive(PartialEq, Eq)]
struct ConfigSources {
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The discovered file's text; `None` when it could not be read (missing or not
    /// text: `Config::load` then reports or ignores it as it always does).
    file: Option<String>,
}

/// `Config::load()`, rebuilt only when the process environment or the text of the
/// configuration file differs from the last evaluation's: parsing them again cost a
/// re-evaluation of a small cached graph about 7 µs of its ~20 µs overhead. What
/// `Config::load` would read is still read every time (a copy of the environment, one
/// file read), so a change is seen by the very next evaluation. Errors are not kept:
/// a bad configuration fails every evaluation, as before.
fn current_config() -> Result<crate::config::Config, RuntimeError> {
    use crate::config::{Config, CONFIG_FILE, CONFIG_VAR};
    static LAST: Mutex<Option<(ConfigSources, Config)>> = Mutex::new(None);
    let env: Vec<_> = std::env::vars_os().collect();
    let path = env
        .iter()
        .find(|(k, v)| k == CONFIG_VAR && !v.to_string_lossy().trim().is_empty())
        .map_or_else(|| std::path::PathBuf::from(CONFIG_FILE), |(_, v)| v.into());
    let sources = ConfigSources {
        file: std::fs::read_to_string(path).ok(),
        env,
    };
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((seen, cfg)) = &*last {
        if *seen == sources {
            return Ok(cfg.clone());
        }
    }
    // Built from the very variables of the key, as `Config::load` would build it.
    let vars = sources
        .env
        .iter()
        .filter_map(|(k, v)| Some((k.to_str()?, v.to_str()?)));
    let cfg = Config::builder().environment(vars).build()?;
    *last = Some((sources, cfg.clone()));
    Ok(cfg)
}

/// Evaluates the outputs of `g` on `backend`, with `inputs` bound to its input nodes.
/// Input data is shared, never copied (except by the interpreter backend).
pub fn execute(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    backend: BackendKind,
) -> Result<Evaluation, RuntimeError> {
    // The compiling backends verify `g` in `compile`, only when it is not a graph they
    // compiled (and so verified) before: verifying is a topological walk with a type
    // check per node, a fifth of a small cached re-evaluation.
    check_inputs(g, inputs)?;
    // Read once per evaluation: the backend choice and the passes both depend on it.
    let cfg = current_config()?;
    // A thread bound to a device, or spread over the GPUs by `allow_multi_gpu`, runs
    // there when no backend was asked for by name (in code or in the config).
    if backend == BackendKind::Auto
        && cfg.backend() == BackendKind::Auto
        && (crate::devices::bound_device().is_some() || cfg.allow_multi_gpu())
    {
        return crate::devices::DeviceSet::global(&cfg)?.execute(g, inputs, &cfg);
    }
    match crate::backend::resolve(backend, &cfg)? {
        BackendKind::Interp => {
            verify(g)?;
            let start = Instant::now();
            let owned: HashMap<NodeId, HostArray> = inputs
                .iter()
                .map(|(&n, a)| (n, HostArray::clone(a)))
                .collect();
            let outputs = interp::eval(g, &owned)?;
            Ok(Evaluation {
                outputs,
                backend: BackendKind::Interp,
                graph: Arc::new(g.clone()),
                passes: None,
                schedule: None,
                compile_cached: false,
                paths: Vec::new(),
                compile_time: Duration::ZERO,
                run_time: start.elapsed(),
                device: DeviceId::cpu(0),
                moves: Vec::new(),
            })
        }
        // Without a device set, CUDA means the first GPU.
        BackendKind::Cuda => run_cuda(g, inputs, &cfg, 0),
        BackendKind::Auto | BackendKind::Cpu => run_cpu(g, inputs, &cfg, None),
    }
}

/// Where [`execute_on`] runs an evaluation.
pub(crate) enum Target<'a> {
    /// The CPU JIT, kernels on this pool (`None`: as [`execute`] does).
    Cpu(Option<&'a rayon::ThreadPool>),
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

/// Evaluates `g` on one device of a [`crate::DeviceSet`], under the caller's `cfg`.
pub(crate) fn execute_on(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &crate::config::Config,
    target: Target<'_>,
) -> Result<Evaluation, RuntimeError> {
    // `compile` verifies `g` unless it compiled it before (see `execute`).
    check_inputs(g, inputs)?;
    match target {
        Target::Cpu(pool) => run_cpu(g, inputs, cfg, pool),
        Target::Cuda(ordinal) => run_cuda(g, inputs, cfg, ordinal),
    }
}

/// A buffer of the evaluation: borrowed from the caller or produced by a step.
enum Buf<'a> {
    Borrowed(&'a HostArray),
    Owned(HostArray),
}

impl Buf<'_> {
    fn get(&self) -> &HostArray {
        match self {
            Buf::Borrowed(a) => a,
            Buf::Owned(a) => a,
        }
    }
}

/// The clean-up passes on a copy of `g`, then fusion: the graph that runs, what each
/// pass did, and the schedule. Input nodes keep their ids, so bindings stay valid.
/// The IR after each pass is recorded when `record_ir` (for `explain`) or when a dump or
/// debug level asks for it: printing a large graph after every pass of every eval
/// would cost more than the passes.
fn compile(
    g: &Graph,
    record_ir: bool,
    cfg: &crate::config::Config,
    target: &ndfuse_passes::TargetDesc,
) -> Result<(Arc<Compiled>, bool), RuntimeError> {
    // A graph compiled before with the same options skips passes and fusion: re-running
    // them would be most of a small eval's cost. Entries are found by the graph's
    // structural hash and confirmed option for option and node for node, so a
    // collision cannot return another graph's schedule. (`same_as` is immediate for
    // the very graph value cached here, or a clone of it, as the frontend passes when
    // the same tensors are evaluated again: see `Graph::stamp`.)
    let fingerprint = g.fingerprint();
    let options = CompileOptions {
        disabled: cfg.disable_passes(),
        record_ir,
        debug: cfg.debug(),
        target: target.name,
    };
    if let Some(hit) = compile_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&fingerprint)
        .and_then(|entries| {
            entries
                .iter()
                .find(|e| e.options.borrowed() == options && e.source.same_as(g))
        })
        .map(|e| Arc::clone(&e.compiled))
    {
        return Ok((hit, true));
    }
    let mut opts = crate::env::pass_options_from(cfg);
    // A hit is a graph equal node for node to one verified here before.
    verify(g)?;
    opts.record_ir = record_ir || opts.debug_level >= 3 || opts.dump_dir.is_some();
    let mut optimized = g.clone();
    let log = ndfuse_passes::optimize(&mut optimized, &opts)?;
    let fuse = !opts.disabled.iter().any(|p| p == "fusion");
    let schedule = ndfuse_passes::schedule_with(&optimized, target, fuse);
    if opts.debug_level >= 2 {
        // The fusion report: where each node went and why, then every kernel and plan.
        eprint!(
            "ndfuse: fusion report\n{}{}",
            schedule.annotate(&optimized, &|_| None),
            schedule.to_text(&optimized)
        );
    }
    let mut last_read = rustc_hash::FxHashMap::default();
    for (i, s) in schedule.steps.iter().enumerate() {
        for &r in s.reads() {
            last_read.insert(r, i);
        }
    }
    let jit = Mutex::new(vec![None; schedule.steps.len()]);
    let compiled = Arc::new(Compiled {
        graph: Arc::new(optimized),
        log: Arc::new(log),
        schedule: Arc::new(schedule),
        debug: opts.debug_level,
        last_read,
        jit,
    });
    let entry = CompileEntry {
        options: CompileOptions {
            disabled: options.disabled.to_vec(),
            record_ir: options.record_ir,
            debug: options.debug,
            target: options.target,
        },
        // Stamped first, so that the cached clone shares `g`'s stamp.
        source: {
            g.stamp();
            g.clone()
        },
        compiled: Arc::clone(&compiled),
    };
    let mut cache = compile_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if cache.len() >= COMPILE_CACHE_GRAPHS {
        // A plain bound: programs that build endless new graphs start over.
        cache.clear();
    }
    let entries = cache.entry(fingerprint).or_default();
    // Another thread may have compiled the same graph meanwhile: keep one entry.
    if !entries
        .iter()
        .any(|e| e.options == entry.options && e.source.same_as(&entry.source))
    {
        entries.push(entry);
    }
    Ok((compiled, false))
}

/// How many distinct graphs (by fingerprint) [`compile`] keeps.
const COMPILE_CACHE_GRAPHS: usize = 256;

/// The options a compiled graph depends on besides the graph: the disabled passes,
/// whether IR is recorded, the debug level and the target. `D` is the list's storage:
/// owned in the cache, borrowed from the configuration for a look-up.
#[derive(Clone, Copy, PartialEq, Eq)]
struct CompileOptions<D> {
    disabled: D,
    record_ir: bool,
    debug: u8,
    target: &'static str,
}

impl CompileOptions<Vec<String>> {
    fn borrowed(&self) -> CompileOptions<&[String]> {
        CompileOptions {
            disabled: &self.disabled,
            record_ir: self.record_ir,
            debug: self.debug,
            target: self.target,
        }
    }
}

/// A compiled graph with what it was compiled from, to confirm a hit.
struct CompileEntry {
    options: CompileOptions<Vec<String>>,
    source: Graph,
    compiled: Arc<Compiled>,
}

/// Compiled graphs by [`Graph::fingerprint`] (the hash is already one, so the map
/// does not hash it again with SipHash).
type CompileCache = Mutex<rustc_hash::FxHashMap<u64, Vec<CompileEntry>>>;

fn compile_cache() -> &'static CompileCache {
    static CACHE: OnceLock<CompileCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// What [`compile`] produces.
struct Compiled {
    graph: Arc<Graph>,
    log: Arc<PassLog>,
    schedule: Arc<Schedule>,
    /// `NDFUSE_DEBUG`: 1 = a line per kernel launched, 2 = plus the fusion report,
    /// 3 = plus the IR after each pass, 4 = plus the generated code.
    debug: u8,
    /// The last step that reads each buffer: it is dropped right after.
    last_read: rustc_hash::FxHashMap<NodeId, usize>,
    /// For the CPU target: the compiled kernel of each kernel step once a run has
    /// found or compiled it, so that re-evaluations skip `supports` and hashing the
    /// kernel description into the kernel cache (`None` until then, and for steps the
    /// interpreter runs).
    jit: Mutex<Vec<Option<Arc<CompiledKernel>>>>,
}

/// Runs `g` with the CPU JIT; kernels split their work on `pool`, or, when `None`, on
/// `cpu_threads` workers (0: the current rayon pool).
fn run_cpu(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &crate::config::Config,
    pool: Option<&rayon::ThreadPool>,
) -> Result<Evaluation, RuntimeError> {
    let own_pool = match pool {
        Some(_) => None,
        None => worker_pool(cfg.cpu_threads()),
    };
    let pool = pool.or(own_pool.as_deref());
    // The limits follow the configuration of this eval (a no-op when unchanged).
    let cache = crate::alloc::host_cache();
    cache.set_limits(crate::alloc::Limits::host(cfg));
    let (compiled_graph, compile_cached) =
        compile(g, false, cfg, &ndfuse_passes::TargetDesc::cpu())?;
    let Compiled {
        graph: optimized,
        log: passes,
        schedule,
        debug,
        last_read,
        jit,
    } = &*compiled_graph;
    let debug = *debug;
    let g = &**optimized;
    let mut bufs: rustc_hash::FxHashMap<NodeId, Buf<'_>> =
        inputs.iter().map(|(&n, a)| (n, Buf::Borrowed(a))).collect();
    let mut paths = Vec::with_capacity(schedule.steps.len());
    let (mut compile_time, mut run_time) = (Duration::ZERO, Duration::ZERO);
    for (i, step) in schedule.steps.iter().enumerate() {
        let read = |n: &NodeId| -> &HostArray {
            bufs.get(n)
                .unwrap_or_else(|| {
                    panic!("step {i} reads {n} before it is written (a scheduling bug)")
                })
                .get()
        };
        let (results, path) = match step {
            Step::Kernel {
                kernel,
                inputs: ins,
                outputs: outs,
            } => {
                let args: Vec<&HostArray> = ins.iter().map(read).collect();
                let start = Instant::now();
                let lock = || {
                    jit.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                };
                let known = lock()[i].clone();
                let (results, path, compiled_in, code) =
                    run_kernel(kernel, known, &args, debug, pool)?;
                if let Some(code) = code {
                    lock()[i].get_or_insert(code);
                }
                compile_time += compiled_in;
                let ran = start.elapsed().saturating_sub(compiled_in);
                run_time += ran;
                if debug >= 1 {
                    let bytes = kernel.bytes_in() + kernel.bytes_out();
                    let secs = ran.as_secs_f64();
                    let gbps = if secs > 0.0 {
                        bytes as f64 / secs / 1e9
                    } else {
                        0.0
                    };
                    eprintln!(
                        "ndfuse: {} [{path}] {:.3} ms, {bytes} B, {gbps:.2} GB/s",
                        kernel.name,
                        secs * 1e3
                    );
                }
                // A kernel writes flat buffers; each takes its node's shape.
                let shaped = outs.iter().zip(results).map(|(&n, a)| {
                    let shape = g.node(n).shape.clone();
                    let a = a
                        .reshaped(shape)
                        .expect("a kernel output holds its node's element count (a scheduling bug otherwise)");
                    (n, a)
                });
                (shaped.collect::<Vec<_>>(), path)
            }
            Step::Interp { node, operands, .. } => {
                let args: Vec<&HostArray> = operands.iter().map(read).collect();
                let start = Instant::now();
                let out = interp::eval_node(g.node(*node), &args)?;
                run_time += start.elapsed();
                (vec![(*node, out)], StepPath::Interp)
            }
        };
        for (n, a) in results {
            bufs.insert(n, Buf::Owned(a));
        }
        paths.push(path);
        for &r in step.reads() {
            if last_read.get(&r) == Some(&i) && !g.is_output(r) {
                bufs.remove(&r);
            }
        }
    }
    // Outputs move out of the buffer table (their memory goes back to the cache when the
    // caller drops them); an input returned as an output, or an output listed twice
    // before its last mention, is copied.
    let outs = g.outputs();
    let outputs = outs
        .iter()
        .enumerate()
        .map(|(k, o)| {
            let last_mention = !outs[k + 1..].contains(o);
            match bufs.remove(o) {
                Some(Buf::Owned(a)) if last_mention => a,
                Some(b) => {
                    let copy = b.get().clone();
                    bufs.insert(*o, b);
                    copy
                }
                None => panic!("output {o} was never computed (a scheduling bug)"),
            }
        })
        .collect();
    Ok(Evaluation {
        outputs,
        backend: BackendKind::Cpu,
        graph: Arc::clone(optimized),
        passes: Some(Arc::clone(passes)),
        schedule: Some(Arc::clone(schedule)),
        compile_cached,
        paths,
        compile_time,
        run_time,
        device: DeviceId::cpu(0),
        moves: Vec::new(),
    })
}

/// A compiled kernel from the cache, or freshly compiled and cached; `None` with the
/// reason when the codegen cannot compile it yet. The one place that decides which path
/// a kernel takes, for `execute` and `explain` alike.
fn compiled(
    kernel: &Kernel,
) -> Result<(Option<Arc<CompiledKernel>>, StepPath, Duration), RuntimeError> {
    if let Err(reason) = ndfuse_codegen_cpu::supports(kernel) {
        return Ok((None, StepPath::KernelInterp { reason }, Duration::ZERO));
    }
    let cached = kernel_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(kernel)
        .cloned();
    Ok(match cached {
        Some(c) => (Some(c), StepPath::Jit { cached: true }, Duration::ZERO),
        None => {
            let c = Arc::new(ndfuse_codegen_cpu::compile(kernel)?);
            let took = c.compile_time();
            kernel_cache()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(kernel.clone(), Arc::clone(&c));
            (Some(c), StepPath::Jit { cached: false }, took)
        }
    })
}

/// What [`run_kernel`] returns: the outputs, the path, the compile time, and the
/// compiled kernel that ran (`None` when the interpreter ran it).
type KernelRun = (
    Vec<HostArray>,
    StepPath,
    Duration,
    Option<Arc<CompiledKernel>>,
);

/// Runs one kernel: `known` (the compiled kernel an earlier run of the same compiled
/// graph used), else JIT-compiled (see [`compiled`]), or in the interpreter when the
/// codegen cannot compile it yet.
fn run_kernel(
    kernel: &Kernel,
    known: Option<Arc<CompiledKernel>>,
    args: &[&HostArray],
    debug: u8,
    pool: Option<&rayon::ThreadPool>,
) -> Result<KernelRun, RuntimeError> {
    let (compiled, path, took) = match known {
        Some(c) => (Some(c), StepPath::Jit { cached: true }, Duration::ZERO),
        None => compiled(kernel)?,
    };
    if let (Some(c), StepPath::Jit { cached: false }, 4..) = (&compiled, &path, debug) {
        eprintln!("ndfuse: Cranelift IR of {}\n{}", kernel.name, c.clif());
    }
    let Some(compiled) = compiled else {
        return Ok((interp::eval_kernel(kernel, args)?, path, took, None));
    };
    // Every element of every output is written by the kernel (`CompiledKernel::run`
    // covers the whole domain), so a recycled buffer's old contents never show.
    let cache = crate::alloc::host_cache();
    let mut outs: Vec<HostArray> = kernel
        .outputs
        .iter()
        .map(|b| cache.array(b.dtype, ndfuse_ir::Shape::new([b.len])))
        .collect::<Result<_, _>>()?;
    let mut out_refs: Vec<&mut HostArray> = outs.iter_mut().collect();
    // The parallel entry: chunks fixed by the kernel's shape run on the current rayon
    // pool (the global one, or the caller's inside `install`), or on the given pool (a
    // CPU device's, or `cpu_threads` workers); outputs are the same bits either way.
    match pool {
        Some(pool) => pool.install(|| compiled.run(args, &mut out_refs))?,
        None => compiled.run(args, &mut out_refs)?,
    }
    Ok((outs, path, took, Some(compiled)))
}

/// The pool for `cpu_threads` workers, `None` for 0 (use the current pool). One pool per
/// size, built on first use and kept: building threads per eval would dominate it.
fn worker_pool(cpu_threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    if cpu_threads == 0 {
        return None;
    }
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(p) = pools.get(&cpu_threads) {
        return Some(Arc::clone(p));
    }
    // A pool that cannot be built (the OS refused threads) falls back to the current one.
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(cpu_threads)
            .thread_name(|i| format!("ndfuse-cpu-{i}"))
            .build()
            .ok()?,
    );
    pools.insert(cpu_threads, Arc::clone(&pool));
    Some(pool)
}

/// What evaluating a graph would do, found without running it.
#[derive(Debug)]
pub struct Explanation {
    /// The backend that would run.
    pub backend: BackendKind,
    /// The graph that would run (after the clean-up passes on a compiling backend).
    pub graph: Arc<Graph>,
    /// What each pass did (absent for the interpreter backend).
    pub passes: Option<Arc<PassLog>>,
    /// The schedule (absent for the interpreter backend, which does not fuse).
    pub schedule: Option<Arc<Schedule>>,
    /// How each step would run, parallel to `schedule.steps`.
    pub paths: Vec<StepPath>,
    /// The generated code of each JIT-compiled kernel: (kernel name, Cranelift IR).
    pub code: Vec<(String, String)>,
}

/// Schedules `g` for `backend` and compiles its kernels (into the kernel cache, so a
/// later `execute` reuses them), without reading or writing any data.
pub fn explain(g: &Graph, backend: BackendKind) -> Result<Explanation, RuntimeError> {
    verify(g)?;
    let cfg = crate::config::Config::load()?;
    // Explaining runs nothing, so the CUDA C can be shown without a GPU.
    let chosen = if backend == BackendKind::Cuda {
        BackendKind::Cuda
    } else {
        crate::backend::resolve(backend, &cfg)?
    };
    match chosen {
        BackendKind::Interp => Ok(Explanation {
            backend: BackendKind::Interp,
            graph: Arc::new(g.clone()),
            passes: None,
            schedule: None,
            paths: Vec::new(),
            code: Vec::new(),
        }),
        BackendKind::Cuda => explain_cuda(g, &cfg),
        BackendKind::Auto | BackendKind::Cpu => {
            let (c, _) = compile(g, true, &cfg, &ndfuse_passes::TargetDesc::cpu())?;
            let (graph, passes, schedule) = (
                Arc::clone(&c.graph),
                Arc::clone(&c.log),
                Arc::clone(&c.schedule),
            );
            let mut paths = Vec::with_capacity(schedule.steps.len());
            let mut code = Vec::new();
            for step in &schedule.steps {
                paths.push(match step {
                    Step::Kernel { kernel, .. } => {
                        let (c, path, _) = compiled(kernel)?;
                        if let Some(c) = c {
                            code.push((kernel.name.clone(), c.clif().to_string()));
                        }
                        path
                    }
                    Step::Interp { .. } => StepPath::Interp,
                });
            }
            Ok(Explanation {
                backend: BackendKind::Cpu,
                graph,
                passes: Some(passes),
                schedule: Some(schedule),
                paths,
                code,
            })
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_unavailable() -> RuntimeError {
    RuntimeError::Unavailable {
        backend: "cuda",
        reason: "not compiled with CUDA (build ndfuse-runtime with the `cuda` feature)".into(),
    }
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _: &Graph,
    _: &HashMap<NodeId, Arc<HostArray>>,
    _: &crate::config::Config,
    _: usize,
) -> Result<Evaluation, RuntimeError> {
    Err(cuda_unavailable())
}

#[cfg(not(feature = "cuda"))]
fn explain_cuda(_: &Graph, _: &crate::config::Config) -> Result<Explanation, RuntimeError> {
    Err(cuda_unavailable())
}

/// Runs `g` on the CUDA device `ordinal`: passes and fusion for the CUDA target, then
/// [`crate::cuda::run`].
#[cfg(feature = "cuda")]
fn run_cuda(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &crate::config::Config,
    ordinal: usize,
) -> Result<Evaluation, RuntimeError> {
    let (c, compile_cached) = compile(g, false, cfg, &ndfuse_passes::TargetDesc::cuda())?;
    let dev = crate::cuda::device(ordinal, cfg)?;
    let run = crate::cuda::run(&dev, &c.graph, &c.schedule, inputs, cfg, c.debug)?;
    Ok(Evaluation {
        outputs: run.outputs,
        backend: BackendKind::Cuda,
        graph: Arc::clone(&c.graph),
        passes: Some(Arc::clone(&c.log)),
        schedule: Some(Arc::clone(&c.schedule)),
        compile_cached,
        paths: run.paths,
        compile_time: run.compile_time,
        // The kernels' device time: what `run_time` means on every backend (time
        // running steps), without the transfers a CPU backend does not have.
        run_time: run.kernel_time,
        device: DeviceId::cuda(ordinal),
        moves: Vec::new(),
    })
}

/// The CUDA C of every kernel of `g`, as the CUDA backend would compile it; needs no
/// GPU and no NVRTC.
#[cfg(feature = "cuda")]
fn explain_cuda(g: &Graph, cfg: &crate::config::Config) -> Result<Explanation, RuntimeError> {
    let (c, _) = compile(g, true, cfg, &ndfuse_passes::TargetDesc::cuda())?;
    let opts = crate::cuda::cuda_options(cfg);
    let mut paths = Vec::with_capacity(c.schedule.steps.len());
    let mut code = Vec::new();
    for step in &c.schedule.steps {
        paths.push(match step {
            Step::Kernel { kernel, .. } => {
                let k = ndfuse_codegen_cuda::emit(kernel, &opts)?;
                let launches: Vec<String> = k
                    .launches
                    .iter()
                    .map(|l| {
                        format!(
                            "// launch {}<<<{}, ({}, {})>>>\n",
                            l.function, l.grid, l.block.0, l.block.1
                        )
                    })
                    .collect();
                code.push((
                    kernel.name.clone(),
                    format!("{}{}", launches.concat(), k.source),
                ));
                StepPath::CudaSource
            }
            Step::Interp { .. } => StepPath::Interp,
        });
    }
    Ok(Explanation {
        backend: BackendKind::Cuda,
        graph: Arc::clone(&c.graph),
        passes: Some(Arc::clone(&c.log)),
        schedule: Some(Arc::clone(&c.schedule)),
        paths,
        code,
    })
}
