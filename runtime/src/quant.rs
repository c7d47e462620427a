//! [`Op::QuantMatMul`] on the CPU: `x @ w^T` with `w` in llama.cpp's block formats
//! (`ndfuse_ir::quant`), read where it is.
//!
//! - **Few rows of `x`** (a decode step's matrix-vector products, up to [`SMALL_M`]):
//!   each task takes [`ROWS_PER_TASK`] rows of `w` and, block by block, widens the 32
//!   quantised values to f32 and accumulates `d * (x * q)` in 32 lanes a row of `x`; the
//!   offset term (Q4_1's minimum `m`, Q4_0's `-8 d`) is `offset * sum(x over the block)`,
//!   the block sums of `x` taken once. Memory traffic is the blocks' bytes: 4.5 (Q4_1)
//!   or 8.5 (Q8_0) bits a weight instead of 32, the floor of a decode step.
//! - **More rows** (a prefill): each task dequantises [`ROWS_PER_GEMM`] rows of `w` to f32
//!   (a bounded buffer, 64 rows, never the whole matrix) and multiplies them with `x` on
//!   the products' GEMM kernels.
//!
//! The matrix-vector loops run on the products' tier (`ProductTier`): AVX-512F or AVX2
//! and FMA intrinsics (`quant_x86.rs`), or a portable loop on hosts without them. Work is split
//! by rows of `w` in pieces fixed by the shape, each result element computed by one task
//! in one order: the same bits on every thread count.

use crate::alloc::host_cache;
use crate::error::RuntimeError;
use crate::gemm_tier::{self, ProductTier};
use crate::quant_x86::{format_of, scale, Format, Rows};
use gemm::Parallelism;
use ndfuse_ir::quant::{QuantSpec, BLOCK};
use ndfuse_ir::{DType, HostArray, Node, Storage};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Rows of `x` up to which the blocks are dotted directly.
pub const SMALL_M: usize = 4;
/// Rows of `w` a matrix-vector task takes.
pub const ROWS_PER_TASK: usize = 32;
/// Rows of `w` a prefill task dequantises and multiplies at once.
pub const ROWS_PER_GEMM: usize = 64;

/// f16 bits to f32, by table (llama.cpp's way: one load per scale).
fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    })
}

/// `x @ w^T` for [`ndfuse_ir::Op::QuantMatMul`] with `spec`, into a result of `node`'s
/// type (f32 `[..., n]`). The operands are the types the op infers (checked by the
/// caller).
pub(crate) fn run(
    spec: &QuantSpec,
    node: &Node,
    ops: &[&HostArray],
) -> Result<HostArray, RuntimeError> {
    let mut out = host_cache().array(DType::F32, node.shape.clone())?;
    let (Some(x), Some(w), Storage::F32(dst)) = (
        ops[0].as_slice::<f32>(),
        ops[1].as_slice::<i32>(),
        out.storage_mut(),
    ) else {
        unreachable!("quant_matmul's operands are f32 and i32 and its result f32 (inferred)")
    };
    let k = spec.k;
    let (m, rw) = (x.len() / k, spec.row_words());
    let n = w.len() / rw;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    // SAFETY: an i32 has no padding and every bit pattern is a valid u8; the slice
    // covers exactly the words' bytes and lives as long as `w`. The bytes are the
    // little-endian blocks on a little-endian host (the only kind this backend builds
    // for: see the assertion below).
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 4) };
    const { assert!(cfg!(target_endian = "little")) };
    let tier = ProductTier::current();
    if m <= SMALL_M {
        let sums = block_sums(x);
        let mut t = (m > 1).then(|| vec![0f32; n * m]);
        let target: &mut [f32] = match &mut t {
            Some(t) => t,
            None => dst,
        };
        target
            .par_chunks_mut(ROWS_PER_TASK * m)
            .enumerate()
            .for_each(|(c, chunk)| {
                let rows = c * ROWS_PER_TASK..(c * ROWS_PER_TASK + chunk.len() / m);
                dots(tier, spec, x, &sums, m, rows, bytes, rw * 4, chunk);
            });
        if let Some(t) = t {
            transpose_into(&t, n, m, dst);
        }
    } else {
        let mut t = vec![0f32; n * m];
        t.par_chunks_mut(ROWS_PER_GEMM * m)
            .enumerate()
            .for_each(|(c, chunk)| {
                let r0 = c * ROWS_PER_GEMM;
                let rows = chunk.len() / m;
                let mut wf = vec![0f32; rows * k];
                for (r, dst_row) in wf.chunks_exact_mut(k).enumerate() {
                    let at = (r0 + r) * rw * 4;
                    spec.format
                        .dequantize(&bytes[at..at + spec.row_bytes()], dst_row);
                }
                // chunk [rows, m] = wf [rows, k] @ x^T [k, m].
                // SAFETY: wf is rows x k (row stride k), x is m rows of k (x^T's element
                // [l, j] at j * k + l), chunk is rows x m (row stride m): every element
                // the strides reach is inside its slice; chunk is this task's own.
                unsafe {
                    gemm_tier::gemm(
                        tier,
                        (rows, m, k),
                        (chunk.as_mut_ptr(), 1, m as isize),
                        (wf.as_ptr(), 1, k as isize),
                        (x.as_ptr(), k as isize, 1),
                        1.0f32,
                        false,
                        Parallelism::None,
                    );
                }
            });
        transpose_into(&t, n, m, dst);
    }
    Ok(out)
}

/// `t` (`[n, m]`) transposed into `dst` (`[m, n]`).
fn transpose_into(t: &[f32], n: usize, m: usize, dst: &mut [f32]) {
    for (j, row) in t.chunks_exact(m).enumerate().take(n) {
        for (i, &v) in row.iter().enumerate() {
            dst[i * n + j] = v;
        }
    }
}

