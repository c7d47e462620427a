//! f16 and bf16 <-> f32 conversions of whole blocks on wide registers: the loads and
//! stores of half-typed element-wise kernels on the wide path.
//!
//! Each gives the bits of the 128-bit code (`lower::convert`):
//!
//! - f16 -> f32 is exact, and F16C's `vcvtph2ps` is that conversion (subnormals
//!   included, with the default MXCSR every kernel assumes; a NaN comes back quiet with
//!   its payload);
//! - f32 -> f16 is `vcvtps2ph` rounding to nearest, ties to even: overflow gives
//!   infinity, a NaN gives a quiet NaN with the top ten bits of its payload, as the
//!   integer sequence of the 128-bit code does;
//! - bf16 is the top half of an f32, so both directions are integer operations, the
//!   same ones as the 128-bit code (AVX-512's `vcvtneps2bf16` would treat subnormals as
//!   zero, so it is not used).
//!
//! A tail shorter than a register goes through a register-sized buffer on the stack,
//! so every element takes the same instructions.

use super::tier::{LoadFn, StoreFn, Tier};
use ndfuse_ir::DType;

/// The conversion of `dtype` elements to f32 at `tier`.
pub(super) fn load_fn(dtype: DType, tier: Tier) -> Option<LoadFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let f: LoadFn = match (dtype, tier) {
            (DType::F16, Tier::Avx512) => x86::load_f16_avx512,
            (DType::BF16, Tier::Avx512) => x86::load_bf16_avx512,
            (DType::F16, Tier::Avx2) => x86::load_f16_avx2,
            (DType::BF16, Tier::Avx2) => x86::load_bf16_avx2,
            _ => return None,
        };
        Some(f)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, tier);
        None
    }
}

