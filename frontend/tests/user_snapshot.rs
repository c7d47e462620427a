//! A user's own snapshot test of a generated kernel, as `examples/snapshot_test.rs`
//! describes: the whole `explain` output (graph, schedule, kernel description,
//! Cranelift IR) of a small expression is pinned, so a change in what ndfuse compiles
//! it to shows up as a diff in review. Update with `cargo insta review` or
//! `INSTA_UPDATE=always cargo test -p ndfuse --test user_snapshot`.

use ndfuse::{Context, Tensor};

/// The same made-up activation as the example.
fn my_activation(x: &Tensor) -> Tensor {
    (x * 0.5 + 0.1).tanh() * 2.0
}

#[test]
fn my_activation_compiles_to_one_kernel() {
    let ctx = Context::new();
    // An input leaf (data, not a constant), so the kernel reads it as yours would.
    let x = ctx
        .from_vec(vec![0.0f32; 32], &[4, 8])
        .expect("32 elements");
    let y = my_activation(&x);
    // Explained before anything evaluates it, so the kernel shows as freshly compiled
    // (`[jit]`), not taken from the process-wide kernel cache (`[jit, cached]`).
    insta::assert_snapshot!(ctx.explain(&[&y]).expect("explains"));
    // The kernel count is asserted too: a snapshot alone would accept a split into two
    // kernels as "just a diff".
    let (_, report) = ctx.eval_report(&[&y]).expect("evaluates");
    assert_eq!(report.kernel_count(), 1, "{}", report.annotated_graph());
}
