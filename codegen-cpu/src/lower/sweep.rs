//! What the loops over rows share: the sweep schedule of a row program, how its loads
//! split into a row part and an element part (`RowIndex`), what a sweep reads
//! (`SweepEnv`), the accumulators of reductions (`Acc`, their start, step and
//! results), and the counted loop every sweep, band and vector loop is built on.

use super::cache::SweepCache;
use super::function::{cl_type, Lowering, Offset};
use crate::index::{self, Access, IndexPlan};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, BlockArg, InstBuilder, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::{Accumulate, ArgReduceOp, DKind, DType, Expr, Kernel, Level, Shape, View};

/// The sweep structure of a row program, decided from the body alone.
pub(super) struct Schedule {
    /// Per instruction: 0 if it needs no reduction result, else one more than the sweep
    /// of the latest reduction it depends on. A reduction runs in sweep `stage - 1`;
    /// other row values are computed just before sweep `stage` (or after the last one).
    pub stage: Vec<usize>,
    /// Number of reduction sweeps (the final store sweep not counted).
    pub sweeps: usize,
}

pub(super) fn schedule(kernel: &Kernel) -> Schedule {
    let (stage, sweeps) = kernel.stages();
    Schedule { stage, sweeps }
}

/// The element values a sweep must compute: `targets` and their element-level operands,
/// transitively (row-level operands are already computed before the sweep).
pub(super) fn element_closure(kernel: &Kernel, levels: &[Level], targets: &[usize]) -> Vec<bool> {
    let mut need = vec![false; kernel.body.len()];
    for &t in targets {
        if levels[t] == Level::Element {
            need[t] = true;
        }
    }
    for i in (0..kernel.body.len()).rev() {
        if need[i] {
            for v in Kernel::operands(&kernel.body[i].expr) {
                if levels[v.index()] == Level::Element {
                    need[v.index()] = true;
                }
            }
        }
    }
    need
}

/// `view` restricted to `axes` (shape, strides) with offset `offset`.
pub(super) fn restrict(view: &View, axes: &[usize], offset: isize) -> View {
    View {
        shape: Shape::new(
            axes.iter()
                .map(|&a| view.shape.dims()[a])
                .collect::<Vec<_>>(),
        ),
        strides: axes.iter().map(|&a| view.strides[a]).collect(),
        offset,
    }
}

/// Whether store `s` writes one element per row (a row value into a buffer of `rows`
/// elements) rather than every domain position: the rule of `Kernel::check`.
pub(super) fn per_row(kernel: &Kernel, levels: &[Level], s: &ndfuse_ir::Store) -> bool {
    levels[s.value.index()] == Level::Row && kernel.outputs[s.output].len == kernel.rows()
}

/// The running state of one reduction in a sweep.
#[derive(Clone, Copy)]
pub(super) enum Acc {
    /// `acc = acc (+) x`.
    Plain(Accumulate),
    /// The best value so far and its index.
    Arg(ArgReduceOp),
}

/// How the row-level part and the element-level part of every load and of the output
/// position combine: index plans over the kept and over the reduced axes.
pub(super) struct RowIndex {
    pub kept: IndexPlan,
    pub red: IndexPlan,
    /// Per instruction that is a load: its (kept, reduced) accesses.
    pub loads: Vec<Option<(Access, Access)>>,
    /// The (kept, reduced) accesses of a contiguous output of the domain's shape, when
    /// some store writes every position.
    pub out: Option<(Access, Access)>,
}

pub(super) fn row_index(kernel: &Kernel, element_stores: bool) -> RowIndex {
    let rank = kernel.domain.rank();
    let kept_axes: Vec<usize> = (0..rank)
        .filter(|a| !kernel.reduce_axes.contains(a))
        .collect();
    let red_axes = &kernel.reduce_axes;
    let mut kept_views = Vec::new();
    let mut red_views = Vec::new();
    for ins in &kernel.body {
        if let Expr::Load { view, .. } = &ins.expr {
            kept_views.push(restrict(view, &kept_axes, view.offset));
            red_views.push(restrict(view, red_axes, 0));
        }
    }
    if element_stores {
        let out = View::contiguous(kernel.domain.clone());
        kept_views.push(restrict(&out, &kept_axes, 0));
        red_views.push(restrict(&out, red_axes, 0));
    }
    let dims = kernel.domain.dims();
    let kept_shape = Shape::new(kept_axes.iter().map(|&a| dims[a]).collect::<Vec<_>>());
    let red_shape = Shape::new(red_axes.iter().map(|&a| dims[a]).collect::<Vec<_>>());
    let (kept, kacc) = index::plan(&kept_shape, &kept_views.iter().collect::<Vec<_>>());
    let (red, racc) = index::plan(&red_shape, &red_views.iter().collect::<Vec<_>>());
    let mut pairs = kacc.into_iter().zip(racc);
    let loads = kernel
        .body
        .iter()
        .map(|ins| match ins.expr {
            Expr::Load { .. } => pairs.next(),
            _ => None,
        })
        .collect();
    let out = if element_stores { pairs.next() } else { None };
    RowIndex {
        kept,
        red,
        loads,
        out,
    }
}

