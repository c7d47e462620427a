//! Fused attention (`Tensor::attention`, one node forward and one backward) against the
//! same function built from the primitives (`Attention::unfused`: two products, masks
//! from iotas, a softmax), on the interpreter in f64 (each node rounded to f64: the two
//! graphs differ by a few f64 roundings) and on the CPU routine in f32 and the half
//! types; gradients against central differences. Causal masks aligned top-left and
//! bottom-right with `Tq != Tk`, rows that see no key, grouped-query heads, padding
//! masks, an additive bias and dropout. Bad operands are errors naming the shapes.

use ndfuse::{Array, Attention, AttentionLayout, BackendKind, Causal, Context, DType, Tensor};

/// One attention problem.
#[derive(Clone, Debug)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: Causal,
    /// The bias's extents (broadcast over the rest).
    bias: Option<Vec<usize>>,
    lengths: Option<Vec<i64>>,
    dropout: Option<f64>,
}

fn case(b: usize, hq: usize, hkv: usize, tq: usize, tk: usize, d: usize) -> Case {
    Case {
        b,
        hq,
        hkv,
        tq,
        tk,
        d,
        dv: d,
        causal: Causal::None,
        bias: None,
        lengths: None,
        dropout: None,
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        case(2, 2, 2, 5, 5, 16),
        Case {
            causal: Causal::TopLeft,
            ..case(2, 4, 4, 7, 7, 16)
        },
        // Tq < Tk: top-left sees a prefix, bottom-right the queries as the last positions.
        Case {
            causal: Causal::TopLeft,
            ..case(1, 2, 2, 3, 9, 8)
        },
        Case {
            causal: Causal::BottomRight,
            ..case(1, 2, 2, 3, 9, 8)
        },
        // Tq > Tk bottom-right: the first rows see no key and give zeros.
        Case {
            causal: Causal::BottomRight,
            ..case(1, 2, 1, 9, 4, 8)
        },
        // Grouped-query attention, and a value dimension of its own.
        Case {
            dv: 12,
            causal: Causal::TopLeft,
            ..case(2, 6, 2, 6, 6, 16)
        },
        // Padding masks, one sequence empty.
        Case {
            lengths: Some(vec![3, 0, 7]),
            ..case(3, 2, 1, 4, 7, 16)
        },
        Case {
            causal: Causal::TopLeft,
            lengths: Some(vec![5, 2]),
            ..case(2, 4, 2, 6, 6, 64)
        },
        // An additive bias per head and key position, and one full.
        Case {
            bias: Some(vec![1, 3, 1, 5]),
            ..case(2, 3, 3, 4, 5, 16)
        },
        Case {
            bias: Some(vec![2, 3, 4, 5]),
            causal: Causal::BottomRight,
            ..case(2, 3, 1, 4, 5, 16)
        },
        Case {
            dropout: Some(0.25),
            causal: Causal::TopLeft,
            ..case(2, 2, 1, 8, 8, 16)
        },
    ];
    v.push(Case {
        causal: Causal::TopLeft,
        ..case(1, 2, 2, 33, 33, 128)
    });
    v.extend(long_cases());
    v
}

/// Cases of several blocks of queries and keys (the CPU routine's blocks are 64 x 64),
/// with extents that are not multiples of the block.
fn long_cases() -> Vec<Case> {
    vec![
        Case {
            causal: Causal::TopLeft,
            ..case(1, 2, 2, 150, 150, 16)
        },
        Case {
            causal: Causal::BottomRight,
            lengths: Some(vec![190, 77]),
            ..case(2, 2, 1, 70, 200, 16)
        },
        Case {
            dropout: Some(0.1),
            bias: Some(vec![1, 4, 1, 130]),
            ..case(1, 4, 2, 100, 130, 32)
        },
    ]
}

/// Deterministic values in `[-2, 2)`.
fn vals(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
        })
        .collect()
}

