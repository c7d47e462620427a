//! What this code generator can compile: every check that must pass before lowering,
//! including the ones memory safety rests on (loads inside their buffers, bool values
//! that can only ever be 0 or 1).

use ndfuse_ir::{BinaryOp, DType, Expr, Instr, Kernel, Plan, UnaryOp, View};

/// Why half-precision kernels go to the interpreter for now.
pub(crate) const HALF_UNSUPPORTED: &str = "f16/bf16 kernels are not JIT-compiled yet (computed in f32 in a later issue); the interpreter runs them";

/// Whether this code generator can compile `kernel`.
///
/// `Err(reason)` names the first thing it cannot do yet, or the first problem of a
/// malformed kernel description; the runtime then falls back to the interpreter.
///
/// Beyond [`Kernel::check`], this verifies what the generated code relies on for memory
/// safety: every view has one stride per axis and reads inside its buffer (computed
/// without overflow), and every instruction is well typed, so that a `bool` value can
/// only ever be 0 or 1 when it is stored into a `Vec<bool>`.
pub fn supports(kernel: &Kernel) -> Result<(), String> {
    let uses_half = kernel.inputs.iter().chain(&kernel.outputs).any(|b| b.dtype.is_half())
        || kernel.body.iter().any(|ins| ins.dtype.is_half());
    if uses_half {
        return Err(HALF_UNSUPPORTED.to_string());
    }
    match kernel.plan {
        Plan::Elementwise => {}
    }
    if !cfg!(target_pointer_width = "64") {
        return Err("the CPU code generator needs a 64-bit host (it indexes in i64)".to_string());
    }
    kernel
        .check()
        .map_err(|errs| format!("invalid kernel description: {}", errs.join("; ")))?;
    // Like the reference interpreter: an output never stored would be left as it was,
    // one stored twice would be ambiguous.
    for o in 0..kernel.outputs.len() {
        let n = kernel.stores.iter().filter(|s| s.output == o).count();
        if n != 1 {
            return Err(format!("invalid kernel description: out{o} is stored {n} times, not once"));
        }
    }
    if i64::try_from(kernel.domain.numel()).is_err() {
        return Err(format!("domain {} has more elements than i64 can index", kernel.domain));
    }
    for (i, ins) in kernel.body.iter().enumerate() {
        if let Expr::Load { input, view } = &ins.expr {
            let len = kernel.inputs[*input].len;
            check_view_inside(view, len).map_err(|why| format!("v{i} loads in{input}: {why}"))?;
        }
        check_types(kernel, i, ins)?;
    }
    Ok(())
}

/// The view's offsets, computed in i128 so that no stride can overflow the check.
fn check_view_inside(view: &View, len: usize) -> Result<(), String> {
    if view.strides.len() != view.shape.rank() {
        return Err(format!(
            "view {view} has {} strides for {} axes",
            view.strides.len(),
            view.shape.rank()
        ));
    }
    if view.shape.numel() == 0 {
        return Ok(());
    }
    let (mut lo, mut hi) = (view.offset as i128, view.offset as i128);
    for (&d, &s) in view.shape.dims().iter().zip(&view.strides) {
        let reach = (d as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    if lo < 0 || hi >= len as i128 {
        return Err(format!("view {view} reaches offsets {lo}..={hi} of a buffer of {len} elements"));
    }
    Ok(())
}

/// The typing rules of `ndfuse_ir::infer`, restated per instruction: operands are
/// defined before use (`Kernel::check`), so their dtypes are known here.
fn check_types(kernel: &Kernel, i: usize, ins: &Instr) -> Result<(), String> {
    let ty = |v: &ndfuse_ir::ValueId| kernel.body[v.index()].dtype;
    let d = ins.dtype;
    let (ok, what) = match &ins.expr {
        Expr::Load { .. } | Expr::Const(_) | Expr::Cast(_) => (true, String::new()),
        Expr::Unary(op, a) => {
            let a = ty(a);
            let ok = match op {
                UnaryOp::Not => a == DType::Bool && d == DType::Bool,
                _ if op.is_float_only() => a.is_float() && d == a,
                _ => a != DType::Bool && d == a,
            };
            (ok, format!("{} of {a}", op.name()))
        }
        Expr::Binary(op, a, b) => {
            let (a, b) = (ty(a), ty(b));
            let ok = a == b
                && if op.is_comparison() {
                    d == DType::Bool
                } else if op.is_logical() {
                    a == DType::Bool && d == DType::Bool
                } else if *op == BinaryOp::Div {
                    // Integer division is not an op of the IR (`/` is true division).
                    a.is_float() && d == a
                } else {
                    a != DType::Bool && d == a
                };
            (ok, format!("{} of {a} and {b}", op.name()))
        }
        Expr::Where(c, a, b) => {
            let (c, a, b) = (ty(c), ty(a), ty(b));
            (c == DType::Bool && a == b && d == a, format!("where of {c}, {a}, {b}"))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("invalid kernel description: v{i} = {what} cannot give {d}"))
    }
}
