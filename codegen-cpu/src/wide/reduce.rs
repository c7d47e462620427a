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
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::tier::Tier;

/// The sum of `n` f32 (C ABI, so JIT code may call it): reads `src[0..n]`.
pub(crate) type SumFn = unsafe extern "C" fn(src: *const f32, n: usize) -> f32;

/// The partial sums the main loop keeps: one step of it reads this many elements.
pub const PARTIALS: usize = 64;

/// The symbol JIT code calls the sum by.
pub(crate) const SUM_SYMBOL: &str = "ndfuse_wide_sum";

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
    use crate::wide::reduce::PARTIALS;
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
}
