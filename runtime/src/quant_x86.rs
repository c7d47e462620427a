//! The x86 vector loops of `quant_matmul`'s matrix-vector path (`quant.rs`): a block of
//! 32 quantised weights widened to f32 in registers and multiplied with `x`, in
//! AVX-512F (two 16-lane halves) or AVX2 (four 8-lane quarters). LLVM's own
//! vectorisation of the portable loop split it into 2-lane pieces (3 GB/s of blocks on
//! the Xeon VM). Per block and row of `x`: `acc += d * (x * q)` in 16 (8) lanes, the
//! products of weights `j` and `j + 16` (and, on AVX2, of `j + 8` and `j + 24`) summed
//! first; the lanes summed once a row; the offset term (`m`, or `-8 d`) times the block
//! sums of `x`. Each tier's bits are fixed (no thread count changes them); the tiers
//! round differently from each other. [`Rows`], what a call dots, is every tier's
//! (the portable loop in `quant.rs` takes it too).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Block layout as a const parameter: 0 Q8_0, 1 Q4_0, 2 Q4_1.
pub(crate) type Format = u8;

/// The [`Format`] of `f`.
pub(crate) fn format_of(f: ndfuse_ir::BlockFormat) -> Format {
    match f {
        ndfuse_ir::BlockFormat::Q8_0 => 0,
        ndfuse_ir::BlockFormat::Q4_0 => 1,
        ndfuse_ir::BlockFormat::Q4_1 => 2,
    }
}

/// The bytes of a block of [`Format`] `F`.
const fn block_bytes<const F: Format>() -> usize {
    match F {
        0 => 34,
        1 => 18,
        _ => 20,
    }
}

/// What one call dots: `rows` rows of `bytes` (one every `row_stride` bytes, `nb`
/// blocks of `bb` bytes each) with `MR` rows of `x` (`k = 32 nb` floats each, their
/// block sums in `sums`), into `out` (`MR` values a row of `w`).
pub(crate) struct Rows<'a> {
    pub x: &'a [f32],
    pub sums: &'a [f32],
    pub rows: std::ops::Range<usize>,
    pub bytes: &'a [u8],
    pub row_stride: usize,
    pub nb: usize,
    pub bb: usize,
    pub table: &'a [f32],
}

/// The f16 at `b[at..at + 2]` (little-endian) through `table`.
#[inline(always)]
pub(crate) fn scale(table: &[f32], b: &[u8], at: usize) -> f32 {
    table[usize::from(u16::from_le_bytes([b[at], b[at + 1]]))]
}

/// AVX-512F rows. Panics unless `a`'s blocks are of format `F`
/// and `x` and `sums` hold `MR` rows (every load below stays inside them then); the
/// caller makes sure the host has AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
pub(crate) fn dots_avx512<const MR: usize, const F: Format>(a: &Rows<'_>, out: &mut [f32]) {
    assert_eq!(a.bb, block_bytes::<F>(), "blocks of another format");
    let k = a.nb * 32;
    assert!(a.x.len() >= MR * k && a.sums.len() >= MR * a.nb);
    for (r, o) in a.rows.clone().zip(out.chunks_exact_mut(MR)) {
        let row = &a.bytes[r * a.row_stride..r * a.row_stride + a.nb * a.bb];
        let mut acc = [_mm512_setzero_ps(); MR];
        let mut offs = [0f32; MR];
        for (b, block) in row.chunks_exact(a.bb).enumerate() {
            let d = scale(a.table, block, 0);
            // SAFETY: `block` has `bb` bytes, F's (asserted): 34 for Q8_0 (32 values at
            // 2), 18 for Q4_0 (16 at 2), 20 for Q4_1 (16 at 4); each load reads inside it.
            let (q0, q1, off) = unsafe {
                match F {
                    0 => {
                        let lo = _mm_loadu_si128(block.as_ptr().add(2).cast());
                        let hi = _mm_loadu_si128(block.as_ptr().add(18).cast());
                        (
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)),
                            0.0,
                        )
                    }
                    _ => {
                        let at = if F == 1 { 2 } else { 4 };
                        let qs = _mm_loadu_si128(block.as_ptr().add(at).cast());
                        let mask = _mm_set1_epi8(0x0f);
                        let lo = _mm_and_si128(qs, mask);
                        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), mask);
                        let off = if F == 1 {
                            -8.0 * d
                        } else {
                            scale(a.table, block, 2)
                        };
                        (
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)),
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)),
                            off,
                        )
                    }
                }
            };
            let dv = _mm512_set1_ps(d);
            for i in 0..MR {
                let at = i * k + b * 32;
                // SAFETY: `at + 32 <= MR * k <= x.len()` (asserted above).
                let (x0, x1) = unsafe {
                    (
                        _mm512_loadu_ps(a.x.as_ptr().add(at)),
                        _mm512_loadu_ps(a.x.as_ptr().add(at + 16)),
                    )
                };
                let t = _mm512_fmadd_ps(x1, q1, _mm512_mul_ps(x0, q0));
                acc[i] = _mm512_fmadd_ps(dv, t, acc[i]);
                if F != 0 {
                    offs[i] = off.mul_add(a.sums[i * a.nb + b], offs[i]);
                }
            }
        }
        for i in 0..MR {
            o[i] = _mm512_reduce_add_ps(acc[i]) + offs[i];
        }
    }
}

