//! Seeing what ndfuse did with an expression: `cargo run --example inspect -p ndfuse`.
//!
//! Prints, for a softmax and an element-wise expression sharing one input: the graph
//! as built (the stable text IR), what `explain` says evaluation would do (schedule,
//! kernels, generated Cranelift IR) without running anything, the graph annotated with
//! what an evaluation actually did, and the Graphviz form of the graph.

use ndfuse::Context;

fn main() -> Result<(), ndfuse::Error> {
    let ctx = Context::new();
    let x = ctx.rand_uniform(&[2, 4], -1.0, 1.0, 1);
    let p = x.softmax(-1);
    let g = (&x * 2.0 + 1.0).tanh();

    println!("######## the graph, before any pass (Context::graph_text)\n");
    println!("{}", ctx.graph_text(&[&p, &g])?);

    println!("######## what eval would do (Context::explain; nothing runs)\n");
    println!("{}", ctx.explain(&[&p, &g])?);

    let (outs, report) = ctx.eval_report(&[&p, &g])?;
    println!("######## what eval did (Report::annotated_graph)\n");
    println!("{}", report.annotated_graph());
    println!(
        "kernels launched: {}; bytes read and written: {}; results {:?} and {:?}\n",
        report.kernel_count(),
        report.bytes_moved(),
        outs[0].shape(),
        outs[1].shape()
    );

    println!("######## the kernels (Report::kernels_text)\n");
    println!("{}", report.kernels_text());

    println!("######## Graphviz (Report::graph().to_dot(); pipe into `dot -Tsvg`)\n");
    println!("{}", report.graph().to_dot());
    Ok(())
}
