//! What an evaluation did ([`Report`]: the graph, its kernels, where it ran, bytes
//! moved) and arrays copied to a device ([`DeviceArray`]).

use crate::array::Array;
use ndfuse_ir::{Graph, NodeId};
use ndfuse_runtime::{DeviceId, Evaluation};
use std::sync::Arc;

/// An array copied to a device with [`Context::to_device`].
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceArray {
    pub(crate) array: Array,
    pub(crate) device: DeviceId,
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
    pub(crate) graph: Arc<Graph>,
    pub(crate) ev: Evaluation,
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

    /// Time spent compiling kernels (and checking that a kernel of a known shape
    /// family lowers to its code: `kernel_families`); zero when every kernel came
    /// from the cache.
    pub fn compile_time(&self) -> std::time::Duration {
        self.ev.compile_time
    }

    /// Time spent running the steps.
    pub fn run_time(&self) -> std::time::Duration {
        self.ev.run_time
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
