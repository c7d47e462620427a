//! The exp family of the inline math: exp and expm1 from one argument reduction, and
//! what is built on them: tanh, sigmoid and erf.

use super::builder::Math;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, Value};

/// (tanh(x) - x)/x³ as a polynomial in x² on |x| ≤ 0.5494: relative error below 1e-8.
pub(crate) const TANH_SMALL: [f64; 7] = [
    -3.333_333_333e-1,
    1.333_333_298e-1,
    -5.396_806_465e-2,
    2.186_567_770e-2,
    -8.826_347_043e-3,
    3.405_443_991e-3,
    -9.663_967_826e-4,
];

/// erf(x)/x as a polynomial in x² on |x| ≤ 1: relative error 1.3e-9.
pub(crate) const ERF_SMALL: [f64; 7] = [
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
pub(crate) const ERF_LARGE: [f64; 11] = [
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

    pub(super) fn exp(&mut self, x: Value) -> Value {
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

    pub(super) fn expm1(&mut self, x: Value) -> Value {
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

    pub(super) fn tanh(&mut self, x: Value) -> Value {
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

    pub(super) fn sigmoid(&mut self, x: Value) -> Value {
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

    pub(super) fn erf(&mut self, x: Value) -> Value {
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
