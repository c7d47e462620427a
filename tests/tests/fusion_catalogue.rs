//! The fusion catalogue: graphs users write, each with the number of kernels fusion must
//! produce AND its values checked against the reference interpreter.
//!
//! Tolerance per entry: `Exact` (bit-identical, NaN matching NaN) wherever the kernel
//! rounds at the same steps as the node-by-node reference (element-wise ops, max, min,
//! argmax, integer sums); `F32_VMATH`, `F32_GELU` and `F32_EXP_SIN` where f32
//! transcendentals are the CPU backend's inline code with a documented ulp bound each
//! (the constants derive what that bound allows after the ops that follow); `F32_ACC`
//! where f32 sums or products accumulate in f32 while the reference sums exactly (see
//! the constant); `F32_STEPS` and `Close` where a
//! composite reduction is lowered to steps that each round in the kernel's dtype while
//! the reference computes the whole node in f64 and rounds once (mean = sum / n, var/std
//! through the mean, norm2 through f32 squares, and layernorm, whose `x - mean` cancels).

use ndfuse::{BackendKind, Context, DType, Tensor};
use ndfuse_tests::catalogue::{x, Case, Tol, CATALOGUE};
use ndfuse_tests::{assert_close, assert_matches};

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
