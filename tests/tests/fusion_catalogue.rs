//! The fusion catalogue: graphs users write, each with the number of kernels fusion must
//! produce AND its values checked against the reference interpreter.
//!
//! Tolerance per entry: `Exact` (bit-identical, NaN matching NaN) wherever the kernel
//! rounds at the same steps as the node-by-node reference (element-wise ops, max, min,
//! argmax, integer sums); `F32_ACC` where f32 sums or products accumulate in f32 while
//! the reference sums exactly (see the constant); `F32_STEPS` and `Close` where a
//! composite reduction is lowered to steps that each round in the kernel's dtype while
//! the reference computes the whole node in f64 and rounds once (mean = sum / n, var/std
//! through the mean, norm2 through f32 squares, and layernorm, whose `x - mean` cancels).

use ndfuse::{BackendKind, Context, DType, SliceArg, Tensor};
use ndfuse_tests::{assert_close, assert_matches};

#[derive(Clone, Copy, Debug)]
enum Tol {
    Exact,
    /// rtol, atol
    Close(f64, f64),
}

/// f32 steps that each round: a few ulp relative, absolute at the terms' scale.
const F32_STEPS: Tol = Tol::Close(2e-6, 1e-6);

/// f32 sums and products accumulate in f32 in a fixed sequential order (the mission:
/// reductions accumulate in f32); the reference sums exactly in f64 and rounds once. The
/// error is bounded by (n - 1) eps sum|x|; over these rows (n up to 70 000, |x| up to
/// about 10) it measured at most 1e-6 relative, and 4e-6 absolute on a sum that cancels.
const F32_ACC: Tol = Tol::Close(1e-5, 1e-5);

struct Case {
    name: &'static str,
    kernels: usize,
    tol: Tol,
    build: fn(&Context) -> Vec<Tensor>,
}

fn x(ctx: &Context, shape: &[usize], seed: u64) -> Tensor {
    ctx.rand_normal(shape, 0.5, 2.0, seed)
}

