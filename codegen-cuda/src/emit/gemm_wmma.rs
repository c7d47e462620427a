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
//! K is): the block stages `As` (BM x BK) and `Bs` (BK x BN) in the operands' own half
//! type, zero past the ends of M, N and K, so edge tiles need no other care. Each tile
//! keeps its operand's fast axis inner (a transposed operand is a `col_major` fragment,
//! not a strided copy), and is copied 16 bytes at a time where that axis has unit
//! stride and sizes and offsets allow aligned copies (`OperandTile`), element by element
//! otherwise. Each warp then loads its a and b fragments from there and issues
//! `fm * fn` `mma_sync`s per 16 of K. For the epilogue each warp stores
//! one accumulator fragment at a time to its own 16x16 f32 slice of shared memory
//! (`store_matrix_sync`), and its 32 lanes run the kernel body on the 256 elements
//! (8 each, a half-warp per row of 16), the product's load replaced by the stored value,
//! storing the outputs under `m < M` / `n < N` guards where the tiles do not divide.
//! Fragment elements are never indexed: their lane mapping is unspecified.

use super::gemm::{prologue, sum, term};
use super::launch::{CudaOptions, Launch};
use super::source::Gen;
use crate::scalar::{self, Helper};
use ndfuse_ir::{Contraction, DType, Prologue, View};
use std::fmt::Write as _;

/// Shared-memory row padding of the staged operand tiles, in elements: 16 bytes. Rows
/// stay a multiple of 16 bytes long (`ldm` must be) and a fragment, which starts every 16
/// rows and 16 columns, at a 256-bit aligned address (as `load_matrix_sync` requires),
/// while consecutive rows move to other banks.
const PAD: usize = 8;

/// Halves per 16-byte copy when staging.
const VEC: usize = 8;

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

/// One operand's K slice in shared memory: laid out with the operand's fast axis inner,
/// so that the copy is contiguous on both sides, and loaded into fragments with the
/// matching layout (`row_major` or `col_major`).
#[derive(Clone, Debug)]
struct OperandTile {
    /// `As` or `Bs`.
    tile: &'static str,
    /// The operand's other axis: `m` or `n`.
    ax: &'static str,
    /// BM or BN.
    extent: usize,
    /// M or N.
    size: usize,
    /// Strides along the other axis and along K.
    s_ax: isize,
    s_k: isize,
    /// The C name of the operand's base at the batch position (`la`, `rb`).
    base: &'static str,
    input: usize,
    /// K is the inner axis: the tile is `[extent][BK + PAD]`; else `[BK][extent + PAD]`.
    k_inner: bool,
    /// Copied 8 halves (16 bytes) at a time: the inner axis has unit stride, its size a
    /// multiple of 8, and every other offset a multiple of 8 elements, so each copy is
    /// aligned (buffers are, as the element-wise kernels' vectors assume) and lies wholly
    /// inside or wholly outside the operand.
    vector: bool,
    /// The operand's prologue (`ndfuse_ir::Prologue`) and its buffer's dtype: staged
    /// element by element, through the steps, then rounded to the half type (which the
    /// steps end in).
    prologue: (Vec<Prologue>, DType),
}

