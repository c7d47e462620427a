//! Checking a kernel description: every invariant a codegen relies on, memory safety
//! included ([`Kernel::check`]), with the checks of gathers and contractions.

use crate::dtype::{DType, Scalar};
use crate::error::TensorType;
use crate::infer::infer;
use crate::kernel::{Buffer, Contraction, Expr, GatherAxis, Kernel, Level, Prologue};
use crate::op::Op;
use crate::shape::{Shape, View};

impl Kernel {
    /// Checks every invariant a codegen relies on, memory safety included, and returns
    /// every problem found:
    /// - each view has one stride per axis, the domain's shape, and reads only offsets
    ///   inside its buffer (computed in i128, so no stride can overflow the check);
    /// - instructions are in SSA order and typed as [`crate::infer()`] types the graph op
    ///   they come from (so a bool value can only ever be 0 or 1), loads and constants
    ///   have their buffer's / value's dtype;
    /// - every output is stored exactly once, with its dtype and the domain's size;
    /// - a random op reads one key for the whole kernel, an i64, at positions in
    ///   `0..2^63`;
    /// - the domain can be indexed with i64.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        let sorted = self.reduce_axes.windows(2).all(|w| w[0] < w[1]);
        if !sorted || self.reduce_axes.iter().any(|&a| a >= self.domain.rank()) {
            errs.push(format!(
                "reduce axes {:?} are not sorted axes of {}",
                self.reduce_axes, self.domain
            ));
            return Err(errs);
        }
        let levels = self.levels();
        if i64::try_from(self.domain.numel()).is_err() {
            errs.push(format!(
                "domain {} has more elements than i64 can index",
                self.domain
            ));
        }
        for (i, ins) in self.body.iter().enumerate() {
            let operands = Kernel::operands(&ins.expr);
            if let Some(v) = operands.iter().find(|v| v.index() >= i) {
                errs.push(format!("v{i} uses {v}, which is not defined before it"));
                continue;
            }
            match &ins.expr {
                Expr::Load { input, view } => match self.inputs.get(*input) {
                    None => errs.push(format!("v{i} loads missing input in{input}")),
                    Some(buf) => {
                        if buf.dtype != ins.dtype {
                            errs.push(format!(
                                "v{i} loads {} from in{input} of {}",
                                ins.dtype, buf.dtype
                            ));
                        }
                        if view.shape != self.domain || view.strides.len() != view.shape.rank() {
                            errs.push(format!(
                                "v{i} view {view} does not map the domain {}",
                                self.domain
                            ));
                        } else if let Some((lo, hi)) = view.span() {
                            if lo < 0 || hi >= buf.len as i128 {
                                errs.push(format!(
                                    "v{i} reads offsets {lo}..={hi} of in{input} ({} elements)",
                                    buf.len
                                ));
                            }
                        }
                    }
                },
                Expr::Random { key, view } => {
                    // One key for the whole kernel: a constant, or a load of one element.
                    let uniform = match &self.body[key.index()].expr {
                        Expr::Const(_) => true,
                        Expr::Load { view: kv, .. } => kv
                            .shape
                            .dims()
                            .iter()
                            .zip(&kv.strides)
                            .all(|(&d, &st)| d == 1 || st == 0),
                        _ => false,
                    };
                    if !uniform {
                        errs.push(format!(
                            "v{i} = random_uniform {key}: the key must be one value for the whole kernel (a constant or a load of one element)"
                        ));
                    }
                    if self.body[key.index()].dtype != DType::I64 || ins.dtype != DType::F32 {
                        errs.push(format!(
                            "v{i} = random_uniform {key}: takes an i64 key and gives f32, not {} -> {}",
                            self.body[key.index()].dtype,
                            ins.dtype
                        ));
                    }
                    self.check_positions(i, view, " of a random op", &mut errs);
                }
                Expr::Position { view } => {
                    if ins.dtype != DType::I64 {
                        errs.push(format!("v{i} = position gives i64, not {}", ins.dtype));
                    }
                    self.check_positions(i, view, "", &mut errs);
                }
                Expr::Gather { input, view, axes } => {
                    self.check_gather(i, ins.dtype, (*input, view, axes), &mut errs)
                }
                Expr::Const(c) => {
                    if c.cast(ins.dtype) != *c {
                        errs.push(format!("v{i} = const {c} is not a {} value", ins.dtype));
                    }
                }
                Expr::Reduce(acc, a) => {
                    let d = self.body[a.index()].dtype;
                    if self.reduce_axes.is_empty() || levels[a.index()] != Level::Element {
                        errs.push(format!(
                            "v{i} = reduce_{} {a}: needs an element value and reduce axes",
                            acc.name()
                        ));
                    } else if d != ins.dtype || d == DType::Bool {
                        errs.push(format!(
                            "v{i} = reduce_{} of {d} cannot give {}",
                            acc.name(),
                            ins.dtype
                        ));
                    }
                }
                Expr::ArgReduce(op, a) => {
                    if self.reduce_axes.len() != 1 || levels[a.index()] != Level::Element {
                        errs.push(format!(
                            "v{i} = {} {a}: needs an element value and exactly one reduce axis",
                            op.name()
                        ));
                    } else if ins.dtype != DType::I64 {
                        errs.push(format!("v{i} = {} gives i64, not {}", op.name(), ins.dtype));
                    }
                }
                expr => {
                    let op = match expr {
                        Expr::Unary(u, _) => Op::Unary(*u),
                        Expr::Binary(b, _, _) => Op::Binary(*b),
                        Expr::Where(..) => Op::Where,
                        Expr::Cast(_) => Op::Cast { to: ins.dtype },
                        Expr::Load { .. }
                        | Expr::Const(_)
                        | Expr::Reduce(..)
                        | Expr::ArgReduce(..)
                        | Expr::Random { .. }
                        | Expr::Position { .. }
                        | Expr::Gather { .. } => {
                            unreachable!("matched above")
                        }
                    };
                    let types: Vec<TensorType> = operands
                        .iter()
                        .map(|v| TensorType {
                            dtype: self.body[v.index()].dtype,
                            shape: Shape::scalar(),
                        })
                        .collect();
                    match infer(&op, &types) {
                        Err(e) => errs.push(format!("v{i}: {e}")),
                        Ok(t) if t.dtype != ins.dtype => errs.push(format!(
                            "v{i} is typed {} but {} gives {}",
                            ins.dtype,
                            op.name(),
                            t.dtype
                        )),
                        Ok(_) => {}
                    }
                }
            }
        }
        if let Some(c) = &self.contraction {
            self.check_contraction(c, &mut errs);
        }
        let mut stored = vec![0usize; self.outputs.len()];
        for s in &self.stores {
            match (self.body.get(s.value.index()), self.outputs.get(s.output)) {
                (Some(ins), Some(out)) => {
                    stored[s.output] += 1;
                    if ins.dtype != out.dtype {
                        errs.push(format!(
                            "out{} of {} stores {} {}",
                            s.output, out.dtype, ins.dtype, s.value
                        ));
                    }
                    // A store takes every position, or one per row for a row value.
                    let per_row = levels[s.value.index()] == Level::Row && out.len == self.rows();
                    if out.len != self.domain.numel() && !per_row {
                        errs.push(format!(
                            "out{} holds {} elements: {} needs {} (or one per row for a row value)",
                            s.output,
                            out.len,
                            s.value,
                            self.domain.numel()
                        ));
                    }
                }
                _ => errs.push(format!(
                    "store of {} into out{} is out of range",
                    s.value, s.output
                )),
            }
        }
        for (o, &n) in stored.iter().enumerate() {
            if n != 1 {
                errs.push(format!("out{o} is stored {n} times, not once"));
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }

    /// `view` maps the domain to positions in `0..2^63` (a random op's or a position's:
    /// `what` says whose in the message).
    fn check_positions(&self, i: usize, view: &View, what: &str, errs: &mut Vec<String>) {
        if view.shape != self.domain || view.strides.len() != view.shape.rank() {
            errs.push(format!(
                "v{i} view {view} does not map the domain {}",
                self.domain
            ));
        } else if let Some((lo, hi)) = view.span() {
            if lo < 0 || hi > i128::from(i64::MAX) {
                errs.push(format!(
                    "v{i} reaches positions {lo}..={hi}{what} (not in 0..2^63)"
                ));
            }
        }
    }

    /// [`Kernel::check`] for a gather: its input, dtype and view as for a load, every
    /// index an integer value (a load of an input when checked), and every offset the
    /// clamped indices can reach inside the buffer.
    fn check_gather(
        &self,
        i: usize,
        dtype: DType,
        (input, view, axes): (usize, &View, &[GatherAxis]),
        errs: &mut Vec<String>,
    ) {
        if !self.reduce_axes.is_empty() {
            errs.push(format!(
                "v{i}: gathers are read by element-wise kernels only"
            ));
        }
        let Some(buf) = self.inputs.get(input) else {
            errs.push(format!("v{i} gathers from missing input in{input}"));
            return;
        };
        if buf.dtype != dtype {
            errs.push(format!(
                "v{i} gathers {dtype} from in{input} of {}",
                buf.dtype
            ));
        }
        for a in axes {
            let idx = &self.body[a.index.index()];
            if !matches!(idx.dtype, DType::I32 | DType::I64) {
                errs.push(format!(
                    "v{i}: index {} is {}, not an integer",
                    a.index, idx.dtype
                ));
            }
            if a.extent == 0 {
                errs.push(format!(
                    "v{i}: an axis of extent 0 has no element to gather"
                ));
            }
            if a.checked.is_some() && !matches!(idx.expr, Expr::Load { .. }) {
                errs.push(format!(
                    "v{i}: a checked index must be a load of an input, not {}",
                    a.index
                ));
            }
        }
        if view.shape != self.domain || view.strides.len() != view.shape.rank() {
            errs.push(format!(
                "v{i} view {view} does not map the domain {}",
                self.domain
            ));
            return;
        }
        if let Some((lo, hi)) = view.span() {
            let (mut lo, mut hi) = (lo, hi);
            for a in axes {
                let far = (a.extent.max(1) as i128 - 1) * a.stride as i128;
                lo += far.min(0);
                hi += far.max(0);
            }
            if lo < 0 || hi >= buf.len as i128 {
                errs.push(format!(
                    "v{i} gathers offsets {lo}..={hi} of in{input} ({} elements)",
                    buf.len
                ));
            }
        }
    }

    /// The invariants of a contraction (see [`Contraction`]): operand views of the right
    /// shapes reading inside their buffers, the product as the last input, a plain
    /// element-wise body that reads the product only at its own position.
    fn check_contraction(&self, c: &Contraction, errs: &mut Vec<String>) {
        let d = self.domain.dims();
        let (l, r) = (c.lhs_view.shape.dims(), c.rhs_view.shape.dims());
        if d.len() < 2 || l.len() != d.len() || r.len() != d.len() {
            errs.push(format!(
                "contraction views {} and {} do not fit the domain {}",
                c.lhs_view, c.rhs_view, self.domain
            ));
            return;
        }
        let b = d.len() - 2;
        let ok = l[..b] == d[..b]
            && r[..b] == d[..b]
            && l[b] == d[b]
            && r[b + 1] == d[b + 1]
            && l[b + 1] == r[b];
        if !ok {
            errs.push(format!(
                "contraction views {} @ {} do not give the domain {}",
                c.lhs_view.shape, c.rhs_view.shape, self.domain
            ));
        }
        if !self.reduce_axes.is_empty() {
            errs.push("a contraction's body (its epilogue) cannot reduce".to_string());
        }
        if !c.read_in_place(&self.domain, &self.body) {
            errs.push(format!(
                "the body loads the product in{} through a view other than its own position",
                c.product
            ));
        }
        if c.block_rows == 0 {
            errs.push("a contraction's block has no rows".to_string());
        }
        for (what, input, steps) in [
            ("lhs", c.lhs, &c.lhs_prologue),
            ("rhs", c.rhs, &c.rhs_prologue),
        ] {
            if steps.is_empty() {
                continue;
            }
            let floats = [DType::F16, DType::BF16, DType::F32];
            let start = self.inputs.get(input).map(|b| b.dtype);
            let casts_ok = steps.iter().all(|s| match s {
                Prologue::Cast(to) => floats.contains(to),
                Prologue::Mul(k) | Prologue::Div(k) => matches!(k, Scalar::F(_)),
            });
            if c.dtype != DType::F32 || !start.is_some_and(|d| floats.contains(&d)) || !casts_ok {
                errs.push(format!(
                    "the {what} prologue of a product accumulating in {} from a {} operand: steps are float casts and scalings of f16, bf16 or f32 operands of f32 products",
                    c.dtype,
                    start.map_or("missing".to_string(), |d| d.to_string())
                ));
            }
        }
        if c.product + 1 != self.inputs.len() {
            errs.push(format!("the product in{} is not the last input", c.product));
        } else if self.inputs[c.product]
            != (Buffer {
                dtype: c.dtype,
                len: self.domain.numel(),
            })
        {
            errs.push(format!(
                "the product in{} is not {}[{}]",
                c.product,
                c.dtype,
                self.domain.numel()
            ));
        }
        for (what, input, view) in [("lhs", c.lhs, &c.lhs_view), ("rhs", c.rhs, &c.rhs_view)] {
            match self.inputs.get(input) {
                Some(buf) if input != c.product => {
                    if view.strides.len() != view.shape.rank() {
                        errs.push(format!(
                            "the {what} view {view} has the wrong number of strides"
                        ));
                    } else if let Some((lo, hi)) = view.span() {
                        if lo < 0 || hi >= buf.len as i128 {
                            errs.push(format!(
                                "the {what} view reads offsets {lo}..={hi} of in{input} ({} elements)",
                                buf.len
                            ));
                        }
                    }
                    let want = if buf.dtype.is_half() {
                        DType::F32
                    } else {
                        buf.dtype
                    };
                    if want != c.dtype {
                        errs.push(format!(
                            "the {what} operand in{input} of {} does not accumulate in {}",
                            buf.dtype, c.dtype
                        ));
                    }
                }
                _ => errs.push(format!("the {what} operand in{input} is not an input")),
            }
        }
    }
}
