//! Row routines that apply one row value to every element of a row, on wide registers:
//! exp of a shifted row, `dst[j] = exp(src[j] - shift)` (a row program's fill pass and
//! its exp in one, softmax's `exp(x - max)` read from the input row itself, fetching
//! the next row into L2 meanwhile, so the next row's first sweep reads it from there
//! while this one computes), and a row
//! divided by one value, `dst[j] = src[j] / d` (softmax's stores, `e / sum`); both
//! called by `lower::rows`.
//!
//! The subtraction and the division are the f32 ones the 128-bit loops do (IEEE, one
//! rounding), and the exp is `exp`'s generic code (`wide::exp`), so every element gets
//! the bits of the 128-bit code (the fill pass then `ndfuse_wide_exp`, or the store
//! sweep's division), on every tier.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::lanes::Lanes;
use super::tier::Tier;

/// `dst[j] = src[j] op x` for `j < n` (C ABI, so JIT code may call it); `src` and
/// `dst` may be the same pointer, never otherwise overlapping.
pub(crate) type ShiftFn = unsafe extern "C" fn(src: *const f32, x: f32, dst: *mut f32, n: usize);

/// `dst[j] = exp(src[j] - shift)` for `j < n`, as a [`ShiftFn`]; the `n` f32 at `next`
/// (any address: a prefetch never faults and changes no value) are fetched into L2.
pub(crate) type ExpShiftFn =
    unsafe extern "C" fn(src: *const f32, shift: f32, dst: *mut f32, n: usize, next: *const f32);

/// The symbol JIT code calls the routine by.
pub(crate) const EXP_SHIFT_SYMBOL: &str = "ndfuse_wide_exp_shift";

