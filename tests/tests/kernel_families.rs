//! Issue 31: kernels that differ only in their leading extent (a batch, a number of
//! rows) share one compile. The CPU kernel cache looks a new kernel up by its shape
//! family (`Kernel::family_key`) and runs a compiled member's code when the new kernel
//! lowers to the very same functions (`CompiledKernel::rebind`), so a stream of batch
//! sizes compiles each kernel once per size class, and a partial last batch compiles
//! nothing.
//!
//! One test in this file: the caches and their counters are the process's.

use ndfuse::{BackendKind, Context, Tensor};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

/// (compiles, rebinds) of the CPU kernel cache so far.
fn counters(ctx: &Context) -> (u64, u64) {
    let s = ctx.compile_cache_stats().kernels;
    (s.misses, s.rebound)
}

/// Runs `f` and returns what it compiled and rebound.
fn delta(ctx: &Context, f: impl FnOnce()) -> (u64, u64) {
    let (c0, r0) = counters(ctx);
    f();
    let (c1, r1) = counters(ctx);
    (c1 - c0, r1 - r0)
}

#[test]
fn a_stream_of_leading_extents_compiles_each_kernel_once_per_size_class() {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("a CPU context");
    let input = |shape: &[usize], seed: u64| -> Tensor {
        ctx.from_vec(values(shape.iter().product(), seed), shape)
            .expect("a tensor")
    };

    // softmax(x, -1).sum(1) over 1..=300 rows of 96: a row program. 300 rows of 96
    // stay below the wide path's size class, so one compile (and one for the single
    // row, whose index plan drops the axis) serves every row count.
    let (compiles, rebound) = delta(&ctx, || {
        for rows in 1..=300 {
            let x = input(&[rows, 96], rows as u64);
            let y = x.softmax(-1).sum(1);
            let out = ctx.eval(&[&y]).expect("eval")[0].to_f64_vec();
            assert_eq!(out.len(), rows);
            for s in out {
                assert!((s - 1.0).abs() < 1e-5, "{rows} rows: a row sums to {s}");
            }
        }
    });
    println!("softmax rows 1..=300: {compiles} compiles, {rebound} rebound");
    assert!(compiles <= 4, "{compiles} compiles for 300 row counts");
    assert!(rebound >= 296, "only {rebound} of 300 row counts rebound");

    // An MLP layer's forward pass, gelu(x @ w + b), for full batches of 64 and a
    // partial last batch of 23: the partial batch compiles nothing.
    let w = input(&[48, 32], 1);
    let b = input(&[32], 2);
    let layer = |batch: usize, seed: u64| {
        let x = input(&[batch, 48], seed);
        let y = (x.matmul(&w) + &b).gelu();
        ctx.eval(&[&y]).expect("eval")[0].to_f64_vec()
    };
    let full = delta(&ctx, || {
        layer(64, 3);
        layer(64, 4);
    });
    let partial = delta(&ctx, || {
        layer(23, 5);
    });
    println!("gelu(x @ w + b): full batches {full:?}, partial batch {partial:?} (compiles, rebound)");
    assert!(full.0 >= 1, "the first batch compiles");
    assert_eq!(partial.0, 0, "the partial batch compiled {} kernels", partial.0);
    assert!(partial.1 >= 1);

    // The rebound kernel computes what the interpreter does.
    let x = input(&[23, 48], 5);
    let y = (x.matmul(&w) + &b).gelu();
    let jit = ctx.eval(&[&y]).expect("eval")[0].to_f64_vec();
    let interp = Context::builder()
        .backend(BackendKind::Interp)
        .build()
        .expect("an interpreter context");
    let xi = interp.from_vec(values(23 * 48, 5), &[23, 48]).unwrap();
    let wi = interp.from_vec(values(48 * 32, 1), &[48, 32]).unwrap();
    let bi = interp.from_vec(values(32, 2), &[32]).unwrap();
    let yi = (xi.matmul(&wi) + &bi).gelu();
    let want = interp.eval(&[&yi]).expect("eval")[0].to_f64_vec();
    for (k, (a, e)) in jit.iter().zip(&want).enumerate() {
        assert!((a - e).abs() <= 1e-5 * (1.0 + e.abs()), "element {k}: {a} vs {e}");
    }
}
