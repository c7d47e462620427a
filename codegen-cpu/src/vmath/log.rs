//! The log family of the inline math: log and log1p, from one core (x = 2^k·m, the
//! s = f/(2+f) form) with their special inputs settled by selects.

use super::builder::Math;
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};

impl Math<'_, '_> {
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

    pub(super) fn log(&mut self, x: Value) -> Value {
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

    pub(super) fn log1p(&mut self, x: Value) -> Value {
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
}