/// The routine of `tier`, where the host has it.
pub(crate) fn exp_shift_fn(tier: Tier) -> Option<ExpShiftFn> {
    if !tier.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(match tier {
            Tier::Avx512 => exp_shift_avx512 as ExpShiftFn,
            Tier::Avx2 => exp_shift_avx2 as ExpShiftFn,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// `exp(src[j] - shift)` into `dst` with `tier`'s routine; `false` (nothing written)
/// when the host does not have the tier or the lengths differ. For tests.
pub fn exp_shift(tier: Tier, src: &[f32], shift: f32, dst: &mut [f32]) -> bool {
    let Some(f) = exp_shift_fn(tier).filter(|_| src.len() == dst.len()) else {
        return false;
    };
    // SAFETY: a routine of a tier the host has (`Tier::available`); `src` and `dst`
    // are distinct slices of `n` elements each.
    unsafe {
        f(
            src.as_ptr(),
            shift,
            dst.as_mut_ptr(),
            src.len(),
            src.as_ptr(),
        )
    };
    true
}

/// The symbol JIT code calls the division by (a [`ShiftFn`]'s signature: `(src, d,
/// dst, n)`, `dst[j] = src[j] / d`).
pub(crate) const DIV_SYMBOL: &str = "ndfuse_wide_div";

/// The division routine of `tier`, where the host has it.
pub(crate) fn div_fn(tier: Tier) -> Option<ShiftFn> {
    if !tier.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(match tier {
            Tier::Avx512 => div_avx512 as ShiftFn,
            Tier::Avx2 => div_avx2 as ShiftFn,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The symbol of the division that writes `dst` with non-temporal stores (past the
/// caches: no read of the output's lines before writing them), for outputs much larger
/// than the caches; the same values.
pub(crate) const DIV_STREAM_SYMBOL: &str = "ndfuse_wide_div_stream";

/// The streaming division routine of `tier`, where the host has it.
pub(crate) fn div_stream_fn(tier: Tier) -> Option<ShiftFn> {
    if !tier.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(match tier {
            Tier::Avx512 => stream::div_stream_avx512 as ShiftFn,
            Tier::Avx2 => stream::div_stream_avx2 as ShiftFn,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// `src[j] / d` into `dst` with `tier`'s streaming routine; as [`div`]. For tests.
pub fn div_stream(tier: Tier, src: &[f32], d: f32, dst: &mut [f32]) -> bool {
    let Some(f) = div_stream_fn(tier).filter(|_| src.len() == dst.len()) else {
        return false;
    };
    // SAFETY: as for `div`.
    unsafe { f(src.as_ptr(), d, dst.as_mut_ptr(), src.len()) };
    true
}

/// `src[j] / d` into `dst` with `tier`'s routine; `false` (nothing written) when the
/// host does not have the tier or the lengths differ. For tests.
pub fn div(tier: Tier, src: &[f32], d: f32, dst: &mut [f32]) -> bool {
    let Some(f) = div_fn(tier).filter(|_| src.len() == dst.len()) else {
        return false;
    };
    // SAFETY: a routine of a tier the host has (`Tier::available`); `src` and `dst`
    // are distinct slices of `n` elements each.
    unsafe { f(src.as_ptr(), d, dst.as_mut_ptr(), src.len()) };
    true
}

/// The widest register of any tier, in f32 lanes (the tail buffer).
const MAX_LANES: usize = 16;

/// The routine's body on `l`'s registers; the last partial register goes through a
/// stack buffer (its unused lanes 0.0), so it gets the bits a full one would.
///
/// # Safety
/// `src` must be valid for reading and `dst` for writing `n` f32; they may be the same
/// pointer, and must not overlap otherwise. `next` may be any address (only prefetched).
#[inline(always)]
unsafe fn exp_shift_on<L: Lanes>(
    l: L,
    (src, shift, dst, n): (*const f32, f32, *mut f32, usize),
    next: *const f32,
) {
    const { assert!(L::LANES <= MAX_LANES) };
    let s = l.splat(shift);
    let full = n - n % L::LANES;
    let mut i = 0;
    while i < full {
        // SAFETY: i + LANES <= full <= n: both registers lie inside the caller's
        // ranges; register i is read whole before it is written, so in place works.
        unsafe {
            // One cache line of the next row an iteration or two (a prefetch is a hint:
            // it never faults, wherever `next` points).
            #[cfg(target_arch = "x86_64")]
            if i % 16 == 0 {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(i).cast());
            }
            let x = l.sub(l.load(src.add(i)), s);
            l.store(dst.add(i), super::exp::exp(l, x));
        }
        i += L::LANES;
    }
    let rest = n - full;
    if rest > 0 {
        let mut buf = [0.0f32; MAX_LANES];
        // SAFETY: `src[full..n]` and `dst[full..n]` lie in the caller's ranges; `buf`
        // (a local, so overlapping neither) holds MAX_LANES >= LANES >= rest f32.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(full), buf.as_mut_ptr(), rest);
            let x = l.sub(l.load(buf.as_ptr()), s);
            l.store(buf.as_mut_ptr(), super::exp::exp(l, x));
            std::ptr::copy_nonoverlapping(buf.as_ptr(), dst.add(full), rest);
        }
    }
}

/// `dst[j] = src[j] / d` on `l`'s registers; the tail one element at a time (the same
/// IEEE division).
///
/// # Safety
/// As [`exp_shift_on`].
#[inline(always)]
unsafe fn div_on<L: Lanes>(l: L, src: *const f32, d: f32, dst: *mut f32, n: usize) {
    let dv = l.splat(d);
    let full = n - n % L::LANES;
    let mut i = 0;
    while i < full {
        // SAFETY: i + LANES <= full <= n, inside the caller's ranges (in place works).
        unsafe { l.store(dst.add(i), l.div(l.load(src.add(i)), dv)) };
        i += L::LANES;
    }
    for j in full..n {
        // SAFETY: j < n, inside the caller's ranges.
        unsafe { *dst.add(j) = *src.add(j) / d };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe extern "C" fn div_avx512(src: *const f32, d: f32, dst: *mut f32, n: usize) {
    // SAFETY: a `ShiftFn`'s contract (the host's features, the pointers' ranges).
    unsafe { div_on(super::lanes::Avx512::assume(), src, d, dst, n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe extern "C" fn div_avx2(src: *const f32, d: f32, dst: *mut f32, n: usize) {
    // SAFETY: as for the AVX-512 routine, with AVX2's features.
    unsafe { div_on(super::lanes::Avx2::assume(), src, d, dst, n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe extern "C" fn exp_shift_avx512(
    src: *const f32,
    shift: f32,
    dst: *mut f32,
    n: usize,
    next: *const f32,
) {
    // SAFETY: an `ExpShiftFn`'s contract: the caller checked that the host has this
    // routine's features (the token's requirement) and the pointers' ranges.
    unsafe { exp_shift_on(super::lanes::Avx512::assume(), (src, shift, dst, n), next) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe extern "C" fn exp_shift_avx2(
    src: *const f32,
    shift: f32,
    dst: *mut f32,
    n: usize,
    next: *const f32,
) {
    // SAFETY: as for the AVX-512 routine, with AVX2's features.
    unsafe { exp_shift_on(super::lanes::Avx2::assume(), (src, shift, dst, n), next) }
}

#[cfg(target_arch = "x86_64")]
mod stream {
    use std::arch::x86_64::*;

    /// Elements before `dst + at` is aligned to `bytes` (a power of two), at most `n`.
    fn head(dst: *mut f32, bytes: usize, n: usize) -> usize {
        let misalign = (dst as usize) & (bytes - 1);
        let head = if misalign == 0 {
            0
        } else {
            (bytes - misalign) / 4
        };
        head.min(n)
    }

    /// # Safety
    /// The host has AVX-512F; `src` is valid for reading and `dst` for writing `n`
    /// f32 (4-byte aligned), equal or not overlapping.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe extern "C" fn div_stream_avx512(
        src: *const f32,
        d: f32,
        dst: *mut f32,
        n: usize,
    ) {
        // SAFETY: a `ShiftFn`'s contract; every access lies below `n`, and each stream
        // store is to a 64-byte aligned address (`head`); the fence orders the
        // non-temporal stores before whatever the caller does next.
        unsafe {
            let h = head(dst, 64, n);
            for j in 0..h {
                *dst.add(j) = *src.add(j) / d;
            }
            let dv = _mm512_set1_ps(d);
            let mut j = h;
            while j + 16 <= n {
                _mm512_stream_ps(dst.add(j), _mm512_div_ps(_mm512_loadu_ps(src.add(j)), dv));
                j += 16;
            }
            for k in j..n {
                *dst.add(k) = *src.add(k) / d;
            }
            _mm_sfence();
        }
    }

    /// # Safety
    /// As for the AVX-512 routine, with AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe extern "C" fn div_stream_avx2(
        src: *const f32,
        d: f32,
        dst: *mut f32,
        n: usize,
    ) {
        // SAFETY: as for the AVX-512 routine, with 32-byte aligned stream stores.
        unsafe {
            let h = head(dst, 32, n);
            for j in 0..h {
                *dst.add(j) = *src.add(j) / d;
            }
            let dv = _mm256_set1_ps(d);
            let mut j = h;
            while j + 8 <= n {
                _mm256_stream_ps(dst.add(j), _mm256_div_ps(_mm256_loadu_ps(src.add(j)), dv));
                j += 8;
            }
            for k in j..n {
                *dst.add(k) = *src.add(k) / d;
            }
            _mm_sfence();
        }
    }
}
