//! Fusion and lowering: groups the graph into the fewest kernels the rules allow, folds
//! views into the loads of the kernels that read them, and turns the result into a
//! [`Schedule`] of [`Kernel`] descriptions (see `ndfuse_ir::kernel` for the row program
//! a kernel with reductions runs).
//!
//! A group has a *domain* (the shape of its element values) and, once it holds a
//! reduction, *reduce axes*; each member is an element value or a row value. The rules,
//! in the order they are applied:
//!
//! 1. In topological order, an element-wise op (unary, binary, where, cast) joins the
//!    groups of its operands, merging them, when they agree on domain and reduce axes
//!    and the merged group stays *convex* (no path leaves it and comes back through
//!    another node: the kernel would wait for itself). Its level follows its operands:
//!    an element value if any operand is one, else a row value (an epilogue: mean's
//!    divide, std's sqrt, softmax's log). A value with several users is computed once.
//! 2. A reduction (or argmax/argmin) joins the group of its element-valued operand when
//!    the group reduces the same axes or none yet (prologue fusion: `sum(exp(a*b+c))`),
//!    and starts a group of its own otherwise.
//! 3. A view of a row value that only adds or removes size-1 axes, or that broadcasts
//!    the keepdims form back over the reduced axes, is the same value inside the kernel
//!    (row-local fusion: softmax, log_softmax, layernorm, var and std are ONE kernel).
//! 4. Sibling groups over the same domain and compatible reduce axes merge (again only
//!    when convex): one launch instead of several, and an input they share is read once.
//! 5. Constants are never loaded: every kernel that reads one gets it as an immediate.
//! 6. Any other view is an index map: a chain of views over a buffer becomes one [`View`]
//!    in the reading kernel's load. When a reshape cannot be expressed over the strides
//!    it sees (flattening a transpose), the view below it is copied into a buffer first.
//! 7. A value is stored (a kernel boundary) when it is an output of the graph, when a
//!    node outside its kernel reads it, or when it is read through a view (the view
//!    reads memory, not the registers of the kernel computing it). Each stored value
//!    records why.
//!
//! The cost rule for a value with several consumers: inside one kernel it is computed
//! once and reused (SSA); across kernels it is materialised (written once, read by each
//! consumer) and never recomputed. Recomputing a cheap element-wise producer inside each
//! consumer would save its write and read (e.g. `y = exp(x)` feeding reductions over two
//! different axes); that trade is not made yet.
//!
//! Composite reductions lower to primitives: mean = sum / n; norm1 = sum |x|; norm2 =
//! sqrt(sum x²); var = sum((x - mean)²) / n, two sweeps over a row rather than
//! sum(x²)/n - mean², which cancels catastrophically when the mean is large against the
//! spread; std = sqrt(var). Shared pieces (the sum inside mean and var) are emitted once.

use crate::plan::{self, TargetDesc};
use crate::schedule::{Placement, Schedule, Step};
use ndfuse_ir::{
    reduced_shape, Accumulate, ArgReduceOp, BinaryOp, Buffer, DType, Expr, Graph, Instr, Kernel,
    Level, NodeId, Op, ReduceOp, Scalar, Shape, Store, UnaryOp, ValueId, View, ViewOp,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// What role a live node plays before lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Input,
    /// A member of group `.0` (`usize::MAX` while not yet placed).
    Member(usize),
    /// A constant: an immediate wherever it is read.
    Const,
    /// A view folded into loads (or copied, when it must be stored).
    View,
}

/// Where a value read by a kernel comes from after folding views.
#[derive(Clone, Debug)]
enum Source {
    Const(Scalar),
    Buffer { base: NodeId, view: View },
}

/// A fusion group under construction.
#[derive(Debug, Default)]
struct Group {
    members: Vec<NodeId>,
    /// Smallest topological position of a member: nothing placed before it can descend
    /// from the group.
    min_pos: usize,
    /// Largest topological position of a member: a group whose members all come before
    /// another set cannot depend on it.
    max_pos: usize,
    /// Operands outside the group that have operands themselves: the only places a path
    /// that left the group could come back through.
    ext: Vec<NodeId>,
    /// Shape of the group's element values.
    domain: Shape,
    /// Axes of `domain` reduced in the group, once it holds a reduction.
    reduce: Option<Vec<usize>>,
}

