//! `Evaluation`: what one evaluation produced, which backend and device ran it, and how
//! each step ran.

use crate::backend_kind::BackendKind;
use crate::device_id::{DeviceId, DeviceMove};
use crate::step_path::StepPath;
use ndfuse_ir::{Graph, HostArray};
use ndfuse_passes::{PassLog, Schedule};
use std::sync::Arc;
use std::time::Duration;

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
