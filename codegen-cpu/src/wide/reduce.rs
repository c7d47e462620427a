//! The sum of a row of f32 on wide registers, in one order that does not depend on the
//! tier, so AVX-512 and AVX2 give the same bits (row programs call it on rows held in
//! their row cache: `lower::rows`).
//!
//! The order, for `n` elements `x[0..n]`, with `full = n - n % 64`:
//!
//! ```text
//! p[k]  = ((0 + x[k]) + x[k + 64]) + x[k + 128] + ...   k in 0..64, over x[0..full]
//! q[l]  = (p[l] + p[l + 16]) + (p[l + 32] + p[l + 48])  l in 0..16
//! q8[l] = q[l] + q[l + 8];  q4[l] = q8[l] + q8[l + 4];  q2[l] = q4[l] + q4[l + 2]
//! t     = q2[0] + q2[1]
//! sum   = (((t + x[full]) + x[full + 1]) + ...) + x[n - 1]
//! ```
//!
//! AVX-512 keeps the 64 partial sums in 4 zmm registers (`p[16 i + l]` in lane `l` of
//! register `i`), AVX2 in 8 ymm registers (`p[8 i + l]`): each lane's additions are the
//! same, in the same order. It is a plain f32 sum (no compensation): its error is at
//! most about `n · ε · Σ|x|` (ε = 2^-24), and NaN and infinities propagate as in any
//! sum. It differs from the 128-bit code's order (a loop of two f32x4 accumulators),
//! so its bits may too; the row programs take it on the wide path only.
//!
//! The row max (`ndfuse_wide_max`) needs no order: it is IEEE 754-2019 `maximum` (the
//! 128-bit code's `fmax`), exact and commutative: NaN where any element is NaN (the
//! default NaN, 0x7FC0_0000), +0 above -0, and is called on non-empty rows only. It compares each element's bits mapped to an i32 whose order
//! is the floats' (-0 below +0), and the largest magnitude's bits for NaN.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::tier::Tier;

/// The sum of `n` f32 (C ABI, so JIT code may call it): reads `src[0..n]`.
pub(crate) type SumFn = unsafe extern "C" fn(src: *const f32, n: usize) -> f32;

/// The partial sums the main loop keeps: one step of it reads this many elements.
pub const PARTIALS: usize = 64;

/// The symbol JIT code calls the sum by.
pub(crate) const SUM_SYMBOL: &str = "ndfuse_wide_sum";

/// The symbol JIT code calls the max by (a [`SumFn`]'s signature).
pub(crate) const MAX_SYMBOL: &str = "ndfuse_wide_max";

