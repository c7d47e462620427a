//! The kernel description: the one contract between `passes` (which decide what is
//! fused and how it is parallelised) and the codegens (which only translate it).
//!
//! A [`Kernel`] is a fused group of graph nodes: the buffers it reads, the buffers it
//! writes, a per-element expression DAG in SSA form ([`Instr`]), and its parallel
//! [`Plan`]. Views are already folded into the loads as index maps, and shapes and
//! strides are constants, so a kernel is specialised to one set of shapes and a codegen
//! never re-derives fusion or layout.
//!
//! ## Reductions: the row program
//!
//! A kernel may reduce some axes of its domain ([`Kernel::reduce_axes`]). A *row* (ND4J's
//! TAD, tensor along dimension) is the set of domain positions that share one index on
//! the kept axes. Every value then has a [`Level`]:
//! - **element** values vary along the row (loads that move along a reduced axis, and
//!   what is computed from them);
//! - **row** values are one per row: [`Expr::Reduce`] and [`Expr::ArgReduce`] results,
//!   constants, loads that stay put along every reduced axis, and what is computed from
//!   those alone.
//!
//! A row value used by an element op is broadcast along the row. Instructions are in
//! dependency order, so softmax is `m = reduce max x; e = exp(x - m); s = reduce sum e;
//! out = e / s`: one kernel; how many sweeps over a row that takes, and whether the row
//! stays in cache or registers between them, is the codegen's choice guided by the plan.
//! A store writes either `domain.numel()` elements in row-major order (a row value is
//! broadcast along its row), or, for a row value only, one element per row in row-major
//! order of the kept axes: the output buffer's length says which.
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
use crate::infer::reduced_shape;
use crate::op::{BinaryOp, UnaryOp};
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
    /// Combines an element value over each row into a row value (see the module docs).
    /// The instruction's dtype is the value's; half types accumulate in f32.
    Reduce(Accumulate, ValueId),
    /// The position along the one reduced axis of the first maximum / minimum of an
    /// element value (the first NaN if there is one), as an i64 row value.
    ArgReduce(crate::op::ArgReduceOp, ValueId),
    /// [`Op::RandomUniform`](crate::Op::RandomUniform)'s value (an f32 in `[0, 1)`, see
    /// [`crate::op::random_uniform`]) for key `key` (an earlier i64 value, in practice a
    /// load of the key's 0-d buffer or a constant) at the random op's own row-major
    /// position `view.offset_of(index)`: `view` maps the domain into the op's output
    /// as a load's view maps it into a buffer (contiguous over the op's shape, then the
    /// views a consumer reads it through), so a transposed or broadcast read gets the
    /// values of the op's own positions.
    Random {
        /// The i64 key.
        key: ValueId,
        /// Index map from the domain into the random op's row-major positions.
        view: View,
    },
    /// The i64 position `view.offset_of(index)`: [`Op::Iota`](crate::Op::Iota)'s index (its row-major
    /// position, through the views a consumer reads it by), or a coordinate of the
    /// domain (a view of stride 1 along one axis, 0 along the others).
    Position {
        /// Index map from the domain into positions.
        view: View,
    },
    /// A load at a computed offset (gather, and the reads of pad and concat): element
    /// `view.offset_of(index) + sum over j of k_j * axes[j].stride` of input `input`,
    /// where `k_j` is the value of `axes[j].index` plus `extent` when negative, clamped
    /// to `0..extent`. The clamp makes every read land inside the buffer whatever the
    /// index (a pad's or concat's unselected branch reads a neighbour); a user's index
    /// is checked against `-extent..extent` before the kernel runs
    /// ([`GatherAxis::checked`]). Element-wise kernels only.
    Gather {
        /// Index into [`Kernel::inputs`].
        input: usize,
        /// Index map of the positions' fixed part: stride 0 along the axes indexed.
        view: View,
        /// The axes read at computed positions.
        axes: Vec<GatherAxis>,
    },
}

