//! Kernel boundaries (rules 5-7): which values must be stored and why, where each value
//! a kernel reads comes from once views fold into index maps, and the copies made when a
//! view cannot be folded or must itself be stored.

use super::group::{Fuser, Group, Role};
use ndfuse_ir::{Level, NodeId, Op, Scalar, View, ViewOp};

/// Where a value read by a kernel comes from after folding views.
#[derive(Clone, Debug)]
pub(super) enum Source {
    Const(Scalar),
    Buffer {
        base: NodeId,
        view: View,
    },
    /// A random op computed in place: its key's source (a 0-d value) and the index map
    /// from the reader's shape into the op's own row-major positions.
    Random {
        key: Box<Source>,
        view: View,
    },
    /// An iota computed in place: `start + step * p` for the op's own row-major
    /// position `p` that `view` maps the reader's shape to.
    Iota {
        start: i64,
        step: i64,
        view: View,
    },
}

impl Source {
    /// The buffer it reads, if any (a random op reads its key's).
    fn base(&self) -> Option<NodeId> {
        match self {
            Source::Const(_) => None,
            Source::Buffer { base, .. } => Some(*base),
            Source::Random { key, .. } => key.base(),
            Source::Iota { .. } => None,
        }
    }
}

/// `source` (a buffer or random op) read through `view` instead.
fn with_view(source: Source, view: View) -> Source {
    match source {
        Source::Buffer { base, .. } => Source::Buffer { base, view },
        Source::Random { key, .. } => Source::Random { key, view },
        Source::Iota { start, step, .. } => Source::Iota { start, step, view },
        Source::Const(c) => Source::Const(c),
    }
}

