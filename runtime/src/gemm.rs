//! Matrix products of contraction kernels on the CPU: the GEMM that fills a kernel's
//! product (the `gemm` crate for floats, a plain loop for integers), a few blocks of rows
//! at a time, each followed at once by the JIT-compiled epilogue over exactly their
//! positions, so they are still in cache when the epilogue reads them.
//!
//! The work is cut into *units*, one per (batch position, group of whole blocks of
//! `block_rows` rows of M, at least the CPU target's `gemm_unit_rows`: one GEMM call,
//! whose packing of the rhs needs that many rows to pay off), in row-major order of the
//! domain. When there
//! are at least as many units as threads, units run batch-parallel: each unit's GEMM on
//! one thread, then at once on the same thread the epilogue over the unit's positions,
//! the units' epilogues running concurrently ([`CompiledKernel::run_units`]); otherwise
//! units run one after another, each GEMM splitting its rows and columns over the threads
//! and then the epilogue over the unit's blocks in parallel. An identity epilogue (a bare
//! product) runs no epilogue: the GEMM writes straight into the output, as one GEMM per
//! batch position over all its rows where that gives the units' bits (`whole_rows`).
//! Either way a product element is one sequence of multiply-adds over K in an order the
//! `gemm` crate fixes from shapes and strides (it blocks K but never splits it across
//! threads: its threads share out tiles of M x N, and the K blocks of a tile run in
//! order), so results are the same bits whatever the thread count (tested below and in
//! tests/tests/matmul_cpu.rs).
//!
//! Operands: f32 and f64 are read in place through their views' strides (transposes,
//! slices, broadcast batch axes: no copy). An f32 product with an f16 or bf16 operand,
//! or an operand with prologue steps (`ndfuse_ir::Prologue`: `(q * 0.125) @ k`,
//! `cast(x, f16) @ w`), runs on the packed GEMM (`gemm_packed`): `gemm`'s own
//! micro-kernels over panels packed there, each element converted and put through its
//! steps as it is packed, with the bits `gemm` gives the same values in f32. Where that
//! GEMM declines (shapes on which `gemm` takes another road), such operands are copied
//! once into contiguous f32 (O(MK + KN) work against the product's O(MNK)), then
//! multiplied in f32. The copies are buffers of the host cache, so a steady loop of
//! evaluations reuses them (no fresh pages after the first), and are filled in
//! parallel in chunks of rows fixed by the shapes alone (exact conversions: the bits
//! depend on nothing else anyway).
//! i32 and i64 use a simple loop with wrapping arithmetic: correct, not fast.

use crate::error::RuntimeError;
use crate::gemm_packed::{Elements, Packed, Source, Widened};
use crate::gemm_tier::{self, ProductTier, TierFloat};
use crate::gemv;
use gemm::Parallelism;
use ndfuse_codegen_cpu::{CodegenError, CompiledKernel};
use ndfuse_ir::{Contraction, DType, Expr, HostArray, Kernel, Prologue, Storage, View};
use rayon::prelude::*;
use std::ops::Range;

