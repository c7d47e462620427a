//! What this code generator can compile: every check that must pass before lowering,
//! including the ones memory safety rests on (loads inside their buffers, bool values
//! that can only ever be 0 or 1). Every dtype is compiled, f16 and bf16 included (held
//! in f32 registers, see `lower::convert`).

use ndfuse_ir::{Expr, Kernel, Level, Plan};

/// Why kernels with empty rows and loads that stay put along the row go to the
/// interpreter: such a load is a row value, but over an empty domain `Kernel::check`
/// cannot bound its view, and the reference reads nothing for it.
pub(crate) const EMPTY_ROW_LOAD_UNSUPPORTED: &str = "a row-level load in a kernel with empty rows (row_len 0) is not JIT-compiled: its view is not bounds-checked over an empty domain; the interpreter runs this kernel";

/// Why kernels with reduce axes that compute a random op go to the interpreter: the
/// row, column and split loops have no lowering of it yet (element-wise kernels and
/// matrix-product epilogues do).
pub(crate) const RANDOM_IN_ROW_PROGRAM_UNSUPPORTED: &str = "a random op or a position in a kernel with reduce axes is not JIT-compiled yet (only element-wise kernels and matmul epilogues are); the interpreter runs this kernel";

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
    // Every reduction plan has a lowering (`lower::rows`, `lower::split`), and one that
    // does not fit its plan's fast path falls back to row-by-row sweeps, so the plan
    // only has to agree with the presence of reduce axes.
    match (&kernel.plan, kernel.reduce_axes.is_empty()) {
        (Plan::Elementwise, true) => {}
        (Plan::Rows { .. } | Plan::Columns { .. } | Plan::Split { .. }, false) => {}
        (Plan::Elementwise, false) => {
            return Err(format!(
                "invalid kernel description: an element-wise plan with reduce axes {:?}",
                kernel.reduce_axes
            ))
        }
        (plan, true) => {
            return Err(format!(
                "invalid kernel description: plan {plan} without reduce axes"
            ))
        }
    }
    if !cfg!(target_pointer_width = "64") {
        return Err("the CPU code generator needs a 64-bit host (it indexes in i64)".to_string());
    }
    kernel
        .check()
        .map_err(|errs| format!("invalid kernel description: {}", errs.join("; ")))?;
    // A contraction kernel compiles as an ordinary element-wise kernel: its product is
    // just its last input, which the runtime fills with a GEMM before each block of the
    // body runs (runtime/src/gemm.rs) and always binds (one pointer per input). `check`
    // above bounded the operand views inside their buffers, made the product the last
    // input of `domain.numel()` elements and made the body read it only in place
    // (`Contraction::read_in_place`); the runtime relies on all three.
    if !kernel.reduce_axes.is_empty()
        && kernel
            .body
            .iter()
            .any(|ins| matches!(ins.expr, Expr::Random { .. } | Expr::Position { .. }))
    {
        return Err(RANDOM_IN_ROW_PROGRAM_UNSUPPORTED.to_string());
    }
    if !kernel.reduce_axes.is_empty() && kernel.row_len() == 0 && kernel.rows() > 0 {
        let levels = kernel.levels();
        let row_load = kernel
            .body
            .iter()
            .zip(&levels)
            .any(|(ins, &l)| matches!(ins.expr, Expr::Load { .. }) && l == Level::Row);
        if row_load {
            return Err(EMPTY_ROW_LOAD_UNSUPPORTED.to_string());
        }
    }
    Ok(())
}
