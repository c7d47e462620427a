//! The indexing family of the user API and of the expression language: take,
//! take_along_axis, index_add, concat, stack, pad, cumsum/cumprod, arange, one_hot,
//! tril/triu, sort/argsort/top_k. Values are numpy's, worked out by hand (no Python at
//! test time), checked on the default backend and on the interpreter; every user
//! mistake is an `Err` naming the shapes, the axis and the call site.

use ndfuse::{concat, stack, BackendKind, Context, DType, Error, PadMode, Tensor};

/// The default backend and the reference interpreter.
fn contexts() -> Vec<(BackendKind, Context)> {
    [BackendKind::Auto, BackendKind::Interp]
        .into_iter()
        .map(|b| {
            let ctx = Context::new();
            ctx.set_backend(b);
            (b, ctx)
        })
        .collect()
}

fn f32s(ctx: &Context, v: &[f32], shape: &[usize]) -> Tensor {
    ctx.from_slice(v, shape).unwrap()
}

fn i64s(ctx: &Context, v: &[i64], shape: &[usize]) -> Tensor {
    ctx.from_slice(v, shape).unwrap()
}

/// Shape and f32 values of `t`, evaluated.
fn ev_f32(t: &Tensor) -> (Vec<usize>, Vec<f32>) {
    let a = t.eval().unwrap_or_else(|e| panic!("{e}"));
    (a.shape().to_vec(), a.to_vec::<f32>().unwrap())
}

/// Shape and i64 values of `t`, evaluated.
fn ev_i64(t: &Tensor) -> (Vec<usize>, Vec<i64>) {
    let a = t.eval().unwrap_or_else(|e| panic!("{e}"));
    (a.shape().to_vec(), a.to_vec::<i64>().unwrap())
}

/// The error `t` carries (from building or from evaluating), as text.
fn err(t: &Tensor) -> String {
    t.eval().expect_err("should fail").to_string()
}

/// `msg` names every one of `parts` and this file as the call site.
fn names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} lacks {p:?}");
    }
    assert!(msg.contains("index_ops.rs"), "no call site in {msg:?}");
}

#[test]
fn take_follows_numpy() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[10., 11., 12., 20., 21., 22.], &[2, 3]);
        let idx = i64s(&ctx, &[2, 0, -1], &[3]);
        let want = (vec![2, 3], vec![12., 10., 12., 22., 20., 22.]);
        assert_eq!(ev_f32(&x.take(&idx, 1)), want, "{b:?}");
        assert_eq!(ev_f32(&x.take(&idx, -1)), want, "{b:?} negative axis");
        // A 2-D i32 index along axis 0: shape idx.shape ++ x.shape[1..].
        let idx2 = ctx.from_slice(&[1i32, 0, 1, -2], &[2, 2]).unwrap();
        assert_eq!(
            ev_f32(&x.take(&idx2, 0)),
            (
                vec![2, 2, 3],
                vec![20., 21., 22., 10., 11., 12., 20., 21., 22., 10., 11., 12.]
            ),
            "{b:?}"
        );
        // A 2-D index in the middle of a 3-D x.
        let x3 = f32s(
            &ctx,
            &(0..12).map(|v| v as f32).collect::<Vec<_>>(),
            &[2, 3, 2],
        );
        let idx3 = i64s(&ctx, &[2, 0], &[2, 1]);
        assert_eq!(
            ev_f32(&x3.take(&idx3, 1)),
            (vec![2, 2, 1, 2], vec![4., 5., 0., 1., 10., 11., 6., 7.]),
            "{b:?}"
        );
        // A 0-d index removes the axis.
        let last = i64s(&ctx, &[-1], &[]);
        assert_eq!(
            ev_f32(&x.take(&last, 1)),
            (vec![2], vec![12., 22.]),
            "{b:?}"
        );
        // An empty index gives an empty axis.
        let none = i64s(&ctx, &[], &[0]);
        assert_eq!(ev_f32(&x.take(&none, 1)), (vec![2, 0], vec![]), "{b:?}");
        // A size-1 axis read many times.
        let row = f32s(&ctx, &[1., 2., 3.], &[1, 3]);
        let zeros = i64s(&ctx, &[0, -1, 0], &[3]);
        assert_eq!(
            ev_f32(&row.take(&zeros, 0)),
            (vec![3, 3], vec![1., 2., 3., 1., 2., 3., 1., 2., 3.]),
            "{b:?}"
        );
        // Out of range: an error of the evaluation naming the index and the axis.
        let bad = i64s(&ctx, &[0, 3], &[2]);
        let msg = err(&x.take(&bad, 1));
        assert!(
            msg.contains("index 3 is out of range") && msg.contains("extent 3"),
            "{b:?}: {msg}"
        );
        let msg = err(&x.take(&i64s(&ctx, &[-4], &[1]), 1));
        assert!(msg.contains("index -4 is out of range"), "{b:?}: {msg}");
    }
}

