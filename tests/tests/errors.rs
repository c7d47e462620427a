//! Every mistake a user can make returns an `Err` (never a panic) whose message names
//! the shapes or dtypes involved and the user's own call site.

use ndfuse::{Context, DType, Error, SliceArg, Tensor};

fn f32s(ctx: &Context, shape: &[usize]) -> Tensor {
    ctx.from_vec(vec![1.0f32; shape.iter().product()], shape)
        .expect("count matches")
}

/// Evaluates `t`, expects an error, and checks its message contains every `needle` and
/// the call site `file:line`.
fn expect_err(t: &Tensor, line: u32, needles: &[&str]) -> String {
    let err = t.eval().expect_err("this expression is invalid");
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} lacks {n:?}");
    }
    let site = format!("{}:{line}:", file!());
    assert!(
        msg.contains(&site),
        "message {msg:?} lacks the call site {site:?}"
    );
    // The same error is visible before eval, through shape() and error().
    assert!(t.shape().is_err() && t.error().is_some());
    msg
}

#[test]
fn shapes_that_do_not_broadcast() {
    let c = Context::new();
    let (a, b) = (f32s(&c, &[4, 8]), f32s(&c, &[3]));
    let (y, line) = (&a + &b, line!());
    let msg = expect_err(&y, line, &["add", "f32[4,8]", "f32[3]", "do not broadcast"]);
    assert!(matches!(y.error(), Some(Error::Op { .. })), "{msg}");
    let (y, line) = (a.maximum(f32s(&c, &[2, 8])), line!());
    expect_err(&y, line, &["max", "f32[4,8]", "f32[2,8]"]);
}

#[test]
fn the_first_error_travels_with_its_call_site() {
    let c = Context::new();
    let (a, b) = (f32s(&c, &[4, 8]), f32s(&c, &[5]));
    let (bad, line) = (&a * &b, line!());
    let later = (bad.exp() + 1.0).sum(0).softmax(-1);
    expect_err(&later, line, &["mul", "f32[4,8]", "f32[5]"]);
    // Evaluating several outputs fails on the poisoned one, without running anything.
    let err = c.eval(&[&a, &later]).expect_err("one output is invalid");
    assert!(err.to_string().contains("mul"), "{err}");
}

#[test]
fn axes_out_of_range_and_repeated() {
    let c = Context::new();
    let a = f32s(&c, &[2, 3]);
    let (y, line) = (a.sum(5), line!());
    expect_err(&y, line, &["sum", "axis 5", "f32[2,3]", "rank 2"]);
    let (y, line) = (a.mean(-3), line!());
    expect_err(&y, line, &["mean", "axis -3"]);
    let (y, line) = (a.max([0, -2]), line!());
    expect_err(&y, line, &["reduce_max", "axis 0", "more than once"]);
    let (y, line) = (a.argmax(2), line!());
    expect_err(&y, line, &["argmax", "axis 2"]);
    let (y, line) = (a.softmax(7), line!());
    expect_err(&y, line, &["axis 7", "f32[2,3]"]);
    let (y, line) = (a.expand_dims(4), line!());
    expect_err(&y, line, &["expand_dims", "axis 4"]);
}

#[test]
fn bool_arithmetic_and_other_bad_dtypes() {
    let c = Context::new();
    let a = f32s(&c, &[3]);
    let mask = a.gt(0.0);
    let (y, line) = (&mask + 1, line!());
    expect_err(&y, line, &["add", "bool[3]", "cast it to a number first"]);
    let (y, line) = (mask.exp(), line!());
    expect_err(&y, line, &["exp", "bool[3]"]);
    let (y, line) = (a.and(&a), line!());
    expect_err(&y, line, &["and", "f32[3]", "bool"]);
    let (y, line) = (a.where_(1.0, 0.0), line!());
    expect_err(&y, line, &["where", "f32[3]", "condition must be bool"]);
    let (y, line) = (mask.sum(..), line!());
    expect_err(&y, line, &["sum", "bool[3]"]);
    let (y, line) = (a.logical_not(), line!());
    expect_err(&y, line, &["not", "f32[3]"]);
}

