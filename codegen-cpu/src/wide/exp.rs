//! The exp family on wide registers (and on one 128-bit register, as the shared math
//! of small kernels): exp, expm1, tanh, sigmoid and erf.
//!
//! Each function is `vmath/exp.rs`'s f32 code with fused multiply-adds, operation for
//! operation (the same constants rounded to f32, the same order, the same fused
//! multiply-adds and selects), so every lane gets the bits the 128-bit inline code
//! gives it. The coefficient tables and constants are vmath's own (`vmath/builder.rs`,
//! `vmath/exp.rs`).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::lanes::Lanes;
use super::map::routines;
pub(super) use crate::vmath::builder::{EXPM1_Q, F32_PREC, LN2_HI, LN2_LO};
use crate::vmath::exp::{ERF_LARGE, ERF_SMALL, TANH_SMALL};

/// 1.5·2^23: adding it rounds to an integer kept in the low mantissa bits.
pub(super) const MAGIC: f64 = F32_PREC.magic;
pub(super) const MAGIC_BITS: i32 = F32_PREC.magic_bits as i32;

routines!(Exp, exp, exp_avx512, exp_avx2, exp_f32x4, exp_f32);
routines!(
    Expm1,
    expm1,
    expm1_avx512,
    expm1_avx2,
    expm1_f32x4,
    expm1_f32
);
routines!(Tanh, tanh, tanh_avx512, tanh_avx2, tanh_f32x4, tanh_f32);
routines!(
    Sigmoid,
    sigmoid,
    sigmoid_avx512,
    sigmoid_avx2,
    sigmoid_f32x4,
    sigmoid_f32
);
routines!(Erf, erf, erf_avx512, erf_avx2, erf_f32x4, erf_f32);

/// exp's reduction (`Math::exp_reduce`): `(n, em)`, x = n·ln2 + r, em = e^r - 1.
#[inline(always)]
fn exp_reduce<L: Lanes>(l: L, x: L::F) -> (L::I, L::F) {
    let magic = l.c(MAGIC);
    let t = l.fma(x, l.c(std::f64::consts::LOG2_E), magic);
    let neg_n = l.sub(magic, t);
    let ni = l.isub(l.bits(t), l.isplat(MAGIC_BITS));
    let r = l.fma(neg_n, l.splat(LN2_HI), x);
    let r = l.fma(neg_n, l.splat(LN2_LO), r);
    let q = l.horner(r, &EXPM1_Q);
    let rq = l.mul(r, q);
    (ni, l.fma(r, rq, r))
}

/// e^x (`Math::exp`): the fast path where every lane has |x| < 87, else the general
/// one; both give the same bits, so which lanes share a register does not matter.
#[inline(always)]
pub(super) fn exp<L: Lanes>(l: L, x: L::F) -> L::F {
    if exp_is_normal(l, x) {
        exp_normal(l, x)
    } else {
        exp_general(l, x)
    }
}

/// Whether every lane has |x| < 87, where e^x is a normal number.
#[inline(always)]
fn exp_is_normal<L: Lanes>(l: L, x: L::F) -> bool {
    l.all(l.lt(l.abs(x), l.c(87.0)))
}

/// e^x where it is a normal number (|x| < 87): 2^n goes straight into the exponent
/// bits of 1 + em, exactly.
#[inline(always)]
fn exp_normal<L: Lanes>(l: L, x: L::F) -> L::F {
    let (ni, em) = exp_reduce(l, x);
    let v = l.add(l.splat(1.0), em);
    l.float(l.iadd(l.bits(v), l.shl(ni, 23)))
}