impl Group {
    /// Number of rows (kept positions) for `reduce` axes.
    fn rows(&self, reduce: &[usize]) -> usize {
        reduced_shape(&self.domain, reduce, false).numel()
    }
}

struct Fuser<'g> {
    g: &'g Graph,
    order: Vec<NodeId>,
    /// Topological position of every live node.
    pos: HashMap<NodeId, usize>,
    role: HashMap<NodeId, Role>,
    /// The level of every group member.
    level: HashMap<NodeId, Level>,
    /// Members that are views of another member: the same value inside the kernel.
    alias: HashMap<NodeId, NodeId>,
    groups: Vec<Group>,
    /// Nodes that must live in memory, with the first reason found.
    stored: BTreeMap<NodeId, String>,
    /// Views (and constants) copied into a buffer of their own.
    copies: BTreeSet<NodeId>,
    target: TargetDesc,
    /// Whether nodes may share kernels at all.
    fuse: bool,
}

/// Fuses and lowers `g` (which must verify) into a schedule of kernels for its outputs,
/// with plans chosen for the CPU target.
pub fn schedule(g: &Graph) -> Schedule {
    schedule_for(g, &TargetDesc::cpu())
}

/// [`schedule`] with plans chosen for `target`.
pub fn schedule_for(g: &Graph, target: &TargetDesc) -> Schedule {
    schedule_with(g, target, true)
}

/// [`schedule_for`], with fusion turned off when `fuse` is false
/// (`NDFUSE_DISABLE_PASSES=fusion`): every op is its own kernel, views still fold into
/// loads. For bisecting a wrong result to fusion, and for measuring what it buys.
pub fn schedule_with(g: &Graph, target: &TargetDesc, fuse: bool) -> Schedule {
    let mut f = Fuser::new(g, target.clone());
    f.fuse = fuse;
    f.form_groups();
    if fuse {
        f.merge_siblings();
    }
    f.mark_stores();
    f.absorb_copies();
    f.lower()
}

/// `dims` without its size-1 axes: two shapes with equal results hold the same
/// elements in the same order.
fn strip_ones(s: &Shape) -> Vec<usize> {
    s.dims().iter().copied().filter(|&d| d != 1).collect()
}

/// `domain` with every reduced axis set to 1: the keepdims shape of a row value.
fn keepdims_shape(domain: &Shape, reduce: &[usize]) -> Shape {
    reduced_shape(domain, reduce, true)
}

