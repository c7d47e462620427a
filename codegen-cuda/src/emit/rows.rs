//! Row plans (`Plan::Rows`, TAD-level): each row reduced by one thread (rows shorter
//! than a warp), by a warp (8 rows per block), or by a whole block (long rows).

use super::group::Strategy;
use super::launch::Launch;
use super::row_program::{RowLayout, MAX_CACHED};
use super::source::Gen;

impl Gen<'_> {
    /// The row program with a thread, a warp or a block per row.
    pub(super) fn rows(&mut self) -> (Vec<Launch>, String) {
        let strat = self.strategy();
        let threads = 256.min(self.opts.max_block_size);
        let layout = match strat {
            Strategy::Thread => RowLayout {
                strat,
                group: 1,
                threads: (threads, 1),
                rows_per_block: threads,
                describe: "thread per row".to_string(),
                rb_start: format!("(nd_idx)blockIdx.x * {threads}"),
                rb_step: format!("(nd_idx)gridDim.x * {threads}"),
                r_in_block: "threadIdx.x".to_string(),
                lane: "0".to_string(),
            },
            Strategy::Warp => {
                let rows_per_block = threads / 32;
                RowLayout {
                    strat,
                    group: 32,
                    threads: (threads, 1),
                    rows_per_block,
                    describe: "warp per row".to_string(),
                    rb_start: format!("(nd_idx)blockIdx.x * {rows_per_block}"),
                    rb_step: format!("(nd_idx)gridDim.x * {rows_per_block}"),
                    r_in_block: "(threadIdx.x >> 5)".to_string(),
                    lane: "(threadIdx.x & 31)".to_string(),
                }
            }
            Strategy::Block(t) => RowLayout {
                strat,
                group: t,
                threads: (t, 1),
                rows_per_block: 1,
                describe: "block per row".to_string(),
                rb_start: "(nd_idx)blockIdx.x".to_string(),
                rb_step: "(nd_idx)gridDim.x".to_string(),
                r_in_block: "0".to_string(),
                lane: "threadIdx.x".to_string(),
            },
            Strategy::ColumnTile => unreachable!("column tiles are the columns plan's"),
        };
        self.row_program(layout)
    }

    /// A thread, a warp or a block per row, by the row length and the passes over it.
    fn strategy(&self) -> Strategy {
        let row_len = self.k.row_len();
        let single_pass = self.sweeps + usize::from(self.has_element_stores()) <= 1;
        if row_len < 32 {
            Strategy::Thread
        } else if row_len <= 32 * MAX_CACHED || (row_len <= 1024 && single_pass) {
            // A warp keeps up to 16 elements a lane in registers: longer rows that need
            // several passes go to a block, which keeps them there too.
            Strategy::Warp
        } else {
            let want = pow2_ceil(row_len.div_ceil(MAX_CACHED) as u32).max(128);
            Strategy::Block(want.min(self.opts.max_block_size))
        }
    }
}

fn pow2_ceil(x: u32) -> u32 {
    x.max(1).next_power_of_two()
}