/// e^x for any x: `Math::exp`'s general path (clamp to [-104, 89], then 2^n in two
/// factors, so that a subnormal result is rounded once) with the same bits, but with
/// no floating-point operation that underflows. On AMD Zen 4 a register of which some
/// lane underflows costs a microcode assist: exp over inputs in the subnormal band ran
/// 3.6x slower than over |x| < 87 (0.73 against 0.20 ns an element, AVX-512), and the
/// gelu epilogue of a matrix product, whose large outputs reach that band in a few
/// percent of the lanes, spent most of its time there.
///
/// A subnormal result p·2^n (p = 1 + em in [0.7, 1.5), n ≤ -126) is p·2^n rounded
/// once to a multiple of 2^-149: that is y = p·2^(n+149) (exact: a power-of-two
/// scaling of a normal number) rounded to an integer m, which adding 2^23 does (to
/// nearest, ties to even, for y < 2^23), and m is the subnormal's bit pattern (2^23
/// that of the smallest normal). The 128-bit inline code keeps the two-factor
/// multiply, so `tests/wide_math.rs` checks this against the hardware's rounding, over
/// every f32 of the band. Lanes whose result is normal scale by 2^n in two factors as
/// `Math::exp_core` does (e^89's overflow included).
#[inline(always)]
fn exp_general<L: Lanes>(l: L, x: L::F) -> L::F {
    // e^-104 rounds to 0 and e^89 overflows: clamping changes no result.
    let xc = l.max_c(x, -104.0);
    let xc = l.min_c(xc, 89.0);
    let (y, m, p, ni) = exp_subnormal(l, xc);
    let sub = l.lt(y, l.c(TWO_23));
    // The normal lanes: p·2^n1·2^n2 (n ≥ -126 there). The subnormal ones compute
    // 1·2^-126 instead, which cannot underflow, and take m.
    let pn = l.sel(sub, l.splat(1.0), p);
    let nn = l.imax(ni, l.isplat(-126));
    let n1 = l.sra(nn, 1);
    let n2 = l.isub(nn, n1);
    let v = l.mul(l.mul(pn, l.pow2(n1)), l.pow2(n2));
    l.sel(sub, l.float(m), v)
}

/// e^x for x ≤ 0 (or NaN) on `exp_general`'s terms, cheaper: no result overflows, so
/// a normal one is 2^n put into the exponent bits of p, exactly, as on the fast path.
#[inline(always)]
fn exp_general_nonpositive<L: Lanes>(l: L, x: L::F) -> L::F {
    let xc = l.max_c(x, -104.0);
    let (y, m, p, ni) = exp_subnormal(l, xc);
    let v = l.float(l.iadd(l.bits(p), l.shl(ni, 23)));
    // A NaN lane is neither subnormal nor normal: it keeps p, a NaN.
    let normal = l.ge(y, l.c(TWO_23));
    let sub = l.lt(y, l.c(TWO_23));
    l.sel(normal, v, l.sel(sub, l.float(m), p))
}

/// 2^23: where y = p·2^(n+149) starts to be a normal result (see `exp_general`).
const TWO_23: f64 = 8_388_608.0;

/// The reduction of x in [-104, 89] (or NaN) and its subnormal case (see
/// `exp_general`): `(y, m, p, n)`, e^x = p·2^n, subnormal where y < 2^23 (normal
/// where y ≥ 2^23; neither for NaN), and then of bit pattern m.
#[inline(always)]
fn exp_subnormal<L: Lanes>(l: L, xc: L::F) -> (L::F, L::I, L::F, L::I) {
    let (ni, em) = exp_reduce(l, xc);
    let p = l.add(l.splat(1.0), em);
    let (y, m) = subnormal_pattern(l, p, ni);
    (y, m, p, ni)
}

/// `exp_subnormal`'s `(y, m)` for e^x = p·2^n: y = p·2^min(n + 149, 24), below 2^23
/// exactly where p·2^n is subnormal (n ≤ -127; n = -126 with p < 1), from 2^23 on for
/// every normal result; and m, the subnormal's bit pattern (y rounded to an integer).
#[inline(always)]
fn subnormal_pattern<L: Lanes>(l: L, p: L::F, ni: L::I) -> (L::F, L::I) {
    let k = l.imin(l.iadd(ni, l.isplat(149)), l.isplat(24));
    let y = l.mul(p, l.pow2(k));
    let two23 = l.c(TWO_23);
    (y, l.isub(l.bits(l.add(y, two23)), l.bits(two23)))
}

