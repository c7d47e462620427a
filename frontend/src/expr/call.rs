//! Arguments of function calls in expressions: binding positional and keyword
//! arguments to a signature, reading the literal arguments (axes, shapes, dtypes,
//! flags, strings, pad widths), and the list of function names for "did you mean" hints.

use super::parse::{ExprError, Kind, Kwarg, Lit, Node};
use crate::ops::Axes;
use ndfuse_ir::{DType, PadMode};

/// Every function the language knows, by family, for "did you mean" hints.
#[rustfmt::skip]
pub const FUNCTIONS: &[&str] = &[
    // unary (with numpy's spellings)
    "neg", "negative", "abs", "absolute", "sign", "exp", "log", "log1p", "expm1", "sqrt",
    "rsqrt", "square", "recip", "reciprocal", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
    "gelu_erf", "erf", "floor", "ceil", "round", "not", "logical_not",
    // binary
    "maximum", "minimum", "pow", "power", "and", "logical_and", "or", "logical_or", "add",
    "subtract", "multiply", "divide", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "where", "cast", "astype", "matmul",
    // reductions
    "sum", "mean", "max", "amax", "min", "amin", "prod", "norm1", "norm2", "var", "std",
    "argmax", "argmin",
    // views
    "reshape", "transpose", "permute", "broadcast_to", "expand_dims", "squeeze",
    // indexing, joining, padding, scans and sorts
    "take", "take_along_axis", "index_add", "concat", "concatenate", "stack", "pad", "cumsum",
    "cumprod", "sort", "argsort", "top_k",
    // positions
    "arange", "one_hot", "tril", "triu",
    // convolutions and pooling
    "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
    "global_avg_pool2d", "batch_norm",
    // attention
    "attention",
    // the LAPACK level
    "solve", "cholesky", "inv", "det", "svdvals", "eigvalsh", "pinv", "triangular_solve",
    "matrix_norm", "cond", "matrix_transpose", "qr", "svd", "eigh", "slogdet", "lu", "lstsq",
    // composites
    "softmax", "log_softmax", "layernorm", "dropout",
    // differentiation
    "grad",
];

/// The LAPACK-level functions that return one tensor (lowered in `linalg`).
pub const LINALG_SINGLE: &[&str] = &[
    "solve",
    "cholesky",
    "inv",
    "det",
    "svdvals",
    "eigvalsh",
    "pinv",
    "triangular_solve",
    "matrix_norm",
    "cond",
    "matrix_transpose",
];

/// The functions that return a tuple, with the number of its items.
pub const LINALG_TUPLES: &[(&str, usize)] = &[
    ("qr", 2),
    ("svd", 3),
    ("eigh", 2),
    ("slogdet", 2),
    ("lu", 3),
    ("lstsq", 4),
];

/// The parts of the tuples, for the "index it" message.
pub fn tuple_items(name: &str) -> &'static str {
    match name {
        "qr" => "(q, r)",
        "svd" => "(u, s, vh)",
        "eigh" => "(eigenvalues, eigenvectors)",
        "slogdet" => "(sign, logabsdet)",
        "lu" => "(p, l, u)",
        _ => "(solution, residuals, rank, singular_values)",
    }
}

/// Whether `name` is a LAPACK-level function.
pub fn is_linalg(name: &str) -> bool {
    LINALG_SINGLE.contains(&name) || LINALG_TUPLES.iter().any(|(t, _)| *t == name)
}

/// The error of a tuple function used without an index.
pub fn linalg_unindexed(name: &str, pos: usize) -> ExprError {
    ExprError::new(
        pos,
        format!(
            "{name}() returns a tuple {}: index it, as {name}(a)[0]",
            tuple_items(name)
        ),
    )
}

/// "unknown function" with the closest known name when one is near.
pub fn unknown_function(name: &str) -> String {
    let best = FUNCTIONS
        .iter()
        .map(|f| (edit_distance(name, f), *f))
        .min()
        .filter(|(d, f)| *d <= 2 && *d < f.len());
    match best {
        Some((_, f)) => format!("unknown function '{name}' (did you mean '{f}'?)"),
        None => format!("unknown function '{name}'"),
    }
}

