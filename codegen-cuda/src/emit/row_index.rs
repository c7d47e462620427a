//! The index maps of a row program: every load's (and the output's) index split into
//! the kept part (which row) and the reduced part (which element of the row).

use crate::index::{coalesce, Space};
use ndfuse_ir::{Expr, Kernel, Level, Shape};

/// The kept and reduced parts of every load's index map (and of the contiguous output).
pub(super) struct RowIndex {
    pub(super) kept: Space,
    pub(super) red: Space,
    /// Per instruction that is a load: its view number in `kept` / `red`.
    pub(super) load_view: Vec<Option<usize>>,
    /// View number of the row-major output.
    pub(super) out_view: usize,
}

impl RowIndex {
    pub(super) fn new(k: &Kernel) -> RowIndex {
        let rank = k.domain.rank();
        let kept_axes: Vec<usize> = (0..rank).filter(|a| !k.reduce_axes.contains(a)).collect();
        let red_axes = &k.reduce_axes;
        let dims = k.domain.dims();
        let mut kept_views = Vec::new();
        let mut red_views = Vec::new();
        let mut load_view = vec![None; k.body.len()];
        for (i, ins) in k.body.iter().enumerate() {
            if let Expr::Load { view, .. } = &ins.expr {
                load_view[i] = Some(kept_views.len());
                kept_views.push(
                    kept_axes
                        .iter()
                        .map(|&a| view.strides[a])
                        .collect::<Vec<_>>(),
                );
                red_views.push(
                    red_axes
                        .iter()
                        .map(|&a| view.strides[a])
                        .collect::<Vec<_>>(),
                );
            }
        }
        let out = Shape::new(dims.to_vec()).contiguous_strides();
        let out_view = kept_views.len();
        kept_views.push(kept_axes.iter().map(|&a| out[a]).collect());
        red_views.push(red_axes.iter().map(|&a| out[a]).collect());
        let kd: Vec<usize> = kept_axes.iter().map(|&a| dims[a]).collect();
        let rd: Vec<usize> = red_axes.iter().map(|&a| dims[a]).collect();
        RowIndex {
            kept: coalesce(&kd, &kept_views),
            red: coalesce(&rd, &red_views),
            load_view,
            out_view,
        }
    }
}

/// Whether store `s` writes one element per row (the rule of `Kernel::check`).
pub(super) fn per_row(k: &Kernel, levels: &[Level], s: &ndfuse_ir::Store) -> bool {
    levels[s.value.index()] == Level::Row && k.outputs[s.output].len == k.rows()
}
