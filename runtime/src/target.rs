//! Where one evaluation runs ([`Target`]: the CPU JIT on a pool, or a CUDA device) and
//! [`execute_on`], which runs it there: what a device of a [`crate::DeviceSet`] calls.

#[cfg(feature = "cuda")]
use crate::backend_kind::BackendKind;
#[cfg(feature = "cuda")]
use crate::compile::compile;
use crate::config::Config;
use crate::cpu::run_cpu;
#[cfg(feature = "cuda")]
use crate::device_id::DeviceId;
use crate::error::RuntimeError;
use crate::evaluation::Evaluation;
use ndfuse_ir::{Graph, HostArray, NodeId, Op, TensorType};
use std::collections::HashMap;
use std::sync::Arc;

/// Checks that every input the outputs need has data of the declared type.
pub(crate) fn check_inputs(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
) -> Result<(), RuntimeError> {
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

/// Where [`execute_on`] runs an evaluation.
pub(crate) enum Target<'a> {
    /// The CPU JIT, kernels on this pool (`None`: as [`crate::execute`] does).
    Cpu(Option<&'a rayon::ThreadPool>),
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

/// Evaluates `g` on one device of a [`crate::DeviceSet`], under the caller's `cfg`.
pub(crate) fn execute_on(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &Config,
    target: Target<'_>,
) -> Result<Evaluation, RuntimeError> {
    // `compile` verifies `g` unless it compiled it before (see `execute`).
    check_inputs(g, inputs)?;
    match target {
        Target::Cpu(pool) => run_cpu(g, inputs, cfg, pool),
        Target::Cuda(ordinal) => run_cuda(g, inputs, cfg, ordinal),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_unavailable() -> RuntimeError {
    RuntimeError::Unavailable {
        backend: "cuda",
        reason: "not compiled with CUDA (build ndfuse-runtime with the `cuda` feature)".into(),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn run_cuda(
    _: &Graph,
    _: &HashMap<NodeId, Arc<HostArray>>,
    _: &Config,
    _: usize,
) -> Result<Evaluation, RuntimeError> {
    Err(cuda_unavailable())
}

/// Runs `g` on the CUDA device `ordinal`: passes and fusion for the CUDA target, then
/// [`crate::cuda::run`].
#[cfg(feature = "cuda")]
pub(crate) fn run_cuda(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &Config,
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
