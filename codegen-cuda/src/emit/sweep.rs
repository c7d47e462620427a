//! Sweeps over a row: the row's loads and values, the loop of a lane over its elements
//! (from memory or from the registers a cached row keeps), a reduction sweep, and the
//! stores of per-row and per-element results.

use super::group::Lanes;
use super::row_index::{per_row, RowIndex};
use super::source::Gen;
use crate::scalar;
use ndfuse_ir::{Expr, Kernel, Level};
use std::fmt::Write as _;

/// Where a kernel function gets the results of reductions of earlier sweeps.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Results {
    /// Computed earlier in the same function (variables `v{i}`).
    Local,
    /// Read from the scratch buffer (split launches), row `ra`.
    Scratch,
}

impl Gen<'_> {
    pub(super) fn has_element_stores(&self) -> bool {
        self.k
            .stores
            .iter()
            .any(|s| !per_row(self.k, &self.levels, s))
    }

    /// Row-level loads (per row, from the kept index).
    pub(super) fn row_prologue(&mut self, ri: &RowIndex, ind: &str) {
        self.body.push_str(&ri.kept.decompose("ra", "k", ind));
        for (i, ins) in self.k.body.iter().enumerate() {
            if let Expr::Load { input, view } = &ins.expr {
                let v = ri.load_view[i].expect("loads have views");
                let base = ri.kept.offset(v, "ra", "k", view.offset);
                if self.levels[i] == Level::Row {
                    let t = scalar::compute_type(ins.dtype);
                    let e = self.load_expr(*input, &base);
                    let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
                } else {
                    let _ = writeln!(self.body, "{ind}const nd_idx base{i} = {base};");
                }
            }
        }
        if self.has_element_stores() {
            let base = ri.kept.offset(ri.out_view, "ra", "k", 0);
            let _ = writeln!(self.body, "{ind}const nd_idx obase = {base};");
        }
    }

    /// Row values of stage `upto` (reductions too when their results are read from
    /// the scratch buffer). Calling it for each stage in turn defines each once.
    pub(super) fn row_values(&mut self, upto: usize, results: Results, ind: &str) {
        for i in 0..self.k.body.len() {
            if self.levels[i] != Level::Row || self.stage[i] > upto {
                continue;
            }
            if self.stage[i] != upto {
                continue;
            }
            match self.k.body[i].expr {
                Expr::Load { .. } => {}
                Expr::Reduce(..) | Expr::ArgReduce(..) => {
                    if results == Results::Scratch {
                        let t = scalar::compute_type(self.k.body[i].dtype);
                        let off = self.scratch_slot(i).1;
                        let _ = writeln!(
                            self.body,
                            "{ind}const {t} v{i} = reinterpret_cast<const {t}*>(scratch + {off})[ra];"
                        );
                    }
                }
                _ => self.define(i, ind),
            }
        }
    }

    /// The element values needed for `targets`, in body order.
    pub(super) fn closure(&self, targets: &[usize]) -> Vec<usize> {
        let k = self.k;
        let mut need = vec![false; k.body.len()];
        for &t in targets {
            if self.levels[t] == Level::Element {
                need[t] = true;
            }
        }
        for i in (0..k.body.len()).rev() {
            if need[i] {
                for v in Kernel::operands(&k.body[i].expr) {
                    if self.levels[v.index()] == Level::Element {
                        need[v.index()] = true;
                    }
                }
            }
        }
        (0..k.body.len()).filter(|&i| need[i]).collect()
    }

    /// Element load `i` at element index `j` (decomposed as `e{a}`), or its cached copy.
    fn element_load(&self, ri: &RowIndex, i: usize, lanes: &Lanes) -> String {
        if lanes.cached.is_some() {
            return format!("c{i}[u]");
        }
        let Expr::Load { input, .. } = &self.k.body[i].expr else {
            unreachable!("element_load of a load")
        };
        let v = ri.load_view[i].expect("loads have views");
        let e = ri.red.offset(v, "j", "e", 0);
        self.load_expr(*input, &format!("base{i} + {e}"))
    }

    /// Opens the loop over this lane's elements: `j` is the element index, `u` the
    /// iteration number when the row is cached.
    pub(super) fn open_lane_loop(&mut self, ri: &RowIndex, lanes: &Lanes, ind: &str) -> String {
        let ind2 = format!("{ind}  ");
        match lanes.cached {
            Some(per_lane) => {
                let _ = writeln!(self.body, "{ind}#pragma unroll");
                let _ = writeln!(self.body, "{ind}for (int u = 0; u < {per_lane}; ++u) {{");
                let _ = writeln!(
                    self.body,
                    "{ind2}const nd_idx j = {} + (nd_idx)u * {};",
                    lanes.start, lanes.group
                );
                let _ = writeln!(self.body, "{ind2}if (j < {}) {{", lanes.end);
                let ind3 = format!("{ind2}  ");
                self.body.push_str(&ri.red.decompose("j", "e", &ind3));
                ind3
            }
            None => {
                // Unrolled so that each thread has several independent loads in flight:
                // 16, since these loads are 4 bytes (seen on an H100 with 4: a 2^26 sum at
                // 48% of the copy bandwidth, a column sum of [8192, 8192] at 63%; too few
                // bytes in flight per multiprocessor to cover the memory latency).
                let _ = writeln!(self.body, "{ind}#pragma unroll 16");
                let _ = writeln!(
                    self.body,
                    "{ind}for (nd_idx j = {}; j < {}; j += {}) {{",
                    lanes.start, lanes.end, lanes.group
                );
                self.body.push_str(&ri.red.decompose("j", "e", &ind2));
                ind2
            }
        }
    }

    pub(super) fn close_lane_loop(&mut self, lanes: &Lanes, ind: &str) {
        if lanes.cached.is_some() {
            let _ = writeln!(self.body, "{ind}  }}");
        }
        let _ = writeln!(self.body, "{ind}}}");
    }

    /// The first pass of a cached row: every element load into registers.
    pub(super) fn cache_row(&mut self, ri: &RowIndex, lanes: &Lanes, ind: &str) {
        let per_lane = lanes.cached.expect("cached");
        let loads: Vec<usize> = (0..self.k.body.len())
            .filter(|&i| {
                self.levels[i] == Level::Element && matches!(self.k.body[i].expr, Expr::Load { .. })
            })
            .collect();
        for &i in &loads {
            let t = scalar::compute_type(self.k.body[i].dtype);
            let _ = writeln!(self.body, "{ind}{t} c{i}[{per_lane}];");
        }
        let direct = Lanes {
            cached: None,
            ..lanes.clone()
        };
        let ind2 = self.open_lane_loop(ri, lanes, ind);
        for &i in &loads {
            let e = self.element_load(ri, i, &direct);
            let _ = writeln!(self.body, "{ind2}c{i}[u] = {e};");
        }
        self.close_lane_loop(lanes, ind);
    }

    /// Emits element instruction `i` at the current element (loads from the row cache
    /// or memory).
    pub(super) fn element_value(&mut self, ri: &RowIndex, i: usize, lanes: &Lanes, ind: &str) {
        if matches!(self.k.body[i].expr, Expr::Load { .. }) {
            let t = scalar::compute_type(self.k.body[i].dtype);
            let e = self.element_load(ri, i, lanes);
            let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
        } else {
            self.define(i, ind);
        }
    }

    /// Reductions of sweep `s`.
    pub(super) fn reductions_of(&self, s: usize) -> Vec<usize> {
        (0..self.k.body.len())
            .filter(|&i| {
                matches!(self.k.body[i].expr, Expr::Reduce(..) | Expr::ArgReduce(..))
                    && self.stage[i] == s + 1
            })
            .collect()
    }

    /// One reduction sweep `s`: accumulate over this lane's elements, combine over the
    /// group, define the results `v{i}`.
    pub(super) fn sweep(&mut self, ri: &RowIndex, lanes: &Lanes, s: usize, ind: &str) {
        let reds = self.reductions_of(s);
        self.init_accs(&reds, ind);
        let operands: Vec<usize> = reds
            .iter()
            .map(|&i| Kernel::operands(&self.k.body[i].expr)[0].index())
            .collect();
        let elems = self.closure(&operands);
        let ind2 = self.open_lane_loop(ri, lanes, ind);
        for &i in &elems {
            self.element_value(ri, i, lanes, &ind2);
        }
        for &i in &reds {
            self.update_acc(i, &ind2);
        }
        self.close_lane_loop(lanes, ind);
        self.group_combine(&reds, lanes, ind);
        for &i in &reds {
            let t = scalar::compute_type(self.k.body[i].dtype);
            let src = match self.k.body[i].expr {
                Expr::ArgReduce(..) => format!("(idx{i} < 0 ? 0LL : idx{i})"),
                _ => format!("acc{i}"),
            };
            let _ = writeln!(self.body, "{ind}const {t} v{i} = {src};");
        }
    }

    /// Stores of row values into per-row outputs, by one thread of the group.
    pub(super) fn per_row_stores(&mut self, guard: &str, ind: &str) {
        let k = self.k;
        let stores: Vec<_> = k
            .stores
            .iter()
            .filter(|s| per_row(k, &self.levels, s))
            .cloned()
            .collect();
        if stores.is_empty() {
            return;
        }
        let guarded = guard != "true";
        let sind = if guarded {
            format!("{ind}  ")
        } else {
            ind.to_string()
        };
        if guarded {
            let _ = writeln!(self.body, "{ind}if ({guard}) {{");
        }
        for s in stores {
            let d = k.outputs[s.output].dtype;
            let _ = writeln!(
                self.body,
                "{sind}out{}[r] = {};",
                s.output,
                scalar::store_conv(d, &format!("v{}", s.value.0))
            );
        }
        if guarded {
            let _ = writeln!(self.body, "{ind}}}");
        }
    }

    /// The final sweep: element stores (row values broadcast along the row).
    pub(super) fn store_sweep(&mut self, ri: &RowIndex, lanes: &Lanes, guard: &str, ind: &str) {
        let k = self.k;
        let stores: Vec<_> = k
            .stores
            .iter()
            .filter(|s| !per_row(k, &self.levels, s))
            .cloned()
            .collect();
        let targets: Vec<usize> = stores.iter().map(|s| s.value.index()).collect();
        let elems = self.closure(&targets);
        let guarded = guard != "true";
        let ind1 = if guarded {
            format!("{ind}  ")
        } else {
            ind.to_string()
        };
        if guarded {
            let _ = writeln!(self.body, "{ind}if ({guard}) {{");
        }
        let ind2 = self.open_lane_loop(ri, lanes, &ind1);
        for &i in &elems {
            self.element_value(ri, i, lanes, &ind2);
        }
        let off = ri.red.offset(ri.out_view, "j", "e", 0);
        for s in stores {
            let d = k.outputs[s.output].dtype;
            let _ = writeln!(
                self.body,
                "{ind2}out{}[obase + {off}] = {};",
                s.output,
                scalar::store_conv(d, &format!("v{}", s.value.0))
            );
        }
        self.close_lane_loop(lanes, &ind1);
        if guarded {
            let _ = writeln!(self.body, "{ind}}}");
        }
    }
}
