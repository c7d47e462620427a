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
//! host has FMA ([`use_fma`]), a multiply and an add where it has not (Cranelift would
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

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{types, Endianness, InstBuilder, MemFlagsData, Type, Value};
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

/// Whether the math here uses fused multiply-adds: when the host ISA has FMA, unless
/// `NDFUSE_CPU_FMA=0` asks for the unfused code every x86-64 runs (read once per
/// process, as the ISA is built once). Both forms are held to the same ULP bounds
/// (`tests/vmath.rs` checks each); their results may differ in the last bit, so for
/// bit-identical results across hosts with and without FMA, set the variable.
pub fn use_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| {
        let off = std::env::var("NDFUSE_CPU_FMA")
            .is_ok_and(|v| matches!(v.trim(), "0" | "false" | "off" | "no"));
        !off && crate::jit::host_isa().is_ok_and(|isa| {
            isa.isa_flags()
                .iter()
                .any(|f| f.name == "has_fma" && f.as_bool() == Some(true))
        })
    })
}

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

/// sin (`cos` false) or cos of the scalar f32 `x`, computed in f64: `(value, exact)`,
/// where `exact` (an I8) is 1 when `x` is outside the fast path's domain (|x| ≥ 2^24,
/// inf, NaN) and the caller must use the exact libcall instead of `value`.
pub(crate) fn sin_cos_f32(b: &mut FunctionBuilder<'_>, x: Value, cos: bool) -> (Value, Value) {
    let exact = sin_cos_exact(b, x);
    let mut m = Math {
        b,
        ty: types::F64,
        fma: use_fma(),
    };
    let xd = m.b.ins().fpromote(types::F64, x);
    let v = m.sin_cos_core(xd, cos);
    let v = m.b.ins().fdemote(types::F32, v);
    (sin_keeps_zero(m.b, x, v, cos), exact)
}

/// sin or cos of an `F32X4` `x`, each lane computed exactly as [`sin_cos_f32`] computes
/// it (the same f64 operations, two lanes at a time): `(value, exact, lanes)`, where
/// `lanes` (an I32X4 mask) marks the lanes outside the fast path's domain and `exact`
/// (an I8) is 1 when there is one; the caller then uses the exact function there.
pub(crate) fn sin_cos_f32x4(
    b: &mut FunctionBuilder<'_>,
    x: Value,
    cos: bool,
) -> (Value, Value, Value) {
    let lanes = sin_cos_exact(b, x);
    let exact = b.ins().vany_true(lanes);
    let mut m = Math {
        b,
        ty: types::F64X2,
        fma: use_fma(),
    };
    let (lo, hi) = halves_f64x2(m.b, x);
    let vlo = m.sin_cos_core(lo, cos);
    let vhi = m.sin_cos_core(hi, cos);
    let v = join_f32x4(m.b, vlo, vhi);
    (sin_keeps_zero(m.b, x, v, cos), exact, lanes)
}

/// Not (|x| < 2^24), lane by lane (true for NaN as well): where sin and cos of f32
/// leave the fast path.
fn sin_cos_exact(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    let ty = b.func.dfg.value_type(x);
    let ax = b.ins().fabs(x);
    let limit = b.ins().f32const(Ieee32::with_float(16_777_216.0));
    let limit = if ty.is_vector() {
        b.ins().splat(ty, limit)
    } else {
        limit
    };
    b.ins()
        .fcmp(FloatCC::UnorderedOrGreaterThanOrEqual, ax, limit)
}

/// sin (`cos` false) or cos of the `F64` or `F64X2` value `x`, to f64 accuracy:
/// `(value, exact, lanes)` where `lanes` marks the lanes outside the fast path's domain
/// (|x| ≥ 2^20, inf, NaN; an I8 for a scalar, an I64X2 mask for a vector) and `exact`
/// (an I8) says whether there is one: the caller uses the exact function there.
pub(crate) fn sin_cos_f64(
    b: &mut FunctionBuilder<'_>,
    x: Value,
    cos: bool,
) -> (Value, Value, Value) {
    let ty = b.func.dfg.value_type(x);
    let mut m = Math {
        b,
        ty,
        fma: use_fma(),
    };
    let ax = m.b.ins().fabs(x);
    let lanes = m.cmp_c(FloatCC::UnorderedOrGreaterThanOrEqual, ax, 1_048_576.0);
    let exact = if ty.is_vector() {
        m.b.ins().vany_true(lanes)
    } else {
        lanes
    };
    let v = m.sin_cos_f64_core(x, cos);
    (sin_keeps_zero(m.b, x, v, cos), exact, lanes)
}

/// sin(-0) = -0, which the polynomial's +0 products turn into +0: `x` where it is a
/// zero, for sin (`cos` false); `v` as it is for cos.
fn sin_keeps_zero(b: &mut FunctionBuilder<'_>, x: Value, v: Value, cos: bool) -> Value {
    if cos {
        return v;
    }
    let ty = b.func.dfg.value_type(x);
    let zero = if ty.lane_type() == types::F64 {
        b.ins().f64const(Ieee64::with_float(0.0))
    } else {
        b.ins().f32const(Ieee32::with_float(0.0))
    };
    if ty.is_vector() {
        let zero = b.ins().splat(ty, zero);
        let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
        let mask = b.ins().bitcast(ty, Math::flags(), is_zero);
        b.ins().bitselect(mask, x, v)
    } else {
        let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
        b.ins().select(is_zero, x, v)
    }
}

