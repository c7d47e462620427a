//! The function being written: the `Lowering` state (Cranelift's builder, the module,
//! imports and cached constants) and what every loop shares to reach memory: the
//! buffer pointers, the index arithmetic of a flat position, element offsets,
//! addresses and loads.

use crate::index::{Access, IndexPlan};
use cranelift_codegen::ir::{types, FuncRef, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use cranelift_module::{FuncId, Module};
use ndfuse_ir::{DType, Kernel};
use std::collections::BTreeMap;

/// The Cranelift type holding values of `dtype` in registers (half types compute in
/// f32).
pub(super) fn cl_type(dtype: DType) -> Type {
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
pub(super) fn input_flags() -> MemFlagsData {
    MemFlagsData::trusted().with_readonly()
}

/// Vector loads of inputs: like [`input_flags`] but without `aligned`. Buffers are only
/// element-aligned, and the x64 backend folds an aligned vector load into an SSE memory
/// operand, which faults unless the address is a multiple of 16.
pub(super) fn vector_input_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap().with_readonly()
}

/// One function being written: Cranelift's builder, the module its imports are declared
/// in, and caches of what the function already computes.
pub(super) struct Lowering<'f, 'm, M: Module> {
    pub(super) b: FunctionBuilder<'f>,
    pub(super) module: &'m mut M,
    pub(super) ptr_ty: Type,
    /// Imported functions declared so far, in declaration order.
    pub(super) imports: Vec<(&'static str, FuncId, FuncRef)>,
    /// i64 constants already materialised. Every block that creates one (entry,
    /// preheader, loop) dominates the later users, so one definition serves all; the
    /// sweeps of a row kernel, which do not dominate what follows them, restore this
    /// cache (and `scaled`) when they end.
    pub(super) consts: BTreeMap<i64, Value>,
    /// Element offsets already scaled to bytes, by (offset, shift): contiguous loads and
    /// stores of one element size share one address computation.
    pub(super) scaled: BTreeMap<(Value, i64), Value>,
    /// Whether f32 math calls the shared out-of-line copies (`shared_math`, for small
    /// kernels) instead of being inlined.
    pub(super) shared_math: bool,
    /// The tier of the wide routines the code may call (`wide::symbols`), if any.
    pub(super) wide: Option<crate::wide::Tier>,
}

/// An element offset: a variable part (`None` for none) plus constant elements, which
/// end up in the load's or store's immediate offset when they fit.
#[derive(Clone, Copy)]
pub(super) struct Offset {
    pub(super) var: Option<Value>,
    pub(super) elems: i64,
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The buffer pointers from the `ptrs` array: inputs, then outputs.
    pub(super) fn buffer_bases(&mut self, kernel: &Kernel, ptrs: Value) -> Vec<Value> {
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

    /// Group indices of the flat position `i`, innermost first by division by constant
    /// extents; only the groups some strided load needs, and only as far out as needed.
    /// The outermost group needs no remainder: `i < numel` bounds it.
    pub(super) fn decompose(&mut self, plan: &IndexPlan, i: Value) -> Vec<Option<Value>> {
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
    pub(super) fn element_offset(
        &mut self,
        access: &Access,
        idx: &[Option<Value>],
        i: Value,
    ) -> Offset {
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

    pub(super) fn iconst(&mut self, v: i64) -> Value {
        if let Some(&c) = self.consts.get(&v) {
            return c;
        }
        let c = self.b.ins().iconst(types::I64, v);
        self.consts.insert(v, c);
        c
    }

    /// The address of element `off` of a buffer of `dtype` at `base`, as a value and an
    /// immediate byte offset.
    pub(super) fn address(&mut self, base: Value, off: Offset, dtype: DType) -> (Value, i32) {
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

    pub(super) fn load_at(&mut self, base: Value, off: Offset, dtype: DType) -> Value {
        let (addr, imm) = self.address(base, off, dtype);
        self.load_typed(dtype, cl_type(dtype), input_flags(), addr, imm)
    }
}
