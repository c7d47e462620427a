//! How to snapshot-test the kernel ndfuse generates for your own expression, so that a
//! change in what it compiles to shows up in review: `cargo run --example snapshot_test
//! -p ndfuse` prints what the snapshot holds.
//!
//! The test itself is `frontend/tests/user_snapshot.rs`; in your crate it is:
//!
//! ```text
//! // Cargo.toml: [dev-dependencies] insta = "1"
//! #[test]
//! fn my_activation_compiles_to_one_kernel() {
//!     let ctx = ndfuse::Context::new();
//!     let x = ctx.from_vec(vec![0.0f32; 32], &[4, 8]).unwrap();
//!     let y = my_activation(&x);
//!     insta::assert_snapshot!(ctx.explain(&[&y]).unwrap());
//! }
//! ```
//!
//! The first run writes `tests/snapshots/*.snap.new`; `cargo insta review` (or
//! `INSTA_UPDATE=always cargo test`) accepts it. From then on, any change in the graph,
//! the schedule, the kernel descriptions or the generated Cranelift IR fails the test
//! with a diff. `explain` only compiles, it never runs, so the input's values do not
//! matter: only its shape and dtype do, and the snapshot is the same on every machine.

use ndfuse::{Context, Tensor};

/// The user's own expression: a scaled, shifted tanh (a made-up activation).
fn my_activation(x: &Tensor) -> Tensor {
    (x * 0.5 + 0.1).tanh() * 2.0
}

fn main() -> Result<(), ndfuse::Error> {
    let ctx = Context::new();
    // An input leaf (data, not a constant), so the kernel reads it as yours would.
    let x = ctx.from_vec(vec![0.0f32; 32], &[4, 8])?;
    let y = my_activation(&x);
    print!("{}", ctx.explain(&[&y])?);
    Ok(())
}
