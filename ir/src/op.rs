//! The one closed set of operations a graph node can hold, grouped in ND4J's families
//! (transform, pairwise, reduce, index reduce, views, cast), with predicates that passes
//! and codegens use instead of downcasting.
//!
//! Element-wise ops take operands of one identical shape: numpy broadcasting is made
//! explicit by the frontend with `broadcast_to` views, as XLA does, so that every later
//! stage sees the broadcast and can fold it into an index map.

use crate::dtype::{DType, Scalar};
use crate::shape::{AxisSlice, Shape};

/// Unary element-wise ops (ND4J's "transform" family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// -1, 0 or 1 with the sign of x; `sign(±0) = ±0`, `sign(NaN) = NaN`.
    Sign,
    /// `e^x`
    Exp,
    /// natural log; `log(0) = -inf`, `log(x<0) = NaN`.
    Log,
    /// `log(1 + x)`, accurate near 0.
    Log1p,
    /// `e^x - 1`, accurate near 0.
    Expm1,
    /// square root; `sqrt(-0) = -0`.
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// `x * x`
    Square,
    /// `1 / x`
    Recip,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// hyperbolic tangent
    Tanh,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `maximum(x, 0)`: `relu(NaN) = NaN`, `relu(-0) = +0`.
    Relu,
    /// the error function
    Erf,
    /// round toward -inf
    Floor,
    /// round toward +inf
    Ceil,
    /// round half to even (numpy's `round`)
    Round,
    /// logical not (bool only)
    Not,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 21] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Square,
        UnaryOp::Recip,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Not,
    ];

    /// The name used in IR dumps and kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Square => "square",
            UnaryOp::Recip => "recip",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Erf => "erf",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Not => "not",
        }
    }

    /// Whether the op is only defined on floats. The frontend casts integer operands
    /// to f64 first, as numpy does (`np.exp(np.int32(1)).dtype == float64`); neg, abs,
    /// sign, square and relu keep integer dtypes, and `not` takes bool.
    pub const fn is_float_only(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::Square
                | UnaryOp::Relu
                | UnaryOp::Not
        )
    }
}

/// Binary element-wise ops (ND4J's "pairwise", "scalar" and "broadcast" families: a
/// scalar operand is a constant node, a broadcast operand a `broadcast_to` view).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// true division `a / b` (ints promote to f64, as numpy's `/`).
    Div,
    /// `a ** b`
    Pow,
    /// `maximum(a, b)`, NaN-propagating, `+0 > -0`.
    Max,
    /// `minimum(a, b)`, NaN-propagating, `-0 < +0`.
    Min,
    /// `a == b` -> bool
    Eq,
    /// `a != b` -> bool
    Ne,
    /// `a < b` -> bool
    Lt,
    /// `a <= b` -> bool
    Le,
    /// `a > b` -> bool
    Gt,
    /// `a >= b` -> bool
    Ge,
    /// logical and (bool only)
    And,
    /// logical or (bool only)
    Or,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 15] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
    ];

    /// The name used in IR dumps and kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
        }
    }

    /// Comparisons return bool.
    pub const fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    /// Logical ops take and return bool.
    pub const fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
}

/// Reductions over a set of axes (ND4J's "reduce" family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// sum; empty sum is 0.
    Sum,
    /// arithmetic mean; empty mean is NaN.
    Mean,
    /// maximum, NaN-propagating; empty is an error at build time.
    Max,
    /// minimum, NaN-propagating; empty is an error at build time.
    Min,
    /// product; empty product is 1.
    Prod,
    /// sum of absolute values.
    Norm1,
    /// square root of the sum of squares.
    Norm2,
    /// population variance (ddof = 0); empty is NaN.
    Var,
    /// population standard deviation (ddof = 0); empty is NaN.
    Std,
}

impl ReduceOp {
    /// Every reduce op.
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::Norm1,
        ReduceOp::Norm2,
        ReduceOp::Var,
        ReduceOp::Std,
    ];

    /// The name used in IR dumps and kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
            ReduceOp::Prod => "prod",
            ReduceOp::Norm1 => "norm1",
            ReduceOp::Norm2 => "norm2",
            ReduceOp::Var => "var",
            ReduceOp::Std => "std",
        }
    }

    /// Whether the reduction has no identity, so reducing zero elements is an error.
    pub const fn needs_nonempty(self) -> bool {
        matches!(self, ReduceOp::Max | ReduceOp::Min)
    }
}