#[test]
fn take_along_axis_follows_numpy_with_broadcasting() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[10., 30., 20., 60., 40., 50.], &[2, 3]);
        let order = i64s(&ctx, &[0, 2, 1, 1, 2, 0], &[2, 3]);
        assert_eq!(
            ev_f32(&x.take_along_axis(&order, 1)),
            (vec![2, 3], vec![10., 20., 30., 40., 50., 60.]),
            "{b:?}"
        );
        // idx [1, 2] broadcasts over the rows of x.
        let idx = i64s(&ctx, &[2, 0], &[1, 2]);
        assert_eq!(
            ev_f32(&x.take_along_axis(&idx, -1)),
            (vec![2, 2], vec![20., 10., 50., 60.]),
            "{b:?}"
        );
        // x [2, 1] broadcasts over the rows of idx [1, 3] on the other axis.
        let col = f32s(&ctx, &[1., 2.], &[2, 1]);
        let idx = i64s(&ctx, &[0, 0, -1], &[1, 3]);
        assert_eq!(
            ev_f32(&col.take_along_axis(&idx, 1)),
            (vec![2, 3], vec![1., 1., 1., 2., 2., 2.]),
            "{b:?}"
        );
        let sq = f32s(&ctx, &[1., 2., 3., 4.], &[2, 2]);
        let idx = ctx.from_slice(&[1i32, 0], &[1, 2]).unwrap();
        assert_eq!(
            ev_f32(&sq.take_along_axis(&idx, 0)),
            (vec![1, 2], vec![3., 2.]),
            "{b:?}"
        );
        let empty = i64s(&ctx, &[], &[2, 0]);
        assert_eq!(ev_f32(&x.take_along_axis(&empty, 1)), (vec![2, 0], vec![]));
    }
}

/// An index of positions (an iota) reaching past the axis is an error of the
/// evaluation, as an index of data is, never a panic of the compiler.
#[test]
fn an_out_of_range_iota_index_is_an_error_not_a_panic() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[1., 2., 3.], &[3]);
        let msg = err(&x.take(&ctx.arange_n(4), 0));
        assert!(msg.contains("index 3 is out of range"), "{b:?}: {msg}");
    }
}

#[test]
fn index_add_accumulates_duplicates_and_wraps_negatives() {
    for (b, ctx) in contexts() {
        let x = ctx.zeros(&[3, 2]);
        let idx = i64s(&ctx, &[0, 2, 0, -1], &[4]);
        let v = f32s(&ctx, &[1., 2., 3., 4., 5., 6., 7., 8.], &[4, 2]);
        assert_eq!(
            ev_f32(&x.index_add(&idx, &v, 0)),
            (vec![3, 2], vec![6., 8., 0., 0., 10., 12.]),
            "{b:?}"
        );
        let ones = ctx.ones(&[2, 3]);
        let idx = ctx.from_slice(&[2i32, 2], &[2]).unwrap();
        let v = f32s(&ctx, &[1., 2., 3., 4.], &[2, 2]);
        assert_eq!(
            ev_f32(&ones.index_add(&idx, &v, -1)),
            (vec![2, 3], vec![1., 1., 4., 1., 1., 8.]),
            "{b:?}"
        );
        // No positions: x unchanged.
        let none = i64s(&ctx, &[], &[0]);
        let v0 = ctx.zeros(&[0, 2]);
        let base = f32s(&ctx, &[1., 2., 3., 4., 5., 6.], &[3, 2]);
        assert_eq!(
            ev_f32(&base.index_add(&none, &v0, 0)),
            (vec![3, 2], vec![1., 2., 3., 4., 5., 6.]),
            "{b:?}"
        );
        // An i32 v into i64 x is cast; integers add exactly.
        let xi = i64s(&ctx, &[100, 200], &[2]);
        let vi = ctx.from_slice(&[1i32, 2, 3], &[3]).unwrap();
        let ii = i64s(&ctx, &[1, 1, 0], &[3]);
        assert_eq!(
            ev_i64(&xi.index_add(&ii, &vi, 0)),
            (vec![2], vec![103, 203])
        );
        // Out of range is an evaluation error.
        let msg = err(&xi.index_add(&i64s(&ctx, &[2, 0, 0], &[3]), &vi, 0));
        assert!(msg.contains("index 2 is out of range"), "{b:?}: {msg}");
    }
}