/// x^y of scalar f32 operands, computed in f64 as 2^(y·log2 x): `(value, exact)` where
/// `exact` (an I8) is 1 unless x is positive and finite and y finite; the caller then
/// uses the exact libcall (every IEEE special case of pow lives there).
pub(crate) fn pow_f32(b: &mut FunctionBuilder<'_>, x: Value, y: Value) -> (Value, Value) {
    let mut m = Math {
        b,
        ty: types::F64,
        fma: use_fma(),
    };
    let zero = m.b.ins().f32const(Ieee32::with_float(0.0));
    let inf = m.b.ins().f32const(Ieee32::with_float(f32::INFINITY));
    let pos = m.b.ins().fcmp(FloatCC::GreaterThan, x, zero);
    let finite = m.b.ins().fcmp(FloatCC::LessThan, x, inf);
    let ay = m.b.ins().fabs(y);
    let y_finite = m.b.ins().fcmp(FloatCC::LessThan, ay, inf);
    let fast = m.b.ins().band(pos, finite);
    let fast = m.b.ins().band(fast, y_finite);
    let exact = m.b.ins().bxor_imm_u(fast, 1);
    // x is normal in f64 even when it is an f32 subnormal.
    let xd = m.b.ins().fpromote(types::F64, x);
    let yd = m.b.ins().fpromote(types::F64, y);
    let v = m.pow_core(xd, yd);
    (m.b.ins().fdemote(types::F32, v), exact)
}

/// x^y of `F32X4` operands, each lane computed exactly as [`pow_f32`] computes it (the
/// same f64 operations, two lanes at a time): `(value, exact, lanes)`, where `lanes`
/// (an I32X4 mask) marks the lanes that need the exact function (x not positive and
/// finite, or y not finite) and `exact` (an I8) is 1 when there is one.
pub(crate) fn pow_f32x4(b: &mut FunctionBuilder<'_>, x: Value, y: Value) -> (Value, Value, Value) {
    let ty = types::F32X4;
    let zero = b.ins().f32const(Ieee32::with_float(0.0));
    let zero = b.ins().splat(ty, zero);
    let inf = b.ins().f32const(Ieee32::with_float(f32::INFINITY));
    let inf = b.ins().splat(ty, inf);
    let pos = b.ins().fcmp(FloatCC::GreaterThan, x, zero);
    let finite = b.ins().fcmp(FloatCC::LessThan, x, inf);
    let ay = b.ins().fabs(y);
    let y_finite = b.ins().fcmp(FloatCC::LessThan, ay, inf);
    let fast = b.ins().band(pos, finite);
    let fast = b.ins().band(fast, y_finite);
    let lanes = b.ins().bnot(fast);
    let exact = b.ins().vany_true(lanes);
    let mut m = Math {
        b,
        ty: types::F64X2,
        fma: use_fma(),
    };
    let (xlo, xhi) = halves_f64x2(m.b, x);
    let (ylo, yhi) = halves_f64x2(m.b, y);
    let vlo = m.pow_core(xlo, ylo);
    let vhi = m.pow_core(xhi, yhi);
    (join_f32x4(m.b, vlo, vhi), exact, lanes)
}

/// Lanes 0, 1 and lanes 2, 3 of an `F32X4` as two `F64X2` (exact).
fn halves_f64x2(b: &mut FunctionBuilder<'_>, x: Value) -> (Value, Value) {
    let flags = Math::flags();
    let lo = b.ins().fvpromote_low(x);
    let bytes = b.ins().bitcast(types::I8X16, flags, x);
    let swap: Vec<u8> = (8..16).chain(0..8).collect();
    let swap = b.func.dfg.immediates.push(swap.as_slice().into());
    let swapped = b.ins().shuffle(bytes, bytes, swap);
    let swapped = b.ins().bitcast(types::F32X4, flags, swapped);
    (lo, b.ins().fvpromote_low(swapped))
}

/// Two `F64X2` rounded to f32 and put together as one `F32X4` (`lo` in lanes 0, 1).
fn join_f32x4(b: &mut FunctionBuilder<'_>, lo: Value, hi: Value) -> Value {
    let flags = Math::flags();
    let dlo = b.ins().fvdemote(lo);
    let dhi = b.ins().fvdemote(hi);
    let blo = b.ins().bitcast(types::I8X16, flags, dlo);
    let bhi = b.ins().bitcast(types::I8X16, flags, dhi);
    let join: Vec<u8> = (0..8).chain(16..24).collect();
    let join = b.func.dfg.immediates.push(join.as_slice().into());
    let v = b.ins().shuffle(blo, bhi, join);
    b.ins().bitcast(types::F32X4, flags, v)
}

// Coefficient tables are kept as fitted (f64) and rounded to f32 when emitted.

/// Builder state: the function and the float type being computed (`F32`, `F32X4`, or
/// `F64` for the f64-internal scalar functions).
struct Math<'a, 'f> {
    b: &'a mut FunctionBuilder<'f>,
    ty: Type,
    /// Whether `a·b + c` is one fused instruction (the host has FMA, see [`use_fma`]).
    fma: bool,
}

/// ln 2 = LN2_HI + LN2_LO, LN2_HI with 10 significant bits so that n · LN2_HI is exact
/// for |n| < 2^14.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// The constants of one precision: everything the exp and log families need besides
/// the shape of their code, which is the same in f32 and f64.
struct Prec {
    /// 1.5 · 2^(mantissa bits): adding it rounds to an integer kept in the low bits.
    magic: f64,
    /// The bits of `magic`.
    magic_bits: i64,
    /// Mantissa bits and exponent bias.
    mant_bits: i64,
    bias: i64,
    /// ln 2 in two parts, the first with trailing zero bits (n · hi exact).
    ln2_hi: f64,
    ln2_lo: f64,
    /// (e^r - 1 - r) / r² on |r| ≤ ln2/2.
    expm1_q: &'static [f64],
    /// exp's clamps: below `exp_lo` the result rounds to 0, from `exp_hi` it overflows.
    exp_lo: f64,
    exp_hi: f64,
    /// Below this |x|, e^x is a normal number (exp's fast path).
    exp_fast: f64,
    /// Below `expm1_lo` e^x - 1 rounds to -1; below `expm1_tiny` (in magnitude) to x.
    expm1_lo: f64,
    expm1_tiny: f64,
    /// Below `log1p_tiny` (in magnitude) log1p(x) rounds to x.
    log1p_tiny: f64,
    /// The bits of 1 and of √½, and the mantissa mask.
    one_bits: i64,
    sqrt_half_bits: i64,
    mant_mask: i64,
    /// R(z)/z of log (see `LOG_R`).
    log_r: &'static [f64],
    /// The smallest normal, and the power of two that makes a subnormal normal.
    min_normal: f64,
    sub_scale_log2: i32,
    /// Where tanh rounds to ±1 (its argument is clamped there).
    tanh_clamp: f64,
}

