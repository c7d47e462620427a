//! The executor: [`execute`] and [`explain`], which load the configuration, pick the
//! backend (or the thread's device) and hand the graph to the CPU JIT, the CUDA device,
//! a device set or the interpreter.

use crate::backend_kind::BackendKind;
use crate::compile::compile;
use crate::config::Config;
use crate::cpu::{compiled, run_cpu};
use crate::device_id::DeviceId;
use crate::error::RuntimeError;
use crate::evaluation::Evaluation;
use crate::step_path::StepPath;
#[cfg(not(feature = "cuda"))]
use crate::target::cuda_unavailable;
use crate::target::{check_inputs, run_cuda};
use ndfuse_ir::interp;
use ndfuse_ir::{verify, Graph, HostArray, NodeId};
use ndfuse_passes::{PassLog, Schedule, Step};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
fn current_config() -> Result<Config, RuntimeError> {
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
    let cfg = Config::load()?;
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
                    Step::Interp { node, .. } => routine_path(&graph, *node, "cpu"),
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

/// How `explain` says a step of its own will run: a native routine of `device` for the
/// ops that have one (scatter-add, scans, sorts), the interpreter for anything else.
fn routine_path(g: &Graph, node: ndfuse_ir::NodeId, device: &str) -> StepPath {
    if g.node(node).op.is_routine() {
        StepPath::Routine {
            device: device.into(),
        }
    } else {
        StepPath::Interp
    }
}

#[cfg(not(feature = "cuda"))]
fn explain_cuda(_: &Graph, _: &Config) -> Result<Explanation, RuntimeError> {
    Err(cuda_unavailable())
}

/// The CUDA C of every kernel of `g`, as the CUDA backend would compile it; needs no
/// GPU and no NVRTC.
#[cfg(feature = "cuda")]
fn explain_cuda(g: &Graph, cfg: &Config) -> Result<Explanation, RuntimeError> {
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
                // Where cuBLASLt loads, the product is its call instead of this GEMM.
                let blas = crate::cublas::cublaslt_call(kernel)
                    .map(|call| {
                        format!(
                            "// on a GPU with cuBLASLt (NDFUSE_CUDA_GEMM unset): {call}; else:\n"
                        )
                    })
                    .unwrap_or_default();
                code.push((
                    kernel.name.clone(),
                    format!("{blas}{}{}", launches.concat(), k.source),
                ));
                StepPath::CudaSource
            }
            Step::Interp { node, .. } => routine_path(&c.graph, *node, "cuda"),
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
