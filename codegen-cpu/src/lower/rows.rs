//! Lowering of kernels with reduce axes: the row program of `ndfuse_ir::kernel`, one
//! row after another over a range of row indices.
//!
//! ```text
//! block0(ptrs, start, end):  brif start < end, pre, exit
//! pre:                       buffer pointers, constants; jump row(start)
//! row(r):                    (a split phase: r and chunk c of unit u)
//!                            kept index of r -> per-load base offsets; row values
//!   sweep 0:  head(j, accs..): reduced index of j, element values, accs' = accs (+) x
//!             brif j + 1 < row_len, head(j + 1, accs'..), done(accs'..)
//!   done(results..):         row values that need sweep 0's results
//!   sweep 1 ...              (reductions that need sweep 0's results)
//!   per-row stores out[r]; final sweep: element stores (row values broadcast)
//!   brif r + 1 < end, row(r + 1), exit
//! exit:                      return
//! ```
//!
//! Every reduction goes into the earliest sweep its operand allows (one after the
//! sweeps of the reductions it depends on), so sibling reductions share a sweep. A later
//! sweep loads and recomputes the element values it needs (re-reading a row that is
//! usually still in cache), except those that contain a transcendental: those go
//! through the row cache (`cache`), a per-call stack buffer of one row, written by the
//! sweep that first computes them and read by the later ones. With a wide tier, a
//! value of an op that has a wide routine is made for the whole row before the first
//! sweep that needs it (a fill pass, then a call of the routine: see `cache`). There,
//! a pass that is all one row routine's work is one call of it, no loop: a lone f32
//! max of a load contiguous along the row (`ndfuse_wide_max`, exact), a lone f32 sum of
//! a filled value (`ndfuse_wide_sum`, in its own fixed order), the fill of `exp(x - r)`
//! from such a load (`ndfuse_wide_exp_shift`), and stores of one f32 `e / d` of a
//! cached row (`ndfuse_wide_div`); see `wide::reduce` and `wide::shift`.
//!
//! Element `j` of row `r` is the domain position whose kept axes hold the row-major
//! index `r` (over the kept axes) and whose reduced axes hold the row-major index `j`
//! (over the reduced axes). Each is decomposed by division by constant extents with the
//! plans of `index`, once per row for `r` and once per element for `j`, so a load's
//! offset is a per-row base plus a per-element part.
//!
//! The same function serves the phases of a split kernel (`split`): a phase runs the
//! row program only as far as it needs (up to one sweep, over one chunk of the row) and
//! takes the results of earlier sweeps from scratch memory instead of sweeping again.
//! `Rows` and `Columns` kernels that have no faster loop of their own are lowered
//! whole, one row after another.

use super::cache::{self, SweepCache};
use super::function::{cl_type, Lowering, Offset};
use super::layout::{Phase, SplitLayout};
use super::sweep::{
    element_closure, per_row, results_of, row_index, schedule, Acc, AccInfo, Bound, Range,
    Schedule, SweepEnv,
};
use super::vector;
use crate::index::Access;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::{Accumulate, BinaryOp, DType, Expr, Kernel, Level, UnaryOp};