/// Index reductions (ND4J's "index reduce" family): the position along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArgReduceOp {
    /// index of the first maximum (the first NaN, if any: numpy's rule).
    ArgMax,
    /// index of the first minimum (the first NaN, if any: numpy's rule).
    ArgMin,
}

impl ArgReduceOp {
    /// The name used in IR dumps.
    pub const fn name(self) -> &'static str {
        match self {
            ArgReduceOp::ArgMax => "argmax",
            ArgReduceOp::ArgMin => "argmin",
        }
    }
}

/// Zero-copy view ops: each is a function on [`crate::View`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ViewOp {
    /// Same elements in row-major order, new shape (same element count).
    Reshape(Shape),
    /// Axis `i` of the result is axis `perm[i]` of the operand.
    Permute(Vec<usize>),
    /// One normalised slice per axis.
    Slice(Vec<AxisSlice>),
    /// numpy's `broadcast_to`.
    BroadcastTo(Shape),
    /// Insert a size-1 axis at this position.
    ExpandDims(usize),
    /// Remove these size-1 axes (sorted, unique).
    Squeeze(Vec<usize>),
}

impl ViewOp {
    /// The name used in IR dumps.
    pub const fn name(&self) -> &'static str {
        match self {
            ViewOp::Reshape(_) => "reshape",
            ViewOp::Permute(_) => "permute",
            ViewOp::Slice(_) => "slice",
            ViewOp::BroadcastTo(_) => "broadcast_to",
            ViewOp::ExpandDims(_) => "expand_dims",
            ViewOp::Squeeze(_) => "squeeze",
        }
    }
}

/// How [`Op::Pad`] fills the positions outside its operand (numpy's `np.pad` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// A constant value (the op's `value`).
    Constant,
    /// The edge element of the axis repeated (`np.pad(mode='edge')`).
    Edge,
    /// Mirrored about the edge element, which is not repeated (`np.pad(mode='reflect')`,
    /// `[1,2,3]` padded by 2 on the left gives `[3,2,1,2,3]`); a width above `n - 1` is
    /// an error.
    Reflect,
}

impl PadMode {
    /// The mode's name in dumps and in EXPR (`'constant'`, `'edge'`, `'reflect'`).
    pub const fn name(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Edge => "edge",
            PadMode::Reflect => "reflect",
        }
    }
}

/// Running combinations along an axis ([`Op::Scan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScanOp {
    /// Running sum (`np.cumsum`).
    Sum,
    /// Running product (`np.cumprod`).
    Prod,
}

impl ScanOp {
    /// The name used in IR dumps.
    pub const fn name(self) -> &'static str {
        match self {
            ScanOp::Sum => "cumsum",
            ScanOp::Prod => "cumprod",
        }
    }
}

