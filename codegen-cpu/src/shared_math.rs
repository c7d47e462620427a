//! Out-of-line copies of the inline math (`vmath`, f32 and f64), for small kernels.
//!
//! Inline math makes a transcendental kernel's code several times larger (the function
//! appears in each unrolled vector step and in the scalar tail), and Cranelift's compile
//! time grows with it: a 10-op element-wise kernel with a `tanh` took about 2 ms to
//! compile inline against 0.6 ms without. On a small domain the kernel runs for
//! microseconds, so the compile dominates the first evaluation. Below
//! [`SHARED_MATH_BELOW`] elements a kernel therefore *calls* these functions instead,
//! one for a scalar `f32` and one for an `f32x4` (so a call covers four elements in the
//! vector loop, never one call per element there), bit-identical to the inline code.
//! Larger kernels keep the math inline, where it runs fastest.
//!
//! Where the process has a wide tier (`wide::tier`: AVX2, FMA and F16C, and the inline
//! math fused), the f32 functions of the exp and log families are the precompiled
//! 128-bit instantiations of the wide algorithms (`wide::math::shared_fns`), which give
//! the inline code's bits with FMA: nothing is compiled at run time, and a kernel's
//! first compile no longer pays for JIT-compiling its math (which cost more than the
//! kernel). Everything else (f64, `rsqrt`, and every op where there is no wide tier:
//! `NDFUSE_CPU_WIDE=0`, `NDFUSE_CPU_FMA=0`, older hosts) is compiled once per process
//! from the very same `vmath` builder. The symbols are the same either way
//! (`ndfuse_vm_tanh_f32x4`), so a kernel's Cranelift text does not change.

use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::types;
use cranelift_codegen::ir::{AbiParam, Function, InstBuilder, Signature, Type, UserFuncName};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_codegen::Context;
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

/// A shared function, precompiled or JIT-compiled.
#[derive(Clone, Copy)]
struct Shared {
    name: &'static str,
    addr: usize,
    /// Cranelift instructions of its optimised body (for the bench's compute floor);
    /// for a precompiled function, counted when [`ops_of`] first asks.
    ops: Option<usize>,
}

/// Shared functions by (op, value type: `F32`, `F32X4`, `F64` or `F64X2`).
type Table = Mutex<HashMap<(UnaryOp, Type), Shared>>;

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// The symbol of the shared `op` on values of `ty` once [`symbols_for`] has made it
/// available.
pub(crate) fn compiled_symbol(op: UnaryOp, ty: Type) -> Option<&'static str> {
    table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(op, ty))
        .map(|s| s.name)
}

/// The instruction count of the shared function named `name`, if it is one: the
/// Cranelift function's, also for a precompiled one (built and compiled, not linked,
/// on the first question, then kept), so the compute floor does not depend on the path.
pub(crate) fn ops_of(name: &str) -> Option<usize> {
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    let (&(op, ty), shared) = t.iter_mut().find(|(_, s)| s.name == name)?;
    if shared.ops.is_none() {
        // Building it fails only where the host ISA cannot be built (then no kernel
        // compiles either): the count is then unknown, as for a name not shared.
        shared.ops = count_ops(op, ty).ok();
    }
    shared.ops
}

/// The symbol of the shared `op` on values of `ty` (`ndfuse_vm_exp_f32x4`).
fn name(op: UnaryOp, ty: Type) -> String {
    format!("ndfuse_vm_{}_{ty}", op.name())
}

/// The symbols and addresses `kernel` needs (every op `vmath` inlines, scalar and
/// vector, in f32 or f64), compiling those not available yet.
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

/// The shared `op` on values of `ty`: precompiled where there is such a function,
/// else compiled on first use.
fn function(op: UnaryOp, ty: Type) -> Result<(&'static str, usize), String> {
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = t.get(&(op, ty)) {
        return Ok((hit.name, hit.addr));
    }
    // Leaked once per (op, type): the name must outlive every kernel that imports it.
    let sym: &'static str = Box::leak(name(op, ty).into_boxed_str());
    let (addr, ops) = match precompiled(op, ty) {
        Some(addr) => (addr, None),
        None => {
            let (addr, ops) = jit(op, ty, sym)?;
            (addr, Some(ops))
        }
    };
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

/// The address of the precompiled shared `op` on `ty` (`F32`: `(f32) -> f32`, `F32X4`:
/// `(f32x4) -> f32x4`, both System V), where the process's kernels have a wide tier:
/// only there is the inline math fused and the host sure to run the function
/// (AVX2 and FMA), so only there are its bits the inline code's.
#[cfg(target_arch = "x86_64")]
fn precompiled(op: UnaryOp, ty: Type) -> Option<usize> {
    crate::wide::tier::tier()?;
    let (x4, x1) = crate::wide::math::shared_fns(op)?;
    match ty {
        types::F32 => Some(x1 as usize),
        types::F32X4 => Some(x4 as usize),
        _ => None,
    }
}

/// No precompiled shared math off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn precompiled(op: UnaryOp, ty: Type) -> Option<usize> {
    let _ = (op, ty);
    None
}