impl Expr {
    /// The same expression with every operand `v` replaced by `f(v)` (for passes and
    /// tests that rewrite a body).
    pub fn map_operands(&self, f: impl Fn(ValueId) -> ValueId) -> Expr {
        match self {
            Expr::Load { .. } | Expr::Const(_) | Expr::Position { .. } => self.clone(),
            Expr::Unary(u, a) => Expr::Unary(*u, f(*a)),
            Expr::Binary(b, x, y) => Expr::Binary(*b, f(*x), f(*y)),
            Expr::Where(c, x, y) => Expr::Where(f(*c), f(*x), f(*y)),
            Expr::Cast(a) => Expr::Cast(f(*a)),
            Expr::Reduce(acc, a) => Expr::Reduce(*acc, f(*a)),
            Expr::ArgReduce(op, a) => Expr::ArgReduce(*op, f(*a)),
            Expr::Random { key, view } => Expr::Random {
                key: f(*key),
                view: view.clone(),
            },
            Expr::Gather { input, view, axes } => Expr::Gather {
                input: *input,
                view: view.clone(),
                axes: axes
                    .iter()
                    .map(|a| GatherAxis {
                        index: f(a.index),
                        ..a.clone()
                    })
                    .collect(),
            },
        }
    }
}

/// One axis of an [`Expr::Gather`] read at a computed position.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GatherAxis {
    /// The i32 or i64 value giving the position along the axis.
    pub index: ValueId,
    /// The axis's stride in the buffer, in elements.
    pub stride: isize,
    /// The axis's extent (1 at least).
    pub extent: usize,
    /// `Some(axis)` when `index` is a user's index (a load of an index buffer), which
    /// the runtime checks against `-extent..extent` before the kernel runs and reports
    /// as an error naming the gather's `axis`; `None` for positions the kernel computed
    /// in range itself (pad, concat).
    pub checked: Option<usize>,
}

/// A user's index a kernel reads through ([`GatherAxis::checked`]): the runtime checks
/// every element of input `input` that `view` reaches against `-extent..extent` before
/// the kernel runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexCheck {
    /// The input holding the indices.
    pub input: usize,
    /// How the kernel reads them.
    pub view: View,
    /// The extent of the axis indexed.
    pub extent: usize,
    /// The gather's axis, for the message.
    pub axis: usize,
}

/// The primitive combining operations of [`Expr::Reduce`]. Mean, norms, variance and
/// standard deviation are built from these and element-wise ops by the passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Accumulate {
    /// Sum; 0 over an empty row.
    Sum,
    /// Product; 1 over an empty row.
    Prod,
    /// NaN-propagating maximum.
    Max,
    /// NaN-propagating minimum.
    Min,
}

impl Accumulate {
    /// The name used in dumps and kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            Accumulate::Sum => "sum",
            Accumulate::Prod => "prod",
            Accumulate::Max => "max",
            Accumulate::Min => "min",
        }
    }
}

/// Whether a kernel value varies along the reduced axes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// One value per domain position.
    Element,
    /// One value per row.
    Row,
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
    /// row-major positions. The plan of every kernel without reductions.
    Elementwise,
    /// TAD-level: each worker takes whole rows, `rows` of them of `row_len` elements;
    /// `contiguous` when the reduced axes are the innermost ones (a row is one run of
    /// memory for a contiguous input).
    Rows {
        /// Number of rows (kept positions).
        rows: usize,
        /// Elements per row.
        row_len: usize,
        /// Whether the reduced axes are the trailing axes of the domain.
        contiguous: bool,
    },
    /// Column strategy: the reduced axes lead and the kept ones trail, so a worker sweeps
    /// down the reduced axes accumulating a contiguous band of kept positions at once
    /// (vectorised across the kept axis).
    Columns {
        /// Number of kept positions (the width of the band swept).
        cols: usize,
        /// Elements reduced into each.
        col_len: usize,
    },
    /// Two-stage reduction for few long rows: each row is cut into `splits` equal chunks
    /// reduced independently, then the partials are combined in chunk order. `splits`
    /// depends on shapes only, so results are identical whatever the thread count.
    Split {
        /// Number of rows.
        rows: usize,
        /// Elements per row.
        row_len: usize,
        /// Chunks per row.
        splits: usize,
    },
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Elementwise => f.write_str("elementwise"),
            Plan::Rows {
                rows,
                row_len,
                contiguous,
            } => write!(
                f,
                "rows({rows} x {row_len}{})",
                if *contiguous { "" } else { ", strided" }
            ),
            Plan::Columns { cols, col_len } => write!(f, "columns({cols} x {col_len})"),
            Plan::Split {
                rows,
                row_len,
                splits,
            } => write!(f, "split({rows} x {row_len} in {splits} chunks)"),
        }
    }
}