/// `a + b` for offsets: one add of the variable parts at most.
fn sum_offsets<M: Module>(lw: &mut Lowering<'_, '_, M>, a: &Offset, b: Offset) -> Offset {
    let var = match (a.var, b.var) {
        (Some(x), Some(y)) => Some(lw.b.ins().iadd(x, y)),
        (x, y) => x.or(y),
    };
    Offset {
        var,
        elems: a.elems + b.elems,
    }
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The function of `phase` for a kernel with reduce axes; `start..end` are rows, or
    /// (row, chunk) units for the per-chunk phases of a split kernel (see `split`).
    pub(super) fn row_kernel(
        &mut self,
        kernel: &Kernel,
        (ptrs, start, end): (Value, Value, Value),
        phase: Phase,
        split: Option<&SplitLayout>,
    ) -> Result<(), String> {
        let (rows, row_len) = (kernel.rows(), kernel.row_len());
        if rows == 0 {
            self.b.ins().return_(&[]);
            return Ok(());
        }
        let levels = kernel.levels();
        let sched = schedule(kernel);
        let element_stores = kernel.stores.iter().any(|s| !per_row(kernel, &levels, s));
        // With empty rows the domain is empty: no view is decomposable and no element
        // is read (`supports` refuses row-level loads there), so no index plan is made.
        let ix = (row_len > 0).then(|| row_index(kernel, element_stores));
        let row_len = i64::try_from(row_len).expect("row_len <= numel fits i64 (supports)");

        let pre = self.b.create_block();
        let unit = self.b.create_block();
        let exit = self.b.create_block();
        let u = self.b.append_block_param(unit, types::I64);
        let nonempty = self.b.ins().icmp(IntCC::SignedLessThan, start, end);
        self.b.ins().brif(nonempty, pre, &[], exit, &[]);

        // Preheader: buffer pointers and constants, invariant over rows.
        self.b.switch_to_block(pre);
        let bases = self.buffer_bases(kernel, ptrs);
        let (in_bases, out_bases) = bases.split_at(kernel.inputs.len());
        let scratch = split.map(|_| self.scratch_base(kernel, ptrs));
        // The row cache, for whole rows only (a split row is spread over calls).
        let cache_plan = match (&ix, split) {
            (Some(_), None) => cache::plan(
                kernel,
                &levels,
                &sweep_targets(kernel, &levels, &sched),
                row_len,
                self.wide,
            ),
            _ => None,
        };
        let cache_base = cache_plan.as_ref().map(|p| self.row_cache(p));
        let cache_of = |sweep: usize| {
            cache_plan
                .as_ref()
                .zip(cache_base)
                .map(|(plan, base)| SweepCache { base, plan, sweep })
        };
        let mut values: Vec<Option<Value>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            if let Expr::Const(_) = ins.expr {
                values[v] = Some(self.compute(kernel, v, &values)?);
            }
        }
        self.b.ins().jump(unit, &[start.into()]);

        // The unit: its row, and for a per-chunk phase the chunk's element range.
        self.b.switch_to_block(unit);
        let (r, range) = match (phase.per_chunk(), split) {
            (true, Some(l)) => {
                let splits = self.iconst(l.splits as i64);
                let r = self.b.ins().udiv(u, splits);
                let whole = self.b.ins().imul(r, splits);
                let c = self.b.ins().isub(u, whole);
                // Chunks past the row's end (splits * chunk_len > row_len) are empty.
                let lo = self.b.ins().imul_imm_s(c, l.chunk_len as i64);
                let hi = self.b.ins().iadd_imm_s(lo, l.chunk_len as i64);
                let len = self.iconst(row_len);
                let lo = self.b.ins().umin(lo, len);
                let hi = self.b.ins().umin(hi, len);
                (r, Range::Dynamic(lo, hi))
            }
            _ => (u, Range::Whole(row_len)),
        };
        let mut kept_offsets: Vec<Option<Offset>> = Vec::new();
        let mut out_kept: Option<Offset> = None;
        if let Some(ix) = &ix {
            let kidx = self.decompose(&ix.kept, r);
            for pair in &ix.loads {
                kept_offsets.push(pair.as_ref().map(|(k, _)| self.element_offset(k, &kidx, r)));
            }
            out_kept = ix
                .out
                .as_ref()
                .map(|(k, _)| self.element_offset(k, &kidx, r));
        }
        // The row: row values and sweeps in stage order, as far as the phase goes.
        for s in 0..=sched.sweeps {
            // Row values that became computable: stage s (stage 0 includes row loads).
            for (v, ins) in kernel.body.iter().enumerate() {
                if levels[v] != Level::Row || sched.stage[v] != s || values[v].is_some() {
                    continue;
                }
                let value = match &ins.expr {
                    Expr::Reduce(..) | Expr::ArgReduce(..) => continue,
                    Expr::Load { input, .. } => {
                        let off = kept_offsets
                            .get(v)
                            .copied()
                            .flatten()
                            .expect("row loads only in non-empty rows (supports); else a bug");
                        self.load_at(in_bases[*input], off, ins.dtype)
                    }
                    _ => self.compute(kernel, v, &values)?,
                };
                values[v] = Some(value);
            }
            // Wide values the sweep needs first: their rows, before it.
            if let (Some(ix), Some(plan)) = (&ix, &cache_plan) {
                for &f in &plan.before[s] {
                    let env = SweepEnv {
                        ix,
                        levels: &levels,
                        kept_offsets: &kept_offsets,
                        in_bases,
                        cache: cache_of(f),
                    };
                    self.fill_sweep(kernel, &env, &values, row_len)?;
                }
            }
            if s == sched.sweeps {
                break;
            }
            let reduces: Vec<usize> = (0..kernel.body.len())
                .filter(|&v| {
                    matches!(kernel.body[v].expr, Expr::Reduce(..) | Expr::ArgReduce(..))
                        && sched.stage[v] == s + 1
                })
                .collect();
            let env = ix.as_ref().map(|ix| SweepEnv {
                ix,
                levels: &levels,
                kept_offsets: &kept_offsets,
                in_bases,
                cache: cache_of(s),
            });
            let wide_max = match (phase, &env) {
                (Phase::Whole, Some(env)) => self.wide_max_load(kernel, env, &reduces),
                _ => None,
            };
            let results = match (phase, split, scratch) {
                (Phase::Whole, _, _) => match &env {
                    Some(env) if wide_max.is_some() => {
                        let x = wide_max.expect("just matched");
                        let src = self.row_start(kernel, env, x);
                        let name = crate::wide::reduce::MAX_SYMBOL;
                        vec![self.wide_reduce_call(name, src, row_len)?]
                    }
                    Some(env) if wide_sum_operand(kernel, env, &reduces).is_some() => {
                        let c = env.cache.expect("a wide sum reads the cache");
                        let x = Kernel::operands(&kernel.body[reduces[0]].expr)[0].index();
                        vec![self.wide_sum_call(&c, x, row_len)?]
                    }
                    Some(env) => {
                        let (accs, finals) =
                            self.reduce_sweep(kernel, env, &reduces, &values, range)?;
                        results_of(&accs, &finals)
                    }
                    None => reduces
                        .iter()
                        .map(|&v| self.empty_result(kernel, v))
                        .collect(),
                },
                (_, Some(l), Some(scratch)) => {
                    let env = env.as_ref().expect("split kernels have non-empty rows");
                    match phase {
                        Phase::Partial(p) if p == s => {
                            let (_, finals) =
                                self.reduce_sweep(kernel, env, &reduces, &values, range)?;
                            self.store_partials(l, scratch, u, &finals);
                            break;
                        }
                        Phase::Combine(p) if p == s => {
                            let results = self.combine_partials(kernel, l, scratch, r, &reduces)?;
                            if l.keeps_results(s) {
                                self.store_results(l, scratch, r, &reduces, &results);
                            }
                            if s + 1 < l.sweeps {
                                break;
                            }
                            results
                        }
                        _ => self.load_results(kernel, l, scratch, r, &reduces),
                    }
                }
                _ => panic!("a split phase without its layout and scratch is a bug"),
            };
            for (&v, value) in reduces.iter().zip(results) {
                values[v] = Some(value);
            }
        }

        // Per-row stores (one element per row, at r), once the last sweep is complete.
        let last = split.map_or(0, |l| l.sweeps.saturating_sub(1));
        if matches!(phase, Phase::Whole) || phase == Phase::Combine(last) {
            for st in &kernel.stores {
                if per_row(kernel, &levels, st) {
                    let value = values[st.value.index()].expect("row values are computed by now");
                    let dtype = kernel.body[st.value.index()].dtype;
                    let at = Offset {
                        var: Some(r),
                        elems: 0,
                    };
                    let (addr, imm) = self.address(out_bases[st.output], at, dtype);
                    self.store_typed(dtype, MemFlagsData::trusted(), value, addr, imm);
                }
            }
        }
        // Element stores: a final sweep (none over an empty row, which has no position).
        if matches!(phase, Phase::Whole | Phase::Stores) {
            if let (Some(ix), Some(out_kept)) = (&ix, &out_kept) {
                let env = SweepEnv {
                    ix,
                    levels: &levels,
                    kept_offsets: &kept_offsets,
                    in_bases,
                    cache: cache_of(sched.sweeps),
                };
                self.store_sweep(kernel, &env, out_kept, out_bases, &values, range)?;
            }
        }
        let next = self.b.ins().iadd_imm_s(u, 1);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, next, end);
        self.b.ins().brif(more, unit, &[next.into()], exit, &[]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
        Ok(())
    }

    /// The value of reduction `v` over an empty row: the identity of sum and product,
    /// NaN for a float max/min and 0 for an integer one (as the reference), index 0.
    fn empty_result(&mut self, kernel: &Kernel, v: usize) -> Value {
        let dtype = kernel.body[v].dtype;
        match kernel.body[v].expr {
            Expr::Reduce(acc, _) => match (acc, dtype.kind()) {
                (Accumulate::Sum, _) => self.typed_const(dtype, 0.0, 0),
                (Accumulate::Prod, _) => self.typed_const(dtype, 1.0, 1),
                (Accumulate::Max | Accumulate::Min, _) => self.typed_const(dtype, f64::NAN, 0),
            },
            _ => self.b.ins().iconst(types::I64, 0),
        }
    }

    /// The loop over the elements `range` of the current row. The block params of its
    /// head are `j` then `carried`; `body` emits one iteration from `j` and the carried
    /// values and returns the next carried values, which the exit block receives as its
    /// params (the carried values themselves when the range is empty).
    fn sweep(
        &mut self,
        range: Range,
        carried: &[(Type, Value)],
        body: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<Vec<Value>, String> {
        match range {
            Range::Whole(n) => {
                let zero = self.b.ins().iconst(types::I64, 0);
                self.counted_loop(zero, Bound::Const(n), 1, false, carried, body)
            }
            Range::Dynamic(lo, hi) => {
                self.counted_loop(lo, Bound::Value(hi), 1, true, carried, body)
            }
        }
    }

    /// Inside a sweep: the element values of `need` for element `j` (whose reduced-axes
    /// indices are `ridx`), in SSA order, on top of the row values in `values` (element
    /// values of other sweeps are not there).
    fn element_values(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        need: &[bool],
        (j, ridx): (Value, &[Option<Value>]),
        values: &[Option<Value>],
    ) -> Result<Vec<Option<Value>>, String> {
        let mut vals = values.to_vec();
        for (v, ins) in kernel.body.iter().enumerate() {
            if !need[v] {
                continue;
            }
            if let Some(c) = env.cache.as_ref().filter(|c| c.loads(v)) {
                let ty = cl_type(ins.dtype.compute_dtype());
                vals[v] = Some(self.cache_load(kernel, c, v, (j, 0), ty));
                continue;
            }
            let value = match &ins.expr {
                Expr::Load { input, .. } => {
                    let (_, red) = env.ix.loads[v].as_ref().expect("loads have accesses");
                    let kept = env.kept_offsets[v]
                        .as_ref()
                        .expect("loads have row offsets");
                    let red = self.element_offset(red, ridx, j);
                    let off = sum_offsets(self, kept, red);
                    self.load_at(env.in_bases[*input], off, ins.dtype)
                }
                Expr::Reduce(..) | Expr::ArgReduce(..) => {
                    panic!("v{v}: a reduction is a row value, never an element one (a bug)")
                }
                _ => self.compute(kernel, v, &vals)?,
            };
            if let Some(c) = env.cache.as_ref().filter(|c| c.stores(v)) {
                self.cache_store(kernel, c, v, (j, 0), value);
            }
            vals[v] = Some(value);
        }
        Ok(vals)
    }

    /// One reduction sweep over `range` computing `reduces` together; returns each
    /// reduction's kind, operand and dtype, and the final accumulator values (one per
    /// plain reduction, best and index per arg one: see [`results_of`]).
    fn reduce_sweep(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        reduces: &[usize],
        values: &[Option<Value>],
        range: Range,
    ) -> Result<(Vec<AccInfo>, Vec<Value>), String> {
        let operands: Vec<usize> = reduces
            .iter()
            .map(|&v| Kernel::operands(&kernel.body[v].expr)[0].index())
            .collect();
        let need = match &env.cache {
            Some(c) => c.pass().need.clone(),
            None => element_closure(kernel, env.levels, &operands),
        };
        // The loop's shape (and so the order of a sum) as on the 128-bit code alone.
        let shape = match &env.cache {
            Some(c) => c.plan.narrow_need[c.sweep].clone(),
            None => need.clone(),
        };
        // Carried state: one accumulator per reduction, two (best, index) per arg one.
        let mut accs = Vec::new();
        let mut carried = Vec::new();
        for (&v, &x) in reduces.iter().zip(&operands) {
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
        let scalar = |lw: &mut Self, j: Value, state: &[Value]| {
            let ridx = lw.decompose(&env.ix.red, j);
            let vals = lw.element_values(kernel, env, &need, (j, &ridx), values)?;
            let mut next = Vec::with_capacity(state.len());
            let mut k = 0;
            for &(acc, x, xd) in &accs {
                let xv = vals[x].expect("the operand is computed in the sweep");
                match acc {
                    Acc::Plain(a) => {
                        next.push(lw.accumulate(a, xd, state[k], xv));
                        k += 1;
                    }
                    Acc::Arg(op) => {
                        let (best, at) = (state[k], state[k + 1]);
                        let take = lw.arg_better(op, xd, xv, best);
                        next.push(lw.b.ins().select(take, xv, best));
                        next.push(lw.b.ins().select(take, j, at));
                        k += 2;
                    }
                }
            }
            Ok(next)
        };
        // Rows shorter than one step of the vector loop stay scalar.
        let long = match range {
            Range::Whole(n) => n >= VECTOR_MIN_ROW,
            Range::Dynamic(..) => true,
        };
        let finals = match vector::sweep_type(kernel, env, &shape, &accs) {
            Some(vt) if long => self.vector_reduce(
                kernel,
                env,
                (&need, &shape),
                &accs,
                &carried,
                values,
                (range, vt),
                scalar,
            )?,
            _ => self.sweep(range, &carried, scalar)?,
        };
        Ok((accs, finals))
    }

    /// The final sweep: every element store of the kernel, element values recomputed
    /// and row values broadcast along the row.
    fn store_sweep(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        out_kept: &Offset,
        out_bases: &[Value],
        values: &[Option<Value>],
        range: Range,
    ) -> Result<(), String> {
        let stores: Vec<&ndfuse_ir::Store> = kernel
            .stores
            .iter()
            .filter(|s| !per_row(kernel, env.levels, s))
            .collect();
        let targets: Vec<usize> = stores.iter().map(|s| s.value.index()).collect();
        let need = match &env.cache {
            Some(c) => c.pass().need.clone(),
            None => element_closure(kernel, env.levels, &targets),
        };
        if let Some((e, d)) = self.wide_div_store(kernel, env, &stores) {
            // out = e / d, e a cached row: one routine writes the output row.
            let c = env.cache.expect("a divided row is cached");
            let at = c.plan.at[e].expect("a divided row is cached");
            let src = self.b.ins().iadd_imm_s(c.base, at);
            let (addr, imm) = self.address(out_bases[stores[0].output], *out_kept, DType::F32);
            let dst = self.b.ins().iadd_imm_s(addr, i64::from(imm));
            let d = values[d].expect("row values are computed before the stores");
            let Range::Whole(n) = range else {
                panic!("a wide store sweep is over a whole row (a bug)");
            };
            // Outputs far larger than the caches are written past them (the same
            // values; the choice depends on the kernel's shape alone).
            let out_bytes = kernel.domain.numel().saturating_mul(4);
            let name = if out_bytes >= STREAM_FROM_BYTES {
                crate::wide::shift::DIV_STREAM_SYMBOL
            } else {
                crate::wide::shift::DIV_SYMBOL
            };
            return self.wide_row_call(name, (src, d, dst), n);
        }
        let (_, out_red) = env.ix.out.as_ref().expect("planned with element stores");
        let scalar = |lw: &mut Self, j: Value, _: &[Value]| {
            let ridx = lw.decompose(&env.ix.red, j);
            let vals = lw.element_values(kernel, env, &need, (j, &ridx), values)?;
            let red = lw.element_offset(out_red, &ridx, j);
            let at = sum_offsets(lw, out_kept, red);
            for st in &stores {
                let value = vals[st.value.index()].expect("stored values are computed");
                let dtype = kernel.body[st.value.index()].dtype;
                let (addr, imm) = lw.address(out_bases[st.output], at, dtype);
                lw.store_typed(dtype, MemFlagsData::trusted(), value, addr, imm);
            }
            Ok(Vec::new())
        };
        let long = match range {
            Range::Whole(n) => n >= VECTOR_MIN_ROW,
            Range::Dynamic(..) => true,
        };
        match vector::store_sweep_type(kernel, env, &need, &stores) {
            Some(vt) if long => self.vector_store_sweep(
                kernel,
                env,
                &need,
                (&stores, out_kept, out_bases),
                values,
                (range, vt),
                scalar,
            ),
            _ => self.sweep(range, &[], scalar).map(|_| ()),
        }
    }
}

impl<M: Module> Lowering<'_, '_, M> {
    /// A fill pass (`env.cache`'s) over the whole row: the operand of each of its wide
    /// values into the value's cached row, then the value's wide routine over that row
    /// in place.
    fn fill_sweep(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        values: &[Option<Value>],
        row_len: i64,
    ) -> Result<(), String> {
        let c = env.cache.expect("a fill pass has its cache (a bug)");
        let pass = c.pass();
        let fills: Vec<(usize, usize)> = pass
            .fill
            .iter()
            .map(|&v| (v, Kernel::operands(&kernel.body[v].expr)[0].index()))
            .collect();
        let scalar = |lw: &mut Self, j: Value, _: &[Value]| {
            let ridx = lw.decompose(&env.ix.red, j);
            let vals = lw.element_values(kernel, env, &pass.need, (j, &ridx), values)?;
            for &(v, u) in &fills {
                let value = vals[u].expect("a filled value's operand is computed");
                lw.cache_store(kernel, &c, v, (j, 0), value);
            }
            Ok(Vec::new())
        };
        if let Some((x, r)) = shifted_exp(kernel, env, &fills) {
            // exp(x - r) of a contiguous row of x: one routine reads the row itself.
            let src = self.row_start(kernel, env, x);
            let shift = values[r].expect("row values are computed before the fill");
            // Where the next row follows this one in memory, it is fetched meanwhile.
            let next = match &env.ix.loads[x] {
                Some((Access::Strided { strides, .. }, _)) if strides.as_slice() == [row_len] => {
                    self.b.ins().iadd_imm_s(src, row_len * 4)
                }
                _ => src,
            };
            return self.wide_exp_shift_call(&c, fills[0].0, (src, shift, next), row_len);
        }
        let range = Range::Whole(row_len);
        let operands: Vec<usize> = fills.iter().map(|&(_, u)| u).collect();
        match vector::fill_type(kernel, env, &pass.need, &operands) {
            Some(vt) if row_len >= VECTOR_MIN_ROW => {
                self.vector_fill(kernel, env, &fills, values, (range, vt), scalar)?
            }
            _ => {
                self.sweep(range, &[], scalar)?;
            }
        }
        for &(v, _) in &fills {
            let Expr::Unary(op, _) = kernel.body[v].expr else {
                panic!("v{v}: a filled value is a unary op (a bug)");
            };
            self.wide_call(&c, (v, op), row_len)?;
        }
        Ok(())
    }
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The address of the current row's first element of the load `x` (f32).
    fn row_start(&mut self, kernel: &Kernel, env: &SweepEnv<'_>, x: usize) -> Value {
        let Expr::Load { input, .. } = kernel.body[x].expr else {
            panic!("v{x}: a row read whole is a load (a bug)");
        };
        let off = env.kept_offsets[x].expect("loads have row offsets");
        let (addr, imm) = self.address(env.in_bases[input], off, DType::F32);
        self.b.ins().iadd_imm_s(addr, i64::from(imm))
    }

    /// `(e, d)` where the store sweep is one f32 store of `e / d`, `e` a cached row
    /// of a kernel on the wide path, `d` a row value, the output contiguous along the
    /// row, and nothing else computed: one call of `ndfuse_wide_div` (`wide::shift`,
    /// the same IEEE division) writes the output row.
    fn wide_div_store(
        &self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        stores: &[&ndfuse_ir::Store],
    ) -> Option<(usize, usize)> {
        let c = env.cache.as_ref()?;
        let &[st] = stores else {
            return None;
        };
        let o = st.value.index();
        let Expr::Binary(BinaryOp::Div, e, d) = kernel.body[o].expr else {
            return None;
        };
        let (e, d) = (e.index(), d.index());
        let only = c
            .pass()
            .need
            .iter()
            .enumerate()
            .all(|(u, &n)| n == (u == e || u == o));
        let f32s = [o, e, d]
            .iter()
            .all(|&w| kernel.body[w].dtype == DType::F32);
        (self.wide.is_some()
            && c.plan.passes.iter().any(|p| p.fill.contains(&e))
            && c.loads(e)
            && env.levels[d] == Level::Row
            && env.levels[e] == Level::Element
            && f32s
            && only
            && matches!(env.ix.out, Some((_, Access::Contiguous))))
        .then_some((e, d))
    }

    /// The load of the sweep's one reduction where the sweep is a wide row max: a
    /// `Max` on f32 of an f32 load contiguous along the row, nothing else computed in
    /// the sweep, in a kernel on the wide path (as `cache::plan` decides it). The max is
    /// exact, so `ndfuse_wide_max` (`wide::reduce`) gives the 128-bit loop's value (a
    /// NaN where it gives a NaN, whatever the payload).
    fn wide_max_load(
        &self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        reduces: &[usize],
    ) -> Option<usize> {
        let wide = self.wide.is_some()
            && crate::vmath::builder::use_fma()
            && kernel.domain.numel() >= crate::blocks::BLOCKS_FROM;
        let &[v] = reduces else {
            return None;
        };
        let Expr::Reduce(Accumulate::Max, x) = kernel.body[v].expr else {
            return None;
        };
        let x = x.index();
        let need = match &env.cache {
            Some(c) if c.loads(x) => return None,
            Some(c) => c.pass().need.clone(),
            None => element_closure(kernel, env.levels, &[x]),
        };
        let only_x = need.iter().enumerate().all(|(u, &n)| n == (u == x));
        (wide
            && only_x
            && kernel.body[v].dtype == DType::F32
            && kernel.body[x].dtype == DType::F32
            && matches!(kernel.body[x].expr, Expr::Load { .. })
            && matches!(env.ix.loads[x], Some((_, Access::Contiguous))))
        .then_some(x)
    }
}

/// The operand of the sweep's one reduction where the sweep is a wide row sum: a `Sum`
/// on f32 of a filled (wide) f32 value, read from the row cache, and nothing else
/// computed in the sweep. Such a sweep is one call of `ndfuse_wide_sum` on the cached
/// row (`wide::reduce`), whose order of additions is its own: fixed by the row's
/// length alone, the same on every tier and thread count, not the 128-bit loop's.
fn wide_sum_operand(kernel: &Kernel, env: &SweepEnv<'_>, reduces: &[usize]) -> Option<usize> {
    let c = env.cache.as_ref()?;
    let &[v] = reduces else {
        return None;
    };
    let Expr::Reduce(Accumulate::Sum, x) = kernel.body[v].expr else {
        return None;
    };
    let x = x.index();
    let pass = c.pass();
    let only_x = pass.need.iter().enumerate().all(|(u, &n)| n == (u == x));
    (kernel.body[v].dtype == DType::F32
        && kernel.body[x].dtype == DType::F32
        && only_x
        && pass.load[x]
        && c.plan.passes.iter().any(|p| p.fill.contains(&x)))
    .then_some(x)
}

/// `(x, r)` where a fill pass makes one value, `exp(x - r)` on f32, `x` a load
/// contiguous along the row and `r` a row value, and computes nothing else: then one
/// call of `ndfuse_wide_exp_shift` reads the row of `x` itself (`wide::shift`, the
/// bits of the fill pass and the exp routine).
fn shifted_exp(
    kernel: &Kernel,
    env: &SweepEnv<'_>,
    fills: &[(usize, usize)],
) -> Option<(usize, usize)> {
    let &[(v, u)] = fills else {
        return None;
    };
    let Expr::Binary(BinaryOp::Sub, x, r) = kernel.body[u].expr else {
        return None;
    };
    let (x, r) = (x.index(), r.index());
    let pass = env.cache.as_ref()?.pass();
    let f32s = [v, u, x, r]
        .iter()
        .all(|&w| kernel.body[w].dtype == DType::F32);
    let only = pass
        .need
        .iter()
        .enumerate()
        .all(|(w, &n)| n == (w == u || w == x));
    (matches!(kernel.body[v].expr, Expr::Unary(UnaryOp::Exp, _))
        && matches!(kernel.body[x].expr, Expr::Load { .. })
        && matches!(env.ix.loads[x], Some((_, Access::Contiguous)))
        && env.levels[x] == Level::Element
        && env.levels[r] == Level::Row
        && f32s
        && only
        && !pass.load[x]
        && !pass.load[u])
        .then_some((x, r))
}

/// The element values each sweep computes for its own use (see `cache::plan`): the
/// operands of its reductions, the store sweep's stored values last.
fn sweep_targets(kernel: &Kernel, levels: &[Level], sched: &Schedule) -> Vec<Vec<usize>> {
    let mut targets = vec![Vec::new(); sched.sweeps + 1];
    for (v, ins) in kernel.body.iter().enumerate() {
        if let Expr::Reduce(..) | Expr::ArgReduce(..) = ins.expr {
            targets[sched.stage[v] - 1].push(Kernel::operands(&ins.expr)[0].index());
        }
    }
    for st in &kernel.stores {
        if !per_row(kernel, levels, st) {
            targets[sched.sweeps].push(st.value.index());
        }
    }
    targets
}

/// Outputs of at least this many bytes are written by the wide path's row routines
/// with non-temporal stores: far larger than a last-level cache, so the lines would be
/// evicted before use anyway, and the stores skip reading them first.
const STREAM_FROM_BYTES: usize = 64 << 20;

/// Rows (or chunks) shorter than this are swept with scalars: the vector loop of
/// `vector` would not run once.
const VECTOR_MIN_ROW: i64 = 16;