/// Writes the Cranelift function of the shared `op` on `ty` into `func` (signature
/// `sig`: one `ty` in, one out), for a target of `config`.
fn build(
    func: &mut Function,
    sig: Signature,
    config: TargetFrontendConfig,
    (op, ty): (UnaryOp, Type),
    sym: &str,
) -> Result<(), String> {
    func.signature = sig;
    func.name = UserFuncName::testcase(sym);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let x = b.block_params(entry)[0];
    let y = crate::vmath::unary(&mut b, op, x)
        .ok_or_else(|| format!("{} has no inline {ty} form", op.name()))?;
    b.ins().return_(&[y]);
    b.seal_all_blocks();
    b.finalize(config);
    Ok(())
}

/// Instructions of an optimised function (what the compute floor counts).
fn instructions(func: &Function) -> usize {
    func.layout
        .blocks()
        .map(|b| func.layout.block_insts(b).count())
        .sum()
}

/// The instruction count of the Cranelift shared `op` on `ty`, compiled for the host
/// as [`jit`] compiles it, but not linked or mapped.
fn count_ops(op: UnaryOp, ty: Type) -> Result<usize, String> {
    let isa = crate::isa::host_isa()?;
    let mut sig = Signature::new(isa.default_call_conv());
    sig.params.push(AbiParam::new(ty));
    sig.returns.push(AbiParam::new(ty));
    let mut ctx = Context::new();
    build(
        &mut ctx.func,
        sig,
        isa.frontend_config(),
        (op, ty),
        &name(op, ty),
    )?;
    ctx.compile(&*isa, &mut ControlPlane::default())
        .map_err(|e| format!("{:?}", e.inner))?;
    Ok(instructions(&ctx.func))
}

