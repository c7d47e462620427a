//! Conversions between how a value is stored and how it is held in a register: f16 and
//! bf16 buffers are read into f32 registers and written back rounded, and casts that
//! end in a half type round once, as the reference does (`ndfuse_ir::round`).
//!
//! Half values live in F32 registers (lanes of F32X4 in vector loops) for their whole
//! life in a kernel: arithmetic on them is f32 arithmetic, and only three places see
//! the storage type:
//!
//! - a load reads the 16 bits zero-extended into an I32 (`uload16`, or `uload16x4` for
//!   four lanes) and widens them exactly: bf16 is the top half of an f32; an f16's
//!   bits shifted into an f32's place are re-biased by one exact multiplication by
//!   2^112, subnormals included. NaNs come back quiet with their payload, like the
//!   `half` crate's conversions the reference uses;
//! - a store, or an explicit cast to a half type, rounds the f32 to nearest, ties to
//!   even, in integer arithmetic (a subnormal f16 through one f32 addition, rounded by
//!   the hardware): overflow gives infinity, a NaN stays a NaN (quiet, the payload's
//!   top bits kept);
//! - a cast to a half type from f64 or from an integer first rounds to f32 *to odd* (the
//!   f32 toward zero with its last bit set when inexact), so that the one
//!   round-to-nearest step to 11 or 8 significant bits that follows gives the correctly
//!   rounded result: one rounding, as `round::to_f16` / `round::int_to_float`.
//!
//! Every sequence here is branch-free and written once for scalars (I32/F32) and
//! vectors (I32X4/F32X4): the candidates are computed and one is picked by `select`
//! (scalars) or `bitselect` on the lane masks of a vector comparison.