/// The max routine of `tier`, where the host has it.
pub(crate) fn max_fn(tier: Tier) -> Option<SumFn> {
    if !tier.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(match tier {
            Tier::Avx512 => x86::max_avx512 as SumFn,
            Tier::Avx2 => x86::max_avx2 as SumFn,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The max of `src` (IEEE `maximum`, see the module docs) with `tier`'s routine;
/// `None` when the host does not have the tier or `src` is empty. For tests.
pub fn max(tier: Tier, src: &[f32]) -> Option<f32> {
    let f = max_fn(tier).filter(|_| !src.is_empty())?;
    // SAFETY: a routine of a tier the host has; `src` holds `src.len() > 0` f32.
    Some(unsafe { f(src.as_ptr(), src.len()) })
}

/// The i32 whose order is the order of the floats (-0 below +0) for the bits `b` of a
/// non-NaN f32; its own inverse.
#[inline(always)]
fn order_key(b: i32) -> i32 {
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// The max from the largest key and the largest magnitude's bits of a row.
#[inline(always)]
fn max_of(key: i32, magnitude: i32) -> f32 {
    if magnitude > f32::INFINITY.to_bits() as i32 {
        f32::NAN
    } else {
        f32::from_bits(order_key(key) as u32)
    }
}

/// The sum routine of `tier`, where the host has it.
pub(crate) fn sum_fn(tier: Tier) -> Option<SumFn> {
    if !tier.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(match tier {
            Tier::Avx512 => x86::sum_avx512 as SumFn,
            Tier::Avx2 => x86::sum_avx2 as SumFn,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The sum of `src` in the order of the module docs with `tier`'s routine; `None`
/// when the host does not have the tier. For tests and benchmarks of the routine.
pub fn sum(tier: Tier, src: &[f32]) -> Option<f32> {
    let f = sum_fn(tier)?;
    // SAFETY: `sum_fn` only returns routines of a tier the host has (checked by
    // `Tier::available`); `src` holds `src.len()` f32.
    Some(unsafe { f(src.as_ptr(), src.len()) })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::wide::reduce::{max_of, order_key, PARTIALS};
    use std::arch::x86_64::*;

    /// Lanes `l` and `l + 8` of `q` (16 partials in two halves) added, then the tree
    /// of the module docs down to one f32, then the tail.
    ///
    /// # Safety
    /// The host has AVX; `src` is valid for reads of `n` f32.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn finish(q8: __m256, src: *const f32, full: usize, n: usize) -> f32 {
        // SAFETY: the host has AVX (the caller's contract); `src[full..n]` is in bounds.
        unsafe {
            let lo = _mm256_castps256_ps128(q8);
            let hi = _mm256_extractf128_ps::<1>(q8);
            let q4 = _mm_add_ps(lo, hi);
            let q2 = _mm_add_ps(q4, _mm_movehl_ps(q4, q4));
            let t = _mm_add_ss(q2, _mm_shuffle_ps::<0b01>(q2, q2));
            let mut total = _mm_cvtss_f32(t);
            for j in full..n {
                total += *src.add(j);
            }
            total
        }
    }

    /// # Safety
    /// The host has AVX-512F; `src` is valid for reads of `n` f32.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe extern "C" fn sum_avx512(src: *const f32, n: usize) -> f32 {
        let full = n - n % PARTIALS;
        // SAFETY: a `SumFn`'s contract: the caller checked the host's features, and
        // every load reads 64 elements below `full <= n`.
        unsafe {
            let mut a = [_mm512_setzero_ps(); 4];
            let mut j = 0;
            while j < full {
                for (i, acc) in a.iter_mut().enumerate() {
                    *acc = _mm512_add_ps(*acc, _mm512_loadu_ps(src.add(j + 16 * i)));
                }
                j += PARTIALS;
            }
            let q = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
            let lo = _mm512_castps512_ps256(q);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(q)));
            finish(_mm256_add_ps(lo, hi), src, full, n)
        }
    }

    /// # Safety
    /// The host has AVX2; `src` is valid for reads of `n` f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe extern "C" fn sum_avx2(src: *const f32, n: usize) -> f32 {
        let full = n - n % PARTIALS;
        // SAFETY: as for the AVX-512 routine, with AVX2's features.
        unsafe {
            let mut b = [_mm256_setzero_ps(); 8];
            let mut j = 0;
            while j < full {
                for (i, acc) in b.iter_mut().enumerate() {
                    *acc = _mm256_add_ps(*acc, _mm256_loadu_ps(src.add(j + 8 * i)));
                }
                j += PARTIALS;
            }
            // q[l] = (p[l] + p[l + 16]) + (p[l + 32] + p[l + 48]), as two halves of 8.
            let q_lo = _mm256_add_ps(_mm256_add_ps(b[0], b[2]), _mm256_add_ps(b[4], b[6]));
            let q_hi = _mm256_add_ps(_mm256_add_ps(b[1], b[3]), _mm256_add_ps(b[5], b[7]));
            finish(_mm256_add_ps(q_lo, q_hi), src, full, n)
        }
    }

    /// Registers a step of the max loops read.
    const MAX_STEP: usize = 4;

    /// The keys' start: the key of -inf (every element's key is at least that, or NaN).
    const KEY_START: i32 = 0x807F_FFFF_u32 as i32;

    /// The max of the tail `src[from..n]` folded into `(key, magnitude)`.
    ///
    /// # Safety
    /// `src` is valid for reads of `n` f32.
    #[inline(always)]
    unsafe fn max_tail(src: *const f32, from: usize, n: usize, mut acc: (i32, i32)) -> f32 {
        for j in from..n {
            // SAFETY: j < n, in the caller's range.
            let b = unsafe { *src.add(j) }.to_bits() as i32;
            acc = (acc.0.max(order_key(b)), acc.1.max(b & i32::MAX));
        }
        max_of(acc.0, acc.1)
    }

    /// # Safety
    /// The host has AVX-512F; `src` is valid for reads of `n` f32.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe extern "C" fn max_avx512(src: *const f32, n: usize) -> f32 {
        let step = 16 * MAX_STEP;
        let full = n - n % step;
        // SAFETY: a `SumFn`'s contract: the caller checked the host's features, and
        // every load reads 16 elements below `full <= n`.
        unsafe {
            let mut key = [_mm512_set1_epi32(KEY_START); MAX_STEP];
            let mut mag = [_mm512_setzero_si512(); MAX_STEP];
            let abs = _mm512_set1_epi32(i32::MAX);
            let mut j = 0;
            while j < full {
                for i in 0..MAX_STEP {
                    let b = _mm512_castps_si512(_mm512_loadu_ps(src.add(j + 16 * i)));
                    let flip = _mm512_srli_epi32::<1>(_mm512_srai_epi32::<31>(b));
                    key[i] = _mm512_max_epi32(key[i], _mm512_xor_si512(b, flip));
                    mag[i] = _mm512_max_epi32(mag[i], _mm512_and_si512(b, abs));
                }
                j += step;
            }
            let k = _mm512_max_epi32(
                _mm512_max_epi32(key[0], key[1]),
                _mm512_max_epi32(key[2], key[3]),
            );
            let m = _mm512_max_epi32(
                _mm512_max_epi32(mag[0], mag[1]),
                _mm512_max_epi32(mag[2], mag[3]),
            );
            let acc = (_mm512_reduce_max_epi32(k), _mm512_reduce_max_epi32(m));
            max_tail(src, full, n, acc)
        }
    }

    /// # Safety
    /// The host has AVX2; `src` is valid for reads of `n` f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe extern "C" fn max_avx2(src: *const f32, n: usize) -> f32 {
        let step = 8 * MAX_STEP;
        let full = n - n % step;
        // SAFETY: as for the AVX-512 routine, with AVX2's features and 8 elements a load.
        unsafe {
            let mut key = [_mm256_set1_epi32(KEY_START); MAX_STEP];
            let mut mag = [_mm256_setzero_si256(); MAX_STEP];
            let abs = _mm256_set1_epi32(i32::MAX);
            let mut j = 0;
            while j < full {
                for i in 0..MAX_STEP {
                    let b = _mm256_castps_si256(_mm256_loadu_ps(src.add(j + 8 * i)));
                    let flip = _mm256_srli_epi32::<1>(_mm256_srai_epi32::<31>(b));
                    key[i] = _mm256_max_epi32(key[i], _mm256_xor_si256(b, flip));
                    mag[i] = _mm256_max_epi32(mag[i], _mm256_and_si256(b, abs));
                }
                j += step;
            }
            let k = _mm256_max_epi32(
                _mm256_max_epi32(key[0], key[1]),
                _mm256_max_epi32(key[2], key[3]),
            );
            let m = _mm256_max_epi32(
                _mm256_max_epi32(mag[0], mag[1]),
                _mm256_max_epi32(mag[2], mag[3]),
            );
            let mut ks = [0i32; 8];
            let mut ms = [0i32; 8];
            _mm256_storeu_si256(ks.as_mut_ptr().cast(), k);
            _mm256_storeu_si256(ms.as_mut_ptr().cast(), m);
            let fold = |v: [i32; 8]| v.into_iter().fold(i32::MIN, i32::max);
            max_tail(src, full, n, (fold(ks), fold(ms)))
        }
    }
}
