//! Matrix products (`Kernel::contraction`): a tiled GEMM whose epilogue is the kernel's
//! body. Each block computes BM x BN tiles of C (a block-stride loop over the tiles of
//! every batch position), walking K in slices of BK that the block stages through shared
//! memory; each thread accumulates a TM x TN tile in registers, then runs the body on
//! each of its elements with the product's load replaced by the accumulator and stores
//! the outputs. The product never exists in memory: the kernel takes no pointer for it.
//!
//! Operands are read through the contraction's views with constant strides (a transpose
//! or a broadcast batch axis costs nothing) and converted to the accumulator's type as
//! they are staged (f16/bf16 to f32). Every dtype takes this path unless the target has
//! tensor cores for its half operands: then `gemm_wmma.rs` emits the product, sharing
//! this file's tile loop (`tile_head`) and epilogue body (`epilogue_element`).

use super::launch::Launch;
use super::source::Gen;
use crate::scalar;
use ndfuse_ir::{Accumulate, Contraction, DType, Expr, Prologue, View};
use std::fmt::Write as _;

/// `v` (a float value of `dtype`, held in f32) through the prologue `steps` (see
/// `ndfuse_ir::Prologue`): f32 arithmetic, each result rounded to its dtype.
pub(super) fn prologue(mut v: String, steps: &[Prologue], mut dtype: DType) -> String {
    let round = |v: String, d: DType| {
        if scalar::is_half(d) {
            scalar::load_conv(d, &scalar::store_conv(d, &v))
        } else {
            v
        }
    };
    for step in steps {
        v = match *step {
            Prologue::Cast(to) => {
                dtype = to;
                round(v, dtype)
            }
            Prologue::Mul(c) => round(format!("({v} * {})", scalar::literal(c, DType::F32)), dtype),
            Prologue::Div(c) => round(format!("({v} / {})", scalar::literal(c, DType::F32)), dtype),
        };
    }
    v
}

/// K slice staged per step. 8 keeps the two staged tiles at 8.3 KiB for f32 (16.5 KiB
/// for 8-byte types): several blocks fit an SM, and each thread loads
/// `(BM + BN) * 8 / threads` elements per step (8 at 256 threads).
const BK: usize = 8;

/// Shared-memory row padding, in elements. A K-major staging walk (a row-major left
/// operand: neighbouring threads take neighbouring k) writes 8 k-rows x 4 m-columns per
/// warp; with rows `BM + 4` apart those 32 writes land in 32 distinct banks whatever BM
/// (a power of two) is.
const PAD: usize = 4;

/// How one GEMM launch is cut up: shape only.
///
/// The threads form a `rows x cols` grid (256 threads: 16 x 16). Thread `(ty, tx)` owns
/// rows `ty + i * rows` and columns `tx + j * cols` of the tile (`i < tm`, `j < tn`),
/// interleaved rather than contiguous: a warp's reads of the staged B tile are 16
/// consecutive words (no bank conflicts, no vector types needed) while its A reads are
/// two broadcasts, and the epilogue's loads and stores along N are coalesced, each warp
/// touching two runs of 16 consecutive elements.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    rows: usize,
    cols: usize,
    tm: usize,
    tn: usize,
}

impl Tiling {
    /// 8 x 8 accumulators for 4-byte types (64 registers, 256 threads: 128 x 128 tiles,
    /// the classic SGEMM balance of 4 FMAs per shared-memory load); 4 x 4 for 8-byte
    /// types, whose registers count double. Fewer per thread when M or N is small, so a
    /// 7-row product does not compute 121 rows of padding; the thread count stays.
    fn choose(acc: DType, threads: u32, m: usize, n: usize) -> Tiling {
        let p = threads.trailing_zeros() as usize;
        let (rows, cols) = (1usize << (p / 2), 1usize << p.div_ceil(2));
        let most = if acc.size_bytes() >= 8 { 4 } else { 8 };
        let fit = |extent: usize, across: usize| {
            extent.div_ceil(across).max(1).next_power_of_two().min(most)
        };
        Tiling {
            rows,
            cols,
            tm: fit(m, rows),
            tn: fit(n, cols),
        }
    }

    fn bm(&self) -> usize {
        self.rows * self.tm
    }

    fn bn(&self) -> usize {
        self.cols * self.tn
    }