/// A matrix product that feeds a kernel's body: a GEMM whose element-wise epilogue is
/// the body. For each position `[b..., m, n]` of the kernel's domain (`[batch..., M,
/// N]`), `product[b..., m, n] = sum over k of lhs[b..., m, k] * rhs[b..., k, n]`,
/// accumulated in [`Contraction::dtype`] and written row-major into input buffer
/// [`Contraction::product`], which the body then loads like any input. A backend fills
/// the product in whole blocks of `block_rows` rows of M (the CPU fills a unit of
/// several blocks per GEMM call) and runs the body over them while they are still in
/// cache. `block_rows` depends on shapes only, so results do not depend on the thread
/// count.
///
/// The product buffer is always the kernel's last input and has no graph node: callers
/// bind every input but that one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Contraction {
    /// Input holding the left operand.
    pub lhs: usize,
    /// Index map of the left operand: shape `[batch..., M, K]` (broadcast batch axes
    /// have stride 0; a transpose is just its strides).
    pub lhs_view: View,
    /// Input holding the right operand.
    pub rhs: usize,
    /// Index map of the right operand: shape `[batch..., K, N]`.
    pub rhs_view: View,
    /// The input the product fills: the last one, `domain.numel()` elements of `dtype`.
    pub product: usize,
    /// The dtype operands are read as and the product accumulates in: f32 for f16, bf16
    /// and f32 operands, else the operands' own (f64, i32, i64; integers wrap).
    pub dtype: DType,
    /// Rows of M filled before the epilogue runs over them.
    pub block_rows: usize,
    /// Element-wise steps applied to each left operand element as it is read, in order
    /// (see [`Prologue`]); empty for most products.
    pub lhs_prologue: Vec<Prologue>,
    /// The same for the right operand.
    pub rhs_prologue: Vec<Prologue>,
}

/// One element-wise step a contraction applies to an operand element as it reads it:
/// what the graph computed on the operand before the product (`(q * 0.125) @ k`,
/// `cast(x, f16) @ w`), folded into the read so that no kernel writes it to memory
/// first. Each step gives the bits the graph's own op gives: its result is rounded to
/// its dtype, the value's dtype after the step before it (the operand buffer's at the
/// start). Only products accumulating in f32 (f32, f16, bf16 operands) take steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prologue {
    /// A cast to a float type (f16, bf16 or f32): a rounding, or a widening.
    Cast(DType),
    /// Multiplied by a constant (already a value of the step's dtype).
    Mul(Scalar),
    /// Divided by a constant (already a value of the step's dtype).
    Div(Scalar),
}

impl Prologue {
    /// `v` (a value of `dtype`) after the step, and the dtype of the result, in the
    /// reference's arithmetic: f64, rounded once to the result dtype (which gives the
    /// bits of the f32 arithmetic the backends use: a product or quotient of two
    /// values of f32 or narrower, rounded to f16 or bf16 through f32 first, rounds
    /// the same, since f32 has at least 2p + 2 bits for those types).
    pub fn apply(self, v: f64, dtype: DType) -> (f64, DType) {
        match self {
            Prologue::Cast(to) => (crate::round::round_f64(v, to), to),
            Prologue::Mul(c) => (crate::round::round_f64(v * c.to_f64(), dtype), dtype),
            Prologue::Div(c) => (crate::round::round_f64(v / c.to_f64(), dtype), dtype),
        }
    }

    /// The dtype of the value after the steps `steps`, from one of `dtype`.
    pub fn result_dtype(steps: &[Prologue], dtype: DType) -> DType {
        steps.iter().fold(dtype, |d, s| match s {
            Prologue::Cast(to) => *to,
            _ => d,
        })
    }

    /// The step as the kernel text prints it (`cast f16`, `mul 0.125`).
    pub fn text(self, dtype: DType) -> String {
        match self {
            Prologue::Cast(to) => format!("cast {to}"),
            Prologue::Mul(c) => format!("mul {}", crate::print::const_text(c, dtype)),
            Prologue::Div(c) => format!("div {}", crate::print::const_text(c, dtype)),
        }
    }
}

/// Whether `view` reads one element wherever it is (every stride 0).
fn is_fixed(view: &View) -> bool {
    view.strides.iter().all(|&s| s == 0)
}

