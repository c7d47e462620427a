//! Lowering: one [`Kernel`] to one Cranelift function, a loop over a range of flat
//! domain positions: a vector loop first when every load is contiguous or fixed and
//! every op has a vector form (`vector`), then the scalar loop for the rest; a row
//! loop when loads broadcast along rows or per row (both in `elementwise`).
//! Kernels with reduce axes loop over rows instead (`rows`), over bands of columns
//! (`columns`), or run in split phases (`split`).
//!
//! The loops build on one layer of shared pieces, never on each other's files:
//! `function` (the state being written, addresses and loads), `convert` (half
//! types), `expr` (one instruction of the body), `cache` (the row cache), `sweep`
//! (row programs' schedule, accumulators and the counted loop), `random` (the random
//! op's hash, scalar and i32x4), `vector` (which
//! vector type a loop takes, and the vector loops themselves) and `layout` (how a
//! reduce kernel's work is cut: split phases, column bands). This file picks the loop.
//!
//! Values are typed as the kernel says: f32/f64 as F32/F64, i32/i64 as I32/I64, bool as
//! an I8 holding 0 or 1 (`supports` guarantees no instruction can produce anything
//! else, which keeps stores into `Vec<bool>` sound). f16/bf16 values are held as F32:
//! loads widen them, stores and casts to them round (`convert`), and everything in
//! between is f32 arithmetic. All index arithmetic is in i64.

use self::function::Lowering;
use self::layout::{ColumnBand, Phase, SplitLayout};
use cranelift_codegen::ir::{types, AbiParam, Function, Signature, UserFuncName};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Module};
use ndfuse_ir::Kernel;
use std::collections::BTreeMap;

mod cache;
mod columns;
mod convert;
mod elementwise;
mod expr;
mod function;
pub(crate) mod layout;
mod random;
mod rows;
mod split;
mod sweep;
mod vector;

/// The signature of every kernel: `(ptrs: *const *mut u8, start: i64, end: i64)`.
pub(crate) fn kernel_signature<M: Module>(module: &M) -> Signature {
    let mut sig = module.make_signature();
    sig.params
        .push(AbiParam::new(module.target_config().pointer_type()));
    sig.params.push(AbiParam::new(types::I64));
    sig.params.push(AbiParam::new(types::I64));
    sig
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
    wide: Option<crate::wide::Tier>,
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
        wide,
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

impl<M: Module> Lowering<'_, '_, M> {
    /// The function of `phase`: the plan's loop (bands of columns, rows, or split
    /// phases of rows for a kernel with reduce axes; positions for an element-wise one).
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
        self.elementwise_kernel(kernel, (ptrs, start, end))
    }
}
