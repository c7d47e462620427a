//! Matrix products of f16 or bf16 operands on tensor cores: the tiled GEMM of
//! `gemm.rs` with its inner product done by `nvcuda::wmma` (16x16x16 fragments, f32
//! accumulators) and the same fused epilogue.
//!
//! **When.** Both operand buffers are f16 (the device is sm_70 or newer) or both bf16
//! (sm_80 or newer), as [`CudaOptions::compute_capability`] says; every other product,
//! and every product when the capability is unknown (the default), takes the SIMT GEMM.
//!
//! **Why wmma, not cuBLASLt.** The epilogue stays in the kernel, whatever the body is
//! (cuBLASLt fuses a fixed menu: bias, relu, gelu), the product never exists in global
//! memory, operands are read through their views' strides as in the SIMT path (a
//! transpose or a broadcast batch costs no copy), and no library beyond NVRTC and the
//! CUDA headers is needed. `wmma` rather than raw `mma.sync` PTX: the fragment layout
//! is NVIDIA's business, and the same source compiles for every arch from sm_70 on.
//!
//! **How.** A block of W warps (8 at 256 threads) computes a BM x BN tile of C: the
//! warps form a `warps_m x warps_n` grid, each owning `fm x fn` 16x16 accumulator
//! fragments (register blocking: 4 x 2 at 8 warps, a 64 x 32 warp tile of a 128 x 128
//! block tile; fewer when M or N is small). K is walked in slices of BK (32, or 16 when
//! K is): the block stages `As` (BM x BK, row-major) and `Bs` (BK x BN, row-major) in the
//! operands' own half type through `Gen::stage_operands`, zero past the ends of M, N and
//! K, so edge tiles need no other care; each warp then loads its a and b fragments from
//! there and issues `fm * fn` `mma_sync`s per 16 of K. For the epilogue each warp stores
//! one accumulator fragment at a time to its own 16x16 f32 slice of shared memory
//! (`store_matrix_sync`), and its 32 lanes run the kernel body on the 256 elements
//! (8 each, a half-warp per row of 16), the product's load replaced by the stored value,
//! storing the outputs under `m < M` / `n < N` guards where the tiles do not divide.
//! Fragment elements are never indexed: their lane mapping is unspecified.

use super::gemm::Staging;
use super::launch::{CudaOptions, Launch};
use super::source::Gen;
use crate::scalar;
use ndfuse_ir::{Contraction, DType};
use std::fmt::Write as _;

/// Shared-memory row padding of the staged operand tiles, in elements: 16 bytes, which
/// keeps every fragment's rows 256-bit aligned (as `load_matrix_sync` requires) while
/// moving consecutive rows to other banks.
const PAD: usize = 8;

/// Most accumulator fragments per warp along M and along N: 4 x 2 fragments are 64 f32
/// registers per lane, the SIMT path's budget.
const MOST_FM: usize = 4;
const MOST_FN: usize = 2;

/// How one tensor-core GEMM launch is cut up: shape only.
#[derive(Clone, Copy, Debug)]
struct WarpTiling {
    warps_m: usize,
    warps_n: usize,
    /// Fragments per warp along M.
    fm: usize,
    /// Fragments per warp along N.
    fn_: usize,
    /// The K slice staged per step.
    bk: usize,
}

impl WarpTiling {
    /// As square a warp grid as the warp count allows (rows <= columns), with fewer
    /// rows of warps when M has fewer 16-row fragments than that; then as many
    /// fragments per warp as cover M and N, up to 4 x 2.
    fn choose(threads: u32, m: usize, n: usize, k: usize) -> WarpTiling {
        let warps = (threads / 32).max(1) as usize;
        let p = warps.trailing_zeros() as usize;
        let warps_m = (1usize << (p / 2)).min(m.div_ceil(16).max(1).next_power_of_two());
        let warps_n = warps / warps_m;
        let fit = |extent: usize, across: usize, most: usize| {
            extent
                .div_ceil(16 * across)
                .max(1)
                .next_power_of_two()
                .min(most)
        };
        WarpTiling {
            warps_m,
            warps_n,
            fm: fit(m, warps_m, MOST_FM),
            fn_: fit(n, warps_n, MOST_FN),
            bk: if k <= 16 { 16 } else { 32 },
        }
    }

    fn warps(&self) -> usize {
        self.warps_m * self.warps_n
    }

    fn threads(&self) -> usize {
        32 * self.warps()
    }

    /// Rows of C a warp owns.
    fn warp_m(&self) -> usize {
        16 * self.fm
    }

    /// Columns of C a warp owns.
    fn warp_n(&self) -> usize {
        16 * self.fn_
    }

    fn bm(&self) -> usize {
        self.warps_m * self.warp_m()
    }

