//! Fuzzing of the expression language: arbitrary strings and token soups (the
//! language's names, functions, keywords, numbers, brackets and operators in random
//! order) go through `Expr::parse`, `Expr::bind` over a few inputs of different shapes
//! and dtypes, and, when they bind, evaluation on the `interp` and `cpu` backends.
//! Property: every step returns (`Ok` or `Err`) within the case's time budget; none
//! panics, hangs or aborts. `NDFUSE_FUZZ_CASES` raises the case count (see
//! `fuzz_support`).

mod fuzz_support;

use fuzz_support::{check, config};
use ndfuse::{BackendKind, Context, Expr, Tensor};
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

const BUDGET: Duration = Duration::from_secs(20);

/// The language's tokens, weighted toward ones that make expressions parse.
const TOKENS: &[&str] = &[
    "x",
    "x",
    "y",
    "m",
    "b",
    "s",
    "k",
    "nope",
    "X",
    "_",
    "(",
    "(",
    ")",
    ")",
    "[",
    "]",
    ",",
    ",",
    ":",
    "=",
    "+",
    "-",
    "*",
    "/",
    "**",
    "@",
    "@",
    "<",
    "<=",
    ">",
    ">=",
    "==",
    "!=",
    "//",
    "%",
    "&",
    "|",
    "~",
    ".",
    "...",
    "0",
    "1",
    "2",
    "-1",
    "3",
    "7",
    "0.5",
    "1e308",
    "1e400",
    "-0.0",
    ".5",
    "1e",
    "1.",
    "0x10",
    "99999999999999999999",
    "9223372036854775807",
    "nan",
    "inf",
    "true",
    "False",
    "None",
    "axis",
    "axis=",
    "axes=",
    "keepdims=",
    "dtype=",
    "eps=",
    "shape=",
    "exp(",
    "log(",
    "sqrt(",
    "tanh(",
    "relu(",
    "gelu(",
    "abs(",
    "round(",
    "not(",
    "sum(",
    "mean(",
    "max(",
    "min(",
    "prod(",
    "var(",
    "std(",
    "argmax(",
    "argmin(",
    "where(",
    "cast(",
    "astype(",
    "reshape(",
    "transpose(",
    "permute(",
    "broadcast_to(",
    "expand_dims(",
    "squeeze(",
    "softmax(",
    "log_softmax(",
    "layernorm(",
    "matmul(",
    "maximum(",
    "minimum(",
    "pow(",
    "and(",
    "or(",
    "equal(",
    "less(",
    "divide(",
    "f16",
    "bf16",
    "f32",
    "f64",
    "i32",
    "i64",
    "bool",
    "float32",
    "int64",
    "é",
    "\u{0}",
    " ",
    "\t",
];

/// Two contexts sharing nothing but the process: the reference and the JIT.
fn contexts() -> &'static (Context, Context) {
    static CTX: OnceLock<(Context, Context)> = OnceLock::new();
    CTX.get_or_init(|| {
        let interp = Context::builder()
            .backend(BackendKind::Interp)
            .build()
            .expect("interp context");
        let cpu = Context::builder()
            .backend(BackendKind::Cpu)
            .build()
            .expect("cpu context");
        (interp, cpu)
    })
}

/// Inputs of several ranks and dtypes: x f32[3,4], y f32[4], m f64[4,3], b bool[3,4],
/// s f32[] (0-d), k i64[2,3,4].
fn inputs(ctx: &Context) -> Vec<(&'static str, Tensor)> {
    let f = |n: usize| (0..n).map(|i| i as f32 * 0.37 - 1.1).collect::<Vec<f32>>();
    vec![
        ("x", ctx.from_vec(f(12), &[3, 4]).expect("x")),
        ("y", ctx.from_vec(f(4), &[4]).expect("y")),
        (
            "m",
            ctx.from_vec((0..12).map(|i| f64::from(i) - 5.5).collect(), &[4, 3])
                .expect("m"),
        ),
        (
            "b",
            ctx.from_vec((0..12).map(|i| i % 3 == 0).collect::<Vec<bool>>(), &[3, 4])
                .expect("b"),
        ),
        ("s", ctx.from_vec(vec![2.5f32], &[]).expect("s")),
        (
            "k",
            ctx.from_vec((0..24i64).map(|i| i - 12).collect(), &[2, 3, 4])
                .expect("k"),
        ),
    ]
}