/// The conversion of f32 to `dtype` elements at `tier`.
pub(super) fn store_fn(dtype: DType, tier: Tier) -> Option<StoreFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let f: StoreFn = match (dtype, tier) {
            (DType::F16, Tier::Avx512) => x86::store_f16_avx512,
            (DType::BF16, Tier::Avx512) => x86::store_bf16_avx512,
            (DType::F16, Tier::Avx2) => x86::store_f16_avx2,
            (DType::BF16, Tier::Avx2) => x86::store_bf16_avx2,
            _ => return None,
        };
        Some(f)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, tier);
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `body` over the `n` elements at `src`/`dst` in steps of `LANES`, the last partial
    /// step through stack buffers of one step (`S` and `D` elements of the source and
    /// destination types). `body(s, d)` converts exactly `LANES` elements from `s` to
    /// `d`.
    ///
    /// # Safety
    /// `src` must be readable for `n` elements of `S`, `dst` writable for `n` of `D`.
    #[inline(always)]
    unsafe fn blocks<S: Copy + Default, D: Copy + Default, const LANES: usize>(
        src: *const S,
        dst: *mut D,
        n: usize,
        body: impl Fn(*const S, *mut D),
    ) {
        let full = n - n % LANES;
        let mut i = 0;
        while i < full {
            // SAFETY: `i + LANES <= full <= n`: inside both buffers.
            body(unsafe { src.add(i) }, unsafe { dst.add(i) });
            i += LANES;
        }
        let rest = n - full;
        if rest > 0 {
            let mut s = [S::default(); LANES];
            let mut d = [D::default(); LANES];
            // SAFETY: `full + rest == n`: the last `rest` elements of each buffer, copied
            // to and from local arrays of `LANES >= rest` elements.
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(full), s.as_mut_ptr(), rest);
                body(s.as_ptr(), d.as_mut_ptr());
                std::ptr::copy_nonoverlapping(d.as_ptr(), dst.add(full), rest);
            }
        }
    }

    /// # Safety
    /// The host has AVX-512F; `src` holds `n` f16, `dst` room for `n` f32.
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe extern "C" fn load_f16_avx512(src: *const u8, dst: *mut f32, n: usize) {
        // SAFETY: the caller's contract; each step reads 16 u16 and writes 16 f32
        // inside the buffers (`blocks`).
        unsafe {
            blocks::<u16, f32, 16>(src.cast(), dst, n, |s, d| {
                let h = _mm256_loadu_si256(s.cast());
                _mm512_storeu_ps(d, _mm512_cvtph_ps(h));
            })
        }
    }

    /// # Safety
    /// The host has AVX-512F; `src` holds `n` f32, `dst` room for `n` f16.
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe extern "C" fn store_f16_avx512(src: *const f32, dst: *mut u8, n: usize) {
        // SAFETY: as `load_f16_avx512`, the other way.
        unsafe {
            blocks::<f32, u16, 16>(src, dst.cast(), n, |s, d| {
                let v = _mm512_loadu_ps(s);
                let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_storeu_si256(d.cast(), h);
            })
        }
    }

    /// # Safety
    /// The host has AVX-512F; `src` holds `n` bf16, `dst` room for `n` f32.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe extern "C" fn load_bf16_avx512(src: *const u8, dst: *mut f32, n: usize) {
        // SAFETY: as `load_f16_avx512`.
        unsafe {
            blocks::<u16, f32, 16>(src.cast(), dst, n, |s, d| {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(s.cast()));
                let wide = _mm512_slli_epi32::<16>(h);
                // A NaN is quieted, its payload kept.
                let mag = _mm512_and_si512(h, _mm512_set1_epi32(0x7FFF));
                let nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7F80));
                let bits = _mm512_mask_or_epi32(wide, nan, wide, _mm512_set1_epi32(0x0040_0000));
                _mm512_storeu_si512(d.cast(), bits);
            })
        }
    }

    /// # Safety
    /// The host has AVX-512F; `src` holds `n` f32, `dst` room for `n` bf16.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe extern "C" fn store_bf16_avx512(src: *const f32, dst: *mut u8, n: usize) {
        // SAFETY: as `load_f16_avx512`, the other way.
        unsafe {
            blocks::<f32, u16, 16>(src, dst.cast(), n, |s, d| {
                let u = _mm512_loadu_si512(s.cast());
                let f = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFF_FFFF));
                let nan = _mm512_cmpgt_epi32_mask(f, _mm512_set1_epi32(0x7F80_0000));
                // Just under half an ulp plus the kept lsb: ties to even.
                let top = _mm512_srli_epi32::<16>(u);
                let lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
                let biased = _mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF));
                let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(biased, lsb));
                let quieted = _mm512_or_si512(top, _mm512_set1_epi32(0x0040));
                let bits = _mm512_mask_blend_epi32(nan, rounded, quieted);
                _mm256_storeu_si256(d.cast(), _mm512_cvtepi32_epi16(bits));
            })
        }
    }

    /// # Safety
    /// The host has AVX2 and F16C; `src` holds `n` f16, `dst` room for `n` f32.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe extern "C" fn load_f16_avx2(src: *const u8, dst: *mut f32, n: usize) {
        // SAFETY: as `load_f16_avx512`, 8 elements a step.
        unsafe {
            blocks::<u16, f32, 8>(src.cast(), dst, n, |s, d| {
                let h = _mm_loadu_si128(s.cast());
                _mm256_storeu_ps(d, _mm256_cvtph_ps(h));
            })
        }
    }

    /// # Safety
    /// The host has AVX2 and F16C; `src` holds `n` f32, `dst` room for `n` f16.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe extern "C" fn store_f16_avx2(src: *const f32, dst: *mut u8, n: usize) {
        // SAFETY: as `load_f16_avx512`, the other way, 8 elements a step.
        unsafe {
            blocks::<f32, u16, 8>(src, dst.cast(), n, |s, d| {
                let v = _mm256_loadu_ps(s);
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(d.cast(), h);
            })
        }
    }

    /// # Safety
    /// The host has AVX2; `src` holds `n` bf16, `dst` room for `n` f32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe extern "C" fn load_bf16_avx2(src: *const u8, dst: *mut f32, n: usize) {
        // SAFETY: as `load_f16_avx512`, 8 elements a step.
        unsafe {
            blocks::<u16, f32, 8>(src.cast(), dst, n, |s, d| {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.cast()));
                let wide = _mm256_slli_epi32::<16>(h);
                let mag = _mm256_and_si256(h, _mm256_set1_epi32(0x7FFF));
                let nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F80));
                let quiet = _mm256_and_si256(nan, _mm256_set1_epi32(0x0040_0000));
                _mm256_storeu_si256(d.cast(), _mm256_or_si256(wide, quiet));
            })
        }
    }

    /// # Safety
    /// The host has AVX2; `src` holds `n` f32, `dst` room for `n` bf16.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe extern "C" fn store_bf16_avx2(src: *const f32, dst: *mut u8, n: usize) {
        // SAFETY: as `load_f16_avx512`, the other way, 8 elements a step.
        unsafe {
            blocks::<f32, u16, 8>(src, dst.cast(), n, |s, d| {
                let u = _mm256_loadu_si256(s.cast());
                let f = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFF_FFFF));
                let nan = _mm256_cmpgt_epi32(f, _mm256_set1_epi32(0x7F80_0000));
                let top = _mm256_srli_epi32::<16>(u);
                let lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
                let biased = _mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF));
                let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(biased, lsb));
                let quieted = _mm256_or_si256(top, _mm256_set1_epi32(0x0040));
                let bits = _mm256_blendv_epi8(rounded, quieted, nan);
                // Every lane is in 0..=0xFFFF: the unsigned saturating pack is exact.
                let lo = _mm256_castsi256_si128(bits);
                let hi = _mm256_extracti128_si256::<1>(bits);
                _mm_storeu_si128(d.cast(), _mm_packus_epi32(lo, hi));
            })
        }
    }
}
