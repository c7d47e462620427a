//! `ndfuse explain`: what an expression compiles to, without evaluating it: the graph,
//! the schedule (which node went into which kernel, what is stored and why), every
//! kernel with its plan, the path it would take on the chosen backend and the bytes it
//! moves, and the generated Cranelift IR.

use ndfuse::{Context, DType, Tensor};
use std::fmt::Write as _;

/// An input as the user named it, for the header of the report.
pub struct InputInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// The explain report: the inputs as the user named them, then the library's
/// explanation. `inputs` are listed in the order the expression first uses them, which
/// is the order the graph numbers its inputs (`in0`, `in1`, ...).
pub fn explain(ctx: &Context, out: &Tensor, inputs: &[InputInfo]) -> Result<String, String> {
    let mut s = String::new();
    let _ = writeln!(s, "== inputs");
    for (i, inp) in inputs.iter().enumerate() {
        let dims: Vec<String> = inp.shape.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            s,
            "in{i} = {} : {}[{}]",
            inp.name,
            inp.dtype,
            dims.join(",")
        );
    }
    s.push('\n');
    s.push_str(&ctx.explain(&[out]).map_err(|e| e.reason())?);
    Ok(s)
}