/// What every sweep of one row reads.
pub(super) struct SweepEnv<'a> {
    pub ix: &'a RowIndex,
    pub levels: &'a [Level],
    /// Per instruction that is a load: its offset at the row's first element.
    pub kept_offsets: &'a [Option<Offset>],
    pub in_bases: &'a [Value],
    /// The row cache, with this sweep's part of its plan.
    pub cache: Option<SweepCache<'a>>,
}

/// The elements of a row a sweep covers.
#[derive(Clone, Copy)]
pub(super) enum Range {
    /// The whole row, `0..row_len` (`row_len > 0` whenever a sweep is emitted).
    Whole(i64),
    /// `lo..hi`, known at run time (a chunk of a split row; possibly empty).
    Dynamic(Value, Value),
}

/// The end of a [`Lowering::counted_loop`].
#[derive(Clone, Copy)]
pub(super) enum Bound {
    /// A constant.
    Const(i64),
    /// A value computed before the loop.
    Value(Value),
}

/// A reduction of a sweep: its kind, its operand's instruction and dtype.
pub(super) type AccInfo = (Acc, usize, DType);

/// The results of a sweep's reductions from its final accumulator values: a plain
/// reduction's accumulator, an arg reduction's index (the second of its pair).
pub(super) fn results_of(accs: &[AccInfo], finals: &[Value]) -> Vec<Value> {
    let mut results = Vec::with_capacity(accs.len());
    let mut k = 0;
    for &(acc, _, _) in accs {
        match acc {
            Acc::Plain(_) => {
                results.push(finals[k]);
                k += 1;
            }
            Acc::Arg(_) => {
                results.push(finals[k + 1]);
                k += 2;
            }
        }
    }
    results
}

impl<M: Module> Lowering<'_, '_, M> {
    /// `f` as a float of `dtype`, or `i` as an integer of it.
    pub(super) fn typed_const(&mut self, dtype: DType, f: f64, i: i64) -> Value {
        match dtype.kind() {
            DKind::Float => self.float_const(dtype, f),
            _ => self.b.ins().iconst(cl_type(dtype), i),
        }
    }