/// What a graph node computes. One closed enum: passes and codegens match on it
/// exhaustively.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A tensor supplied at evaluation time, by name.
    Input {
        /// Name shown in dumps and used by the CLI to bind data.
        name: String,
    },
    /// A tensor whose every element is `value` (a scalar literal or `full`).
    Const {
        /// The value, already converted to the node's dtype.
        value: Scalar,
    },
    /// Unary element-wise op.
    Unary(UnaryOp),
    /// Binary element-wise op; operands have one shape (see the module docs).
    Binary(BinaryOp),
    /// `where(cond, a, b)`: operand 0 is a bool condition.
    Where,
    /// Conversion to another dtype (see [`crate::Scalar::cast`] for the rules).
    Cast {
        /// The target dtype, equal to the node's dtype.
        to: DType,
    },
    /// Reduction over `axes` (sorted, unique), keeping them as size-1 axes if `keepdims`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes of the operand, sorted and unique.
        axes: Vec<usize>,
        /// Keep reduced axes with extent 1.
        keepdims: bool,
    },
    /// Index reduction along one axis, returning i64.
    ArgReduce {
        /// argmax or argmin.
        op: ArgReduceOp,
        /// The axis searched.
        axis: usize,
        /// Keep the axis with extent 1.
        keepdims: bool,
    },
    /// A zero-copy view of the operand.
    View(ViewOp),
    /// Matrix product over the last two axes (numpy's `matmul` for operands of rank 2 or
    /// more; the frontend promotes 1-D operands): `[..., M, K] @ [..., K, N] ->
    /// [..., M, N]`, leading (batch) axes broadcast. Operands have one dtype, not bool;
    /// floats accumulate in f32 (f16, bf16, f32) or f64 and round once, integers wrap.
    MatMul,
    /// Counter-based uniform random numbers: f32 values in `[0, 1)` of `shape`, from ONE
    /// operand, `key`, a 0-d i64 tensor. The key is runtime data, not an attribute, so a
    /// training loop changes it every step without recompiling. The element at row-major
    /// position `i` of `shape` (its own shape, whatever view a consumer reads it through)
    /// is [`random_bits`]`(key, i) >> 8` times 2^-24: a pure function of `(key, i)`, so
    /// the same on every backend, thread count, chunking and vector width. Not
    /// differentiable (its operand is an integer).
    RandomUniform {
        /// The shape of the result.
        shape: Shape,
    },
    /// `start + step * i` for `i` in `0..len`, as i64 (numpy's `arange`): the only op
    /// that makes positions into values, from which `one_hot`, `tril`/`triu` and causal
    /// masks are composites. A *read* like a constant: every kernel that reads it
    /// computes it from the position.
    Iota {
        /// Number of elements.
        len: usize,
        /// The first value.
        start: i64,
        /// The difference between neighbours.
        step: i64,
    },
    /// `out[p] = x[p with p[axis] := idx[p]]`: operands `x` and `idx` (i32 or i64) of one
    /// rank that agree on every axis but `axis`; the result has `idx`'s shape and `x`'s
    /// dtype. numpy's `take_along_axis` with the broadcasting made explicit; `take(x,
    /// idx, axis)` is this op on views of both. A negative index counts from the end; an
    /// index outside `-n..n` is an error of the evaluation (never a read out of bounds).
    /// An element-wise kernel reads through it (a load at a computed offset).
    Gather {
        /// The axis of `x` indexed.
        axis: usize,
    },
    /// `out = x` with `v[p]` added at `p with p[axis] := idx[p]` for every position `p`
    /// of `idx` (numpy's `np.add.at` along one axis): operands `x`, `idx` (i32 or i64)
    /// and `v` (of `idx`'s shape and `x`'s dtype). Duplicate indices accumulate, in
    /// increasing position order along `axis` (the same bits on every thread count).
    /// Gather's gradient. A kernel of its own.
    ScatterAdd {
        /// The axis of `x` indexed.
        axis: usize,
    },
    /// The `parts` operands joined along `axis` (numpy's `concatenate`): one dtype, one
    /// rank, equal extents on every other axis. A read: a kernel that consumes it picks
    /// the operand by the position's range.
    Concat {
        /// The axis joined along.
        axis: usize,
        /// Number of operands (one at least).
        parts: usize,
    },
    /// `widths[a] = (before, after)` positions added on each side of axis `a`, filled as
    /// `mode` says (numpy's `np.pad`). A read: outside the interior a kernel returns
    /// the fill instead of loading.
    Pad {
        /// Positions added before and after, one pair per axis.
        widths: Vec<(usize, usize)>,
        /// How the new positions are filled.
        mode: PadMode,
        /// The fill of [`PadMode::Constant`] (of the node's dtype; 0 for other modes).
        value: Scalar,
    },
    /// Inclusive running sum or product along `axis` (numpy's `cumsum`/`cumprod`), from
    /// the end backwards when `reverse`. Integers accumulate in i64 (numpy's platform
    /// integer), floats in their own dtype (half types in f32, rounded at each store).
    /// A kernel of its own.
    Scan {
        /// Sum or product.
        op: ScanOp,
        /// The axis scanned.
        axis: usize,
        /// Scan from the last position to the first.
        reverse: bool,
    },
    /// The positions (i64) that sort `x` along `axis`, stably: numpy's
    /// `argsort(kind='stable')` order (NaN last) when ascending; when `descending`, the
    /// reverse order of values (NaN first, as the largest) with ties still in increasing
    /// position. Only the first `k` positions of each row are kept: `top_k` is
    /// `descending` with `k` below the extent. A kernel of its own; `sort` and `top_k`'s
    /// values are a gather through it.
    Argsort {
        /// The axis sorted.
        axis: usize,
        /// Largest first.
        descending: bool,
        /// Positions kept per row (the extent of `axis` for a full sort).
        k: usize,
    },
    /// Scaled dot-product attention, fused: `softmax(scale * q @ k^T + bias, masked) @ v`
    /// over `[B, H, T, D]` operands (`[B, T, H, D]` in the spec's other layout) `q [B, Hq, Tq, D]`, `k [B, Hkv, Tk, D]`,
    /// `v [B, Hkv, Tk, Dv]` (one float dtype; `Hkv` divides `Hq`: query head `h` reads
    /// key/value head `h / (Hq / Hkv)`), then, as the spec says, `bias` (a float of
    /// extents `[B|1, Hq|1, Tq|1, Tk|1]`, added to the scaled scores), `key_lengths`
    /// (i64 `[B]`: key `j` of batch `b` is seen only when `j < key_lengths[b]`) and the
    /// dropout `key` (0-d i64). Result `[B, Hq, Tq, Dv]` in q's dtype. A query row that
    /// sees no key gives zeros. Dropout keeps probability `(b, h, i, j)` when
    /// [`random_uniform`]`(key, ((b * Hq + h) * Tq + i) * Tk + j) >= p` (f32) and scales
    /// the kept ones by `1 / (1 - p)`: [`Op::RandomUniform`]'s stream over the scores'
    /// shape, so the unfused graph draws the same mask. A routine of its own: the scores
    /// never reach memory.
    Attention(AttentionSpec),
    /// The gradient of [`Op::Attention`] with respect to q, k and v, packed: operands
    /// `q, k, v, o, do` (the forward's result and its gradient) then the forward's extra
    /// operands; the result is 1-D, `dq`, `dk`, `dv` flattened one after another (the
    /// gradients of the shared key/value heads summed over their query heads). A routine
    /// of its own that recomputes the probabilities per block of keys.
    AttentionBackward(AttentionSpec),
    /// A decomposition or solve of the LAPACK level over the last two axes, batched over
    /// the leading ones (see [`crate::linalg`] for each op's operands, its packed result
    /// and its sign conventions). Float dtypes; f16 and bf16 compute in f32 and round
    /// once. A routine of its own (a library call on a backend); a matrix it cannot
    /// factor is an error of the evaluation naming the batch index.
    Linalg(crate::linalg::LinalgOp),
    /// `x @ w^T` with `w` a block-quantised matrix (llama.cpp's formats): operands `x`
    /// (f32 `[..., k]`) and `w`, the blocks of `n` rows as an i32 tensor
    /// `[n, spec.row_words()]` (see [`crate::quant`]); the result is f32 `[..., n]`,
    /// each weight dequantised to f32 as the format defines ([`crate::BlockFormat`]).
    /// A routine of its own that reads the blocks where they are: a decode step's
    /// matrix-vector products read 4.5 (Q4_1) or 8.5 (Q8_0) bits a weight, not 32. Not
    /// differentiable (the weights are not floats).
    QuantMatMul(crate::quant::QuantSpec),
}