/// e^x - 1 for x in [-20, 89] or NaN (`Math::expm1_core`).
#[inline(always)]
fn expm1_core<L: Lanes>(l: L, x: L::F) -> L::F {
    let (ni, em) = exp_reduce(l, x);
    // `ni > 127 ? 127 : ni`.
    let nc = l.imin(ni, l.isplat(127));
    let extra = l.isub(ni, nc);
    let s = l.pow2(nc);
    let one = l.splat(1.0);
    let sm1 = l.sub(s, one);
    let se = l.mul(s, em);
    let u = l.add(se, sm1);
    let w = l.pow2(extra);
    let wm1 = l.sub(w, one);
    let wu = l.mul(w, u);
    l.add(wu, wm1)
}

/// e^x - 1 (`Math::expm1`).
#[inline(always)]
pub(super) fn expm1<L: Lanes>(l: L, x: L::F) -> L::F {
    let xc = l.max_c(x, -20.0);
    let xc = l.min_c(xc, 89.0);
    let v = expm1_core(l, xc);
    let tiny = l.lt(l.abs(x), l.c(2.980_232_238_769_531_2e-8));
    l.sel(tiny, x, v)
}

/// tanh (`Math::tanh`, f32).
#[inline(always)]
pub(super) fn tanh<L: Lanes>(l: L, x: L::F) -> L::F {
    // `Math::tanh_reduce`.
    let a = l.min_c(l.abs(x), 9.1);
    let a2 = l.add(a, a);
    let (ni, em) = exp_reduce(l, a2);
    let s = l.pow2(ni);

    let one = l.splat(1.0);
    let s1 = l.add(s, one);
    let den = l.fma(s, em, s1);
    let q = l.div(l.splat(2.0), den);
    let large = l.sub(one, q);
    let z = l.mul(a, a);
    let p = l.horner(z, &TANH_SMALL);
    let zp = l.mul(z, p);
    let small = l.fma(a, zp, a);
    let is_small = l.lt(a, l.c(0.549_306_1));
    let t = l.sel(is_small, small, large);
    l.with_sign_of(t, x)
}

/// The logistic function (`Math::sigmoid`): num / (1 + e) with e = e^-|x| and num 1
/// or e by the sign of x.
#[inline(always)]
pub(super) fn sigmoid<L: Lanes>(l: L, x: L::F) -> L::F {
    let nx = l.neg(l.abs(x));
    if exp_is_normal(l, nx) {
        return sigmoid_normal(l, x, nx);
    }
    let one = l.splat(1.0);
    let nonneg = l.ge(x, l.splat(0.0));
    let e = exp_general_nonpositive(l, nx);
    let den = l.add(one, e);
    let num = l.sel(nonneg, one, e);
    // Where e is below 2^-24, den is 1 and the quotient is num itself. A subnormal
    // quotient costs a microcode assist (see `exp_general`), so where e is subnormal 1
    // is divided instead, and num taken where e < 2^-24: two masks, so that the
    // compiler cannot fold the two selects back into a division of num.
    let subnormal = l.lt(e, l.splat(f32::MIN_POSITIVE));
    let q = l.div(l.sel(subnormal, one, num), den);
    let den_is_one = l.lt(e, l.c(5.960_464_477_539_063e-8));
    l.sel(den_is_one, num, q)
}

/// [`sigmoid`] where every lane has |x| < 87, given nx = -|x|.
#[inline(always)]
fn sigmoid_normal<L: Lanes>(l: L, x: L::F, nx: L::F) -> L::F {
    logistic_of(l, x, exp_normal(l, nx))
}