struct Operands {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    r: Tensor,
    opts: Attention,
}

fn operands(ctx: &Context, c: &Case, dtype: DType) -> Operands {
    let make = |shape: &[usize], seed: u64| {
        ctx.from_slice(&vals(shape.iter().product(), seed), shape)
            .expect("data")
            .cast(dtype)
    };
    let q = make(&[c.b, c.hq, c.tq, c.d], 1);
    let k = make(&[c.b, c.hkv, c.tk, c.d], 2);
    let v = make(&[c.b, c.hkv, c.tk, c.dv], 3);
    let r = make(&[c.b, c.hq, c.tq, c.dv], 4);
    let mut opts = Attention::new().causal(c.causal).scale(0.3);
    if let Some(shape) = &c.bias {
        opts = opts.bias(&make(shape, 5));
    }
    if let Some(l) = &c.lengths {
        opts = opts.key_lengths(&ctx.from_vec(l.clone(), &[c.b]).expect("lengths"));
    }
    if let Some(p) = c.dropout {
        opts = opts.dropout(p, &ctx.key(7));
    }
    Operands { q, k, v, r, opts }
}

/// The result and the gradients of `sum(o * r)` with respect to q, k and v.
fn run(ctx: &Context, c: &Case, dtype: DType, unfused: bool) -> Vec<Array> {
    let Operands { q, k, v, r, opts } = operands(ctx, c, dtype);
    let opts = if unfused { opts.unfused() } else { opts };
    let o = q.attention_with(&k, &v, &opts);
    let loss = (&o.cast(DType::F64) * &r.cast(DType::F64)).sum(..);
    let grads = ndfuse::grad(&loss, &[&q, &k, &v]).expect("gradients");
    let mut all = vec![&o];
    all.extend(grads.iter());
    ctx.eval(&all).expect("eval")
}

fn ctx(backend: BackendKind) -> Context {
    Context::builder()
        .backend(backend)
        .dtype(DType::F64)
        .build()
        .expect("a context")
}

/// `max |got - want| <= bound * (1 + max |want|)`, naming the worst element.
fn close(what: &str, got: &Array, want: &Array, bound: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = 1.0 + w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (i, worst) = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0, 0.0f64),
            |m, (i, d)| if d > m.1 || d.is_nan() { (i, d) } else { m },
        );
    assert!(
        worst <= bound * scale,
        "{what}: element {i} is {} against {} (|diff| {worst:e} > {:e})",
        g[i],
        w[i],
        bound * scale
    );
}

const NAMES: [&str; 4] = ["o", "dq", "dk", "dv"];

#[test]
fn fused_equals_the_unfused_graph_in_f64() {
    // The two graphs round differently (the unfused one at every node), in f64: a few
    // hundred units of f64 roundoff relative to the largest value at most.
    for backend in [BackendKind::Interp, BackendKind::Cpu] {
        let ctx = ctx(backend);
        for c in cases() {
            let fused = run(&ctx, &c, DType::F64, false);
            let reference = run(&ctx, &c, DType::F64, true);
            for ((got, want), name) in fused.iter().zip(&reference).zip(NAMES) {
                close(&format!("{backend:?} {c:?} {name}"), got, want, 1e-12);
            }
        }
    }
}

/// f32's and the half types' unit roundoff.
fn unit(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-53),
    }
}

