//! Random number sources in generated code: `random_uniform`'s hash
//! (`ndfuse_ir::op::random_bits`) from 32-bit multiplies, xors, shifts and adds, on a
//! scalar or on the four i32 lanes of a vector, giving the interpreter's bits at every
//! position (`(bits >> 8) * 2^-24` is exact in f32, whatever the width).

use super::function::Lowering;
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{types, InstBuilder, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::op::mix32;
use ndfuse_ir::View;

/// Whether every position `view` reaches is below 2^32: the high half of the index is 0
/// and the key schedule is one value per kernel (`random_stream(key, 0)`).
pub(super) fn below_2_32(view: &View) -> bool {
    view.span().is_none_or(|(_, hi)| hi < 1 << 32)
}

impl<M: Module> Lowering<'_, '_, M> {
    /// A 32-bit constant in the shape of `like` (a scalar or a vector of i32 lanes).
    fn u32_const(&mut self, like: Type, c: u32) -> Value {
        let s = self.b.ins().iconst(types::I32, i64::from(c as i32));
        if like.is_vector() {
            self.b.ins().splat(like, s)
        } else {
            s
        }
    }

    /// `x ^= x >> s` on each 32-bit lane.
    fn xorshift(&mut self, x: Value, s: i64) -> Value {
        let sh = self.b.ins().ushr_imm_u(x, s);
        self.b.ins().bxor(x, sh)
    }

    /// [`mix32`] on a scalar i32 or on each lane of an i32x4.
    fn mix32(&mut self, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let x = self.xorshift(x, 16);
        let m1 = self.u32_const(ty, 0x7feb_352d);
        let x = self.b.ins().imul(x, m1);
        let x = self.xorshift(x, 15);
        let m2 = self.u32_const(ty, 0x846c_a68b);
        let x = self.b.ins().imul(x, m2);
        self.xorshift(x, 16)
    }

    /// [`ndfuse_ir::op::random_stream`]`(key, c1)` for an i64 `key` and an i32 `c1`
    /// (`None` for 0, whose inner mix is a constant).
    pub(super) fn random_stream(&mut self, key: Value, c1: Option<Value>) -> Value {
        let k0 = self.b.ins().ireduce(types::I32, key);
        let hi = self.b.ins().ushr_imm_u(key, 32);
        let k1 = self.b.ins().ireduce(types::I32, hi);
        let inner = match c1 {
            // mix32(0 ^ 0x9e3779b9), folded here.
            None => self.u32_const(types::I32, mix32(0x9e37_79b9)),
            Some(c1) => {
                let golden = self.u32_const(types::I32, 0x9e37_79b9);
                let x = self.b.ins().bxor(c1, golden);
                self.mix32(x)
            }
        };
        let x = self.b.ins().bxor(k1, inner);
        let x = self.mix32(x);
        let x = self.b.ins().bxor(k0, x);
        self.mix32(x)
    }

    /// The value in `[0, 1)` for stream `h` at low index half `c0`: `mix32(mix32(c0 ^
    /// h) + h) >> 8` times 2^-24; `h` and `c0` both scalars, or both i32x4.
    pub(super) fn random_value(&mut self, h: Value, c0: Value) -> Value {
        let ty = self.b.func.dfg.value_type(c0);
        let x = self.b.ins().bxor(c0, h);
        let x = self.mix32(x);
        let x = self.b.ins().iadd(x, h);
        let bits = self.mix32(x);
        let top = self.b.ins().ushr_imm_u(bits, 8);
        // Below 2^24: the signed conversion is exact (and one instruction on x86).
        let (fty, scale) = if ty.is_vector() {
            (types::F32X4, true)
        } else {
            (types::F32, false)
        };
        let f = self.b.ins().fcvt_from_sint(fty, top);
        let s = self
            .b
            .ins()
            .f32const(Ieee32::with_float(1.0 / 16_777_216.0));
        let s = if scale {
            self.b.ins().splat(types::F32X4, s)
        } else {
            s
        };
        self.b.ins().fmul(f, s)
    }

    /// The value at i64 position `index` under i64 `key` on scalars; `stream` is the
    /// key schedule when the caller has it (every position below 2^32), else it is
    /// computed from the index's high half.
    pub(super) fn random_at(&mut self, key: Value, index: Value, stream: Option<Value>) -> Value {
        let h = match stream {
            Some(h) => h,
            None => {
                let hi = self.b.ins().ushr_imm_u(index, 32);
                let c1 = self.b.ins().ireduce(types::I32, hi);
                self.random_stream(key, Some(c1))
            }
        };
        let c0 = self.b.ins().ireduce(types::I32, index);
        self.random_value(h, c0)
    }
}