    fn bn(&self) -> usize {
        self.warps_n * self.warp_n()
    }
}

/// The operands' dtype when `c` runs on tensor cores under `opts`: both operand buffers
/// f16 on sm_70 or newer, or both bf16 on sm_80 or newer, accumulating in f32.
pub(super) fn tensor_core_dtype(
    c: &Contraction,
    inputs: &[ndfuse_ir::Buffer],
    opts: &CudaOptions,
) -> Option<DType> {
    let (major, _) = opts.compute_capability?;
    let (l, r) = (inputs[c.lhs].dtype, inputs[c.rhs].dtype);
    let since = match l {
        DType::F16 => 7,
        DType::BF16 => 8,
        _ => return None,
    };
    (l == r && c.dtype == DType::F32 && major >= since).then_some(l)
}

impl Gen<'_> {
    /// The tensor-core GEMM with the body as its epilogue, for operands of `half`.
    pub(super) fn gemm_wmma(&mut self, half: DType) -> (Vec<Launch>, String) {
        let k = self.k;
        let c = k
            .contraction
            .clone()
            .expect("gemm_wmma is only chosen for a contraction");
        let (nbatch, m, n, kk) = c.extents();
        let t = WarpTiling::choose(256.min(self.opts.max_block_size), m, n, kk);
        let (bm, bn, bk, threads) = (t.bm(), t.bn(), t.bk, t.threads());
        let (tiles_m, tiles_n) = (m.div_ceil(bm), n.div_ceil(bn));
        let tiles = nbatch * tiles_m * tiles_n;
        let ht = scalar::storage_type(half);
        let name = k.name.clone();
        let strategy = format!(
            "tiled GEMM on tensor cores (wmma 16x16x16, {half} in, f32 accumulators): {bm} x {bn} tiles of C, K in slices of {bk} through shared memory, {} x {} warps of {} x {} fragments, {threads} threads per block; epilogue through shared memory",
            t.warps_m, t.warps_n, t.fm, t.fn_
        );
        self.body.push_str("#include <mma.h>\n");
        self.open_function(&name, threads as u32);
        let (lda, ldb) = (bk + PAD, bn + PAD);
        let b = &mut self.body;
        let _ = writeln!(b, "  namespace wmma = nvcuda::wmma;");
        let _ = writeln!(b, "  __align__(32) __shared__ {ht} As[{bm}][{lda}];");
        let _ = writeln!(b, "  __align__(32) __shared__ {ht} Bs[{bk}][{ldb}];");
        let _ = writeln!(
            b,
            "  __align__(32) __shared__ float Cs[{}][256];",
            t.warps()
        );
        let _ = writeln!(b, "  const int tid = threadIdx.x;");
        let _ = writeln!(b, "  const int warp = tid / 32, lane = tid % 32;");
        let wm = match (t.warps_m, t.warps_n) {
            (1, _) => "0".to_string(),
            (_, 1) => format!("warp * {}", t.warp_m()),
            (_, wn) => format!("warp / {wn} * {}", t.warp_m()),
        };
        let wn = match t.warps_n {
            1 => "0".to_string(),
            wn => format!("warp % {wn} * {}", t.warp_n()),
        };
        let _ = writeln!(b, "  const int wm = {wm}, wn = {wn};");
        let batch_axes = self.tile_head(&c, (bm, bn), (tiles_m, tiles_n, nbatch));
        let ind = "    ";
        let b = &mut self.body;
        let _ = writeln!(
            b,
            "{ind}wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[{}][{}];",
            t.fm, t.fn_
        );
        let _ = writeln!(b, "{ind}#pragma unroll");
        let _ = writeln!(b, "{ind}for (int i = 0; i < {}; ++i)", t.fm);
        let _ = writeln!(b, "{ind}  #pragma unroll");
        let _ = writeln!(
            b,
            "{ind}  for (int j = 0; j < {}; ++j) wmma::fill_fragment(acc[i][j], 0.0f);",
            t.fn_
        );
        let _ = writeln!(b, "{ind}for (nd_idx k0 = 0; k0 < {kk}; k0 += {bk}) {{");
        let staging = Staging {
            threads,
            tile: (bm, bn, bk),
            half: Some(half),
            lhs_k_major: false,
        };
        self.stage_operands(&c, &staging, (m, n, kk));
        self.wmma_steps(t, ht, (lda, ldb));
        self.wmma_epilogue(&c, t, (m, n), &batch_axes);
        let b = &mut self.body;
        let _ = writeln!(b, "  }}");
        b.push_str("}\n");
        let launch = Launch {
            function: name,
            grid: self.grid_for(tiles, 1),
            block: (threads as u32, 1),
        };
        let empty = k.domain.numel() == 0;
        (if empty { vec![] } else { vec![launch] }, strategy)
    }

    /// After the staging: each warp's fragment loads and `mma_sync`s over the slice,
    /// 16 of K at a time, then the barrier before the next slice overwrites the tiles.
    fn wmma_steps(&mut self, t: WarpTiling, ht: &str, (lda, ldb): (usize, usize)) {
        let (ind, ind2, ind3) = ("    ", "      ", "        ");
        let b = &mut self.body;
        let _ = writeln!(b, "{ind2}__syncthreads();");
        let _ = writeln!(b, "{ind2}#pragma unroll");
        let _ = writeln!(b, "{ind2}for (int kk = 0; kk < {}; kk += 16) {{", t.bk);
        let _ = writeln!(
            b,
            "{ind3}wmma::fragment<wmma::matrix_a, 16, 16, 16, {ht}, wmma::row_major> fa[{}];",
            t.fm
        );
        let _ = writeln!(
            b,
            "{ind3}wmma::fragment<wmma::matrix_b, 16, 16, 16, {ht}, wmma::row_major> fb[{}];",
            t.fn_
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}for (int i = 0; i < {}; ++i) wmma::load_matrix_sync(fa[i], &As[wm + i * 16][kk], {lda});",
            t.fm
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}for (int j = 0; j < {}; ++j) wmma::load_matrix_sync(fb[j], &Bs[kk][wn + j * 16], {ldb});",
            t.fn_
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(b, "{ind3}for (int i = 0; i < {}; ++i)", t.fm);
        let _ = writeln!(b, "{ind3}  #pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}  for (int j = 0; j < {}; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);",
            t.fn_
        );
        let _ = writeln!(b, "{ind2}}}");
        let _ = writeln!(b, "{ind2}__syncthreads();");
        let _ = writeln!(b, "{ind}}}");
    }

    /// Each accumulator fragment through the warp's slice of `Cs`, then the body on its
    /// 256 elements, 8 per lane. The `__syncwarp`s order the lanes' reads after the
    /// store, and the next store after every read.
    fn wmma_epilogue(
        &mut self,
        c: &Contraction,
        t: WarpTiling,
        (m, n): (usize, usize),
        batch_axes: &[usize],
    ) {
        let ind = "    ";
        let b = &mut self.body;
        let _ = writeln!(b, "{ind}float* const cw = Cs[warp];");
        let _ = writeln!(b, "{ind}#pragma unroll");
        let _ = writeln!(b, "{ind}for (int i = 0; i < {}; ++i) {{", t.fm);
        let _ = writeln!(b, "{ind}  #pragma unroll");
        let _ = writeln!(b, "{ind}  for (int j = 0; j < {}; ++j) {{", t.fn_);
        let ind3 = "        ";
        let _ = writeln!(
            b,
            "{ind3}wmma::store_matrix_sync(cw, acc[i][j], 16, wmma::mem_row_major);"
        );
        let _ = writeln!(b, "{ind3}__syncwarp();");
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(b, "{ind3}for (int r = 0; r < 8; ++r) {{");
        let ind4 = "          ";
        let _ = writeln!(b, "{ind4}const int e = lane + r * 32;");
        let _ = writeln!(
            b,
            "{ind4}const nd_idx m = m0 + wm + i * 16 + e / 16, n = n0 + wn + j * 16 + e % 16;"
        );
        let checks = (m % t.bm() != 0, n % t.bn() != 0);
        self.epilogue_element(c, batch_axes, (m, n), checks, "cw[e]", ind4);
        let b = &mut self.body;
        let _ = writeln!(b, "{ind3}}}");
        let _ = writeln!(b, "{ind3}__syncwarp();");
        let _ = writeln!(b, "{ind}  }}");
        let _ = writeln!(b, "{ind}}}");
    }
}

#[cfg(test)]
mod tests {
    use super::WarpTiling;

    #[test]
    fn warp_tiles_cover_the_block_and_shrink_with_small_products() {
        let big = WarpTiling::choose(256, 4096, 4096, 1024);
        assert_eq!((big.warps_m, big.warps_n, big.fm, big.fn_), (2, 4, 4, 2));
        assert_eq!((big.bm(), big.bn(), big.bk), (128, 128, 32));
        // One row of C: every warp along N, one fragment each way.
        let row = WarpTiling::choose(256, 1, 7, 7);
        assert_eq!((row.warps_m, row.warps_n, row.fm, row.fn_), (1, 8, 1, 1));
        assert_eq!((row.bm(), row.bn(), row.bk), (16, 128, 16));
        // 32 threads: one warp with the whole tile.
        let one = WarpTiling::choose(32, 65, 65, 65);
        assert_eq!((one.warps(), one.fm, one.fn_), (1, 4, 2));
        assert_eq!((one.bm(), one.bn()), (64, 32));
    }
}
