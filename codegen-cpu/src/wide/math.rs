//! Which wide routine computes which unary op (filled in by the exp and log files),
//! and which precompiled 128-bit function is an op's shared math.

use super::tier::{Tier, UnaryFn};
use ndfuse_ir::UnaryOp;

/// The routine of `op` at `tier`, where the wide path has one: the exp and log
/// families of the inline math (`vmath`), on x86-64 only.
#[cfg(target_arch = "x86_64")]
pub(super) fn unary_fn(op: UnaryOp, tier: Tier) -> Option<UnaryFn> {
    use super::{exp, log};
    let (avx512, avx2): (UnaryFn, UnaryFn) = match op {
        UnaryOp::Exp => (exp::exp_avx512, exp::exp_avx2),
        UnaryOp::Expm1 => (exp::expm1_avx512, exp::expm1_avx2),
        UnaryOp::Tanh => (exp::tanh_avx512, exp::tanh_avx2),
        UnaryOp::Sigmoid => (exp::sigmoid_avx512, exp::sigmoid_avx2),
        UnaryOp::Erf => (exp::erf_avx512, exp::erf_avx2),
        UnaryOp::Log => (log::log_avx512, log::log_avx2),
        UnaryOp::Log1p => (log::log1p_avx512, log::log1p_avx2),
        _ => return None,
    };
    if !tier.available() {
        return None;
    }
    Some(match tier {
        Tier::Avx512 => avx512,
        Tier::Avx2 => avx2,
    })
}

/// The shared math of one op on one `f32x4` (C ABI: the register in and out in
/// `xmm0`, as Cranelift's `(f32x4) -> f32x4` System V functions; the lint knows no
/// SIMD types).
#[allow(improper_ctypes_definitions)]
#[cfg(target_arch = "x86_64")]
pub(crate) type SharedX4Fn =
    unsafe extern "C" fn(std::arch::x86_64::__m128) -> std::arch::x86_64::__m128;

/// The shared math of one op on one `f32` (C ABI, as Cranelift's `(f32) -> f32`).
#[cfg(target_arch = "x86_64")]
pub(crate) type SharedX1Fn = unsafe extern "C" fn(f32) -> f32;

/// The precompiled 128-bit shared math of `op` (`shared_math`): its `f32x4` and `f32`
/// functions, the exp and log families' algorithms on one SSE register, where the
/// host can run them (AVX2 and FMA, detected here). Safe to call on such a host: the
/// functions read and write registers only.
#[cfg(target_arch = "x86_64")]
pub(crate) fn shared_fns(op: UnaryOp) -> Option<(SharedX4Fn, SharedX1Fn)> {
    use super::{exp, log};
    let fns: (SharedX4Fn, SharedX1Fn) = match op {
        UnaryOp::Exp => (exp::exp_f32x4, exp::exp_f32),
        UnaryOp::Expm1 => (exp::expm1_f32x4, exp::expm1_f32),
        UnaryOp::Tanh => (exp::tanh_f32x4, exp::tanh_f32),
        UnaryOp::Sigmoid => (exp::sigmoid_f32x4, exp::sigmoid_f32),
        UnaryOp::Erf => (exp::erf_f32x4, exp::erf_f32),
        UnaryOp::Log => (log::log_f32x4, log::log_f32),
        UnaryOp::Log1p => (log::log1p_f32x4, log::log1p_f32),
        _ => return None,
    };
    super::lanes::Xmm::new().map(|_| fns)
}

/// No wide routines off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) fn unary_fn(op: UnaryOp, tier: Tier) -> Option<UnaryFn> {
    let _ = (op, tier);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [UnaryOp; 7] = crate::wide::tier::UNARY_OPS;

    /// In place (`src == dst`, which the safe `wide::unary` cannot express) gives the
    /// bits of two buffers, tails included; `tests/wide_math.rs` checks those against
    /// the 128-bit code.
    #[test]
    fn in_place_matches_two_buffers() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        // Random bit patterns: every sign and exponent, NaNs and infinities among them.
        let xs: Vec<f32> = (0..1000)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                f32::from_bits((state >> 32) as u32)
            })
            .collect();
        for t in [Tier::Avx512, Tier::Avx2]
            .into_iter()
            .filter(|t| t.available())
        {
            for op in OPS {
                let f = unary_fn(op, t).expect("a routine for every listed op");
                for n in [0, 1, t.lanes() - 1, t.lanes() + 1, 1000] {
                    let mut apart = vec![0.0f32; n];
                    let mut buf = xs[..n].to_vec();
                    let p = buf.as_mut_ptr();
                    // SAFETY: `f` is a routine of a tier the host has (`available`);
                    // `xs` and `apart` are distinct buffers of at least `n` f32, and `p`
                    // is valid for `n` f32, read and written in place.
                    unsafe {
                        f(xs.as_ptr(), apart.as_mut_ptr(), n);
                        f(p, p, n);
                    }
                    for (i, (a, b)) in apart.iter().zip(&buf).enumerate() {
                        assert!(
                            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                            "{} {} n = {n}: element {i} in place {b:e}, apart {a:e}",
                            t.name(),
                            op.name()
                        );
                    }
                }
            }
        }
    }
}