/// Which keys a query sees by position in [`Op::Attention`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CausalMask {
    /// Every key.
    #[default]
    None,
    /// Query `i` sees keys `j <= i` (torch's and jax's `is_causal`), also when `Tq != Tk`.
    TopLeft,
    /// Query `i` sees keys `j <= i + Tk - Tq` (FlashAttention's and llama.cpp's
    /// alignment: the queries are the last `Tq` positions, as in a KV-cache decode step).
    BottomRight,
}

impl From<bool> for CausalMask {
    fn from(causal: bool) -> Self {
        if causal {
            CausalMask::TopLeft
        } else {
            CausalMask::None
        }
    }
}

impl CausalMask {
    /// The last key query `i` of `tq` sees among `tk` keys, plus one (`tk` when all;
    /// negative or zero when none).
    pub fn visible(self, i: usize, tq: usize, tk: usize) -> i64 {
        match self {
            CausalMask::None => tk as i64,
            CausalMask::TopLeft => (i as i64 + 1).min(tk as i64),
            CausalMask::BottomRight => (i as i64 + 1 + tk as i64 - tq as i64).min(tk as i64),
        }
    }

    /// The spelling of the expression language (`false`, `true`, `'bottom_right'`).
    pub fn name(self) -> &'static str {
        match self {
            CausalMask::None => "false",
            CausalMask::TopLeft => "true",
            CausalMask::BottomRight => "'bottom_right'",
        }
    }
}

