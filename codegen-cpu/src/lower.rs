//! Lowering: one [`Kernel`] to one Cranelift function, a loop over a range of flat
//! domain positions: a vector loop first when every load is contiguous or fixed and
//! every op has a vector form (`vector`), then the scalar loop below for the rest; a
//! row loop when loads broadcast along rows or per row (`broadcast`).
//! Kernels with reduce axes loop over rows instead (`rows`), over bands of columns
//! (`columns`), or run in split phases (`split`).
//!
//! ```text
//! block0(ptrs, start, end):   brif start < end, block1, block3
//! block1:                     buffer pointers from ptrs; loads of fixed elements
//!                             jump block2(start)
//! block2(i):                  index math, loads, the body, stores
//!                             brif i + 1 < end, block2(i + 1), block3
//! block3:                     return
//! ```
//!
//! Values are typed as the kernel says: f32/f64 as F32/F64, i32/i64 as I32/I64, bool as
//! an I8 holding 0 or 1 (`supports` guarantees no instruction can produce anything
//! else, which keeps stores into `Vec<bool>` sound). f16/bf16 values are held as F32:
//! loads widen them, stores and casts to them round (`convert`), and everything in
//! between is f32 arithmetic. All index arithmetic is in i64.

use crate::index::{self, Access, IndexPlan};
use crate::libcalls::{self, Libcall};
use crate::vmath;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{
    types, AbiParam, FuncRef, Function, InstBuilder, MemFlagsData, Signature, Type, UserFuncName,
    Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};
use ndfuse_ir::{BinaryOp, DKind, DType, Expr, Kernel, Scalar, UnaryOp, View};
use std::collections::BTreeMap;

mod broadcast;
mod cache;
mod columns;
mod convert;
mod rows;
mod split;
mod vector;

pub(crate) use columns::{ColumnBand, BAND};
pub(crate) use split::{Phase, SplitLayout};

/// The signature of every kernel: `(ptrs: *const *mut u8, start: i64, end: i64)`.
pub(crate) fn kernel_signature<M: Module>(module: &M) -> Signature {
    let mut sig = module.make_signature();
    sig.params
        .push(AbiParam::new(module.target_config().pointer_type()));
    sig.params.push(AbiParam::new(types::I64));
    sig.params.push(AbiParam::new(types::I64));
    sig
}

/// The Cranelift type holding values of `dtype` in registers (half types compute in
/// f32).
fn cl_type(dtype: DType) -> Type {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::Bool => types::I8,
    }
}

/// log2 of the element size, to scale an element offset into bytes with a shift.
fn size_shift(dtype: DType) -> i64 {
    i64::from(dtype.size_bytes().trailing_zeros())
}

/// Loads of inputs: the buffers are never written while the kernel runs (inputs and
/// outputs are distinct Rust borrows), and `supports` proved every access in bounds.
fn input_flags() -> MemFlagsData {
    MemFlagsData::trusted().with_readonly()
}

/// Vector loads of inputs: like [`input_flags`] but without `aligned`. Buffers are only
/// element-aligned, and the x64 backend folds an aligned vector load into an SSE memory
/// operand, which faults unless the address is a multiple of 16.
fn vector_input_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap().with_readonly()
}

/// Writes the function of `phase` of `kernel` (`Phase::Whole` but for the phases of a
/// split kernel: `SplitLayout::phases`) as the body of `func`, whose name and signature
/// this sets. Fails only when `module` refuses an import.
/// Transcendentals become calls to imported [`libcalls`], declared in `module`; the
/// imports are returned in the order of their ids, for a legend of the CLIF text (which
/// shows them only as `u0:<id>`).
pub(crate) fn lower<M: Module>(
    kernel: &Kernel,
    phase: Phase,
    shared_math: bool,
    module: &mut M,
    func: &mut Function,
    fctx: &mut FunctionBuilderContext,
) -> Result<Vec<(&'static str, FuncId)>, String> {
    func.signature = kernel_signature(module);
    func.name = UserFuncName::testcase(format!("{}{}", kernel.name, phase.suffix()));
    let ptr_ty = module.target_config().pointer_type();
    let b = FunctionBuilder::new(func, fctx);
    let mut lw = Lowering {
        b,
        module,
        ptr_ty,
        imports: Vec::new(),
        consts: BTreeMap::new(),
        scaled: BTreeMap::new(),
        shared_math,
    };
    lw.kernel(kernel, phase)?;
    lw.b.seal_all_blocks();
    let config = lw.module.target_config();
    lw.b.finalize(config);
    Ok(lw
        .imports
        .into_iter()
        .map(|(name, id, _)| (name, id))
        .collect())
}