/// Runs contraction kernel `kernel` (whose contraction is `c`) with `compiled`, its
/// epilogue, into `outs`; `args` are the kernel's other inputs, in order. Runs on the
/// current rayon pool. An epilogue with one output of the product's dtype and length
/// (`gelu(x @ w + b)`) has the GEMM fill that output and rewrites it in place:
/// `product` is left untouched, as for an identity epilogue.
///
/// An identity epilogue (the body stores the product unchanged, see [`is_identity`]) has
/// the GEMM write straight into the one output: `product` is left untouched (a fresh
/// scratch buffer's pages are never faulted in), and no epilogue runs. Otherwise
/// `product` (the kernel's last input, scratch of `c.dtype` and `domain.numel()`
/// elements) is filled unit by unit, each unit followed at once, on the same thread, by
/// the epilogue over its positions.
pub(crate) fn run_contraction(
    kernel: &Kernel,
    c: &Contraction,
    compiled: &CompiledKernel,
    args: &[&HostArray],
    product: &mut HostArray,
    outs: &mut [&mut HostArray],
) -> Result<(), RuntimeError> {
    check_args(kernel, c, args)?;
    if kernel.domain.numel() == 0 {
        return Ok(());
    }
    let units = Units::new(c, compiled);
    // Operands converted as the GEMM packs them where the bits allow (no copies), else
    // f32 copies of those that need one. Owned here, so the copies go back to the host
    // cache when the run returns.
    let converted = Converted::of(c, args, &units);
    let widened = match converted {
        Some(_) => (None, None),
        None => (
            Widened::of(args[c.lhs], &c.lhs_view, &c.lhs_prologue)?,
            Widened::of(args[c.rhs], &c.rhs_view, &c.rhs_prologue)?,
        ),
    };
    let ops = match converted {
        Some(conv) => Ops::Converted(conv),
        None => Ops::Gemm(Operands::of(
            c,
            (args[c.lhs], widened.0.as_ref()),
            (args[c.rhs], widened.1.as_ref()),
        )?),
    };
    // Not reached: `check_product` checked the dtype.
    let bad = || {
        bad_args(
            kernel,
            "the GEMM's destination is not of the contraction's dtype",
        )
    };
    if is_identity(kernel, c) {
        let [out] = outs else {
            return Err(bad_args(kernel, "an identity epilogue has one output"));
        };
        check_product(kernel, c, out, "output 0")?;
        return match &ops {
            Ops::Converted(conv) => units.fill_only(conv, f32::base(out).ok_or_else(bad)?),
            Ops::Gemm(Operands::F32(l, r)) => {
                units.fill_only(&(l, r), f32::base(out).ok_or_else(bad)?)
            }
            Ops::Gemm(Operands::F64(l, r)) => {
                units.fill_only(&(l, r), f64::base(out).ok_or_else(bad)?)
            }
            Ops::Gemm(Operands::I32(l, r)) => {
                units.fill_only(&(l, r), i32::base(out).ok_or_else(bad)?)
            }
            Ops::Gemm(Operands::I64(l, r)) => {
                units.fill_only(&(l, r), i64::base(out).ok_or_else(bad)?)
            }
        };
    }
    check_loads(kernel, c)?;
    // One output of the product's dtype and length: the GEMM fills it and the
    // epilogue rewrites it in place (no scratch the size of the output).
    let in_place = matches!(outs, [out] if out.dtype() == c.dtype
        && out.len() == kernel.domain.numel());
    if let (true, [out]) = (in_place, &*outs) {
        check_product(kernel, c, out, "output 0")?;
    } else {
        check_product(kernel, c, product, "the product scratch")?;
    }
    match &ops {
        Ops::Converted(conv) => units.run(conv, in_place, product, args, outs, &bad),
        Ops::Gemm(Operands::F32(l, r)) => units.run(&(l, r), in_place, product, args, outs, &bad),
        Ops::Gemm(Operands::F64(l, r)) => units.run(&(l, r), in_place, product, args, outs, &bad),
        Ops::Gemm(Operands::I32(l, r)) => units.run(&(l, r), in_place, product, args, outs, &bad),
        Ops::Gemm(Operands::I64(l, r)) => units.run(&(l, r), in_place, product, args, outs, &bad),
    }
}

/// How the blocks of one product are filled.
enum Ops<'a> {
    /// The `gemm` crate over the operands in place or their f32 copies.
    Gemm(Operands<'a>),
    /// The packed GEMM, converting the operands as it packs them.
    Converted(Converted<'a>),
}

/// What fills a block of the product (`Units::fill`).
trait Fill<T>: Sync {
    /// Fills `dst` (`block.rows * block.n` elements, row-major) with the block's rows
    /// of the product; `block.k > 0`.
    fn fill(&self, block: Block, dst: &mut [T], par: Parallelism);
}

impl<T: Accum> Fill<T> for (&Mat<'_, T>, &Mat<'_, T>) {
    fn fill(&self, block: Block, dst: &mut [T], par: Parallelism) {
        T::fill(self.0, self.1, block, dst, par);
    }
}

/// An f32 product's operands read by the packed GEMM (`gemm_packed`), each element
/// converted to f32 and put through its prologue steps as it is packed: f16 and bf16
/// operands and operands with steps, beside a plain f32 one read in place.
struct Converted<'a> {
    lhs: (Elements<'a>, &'a View, &'a [Prologue]),
    rhs: (Elements<'a>, &'a View, &'a [Prologue]),
}

impl<'a> Converted<'a> {
    /// The operands of `c` for the packed GEMM: an f32 product with something to
    /// convert, every block of which `Packed::new` takes (so the bits are `gemm`'s on
    /// f32 copies); else `None`.
    fn of(c: &'a Contraction, args: &[&'a HostArray], units: &Units<'_>) -> Option<Self> {
        let elements = |a: &'a HostArray| match a.storage() {
            Storage::F32(v) => Some(Elements::F32(v)),
            Storage::F16(v) => Some(Elements::F16(v)),
            Storage::BF16(v) => Some(Elements::BF16(v)),
            _ => None,
        };
        if c.dtype != DType::F32 {
            return None;
        }
        let conv = Converted {
            lhs: (elements(args[c.lhs])?, &c.lhs_view, &c.lhs_prologue),
            rhs: (elements(args[c.rhs])?, &c.rhs_view, &c.rhs_prologue),
        };
        let plain = |(e, _, steps): (Elements<'_>, &View, &[Prologue])| {
            matches!(e, Elements::F32(_)) && steps.is_empty()
        };
        if plain(conv.lhs) && plain(conv.rhs) {
            return None;
        }
        (0..units.units)
            .map(|u| units.block(u).0)
            .all(|b| b.k == 0 || conv.packed(b).is_some())
            .then_some(conv)
    }

    /// The packed product of block `b`, where `Packed::new` takes it.
    fn packed(&self, b: Block) -> Option<Packed<'a>> {
        let source = |(data, view, steps): (Elements<'a>, &View, &'a [Prologue]), row0: usize| {
            let (rs, cs) = matrix_strides(view);
            Source {
                data,
                off: batch_offset(view, b.batch) + row0 as isize * rs,
                rs,
                cs,
                steps,
            }
        };
        Packed::new(
            source(self.lhs, b.row0),
            source(self.rhs, 0),
            (b.rows, b.n, b.k),
        )
    }
}