/// How [`Op::Attention`]'s q, k, v (and its result, and the backward's o, do and
/// gradients) lay out their axes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionLayout {
    /// `[B, H, T, D]` (torch's `scaled_dot_product_attention`).
    #[default]
    Bhtd,
    /// `[B, T, H, D]` (FlashAttention's): the heads of a `[B, T, H * D]` projection
    /// without a transpose.
    Bthd,
    /// One operand `qkv [B, T, (Hq + 2 Hkv) D]` in place of q, k and v: at each position
    /// the `q_heads` query heads, then the `kv_heads` key heads, then the value heads, `D`
    /// features each (FlashAttention's `qkvpacked`, GPT-2's `c_attn` projection). The
    /// result is `[B, T, Hq, D]` as in [`AttentionLayout::Bthd`]; the backward's result
    /// is the gradient of `qkv`, of its shape.
    Packed {
        /// Query heads.
        q_heads: usize,
        /// Key (and value) heads.
        kv_heads: usize,
    },
}

impl AttentionLayout {
    /// `(batch, heads, time, features)` of a 4-axis shape in this layout (the packed
    /// layout's result is `[B, T, H, D]`).
    pub fn split(self, d: &[usize]) -> (usize, usize, usize, usize) {
        match self {
            AttentionLayout::Bhtd => (d[0], d[1], d[2], d[3]),
            _ => (d[0], d[2], d[1], d[3]),
        }
    }

    /// The 4-axis shape of `(batch, heads, time, features)` in this layout.
    pub fn shape(self, b: usize, h: usize, t: usize, d: usize) -> [usize; 4] {
        match self {
            AttentionLayout::Bhtd => [b, h, t, d],
            _ => [b, t, h, d],
        }
    }

    /// Tensor operands in front of the extras: 1 when packed, else 3 (q, k, v).
    pub fn tensors(self) -> usize {
        match self {
            AttentionLayout::Packed { .. } => 1,
            _ => 3,
        }
    }

    /// The offset of row `(b, h, t)` (its feature 0) and the distance between rows `t` and
    /// `t + 1` of one head, in a contiguous tensor of `heads` heads, `time` rows and
    /// `features` features.
    pub fn row(
        self,
        (b, h, t): (usize, usize, usize),
        heads: usize,
        time: usize,
        features: usize,
    ) -> (usize, usize) {
        match self {
            AttentionLayout::Bhtd => (((b * heads + h) * time + t) * features, features),
            _ => (((b * time + t) * heads + h) * features, heads * features),
        }
    }
}

/// The attributes of [`Op::Attention`] and [`Op::AttentionBackward`]: the mask, the
/// scale, the layout, and which extra operands follow q, k and v (in this order: bias,
/// key lengths, dropout key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionSpec {
    /// The axes' order of q, k, v and the result.
    pub layout: AttentionLayout,
    /// The causal mask.
    pub causal: CausalMask,
    /// The factor of `q @ k^T` (a float).
    pub scale: Scalar,
    /// An additive bias operand follows.
    pub bias: bool,
    /// A key-lengths operand follows.
    pub key_lengths: bool,
    /// The dropout rate, when a key operand follows.
    pub dropout: Option<Scalar>,
}

impl AttentionSpec {
    /// Operands after q, k, v (and o, do for the backward).
    pub fn extras(&self) -> usize {
        usize::from(self.bias) + usize::from(self.key_lengths) + usize::from(self.dropout.is_some())
    }

    /// The scale as f64.
    pub fn scale(&self) -> f64 {
        self.scale.to_f64()
    }

    /// The dropout rate (0 when none).
    pub fn dropout_p(&self) -> f64 {
        self.dropout.map_or(0.0, |p| p.to_f64())
    }
}

/// `lowbias32` (Chris Wellons' hash-prospector): a cheap 32-bit integer mixer built from
/// what vectorises on 32-bit lanes and is trivial in CUDA C: xor, shift, low multiply.
pub const fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The key schedule of [`Op::RandomUniform`]: with `key` split into `k0` (low 32 bits)
/// and `k1` (high 32 bits), and the high half `c1` of the element index,
/// `mix32(k0 ^ mix32(k1 ^ mix32(c1 ^ 0x9e3779b9)))`. Below 2^32 elements `c1` is 0, so a
/// kernel computes it once.
pub const fn random_stream(key: i64, c1: u32) -> u32 {
    let key = key as u64;
    let (k0, k1) = (key as u32, (key >> 32) as u32);
    mix32(k0 ^ mix32(k1 ^ mix32(c1 ^ 0x9e37_79b9)))
}