    fn threads(&self) -> usize {
        self.rows * self.cols
    }
}

impl Gen<'_> {
    /// The tiled GEMM with the body as its epilogue.
    pub(super) fn gemm(&mut self) -> (Vec<Launch>, String) {
        let k = self.k;
        let c = k
            .contraction
            .clone()
            .expect("gemm is only chosen for a contraction");
        let (nbatch, m, n, kk) = c.extents();
        let threads = 256.min(self.opts.max_block_size);
        let t = Tiling::choose(c.dtype, threads, m, n);
        let (bm, bn) = (t.bm(), t.bn());
        let (tiles_m, tiles_n) = (m.div_ceil(bm), n.div_ceil(bn));
        let tiles = nbatch * tiles_m * tiles_n;
        let acc = scalar::compute_type(c.dtype);
        let zero = scalar::identity(Accumulate::Sum, c.dtype);
        let name = k.name.clone();
        let strategy = format!(
            "tiled GEMM: {bm} x {bn} tiles of C, K in slices of {BK} through shared memory, {} x {} accumulators per thread, {} threads per block; epilogue in registers",
            t.tm,
            t.tn,
            t.threads()
        );
        self.open_function(&name, t.threads() as u32);
        let b = &mut self.body;
        let _ = writeln!(b, "  __shared__ {acc} As[{BK}][{}];", bm + PAD);
        let _ = writeln!(b, "  __shared__ {acc} Bs[{BK}][{}];", bn + PAD);
        let _ = writeln!(b, "  const int tid = threadIdx.x;");
        let _ = writeln!(
            b,
            "  const int tx = tid % {cols}, ty = tid / {cols};",
            cols = t.cols
        );
        let batch_axes = self.tile_head(&c, (bm, bn), (tiles_m, tiles_n, nbatch));
        let ind = "    ";
        let b = &mut self.body;
        let _ = writeln!(b, "{ind}{acc} acc[{}][{}];", t.tm, t.tn);
        let _ = writeln!(b, "{ind}#pragma unroll");
        let _ = writeln!(b, "{ind}for (int i = 0; i < {}; ++i)", t.tm);
        let _ = writeln!(b, "{ind}  #pragma unroll");
        let _ = writeln!(
            b,
            "{ind}  for (int j = 0; j < {}; ++j) acc[i][j] = {zero};",
            t.tn
        );
        self.k_loop(&c, t, (m, n, kk));
        self.epilogue(&c, t, (m, n), &batch_axes);
        let b = &mut self.body;
        let _ = writeln!(b, "  }}");
        b.push_str("}\n");
        let launch = Launch {
            function: name,
            grid: self.grid_for(tiles, 1),
            block: (t.threads() as u32, 1),
        };
        let empty = k.domain.numel() == 0;
        (if empty { vec![] } else { vec![launch] }, strategy)
    }

    /// Opens the block-stride loop over the tiles (`t`) of every batch position and
    /// defines the tile's origin in C (`m0`, `n0`), its batch position (`bz`, and `b{a}`
    /// along each batch axis that is not 1) and the operands' bases there (`la`, `rb`).
    /// Returns the batch axes that have an index.
    pub(super) fn tile_head(
        &mut self,
        c: &Contraction,
        (bm, bn): (usize, usize),
        (tiles_m, tiles_n, nbatch): (usize, usize, usize),
    ) -> Vec<usize> {
        let k = self.k;
        let tiles = nbatch * tiles_m * tiles_n;
        let ind = "    ";
        let b = &mut self.body;
        let _ = writeln!(
            b,
            "  for (nd_idx t = blockIdx.x; t < {tiles}; t += gridDim.x) {{"
        );
        // Tile t: n-tiles fastest, then m-tiles, then the batch position.
        let per_matrix = tiles_m * tiles_n;
        let m_tile = match (tiles_m, tiles_n, nbatch) {
            (1, _, _) => None,
            (_, 1, 1) => Some("t".to_string()),
            (_, 1, _) => Some(format!("t % {tiles_m}")),
            (_, _, 1) => Some(format!("t / {tiles_n}")),
            _ => Some(format!("t / {tiles_n} % {tiles_m}")),
        };
        let m0 = m_tile.map_or("0".to_string(), |x| format!("{x} * {bm}"));
        let n0 = if tiles_n == 1 {
            "0".to_string()
        } else {
            format!("t % {tiles_n} * {bn}")
        };
        let _ = writeln!(b, "{ind}const nd_idx m0 = {m0}, n0 = {n0};");
        // The batch position's index along each batch axis (size-1 axes have none).
        let batch_dims = &k.domain.dims()[..k.domain.rank() - 2];
        let batch_axes: Vec<usize> = (0..batch_dims.len())
            .filter(|&a| batch_dims[a] != 1)
            .collect();
        if !batch_axes.is_empty() {
            let bz = if per_matrix == 1 {
                "t".to_string()
            } else {
                format!("t / {per_matrix}")
            };
            let _ = writeln!(b, "{ind}const nd_idx bz = {bz};");
        }
        if let [a] = batch_axes[..] {
            let _ = writeln!(b, "{ind}const nd_idx b{a} = bz;");
        } else if !batch_axes.is_empty() {
            let _ = writeln!(b, "{ind}nd_idx bt = bz;");
            for (pos, &a) in batch_axes.iter().enumerate().rev() {
                if pos == 0 {
                    let _ = writeln!(b, "{ind}const nd_idx b{a} = bt;");
                } else {
                    let _ = writeln!(
                        b,
                        "{ind}const nd_idx b{a} = bt % {d}; bt /= {d};",
                        d = batch_dims[a]
                    );
                }
            }
        }
        let base = |view: &View| {
            let mut terms = vec![view.offset.to_string()];
            for &a in &batch_axes {
                term(&mut terms, &format!("b{a}"), view.strides[a]);
            }
            sum(terms)
        };
        let _ = writeln!(
            b,
            "{ind}const nd_idx la = {}, rb = {};",
            base(&c.lhs_view),
            base(&c.rhs_view)
        );
        batch_axes
    }

    /// The walk over K: stage a slice of each operand, then the rank-BK update of the
    /// accumulators. Bounds checks only on the axes the tiles do not divide.
    fn k_loop(&mut self, c: &Contraction, t: Tiling, (m, n, kk): (usize, usize, usize)) {
        let acc = scalar::compute_type(c.dtype);
        let ind = "    ";
        let _ = writeln!(
            self.body,
            "{ind}for (nd_idx k0 = 0; k0 < {kk}; k0 += {BK}) {{"
        );
        self.stage_operands(c, t, (m, n, kk));
        let ind2 = "      ";
        let b = &mut self.body;
        let _ = writeln!(b, "{ind2}__syncthreads();");
        let _ = writeln!(b, "{ind2}#pragma unroll");
        let _ = writeln!(b, "{ind2}for (int kk = 0; kk < {BK}; ++kk) {{");
        let ind3 = "        ";
        let _ = writeln!(b, "{ind3}{acc} a[{}], b[{}];", t.tm, t.tn);
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}for (int i = 0; i < {}; ++i) a[i] = As[kk][ty + i * {}];",
            t.tm, t.rows
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}for (int j = 0; j < {}; ++j) b[j] = Bs[kk][tx + j * {}];",
            t.tn, t.cols
        );
        let _ = writeln!(b, "{ind3}#pragma unroll");
        let _ = writeln!(b, "{ind3}for (int i = 0; i < {}; ++i)", t.tm);
        let _ = writeln!(b, "{ind3}  #pragma unroll");
        let _ = writeln!(
            b,
            "{ind3}  for (int j = 0; j < {}; ++j) acc[i][j] = {};",
            t.tn,
            multiply_add(c.dtype, "acc[i][j]", "a[i]", "b[j]")
        );
        let _ = writeln!(b, "{ind2}}}");
        let _ = writeln!(b, "{ind2}__syncthreads();");
        let _ = writeln!(b, "{ind}}}");
    }

    /// One thread block's copy of a K slice of each operand into shared memory, converted
    /// to the accumulator's type: `As` and `Bs`, both K-major (BK x BM and BK x BN),
    /// element `e` of a tile by thread `e % threads`, zero where the slice passes the end
    /// of M, N or K (bounds checks only on the axes the tiles do not divide). Each tile is
    /// walked along its operand's smaller stride, so that neighbouring threads read
    /// neighbouring addresses (a transposed operand is read along its rows).
    fn stage_operands(&mut self, c: &Contraction, t: Tiling, (m, n, kk): (usize, usize, usize)) {
        let (bm, bn, bk, threads) = (t.bm(), t.bn(), BK, t.threads());
        let zero = scalar::identity(Accumulate::Sum, c.dtype);
        let rank = c.lhs_view.shape.rank();
        let (sm, sk) = (c.lhs_view.strides[rank - 2], c.lhs_view.strides[rank - 1]);
        let (sk2, sn) = (c.rhs_view.strides[rank - 2], c.rhs_view.strides[rank - 1]);
        let (check_m, check_n, check_k) = (m % bm != 0, n % bn != 0, kk % bk != 0);
        let stages = [
            (
                "As",
                "m",
                bm,
                sm,
                sk,
                check_m,
                m,
                "la",
                c.lhs,
                &c.lhs_prologue,
            ),
            (
                "Bs",
                "n",
                bn,
                sn,
                sk2,
                check_n,
                n,
                "rb",
                c.rhs,
                &c.rhs_prologue,
            ),
        ];
        for (tile, ax, extent, s_ax, s_k, check_ax, size, base, input, steps) in stages {
            let total = extent * bk;
            let per = total.div_ceil(threads);
            let k_fast = s_k.abs() <= s_ax.abs();
            let ind2 = "      ";
            let _ = writeln!(self.body, "{ind2}#pragma unroll");
            let _ = writeln!(self.body, "{ind2}for (int r = 0; r < {per}; ++r) {{");
            let ind3 = "        ";
            let _ = writeln!(self.body, "{ind3}const int e = tid + r * {threads};");
            let guard_e = !total.is_multiple_of(threads);
            if guard_e {
                let _ = writeln!(self.body, "{ind3}if (e < {total}) {{");
            }
            let ind4 = if guard_e { "          " } else { ind3 };
            let (ka, aa) = if k_fast {
                (format!("e % {bk}"), format!("e / {bk}"))
            } else {
                (format!("e / {extent}"), format!("e % {extent}"))
            };
            let _ = writeln!(self.body, "{ind4}const int kk = {ka}, {ax}{ax} = {aa};");
            let _ = writeln!(
                self.body,
                "{ind4}const nd_idx k = k0 + kk, {ax} = {ax}0 + {ax}{ax};"
            );
            let mut off = vec![base.to_string()];
            term(&mut off, ax, s_ax);
            term(&mut off, "k", s_k);
            let load = prologue(
                self.load_expr(input, &sum(off)),
                steps,
                self.k.inputs[input].dtype,
            );
            let mut conds = Vec::new();
            if check_ax {
                conds.push(format!("{ax} < {size}"));
            }
            if check_k {
                conds.push(format!("k < {kk}"));
            }
            let value = if conds.is_empty() {
                load
            } else {
                format!("({}) ? {load} : {zero}", conds.join(" && "))
            };
            let _ = writeln!(self.body, "{ind4}{tile}[kk][{ax}{ax}] = {value};");
            if guard_e {
                let _ = writeln!(self.body, "{ind3}}}");
            }
            let _ = writeln!(self.body, "{ind2}}}");
        }
    }

    /// The body at each element of the thread's register tile inside C, the product's
    /// load being the accumulator, and its stores.
    fn epilogue(
        &mut self,
        c: &Contraction,
        t: Tiling,
        (m, n): (usize, usize),
        batch_axes: &[usize],
    ) {
        let ind = "    ";
        let b = &mut self.body;
        let _ = writeln!(b, "{ind}#pragma unroll");
        let _ = writeln!(b, "{ind}for (int i = 0; i < {}; ++i) {{", t.tm);
        let _ = writeln!(b, "{ind}  #pragma unroll");
        let _ = writeln!(b, "{ind}  for (int j = 0; j < {}; ++j) {{", t.tn);
        let ind3 = "        ";
        let _ = writeln!(
            b,
            "{ind3}const nd_idx m = m0 + ty + i * {}, n = n0 + tx + j * {};",
            t.rows, t.cols
        );
        let checks = (m % t.bm() != 0, n % t.bn() != 0);
        self.epilogue_element(c, batch_axes, (m, n), checks, "acc[i][j]", ind3);
        let b = &mut self.body;
        let _ = writeln!(b, "{ind}  }}");
        let _ = writeln!(b, "{ind}}}");
    }

    /// The body at element `(m, n)` of C (defined by the caller, at indent `ind`), the
    /// product's load being `product`, storing the outputs at `p`; guarded by `m < M`
    /// and `n < N` where `checks` says the tiles do not divide that axis.
    pub(super) fn epilogue_element(
        &mut self,
        c: &Contraction,
        batch_axes: &[usize],
        (m, n): (usize, usize),
        (check_m, check_n): (bool, bool),
        product: &str,
        ind: &str,
    ) {
        let mut conds = Vec::new();
        if check_m {
            conds.push(format!("m < {m}"));
        }
        if check_n {
            conds.push(format!("n < {n}"));
        }
        let inner = format!("{ind}  ");
        let ind2 = if conds.is_empty() {
            ind
        } else {
            let _ = writeln!(self.body, "{ind}if ({}) {{", conds.join(" && "));
            &inner
        };
        let mut p = Vec::new();
        if !batch_axes.is_empty() {
            p.push(format!("bz * {}", m * n));
        }
        term(&mut p, "m", n as isize);
        term(&mut p, "n", 1);
        let _ = writeln!(self.body, "{ind2}const nd_idx p = {};", sum(p));
        let src = self.epilogue_sources(c, batch_axes, product);
        self.element_body(&src, "out{}[p]", ind2);
        if !conds.is_empty() {
            let _ = writeln!(self.body, "{ind}}}");
        }
    }

    /// Where each load, random op, position and gather of the body gets its value at
    /// element `(m, n)` of C (batch position `b{a}`): the product's load is `product`,
    /// other loads read their buffers through their views. `None` for the other
    /// instructions.
    fn epilogue_sources(
        &mut self,
        c: &Contraction,
        batch_axes: &[usize],
        product: &str,
    ) -> Vec<Option<String>> {
        let k = self.k;
        let rank = k.domain.rank();
        let offset = |view: &ndfuse_ir::View| {
            let mut off = vec![view.offset.to_string()];
            for &a in batch_axes {
                term(&mut off, &format!("b{a}"), view.strides[a]);
            }
            term(&mut off, "m", view.strides[rank - 2]);
            term(&mut off, "n", view.strides[rank - 1]);
            sum(off)
        };
        let mut src: Vec<Option<String>> = vec![None; k.body.len()];
        for (i, ins) in k.body.iter().enumerate() {
            src[i] = match &ins.expr {
                Expr::Random { key, view } => {
                    let key = format!("v{}", key.0);
                    Some(scalar::random(&key, &offset(view), &mut self.needs))
                }
                Expr::Position { view } | Expr::Gather { view, .. } => {
                    Some(self.computed_read(i, &offset(view)))
                }
                Expr::Load { input, .. } if *input == c.product => Some(product.to_string()),
                Expr::Load { input, view } => Some(self.load_expr(*input, &offset(view))),
                _ => None,
            };
        }
        src
    }
}