#[test]
fn the_cpu_routine_in_f32_and_the_half_types_matches_the_f64_reference() {
    // The reference: the interpreter's fused node in f64 on the same (rounded) inputs.
    // The routine computes in f32: each score a sum of D products, each output a sum of
    // Tk weighted values (and the gradients sums of Tq or Tk terms of products of
    // those), with the softmax's exp and division in between. Bound for f32, relative to
    // the largest value: (D + Tk + Tq + 16) units of roundoff, the error of a sum of that
    // many terms of that size; for f16 and bf16 the one rounding of the result (and the
    // f32 error below it): 2 units of the half type.
    let cpu = Context::builder()
        .backend(BackendKind::Cpu)
        .dtype(DType::F64)
        .build()
        .expect("cpu");
    let interp = ctx(BackendKind::Interp);
    let mut all = cases();
    all.truncate(4);
    all.extend(long_cases());
    for c in all {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let got = run(&cpu, &c, dtype, false);
            let want = run_rounded(&interp, &c, dtype);
            let bound = match dtype {
                DType::F32 => (c.d + c.tk + c.tq + 16) as f64 * unit(dtype),
                _ => 2.0 * unit(dtype),
            };
            for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                close(&format!("{dtype} {c:?} {name}"), g, w, bound);
            }
        }
    }
}

/// [`run`] in f64 on inputs rounded to `dtype`.
fn run_rounded(ctx: &Context, c: &Case, dtype: DType) -> Vec<Array> {
    let Operands { q, k, v, r, opts } = operands(ctx, c, dtype);
    let up = |t: &Tensor| ctx.tensor(t.cast(DType::F64).eval().expect("inputs"));
    let (q, k, v, r) = (up(&q), up(&k), up(&v), up(&r));
    let o = q.attention_with(&k, &v, &opts);
    let loss = (&o * &r).sum(..);
    let grads = ndfuse::grad(&loss, &[&q, &k, &v]).expect("gradients");
    let mut all = vec![&o];
    all.extend(grads.iter());
    ctx.eval(&all).expect("eval")
}

#[test]
fn rows_that_see_no_key_give_zeros_and_no_gradient() {
    let ctx = ctx(BackendKind::Interp);
    let c = Case {
        causal: Causal::BottomRight,
        lengths: Some(vec![4, 0]),
        ..case(2, 1, 1, 6, 4, 8)
    };
    let out = run(&ctx, &c, DType::F64, false);
    let o = out[0].to_f64_vec();
    let dq = out[1].to_f64_vec();
    // Batch 0: rows 0 and 1 see keys j <= i - 2, none; batch 1 sees no key at all.
    for (i, row) in o.chunks(8).enumerate() {
        let empty = !(2..6).contains(&i);
        assert_eq!(row.iter().all(|&x| x == 0.0), empty, "row {i}: {row:?}");
    }
    for (i, row) in dq.chunks(8).enumerate() {
        if !(2..6).contains(&i) {
            assert!(row.iter().all(|&x| x == 0.0), "dq row {i}: {row:?}");
        }
    }
}