/// The Cranelift shared `op` on `ty`, JIT-compiled as `sym`: its address (mapped for
/// the rest of the process) and its instruction count.
fn jit(op: UnaryOp, ty: Type, sym: &str) -> Result<(usize, usize), String> {
    let isa = crate::isa::host_isa()?;
    let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(ty));
    sig.returns.push(AbiParam::new(ty));
    let id = module
        .declare_function(sym, Linkage::Export, &sig)
        .map_err(|e| e.to_string())?;
    let mut ctx = module.make_context();
    let config = module.target_config();
    build(&mut ctx.func, sig, config, (op, ty), sym)?;
    module
        .define_function(id, &mut ctx)
        .map_err(|e| e.to_string())?;
    let ops = instructions(&ctx.func);
    module.finalize_definitions().map_err(|e| e.to_string())?;
    let addr = module.get_finalized_function(id) as usize;
    // The code must stay mapped for the process: kernels call it by address.
    std::mem::forget(module);
    Ok((addr, ops))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::arch::x86_64::{__m128, _mm_loadu_ps, _mm_storeu_ps};

    #[allow(improper_ctypes_definitions)]
    type X4 = unsafe extern "C" fn(__m128) -> __m128;
    type X1 = unsafe extern "C" fn(f32) -> f32;

    /// Edge cases (zeros, infinities, NaNs, subnormals, extremes, the thresholds where
    /// the math changes method) among random bit patterns and random values of
    /// moderate size, so that registers mix lanes of every kind.
    fn inputs() -> Vec<f32> {
        let mut edges = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7FA0_0001), // a signalling NaN
            f32::from_bits(1),
            f32::from_bits(0x007F_FFFF),
            f32::MIN_POSITIVE,
            f32::MAX,
        ];
        for t in [
            88.722_83f32,
            87.0,
            87.336_55,
            103.278_93,
            103.972_08,
            104.0,
            89.0,
            88.376_26,
            17.328_68,
            20.0,
            2.980_232_2e-8,
            5.960_464_5e-8,
            9.0,
            9.010_913,
            9.1,
            0.549_306_1,
            1.0,
            4.0,
            0.346_573_6,
            std::f32::consts::FRAC_1_SQRT_2,
            std::f32::consts::SQRT_2,
            0.5,
            2.0,
        ] {
            for x in [
                t,
                f32::from_bits(t.to_bits() + 1),
                f32::from_bits(t.to_bits() - 1),
            ] {
                edges.extend([x, -x, x - 1.0, -x - 1.0]);
            }
        }
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
        };
        let mut v = Vec::new();
        for i in 0..(1 << 18) {
            let r = next();
            v.push(match i % 4 {
                // Any pattern: every sign and exponent, NaNs among them.
                0 => f32::from_bits(r),
                // |x| in [2^-8, 2^8): where every method of every op is used.
                1 | 2 => f32::from_bits((r & 0x807F_FFFF) | ((119 + (r >> 23) % 16) << 23)),
                _ => edges[r as usize % edges.len()],
            });
        }
        edges.extend(v);
        edges
    }

    /// Same bits, NaNs included (both paths run the same instructions on the same
    /// operands; were a compiler ever to commute one, a NaN payload could differ).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits()
    }

    /// The precompiled shared math gives the bits of the Cranelift functions it
    /// replaces (JIT-compiled here from the `vmath` builder, as the path without a
    /// wide tier compiles them), on vectors and scalars, and keeps their symbols and
    /// instruction counts.
    #[test]
    fn precompiled_functions_match_the_cranelift_ones() {
        if crate::wide::tier().is_none() {
            println!("skipped: no wide tier (NDFUSE_CPU_WIDE=0, unfused math, or host)");
            return;
        }
        let xs = inputs();
        for op in crate::wide::UNARY_OPS {
            let (x4, x1) = crate::wide::math::shared_fns(op).expect("a precompiled op");
            let (j4, ops4) = jit(op, types::F32X4, "reference_f32x4").expect("JIT");
            let (j1, ops1) = jit(op, types::F32, "reference_f32").expect("JIT");
            // SAFETY: `jit` returns the address of a finalised Cranelift function of
            // signature `(f32x4) -> f32x4` / `(f32) -> f32` with the host's default
            // (System V) calling convention, mapped for the rest of the process.
            let (j4, j1) = unsafe {
                (
                    std::mem::transmute::<usize, X4>(j4),
                    std::mem::transmute::<usize, X1>(j1),
                )
            };
            for chunk in xs.chunks_exact(4) {
                let (mut got, mut want) = ([0.0f32; 4], [0.0f32; 4]);
                // SAFETY: a wide tier exists, so the host has AVX2 and FMA (what the
                // precompiled functions need); `chunk`, `got` and `want` hold 4 f32.
                unsafe {
                    let x = _mm_loadu_ps(chunk.as_ptr());
                    _mm_storeu_ps(got.as_mut_ptr(), x4(x));
                    _mm_storeu_ps(want.as_mut_ptr(), j4(x));
                }
                for (lane, &x) in chunk.iter().enumerate() {
                    // SAFETY: as above.
                    let (g1, w1) = unsafe { (x1(x), j1(x)) };
                    assert!(
                        same(got[lane], want[lane]) && same(g1, w1),
                        "{} at x = {x:e} ({:#010x}): f32x4 lane {lane} {:e} against Cranelift's {:e}, f32 {g1:e} against {w1:e}",
                        op.name(),
                        x.to_bits(),
                        got[lane],
                        want[lane]
                    );
                }
            }
            // The process's shared math is the precompiled code, under the same names,
            // with the Cranelift functions' instruction counts.
            for (ty, addr, ops) in [
                (types::F32X4, x4 as usize, ops4),
                (types::F32, x1 as usize, ops1),
            ] {
                let (sym, got) = function(op, ty).expect("shared function");
                assert_eq!(sym, format!("ndfuse_vm_{}_{ty}", op.name()));
                assert_eq!(got, addr, "{sym} is the precompiled function");
                assert_eq!(ops_of(sym), Some(ops), "{sym}'s instruction count");
            }
        }
    }

    /// Ops and types without a precompiled function are JIT-compiled as before.
    #[test]
    fn other_ops_and_f64_are_compiled() {
        for (op, ty) in [
            (UnaryOp::Rsqrt, types::F32X4),
            (UnaryOp::Exp, types::F64X2),
            (UnaryOp::Tanh, types::F64),
        ] {
            assert_eq!(precompiled(op, ty), None);
            let (sym, _) = function(op, ty).expect("compiled");
            assert!(ops_of(sym).is_some_and(|n| n > 1), "{sym} has a body");
        }
        assert_eq!(ops_of("ndfuse_vm_nothing_f32"), None);
    }
}