impl Fill<f32> for Converted<'_> {
    fn fill(&self, b: Block, dst: &mut [f32], par: Parallelism) {
        let threads = match par {
            Parallelism::Rayon(t) => t.max(1),
            _ => 1,
        };
        self.packed(b)
            .expect("Converted::of checked that the packed GEMM takes every block")
            .run(dst, threads);
    }
}

/// Whether the epilogue of `kernel` is the identity: no reduce axes, a body of one
/// load of the product through its contiguous view, stored into the one output, of the
/// product's dtype and `domain.numel()` elements. Then the output holds exactly the
/// product, and the GEMM can write it there. From the kernel description alone.
pub(crate) fn is_identity(kernel: &Kernel, c: &Contraction) -> bool {
    let numel = kernel.domain.numel();
    let one_load = match &kernel.body[..] {
        [ins] => {
            ins.dtype == c.dtype
                && matches!(&ins.expr, Expr::Load { input, view }
                    if *input == c.product && *view == View::contiguous(kernel.domain.clone()))
        }
        _ => false,
    };
    let one_store = match (&kernel.stores[..], &kernel.outputs[..]) {
        ([store], [out]) => {
            store.value.0 == 0 && store.output == 0 && out.dtype == c.dtype && out.len == numel
        }
        _ => false,
    };
    kernel.reduce_axes.is_empty() && one_load && one_store
}

/// The kernel-argument error for `kernel`.
fn bad_args(kernel: &Kernel, detail: impl Into<String>) -> RuntimeError {
    RuntimeError::Codegen(CodegenError::Args {
        kernel: kernel.name.clone(),
        detail: detail.into(),
    })
}

/// Checks, before any raw call, what the GEMM and the epilogue's pointers rely on beyond
/// [`Kernel::check`] (which `ndfuse_codegen_cpu::supports` ran before the kernel was
/// compiled: operand views inside their kernel buffers, product last with
/// `domain.numel()` elements of `c.dtype`, views of the domain's shape): that the arrays
/// bound are those buffers (one per input but the product, dtype and length), that each
/// operand view reads inside its actual array (again, cheaply, so nothing here rests on
/// another crate's check alone), and that the body loads the product only through its
/// contiguous view (so the epilogue of one block reads that block only).
fn check_args(kernel: &Kernel, c: &Contraction, args: &[&HostArray]) -> Result<(), RuntimeError> {
    let bad = |detail: String| bad_args(kernel, detail);
    if args.len() + 1 != kernel.inputs.len() || c.product != args.len() {
        return Err(bad(format!(
            "{} arrays bound for {} inputs (all but the product in{})",
            args.len(),
            kernel.inputs.len(),
            c.product
        )));
    }
    for (k, (a, b)) in args.iter().zip(&kernel.inputs).enumerate() {
        if a.dtype() != b.dtype || a.len() != b.len {
            return Err(bad(format!(
                "input {k} is {}[{}], the kernel needs {}[{}]",
                a.dtype(),
                a.len(),
                b.dtype,
                b.len
            )));
        }
    }
    for (what, input, view) in [("lhs", c.lhs, &c.lhs_view), ("rhs", c.rhs, &c.rhs_view)] {
        let len = args.get(input).map_or(0, |a| a.len());
        if view.strides.len() != view.shape.rank() || view.shape.rank() < 2 {
            return Err(bad(format!("the {what} view {view} is malformed")));
        }
        if let Some((lo, hi)) = view.span() {
            if lo < 0 || hi >= len as i128 {
                return Err(bad(format!(
                    "the {what} view reads offsets {lo}..={hi} of in{input} ({len} elements)"
                )));
            }
        }
    }
    Ok(())
}

/// Checks that the body loads the product only through its contiguous view, so that the
/// epilogue over one unit's positions reads that unit's product elements only.
fn check_loads(kernel: &Kernel, c: &Contraction) -> Result<(), RuntimeError> {
    if !c.read_in_place(&kernel.domain, &kernel.body) {
        return Err(bad_args(
            kernel,
            "the body loads the product through a non-contiguous view",
        ));
    }
    Ok(())
}

