//! The same graph on the same backend gives bit-identical results whatever the thread
//! count: kernels split their work at boundaries that depend on shapes only, and no
//! partial results are combined across threads.

use ndfuse::{Context, Tensor};

fn graphs(ctx: &Context) -> Vec<Tensor> {
    let a = ctx.rand_normal(&[1024, 768], 0.0, 2.0, 1);
    let b = ctx.rand_normal(&[768], 0.0, 1.0, 2);
    vec![
        (&a * &b + 1.0).gelu(),
        a.softmax(-1),
        a.layernorm(-1, 1e-5),
        a.sum(0),
        a.var(1),
        a.sum(..),
        a.argmax(1),
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
