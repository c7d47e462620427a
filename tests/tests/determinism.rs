//! The same graph on the same backend gives bit-identical results whatever the thread
//! count: kernels split their work at boundaries that depend on shapes only, and partial
//! results (the chunks of a split reduction) are combined in an order fixed by shapes
//! too, never by which thread finished first. The LAPACK level's library calls too.

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
    same_bits_on_one_two_and_four_threads(&ctx, &graphs(&ctx));
}

/// The LAPACK level: Cholesky and LU (faer's parallel recursions, large enough to
/// split), a single inverse, QR, SVD and eigh, and a batch of inverses.
#[test]
fn the_lapack_level_gives_the_same_bits_on_any_thread_count() {
    use ndfuse::linalg::{self, QrMode};
    let ctx = Context::builder()
        .dtype(DType::F64)
        .build()
        .expect("a context");
    let n = 600;
    let a = ctx.rand_normal(&[n, n], 0.0, 1.0, 11);
    // Diagonally dominant: positive definite from its lower triangle.
    let shift = ctx
        .full_dtype(&[n, n], n as f64, DType::F64)
        .tril(0)
        .triu(0);
    let p = &ctx.rand_normal(&[n, n], 0.0, 1.0, 12) + &shift;
    let b = ctx.rand_normal(&[n, 3], 0.0, 1.0, 13);
    let d = ctx.rand_normal(&[160, 160], 0.0, 1.0, 14);
    let small = ctx.rand_normal(&[6, 20, 20], 0.0, 1.0, 15);
    let q = linalg::qr(&d, QrMode::Reduced);
    let s = linalg::svd(&d, false);
    let outs = [
        linalg::cholesky(&p, false),
        linalg::solve(&a, &b),
        linalg::det(&a),
        linalg::inv(&a),
        q.q,
        q.r,
        s.u,
        s.s,
        linalg::eigh(&d, false).eigenvectors,
        linalg::inv(&small),
    ];
    same_bits_on_one_two_and_four_threads(&ctx, &outs);
}

/// Evaluates `outs` on pools of 1, 2 and 4 threads and compares the bits.
fn same_bits_on_one_two_and_four_threads(ctx: &Context, outs: &[Tensor]) {
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