/// Whether `body` (over `domain`) loads input `input` only at each position's own
/// offset: every load of it is the contiguous view of `domain`.
fn loads_in_place(domain: &Shape, body: &[Instr], input: usize) -> bool {
    let identity = View::contiguous(domain.clone());
    body.iter().all(|ins| match &ins.expr {
        Expr::Load { input: i, view } if *i == input => *view == identity,
        _ => true,
    })
}

impl Contraction {
    /// Whether `body` reads the product only at its own position (every load of input
    /// `product` is the contiguous view of `domain`): what lets a backend fill the
    /// product block by block and run the body on each block, or keep it in registers.
    pub fn read_in_place(&self, domain: &Shape, body: &[Instr]) -> bool {
        loads_in_place(domain, body, self.product)
    }

    /// The extents `(batch, m, n, k)`: batch positions, then the matrix sizes.
    pub fn extents(&self) -> (usize, usize, usize, usize) {
        let l = self.lhs_view.shape.dims();
        let r = self.rhs_view.shape.dims();
        let (m, k) = (l[l.len() - 2], l[l.len() - 1]);
        let n = r[r.len() - 1];
        (l[..l.len() - 2].iter().product(), m, n, k)
    }

    /// Multiply-adds it performs.
    pub fn flops(&self) -> usize {
        let (b, m, n, k) = self.extents();
        2 * b * m * n * k
    }
}

/// A fused kernel, ready for a codegen. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// Stable, readable name: `k{n}_{ops}` (`k0_mul_add_exp`).
    pub name: String,
    /// The iteration space; every load's view has this shape.
    pub domain: Shape,
    /// Axes of `domain` reduced inside the kernel, sorted; empty for a kernel without
    /// reductions (see the module docs).
    pub reduce_axes: Vec<usize>,
    /// Buffers read.
    pub inputs: Vec<Buffer>,
    /// Buffers written: `domain.numel()` elements, or one per row for a row value (see
    /// the module docs).
    pub outputs: Vec<Buffer>,
    /// Instructions in SSA order: an operand always refers to an earlier instruction.
    pub body: Vec<Instr>,
    /// Which values are stored where.
    pub stores: Vec<Store>,
    /// The parallel plan.
    pub plan: Plan,
    /// Why the plan was chosen, for dumps.
    pub plan_reason: String,
    /// The matrix product whose epilogue the body is, if any (see [`Contraction`]).
    pub contraction: Option<Contraction>,
}