#[test]
fn concat_and_stack_follow_numpy() {
    for (b, ctx) in contexts() {
        let a = f32s(&ctx, &[1., 2.], &[1, 2]);
        let m = f32s(&ctx, &[3., 4., 5., 6.], &[2, 2]);
        assert_eq!(
            ev_f32(&concat(&[&a, &m], 0)),
            (vec![3, 2], vec![1., 2., 3., 4., 5., 6.]),
            "{b:?}"
        );
        let c = f32s(&ctx, &[7., 8.], &[2, 1]);
        assert_eq!(
            ev_f32(&concat(&[&c, &m, &c], -1)),
            (vec![2, 4], vec![7., 3., 4., 7., 8., 5., 6., 8.]),
            "{b:?}"
        );
        // A size-0 part adds nothing; one part is itself.
        let empty = ctx.zeros(&[2, 0]);
        assert_eq!(ev_f32(&concat(&[&empty, &m], 1)), ev_f32(&m));
        assert_eq!(ev_f32(&concat(&[&m], 1)), ev_f32(&m));
        // Dtypes promote as arithmetic does: i32 with f32 is f64.
        let i = ctx.from_slice(&[1i32, 2], &[2]).unwrap();
        let f = f32s(&ctx, &[0.5], &[1]);
        let j = concat(&[&i, &f], 0);
        assert_eq!(j.dtype().unwrap(), DType::F64);
        assert_eq!(
            j.eval().unwrap().to_vec::<f64>().unwrap(),
            vec![1., 2., 0.5]
        );

        let p = f32s(&ctx, &[1., 2.], &[2]);
        let q = f32s(&ctx, &[3., 4.], &[2]);
        assert_eq!(
            ev_f32(&stack(&[&p, &q], 0)),
            (vec![2, 2], vec![1., 2., 3., 4.]),
            "{b:?}"
        );
        assert_eq!(
            ev_f32(&stack(&[&p, &q, &p], -1)),
            (vec![2, 3], vec![1., 3., 1., 2., 4., 2.]),
            "{b:?}"
        );
    }
}

#[test]
fn pad_follows_numpy_modes() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[1., 2., 3.], &[3]);
        let pad = |w, m, v| ev_f32(&x.pad(&[w], m, v)).1;
        assert_eq!(
            pad((2, 1), PadMode::Reflect, 0.),
            vec![3., 2., 1., 2., 3., 2.],
            "{b:?}"
        );
        assert_eq!(
            pad((1, 2), PadMode::Constant, 9.),
            vec![9., 1., 2., 3., 9., 9.],
            "{b:?}"
        );
        assert_eq!(pad((0, 0), PadMode::Reflect, 0.), vec![1., 2., 3.], "{b:?}");
        let m = f32s(&ctx, &[1., 2., 3., 4.], &[2, 2]);
        assert_eq!(
            ev_f32(&m.pad(&[(1, 0), (0, 1)], PadMode::Constant, 0.)),
            (vec![3, 3], vec![0., 0., 0., 1., 2., 0., 3., 4., 0.]),
            "{b:?}"
        );
        assert_eq!(
            ev_f32(&m.pad(&[(1, 1), (1, 0)], PadMode::Edge, 0.)),
            (
                vec![4, 3],
                vec![1., 1., 2., 1., 1., 2., 3., 3., 4., 3., 3., 4.]
            ),
            "{b:?}"
        );
        let i = i64s(&ctx, &[5, 6], &[2]);
        assert_eq!(
            ev_i64(&i.pad(&[(1, 1)], PadMode::Constant, -1.)),
            (vec![4], vec![-1, 5, 6, -1])
        );
        // A size-1 axis: reflect allows no width, edge repeats the one element.
        let one = f32s(&ctx, &[7.], &[1]);
        assert_eq!(
            ev_f32(&one.pad(&[(2, 1)], PadMode::Edge, 0.)).1,
            vec![7.; 4]
        );
    }
}

