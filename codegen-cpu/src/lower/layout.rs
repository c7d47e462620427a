//! How the work of a kernel with reduce axes is cut for running: the phases of a split
//! kernel and where their partials live (`Phase`, `SplitLayout`), and the column bands
//! of a `Columns` kernel (`ColumnBand`). `jit` reads them to run the functions; the
//! loops of `rows`, `split` and `columns` follow them.

use super::sweep::{element_closure, per_row, restrict, schedule};
use super::vector::vector_op;
use crate::index::{self, Access, IndexPlan};
use ndfuse_ir::{Accumulate, DType, Expr, Kernel, Level, Plan, Shape, View};

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
        let stage = schedule(kernel);
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
        let element_stores = kernel.stores.iter().any(|s| !per_row(kernel, &levels, s));
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

/// Columns per band: each row of a band is a run of 4 KiB (f32; 8 KiB of f64), a page,
/// which the prefetcher streams (256 columns, 1 KiB runs, ran 3x slower on [4096,4096]
/// f32; 4096 columns left one band for two threads); the accumulators (4 KiB of f32 a
/// reduction) stay in L1. A multiple of every vector width and of `UNROLL` vectors.
pub(crate) const BAND: usize = 1024;

/// How a load of a band kernel finds column `col`'s element.
#[derive(Clone, Copy)]
pub(super) enum Across {
    /// At `col + offset` plus the reduced part: contiguous across columns.
    Contiguous(i64),
    /// At `offset` plus the reduced part, the same element for every column.
    Fixed(i64),
}

/// A kernel the band loop applies to, and what lowering it needs.
pub(crate) struct ColumnBand {
    /// Float type of every element value and reduction.
    pub(super) dtype: DType,
    /// Plan of the reduced axes (the position `j` down a column).
    pub(super) red: IndexPlan,
    /// Per instruction that is a load: across columns, and along the reduced axes.
    pub(super) loads: Vec<Option<(Across, Access)>>,
    /// Element values the sweep computes.
    pub(super) need: Vec<bool>,
    /// The reductions, in body order.
    pub(super) reduces: Vec<(usize, Accumulate, usize)>,
}

impl ColumnBand {
    /// The band plan of `kernel`, or `None` when it is lowered row by row (see the
    /// module docs for what the band loop covers).
    pub(crate) fn of(kernel: &Kernel) -> Option<ColumnBand> {
        if !matches!(kernel.plan, Plan::Columns { .. }) {
            return None;
        }
        let (rows, row_len) = (kernel.rows(), kernel.row_len());
        if rows == 0 || row_len == 0 || schedule(kernel).sweeps != 1 {
            return None;
        }
        let levels = kernel.levels();
        if kernel.stores.iter().any(|s| !per_row(kernel, &levels, s)) {
            return None;
        }
        let mut reduces = Vec::new();
        let mut dtype = None;
        for (v, ins) in kernel.body.iter().enumerate() {
            match &ins.expr {
                Expr::Reduce(acc, x) => {
                    reduces.push((v, *acc, x.index()));
                    if *dtype.get_or_insert(ins.dtype) != ins.dtype {
                        return None;
                    }
                }
                Expr::ArgReduce(..) => return None,
                Expr::Load { .. } if levels[v] == Level::Row => return None,
                _ => {}
            }
        }
        let dtype = dtype?;
        if !dtype.is_float() {
            return None;
        }
        let targets: Vec<usize> = reduces.iter().map(|&(_, _, x)| x).collect();
        let need = element_closure(kernel, &levels, &targets);

        // Index plans of the kept axes (across columns) and of the reduced ones.
        let rank = kernel.domain.rank();
        let kept_axes: Vec<usize> = (0..rank)
            .filter(|a| !kernel.reduce_axes.contains(a))
            .collect();
        let dims = kernel.domain.dims();
        let shape_of =
            |axes: &[usize]| Shape::new(axes.iter().map(|&a| dims[a]).collect::<Vec<_>>());
        let mut kept_views = Vec::new();
        let mut red_views = Vec::new();
        for ins in &kernel.body {
            if let Expr::Load { view, .. } = &ins.expr {
                kept_views.push(restrict(view, &kept_axes, view.offset));
                red_views.push(restrict(view, &kernel.reduce_axes, 0));
            }
        }
        let kept_refs: Vec<&View> = kept_views.iter().collect();
        let red_refs: Vec<&View> = red_views.iter().collect();
        let (kept_plan, kacc) = index::plan(&shape_of(&kept_axes), &kept_refs);
        let (red, racc) = index::plan(&shape_of(&kernel.reduce_axes), &red_refs);
        let mut pairs = kacc.into_iter().zip(racc);
        let mut loads = Vec::with_capacity(kernel.body.len());
        for (v, ins) in kernel.body.iter().enumerate() {
            let Expr::Load { .. } = ins.expr else {
                loads.push(None);
                continue;
            };
            let (kept, red) = pairs.next().expect("one access pair per load");
            let across = match kept {
                Access::Contiguous => Across::Contiguous(0),
                Access::Fixed(at) => Across::Fixed(at),
                // One group of stride 1: contiguous from an offset (a sliced input).
                Access::Strided { offset, strides }
                    if kept_plan.extents.len() == 1 && strides == [1] =>
                {
                    Across::Contiguous(offset)
                }
                // Not contiguous across columns: fine for a load no sweep needs.
                Access::Strided { .. } if !need[v] => {
                    loads.push(None);
                    continue;
                }
                Access::Strided { .. } => return None,
            };
            loads.push(Some((across, red)));
        }
        for (v, ins) in kernel.body.iter().enumerate() {
            let load = matches!(ins.expr, Expr::Load { .. });
            if need[v] && (ins.dtype != dtype || !(load || vector_op(kernel, &ins.expr, dtype))) {
                return None;
            }
        }
        Some(ColumnBand {
            dtype,
            red,
            loads,
            need,
            reduces,
        })
    }
}
