//! The kernel description: the one contract between `passes` (which decide what is
//! fused and how it is parallelised) and the codegens (which only translate it).
//!
//! A [`Kernel`] is a fused group of graph nodes: the buffers it reads, the buffers it
//! writes, a per-element expression DAG in SSA form ([`Instr`]), and its parallel
//! [`Plan`]. Views are already folded into the loads as index maps, and shapes and
//! strides are constants, so a kernel is specialised to one set of shapes and a codegen
//! never re-derives fusion or layout.
//!
//! ```text
//! kernel k0_mul_add_exp  domain=[4,8]  plan=elementwise
//!   in0: f32[32]
//!   in1: f32[8]
//!   v0 = load in0 [4,8] strides=(8,1) offset=0 : f32
//!   v1 = load in1 [4,8] strides=(0,1) offset=0 : f32
//!   v2 = mul v0, v1 : f32
//!   ...
//!   out0 = v4 : f32[4,8]
//! ```

use crate::dtype::{DType, Scalar};
use crate::error::TensorType;
use crate::infer::infer;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::shape::{Shape, View};
use std::fmt;

/// An SSA value of a kernel body: the result of instruction number `.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// Position of the defining instruction in [`Kernel::body`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// What one instruction of a kernel body computes, per element of the domain.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Element `view.offset_of(index)` of input buffer `input`, where `index` is the
    /// current position in the kernel's domain (`view.shape == domain`).
    Load {
        /// Index into [`Kernel::inputs`].
        input: usize,
        /// Index map from the domain into that buffer.
        view: View,
    },
    /// A constant, already of the instruction's dtype.
    Const(Scalar),
    /// Unary op on an earlier value.
    Unary(UnaryOp, ValueId),
    /// Binary op on earlier values of one dtype (comparisons produce bool).
    Binary(BinaryOp, ValueId, ValueId),
    /// `cond ? a : b`.
    Where(ValueId, ValueId, ValueId),
    /// Conversion of an earlier value to the instruction's dtype.
    Cast(ValueId),
}

/// One SSA instruction: an expression and the dtype of its result.
///
/// For `f16`/`bf16` the dtype records the graph's storage type; backends compute half
/// values in f32 and round only at stores (so a fused kernel may be *more* accurate than
/// the node-by-node reference, which rounds after every node).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instr {
    /// Result dtype.
    pub dtype: DType,
    /// What is computed.
    pub expr: Expr,
}

/// A buffer a kernel reads or writes: contiguous, `len` elements of `dtype`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    /// Element type.
    pub dtype: DType,
    /// Number of elements the buffer must hold.
    pub len: usize,
}

/// An output of a kernel: value `value` stored, row-major over the domain, into output
/// buffer number `index` of [`Kernel::outputs`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// The stored value.
    pub value: ValueId,
    /// Index into [`Kernel::outputs`].
    pub output: usize,
}

/// How a kernel's work is split across threads or GPU blocks. Chosen by the passes from
/// shapes and a target description; never from the thread count, so results do not
/// depend on it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Plan {
    /// One flat index space over the domain: each worker takes a contiguous range of
    /// row-major positions. The plan of every element-wise kernel.
    Elementwise,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Elementwise => f.write_str("elementwise"),
        }
    }
}

/// A fused kernel, ready for a codegen. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// Stable, readable name: `k{n}_{ops}` (`k0_mul_add_exp`).
    pub name: String,
    /// The iteration space; every load's view and every output has this shape.
    pub domain: Shape,
    /// Buffers read.
    pub inputs: Vec<Buffer>,
    /// Buffers written, each `domain.numel()` elements.
    pub outputs: Vec<Buffer>,
    /// Instructions in SSA order: an operand always refers to an earlier instruction.
    pub body: Vec<Instr>,
    /// Which values are stored where.
    pub stores: Vec<Store>,
    /// The parallel plan.
    pub plan: Plan,
    /// Why the plan was chosen, for dumps.
    pub plan_reason: String,
}

impl Kernel {
    /// Bytes of the buffers it reads: what it must move in, at the least.
    pub fn bytes_in(&self) -> usize {
        self.inputs
            .iter()
            .map(|b| b.len * b.dtype.size_bytes())
            .sum()
    }

    /// Bytes of the buffers it writes.
    pub fn bytes_out(&self) -> usize {
        self.outputs
            .iter()
            .map(|b| b.len * b.dtype.size_bytes())
            .sum()
    }

    /// The operands of an instruction, in order.
    pub fn operands(expr: &Expr) -> Vec<ValueId> {
        match expr {
            Expr::Load { .. } | Expr::Const(_) => Vec::new(),
            Expr::Unary(_, a) | Expr::Cast(a) => vec![*a],
            Expr::Binary(_, a, b) => vec![*a, *b],
            Expr::Where(c, a, b) => vec![*c, *a, *b],
        }
    }

    /// Checks every invariant a codegen relies on, memory safety included, and returns
    /// every problem found:
    /// - each view has one stride per axis, the domain's shape, and reads only offsets
    ///   inside its buffer (computed in i128, so no stride can overflow the check);
    /// - instructions are in SSA order and typed as [`crate::infer()`] types the graph op
    ///   they come from (so a bool value can only ever be 0 or 1), loads and constants
    ///   have their buffer's / value's dtype;
    /// - every output is stored exactly once, with its dtype and the domain's size;
    /// - the domain can be indexed with i64.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
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
                Expr::Const(c) => {
                    if c.cast(ins.dtype) != *c {
                        errs.push(format!("v{i} = const {c} is not a {} value", ins.dtype));
                    }
                }
                expr => {
                    let op = match expr {
                        Expr::Unary(u, _) => Op::Unary(*u),
                        Expr::Binary(b, _, _) => Op::Binary(*b),
                        Expr::Where(..) => Op::Where,
                        Expr::Cast(_) => Op::Cast { to: ins.dtype },
                        Expr::Load { .. } | Expr::Const(_) => unreachable!("matched above"),
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
                    if out.len != self.domain.numel() {
                        errs.push(format!(
                            "out{} holds {} elements, domain has {}",
                            s.output,
                            out.len,
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
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel {}  domain={}  plan={}  ; {}",
            self.name, self.domain, self.plan, self.plan_reason
        )?;
        for (i, b) in self.inputs.iter().enumerate() {
            writeln!(f, "  in{i}: {}[{}]", b.dtype, b.len)?;
        }
        for (i, ins) in self.body.iter().enumerate() {
            write!(f, "  v{i} = ")?;
            match &ins.expr {
                Expr::Load { input, view } => write!(f, "load in{input} {view}")?,
                Expr::Const(c) => write!(f, "const {c}")?,
                Expr::Unary(u, a) => write!(f, "{} {a}", u.name())?,
                Expr::Binary(b, x, y) => write!(f, "{} {x}, {y}", b.name())?,
                Expr::Where(c, a, b) => write!(f, "where {c}, {a}, {b}")?,
                Expr::Cast(a) => write!(f, "cast {a}")?,
            }
            writeln!(f, " : {}", ins.dtype)?;
        }
        for s in &self.stores {
            let out = &self.outputs[s.output];
            writeln!(
                f,
                "  out{} = {} : {}{}",
                s.output, s.value, out.dtype, self.domain
            )?;
        }
        Ok(())
    }
}
