//! Issue 36: `BatchNorm2d` trains with PyTorch's semantics: each training step
//! normalises by the batch's statistics and moves the running mean and variance by the
//! momentum (the variance unbiased), on the step that compiles and on the cached steps
//! after it; evaluation uses the running statistics; checkpoints keep them.

use ndfuse::{Array, BatchNorm, Context};
use ndfuse_nn::{
    Activation, BatchNorm2d, Flatten, Init, Layer, Linear, Loss, Mode, Optimizer, Sequential,
    Trainer,
};

fn images(seed: u64) -> Array {
    let v: Vec<f32> = (0..8 * 2 * 3 * 3)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(977);
            ((h >> 20) % 1000) as f32 / 250.0 - 1.0 + (i % 18 / 9) as f32
        })
        .collect();
    Array::from_vec(v, &[8, 2, 3, 3]).unwrap()
}

/// Per channel of `x [8, 2, 3, 3]`: the mean and the unbiased variance over N, H, W.
fn stats(x: &Array) -> Vec<(f64, f64)> {
    let v = x.to_f64_vec();
    (0..2)
        .map(|c| {
            let vals: Vec<f64> = (0..8)
                .flat_map(|n| (0..9).map(move |p| (n, p)))
                .map(|(n, p)| v[n * 18 + c * 9 + p])
                .collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|a| (a - m).powi(2)).sum::<f64>() / (vals.len() - 1) as f64;
            (m, var)
        })
        .collect()
}

fn model(ctx: &Context) -> Sequential {
    Sequential::new()
        .push(BatchNorm2d::new(ctx, "bn", 2, BatchNorm::new()).unwrap())
        .push(Flatten)
        .push(Linear::new(ctx, "fc", 18, 3, Init::GlorotUniform, 1).unwrap())
        .push(Activation::Tanh)
}

fn close(got: &[f64], want: &[f64], what: &str) {
    for (g, w) in got.iter().zip(want) {
        // f32 sums of 72 values below 3 and one f32 rounding of the update.
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}: {got:?} against {want:?}"
        );
    }
}

#[test]
fn running_statistics_follow_pytorchs_updates_and_serve_evaluation() {
    let ctx = Context::new();
    let m = model(&ctx);
    let buffers = m.buffers();
    assert_eq!(buffers.len(), 2);
    let opt = Optimizer::sgd(&m.parameters(), 0.1);
    let mut t = Trainer::new(m, opt, Loss::Mse).unwrap();
    let target = Array::from_vec(vec![0.5f32; 24], &[8, 3]).unwrap();
    let (mut rm, mut rv) = (vec![0.0; 2], vec![1.0; 2]);
    // Three steps: the first compiles the step, the others run it cached.
    for seed in 0..3 {
        let x = images(seed);
        t.step(&x, &target).unwrap();
        for (c, (mean, var)) in stats(&x).into_iter().enumerate() {
            rm[c] = 0.9 * rm[c] + 0.1 * mean;
            rv[c] = 0.9 * rv[c] + 0.1 * var;
        }
        let got_m = buffers[0].array().unwrap().to_f64_vec();
        let got_v = buffers[1].array().unwrap().to_f64_vec();
        close(&got_m, &rm, &format!("running mean after step {seed}"));
        close(&got_v, &rv, &format!("running var after step {seed}"));
    }
    // Evaluation normalises by the running statistics, then applies the trained
    // weight and bias.
    let x = images(9);
    let bn = &t.model().layers()[0];
    let affine: Vec<Vec<f64>> = bn
        .parameters()
        .iter()
        .map(|p| p.array().unwrap().to_f64_vec())
        .collect();
    let y = bn
        .forward(&ctx.tensor(x.clone()), &Mode::eval())
        .eval()
        .unwrap()
        .to_f64_vec();
    let xv = x.to_f64_vec();
    for (i, (&got, &xi)) in y.iter().zip(&xv).enumerate() {
        let c = (i / 9) % 2;
        let want = (xi - rm[c]) / (rv[c] + 1e-5).sqrt() * affine[0][c] + affine[1][c];
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "element {i}: {got} against {want}"
        );
    }

    // A checkpoint keeps them: saved, moved by another step, restored by loading.
    let dir = std::env::temp_dir().join(format!("ndfuse-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bn.safetensors");
    t.save(&path).unwrap();
    let saved = buffers[0].array().unwrap().to_f64_vec();
    t.step(&images(5), &target).unwrap();
    assert_ne!(buffers[0].array().unwrap().to_f64_vec(), saved);
    t.load(&path).unwrap();
    assert_eq!(buffers[0].array().unwrap().to_f64_vec(), saved);
    std::fs::remove_dir_all(&dir).ok();
}
