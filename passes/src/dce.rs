//! Dead code elimination: removes the nodes no output needs. The rewriting passes only
//! redirect uses and leave the old nodes behind; this pass sweeps them all at once.

use crate::pass::{live_order, Pass, PassCx, PassError};
use ndfuse_ir::Graph;
use std::collections::HashSet;

/// Removes nodes that no output depends on (inputs are kept).
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        let live: HashSet<_> = live_order(g, self.name())?.into_iter().collect();
        // Inputs stay even when unused: the caller binds arrays to them by node id and
        // may still hand one over; they cost nothing.
        let dead: Vec<_> = g
            .node_ids()
            .into_iter()
            .filter(|n| !live.contains(n) && !g.node(*n).op.is_input())
            .collect();
        for &n in &dead {
            g.remove(n);
        }
        Ok(!dead.is_empty())
    }
}
