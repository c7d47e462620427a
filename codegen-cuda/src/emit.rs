//! Kernel descriptions to CUDA C: one source text per kernel, one or more `__global__`
//! functions in it, and the launches that run them in order.
//!
//! ## Element-wise kernels (`Plan::Elementwise`)
//!
//! A grid-stride loop over the domain. Each iteration takes `V` consecutive positions,
//! `V` = 16 bytes over the widest buffer element (4 for f32, 8 when every buffer is
//! f16/bf16, 2 for f64), when the innermost (merged) axis holds a multiple of `V`:
//! loads that move along that axis with unit stride and `V`-aligned offsets become one
//! aligned 16-byte access (`nd_vec<float, 4>` is an `ld.global.v4.f32`, `nd_vec<__half,
//! 8>` one `ld.global.v4.b32`), loads that stay put are read once, others are gathered
//! lane by lane; stores are `V`-element accesses too. Otherwise one position per
//! iteration.
//!
//! Positions (`Expr::Position`) and gathers (`Expr::Gather`) take part in the same index
//! space as loads, lane by lane: a position is its view's offset widened to i64; a
//! gather loads at its view's offset plus, per axis, the index wrapped and clamped into
//! the axis in 64 bits (`nd_gather_index`) times the axis's stride, so that no index
//! reads outside the buffer and the sum needs no wider type than the buffer's offsets.
//! Only a position's span (like a random op's) can ask for 64-bit `nd_idx`.
//!
//! ## Kernels with reductions: the row program on a group of threads
//!
//! A row (a TAD) is reduced by a *group* of `G` threads: lane `l` of the group takes
//! elements `l, l + G, ...`, accumulating a partial per reduction, and the group combines
//! the partials in a fixed tree (so a result depends on the launch shape, which depends
//! only on the kernel's shapes, never on timing: deterministic, no atomics). The
//! strategies, chosen from the plan and the row length:
//!
//! | strategy | when | group | combine |
//! |---|---|---|---|
//! | thread per row | rows shorter than 32 | 1 thread | none |
//! | warp per row | rows of 32..=512, or up to 1024 read in one pass | a warp (8 rows per block) | `__shfl_xor_sync` butterfly |
//! | block per row | longer rows | a block | warp shuffles, then the warps' partials in order through shared memory |
//! | column tile | `Plan::Columns`, and strided rows whose innermost kept axis is contiguous | 8 threads of a 32 x 8 block, 32 rows side by side | through a shared-memory tile |
//! | split | `Plan::Split` (few long rows) | see below | partials in a scratch buffer |
//!
//! A row program may need several sweeps over its row (softmax: max, then the sum of
//! `exp(x - max)`, then the stores). When a lane's share of a row is at most 16 elements
//! per load, the first sweep keeps every element it loads in registers and the later
//! sweeps read them from there (one pass over global memory); otherwise every sweep reads
//! the row again (two or more passes).
//!
//! ## Split reductions
//!
//! For `Plan::Split { rows, splits, .. }` the launches are, per sweep `s`:
//! `NAME_p{s}` (one block per chunk: the chunk's partials into the scratch buffer) and
//! `NAME_f{s}` (one block per row: the partials combined in a fixed order, lanes then
//! warps then the block, the row's results into the scratch buffer, per-row stores after
//! the last sweep), then `NAME_st`
//! if the kernel stores element values. Later launches recompute row values from the
//! results in the scratch buffer. No atomics, so the result is the same on every run.
//!
//! ## Matrix products (`Kernel::contraction`)
//!
//! A tiled GEMM (`gemm`): a block-stride loop over the BM x BN tiles of C of every batch
//! position (128 x 128 for f32 at 256 threads), K in slices of 8 staged through shared
//! memory, an 8 x 8 (4 x 4 for 8-byte types) register tile per thread; the body runs as
//! the epilogue on each accumulator and stores the outputs. The product input has no
//! buffer: the functions take no pointer for it.
//!
//! When both operands are f16 and the device is sm_70 or newer, or both bf16 on sm_80
//! or newer (`CudaOptions::compute_capability`; unknown by default, so the default is
//! this SIMT path for every dtype), the inner product runs on tensor cores instead
//! (`gemm_wmma`): `nvcuda::wmma` 16x16x16 fragments with f32 accumulators, 128 x 128
//! tiles of 8 warps with 4 x 2 fragments each, K in slices of 32 staged as half values;
//! the epilogue runs on each fragment after it passes through shared memory. wmma
//! rather than cuBLASLt keeps any epilogue fused and needs no library beyond NVRTC.
//!
//! ## Where the code is
//!
//! The shared layer, bottom to top: `launch` (the output types), `source` (the emitter's
//! state, header, signatures, launch geometry, scratch layout), `values` (per-op C
//! expressions, loads, the element body), `row_index`, `group` (strategies, lanes,
//! accumulators and their combines), `sweep` (a row's loads, values, sweeps and stores)
//! and `row_program` (the loop over rows). One file per plan on top of it, none using
//! another: `elementwise`, `rows`, `columns`, `split`, and `gemm` for matrix products
//! (with `gemm_wmma`, its tensor-core variant, which shares its staging, tile loop and
//! epilogue body).
//! This file picks the plan's file. `routine` stands apart: scatter-add, scans, argsort
//! and attention (`attention`, its gradient in `attention_backward`), graph nodes of
//! their own rather than kernel descriptions, on `launch` and the per-op table only.

use crate::CudaError;
use launch::{CudaKernel, CudaOptions};
use ndfuse_ir::{Kernel, Plan};
use source::Gen;

pub(crate) mod attention;
mod attention_backward;
mod columns;
mod elementwise;
mod gemm;
mod gemm_wmma;
mod group;
pub(crate) mod launch;
pub(crate) mod routine;
mod row_index;
mod row_program;
mod rows;
mod source;
mod split;
mod sweep;
mod values;

/// Renders `kernel` as CUDA C. The text depends only on the kernel and `opts`.
pub fn emit(kernel: &Kernel, opts: &CudaOptions) -> Result<CudaKernel, CudaError> {
    kernel.check().map_err(|problems| CudaError::Invalid {
        kernel: kernel.name.clone(),
        problems: problems.join("; "),
    })?;
    // The passes compute random ops, positions and gathers in element-wise kernels and
    // matmul epilogues only (a kernel with reductions reads their values from a buffer).
    let computed = kernel.body.iter().find_map(|ins| match ins.expr {
        ndfuse_ir::Expr::Random { .. } => Some("a random op"),
        ndfuse_ir::Expr::Position { .. } => Some("a position"),
        ndfuse_ir::Expr::Gather { .. } => Some("a gather"),
        _ => None,
    });
    if let Some(what) = computed.filter(|_| !kernel.reduce_axes.is_empty()) {
        return Err(CudaError::Invalid {
            kernel: kernel.name.clone(),
            problems: format!("{what} in a kernel with reduce axes: the CUDA emitter computes random ops, positions and gathers in element-wise kernels and matmul epilogues only (as the passes place them)"),
        });
    }
    let mut g = Gen::new(kernel, opts);
    let (launches, strategy) = if let Some(c) = &kernel.contraction {
        match gemm_wmma::tensor_core_dtype(c, &kernel.inputs, opts) {
            Some(half) => g.gemm_wmma(half),
            None => g.gemm(),
        }
    } else if kernel.reduce_axes.is_empty() {
        g.elementwise()
    } else if let Plan::Split { splits, .. } = kernel.plan {
        g.split_program(splits.max(1))
    } else if g.column_like() {
        g.columns()
    } else {
        g.rows()
    };
    Ok(g.finish(launches, strategy))
}