    /// A loop `for j in (lo..hi).step_by(step)` carrying values (see [`Self::sweep`]);
    /// `hi - lo` must be a multiple of `step`. Without `guard` the loop is known to run
    /// at least once. The caches of constants and scaled offsets made in the body are
    /// dropped afterwards: the body does not dominate what follows.
    pub(super) fn counted_loop(
        &mut self,
        lo: Value,
        hi: Bound,
        step: i64,
        guard: bool,
        carried: &[(Type, Value)],
        body: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<Vec<Value>, String> {
        let head = self.b.create_block();
        let done = self.b.create_block();
        let j = self.b.append_block_param(head, types::I64);
        let mut params = Vec::new();
        let mut results = Vec::new();
        for &(ty, _) in carried {
            params.push(self.b.append_block_param(head, ty));
            results.push(self.b.append_block_param(done, ty));
        }
        let mut args = vec![lo.into()];
        args.extend(carried.iter().map(|&(_, v)| BlockArg::from(v)));
        if guard {
            let empty: Vec<BlockArg> = carried.iter().map(|&(_, v)| BlockArg::from(v)).collect();
            let runs = match hi {
                Bound::Const(n) => self.b.ins().icmp_imm_s(IntCC::SignedLessThan, lo, n),
                Bound::Value(h) => self.b.ins().icmp(IntCC::SignedLessThan, lo, h),
            };
            self.b.ins().brif(runs, head, &args, done, &empty);
        } else {
            self.b.ins().jump(head, &args);
        }

        self.b.switch_to_block(head);
        let (consts, scaled) = (self.consts.clone(), self.scaled.clone());
        let next_vals = body(self, j, &params)?;
        let next = self.b.ins().iadd_imm_s(j, step);
        let more = match hi {
            Bound::Const(n) => self.b.ins().icmp_imm_s(IntCC::SignedLessThan, next, n),
            Bound::Value(h) => self.b.ins().icmp(IntCC::SignedLessThan, next, h),
        };
        let mut again = vec![next.into()];
        again.extend(next_vals.iter().map(|&v| BlockArg::from(v)));
        let out: Vec<BlockArg> = next_vals.iter().map(|&v| BlockArg::from(v)).collect();
        self.b.ins().brif(more, head, &again, done, &out);
        (self.consts, self.scaled) = (consts, scaled);

        self.b.switch_to_block(done);
        Ok(results)
    }

    /// The starting accumulator of `acc` over values of `dtype`: the identity of the
    /// operation, so the first element is taken as it is (-inf for max, whose
    /// `fmax(-inf, -0)` is -0; the first element always wins an arg reduction, since
    /// the comparison with the start is strict and the start index is 0).
    pub(super) fn acc_init(&mut self, acc: Acc, dtype: DType) -> Value {
        let (lo, hi) = match dtype {
            DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
            // Bools compare unsigned: 0 is the least, 1 the greatest.
            DType::Bool => (0, 1),
            _ => (i64::MIN, i64::MAX),
        };
        match acc {
            Acc::Plain(Accumulate::Sum) => self.typed_const(dtype, 0.0, 0),
            Acc::Plain(Accumulate::Prod) => self.typed_const(dtype, 1.0, 1),
            Acc::Plain(Accumulate::Max) | Acc::Arg(ArgReduceOp::ArgMax) => {
                self.typed_const(dtype, f64::NEG_INFINITY, lo)
            }
            Acc::Plain(Accumulate::Min) | Acc::Arg(ArgReduceOp::ArgMin) => {
                self.typed_const(dtype, f64::INFINITY, hi)
            }
        }
    }

    /// `acc (+) x` in the value's own type: f32 in f32 (rounded at every step, in
    /// element order), f64 in f64, integers wrapping. Float max/min propagate NaN and
    /// order -0 below +0, as the reference's.
    pub(super) fn accumulate(
        &mut self,
        acc: Accumulate,
        dtype: DType,
        a: Value,
        x: Value,
    ) -> Value {
        let ins = self.b.ins();
        match (acc, dtype.kind() == DKind::Float) {
            (Accumulate::Sum, true) => ins.fadd(a, x),
            (Accumulate::Prod, true) => ins.fmul(a, x),
            (Accumulate::Max, true) => ins.fmax(a, x),
            (Accumulate::Min, true) => ins.fmin(a, x),
            (Accumulate::Sum, false) => ins.iadd(a, x),
            (Accumulate::Prod, false) => ins.imul(a, x),
            (Accumulate::Max, false) => ins.smax(a, x),
            (Accumulate::Min, false) => ins.smin(a, x),
        }
    }

    /// Whether `x` replaces `best` in an arg reduction (the reference's `arg_f64` /
    /// `arg_i64`): strictly better, or the first NaN. Once `best` is a NaN nothing
    /// compares better and a later NaN is not first, so the first NaN's index stays.
    pub(super) fn arg_better(
        &mut self,
        op: ArgReduceOp,
        dtype: DType,
        x: Value,
        best: Value,
    ) -> Value {
        let max = op == ArgReduceOp::ArgMax;
        match dtype.kind() {
            DKind::Float => {
                let cc = if max {
                    FloatCC::GreaterThan
                } else {
                    FloatCC::LessThan
                };
                let better = self.b.ins().fcmp(cc, x, best);
                let x_nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
                let best_num = self.b.ins().fcmp(FloatCC::Ordered, best, best);
                let first_nan = self.b.ins().band(x_nan, best_num);
                self.b.ins().bor(better, first_nan)
            }
            DKind::Int => {
                let cc = if max {
                    IntCC::SignedGreaterThan
                } else {
                    IntCC::SignedLessThan
                };
                self.b.ins().icmp(cc, x, best)
            }
            DKind::Bool => {
                let cc = if max {
                    IntCC::UnsignedGreaterThan
                } else {
                    IntCC::UnsignedLessThan
                };
                self.b.ins().icmp(cc, x, best)
            }
        }
    }
}