/// The sum of each block of 32 of each row of `x` (`[m, k]`, `k` a multiple of 32):
/// `[m, k / 32]`, row after row.
fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(BLOCK).map(|b| b.iter().sum()).collect()
}

/// `out[(r - rows.start) * m + i] = x[i] . w[r]` for `r` in `rows`, on `tier`'s vectors:
/// one copy of the loop per count of `x` rows and block format, so that the
/// accumulators stay in registers and no branch is taken per block.
#[allow(clippy::too_many_arguments)]
fn dots(
    tier: ProductTier,
    spec: &QuantSpec,
    x: &[f32],
    sums: &[f32],
    m: usize,
    rows: std::ops::Range<usize>,
    bytes: &[u8],
    row_stride: usize,
    out: &mut [f32],
) {
    let a = Rows {
        x,
        sums,
        rows,
        bytes,
        row_stride,
        nb: spec.k / BLOCK,
        bb: spec.format.block_bytes(),
        table: f16_table(),
    };
    let f = format_of(spec.format);
    // `$run!(MR, F)` for this call's `m` (1 to 4) and format.
    macro_rules! each_shape {
        ($run:ident) => {
            match m {
                1 => each_shape!(@f $run, 1),
                2 => each_shape!(@f $run, 2),
                3 => each_shape!(@f $run, 3),
                _ => each_shape!(@f $run, 4),
            }
        };
        (@f $run:ident, $m:literal) => {
            match f {
                0 => $run!($m, 0),
                1 => $run!($m, 1),
                _ => $run!($m, 2),
            }
        };
    }
    match tier {
        #[cfg(target_arch = "x86_64")]
        ProductTier::Avx512 => {
            macro_rules! run {
                ($m:literal, $f:literal) => {
                    // SAFETY: `ProductTier::current` picks AVX-512F only where the host
                    // has it and FMA.
                    unsafe { crate::quant_x86::dots_avx512::<$m, $f>(&a, out) }
                };
            }
            each_shape!(run)
        }
        #[cfg(target_arch = "x86_64")]
        ProductTier::Fma => {
            macro_rules! run {
                ($m:literal, $f:literal) => {
                    // SAFETY: `ProductTier::current` picks AVX2+FMA only where the host
                    // has them.
                    unsafe { crate::quant_x86::dots_avx2::<$m, $f>(&a, out) }
                };
            }
            each_shape!(run)
        }
        _ => {
            macro_rules! run {
                ($m:literal, $f:literal) => {
                    dots_rows::<$m, $f>(&a, out)
                };
            }
            each_shape!(run)
        }
    }
}

/// The portable loop (hosts without AVX2): rows of `w` in format `F` dotted with `MR`
/// rows of `x`.
fn dots_rows<const MR: usize, const F: Format>(a: &Rows<'_>, out: &mut [f32]) {
    let (nb, bb) = (a.nb, a.bb);
    let k = nb * BLOCK;
    let xs: [&[f32]; MR] = std::array::from_fn(|i| &a.x[i * k..(i + 1) * k]);
    let sums: [&[f32]; MR] = std::array::from_fn(|i| &a.sums[i * nb..(i + 1) * nb]);
    for (r, o) in a.rows.clone().zip(out.chunks_exact_mut(MR)) {
        let row = &a.bytes[r * a.row_stride..r * a.row_stride + nb * bb];
        let mut acc = [[0f32; BLOCK]; MR];
        let mut offs = [0f32; MR];
        for (b, block) in row.chunks_exact(bb).enumerate() {
            let d = scale(a.table, block, 0);
            let mut q = [0f32; BLOCK];
            let off = match F {
                0 => {
                    let qs: &[u8; BLOCK] = block[2..2 + BLOCK].try_into().expect("a block");
                    for (qj, &v) in q.iter_mut().zip(qs) {
                        *qj = f32::from(v as i8);
                    }
                    0.0
                }
                1 => {
                    unpack_nibbles(block[2..2 + BLOCK / 2].try_into().expect("a block"), &mut q);
                    -8.0 * d
                }
                _ => {
                    unpack_nibbles(block[4..4 + BLOCK / 2].try_into().expect("a block"), &mut q);
                    scale(a.table, block, 2)
                }
            };
            for i in 0..MR {
                let xb: &[f32; BLOCK] = xs[i][b * BLOCK..(b + 1) * BLOCK]
                    .try_into()
                    .expect("a block");
                let acc_i = &mut acc[i];
                for j in 0..BLOCK {
                    acc_i[j] = d.mul_add(xb[j] * q[j], acc_i[j]);
                }
                if F != 0 {
                    offs[i] = off.mul_add(sums[i][b], offs[i]);
                }
            }
        }
        for i in 0..MR {
            o[i] = tree_sum(acc[i]) + offs[i];
        }
    }
}

/// The sum of 32 lanes as a tree (halves added lane-wise, five times): vector adds,
/// not 31 dependent scalar ones.
#[inline(always)]
fn tree_sum(mut v: [f32; BLOCK]) -> f32 {
    let mut w = BLOCK / 2;
    while w > 0 {
        for j in 0..w {
            v[j] += v[j + w];
        }
        w /= 2;
    }
    v[0]
}

/// The 32 values of 16 bytes of nibbles (low nibbles first, then high) as f32.
#[inline(always)]
fn unpack_nibbles(qs: &[u8; BLOCK / 2], q: &mut [f32; BLOCK]) {
    for j in 0..BLOCK / 2 {
        q[j] = f32::from(qs[j] & 0x0f);
        q[j + BLOCK / 2] = f32::from(qs[j] >> 4);
    }
}
