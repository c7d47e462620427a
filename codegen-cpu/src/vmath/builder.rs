//! The builder the inline math is written with: `Math` (the function, the float type
//! being computed, whether multiply-adds fuse) and its shared instruction helpers
//! (constants, masks and selects, Horner polynomials, `mul_add`, 2^n), each precision's
//! constants (`Prec`), and the f32x4 <-> two f64x2 halves that sin, cos and pow use.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{types, Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;

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
        !off && crate::isa::host_isa().is_ok_and(|isa| {
            isa.isa_flags()
                .iter()
                .any(|f| f.name == "has_fma" && f.as_bool() == Some(true))
        })
    })
}

/// Lanes 0, 1 and lanes 2, 3 of an `F32X4` as two `F64X2` (exact).
pub(super) fn halves_f64x2(b: &mut FunctionBuilder<'_>, x: Value) -> (Value, Value) {
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
pub(super) fn join_f32x4(b: &mut FunctionBuilder<'_>, lo: Value, hi: Value) -> Value {
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

/// Builder state: the function and the float type being computed (`F32`, `F32X4`, or
/// `F64` for the f64-internal scalar functions).
pub(super) struct Math<'a, 'f> {
    pub(super) b: &'a mut FunctionBuilder<'f>,
    pub(super) ty: Type,
    /// Whether `a·b + c` is one fused instruction (the host has FMA, see [`use_fma`]).
    pub(super) fma: bool,
}

// Coefficient tables are kept as fitted (f64) and rounded to f32 when emitted.

/// ln 2 = LN2_HI + LN2_LO, LN2_HI with 10 significant bits so that n · LN2_HI is exact
/// for |n| < 2^14.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;

/// The constants of one precision: everything the exp and log families need besides
/// the shape of their code, which is the same in f32 and f64.
pub(crate) struct Prec {
    /// 1.5 · 2^(mantissa bits): adding it rounds to an integer kept in the low bits.
    pub(crate) magic: f64,
    /// The bits of `magic`.
    pub(crate) magic_bits: i64,
    /// Mantissa bits and exponent bias.
    pub(crate) mant_bits: i64,
    pub(crate) bias: i64,
    /// ln 2 in two parts, the first with trailing zero bits (n · hi exact).
    pub(crate) ln2_hi: f64,
    pub(crate) ln2_lo: f64,
    /// (e^r - 1 - r) / r² on |r| ≤ ln2/2.
    pub(crate) expm1_q: &'static [f64],
    /// exp's clamps: below `exp_lo` the result rounds to 0, from `exp_hi` it overflows.
    pub(crate) exp_lo: f64,
    pub(crate) exp_hi: f64,
    /// Below this |x|, e^x is a normal number (exp's fast path).
    pub(crate) exp_fast: f64,
    /// Below `expm1_lo` e^x - 1 rounds to -1; below `expm1_tiny` (in magnitude) to x.
    pub(crate) expm1_lo: f64,
    pub(crate) expm1_tiny: f64,
    /// Below `log1p_tiny` (in magnitude) log1p(x) rounds to x.
    pub(crate) log1p_tiny: f64,
    /// The bits of 1 and of √½, and the mantissa mask.
    pub(crate) one_bits: i64,
    pub(crate) sqrt_half_bits: i64,
    pub(crate) mant_mask: i64,
    /// R(z)/z of log (see `LOG_R`).
    pub(crate) log_r: &'static [f64],
    /// The smallest normal, and the power of two that makes a subnormal normal.
    pub(crate) min_normal: f64,
    pub(crate) sub_scale_log2: i32,
    /// Where tanh rounds to ±1 (its argument is clamped there).
    pub(crate) tanh_clamp: f64,
}

pub(crate) const F32_PREC: Prec = Prec {
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
pub(crate) const EXPM1_Q: [f64; 6] = [
    5.000_000_013e-1,
    1.666_666_668e-1,
    4.166_646_501e-2,
    8.333_310_935e-3,
    1.393_364_103e-3,
    1.989_098_082e-4,
];

/// R(z)/z for log1p(f) = f - f²/2 + s·(f²/2 + R), s = f/(2+f), z = s² ≤ 0.0295:
/// relative error 2e-9.
pub(crate) const LOG_R: [f64; 4] = [
    6.666_666_655e-1,
    4.000_012_186e-1,
    2.855_081_910e-1,
    2.333_050_140e-1,
];

impl Math<'_, '_> {
    /// The integer type of the same shape as `self.ty`.
    pub(super) fn ity(&self) -> Type {
        self.ty.as_int()
    }

    /// The constants of this precision.
    pub(super) fn p(&self) -> &'static Prec {
        if self.ty.lane_type() == types::F64 {
            &F64_PREC
        } else {
            &F32_PREC
        }
    }

    pub(super) fn vector(&self) -> bool {
        self.ty.is_vector()
    }

    /// A float constant of `self.ty` (splatted for vectors).
    pub(super) fn f(&mut self, v: f64) -> Value {
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
    pub(super) fn i(&mut self, v: i64) -> Value {
        let ity = self.ity();
        let lane = ity.lane_type();
        let c = self.b.ins().iconst(lane, v);
        if self.vector() {
            self.b.ins().splat(ity, c)
        } else {
            c
        }
    }

    pub(super) fn mul_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        self.b.ins().fmul(x, c)
    }

    pub(super) fn add_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        self.b.ins().fadd(x, c)
    }

    pub(super) fn flags() -> MemFlagsData {
        MemFlagsData::new().with_endianness(Endianness::Little)
    }

    pub(super) fn as_int(&mut self, x: Value) -> Value {
        let ity = self.ity();
        self.b.ins().bitcast(ity, Self::flags(), x)
    }

    pub(super) fn as_float(&mut self, i: Value) -> Value {
        self.b.ins().bitcast(self.ty, Self::flags(), i)
    }

    /// `a cc b` as a mask: I8 0/1 for scalars, all-ones lanes for vectors.
    pub(super) fn cmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }

    pub(super) fn cmp_c(&mut self, cc: FloatCC, a: Value, c: f64) -> Value {
        let c = self.f(c);
        self.cmp(cc, a, c)
    }

    /// `mask ? a : b` for floats.
    pub(super) fn sel(&mut self, mask: Value, a: Value, b: Value) -> Value {
        if self.vector() {
            let m = self.b.ins().bitcast(self.ty, Self::flags(), mask);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(mask, a, b)
        }
    }

    /// `mask ? a : b` for integers of `self.ity()` (mask from an integer compare).
    pub(super) fn isel(&mut self, mask: Value, a: Value, b: Value) -> Value {
        if self.vector() {
            self.b.ins().bitselect(mask, a, b)
        } else {
            self.b.ins().select(mask, a, b)
        }
    }

    /// min(x, c), NaN kept: `c < x ? c : x`.
    pub(super) fn min_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        let lt = self.cmp(FloatCC::LessThan, c, x);
        self.sel(lt, c, x)
    }

    /// max(x, c), NaN kept: `x < c ? c : x`.
    pub(super) fn max_c(&mut self, x: Value, c: f64) -> Value {
        let c = self.f(c);
        let lt = self.cmp(FloatCC::LessThan, x, c);
        self.sel(lt, c, x)
    }

    /// c[0] + v·(c[1] + v·(...)).
    pub(super) fn horner<T: Copy + Into<f64>>(&mut self, v: Value, c: &[T]) -> Value {
        let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
        let mut acc = self.f((*last).into());
        for &k in rest.iter().rev() {
            let k = self.f(k.into());
            acc = self.mul_add(acc, v, k);
        }
        acc
    }

    /// a·b + c: one rounding where the host has FMA, two where it has not.
    pub(super) fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
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
    pub(super) fn int_to_float(&mut self, k: Value) -> Value {
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
    pub(super) fn pow2(&mut self, n: Value) -> Value {
        let p = self.p();
        let bias = self.i(p.bias);
        let e = self.b.ins().iadd(n, bias);
        let e = self.b.ins().ishl_imm_s(e, p.mant_bits);
        self.as_float(e)
    }

    /// `x` with the sign bit of `s` (`x` non-negative or NaN).
    pub(super) fn with_sign_of(&mut self, x: Value, s: Value) -> Value {
        let xb = self.as_int(x);
        let sb = self.as_int(s);
        let bits = self.ty.lane_type().bits();
        let mask = self.i(i64::MIN >> (64 - bits));
        let sign = self.b.ins().band(sb, mask);
        let v = self.b.ins().bor(xb, sign);
        self.as_float(v)
    }
}