struct Lowering<'f, 'm, M: Module> {
    b: FunctionBuilder<'f>,
    module: &'m mut M,
    ptr_ty: Type,
    /// Imported functions declared so far, in declaration order.
    imports: Vec<(&'static str, FuncId, FuncRef)>,
    /// i64 constants already materialised. Every block that creates one (entry,
    /// preheader, loop) dominates the later users, so one definition serves all; the
    /// sweeps of a row kernel, which do not dominate what follows them, restore this
    /// cache (and `scaled`) when they end.
    consts: BTreeMap<i64, Value>,
    /// Element offsets already scaled to bytes, by (offset, shift): contiguous loads and
    /// stores of one element size share one address computation.
    scaled: BTreeMap<(Value, i64), Value>,
    /// Whether f32 math calls the shared out-of-line copies (`shared_math`, for small
    /// kernels) instead of being inlined.
    shared_math: bool,
}

/// An element offset: a variable part (`None` for none) plus constant elements, which
/// end up in the load's or store's immediate offset when they fit.
#[derive(Clone, Copy)]
struct Offset {
    var: Option<Value>,
    elems: i64,
}

impl<M: Module> Lowering<'_, '_, M> {
    fn kernel(&mut self, kernel: &Kernel, phase: Phase) -> Result<(), String> {
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let params = self.b.block_params(entry).to_vec();
        let (ptrs, start, end) = (params[0], params[1], params[2]);
        if !kernel.reduce_axes.is_empty() {
            if let (Phase::Whole, Some(band)) = (phase, ColumnBand::of(kernel)) {
                return self.column_kernel(kernel, &band, (ptrs, start, end));
            }
            let split = SplitLayout::of(kernel);
            return self.row_kernel(kernel, (ptrs, start, end), phase, split.as_ref());
        }

        // An empty domain has no element to read; its views need not even be
        // decomposable, so emit no loop at all.
        if kernel.domain.numel() == 0 {
            self.b.ins().return_(&[]);
            return Ok(());
        }

        let preheader = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        let i = self.b.append_block_param(body, types::I64);

        let nonempty = self.b.ins().icmp(IntCC::SignedLessThan, start, end);
        self.b.ins().brif(nonempty, preheader, &[], exit, &[]);

        // Preheader: everything that does not depend on the position.
        self.b.switch_to_block(preheader);
        let bases = self.buffer_bases(kernel, ptrs);
        let (in_bases, out_bases) = bases.split_at(kernel.inputs.len());

        let views: Vec<&View> = kernel
            .body
            .iter()
            .filter_map(|ins| match &ins.expr {
                Expr::Load { view, .. } => Some(view),
                _ => None,
            })
            .collect();
        let (plan, accesses) = index::plan(&kernel.domain, &views);
        let mut accesses = accesses.into_iter();

        // Loads of one fixed element (broadcast scalars) are loop-invariant; in bounds
        // whenever the loop runs, since the domain is not empty.
        let mut values: Vec<Option<Value>> = vec![None; kernel.body.len()];
        let mut load_access: Vec<Option<Access>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            if let Expr::Load { input, .. } = &ins.expr {
                let access = accesses.next().expect("one access per load");
                if let Access::Fixed(elems) = access {
                    let off = Offset { var: None, elems };
                    values[v] = Some(self.load_at(in_bases[*input], off, ins.dtype));
                } else {
                    load_access[v] = Some(access);
                }
            }
        }
        // Loads that broadcast along rows or per row: the row loop does every position.
        if vector::elementwise_type(kernel, &plan, &load_access).is_none() {
            if let Some(vt) = broadcast::row_loop_type(kernel, &plan, &load_access) {
                let loads = (&plan, &load_access[..]);
                let bases = (in_bases, out_bases);
                self.elementwise_rows(kernel, (start, end, exit), loads, &values, vt, bases)?;
                self.b.switch_to_block(exit);
                self.b.ins().return_(&[]);
                return Ok(());
            }
        }
        // Vectors first where the kernel allows, then scalars for the rest.
        match vector::elementwise_type(kernel, &plan, &load_access) {
            Some(vt) => {
                let bases = (in_bases, out_bases);
                let loads = (&plan, &load_access[..]);
                let vend =
                    self.elementwise_vectors(kernel, (start, end), loads, &values, vt, bases)?;
                let more = self.b.ins().icmp(IntCC::SignedLessThan, vend, end);
                self.b.ins().brif(more, body, &[vend.into()], exit, &[]);
            }
            None => {
                self.b.ins().jump(body, &[start.into()]);
            }
        }

