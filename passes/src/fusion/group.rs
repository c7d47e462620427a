//! Fusion groups under construction: the [`Fuser`] state (each live node's role, the
//! groups and their members) and the bookkeeping every rule shares: creating a group,
//! merging groups, dropping the emptied ones.

use crate::plan::TargetDesc;
use ndfuse_ir::round::round_f64;
use ndfuse_ir::{
    reduced_shape, BinaryOp, DType, Graph, Level, NodeId, Op, Prologue, Scalar, Shape,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What role a live node plays before lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Input,
    /// A member of group `.0` (`usize::MAX` while not yet placed).
    Member(usize),
    /// A constant: an immediate wherever it is read.
    Const,
    /// A random op: computed from its key and position inside every kernel that reads
    /// it (rule 5), like a constant with an index.
    Random,
    /// An iota: computed from the position inside every kernel that reads it, like a
    /// random op.
    Iota,
    /// A view folded into loads (or copied, when it must be stored).
    View,
    /// A node computed by a step of its own on materialised operands (scatter-add,
    /// scans, sorts: `Step::Interp`, which the backends run as native routines).
    Routine,
    /// A widening cast of a half value (f16/bf16 -> f32) read only by matrix products:
    /// a prologue the GEMM applies as it reads its operand (exact), never computed on
    /// its own.
    Widened,
    /// A step of a matrix product's operand prologue (`ndfuse_ir::Prologue`): a float
    /// cast, or a product or quotient by a constant, read only by products or by
    /// further such steps: the GEMM applies it as it reads its operand, never computed
    /// on its own.
    Prologue,
}

/// A fusion group under construction.
#[derive(Debug, Default)]
pub(super) struct Group {
    pub(super) members: Vec<NodeId>,
    /// Smallest topological position of a member: nothing placed before it can descend
    /// from the group.
    pub(super) min_pos: usize,
    /// Largest topological position of a member: a group whose members all come before
    /// another set cannot depend on it.
    pub(super) max_pos: usize,
    /// Operands outside the group that have operands themselves: the only places a path
    /// that left the group could come back through.
    pub(super) ext: Vec<NodeId>,
    /// Shape of the group's element values.
    pub(super) domain: Shape,
    /// Axes of `domain` reduced in the group, once it holds a reduction.
    pub(super) reduce: Option<Vec<usize>>,
    /// The matrix product the group is the epilogue of, if any: such a group starts
    /// at the product and takes single element-wise consumers only.
    pub(super) contract: Option<NodeId>,
    /// The members that read at computed positions (gather, concat, pad): a group with
    /// any never takes a reduction (the row programs have no lowering of them).
    pub(super) reads: Vec<NodeId>,
}

impl Group {
    /// Number of rows (kept positions) for `reduce` axes.
    pub(super) fn rows(&self, reduce: &[usize]) -> usize {
        reduced_shape(&self.domain, reduce, false).numel()
    }
}

/// Groups the live nodes of one graph into kernels and lowers them (see the `fusion`
/// module docs for the rules).
pub(super) struct Fuser<'g> {
    pub(super) g: &'g Graph,
    pub(super) order: Vec<NodeId>,
    /// Topological position of every live node.
    pub(super) pos: HashMap<NodeId, usize>,
    pub(super) role: HashMap<NodeId, Role>,
    /// The level of every group member.
    pub(super) level: HashMap<NodeId, Level>,
    /// Members that are views of another member: the same value inside the kernel.
    pub(super) alias: HashMap<NodeId, NodeId>,
    pub(super) groups: Vec<Group>,
    /// Nodes that must live in memory, with the first reason found.
    pub(super) stored: BTreeMap<NodeId, String>,
    /// Views (and constants) copied into a buffer of their own.
    pub(super) copies: BTreeSet<NodeId>,
    /// Outputs of the graph that are a whole buffer reshaped: the buffer's node.
    pub(super) reshaped_outputs: BTreeMap<NodeId, NodeId>,
    pub(super) target: TargetDesc,
    /// Whether nodes may share kernels at all.
    pub(super) fuse: bool,
    /// Whether sibling groups may merge and copies join other groups (off on the
    /// retry after a circle of kernels, see `schedule_with`).
    pub(super) share: bool,
}

