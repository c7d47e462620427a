//! Matrix products whose operands are converted as they are read: f16 and bf16
//! operands, and operands with prologue steps (`ndfuse_ir::Prologue`: `(q * 0.125) @ k`,
//! `cast(x, f16) @ w`). The `gemm` crate multiplies f32 in place but cannot convert, so
//! such an operand used to be copied whole into f32 first (1.5 ms of a 2048^3 f16
//! product, all of its cost over f32). Here the crate's own f32 micro-kernels run over
//! panels packed by this module, and each element is converted (and put through its
//! steps) as it is packed, in the copy the GEMM makes anyway.
//!
//! The bits are those of `gemm::gemm` on f32 copies of the operands, because the
//! computation is the same: on x86-64 with FMA, stable Rust, `gemm` runs its `fma`
//! micro-kernels (16 of its lhs rows, our columns, by 6 of its rhs columns, our rows) on
//! the transposed problem (our row-major destination is its column-major one), and an
//! element of the product is one chain of fused multiply-adds over each block of `kc`
//! of K, in order, the blocks' sums added into the destination in order. `kc` is the
//! crate's own choice from the shapes ([`kc`]), and the tile a micro-kernel call covers
//! changes nothing in an element's chain, so the blocking of rows and columns here can
//! differ from the crate's. Where `gemm` would take another road (a degenerate shape,
//! its small-product kernels, a reversed K, or no FMA) [`Packed::new`] declines and the
//! caller copies the operands instead ([`Widened`]: contiguous f32 copies in buffers of
//! the host cache, which `gemm` then reads). `tests/tests/matmul_cpu.rs` checks the bits
//! against `gemm` over the same values in f32, on shapes with partial tiles, several K
//! blocks and on the shapes where this module declines.

use crate::alloc::{host_cache, AllocError};
use crate::gemm_tier::{F32Kernels, ProductTier};
use gemm_common::cache::kernel_params;
use half::slice::HalfFloatSliceExt;
use ndfuse_ir::{DType, HostArray, Prologue, Shape, Storage, View};
use rayon::prelude::*;
use std::cell::RefCell;

/// Multiply-adds of a block below which it runs on one thread (`gemm`'s default).
const THREADING_THRESHOLD: usize = gemm_common::gemm::DEFAULT_THREADING_THRESHOLD;

/// The elements of one operand, as stored.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Elements<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    BF16(&'a [half::bf16]),
}

impl Elements<'_> {
    fn dtype(&self) -> DType {
        match self {
            Elements::F32(_) => DType::F32,
            Elements::F16(_) => DType::F16,
            Elements::BF16(_) => DType::BF16,
        }
    }
}

/// One matrix operand: element `[r, c]` at `off + r * rs + c * cs` of `data`, read as
/// f32 and put through prologue `steps`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Source<'a> {
    pub(crate) data: Elements<'a>,
    pub(crate) off: isize,
    pub(crate) rs: isize,
    pub(crate) cs: isize,
    pub(crate) steps: &'a [Prologue],
}

impl Source<'_> {
    /// Whether the operand is read as it is (plain f32): `gemm` would get its strides.
    fn in_place(&self) -> bool {
        matches!(self.data, Elements::F32(_)) && self.steps.is_empty()
    }

    /// Elements `[r, c0..c0 + dst.len()]` as f32, through the steps, into `dst`. The
    /// caller keeps them inside the view (checked by `check_args` before any product).
    fn row(&self, r: usize, c0: usize, dst: &mut [f32]) {
        let start = self.off + r as isize * self.rs + c0 as isize * self.cs;
        let at = |j: usize| (start + j as isize * self.cs) as usize;
        match self.data {
            Elements::F32(v) if self.cs == 1 => {
                dst.copy_from_slice(&v[start as usize..start as usize + dst.len()])
            }
            Elements::F16(v) if self.cs == 1 => {
                Half::to_f32s(&v[start as usize..start as usize + dst.len()], dst)
            }
            Elements::BF16(v) if self.cs == 1 => {
                Half::to_f32s(&v[start as usize..start as usize + dst.len()], dst)
            }
            Elements::F32(v) => dst.iter_mut().enumerate().for_each(|(j, d)| *d = v[at(j)]),
            Elements::F16(v) => dst
                .iter_mut()
                .enumerate()
                .for_each(|(j, d)| *d = v[at(j)].to_f32()),
            Elements::BF16(v) => dst
                .iter_mut()
                .enumerate()
                .for_each(|(j, d)| *d = v[at(j)].to_f32()),
        }
        if !self.steps.is_empty() {
            apply_prologue(dst, (self.steps, self.data.dtype()));
        }
    }
}

