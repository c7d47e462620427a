//! The log family on wide registers (and on one 128-bit register, as the shared math
//! of small kernels): log and log1p.
//!
//! `vmath/log.rs`'s f32 code with fused multiply-adds, operation for operation, so
//! every lane gets the bits of the 128-bit inline code, with vmath's own constants
//! (`LOG_R` and the F32 `Prec` of `vmath/builder.rs`).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::exp::{F32_PREC, LN2_HI, LN2_LO};
use super::lanes::Lanes;
use super::map::routines;
use crate::vmath::builder::LOG_R;

/// The bits of 1 and of √½, the mantissa mask.
const ONE_BITS: i32 = F32_PREC.one_bits as i32;
const SQRT_HALF_BITS: i32 = F32_PREC.sqrt_half_bits as i32;
const MANT_MASK: i32 = F32_PREC.mant_mask as i32;
/// Subnormals are scaled by 2^25 before the core.
const SUB_SCALE_LOG2: i32 = F32_PREC.sub_scale_log2;
/// Below this |x|, log1p(x) rounds to x (2^-24).
const LOG1P_TINY: f64 = F32_PREC.log1p_tiny;

routines!(Log, log, log_avx512, log_avx2, log_f32x4, log_f32);
routines!(
    Log1p,
    log1p,
    log1p_avx512,
    log1p_avx2,
    log1p_f32x4,
    log1p_f32
);

/// log(u) + c for u positive, normal and finite, `k_adj` taken off the exponent
/// (`Math::log_core`).
#[inline(always)]
fn log_core<L: Lanes>(l: L, u: L::F, c: Option<L::F>, k_adj: Option<L::F>) -> L::F {
    let ix = l.iadd(l.bits(u), l.isplat(ONE_BITS - SQRT_HALF_BITS));
    let k = l.srl(ix, 23);
    let k = l.isub(k, l.isplat(127));
    let mant = l.and(ix, l.isplat(MANT_MASK));
    let mant = l.iadd(mant, l.isplat(SQRT_HALF_BITS));
    let m = l.float(mant);
    let one = l.splat(1.0);
    let f = l.sub(m, one);
    let den = l.add(l.splat(2.0), f);
    let s = l.div(f, den);
    let z = l.mul(s, s);
    let p = l.horner(z, &LOG_R);
    let r = l.mul(z, p);
    let ff = l.mul(f, f);
    let hfsq = l.mul(ff, l.splat(0.5));
    let mut kf = l.to_float(k);
    if let Some(adj) = k_adj {
        kf = l.sub(kf, adj);
    }
    let hr = l.add(hfsq, r);
    let kl = l.mul(kf, l.splat(LN2_LO));
    let lo = l.fma(s, hr, kl);
    let lo = match c {
        Some(c) => l.add(lo, c),
        None => lo,
    };
    let t = l.sub(hfsq, lo);
    let t = l.sub(t, f);
    let kh = l.mul(kf, l.splat(LN2_HI));
    l.sub(kh, t)
}

/// log's special inputs at `u`: 0 → -inf, inf → inf, negative or NaN → NaN
/// (`Math::log_specials`).
#[inline(always)]
fn log_specials<L: Lanes>(l: L, u: L::F, v: L::F) -> L::F {
    let zero = l.eq(u, l.splat(0.0));
    let v = l.sel(zero, l.splat(f32::NEG_INFINITY), v);
    let inf = l.splat(f32::INFINITY);
    let is_inf = l.eq(u, inf);
    let v = l.sel(is_inf, inf, v);
    let ok = l.ge(u, l.splat(0.0));
    l.sel(ok, v, l.splat(f32::NAN))
}

/// log (`Math::log`).
#[inline(always)]
pub(super) fn log<L: Lanes>(l: L, x: L::F) -> L::F {
    let sub = l.lt(x, l.splat(f32::MIN_POSITIVE));
    let big = l.mul(x, l.c(2f64.powi(SUB_SCALE_LOG2)));
    let u = l.sel(sub, big, x);
    let adj = l.sel(sub, l.c(f64::from(SUB_SCALE_LOG2)), l.splat(0.0));
    let v = log_core(l, u, None, Some(adj));
    log_specials(l, x, v)
}

/// log(1 + x) (`Math::log1p`).
#[inline(always)]
pub(super) fn log1p<L: Lanes>(l: L, x: L::F) -> L::F {
    let one = l.splat(1.0);
    let u = l.add(one, x);
    let um1 = l.sub(u, one);
    let d = l.sub(x, um1);
    let c = l.div(d, u);
    let v = log_core(l, u, Some(c), None);
    let v = log_specials(l, u, v);
    let tiny = l.lt(l.abs(x), l.c(LOG1P_TINY));
    l.sel(tiny, x, v)
}