impl<'g> Fuser<'g> {
    pub(super) fn new(g: &'g Graph, target: TargetDesc) -> Fuser<'g> {
        let order = g.live_nodes();
        let pos = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let role = order
            .iter()
            .map(|&n| {
                let r = match &g.node(n).op {
                    Op::Input { .. } => Role::Input,
                    Op::Const { .. } => Role::Const,
                    Op::RandomUniform { .. } => Role::Random,
                    Op::View(_) => Role::View,
                    Op::Unary(_)
                    | Op::Binary(_)
                    | Op::Where
                    | Op::Cast { .. }
                    | Op::Reduce { .. }
                    | Op::ArgReduce { .. }
                    | Op::MatMul
                    | Op::Gather { .. }
                    | Op::Concat { .. }
                    | Op::Pad { .. } => Role::Member(usize::MAX),
                    Op::Iota { .. } => Role::Iota,
                    Op::ScatterAdd { .. }
                    | Op::Scan { .. }
                    | Op::Argsort { .. }
                    | Op::Attention(_)
                    | Op::AttentionBackward(_)
                    | Op::Linalg(_)
                    | Op::QuantMatMul(_) => Role::Routine,
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
            reshaped_outputs: BTreeMap::new(),
            target,
            fuse: true,
            share: true,
        }
    }

    /// Marks the widening casts that fold into a matrix product's operand read (see
    /// [`Role::Widened`]). The cast's own operand then becomes the product's operand.
    pub(super) fn mark_widened(&mut self) {
        for &n in &self.order {
            let node = self.g.node(n);
            let Op::Cast { to: DType::F32 } = node.op else {
                continue;
            };
            let o = self.g.operands(n)[0];
            let users = self.g.users(n);
            let widened = self.g.node(o).dtype.is_half()
                && !matches!(self.g.node(o).op, Op::Const { .. })
                && !self.g.outputs().contains(&n)
                && !users.is_empty()
                && users.iter().all(|&u| self.g.node(u).op.is_contraction());
            if widened {
                self.role.insert(n, Role::Widened);
            }
        }
    }

    /// Marks the operand prologues of matrix products (see [`Role::Prologue`]), from
    /// the products down: a node is a step when [`Fuser::prologue_step`] takes it and
    /// every user is a product, a step already marked or a widened cast (which only
    /// products read), and it is no graph output.
    /// Only products accumulating in f32 take steps, and a chain's first operand must
    /// live in memory (not a constant or random op, which a GEMM cannot read).
    pub(super) fn mark_prologues(&mut self) {
        for n in self.order.clone().into_iter().rev() {
            if self.role[&n] != Role::Member(usize::MAX)
                || self.g.outputs().contains(&n)
                || self.prologue_step(n).is_none()
            {
                continue;
            }
            let users = self.g.users(n);
            let ok = !users.is_empty()
                && users.iter().all(|&u| {
                    let node = self.g.node(u);
                    (node.op.is_contraction()
                        && node.dtype.is_float()
                        && self.product_takes_steps(u))
                        || matches!(self.role[&u], Role::Prologue | Role::Widened)
                });
            let below = self.prologue_step(n).map(|(_, o)| o);
            let readable = below.is_some_and(|o| {
                let mut m = o;
                loop {
                    match &self.g.node(m).op {
                        Op::Const { .. } | Op::RandomUniform { .. } => break false,
                        Op::View(_) => m = self.g.operands(m)[0],
                        _ => break true,
                    }
                }
            });
            if ok && readable {
                self.role.insert(n, Role::Prologue);
            }
        }
    }

    /// Whether product `p` (a matmul node) accumulates in f32: f32, f16 or bf16
    /// operands.
    fn product_takes_steps(&self, p: NodeId) -> bool {
        let o = self.g.operands(p)[0];
        matches!(self.g.node(o).dtype, DType::F32 | DType::F16 | DType::BF16)
    }

    /// `n` as a prologue step, with the operand it reads: a cast between f16, bf16 and
    /// f32, or a product by (either side) or quotient by a constant, of one of those
    /// types and of the other operand's shape. `None` for anything else.
    pub(super) fn prologue_step(&self, n: NodeId) -> Option<(Prologue, NodeId)> {
        let node = self.g.node(n);
        let floats = [DType::F16, DType::BF16, DType::F32];
        if !floats.contains(&node.dtype) {
            return None;
        }
        let ops = self.g.operands(n);
        let constant = |o: NodeId| match &self.g.node(o).op {
            Op::Const { value } => Some(Scalar::F(round_f64(value.to_f64(), node.dtype))),
            _ => None,
        };
        let same_shape = |o: NodeId| self.g.node(o).shape == node.shape;
        match &node.op {
            Op::Cast { to } => {
                let o = ops[0];
                (floats.contains(&self.g.node(o).dtype) && same_shape(o))
                    .then_some((Prologue::Cast(*to), o))
            }
            Op::Binary(BinaryOp::Mul) => match (constant(ops[0]), constant(ops[1])) {
                (None, Some(c)) if same_shape(ops[0]) => Some((Prologue::Mul(c), ops[0])),
                (Some(c), None) if same_shape(ops[1]) => Some((Prologue::Mul(c), ops[1])),
                _ => None,
            },
            Op::Binary(BinaryOp::Div) => match (constant(ops[0]), constant(ops[1])) {
                (None, Some(c)) if same_shape(ops[0]) => Some((Prologue::Div(c), ops[0])),
                _ => None,
            },
            _ => None,
        }
    }

    /// The prologue of product operand `o`: the steps from the buffer the product reads
    /// up to `o`, in the order they apply (empty when `o` is no step).
    pub(super) fn prologue_of(&self, mut o: NodeId) -> Vec<Prologue> {
        // A widened half value (the product widens it anyway) may be a step's result:
        // `cast(cast(x, f16), f32) @ w`.
        if self.role[&o] == Role::Widened {
            o = self.g.operands(o)[0];
        }
        let mut steps = Vec::new();
        while self.role[&o] == Role::Prologue {
            let (step, below) = self
                .prologue_step(o)
                .expect("a node marked as a prologue step is one");
            steps.push(step);
            o = below;
        }
        steps.reverse();
        steps
    }

    /// Whether the groups `gs` and the node `extra` may be one kernel as far as indexed
    /// reads go: no member reading at computed positions (gather, concat, pad) has an
    /// operand computed in the union itself (it reads its operands from memory, and a
    /// gather's indices are checked there before the kernel runs), and no reduction
    /// joins a group with such a member.
    pub(super) fn indexed_union_ok(&self, gs: &[usize], extra: Option<NodeId>) -> bool {
        let in_union =
            |x: NodeId| Some(x) == extra || self.group_of(x).is_some_and(|g| gs.contains(&g));
        // Only the reads are looked at: a long chain's groups are checked in constant
        // time per step.
        let extra_read = extra.filter(|&n| self.g.node(n).op.is_indexed_read());
        let mut reads = gs
            .iter()
            .flat_map(|&g| self.groups[g].reads.iter().copied())
            .chain(extra_read)
            .peekable();
        if reads.peek().is_none() {
            return true;
        }
        let reduces = gs.iter().any(|&g| self.groups[g].reduce.is_some())
            || extra.is_some_and(|n| self.g.node(n).op.is_reduce());
        if reduces {
            return false;
        }
        reads.all(|m| {
            self.g.operands(m).into_iter().all(|o| {
                // Through views that fold into loads, down to where the value lives.
                let mut b = o;
                while self.role.get(&b) == Some(&Role::View) && !self.copies.contains(&b) {
                    b = self.g.operands(b)[0];
                }
                !in_union(b)
            })
        })
    }

    pub(super) fn group_of(&self, n: NodeId) -> Option<usize> {
        match self.role.get(&n) {
            Some(Role::Member(gi)) if *gi != usize::MAX => Some(*gi),
            _ => None,
        }
    }

    pub(super) fn new_group(
        &mut self,
        n: NodeId,
        domain: Shape,
        reduce: Option<Vec<usize>>,
        level: Level,
    ) {
        self.groups.push(Group {
            domain,
            reduce,
            ..Group::default()
        });
        self.merge(&[self.groups.len() - 1], Some(n));
        self.level.insert(n, level);
    }

    /// Drops groups emptied by merges and renumbers the rest.
    pub(super) fn compact_groups(&mut self) {
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

    /// Moves groups `gs[1..]` and the node `extra` into group `gs[0]`.
    pub(super) fn merge(&mut self, gs: &[usize], extra: Option<NodeId>) {
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
            // A product's epilogue may absorb plain element-wise groups (rule 1): the
            // union is the product's group wherever it was merged into.
            t.contract = t.contract.or(moved.contract);
            t.reads.extend(moved.reads);
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
}
