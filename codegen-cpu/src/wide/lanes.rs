//! The register types of each tier and the operations the wide math is written with.
//!
//! [`Lanes`] is implemented by one zero-sized token per tier ([`Avx512`], [`Avx2`]),
//! which only exists where the host has the tier's features: [`Avx512::new`] and
//! [`Avx2::new`] detect them at run time, and [`Avx512::assume`] / [`Avx2::assume`]
//! are for the routines whose own `#[target_feature]` contract already guarantees
//! them. A third token, [`Xmm`], runs the same algorithms on one 128-bit register:
//! the precompiled shared math that small kernels call per `f32x4` and per scalar
//! (`shared_math`), compiled with AVX2 and FMA like the AVX2 tier, so it exists only
//! where a wide tier does. So every method takes the token and is safe to call; the intrinsics it uses
//! are sound because the token exists. The methods are `#[inline(always)]` and carry
//! no `#[target_feature]` themselves: inlined into a routine compiled for the tier,
//! they become its instructions.
//!
//! Each operation is the one the 128-bit inline math (`vmath::builder`) emits through
//! Cranelift, lane for lane, so the wide routines give the same bits: compares are
//! ordered (false on NaN) like Cranelift's `fcmp`, selects take whole lanes like its
//! `bitselect` of a compare mask, `abs` and `neg` clear and flip the sign bit like its
//! `fabs`/`fneg` on x86, int -> float is `cvtdq2ps` (round to nearest), and the
//! helpers built on them ([`Lanes::min_c`], [`Lanes::max_c`], [`Lanes::horner`],
//! [`Lanes::pow2`], [`Lanes::with_sign_of`]) are `vmath::builder`'s, with its
//! rounding of every f64 constant to f32.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// The operations of one tier's f32 registers (`F`), i32 registers of the same width
/// (`I`) and compare masks (`M`).
pub(super) trait Lanes: Copy {
    /// f32 lanes of one register.
    const LANES: usize;
    type F: Copy;
    type I: Copy;
    type M: Copy;

    /// The `LANES` f32 at `p` (unaligned).
    ///
    /// # Safety
    /// `p` must be valid for reading `LANES` f32.
    unsafe fn load(self, p: *const f32) -> Self::F;
    /// Writes `v` to the `LANES` f32 at `p` (unaligned).
    ///
    /// # Safety
    /// `p` must be valid for writing `LANES` f32.
    unsafe fn store(self, p: *mut f32, v: Self::F);