/// Edge padding repeats the edge element on both sides, also where the padded
/// coordinate is negative (a gather would wrap it; the edge rule clamps).
#[test]
fn pad_edge_repeats_the_edge_element() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[1., 2., 3.], &[3]);
        assert_eq!(
            ev_f32(&x.pad(&[(2, 1)], PadMode::Edge, 0.)).1,
            vec![1., 1., 1., 2., 3., 3.],
            "{b:?}"
        );
    }
}

#[test]
fn scans_follow_numpy() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
        assert_eq!(
            ev_f32(&x.cumsum(1)).1,
            vec![1., 3., 6., 4., 9., 15.],
            "{b:?}"
        );
        assert_eq!(
            ev_f32(&x.cumsum(-2)).1,
            vec![1., 2., 3., 5., 7., 9.],
            "{b:?}"
        );
        assert_eq!(
            ev_f32(&x.cumprod(1)).1,
            vec![1., 2., 6., 4., 20., 120.],
            "{b:?}"
        );
        let i = ctx.from_slice(&[1i32, -2, 3], &[3]).unwrap();
        assert_eq!(ev_i64(&i.cumsum(0)), (vec![3], vec![1, -1, 2]));
        assert_eq!(ev_i64(&i.cumprod(0)), (vec![3], vec![1, -2, -6]));
        assert_eq!(ev_f32(&ctx.zeros(&[2, 0]).cumsum(1)), (vec![2, 0], vec![]));
    }
}

#[test]
fn arange_one_hot_and_triangles() {
    for (b, ctx) in contexts() {
        let r = |s, e, st| ev_i64(&ctx.arange_i64(s, e, st).unwrap()).1;
        assert_eq!(r(0, 5, 1), vec![0, 1, 2, 3, 4], "{b:?}");
        assert_eq!(r(0, 10, 3), vec![0, 3, 6, 9]);
        assert_eq!(r(5, -2, -3), vec![5, 2, -1]);
        assert_eq!(r(3, 3, 1), Vec::<i64>::new());
        assert_eq!(r(1, 0, 1), Vec::<i64>::new());
        assert_eq!(ev_i64(&ctx.arange_n(4)), (vec![4], vec![0, 1, 2, 3]));
        let e = ctx.arange_i64(0, 5, 0).unwrap_err().to_string();
        names(&e, &["arange", "step"]);

        let idx = i64s(&ctx, &[2, 0, -1, 3], &[4]);
        let oh = idx.one_hot(3);
        assert_eq!(oh.dtype().unwrap(), ctx.default_dtype());
        assert_eq!(
            ev_f32(&oh),
            (
                vec![4, 3],
                vec![0., 0., 1., 1., 0., 0., 0., 0., 0., 0., 0., 0.]
            ),
            "{b:?}"
        );
        let x = f32s(
            &ctx,
            &(1..=12).map(|v| v as f32).collect::<Vec<_>>(),
            &[3, 4],
        );
        let z = 0.0;
        #[rustfmt::skip]
        let cases = [
            (x.tril(0), vec![1., z, z, z, 5., 6., z, z, 9., 10., 11., z]),
            (x.tril(-1), vec![z, z, z, z, 5., z, z, z, 9., 10., z, z]),
            (x.triu(1), vec![z, 2., 3., 4., z, z, 7., 8., z, z, z, 12.]),
            (x.triu(0), vec![1., 2., 3., 4., z, 6., 7., 8., z, z, 11., 12.]),
            (ndfuse::tril(&x, 5), (1..=12).map(|v| v as f32).collect()),
        ];
        for (k, (t, want)) in cases.into_iter().enumerate() {
            assert_eq!(ev_f32(&t), (vec![3, 4], want), "{b:?} case {k}");
        }
        let batch = f32s(&ctx, &[1., 2., 3., 4., 5., 6., 7., 8.], &[2, 2, 2]);
        assert_eq!(
            ev_f32(&batch.tril(0)).1,
            vec![1., 0., 3., 4., 5., 0., 7., 8.]
        );
        let mask = ctx.ones(&[2, 2]).gt(0.0).triu(1);
        assert_eq!(
            mask.eval().unwrap().to_vec::<bool>().unwrap(),
            vec![false, true, false, false]
        );
    }
}

