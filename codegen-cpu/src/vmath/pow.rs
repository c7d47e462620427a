//! pow of f32 in the inline math: computed in f64 as 2^(y·log2 x) on scalars and on
//! f32x4 as two f64x2 halves; the IEEE special cases are left to the exact libcall.

use super::builder::{halves_f64x2, join_f32x4, use_fma, Math};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{types, InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;

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

impl Math<'_, '_> {
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
}
