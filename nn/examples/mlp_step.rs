//! scratch timing
use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Layer, Loss, Optimizer, Sequential, Trainer};
use std::time::Instant;
fn main() {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[784, 512, 512, 10], Activation::Relu, 5).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 1e-3);
    let mut t = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    let x = ctx.rand_normal(&[128, 784], 0.0, 1.0, 1).eval().unwrap();
    let labels: Vec<i64> = (0..128).map(|i| i % 10).collect();
    let y = Array::from_vec(labels, &[128]).unwrap();
    let (x, y) = (ctx.tensor(x), ctx.tensor(y));
    let (_, r) = t.step_report(&x, &y).unwrap();
    println!("kernels {}", r.kernel_count());
    if std::env::var("SHOW").is_ok() {
        println!("{}", r.kernels_text());
    }
    let mut times = vec![];
    for _ in 0..30 {
        let s = Instant::now();
        let (_, r) = t.step_report(&x, &y).unwrap();
        let e = r.evaluation();
        times.push((
            s.elapsed().as_secs_f64() * 1e3,
            e.run_time.as_secs_f64() * 1e3,
            e.compile_time.as_secs_f64() * 1e3,
        ));
    }
    times.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let flops = 2.0 * 128.0 * (784.0 * 512.0 + 512.0 * 512.0 + 512.0 * 10.0) * 3.0;
    let med = times[15];
    println!(
        "median total {:.3} ms run {:.3} ms compile {:.3}; {:.1} GFLOP/s",
        med.0,
        med.1,
        med.2,
        flops / med.0 / 1e6
    );
}
