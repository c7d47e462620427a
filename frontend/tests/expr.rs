//! The expression language as a library feature: `Context::evaluate`, parse once and
//! bind many times, and errors that name the column (the CLI's own tests check that
//! its results equal these).

use ndfuse::{Context, Error, Expr, Tensor};

fn ctx_x() -> (Context, Tensor) {
    let ctx = Context::new();
    let x = ctx
        .from_vec(vec![1.0f32, -2.0, 3.0, 0.5, 4.0, -1.0], &[2, 3])
        .unwrap();
    (ctx, x)
}

#[test]
fn evaluate_equals_the_same_expression_built_in_rust() {
    let (ctx, x) = ctx_x();
    let got = ctx
        .evaluate("sum(exp(x) * 2 + 1, axis=1)", &[("x", &x)])
        .unwrap();
    let want = ((x.exp() * 2.0) + 1.0).sum(1).eval().unwrap();
    assert_eq!(got, want);
    let got = ctx.evaluate("softmax(x, axis=-1)", &[("x", &x)]).unwrap();
    assert_eq!(got, x.softmax(-1).eval().unwrap());
}

#[test]
fn a_parsed_expression_binds_to_different_inputs_and_stays_lazy() {
    let (ctx, x) = ctx_x();
    let e: Expr = "maximum(x, y) - x".parse().unwrap();
    assert_eq!(e.text(), "maximum(x, y) - x");
    let y1 = ctx.zeros(&[3]);
    let y2 = ctx.full(&[2, 3], 10.0);
    let a = e.bind(&ctx, &[("x", &x), ("y", &y1)]).unwrap();
    let b = e.bind(&ctx, &[("y", &y2), ("x", &x)]).unwrap();
    assert_eq!(a.shape().unwrap(), &[2, 3]);
    assert_eq!(
        a.eval().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 2.0, 0.0, 0.0, 0.0, 1.0]
    );
    assert_eq!(
        b.eval().unwrap().to_vec::<f32>().unwrap(),
        vec![9.0, 12.0, 7.0, 9.5, 6.0, 11.0]
    );
    let bound = e
        .bind_named(
            &ctx,
            &[("y".to_string(), y1), ("x".to_string(), x)].into(),
            "inputs",
        )
        .unwrap();
    assert_eq!(
        bound.used,
        vec!["x", "y"],
        "in the order the text names them"
    );
}

fn expr_err(e: Error) -> (usize, String) {
    match e {
        Error::Expr { column, message } => (column, message),
        other => panic!("not an expression error: {other}"),
    }
}

#[test]
fn errors_name_the_column_and_the_shapes() {
    let (ctx, x) = ctx_x();
    let y = ctx.zeros(&[4]);
    let (col, msg) = expr_err(ctx.evaluate("x + y", &[("x", &x), ("y", &y)]).unwrap_err());
    assert_eq!(col, 3);
    assert!(msg.contains("f32[2,3]") && msg.contains("f32[4]"), "{msg}");
    assert!(!msg.contains(".rs:"), "no Rust call site in {msg}");

    let (col, msg) = expr_err(Expr::parse("exp(x))").unwrap_err());
    assert_eq!(
        (col, msg.as_str()),
        (7, "unexpected ')' after a complete expression")
    );

    let (col, msg) = expr_err(ctx.evaluate("x * q", &[("x", &x)]).unwrap_err());
    assert_eq!(col, 5);
    assert!(msg.starts_with("unknown input 'q'"), "{msg}");

    let (col, msg) = expr_err(ctx.evaluate("sum(x, axis=2)", &[("x", &x)]).unwrap_err());
    assert_eq!(col, 1);
    assert!(msg.contains("axis 2 is out of range"), "{msg}");

    let (col, msg) = expr_err(ctx.evaluate("expp(x)", &[("x", &x)]).unwrap_err());
    assert_eq!(col, 1);
    assert!(msg.contains("did you mean 'exp'"), "{msg}");

    let err = ctx.evaluate("x", &[("x", &x), ("x", &x)]).unwrap_err();
    assert!(err.to_string().contains("given more than once"), "{err}");
    assert!(ctx
        .evaluate("x +", &[("x", &x)])
        .unwrap_err()
        .to_string()
        .starts_with("at column "));
}

