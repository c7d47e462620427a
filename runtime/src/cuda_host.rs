//! What a CUDA evaluation does on the host around its launches: the checks before a
//! launch (the buffers handed to an emitted kernel or routine hold what it reads and
//! writes; a scatter-add's user indices are in range, since the emitted routine skips
//! those that are not), and the steps the device has no code for (a routine with no
//! emitted kernel runs the CPU routine, any other node the interpreter).

use crate::error::RuntimeError;
use crate::routines::run_routine;
use crate::step_path::StepPath;
use cudarc::driver::CudaSlice;
use ndfuse_ir::{HostArray, Node, NodeId, TensorType};
use ndfuse_passes::Step;
use std::collections::HashMap;

/// Routine `node` on the host (the device has no kernel for it, for `reason`): its CPU
/// routine, else the interpreter; with the path that says which.
pub(crate) fn run_on_host(
    node: &Node,
    operands: &[&HostArray],
    reason: String,
    debug: u8,
) -> Result<(HostArray, StepPath), RuntimeError> {
    match run_routine(node, operands) {
        Some(out) => {
            if debug >= 1 {
                eprintln!("ndfuse: {} [host routine] {reason}", node.op.name());
            }
            let device = format!("cpu, not on the device: {reason}");
            Ok((out?, StepPath::Routine { device }))
        }
        None => Ok((
            ndfuse_ir::interp::eval_node(node, operands)?,
            StepPath::Interp,
        )),
    }
}

/// One device buffer per operand of an emitted routine, each holding its operand.
pub(crate) fn check_routine_sizes(name: &str, types: &[TensorType], bufs: &[&CudaSlice<u8>]) {
    assert_eq!(
        types.len(),
        bufs.len(),
        "routine {name}: operand count (a runtime bug)"
    );
    for (t, b) in types.iter().zip(bufs) {
        assert!(
            b.len() >= t.shape.numel() * t.dtype.size_bytes(),
            "routine {name}: a buffer of {} bytes for {t} (a runtime bug)",
            b.len()
        );
    }
}

/// One buffer per parameter of the emitted functions (every input but a contraction's
/// product, which has no buffer and no parameter; every output), each holding at least
/// what the kernel description reads or writes.
pub(crate) fn check_sizes(k: &ndfuse_ir::Kernel, ins: &[&CudaSlice<u8>], outs: &[&CudaSlice<u8>]) {
    let bound = k.inputs.len() - usize::from(k.contraction.is_some());
    assert!(
        ins.len() == bound && outs.len() == k.outputs.len(),
        "kernel {}: {} input and {} output buffers for {bound} inputs and {} outputs (a runtime bug)",
        k.name,
        ins.len(),
        outs.len(),
        k.outputs.len()
    );
    for (b, s) in k.inputs.iter().zip(ins) {
        assert!(
            s.len() >= b.len * b.dtype.size_bytes(),
            "kernel {}: an input buffer of {} bytes for {} x {} (a runtime bug)",
            k.name,
            s.len(),
            b.len,
            b.dtype
        );
    }
    for (b, s) in k.outputs.iter().zip(outs) {
        assert!(
            s.len() >= b.len * b.dtype.size_bytes(),
            "kernel {}: an output buffer of {} bytes for {} x {} (a runtime bug)",
            k.name,
            s.len(),
            b.len,
            b.dtype
        );
    }
}

/// Scatter-add's indices, checked as the CPU routine and the interpreter check them: the
/// first (row-major) index outside `-n..n` is the interpreter's error.
pub(crate) fn check_scatter_indices(
    idx: &HostArray,
    axis: usize,
    n: usize,
) -> Result<(), RuntimeError> {
    let bad = |k: i64| !(-(n as i64)..n as i64).contains(&k);
    let found = match idx.storage() {
        ndfuse_ir::Storage::I32(ks) => ks
            .iter()
            .position(|&k| bad(k.into()))
            .map(|p| (p, i64::from(ks[p]))),
        ndfuse_ir::Storage::I64(ks) => ks.iter().position(|&k| bad(k)).map(|p| (p, ks[p])),
        _ => None,
    };
    let Some((mut p, value)) = found else {
        return Ok(());
    };
    let dims = idx.shape().dims();
    let mut position = vec![0; dims.len()];
    for (a, &d) in dims.iter().enumerate().rev() {
        if d > 0 {
            position[a] = p % d;
            p /= d;
        }
    }
    Err(ndfuse_ir::interp::InterpError::IndexOutOfRange {
        op: "scatter_add",
        axis,
        value,
        position,
        extent: n,
    }
    .into())
}

/// Drops the buffers step `i` read last (not the graph's outputs, nor a buffer an
/// output aliases: `kept`): back to the device cache, where later allocations are
/// ordered after this step's launches on the one stream.
pub(crate) fn release_reads<B>(
    step: &Step,
    i: usize,
    last_read: &HashMap<NodeId, usize>,
    kept: &[NodeId],
    bufs: &mut HashMap<NodeId, B>,
) {
    for &r in step.reads() {
        if last_read.get(&r) == Some(&i) && !kept.contains(&r) {
            bufs.remove(&r);
        }
    }
}