use super::function::Lowering;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{types, Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::DType;

/// 2^112 = 2^(127 - 15): an f16's bits shifted into an f32's place, times this, are
/// its value.
const F16_REBIAS: f32 = f32::from_bits((127 + 112) << 23);

impl<M: Module> Lowering<'_, '_, M> {
    /// A value of storage type `dtype` read from `addr + imm` into a register of type
    /// `ty` (the scalar or vector type that holds `dtype`'s values: F32 or F32X4 for the
    /// half types, which are widened exactly).
    pub(super) fn load_typed(
        &mut self,
        dtype: DType,
        ty: Type,
        flags: MemFlagsData,
        addr: Value,
        imm: i32,
    ) -> Value {
        if !dtype.is_half() {
            return self.b.ins().load(ty, flags, addr, imm);
        }
        let bits = if ty.is_vector() {
            debug_assert_eq!(ty, types::F32X4, "half values are held in f32 lanes");
            self.b.ins().uload16x4(flags, addr, imm)
        } else {
            self.b.ins().uload16(types::I32, flags, addr, imm)
        };
        self.half_to_f32(dtype, bits)
    }

    /// Writes register `value` (scalar or vector) to `addr + imm` as storage type
    /// `dtype`: half values are rounded to nearest, ties to even, from their f32.
    pub(super) fn store_typed(
        &mut self,
        dtype: DType,
        flags: MemFlagsData,
        value: Value,
        addr: Value,
        imm: i32,
    ) {
        if !dtype.is_half() {
            self.b.ins().store(flags, value, addr, imm);
            return;
        }
        let bits = self.f32_to_half_bits(dtype, value);
        if self.b.func.dfg.value_type(bits).is_vector() {
            // Four 16-bit lanes are the low 64 bits of the narrowed vector (the lanes
            // are already in 0..=0xFFFF, so the saturating narrow changes nothing).
            let narrow = self.b.ins().unarrow(bits, bits);
            let le = MemFlagsData::new().with_endianness(Endianness::Little);
            let wide = self.b.ins().bitcast(types::I64X2, le, narrow);
            let low = self.b.ins().extractlane(wide, 0);
            self.b.ins().store(flags, low, addr, imm);
        } else {
            self.b.ins().istore16(flags, bits, addr, imm);
        }
    }

    /// A conversion that involves a half type (`from` or `to`), with the reference's
    /// rules: to a half type, one rounding from the exact source value (even from a half
    /// type: the register holds f32 arithmetic not yet rounded); from a half type, the
    /// f32 it is held in converts like an f32.
    pub(super) fn cast_half(&mut self, x: Value, from: DType, to: DType) -> Value {
        if !to.is_half() {
            return self.cast(x, DType::F32, to);
        }
        let f32_value = match from {
            DType::F32 | DType::F16 | DType::BF16 => x,
            DType::F64 => self.f64_to_f32_odd(x),
            DType::I32 => {
                let wide = self.b.ins().sextend(types::I64, x);
                self.int_to_f32_odd(wide)
            }
            DType::I64 => self.int_to_f32_odd(x),
            // 0 or 1: exact.
            DType::Bool => {
                let wide = self.b.ins().uextend(types::I32, x);
                return self.b.ins().fcvt_from_uint(types::F32, wide);
            }
        };
        let bits = self.f32_to_half_bits(to, f32_value);
        self.half_to_f32(to, bits)
    }

    /// The f32 value of the half `bits` of `dtype` (the zero-extended 16 bits in an I32,
    /// or in each lane of an I32X4): exact; NaNs quieted, payload kept.
    fn half_to_f32(&mut self, dtype: DType, h: Value) -> Value {
        let ity = self.b.func.dfg.value_type(h);
        let fty = float_of(ity);
        let plain = MemFlagsData::new();
        let bits = match dtype {
            DType::BF16 => {
                // bf16 is the top half of an f32.
                let sixteen = self.b.ins().iconst(types::I32, 16);
                let wide = self.b.ins().ishl(h, sixteen);
                let mag = self.kconst(ity, 0x7FFF);
                let mag = self.b.ins().band(h, mag);
                let inf = self.kconst(ity, 0x7F80);
                let nan = self.b.ins().icmp(IntCC::SignedGreaterThan, mag, inf);
                let quiet = self.kconst(ity, 0x0040_0000);
                let quieted = self.b.ins().bor(wide, quiet);
                self.pick(nan, quieted, wide)
            }
            DType::F16 => {
                let mag = self.kconst(ity, 0x7FFF);
                let em = self.b.ins().band(h, mag);
                let thirteen = self.b.ins().iconst(types::I32, 13);
                let o = self.b.ins().ishl(em, thirteen);
                // Finite: the bits shifted into place read as an f32 2^112 times too
                // small (exponent bias 127 against 15), subnormals included (an f32
                // subnormal then); one exact multiplication by 2^112 re-biases both
                // (in the default floating-point environment, as every kernel assumes:
                // no denormals-are-zero).
                let as_float = self.b.ins().bitcast(fty, plain, o);
                let rebias = self.fconst32(fty, F16_REBIAS);
                let finite = self.b.ins().fmul(as_float, rebias);
                let finite = self.b.ins().bitcast(ity, plain, finite);
                // Infinity or NaN: the exponent all ones, the payload kept (quieted).
                let exp_ones = self.kconst(ity, 0x7F80_0000);
                let inf_nan = self.b.ins().bor(o, exp_ones);
                let quiet = self.kconst(ity, 0x0040_0000);
                let quieted = self.b.ins().bor(inf_nan, quiet);
                let inf = self.kconst(ity, 0x7C00);
                let nan = self.b.ins().icmp(IntCC::SignedGreaterThan, em, inf);
                let special = self.pick(nan, quieted, inf_nan);
                let not_finite = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, em, inf);
                let unsigned = self.pick(not_finite, special, finite);
                let sign_mask = self.kconst(ity, 0x8000);
                let sign = self.b.ins().band(h, sign_mask);
                let sixteen = self.b.ins().iconst(types::I32, 16);
                let sign = self.b.ins().ishl(sign, sixteen);
                self.b.ins().bor(unsigned, sign)
            }
            _ => panic!("half_to_f32 of {dtype}, which is not a half type: a bug"),
        };
        self.b.ins().bitcast(fty, plain, bits)
    }

    /// `x` (F32 or F32X4) rounded to nearest, ties to even, to the half `dtype`: its 16
    /// bits zero-extended in an I32 (or in each lane of an I32X4). Overflow gives
    /// infinity; a NaN gives a quiet NaN with the top bits of its payload, as the `half`
    /// crate's conversion.
    fn f32_to_half_bits(&mut self, dtype: DType, x: Value) -> Value {
        let fty = self.b.func.dfg.value_type(x);
        let ity = int_of(fty);
        let plain = MemFlagsData::new();
        let u = self.b.ins().bitcast(ity, plain, x);
        let abs_mask = self.kconst(ity, 0x7FFF_FFFF);
        let f = self.b.ins().band(u, abs_mask);
        let inf = self.kconst(ity, 0x7F80_0000);
        let nan = self.b.ins().icmp(IntCC::SignedGreaterThan, f, inf);
        let sixteen = self.b.ins().iconst(types::I32, 16);
        match dtype {
            DType::BF16 => {
                // Add just under half an ulp, plus the kept lsb (ties to even), and keep
                // the top 16 bits; a carry into the exponent is the right result,
                // infinity included.
                let top = self.b.ins().ushr(u, sixteen);
                let one = self.kconst(ity, 1);
                let lsb = self.b.ins().band(top, one);
                let below_half = self.kconst(ity, 0x7FFF);
                let biased = self.b.ins().iadd(u, below_half);
                let biased = self.b.ins().iadd(biased, lsb);
                let rounded = self.b.ins().ushr(biased, sixteen);
                let quiet = self.kconst(ity, 0x0040);
                let quieted = self.b.ins().bor(top, quiet);
                self.pick(nan, quieted, rounded)
            }
            DType::F16 => {
                let thirteen = self.b.ins().iconst(types::I32, 13);
                // Normal: re-bias the exponent from 127 to 15 and round the 13 dropped
                // bits to nearest even (0xFFF plus the kept lsb); a carry out of the
                // mantissa is the next exponent, up to infinity at 65520 and above.
                let kept = self.b.ins().ushr(f, thirteen);
                let one = self.kconst(ity, 1);
                let lsb = self.b.ins().band(kept, one);
                let bias = self.kconst(ity, ((15u32.wrapping_sub(127) << 23) + 0xFFF) as i64);
                let biased = self.b.ins().iadd(f, bias);
                let biased = self.b.ins().iadd(biased, lsb);
                let normal = self.b.ins().ushr(biased, thirteen);
                // Below 2^-14 (f16 subnormal or zero): adding 0.5 leaves the f16 ulp
                // 2^-24 as the f32 ulp, so the hardware's rounding of the addition is the
                // rounding wanted; the mantissa bits are the result (0x400 when it rounds
                // up to the smallest normal).
                let as_float = self.b.ins().bitcast(fty, plain, f);
                let half = self.fconst32(fty, 0.5);
                let sum = self.b.ins().fadd(as_float, half);
                let sum = self.b.ins().bitcast(ity, plain, sum);
                let half_bits = self.kconst(ity, 0x3F00_0000);
                let sub = self.b.ins().isub(sum, half_bits);
                // At 65536 and above: infinity, or a quiet NaN.
                let payload = self.kconst(ity, 0x03FF);
                let payload = self.b.ins().band(kept, payload);
                let quiet_nan = self.kconst(ity, 0x7E00);
                let quiet_nan = self.b.ins().bor(quiet_nan, payload);
                let half_inf = self.kconst(ity, 0x7C00);
                let big = self.pick(nan, quiet_nan, half_inf);
                let min_normal = self.kconst(ity, (127 - 14) << 23);
                let tiny = self.b.ins().icmp(IntCC::SignedLessThan, f, min_normal);
                let finite = self.pick(tiny, sub, normal);
                let overflow = self.kconst(ity, (127 + 16) << 23);
                let huge = self
                    .b
                    .ins()
                    .icmp(IntCC::SignedGreaterThanOrEqual, f, overflow);
                let unsigned = self.pick(huge, big, finite);
                let sign = self.b.ins().ushr(u, sixteen);
                let sign_mask = self.kconst(ity, 0x8000);
                let sign = self.b.ins().band(sign, sign_mask);
                self.b.ins().bor(unsigned, sign)
            }
            _ => panic!("f32_to_half_bits to {dtype}, which is not a half type: a bug"),
        }
    }

    /// `x` (F64) rounded to f32 by round-to-odd (`round::f32_round_odd`): exact, or the
    /// f32 toward zero with its last bit set; NaN stays NaN.
    fn f64_to_f32_odd(&mut self, x: Value) -> Value {
        let r = self.b.ins().fdemote(types::F32, x);
        let back = self.b.ins().fpromote(types::F64, r);
        let exact = self.b.ins().fcmp(FloatCC::Equal, back, x);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let keep = self.b.ins().bor(exact, nan);
        // Round-to-nearest went away from zero (or overflowed): step back toward it.
        let back_abs = self.b.ins().fabs(back);
        let x_abs = self.b.ins().fabs(x);
        let away = self.b.ins().fcmp(FloatCC::GreaterThan, back_abs, x_abs);
        let plain = MemFlagsData::new();
        let rb = self.b.ins().bitcast(types::I32, plain, r);
        let toward = self.b.ins().iadd_imm_s(rb, -1);
        let t = self.b.ins().select(away, toward, rb);
        let t = self.b.ins().bor_imm_s(t, 1);
        let odd = self.b.ins().bitcast(types::F32, plain, t);
        self.b.ins().select(keep, r, odd)
    }

    /// The I64 `x` as f32 by round-to-odd: its magnitude truncated to 24 significant
    /// bits, the last of them set when a dropped bit was, then converted exactly.
    fn int_to_f32_odd(&mut self, x: Value) -> Value {
        // |i64::MIN| wraps to itself, which read as unsigned is 2^63: right.
        let mag = self.b.ins().iabs(x);
        let lz = self.b.ins().clz(mag);
        // Bits below the top 24 significant ones: 64 - lz - 24, at least 0.
        let forty = self.b.ins().iconst(types::I64, 40);
        let drop = self.b.ins().isub(forty, lz);
        let zero = self.b.ins().iconst(types::I64, 0);
        let drop = self.b.ins().smax(drop, zero);
        let one = self.b.ins().iconst(types::I64, 1);
        let last = self.b.ins().ishl(one, drop);
        let mask = self.b.ins().isub(last, one);
        let low = self.b.ins().band(mag, mask);
        let sticky = self.b.ins().icmp_imm_s(IntCC::NotEqual, low, 0);
        let kept = self.b.ins().band_not(mag, mask);
        let odd = self.b.ins().bor(kept, last);
        let t = self.b.ins().select(sticky, odd, kept);
        let f = self.b.ins().fcvt_from_uint(types::F32, t);
        let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
        let minus = self.b.ins().fneg(f);
        self.b.ins().select(neg, minus, f)
    }

    /// `v` as an I32, or splatted to the lanes of an I32X4.
    fn kconst(&mut self, ity: Type, v: i64) -> Value {
        // I32 immediates are given zero-extended.
        let c = self.b.ins().iconst(types::I32, v & i64::from(u32::MAX));
        if ity.is_vector() {
            self.b.ins().splat(ity, c)
        } else {
            c
        }
    }

    /// `v` as an F32, or splatted to the lanes of an F32X4.
    fn fconst32(&mut self, fty: Type, v: f32) -> Value {
        let c = self.b.ins().f32const(Ieee32::with_float(v));
        if fty.is_vector() {
            self.b.ins().splat(fty, c)
        } else {
            c
        }
    }

    /// `cond ? a : b`, for a scalar condition or per lane for a vector comparison's mask.
    fn pick(&mut self, cond: Value, a: Value, b: Value) -> Value {
        if self.b.func.dfg.value_type(a).is_vector() {
            self.b.ins().bitselect(cond, a, b)
        } else {
            self.b.ins().select(cond, a, b)
        }
    }
}

/// The float type with the layout of integer type `ity` (I32 or I32X4).
fn float_of(ity: Type) -> Type {
    if ity.is_vector() {
        types::F32X4
    } else {
        types::F32
    }
}

/// The integer type with the layout of float type `fty` (F32 or F32X4).
fn int_of(fty: Type) -> Type {
    if fty.is_vector() {
        types::I32X4
    } else {
        types::I32
    }
}
