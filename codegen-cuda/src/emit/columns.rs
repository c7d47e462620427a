//! Column plans (`Plan::Columns`, and strided rows whose innermost kept axis is
//! contiguous): a 32 x 8 block holds 32 rows side by side, 8 threads down each, so
//! neighbouring threads read neighbouring addresses; the partials meet in a
//! shared-memory tile.

use super::group::{Strategy, TILE_X};
use super::launch::Launch;
use super::row_program::RowLayout;
use super::source::Gen;
use ndfuse_ir::Plan;

impl Gen<'_> {
    /// Whether the kernel's rows are reduced in column tiles.
    pub(super) fn column_like(&self) -> bool {
        let k = self.k;
        let innermost_kept = !k.reduce_axes.contains(&(k.domain.rank() - 1));
        matches!(k.plan, Plan::Columns { .. })
            || (matches!(
                k.plan,
                Plan::Rows {
                    contiguous: false,
                    ..
                }
            ) && innermost_kept)
    }

    /// The row program over column tiles.
    pub(super) fn columns(&mut self) -> (Vec<Launch>, String) {
        let ty = self.tile_y();
        self.row_program(RowLayout {
            strat: Strategy::ColumnTile,
            group: ty,
            threads: (TILE_X, ty),
            rows_per_block: TILE_X,
            describe: format!("column tile: {TILE_X} rows side by side, {ty} threads down each"),
            rb_start: format!("(nd_idx)blockIdx.x * {TILE_X}"),
            rb_step: format!("(nd_idx)gridDim.x * {TILE_X}"),
            r_in_block: "threadIdx.x".to_string(),
            lane: "threadIdx.y".to_string(),
        })
    }
}
