//! The grouping rules (1, 2 and 4 of the `fusion` docs): which ops join which group as the
//! graph is walked in topological order, and which sibling groups merge afterwards.

use super::group::{Fuser, Role};
use ndfuse_ir::{Level, NodeId, Op, Shape};

impl Fuser<'_> {
    /// Rules 1-3: grow groups in topological order.
    pub(super) fn form_groups(&mut self) {
        for n in self.order.clone() {
            let node = self.g.node(n);
            if matches!(self.role[&n], Role::Widened | Role::Prologue) {
                continue; // read through by the product that uses it
            }
            match &node.op {
                Op::Input { .. } | Op::Const { .. } | Op::RandomUniform { .. } => {}
                // Computed in every kernel that reads it (rule 5).
                Op::Iota { .. } => {}
                // Steps of their own (lowered in `lower`).
                Op::ScatterAdd { .. }
                | Op::Scan { .. }
                | Op::Argsort { .. }
                | Op::Attention(_)
                | Op::AttentionBackward(_)
                | Op::Linalg(_)
                | Op::QuantMatMul(_) => {}
                // Reads at computed positions start a group; their consumers join it.
                Op::Gather { .. } | Op::Concat { .. } | Op::Pad { .. } => {
                    self.new_group(n, node.shape.clone(), None, Level::Element);
                    let gi = self.groups.len() - 1;
                    self.groups[gi].reads.push(n);
                }
                Op::View(v) => self.try_alias(n, v),
                Op::Reduce { axes, .. } => self.place_reduction(n, axes.clone()),
                Op::ArgReduce { axis, .. } => self.place_reduction(n, vec![*axis]),
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => {
                    self.place_elementwise(n)
                }
                Op::MatMul => {
                    self.new_group(n, node.shape.clone(), None, Level::Element);
                    let gi = self.groups.len() - 1;
                    self.groups[gi].contract = Some(n);
                }
            }
        }
        self.compact_groups();
    }

    /// Rule 1 for one element-wise node.
    fn place_elementwise(&mut self, n: NodeId) {
        let mut cands: Vec<usize> = self
            .g
            .operands(n)
            .into_iter()
            .filter_map(|o| self.group_of(o))
            .collect();
        cands.sort_unstable();
        cands.dedup();
        if !self.fuse {
            cands.clear();
        }
        let fit = |f: &Self, gs: &[usize]| -> Option<(Level, Option<Vec<usize>>)> {
            f.elementwise_fit(n, gs)
                .filter(|_| f.convex_union(gs, Some(n)) && f.indexed_union_ok(gs, Some(n)))
        };
        let choice = fit(self, &cands).map(|lv| (cands.clone(), lv)).or_else(|| {
            cands
                .iter()
                .find_map(|&c| fit(self, &[c]).map(|lv| (vec![c], lv)))
        });
        match choice {
            Some((gs, (level, reduce))) => {
                self.merge(&gs, Some(n));
                self.groups[gs[0]].reduce = reduce;
                self.level.insert(n, level);
            }
            None => self.new_group(n, self.g.node(n).shape.clone(), None, Level::Element),
        }
    }

    /// The level `n` would have in the union of groups `gs`, and the union's reduce
    /// axes, when they are compatible (one domain, agreeing reduce axes) and `n` fits.
    fn elementwise_fit(&self, n: NodeId, gs: &[usize]) -> Option<(Level, Option<Vec<usize>>)> {
        let first = self.groups.get(*gs.first()?)?;
        if gs.len() > 1 && !self.epilogue_may_absorb(gs) {
            return None;
        }
        let mut reduce: Option<Vec<usize>> = None;
        for &gi in gs {
            let grp = &self.groups[gi];
            if grp.domain != first.domain {
                return None;
            }
            match (&reduce, &grp.reduce) {
                (Some(a), Some(b)) if a != b => return None,
                (None, Some(b)) => reduce = Some(b.clone()),
                _ => {}
            }
        }
        let shape = &self.g.node(n).shape;
        let in_group: Vec<Level> = self
            .g
            .operands(n)
            .into_iter()
            .filter(|o| self.group_of(*o).is_some_and(|g| gs.contains(&g)))
            .map(|o| self.level[&o])
            .collect();
        if in_group.contains(&Level::Element) {
            (shape == &first.domain).then_some((Level::Element, reduce))
        } else {
            let rows = first.rows(reduce.as_deref()?);
            (shape.numel() == rows).then_some((Level::Row, reduce))
        }
    }

    /// Whether groups `gs` (more than one) may become one group as far as matrix
    /// products go: when one is a product's epilogue, the others must be plain
    /// element-wise groups (no product, no reduction) that compute none of the product's
    /// operands, since the product runs before its epilogue. An optimiser's update is
    /// the case in point: `m * beta1` reads only inputs, so it forms a group before the
    /// gradient's product exists, and `m * beta1 + g * (1 - beta1)` then joins the two;
    /// with this the whole update is the gradient product's epilogue. (An operand
    /// computed outside the union from one of these groups is a path that leaves the
    /// union and comes back: `convex_union` refuses it.)
    fn epilogue_may_absorb(&self, gs: &[usize]) -> bool {
        let products: Vec<NodeId> = gs
            .iter()
            .filter_map(|&gi| self.groups[gi].contract)
            .collect();
        match products.as_slice() {
            [] => true,
            [p] => {
                let mut read = self.g.operands(*p);
                // A widened half operand or a prologue step is read through: the product
                // reads its operand (a chain of steps, down to the buffer).
                let mut i = 0;
                while i < read.len() {
                    let o = read[i];
                    if matches!(self.role[&o], Role::Widened | Role::Prologue) {
                        read.extend(self.g.operands(o));
                    }
                    i += 1;
                }
                gs.iter().all(|&gi| {
                    let grp = &self.groups[gi];
                    grp.contract.is_some()
                        || (grp.reduce.is_none()
                            && !read.iter().any(|&o| self.group_of(o) == Some(gi)))
                })
            }
            _ => false,
        }
    }

    /// Rule 2 for a reduction (or argmax/argmin) over `axes` of its operand.
    fn place_reduction(&mut self, n: NodeId, axes: Vec<usize>) {
        let o = self.g.operands(n)[0];
        let joins = self.group_of(o).filter(|_| self.fuse).filter(|&gi| {
            let grp = &self.groups[gi];
            self.level[&o] == Level::Element
                && grp.contract.is_none()
                && grp.domain == self.g.node(o).shape
                && grp.reduce.as_ref().is_none_or(|r| *r == axes)
                && grp.reads.is_empty()
                && self.convex_union(&[gi], Some(n))
        });
        match joins {
            Some(gi) => {
                self.merge(&[gi], Some(n));
                self.groups[gi].reduce = Some(axes);
                self.level.insert(n, Level::Row);
            }
            None => {
                let domain = self.g.node(o).shape.clone();
                self.new_group(n, domain, Some(axes), Level::Row);
            }
        }
    }

    /// Rule 4: merges groups of one domain and compatible reduce axes, in graph order,
    /// whenever convex.
    pub(super) fn merge_siblings(&mut self) {
        let mut buckets: Vec<(Shape, Vec<usize>)> = Vec::new();
        for gi in 0..self.groups.len() {
            if self.groups[gi].contract.is_some() {
                continue; // an epilogue takes consumers of its product only (rule 1)
            }
            let domain = &self.groups[gi].domain;
            match buckets.iter_mut().find(|(s, _)| s == domain) {
                Some((_, v)) => v.push(gi),
                None => buckets.push((domain.clone(), vec![gi])),
            }
        }
        for (_, bucket) in buckets {
            let mut kept: Vec<usize> = Vec::new();
            for gi in bucket {
                let target = kept.iter().copied().find(|&k| {
                    let (a, b) = (&self.groups[k].reduce, &self.groups[gi].reduce);
                    let compatible = a.is_none() || b.is_none() || a == b;
                    compatible
                        && self.convex_union(&[k, gi], None)
                        && self.indexed_union_ok(&[k, gi], None)
                });
                match target {
                    Some(k) => {
                        let reduce = self.groups[k]
                            .reduce
                            .clone()
                            .or_else(|| self.groups[gi].reduce.clone());
                        self.merge(&[k, gi], None);
                        self.groups[k].reduce = reduce;
                    }
                    None => kept.push(gi),
                }
            }
        }
        self.compact_groups();
    }
}