#[test]
fn sorts_follow_numpy_with_nan() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[3., 1., f32::NAN, 2., 1.], &[5]);
        assert_eq!(ev_i64(&x.argsort(0)).1, vec![1, 4, 3, 0, 2], "{b:?}");
        let (_, s) = ev_f32(&x.sort(-1));
        assert_eq!(&s[..4], &[1., 1., 2., 3.], "{b:?}");
        assert!(s[4].is_nan());
        let (v, i) = x.top_k(3);
        let (_, v) = ev_f32(&v);
        assert!(v[0].is_nan() && v[1..] == [3., 2.], "{b:?}: {v:?}");
        assert_eq!(ev_i64(&i).1, vec![2, 0, 3]);
        let (_, i) = x.top_k(5);
        assert_eq!(ev_i64(&i).1, vec![2, 0, 3, 1, 4], "ties keep their order");

        let m = f32s(&ctx, &[3., 1., 2., 0., 5., 5.], &[2, 3]);
        assert_eq!(ev_i64(&m.argsort(0)).1, vec![1, 0, 0, 0, 1, 1], "{b:?}");
        assert_eq!(ev_i64(&m.argsort(-1)).1, vec![1, 2, 0, 0, 1, 2], "{b:?}");
        assert_eq!(ev_f32(&m.sort(0)).1, vec![0., 1., 2., 3., 5., 5.], "{b:?}");
        let (v, i) = m.top_k(2);
        assert_eq!(ev_f32(&v), (vec![2, 2], vec![3., 2., 5., 5.]), "{b:?}");
        assert_eq!(ev_i64(&i), (vec![2, 2], vec![0, 2, 1, 2]), "{b:?}");
        let (v, _) = m.top_k(0);
        assert_eq!(ev_f32(&v), (vec![2, 0], vec![]));
        let ints = i64s(&ctx, &[5, -1, 5, 0], &[4]);
        assert_eq!(ev_i64(&ints.sort(0)).1, vec![-1, 0, 5, 5]);
        assert_eq!(ev_i64(&ctx.zeros(&[0]).argsort(0)), (vec![0], vec![]));
    }
}