/// Checks that `array` (`what`), which the GEMM fills, is `domain.numel()` elements of
/// `c.dtype`: the units' slices of it rely on that.
fn check_product(
    kernel: &Kernel,
    c: &Contraction,
    array: &HostArray,
    what: &str,
) -> Result<(), RuntimeError> {
    if array.dtype() != c.dtype || array.len() != kernel.domain.numel() {
        return Err(bad_args(
            kernel,
            format!(
                "{what} is {}[{}], the product needs {}[{}]",
                array.dtype(),
                array.len(),
                c.dtype,
                kernel.domain.numel()
            ),
        ));
    }
    Ok(())
}

/// One operand of the product: its elements and the view that reads them, of shape
/// `[batch..., rows, cols]`. Every offset the view reaches lies in `data` (checked by
/// `check_args` for an operand read in place; by construction for a widened copy).
#[derive(Debug)]
struct Mat<'a, T> {
    data: &'a [T],
    view: View,
}

impl<T> Mat<'_, T> {
    /// See [`batch_offset`].
    fn batch_offset(&self, batch: usize) -> isize {
        batch_offset(&self.view, batch)
    }

    /// See [`matrix_strides`].
    fn strides(&self) -> (isize, isize) {
        matrix_strides(&self.view)
    }
}

/// Offset of element `[b..., 0, 0]` of `view` (rank >= 2) for flat batch position
/// `batch` (row-major over the batch axes; a broadcast batch axis has stride 0).
fn batch_offset(view: &View, mut batch: usize) -> isize {
    let d = view.shape.dims();
    let r = d.len();
    let mut off = view.offset;
    for a in (0..r - 2).rev() {
        off += (batch % d[a]) as isize * view.strides[a];
        batch /= d[a];
    }
    off
}

/// Strides of the matrix axes of `view` (rank >= 2): (rows, columns).
fn matrix_strides(view: &View) -> (isize, isize) {
    let s = &view.strides;
    (s[s.len() - 2], s[s.len() - 1])
}

/// The operands in the dtype the product accumulates in.
#[derive(Debug)]
enum Operands<'a> {
    F32(Mat<'a, f32>, Mat<'a, f32>),
    F64(Mat<'a, f64>, Mat<'a, f64>),
    I32(Mat<'a, i32>, Mat<'a, i32>),
    I64(Mat<'a, i64>, Mat<'a, i64>),
}

impl<'a> Operands<'a> {
    /// The operands of `c` from their arrays, each with its widened f32 copy when it has
    /// one ([`Widened::of`]): the copy when there is one, else the array as it is.
    fn of(
        c: &Contraction,
        (lhs, lw): (&'a HostArray, Option<&'a Widened>),
        (rhs, rw): (&'a HostArray, Option<&'a Widened>),
    ) -> Result<Self, RuntimeError> {
        let mat = |a: &'a HostArray, view: &View, w: Option<&'a Widened>| -> Option<Operand<'a>> {
            let (storage, view) = match w {
                Some(w) => (w.array.storage(), &w.view),
                None => (a.storage(), view),
            };
            let view = view.clone();
            Some(match storage {
                Storage::F32(data) => Operand::F32(Mat { data, view }),
                Storage::F64(data) => Operand::F64(Mat { data, view }),
                Storage::I32(data) => Operand::I32(Mat { data, view }),
                Storage::I64(data) => Operand::I64(Mat { data, view }),
                // Half operands always come widened: `Widened::of`.
                Storage::F16(_) | Storage::BF16(_) | Storage::Bool(_) => return None,
            })
        };
        let pair = (mat(lhs, &c.lhs_view, lw), mat(rhs, &c.rhs_view, rw));
        Ok(match pair {
            (Some(Operand::F32(l)), Some(Operand::F32(r))) if c.dtype == DType::F32 => {
                Operands::F32(l, r)
            }
            (Some(Operand::F64(l)), Some(Operand::F64(r))) if c.dtype == DType::F64 => {
                Operands::F64(l, r)
            }
            (Some(Operand::I32(l)), Some(Operand::I32(r))) if c.dtype == DType::I32 => {
                Operands::I32(l, r)
            }
            (Some(Operand::I64(l)), Some(Operand::I64(r))) if c.dtype == DType::I64 => {
                Operands::I64(l, r)
            }
            _ => {
                return Err(RuntimeError::Codegen(CodegenError::Args {
                    kernel: format!("matmul of {} @ {}", lhs.dtype(), rhs.dtype()),
                    detail: format!("operands that do not accumulate in {}", c.dtype),
                }))
            }
        })
    }
}

