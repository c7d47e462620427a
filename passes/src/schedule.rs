//! The schedule: what `passes` hands to a backend. An ordered list of steps, each either
//! a fused [`Kernel`] or one node the reference interpreter evaluates, plus, for every
//! graph node, where it ended up and why (for dumps and `ndfuse explain`).

use ndfuse_ir::{Graph, Kernel, NodeId};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One unit of work, in execution order.
// A schedule holds a handful of steps, built once per compile: boxing the kernel would
// only add an indirection to every match.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A fused kernel. `inputs[i]` is the graph node whose buffer feeds
    /// `kernel.inputs[i]`; `outputs[j]` the node whose buffer `kernel.outputs[j]` fills.
    Kernel {
        /// The kernel description.
        kernel: Kernel,
        /// Buffer nodes read, in `kernel.inputs` order.
        inputs: Vec<NodeId>,
        /// Nodes materialised, in `kernel.outputs` order.
        outputs: Vec<NodeId>,
    },
    /// One node evaluated by the reference interpreter on its materialised operands.
    Interp {
        /// The node evaluated.
        node: NodeId,
        /// Its operands (each has a buffer), in slot order.
        operands: Vec<NodeId>,
        /// Why it is not in a kernel.
        reason: String,
    },
}

impl Step {
    /// The nodes whose buffers this step reads.
    pub fn reads(&self) -> &[NodeId] {
        match self {
            Step::Kernel { inputs, .. } => inputs,
            Step::Interp { operands, .. } => operands,
        }
    }

    /// The nodes whose buffers this step writes.
    pub fn writes(&self) -> Vec<NodeId> {
        match self {
            Step::Kernel { outputs, .. } => outputs.clone(),
            Step::Interp { node, .. } => vec![*node],
        }
    }
}

/// Where a graph node is computed, recorded for dumps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Bound by the caller.
    Input,
    /// Computed inside step `step` (a kernel); `stored` says why it is also written to
    /// memory, if it is.
    InKernel {
        /// Index into [`Schedule::steps`].
        step: usize,
        /// Why the value is materialised, if it is (a kernel boundary).
        stored: Option<String>,
    },
    /// A view or constant folded into the loads of the kernels that read it.
    Folded,
    /// An output of the graph that is the buffer of `of` under its own shape: a reshape
    /// reading that whole buffer in order, handed back without a copy.
    Alias {
        /// The node whose buffer holds the output's elements.
        of: NodeId,
    },
    /// Evaluated by the interpreter in step `step`.
    Interp {
        /// Index into [`Schedule::steps`].
        step: usize,
    },
    /// Not needed by any output.
    Dead,
}

/// The result of scheduling a graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// Where every node of the graph went.
    pub placement: HashMap<NodeId, Placement>,
}

impl Schedule {
    /// Number of kernel steps.
    pub fn kernel_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Kernel { .. }))
            .count()
    }

    /// The node whose buffer holds output `o`: `o`'s own, or the buffer an output
    /// aliases ([`Placement::Alias`]).
    pub fn output_buffer(&self, o: NodeId) -> NodeId {
        match self.placement.get(&o) {
            Some(Placement::Alias { of }) => *of,
            _ => o,
        }
    }

    /// The kernels, in order.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Kernel { kernel, .. } => Some(kernel),
            Step::Interp { .. } => None,
        })
    }

    /// The note a graph dump shows after `id` (`k0`, `k0, stored: output of the graph`,
    /// `folded into loads`, `interp: ...`). `kernel_path` names how a kernel step runs on
    /// the chosen backend (`jit`, `interp: <why the code generator refused it>`), when
    /// known.
    pub fn note(
        &self,
        g: &Graph,
        id: NodeId,
        kernel_path: &dyn Fn(usize) -> Option<String>,
    ) -> Option<String> {
        let mut s = String::new();
        match self.placement.get(&id)? {
            Placement::Input => return None,
            Placement::Dead => s.push_str("dead: no output needs it"),
            Placement::Folded => s.push_str("folded into loads"),
            Placement::Alias { of } => {
                let num = g.print_numbering();
                let of = num.get(of).map_or_else(|| "?".into(), ToString::to_string);
                let _ = write!(s, "the buffer of %{of}, reshaped (no copy)");
            }
            Placement::InKernel { step, stored } => {
                let Step::Kernel { kernel, .. } = &self.steps[*step] else {
                    unreachable!("InKernel placement points at a kernel step (a bug otherwise)");
                };
                let _ = write!(s, "{}", kernel.name);
                if let Some(path) = kernel_path(*step) {
                    let _ = write!(s, " [{path}]");
                }
                if let Some(why) = stored {
                    let _ = write!(s, ", stored: {why}");
                }
            }
            Placement::Interp { step } => {
                let Step::Interp { node, reason, .. } = &self.steps[*step] else {
                    unreachable!("Interp placement points at an interp step (a bug otherwise)");
                };
                let _ = write!(s, "{}: {reason}", step_kind(g, *node));
            }
        }
        Some(s)
    }

    /// The graph's text form with each node's placement noted.
    pub fn annotate(&self, g: &Graph, kernel_path: &dyn Fn(usize) -> Option<String>) -> String {
        g.to_text_with(&|id| self.note(g, id, kernel_path))
    }
}

/// How a step of its own for `node` runs: `routine` for the ops the backends run as
/// native routines (scatter-add, scans, sorts; recorded as [`Step::Interp`] with the
/// node), `interp` for the reference interpreter.
fn step_kind(g: &Graph, node: NodeId) -> &'static str {
    if g.node(node).op.is_routine() {
        "routine"
    } else {
        "interp"
    }
}

impl Schedule {
    /// Every step in order: kernels in full, interpreter steps as one line, with node
    /// numbers as in the graph's printed form.
    pub fn to_text(&self, g: &Graph) -> String {
        let num = g.print_numbering();
        let mut out = String::new();
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::Kernel { kernel, .. } => {
                    let _ = write!(out, "step {i}: {kernel}");
                }
                Step::Interp { node, reason, .. } => {
                    let n = num.get(node).copied().unwrap_or(usize::MAX);
                    let _ = writeln!(
                        out,
                        "step {i}: {} %{n} {} ; {reason}",
                        step_kind(g, *node),
                        g.node(*node).op.name()
                    );
                }
            }
        }
        out
    }
}
