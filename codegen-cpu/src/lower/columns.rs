//! The band loop of `Plan::Columns`: the reduced axes lead and the kept ones trail, so
//! a call accumulates a contiguous band of kept positions (columns) at once while it
//! sweeps down the reduced axes, reading each row of the band as one run of memory.
//!
//! ```text
//! block0(ptrs, start, end):  brif start < end, pre, exit
//! pre:        buffer pointers, constants (and their vector splats); an accumulator
//!             array of BAND columns per reduction, on the stack
//! band(b):    w = min(end - b, BAND); every accumulator := the identity
//!   j loop:   for j in (0..col_len).step_by(4), then one row at a time for the last
//!             col_len % 4: the reduced part of every load's offset at rows j..j+4
//!     vector: for c in (0..w - w % W).step_by(W) (unrolled 4 times): acc[c..c+W] =
//!             (((acc[c..c+W] (+) x[j]) (+) x[j+1]) (+) x[j+2]) (+) x[j+3], the x
//!             vectors of elements (row, b+c .. b+c+W)
//!     scalar: for c in w - w % W..w: the same, one column at a time
//!   columns:  for c in 0..w: the results acc[c] -> row values -> per-row stores at b+c
//!   brif b + BAND < end, band(b + BAND), exit
//! ```
//!
//! Every column accumulates its elements in row order (`j = 0, 1, ...`), exactly as the
//! row-by-row lowering does, so results are bit-identical to it and to any cut of the
//! columns into bands or threads.
//!
//! The band loop covers the common column programs: one sweep of plain float
//! reductions (sum, product, max, min, and what is built from them: mean, norms) whose
//! element values have vector forms (`vector::vector_op`), loads contiguous across the
//! columns (or one element for all of them), and per-row stores only. A kernel outside
//! that (two sweeps, as std of columns; arg reductions; element stores; row-level
//! loads) is lowered row by row (`rows`), reading its columns with strides: correct,
//! and rare enough in practice not to pay for a second band loop here.

use super::function::{input_flags, vector_input_flags, Lowering, Offset};
use super::layout::{Across, ColumnBand, BAND};
use super::sweep::{Acc, Bound};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    types, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_module::Module;
use ndfuse_ir::{DType, Expr, Kernel, Level};

/// Rows accumulated per pass across the band: each accumulator is loaded and stored
/// once for them, and as many streams of memory are read at once.
const ROWS_AT_ONCE: i64 = 4;

/// Vectors per iteration of the band loop: fewer loop and address instructions per
/// vector (the loop is bound by them, not by memory, at one vector an iteration).
const UNROLL: i64 = 4;

