//! The exp family on wide registers (and on one 128-bit register, as the shared math
//! of small kernels): exp, expm1, tanh, sigmoid and erf.
//!
//! Each function is `vmath/exp.rs`'s f32 code with fused multiply-adds, operation for
//! operation (the same constants rounded to f32, the same order, the same fused
//! multiply-adds and selects), so every lane gets the bits the 128-bit inline code
//! gives it. The coefficient tables are copies of `vmath/builder.rs`'s (`EXPM1_Q`,
//! `LN2_HI`, `LN2_LO`, F32 `Prec`) and `vmath/exp.rs`'s (`TANH_SMALL`, `ERF_SMALL`,
//! `ERF_LARGE`); `tests/wide_math.rs` would catch one that drifted.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::lanes::{routines, Lanes};

/// 1.5·2^23: adding it rounds to an integer kept in the low mantissa bits.
pub(super) const MAGIC: f64 = 12_582_912.0;
pub(super) const MAGIC_BITS: i32 = 0x4B40_0000;
/// ln 2 in two parts (`vmath::builder::LN2_HI`, `LN2_LO`).
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;

/// (e^r - 1 - r) / r² on |r| ≤ ln2/2 (`vmath::builder::EXPM1_Q`).
const EXPM1_Q: [f64; 6] = [
    5.000_000_013e-1,
    1.666_666_668e-1,
    4.166_646_501e-2,
    8.333_310_935e-3,
    1.393_364_103e-3,
    1.989_098_082e-4,
];

/// (tanh(x) - x)/x³ in x² on |x| ≤ 0.5494 (`vmath::exp::TANH_SMALL`).
const TANH_SMALL: [f64; 7] = [
    -3.333_333_333e-1,
    1.333_333_298e-1,
    -5.396_806_465e-2,
    2.186_567_770e-2,
    -8.826_347_043e-3,
    3.405_443_991e-3,
    -9.663_967_826e-4,
];

/// erf(x)/x in x² on |x| ≤ 1 (`vmath::exp::ERF_SMALL`).
const ERF_SMALL: [f64; 7] = [
    1.128_379_166,
    -3.761_262_667e-1,
    1.128_359_472e-1,
    -2.685_421_201e-2,
    5.189_087_423e-3,
    -8.016_864_283e-4,
    7.875_875_049e-5,
];

/// log erfc(2.5 + v) in v on |v| ≤ 1.5 (`vmath::exp::ERF_LARGE`).
const ERF_LARGE: [f64; 11] = [
    -7.806_815_273,
    -5.352_680_741,
    -9.438_937_363e-1,
    -1.085_816_384e-2,
    2.165_501_739e-3,
    -4.207_096_483e-4,
    7.696_963_260e-5,
    -1.297_452_582e-5,
    1.829_792_778e-6,
    -6.614_636_555e-8,
    -3.834_714_563e-8,
];

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

/// e^x for x in [-104, 89] or NaN, 2^n in two factors (`Math::exp_core`).
#[inline(always)]
fn exp_core<L: Lanes>(l: L, x: L::F) -> L::F {
    let (ni, em) = exp_reduce(l, x);
    let p = l.add(l.splat(1.0), em);
    let n1 = l.sra(ni, 1);
    let n2 = l.isub(ni, n1);
    let v = l.mul(p, l.pow2(n1));
    l.mul(v, l.pow2(n2))
}

/// e^x (`Math::exp`): the fast path where every lane has |x| < 87, else the general
/// one; both give the same bits, so which lanes share a register does not matter.
#[inline(always)]
pub(super) fn exp<L: Lanes>(l: L, x: L::F) -> L::F {
    let ok = l.lt(l.abs(x), l.c(87.0));
    if l.all(ok) {
        let (ni, em) = exp_reduce(l, x);
        let v = l.add(l.splat(1.0), em);
        l.float(l.iadd(l.bits(v), l.shl(ni, 23)))
    } else {
        let xc = l.max_c(x, -104.0);
        let xc = l.min_c(xc, 89.0);
        exp_core(l, xc)
    }
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

/// The logistic function (`Math::sigmoid`).
#[inline(always)]
pub(super) fn sigmoid<L: Lanes>(l: L, x: L::F) -> L::F {
    let nx = l.neg(l.abs(x));
    let e = exp(l, nx);
    let one = l.splat(1.0);
    let den = l.add(one, e);
    let nonneg = l.ge(x, l.splat(0.0));
    let num = l.sel(nonneg, one, e);
    l.div(num, den)
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