const F32_PREC: Prec = Prec {
    magic: 12_582_912.0,
    magic_bits: 0x4B40_0000,
    mant_bits: 23,
    bias: 127,
    ln2_hi: LN2_HI as f64,
    ln2_lo: LN2_LO as f64,
    expm1_q: &EXPM1_Q,
    exp_lo: -104.0,
    exp_hi: 89.0,
    exp_fast: 87.0,
    expm1_lo: -20.0,
    expm1_tiny: 2.980_232_238_769_531_2e-8,
    log1p_tiny: 5.960_464_477_539_063e-8,
    one_bits: 0x3F80_0000,
    sqrt_half_bits: 0x3F35_04F3,
    mant_mask: 0x007F_FFFF,
    log_r: &LOG_R,
    min_normal: f32::MIN_POSITIVE as f64,
    sub_scale_log2: 25,
    tanh_clamp: 9.1,
};

const F64_PREC: Prec = Prec {
    magic: 6_755_399_441_055_744.0,
    magic_bits: 0x4338_0000_0000_0000,
    mant_bits: 52,
    bias: 1023,
    // fdlibm's split: ln2_hi has 32 trailing zero bits (n · ln2_hi exact for |n| < 2^20).
    ln2_hi: f64::from_bits(0x3FE6_2E42_FEE0_0000),
    ln2_lo: f64::from_bits(0x3DEA_39EF_3579_3C76),
    expm1_q: &EXPM1_Q_F64,
    // e^-745.14 is half the smallest subnormal; e^709.79 overflows.
    exp_lo: -746.0,
    exp_hi: 710.0,
    exp_fast: 708.0,
    // e^-38 is below half an ulp of 1.
    expm1_lo: -38.0,
    expm1_tiny: 5.551_115_123_125_783e-17,
    log1p_tiny: 1.110_223_024_625_156_5e-16,
    one_bits: 0x3FF0_0000_0000_0000,
    sqrt_half_bits: 0x3FE6_A09E_667F_3BCD,
    mant_mask: 0x000F_FFFF_FFFF_FFFF,
    log_r: &LOG_R_F64,
    min_normal: f64::MIN_POSITIVE,
    sub_scale_log2: 54,
    // tanh(19.1) = 1 - 5.1e-17 rounds to 1.
    tanh_clamp: 19.1,
};

/// (e^r - 1 - r) / r² for f64: Taylor coefficients 1/2! .. 1/14!, truncation below
/// 2^-60 relative on |r| ≤ 0.347.
const EXPM1_Q_F64: [f64; 13] = [
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5_040.0,
    1.0 / 40_320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
    1.0 / 479_001_600.0,
    1.0 / 6_227_020_800.0,
    1.0 / 87_178_291_200.0,
];

/// R(z)/z of log for f64: 2/3, 2/5, ... (the series of 2·atanh(s)/s - 2 over z = s²),
/// to z^10: truncation below 2^-58 relative for z ≤ 0.0295.
const LOG_R_F64: [f64; 11] = [
    2.0 / 3.0,
    2.0 / 5.0,
    2.0 / 7.0,
    2.0 / 9.0,
    2.0 / 11.0,
    2.0 / 13.0,
    2.0 / 15.0,
    2.0 / 17.0,
    2.0 / 19.0,
    2.0 / 21.0,
    2.0 / 23.0,
];

/// (e^r - 1 - r) / r² on |r| ≤ ln2/2, relative error 4e-9 (Chebyshev interpolation).
const EXPM1_Q: [f64; 6] = [
    5.000_000_013e-1,
    1.666_666_668e-1,
    4.166_646_501e-2,
    8.333_310_935e-3,
    1.393_364_103e-3,
    1.989_098_082e-4,
];

/// R(z)/z for log1p(f) = f - f²/2 + s·(f²/2 + R), s = f/(2+f), z = s² ≤ 0.0295:
/// relative error 2e-9.
const LOG_R: [f64; 4] = [
    6.666_666_655e-1,
    4.000_012_186e-1,
    2.855_081_910e-1,
    2.333_050_140e-1,
];

/// (tanh(x) - x)/x³ as a polynomial in x² on |x| ≤ 0.5494: relative error below 1e-8.
const TANH_SMALL: [f64; 7] = [
    -3.333_333_333e-1,
    1.333_333_298e-1,
    -5.396_806_465e-2,
    2.186_567_770e-2,
    -8.826_347_043e-3,
    3.405_443_991e-3,
    -9.663_967_826e-4,
];

/// erf(x)/x as a polynomial in x² on |x| ≤ 1: relative error 1.3e-9.
const ERF_SMALL: [f64; 7] = [
    1.128_379_166,
    -3.761_262_667e-1,
    1.128_359_472e-1,
    -2.685_421_201e-2,
    5.189_087_423e-3,
    -8.016_864_283e-4,
    7.875_875_049e-5,
];

/// log erfc(2.5 + v) as a polynomial in v on |v| ≤ 1.5 (x in [1, 4]): absolute error
/// 2.2e-9.
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

impl Math<'_, '_> {
    /// The integer type of the same shape as `self.ty`.
    fn ity(&self) -> Type {
        self.ty.as_int()
    }

