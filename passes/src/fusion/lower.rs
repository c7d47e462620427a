//! Lowering: turns the final groups into [`Step`]s, one kernel each, in an order that
//! respects what each reads, and records where every node of the graph ended up.

use super::boundary::Source;
use super::group::{Fuser, Role};
use super::kernel::KernelBuilder;
use crate::plan::gemm_block_rows;
use crate::schedule::{Placement, Schedule, Step};
use ndfuse_ir::{
    BinaryOp, DType, Expr, GatherAxis, Level, NodeId, Op, PadMode, Scalar, Shape, UnaryOp, ValueId,
    View,
};
use std::collections::HashMap;

impl Fuser<'_> {
    /// Builds the steps in dependency order; `None` when the kernels would wait for
    /// each other.
    pub(super) fn lower(mut self) -> Option<Schedule> {
        // Units: groups and copies, each keyed by its first node in topological order so
        // that the schedule follows the graph.
        let mut lowered: Vec<(usize, Step)> = Vec::new();
        for gi in 0..self.groups.len() {
            let first = self.groups[gi].min_pos;
            lowered.push((first, self.lower_group(gi)));
        }
        for &n in &self.order {
            if self.role[&n] == Role::Routine {
                let operands = self.g.operands(n);
                let op = &self.g.node(n).op;
                let reason = match op {
                    Op::Attention(_) => "attention runs as a routine of its own: \
                                         softmax(scale * q @ k^T + mask) @ v fused, the \
                                         scores never stored"
                        .to_string(),
                    Op::AttentionBackward(_) => "attention_backward runs as a routine of \
                                                 its own: dq, dk and dv from the \
                                                 probabilities recomputed per block"
                        .to_string(),
                    Op::QuantMatMul(spec) => format!(
                        "quant_matmul reads {} blocks where they are: each weight \
                         dequantised inside the product, never stored as f32",
                        spec.format.name()
                    ),
                    Op::Linalg(l) => format!(
                        "{} is a library call of the LAPACK level (faer on the CPU)",
                        l.name()
                    ),
                    _ => format!("{} runs as a routine of its own", op.name()),
                };
                lowered.push((
                    self.pos[&n],
                    Step::Interp {
                        node: n,
                        operands,
                        reason,
                    },
                ));
            }
        }
        let mut steps = order_steps(lowered)?;
        let routine_step: HashMap<NodeId, usize> = steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Step::Interp { node, .. } => Some((*node, i)),
                Step::Kernel { .. } => None,
            })
            .collect();
        let mut placement: HashMap<NodeId, Placement> = self
            .g
            .node_ids()
            .into_iter()
            .map(|n| (n, Placement::Dead))
            .collect();
        for &n in &self.order {
            let p = match self.role[&n] {
                Role::Input => Placement::Input,
                Role::Const | Role::Random | Role::Iota | Role::View | Role::Widened => {
                    Placement::Folded
                }
                // Placed with the product that reads it, below.
                Role::Member(_) | Role::Prologue => continue,
                Role::Routine => Placement::Interp {
                    step: routine_step[&n],
                },
            };
            placement.insert(n, p);
        }
        for (&o, &of) in &self.reshaped_outputs {
            placement.insert(o, Placement::Alias { of });
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
        // A prologue step is computed by the kernel of the product that reads it (the
        // first product up its chain of users).
        for &n in &self.order {
            if self.role[&n] != Role::Prologue {
                continue;
            }
            let mut m = n;
            while self.role[&m] == Role::Prologue {
                m = self.g.users(m)[0];
            }
            if let Some(&si) = self.group_of(m).and_then(|gi| group_step.get(&gi)) {
                placement.insert(
                    n,
                    Placement::InKernel {
                        step: si,
                        stored: None,
                    },
                );
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
        Some(Schedule { steps, placement })
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
                names.push(match node.op {
                    Op::Const { .. } => "fill",
                    Op::RandomUniform { .. } => "random_uniform",
                    Op::Iota { .. } => "iota",
                    _ => "copy",
                });
                continue;
            }
            let node = self.g.node(m);
            if node.op.is_indexed_read() {
                let v = self.lower_indexed(&mut kb, m);
                value.insert(m, v);
                names.push(node.op.name());
                continue;
            }
            if node.op.is_contraction() {
                let v = self.lower_contraction(&mut kb, m);
                value.insert(m, v);
                names.push(node.op.name());
                continue;
            }
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

impl Fuser<'_> {
    /// The matrix product `m` as the kernel's contraction: each operand's view padded
    /// and broadcast to the output's batch axes (a GEMM reads views through strides, no
    /// copy), read in its buffer's own dtype (a widened half operand stays half: the
    /// GEMM widens it), the product accumulated in f32 for half types, then cast to
    /// `m`'s dtype.
    fn lower_contraction(&mut self, kb: &mut KernelBuilder, m: NodeId) -> ValueId {
        let node = self.g.node(m);
        let out = node.shape.dims().to_vec();
        let batch = out.len() - 2;
        let mut operands = Vec::with_capacity(2);
        for o in self.g.operands(m) {
            let Source::Buffer { base, mut view } = self.resolve(o) else {
                unreachable!(
                    "a constant operand of matmul is stored by mark_stores (a bug otherwise)"
                )
            };
            while view.shape.rank() < out.len() {
                view = view.expand_dims(0);
            }
            let mut dims = out[..batch].to_vec();
            dims.extend_from_slice(&view.shape.dims()[batch..]);
            operands.push((base, view.broadcast_to(&Shape::new(dims))));
        }
        let dtype = self.g.node(self.g.operands(m)[0]).dtype;
        let acc = if dtype.is_half() { DType::F32 } else { dtype };
        let (rows, _) = gemm_block_rows(&node.shape, acc.size_bytes(), &self.target);
        let rhs = operands.pop().expect("matmul has two operands");
        let lhs = operands.pop().expect("matmul has two operands");
        let [lo, ro] = [0, 1].map(|i| self.g.operands(m)[i]);
        let prologues = (self.prologue_of(lo), self.prologue_of(ro));
        let p = kb.contraction(lhs, rhs, acc, rows, prologues, self.g);
        if node.dtype == acc {
            p
        } else {
            kb.push(node.dtype, Expr::Cast(p))
        }
    }
}

/// Steps sorted so that each comes after the steps writing what it reads; ties keep
/// graph order. `None` when no such order exists (kernels that read each other).
fn order_steps(mut lowered: Vec<(usize, Step)>) -> Option<Vec<Step>> {
    lowered.sort_by_key(|(first, _)| *first);
    let writer: HashMap<NodeId, usize> = lowered
        .iter()
        .enumerate()
        .flat_map(|(i, (_, s))| s.writes().into_iter().map(move |n| (n, i)))
        .collect();
    let mut done = vec![false; lowered.len()];
    let mut out = Vec::with_capacity(lowered.len());
    while out.len() < lowered.len() {
        let next = (0..lowered.len()).find(|&i| {
            !done[i]
                && lowered[i]
                    .1
                    .reads()
                    .iter()
                    .all(|r| writer.get(r).is_none_or(|&w| done[w]))
        })?;
        done[next] = true;
        out.push(next);
    }
    let mut slots: Vec<Option<Step>> = lowered.into_iter().map(|(_, s)| Some(s)).collect();
    Some(
        out.into_iter()
            .map(|i| slots[i].take().expect("each step is taken once"))
            .collect(),
    )
}

impl Fuser<'_> {
    /// A read at computed positions (gather, concat, pad) as the kernel's loads: each
    /// operand read from its buffer through [`Expr::Gather`] with indices computed from
    /// the position (see `mark_stores` for why each operand is in memory).
    fn lower_indexed(&mut self, kb: &mut KernelBuilder, m: NodeId) -> ValueId {
        let node = self.g.node(m).clone();
        let ops = self.g.operands(m);
        if node.shape.numel() == 0 {
            // Nothing is read; the value is never computed.
            return kb.push(node.dtype, Expr::Const(Scalar::I(0).cast(node.dtype)));
        }
        match &node.op {
            Op::Gather { axis } => {
                let n = self.g.node(ops[0]).shape.dims()[*axis];
                let src = self.resolve(ops[1]);
                let checked = matches!(src, Source::Buffer { .. }).then_some(*axis);
                let k = kb.source(src, self.g.node(ops[1]).dtype, Level::Element, self.g);
                self.read_at(kb, ops[0], node.dtype, &[(*axis, k, n)], checked)
            }
            Op::Concat { axis, .. } => {
                let c = kb.coordinate(*axis);
                let mut parts: Vec<(usize, ValueId)> = Vec::new();
                let mut start = 0usize;
                for &o in &ops {
                    let n = self.g.node(o).shape.dims()[*axis];
                    if n > 0 {
                        let k = if start == 0 {
                            c
                        } else {
                            let s = kb.int(start as i64);
                            kb.push(DType::I64, Expr::Binary(BinaryOp::Sub, c, s))
                        };
                        let v = self.read_at(kb, o, node.dtype, &[(*axis, k, n)], None);
                        parts.push((start + n, v));
                    }
                    start += n;
                }
                // The last part where no earlier one's range holds the position.
                let (_, mut v) = parts
                    .pop()
                    .expect("a non-empty concat has a non-empty part");
                while let Some((end, w)) = parts.pop() {
                    let e = kb.int(end as i64);
                    let before = kb.push(DType::Bool, Expr::Binary(BinaryOp::Lt, c, e));
                    v = kb.push(node.dtype, Expr::Where(before, w, v));
                }
                v
            }
            Op::Pad {
                widths,
                mode,
                value,
            } => {
                let dims = self.g.node(ops[0]).shape.dims().to_vec();
                let mut axes = Vec::new();
                let mut inside: Option<ValueId> = None;
                for (a, (&(lo, hi), &n)) in widths.iter().zip(&dims).enumerate() {
                    if lo == 0 && hi == 0 {
                        continue;
                    }
                    if n == 0 {
                        // Only the constant mode pads an empty axis: all fill.
                        return kb.push(node.dtype, Expr::Const(*value));
                    }
                    let c = kb.coordinate(a);
                    let l = kb.int(lo as i64);
                    let k = kb.push(DType::I64, Expr::Binary(BinaryOp::Sub, c, l));
                    let k = match mode {
                        PadMode::Constant => {
                            let z = kb.int(0);
                            let top = kb.int(n as i64);
                            let ge = kb.push(DType::Bool, Expr::Binary(BinaryOp::Ge, k, z));
                            let lt = kb.push(DType::Bool, Expr::Binary(BinaryOp::Lt, k, top));
                            let here = kb.push(DType::Bool, Expr::Binary(BinaryOp::And, ge, lt));
                            inside = Some(match inside {
                                None => here,
                                Some(i) => {
                                    kb.push(DType::Bool, Expr::Binary(BinaryOp::And, i, here))
                                }
                            });
                            k
                        }
                        // max(k, 0), then the gather's clamp to n - 1 (its wrap of a
                        // negative index is numpy's take, not the edge rule).
                        PadMode::Edge => {
                            let z = kb.int(0);
                            kb.push(DType::I64, Expr::Binary(BinaryOp::Max, k, z))
                        }
                        // (n-1) - |(n-1) - |k||: widths are below n (infer checks).
                        PadMode::Reflect => {
                            let last = kb.int(n as i64 - 1);
                            let ak = kb.push(DType::I64, Expr::Unary(UnaryOp::Abs, k));
                            let d = kb.push(DType::I64, Expr::Binary(BinaryOp::Sub, last, ak));
                            let ad = kb.push(DType::I64, Expr::Unary(UnaryOp::Abs, d));
                            kb.push(DType::I64, Expr::Binary(BinaryOp::Sub, last, ad))
                        }
                    };
                    axes.push((a, k, n));
                }
                let v = self.read_at(kb, ops[0], node.dtype, &axes, None);
                match inside {
                    Some(i) => {
                        let fill = kb.push(node.dtype, Expr::Const(*value));
                        kb.push(node.dtype, Expr::Where(i, v, fill))
                    }
                    None => v,
                }
            }
            other => unreachable!("{} is no indexed read (a bug otherwise)", other.name()),
        }
    }

    /// Operand `o` (a buffer or constant) read at every domain position with the
    /// coordinates along `axes` (axis, i64 index value, extent) computed instead.
    fn read_at(
        &mut self,
        kb: &mut KernelBuilder,
        o: NodeId,
        dtype: DType,
        axes: &[(usize, ValueId, usize)],
        checked: Option<usize>,
    ) -> ValueId {
        match self.resolve(o) {
            Source::Const(c) => kb.push(dtype, Expr::Const(c)),
            Source::Buffer { base, view } => {
                let mut strides = view.strides.clone();
                let mut gaxes = Vec::with_capacity(axes.len());
                for &(a, index, extent) in axes {
                    gaxes.push(GatherAxis {
                        index,
                        stride: view.strides[a],
                        extent,
                        checked,
                    });
                    strides[a] = 0;
                }
                let view = View {
                    shape: kb.domain.clone(),
                    strides,
                    offset: view.offset,
                };
                let input = kb.input(base, dtype, self.g);
                kb.push(
                    dtype,
                    Expr::Gather {
                        input,
                        view,
                        axes: gaxes,
                    },
                )
            }
            Source::Random { .. } | Source::Iota { .. } => {
                unreachable!("mark_stores puts a computed operand of an indexed read in memory")
            }
        }
    }
}