/// The logistic function of x given e = e^-|x|: num / (1 + e), num 1 or e by the sign
/// of x.
#[inline(always)]
fn logistic_of<L: Lanes>(l: L, x: L::F, e: L::F) -> L::F {
    let one = l.splat(1.0);
    let nonneg = l.ge(x, l.splat(0.0));
    l.div(l.sel(nonneg, one, e), l.add(one, e))
}

/// erf (`Math::erf`).
#[inline(always)]
pub(super) fn erf<L: Lanes>(l: L, x: L::F) -> L::F {
    let ax = l.abs(x);
    let z = l.mul(ax, ax);
    let p = l.horner(z, &ERF_SMALL);
    let small = l.mul(ax, p);
    let a = l.min_c(ax, 4.0);
    let v = l.add(a, l.c(-2.5));
    let lg = l.horner(v, &ERF_LARGE);
    let e = exp(l, lg);
    let large = l.sub(l.splat(1.0), e);
    let is_small = l.lt(ax, l.splat(1.0));
    let r = l.sel(is_small, small, large);
    l.with_sign_of(r, x)
}

/// gelu's tail on f32, `x · sigmoid(c2 · (x + c1 · x·x·x))` (tanh's form, as the
/// passes expand it: `x·(x·x)` rounded at each step, then the constant, the sum, the
/// constant, the logistic function, the product), for `n` elements of `src` into
/// `dst`: each operation the instruction of the kernel compiled whole would do, in
/// its order, so the same bits. `blocks` calls it in place of the two segments and the
/// sigmoid a gelu epilogue would take, its intermediate values never leaving
/// registers.
///
/// Safety contract (as `UnaryFn`'s): the host has the routine's tier, and `src` and
/// `dst` are valid for `n` f32, the same pointer or not overlapping.
pub(crate) type GeluFn =
    unsafe extern "C" fn(src: *const f32, dst: *mut f32, n: usize, c1: f32, c2: f32);

/// gelu's tail over a sum, `x = a + b` (a bias added to a matrix product): as
/// [`GeluFn`] with `x` the f32 sum of `a[i]` and `b[i]`, which stays in registers.
///
/// Safety contract: as [`GeluFn`]'s, with `a` and `b` each valid for `n` f32 and `dst`
/// equal to `a`, or to `b`, or overlapping neither.
pub(crate) type GeluSumFn =
    unsafe extern "C" fn(a: *const f32, b: *const f32, dst: *mut f32, n: usize, c1: f32, c2: f32);

/// [`GeluFn`]'s function of one register, with its two constants. `SPREAD` is for
/// values mostly far from 0 (a matrix product's outputs, [`GeluSumFn`]): it skips the
/// test for the unclamped fast path, which nearly every register fails there (the
/// clamped path gives the same bits, for 3 more operations a register).
#[derive(Debug)]
struct GeluTanh<const SPREAD: bool> {
    c1: f32,
    c2: f32,
}

