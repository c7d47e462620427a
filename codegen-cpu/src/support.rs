//! What this code generator can compile: every check that must pass before lowering,
//! including the ones memory safety rests on (loads inside their buffers, bool values
//! that can only ever be 0 or 1).

use ndfuse_ir::{Kernel, Plan};

/// Why half-precision kernels go to the interpreter for now.
pub(crate) const HALF_UNSUPPORTED: &str = "f16/bf16 kernels are not JIT-compiled yet (computed in f32 in a later issue); the interpreter runs them";

/// Why kernels with reductions go to the interpreter for now.
pub(crate) const REDUCE_UNSUPPORTED: &str =
    "reductions are not JIT-compiled yet (the CPU-backend issue); the interpreter runs this kernel";

/// Whether this code generator can compile `kernel`.
///
/// `Err(reason)` names the first thing it cannot do yet, or the first problem of a
/// malformed kernel description; the runtime then falls back to the interpreter.
///
/// [`Kernel::check`] verifies everything the generated code relies on for memory safety
/// (views inside their buffers, computed without overflow; well-typed instructions, so a
/// `bool` value can only ever be 0 or 1 when it is stored into a `Vec<bool>`; every
/// output stored once; an i64-indexable domain).
pub fn supports(kernel: &Kernel) -> Result<(), String> {
    let uses_half = kernel
        .inputs
        .iter()
        .chain(&kernel.outputs)
        .any(|b| b.dtype.is_half())
        || kernel.body.iter().any(|ins| ins.dtype.is_half());
    if uses_half {
        return Err(HALF_UNSUPPORTED.to_string());
    }
    match kernel.plan {
        Plan::Elementwise if kernel.reduce_axes.is_empty() => {}
        _ => return Err(REDUCE_UNSUPPORTED.to_string()),
    }
    if !cfg!(target_pointer_width = "64") {
        return Err("the CPU code generator needs a 64-bit host (it indexes in i64)".to_string());
    }
    kernel
        .check()
        .map_err(|errs| format!("invalid kernel description: {}", errs.join("; ")))
}