const CATALOGUE: &[Case] = &[
    Case {
        name: "gelu",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![x(c, &[1000], 1).gelu()],
    },
    Case {
        name: "three-input chain",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![(&x(c, &[64, 16], 1) * &x(c, &[64, 16], 2) + &x(c, &[64, 16], 3)).tanh()],
    },
    Case {
        name: "exp(a*b+c).sum(1)",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            vec![
                (&x(c, &[32, 24], 1) * &x(c, &[32, 24], 2) + &x(c, &[24], 3))
                    .exp()
                    .sum(1),
            ]
        },
    },
    Case {
        name: "mean of rows",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[40, 30], 4).mean(1)],
    },
    Case {
        name: "var of rows",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[40, 30], 5).var(-1)],
    },
    Case {
        name: "std of columns",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[40, 30], 6).std(0)],
    },
    Case {
        name: "softmax",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[16, 33], 7).softmax(-1)],
    },
    Case {
        name: "log_softmax",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[16, 33], 8).log_softmax(-1)],
    },
    Case {
        name: "layernorm",
        kernels: 1,
        tol: Tol::Close(1e-5, 1e-5),
        build: |c| vec![x(c, &[12, 64], 9).layernorm(-1, 1e-5)],
    },
    Case {
        name: "column sum",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[64, 48], 10).sum(0)],
    },
    Case {
        name: "full sum",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[70_000], 11).sum(..)],
    },
    Case {
        name: "argmax and argmin",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| {
            let a = x(c, &[20, 17], 12);
            vec![a.argmax(1), a.argmin(1)]
        },
    },
    Case {
        name: "broadcast [N,1] + [M]",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![&x(c, &[50, 1], 13) + &x(c, &[40], 14)],
    },
    Case {
        name: "diamond: one value, two consumers",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| {
            let t = x(c, &[300], 15).exp();
            vec![&t * &t + t.sin()]
        },
    },
    Case {
        name: "transpose then add",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![&x(c, &[24, 16], 16).transpose() + &x(c, &[16, 24], 17)],
    },
    Case {
        name: "sibling reductions share one pass",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            let a = x(c, &[30, 20], 18);
            vec![a.sum(1), a.max(1), a.min(1), a.prod(1)]
        },
    },
    Case {
        name: "reductions over different axes of one input",
        kernels: 2,
        tol: F32_ACC,
        build: |c| {
            let a = x(c, &[30, 20], 19);
            vec![a.sum(0), a.sum(1)]
        },
    },
    Case {
        name: "a value consumed by reductions over different axes is materialised",
        kernels: 2,
        tol: F32_ACC,
        build: |c| {
            let y = x(c, &[30, 20], 20).exp();
            vec![y.sum(0), y.sum(1)]
        },
    },
    Case {
        name: "centering with a keepdims mean",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| {
            let a = x(c, &[25, 40], 21);
            vec![&a - &a.mean_keepdims(1)]
        },
    },
    Case {
        name: "norms",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| {
            let a = x(c, &[30, 20], 22);
            vec![a.norm1(1), a.norm2(1)]
        },
    },
    Case {
        name: "a reduction of a row-fused result",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[16, 33], 23).softmax(-1).sum(-1)],
    },
    Case {
        name: "epilogue after a reduction",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            let a = x(c, &[30, 20], 24);
            vec![(&a * &a).sum(1).sqrt() + 1.0]
        },
    },
    Case {
        name: "reduction over non-adjacent axes",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[6, 5, 7], 25).sum([0, 2])],
    },
    Case {
        name: "integer sum accumulates in i64",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![x(c, &[40, 30], 26).mul(1000.0).cast(DType::I32).sum(1)],
    },
    Case {
        name: "reshaped reduction result",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[30, 20], 27).mean(1).reshape(&[-1, 1]) * 2.0],
    },
    Case {
        name: "softmax of a transposed input",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[33, 16], 28).transpose().softmax(-1)],
    },
    Case {
        name: "a reduction of a reduction",
        kernels: 2,
        tol: F32_ACC,
        build: |c| vec![x(c, &[30, 20], 29).sum(1).max(0)],
    },
    Case {
        name: "where against a row mean",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| {
            let a = x(c, &[25, 40], 30);
            vec![a.gt(a.mean_keepdims(1)).where_(&a, 0.0)]
        },
    },
    Case {
        name: "reversed slices reduced",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            vec![x(c, &[30, 20], 31)
                .slice(&[SliceArg::new(None, None, -3)])
                .sum(1)]
        },
    },
    Case {
        name: "a broadcast input reduced along its stride-0 axis",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[30, 1], 32).broadcast_to(&[30, 20]).mean(1)],
    },
    Case {
        name: "transpose then reduce",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[20, 30], 33).transpose().sum(1)],
    },
    Case {
        name: "cast chains",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![(x(c, &[100], 34).cast(DType::F16).cast(DType::F32) * 2.0).cast(DType::F64)],
    },
];

fn run(case: &Case) -> ndfuse::Report {
    let ctx = Context::new();
    let outs = (case.build)(&ctx);
    let refs: Vec<&Tensor> = outs.iter().collect();
    ctx.set_backend(BackendKind::Interp);
    let want = ctx
        .eval(&refs)
        .unwrap_or_else(|e| panic!("{}: reference: {e}", case.name));
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx
        .eval_report(&refs)
        .unwrap_or_else(|e| panic!("{}: cpu: {e}", case.name));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let what = format!("{} output {i}\n{}", case.name, report.kernels_text());
        match case.tol {
            Tol::Exact => assert_matches(g, w, 0, &what),
            Tol::Close(rtol, atol) => assert_close(g, w, rtol, atol, &what),
        }
    }
    report
}

/// The fusion report of a catalogue graph: where each node went and why, then every
/// kernel with its plan, the reason for it and the bytes it moves.
fn fusion_report(case: &Case) -> String {
    let ctx = Context::new();
    let outs = (case.build)(&ctx);
    let refs: Vec<&Tensor> = outs.iter().collect();
    let g = ctx.graph(&refs).expect("builds");
    let s = ndfuse_passes::schedule(&g);
    let bytes: Vec<String> = s
        .kernels()
        .map(|k| {
            format!(
                "{}: reads {} B, writes {} B",
                k.name,
                k.bytes_in(),
                k.bytes_out()
            )
        })
        .collect();
    format!(
        "{}\n{}\n{}\n",
        s.annotate(&g, &|_| None),
        s.to_text(&g),
        bytes.join("\n")
    )
}