/// A product `a [rows, k] @ b [k, n]` this module runs, with `kc` fixed (see [`kc`]).
#[derive(Debug)]
pub(crate) struct Packed<'a> {
    a: Source<'a>,
    b: Source<'a>,
    rows: usize,
    n: usize,
    k: usize,
    kc: usize,
    /// The tier's micro-kernels: tiles of `mr` columns of the product (rows of
    /// `gemm`'s lhs, whole registers of `lanes`) by `nr` rows.
    kernels: F32Kernels,
}

impl<'a> Packed<'a> {
    /// The product of `a` (`rows x k`) and `b` (`k x n`), or `None` where `gemm` on
    /// f32 copies of the operands would not run its micro-kernels over blocks of K in
    /// order, so the bits would differ: no FMA (its scalar kernels), `n` or `rows`
    /// below 2 (a matrix-vector product or no transposition), `k` below 3 (its
    /// outer-product kernel), a reversed K on an operand read in place (it reverses
    /// K), or its small-product kernels (unit strides on both K axes of what it would
    /// read, at most 256 outputs).
    pub(crate) fn new(
        a: Source<'a>,
        b: Source<'a>,
        (rows, n, k): (usize, usize, usize),
    ) -> Option<Self> {
        let kernels = ProductTier::current().f32_kernels()?;
        if rows < 2 || n < 2 || k < 3 {
            return None;
        }
        // The K strides `gemm` would see: a copy is contiguous, row-major.
        let b_k_stride = if b.in_place() { b.rs } else { n as isize };
        let a_k_stride = if a.in_place() { a.cs } else { 1 };
        if b_k_stride < 0 || (b_k_stride == 1 && a_k_stride == 1 && n * rows <= 256) {
            return None;
        }
        let kc = kc(rows, n, k, &kernels);
        Some(Packed {
            a,
            b,
            rows,
            n,
            k,
            kc,
            kernels,
        })
    }

    /// Fills `dst` (`rows x n`, row-major, row stride `n`) with the product, on up to
    /// `threads` threads of the current rayon pool (blocks of columns), the same bits
    /// on any number.
    pub(crate) fn run(&self, dst: &mut [f32], threads: usize) {
        assert_eq!(dst.len(), self.rows * self.n, "rows x n (a bug)");
        let Packed { rows, n, k, kc, .. } = *self;
        let F32Kernels {
            mr: tile_mr,
            nr: tile_nr,
            ..
        } = self.kernels;
        let params = kernel_params(n, rows, k, tile_mr, tile_nr, 4);
        // Columns per block of packed b: the crate's L2 choice, cut so that every
        // thread gets one; rows per block of packed a: its choice, or 128 panels.
        let per_thread = n.div_ceil(threads.max(1)).next_multiple_of(tile_mr);
        let mc = params
            .mc
            .max(tile_mr)
            .next_multiple_of(tile_mr)
            .min(per_thread);
        let nc = if params.nc > 0 {
            params.nc
        } else {
            128 * tile_nr
        }
        .next_multiple_of(tile_nr);
        let out = DstPtr(dst.as_mut_ptr());
        for i0 in (0..rows).step_by(nc) {
            let nrows = nc.min(rows - i0);
            for (block, p0) in (0..k).step_by(kc).enumerate() {
                let kl = kc.min(k - p0);
                // `gemm`'s threshold: less work than this runs on one thread.
                let parallel = threads > 1 && nrows * n * kl >= THREADING_THRESHOLD;
                with_buffer(&PACK_A, nrows.next_multiple_of(tile_nr) * kl, |pa| {
                    self.pack_a(pa, (i0, nrows), (p0, kl), parallel);
                    let pa: &[f32] = pa;
                    let columns = |j0: usize| {
                        let ncols = mc.min(n - j0);
                        with_buffer(&PACK_B, ncols.next_multiple_of(tile_mr) * kl, |pb| {
                            self.pack_b(pb, p0, kl, j0, ncols);
                            // SAFETY: `tiles`' contract: `out` is `dst`, rows x n, and
                            // the calls of one block of K write disjoint columns.
                            unsafe {
                                tiles(
                                    &self.kernels,
                                    &out,
                                    n,
                                    (pa, pb),
                                    (i0, nrows),
                                    (j0, ncols),
                                    kl,
                                    block,
                                )
                            };
                        });
                    };
                    if parallel && n > mc {
                        (0..n).into_par_iter().step_by(mc).for_each(columns);
                    } else {
                        (0..n).step_by(mc).for_each(columns);
                    }
                });
            }
        }
    }

