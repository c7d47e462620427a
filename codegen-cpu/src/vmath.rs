//! Inline math: Cranelift IR builders for the transcendental ops on f32, written into
//! the kernel's own code (no call per element), on scalars (`F32`) and on vectors of
//! four (`F32X4`) alike.
//!
//! Every function here reduces its argument to a small interval, approximates there
//! with a polynomial (coefficients fitted for this file by interpolation at Chebyshev
//! nodes in f64, or plain Taylor coefficients where those suffice), and puts the
//! result back together; special inputs (NaN, ±inf, ±0, subnormals, overflow and
//! underflow thresholds) are settled by selects, never by branches, so the same code
//! serves one lane or four and each lane gets what the scalar code would give it, bit
//! for bit.
//!
//! Polynomials and reductions are multiply-adds (`mul_add`): one fused `fma` where the
//! host has FMA ([`use_fma`](builder::use_fma)), a multiply and an add where it has not (Cranelift would
//! lower `fma` to a libcall per element there). Fused, the inline math of a gelu or a
//! softmax kernel runs about a sixth fewer vector instructions. The two forms may
//! differ in the last bit; both are held to the bounds below (`tests/vmath.rs` runs
//! every op in both), and `NDFUSE_CPU_FMA=0` gives the unfused bits on any host.
//!
//! Max error in ULP of f32 against the f64 reference (`ndfuse_ir::interp`) rounded to
//! f32: the bound each function is documented (and tested) to, and the max measured by
//! `tests/vmath.rs` over 2^20 log-uniform samples of both signs plus edge cases, through
//! both the vector and the scalar loop, with and without FMA (the same maxima):
//!
//! | op | bound | measured | how |
//! | --- | --- | --- | --- |
//! | exp | 1 | 1 | n = round(x/ln2), two-part ln2, degree-7 poly, 2^n as two factors |
//! | expm1 | 2 | 1 | exp's reduction; 2^n·em + (2^n - 1); x itself below 2^-25 |
//! | log | 1 | 1 | x = 2^k·m, m in [√½, √2); fdlibm-style s = f/(2+f) form, degree-4 R(s²) |
//! | log1p | 2 | 1 | log of u = 1+x with the rounding of u corrected by (x-(u-1))/u |
//! | tanh | 2 | 1 | |x| < 0.5493: |x| + |x|³·P(x²) (degree 6 in x²); else 1 - 2/(2^n·em + 2^n + 1) from exp's reduction of 2|x|; sign of x |
//! | sigmoid | 2 | 2 | e = exp(-|x|); 1/(1+e) or e/(1+e), the reference's two forms |
//! | erf | 2 | 2 | |x| < 1: |x|·P(x²) (degree 6 in x²); else 1 - exp(P(|x|-2.5)), P ≈ log erfc (degree 10) |
//! | rsqrt | 1 | 1 | 1/√x in f32 (two correct roundings) |
//! | sin | 1 | 1 | in f64: Cody-Waite reduction by π/2 in two parts, Taylor polys; f32x4 as two f64x2 |
//! | cos | 1 | 0 | as sin, one quadrant on |
//! | pow | 1 | 0 | in f64: log2 by the s = f/(2+f) series, exp2 by Taylor; f32x4 as two f64x2 |
//!
//! sin, cos and pow compute in f64 (an f32x4 as two f64x2 halves through the same code,
//! `sin_cos_f32x4` and `pow_f32x4`, in kernels of 2^16 elements or more): their
//! arguments leave the f64-internal fast path, through a branch to the exact libcall,
//! only where it cannot be accurate or cheap: |x| ≥ 2^24 or non-finite for sin/cos
//! (that needs Payne-Hanek reduction), and x ≤ 0, non-finite x or y for pow (the IEEE
//! special cases).
//!
//! The exp and log families are built for f64 too (`F64` and `F64X2`), by the same code
//! with the constants of the other precision (`Prec`): the reductions are exact in
//! both, and the polynomials are Taylor series long enough for f64 (13 terms for expm1,
//! 11 for log's R). Max error in ULP of f64 against the reference's libm, measured by
//! `tests/vmath_f64.rs` (2^20 samples plus edge cases, vector and scalar loops, fused
//! and unfused):
//!
//! | op | bound | measured | how |
//! | --- | --- | --- | --- |
//! | exp | 1 | 1 | as f32; 13-term Taylor expm1 polynomial |
//! | expm1 | 2 | 2 | as f32 |
//! | log | 1 | 1 | as f32; R(z) to z^11 |
//! | log1p | 2 | 1 | as f32 |
//! | tanh | 3 | 3 | E = 2^n·em + 2^n - 1 of 2|x|: E/(E+2) below 0.5493, else 1 - 2/(E+2) |
//! | sigmoid | 2 | 2 | as f32 |
//! | sin | 2 | 2 | r = x - n·π/2 with π/2 in three parts (33, 33, 53 bits), Taylor to r^17; exact libcall from |x| ≥ 2^20 |
//! | cos | 2 | 2 | as sin, Taylor to r^16 with 1 - r²/2 split |
//!
//! The other f64 transcendentals (erf, pow) call the exact libm functions (`libcalls`),
//! as the reference does: their bound is 0. An inline f64 erf needs its own fitted
//! polynomials and pow a double-word log; sin and cos would reach 1 ulp with a
//! double-word remainder. Left for later.