impl OperandTile {
    fn new(
        (tile, ax, base): (&'static str, &'static str, &'static str),
        view: &View,
        (ax_axis, k_axis): (usize, usize),
        (input, prologue): (usize, (Vec<Prologue>, DType)),
        (extent, size, k): (usize, usize, usize),
    ) -> OperandTile {
        let (s_ax, s_k) = (view.strides[ax_axis], view.strides[k_axis]);
        let k_inner = s_k.abs() <= s_ax.abs();
        let (s_inner, s_outer, inner_size) = if k_inner {
            (s_k, s_ax, k)
        } else {
            (s_ax, s_k, size)
        };
        let rank = view.strides.len();
        let aligned = |x: isize| x % VEC as isize == 0;
        let vector = prologue.0.is_empty()
            && s_inner == 1
            && inner_size.is_multiple_of(VEC)
            && aligned(view.offset)
            && aligned(s_outer)
            && view.strides[..rank - 2].iter().all(|&s| aligned(s));
        OperandTile {
            tile,
            ax,
            extent,
            size,
            s_ax,
            s_k,
            base,
            input,
            k_inner,
            vector,
            prologue,
        }
    }

    /// (rows, row length) of the shared tile, padding included.
    fn shape(&self, bk: usize) -> (usize, usize) {
        if self.k_inner {
            (self.extent, bk + PAD)
        } else {
            (bk, self.extent + PAD)
        }
    }

    /// The tile's element at K index `k` and other-axis index `a` (C expressions).
    fn at(&self, k: &str, a: &str) -> String {
        if self.k_inner {
            format!("{}[{a}][{k}]", self.tile)
        } else {
            format!("{}[{k}][{a}]", self.tile)
        }
    }

    /// How it was staged, for the strategy line.
    fn describe(&self) -> String {
        format!(
            "{} {}-inner{}",
            self.tile,
            if self.k_inner {
                "K"
            } else if self.ax == "m" {
                "M"
            } else {
                "N"
            },
            if self.vector {
                " in 16-byte copies"
            } else {
                ""
            }
        )
    }
}

/// The operands' dtype when `c` runs on tensor cores under `opts`: both operands f16 (as
/// the product reads them: buffers of f16, or rounded to f16 by their prologues) on
/// sm_70 or newer, or both bf16 on sm_80 or newer, accumulating in f32.
pub(super) fn tensor_core_dtype(
    c: &Contraction,
    inputs: &[ndfuse_ir::Buffer],
    opts: &CudaOptions,
) -> Option<DType> {
    let (major, _) = opts.compute_capability?;
    // The operands' dtypes as the product reads them: after their prologues (a rounding
    // cast of an f32 operand to a half type is applied as the tile is staged).
    let (l, r) = (
        Prologue::result_dtype(&c.lhs_prologue, inputs[c.lhs].dtype),
        Prologue::result_dtype(&c.rhs_prologue, inputs[c.rhs].dtype),
    );
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
        let rank = k.domain.rank();
        let (ma, ka) = (rank - 2, rank - 1);
        let ops = [
            OperandTile::new(
                ("As", "m", "la"),
                &c.lhs_view,
                (ma, ka),
                (c.lhs, (c.lhs_prologue.clone(), k.inputs[c.lhs].dtype)),
                (bm, m, kk),
            ),
            OperandTile::new(
                ("Bs", "n", "rb"),
                &c.rhs_view,
                (ka, ma),
                (c.rhs, (c.rhs_prologue.clone(), k.inputs[c.rhs].dtype)),
                (bn, n, kk),
            ),
        ];
        let name = k.name.clone();
        let strategy = format!(
            "tiled GEMM on tensor cores (wmma 16x16x16, {half} in, f32 accumulators): {bm} x {bn} tiles of C, K in slices of {bk} through shared memory ({}, {}), {} x {} warps of {} x {} fragments, {threads} threads per block; epilogue through shared memory",
            ops[0].describe(),
            ops[1].describe(),
            t.warps_m,
            t.warps_n,
            t.fm,
            t.fn_
        );
        if ops.iter().any(|o| o.vector) {
            self.needs.insert(Helper::Vec4);
        }
        // After the header's includes and helpers (the translation unit's top is
        // `source.rs`'s): at file scope, before the only function that uses it.
        self.body.push_str("#include <mma.h>\n");
        self.open_function(&name, threads as u32);
        let b = &mut self.body;
        let _ = writeln!(b, "  namespace wmma = nvcuda::wmma;");
        for o in &ops {
            let (rows, cols) = o.shape(bk);
            let _ = writeln!(
                b,
                "  __align__(32) __shared__ {ht} {}[{rows}][{cols}];",
                o.tile
            );
        }
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
        let wn = match (t.warps_m, t.warps_n) {
            (_, 1) => "0".to_string(),
            (1, _) => format!("warp * {}", t.warp_n()),
            (_, wn) => format!("warp % {wn} * {}", t.warp_n()),
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
        for o in &ops {
            self.stage_halves(o, half, threads, bk, kk);
        }
        self.wmma_steps(t, ht, &ops);
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

    /// One thread block's copy of operand `o`'s K slice into its shared tile, as stored
    /// (half values, which the tensor cores read), zero where the slice passes the end
    /// of M, N or K: piece `e` (an element, or 8 along the inner axis) by thread
    /// `e % threads`, neighbouring threads taking neighbouring pieces along the inner
    /// axis, so that both the reads and the shared-memory writes are contiguous.
    fn stage_halves(&mut self, o: &OperandTile, half: DType, threads: usize, bk: usize, kk: usize) {
        let ht = scalar::storage_type(half);
        let ax = o.ax;
        let w = if o.vector { VEC } else { 1 };
        // Pieces along the inner axis of the tile, and in all.
        let inner = if o.k_inner { bk } else { o.extent } / w;
        let total = o.extent * bk / w;
        let per = total.div_ceil(threads);
        let piece = |along: bool| match (along, inner, w) {
            (true, 1, _) => "0".to_string(),
            (true, _, 1) => format!("e % {inner}"),
            (true, _, _) => format!("e % {inner} * {w}"),
            (false, 1, _) => "e".to_string(),
            (false, _, _) => format!("e / {inner}"),
        };
        let (k_piece, ax_piece) = (piece(o.k_inner), piece(!o.k_inner));
        let (ind2, ind3) = ("      ", "        ");
        let b = &mut self.body;
        let _ = writeln!(b, "{ind2}#pragma unroll");
        let _ = writeln!(b, "{ind2}for (int r = 0; r < {per}; ++r) {{");
        let _ = writeln!(b, "{ind3}const int e = tid + r * {threads};");
        let guard_e = !total.is_multiple_of(threads);
        if guard_e {
            let _ = writeln!(b, "{ind3}if (e < {total}) {{");
        }
        let ind4 = if guard_e { "          " } else { ind3 };
        let _ = writeln!(b, "{ind4}const int kk = {k_piece}, {ax}{ax} = {ax_piece};");
        let _ = writeln!(
            b,
            "{ind4}const nd_idx k = k0 + kk, {ax} = {ax}0 + {ax}{ax};"
        );
        let mut off = vec![o.base.to_string()];
        term(&mut off, ax, o.s_ax);
        term(&mut off, "k", o.s_k);
        let off = sum(off);
        let mut conds = Vec::new();
        if !o.size.is_multiple_of(o.extent) {
            conds.push(format!("{ax} < {}", o.size));
        }
        if !kk.is_multiple_of(bk) {
            conds.push(format!("k < {kk}"));
        }
        let at = o.at("kk", &format!("{ax}{ax}"));
        let (target, load, zero) = if o.vector {
            let v = format!("nd_vec<{ht}, {VEC}>");
            (
                format!("*reinterpret_cast<{v}*>(&{at})"),
                format!("*reinterpret_cast<const {v}*>(in{} + ({off}))", o.input),
                format!("{v}{{}}"),
            )
        } else if o.prologue.0.is_empty() {
            (
                at,
                format!("in{}[{off}]", o.input),
                scalar::store_conv(half, "0.0f"),
            )
        } else {
            let (steps, dtype) = &o.prologue;
            let v = scalar::load_conv(*dtype, &format!("in{}[{off}]", o.input));
            // A last step that rounds to `half` is the store's own rounding.
            let steps = match steps.split_last() {
                Some((Prologue::Cast(to), rest)) if *to == half => rest,
                _ => &steps[..],
            };
            (
                at,
                scalar::store_conv(half, &prologue(v, steps, *dtype)),
                scalar::store_conv(half, "0.0f"),
            )
        };
        let value = if conds.is_empty() {
            load
        } else {
            format!("({}) ? {load} : {zero}", conds.join(" && "))
        };
        let _ = writeln!(b, "{ind4}{target} = {value};");
        if guard_e {
            let _ = writeln!(b, "{ind3}}}");
        }
        let _ = writeln!(b, "{ind2}}}");
    }

    /// After the staging: each warp's fragment loads and `mma_sync`s over the slice,
    /// 16 of K at a time, then the barrier before the next slice overwrites the tiles.
    fn wmma_steps(&mut self, t: WarpTiling, ht: &str, [a, b_op]: &[OperandTile; 2]) {
        let layout = |row: bool| if row { "row_major" } else { "col_major" };
        // a (M x K) is row-major when K is its tile's inner axis; b (K x N) when N is.
        let (la, lb) = (layout(a.k_inner), layout(!b_op.k_inner));
        let (lda, ldb) = (a.shape(t.bk).1, b_op.shape(t.bk).1);
        let a_at = a.at("kk", "wm + i * 16");
        let b_at = b_op.at("kk", "wn + j * 16");
        let (ind, ind2, ind3) = ("    ", "      ", "        ");
        let b = &mut self.body;
        let _ = writeln!(b, "{ind2}__syncthreads();");
        let _ = writeln!(b, "{ind2}#pragma unroll");
        let _ = writeln!(b, "{ind2}for (int kk = 0; kk < {}; kk += 16) {{", t.bk);
        let _ = writeln!(
            b,
            "{ind3}wmma::fragment<wmma::matrix_a, 16, 16, 16, {ht}, wmma::{la}> fa[{}];",
            t.fm
        );
        let _ = writeln!(
            b,
            "{ind3}wmma::fragment<wmma::matrix_b, 16, 16, 16, {ht}, wmma::{lb}> fb[{}];",
            t.fn_
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}for (int i = 0; i < {}; ++i) wmma::load_matrix_sync(fa[i], &{a_at}, {lda});",
            t.fm
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}for (int j = 0; j < {}; ++j) wmma::load_matrix_sync(fb[j], &{b_at}, {ldb});",
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
