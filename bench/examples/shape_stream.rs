//! Issue 31's figures: streams of shapes in one process, with kernel families on
//! (the default) or off (`NDFUSE_KERNEL_FAMILIES=0`: every shape compiles its own
//! kernels). Run both, back to back, on a quiet machine:
//!
//! ```text
//! cargo run --release -p ndfuse-bench --example shape_stream
//! NDFUSE_KERNEL_FAMILIES=0 cargo run --release -p ndfuse-bench --example shape_stream
//! ```
//!
//! Each row: the kernels compiled and rebound to a family's code, the time spent
//! compiling (and checking rebinds), and the whole loop's time.

use ndfuse::{Context, SliceArg, Tensor};
use std::time::{Duration, Instant};

fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u64 * 2_654_435_761 + seed * 97) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

/// Runs `steps` evaluations built by `build(i)` and prints one row.
fn row(ctx: &Context, name: &str, steps: usize, build: impl Fn(usize) -> Tensor) {
    let stats = || {
        let s = ctx.compile_cache_stats().kernels;
        (s.misses, s.rebound)
    };
    let (c0, r0) = stats();
    let mut compile = Duration::ZERO;
    let started = Instant::now();
    for i in 0..steps {
        let y = build(i);
        let (_, report) = ctx.eval_report(&[&y]).expect("eval");
        compile += report.compile_time();
    }
    let total = started.elapsed();
    let (c1, r1) = stats();
    println!(
        "{name:<44} {steps:>4} steps: {:>4} compiled, {:>4} rebound; compiling {:>8.2} ms, \
         total {:>8.2} ms ({:.3} ms a step)",
        c1 - c0,
        r1 - r0,
        compile.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3 / steps as f64,
    );
}

fn main() {
    let families = std::env::var("NDFUSE_KERNEL_FAMILIES").map_or(true, |v| v != "0");
    println!(
        "kernel families {}",
        if families {
            "on"
        } else {
            "off (NDFUSE_KERNEL_FAMILIES=0)"
        }
    );
    let ctx = Context::new();
    let data = |shape: &[usize], seed: u64| {
        ctx.from_vec(values(shape.iter().product(), seed), shape)
            .expect("a tensor")
    };

    // A decode loop: one query against the first T rows of a 256-row cache.
    let (q, k, v) = (data(&[1, 64], 1), data(&[256, 64], 2), data(&[256, 64], 3));
    row(
        &ctx,
        "decode softmax(q @ k[:T].T) @ v[:T], T=1..256",
        256,
        |i| {
            let rows = [SliceArg::new(None, Some(i as i64 + 1), 1)];
            q.matmul(&k.slice(&rows).transpose())
                .softmax(-1)
                .matmul(&v.slice(&rows))
        },
    );

    // An MLP's forward pass over every batch size from 1 to 256.
    let (w1, b1, w2) = (data(&[256, 512], 4), data(&[512], 5), data(&[512, 10], 6));
    row(&ctx, "mlp gelu(x @ w1 + b1) @ w2, batch 1..256", 256, |i| {
        let x = data(&[i + 1, 256], 7);
        (x.matmul(&w1) + &b1).gelu().matmul(&w2).softmax(-1)
    });

    // Layer norm over a growing number of rows of 768.
    row(&ctx, "layernorm(x, -1), rows 1..256 of 768", 256, |i| {
        data(&[i + 1, 768], 8).layernorm(-1, 1e-5)
    });
}