#[test]
fn every_catalogue_graph_has_its_fusion_report_pinned() {
    for case in CATALOGUE {
        let name = case.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        insta::assert_snapshot!(name, fusion_report(case));
    }
}

#[test]
fn every_catalogue_graph_has_its_kernel_count_and_the_reference_values() {
    assert!(CATALOGUE.len() >= 25);
    let mut wrong = Vec::new();
    for case in CATALOGUE {
        let report = run(case);
        if report.kernel_count() != case.kernels {
            wrong.push(format!(
                "{}: {} kernels, expected {}\n{}",
                case.name,
                report.kernel_count(),
                case.kernels,
                report.annotated_graph()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_boundary_says_why() {
    let ctx = Context::new();
    let y = x(&ctx, &[30, 20], 20).exp();
    let g = ctx.graph(&[&y.sum(0), &y.sum(1)]).expect("builds");
    let text = ndfuse_passes::schedule(&g).annotate(&g, &|_| None);
    assert!(
        text.contains("stored: read by sum in another kernel"),
        "{text}"
    );
    assert!(text.contains("stored: output of the graph"), "{text}");
}

#[test]
fn row_fused_ops_are_one_kernel_with_rows_plans() {
    let ctx = Context::new();
    let a = x(&ctx, &[64, 128], 1);
    for (name, t) in [
        ("softmax", a.softmax(-1)),
        ("layernorm", a.layernorm(-1, 1e-5)),
        ("var", a.var(-1)),
    ] {
        let g = ctx.graph(&[&t]).expect("builds");
        let s = ndfuse_passes::schedule(&g);
        assert_eq!(s.kernel_count(), 1, "{name}");
        let k = s.kernels().next().expect("one kernel");
        assert_eq!(k.reduce_axes, vec![1], "{name}");
        assert_eq!(
            k.plan,
            ndfuse_ir::Plan::Rows {
                rows: 64,
                row_len: 128,
                contiguous: true
            },
            "{name}: {}",
            k.plan_reason
        );
    }
}

#[test]
fn a_full_sum_of_64m_is_one_split_kernel_and_a_column_sum_sweeps_columns() {
    // Scheduling only: no data needed.
    let mut g = ndfuse_ir::Graph::new();
    let big = g.add_input("x", DType::F32, ndfuse_ir::Shape::new([64 << 20]));
    let op = ndfuse_ir::Op::Reduce {
        op: ndfuse_ir::ReduceOp::Sum,
        axes: vec![0],
        keepdims: false,
    };
    let s = g.add(op, &[big]).expect("sum");
    let sq = g.add_input("y", DType::F32, ndfuse_ir::Shape::new([4096, 4096]));
    let col = ndfuse_ir::Op::Reduce {
        op: ndfuse_ir::ReduceOp::Sum,
        axes: vec![0],
        keepdims: false,
    };
    let c = g.add(col, &[sq]).expect("column sum");
    g.add_output(s);
    g.add_output(c);
    let sched = ndfuse_passes::schedule(&g);
    let plans: Vec<&ndfuse_ir::Plan> = sched.kernels().map(|k| &k.plan).collect();
    assert_eq!(
        plans,
        vec![
            &ndfuse_ir::Plan::Split {
                rows: 1,
                row_len: 64 << 20,
                splits: 1024
            },
            &ndfuse_ir::Plan::Columns {
                cols: 4096,
                col_len: 4096
            },
        ]
    );
}

#[test]
fn the_fused_reference_of_a_catalogue_graph_is_pinned() {
    let ctx = Context::new();
    let a = x(&ctx, &[4, 8], 1);
    let g = ctx.graph(&[&a.softmax(-1), &a.var(-1)]).expect("builds");
    let s = ndfuse_passes::schedule(&g);
    insta::assert_snapshot!(format!("{}\n{}", s.annotate(&g, &|_| None), s.to_text(&g)));
}