/// Parses, binds and (when it binds) evaluates `text` on both backends; the results
/// are not compared (random expressions overflow, divide by zero and take logs of
/// negatives: the differential checks live in fuzz_graphs.rs).
fn exercise(text: &str) -> &'static str {
    let Ok(expr) = Expr::parse(text) else {
        return "parse error";
    };
    // Display and re-parse of what parsed must agree.
    assert_eq!(
        Expr::parse(&expr.to_string()).ok().as_ref(),
        Some(&expr),
        "re-parse of {text:?}"
    );
    let (interp, cpu) = contexts();
    let mut outcome = "bind error";
    for ctx in [interp, cpu] {
        let named = inputs(ctx);
        let pairs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (*n, t)).collect();
        let Ok(t) = expr.bind(ctx, &pairs) else {
            continue;
        };
        // Shape and dtype are known (or an error) before anything runs.
        let _ = (t.shape().map(<[usize]>::to_vec), t.dtype());
        outcome = match t.eval() {
            Ok(a) => {
                assert_eq!(
                    a.len(),
                    a.shape().iter().product::<usize>(),
                    "a result's length is its shape's product"
                );
                "evaluated"
            }
            Err(_) => "eval error",
        };
    }
    outcome
}

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..24).prop_map(|t| t.concat())
}

fn spaced_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..24).prop_map(|t| t.join(" "))
}

/// Well-formed calls with random (possibly wrong) arguments: these get past the parser
/// and exercise the lowering's argument checks.
fn calls() -> impl Strategy<Value = String> {
    let operand = prop::sample::select(vec!["x", "y", "m", "b", "s", "k", "x @ m", "1", "-2.5"]);
    let func = prop::sample::select(vec![
        "sum",
        "mean",
        "max",
        "argmax",
        "softmax",
        "log_softmax",
        "layernorm",
        "squeeze",
        "expand_dims",
        "transpose",
        "reshape",
        "broadcast_to",
        "cast",
        "where",
        "matmul",
        "var",
        "prod",
        "exp",
    ]);
    let arg = prop::sample::select(vec![
        "0",
        "1",
        "-1",
        "2",
        "-3",
        "5",
        "(0, 1)",
        "[1, 0]",
        "[-1]",
        "[3, 4]",
        "[12]",
        "[2, -1]",
        "[0]",
        "[]",
        "f16",
        "i32",
        "bool",
        "true",
        "None",
        "1e-5",
        "axis=1",
        "axis=-4",
        "keepdims=true",
        "dtype=f64",
        "eps=0",
        "axis=(0, 0)",
        "x",
        "y",
    ]);
    (func, operand, prop::collection::vec(arg, 0..4)).prop_map(|(f, o, a)| {
        let mut args = vec![o.to_string()];
        args.extend(a.iter().map(|s| s.to_string()));
        format!("{f}({})", args.join(", "))
    })
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn arbitrary_strings_never_crash(text in any::<String>()) {
        let t = text.clone();
        check(&text, BUDGET, move || exercise(&t))?;
    }

    #[test]
    fn token_soups_never_crash(text in prop_oneof![soup(), spaced_soup(), calls()]) {
        let t = text.clone();
        check(&text, BUDGET, move || exercise(&t))?;
    }

    #[test]
    fn nested_calls_never_crash(
        inner in calls(),
        wraps in prop::collection::vec(prop::sample::select(TOKENS), 0..2),
        depth in 0usize..130,
    ) {
        // Deep nesting around a real call, across the 100-level limit.
        let text = format!(
            "{}{}{inner}{}",
            wraps.concat(),
            "exp(".repeat(depth),
            ")".repeat(depth)
        );
        let t = text.clone();
        check(&text, BUDGET, move || exercise(&t))?;
    }

    #[test]
    fn combined_calls_never_crash(
        a in calls(),
        b in calls(),
        op in prop::sample::select(vec!["+", "*", "@", "<", "-", "**", "/"]),
        wrap in prop::sample::select(vec!["", "sum", "softmax", "transpose", "exp", "argmin"]),
    ) {
        let text = format!("{wrap}(({a}) {op} {b})");
        let t = text.clone();
        check(&text, BUDGET, move || exercise(&t))?;
    }
}
