//! Common subexpression elimination: nodes with the same op, dtype, shape and operands
//! compute the same value, so every one but the first is replaced by the first.
//! Constants are included (a `2.0` fill written twice by the user, or made twice by
//! folding, becomes one), which lets `simplify` see `maximum(x, x)` and `where(c, x, x)`.

use crate::pass::{live_order, Pass, PassCx, PassError};
use ndfuse_ir::{DType, Graph, NodeId, Op, Shape};
use std::collections::HashMap;

/// Merges structurally identical nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cse;

/// What makes two nodes compute the same value. `Op` equality is structural with
/// bitwise constants (`-0.0` and `0.0` are different constants, NaNs of one payload
/// the same).
type Key = (Op, DType, Shape, Vec<NodeId>);

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, g: &mut Graph, _cx: &PassCx) -> Result<bool, PassError> {
        let mut first: HashMap<Key, NodeId> = HashMap::new();
        let mut changed = false;
        // Topological order: a node's operands were already replaced by their first
        // copies, so duplicates of whole expressions are found in one sweep, and the
        // copy kept is the earliest (deterministic).
        for id in live_order(g, self.name())? {
            let node = g.node(id);
            // Inputs are bound to their node ids by the caller; never merge them.
            if node.op.is_input() {
                continue;
            }
            let key = (
                node.op.clone(),
                node.dtype,
                node.shape.clone(),
                g.operands(id),
            );
            match first.get(&key) {
                Some(&kept) => {
                    g.replace_all_uses(id, kept);
                    changed = true;
                }
                None => {
                    first.insert(key, id);
                }
            }
        }
        Ok(changed)
    }
}