impl<const SPREAD: bool> super::map::Op for GeluTanh<SPREAD> {
    #[inline(always)]
    fn apply<L: Lanes>(&self, l: L, x: L::F) -> L::F {
        let sq = l.mul(x, x);
        let cube = l.mul(x, sq);
        let t = l.mul(cube, l.splat(self.c1));
        let inner = l.add(x, t);
        let z = l.mul(inner, l.splat(self.c2));
        let nz = l.neg(l.abs(z));
        if !SPREAD && exp_is_normal(l, nz) {
            return l.mul(x, sigmoid_normal(l, z, nz));
        }
        // The logistic function's general path costs about twice the fast one, and a
        // matrix product's outputs send most registers there (|z| > 87 in a third of
        // the lanes where their deviation is 10). But the logistic function is 1 for
        // z ≥ 86.9 and 0 for z ≤ -104.2 (e^z < 2^-150 rounds to 0), as the fast
        // path on -|z| clamped to -86.9 and a select give. Only the band between,
        // where e^z is subnormal or near it (1.6% of such lanes), needs more.
        let off_band = l.abs(l.add(z, l.c(95.55)));
        if l.all(l.ge(off_band, l.c(8.65))) {
            return gelu_clamped(l, x, z, nz);
        }
        // Some lane is in the band (or NaN). There the logistic function is e^z itself
        // (1 + e^z rounds to 1), subnormal below z = -87.3, and x times it is
        // subnormal or close: the general path's operations on those values cost a
        // microcode assist each (see `exp_general`). So where no lane is NaN and the
        // band's lanes have |x| < 2^40, the band's lanes are computed apart, from
        // integers (`gelu_with_band`), and selected. Over 4M f32 of N(0, 10.7) (a matrix
        // product's outputs) that was 0.89 ns an element against 0.99 on the general
        // path; with one reduction for both kinds of lane, and registers in pairs, a
        // bias added first (`GeluSumFn`), 0.66 against 0.75 one register at a time
        // with two reductions.
        let band = l.lt(off_band, l.c(8.65));
        let xa = l.abs(x);
        let tame = l.all(l.eq(z, z)) && l.all(l.lt(l.sel(band, xa, l.splat(0.0)), l.c(TWO_40)));
        if tame {
            gelu_with_band(l, x, z, nz, band)
        } else {
            l.mul(x, sigmoid(l, z))
        }
    }
}

/// x · sigmoid(z) where no lane has e^z subnormal: the fast path on -|z| clamped to
/// -86.9 (nz = -|z|), 0 in place of the logistic function where z < -95.
#[inline(always)]
fn gelu_clamped<L: Lanes>(l: L, x: L::F, z: L::F, nz: L::F) -> L::F {
    clamped_product(l, x, z, sigmoid_normal(l, z, l.max(nz, l.c(-86.9))))
}

/// x · s, with 0 in place of the logistic function s where z < -95 ([`gelu_clamped`]).
#[inline(always)]
fn clamped_product<L: Lanes>(l: L, x: L::F, z: L::F, s: L::F) -> L::F {
    l.mul(x, l.sel(l.lt(z, l.c(-95.0)), l.splat(0.0), s))
}

/// x · sigmoid(z) in a register with lanes in the `band` (z in (-104.2, -86.9), where
/// the logistic function is e^z, subnormal or near it; there |x| < 2^40): the bits of
/// `x · sigmoid(z)` on the general path, with no floating-point operation that has a
/// subnormal operand or result (an assist each on Zen 4, see `exp_general`). One
/// reduction serves both kinds of lane: of z (≥ -104, as `exp_general` clamps) in the
/// band, of -|z| clamped to -86.9 outside it, as [`gelu_clamped`] takes it.
///
/// In the band, e = e^z as the general path rounds it: p·2^n (exact) where normal, else
/// the integer m of `exp_subnormal`. e' = e·2^149 is then exact from bits alone (m
/// converted, or n raised by 149), and |x|·e' cannot overflow (e' < 2^25). The product
/// x·e rounds once: to an integer multiple of 2^-149 where it is subnormal (|x|·e' <
/// 2^23: the fused multiply-add |x|·e' + 2^23 does that rounding, and its low bits are
/// the pattern), else to 24 bits (|x|·e' rounded, scaled back by 2^-149 in two exact
/// steps). Each path's operands are replaced by harmless ones (0, 1) in the other's
/// lanes, whose results the last select drops.
#[inline(always)]
fn gelu_with_band<L: Lanes>(l: L, x: L::F, z: L::F, nz: L::F, band: L::M) -> L::F {
    let one = l.splat(1.0);
    let two23 = l.c(TWO_23);
    let w = l.max(nz, l.sel(band, l.c(-104.0), l.c(-86.9)));
    let (ni, em) = exp_reduce(l, w);
    let p = l.add(one, em);
    let normal_bits = l.iadd(l.bits(p), l.shl(ni, 23));
    // Outside the band: `gelu_clamped`, its e^-|z| being `exp_normal`'s.
    let e = l.sel(band, l.splat(0.0), l.float(normal_bits));
    let clamped = clamped_product(l, x, z, logistic_of(l, z, e));
    // In the band: `exp_subnormal`'s y and m from the same reduction, then x·e.
    let (y, m) = subnormal_pattern(l, p, ni);
    let scaled = l.sel(
        l.lt(y, two23),
        l.to_float(m),
        l.float(l.iadd(normal_bits, l.isplat(149 << 23))),
    );
    let scaled = l.sel(band, scaled, one);
    let xb = l.sel(band, l.abs(x), one);
    let product = l.mul(xb, scaled);
    let sub = l.lt(product, two23);
    let pattern = l.isub(l.bits(l.fma(xb, scaled, two23)), l.bits(two23));
    // max(product, 2^23) is 2^23 exactly in the `sub` lanes: a select here let LLVM
    // move the scalings into both of its arms (folding the constant one), so the
    // product itself was scaled to a subnormal in those lanes (and in every lane
    // outside the band, where it is 1): an assist each on Intel, which made the whole
    // routine 2.3x slower over a matrix product's outputs (Xeon, 2026-11-29). A max
    // keeps the operand of the scalings at least 2^23, so they stay normal.
    let normal = l.mul(l.mul(l.max(product, two23), l.c(TWO_M75)), l.c(TWO_M74));
    let banded = l.with_sign_of(l.sel(sub, l.float(pattern), normal), x);
    l.sel(band, banded, clamped)
}