    /// The constants of this precision.
    fn p(&self) -> &'static Prec {
        if self.ty.lane_type() == types::F64 {
            &F64_PREC
        } else {
            &F32_PREC
        }
    }

    fn vector(&self) -> bool {
        self.ty.is_vector()
    }

    /// A float constant of `self.ty` (splatted for vectors).
    fn f(&mut self, v: f64) -> Value {
        let c = if self.ty.lane_type() == types::F64 {
            self.b.ins().f64const(Ieee64::with_float(v))
        } else {
            self.b.ins().f32const(Ieee32::with_float(v as f32))
        };
        if self.vector() {
            self.b.ins().splat(self.ty, c)
        } else {
            c
        }
    }

    /// An integer constant of `self.ity()`.
    fn i(&mut self, v: i64) -> Value {
        let ity = self.ity();
        let lane = ity.lane_type();
        let c = self.b.ins().iconst(lane, v);
        if self.vector() {
            self.b.ins().splat(ity, c)
        } else {
            c
        }
    }

    fn mul_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        self.b.ins().fmul(x, c)
    }

    fn add_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        self.b.ins().fadd(x, c)
    }

    fn flags() -> MemFlagsData {
        MemFlagsData::new().with_endianness(Endianness::Little)
    }

    fn as_int(&mut self, x: Value) -> Value {
        let ity = self.ity();
        self.b.ins().bitcast(ity, Self::flags(), x)
    }

    fn as_float(&mut self, i: Value) -> Value {
        self.b.ins().bitcast(self.ty, Self::flags(), i)
    }

    /// `a cc b` as a mask: I8 0/1 for scalars, all-ones lanes for vectors.
    fn cmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }

    fn cmp_c(&mut self, cc: FloatCC, a: Value, c: f64) -> Value {
        let c = self.f(c);
        self.cmp(cc, a, c)
    }

    /// `mask ? a : b` for floats.
    fn sel(&mut self, mask: Value, a: Value, b: Value) -> Value {
        if self.vector() {
            let m = self.b.ins().bitcast(self.ty, Self::flags(), mask);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(mask, a, b)
        }
    }

    /// `mask ? a : b` for integers of `self.ity()` (mask from an integer compare).
    fn isel(&mut self, mask: Value, a: Value, b: Value) -> Value {
        if self.vector() {
            self.b.ins().bitselect(mask, a, b)
        } else {
            self.b.ins().select(mask, a, b)
        }
    }

    /// min(x, c), NaN kept: `c < x ? c : x`.
    fn min_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        let lt = self.cmp(FloatCC::LessThan, c, x);
        self.sel(lt, c, x)
    }

    /// max(x, c), NaN kept: `x < c ? c : x`.
    fn max_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        let lt = self.cmp(FloatCC::LessThan, x, c);
        self.sel(lt, c, x)
    }

    /// c[0] + v·(c[1] + v·(...)).
    fn horner<T: Copy + Into<f64>>(&mut self, v: Value, c: &[T]) -> Value {
        let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
        let mut acc = self.f((*last).into());
        for &k in rest.iter().rev() {
            let k = self.f(k.into());
            acc = self.mul_add(acc, v, k);
        }
        acc
    }

    /// a·b + c: one rounding where the host has FMA, two where it has not.
    fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let ab = self.b.ins().fmul(a, b);
            self.b.ins().fadd(ab, c)
        }
    }

    /// The integer lanes `k` (|k| < 2^22) as floats: `cvtdq2ps` for i32 lanes; for i64
    /// lanes, which x86 cannot convert without AVX-512, k + 1.5·2^52 read as a float
    /// minus 1.5·2^52 (exact).
    fn int_to_float(&mut self, k: Value) -> Value {
        let p = self.p();
        if self.ty.lane_type() == types::F32 {
            return self.b.ins().fcvt_from_sint(self.ty, k);
        }
        let mb = self.i(p.magic_bits);
        let t = self.b.ins().iadd(k, mb);
        let t = self.as_float(t);
        let magic = self.f(p.magic);
        self.b.ins().fsub(t, magic)
    }

    /// 2^n for integer lanes `n` in [-126, 127] (f64: [-1022, 1023]), as floats.
    fn pow2(&mut self, n: Value) -> Value {
        let p = self.p();
        let bias = self.i(p.bias);
        let e = self.b.ins().iadd(n, bias);
        let e = self.b.ins().ishl_imm_s(e, p.mant_bits);
        self.as_float(e)
    }

    /// `x` with the sign bit of `s` (`x` non-negative or NaN).
    fn with_sign_of(&mut self, x: Value, s: Value) -> Value {
        let xb = self.as_int(x);
        let sb = self.as_int(s);
        let bits = self.ty.lane_type().bits();
        let mask = self.i(i64::MIN >> (64 - bits));
        let sign = self.b.ins().band(sb, mask);
        let v = self.b.ins().bor(xb, sign);
        self.as_float(v)
    }

    /// Argument reduction of exp: `(n, em)` with x = n·ln2 + r, n an integer (lanes
    /// of `ity`) and em = e^r - 1, |r| ≤ ln2/2 (a little more after rounding). `x`
    /// must lie in [-2^21, 2^21] or be NaN (em is then NaN).
    fn exp_reduce(&mut self, x: Value) -> (Value, Value) {
        // n = round(x/ln2) by adding 1.5·2^23: the sum's low mantissa bits hold n.
        let p = self.p();
        let magic = self.f(p.magic);
        let log2e = self.f(std::f64::consts::LOG2_E);
        let t = self.mul_add(x, log2e, magic);
        // -n, so that the reduction below is two multiply-adds.
        let neg_n = self.b.ins().fsub(magic, t);
        let tb = self.as_int(t);
        let mb = self.i(p.magic_bits);
        let ni = self.b.ins().isub(tb, mb);
        let hi = self.f(p.ln2_hi);
        let r = self.mul_add(neg_n, hi, x);
        let lo = self.f(p.ln2_lo);
        let r = self.mul_add(neg_n, lo, r);
        // em = r + r·(r·Q(r)): the sign of r (and of a zero r) survives.
        let q = self.horner(r, p.expm1_q);
        let rq = self.b.ins().fmul(r, q);
        let em = self.mul_add(r, rq, r);
        (ni, em)
    }

    /// e^x for x already in [-104, 89] (or NaN): 2^n split in two factors so that
    /// subnormal results are rounded once and e^89 overflows to inf.
    fn exp_core(&mut self, x: Value) -> Value {
        let (ni, em) = self.exp_reduce(x);
        let one = self.f(1.0);
        let p = self.b.ins().fadd(one, em);
        let n1 = self.b.ins().sshr_imm_s(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let s1 = self.pow2(n1);
        let s2 = self.pow2(n2);
        let v = self.b.ins().fmul(p, s1);
        self.b.ins().fmul(v, s2)
    }

    fn exp(&mut self, x: Value) -> Value {
        // Where every lane's result is a normal number (|x| < 87; f64: 708), 2^n goes
        // straight into the exponent bits of 1 + em: exact, so the very bits of the
        // general path below, which clamps and scales in two factors for subnormal and
        // overflowing results (and NaN). A branch on all lanes at once.
        let p = self.p();
        let ax = self.b.ins().fabs(x);
        let ok = self.cmp_c(FloatCC::LessThan, ax, p.exp_fast);
        let all = if self.vector() {
            self.b.ins().vall_true(ok)
        } else {
            ok
        };
        let fast = self.b.create_block();
        let general = self.b.create_block();
        // Cold: out of the hot loop's way, and out of the bench's count (`cost`).
        self.b.set_cold_block(general);
        let join = self.b.create_block();
        let out = self.b.append_block_param(join, self.ty);
        self.b.ins().brif(all, fast, &[], general, &[]);

        self.b.switch_to_block(fast);
        let (ni, em) = self.exp_reduce(x);
        let one = self.f(1.0);
        let v = self.b.ins().fadd(one, em);
        let vb = self.as_int(v);
        let shifted = self.b.ins().ishl_imm_s(ni, p.mant_bits);
        let vb = self.b.ins().iadd(vb, shifted);
        let v = self.as_float(vb);
        self.b.ins().jump(join, &[v.into()]);

        // e^-104 rounds to 0 and e^89 overflows: clamping changes no result.
        self.b.switch_to_block(general);
        let xc = self.max_c(x, p.exp_lo);
        let xc = self.min_c(xc, p.exp_hi);
        let v = self.exp_core(xc);
        self.b.ins().jump(join, &[v.into()]);

        self.b.switch_to_block(join);
        out
    }

    /// e^x - 1 for x in [-20, 89] (or NaN), without the tiny-argument fix-up.
    fn expm1_core(&mut self, x: Value) -> Value {
        let (ni, em) = self.exp_reduce(x);
        // 2^n·em + (2^n - 1) with n ≤ 127, then once more for n = 128 (x > 88.38):
        // w·u + (w - 1) with w = 2^(n - 127) in {1, 2}.
        let cap = self.i(self.p().bias);
        let over = self.b.ins().icmp(IntCC::SignedGreaterThan, ni, cap);
        let nc = self.isel(over, cap, ni);
        let extra = self.b.ins().isub(ni, nc);
        let s = self.pow2(nc);
        let one = self.f(1.0);
        let sm1 = self.b.ins().fsub(s, one);
        let se = self.b.ins().fmul(s, em);
        let u = self.b.ins().fadd(se, sm1);
        let w = self.pow2(extra);
        let wm1 = self.b.ins().fsub(w, one);
        let wu = self.b.ins().fmul(w, u);
        self.b.ins().fadd(wu, wm1)
    }

    fn expm1(&mut self, x: Value) -> Value {
        // Below -20 the result rounds to -1; from 89 on it overflows.
        let p = self.p();
        let xc = self.max_c(x, p.expm1_lo);
        let xc = self.min_c(xc, p.exp_hi);
        let v = self.expm1_core(xc);
        // |x| < 2^-25 (f64: 2^-54): e^x - 1 rounds to x (keeps -0 and subnormals exact).
        let ax = self.b.ins().fabs(x);
        let tiny = self.cmp_c(FloatCC::LessThan, ax, p.expm1_tiny);
        self.sel(tiny, x, v)
    }

    /// log(u) + c for u positive, normal and finite; `k_adj` (a float, or `None`) is
    /// subtracted from the exponent (for prescaled subnormals).
    fn log_core(&mut self, u: Value, c: Option<Value>, k_adj: Option<Value>) -> Value {
        // Exponent counted from √½ so that m = u / 2^k lies in [√½, √2).
        let pr = self.p();
        let ub = self.as_int(u);
        let shift = self.i(pr.one_bits - pr.sqrt_half_bits);
        let ix = self.b.ins().iadd(ub, shift);
        // u is positive: a logical shift is the arithmetic one (and exists for i64x2).
        let k = self.b.ins().ushr_imm_s(ix, pr.mant_bits);
        let bias = self.i(pr.bias);
        let k = self.b.ins().isub(k, bias);
        let mmask = self.i(pr.mant_mask);
        let mant = self.b.ins().band(ix, mmask);
        let base = self.i(pr.sqrt_half_bits);
        let mant = self.b.ins().iadd(mant, base);
        let m = self.as_float(mant);
        let one = self.f(1.0);
        let f = self.b.ins().fsub(m, one);
        let two = self.f(2.0);
        let den = self.b.ins().fadd(two, f);
        let s = self.b.ins().fdiv(f, den);
        let z = self.b.ins().fmul(s, s);
        let p = self.horner(z, pr.log_r);
        let r = self.b.ins().fmul(z, p);
        let ff = self.b.ins().fmul(f, f);
        let hfsq = self.mul_c(ff, 0.5);
        let mut kf = self.int_to_float(k);
        if let Some(adj) = k_adj {
            kf = self.b.ins().fsub(kf, adj);
        }
        // k·ln2_hi - ((hfsq - (s·(hfsq + R) + k·ln2_lo + c)) - f): the small terms
        // first, f and the exact k·ln2_hi last.
        let hr = self.b.ins().fadd(hfsq, r);
        let kl = self.mul_c(kf, pr.ln2_lo);
        let lo = self.mul_add(s, hr, kl);
        let lo = match c {
            Some(c) => self.b.ins().fadd(lo, c),
            None => lo,
        };
        let t = self.b.ins().fsub(hfsq, lo);
        let t = self.b.ins().fsub(t, f);
        let kh = self.mul_c(kf, pr.ln2_hi);
        self.b.ins().fsub(kh, t)
    }

    /// The special cases of log at `u`: 0 → -inf, inf → inf, negative or NaN → NaN.
    fn log_specials(&mut self, u: Value, v: Value) -> Value {
        let ninf = self.f(f64::NEG_INFINITY);
        let zero = self.cmp_c(FloatCC::Equal, u, 0.0);
        let v = self.sel(zero, ninf, v);
        let inf = self.f(f64::INFINITY);
        let is_inf = self.cmp_c(FloatCC::Equal, u, f64::INFINITY);
        let v = self.sel(is_inf, inf, v);
        let nan = self.f(f64::NAN);
        let ok = self.cmp_c(FloatCC::GreaterThanOrEqual, u, 0.0);
        self.sel(ok, v, nan)
    }

    fn log(&mut self, x: Value) -> Value {
        // Subnormals: scale by 2^25 (f64: 2^54), exact, and take that off the exponent.
        let p = self.p();
        let sub = self.cmp_c(FloatCC::LessThan, x, p.min_normal);
        let big = self.mul_c(x, 2f64.powi(p.sub_scale_log2));
        let u = self.sel(sub, big, x);
        let zero = self.f(0.0);
        let scale = self.f(f64::from(p.sub_scale_log2));
        let adj = self.sel(sub, scale, zero);
        let v = self.log_core(u, None, Some(adj));
        self.log_specials(x, v)
    }

    fn log1p(&mut self, x: Value) -> Value {
        // u = 1 + x rounded; c = (x - (u - 1)) / u corrects that rounding (u - 1 and
        // the difference are exact for u ≥ 1/2; below, u = 1 + x is exact and c = 0).
        let one = self.f(1.0);
        let u = self.b.ins().fadd(one, x);
        let um1 = self.b.ins().fsub(u, one);
        let d = self.b.ins().fsub(x, um1);
        let c = self.b.ins().fdiv(d, u);
        let v = self.log_core(u, Some(c), None);
        let v = self.log_specials(u, v);
        // |x| < 2^-24: log1p(x) rounds to x (keeps -0 and subnormals exact).
        let ax = self.b.ins().fabs(x);
        let tiny = self.cmp_c(FloatCC::LessThan, ax, self.p().log1p_tiny);
        self.sel(tiny, x, v)
    }

    /// x^y for `xd`, `yd` (`F64` or `F64X2`, f32 values widened; x positive and finite,
    /// y finite) as 2^(y·log2 x), in f64.
    fn pow_core(&mut self, xd: Value, yd: Value) -> Value {
        // x = 2^k · m with m in [√½, √2): shift the bits so that the exponent field counts
        // from √½.
        let ix = self.as_int(xd);
        let shift = self.i(0x3FF0_0000_0000_0000 - 0x3FE6_A09E_667F_3BCD);
        let ix = self.b.ins().iadd(ix, shift);
        let k = self.b.ins().sshr_imm_s(ix, 52);
        let bias = self.i(-1023);
        let k = self.b.ins().iadd(k, bias);
        let mmask = self.i(0x000F_FFFF_FFFF_FFFF);
        let mant = self.b.ins().band(ix, mmask);
        let base = self.i(0x3FE6_A09E_667F_3BCD);
        let mant = self.b.ins().iadd(mant, base);
        let mf = self.as_float(mant);
        let one = self.f(1.0);
        let f = self.b.ins().fsub(mf, one);
        // log m = 2 atanh(s), s = f/(2+f), |s| ≤ 0.1716: 2s(1 + z/3 + z²/5 + ...), z = s²;
        // the series to z^6 leaves a relative error below 2^-40.
        let two = self.f(2.0);
        let den = self.b.ins().fadd(two, f);
        let s = self.b.ins().fdiv(f, den);
        let z = self.b.ins().fmul(s, s);
        let series = self.horner(
            z,
            &[
                1.0,
                1.0 / 3.0,
                1.0 / 5.0,
                1.0 / 7.0,
                1.0 / 9.0,
                1.0 / 11.0,
                1.0 / 13.0,
            ],
        );
        let s2 = self.mul_c(s, 2.0 * std::f64::consts::LOG2_E);
        let log2m = self.b.ins().fmul(s2, series);
        let kf = self.int_to_float(k);
        let log2x = self.b.ins().fadd(kf, log2m);
        let t = self.b.ins().fmul(yd, log2x);
        // 2^t for t clamped to ±200 (beyond f32's range either way; NaN cannot occur on
        // the fast path): t = n + r, |r| ≤ 1/2, 2^r = e^(r ln 2) by Taylor to degree 10.
        let t = self.max_c(t, -200.0);
        let t = self.min_c(t, 200.0);
        let magic = self.f(6_755_399_441_055_744.0);
        let tm = self.b.ins().fadd(t, magic);
        let n = self.b.ins().fsub(tm, magic);
        let r = self.b.ins().fsub(t, n);
        let w = self.mul_c(r, std::f64::consts::LN_2);
        let mut coefs = [0.0; 11];
        let mut fact = 1.0;
        for (i, c) in coefs.iter_mut().enumerate() {
            if i > 0 {
                fact *= i as f64;
            }
            *c = 1.0 / fact;
        }
        let p = self.horner(w, &coefs);
        let nb = self.as_int(tm);
        let magic_bits = 0x4338_0000_0000_0000_i64;
        let off = self.i(1023 - magic_bits);
        let e = self.b.ins().iadd(nb, off);
        let e = self.b.ins().ishl_imm_s(e, 52);
        let scale = self.as_float(e);
        self.b.ins().fmul(p, scale)
    }

    /// sin or cos of `x` (`F64` or `F64X2`, |x| < 2^20) to f64 accuracy: n = round(x·2/π),
    /// r = x - n·π/2 with π/2 in three parts of 33, 33 and 53 bits (fdlibm's; n·P1 and
    /// n·P2 are exact for |n| < 2^20), then Taylor series on |r| ≤ π/4 to r^17 for sin
    /// and r^16 for cos (truncation below 2^-60), and the quadrant.
    fn sin_cos_f64_core(&mut self, x: Value, cos: bool) -> Value {
        let magic = self.f(6_755_399_441_055_744.0);
        let two_over_pi = self.f(std::f64::consts::FRAC_2_PI);
        let t = self.mul_add(x, two_over_pi, magic);
        let neg_n = self.b.ins().fsub(magic, t);
        let p1 = self.f(f64::from_bits(0x3FF9_21FB_5440_0000));
        let r = self.mul_add(neg_n, p1, x);
        let p2 = self.f(f64::from_bits(0x3DD0_B461_1A60_0000));
        let r = self.mul_add(neg_n, p2, r);
        let p3 = self.f(f64::from_bits(0x3BA3_198A_2E03_7073));
        let r = self.mul_add(neg_n, p3, r);
        let z = self.b.ins().fmul(r, r);
        let mut sin_c = [0.0f64; 8];
        let mut cos_c = [0.0f64; 7];
        let mut fact = 1.0f64;
        for k in 2..=17u32 {
            fact *= f64::from(k);
            let sign = if (k / 2) % 2 == 1 { -1.0 } else { 1.0 };
            if k % 2 == 1 {
                sin_c[(k as usize - 3) / 2] = sign / fact;
            } else if k >= 4 {
                cos_c[(k as usize - 4) / 2] = sign / fact;
            }
        }
        // sin r = r + r·z·S(z); cos r = 1 - z/2 + z²·C(z), with 1 - z/2 split so that
        // its rounding error is kept: w = 1 - z/2, (1 - w) - z/2 is exact.
        let s = self.horner(z, &sin_c);
        let rz = self.b.ins().fmul(r, z);
        let sin = self.mul_add(rz, s, r);
        let c = self.horner(z, &cos_c);
        let hz = self.mul_c(z, 0.5);
        let one = self.f(1.0);
        let w = self.b.ins().fsub(one, hz);
        let lost = self.b.ins().fsub(one, w);
        let lost = self.b.ins().fsub(lost, hz);
        let zz = self.b.ins().fmul(z, z);
        let tail = self.mul_add(zz, c, lost);
        let cos_r = self.b.ins().fadd(w, tail);
        self.quadrant(t, cos, sin, cos_r)
    }

    /// sin or cos of `xd` (`F64` or `F64X2`, an f32 widened, |x| < 2^24), in f64.
    fn sin_cos_core(&mut self, xd: Value, cos: bool) -> Value {
        // n = round(x * 2/π) by adding 1.5 * 2^52; its low bits are the quadrant.
        let magic = self.f(6_755_399_441_055_744.0);
        let scaled = self.mul_c(xd, std::f64::consts::FRAC_2_PI);
        let t = self.b.ins().fadd(scaled, magic);
        let n = self.b.ins().fsub(t, magic);
        // π/2 = P1 + P2 (+ 2^-89): P1 has 29 significant bits, so n * P1 is exact for
        // |n| < 2^24 and x - n * P1 is exact (Sterbenz); the remainder's error is below
        // 2^-60 where the closest f32 to a multiple of π/2 leaves more than 2^-32.
        let r = self.mul_c(n, f64::from_bits(0x3FF9_21FB_5400_0000));
        let r = self.b.ins().fsub(xd, r);
        let r2 = self.mul_c(n, 9.920_935_796_805_404e-10);
        let r = self.b.ins().fsub(r, r2);
        let z = self.b.ins().fmul(r, r);
        // sin r = r + r·z·S(z), cos r = 1 - z/2 + z²·C(z): Taylor to z^5 (error below
        // 2^-36 on |r| ≤ π/4).
        let s = self.horner(
            z,
            &[
                -1.0 / 6.0,
                1.0 / 120.0,
                -1.0 / 5040.0,
                1.0 / 362_880.0,
                -1.0 / 39_916_800.0,
            ],
        );
        let rz = self.b.ins().fmul(r, z);
        let rzs = self.b.ins().fmul(rz, s);
        let sin = self.b.ins().fadd(r, rzs);
        let c = self.horner(
            z,
            &[
                1.0 / 24.0,
                -1.0 / 720.0,
                1.0 / 40320.0,
                -1.0 / 3_628_800.0,
                1.0 / 479_001_600.0,
            ],
        );
        let zz = self.b.ins().fmul(z, z);
        let zzc = self.b.ins().fmul(zz, c);
        let half_z = self.mul_c(z, 0.5);
        let one = self.f(1.0);
        let cos_r = self.b.ins().fsub(one, half_z);
        let cos_r = self.b.ins().fadd(cos_r, zzc);
        self.quadrant(t, cos, sin, cos_r)
    }

    /// sin (or cos, `cos`) of x from sin r and cos r, where x = n·π/2 + r and `t` is
    /// n + 1.5·2^52 (its low bits hold n): quadrant q = n mod 4 (cos: q + 1), odd
    /// quadrants swap sin and cos, quadrants 2 and 3 negate.
    fn quadrant(&mut self, t: Value, cos: bool, sin: Value, cos_r: Value) -> Value {
        let bits = self.as_int(t);
        let q = if cos {
            let one = self.i(1);
            self.b.ins().iadd(bits, one)
        } else {
            bits
        };
        let swap = self.bit_set(q, 1);
        let v = self.sel(swap, cos_r, sin);
        let neg = self.bit_set(q, 2);
        let minus = self.b.ins().fneg(v);
        self.sel(neg, minus, v)
    }

    /// Whether `bit` is set in the integer lanes `q`, as a mask for [`Math::sel`].
    fn bit_set(&mut self, q: Value, bit: i64) -> Value {
        let m = self.i(bit);
        let and = self.b.ins().band(q, m);
        if self.vector() {
            let zero = self.i(0);
            self.b.ins().icmp(IntCC::NotEqual, and, zero)
        } else {
            and
        }
    }

    fn tanh(&mut self, x: Value) -> Value {
        // tanh |x| = 1 - q with q = 2/(e^2|x| + 1), where tanh ≥ 1/2: 1 - q rounds once
        // next to q's small error, so tanh is nearly correctly rounded near ±1 (where
        // gelu's 1 + tanh cancels); from |x| = 9.1 on it rounds to 1 (at 9 it is still
        // 1 - 2^-24). Below 1/2, |x| + |x|³·P(x²). exp rather than expm1 is enough
        // here (e ≥ e^1.0986 = 3) and cheaper.
        if self.p().mant_bits == 52 {
            return self.tanh_f64(x);
        }
        // e^2a + 1 = 2^n·(1 + em) + 1 = 2^n·em + (2^n + 1).
        let (a, s, em) = self.tanh_reduce(x);
        let one = self.f(1.0);
        let s1 = self.b.ins().fadd(s, one);
        let den = self.mul_add(s, em, s1);
        let two = self.f(2.0);
        let q = self.b.ins().fdiv(two, den);
        let large = self.b.ins().fsub(one, q);
        let z = self.b.ins().fmul(a, a);
        let p = self.horner(z, &TANH_SMALL);
        let zp = self.b.ins().fmul(z, p);
        let small = self.mul_add(a, zp, a);
        // tanh(0.5493) = 1/2.
        let is_small = self.cmp_c(FloatCC::LessThan, a, 0.549_306_1);
        let t = self.sel(is_small, small, large);
        self.with_sign_of(t, x)
    }

    /// tanh's reduction of 2|x|: `(a, s, em)` with a = |x| clamped where tanh rounds to
    /// 1, and e^2a = s·(1 + em), s = 2^n (one factor is enough: n ≤ 27 in f32, 56 in
    /// f64).
    fn tanh_reduce(&mut self, x: Value) -> (Value, Value, Value) {
        let ax = self.b.ins().fabs(x);
        let a = self.min_c(ax, self.p().tanh_clamp);
        let a2 = self.b.ins().fadd(a, a);
        let (ni, em) = self.exp_reduce(a2);
        (a, self.pow2(ni), em)
    }

    /// tanh in f64 from one reduction of 2|x|: with E = e^2|x| - 1 = 2^n·em + (2^n - 1),
    /// tanh |x| = E/(E + 2) below 0.5493 (E is accurate there, as expm1 is) and
    /// 1 - 2/(E + 2) above, one division for both; from |x| = 19.1 on it rounds to 1.
    /// (A polynomial for the small range would need about 17 terms in f64.)
    fn tanh_f64(&mut self, x: Value) -> Value {
        let (a, s, em) = self.tanh_reduce(x);
        let one = self.f(1.0);
        let sm1 = self.b.ins().fsub(s, one);
        let e = self.mul_add(s, em, sm1);
        let two = self.f(2.0);
        let den = self.b.ins().fadd(e, two);
        let is_small = self.cmp_c(FloatCC::LessThan, a, 0.549_306_144_334_054_8);
        let num = self.sel(is_small, e, two);
        let q = self.b.ins().fdiv(num, den);
        let large = self.b.ins().fsub(one, q);
        let t = self.sel(is_small, q, large);
        self.with_sign_of(t, x)
    }

    fn sigmoid(&mut self, x: Value) -> Value {
        // The reference's forms: 1/(1 + e^-x) for x ≥ 0, e^x/(1 + e^x) below, both
        // with e = e^-|x|.
        let ax = self.b.ins().fabs(x);
        let nx = self.b.ins().fneg(ax);
        // exp's fast path where every lane has |x| < 87 (its general path clamps).
        let e = self.exp(nx);
        let one = self.f(1.0);
        let den = self.b.ins().fadd(one, e);
        let nonneg = self.cmp_c(FloatCC::GreaterThanOrEqual, x, 0.0);
        let num = self.sel(nonneg, one, e);
        self.b.ins().fdiv(num, den)
    }

    fn erf(&mut self, x: Value) -> Value {
        let ax = self.b.ins().fabs(x);
        // |x| < 1: |x|·P(x²).
        let z = self.b.ins().fmul(ax, ax);
        let p = self.horner(z, &ERF_SMALL);
        let small = self.b.ins().fmul(ax, p);
        // |x| ≥ 1: 1 - e^L(|x| - 2.5), L ≈ log erfc; from 4 on the result rounds to 1.
        let a = self.min_c(ax, 4.0);
        let v = self.add_c(a, -2.5);
        let l = self.horner(v, &ERF_LARGE);
        let e = self.exp(l);
        let one = self.f(1.0);
        let large = self.b.ins().fsub(one, e);
        let is_small = self.cmp_c(FloatCC::LessThan, ax, 1.0);
        let r = self.sel(is_small, small, large);
        self.with_sign_of(r, x)
    }
}