/// Levenshtein distance, for "did you mean" hints.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Binds positional and keyword arguments to `params` (`"axis=None"` marks an
/// optional parameter and shows its default in messages).
pub fn bind<'n>(
    name: &str,
    pos: usize,
    args: &'n [Node],
    kwargs: &'n [Kwarg],
    params: &[&str],
) -> Result<Vec<Option<&'n Node>>, ExprError> {
    let sig = params.join(", ");
    let pname = |p: &str| p.split('=').next().unwrap_or(p).to_string();
    if args.len() > params.len() {
        let n = params.len();
        return Err(ExprError::new(
            args[n].pos,
            format!(
                "{name}() takes at most {n} argument{} ({sig}), got {}",
                if n == 1 { "" } else { "s" },
                args.len()
            ),
        ));
    }
    let mut slots: Vec<Option<&Node>> = vec![None; params.len()];
    for (i, a) in args.iter().enumerate() {
        slots[i] = Some(a);
    }
    for kw in kwargs {
        let Some(i) = params.iter().position(|p| pname(p) == kw.name) else {
            return Err(ExprError::new(
                kw.pos,
                format!("{name}() has no keyword '{}' (it takes {sig})", kw.name),
            ));
        };
        if slots[i].is_some() {
            return Err(ExprError::new(
                kw.pos,
                format!("{name}() got '{}' both by position and by keyword", kw.name),
            ));
        }
        slots[i] = Some(&kw.value);
    }
    for (i, p) in params.iter().enumerate() {
        if slots[i].is_none() && !p.contains('=') {
            return Err(ExprError::new(
                pos,
                format!("{name}() is missing argument '{p}' (it takes {sig})"),
            ));
        }
    }
    Ok(slots)
}

/// A required slot, which [`bind`] has checked is present.
pub fn req<'n>(slots: &[Option<&'n Node>], i: usize) -> &'n Node {
    slots[i].expect("bind() checked that required arguments are present")
}

pub fn opt<'n>(slots: &[Option<&'n Node>], i: usize) -> Option<&'n Node> {
    slots[i].filter(|n| !is_none(n))
}

pub fn is_none(n: &Node) -> bool {
    matches!(&n.kind, Kind::Name(s) if s == "None")
}

/// An integer literal, possibly negated.
pub fn int_literal(n: &Node, what: &str) -> Result<i64, ExprError> {
    match &n.kind {
        Kind::Lit(Lit::Int(v)) => Ok(*v),
        Kind::Unary { negate, operand } => {
            let v = int_literal(operand, what)?;
            if *negate {
                v.checked_neg()
                    .ok_or_else(|| ExprError::new(n.pos, format!("{what} is out of range")))
            } else {
                Ok(v)
            }
        }
        _ => Err(ExprError::new(
            n.pos,
            format!("{what} must be an integer literal"),
        )),
    }
}

pub fn float_literal(n: &Node, what: &str) -> Result<f64, ExprError> {
    match &n.kind {
        Kind::Lit(Lit::Int(v)) => Ok(*v as f64),
        Kind::Lit(Lit::Float(v)) => Ok(*v),
        Kind::Unary { negate, operand } => {
            let v = float_literal(operand, what)?;
            Ok(if *negate { -v } else { v })
        }
        _ => Err(ExprError::new(n.pos, format!("{what} must be a number"))),
    }
}

pub fn bool_literal(n: &Node) -> Result<bool, ExprError> {
    match &n.kind {
        Kind::Lit(Lit::Bool(b)) => Ok(*b),
        _ => Err(ExprError::new(n.pos, "keepdims must be true or false")),
    }
}

pub fn axis_literal(n: &Node, what: &str) -> Result<i64, ExprError> {
    int_literal(n, what)
}

/// `[a, b, ...]` of integer literals (a single integer is a one-element list).
pub fn int_list(n: &Node, what: &str) -> Result<Vec<i64>, ExprError> {
    match &n.kind {
        Kind::List(items) => items
            .iter()
            .map(|i| int_literal(i, &format!("each {what} entry")))
            .collect(),
        _ => int_literal(n, what).map(|v| vec![v]).map_err(|_| {
            ExprError::new(
                n.pos,
                format!("{what} must be a list of integers like [2, 3]"),
            )
        }),
    }
}

pub fn axes_literal(n: &Node) -> Result<Axes, ExprError> {
    match &n.kind {
        Kind::List(_) => int_list(n, "axis").map(Axes::These),
        _ => int_literal(n, "axis")
            .map(|a| Axes::These(vec![a]))
            .map_err(|_| {
                ExprError::new(
                    n.pos,
                    "axis must be an integer or a list of integers like [0, 2]",
                )
            }),
    }
}

pub fn dtype_literal(n: &Node) -> Result<DType, ExprError> {
    let Kind::Name(s) = &n.kind else {
        return Err(ExprError::new(
            n.pos,
            "the dtype must be a name: f16, bf16, f32, f64, i32, i64 or bool",
        ));
    };
    parse_dtype(s).ok_or_else(|| {
        ExprError::new(
            n.pos,
            format!("unknown dtype '{s}' (use f16, bf16, f32, f64, i32, i64 or bool)"),
        )
    })
}

/// A dtype by its ndfuse name or its numpy name.
pub fn parse_dtype(s: &str) -> Option<DType> {
    DType::parse(s).or(match s {
        "float16" | "half" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        "float32" | "float" => Some(DType::F32),
        "float64" | "double" => Some(DType::F64),
        "int32" => Some(DType::I32),
        "int64" => Some(DType::I64),
        _ => None,
    })
}

