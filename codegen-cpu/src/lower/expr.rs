//! Expression lowering: one instruction of the body, on scalars or vectors alike
//! (constants, unary and binary ops, selects, casts), with transcendentals as inline
//! math (`vmath`), calls to its shared copies (`shared_math`), or calls to the exact
//! functions (`libcalls`) for what the inline code leaves to them.

use super::function::{cl_type, Lowering};
use crate::libcalls::{self, Libcall};
use crate::vmath;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{types, AbiParam, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::{Linkage, Module};
use ndfuse_ir::{BinaryOp, DKind, DType, Expr, Kernel, Scalar, UnaryOp};

impl<M: Module> Lowering<'_, '_, M> {
    /// Instruction `v` of `kernel`, which is neither a load nor a reduction, from the
    /// values of its operands in `values` (all defined, by SSA order).
    pub(super) fn compute(
        &mut self,
        kernel: &Kernel,
        v: usize,
        values: &[Option<Value>],
    ) -> Result<Value, String> {
        let ins = &kernel.body[v];
        let operand =
            |x: &ndfuse_ir::ValueId| values[x.index()].expect("SSA order: defined before use");
        Ok(match &ins.expr {
            Expr::Const(c) => self.constant(*c, ins.dtype),
            // Half values are f32 in registers: their ops are f32 ops.
            Expr::Unary(op, a) => {
                let (a, ad) = (operand(a), kernel.body[a.index()].dtype);
                self.unary(*op, a, ad.compute_dtype())?
            }
            Expr::Binary(op, x, y) => {
                let (xd, x, y) = (kernel.body[x.index()].dtype, operand(x), operand(y));
                self.binary(*op, x, y, xd.compute_dtype())?
            }
            Expr::Where(c, x, y) => {
                let (c, x, y) = (operand(c), operand(x), operand(y));
                // `c` holds 0 or 1; select tests it for non-zero.
                self.select_value(c, x, y)
            }
            Expr::Cast(a) => {
                let (a, from) = (operand(a), kernel.body[a.index()].dtype);
                self.cast(a, from, ins.dtype)
            }
            Expr::Load { .. }
            | Expr::Reduce(..)
            | Expr::ArgReduce(..)
            | Expr::Random { .. }
            | Expr::Position { .. }
            | Expr::Gather { .. } => {
                panic!(
                    "v{v}: loads, reductions, random ops, positions and gathers are lowered by their callers; this is a bug"
                )
            }
        })
    }

    /// `c ? x : y` without a branch. On x86 Cranelift selects a scalar float with a
    /// conditional jump over a move, which mispredicts on data-dependent conditions
    /// (dropout's random mask: 4.5x slower than the same kernel without the select), so
    /// a scalar float is selected as its bits in integer registers (a `cmov`); the bits,
    /// NaN payloads included, are the same.
    ///
    /// On vectors (the element-wise vector loop), `c` is a comparison's lane mask.
    pub(super) fn select_value(&mut self, c: Value, x: Value, y: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        if ty.is_vector() {
            let mask = if self.b.func.dfg.value_type(c) == ty {
                c
            } else {
                let flags =
                    MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
                self.b.ins().bitcast(ty, flags, c)
            };
            return self.b.ins().bitselect(mask, x, y);
        }
        let bits = match ty {
            types::F32 => types::I32,
            types::F64 => types::I64,
            _ => return self.b.ins().select(c, x, y),
        };
        let flags = MemFlagsData::new();
        let xi = self.b.ins().bitcast(bits, flags, x);
        let yi = self.b.ins().bitcast(bits, flags, y);
        let r = self.b.ins().select(c, xi, yi);
        self.b.ins().bitcast(ty, flags, r)
    }

    pub(super) fn constant(&mut self, c: Scalar, dtype: DType) -> Value {
        // The IR promises constants of the instruction's dtype; converting again makes
        // a mismatched one harmless instead of a wrong bit pattern. A half constant is
        // a half value, held exactly in an f32.
        match (c.cast(dtype), dtype) {
            (Scalar::F(v), DType::F32 | DType::F16 | DType::BF16) => {
                self.b.ins().f32const(Ieee32::with_float(v as f32))
            }
            (Scalar::F(v), _) => self.b.ins().f64const(Ieee64::with_float(v)),
            (Scalar::I(v), _) => self.b.ins().iconst(cl_type(dtype), v),
            (Scalar::B(v), _) => self.b.ins().iconst(types::I8, i64::from(v)),
        }
    }

    pub(super) fn float_const(&mut self, dtype: DType, v: f64) -> Value {
        match dtype.compute_dtype() {
            DType::F32 => self.b.ins().f32const(Ieee32::with_float(v as f32)),
            _ => self.b.ins().f64const(Ieee64::with_float(v)),
        }
    }

    pub(super) fn call(
        &mut self,
        call: Libcall,
        ty: Type,
        args: &[Value],
    ) -> Result<Value, String> {
        let known = self.imports.iter().find(|(name, _, _)| *name == call.name);
        let fref = match known {
            Some(&(_, _, fref)) => fref,
            None => {
                let mut sig = self.module.make_signature();
                for _ in 0..call.arity {
                    sig.params.push(AbiParam::new(ty));
                }
                sig.returns.push(AbiParam::new(ty));
                let id = self
                    .module
                    .declare_function(call.name, Linkage::Import, &sig)
                    .map_err(|e| format!("declaring {}: {e}", call.name))?;
                let fref = self.module.declare_func_in_func(id, self.b.func);
                self.imports.push((call.name, id, fref));
                fref
            }
        };
        let inst = self.b.ins().call(fref, args);
        Ok(self.b.inst_results(inst)[0])
    }

    /// `fast`, or `call` on `args` where `exact` (an I8) is non-zero: a branch to a
    /// cold block for the arguments that inline code leaves to the exact function.
    ///
    /// For a vector `fast` (f32x4 or f64x2), `lanes` (an integer mask of the same shape)
    /// marks the lanes that need the call and `exact` says whether any does: the cold
    /// block calls `call` on every lane of `args` and keeps its results in `lanes`
    /// only. The other lanes keep the inline value, which the vector forms in `vmath`
    /// compute to the bit as the scalar code does, so every lane gets what the scalar
    /// loop gives it.
    pub(super) fn exact_unless(
        &mut self,
        (fast, exact, lanes): (Value, Value, Value),
        call: Libcall,
        args: &[Value],
    ) -> Result<Value, String> {
        let ty = self.b.func.dfg.value_type(fast);
        let slow = self.b.create_block();
        let join = self.b.create_block();
        let out = self.b.append_block_param(join, ty);
        self.b.set_cold_block(slow);
        self.b.ins().brif(exact, slow, &[], join, &[fast.into()]);
        self.b.switch_to_block(slow);
        let v = if ty.is_vector() {
            let mut called = fast;
            for lane in 0..ty.lane_count() as u8 {
                let xs: Vec<Value> = args
                    .iter()
                    .map(|&a| self.b.ins().extractlane(a, lane))
                    .collect();
                let yi = self.call(call, ty.lane_type(), &xs)?;
                called = self.b.ins().insertlane(called, yi, lane);
            }
            let flags =
                MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
            let mask = self.b.ins().bitcast(ty, flags, lanes);
            self.b.ins().bitselect(mask, called, fast)
        } else {
            self.call(call, ty, args)?
        };
        self.b.ins().jump(join, &[v.into()]);
        self.b.switch_to_block(join);
        Ok(out)
    }

    pub(super) fn unary(&mut self, op: UnaryOp, x: Value, dtype: DType) -> Result<Value, String> {
        let ty = cl_type(dtype);
        // Transcendentals are inline code (`vmath`), on scalars and vectors alike: the
        // f32 ones and f64 exp, log, tanh, ...; sin and cos (and pow, below) call the
        // exact function only outside their domain, from a cold block.
        if matches!(dtype, DType::F32 | DType::F64) && vmath::inline_for(op, dtype) {
            let vty = self.b.func.dfg.value_type(x);
            if self.shared_math {
                // The same code as inline, compiled once for the process: a call per
                // scalar or per vector.
                let name = crate::shared_math::compiled_symbol(op, vty)
                    .ok_or_else(|| format!("shared {} was not compiled first", op.name()))?;
                return self.call(Libcall { name, arity: 1 }, vty, &[x]);
            }
            if let Some(v) = vmath::unary(&mut self.b, op, x) {
                return Ok(v);
            }
        }
        if dtype == DType::F64 {
            if let (UnaryOp::Sin | UnaryOp::Cos, Some(call)) = (op, libcalls::unary(op, dtype)) {
                let cos = op == UnaryOp::Cos;
                let fast = vmath::trig::sin_cos_f64(&mut self.b, x, cos);
                return self.exact_unless(fast, call, &[x]);
            }
        }
        if dtype == DType::F32 {
            if let (UnaryOp::Sin | UnaryOp::Cos, Some(call)) = (op, libcalls::unary(op, dtype)) {
                let cos = op == UnaryOp::Cos;
                if self.b.func.dfg.value_type(x).is_vector() {
                    let fast = vmath::trig::sin_cos_f32x4(&mut self.b, x, cos);
                    return self.exact_unless(fast, call, &[x]);
                }
                let (fast, exact) = vmath::trig::sin_cos_f32(&mut self.b, x, cos);
                return self.exact_unless((fast, exact, exact), call, &[x]);
            }
        }
        if let Some(call) = libcalls::unary(op, dtype) {
            return self.call(call, ty, &[x]);
        }
        let ins = self.b.ins();
        Ok(match (op, dtype.kind()) {
            (UnaryOp::Not, _) => ins.bxor_imm_u(x, 1),
            (UnaryOp::Neg, DKind::Float) => ins.fneg(x),
            (UnaryOp::Neg, _) => ins.ineg(x),
            (UnaryOp::Abs, DKind::Float) => ins.fabs(x),
            (UnaryOp::Abs, _) => {
                // Wraps like the reference: |MIN| is MIN.
                let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                let minus = self.b.ins().ineg(x);
                self.b.ins().select(neg, minus, x)
            }
            (UnaryOp::Sign, DKind::Float) => {
                // x > 0 ? 1 : x < 0 ? -1 : x, so that ±0 and NaN come back unchanged.
                let zero = self.float_const(dtype, 0.0);
                let one = self.float_const(dtype, 1.0);
                let minus_one = self.float_const(dtype, -1.0);
                let gt = self.b.ins().fcmp(FloatCC::GreaterThan, x, zero);
                let lt = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                let low = self.b.ins().select(lt, minus_one, x);
                self.b.ins().select(gt, one, low)
            }
            (UnaryOp::Sign, _) => {
                let one = self.b.ins().iconst(ty, 1);
                let minus_one = self.b.ins().iconst(ty, -1);
                let gt = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                let lt = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                let low = self.b.ins().select(lt, minus_one, x);
                self.b.ins().select(gt, one, low)
            }
            (UnaryOp::Sqrt, _) => ins.sqrt(x),
            (UnaryOp::Rsqrt, _) => {
                let root = self.b.ins().sqrt(x);
                let one = self.float_const(dtype, 1.0);
                self.b.ins().fdiv(one, root)
            }
            (UnaryOp::Square, DKind::Float) => ins.fmul(x, x),
            (UnaryOp::Square, _) => ins.imul(x, x),
            (UnaryOp::Recip, _) => {
                let one = self.float_const(dtype, 1.0);
                self.b.ins().fdiv(one, x)
            }
            (UnaryOp::Relu, DKind::Float) => {
                // fmax propagates NaN and orders -0 < +0, so relu(-0) = +0.
                let zero = self.float_const(dtype, 0.0);
                self.b.ins().fmax(x, zero)
            }
            (UnaryOp::Relu, _) => {
                let zero = self.b.ins().iconst(ty, 0);
                self.b.ins().smax(x, zero)
            }
            (UnaryOp::Floor, _) => ins.floor(x),
            (UnaryOp::Ceil, _) => ins.ceil(x),
            (UnaryOp::Round, _) => ins.nearest(x),
            (
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Expm1
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Erf,
                _,
            ) => panic!(
                "{} on {dtype} has no libcall; supports() admitting it is a bug",
                op.name()
            ),
        })
    }

    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        x: Value,
        y: Value,
        dtype: DType,
    ) -> Result<Value, String> {
        let ty = cl_type(dtype);
        if let Some(call) = libcalls::binary(op, dtype) {
            if dtype == DType::F32 {
                // Inline for x > 0 and finite operands; the IEEE special cases call.
                if self.b.func.dfg.value_type(x).is_vector() {
                    let fast = vmath::pow::pow_f32x4(&mut self.b, x, y);
                    return self.exact_unless(fast, call, &[x, y]);
                }
                let (fast, exact) = vmath::pow::pow_f32(&mut self.b, x, y);
                return self.exact_unless((fast, exact, exact), call, &[x, y]);
            }
            return self.call(call, ty, &[x, y]);
        }
        let ins = self.b.ins();
        Ok(match (op, dtype.kind()) {
            (BinaryOp::Add, DKind::Float) => ins.fadd(x, y),
            (BinaryOp::Sub, DKind::Float) => ins.fsub(x, y),
            (BinaryOp::Mul, DKind::Float) => ins.fmul(x, y),
            (BinaryOp::Div, DKind::Float) => ins.fdiv(x, y),
            // NaN-propagating, and maximum(-0, +0) = +0 (the WebAssembly rules).
            (BinaryOp::Max, DKind::Float) => ins.fmax(x, y),
            (BinaryOp::Min, DKind::Float) => ins.fmin(x, y),
            // Integer arithmetic wraps, as the reference's.
            (BinaryOp::Add, _) => ins.iadd(x, y),
            (BinaryOp::Sub, _) => ins.isub(x, y),
            (BinaryOp::Mul, _) => ins.imul(x, y),
            (BinaryOp::Max, _) => ins.smax(x, y),
            (BinaryOp::Min, _) => ins.smin(x, y),
            (BinaryOp::And, _) => ins.band(x, y),
            (BinaryOp::Or, _) => ins.bor(x, y),
            (cmp, DKind::Float) => {
                // Ordered comparisons are false on NaN; `!=` is the unordered one, true.
                let cc = match cmp {
                    BinaryOp::Eq => FloatCC::Equal,
                    BinaryOp::Ne => FloatCC::NotEqual,
                    BinaryOp::Lt => FloatCC::LessThan,
                    BinaryOp::Le => FloatCC::LessThanOrEqual,
                    BinaryOp::Gt => FloatCC::GreaterThan,
                    BinaryOp::Ge => FloatCC::GreaterThanOrEqual,
                    _ => panic!("{} on {dtype} passed supports(); that is a bug", op.name()),
                };
                ins.fcmp(cc, x, y)
            }
            (cmp, kind) => {
                // Bools are 0/1, so unsigned order gives false < true.
                let signed = kind == DKind::Int;
                let cc = match (cmp, signed) {
                    (BinaryOp::Eq, _) => IntCC::Equal,
                    (BinaryOp::Ne, _) => IntCC::NotEqual,
                    (BinaryOp::Lt, true) => IntCC::SignedLessThan,
                    (BinaryOp::Le, true) => IntCC::SignedLessThanOrEqual,
                    (BinaryOp::Gt, true) => IntCC::SignedGreaterThan,
                    (BinaryOp::Ge, true) => IntCC::SignedGreaterThanOrEqual,
                    (BinaryOp::Lt, false) => IntCC::UnsignedLessThan,
                    (BinaryOp::Le, false) => IntCC::UnsignedLessThanOrEqual,
                    (BinaryOp::Gt, false) => IntCC::UnsignedGreaterThan,
                    (BinaryOp::Ge, false) => IntCC::UnsignedGreaterThanOrEqual,
                    _ => panic!("{} on {dtype} passed supports(); that is a bug", op.name()),
                };
                ins.icmp(cc, x, y)
            }
        })
    }

    /// Conversions with the reference's rules (`Scalar::cast`): float to int saturates
    /// to i64 (NaN to 0) and then wraps to i32; anything to bool is `!= 0` (NaN is true);
    /// to a half type rounds once (`convert`), even from the same half type.
    pub(super) fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
        use DType::*;
        if from.is_half() || to.is_half() {
            return self.cast_half(x, from, to);
        }
        let to_ty = cl_type(to);
        match (from, to) {
            _ if from == to => x,
            (F32, F64) => self.b.ins().fpromote(types::F64, x),
            (F64, F32) => self.b.ins().fdemote(types::F32, x),
            (F32 | F64, I64) => self.b.ins().fcvt_to_sint_sat(types::I64, x),
            (F32 | F64, I32) => {
                let wide = self.b.ins().fcvt_to_sint_sat(types::I64, x);
                self.b.ins().ireduce(types::I32, wide)
            }
            (F32 | F64, Bool) => {
                let zero = self.float_const(from, 0.0);
                // Unordered not-equal: NaN != 0 is true.
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            // One rounding, as the reference's `int_to_float` (i64 -> f64 -> f32 would
            // round twice beyond 2^53).
            (I32 | I64, F32 | F64) => self.b.ins().fcvt_from_sint(to_ty, x),
            (I32, I64) => self.b.ins().sextend(types::I64, x),
            (I64, I32) => self.b.ins().ireduce(types::I32, x),
            (I32 | I64, Bool) => self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
            (Bool, I32 | I64) => self.b.ins().uextend(to_ty, x),
            (Bool, F32 | F64) => {
                let wide = self.b.ins().uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(to_ty, wide)
            }
            _ => panic!("cast {from} -> {to} passed supports(); that is a bug"),
        }
    }
}
