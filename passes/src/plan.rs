//! Parallel plans: how a kernel's work is split across workers, chosen from shapes and a
//! target description, with the reason recorded for dumps.
//!
//! Determinism: a plan depends on shapes and on fixed properties of the target (vector
//! width, cache size), never on how many threads run it, so the order in which partial
//! results combine (and so every bit of the result) is the same on 1 or 64 threads.

use ndfuse_ir::{Plan, Shape};

/// What a backend offers that plan choice depends on. Fixed per backend, never read
/// from the running machine's thread count (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDesc {
    /// Name shown in dumps.
    pub name: &'static str,
    /// Bytes per vector register (16 for Cranelift's x86-64 vectors).
    pub vector_bytes: usize,
    /// Elements of one chunk of a split reduction: small enough to stay in a core's
    /// cache, large enough that combining partials costs nothing.
    pub split_chunk: usize,
    /// A reduction is split when it has fewer rows than this...
    pub split_below_rows: usize,
    /// ...and each row has at least this many elements.
    pub split_min_row: usize,
    /// Most chunks a row is split into.
    pub max_splits: usize,
    /// Bytes of a matrix product's block: whole rows of M, the grain of its scratch
    /// (the interpreter's and a host fallback's) and of the CPU's units.
    pub gemm_block_bytes: usize,
    /// Fewest rows of M one GEMM call fills on this target, a unit of whole blocks,
    /// after which the fused epilogue runs over the unit on the same thread while it
    /// is still in cache; 0 where the epilogue runs on the GEMM's tiles in registers
    /// (CUDA).
    pub gemm_unit_rows: usize,
}

impl TargetDesc {
    /// The CPU backend: 128-bit vectors, 64 Ki-element chunks.
    pub fn cpu() -> TargetDesc {
        TargetDesc {
            name: "cpu",
            vector_bytes: 16,
            split_chunk: 1 << 16,
            split_below_rows: 16,
            split_min_row: 1 << 17,
            max_splits: 1024,
            // Half of a core's L2 on current x86 (1-2 MiB).
            gemm_block_bytes: 1 << 19,
            // Every GEMM call packs all of the rhs (K x N) again, for 2 * rows flops per
            // packed element: at the 32 or 64 rows of a 512 KiB block with N = 4096 or
            // 2048 the packing (memory-bound, K * N elements) cost as much as the
            // multiply-adds (4096x1024 @ 1024x4096: 30 GFLOP/s in blocks of 32 rows,
            // against 100-180 in calls of 256 rows or more, on the 2-core development
            // VM). So a call fills a unit of at least this many rows, and the epilogue
            // then reads it from the last-level cache (a few MiB for the shapes that
            // matter). The GEMM's thread CPU time summed over units, 2048^3 and
            // 4096x1024 @ 1024x4096, min of 12 runs: 128 rows 201 / 394 ms, 256 rows
            // 184 / 353, 512 rows 177 / 350, 1024 rows 185 / 356. 512 also leaves both
            // shapes at least two units per thread on 2 threads, so a thread slowed by
            // other work does not hold up the rest. The epilogue on 24-row groups inside
            // the GEMM's loop, in L2, was tried: the GEMM, re-reading its packed rhs from
            // L3 for each group, lost more (1.15x against 1.04x for gelu(x @ w + b)).
            gemm_unit_rows: 512,
        }
    }
}

impl TargetDesc {
    /// The CUDA backend: rows shorter than 2^15 or more numerous than 256 already fill
    /// a GPU with one thread group per row; fewer, longer rows are cut into chunks of
    /// 16 Ki elements (one block of 256 threads each, 64 elements per thread).
    pub fn cuda() -> TargetDesc {
        TargetDesc {
            name: "cuda",
            vector_bytes: 16,
            split_chunk: 1 << 14,
            split_below_rows: 256,
            split_min_row: 1 << 15,
            max_splits: 4096,
            // The emitted GEMM applies its epilogue in registers; blocks only bound the
            // interpreter's and the host fallback's scratch.
            gemm_block_bytes: 1 << 19,
            gemm_unit_rows: 0,
        }
    }
}

impl Default for TargetDesc {
    fn default() -> TargetDesc {
        TargetDesc::cpu()
    }
}

/// Rows of M per block of a matrix product over `domain` (`[batch..., M, N]`) whose
/// product elements take `elem_bytes`: as many as fit `target.gemm_block_bytes`, at
/// least 16 (so a GEMM call has rows to block over), at most M. Shapes only. The text
/// says where the epilogue runs: on each unit of [`gemm_unit_rows`] rows, or in
/// registers.
pub fn gemm_block_rows(domain: &Shape, elem_bytes: usize, target: &TargetDesc) -> (usize, String) {
    let d = domain.dims();
    let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
    let fit = target.gemm_block_bytes / (n.max(1) * elem_bytes);
    let rows = fit.max(16).min(m.max(1));
    let why = if target.gemm_unit_rows == 0 {
        "matmul: the element-wise epilogue runs on each tile of the product in registers"
            .to_string()
    } else {
        let unit = gemm_unit_rows(rows, m, target);
        let size = size_text(unit * n * elem_bytes);
        let what = if unit > rows {
            format!(
                "{size}: {} blocks of {rows} rows, grouped so that packing the right operand pays off",
                unit.div_ceil(rows)
            )
        } else {
            size
        };
        format!(
            "matmul: one GEMM call fills {unit} rows of M at a time ({what}) and the element-wise epilogue runs on them right after, on the same thread, while they are in cache"
        )
    };
    (rows, why)
}