#[test]
fn every_mistake_is_an_error_naming_shapes_axis_and_call_site() {
    let ctx = Context::new();
    let x = f32s(&ctx, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let fidx = f32s(&ctx, &[0., 1.], &[2]);
    let bidx = fidx.gt(0.0);
    let idx = i64s(&ctx, &[0, 1], &[2]);

    // Float and bool indices.
    names(&err(&x.take(&fidx, 1)), &["take", "f32[2]", "integers"]);
    names(&err(&x.take(&bidx, 1)), &["take", "bool[2]", "integers"]);
    let f2 = f32s(&ctx, &[0., 1.], &[2, 1]);
    names(
        &err(&x.take_along_axis(&f2, 1)),
        &["take_along_axis", "f32[2,1]"],
    );
    names(&err(&x.index_add(&fidx, &x, 0)), &["index_add", "f32[2]"]);
    names(&err(&fidx.one_hot(3)), &["one_hot", "f32[2]", "integers"]);

    // Axes out of range.
    names(&err(&x.take(&idx, 2)), &["take", "axis 2", "f32[2,3]"]);
    names(&err(&x.cumsum(-3)), &["cumsum", "axis -3", "f32[2,3]"]);
    names(&err(&x.argsort(5)), &["argsort", "axis 5"]);
    names(&err(&concat(&[&x, &x], 2)), &["concat", "axis 2"]);
    names(&err(&stack(&[&x, &x], 3)), &["stack", "axis 3"]);

    // Shapes that do not agree.
    let y = ctx.zeros(&[3, 3]);
    names(
        &err(&concat(&[&x, &y], 1)),
        &["concat", "f32[2,3]", "f32[3,3]", "axis 1"],
    );
    names(&err(&concat(&[&x, &ctx.zeros(&[6])], 0)), &["f32[6]"]);
    names(
        &err(&stack(&[&x, &y], 0)),
        &["stack", "f32[2,3]", "f32[3,3]"],
    );
    let i3 = i64s(&ctx, &[0, 0, 0, 0, 0, 0], &[3, 2]);
    names(
        &err(&x.take_along_axis(&i3, 1)),
        &["take_along_axis", "f32[2,3]", "i64[3,2]", "axis 1"],
    );
    names(
        &err(&x.take_along_axis(&idx, 1)),
        &["take_along_axis", "i64[2]"],
    );
    let v = ctx.zeros(&[2, 4]);
    names(
        &err(&x.index_add(&idx, &v, 0)),
        &["index_add", "f32[2,3]", "f32[2,4]", "axis 0"],
    );
    let v3 = ctx.zeros(&[3, 3]);
    names(
        &err(&x.index_add(&idx, &v3, 0)),
        &["index_add", "i64[2]", "f32[3,3]", "axis 0"],
    );
    names(
        &err(&x.index_add(&i3, &v3, 0)),
        &["index_add", "i64[3,2]", "1-D"],
    );
    let vf = f32s(&ctx, &[1., 2.], &[2]);
    let xi = i64s(&ctx, &[0, 0], &[2]);
    names(
        &err(&xi.index_add(&idx, &vf, 0)),
        &["index_add", "i64[2]", "f32[2]"],
    );

    // Pad widths.
    names(
        &err(&x.pad(&[(0, 0), (3, 0)], PadMode::Reflect, 0.0)),
        &["pad", "reflect", "axis 1", "extent 3", "f32[2,3]"],
    );
    names(
        &err(&x.pad(&[(1, 1)], PadMode::Constant, 0.0)),
        &["pad", "1 pairs", "2 axes"],
    );
    names(
        &err(&ctx.zeros(&[0]).pad(&[(1, 0)], PadMode::Edge, 0.0)),
        &["pad", "empty"],
    );

    // k above the extent, and top_k of a 0-d tensor.
    let (v, i) = x.top_k(4);
    names(&err(&v), &["top_k", "k = 4", "3 positions", "f32[2,3]"]);
    names(&err(&i), &["top_k"]);
    names(&err(&ctx.scalar(1.0).top_k(1).0), &["top_k", "f32[]"]);

    // Empty lists, and triangles of fewer than 2 axes.
    names(&err(&concat(&[], 0)), &["concat", "empty"]);
    names(&err(&stack(&[], 0)), &["stack", "empty"]);
    names(&err(&vf.tril(0)), &["tril", "f32[2]", "2 axes"]);
    names(&err(&vf.triu(0)), &["triu", "f32[2]"]);

    // An op on an erroneous tensor carries the first error.
    let bad = x.take(&fidx, 1);
    names(&err(&bad.cumsum(0).sort(0)), &["take", "f32[2]"]);
    let r = ctx.arange_i64(0, 3, 0);
    assert!(matches!(r, Err(Error::Argument { what: "arange", .. })));
}

#[test]
fn expressions_match_the_api() {
    for (b, ctx) in contexts() {
        let x = f32s(&ctx, &[3., 1., 2., 0., 5., 4.], &[2, 3]);
        let idx = i64s(&ctx, &[2, 0, -1], &[3]);
        let ii = i64s(&ctx, &[1, 1], &[2]);
        let v = f32s(&ctx, &[1., 1., 1., 2., 2., 2.], &[2, 3]);
        let ins: &[(&str, &Tensor)] = &[("x", &x), ("idx", &idx), ("ii", &ii), ("v", &v)];
        let f = |e: &str| -> (Vec<usize>, Vec<f32>) {
            let a = ctx
                .evaluate(e, ins)
                .unwrap_or_else(|err| panic!("{e}: {err}"));
            (a.shape().to_vec(), a.to_vec::<f32>().unwrap())
        };
        let i = |e: &str| -> (Vec<usize>, Vec<i64>) {
            let a = ctx
                .evaluate(e, ins)
                .unwrap_or_else(|err| panic!("{e}: {err}"));
            (a.shape().to_vec(), a.to_vec::<i64>().unwrap())
        };
        assert_eq!(f("take(x, idx, axis=1)"), ev_f32(&x.take(&idx, 1)), "{b:?}");
        // No axis: numpy takes from the flattened array.
        assert_eq!(f("take(x, idx)"), (vec![3], vec![2., 3., 4.]));
        assert_eq!(
            f("take_along_axis(x, argsort(x, axis=1), axis=1)"),
            (vec![2, 3], vec![1., 2., 3., 0., 4., 5.])
        );
        assert_eq!(
            f("index_add(x, ii, v, axis=0)"),
            (vec![2, 3], vec![3., 1., 2., 3., 8., 7.])
        );
        assert_eq!(
            f("concat([x, x * 2], axis=1)"),
            ev_f32(&concat(&[&x, &(&x * 2.0)], 1))
        );
        assert_eq!(f("concatenate([x, x])").0, vec![4, 3]);
        assert_eq!(f("stack([x, x], axis=-1)").0, vec![2, 3, 2]);
        assert_eq!(
            f("pad(x, [[1, 0], [0, 2]], mode='constant', value=-1)"),
            ev_f32(&x.pad(&[(1, 0), (0, 2)], PadMode::Constant, -1.0))
        );
        assert_eq!(
            f("pad(x, [0, 1], mode=\"reflect\")"),
            ev_f32(&x.pad(&[(0, 1), (0, 1)], PadMode::Reflect, 0.0))
        );
        assert_eq!(f("pad(x, 1, mode='edge')").0, vec![4, 5]);
        assert_eq!(
            f("pad(x, [[0, 0], [1, 1]])").1,
            vec![0., 3., 1., 2., 0., 0., 0., 5., 4., 0.]
        );
        assert_eq!(f("cumsum(x, axis=1)").1, vec![3., 4., 6., 0., 5., 9.]);
        assert_eq!(f("cumsum(x)"), (vec![6], vec![3., 4., 6., 6., 11., 15.]));
        assert_eq!(f("cumprod(x, axis=0)").1, vec![3., 1., 2., 0., 5., 8.]);
        assert_eq!(i("arange(4)"), (vec![4], vec![0, 1, 2, 3]));
        assert_eq!(i("arange(5, -2, -3)").1, vec![5, 2, -1]);
        assert_eq!(i("arange(1, 3)").1, vec![1, 2]);
        assert_eq!(f("one_hot(idx, 3)").1, ev_f32(&idx.one_hot(3)).1);
        assert_eq!(f("one_hot(arange(2), 2)").1, vec![1., 0., 0., 1.]);
        assert_eq!(f("tril(x)").1, vec![3., 0., 0., 0., 5., 0.]);
        assert_eq!(f("triu(x, k=1)").1, vec![0., 1., 2., 0., 0., 4.]);
        assert_eq!(f("sort(x)").1, vec![1., 2., 3., 0., 4., 5.]);
        assert_eq!(f("sort(x, axis=0)").1, vec![0., 1., 2., 3., 5., 4.]);
        assert_eq!(i("argsort(x)").1, vec![1, 2, 0, 0, 2, 1]);
        assert_eq!(f("top_k(x, 2)"), (vec![2, 2], vec![3., 2., 5., 4.]));
        assert_eq!(f("top_k(x, k=1) + 1").1, vec![4., 6.]);
    }
}

#[test]
fn expression_mistakes_name_the_column() {
    let ctx = Context::new();
    let x = f32s(&ctx, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let fi = f32s(&ctx, &[0., 1.], &[2]);
    let idx = i64s(&ctx, &[0, 1], &[2]);
    let ins: &[(&str, &Tensor)] = &[("x", &x), ("fi", &fi), ("idx", &idx)];
    let cases: &[(&str, usize, &str)] = &[
        (
            "take(x, fi, axis=1)",
            1,
            "take: f32[2] is not allowed: indices must be integers",
        ),
        (
            "1 + take(x, idx, axis=2)",
            5,
            "take: axis 2 is out of range for f32[2,3]",
        ),
        (
            "concat([x, transpose(x)], axis=1)",
            1,
            "concat: f32[2,3] and f32[3,2] must agree on every axis but axis 1",
        ),
        ("concat([], axis=0)", 1, "concat: no tensors to join"),
        (
            "concat(x, axis=0)",
            8,
            "concat() takes a list of tensors like [a, b]",
        ),
        (
            "stack([x, fi])",
            1,
            "stack: operands f32[2,3] and f32[2] must have the same shape",
        ),
        ("pad(x, [[1, -2], [0, 0]])", 13, "pad width -2 is negative"),
        (
            "pad(x, [[1, 2]])",
            8,
            "pad: 1 pairs of widths given for 2 axes",
        ),
        (
            "pad(x, [[1, 2], [0, 3]], mode='wrap')",
            31,
            "unknown pad mode 'wrap'",
        ),
        (
            "pad(x, 1, mode=reflect)",
            16,
            "mode must be a quoted string",
        ),
        (
            "pad(x, [[0, 0], [3, 0]], mode='reflect')",
            1,
            "reflect widths (3, 0) on axis 1 of extent 3: at most 2",
        ),
        ("pad(x, 1, mode='reflect)", 16, "unterminated string"),
        (
            "top_k(x, 4)",
            1,
            "top_k: k = 4 is more than the 3 positions",
        ),
        ("top_k(x, -1)", 10, "k = -1 is negative"),
        ("arange(0, 5, 0)", 14, "the step must not be zero"),
        ("arange(x)", 8, "start must be an integer literal"),
        ("one_hot(fi, 3)", 1, "one_hot: f32[2] is not allowed"),
        ("tril(fi)", 1, "tril: f32[2] is not allowed"),
        ("x + 'a'", 5, "a string is only allowed as an argument"),
        ("[x, x] + 1", 1, "a list is only allowed as an argument"),
        (
            "sortt(x)",
            1,
            "unknown function 'sortt' (did you mean 'sort'?)",
        ),
        ("cumsum(x, axis=2)", 1, "cumsum: axis 2 is out of range"),
        (
            "index_add(x, idx, fi)",
            1,
            "index_add: f32[2,3] and f32[2] must agree",
        ),
    ];
    for (e, col, want) in cases {
        match ctx.evaluate(e, ins) {
            Err(Error::Expr { column, message }) => {
                assert!(
                    *col == column && message.contains(want),
                    "{e}: got column {column}: {message:?}, want column {col}: {want:?}"
                );
                assert!(!message.contains(".rs:"), "{e}: call site in {message:?}");
            }
            other => panic!("{e}: not an expression error: {other:?}"),
        }
    }
    // An index out of range is an error of the evaluation, not of the expression.
    let r = ctx.evaluate("take(x, idx * 5, axis=1)", ins).unwrap_err();
    assert!(r.to_string().contains("index 5 is out of range"), "{r}");
}

/// The gradient of `take` with an index of several axes (an embedding of [batch, seq]
/// tokens) is the scatter-add of the rows into the table: each token's row gathers the
/// gradients of its positions. The index is taken as one axis and the result split
/// (`take`'s docs), so the gradient is a scatter-add into the table's own shape, not
/// into a view of the table broadcast over the sequence (here 6x the table).
#[test]
fn the_gradient_of_an_embedding_lookup_adds_rows_into_the_table() {
    for (backend, ctx) in contexts() {
        let emb = f32s(
            &ctx,
            &(0..5 * 3).map(|v| v as f32).collect::<Vec<_>>(),
            &[5, 3],
        );
        let tokens = i64s(&ctx, &[4, 1, 4, 0, 2, 4], &[2, 3]);
        let w = f32s(
            &ctx,
            &(1..=18).map(|v| v as f32).collect::<Vec<_>>(),
            &[2, 3, 3],
        );
        let y = emb.take(&tokens, 0);
        assert_eq!(y.shape().expect("y"), &[2, 3, 3], "{backend:?}");
        let loss = (&y * &w).sum(..);
        let g = ndfuse::grad(&loss, &[&emb]).expect("a gradient");
        let (shape, got) = ev_f32(&g[0]);
        assert_eq!(shape, vec![5, 3], "{backend:?}");
        // Row r gets the sum of w's rows at the positions whose token is r.
        let mut want = vec![0.0f32; 15];
        for (p, &t) in [4usize, 1, 4, 0, 2, 4].iter().enumerate() {
            for d in 0..3 {
                want[t * 3 + d] += (p * 3 + d + 1) as f32;
            }
        }
        assert_eq!(got, want, "{backend:?}");
    }
}

/// More parts than one node holds (an unrolled RNN stacks a part per step): a tree of
/// concats, with numpy's values.
#[test]
fn concat_of_many_parts() {
    for (b, ctx) in contexts() {
        let parts: Vec<Tensor> = (0..600)
            .map(|i| f32s(&ctx, &[i as f32, -(i as f32)], &[1, 2]))
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let (shape, v) = ev_f32(&concat(&refs, 0));
        assert_eq!(shape, vec![600, 2], "{b:?}");
        let want: Vec<f32> = (0..600).flat_map(|i| [i as f32, -(i as f32)]).collect();
        assert_eq!(v, want, "{b:?}");
        let (shape, _) = ev_f32(&stack(&refs, 1));
        assert_eq!(shape, vec![1, 600, 2], "{b:?}");
    }
}