    /// Rows `i0..i0 + nrows`, K `p0..p0 + kl` of `a` into panels of `NR` rows: element
    /// `[i0 + q * NR + r, p0 + p]` at `(q * kl + p) * NR + r` (`gemm`'s packed rhs); the
    /// panels in parallel when `parallel`.
    fn pack_a(
        &self,
        pa: &mut [f32],
        (i0, nrows): (usize, usize),
        (p0, kl): (usize, usize),
        parallel: bool,
    ) {
        let tile_nr = self.kernels.nr;
        let panel = |(q, panel): (usize, &mut [f32])| {
            let r0 = q * tile_nr;
            let nr = tile_nr.min(nrows - r0);
            with_buffer(&ROW, kl, |row| {
                for r in 0..nr {
                    self.a.row(i0 + r0 + r, p0, row);
                    for (p, &v) in row.iter().enumerate() {
                        panel[p * tile_nr + r] = v;
                    }
                }
            });
            // Rows past `nrows` are never read (a micro-kernel of fewer columns), but
            // are zeros so that nothing uninitialised is ever copied.
            for r in nr..tile_nr {
                (0..kl).for_each(|p| panel[p * tile_nr + r] = 0.0);
            }
        };
        if parallel {
            pa.par_chunks_mut(kl * tile_nr).enumerate().for_each(panel);
        } else {
            pa.chunks_mut(kl * tile_nr).enumerate().for_each(panel);
        }
    }

    /// K `p0..p0 + kl`, columns `j0..j0 + ncols` of `b` into panels of `MR` columns:
    /// element `[p0 + p, j0 + q * MR + c]` at `(q * kl + p) * MR + c`, zeros past
    /// `ncols` (`gemm`'s packed lhs).
    fn pack_b(&self, pb: &mut [f32], p0: usize, kl: usize, j0: usize, ncols: usize) {
        let tile_mr = self.kernels.mr;
        let width = ncols.next_multiple_of(tile_mr);
        with_buffer(&ROW, width, |row| {
            row[ncols..].fill(0.0);
            for p in 0..kl {
                self.b.row(p0 + p, j0, &mut row[..ncols]);
                for (q, chunk) in row.chunks_exact(tile_mr).enumerate() {
                    pb[(q * kl + p) * tile_mr..][..tile_mr].copy_from_slice(chunk);
                }
            }
        });
    }
}

/// The micro-kernel calls of one block: rows `i0..i0 + nrows` (packed in `pa`) by
/// columns `j0..j0 + ncols` (packed in `pb`) over `kl` of K, the `block`-th block of
/// K: the first writes the sums, the others add them to the destination.
///
/// # Safety
/// `out` must point to the `rows x n` row-major destination with rows `i0..i0 + nrows`
/// and columns `j0..j0 + ncols` inside it, not accessed by anyone else during the call;
/// `pa` and `pb` packed by [`Packed::pack_a`] and [`Packed::pack_b`] with these extents;
/// the host runs `kernels`' tier ([`Packed::new`] took them from
/// [`ProductTier::current`]).
#[allow(clippy::too_many_arguments)]
unsafe fn tiles(
    kernels: &F32Kernels,
    out: &DstPtr,
    n: usize,
    (pa, pb): (&[f32], &[f32]),
    (i0, nrows): (usize, usize),
    (j0, ncols): (usize, usize),
    kl: usize,
    block: usize,
) {
    let F32Kernels {
        lanes,
        mr: tile_mr,
        nr: tile_nr,
        ukr,
    } = *kernels;
    // 0: dst = beta * sum; 1: dst = beta * sum + dst (beta = 1, alpha unused).
    let status = u8::from(block > 0);
    for q in 0..nrows.div_ceil(tile_nr) {
        let nr = tile_nr.min(nrows - q * tile_nr);
        let a_panel = pa[q * kl * tile_nr..].as_ptr();
        for c in 0..ncols.div_ceil(tile_mr) {
            let mr = tile_mr.min(ncols - c * tile_mr);
            let b_panel = pb[c * kl * tile_mr..].as_ptr();
            let next = pb[((c + 1) * kl * tile_mr).min(pb.len() - 1)..].as_ptr();
            let d = out
                .get()
                .wrapping_add((i0 + q * tile_nr) * n + j0 + c * tile_mr);
            // SAFETY: the kernel reads `kl` steps of MR floats from `b_panel` (the
            // panel is kl * MR, zero-padded) and of `nr` floats at stride NR from
            // `a_panel` (kl * NR); `next` is only a prefetch hint. It writes the `mr`
            // columns (unit stride) of `nr` rows (stride n) at `d`, inside the
            // caller's rows and columns. The host runs the kernels' tier.
            unsafe {
                ukr[mr.div_ceil(lanes) - 1][nr - 1](
                    mr,
                    nr,
                    kl,
                    d,
                    b_panel,
                    a_panel,
                    n as isize,
                    1,
                    tile_mr as isize,
                    tile_nr as isize,
                    1,
                    1.0,
                    1.0,
                    status,
                    false,
                    false,
                    false,
                    next,
                )
            };
        }
    }
}