/// 2^40, 2^-75 and 2^-74: [`gelu_with_band`]'s bound on |x| and its scalings back.
const TWO_40: f64 = 1_099_511_627_776.0;
const TWO_M75: f64 = 2.646_977_960_169_688_6e-23;
const TWO_M74: f64 = 5.293_955_920_339_377e-23;

/// The two gelu routines of one tier: `$tanh` ([`GeluFn`], through `map`) and `$sum`
/// ([`GeluSumFn`], through `map_sum`, for a product's outputs: `GeluTanh<true>`), on
/// the registers of `$lanes` with its features `$features`.
macro_rules! gelu_routines {
    ($tanh:ident, $sum:ident, $lanes:ident, $features:literal) => {
        /// [`GeluFn`] on this tier.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        pub(super) unsafe extern "C" fn $tanh(
            src: *const f32,
            dst: *mut f32,
            n: usize,
            c1: f32,
            c2: f32,
        ) {
            // SAFETY: a `GeluFn`'s contract: the caller checked that the host has this
            // routine's features (the token's requirement) and that `src` and `dst` are
            // valid for `n` f32, equal or not overlapping (`map`'s).
            let l = unsafe { super::lanes::$lanes::assume() };
            // SAFETY: as above.
            unsafe { super::map::map(l, &GeluTanh::<false> { c1, c2 }, src, dst, n) }
        }

        /// [`GeluSumFn`] on this tier.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        pub(super) unsafe extern "C" fn $sum(
            a: *const f32,
            b: *const f32,
            dst: *mut f32,
            n: usize,
            c1: f32,
            c2: f32,
        ) {
            // SAFETY: a `GeluSumFn`'s contract: the host has this routine's features
            // (the token's requirement); `a`, `b` and `dst` are valid for `n` f32, `dst`
            // equal to one of them or overlapping neither (`map_sum`'s).
            let l = unsafe { super::lanes::$lanes::assume() };
            // SAFETY: as above.
            unsafe { super::map::map_sum(l, &GeluTanh::<true> { c1, c2 }, (a, b), dst, n) }
        }
    };
}

gelu_routines!(
    gelu_tanh_avx512,
    gelu_sum_avx512,
    Avx512,
    "avx512f,fma,f16c"
);
gelu_routines!(gelu_tanh_avx2, gelu_sum_avx2, Avx2, "avx2,fma,f16c");