/// A quoted string literal (`'reflect'` or `"reflect"`).
pub fn str_literal<'n>(n: &'n Node, what: &str) -> Result<&'n str, ExprError> {
    match &n.kind {
        Kind::Str(s) => Ok(s),
        _ => Err(ExprError::new(
            n.pos,
            format!("{what} must be a quoted string like 'reflect'"),
        )),
    }
}

/// A pad mode by its numpy name.
pub fn pad_mode(n: &Node) -> Result<PadMode, ExprError> {
    let s = str_literal(n, "mode")?;
    [PadMode::Constant, PadMode::Edge, PadMode::Reflect]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| {
            ExprError::new(
                n.pos,
                format!("unknown pad mode '{s}' (use 'constant', 'edge' or 'reflect')"),
            )
        })
}

/// numpy's `pad_width` for `rank` axes: `[[before, after], ...]` one pair per axis,
/// `[before, after]` for every axis, or `n` on both sides of every axis. Each width
/// is a non-negative integer literal; a negative one is refused at its column.
pub fn pad_widths(n: &Node, rank: usize) -> Result<Vec<(usize, usize)>, ExprError> {
    let width = |w: &Node| -> Result<usize, ExprError> {
        let v = int_literal(w, "each pad width")?;
        usize::try_from(v).map_err(|_| {
            ExprError::new(
                w.pos,
                format!("pad width {v} is negative (widths are >= 0)"),
            )
        })
    };
    let pair = |p: &Node| -> Result<(usize, usize), ExprError> {
        match &p.kind {
            Kind::List(v) if v.len() == 2 => Ok((width(&v[0])?, width(&v[1])?)),
            _ => Err(ExprError::new(
                p.pos,
                "each pad width entry must be a pair [before, after]",
            )),
        }
    };
    match &n.kind {
        Kind::List(items) if items.iter().all(|i| matches!(i.kind, Kind::List(_))) => {
            if items.len() != rank {
                return Err(ExprError::new(
                    n.pos,
                    format!("pad: {} pairs of widths given for {rank} axes", items.len()),
                ));
            }
            items.iter().map(pair).collect()
        }
        Kind::List(_) => Ok(vec![pair(n)?; rank]),
        _ => {
            let w = width(n)?;
            Ok(vec![(w, w); rank])
        }
    }
}

/// A convolution's per-axis setting: an integer literal (every spatial axis) or a list
/// of them (one per axis), each at least `min`.
pub fn spatial_literal(n: &Node, what: &str, min: i64) -> Result<Vec<usize>, ExprError> {
    let one = |v: &Node| -> Result<usize, ExprError> {
        let x = int_literal(v, what)?;
        if x < min {
            return Err(ExprError::new(
                v.pos,
                format!("{what} = {x} must be at least {min}"),
            ));
        }
        Ok(x as usize)
    };
    match &n.kind {
        Kind::List(items) => items.iter().map(one).collect(),
        _ => Ok(vec![one(n)?]),
    }
}

/// A convolution's padding: `'same'`, `'valid'`, an integer or a list of one per axis
/// (each on both sides of its axis, as PyTorch's).
pub fn conv_padding(n: &Node) -> Result<crate::conv::Padding, ExprError> {
    use crate::conv::Padding;
    if let Kind::Str(s) = &n.kind {
        return match s.as_str() {
            "same" => Ok(Padding::Same),
            "valid" => Ok(Padding::Valid),
            _ => Err(ExprError::new(
                n.pos,
                format!("unknown padding '{s}' (use 'same', 'valid', an integer or a list)"),
            )),
        };
    }
    let p = spatial_literal(n, "padding", 0)?;
    Ok(Padding::Explicit(p.into_iter().map(|v| (v, v)).collect()))
}

/// Attention's mask: `true` / `'top_left'` (torch's `is_causal`), `'bottom_right'`
/// (FlashAttention's alignment), `false` / `'none'`.
pub fn causal_literal(n: &Node) -> Result<crate::Causal, ExprError> {
    use crate::Causal;
    match &n.kind {
        Kind::Lit(Lit::Bool(b)) => Ok(Causal::from(*b)),
        Kind::Str(s) => match s.as_str() {
            "top_left" => Ok(Causal::TopLeft),
            "bottom_right" => Ok(Causal::BottomRight),
            "none" => Ok(Causal::None),
            _ => Err(ExprError::new(
                n.pos,
                format!("unknown causal '{s}' (use true, false, 'top_left' or 'bottom_right')"),
            )),
        },
        _ => Err(ExprError::new(
            n.pos,
            "causal must be true, false, 'top_left' or 'bottom_right'",
        )),
    }
}
