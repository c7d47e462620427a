//! The same graph on the same backend gives bit-identical results whatever the thread
//! count: kernels split their work at boundaries that depend on shapes only, and partial
//! results (the chunks of a split reduction) are combined in an order fixed by shapes
//! too, never by which thread finished first.

use ndfuse::{Context, DType, Tensor};

fn graphs(ctx: &Context) -> Vec<Tensor> {
    let a = ctx.rand_normal(&[1024, 768], 0.0, 2.0, 1);
    let b = ctx.rand_normal(&[768], 0.0, 1.0, 2);
    // Split plans over many chunks (one long row; a few long strided rows), and column
    // bands spread over several threads.
    let long = ctx.rand_normal(&[(3 << 20) + 11], 0.0, 1.0, 3);
    let tall = ctx.rand_normal(&[1 << 18, 3], 0.0, 1.0, 4);
    let wide = ctx.rand_normal(&[128, 6000], 0.0, 1.0, 5);
    // Half inputs: f16/bf16 loads and stores, f32 accumulation (rows, split, columns).
    let (a16, long16) = (a.cast(DType::F16), long.cast(DType::BF16));
    let wide16 = wide.cast(DType::BF16);
    vec![
        (&a * &b + 1.0).gelu(),
        a.softmax(-1),
        a.layernorm(-1, 1e-5),
        a.sum(0),
        a.var(1),
        a.sum(..),
        a.argmax(1),
        long.sum(..),
        long.var(..),
        long.softmax(0),
        long.argmin(0),
        tall.sum(0),
        wide.sum(0),
        wide.norm2(0),
        a16.softmax(-1),
        (&a16 * 0.5).gelu(),
        long16.sum(..),
        wide16.sum(0),
    ]
}

#[test]
fn one_two_and_four_threads_give_the_same_bits() {
    let ctx = Context::new();
    let outs = graphs(&ctx);
    let refs: Vec<&Tensor> = outs.iter().collect();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        pool.install(|| ctx.eval(&refs).expect("evaluates"))
    };
    let one = run(1);
    for threads in [2, 4] {
        let many = run(threads);
        for (i, (x, y)) in one.iter().zip(&many).enumerate() {
            let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "output {i} differs between 1 and {threads} threads"
            );
        }
    }
}