/// AVX2 rows: the same arithmetic in four 8-lane quarters. Panics unless `a`'s blocks are of format `F`
/// and `x` and `sums` hold `MR` rows (every load below stays inside them then); the
/// caller makes sure the host has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dots_avx2<const MR: usize, const F: Format>(a: &Rows<'_>, out: &mut [f32]) {
    assert_eq!(a.bb, block_bytes::<F>(), "blocks of another format");
    let k = a.nb * 32;
    assert!(a.x.len() >= MR * k && a.sums.len() >= MR * a.nb);
    for (r, o) in a.rows.clone().zip(out.chunks_exact_mut(MR)) {
        let row = &a.bytes[r * a.row_stride..r * a.row_stride + a.nb * a.bb];
        let mut acc = [_mm256_setzero_ps(); MR];
        let mut offs = [0f32; MR];
        for (b, block) in row.chunks_exact(a.bb).enumerate() {
            let d = scale(a.table, block, 0);
            // SAFETY: as in `dots_avx512`, every load reads inside `block`.
            let (q, off) = unsafe {
                let widen = |v: __m128i| -> [__m256; 2] {
                    if F == 0 {
                        [
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
                        ]
                    } else {
                        [
                            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
                            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v))),
                        ]
                    }
                };
                match F {
                    0 => {
                        let [a0, a1] = widen(_mm_loadu_si128(block.as_ptr().add(2).cast()));
                        let [b0, b1] = widen(_mm_loadu_si128(block.as_ptr().add(18).cast()));
                        ([a0, a1, b0, b1], 0.0)
                    }
                    _ => {
                        let at = if F == 1 { 2 } else { 4 };
                        let qs = _mm_loadu_si128(block.as_ptr().add(at).cast());
                        let mask = _mm_set1_epi8(0x0f);
                        let [a0, a1] = widen(_mm_and_si128(qs, mask));
                        let [b0, b1] = widen(_mm_and_si128(_mm_srli_epi16::<4>(qs), mask));
                        let off = if F == 1 {
                            -8.0 * d
                        } else {
                            scale(a.table, block, 2)
                        };
                        ([a0, a1, b0, b1], off)
                    }
                }
            };
            let dv = _mm256_set1_ps(d);
            for i in 0..MR {
                let at = i * k + b * 32;
                // SAFETY: `at + 32 <= MR * k <= x.len()` (asserted above).
                let xs = unsafe {
                    let p = a.x.as_ptr().add(at);
                    [
                        _mm256_loadu_ps(p),
                        _mm256_loadu_ps(p.add(8)),
                        _mm256_loadu_ps(p.add(16)),
                        _mm256_loadu_ps(p.add(24)),
                    ]
                };
                // Lanes as the AVX-512 loop pairs them: weight j with weight j + 16.
                let t0 = _mm256_fmadd_ps(xs[2], q[2], _mm256_mul_ps(xs[0], q[0]));
                let t1 = _mm256_fmadd_ps(xs[3], q[3], _mm256_mul_ps(xs[1], q[1]));
                acc[i] = _mm256_fmadd_ps(dv, _mm256_add_ps(t0, t1), acc[i]);
                if F != 0 {
                    offs[i] = off.mul_add(a.sums[i * a.nb + b], offs[i]);
                }
            }
        }
        for i in 0..MR {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i]) };
            o[i] = lanes.iter().sum::<f32>() + offs[i];
        }
    }
}