#[test]
fn gradients_match_central_differences() {
    let ctx = ctx(BackendKind::Interp);
    let c = Case {
        causal: Causal::TopLeft,
        lengths: Some(vec![4, 3]),
        bias: Some(vec![1, 1, 5, 4]),
        ..case(2, 4, 2, 5, 4, 6)
    };
    let Operands { q, k, v, r, opts } = operands(&ctx, &c, DType::F64);
    let loss_of =
        |q: &Tensor, k: &Tensor, v: &Tensor| (&q.attention_with(k, v, &opts) * &r).sum(..);
    let grads = ndfuse::grad(&loss_of(&q, &k, &v), &[&q, &k, &v]).expect("gradients");
    let base: Vec<Vec<f64>> = [&q, &k, &v]
        .iter()
        .map(|t| t.eval().expect("value").to_f64_vec())
        .collect();
    let shapes: Vec<Vec<usize>> = [&q, &k, &v]
        .iter()
        .map(|t| t.shape().expect("shape").to_vec())
        .collect();
    let h = 1e-6;
    for which in 0..3 {
        let got = grads[which].eval().expect("grad").to_f64_vec();
        for i in (0..base[which].len()).step_by(7) {
            let at = |delta: f64| {
                let mut t: Vec<Tensor> = Vec::new();
                for (w, b) in base.iter().enumerate() {
                    let mut b = b.clone();
                    if w == which {
                        b[i] += delta;
                    }
                    t.push(ctx.from_slice(&b, &shapes[w]).expect("data"));
                }
                loss_of(&t[0], &t[1], &t[2])
                    .eval()
                    .expect("loss")
                    .to_f64_vec()[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!(
                (fd - got[i]).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{} element {i}: autodiff {} against central differences {fd}",
                NAMES[which + 1],
                got[i]
            );
        }
    }
}

#[test]
fn a_bias_that_needs_a_gradient_is_refused_unless_unfused() {
    let ctx = ctx(BackendKind::Interp);
    let q = ctx.ones(&[1, 1, 2, 4]);
    let bias = ctx.zeros(&[1, 1, 2, 2]);
    let o = q.attention_with(&q, &q, &Attention::new().bias(&bias));
    let err = ndfuse::grad(&o.sum(..), &[&bias]).expect_err("refused");
    assert!(err.to_string().contains("unfused"), "{err}");
    let o = q.attention_with(&q, &q, &Attention::new().bias(&bias).unfused());
    let g = ndfuse::grad(&o.sum(..), &[&bias]).expect("the unfused graph learns a bias");
    assert_eq!(g[0].eval().expect("grad").shape(), &[1, 1, 2, 2]);
}

#[test]
fn bad_operands_are_errors_naming_the_shapes_and_the_call_site() {
    let ctx = Context::new();
    let q = ctx.ones(&[2, 6, 5, 16]);
    let check = |t: Tensor, want: &[&str]| {
        let e = t.eval().expect_err("an error").to_string();
        for w in want {
            assert!(e.contains(w), "{e:?} lacks {w:?}");
        }
        assert!(e.contains("attention.rs"), "{e:?} names no call site");
    };
    check(
        q.attention(
            &ctx.ones(&[2, 4, 5, 16]),
            &ctx.ones(&[2, 4, 5, 16]),
            true,
            0.25,
        ),
        &["[2, 6, 5, 16]", "[2, 4, 5, 16]", "divide"],
    );
    check(
        q.attention(
            &ctx.ones(&[2, 6, 5, 8]),
            &ctx.ones(&[2, 6, 5, 16]),
            true,
            0.25,
        ),
        &["[2, 6, 5, 8]", "head dimensions"],
    );
    check(
        q.attention(
            &ctx.ones(&[2, 6, 7, 16]),
            &ctx.ones(&[2, 6, 5, 16]),
            false,
            0.25,
        ),
        &["7 keys and v 5 values"],
    );
    check(
        q.attention_with(&q, &q, &Attention::new().bias(&ctx.ones(&[3, 5]))),
        &["[3, 5]", "[2, 6, 5, 5]"],
    );
    check(
        q.attention_with(
            &q,
            &q,
            &Attention::new().key_lengths(&ctx.from_vec(vec![1i64, 2, 3], &[3]).expect("l")),
        ),
        &["[3]", "[2]"],
    );
}

#[test]
fn attention_of_rank_three_and_two_operands() {
    let ctx = ctx(BackendKind::Interp);
    let x = ctx.from_slice(&vals(3 * 4 * 8, 9), &[3, 4, 8]).expect("x");
    let fused = x.attention(&x, &x, true, 0.5).eval().expect("rank 3");
    let unfused = x
        .attention_with(&x, &x, &Attention::new().causal(true).scale(0.5).unfused())
        .eval()
        .expect("rank 3");
    close("rank 3", &fused, &unfused, 1e-12);
    let y = x.reshape(&[12, 8]);
    let o = y.attention(&y, &y, false, 0.5).eval().expect("rank 2");
    assert_eq!(o.shape(), &[12, 8]);
}

#[test]
fn attention_is_one_routine_forward_and_one_backward_with_no_score_matrix() {
    let ctx = Context::new();
    let c = Case {
        causal: Causal::TopLeft,
        ..case(2, 4, 2, 80, 80, 32)
    };
    let Operands { q, k, v, r, opts } = operands(&ctx, &c, DType::F32);
    let [q, k, v, r] = [q, k, v, r].map(|t| ctx.tensor(t.eval().expect("data")));
    let o = q.attention_with(&k, &v, &opts);
    let loss = (&o * &r).sum(..);
    let g = ndfuse::grad(&loss, &[&q, &k, &v]).expect("grads");
    let (_, report) = ctx.eval_report(&[&o, &g[0], &g[1], &g[2]]).expect("eval");
    let text = report.evaluation().annotated_graph();
    let steps = |op: &str| {
        text.lines()
            .filter(|l| l.contains(&format!("= {op} ")) && l.contains("routine"))
            .count()
    };
    assert_eq!(steps("attention"), 1, "{text}");
    assert_eq!(steps("attention_backward"), 1, "{text}");
    // Nothing of the scores' extents [.., 80, 80] is ever a value of the graph.
    assert!(!text.contains("80,80]"), "{text}");
}

#[test]
fn one_two_and_eight_threads_give_the_same_bits() {
    // 4 (batch, key/value head) pairs: on 1 and 2 threads the backward runs one task per
    // pair, on 8 it splits by blocks; both add the same products in the same order.
    let ctx = Context::new();
    let c = Case {
        causal: Causal::TopLeft,
        lengths: Some(vec![150, 97]),
        dropout: Some(0.1),
        ..case(2, 4, 2, 150, 150, 32)
    };
    let Operands { q, k, v, r, opts } = operands(&ctx, &c, DType::F32);
    let [q, k, v, r] = [q, k, v, r].map(|t| ctx.tensor(t.eval().expect("data")));
    let o = q.attention_with(&k, &v, &opts);
    let g = ndfuse::grad(&(&o * &r).sum(..), &[&q, &k, &v]).expect("grads");
    let outs = [&o, &g[0], &g[1], &g[2]];
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        pool.install(|| ctx.eval(&outs).expect("evaluates"))
    };
    let one = run(1);
    for threads in [2, 8] {
        for ((x, y), name) in one.iter().zip(&run(threads)).zip(NAMES) {
            let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{name} differs between 1 and {threads} threads"
            );
        }
    }
}