/// `gemm`'s block of K for a product of `rows x n` over `k` (its column-major view:
/// `n` by `rows`): `kernel_params`, or below 65 x 65 the first 512 of K.
fn kc(rows: usize, n: usize, k: usize, kernels: &F32Kernels) -> usize {
    if n <= 64 && rows <= 64 {
        k.min(512)
    } else {
        kernel_params(n, rows, k, kernels.mr, kernels.nr, 4).kc
    }
}

/// The destination, shared by the tasks of one block of K (disjoint columns).
struct DstPtr(*mut f32);

impl DstPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

// SAFETY: the tasks of one block of K write disjoint ranges of columns (`Packed::run`),
// and the blocks of K run one after another; the pointer does not outlive `run`.
unsafe impl Sync for DstPtr {}

thread_local! {
    /// Packing buffers of this thread, kept for the next product.
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `f` on `len` floats of this thread's buffer `cell`, or of a fresh one where the
/// buffer is in use (a rayon task stolen while the thread waits inside another).
fn with_buffer<R>(
    cell: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0.0);
            }
            f(&mut v[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// A half operand's contiguous f32 copy, a buffer of the host cache (back there when
/// dropped), and the view that reads it in the operand's place.
pub(crate) struct Widened {
    pub(crate) array: HostArray,
    pub(crate) view: View,
}

/// Elements of the copy one parallel chunk fills: as many whole rows of the kept
/// extents as fit in this many (one row when a row is longer), 256 KiB of f32, enough to
/// amortise a task and to give every thread several. A constant, so the chunks depend on
/// shapes only.
const WIDEN_CHUNK: usize = 1 << 16;

impl Widened {
    /// The f32 copy of `a` read through `view`, each element through the prologue
    /// `steps`, when `a` is f16 or bf16 or there are steps; else `None` (the operand is
    /// read in place).
    pub(crate) fn of(
        a: &HostArray,
        view: &View,
        steps: &[Prologue],
    ) -> Result<Option<Widened>, AllocError> {
        Ok(match a.storage() {
            Storage::F16(v) => Some(widen(v, view, (steps, DType::F16))?),
            Storage::BF16(v) => Some(widen(v, view, (steps, DType::BF16))?),
            Storage::F32(v) if !steps.is_empty() => Some(widen(v, view, (steps, DType::F32))?),
            _ => None,
        })
    }
}

/// A contiguous f32 copy of what `view` reads from `src`: an axis of stride 0 (a
/// broadcast) keeps one position in the copy and stride 0 in the new view, so a
/// broadcast batch is widened once. The copy is a host-cache buffer (a steady loop of
/// evaluations reuses it); its size follows the user's shapes, so running out of memory
/// for it is an error, not an abort. Its rows (of the last axis' kept extent) are filled
/// in parallel, in chunks of whole rows fixed by the shape ([`WIDEN_CHUNK`]); every
/// element is written, so a recycled buffer's old contents never show.
fn widen<H: Half>(
    src: &[H],
    view: &View,
    prologue: (&[Prologue], DType),
) -> Result<Widened, AllocError> {
    let dims = view.shape.dims();
    let r = dims.len();
    let kept: Vec<usize> = dims
        .iter()
        .zip(&view.strides)
        .map(|(&d, &s)| if s == 0 { d.min(1) } else { d })
        .collect();
    let total: usize = kept.iter().product();
    // Row-major strides over the kept extents; 0 where the view broadcasts.
    let mut strides = vec![0isize; r];
    let mut step = 1isize;
    for a in (0..r).rev() {
        if view.strides[a] != 0 {
            strides[a] = step;
            step *= kept[a] as isize;
        }
    }
    let mut array = host_cache().array(DType::F32, Shape::new([total]))?;
    // Rank >= 2 (`check_args`), so there is a last axis; `total > 0` makes `row > 0`.
    let (row, col_stride) = (kept[r - 1], view.strides[r - 1]);
    if let (Storage::F32(data), true) = (array.storage_mut(), total > 0) {
        let rows_per_chunk = (WIDEN_CHUNK / row).max(1);
        let outer = &kept[..r - 1];
        data.par_chunks_mut(rows_per_chunk * row)
            .enumerate()
            .for_each(|(ci, chunk)| {
                for (i, dst) in chunk.chunks_exact_mut(row).enumerate() {
                    // The source offset of kept row `first + i`'s first element.
                    let mut q = ci * rows_per_chunk + i;
                    let mut off = view.offset;
                    for a in (0..r - 1).rev() {
                        off += (q % outer[a]) as isize * view.strides[a];
                        q /= outer[a];
                    }
                    // In bounds: `check_args` bounded the view's span inside `src`
                    // (indexing checks it again; out of bounds would be a bug).
                    if col_stride == 1 {
                        let start = off as usize;
                        H::to_f32s(&src[start..start + row], dst);
                    } else {
                        for (j, d) in dst.iter_mut().enumerate() {
                            *d = src[(off + j as isize * col_stride) as usize].to_f32();
                        }
                    }
                    if !prologue.0.is_empty() {
                        apply_prologue(dst, prologue);
                    }
                }
            });
    }
    Ok(Widened {
        array,
        view: View {
            shape: view.shape.clone(),
            strides,
            offset: 0,
        },
    })
}

/// The types an operand copy reads, widened to f32 one element or a contiguous run at a
/// time (the latter through the kernels' wide load routines, see [`widen_run`], else
/// `half`'s slice conversion).
trait Half: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    fn to_f32s(src: &[Self], dst: &mut [f32]);
}

impl Half for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

/// `src` (the bits of f16 or bf16 elements, by `dtype`) widened into `dst` by the
/// kernels' wide load routine (AVX-512 or AVX2 with F16C), when the process uses one;
/// `false` otherwise.
/// Exact conversions, so the bits are those of `half`'s. `half` converts bf16 one
/// element at a time: its slice conversion made a 2048^3 bf16 product 2.3% slower than
/// f32, against 1% for f16 (F16C), all of it the copies.
fn widen_run(dtype: DType, src: &[u16], dst: &mut [f32]) -> bool {
    let Some(tier) = ndfuse_codegen_cpu::wide::tier() else {
        return false;
    };
    // SAFETY: `u16` is plain data without padding, of alignment at least `u8`'s: the
    // `2 * src.len()` bytes at `src` are initialised and live as long as `src`.
    let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 2 * src.len()) };
    ndfuse_codegen_cpu::wide::load(dtype, tier, bytes, dst)
}