/// The 32 random bits of element `index` under `key`: with `c0` the low 32 bits of the
/// index and `h = random_stream(key, c1)`, `mix32(mix32(c0 ^ h) + h)` (wrapping add).
/// For one key and `c1`, a bijection of `c0` (each step is one). [`Op::RandomUniform`]
/// takes the top 24 bits: `(bits >> 8) as f32 * 2^-24`, exact, in `[0, 1)`.
pub const fn random_bits(key: i64, index: u64) -> u32 {
    let h = random_stream(key, (index >> 32) as u32);
    mix32(mix32(index as u32 ^ h).wrapping_add(h))
}

/// The value of element `index` of [`Op::RandomUniform`] under `key`, in `[0, 1)`.
pub fn random_uniform(key: i64, index: u64) -> f32 {
    (random_bits(key, index) >> 8) as f32 * (1.0 / 16_777_216.0)
}

impl Op {
    /// Number of operands this op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input { .. } | Op::Const { .. } => 0,
            Op::Unary(_)
            | Op::Cast { .. }
            | Op::Reduce { .. }
            | Op::ArgReduce { .. }
            | Op::View(_)
            | Op::RandomUniform { .. } => 1,
            Op::Binary(_) | Op::MatMul => 2,
            Op::Where => 3,
            Op::Iota { .. } => 0,
            Op::Scan { .. } | Op::Argsort { .. } => 1,
            Op::Gather { .. } => 2,
            Op::ScatterAdd { .. } => 3,
            Op::Concat { parts, .. } => *parts,
            Op::Pad { .. } => 1,
            Op::Attention(s) => s.layout.tensors() + s.extras(),
            Op::AttentionBackward(s) => s.layout.tensors() + 2 + s.extras(),
            Op::Linalg(l) => l.arity(),
            Op::QuantMatMul(_) => 2,
        }
    }

    /// Element-wise compute: output element `i` depends only on operand elements `i`.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } | Op::Const { .. }
        )
    }

    /// Reductions, including index reductions.
    pub fn is_reduce(&self) -> bool {
        matches!(self, Op::Reduce { .. } | Op::ArgReduce { .. })
    }

    /// Contractions (matrix products): a GEMM, with element-wise epilogues fused.
    pub fn is_contraction(&self) -> bool {
        matches!(self, Op::MatMul)
    }

    /// Zero-copy views.
    pub fn is_view(&self) -> bool {
        matches!(self, Op::View(_))
    }

    /// Random number sources: computed from their key and the element's own position,
    /// reading no other array (fused into kernels like a constant with an index).
    pub fn is_random(&self) -> bool {
        matches!(self, Op::RandomUniform { .. })
    }

    /// Reads at computed positions (gather, concat, pad): an element-wise kernel loads
    /// its operands through the index (or the position's range, or the interior test)
    /// instead of at the position itself.
    pub fn is_indexed_read(&self) -> bool {
        matches!(self, Op::Gather { .. } | Op::Concat { .. } | Op::Pad { .. })
    }

    /// Ops that run as a routine of their own (scatter-add, scans, sorts, attention, the
    /// LAPACK level):
    /// neither element-wise nor a reduction of the row program.
    pub fn is_routine(&self) -> bool {
        matches!(
            self,
            Op::ScatterAdd { .. }
                | Op::Scan { .. }
                | Op::Argsort { .. }
                | Op::Attention(_)
                | Op::AttentionBackward(_)
                | Op::Linalg(_)
                | Op::QuantMatMul(_)
        )
    }

    /// Graph inputs.
    pub fn is_input(&self) -> bool {
        matches!(self, Op::Input { .. })
    }

    /// The op's short name, as printed in dumps and used in kernel names.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Const { .. } => "const",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Cast { .. } => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { op, .. } => op.name(),
            Op::View(v) => v.name(),
            Op::MatMul => "matmul",
            Op::RandomUniform { .. } => "random_uniform",
            Op::Iota { .. } => "iota",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Concat { .. } => "concat",
            Op::Pad { .. } => "pad",
            Op::Scan { op, .. } => op.name(),
            Op::Argsort { .. } => "argsort",
            Op::Attention(_) => "attention",
            Op::AttentionBackward(_) => "attention_backward",
            Op::Linalg(l) => l.name(),
            Op::QuantMatMul(_) => "quant_matmul",
        }
    }
}

/// A node's op together with its result type, the payload of a graph node.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// Element type of the result.
    pub dtype: DType,
    /// Shape of the result.
    pub shape: Shape,
}