impl<'g> Fuser<'g> {
    fn new(g: &'g Graph, target: TargetDesc) -> Fuser<'g> {
        let order = g.live_nodes();
        let pos = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let role = order
            .iter()
            .map(|&n| {
                let r = match &g.node(n).op {
                    Op::Input { .. } => Role::Input,
                    Op::Const { .. } => Role::Const,
                    Op::View(_) => Role::View,
                    Op::Unary(_)
                    | Op::Binary(_)
                    | Op::Where
                    | Op::Cast { .. }
                    | Op::Reduce { .. }
                    | Op::ArgReduce { .. } => Role::Member(usize::MAX),
                };
                (n, r)
            })
            .collect();
        Fuser {
            g,
            order,
            pos,
            role,
            level: HashMap::new(),
            alias: HashMap::new(),
            groups: Vec::new(),
            stored: BTreeMap::new(),
            copies: BTreeSet::new(),
            target,
            fuse: true,
        }
    }

    fn group_of(&self, n: NodeId) -> Option<usize> {
        match self.role.get(&n) {
            Some(Role::Member(gi)) if *gi != usize::MAX => Some(*gi),
            _ => None,
        }
    }

    /// Rules 1-3: grow groups in topological order.
    fn form_groups(&mut self) {
        for n in self.order.clone() {
            let node = self.g.node(n);
            match &node.op {
                Op::Input { .. } | Op::Const { .. } => {}
                Op::View(v) => self.try_alias(n, v),
                Op::Reduce { axes, .. } => self.place_reduction(n, axes.clone()),
                Op::ArgReduce { axis, .. } => self.place_reduction(n, vec![*axis]),
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => {
                    self.place_elementwise(n)
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
                .filter(|_| f.convex_union(gs, Some(n)))
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

    /// Rule 2 for a reduction (or argmax/argmin) over `axes` of its operand.
    fn place_reduction(&mut self, n: NodeId, axes: Vec<usize>) {
        let o = self.g.operands(n)[0];
        let joins = self.group_of(o).filter(|_| self.fuse).filter(|&gi| {
            let grp = &self.groups[gi];
            self.level[&o] == Level::Element
                && grp.domain == self.g.node(o).shape
                && grp.reduce.as_ref().is_none_or(|r| *r == axes)
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

    /// Rule 3: a view of a row value that stays the same value inside its kernel.
    fn try_alias(&mut self, n: NodeId, v: &ViewOp) {
        let o = self.g.operands(n)[0];
        let Some(gi) = self.group_of(o).filter(|_| self.fuse) else {
            return;
        };
        if self.level[&o] != Level::Row {
            return;
        }
        let grp = &self.groups[gi];
        let Some(reduce) = &grp.reduce else { return };
        let (shape, from) = (&self.g.node(n).shape, &self.g.node(o).shape);
        let level = match v {
            // keepdims row value broadcast back over the reduced axes.
            ViewOp::BroadcastTo(_)
                if shape == &grp.domain && from == &keepdims_shape(&grp.domain, reduce) =>
            {
                Level::Element
            }
            // Adding or removing size-1 axes keeps one value per row, in row order.
            ViewOp::Reshape(_) | ViewOp::ExpandDims(_) | ViewOp::Squeeze(_)
                if strip_ones(shape) == strip_ones(from) =>
            {
                Level::Row
            }
            _ => return,
        };
        if self.convex_union(&[gi], Some(n)) {
            self.role.insert(n, Role::Member(usize::MAX));
            self.merge(&[gi], Some(n));
            self.level.insert(n, level);
            self.alias.insert(n, o);
        }
    }

    fn new_group(&mut self, n: NodeId, domain: Shape, reduce: Option<Vec<usize>>, level: Level) {
        self.groups.push(Group {
            domain,
            reduce,
            ..Group::default()
        });
        self.merge(&[self.groups.len() - 1], Some(n));
        self.level.insert(n, level);
    }

    /// Drops groups emptied by merges and renumbers the rest.
    fn compact_groups(&mut self) {
        let mut renumber = HashMap::new();
        let groups = std::mem::take(&mut self.groups);
        for (old, grp) in groups.into_iter().enumerate() {
            if !grp.members.is_empty() {
                renumber.insert(old, self.groups.len());
                self.groups.push(grp);
            }
        }
        for r in self.role.values_mut() {
            if let Role::Member(gi) = r {
                if let Some(&new) = renumber.get(gi) {
                    *gi = new;
                }
            }
        }
    }

    /// Rule 4: merges groups of one domain and compatible reduce axes, in graph order,
    /// whenever convex.
    fn merge_siblings(&mut self) {
        let mut buckets: Vec<(Shape, Vec<usize>)> = Vec::new();
        for gi in 0..self.groups.len() {
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
                    compatible && self.convex_union(&[k, gi], None)
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
    fn convex_union(&self, gs: &[usize], extra: Option<NodeId>) -> bool {
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

    /// Moves groups `gs[1..]` and the node `extra` into group `gs[0]`.
    fn merge(&mut self, gs: &[usize], extra: Option<NodeId>) {
        let target = gs[0];
        if self.groups[target].members.is_empty() {
            self.groups[target].min_pos = usize::MAX;
        }
        for &c in &gs[1..] {
            let moved = std::mem::take(&mut self.groups[c]);
            for &m in &moved.members {
                self.role.insert(m, Role::Member(target));
            }
            let t = &mut self.groups[target];
            t.members.extend(moved.members);
            t.ext.extend(moved.ext);
            t.min_pos = t.min_pos.min(moved.min_pos);
            t.max_pos = t.max_pos.max(moved.max_pos);
        }
        if let Some(n) = extra {
            self.role.insert(n, Role::Member(target));
            let outside: Vec<NodeId> = self
                .g
                .operands(n)
                .into_iter()
                .filter(|&o| self.g.node(o).op.arity() > 0)
                .collect();
            let t = &mut self.groups[target];
            t.members.push(n);
            t.ext.extend(outside);
            t.min_pos = t.min_pos.min(self.pos[&n]);
            t.max_pos = t.max_pos.max(self.pos[&n]);
        }
        let mut ext = std::mem::take(&mut self.groups[target].ext);
        ext.retain(|&o| self.group_of(o) != Some(target));
        ext.sort_unstable();
        ext.dedup();
        self.groups[target].ext = ext;
    }

    fn store(&mut self, n: NodeId, why: String) {
        self.stored.entry(n).or_insert(why);
    }

    /// Rule 7 (and rule 6's copies): decides which nodes need buffers. Runs to a fixed
    /// point because resolving a view may ask for a copy below it.
    fn mark_stores(&mut self) {
        for &o in self.g.outputs() {
            self.store(o, "output of the graph".into());
        }
        for n in self.order.clone() {
            let Some(gi) = self.group_of(n) else { continue };
            for u in self.g.users(n) {
                match self.role[&u] {
                    Role::Member(ug) if ug == gi => {}
                    Role::View => self.store(n, "read through a view".into()),
                    _ => {
                        let why = format!("read by {} in another kernel", self.g.node(u).op.name());
                        self.store(n, why);
                    }
                }
            }
        }
        // Stored views and constants are copies; resolving every read may add more.
        loop {
            let before = (self.stored.len(), self.copies.len());
            let stored: Vec<NodeId> = self.stored.keys().copied().collect();
            for n in stored {
                if matches!(self.role[&n], Role::View | Role::Const) {
                    self.copies.insert(n);
                    self.resolve_below(n);
                }
            }
            for n in self.order.clone() {
                if self.group_of(n).is_some() && !self.alias.contains_key(&n) {
                    for o in self.g.operands(n) {
                        if self.group_of(o) != self.group_of(n) {
                            self.resolve(o);
                        }
                    }
                }
            }
            if (self.stored.len(), self.copies.len()) == before {
                break;
            }
        }
    }

    /// Makes every copy (a stored view or constant) a member: of a same-domain group when
    /// that stays convex and the group does not write the buffer the copy reads (a kernel
    /// cannot read its own output), else of a group of its own. One launch then writes
    /// both, say, `x.T` and `c - x.T`.
    fn absorb_copies(&mut self) {
        for c in self.copies.clone() {
            let domain = self.g.node(c).shape.clone();
            let base = match self.resolve_below(c) {
                Source::Buffer { base, .. } => Some(base),
                Source::Const(_) => None,
            };
            self.role.insert(c, Role::Member(usize::MAX));
            let target = (0..self.groups.len()).find(|&gi| {
                let grp = &self.groups[gi];
                self.fuse
                    && !grp.members.is_empty()
                    && grp.domain == domain
                    && base.is_none_or(|b| self.group_of(b) != Some(gi))
                    && self.convex_union(&[gi], Some(c))
            });
            match target {
                Some(gi) => self.merge(&[gi], Some(c)),
                None => {
                    self.groups.push(Group {
                        domain,
                        ..Group::default()
                    });
                    self.merge(&[self.groups.len() - 1], Some(c));
                }
            }
            self.level.insert(c, Level::Element);
        }
    }

    /// Where the value of `n` is read from by a kernel that does not compute it.
    fn resolve(&mut self, n: NodeId) -> Source {
        if self.copies.contains(&n) {
            return self.buffer(n);
        }
        self.resolve_below(n)
    }

    /// Like [`Fuser::resolve`], but looks through `n` even when `n` is copied (to
    /// build the copy itself).
    fn resolve_below(&mut self, n: NodeId) -> Source {
        match (&self.g.node(n).op, self.role[&n]) {
            (Op::Const { value }, _) => Source::Const(*value),
            (Op::View(v), role) if role == Role::View || self.copies.contains(&n) => {
                let operand = self.g.operands(n)[0];
                match self.resolve(operand) {
                    Source::Const(c) => Source::Const(c),
                    Source::Buffer { base, view } => match apply_view(&view, v) {
                        Some(view) => Source::Buffer { base, view },
                        None => {
                            // Rule 6: the reshape needs its operand contiguous.
                            self.store(
                                operand,
                                "reshaped in a way its strides cannot express".into(),
                            );
                            self.copies.insert(operand);
                            let view = apply_view(
                                &View::contiguous(self.g.node(operand).shape.clone()),
                                v,
                            )
                            .expect("any view of a contiguous buffer is expressible");
                            Source::Buffer {
                                base: operand,
                                view,
                            }
                        }
                    },
                }
            }
            _ => self.buffer(n),
        }
    }

    fn buffer(&mut self, n: NodeId) -> Source {
        if self.role[&n] != Role::Input {
            self.store(n, "read by another kernel".into());
        }
        Source::Buffer {
            base: n,
            view: View::contiguous(self.g.node(n).shape.clone()),
        }
    }

    /// Builds the steps in dependency order.
    fn lower(mut self) -> Schedule {
        // Units: groups and copies, each keyed by its first node in topological order so
        // that the schedule follows the graph.
        let mut lowered: Vec<(usize, Step)> = Vec::new();
        for gi in 0..self.groups.len() {
            let first = self.groups[gi].min_pos;
            lowered.push((first, self.lower_group(gi)));
        }
        let mut steps = order_steps(lowered, self.g);
        let mut placement: HashMap<NodeId, Placement> = self
            .g
            .node_ids()
            .into_iter()
            .map(|n| (n, Placement::Dead))
            .collect();
        for &n in &self.order {
            let p = match self.role[&n] {
                Role::Input => Placement::Input,
                Role::Const | Role::View => Placement::Folded,
                Role::Member(_) => continue,
            };
            placement.insert(n, p);
        }
        // Every member lives in the step of its group; stored ones say why.
        let mut group_step: HashMap<usize, usize> = HashMap::new();
        for (si, step) in steps.iter().enumerate() {
            if let Step::Kernel { outputs, .. } = step {
                for &o in outputs {
                    if let Some(gi) = self.group_of(o) {
                        group_step.insert(gi, si);
                    }
                    placement.insert(
                        o,
                        Placement::InKernel {
                            step: si,
                            stored: self.stored.get(&o).cloned(),
                        },
                    );
                }
            }
        }
        for &n in &self.order {
            if let Some(gi) = self.group_of(n) {
                if !self.stored.contains_key(&n) {
                    let si = *group_step
                        .get(&gi)
                        .expect("every group stores at least one value");
                    placement.insert(
                        n,
                        Placement::InKernel {
                            step: si,
                            stored: None,
                        },
                    );
                }
            }
        }
        // Kernel names carry their final position.
        let mut k = 0;
        for s in &mut steps {
            if let Step::Kernel { kernel, .. } = s {
                kernel.name = format!("k{k}_{}", kernel.name);
                k += 1;
            }
        }
        Schedule { steps, placement }
    }

    fn lower_group(&mut self, gi: usize) -> Step {
        let mut ordered = self.groups[gi].members.clone();
        ordered.sort_by_key(|m| self.pos[m]);
        let domain = self.groups[gi].domain.clone();
        let reduce = self.groups[gi].reduce.clone().unwrap_or_default();
        let mut kb = KernelBuilder::new(domain.clone(), reduce.clone());
        let mut value: HashMap<NodeId, ValueId> = HashMap::new();
        let mut names: Vec<&'static str> = Vec::new();
        for &m in &ordered {
            if let Some(o) = self.alias.get(&m) {
                value.insert(m, value[o]);
                continue;
            }
            if self.copies.contains(&m) {
                // A copy: the view (or constant) read through to its source.
                let src = self.resolve_below(m);
                let node = self.g.node(m);
                value.insert(m, kb.source(src, node.dtype, Level::Element, self.g));
                names.push(if matches!(node.op, Op::Const { .. }) {
                    "fill"
                } else {
                    "copy"
                });
                continue;
            }
            let node = self.g.node(m);
            let level = self.level[&m];
            // A reduction reads element values; anything else reads at its own level.
            let operand_level = if node.op.is_reduce() {
                Level::Element
            } else {
                level
            };
            let args: Vec<ValueId> = self
                .g
                .operands(m)
                .into_iter()
                .map(|o| match value.get(&o) {
                    Some(&v) => v,
                    None => {
                        let src = self.resolve(o);
                        kb.source(src, self.g.node(o).dtype, operand_level, self.g)
                    }
                })
                .collect();
            let v = match &node.op {
                Op::Unary(u) => kb.push(node.dtype, Expr::Unary(*u, args[0])),
                Op::Binary(b) => kb.push(node.dtype, Expr::Binary(*b, args[0], args[1])),
                Op::Where => kb.push(node.dtype, Expr::Where(args[0], args[1], args[2])),
                Op::Cast { .. } => kb.push(node.dtype, Expr::Cast(args[0])),
                Op::Reduce { op, .. } => {
                    let from = self.g.node(self.g.operands(m)[0]).dtype;
                    kb.reduce(*op, args[0], from, node.dtype)
                }
                Op::ArgReduce { op, .. } => kb.arg_reduce(*op, args[0]),
                other => unreachable!("group member {} is fusible (a bug otherwise)", other.name()),
            };
            if !matches!(node.op, Op::Cast { .. }) {
                names.push(node.op.name());
            }
            value.insert(m, v);
        }
        let mut outputs = Vec::new();
        for &m in &ordered {
            if self.stored.contains_key(&m) {
                kb.store(value[&m], self.g.node(m).dtype, self.level[&m]);
                outputs.push(m);
            }
        }
        if names.is_empty() {
            names.push("copy");
        }
        kb.finish(&names, outputs, &self.target)
    }
}

/// Applies one view op to an index map, `None` for a reshape the strides cannot express.
fn apply_view(view: &View, op: &ViewOp) -> Option<View> {
    Some(match op {
        ViewOp::Reshape(s) => return view.reshape(s),
        ViewOp::Permute(p) => view.permute(p),
        ViewOp::Slice(s) => view.slice(s),
        ViewOp::BroadcastTo(s) => view.broadcast_to(s),
        ViewOp::ExpandDims(a) => view.expand_dims(*a),
        ViewOp::Squeeze(a) => view.squeeze(a),
    })
}

/// Steps sorted so that each comes after the steps writing what it reads; ties keep
/// graph order. Units of a convex grouping always admit such an order.
fn order_steps(mut lowered: Vec<(usize, Step)>, g: &Graph) -> Vec<Step> {
    lowered.sort_by_key(|(first, _)| *first);
    let writer: HashMap<NodeId, usize> = lowered
        .iter()
        .enumerate()
        .flat_map(|(i, (_, s))| s.writes().into_iter().map(move |n| (n, i)))
        .collect();
    let mut done = vec![false; lowered.len()];
    let mut out = Vec::with_capacity(lowered.len());
    while out.len() < lowered.len() {
        let next = (0..lowered.len())
            .find(|&i| {
                !done[i]
                    && lowered[i]
                        .1
                        .reads()
                        .iter()
                        .all(|r| writer.get(r).is_none_or(|&w| done[w]))
            })
            .unwrap_or_else(|| panic!("fusion produced a dependency cycle (a bug):\n{g}"));
        done[next] = true;
        out.push(next);
    }
    let mut slots: Vec<Option<Step>> = lowered.into_iter().map(|(_, s)| Some(s)).collect();
    out.into_iter()
        .map(|i| slots[i].take().expect("each step is taken once"))
        .collect()
}

/// Accumulates one kernel: deduplicated buffers and loads, SSA body with levels, stores.
struct KernelBuilder {
    domain: Shape,
    reduce_axes: Vec<usize>,
    inputs: Vec<NodeId>,
    buffers: Vec<Buffer>,
    body: Vec<Instr>,
    levels: Vec<Level>,
    memo: HashMap<Instr, ValueId>,
    outputs: Vec<Buffer>,
    stores: Vec<Store>,
}

impl KernelBuilder {
    fn new(domain: Shape, reduce_axes: Vec<usize>) -> KernelBuilder {
        KernelBuilder {
            domain,
            reduce_axes,
            inputs: Vec::new(),
            buffers: Vec::new(),
            body: Vec::new(),
            levels: Vec::new(),
            memo: HashMap::new(),
            outputs: Vec::new(),
            stores: Vec::new(),
        }
    }

    fn row_len(&self) -> usize {
        self.reduce_axes
            .iter()
            .map(|&a| self.domain.dims()[a])
            .product()
    }

    fn rows(&self) -> usize {
        reduced_shape(&self.domain, &self.reduce_axes, false).numel()
    }

    fn push(&mut self, dtype: DType, expr: Expr) -> ValueId {
        let ins = Instr { dtype, expr };
        if let Some(&v) = self.memo.get(&ins) {
            return v;
        }
        // Same rule as Kernel::levels, kept as the body grows.
        let level = match &ins.expr {
            Expr::Const(_) | Expr::Reduce(..) | Expr::ArgReduce(..) => Level::Row,
            Expr::Load { view, .. } => {
                let still = !self.reduce_axes.is_empty()
                    && self
                        .reduce_axes
                        .iter()
                        .all(|&a| view.shape.dims()[a] == 1 || view.strides[a] == 0);
                if still {
                    Level::Row
                } else {
                    Level::Element
                }
            }
            e => {
                if Kernel::operands(e)
                    .iter()
                    .any(|v| self.levels[v.index()] == Level::Element)
                {
                    Level::Element
                } else {
                    Level::Row
                }
            }
        };
        let v = ValueId(
            u32::try_from(self.body.len()).expect("kernels have fewer than 2^32 instructions"),
        );
        self.memo.insert(ins.clone(), v);
        self.body.push(ins);
        self.levels.push(level);
        v
    }

    /// A value read from outside the kernel at `level`: a row value's source has the
    /// row shape, so its index map is stretched over the domain (stride 0 along the
    /// reduced axes).
    fn source(&mut self, src: Source, dtype: DType, level: Level, g: &Graph) -> ValueId {
        match src {
            Source::Const(c) => self.push(dtype, Expr::Const(c)),
            Source::Buffer { base, view } => {
                let view = if level == Level::Row && !self.reduce_axes.is_empty() {
                    view.reshape(&keepdims_shape(&self.domain, &self.reduce_axes))
                        .expect("a row shape differs from the keepdims shape only by size-1 axes")
                        .broadcast_to(&self.domain)
                } else {
                    view
                };
                let input = match self.inputs.iter().position(|&b| b == base) {
                    Some(i) => i,
                    None => {
                        self.inputs.push(base);
                        self.buffers.push(Buffer {
                            dtype,
                            len: g.node(base).shape.numel(),
                        });
                        self.inputs.len() - 1
                    }
                };
                self.push(dtype, Expr::Load { input, view })
            }
        }
    }

    /// `x * n` or `x / n` (n = the row length) computed in `x`'s compute dtype, so a
    /// count too large for a half type stays exact.
    fn by_count(&mut self, x: ValueId, dtype: DType, op: BinaryOp) -> ValueId {
        let n = self.row_len();
        if dtype.is_int() {
            let c = self.push(dtype, Expr::Const(Scalar::I(n as i64)));
            return self.push(dtype, Expr::Binary(op, x, c));
        }
        let cd = dtype.compute_dtype();
        let x = if cd == dtype {
            x
        } else {
            self.push(cd, Expr::Cast(x))
        };
        let c = self.push(cd, Expr::Const(Scalar::F(n as f64).cast(cd)));
        let r = self.push(cd, Expr::Binary(op, x, c));
        if cd == dtype {
            r
        } else {
            self.push(dtype, Expr::Cast(r))
        }
    }

    /// A primitive reduction of `x`; a row value (the same along the row) folds to what
    /// combining `n` copies gives.
    fn accumulate(&mut self, acc: Accumulate, x: ValueId, dtype: DType) -> ValueId {
        if self.levels[x.index()] == Level::Element {
            return self.push(dtype, Expr::Reduce(acc, x));
        }
        match acc {
            Accumulate::Sum => self.by_count(x, dtype, BinaryOp::Mul),
            Accumulate::Prod => self.by_count(x, dtype, BinaryOp::Pow),
            Accumulate::Max | Accumulate::Min => x,
        }
    }

    /// The graph reduction `op` of `x` (of dtype `from`) giving dtype `to`, lowered to
    /// primitives (see the module docs).
    fn reduce(&mut self, op: ReduceOp, x: ValueId, from: DType, to: DType) -> ValueId {
        let x = if from == to {
            x
        } else {
            self.push(to, Expr::Cast(x))
        };
        let d = to;
        match op {
            ReduceOp::Sum => self.accumulate(Accumulate::Sum, x, d),
            ReduceOp::Prod => self.accumulate(Accumulate::Prod, x, d),
            ReduceOp::Max => self.accumulate(Accumulate::Max, x, d),
            ReduceOp::Min => self.accumulate(Accumulate::Min, x, d),
            ReduceOp::Mean => {
                let s = self.accumulate(Accumulate::Sum, x, d);
                self.by_count(s, d, BinaryOp::Div)
            }
            ReduceOp::Norm1 => {
                let a = self.push(d, Expr::Unary(UnaryOp::Abs, x));
                self.accumulate(Accumulate::Sum, a, d)
            }
            ReduceOp::Norm2 => {
                let sq = self.push(d, Expr::Unary(UnaryOp::Square, x));
                let s = self.accumulate(Accumulate::Sum, sq, d);
                self.push(d, Expr::Unary(UnaryOp::Sqrt, s))
            }
            ReduceOp::Var | ReduceOp::Std => {
                let mean = self.reduce(ReduceOp::Mean, x, d, d);
                let dev = self.push(d, Expr::Binary(BinaryOp::Sub, x, mean));
                let sq = self.push(d, Expr::Unary(UnaryOp::Square, dev));
                let s = self.accumulate(Accumulate::Sum, sq, d);
                let var = self.by_count(s, d, BinaryOp::Div);
                if op == ReduceOp::Std {
                    self.push(d, Expr::Unary(UnaryOp::Sqrt, var))
                } else {
                    var
                }
            }
        }
    }

    /// argmax/argmin of `x`; the first position (0) for a row value.
    fn arg_reduce(&mut self, op: ArgReduceOp, x: ValueId) -> ValueId {
        if self.levels[x.index()] == Level::Row {
            return self.push(DType::I64, Expr::Const(Scalar::I(0)));
        }
        self.push(DType::I64, Expr::ArgReduce(op, x))
    }

    /// Stores `value` for a node of `level`: an element node gets every position (a
    /// broadcast row value included), a row node one element per row.
    fn store(&mut self, value: ValueId, dtype: DType, level: Level) {
        let len = match level {
            Level::Element => self.domain.numel(),
            Level::Row => self.rows(),
        };
        self.outputs.push(Buffer { dtype, len });
        self.stores.push(Store {
            value,
            output: self.outputs.len() - 1,
        });
    }

    fn finish(self, names: &[&str], outputs: Vec<NodeId>, target: &TargetDesc) -> Step {
        // Readable, stable names: the first few ops, then how many more (`mul_add_exp_etc3`).
        const SHOWN: usize = 4;
        let mut name = names
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join("_");
        if names.len() > SHOWN {
            name.push_str(&format!("_etc{}", names.len() - SHOWN));
        }
        let (plan, plan_reason) = plan::choose(&self.domain, &self.reduce_axes, target);
        let kernel = Kernel {
            name,
            domain: self.domain,
            reduce_axes: self.reduce_axes,
            inputs: self.buffers,
            outputs: self.outputs,
            body: self.body,
            stores: self.stores,
            plan,
            plan_reason,
        };
        Step::Kernel {
            kernel,
            inputs: self.inputs,
            outputs,
        }
    }
}
