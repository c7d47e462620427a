//! The vocabulary every pass shares: the [`Pass`] trait, what a pass may consult
//! ([`PassCx`]), the crate's one error enum ([`PassError`]), and `live_order`, the graph
//! query every clean-up pass starts from. The passes and the manager both build on it.

use ndfuse_ir::{Graph, IrError, NodeId, TensorType, VerifyErrors};
use std::fmt;
use std::path::PathBuf;

/// One graph-to-graph transformation. Implementations are unit structs, one per file,
/// that leave the shared work (verify, time, log, dump) to `PassManager`.
///
/// A pass must report `Ok(true)` exactly when it changed the graph: the manager stops
/// at the first full lap of unchanged passes and logs "(unchanged)" from the flag.
pub trait Pass: fmt::Debug + Send + Sync {
    /// The name used in logs, dump file names and `NDFUSE_DISABLE_PASSES`.
    fn name(&self) -> &'static str;

    /// Rewrites `g` in place; `Ok(changed)`.
    fn run(&self, g: &mut Graph, cx: &PassCx) -> Result<bool, PassError>;
}

/// What a pass may consult besides the graph. Small on purpose; later passes (plans)
/// add their target description here rather than reaching for a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassCx {
    /// How many sweeps over the graph a rule-table pass may make before giving up with
    /// [`PassError::SweepLimit`]. Rules only ever shrink or canonicalise the graph, so
    /// real graphs settle in a few sweeps; hitting the limit means two rules undo each
    /// other.
    pub max_sweeps: usize,
}

impl Default for PassCx {
    fn default() -> PassCx {
        PassCx { max_sweeps: 64 }
    }
}

/// Why the pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The graph handed to the manager does not verify (no pass ran).
    #[error("the input graph is invalid, before any pass ran: {errors}\nIR:\n{ir}")]
    InvalidInput {
        /// Every problem found.
        errors: VerifyErrors,
        /// The input IR.
        ir: String,
    },
    /// A pass left a graph that does not verify: a bug in that pass.
    #[error("pass `{pass}` left an invalid graph (a bug in the pass): {errors}\nIR after `{pass}`:\n{ir}")]
    Verify {
        /// The pass that ran last.
        pass: &'static str,
        /// Every problem found.
        errors: VerifyErrors,
        /// The IR after the pass.
        ir: String,
    },
    /// A pass said "unchanged" but the IR text differs (checked when verifying).
    #[error("pass `{pass}` reported no change but changed the graph (a bug in the pass)\nIR before:\n{before}\nIR after:\n{after}")]
    ChangedFlag {
        /// The pass.
        pass: &'static str,
        /// IR before the pass.
        before: String,
        /// IR after the pass.
        after: String,
    },
    /// A pass built a node that shape/dtype inference rejects: a bug in a rewrite rule.
    #[error("pass `{pass}` built an illegal node (a bug in the pass): {source}")]
    Ir {
        /// The pass.
        pass: &'static str,
        /// What inference said.
        #[source]
        source: IrError,
    },
    /// A rewrite would replace a node by one of another dtype or shape: a bug in a rule
    /// (the verifier cannot see it when the node is an output).
    #[error("pass `{pass}` tried to replace a {op} of type {from} by a node of type {to} (a bug in the rule)")]
    Retype {
        /// The pass.
        pass: &'static str,
        /// The replaced node's op.
        op: &'static str,
        /// The replaced node's type.
        from: TensorType,
        /// The replacement's type.
        to: TensorType,
    },
    /// The graph has a cycle (only possible when the input was not verified).
    #[error("pass `{pass}`: the graph has a cycle through {node}")]
    Cycle {
        /// The pass that found it.
        pass: &'static str,
        /// A node on the cycle.
        node: NodeId,
    },
    /// A rule-table pass did not reach its fixed point within [`PassCx::max_sweeps`].
    #[error("pass `{pass}` still rewrote the graph after {sweeps} sweeps (two rules undo each other: a bug)")]
    SweepLimit {
        /// The pass.
        pass: &'static str,
        /// The limit.
        sweeps: usize,
    },
    /// The pipeline did not settle within `PassOptions::max_laps` laps.
    #[error("the pass pipeline still changed the graph after {laps} laps (passes undo each other: a bug); last lap changed: {changed:?}")]
    LapLimit {
        /// The limit.
        laps: usize,
        /// The passes that changed the graph in the last lap.
        changed: Vec<&'static str>,
    },
    /// A name in `PassOptions::disabled` is no pass of the pipeline.
    #[error("cannot disable pass {name:?}: no such pass (known: {known})")]
    UnknownPass {
        /// The name given.
        name: String,
        /// The names that exist, comma-separated.
        known: String,
    },
    /// A dump file could not be written.
    #[error("cannot write the IR dump {path}: {source}")]
    Dump {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The nodes the outputs need, in topological order: what a clean-up pass looks at.
/// Dead nodes are skipped so that a pass never rewrites them again and again (they
/// stay until DCE, which may be disabled).
pub(crate) fn live_order(g: &Graph, pass: &'static str) -> Result<Vec<NodeId>, PassError> {
    let order = g
        .topo_order()
        .map_err(|node| PassError::Cycle { pass, node })?;
    let mut live = std::collections::HashSet::new();
    let mut stack: Vec<NodeId> = g.outputs().to_vec();
    while let Some(n) = stack.pop() {
        if live.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    Ok(order.into_iter().filter(|n| live.contains(n)).collect())
}