pub(crate) mod builder;
pub(crate) mod exp;
mod log;
pub(crate) mod pow;
pub(crate) mod trig;

use self::builder::{use_fma, Math};
use cranelift_codegen::ir::{types, InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;
use ndfuse_ir::UnaryOp;

/// Documented max ULP error of the f32 version of `op` (see the module table), `None`
/// for ops that are not transcendental here (exact IEEE operations are 0.5 ULP at most
/// and are not listed).
pub fn f32_ulp_bound(op: UnaryOp) -> Option<u32> {
    Some(match op {
        UnaryOp::Exp | UnaryOp::Log | UnaryOp::Rsqrt | UnaryOp::Sin | UnaryOp::Cos => 1,
        UnaryOp::Expm1 | UnaryOp::Log1p | UnaryOp::Sigmoid | UnaryOp::Erf | UnaryOp::Tanh => 2,
        _ => return None,
    })
}

/// Documented max ULP error of the f64 version of `op` (see the module's f64 table),
/// `None` for the f64 ops that call the exact libm functions instead.
pub fn f64_ulp_bound(op: UnaryOp) -> Option<u32> {
    Some(match op {
        UnaryOp::Exp | UnaryOp::Log => 1,
        UnaryOp::Expm1 | UnaryOp::Log1p | UnaryOp::Sigmoid | UnaryOp::Sin | UnaryOp::Cos => 2,
        UnaryOp::Tanh => 3,
        _ => return None,
    })
}

/// Documented max ULP error of the f32 `pow` (see the module table).
pub const POW_F32_ULP: u32 = 1;

/// Whether the f64 version of `op` is built here (for `F64` and `F64X2`); the other
/// f64 ops call the exact libm functions (`libcalls`).
pub(crate) fn vectorises_f64(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Expm1
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
    )
}

/// Whether the inline math builds `op` for `dtype`'s compute type (f16 and bf16 compute
/// in f32), on scalars and vectors alike.
pub(crate) fn inline_for(op: UnaryOp, dtype: ndfuse_ir::DType) -> bool {
    match dtype.compute_dtype() {
        ndfuse_ir::DType::F32 => vectorises(op),
        ndfuse_ir::DType::F64 => vectorises_f64(op),
        _ => false,
    }
}

/// Whether the f32 version of `op` is built here for vectors as well as scalars.
pub(crate) fn vectorises(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Expm1
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Erf
            | UnaryOp::Rsqrt
    )
}

/// `op` on `x`, an `F32`, `F32X4`, `F64` or `F64X2` value, as inline code; `None` when
/// `op` is not one of the ops that [`vectorises`] (f32) or [`vectorises_f64`] (f64).
pub(crate) fn unary(b: &mut FunctionBuilder<'_>, op: UnaryOp, x: Value) -> Option<Value> {
    let ty = b.func.dfg.value_type(x);
    if ty.lane_type() == types::F64 && !vectorises_f64(op) {
        return None;
    }
    let mut m = Math {
        b,
        ty,
        fma: use_fma(),
    };
    Some(match op {
        UnaryOp::Exp => m.exp(x),
        UnaryOp::Expm1 => m.expm1(x),
        UnaryOp::Log => m.log(x),
        UnaryOp::Log1p => m.log1p(x),
        UnaryOp::Tanh => m.tanh(x),
        UnaryOp::Sigmoid => m.sigmoid(x),
        UnaryOp::Erf => m.erf(x),
        UnaryOp::Rsqrt => {
            let root = m.b.ins().sqrt(x);
            let one = m.f(1.0);
            m.b.ins().fdiv(one, root)
        }
        _ => return None,
    })
}