#[test]
fn the_expression_language_spells_attention() {
    let ctx = ctx(BackendKind::Interp);
    let c = Case {
        lengths: Some(vec![3, 6]),
        ..case(2, 4, 2, 5, 6, 8)
    };
    let Operands { q, k, v, .. } = operands(&ctx, &c, DType::F64);
    let lengths = ctx.from_vec(vec![3i64, 6], &[2]).expect("lengths");
    let inputs = [("q", &q), ("k", &k), ("v", &v), ("n", &lengths)];
    let got = ctx
        .evaluate(
            "attention(q, k, v, causal='bottom_right', scale=0.125, key_lengths=n)",
            &inputs,
        )
        .expect("evaluates");
    let opts = Attention::new()
        .causal(Causal::BottomRight)
        .scale(0.125)
        .key_lengths(&lengths);
    let want = q.attention_with(&k, &v, &opts).eval().expect("api");
    close("expr", &got, &want, 0.0);
    let got = ctx
        .evaluate("attention(q, k, v, causal=true, scale=0.125)", &inputs)
        .expect("evaluates");
    let want = q.attention(&k, &v, true, 0.125).eval().expect("api");
    close("expr", &got, &want, 0.0);
    let err = ctx
        .evaluate("attention(q, k, v, causal='diagonal')", &inputs)
        .expect_err("refused");
    assert!(err.to_string().contains("bottom_right"), "{err}");
}