#[test]
fn matmul_errors_name_the_column_of_the_at_sign() {
    let (ctx, x) = ctx_x();
    let s = ctx.scalar(2.0);
    let m = x.gt(0.0);
    let b = ctx.zeros(&[2, 3, 4]);
    let c = ctx.zeros(&[3, 4, 2]);
    let ins = [("x", &x), ("s", &s), ("m", &m), ("b", &b), ("c", &c)];
    let cases: &[(&str, usize, &str)] = &[
        ("x @ x", 3, "matmul: f32[2,3] @ f32[2,3]: 3 != 2"),
        ("exp(x) + x @ x", 12, "matmul: f32[2,3] @ f32[2,3]: 3 != 2"),
        ("matmul(x, x)", 1, "matmul: f32[2,3] @ f32[2,3]: 3 != 2"),
        ("x @ s", 3, "matmul: f32[] is not allowed"),
        ("m @ transpose(x)", 3, "matmul: bool[2,3] is not allowed"),
        ("b @ c", 3, "f32[2,3,4] and f32[3,4,2] do not broadcast"),
        ("b @ x", 3, "f32[2,3,4] @ f32[2,3]: 4 != 2"),
        (
            "2 @ x",
            3,
            "matmul: a literal has no matrix product (multiply with * to scale)",
        ),
        ("x @ 1.5", 3, "a literal has no matrix product"),
    ];
    for (expr, col, want) in cases {
        let (c, msg) = expr_err(ctx.evaluate(expr, &ins).unwrap_err());
        assert_eq!(c, *col, "{expr}: {msg}");
        assert!(msg.contains(want), "{expr}: {msg:?} lacks {want:?}");
        assert!(!msg.contains(".rs:"), "{expr}: no Rust call site in {msg}");
    }
}

/// `@` is at `*`'s level and left-associative (Python's rule): each expression equals
/// the Rust API's grouping bit for bit on the cpu backend, and differs from the other
/// grouping (so that a wrong precedence would fail).
#[test]
fn matmul_precedence_and_associativity() {
    let ctx = Context::new();
    ctx.set_backend(ndfuse::BackendKind::Cpu);
    let [a, b, c] = [1, 2, 3].map(|seed| ctx.rand_uniform(&[4, 4], -1.0, 1.0, seed));
    let ins = [("a", &a), ("b", &b), ("c", &c)];
    let cases = [
        ("a @ b * c", a.matmul(&b) * &c, a.matmul(&(&b * &c))),
        ("a * b @ c", (&a * &b).matmul(&c), &a * &b.matmul(&c)),
        ("a + b @ c", &a + &b.matmul(&c), (&a + &b).matmul(&c)),
        ("a @ b - c", a.matmul(&b) - &c, a.matmul(&(&b - &c))),
        (
            "a @ b @ c",
            a.matmul(&b).matmul(&c),
            a.matmul(&b.matmul(&c)),
        ),
        ("a @ b / 2", a.matmul(&b) / 2.0, a.matmul(&(&b / 2.0))),
        ("-a @ b", (-&a).matmul(&b), -&a.matmul(&b)),
        ("a @ b ** 2", a.matmul(&b.pow(2.0)), a.matmul(&b).pow(2.0)),
    ];
    for (expr, right, wrong) in cases {
        let got = ctx.evaluate(expr, &ins).unwrap();
        let (right, wrong) = (right.eval().unwrap(), wrong.eval().unwrap());
        assert_eq!(got, right, "{expr}");
        // `a @ b / 2` and `a @ (b / 2)` are the same bits (a halving is exact), and
        // `-a @ b` / `-(a @ b)` too: those only check the parse gives the right value.
        if !["a @ b / 2", "-a @ b"].contains(&expr) {
            assert_ne!(got, wrong, "{expr}: the other grouping gives the same bits");
        }
    }
}

#[test]
fn nesting_deeper_than_the_limit_is_an_error_at_a_column() {
    // 100,000 levels, parsed on a test thread (2 MiB of stack): the depth limit, not the
    // stack, ends it (issue 18).
    let n = 100_000;
    let deep = format!("{}x{}", "exp(".repeat(n), ")".repeat(n));
    match Expr::parse(&deep) {
        Err(Error::Expr { column, message }) => {
            assert_eq!(
                (column, message.as_str()),
                (401, "expression nested deeper than 100 levels")
            );
        }
        other => panic!("expected the depth error, got {other:?}"),
    }
    let chain = format!("x{}", "*1".repeat(n));
    assert!(Expr::parse(&chain).is_err_and(|e| e.to_string().contains("nested deeper")));
}