/// The index map of `source` after view op `op`, `None` for a constant or a reshape the
/// strides cannot express.
fn source_view(source: &Source, op: &ViewOp) -> Option<View> {
    match source {
        Source::Buffer { view, .. } | Source::Random { view, .. } | Source::Iota { view, .. } => {
            apply_view(view, op)
        }
        Source::Const(_) => None,
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

impl Fuser<'_> {
    fn store(&mut self, n: NodeId, why: String) {
        self.stored.entry(n).or_insert(why);
    }

    /// Rule 7 (and rule 6's copies): decides which nodes need buffers. Runs to a fixed
    /// point because resolving a view may ask for a copy below it.
    pub(super) fn mark_stores(&mut self) {
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
        // An output that is a view reading a whole buffer in order (a reshape of a
        // kernel's stored value, say) is that buffer under the output's shape: the
        // runtime hands it back without a copy.
        for &o in self.g.outputs() {
            if self.role[&o] != Role::View {
                continue;
            }
            if let Source::Buffer { base, view } = self.resolve_below(o) {
                let whole = view.offset == 0
                    && view.is_contiguous()
                    && view.shape.numel() == self.g.node(base).shape.numel();
                if whole {
                    self.stored.remove(&o);
                    self.reshaped_outputs.insert(o, base);
                }
            }
        }
        // A GEMM reads its operands from memory: a constant or random operand (or a view
        // of one) is filled into a buffer first.
        for n in self.order.clone() {
            if self.g.node(n).op.is_contraction() {
                for o in self.g.operands(n) {
                    let why = match self.resolve(o) {
                        Source::Const(_) => "a constant operand of matmul (a GEMM reads memory)",
                        Source::Random { .. } => "a random operand of matmul (a GEMM reads memory)",
                        Source::Iota { .. } => "an iota operand of matmul (a GEMM reads memory)",
                        Source::Buffer { .. } => continue,
                    };
                    self.store(o, why.into());
                }
            }
        }
        // A routine reads its operands from memory: each operand that is not an input,
        // a routine or a kernel's value is copied into a buffer (a kernel's value is
        // stored by the users rule above).
        for n in self.order.clone() {
            if self.role[&n] != Role::Routine {
                continue;
            }
            for o in self.g.operands(n) {
                if matches!(
                    self.role[&o],
                    Role::View | Role::Const | Role::Random | Role::Iota
                ) {
                    let why = format!(
                        "read by {} (a routine reads memory)",
                        self.g.node(n).op.name()
                    );
                    self.store(o, why);
                }
            }
        }
        // A read at computed positions (gather, concat, pad) loads its data from memory
        // (or takes a constant); a gather's index is a load the runtime checks first,
        // or an iota or constant known to be in range.
        for n in self.order.clone() {
            let op = self.g.node(n).op.clone();
            if !op.is_indexed_read() || self.group_of(n).is_none() {
                continue;
            }
            let ops = self.g.operands(n);
            let data: &[NodeId] = match op {
                Op::Gather { .. } => &ops[..1],
                _ => &ops,
            };
            for &o in data {
                if !matches!(self.resolve(o), Source::Buffer { .. } | Source::Const(_)) {
                    let why = format!("read by {} at computed positions", op.name());
                    self.store(o, why);
                }
            }
            if let Op::Gather { axis } = op {
                let n_axis = self.g.node(ops[0]).shape.dims()[axis];
                let ok = match self.resolve(ops[1]) {
                    Source::Buffer { .. } => true,
                    src => static_index_in_range(&src, n_axis),
                };
                if !ok {
                    self.store(
                        ops[1],
                        "a gather's index not known to be in range (the runtime checks it in memory)"
                            .into(),
                    );
                }
            }
        }
        // Stored views, constants and random ops are copies; resolving every read may add
        // more.
        loop {
            let before = (self.stored.len(), self.copies.len());
            let stored: Vec<NodeId> = self.stored.keys().copied().collect();
            for n in stored {
                if matches!(
                    self.role[&n],
                    Role::View | Role::Const | Role::Random | Role::Iota
                ) {
                    self.copies.insert(n);
                    self.resolve_below(n);
                }
            }
            for n in self.order.clone() {
                if self.group_of(n).is_some() && !self.alias.contains_key(&n) {
                    let reduces = self
                        .group_of(n)
                        .is_some_and(|g| self.groups[g].reduce.is_some());
                    for o in self.g.operands(n) {
                        if self.group_of(o) != self.group_of(n) {
                            let random = matches!(
                                self.resolve(o),
                                Source::Random { .. } | Source::Iota { .. }
                            );
                            if let (true, true, Some(r)) = (reduces, random, self.random_below(o)) {
                                self.store(
                                    r,
                                    "read by a kernel with reductions (random ops and iotas are computed in element-wise kernels)".into(),
                                );
                            }
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
    pub(super) fn absorb_copies(&mut self) {
        for c in self.copies.clone() {
            let domain = self.g.node(c).shape.clone();
            let source = self.resolve_below(c);
            let base = source.base();
            // Random ops are computed in element-wise kernels only (the row programs of
            // the codegens have no lowering of them).
            let random = matches!(source, Source::Random { .. } | Source::Iota { .. });
            self.role.insert(c, Role::Member(usize::MAX));
            let target = (0..self.groups.len()).find(|&gi| {
                let grp = &self.groups[gi];
                self.share
                    && !grp.members.is_empty()
                    && grp.contract.is_none()
                    && !(random && grp.reduce.is_some())
                    && grp.domain == domain
                    && base.is_none_or(|b| self.group_of(b) != Some(gi))
                    && self.convex_union(&[gi], Some(c))
                    // Not into a kernel that reads the copy at computed positions (a
                    // gather's stored index is read from memory, checked first).
                    && self.indexed_union_ok(&[gi], Some(c))
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
    pub(super) fn resolve(&mut self, n: NodeId) -> Source {
        if self.copies.contains(&n) {
            return self.buffer(n);
        }
        self.resolve_below(n)
    }

    /// Like [`Fuser::resolve`], but looks through `n` even when `n` is copied (to
    /// build the copy itself).
    ///
    /// Iterative: a chain of a hundred thousand views is walked down to where its value
    /// lives, then its index maps are applied on the way back up, on the heap.
    pub(super) fn resolve_below(&mut self, n: NodeId) -> Source {
        // The views to apply, the topmost first.
        let mut views: Vec<NodeId> = Vec::new();
        let mut m = n;
        let mut source = loop {
            // Below `n`, a copied node is read from its own buffer.
            if m != n && self.copies.contains(&m) {
                break self.buffer(m);
            }
            match (&self.g.node(m).op, self.role[&m]) {
                (Op::Const { value }, _) => break Source::Const(*value),
                (Op::Iota { len, start, step }, _) => {
                    break Source::Iota {
                        start: *start,
                        step: *step,
                        view: View::contiguous(ndfuse_ir::Shape::new([*len])),
                    }
                }
                (Op::RandomUniform { shape }, _) => {
                    let view = View::contiguous(shape.clone());
                    let key = self.resolve(self.g.operands(m)[0]);
                    break Source::Random {
                        key: Box::new(key),
                        view,
                    };
                }
                // The product reads the half buffer itself (only products read a
                // widened cast).
                (Op::Cast { .. }, Role::Widened) => m = self.g.operands(m)[0],
                // A prologue step: the product reads the chain's first operand and
                // applies the steps (`Fuser::prologue_of`) as it reads.
                (_, Role::Prologue) => {
                    m = self
                        .prologue_step(m)
                        .expect("a node marked as a prologue step is one")
                        .1
                }
                (Op::View(_), role) if role == Role::View || self.copies.contains(&m) => {
                    views.push(m);
                    m = self.g.operands(m)[0];
                }
                _ => break self.buffer(m),
            }
        };
        while let Some(m) = views.pop() {
            let Op::View(v) = &self.g.node(m).op else {
                unreachable!("only views are pushed")
            };
            source = match source {
                Source::Const(c) => Source::Const(c),
                Source::Buffer { .. } | Source::Random { .. } | Source::Iota { .. } => {
                    match source_view(&source, v) {
                        Some(view) => with_view(source, view),
                        None => {
                            // Rule 6: the reshape needs its operand contiguous.
                            let operand = self.g.operands(m)[0];
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
                    }
                }
            };
        }
        source
    }

    /// The random op or iota `n` reads through views (not copied ones), if any.
    fn random_below(&self, n: NodeId) -> Option<NodeId> {
        let mut m = n;
        loop {
            match self.role[&m] {
                Role::Random | Role::Iota => return Some(m),
                Role::View if m == n || !self.copies.contains(&m) => m = self.g.operands(m)[0],
                _ => return None,
            }
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
}

/// Whether every index an iota or constant `src` gives, through its view, lies in
/// `-n..n` (so a gather may read through it unchecked).
fn static_index_in_range(src: &Source, n: usize) -> bool {
    let n = n as i128;
    let ok = |v: i128| -n <= v && v < n;
    match src {
        Source::Const(Scalar::I(v)) => ok(i128::from(*v)),
        Source::Iota { start, step, view } => match view.span() {
            // No position read: nothing to check.
            None => true,
            Some((lo, hi)) => {
                let at = |p: i128| i128::from(*start) + i128::from(*step) * p;
                ok(at(lo)) && ok(at(hi))
            }
        },
        _ => false,
    }
}
