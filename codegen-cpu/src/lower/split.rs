//! The two-stage lowering of `Plan::Split` (few long rows): which functions a split
//! kernel compiles to, and where their partial results live between them.
//!
//! A split kernel is not one function but a short list of *phases*, each a function
//! with the usual ABI run over all its units before the next one starts:
//!
//! ```text
//! for each reduction sweep s (see `rows`):
//!   Partial(s)  units (row, chunk): row values of earlier sweeps from scratch; sweep s
//!               over the chunk's elements only; its accumulators -> partial slots
//!   Combine(s)  units rows: partials of every chunk folded in chunk order -> the sweep's
//!               results (scratch); after the last sweep: the epilogue, per-row stores
//! Stores        units (row, chunk), only with element stores: every row value from
//!               scratch, the store sweep over the chunk's elements
//! ```
//!
//! Chunk `c` of a row covers elements `[c * chunk_len, min((c + 1) * chunk_len,
//! row_len))` with `chunk_len = ceil(row_len / splits)`; `splits` comes from the plan,
//! which depends on shapes only, and partials combine in chunk order, so results are
//! the same on any number of threads. A multi-sweep row program (mean then variance,
//! softmax) gets one Partial/Combine pair per sweep: later sweeps read the results of
//! earlier ones, which must be complete over the whole row first.
//!
//! Scratch memory (owned by `CompiledKernel::run`) is an array of 8-byte slots: first
//! `rows * results` result slots (one per reduction of each row), then
//! `rows * splits * partial_slots` partial slots (one block per unit). A value narrower
//! than 8 bytes sits in the low bytes of its slot.

use super::rows::{results_of, Acc, AccInfo, Bound};
use super::{cl_type, input_flags, Lowering};
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::{Expr, Kernel, Plan};

/// Bytes of one scratch slot.
pub(crate) const SLOT: usize = 8;

/// What one function of a row kernel does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Everything, row by row: `start..end` are rows, each reduced whole.
    Whole,
    /// Stage 1 of sweep `s`: `start..end` are units `row * splits + chunk`.
    Partial(usize),
    /// Stage 2 of sweep `s`: `start..end` are rows.
    Combine(usize),
    /// Element stores of a split kernel: `start..end` are units `row * splits + chunk`.
    Stores,
}

impl Phase {
    /// Whether `start..end` count (row, chunk) units rather than rows.
    pub(crate) fn per_chunk(self) -> bool {
        matches!(self, Phase::Partial(_) | Phase::Stores)
    }

    /// The suffix of the phase's function name (empty for `Whole`).
    pub(crate) fn suffix(self) -> String {
        match self {
            Phase::Whole => String::new(),
            Phase::Partial(s) => format!("_partial{s}"),
            Phase::Combine(s) => format!("_combine{s}"),
            Phase::Stores => "_stores".to_string(),
        }
    }
}

/// Where a split kernel's intermediate values live, and its chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SplitLayout {
    /// Rows of the kernel.
    pub rows: usize,
    /// Elements per row.
    pub row_len: usize,
    /// Chunks per row.
    pub splits: usize,
    /// Elements per chunk (the last chunks may be shorter, or empty).
    pub chunk_len: usize,
    /// Reduction sweeps of the row program.
    pub sweeps: usize,
    /// Per instruction: the result slot of a reduction (its rank among reductions).
    pub result_slot: Vec<Option<usize>>,
    /// Result slots per row.
    pub results: usize,
    /// Partial slots per unit: the most accumulator values any sweep carries.
    pub partial_slots: usize,
    /// Whether some store writes every domain position (a `Stores` phase is needed).
    pub element_stores: bool,
}