#[test]
fn attention_written_with_the_primitives_becomes_the_fused_node_forward_and_backward() {
    // softmax(q @ k^T * scale + bias) @ v, the bias a broadcast [Tq, Tk] mask of -1e9s
    // (additive) or a where(mask, s, -inf); and q @ k^T / 8 without bias.
    let ctx = ctx(BackendKind::Cpu);
    let c = case(2, 3, 3, 9, 11, 8);
    let Operands { q, k, v, r, .. } = operands(&ctx, &c, DType::F64);
    let kt = k.permute(&[0, 1, 3, 2]);
    let rows = ctx.arange_i64(0, 9, 1).expect("rows").reshape(&[9, 1]);
    let cols = ctx.arange_i64(0, 11, 1).expect("cols");
    let keep = cols.le(&rows);
    let additive = keep.where_(0.0, -1e9);
    let written = [
        (q.matmul(&kt) * 0.3 + &additive).softmax(-1).matmul(&v),
        keep.where_(q.matmul(&kt) * 0.3, f64::NEG_INFINITY)
            .softmax(-1)
            .matmul(&v),
        (q.matmul(&kt) / 8.0).softmax(-1).matmul(&v),
    ];
    let masked = Attention::new()
        .causal(Causal::TopLeft)
        .scale(0.3)
        .unfused();
    let references = [
        q.attention_with(&k, &v, &masked),
        q.attention_with(&k, &v, &masked),
        q.attention_with(&k, &v, &Attention::new().scale(0.125).unfused()),
    ];
    for (i, (o, reference)) in written.iter().zip(&references).enumerate() {
        let loss = (o * &r).sum(..);
        let grads = ndfuse::grad(&loss, &[&q, &k, &v]).expect("grads");
        let outs = [o, &grads[0], &grads[1], &grads[2]];
        let (got, report) = ctx.eval_report(&outs).expect("eval");
        let text = report.evaluation().annotated_graph();
        assert!(text.contains("= attention "), "pattern {i}: {text}");
        assert!(
            text.contains("= attention_backward "),
            "pattern {i}: {text}"
        );
        assert!(
            !text.contains("= exp "),
            "pattern {i} kept its softmax: {text}"
        );
        let rl = (reference * &r).sum(..);
        let rg = ndfuse::grad(&rl, &[&q, &k, &v]).expect("grads");
        let want = ctx
            .eval(&[reference, &rg[0], &rg[1], &rg[2]])
            .expect("reference");
        for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
            close(&format!("pattern {i} {name}"), g, w, 1e-12);
        }
    }
}

#[test]
fn the_bthd_layout_is_the_bhtd_one_transposed() {
    // The same problems with q, k, v (and the result, and the gradients) as [B, T, H, D]:
    // equal to the [B, H, T, D] run up to f64 roundings, on the interpreter and the CPU
    // routine (whose tasks split the work differently in this layout).
    for backend in [BackendKind::Interp, BackendKind::Cpu] {
        let ctx = ctx(backend);
        for c in cases().into_iter().filter(|c| c.bias.is_none()) {
            let Operands { q, k, v, r, opts } = operands(&ctx, &c, DType::F64);
            let swap = |t: &Tensor| ctx.tensor(t.permute(&[0, 2, 1, 3]).eval().expect("data"));
            let (qt, kt, vt, rt) = (swap(&q), swap(&k), swap(&v), swap(&r));
            let o = qt.attention_with(&kt, &vt, &opts.clone().layout(AttentionLayout::Bthd));
            let g = ndfuse::grad(&(&o * &rt).sum(..), &[&qt, &kt, &vt]).expect("grads");
            let got: Vec<Tensor> = [&o, &g[0], &g[1], &g[2]]
                .iter()
                .map(|t| t.permute(&[0, 2, 1, 3]))
                .collect();
            let got = ctx.eval(&got.iter().collect::<Vec<_>>()).expect("eval");
            let want = run(&ctx, &c, DType::F64, false);
            for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                close(&format!("{backend:?} bthd {c:?} {name}"), g, w, 1e-12);
            }
        }
    }
}

