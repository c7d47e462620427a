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

use super::function::{cl_type, input_flags, Lowering};
use super::layout::{SplitLayout, SLOT};
use super::sweep::{results_of, Acc, AccInfo, Bound};
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::{Expr, Kernel};

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