impl SplitLayout {
    /// The layout of `kernel` when it is lowered in split phases, or `None` when it is
    /// lowered whole: another plan, fewer than 2 chunks, empty rows, or no reduction
    /// (nothing would be split).
    pub(crate) fn of(kernel: &Kernel) -> Option<SplitLayout> {
        let Plan::Split { splits, .. } = kernel.plan else {
            return None;
        };
        let (rows, row_len) = (kernel.rows(), kernel.row_len());
        let stage = super::rows::schedule(kernel);
        if rows == 0 || row_len == 0 || splits < 2 || stage.sweeps == 0 {
            return None;
        }
        let splits = splits.min(row_len);
        let mut result_slot = vec![None; kernel.body.len()];
        let mut results = 0;
        let mut per_sweep = vec![0usize; stage.sweeps];
        for (v, ins) in kernel.body.iter().enumerate() {
            let slots = match ins.expr {
                Expr::Reduce(..) => 1,
                Expr::ArgReduce(..) => 2,
                _ => continue,
            };
            result_slot[v] = Some(results);
            results += 1;
            per_sweep[stage.stage[v] - 1] += slots;
        }
        let levels = kernel.levels();
        let element_stores = kernel
            .stores
            .iter()
            .any(|s| !super::rows::per_row(kernel, &levels, s));
        Some(SplitLayout {
            rows,
            row_len,
            splits,
            chunk_len: row_len.div_ceil(splits),
            sweeps: stage.sweeps,
            result_slot,
            results,
            partial_slots: per_sweep.into_iter().max().unwrap_or(0),
            element_stores,
        })
    }

    /// The phases, in the order they must run.
    pub(crate) fn phases(&self) -> Vec<Phase> {
        let mut phases = Vec::new();
        for s in 0..self.sweeps {
            phases.push(Phase::Partial(s));
            phases.push(Phase::Combine(s));
        }
        if self.element_stores {
            phases.push(Phase::Stores);
        }
        phases
    }

    /// Slot index of the first partial slot.
    pub(crate) fn partial_base(&self) -> usize {
        self.rows * self.results
    }

    /// Total 8-byte slots of scratch memory.
    pub(crate) fn scratch_slots(&self) -> usize {
        self.partial_base() + self.rows * self.splits * self.partial_slots
    }

    /// Whether results of sweep `s` must be written to scratch by `Combine(s)`: a later
    /// sweep or the stores phase reads them.
    pub(crate) fn keeps_results(&self, s: usize) -> bool {
        s + 1 < self.sweeps || self.element_stores
    }
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The scratch pointer: the last entry of the pointer array, after the buffers.
    pub(super) fn scratch_base(&mut self, kernel: &Kernel, ptrs: Value) -> Value {
        let k = kernel.inputs.len() + kernel.outputs.len();
        let word = self.ptr_ty.bytes() as usize;
        let at = i32::try_from(k * word).expect("a kernel with over 2^28 buffers is a bug");
        self.b.ins().load(self.ptr_ty, input_flags(), ptrs, at)
    }

    /// The address of 8-byte slot `first + index * per` of the scratch memory.
    fn slot_addr(&mut self, scratch: Value, first: usize, index: Value, per: usize) -> Value {
        let scaled = self.b.ins().imul_imm_s(index, (per * SLOT) as i64);
        let at = self.b.ins().iadd(scratch, scaled);
        if first == 0 {
            at
        } else {
            self.b.ins().iadd_imm_s(at, (first * SLOT) as i64)
        }
    }

    /// Stage 1's output: the final accumulator values of unit `u`'s sweep, in order.
    pub(super) fn store_partials(
        &mut self,
        l: &SplitLayout,
        scratch: Value,
        u: Value,
        finals: &[Value],
    ) {
        let at = self.slot_addr(scratch, l.partial_base(), u, l.partial_slots);
        for (k, &v) in finals.iter().enumerate() {
            self.b
                .ins()
                .store(MemFlagsData::trusted(), v, at, (k * SLOT) as i32);
        }
    }