#[test]
fn packed_qkv_is_the_bthd_attention_of_its_slices() {
    // qkv [B, T, (Hq + 2 Hkv) D]: the result equals attention of its three slices, and
    // the backward node's result (qkv's gradient) equals the gradient through the slices
    // of the unfused graph; causal, grouped heads, key lengths and dropout; f64 on the
    // interpreter and the CPU routine, f32 on the routine against the f64 reference.
    for backend in [BackendKind::Interp, BackendKind::Cpu] {
        let ctx = ctx(backend);
        for (b, t, hq, hkv, d, lengths, dropout) in [
            (2, 9, 4, 2, 8, Some(vec![9i64, 4]), None),
            (1, 150, 2, 1, 16, None, Some(0.1)),
            (3, 70, 4, 4, 8, Some(vec![70, 0, 33]), None),
        ] {
            let w = (hq + 2 * hkv) * d;
            let qkv = ctx
                .from_slice(&vals(b * t * w, 21), &[b, t, w])
                .expect("qkv");
            let r = ctx
                .from_slice(&vals(b * t * hq * d, 22), &[b, t, hq, d])
                .expect("r");
            let mut opts = Attention::new().causal(Causal::TopLeft).scale(0.4);
            if let Some(l) = &lengths {
                opts = opts.key_lengths(&ctx.from_vec(l.clone(), &[b]).expect("lengths"));
            }
            if let Some(p) = dropout {
                opts = opts.dropout(p, &ctx.key(3));
            }
            let o = qkv.attention_qkv(hq, hkv, &opts);
            let g = ndfuse::grad(&(&o * &r).sum(..), &[&qkv]).expect("grad");
            let ou = qkv.attention_qkv(hq, hkv, &opts.clone().unfused());
            let gu = ndfuse::grad(&(&ou * &r).sum(..), &[&qkv]).expect("grad");
            let got = ctx.eval(&[&o, &g[0]]).expect("packed");
            let want = ctx.eval(&[&ou, &gu[0]]).expect("unfused");
            for ((g, w), name) in got.iter().zip(&want).zip(["o", "dqkv"]) {
                close(&format!("{backend:?} packed t={t} {name}"), g, w, 1e-12);
            }
            if backend == BackendKind::Cpu {
                let (f, r32) = (qkv.cast(DType::F32), r.cast(DType::F32));
                let f = ctx.tensor(f.eval().expect("f32"));
                let o = f.attention_qkv(hq, hkv, &opts);
                let g = ndfuse::grad(
                    &(&o.cast(DType::F64) * &r32.cast(DType::F64)).sum(..),
                    &[&f],
                );
                let got = ctx.eval(&[&o, &g.expect("grad")[0]]).expect("f32");
                let bound = (d + 2 * t + 16) as f64 * unit(DType::F32);
                for ((g, w), name) in got.iter().zip(&want).zip(["o", "dqkv"]) {
                    close(&format!("f32 packed t={t} {name}"), g, w, bound);
                }
            }
        }
    }
}

#[test]
fn empty_extents_give_empty_or_zero_results() {
    // No queries: an empty result; no keys: every row sees nothing, so zeros; and their
    // gradients (zeros, of the operands' shapes).
    for backend in [BackendKind::Interp, BackendKind::Cpu] {
        let ctx = ctx(backend);
        for (tq, tk) in [(0, 5), (4, 0), (0, 0)] {
            let q = ctx.ones(&[2, 2, tq, 8]);
            let k = ctx.ones(&[2, 2, tk, 8]);
            let o = q.attention(&k, &k, false, 0.5);
            let g = ndfuse::grad(&o.sum(..), &[&q, &k]).expect("grads");
            let out = ctx.eval(&[&o, &g[0], &g[1]]).expect("eval");
            assert_eq!(out[0].shape(), &[2, 2, tq, 8]);
            for a in &out {
                assert!(
                    a.to_f64_vec().iter().all(|&x| x == 0.0),
                    "{backend:?} {tq} {tk}"
                );
            }
        }
    }
}