impl<M: Module> Lowering<'_, '_, M> {
    /// The whole function of a `Columns` kernel that `band` applies to; `start..end`
    /// are columns (the kernel's rows).
    pub(super) fn column_kernel(
        &mut self,
        kernel: &Kernel,
        band: &ColumnBand,
        (ptrs, start, end): (Value, Value, Value),
    ) -> Result<(), String> {
        let levels = kernel.levels();
        let col_len = i64::try_from(kernel.row_len()).expect("row_len fits i64 (supports)");
        // Half values accumulate in f32.
        let (ty, vt) = match band.dtype {
            DType::F64 => (types::F64, types::F64X2),
            _ => (types::F32, types::F32X4),
        };
        let width = i64::from(vt.lane_count());
        let size = i64::from(ty.bytes());
        let band_bytes = BAND as i64 * size;

        let pre = self.b.create_block();
        let head = self.b.create_block();
        let exit = self.b.create_block();
        let b0 = self.b.append_block_param(head, types::I64);
        let nonempty = self.b.ins().icmp(IntCC::SignedLessThan, start, end);
        self.b.ins().brif(nonempty, pre, &[], exit, &[]);

        // Preheader: pointers, row values (constants only: no row loads here), their
        // splats, and the accumulators.
        self.b.switch_to_block(pre);
        let bases = self.buffer_bases(kernel, ptrs);
        let (in_bases, out_bases) = bases.split_at(kernel.inputs.len());
        let mut values: Vec<Option<Value>> = vec![None; kernel.body.len()];
        let mut splats: Vec<Option<Value>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            if levels[v] == Level::Row && !matches!(ins.expr, Expr::Reduce(..)) {
                let stage0 = Kernel::operands(&ins.expr)
                    .iter()
                    .all(|x| values[x.index()].is_some());
                if stage0 {
                    values[v] = Some(self.compute(kernel, v, &values)?);
                }
            }
        }
        for (v, ins) in kernel.body.iter().enumerate() {
            if !band.need[v] {
                continue;
            }
            for x in Kernel::operands(&ins.expr) {
                let x = x.index();
                if levels[x] == Level::Row && splats[x].is_none() {
                    let s = values[x].expect("row values of a band sweep are constants");
                    splats[x] = Some(self.b.ins().splat(vt, s));
                }
            }
        }
        let slot_bytes = u32::try_from(band_bytes * band.reduces.len() as i64)
            .expect("a band's accumulators are a few KiB");
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            slot_bytes,
            4,
        ));
        let accs = self.b.ins().stack_addr(self.ptr_ty, slot, 0);
        self.b.ins().jump(head, &[start.into()]);

        // One band: columns b0 .. b0 + w.
        self.b.switch_to_block(head);
        let left = self.b.ins().isub(end, b0);
        let band_len = self.iconst(BAND as i64);
        let w = self.b.ins().smin(left, band_len);
        let wv = self.b.ins().band_imm_s(w, -width);
        let wu = self.b.ins().band_imm_s(w, -width * UNROLL);
        let inits: Vec<Value> = band
            .reduces
            .iter()
            .map(|&(_, acc, _)| {
                let init = self.acc_init(Acc::Plain(acc), band.dtype);
                self.b.ins().splat(vt, init)
            })
            .collect();
        // Only the band's columns, rounded up to whole vectors (w >= 1).
        let used = self.b.ins().imul_imm_s(w, size);
        let used = self.b.ins().iadd_imm_s(used, 15);
        let used = self.b.ins().band_imm_s(used, -16);
        let zero = self.b.ins().iconst(types::I64, 0);
        self.counted_loop(zero, Bound::Value(used), 16, false, &[], |lw, at, _| {
            let addr = lw.b.ins().iadd(accs, at);
            for (k, &init) in inits.iter().enumerate() {
                let imm = (k as i64 * band_bytes) as i32;
                lw.b.ins().store(MemFlagsData::trusted(), init, addr, imm);
            }
            Ok(Vec::new())
        })?;

        // Down the columns: ROWS_AT_ONCE rows at a time, then one at a time; across the
        // band, unrolled vectors, vectors, then scalars.
        let grouped = col_len / ROWS_AT_ONCE * ROWS_AT_ONCE;
        for (lo, hi, rows) in [(0, grouped, ROWS_AT_ONCE), (grouped, col_len, 1)] {
            if lo == hi {
                continue;
            }
            let first = self.b.ins().iconst(types::I64, lo);
            self.counted_loop(first, Bound::Const(hi), rows, false, &[], |lw, j, _| {
                let mut red = Vec::with_capacity(rows as usize);
                for r in 0..rows {
                    let jr = if r == 0 {
                        j
                    } else {
                        lw.b.ins().iadd_imm_s(j, r)
                    };
                    let ridx = lw.decompose(&band.red, jr);
                    let offs: Vec<Option<Offset>> = band
                        .loads
                        .iter()
                        .map(|l| l.as_ref().map(|(_, a)| lw.element_offset(a, &ridx, jr)))
                        .collect();
                    red.push(offs);
                }
                let zero = lw.b.ins().iconst(types::I64, 0);
                let env = BandEnv {
                    band,
                    red: &red,
                    in_bases,
                    accs,
                    band_bytes,
                };
                let step = width * UNROLL;
                lw.counted_loop(zero, Bound::Value(wu), step, true, &[], |lw, c, _| {
                    for u in 0..UNROLL {
                        lw.band_step(kernel, &env, (b0, c, u * width), &splats, vt)?;
                    }
                    Ok(Vec::new())
                })?;
                lw.counted_loop(wu, Bound::Value(wv), width, true, &[], |lw, c, _| {
                    lw.band_step(kernel, &env, (b0, c, 0), &splats, vt)?;
                    Ok(Vec::new())
                })?;
                lw.counted_loop(wv, Bound::Value(w), 1, true, &[], |lw, c, _| {
                    lw.band_step(kernel, &env, (b0, c, 0), &values, ty)?;
                    Ok(Vec::new())
                })?;
                Ok(Vec::new())
            })?;
        }

        // Each column's results: the row values after the reduction, per-row stores.
        let zero = self.b.ins().iconst(types::I64, 0);
        self.counted_loop(zero, Bound::Value(w), 1, false, &[], |lw, c, _| {
            let r = lw.b.ins().iadd(b0, c);
            let scaled = lw.b.ins().imul_imm_s(c, size);
            let at = lw.b.ins().iadd(accs, scaled);
            let mut vals = values.clone();
            for (k, &(v, _, _)) in band.reduces.iter().enumerate() {
                let imm = (k as i64 * band_bytes) as i32;
                vals[v] = Some(lw.b.ins().load(ty, MemFlagsData::trusted(), at, imm));
            }
            for v in 0..kernel.body.len() {
                if levels[v] == Level::Row && vals[v].is_none() {
                    vals[v] = Some(lw.compute(kernel, v, &vals)?);
                }
            }
            for st in &kernel.stores {
                let value = vals[st.value.index()].expect("row values are computed by now");
                let dtype = kernel.body[st.value.index()].dtype;
                let off = Offset {
                    var: Some(r),
                    elems: 0,
                };
                let (addr, imm) = lw.address(out_bases[st.output], off, dtype);
                lw.store_typed(dtype, MemFlagsData::trusted(), value, addr, imm);
            }
            Ok(Vec::new())
        })?;
        let next = self.b.ins().iadd_imm_s(b0, BAND as i64);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, next, end);
        self.b.ins().brif(more, head, &[next.into()], exit, &[]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
        Ok(())
    }

    /// One step across the band at the rows of `env.red` (their reduced offsets, in
    /// row order): columns `b0 + c + lane ..` as `ty` (a vector, or one scalar) of each
    /// row accumulated, in row order, into the accumulators at `c + lane`, which are
    /// read and written once. `row_vals` are the row values as `ty`.
    fn band_step(
        &mut self,
        kernel: &Kernel,
        env: &BandEnv<'_>,
        (b0, c, lane): (Value, Value, i64),
        row_vals: &[Option<Value>],
        ty: Type,
    ) -> Result<(), String> {
        let col = self.b.ins().iadd(b0, c);
        let size = i64::from(ty.lane_type().bytes());
        let scaled = self.b.ins().imul_imm_s(c, size);
        let at = self.b.ins().iadd(env.accs, scaled);
        // Vectors start at a multiple of W columns: 16-byte aligned in the slot.
        let mut accs: Vec<Value> = (0..env.band.reduces.len())
            .map(|k| {
                let imm = (k as i64 * env.band_bytes + lane * size) as i32;
                self.b.ins().load(ty, MemFlagsData::trusted(), at, imm)
            })
            .collect();
        for red in env.red {
            let vals = self.band_values(kernel, env, red, (col, lane), row_vals, ty)?;
            for (k, &(_, acc, x)) in env.band.reduces.iter().enumerate() {
                let xv = vals[x].expect("the operand is computed in the step");
                accs[k] = self.accumulate(acc, env.band.dtype, accs[k], xv);
            }
        }
        for (k, &new) in accs.iter().enumerate() {
            let imm = (k as i64 * env.band_bytes + lane * size) as i32;
            self.b.ins().store(MemFlagsData::trusted(), new, at, imm);
        }
        Ok(())
    }

    /// The element values the band needs at one row (reduced offsets `red`), columns
    /// `col + lane ..` as `ty`.
    fn band_values(
        &mut self,
        kernel: &Kernel,
        env: &BandEnv<'_>,
        red: &[Option<Offset>],
        (col, lane): (Value, i64),
        row_vals: &[Option<Value>],
        ty: Type,
    ) -> Result<Vec<Option<Value>>, String> {
        let mut vals = row_vals.to_vec();
        for (v, ins) in kernel.body.iter().enumerate() {
            if !env.band.need[v] {
                continue;
            }
            let value = match &ins.expr {
                Expr::Load { input, .. } => {
                    let (across, _) = env.band.loads[v]
                        .as_ref()
                        .expect("loads of the band are planned");
                    let red = red[v].expect("loads have a reduced offset");
                    let base = env.in_bases[*input];
                    match *across {
                        Across::Contiguous(offset) => {
                            let var = match red.var {
                                Some(rv) => self.b.ins().iadd(col, rv),
                                None => col,
                            };
                            let off = Offset {
                                var: Some(var),
                                elems: red.elems + offset + lane,
                            };
                            let (addr, imm) = self.address(base, off, ins.dtype);
                            let flags = if ty.is_vector() {
                                vector_input_flags()
                            } else {
                                input_flags()
                            };
                            self.load_typed(ins.dtype, ty, flags, addr, imm)
                        }
                        Across::Fixed(offset) => {
                            let off = Offset {
                                var: red.var,
                                elems: red.elems + offset,
                            };
                            let x = self.load_at(base, off, ins.dtype);
                            if ty.is_vector() {
                                self.b.ins().splat(ty, x)
                            } else {
                                x
                            }
                        }
                    }
                }
                _ => self.compute(kernel, v, &vals)?,
            };
            vals[v] = Some(value);
        }
        Ok(vals)
    }
}

/// What every step of a band reads.
struct BandEnv<'a> {
    band: &'a ColumnBand,
    /// Per row of the step, in row order; per instruction that is a load: the reduced
    /// part of its offset at that row.
    red: &'a [Vec<Option<Offset>>],
    in_bases: &'a [Value],
    /// The accumulator array (one run of `band_bytes` per reduction).
    accs: Value,
    band_bytes: i64,
}
