//! Convexity: a group may become one kernel only if no path leaves it and comes back
//! into it (the kernel would wait for itself). Every rule that grows a group asks here.

use super::group::Fuser;
use ndfuse_ir::NodeId;
use std::collections::HashSet;

impl Fuser<'_> {
    /// Whether `x` is in one of the groups `gs` or is `extra`.
    fn in_union(&self, x: NodeId, gs: &[usize], extra: Option<NodeId>) -> bool {
        Some(x) == extra || self.group_of(x).is_some_and(|g| gs.contains(&g))
    }

    /// Whether the groups `gs` and the node `extra` together can be one kernel without a
    /// cycle: no path leaves the set and comes back into it. Paths are taken between
    /// kernels, not only between nodes: a kernel runs after all of its inputs, so
    /// reaching any member of another group means depending on everything that group
    /// reads (sibling merges join nodes with no path between them). The search goes
    /// backwards from the operands the set reads from outside (each group keeps them in
    /// `ext`) and stops at nodes, or whole groups, placed before the set.
    pub(super) fn convex_union(&self, gs: &[usize], extra: Option<NodeId>) -> bool {
        let min = gs
            .iter()
            .map(|&g| self.groups[g].min_pos)
            .chain(extra.map(|n| self.pos[&n]))
            .min()
            .unwrap_or(0);
        let mut stack: Vec<NodeId> = gs
            .iter()
            .flat_map(|&g| self.groups[g].ext.iter().copied())
            .chain(extra.map(|n| self.g.operands(n)).unwrap_or_default())
            .filter(|&o| !self.in_union(o, gs, extra))
            .collect();
        let mut seen: HashSet<NodeId> = HashSet::new();
        let mut seen_groups: HashSet<usize> = HashSet::new();
        while let Some(x) = stack.pop() {
            if self.in_union(x, gs, extra) {
                return false;
            }
            if !seen.insert(x) {
                continue;
            }
            match self.group_of(x) {
                Some(h) => {
                    if seen_groups.insert(h) && self.groups[h].max_pos >= min {
                        stack.extend(self.groups[h].ext.iter().copied());
                    }
                }
                None => {
                    if self.pos[&x] >= min {
                        stack.extend(self.g.operands(x));
                    }
                }
            }
        }
        true
    }
}