        // Loop body.
        self.b.switch_to_block(body);
        let indices = self.decompose(&plan, i);
        for (v, ins) in kernel.body.iter().enumerate() {
            if values[v].is_some() {
                continue;
            }
            let value = match &ins.expr {
                Expr::Load { input, .. } => {
                    let access = load_access[v].take().expect("a load's access was planned");
                    let off = self.element_offset(&access, &indices, i);
                    self.load_at(in_bases[*input], off, ins.dtype)
                }
                _ => self.compute(kernel, v, &values)?,
            };
            values[v] = Some(value);
        }
        for s in &kernel.stores {
            let value = values[s.value.index()].expect("stored values are defined");
            let dtype = kernel.body[s.value.index()].dtype;
            let at = Offset {
                var: Some(i),
                elems: 0,
            };
            let (addr, imm) = self.address(out_bases[s.output], at, dtype);
            self.store_typed(dtype, MemFlagsData::trusted(), value, addr, imm);
        }
        let one = self.iconst(1);
        let next = self.b.ins().iadd(i, one);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, next, end);
        self.b.ins().brif(more, body, &[next.into()], exit, &[]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
        Ok(())
    }

    /// The buffer pointers from the `ptrs` array: inputs, then outputs.
    fn buffer_bases(&mut self, kernel: &Kernel, ptrs: Value) -> Vec<Value> {
        let n_ptrs = kernel.inputs.len() + kernel.outputs.len();
        let word = i32::try_from(self.ptr_ty.bytes()).expect("a pointer is 4 or 8 bytes");
        (0..n_ptrs)
            .map(|k| {
                let at = i32::try_from(k).ok().and_then(|k| k.checked_mul(word));
                let at = at.expect("a kernel with over 2^28 buffers is a bug");
                self.b.ins().load(self.ptr_ty, input_flags(), ptrs, at)
            })
            .collect()
    }