/// Blocks of `block_rows` rows one GEMM call fills on a target with units
/// (`target.gemm_unit_rows > 0`): the fewest whole blocks of at least the target's unit
/// rows, and at least one. Shapes only: the CPU runtime's units are these.
pub fn gemm_unit_blocks(block_rows: usize, target: &TargetDesc) -> usize {
    target.gemm_unit_rows.div_ceil(block_rows.max(1)).max(1)
}

/// Rows of M one GEMM call fills ([`gemm_unit_blocks`] blocks of `block_rows` rows), at
/// most M = `m`.
pub fn gemm_unit_rows(block_rows: usize, m: usize, target: &TargetDesc) -> usize {
    (gemm_unit_blocks(block_rows, target) * block_rows.max(1)).min(m.max(1))
}

/// Bytes as B, KiB or MiB, rounded down.
fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The plan for a kernel over `domain` reducing `reduce_axes` (sorted), and why.
pub fn choose(domain: &Shape, reduce_axes: &[usize], target: &TargetDesc) -> (Plan, String) {
    if reduce_axes.is_empty() {
        return (
            Plan::Elementwise,
            "no reduction: one flat index space cut into contiguous ranges".into(),
        );
    }
    let dims = domain.dims();
    let rank = dims.len();
    let k = reduce_axes.len();
    let row_len: usize = reduce_axes.iter().map(|&a| dims[a]).product();
    let rows = ndfuse_ir::reduced_shape(domain, reduce_axes, false).numel();
    let trailing = reduce_axes.iter().copied().eq(rank - k..rank);
    let leading = reduce_axes.iter().copied().eq(0..k);
    if rows < target.split_below_rows && row_len >= target.split_min_row {
        let splits = row_len.div_ceil(target.split_chunk).min(target.max_splits);
        let reason = format!(
            "few long rows ({rows} of {row_len}): each is cut into {splits} chunks of about {} reduced apart, then combined in chunk order",
            row_len.div_ceil(splits)
        );
        return (
            Plan::Split {
                rows,
                row_len,
                splits,
            },
            reason,
        );
    }
    if trailing {
        let reason = format!(
            "reduced axes {reduce_axes:?} are innermost: each of the {rows} rows is one contiguous run, one row per work item (TAD-level)"
        );
        return (
            Plan::Rows {
                rows,
                row_len,
                contiguous: true,
            },
            reason,
        );
    }
    if leading {
        let reason = format!(
            "reduced axes {reduce_axes:?} lead: sweep down {row_len} elements per column, vectorised across the {rows} contiguous kept positions"
        );
        return (
            Plan::Columns {
                cols: rows,
                col_len: row_len,
            },
            reason,
        );
    }
    let reason = format!(
        "reduced axes {reduce_axes:?} are neither innermost nor leading: each of the {rows} rows is gathered with strides, one row per work item"
    );
    (
        Plan::Rows {
            rows,
            row_len,
            contiguous: false,
        },
        reason,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_unit_is_whole_blocks_of_at_least_the_target_rows_at_most_m() {
        let cpu = TargetDesc::cpu();
        assert_eq!(gemm_unit_rows(32, 4096, &cpu), 512);
        assert_eq!(gemm_unit_rows(48, 4096, &cpu), 528);
        assert_eq!(gemm_unit_rows(32, 100, &cpu), 100);
        assert_eq!(gemm_unit_rows(1024, 4096, &cpu), 1024);
        // The note names the unit and its blocks, or says the epilogue is in registers.
        let (rows, why) = gemm_block_rows(&Shape::new([4096, 4096]), 4, &cpu);
        assert_eq!(rows, 32);
        assert!(
            why.contains("fills 512 rows of M at a time (8 MiB: 16 blocks of 32 rows"),
            "{why}"
        );
        let (_, why) = gemm_block_rows(&Shape::new([6, 10]), 4, &cpu);
        assert!(why.contains("fills 6 rows of M at a time (240 B)"), "{why}");
        let (_, why) = gemm_block_rows(&Shape::new([4096, 4096]), 4, &TargetDesc::cuda());
        assert!(why.contains("in registers"), "{why}");
    }

    fn plan(dims: &[usize], axes: &[usize]) -> Plan {
        choose(&Shape::new(dims.to_vec()), axes, &TargetDesc::cpu()).0
    }

    #[test]
    fn plans_follow_the_shape() {
        assert_eq!(plan(&[4096, 4096], &[]), Plan::Elementwise);
        assert_eq!(
            plan(&[4096, 4096], &[1]),
            Plan::Rows {
                rows: 4096,
                row_len: 4096,
                contiguous: true
            }
        );
        assert_eq!(
            plan(&[4096, 4096], &[0]),
            Plan::Columns {
                cols: 4096,
                col_len: 4096
            }
        );
        assert_eq!(
            plan(&[8, 16, 32], &[0, 2]),
            Plan::Rows {
                rows: 16,
                row_len: 256,
                contiguous: false
            }
        );
        // A full sum of 64M: one row, split into 1024 chunks (capped) of 65536.
        assert_eq!(
            plan(&[64 << 20], &[0]),
            Plan::Split {
                rows: 1,
                row_len: 64 << 20,
                splits: 1024
            }
        );
        // Few short rows are not worth splitting.
        assert_eq!(
            plan(&[2, 1000], &[1]),
            Plan::Rows {
                rows: 2,
                row_len: 1000,
                contiguous: true
            }
        );
        // Empty rows and empty domains still get a plan.
        assert_eq!(
            plan(&[3, 0], &[1]),
            Plan::Rows {
                rows: 3,
                row_len: 0,
                contiguous: true
            }
        );
        assert_eq!(
            plan(&[0, 5], &[1]),
            Plan::Rows {
                rows: 0,
                row_len: 5,
                contiguous: true
            }
        );
    }
}