impl Kernel {
    /// Bytes it must read at the least: for each input, the elements its loads reach
    /// (a view's extent without its broadcast axes; the largest view of that input),
    /// never more than the buffer. A slice of a large buffer counts only the slice.
    pub fn bytes_in(&self) -> usize {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let extent = |view: &View| {
                    view.shape
                        .dims()
                        .iter()
                        .zip(&view.strides)
                        .filter(|&(_, &st)| st != 0)
                        .map(|(&d, _)| d)
                        .product::<usize>()
                };
                // A contraction's operands are read through its views; its product is
                // scratch filled and read block by block in cache, not memory traffic.
                let (operand, product) = match &self.contraction {
                    Some(c) if c.product == i => (None, true),
                    Some(c) if c.lhs == i => (Some(extent(&c.lhs_view)), false),
                    Some(c) if c.rhs == i => (Some(extent(&c.rhs_view)), false),
                    _ => (None, false),
                };
                if product {
                    return 0;
                }
                let reached = self
                    .body
                    .iter()
                    .filter_map(|ins| match &ins.expr {
                        Expr::Load { input, view } if *input == i => Some(extent(view)),
                        _ => None,
                    })
                    .chain(operand)
                    .max()
                    .unwrap_or(0);
                reached.min(b.len) * b.dtype.size_bytes()
            })
            .sum()
    }

    /// Bytes of the buffers it writes.
    pub fn bytes_out(&self) -> usize {
        self.outputs
            .iter()
            .map(|b| b.len * b.dtype.size_bytes())
            .sum()
    }

    /// Number of rows: positions of the kept axes (the domain's size without reductions).
    pub fn rows(&self) -> usize {
        reduced_shape(&self.domain, &self.reduce_axes, false).numel()
    }

    /// Elements per row: the product of the reduced axes (1 without reductions).
    pub fn row_len(&self) -> usize {
        self.reduce_axes
            .iter()
            .map(|&a| self.domain.dims()[a])
            .product()
    }

    /// The level of every instruction (see the module docs). Without reduce axes every
    /// load is an element value.
    pub fn levels(&self) -> Vec<Level> {
        let mut lv: Vec<Level> = Vec::with_capacity(self.body.len());
        for ins in &self.body {
            let l = match &ins.expr {
                Expr::Const(_) | Expr::Reduce(..) | Expr::ArgReduce(..) => Level::Row,
                Expr::Load { view, .. }
                | Expr::Random { view, .. }
                | Expr::Position { view }
                | Expr::Gather { view, .. } => {
                    let still = !self.reduce_axes.is_empty()
                        && self.reduce_axes.iter().all(|&a| {
                            view.shape.dims().get(a) == Some(&1) || view.strides.get(a) == Some(&0)
                        })
                        && Kernel::operands(&ins.expr)
                            .iter()
                            .all(|v| lv.get(v.index()) == Some(&Level::Row));
                    if still {
                        Level::Row
                    } else {
                        Level::Element
                    }
                }
                e => {
                    let any_elem = Kernel::operands(e)
                        .iter()
                        .any(|v| lv.get(v.index()) == Some(&Level::Element));
                    if any_elem {
                        Level::Element
                    } else {
                        Level::Row
                    }
                }
            };
            lv.push(l);
        }
        lv
    }

    /// The sweep structure of the row program (see the module docs), decided from the
    /// body alone: per instruction its *stage*, 0 when it needs no reduction result, else
    /// one more than the sweep of the latest reduction it depends on (a reduction runs in
    /// sweep `stage - 1`; other row values can be computed just before sweep `stage`, or
    /// after the last one); and the number of reduction sweeps. Every reduction goes into
    /// the earliest sweep its operand allows, so sibling reductions share a sweep.
    ///
    /// Softmax (`m = max x; e = exp(x - m); s = sum e; out = e / s`) has two sweeps: `m`
    /// is in sweep 0, `s` in sweep 1, and `out` is of stage 2.
    pub fn stages(&self) -> (Vec<usize>, usize) {
        let mut stage = vec![0usize; self.body.len()];
        let mut sweeps = 0;
        for (i, ins) in self.body.iter().enumerate() {
            let deps = Kernel::operands(&ins.expr)
                .iter()
                .map(|v| stage[v.index()])
                .max()
                .unwrap_or(0);
            stage[i] = match ins.expr {
                Expr::Reduce(..) | Expr::ArgReduce(..) => {
                    sweeps = sweeps.max(deps + 1);
                    deps + 1
                }
                _ => deps,
            };
        }
        (stage, sweeps)
    }

    /// The operands of an instruction, in order.
    pub fn operands(expr: &Expr) -> Vec<ValueId> {
        match expr {
            Expr::Load { .. } | Expr::Const(_) | Expr::Position { .. } => Vec::new(),
            Expr::Gather { axes, .. } => axes.iter().map(|a| a.index).collect(),
            Expr::Unary(_, a)
            | Expr::Cast(a)
            | Expr::Reduce(_, a)
            | Expr::ArgReduce(_, a)
            | Expr::Random { key: a, .. } => vec![*a],
            Expr::Binary(_, a, b) => vec![*a, *b],
            Expr::Where(c, a, b) => vec![*c, *a, *b],
        }
    }

    /// The user indices the runtime must check before the kernel runs (see
    /// [`GatherAxis::checked`]); `Kernel::check` makes each a load of an input.
    pub fn index_checks(&self) -> Vec<IndexCheck> {
        let mut out: Vec<IndexCheck> = Vec::new();
        for ins in &self.body {
            let Expr::Gather { axes, .. } = &ins.expr else {
                continue;
            };
            for a in axes {
                let (Some(axis), Expr::Load { input, view }) =
                    (a.checked, &self.body[a.index.index()].expr)
                else {
                    continue;
                };
                let c = IndexCheck {
                    input: *input,
                    view: view.clone(),
                    extent: a.extent,
                    axis,
                };
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// The kernel's shape family: the kernel with its leading extent (a batch, a
    /// sequence length) erased, from the domain, every view over the domain, the
    /// product's operands (and their summed extent K, which only the GEMM call reads)
    /// and the plan, with the buffers' lengths erased too (an output's as "one per
    /// position" or "one per row") and no plan reason. An element-wise kernel that
    /// loads only contiguous buffers and single elements has every extent erased: it
    /// is a flat loop whatever its shape. Kernels of one family usually lower to the
    /// same code, which takes the extent as the `start..end` of its calls: a backend
    /// may look for a compiled member's code under this key and run it, after checking
    /// that the code is the same. `None` for a kernel without a kept leading axis to
    /// erase (a rank-0 domain, or one that reduces axis 0).
    pub fn family_key(&self) -> Option<Kernel> {
        if self.domain.rank() == 0 || self.reduce_axes.contains(&0) {
            return None;
        }
        // An element-wise kernel that loads only whole contiguous buffers or single
        // elements is a flat loop over positions whatever its shape: every extent is
        // erased (the copies of a growing cache, a product's plain epilogue).
        let flat = self.plan == Plan::Elementwise
            && self.body.iter().all(|ins| match &ins.expr {
                Expr::Load { view, .. } => view.is_contiguous() || is_fixed(view),
                Expr::Random { .. } | Expr::Position { .. } | Expr::Gather { .. } => false,
                _ => true,
            });
        let erase = |shape: &Shape| {
            let mut dims = shape.dims().to_vec();
            let n = if flat { dims.len() } else { 1 };
            dims[..n].fill(0);
            Shape::new(dims)
        };
        let erase_view = |view: &View| match () {
            _ if flat && is_fixed(view) => View {
                shape: Shape::new([0]),
                strides: vec![0],
                offset: view.offset,
            },
            _ if flat => View::contiguous(Shape::new([0])),
            _ => View {
                shape: erase(&view.shape),
                ..view.clone()
            },
        };
        let numel = self.domain.numel();
        let body = self
            .body
            .iter()
            .map(|ins| Instr {
                dtype: ins.dtype,
                expr: match &ins.expr {
                    Expr::Load { input, view } => Expr::Load {
                        input: *input,
                        view: erase_view(view),
                    },
                    Expr::Random { key, view } => Expr::Random {
                        key: *key,
                        view: erase_view(view),
                    },
                    Expr::Position { view } => Expr::Position {
                        view: erase_view(view),
                    },
                    Expr::Gather { input, view, axes } => Expr::Gather {
                        input: *input,
                        view: erase_view(view),
                        axes: axes.clone(),
                    },
                    other => other.clone(),
                },
            })
            .collect();
        // The product's operands, `[batch..., M, K]` and `[batch..., K, N]`: the
        // domain's leading axis (M, or a batch), and K too, which only the runtime's
        // GEMM call reads (a weight's gradient `x^T @ dy` sums over the batch).
        let erase_axes = |view: &View, axes: &[usize]| {
            let mut dims = view.shape.dims().to_vec();
            for &a in axes {
                dims[a] = 0;
            }
            if flat {
                dims.fill(0);
            }
            View {
                shape: Shape::new(dims),
                ..view.clone()
            }
        };
        let contraction = self.contraction.as_ref().map(|c| Contraction {
            lhs_view: erase_axes(&c.lhs_view, &[0, c.lhs_view.shape.rank() - 1]),
            rhs_view: match c.rhs_view.shape.rank() {
                2 => erase_axes(&c.rhs_view, &[0]),
                r => erase_axes(&c.rhs_view, &[0, r - 2]),
            },
            // Blocks of M are the runtime's business, read from the kernel itself.
            block_rows: 0,
            ..c.clone()
        });
        let plan = match &self.plan {
            Plan::Elementwise => Plan::Elementwise,
            Plan::Rows {
                row_len,
                contiguous,
                ..
            } => Plan::Rows {
                rows: 0,
                row_len: *row_len,
                contiguous: *contiguous,
            },
            Plan::Columns { col_len, .. } => Plan::Columns {
                cols: 0,
                col_len: *col_len,
            },
            Plan::Split {
                row_len, splits, ..
            } => Plan::Split {
                rows: 0,
                row_len: *row_len,
                splits: *splits,
            },
        };
        let erase_len = |b: &Buffer, per_position: usize| Buffer {
            dtype: b.dtype,
            len: usize::from(b.len != per_position),
        };
        Some(Kernel {
            name: self.name.clone(),
            domain: if flat {
                Shape::new([0])
            } else {
                erase(&self.domain)
            },
            reduce_axes: self.reduce_axes.clone(),
            inputs: self.inputs.iter().map(|b| erase_len(b, b.len)).collect(),
            outputs: self.outputs.iter().map(|b| erase_len(b, numel)).collect(),
            body,
            stores: self.stores.clone(),
            plan,
            plan_reason: String::new(),
            contraction,
        })
    }

    /// Whether the body loads input `input` only at each position's own offset (the
    /// contiguous view of the domain), so that the code of a position could read it
    /// from the very element it writes.
    pub fn reads_in_place(&self, input: usize) -> bool {
        loads_in_place(&self.domain, &self.body, input)
    }
}

impl fmt::Display for Kernel {
    /// One line of header, the buffers, then one instruction a line; with reduce axes,
    /// row values are marked `(row)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {}  domain={}", self.name, self.domain)?;
        if !self.reduce_axes.is_empty() {
            let axes: Vec<String> = self.reduce_axes.iter().map(ToString::to_string).collect();
            write!(f, "  reduce=[{}]", axes.join(","))?;
        }
        writeln!(f, "  plan={}  ; {}", self.plan, self.plan_reason)?;
        for (i, b) in self.inputs.iter().enumerate() {
            writeln!(f, "  in{i}: {}[{}]", b.dtype, b.len)?;
        }
        if let Some(c) = &self.contraction {
            let prologue = |input: usize, steps: &[Prologue]| -> String {
                let mut d = self.inputs.get(input).map_or(c.dtype, |b| b.dtype);
                let mut out = String::new();
                for s in steps {
                    out.push_str(&format!(" |> {}", s.text(d)));
                    d = Prologue::result_dtype(std::slice::from_ref(s), d);
                }
                out
            };
            writeln!(
                f,
                "  in{} = matmul in{} {}{}, in{} {}{} : {}  ; blocks of {} rows",
                c.product,
                c.lhs,
                c.lhs_view,
                prologue(c.lhs, &c.lhs_prologue),
                c.rhs,
                c.rhs_view,
                prologue(c.rhs, &c.rhs_prologue),
                c.dtype,
                c.block_rows
            )?;
        }
        let levels = self.levels();
        for (i, ins) in self.body.iter().enumerate() {
            write!(f, "  v{i} = ")?;
            match &ins.expr {
                Expr::Load { input, view } => write!(f, "load in{input} {view}")?,
                Expr::Const(c) => write!(f, "const {}", crate::print::const_text(*c, ins.dtype))?,
                Expr::Unary(u, a) => write!(f, "{} {a}", u.name())?,
                Expr::Binary(b, x, y) => write!(f, "{} {x}, {y}", b.name())?,
                Expr::Where(c, a, b) => write!(f, "where {c}, {a}, {b}")?,
                Expr::Cast(a) => write!(f, "cast {a}")?,
                Expr::Reduce(acc, a) => write!(f, "reduce_{} {a}", acc.name())?,
                Expr::ArgReduce(op, a) => write!(f, "{} {a}", op.name())?,
                Expr::Random { key, view } => write!(f, "random_uniform {key} {view}")?,
                Expr::Position { view } => write!(f, "position {view}")?,
                Expr::Gather { input, view, axes } => {
                    write!(f, "gather in{input} {view}")?;
                    for a in axes {
                        write!(f, " + {}*{}", a.index, a.stride)?;
                        write!(f, " (0..{}", a.extent)?;
                        if let Some(axis) = a.checked {
                            write!(f, ", checked axis {axis}")?;
                        }
                        f.write_str(")")?;
                    }
                }
            }
            write!(f, " : {}", ins.dtype)?;
            if !self.reduce_axes.is_empty() && levels[i] == Level::Row {
                f.write_str("  (row)")?;
            }
            writeln!(f)?;
        }
        for s in &self.stores {
            match self.outputs.get(s.output) {
                Some(out) => writeln!(
                    f,
                    "  out{} = {} : {}[{}]",
                    s.output, s.value, out.dtype, out.len
                )?,
                None => writeln!(f, "  out{} = {} : <no such output>", s.output, s.value)?,
            }
        }
        Ok(())
    }
}