/// Adds `index * stride` to `terms` (nothing for stride 0).
pub(super) fn term(terms: &mut Vec<String>, index: &str, stride: isize) {
    match stride {
        0 => {}
        1 => terms.push(index.to_string()),
        s => terms.push(format!("{index} * {s}")),
    }
}

/// `terms` joined with `+`, without the zero terms ("0" when nothing is left).
pub(super) fn sum(terms: Vec<String>) -> String {
    let kept: Vec<String> = terms.into_iter().filter(|t| t != "0").collect();
    if kept.is_empty() {
        "0".to_string()
    } else {
        kept.join(" + ")
    }
}

/// `acc + a * b` in the accumulator's type: a fused multiply-add for floats, wrapping
/// (unsigned) arithmetic for integers, as the reference's integer product wraps.
fn multiply_add(acc: DType, sum: &str, a: &str, b: &str) -> String {
    match acc {
        DType::F64 => format!("fma({a}, {b}, {sum})"),
        DType::I32 => format!("(int)((unsigned){sum} + (unsigned){a} * (unsigned){b})"),
        DType::I64 => format!(
            "(long long)((unsigned long long){sum} + (unsigned long long){a} * (unsigned long long){b})"
        ),
        _ => format!("fmaf({a}, {b}, {sum})"),
    }
}