impl Half for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        if !widen_run(DType::F16, src.reinterpret_cast(), dst) {
            src.convert_to_f32_slice(dst);
        }
    }
}

impl Half for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        if !widen_run(DType::BF16, src.reinterpret_cast(), dst) {
            src.convert_to_f32_slice(dst);
        }
    }
}

/// Applies prologue `steps` to `row` (values of `dtype`, held in f32), in place: each
/// step's result rounded to its dtype, as the graph's own op rounds it (see
/// `ndfuse_ir::Prologue`: f32 arithmetic, then a rounding to f16 or bf16, gives the
/// reference's bits). Runs of 256 go through `half`'s slice conversions.
fn apply_prologue(row: &mut [f32], (steps, mut dtype): (&[Prologue], DType)) {
    fn round(row: &mut [f32], dtype: DType) {
        for run in row.chunks_mut(256) {
            match dtype {
                DType::F16 => {
                    let mut h = [half::f16::ZERO; 256];
                    h[..run.len()].convert_from_f32_slice(run);
                    h[..run.len()].convert_to_f32_slice(run);
                }
                DType::BF16 => {
                    let mut h = [half::bf16::ZERO; 256];
                    h[..run.len()].convert_from_f32_slice(run);
                    h[..run.len()].convert_to_f32_slice(run);
                }
                _ => {}
            }
        }
    }
    for step in steps {
        match *step {
            Prologue::Cast(to) => {
                dtype = to;
                round(row, dtype);
            }
            Prologue::Mul(c) => {
                let c = c.to_f64() as f32;
                row.iter_mut().for_each(|v| *v *= c);
                round(row, dtype);
            }
            Prologue::Div(c) => {
                let c = c.to_f64() as f32;
                row.iter_mut().for_each(|v| *v /= c);
                round(row, dtype);
            }
        }
    }
}