    fn splat(self, v: f32) -> Self::F;
    /// Lane 0.
    fn first(self, v: Self::F) -> f32;
    fn add(self, a: Self::F, b: Self::F) -> Self::F;
    fn sub(self, a: Self::F, b: Self::F) -> Self::F;
    fn mul(self, a: Self::F, b: Self::F) -> Self::F;
    fn div(self, a: Self::F, b: Self::F) -> Self::F;
    /// a·b + c with one rounding.
    fn fma(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The sign bit cleared (NaN included).
    fn abs(self, a: Self::F) -> Self::F;
    /// The sign bit flipped (NaN included).
    fn neg(self, a: Self::F) -> Self::F;

    /// `a > b ? a : b` (`maxps`: b where either is NaN).
    fn max(self, a: Self::F, b: Self::F) -> Self::F;
    /// a < b, false where either is NaN.
    fn lt(self, a: Self::F, b: Self::F) -> Self::M;
    /// a ≥ b, false where either is NaN.
    fn ge(self, a: Self::F, b: Self::F) -> Self::M;
    /// a == b, false where either is NaN.
    fn eq(self, a: Self::F, b: Self::F) -> Self::M;
    /// `m ? a : b` lane by lane.
    fn sel(self, m: Self::M, a: Self::F, b: Self::F) -> Self::F;
    /// Whether every lane of `m` is set.
    fn all(self, m: Self::M) -> bool;

    /// The bits of `a` as i32 lanes.
    fn bits(self, a: Self::F) -> Self::I;
    /// i32 lanes read as f32 bits.
    fn float(self, i: Self::I) -> Self::F;
    /// i32 lanes converted to f32, rounded to nearest (`cvtdq2ps`).
    fn to_float(self, i: Self::I) -> Self::F;

    fn isplat(self, v: i32) -> Self::I;
    fn iadd(self, a: Self::I, b: Self::I) -> Self::I;
    fn isub(self, a: Self::I, b: Self::I) -> Self::I;
    fn and(self, a: Self::I, b: Self::I) -> Self::I;
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    /// Signed minimum (`a > b ? b : a`).
    fn imin(self, a: Self::I, b: Self::I) -> Self::I;
    /// Signed maximum (`a < b ? b : a`).
    fn imax(self, a: Self::I, b: Self::I) -> Self::I;
    /// Shift left by `n` (0..32, a constant after inlining).
    fn shl(self, a: Self::I, n: i32) -> Self::I;
    /// Arithmetic shift right by `n`.
    fn sra(self, a: Self::I, n: i32) -> Self::I;
    /// Logical shift right by `n`.
    fn srl(self, a: Self::I, n: i32) -> Self::I;

    /// A constant of the inline math: `v` rounded to f32, as `Math::f` emits it.
    #[inline(always)]
    fn c(self, v: f64) -> Self::F {
        self.splat(v as f32)
    }

    /// min(x, c), NaN kept: `c < x ? c : x` (`Math::min_c`).
    #[inline(always)]
    fn min_c(self, x: Self::F, c: f64) -> Self::F {
        let c = self.c(c);
        let lt = self.lt(c, x);
        self.sel(lt, c, x)
    }

    /// max(x, c), NaN kept: `x < c ? c : x` (`Math::max_c`).
    #[inline(always)]
    fn max_c(self, x: Self::F, c: f64) -> Self::F {
        let c = self.c(c);
        let lt = self.lt(x, c);
        self.sel(lt, c, x)
    }

    /// c[0] + v·(c[1] + v·(...)), one fused multiply-add a step (`Math::horner`).
    #[inline(always)]
    fn horner(self, v: Self::F, c: &[f64]) -> Self::F {
        let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
        let mut acc = self.c(*last);
        for &k in rest.iter().rev() {
            acc = self.fma(acc, v, self.c(k));
        }
        acc
    }

    /// 2^n for i32 lanes `n` in [-126, 127] (`Math::pow2`).
    #[inline(always)]
    fn pow2(self, n: Self::I) -> Self::F {
        let e = self.iadd(n, self.isplat(127));
        self.float(self.shl(e, 23))
    }

    /// `x` with the sign bit of `s` or-ed in (`Math::with_sign_of`).
    #[inline(always)]
    fn with_sign_of(self, x: Self::F, s: Self::F) -> Self::F {
        let sign = self.and(self.bits(s), self.isplat(i32::MIN));
        self.float(self.or(self.bits(x), sign))
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512, Xmm};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::wide::lanes::Lanes;
    use std::arch::x86_64::*;

    /// Proof that the host has AVX-512F, FMA and F16C (the `Avx512` tier).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx512(());

    /// Proof that the host has AVX2, FMA and F16C (the `Avx2` tier).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx2(());

    impl Avx512 {
        /// The token, where the host has the features (detected at run time).
        pub(crate) fn new() -> Option<Self> {
            let has = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            has.then_some(Avx512(()))
        }

        /// The token without detection.
        ///
        /// # Safety
        /// The host must have AVX-512F, FMA and F16C (for example: the caller is
        /// compiled with them as `#[target_feature]` and was itself called soundly).
        #[inline(always)]
        pub(crate) unsafe fn assume() -> Self {
            debug_assert!(
                Self::new().is_some(),
                "AVX-512 routine on a host without it"
            );
            Avx512(())
        }
    }

    /// Proof that the host has AVX2 and FMA, for the 128-bit registers of the shared
    /// math (the SSE4.1 and AVX instructions it uses come with them).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Xmm(());

    impl Xmm {
        /// The token, where the host has the features (detected at run time).
        pub(crate) fn new() -> Option<Self> {
            let has = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            has.then_some(Xmm(()))
        }

        /// The token without detection.
        ///
        /// # Safety
        /// The host must have AVX2 and FMA.
        #[inline(always)]
        pub(crate) unsafe fn assume() -> Self {
            debug_assert!(Self::new().is_some(), "AVX2 routine on a host without it");
            Xmm(())
        }
    }

    impl Avx2 {
        /// The token, where the host has the features (detected at run time).
        pub(crate) fn new() -> Option<Self> {
            let has = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            has.then_some(Avx2(()))
        }

        /// The token without detection.
        ///
        /// # Safety
        /// The host must have AVX2, FMA and F16C.
        #[inline(always)]
        pub(crate) unsafe fn assume() -> Self {
            debug_assert!(Self::new().is_some(), "AVX2 routine on a host without it");
            Avx2(())
        }
    }

    // Every `unsafe` block below calls intrinsics of the features the token proves
    // (AVX-512F, or AVX2 + FMA), and nothing else: the token exists only where the host
    // has them (`new`, or `assume` under its contract). Loads and stores also rely on
    // their callers' pointer contracts.

    impl Lanes for Avx512 {
        const LANES: usize = 16;
        type F = __m512;
        type I = __m512i;
        type M = __mmask16;

        #[inline(always)]
        unsafe fn load(self, p: *const f32) -> __m512 {
            // SAFETY: the token (features); the caller (16 readable f32 at p).
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32, v: __m512) {
            // SAFETY: the token (features); the caller (16 writable f32 at p).
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn splat(self, v: f32) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_set1_ps(v) }
        }
        #[inline(always)]
        fn first(self, v: __m512) -> f32 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_cvtss_f32(v) }
        }
        #[inline(always)]
        fn add(self, a: __m512, b: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m512, b: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_sub_ps(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m512, b: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m512, b: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_div_ps(a, b) }
        }
        #[inline(always)]
        fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F (whose vfmadd is this one).
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn abs(self, a: __m512) -> __m512 {
            self.float(self.and(self.bits(a), self.isplat(i32::MAX)))
        }
        #[inline(always)]
        fn neg(self, a: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            self.float(unsafe { _mm512_xor_si512(self.bits(a), self.isplat(i32::MIN)) })
        }
        #[inline(always)]
        fn max(self, a: __m512, b: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        fn lt(self, a: __m512, b: __m512) -> __mmask16 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) }
        }
        #[inline(always)]
        fn ge(self, a: __m512, b: __m512) -> __mmask16 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b) }
        }
        #[inline(always)]
        fn eq(self, a: __m512, b: __m512) -> __mmask16 {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b) }
        }
        #[inline(always)]
        fn sel(self, m: __mmask16, a: __m512, b: __m512) -> __m512 {
            // SAFETY: the token proves AVX-512F. (blend takes the second operand
            // where the mask is set.)
            unsafe { _mm512_mask_blend_ps(m, b, a) }
        }
        #[inline(always)]
        fn all(self, m: __mmask16) -> bool {
            m == 0xFFFF
        }
        #[inline(always)]
        fn bits(self, a: __m512) -> __m512i {
            // SAFETY: the token proves AVX-512F (a bit cast, no instruction).
            unsafe { _mm512_castps_si512(a) }
        }
        #[inline(always)]
        fn float(self, i: __m512i) -> __m512 {
            // SAFETY: the token proves AVX-512F (a bit cast, no instruction).
            unsafe { _mm512_castsi512_ps(i) }
        }
        #[inline(always)]
        fn to_float(self, i: __m512i) -> __m512 {
            // SAFETY: the token proves AVX-512F; rounds by MXCSR (to nearest), as
            // Cranelift's cvtdq2ps does.
            unsafe { _mm512_cvtepi32_ps(i) }
        }
        #[inline(always)]
        fn isplat(self, v: i32) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_set1_epi32(v) }
        }
        #[inline(always)]
        fn iadd(self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn and(self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_and_si512(a, b) }
        }
        #[inline(always)]
        fn or(self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_or_si512(a, b) }
        }
        #[inline(always)]
        fn imin(self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_min_epi32(a, b) }
        }
        #[inline(always)]
        fn imax(self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_max_epi32(a, b) }
        }
        #[inline(always)]
        fn shl(self, a: __m512i, n: i32) -> __m512i {
            // SAFETY: the token proves AVX-512F (SSE2's cvtsi32 comes with it).
            unsafe { _mm512_sll_epi32(a, _mm_cvtsi32_si128(n)) }
        }
        #[inline(always)]
        fn sra(self, a: __m512i, n: i32) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_sra_epi32(a, _mm_cvtsi32_si128(n)) }
        }
        #[inline(always)]
        fn srl(self, a: __m512i, n: i32) -> __m512i {
            // SAFETY: the token proves AVX-512F.
            unsafe { _mm512_srl_epi32(a, _mm_cvtsi32_si128(n)) }
        }
    }

    impl Lanes for Avx2 {
        const LANES: usize = 8;
        type F = __m256;
        type I = __m256i;
        /// All-ones or all-zeros lanes, as `cmpps` gives them.
        type M = __m256;

        #[inline(always)]
        unsafe fn load(self, p: *const f32) -> __m256 {
            // SAFETY: the token (features); the caller (8 readable f32 at p).
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32, v: __m256) {
            // SAFETY: the token (features); the caller (8 writable f32 at p).
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn splat(self, v: f32) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_set1_ps(v) }
        }
        #[inline(always)]
        fn first(self, v: __m256) -> f32 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_cvtss_f32(v) }
        }
        #[inline(always)]
        fn add(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
            // SAFETY: the token proves FMA.
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn abs(self, a: __m256) -> __m256 {
            self.float(self.and(self.bits(a), self.isplat(i32::MAX)))
        }
        #[inline(always)]
        fn neg(self, a: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            self.float(unsafe { _mm256_xor_si256(self.bits(a), self.isplat(i32::MIN)) })
        }
        #[inline(always)]
        fn max(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_max_ps(a, b) }
        }
        #[inline(always)]
        fn lt(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(a, b) }
        }
        #[inline(always)]
        fn ge(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_cmp_ps::<_CMP_GE_OQ>(a, b) }
        }
        #[inline(always)]
        fn eq(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b) }
        }
        #[inline(always)]
        fn sel(self, m: __m256, a: __m256, b: __m256) -> __m256 {
            // SAFETY: the token proves AVX2. (blendv takes the second operand where the
            // mask's sign bit is set; compare masks are whole lanes.)
            unsafe { _mm256_blendv_ps(b, a, m) }
        }
        #[inline(always)]
        fn all(self, m: __m256) -> bool {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_movemask_ps(m) == 0xFF }
        }
        #[inline(always)]
        fn bits(self, a: __m256) -> __m256i {
            // SAFETY: the token proves AVX2 (a bit cast, no instruction).
            unsafe { _mm256_castps_si256(a) }
        }
        #[inline(always)]
        fn float(self, i: __m256i) -> __m256 {
            // SAFETY: the token proves AVX2 (a bit cast, no instruction).
            unsafe { _mm256_castsi256_ps(i) }
        }
        #[inline(always)]
        fn to_float(self, i: __m256i) -> __m256 {
            // SAFETY: the token proves AVX2; rounds by MXCSR (to nearest).
            unsafe { _mm256_cvtepi32_ps(i) }
        }
        #[inline(always)]
        fn isplat(self, v: i32) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_set1_epi32(v) }
        }
        #[inline(always)]
        fn iadd(self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn and(self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_and_si256(a, b) }
        }
        #[inline(always)]
        fn or(self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_or_si256(a, b) }
        }
        #[inline(always)]
        fn imin(self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_min_epi32(a, b) }
        }
        #[inline(always)]
        fn imax(self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_max_epi32(a, b) }
        }
        #[inline(always)]
        fn shl(self, a: __m256i, n: i32) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_sll_epi32(a, _mm_cvtsi32_si128(n)) }
        }
        #[inline(always)]
        fn sra(self, a: __m256i, n: i32) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_sra_epi32(a, _mm_cvtsi32_si128(n)) }
        }
        #[inline(always)]
        fn srl(self, a: __m256i, n: i32) -> __m256i {
            // SAFETY: the token proves AVX2.
            unsafe { _mm256_srl_epi32(a, _mm_cvtsi32_si128(n)) }
        }
    }

    impl Lanes for Xmm {
        const LANES: usize = 4;
        type F = __m128;
        type I = __m128i;
        /// All-ones or all-zeros lanes, as `cmpps` gives them.
        type M = __m128;

        #[inline(always)]
        unsafe fn load(self, p: *const f32) -> __m128 {
            // SAFETY: the token (features); the caller (4 readable f32 at p).
            unsafe { _mm_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32, v: __m128) {
            // SAFETY: the token (features); the caller (4 writable f32 at p).
            unsafe { _mm_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn splat(self, v: f32) -> __m128 {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_set1_ps(v) }
        }
        #[inline(always)]
        fn first(self, v: __m128) -> f32 {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_cvtss_f32(v) }
        }
        #[inline(always)]
        fn add(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_add_ps(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_sub_ps(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_mul_ps(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_div_ps(a, b) }
        }
        #[inline(always)]
        fn fma(self, a: __m128, b: __m128, c: __m128) -> __m128 {
            // SAFETY: the token proves FMA.
            unsafe { _mm_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn abs(self, a: __m128) -> __m128 {
            self.float(self.and(self.bits(a), self.isplat(i32::MAX)))
        }
        #[inline(always)]
        fn neg(self, a: __m128) -> __m128 {
            // SAFETY: SSE2, which x86-64 always has.
            self.float(unsafe { _mm_xor_si128(self.bits(a), self.isplat(i32::MIN)) })
        }
        #[inline(always)]
        fn max(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: the token proves AVX2 (and so AVX).
            unsafe { _mm_max_ps(a, b) }
        }
        #[inline(always)]
        fn lt(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: the token proves AVX2 (and so AVX's vcmpps).
            unsafe { _mm_cmp_ps::<_CMP_LT_OQ>(a, b) }
        }
        #[inline(always)]
        fn ge(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: the token proves AVX2 (and so AVX's vcmpps).
            unsafe { _mm_cmp_ps::<_CMP_GE_OQ>(a, b) }
        }
        #[inline(always)]
        fn eq(self, a: __m128, b: __m128) -> __m128 {
            // SAFETY: the token proves AVX2 (and so AVX's vcmpps).
            unsafe { _mm_cmp_ps::<_CMP_EQ_OQ>(a, b) }
        }
        #[inline(always)]
        fn sel(self, m: __m128, a: __m128, b: __m128) -> __m128 {
            // SAFETY: the token proves AVX2 (and so SSE4.1's blendvps; it takes the
            // second operand where the mask's sign bit is set; compare masks are
            // whole lanes).
            unsafe { _mm_blendv_ps(b, a, m) }
        }
        #[inline(always)]
        fn all(self, m: __m128) -> bool {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_movemask_ps(m) == 0xF }
        }
        #[inline(always)]
        fn bits(self, a: __m128) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has (a bit cast, no instruction).
            unsafe { _mm_castps_si128(a) }
        }
        #[inline(always)]
        fn float(self, i: __m128i) -> __m128 {
            // SAFETY: SSE2, which x86-64 always has (a bit cast, no instruction).
            unsafe { _mm_castsi128_ps(i) }
        }
        #[inline(always)]
        fn to_float(self, i: __m128i) -> __m128 {
            // SAFETY: SSE2, which x86-64 always has; rounds by MXCSR (to nearest), as
            // Cranelift's cvtdq2ps does.
            unsafe { _mm_cvtepi32_ps(i) }
        }
        #[inline(always)]
        fn isplat(self, v: i32) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_set1_epi32(v) }
        }
        #[inline(always)]
        fn iadd(self, a: __m128i, b: __m128i) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(self, a: __m128i, b: __m128i) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn and(self, a: __m128i, b: __m128i) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_and_si128(a, b) }
        }
        #[inline(always)]
        fn or(self, a: __m128i, b: __m128i) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_or_si128(a, b) }
        }
        #[inline(always)]
        fn imin(self, a: __m128i, b: __m128i) -> __m128i {
            // SAFETY: the token proves AVX2 (and so SSE4.1's pminsd).
            unsafe { _mm_min_epi32(a, b) }
        }
        #[inline(always)]
        fn imax(self, a: __m128i, b: __m128i) -> __m128i {
            // SAFETY: the token proves AVX2 (and so SSE4.1's pmaxsd).
            unsafe { _mm_max_epi32(a, b) }
        }
        #[inline(always)]
        fn shl(self, a: __m128i, n: i32) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_sll_epi32(a, _mm_cvtsi32_si128(n)) }
        }
        #[inline(always)]
        fn sra(self, a: __m128i, n: i32) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_sra_epi32(a, _mm_cvtsi32_si128(n)) }
        }
        #[inline(always)]
        fn srl(self, a: __m128i, n: i32) -> __m128i {
            // SAFETY: SSE2, which x86-64 always has.
            unsafe { _mm_srl_epi32(a, _mm_cvtsi32_si128(n)) }
        }
    }
}