    /// Instruction `v` of `kernel`, which is neither a load nor a reduction, from the
    /// values of its operands in `values` (all defined, by SSA order).
    fn compute(
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
                self.b.ins().select(c, x, y)
            }
            Expr::Cast(a) => {
                let (a, from) = (operand(a), kernel.body[a.index()].dtype);
                self.cast(a, from, ins.dtype)
            }
            Expr::Load { .. } | Expr::Reduce(..) | Expr::ArgReduce(..) => {
                panic!("v{v}: loads and reductions are lowered by their callers; this is a bug")
            }
        })
    }

    /// Group indices of the flat position `i`, innermost first by division by constant
    /// extents; only the groups some strided load needs, and only as far out as needed.
    /// The outermost group needs no remainder: `i < numel` bounds it.
    fn decompose(&mut self, plan: &IndexPlan, i: Value) -> Vec<Option<Value>> {
        let mut idx = vec![None; plan.extents.len()];
        let Some(first) = plan.outermost_needed() else {
            return idx;
        };
        let mut rest = i;
        for g in (first..plan.extents.len()).rev() {
            if g == 0 {
                idx[0] = Some(rest);
                break;
            }
            let extent = self.iconst(plan.extents[g]);
            let quot = self.b.ins().udiv(rest, extent);
            if plan.needed[g] {
                let whole = self.b.ins().imul(quot, extent);
                idx[g] = Some(self.b.ins().isub(rest, whole));
            }
            rest = quot;
        }
        idx
    }

    /// The element offset of a load at position `i`.
    fn element_offset(&mut self, access: &Access, idx: &[Option<Value>], i: Value) -> Offset {
        match access {
            Access::Contiguous => Offset {
                var: Some(i),
                elems: 0,
            },
            Access::Fixed(elems) => Offset {
                var: None,
                elems: *elems,
            },
            Access::Strided { offset, strides } => {
                let mut sum: Option<Value> = None;
                for (g, &stride) in strides.iter().enumerate() {
                    if stride == 0 {
                        continue;
                    }
                    let ix = idx[g].expect("indices of groups with a non-zero stride are computed");
                    let term = if stride == 1 {
                        ix
                    } else {
                        let s = self.iconst(stride);
                        self.b.ins().imul(ix, s)
                    };
                    sum = Some(match sum {
                        None => term,
                        Some(acc) => self.b.ins().iadd(acc, term),
                    });
                }
                Offset {
                    var: sum,
                    elems: *offset,
                }
            }
        }
    }

    fn iconst(&mut self, v: i64) -> Value {
        if let Some(&c) = self.consts.get(&v) {
            return c;
        }
        let c = self.b.ins().iconst(types::I64, v);
        self.consts.insert(v, c);
        c
    }

    /// The address of element `off` of a buffer of `dtype` at `base`, as a value and an
    /// immediate byte offset.
    fn address(&mut self, base: Value, off: Offset, dtype: DType) -> (Value, i32) {
        let shift = size_shift(dtype);
        let addr = match off.var {
            None => base,
            Some(var) => {
                let bytes = match self.scaled.get(&(var, shift)) {
                    Some(&b) => b,
                    None => {
                        let b = if shift == 0 {
                            var
                        } else {
                            let sh = self.iconst(shift);
                            self.b.ins().ishl(var, sh)
                        };
                        self.scaled.insert((var, shift), b);
                        b
                    }
                };
                self.b.ins().iadd(base, bytes)
            }
        };
        // A constant offset inside a buffer is below isize::MAX bytes.
        let bytes = off
            .elems
            .checked_mul(dtype.size_bytes() as i64)
            .expect("an offset inside a buffer fits in i64 bytes (supports() checked the view)");
        match i32::try_from(bytes) {
            Ok(imm) => (addr, imm),
            Err(_) => {
                let c = self.iconst(bytes);
                (self.b.ins().iadd(addr, c), 0)
            }
        }
    }

    fn load_at(&mut self, base: Value, off: Offset, dtype: DType) -> Value {
        let (addr, imm) = self.address(base, off, dtype);
        self.load_typed(dtype, cl_type(dtype), input_flags(), addr, imm)
    }

    fn constant(&mut self, c: Scalar, dtype: DType) -> Value {
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

    fn float_const(&mut self, dtype: DType, v: f64) -> Value {
        match dtype.compute_dtype() {
            DType::F32 => self.b.ins().f32const(Ieee32::with_float(v as f32)),
            _ => self.b.ins().f64const(Ieee64::with_float(v)),
        }
    }

    fn call(&mut self, call: Libcall, ty: Type, args: &[Value]) -> Result<Value, String> {
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
    fn exact_unless(
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

    fn unary(&mut self, op: UnaryOp, x: Value, dtype: DType) -> Result<Value, String> {
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

    fn binary(&mut self, op: BinaryOp, x: Value, y: Value, dtype: DType) -> Result<Value, String> {
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
    fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
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