    /// Stage 2: the partials of every chunk of row `r` folded in chunk order, each
    /// with the operation its sweep used (an arg reduction keeps the earliest chunk's
    /// index on ties and the first NaN, as one sequential sweep would); returns the
    /// results of `reduces`.
    pub(super) fn combine_partials(
        &mut self,
        kernel: &Kernel,
        l: &SplitLayout,
        scratch: Value,
        r: Value,
        reduces: &[usize],
    ) -> Result<Vec<Value>, String> {
        let mut accs: Vec<AccInfo> = Vec::new();
        let mut carried = Vec::new();
        for &v in reduces {
            let x = Kernel::operands(&kernel.body[v].expr)[0].index();
            let xd = kernel.body[x].dtype;
            let acc = match kernel.body[v].expr {
                Expr::Reduce(a, _) => Acc::Plain(a),
                Expr::ArgReduce(a, _) => Acc::Arg(a),
                _ => panic!("v{v} is not a reduction (a bug)"),
            };
            let init = self.acc_init(acc, xd);
            carried.push((cl_type(xd), init));
            if let Acc::Arg(_) = acc {
                let zero = self.b.ins().iconst(types::I64, 0);
                carried.push((types::I64, zero));
            }
            accs.push((acc, x, xd));
        }
        let first_unit = self.b.ins().imul_imm_s(r, l.splits as i64);
        let zero = self.b.ins().iconst(types::I64, 0);
        let types: Vec<Type> = carried.iter().map(|&(t, _)| t).collect();
        let finals = self.counted_loop(
            zero,
            Bound::Const(l.splits as i64),
            1,
            false,
            &carried,
            |lw, c, state| {
                let u = lw.b.ins().iadd(first_unit, c);
                let at = lw.slot_addr(scratch, l.partial_base(), u, l.partial_slots);
                let part: Vec<Value> = types
                    .iter()
                    .enumerate()
                    .map(|(k, &t)| {
                        lw.b.ins()
                            .load(t, MemFlagsData::trusted(), at, (k * SLOT) as i32)
                    })
                    .collect();
                let mut next = Vec::with_capacity(state.len());
                let mut k = 0;
                for &(acc, _, xd) in &accs {
                    match acc {
                        Acc::Plain(a) => {
                            next.push(lw.accumulate(a, xd, state[k], part[k]));
                            k += 1;
                        }
                        Acc::Arg(op) => {
                            let (best, at) = (state[k], state[k + 1]);
                            let take = lw.arg_better(op, xd, part[k], best);
                            next.push(lw.b.ins().select(take, part[k], best));
                            next.push(lw.b.ins().select(take, part[k + 1], at));
                            k += 2;
                        }
                    }
                }
                Ok(next)
            },
        )?;
        Ok(results_of(&accs, &finals))
    }

    /// Writes the results of `reduces` for row `r` to their result slots.
    pub(super) fn store_results(
        &mut self,
        l: &SplitLayout,
        scratch: Value,
        r: Value,
        reduces: &[usize],
        results: &[Value],
    ) {
        let at = self.slot_addr(scratch, 0, r, l.results);
        for (&v, &value) in reduces.iter().zip(results) {
            let slot = l.result_slot[v].expect("reductions have result slots");
            self.b
                .ins()
                .store(MemFlagsData::trusted(), value, at, (slot * SLOT) as i32);
        }
    }

    /// Reads the results of `reduces` for row `r`, written by an earlier phase.
    pub(super) fn load_results(
        &mut self,
        kernel: &Kernel,
        l: &SplitLayout,
        scratch: Value,
        r: Value,
        reduces: &[usize],
    ) -> Vec<Value> {
        let at = self.slot_addr(scratch, 0, r, l.results);
        reduces
            .iter()
            .map(|&v| {
                let slot = l.result_slot[v].expect("reductions have result slots");
                let ty = cl_type(kernel.body[v].dtype);
                self.b
                    .ins()
                    .load(ty, MemFlagsData::trusted(), at, (slot * SLOT) as i32)
            })
            .collect()
    }
}
