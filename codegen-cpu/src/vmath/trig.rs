//! sin and cos in the inline math: f32 computed in f64 (f32x4 as two f64x2 halves),
//! f64 to f64 accuracy, each by a Cody-Waite reduction by π/2, Taylor polynomials and
//! the quadrant; arguments outside the fast path are left to the exact libcall.

use super::builder::{halves_f64x2, join_f32x4, use_fma, Math};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{types, InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;

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

impl Math<'_, '_> {
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
}
