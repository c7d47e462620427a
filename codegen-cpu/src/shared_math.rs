//! Out-of-line copies of the inline math (`vmath`, f32 and f64), for small kernels.
//!
//! Inline math makes a transcendental kernel's code several times larger (the function
//! appears in each unrolled vector step and in the scalar tail), and Cranelift's compile
//! time grows with it: a 10-op element-wise kernel with a `tanh` took about 2 ms to
//! compile inline against 0.6 ms without. On a small domain the kernel runs for
//! microseconds, so the compile dominates the first evaluation. Below
//! [`SHARED_MATH_BELOW`] elements a kernel therefore *calls* these functions instead:
//! each is compiled once per process, from the very same `vmath` builder, for a scalar
//! `f32` and for an `f32x4`, so the results are bit-identical to the inline code (and a
//! call covers four elements in the vector loop, never one call per element there).
//! Larger kernels keep the math inline, where it runs fastest.

use cranelift_codegen::ir::types;
use cranelift_codegen::ir::{AbiParam, InstBuilder, Type, UserFuncName};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use ndfuse_ir::{Kernel, UnaryOp};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Kernels over fewer elements than this (their domain) call the shared math.
pub(crate) const SHARED_MATH_BELOW: usize = 1 << 16;

/// Whether `kernel` calls the shared math rather than inlining it.
pub(crate) fn applies(kernel: &Kernel) -> bool {
    kernel.domain.numel() < SHARED_MATH_BELOW
}

/// A compiled shared function.
#[derive(Clone, Copy)]
struct Shared {
    name: &'static str,
    addr: usize,
    /// Cranelift instructions of its optimised body (for the bench's compute floor).
    ops: usize,
}

/// Compiled functions by (op, value type: `F32`, `F32X4`, `F64` or `F64X2`).
type Table = Mutex<HashMap<(UnaryOp, Type), Shared>>;

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// The symbol of the shared `op` on values of `ty` once [`symbols_for`] has compiled
/// it.
pub(crate) fn compiled_symbol(op: UnaryOp, ty: Type) -> Option<&'static str> {
    table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(op, ty))
        .map(|s| s.name)
}

/// The instruction count of the shared function named `name`, if it is one.
pub(crate) fn ops_of(name: &str) -> Option<usize> {
    table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .find(|s| s.name == name)
        .map(|s| s.ops)
}

/// The symbol of the shared `op` on values of `ty` (`ndfuse_vm_exp_f32x4`).
fn name(op: UnaryOp, ty: Type) -> String {
    format!("ndfuse_vm_{}_{ty}", op.name())
}

/// The symbols and addresses `kernel` needs (every op `vmath` inlines, scalar and
/// vector, in f32 or f64), compiling those not compiled yet.
pub(crate) fn symbols_for(kernel: &Kernel) -> Result<Vec<(&'static str, usize)>, String> {
    let mut ops: Vec<(UnaryOp, bool)> = kernel
        .body
        .iter()
        .filter_map(|ins| match ins.expr {
            ndfuse_ir::Expr::Unary(op, _) if crate::vmath::inline_for(op, ins.dtype) => {
                Some((op, ins.dtype.compute_dtype() == ndfuse_ir::DType::F64))
            }
            _ => None,
        })
        .collect();
    ops.sort_by_key(|&(op, wide)| (op.name(), wide));
    ops.dedup();
    let mut out = Vec::new();
    for (op, wide) in ops {
        let tys = if wide {
            [types::F64, types::F64X2]
        } else {
            [types::F32, types::F32X4]
        };
        for ty in tys {
            out.push(function(op, ty)?);
        }
    }
    Ok(out)
}

/// The shared `op` on values of `ty`, compiled on first use.
fn function(op: UnaryOp, ty: Type) -> Result<(&'static str, usize), String> {
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = t.get(&(op, ty)) {
        return Ok((hit.name, hit.addr));
    }
    let isa = crate::isa::host_isa()?;
    let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(ty));
    sig.returns.push(AbiParam::new(ty));
    // Leaked once per (op, type): the name must outlive every kernel that imports it.
    let sym: &'static str = Box::leak(name(op, ty).into_boxed_str());
    let id = module
        .declare_function(sym, Linkage::Export, &sig)
        .map_err(|e| e.to_string())?;
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    ctx.func.name = UserFuncName::testcase(sym);
    let mut fctx = FunctionBuilderContext::new();
    let config = module.target_config();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let x = b.block_params(entry)[0];
        let y = crate::vmath::unary(&mut b, op, x)
            .ok_or_else(|| format!("{} has no inline {ty} form", op.name()))?;
        b.ins().return_(&[y]);
        b.seal_all_blocks();
        b.finalize(config);
    }
    module
        .define_function(id, &mut ctx)
        .map_err(|e| e.to_string())?;
    let ops = ctx
        .func
        .layout
        .blocks()
        .map(|b| ctx.func.layout.block_insts(b).count())
        .sum();
    module.finalize_definitions().map_err(|e| e.to_string())?;
    let addr = module.get_finalized_function(id) as usize;
    // The code must stay mapped for the process: kernels call it by address.
    std::mem::forget(module);
    t.insert(
        (op, ty),
        Shared {
            name: sym,
            addr,
            ops,
        },
    );
    Ok((sym, addr))
}
