//! The row program shared by the row and column plans: a grid-stride loop over rows, each
//! reduced by a group of threads laid out as the plan says (`RowLayout`), sweep by
//! sweep, then the row's stores.

use super::group::{Lanes, Strategy};
use super::launch::Launch;
use super::row_index::RowIndex;
use super::source::Gen;
use super::sweep::Results;
use std::fmt::Write as _;

/// Most elements per load a lane keeps in registers between sweeps.
pub(super) const MAX_CACHED: usize = 16;

/// Where a plan puts the groups of threads that reduce rows.
pub(super) struct RowLayout {
    pub(super) strat: Strategy,
    /// Threads reducing one row together.
    pub(super) group: u32,
    /// Threads per block (x, y).
    pub(super) threads: (u32, u32),
    pub(super) rows_per_block: u32,
    /// The strategy as dumps name it (`"warp per row"`).
    pub(super) describe: String,
    /// C expressions: the first row of this block (`rb`), the rows of one grid-stride
    /// step, this thread's row within the block, and its lane within its group.
    pub(super) rb_start: String,
    pub(super) rb_step: String,
    pub(super) r_in_block: String,
    pub(super) lane: String,
}

impl Gen<'_> {
    /// One function: rows laid out as `layout` says, every sweep of each row, then its
    /// stores; its one launch (none for no rows) and the strategy line for dumps.
    pub(super) fn row_program(&mut self, layout: RowLayout) -> (Vec<Launch>, String) {
        let k = self.k;
        let rows = k.rows();
        let RowLayout {
            strat,
            group,
            threads: (threads_x, threads_y),
            rows_per_block,
            describe,
            rb_start,
            rb_step,
            r_in_block,
            lane,
        } = layout;
        let row_len = k.row_len();
        let per_lane = row_len.div_ceil(group as usize);
        let passes = self.sweeps + usize::from(self.has_element_stores());
        let cached = matches!(strat, Strategy::Warp | Strategy::Block(_))
            && passes > 1
            && per_lane <= MAX_CACHED
            && row_len > 0;
        let strategy = format!(
            "{}, {} threads per block{}",
            describe,
            threads_x * threads_y,
            if cached {
                format!(", row in registers ({per_lane} per lane)")
            } else if passes > 1 {
                format!(", {passes} passes over each row")
            } else {
                String::new()
            }
        );
        let name = k.name.clone();
        self.open_function(&name, threads_x * threads_y);
        let ind = "  ";
        let _ = writeln!(self.body, "{ind}const int lane = {lane};");
        let _ = writeln!(
            self.body,
            "{ind}for (nd_idx rb = {rb_start}; rb < {rows}; rb += {rb_step}) {{"
        );
        let ind2 = "    ";
        let _ = writeln!(self.body, "{ind2}const nd_idx r = rb + {r_in_block};");
        let _ = writeln!(self.body, "{ind2}const bool active = r < {rows};");
        let _ = writeln!(self.body, "{ind2}const nd_idx ra = active ? r : 0;");
        let ri = RowIndex::new(k);
        self.row_prologue(&ri, ind2);
        let lanes = Lanes {
            group,
            strat,
            cached: cached.then_some(per_lane),
            start: "lane".into(),
            end: row_len.to_string(),
        };
        if cached {
            self.cache_row(&ri, &lanes, ind2);
        }
        for s in 0..self.sweeps {
            self.row_values(s, Results::Local, ind2);
            self.sweep(&ri, &lanes, s, ind2);
        }
        self.row_values(self.sweeps, Results::Local, ind2);
        self.per_row_stores("active && lane == 0", ind2);
        if self.has_element_stores() {
            self.store_sweep(&ri, &lanes, "active", ind2);
        }
        let _ = writeln!(self.body, "{ind}}}\n}}");
        let grid = self.grid_for(rows, rows_per_block as usize);
        let launches = if rows == 0 {
            vec![]
        } else {
            vec![Launch {
                function: name,
                grid,
                block: (threads_x, threads_y),
            }]
        };
        (launches, strategy)
    }
}