/// One operand before pairing.
enum Operand<'a> {
    F32(Mat<'a, f32>),
    F64(Mat<'a, f64>),
    I32(Mat<'a, i32>),
    I64(Mat<'a, i64>),
}

/// One block of the product: rows `row0..row0 + rows` of M of batch position `batch`.
#[derive(Clone, Copy, Debug)]
struct Block {
    batch: usize,
    row0: usize,
    rows: usize,
    n: usize,
    k: usize,
}

/// An element type the product accumulates in, and how a block of it is filled.
trait Accum: Copy + Send + Sync + Default + 'static {
    /// Fills `dst` (`block.rows * block.n` elements, row-major) with the product of the
    /// block's rows of `lhs` and all of `rhs`; `k > 0`.
    fn fill(
        lhs: &Mat<'_, Self>,
        rhs: &Mat<'_, Self>,
        block: Block,
        dst: &mut [Self],
        par: Parallelism,
    );
    /// The storage pointer of `product` when it holds this type.
    fn base(product: &mut HostArray) -> Option<ProductPtr<Self>>;
}

/// [`Accum::base`] for one storage variant.
macro_rules! base {
    ($variant:ident) => {
        fn base(product: &mut HostArray) -> Option<ProductPtr<Self>> {
            match product.storage_mut() {
                Storage::$variant(v) => Some(ProductPtr(v.as_mut_ptr())),
                _ => None,
            }
        }
    };
}

/// The `gemm` crate's product for a float type, on the process's tier
/// ([`ProductTier::current`]).
fn gemm_fill<T: Accum + TierFloat>(
    lhs: &Mat<'_, T>,
    rhs: &Mat<'_, T>,
    b: Block,
    dst: &mut [T],
    par: Parallelism,
) {
    let (lrs, lcs) = lhs.strides();
    let (rrs, rcs) = rhs.strides();
    let loff = lhs.batch_offset(b.batch) + b.row0 as isize * lrs;
    let roff = rhs.batch_offset(b.batch);
    assert_eq!(
        dst.len(),
        b.rows * b.n,
        "a block's destination is rows x n (a bug)"
    );
    // SAFETY: `gemm_tier::gemm` (as `gemm::gemm`) reads lhs[i * lrs + l * lcs] for i < rows, l < k and
    // rhs[l * rrs + j * rcs] for l < k, j < n from the pointers given, and writes
    // dst[i * n + j]. Those lhs elements are the positions [batch, row0 + i, l] of the
    // lhs view (row0 + rows <= M, k = K), the rhs ones positions [batch, l, j] of the
    // rhs view (n = N), so their offsets lie in the views' spans, which `check_args`
    // (and `Kernel::check` before it) bounded inside `data`; the pointer offsets below
    // are those of real elements (`wrapping_offset`, so no arithmetic is UB even for a
    // view whose first element is not its lowest). `dst` is an exclusive slice of
    // exactly rows * n elements, row stride n, column stride 1, and does not overlap the
    // operands (a separate allocation). `read_dst` is false, so dst's old contents are
    // never read (alpha is ignored); beta = 1 scales the product. Sizes are non-zero
    // (callers skip empty blocks and K = 0). The conj flags are no-ops for real types.
    unsafe {
        gemm_tier::gemm(
            ProductTier::current(),
            (b.rows, b.n, b.k),
            (dst.as_mut_ptr(), 1, b.n as isize),
            (lhs.data.as_ptr().wrapping_offset(loff), lcs, lrs),
            (rhs.data.as_ptr().wrapping_offset(roff), rcs, rrs),
            T::ONE,
            false,
            par,
        );
    }
}

impl Accum for f32 {
    fn fill(lhs: &Mat<'_, f32>, rhs: &Mat<'_, f32>, b: Block, dst: &mut [f32], par: Parallelism) {
        if !gemv_f32(lhs, rhs, b, dst) {
            gemm_fill(lhs, rhs, b, dst, par);
        }
    }
    base!(F32);
}

/// [`gemv::row_product`] for a product whose left-hand side is one row (the whole
/// product, so no thread count or unit split decides which rows take this path).
fn gemv_f32(lhs: &Mat<'_, f32>, rhs: &Mat<'_, f32>, b: Block, dst: &mut [f32]) -> bool {
    let rows = lhs.view.shape.dims().iter().rev().nth(1).copied();
    if rows != Some(1) || b.rows != 1 {
        return false;
    }
    let (_, lcs) = lhs.strides();
    let (rrs, rcs) = rhs.strides();
    let (Ok(l0), Ok(r0)) = (
        usize::try_from(lhs.batch_offset(b.batch)),
        usize::try_from(rhs.batch_offset(b.batch)),
    ) else {
        return false;
    };
    gemv::row_product(
        (lhs.data, l0, lcs),
        (rhs.data, r0, rrs, rcs),
        (b.k, b.n),
        dst,
    )
}

impl Accum for f64 {
    fn fill(lhs: &Mat<'_, f64>, rhs: &Mat<'_, f64>, b: Block, dst: &mut [f64], par: Parallelism) {
        gemm_fill(lhs, rhs, b, dst, par);
    }
    base!(F64);
}

/// Integer products: a row of the block at a time, `dst[i, :] += lhs[i, l] * rhs[l, :]`
/// over l, wrapping (as the reference and numpy do). Safe indexing; correct, not fast.
macro_rules! int_accum {
    ($t:ty, $variant:ident) => {
        impl Accum for $t {
            base!($variant);

            fn fill(
                lhs: &Mat<'_, $t>,
                rhs: &Mat<'_, $t>,
                b: Block,
                dst: &mut [$t],
                _: Parallelism,
            ) {
                let (lrs, lcs) = lhs.strides();
                let (rrs, rcs) = rhs.strides();
                let (loff, roff) = (lhs.batch_offset(b.batch), rhs.batch_offset(b.batch));
                dst.fill(0);
                for (i, row) in dst.chunks_exact_mut(b.n).enumerate() {
                    let li = loff + (b.row0 + i) as isize * lrs;
                    for l in 0..b.k {
                        let a = lhs.data[(li + l as isize * lcs) as usize];
                        let rl = roff + l as isize * rrs;
                        for (j, d) in row.iter_mut().enumerate() {
                            let y = rhs.data[(rl + j as isize * rcs) as usize];
                            *d = d.wrapping_add(a.wrapping_mul(y));
                        }
                    }
                }
            }
        }
    };
}
int_accum!(i32, I32);
int_accum!(i64, I64);

/// Where the GEMM puts the product for the epilogue: the product scratch (the kernel's
/// last input), or the one output, which the epilogue then rewrites in place
/// ([`CompiledKernel::run_units_in_place`]).
#[derive(Clone, Copy)]
enum Dest<'a> {
    Scratch(&'a HostArray),
    InPlace,
}

/// The storage the GEMM fills (the product scratch, or an identity epilogue's output),
/// shared by the units that fill disjoint ranges of it.
struct ProductPtr<T>(*mut T);

impl<T> ProductPtr<T> {
    /// The base pointer. A method rather than the field, so that a closure captures the
    /// whole (`Sync`) wrapper and not the bare raw pointer.
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the pointer is shared only by the units of one `Units::run` or
// `Units::fill_only`. Each unit makes an exclusive slice of its own range of positions
// (`Units::fill`: units are disjoint ranges of rows, see `Units::block`) and drops it
// before its epilogue runs; the epilogue over a unit's range, run by `run_units` on the
// same worker after that unit's fill, reads only that range of the product (its loads of
// the product are the contiguous view, checked by `check_loads`; in place, it also
// writes only that range, each element after reading it), and in the
// GEMM-parallel order the epilogue of a unit starts only once its GEMM has returned. So
// no element is accessed by two threads at once. The storage outlives the parallel
// loops, which return only when every unit has finished.
unsafe impl<T: Send> Sync for ProductPtr<T> {}

/// Fewest positions of epilogue a worker is handed when a unit's epilogue is split over
/// the threads (see `Units::run`). A 64 x 64 product with an epilogue (an f16 product's
/// rounding, a bias) took 40 µs split in two, of which the epilogue's own work is about
/// 1: the rest was waking the second worker.
const EPILOGUE_PIECE: usize = 1 << 14;

/// The units of one contraction run (see the module docs): a unit is one batch position's
/// group of `group` blocks of `block_rows` rows, filled by one GEMM call.
struct Units<'k> {
    c: &'k Contraction,
    compiled: &'k CompiledKernel,
    /// Blocks per GEMM call.
    group: usize,
    /// Groups per batch position.
    groups: usize,
    /// Batch positions times groups.
    units: usize,
}

impl<'k> Units<'k> {
    /// The units of contraction `c`, whose epilogue is `compiled`.
    fn new(c: &'k Contraction, compiled: &'k CompiledKernel) -> Self {
        let (nbatch, m, _, _) = c.extents();
        // The CPU target's units (`TargetDesc::gemm_unit_rows` says why 512 rows), the
        // ones the plan's note in `ndfuse explain` describes. Shapes only.
        let group =
            ndfuse_passes::plan::gemm_unit_blocks(c.block_rows, &ndfuse_passes::TargetDesc::cpu());
        let groups = m.div_ceil(c.block_rows * group);
        Units {
            c,
            compiled,
            group,
            groups,
            units: nbatch * groups,
        }
    }

    /// Unit `u`'s rows, and its range of row-major positions of the domain.
    fn block(&self, u: usize) -> (Block, Range<usize>) {
        let (_, m, n, k) = self.c.extents();
        let (batch, g) = (u / self.groups, u % self.groups);
        let row0 = g * self.group * self.c.block_rows;
        let rows = (self.group * self.c.block_rows).min(m - row0);
        let start = (batch * m + row0) * n;
        let block = Block {
            batch,
            row0,
            rows,
            n,
            k,
        };
        (block, start..start + rows * n)
    }

    /// Whether units run batch-parallel (each unit's GEMM on one thread): when there are
    /// at least as many units as threads. Otherwise each GEMM spreads over the threads.
    /// Either way the units, and so the bits, are the same.
    fn batch_parallel(&self) -> bool {
        self.units >= rayon::current_num_threads()
    }

    /// Fills unit `u` of the destination whose storage is `base` (the product scratch or
    /// an identity epilogue's output, `numel` elements of `T`, checked by
    /// `check_product`), with the GEMM's threads `par`.
    fn fill<T: Accum>(&self, ops: &impl Fill<T>, base: &ProductPtr<T>, u: usize, par: Parallelism) {
        let (block, range) = self.block(u);
        self.fill_block(ops, base, block, range, par);
    }

    /// Whether a bare product may run as one GEMM per batch position instead of its
    /// units, with the same bits: several units, the last of more than 64 rows, N of 2
    /// or more and K of 3 or more. Then every unit and the whole take `gemm`'s main path
    /// (not its small-product, matrix-vector or outer-product kernels) with the same
    /// block of K (`kernel_params` sets it from K alone there), and its threads never
    /// split K: each element is the same chain of multiply-adds either way.
    fn whole_rows(&self) -> bool {
        let (_, m, n, k) = self.c.extents();
        let unit_rows = self.group * self.c.block_rows;
        let last = m - (self.groups - 1) * unit_rows;
        self.groups > 1 && last > 64 && n >= 2 && k >= 3
    }

    /// Fills `block` of the destination whose storage is `base`, its positions `range`,
    /// with the GEMM's threads `par`.
    fn fill_block<T: Accum>(
        &self,
        ops: &impl Fill<T>,
        base: &ProductPtr<T>,
        block: Block,
        range: Range<usize>,
        par: Parallelism,
    ) {
        // SAFETY: `range` is the block's rows of one batch position (a unit's, or all
        // M): rows <= M - row0, so it ends at or below (batch + 1) * M * N <= numel,
        // the destination's length (`check_product`); blocks filled at once are
        // disjoint units, and no other access touches these elements while the slice
        // lives (see `ProductPtr`: the epilogue over them runs after this returns).
        let dst =
            unsafe { std::slice::from_raw_parts_mut(base.get().add(range.start), range.len()) };
        if block.k == 0 {
            dst.fill(T::default());
        } else {
            ops.fill(block, dst, par);
        }
    }

    /// The GEMM's threads when units run one after another.
    fn gemm_threads() -> Parallelism {
        match rayon::current_num_threads() {
            0 | 1 => Parallelism::None,
            t => Parallelism::Rayon(t),
        }
    }

    /// Fills an identity epilogue's output (`base`) with the product: nothing else runs.
    fn fill_only<T: Accum>(
        &self,
        ops: &impl Fill<T>,
        base: ProductPtr<T>,
    ) -> Result<(), RuntimeError> {
        if self.whole_rows() {
            // One GEMM over each batch position's M rows, spread over the threads: it
            // packs the rhs once where units would each pack all of it (2048^3 f32:
            // 54.8 ms against 60.1 in units of 512 rows, 2-core Xeon, 2026-11-29).
            let (nbatch, m, n, k) = self.c.extents();
            let par = Self::gemm_threads();
            for batch in 0..nbatch {
                let block = Block {
                    batch,
                    row0: 0,
                    rows: m,
                    n,
                    k,
                };
                let start = batch * m * n;
                self.fill_block(ops, &base, block, start..start + m * n, par);
            }
            return Ok(());
        }
        if self.batch_parallel() {
            (0..self.units)
                .into_par_iter()
                .for_each(|u| self.fill(ops, &base, u, Parallelism::None));
        } else {
            let par = Self::gemm_threads();
            for u in 0..self.units {
                self.fill(ops, &base, u, par);
            }
        }
        Ok(())
    }

    /// Fills the product unit by unit (into the scratch `product`, or, `in_place`, into
    /// the one output, which the epilogue then rewrites), each unit followed by the
    /// epilogue over its positions into `outs`: batch-parallel, each unit's GEMM and
    /// then its epilogue on one worker, the units' epilogues running at once
    /// ([`CompiledKernel::run_units`]); or one unit after another, each GEMM spread over
    /// the threads and then the epilogue over its blocks of `block_rows` rows in parallel.
    fn run<T: Accum>(
        &self,
        ops: &impl Fill<T>,
        in_place: bool,
        product: &mut HostArray,
        args: &[&HostArray],
        outs: &mut [&mut HostArray],
        bad: &dyn Fn() -> RuntimeError,
    ) -> Result<(), RuntimeError> {
        // The destination's storage pointer is taken before `product` is reborrowed
        // shared for the epilogue: `Vec::as_mut_ptr` and `Vec::as_ptr` (which the
        // epilogue's argument check uses) never create a reference to the elements, so
        // the GEMM's writes through this pointer and the epilogue's reads of other units
        // do not invalidate each other.
        let base = match (in_place, &mut *outs) {
            (true, [out]) => T::base(out),
            _ => T::base(product),
        }
        .ok_or_else(bad)?;
        let dest = if in_place {
            Dest::InPlace
        } else {
            Dest::Scratch(product)
        };
        let mut inputs: Vec<&HostArray> = args.to_vec();
        if let Dest::Scratch(product) = dest {
            inputs.push(product);
        }
        // The epilogue over `ranges`, each after `before` on the same worker.
        let epilogue =
            |outs: &mut [&mut HostArray],
             ranges: &[Range<usize>],
             before: &(dyn Fn(usize) -> Result<(), RuntimeError> + Sync)| {
                match dest {
                    Dest::Scratch(_) => self.compiled.run_units(&inputs, outs, ranges, before),
                    Dest::InPlace => self.compiled.run_units_in_place(
                        &inputs,
                        outs,
                        (self.c.product, 0),
                        ranges,
                        before,
                    ),
                }
            };
        if self.batch_parallel() {
            let ranges: Vec<Range<usize>> = (0..self.units).map(|u| self.block(u).1).collect();
            epilogue(outs, &ranges, &|u| -> Result<(), RuntimeError> {
                self.fill(ops, &base, u, Parallelism::None);
                Ok(())
            })
        } else {
            let par = Self::gemm_threads();
            let (_, _, n, _) = self.c.extents();
            let step = self.c.block_rows * n;
            for u in 0..self.units {
                self.fill(ops, &base, u, par);
                let range = self.block(u).1;
                // The epilogue is element-wise, so any cut gives the same bits: each
                // block is cut in as many pieces as there are threads (a unit of one
                // block, such as a product of 128 rows, otherwise runs its epilogue on
                // one thread), in multiples of 64 positions, but no piece is smaller
                // than `EPILOGUE_PIECE`: waking a worker costs more than a few
                // thousand positions of epilogue.
                let threads = rayon::current_num_threads().max(1);
                let blocks: Vec<Range<usize>> = range
                    .clone()
                    .step_by(step)
                    .flat_map(|s| {
                        let end = (s + step).min(range.end);
                        let piece = (end - s)
                            .div_ceil(threads)
                            .next_multiple_of(64)
                            .max(EPILOGUE_PIECE);
                        (s..end)
                            .step_by(piece)
                            .map(move |p| p..(p + piece).min(end))
                    })
                    .collect();
                epilogue(outs, &blocks, &|_| Ok(()))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndfuse_ir::Shape;

    /// Deterministic values in [-1, 1) with full mantissas (an LCG's top bits).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
            })
            .collect()
    }

    /// The `gemm` crate gives the same bits with its threads as without: it blocks K but
    /// never splits it across threads, so batch-parallel units (one thread per GEMM) and
    /// a GEMM spread over threads agree, whatever the thread count. Shapes cover the
    /// small-matrix paths, edge tiles, K longer than one K block, and a transposed lhs.
    #[test]
    fn gemm_threads_do_not_change_bits() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .expect("a pool of 4 threads");
        for &(m, n, k, transposed) in &[
            (7, 5, 3, false),
            (65, 65, 65, false),
            (64, 1023, 1023, false),
            (200, 300, 1500, false),
            (129, 257, 700, true),
            (1, 513, 2000, false),
        ] {
            let a = values(m * k, 1);
            let b = values(k * n, 2);
            let (lrs, lcs) = if transposed {
                (1, m as isize)
            } else {
                (k as isize, 1)
            };
            let lhs = Mat {
                data: &a[..],
                view: View {
                    shape: Shape::new([m, k]),
                    strides: vec![lrs, lcs],
                    offset: 0,
                },
            };
            let rhs = Mat {
                data: &b[..],
                view: View::contiguous(Shape::new([k, n])),
            };
            let block = Block {
                batch: 0,
                row0: 0,
                rows: m,
                n,
                k,
            };
            let mut one = vec![0f32; m * n];
            f32::fill(&lhs, &rhs, block, &mut one, Parallelism::None);
            for threads in [2, 4] {
                let mut many = vec![0f32; m * n];
                pool.install(|| {
                    f32::fill(&lhs, &rhs, block, &mut many, Parallelism::Rayon(threads))
                });
                let same = one
                    .iter()
                    .zip(&many)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{m}x{n}x{k}: {threads} gemm threads change the bits");
            }
            // And the product is right: against an f64 sum, within K roundings.
            for (i, row) in one.chunks_exact(n).enumerate().step_by(m.div_ceil(5)) {
                for (j, &got) in row.iter().enumerate().step_by(n.div_ceil(5)) {
                    let (mut want, mut scale) = (0f64, 0f64);
                    for l in 0..k {
                        let x = f64::from(a[(i as isize * lrs + l as isize * lcs) as usize]);
                        let y = f64::from(b[l * n + j]);
                        want += x * y;
                        scale += (x * y).abs();
                    }
                    let tol = scale * k as f64 * f64::from(f32::EPSILON);
                    assert!(
                        (f64::from(got) - want).abs() <= tol,
                        "{m}x{n}x{k} [{i},{j}]"
                    );
                }
            }
        }
    }
}
