//! Fusion and lowering: groups every connected DAG of element-wise ops into one kernel,
//! folds views into the loads of the kernels that read them, and turns the result into a
//! [`Schedule`].
//!
//! The rules, in the order they are applied:
//!
//! 1. Element-wise compute nodes (unary, binary, where, cast) join the group of their
//!    element-wise operands, merging groups, as long as the merged group stays *convex*:
//!    no path leaves it and comes back through another node (that would need the kernel
//!    to wait for itself). A value with several users inside a group is computed once.
//! 2. Sibling groups over the same domain merge (again only when convex): one launch
//!    instead of several, and an input they share is read once.
//! 3. Constants are never loaded: every kernel that reads one (directly or through
//!    views) gets it as an immediate.
//! 4. A view is an index map: a chain of views over a buffer becomes one [`View`] in the
//!    reading kernel's load. When a reshape cannot be expressed over the strides it sees
//!    (flattening a transpose), the view below it is copied into a buffer first.
//! 5. A value is stored (a kernel boundary) when it is an output of the graph, when a
//!    node outside its kernel reads it, or when it is read through a view (the view
//!    reads memory, not the registers of the kernel computing it).
//! 6. Reductions are evaluated by the interpreter in this version; the fusion issue
//!    moves them into kernels (prologue/epilogue fusion).

use crate::schedule::{Placement, Schedule, Step};
use ndfuse_ir::{
    Buffer, Expr, Graph, Instr, Kernel, NodeId, Op, Plan, Scalar, Store, ValueId, View, ViewOp,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// What role a live node plays before lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Input,
    /// Element-wise compute, member of group `.0`.
    Member(usize),
    /// A constant: an immediate wherever it is read.
    Const,
    /// A view: folded into loads unless it must be copied.
    View,
    /// Evaluated on its own by the interpreter.
    Interp,
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
    /// Operands outside the group that have operands themselves: the only places a path
    /// that left the group could come back through.
    ext: Vec<NodeId>,
}

struct Fuser<'g> {
    g: &'g Graph,
    order: Vec<NodeId>,
    /// Topological position of every live node.
    pos: HashMap<NodeId, usize>,
    role: HashMap<NodeId, Role>,
    groups: Vec<Group>,
    /// Nodes that must live in memory, with the first reason found.
    stored: BTreeMap<NodeId, String>,
    /// Views (and constants) copied into a buffer of their own.
    copies: BTreeSet<NodeId>,
}

/// Fuses and lowers `g` (which must verify) into a schedule of kernels and interpreter
/// steps for its outputs.
pub fn schedule(g: &Graph) -> Schedule {
    let mut f = Fuser::new(g);
    f.form_groups();
    f.merge_siblings();
    f.mark_stores();
    f.lower()
}

