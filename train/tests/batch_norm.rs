//! Issue 36: data-parallel training averages buffers (batch norm's running statistics)
//! like parameters. Each replica updates its statistics from its own batches; after a
//! round their mean (weighted by batch size at frequency 1, equal at frequency k) is
//! the model's and, handed back, every replica's start for the next round. The
//! expected values are computed here in f64 from the same batches in the same order.

mod support;

use ndfuse::{Array, BatchNorm, Context};
use ndfuse_nn::{
    BatchNorm2d, Dataset, Flatten, Init, Layer, Linear, Loss, Optimizer, Sequential, Trainer,
};
use ndfuse_train::ParallelWrapper;
use support::cpus;

const CHANNELS: usize = 2;
const MOMENTUM: f64 = 0.1;

fn trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let m = Sequential::new()
        .push(BatchNorm2d::new(&ctx, "bn", CHANNELS, BatchNorm::new()).unwrap())
        .push(Flatten)
        .push(Linear::new(&ctx, "fc", CHANNELS * 9, 3, Init::GlorotUniform, 1).unwrap());
    let opt = Optimizer::sgd(&m.parameters(), 0.1);
    Trainer::new(m, opt, Loss::Mse).unwrap()
}

/// `n` images of 2 x 3 x 3 whose channels differ in mean and spread from image to
/// image, so that batches differ in their statistics.
fn images(n: usize) -> Dataset {
    let ctx = Context::new();
    let noise = ctx.rand_normal(&[n, CHANNELS, 3, 3], 0.0, 1.0, 11);
    let scale = ctx.rand_uniform(&[n, 1, 1, 1], 0.5, 3.0, 12);
    let shift = ctx.rand_normal(&[n, CHANNELS, 1, 1], 1.0, 2.0, 13);
    let x = (noise * scale + shift).eval().unwrap();
    let y = ctx.rand_normal(&[n, 3], 0.0, 1.0, 14).eval().unwrap();
    Dataset::new(x, y).unwrap()
}

/// Each channel's mean and unbiased variance over a batch `[b, C, 3, 3]`.
fn batch_stats(x: &Array) -> Vec<(f64, f64)> {
    let v = x.to_f64_vec();
    let per_image = CHANNELS * 9;
    (0..CHANNELS)
        .map(|c| {
            let xs: Vec<f64> = v
                .chunks(per_image)
                .flat_map(|img| img[c * 9..(c + 1) * 9].iter().copied())
                .collect();
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (mean, var)
        })
        .collect()
}

/// Each batch's statistics, in the epoch's order (batches of 8, seed 9).
fn epoch_stats(data: &Dataset) -> Vec<Vec<(f64, f64)>> {
    data.batches(8, 9, 0, false)
        .unwrap()
        .map(|b| batch_stats(&b.unwrap().features))
        .collect()
}

/// The statistics `(mean, var)` per channel after `stats` updates them in order.
fn update(mut r: Vec<(f64, f64)>, stats: &[Vec<(f64, f64)>]) -> Vec<(f64, f64)> {
    for s in stats {
        for (r, s) in r.iter_mut().zip(s) {
            r.0 = (1.0 - MOMENTUM) * r.0 + MOMENTUM * s.0;
            r.1 = (1.0 - MOMENTUM) * r.1 + MOMENTUM * s.1;
        }
    }
    r
}

/// The mean of each replica's statistics.
fn average(replicas: &[Vec<(f64, f64)>]) -> Vec<(f64, f64)> {
    let k = replicas.len() as f64;
    (0..CHANNELS)
        .map(|c| {
            let m = replicas.iter().map(|r| r[c].0).sum::<f64>() / k;
            let v = replicas.iter().map(|r| r[c].1).sum::<f64>() / k;
            (m, v)
        })
        .collect()
}

fn running(t: &Trainer<Sequential>) -> Vec<(f64, f64)> {
    let b = t.model().buffers();
    let (m, v) = (
        b[0].array().unwrap().to_f64_vec(),
        b[1].array().unwrap().to_f64_vec(),
    );
    m.into_iter().zip(v).collect()
}

fn assert_stats(got: &[(f64, f64)], want: &[(f64, f64)], what: &str) {
    for (c, (g, w)) in got.iter().zip(want).enumerate() {
        for (a, b, name) in [(g.0, w.0, "mean"), (g.1, w.1, "var")] {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{what}: channel {c}: running {name} {a}, expected {b}"
            );
        }
    }
}

fn fit(data: &Dataset, frequency: u64) -> Trainer<Sequential> {
    let mut pw = ParallelWrapper::builder(trainer())
        .workers(2)
        .devices(cpus(2, 2))
        .batch_size(8)
        .averaging_frequency(frequency)
        .seed(9)
        .progress(false)
        .build()
        .unwrap();
    pw.fit(data, 1).unwrap();
    pw.into_trainer()
}

#[test]
fn synchronous_rounds_average_the_replicas_statistics() {
    // Two rounds of two batches: batch j of the epoch's order goes to worker j mod 2;
    // each round starts every replica from the last round's average.
    let data = images(32);
    let stats = epoch_stats(&data);
    let mut want = vec![(0.0, 1.0); CHANNELS];
    for round in stats.chunks(2) {
        let replicas: Vec<_> = round
            .iter()
            .map(|s| update(want.clone(), std::slice::from_ref(s)))
            .collect();
        want = average(&replicas);
    }
    assert_stats(&running(&fit(&data, 1)), &want, "frequency 1");
}

#[test]
fn averaging_rounds_average_the_replicas_statistics() {
    // Frequency 2: one round of four batches, worker 0 steps on batches 0 and 2,
    // worker 1 on 1 and 3, then the statistics are averaged with the parameters.
    let data = images(32);
    let stats = epoch_stats(&data);
    let start = vec![(0.0, 1.0); CHANNELS];
    let replicas = [
        update(start.clone(), &[stats[0].clone(), stats[2].clone()]),
        update(start, &[stats[1].clone(), stats[3].clone()]),
    ];
    assert_stats(&running(&fit(&data, 2)), &average(&replicas), "frequency 2");
}
