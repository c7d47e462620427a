//! Split reductions (`Plan::Split`): per sweep, one block per chunk of a row writes its
//! partials into the scratch buffer, then one block per row combines them (the second
//! phase: each lane a strided share of the partials, then the block's fixed-order
//! combine: on an H100, with one thread per row reading its 4096 partials, a 2^26 sum
//! ran at half the copy bandwidth); element stores run last, one block per chunk.

use super::group::{Lanes, Strategy};
use super::launch::Launch;
use super::row_index::{per_row, RowIndex};
use super::source::{c_size, Gen};
use super::sweep::Results;
use crate::scalar;
use ndfuse_ir::{Expr, Kernel, Level, Plan};
use std::fmt::Write as _;

impl Gen<'_> {
    pub(super) fn split_program(&mut self, splits: usize) -> (Vec<Launch>, String) {
        let k = self.k;
        let rows = k.rows();
        let row_len = k.row_len();
        let chunk = row_len.div_ceil(splits).max(1);
        let threads = 256.min(self.opts.max_block_size);
        let ri = RowIndex::new(k);
        let mut launches = Vec::new();
        let work = rows * splits;
        for s in 0..self.sweeps {
            // Partials: one block per (row, chunk).
            let fname = format!("{}_p{s}", k.name);
            self.open_chunk_function(&fname, &ri, s);
            let (ind, ind2) = ("  ", "    ");
            let lanes = Lanes {
                group: threads,
                strat: Strategy::Block(threads),
                cached: None,
                start: format!("c * {chunk} + lane"),
                end: "jend".into(),
            };
            let reds = self.reductions_of(s);
            self.init_accs(&reds, ind2);
            let operands: Vec<usize> = reds
                .iter()
                .map(|&i| Kernel::operands(&self.k.body[i].expr)[0].index())
                .collect();
            let elems = self.closure(&operands);
            let ind3 = self.open_lane_loop(&ri, &lanes, ind2);
            for &i in &elems {
                self.element_value(&ri, i, &lanes, &ind3);
            }
            for &i in &reds {
                self.update_acc(i, &ind3);
            }
            self.close_lane_loop(&lanes, ind2);
            self.group_combine(&reds, &lanes, ind2);
            let _ = writeln!(self.body, "{ind2}if (lane == 0) {{");
            for &i in &reds {
                let io = self.partial_io(i, "w", "", true, &format!("{ind2}  "));
                self.body.push_str(&io);
            }
            let _ = writeln!(self.body, "{ind2}}}");
            let _ = writeln!(self.body, "{ind}}}\n}}");
            launches.push(Launch {
                function: fname,
                grid: self.grid_for(work, 1),
                block: (threads, 1),
            });

            // Finish: one block per row; its lanes take the partials lane, lane + T, ...
            // (each load in flight beside the others), then combine over the block in
            // the fixed order of the partial phase's own combine.
            let fname = format!("{}_f{s}", k.name);
            self.open_function(&fname, threads);
            let _ = writeln!(self.body, "{ind}const int lane = threadIdx.x;");
            let _ = writeln!(
                self.body,
                "{ind}for (nd_idx r = blockIdx.x; r < {rows}; r += gridDim.x) {{"
            );
            let _ = writeln!(self.body, "{ind2}const nd_idx ra = r;");
            self.init_accs(&reds, ind2);
            let _ = writeln!(self.body, "{ind2}#pragma unroll 4");
            let _ = writeln!(
                self.body,
                "{ind2}for (nd_idx c = lane; c < {splits}; c += {threads}) {{"
            );
            let ind3 = format!("{ind2}  ");
            for &i in &reds {
                let next = self.partial_io(i, &format!("r * {splits} + c"), "oth", false, &ind3);
                self.body.push_str(&next);
                let st = self.combine_stmt(i, &format!("othacc{i}"), &format!("othidx{i}"), &ind3);
                self.body.push_str(&st);
            }
            let _ = writeln!(self.body, "{ind2}}}");
            let block = Lanes {
                group: threads,
                strat: Strategy::Block(threads),
                cached: None,
                start: "lane".into(),
                end: format!("{splits}"),
            };
            self.group_combine(&reds, &block, ind2);
            let _ = writeln!(self.body, "{ind2}if (lane == 0) {{");
            for &i in &reds {
                let (_, res) = self.scratch_slot(i);
                let store = match self.k.body[i].expr {
                    Expr::ArgReduce(..) => format!("(idx{i} < 0 ? 0LL : idx{i})"),
                    _ => format!("acc{i}"),
                };
                let vt = scalar::compute_type(self.k.body[i].dtype);
                let _ = writeln!(
                    self.body,
                    "{ind3}reinterpret_cast<{vt}*>(scratch + {res})[r] = {store};"
                );
            }
            if s + 1 == self.sweeps {
                let reads: Vec<usize> = (0..=self.sweeps).collect();
                if k.stores.iter().any(|st| per_row(k, &self.levels, st)) {
                    self.row_prologue_rows_only(&ri, &ind3);
                    for t in reads {
                        self.row_values(t, Results::Scratch, &ind3);
                    }
                    self.per_row_stores("true", &ind3);
                }
            }
            let _ = writeln!(self.body, "{ind2}}}");
            let _ = writeln!(self.body, "{ind}}}\n}}");
            launches.push(Launch {
                function: fname,
                grid: self.grid_for(rows, 1),
                block: (threads, 1),
            });
        }
        if self.has_element_stores() {
            let fname = format!("{}_st", k.name);
            self.open_chunk_function(&fname, &ri, self.sweeps);
            let (ind, ind2) = ("  ", "    ");
            let lanes = Lanes {
                group: threads,
                strat: Strategy::Block(threads),
                cached: None,
                start: format!("c * {chunk} + lane"),
                end: "jend".into(),
            };
            self.store_sweep(&ri, &lanes, "true", ind2);
            let _ = writeln!(self.body, "{ind}}}\n}}");
            launches.push(Launch {
                function: fname,
                grid: self.grid_for(work, 1),
                block: (threads, 1),
            });
        }
        if rows == 0 {
            launches.clear();
        }
        let strategy = format!(
            "split: {splits} chunks of {chunk} per row, one {threads}-thread block per chunk, partials combined by one block per row ({} launches)",
            launches.len()
        );
        (launches, strategy)
    }

    /// Statements moving reduction `i`'s partial number `slot` (a C expression) between
    /// the scratch buffer and the variables `{prefix}acc{i}` / `{prefix}idx{i}` (the
    /// index only for arg-reductions): a store when `write`, else declarations that
    /// load it.
    fn partial_io(&self, i: usize, slot: &str, prefix: &str, write: bool, ind: &str) -> String {
        let (t, arg) = self.acc_types(i);
        let (p, _) = self.scratch_slot(i);
        let (_, _, _, work) = self.split_shape();
        let mut parts = vec![(t, p, format!("{prefix}acc{i}"))];
        if arg {
            parts.push((
                "long long",
                self.index_offset(i, p, work),
                format!("{prefix}idx{i}"),
            ));
        }
        parts
            .into_iter()
            .map(|(ty, at, var)| {
                if write {
                    format!("{ind}reinterpret_cast<{ty}*>(scratch + {at})[{slot}] = {var};\n")
                } else {
                    format!("{ind}{ty} {var} = reinterpret_cast<const {ty}*>(scratch + {at})[{slot}];\n")
                }
            })
            .collect()
    }

    /// Byte offset of the index array that follows `n` values of reduction `i` at `at`.
    fn index_offset(&self, i: usize, at: usize, n: usize) -> usize {
        let (t, _) = self.acc_types(i);
        (at + n * c_size(t)).next_multiple_of(16)
    }

    /// (threads, splits, chunk length, work items = rows x splits) of a split kernel.
    fn split_shape(&self) -> (u32, usize, usize, usize) {
        let Plan::Split { splits, .. } = self.k.plan else {
            unreachable!("split_shape of a split plan")
        };
        let splits = splits.max(1);
        let chunk = self.k.row_len().div_ceil(splits).max(1);
        (
            256.min(self.opts.max_block_size),
            splits,
            chunk,
            self.k.rows() * splits,
        )
    }

    /// Opens a function of one block per (row, chunk) of a split kernel: the loop over
    /// work items `w` (row `ra`, chunk `c`, chunk end `jend`), the row's loads, and the
    /// row values up to `stage`, reductions read from the scratch buffer. Two levels of
    /// braces are left open.
    fn open_chunk_function(&mut self, name: &str, ri: &RowIndex, stage: usize) {
        let (threads, splits, chunk, work) = self.split_shape();
        let row_len = self.k.row_len();
        self.open_function(name, threads);
        let (ind, ind2) = ("  ", "    ");
        let _ = writeln!(self.body, "{ind}const int lane = threadIdx.x;");
        let _ = writeln!(
            self.body,
            "{ind}for (nd_idx w = blockIdx.x; w < {work}; w += gridDim.x) {{"
        );
        let _ = writeln!(
            self.body,
            "{ind2}const nd_idx ra = w / {splits}, c = w % {splits};"
        );
        let _ = writeln!(
            self.body,
            "{ind2}const nd_idx jend = min((c + 1) * {chunk}, (nd_idx){row_len});"
        );
        self.row_prologue(ri, ind2);
        for t in 0..=stage {
            self.row_values(t, Results::Scratch, ind2);
        }
    }

    /// Row-level loads only (no element bases), for the finish functions.
    fn row_prologue_rows_only(&mut self, ri: &RowIndex, ind: &str) {
        self.body.push_str(&ri.kept.decompose("ra", "k", ind));
        for (i, ins) in self.k.body.iter().enumerate() {
            if let Expr::Load { input, view } = &ins.expr {
                if self.levels[i] == Level::Row {
                    let v = ri.load_view[i].expect("loads have views");
                    let base = ri.kept.offset(v, "ra", "k", view.offset);
                    let t = scalar::compute_type(ins.dtype);
                    let e = self.load_expr(*input, &base);
                    let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
                }
            }
        }
    }
}