impl<'g> Fuser<'g> {
    fn new(g: &'g Graph) -> Fuser<'g> {
        let order = g.live_nodes();
        let pos = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let role = order
            .iter()
            .map(|&n| {
                let r = match &g.node(n).op {
                    Op::Input { .. } => Role::Input,
                    Op::Const { .. } => Role::Const,
                    Op::View(_) => Role::View,
                    Op::Reduce { .. } | Op::ArgReduce { .. } => Role::Interp,
                    Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => {
                        Role::Member(usize::MAX)
                    }
                };
                (n, r)
            })
            .collect();
        Fuser {
            g,
            order,
            pos,
            role,
            groups: Vec::new(),
            stored: BTreeMap::new(),
            copies: BTreeSet::new(),
        }
    }

    fn group_of(&self, n: NodeId) -> Option<usize> {
        match self.role.get(&n) {
            Some(Role::Member(gi)) if *gi != usize::MAX => Some(*gi),
            _ => None,
        }
    }

    /// Rule 1: grow groups in topological order.
    fn form_groups(&mut self) {
        for &n in &self.order.clone() {
            if !matches!(self.role[&n], Role::Member(_)) {
                continue;
            }
            let mut cands: Vec<usize> = self
                .g
                .operands(n)
                .into_iter()
                .filter_map(|o| self.group_of(o))
                .collect();
            cands.sort_unstable();
            cands.dedup();
            // All operand groups at once, else the first that stays convex, else alone.
            let join = if !cands.is_empty() && self.convex_union(&cands, Some(n)) {
                Some(cands.clone())
            } else {
                cands
                    .iter()
                    .find(|&&c| self.convex_union(&[c], Some(n)))
                    .map(|&c| vec![c])
            };
            match join {
                Some(gs) => self.merge(&gs, Some(n)),
                None => {
                    self.groups.push(Group::default());
                    self.merge(&[self.groups.len() - 1], Some(n));
                }
            }
        }
        self.compact_groups();
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

    /// Rule 2: merges groups of one domain, in graph order, whenever convex.
    fn merge_siblings(&mut self) {
        let mut buckets: Vec<(ndfuse_ir::Shape, Vec<usize>)> = Vec::new();
        for gi in 0..self.groups.len() {
            let shape = &self.g.node(self.groups[gi].members[0]).shape;
            match buckets.iter_mut().find(|(s, _)| s == shape) {
                Some((_, v)) => v.push(gi),
                None => buckets.push((shape.clone(), vec![gi])),
            }
        }
        for (_, bucket) in buckets {
            let mut kept: Vec<usize> = Vec::new();
            for gi in bucket {
                match kept.iter().find(|&&k| self.convex_union(&[k, gi], None)) {
                    Some(&k) => self.merge(&[k, gi], None),
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

    /// Whether the groups `gs` and the node `extra` together are convex: no path leaves
    /// the set and comes back into it (the kernel would wait for itself). Such a path
    /// re-enters through an operand outside the set that descends from the set, so a
    /// backward search from those operands (each group keeps the candidates in `ext`)
    /// decides it, and may stop at nodes placed before the set.
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
        while let Some(x) = stack.pop() {
            if self.pos[&x] < min || !seen.insert(x) {
                continue;
            }
            if self.in_union(x, gs, extra) {
                return false;
            }
            stack.extend(self.g.operands(x));
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

    /// Rule 4 (and rule 3's copies): decides which nodes need buffers. Runs to a fixed
    /// point because resolving a view may ask for a copy below it.
    fn mark_stores(&mut self) {
        for &o in self.g.outputs() {
            self.store(o, "output of the graph".into());
        }
        for n in self.order.clone() {
            if self.role[&n] == Role::Interp {
                for o in self.g.operands(n) {
                    let why = format!("read by {} outside this kernel", self.g.node(n).op.name());
                    self.store(o, why);
                }
            }
            if let Some(gi) = self.group_of(n) {
                for u in self.g.users(n) {
                    match self.role[&u] {
                        Role::Member(ug) if ug == gi => {}
                        Role::View => self.store(n, "read through a view".into()),
                        _ => {
                            let why =
                                format!("read by {} outside this kernel", self.g.node(u).op.name());
                            self.store(n, why);
                        }
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
            for &n in &self.order.clone() {
                if self.group_of(n).is_some() {
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
            (Op::View(v), _) => {
                let operand = self.g.operands(n)[0];
                match self.resolve(operand) {
                    Source::Const(c) => Source::Const(c),
                    Source::Buffer { base, view } => match apply_view(&view, v) {
                        Some(view) => Source::Buffer { base, view },
                        None => {
                            // Rule 3: the reshape needs its operand contiguous.
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
        // Units: groups, copies and interp nodes, each keyed by its first node in
        // topological order so that the schedule follows the graph.
        let pos = &self.pos;
        enum Unit {
            Group(usize),
            Copy(NodeId),
            Interp(NodeId),
        }
        let mut units: Vec<(usize, Unit)> = Vec::new();
        for (gi, grp) in self.groups.iter().enumerate() {
            units.push((grp.min_pos, Unit::Group(gi)));
        }
        for &c in &self.copies {
            units.push((pos[&c], Unit::Copy(c)));
        }
        for &n in &self.order {
            if self.role[&n] == Role::Interp {
                units.push((pos[&n], Unit::Interp(n)));
            }
        }
        // Lower every unit, then order them so each runs after what it reads.
        let mut lowered: Vec<(usize, Step)> = Vec::new();
        for (first, unit) in units {
            let step = match unit {
                Unit::Group(gi) => self.lower_group(gi),
                Unit::Copy(n) => self.lower_copy(n),
                Unit::Interp(n) => {
                    let what = self.g.node(n).op.name();
                    Step::Interp {
                        node: n,
                        operands: self.g.operands(n),
                        reason: format!("{what} is not compiled into kernels yet"),
                    }
                }
            };
            lowered.push((first, step));
        }
        let steps = order_steps(lowered, self.g);
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
                Role::Member(_) | Role::Interp => continue,
            };
            placement.insert(n, p);
        }
        for (si, step) in steps.iter().enumerate() {
            match step {
                Step::Kernel { outputs, .. } => {
                    for &o in outputs {
                        placement.insert(
                            o,
                            Placement::InKernel {
                                step: si,
                                stored: self.stored.get(&o).cloned(),
                            },
                        );
                    }
                }
                Step::Interp { node, .. } => {
                    placement.insert(*node, Placement::Interp { step: si });
                }
            }
        }
        // Members that are not stored live in the step of their group's stores.
        let mut group_step: HashMap<usize, usize> = HashMap::new();
        for (si, step) in steps.iter().enumerate() {
            if let Step::Kernel { outputs, .. } = step {
                for &o in outputs {
                    if let Some(gi) = self.group_of(o) {
                        group_step.insert(gi, si);
                    }
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
        let mut steps = steps;
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
        let domain = self.g.node(ordered[0]).shape.clone();
        let mut kb = KernelBuilder::default();
        let mut value: HashMap<NodeId, ValueId> = HashMap::new();
        let mut names: Vec<&'static str> = Vec::new();
        ordered.sort_by_key(|m| self.pos[m]);
        for &m in &ordered {
            let node = self.g.node(m);
            let args: Vec<ValueId> = self
                .g
                .operands(m)
                .into_iter()
                .map(|o| match value.get(&o) {
                    Some(&v) => v,
                    None => {
                        let src = self.resolve(o);
                        kb.source(src, self.g.node(o).dtype, self.g)
                    }
                })
                .collect();
            let expr = match &node.op {
                Op::Unary(u) => Expr::Unary(*u, args[0]),
                Op::Binary(b) => Expr::Binary(*b, args[0], args[1]),
                Op::Where => Expr::Where(args[0], args[1], args[2]),
                Op::Cast { .. } => Expr::Cast(args[0]),
                other => unreachable!(
                    "group member {} is element-wise (a bug otherwise)",
                    other.name()
                ),
            };
            if !matches!(node.op, Op::Cast { .. }) {
                names.push(node.op.name());
            }
            value.insert(m, kb.push(node.dtype, expr));
        }
        let mut outputs = Vec::new();
        for &m in &ordered {
            if self.stored.contains_key(&m) {
                kb.store(value[&m], self.g.node(m).dtype, domain.numel());
                outputs.push(m);
            }
        }
        if names.is_empty() {
            names.push("cast");
        }
        kb.finish(&names, domain, outputs)
    }

    fn lower_copy(&mut self, n: NodeId) -> Step {
        let node = self.g.node(n);
        let src = self.resolve_below(n);
        let mut kb = KernelBuilder::default();
        let v = kb.source(src, node.dtype, self.g);
        kb.store(v, node.dtype, node.shape.numel());
        let name = if matches!(node.op, Op::Const { .. }) {
            "fill"
        } else {
            "copy"
        };
        kb.finish(&[name], node.shape.clone(), vec![n])
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

/// Accumulates one kernel: deduplicated buffers and loads, SSA body, stores.
#[derive(Default)]
struct KernelBuilder {
    inputs: Vec<NodeId>,
    buffers: Vec<Buffer>,
    body: Vec<Instr>,
    memo: HashMap<Instr, ValueId>,
    outputs: Vec<Buffer>,
    stores: Vec<Store>,
}

impl KernelBuilder {
    fn push(&mut self, dtype: ndfuse_ir::DType, expr: Expr) -> ValueId {
        let ins = Instr { dtype, expr };
        if let Some(&v) = self.memo.get(&ins) {
            return v;
        }
        let v = ValueId(
            u32::try_from(self.body.len()).expect("kernels have fewer than 2^32 instructions"),
        );
        self.memo.insert(ins.clone(), v);
        self.body.push(ins);
        v
    }

    fn source(&mut self, src: Source, dtype: ndfuse_ir::DType, g: &Graph) -> ValueId {
        match src {
            Source::Const(c) => self.push(dtype, Expr::Const(c)),
            Source::Buffer { base, view } => {
                let input = match self.inputs.iter().position(|&b| b == base) {
                    Some(i) => i,
                    None => {
                        let node = g.node(base);
                        self.inputs.push(base);
                        self.buffers.push(Buffer {
                            dtype: node.dtype,
                            len: node.shape.numel(),
                        });
                        self.inputs.len() - 1
                    }
                };
                self.push(dtype, Expr::Load { input, view })
            }
        }
    }

    fn store(&mut self, value: ValueId, dtype: ndfuse_ir::DType, len: usize) {
        self.outputs.push(Buffer { dtype, len });
        self.stores.push(Store {
            value,
            output: self.outputs.len() - 1,
        });
    }

    fn finish(self, names: &[&str], domain: ndfuse_ir::Shape, outputs: Vec<NodeId>) -> Step {
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
        let kernel = Kernel {
            name,
            domain,
            inputs: self.buffers,
            outputs: self.outputs,
            body: self.body,
            stores: self.stores,
            plan: Plan::Elementwise,
            plan_reason: "element-wise: one flat index space".into(),
        };
        Step::Kernel {
            kernel,
            inputs: self.inputs,
            outputs,
        }
    }
}