#[test]
fn wrong_element_count_in_constructors() {
    let c = Context::new();
    let line = line!() + 1;
    let err = c.from_vec(vec![1.0f32; 5], &[2, 3]).expect_err("5 != 6");
    let msg = err.to_string();
    assert!(
        msg.contains("5 elements") && msg.contains("[2,3]") && msg.contains("holds 6"),
        "{msg}"
    );
    assert!(msg.contains(&format!("{}:{line}:", file!())), "{msg}");
    let err = Tensor::from_vec(vec![1i64; 3], &[4]).expect_err("3 != 4");
    assert!(
        matches!(
            err,
            Error::ElementCount {
                count: 3,
                expected: 4,
                ..
            }
        ),
        "{err}"
    );
    let err = c.arange(0.0, 1.0, 0.0).expect_err("zero step");
    assert!(err.to_string().contains("non-zero step"), "{err}");
    let err = c
        .set_default_dtype(DType::I32)
        .expect_err("ints are no default");
    assert!(
        err.to_string().contains("i32 is not a float dtype"),
        "{err}"
    );
    let err = Context::builder()
        .dtype(DType::Bool)
        .build()
        .expect_err("bool is no default");
    assert!(err.to_string().contains("bool"), "{err}");
}

#[test]
fn views_with_bad_arguments() {
    let c = Context::new();
    let a = f32s(&c, &[4, 6]);
    let (y, line) = (a.reshape(&[5, 5]), line!());
    expect_err(&y, line, &["reshape", "f32[4,6]", "24 elements", "[5,5]"]);
    let (y, line) = (a.reshape(&[-1, -1]), line!());
    expect_err(&y, line, &["at most one dim may be -1"]);
    let (y, line) = (a.reshape(&[7, -1]), line!());
    expect_err(&y, line, &["-1 dim cannot be inferred"]);
    let (y, line) = (a.permute(&[0, 0]), line!());
    expect_err(&y, line, &["permute", "[0,0]", "f32[4,6]"]);
    let (y, line) = (a.slice(&[SliceArg::all().step(0)]), line!());
    expect_err(&y, line, &["slice", "step 0 on axis 0"]);
    let all = SliceArg::all();
    let (y, line) = (a.slice(&[all, all, all]), line!());
    expect_err(&y, line, &["3 slices given for 2 axes"]);
    let (y, line) = (a.broadcast_to(&[4, 5]), line!());
    expect_err(&y, line, &["broadcast_to", "f32[4,6]", "[4,5]"]);
    let (y, line) = (a.squeeze(&[1]), line!());
    expect_err(&y, line, &["squeeze", "axis 1", "extent 6"]);
}

#[test]
fn reductions_without_identity_over_nothing() {
    let c = Context::new();
    let e = c
        .from_vec(Vec::<f32>::new(), &[0, 3])
        .expect("empty is fine");
    let (y, line) = (e.max(0), line!());
    expect_err(&y, line, &["reduce_max", "f32[0,3]", "zero-size"]);
    let (y, line) = (e.argmin(0), line!());
    expect_err(&y, line, &["argmin", "zero-size"]);
    // Reducing the other axis is fine: the result itself is empty (numpy agrees).
    assert_eq!(e.max(1).eval().expect("empty result").shape(), &[0]);
    assert_eq!(
        e.sum(0)
            .eval()
            .expect("sum has identity")
            .to_vec::<f32>()
            .expect("f32"),
        vec![0.0; 3]
    );
}

#[test]
fn reading_results_as_the_wrong_type() {
    let c = Context::new();
    let out = f32s(&c, &[2]).eval().expect("valid");
    let err = out.to_vec::<f64>().expect_err("f32 is not f64");
    assert_eq!(
        err.to_string(),
        "to_vec::<f64>() on an array of f32 (cast the tensor before eval)"
    );
    assert!(out.as_slice::<half::f16>().is_err());
}

/// An output whose size the user chose beyond the address space (a broadcast of one
/// element to 2^60 f64s) is `Error::OutOfMemory` on every host backend (issue 18), never
/// an abort: the interpreter refuses the step, the CPU runtime its buffer.
#[test]
fn an_output_beyond_the_address_space_is_out_of_memory() {
    let ctx = Context::new();
    let x = ctx.from_vec(vec![2.0f64], &[1, 1, 1]).expect("x");
    let huge = (&x.broadcast_to(&[1 << 20, 1 << 20, 1 << 20]) + 1.0).exp();
    for backend in [ndfuse::BackendKind::Interp, ndfuse::BackendKind::Cpu] {
        ctx.set_backend(backend);
        let e = huge.eval().expect_err("too large");
        assert!(matches!(e, Error::OutOfMemory { .. }), "{backend:?}: {e:?}");
        assert!(
            e.to_string().starts_with("out of memory: "),
            "{backend:?}: {e}"
        );
    }
    // The context still evaluates afterwards; an input returned as an output (twice)
    // is copied into buffers of the runtime.
    let outs = ctx.eval(&[&x, &x]).expect("copies");
    for o in &outs {
        assert_eq!(o.to_vec::<f64>().expect("f64"), [2.0]);
    }
    assert_eq!(
        x.exp().eval().expect("small").to_vec::<f64>().expect("f64"),
        [2f64.exp()]
    );
}
