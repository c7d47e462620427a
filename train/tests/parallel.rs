//! ParallelWrapper: synchronous averaging equals one worker of the combined batch,
//! parameter averaging equals the mean of the replicas, runs are the same bits run to
//! run and whatever the threads per device, and two one-thread CPU workers learn the
//! digits.

mod support;

use ndfuse::{Array, Context};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::ParallelWrapper;
use std::path::Path;
use support::cpus;

/// A regression problem of `n` samples: 6 features, 2 targets.
fn regression(n: usize) -> Dataset {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[n, 6], 0.0, 1.0, 5).eval().unwrap();
    let w = ctx.rand_normal(&[6, 2], 0.0, 1.0, 6);
    let y = ctx.tensor(x.clone()).matmul(&w).tanh().eval().unwrap();
    Dataset::new(x, y).unwrap()
}

fn sgd_trainer(ctx: &Context) -> Trainer<Sequential> {
    let model = Sequential::mlp(ctx, &[6, 16, 2], Activation::Tanh, 3).unwrap();
    let opt = Optimizer::sgd(&model.parameters(), 0.1).momentum(0.9);
    Trainer::new(model, opt, Loss::Mse).unwrap()
}

fn values(t: &Trainer<impl Layer>) -> Vec<Vec<f32>> {
    t.model()
        .parameters()
        .iter()
        .map(|p| p.array().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn synchronous_averaging_of_n_workers_is_one_worker_of_n_times_the_batch() {
    let data = regression(16 * 20);
    // One worker, batch 16, stepping through the epoch's order.
    let ctx = Context::new();
    let mut single = sgd_trainer(&ctx);
    let mut losses = Vec::new();
    for b in data.batches(16, 9, 0, false).unwrap() {
        losses.push(single.step_batch(b.unwrap()).unwrap());
    }
    // Two workers of batch 8: batch j of the same order goes to worker j mod 2.
    let mut pw = ParallelWrapper::builder(sgd_trainer(&Context::new()))
        .workers(2)
        .devices(cpus(2, 2))
        .batch_size(8)
        .seed(9)
        .progress(false)
        .build()
        .unwrap();
    let report = pw.fit(&data, 1).unwrap();
    assert_eq!(report.rounds, 20);
    // Per step: the averaged score is the combined batch's loss (f32 rounding apart).
    for (i, (a, b)) in report.scores.iter().zip(&losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "step {i}: {a} vs {b}"
        );
    }
    for (p, q) in values(pw.trainer()).iter().zip(values(&single)) {
        for (a, b) in p.iter().zip(q) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
    let r = &report.workers;
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].samples + r[1].samples, 16 * 20);
}

#[test]
fn parameter_averaging_gives_the_mean_of_the_replicas() {
    let data = regression(8 * 6);
    let (k, workers) = (3, 2);
    let mut pw = ParallelWrapper::builder(sgd_trainer(&Context::new()))
        .workers(workers)
        .devices(cpus(2, 2))
        .batch_size(8)
        .averaging_frequency(k)
        .seed(4)
        .progress(false)
        .build()
        .unwrap();
    pw.fit(&data, 1).unwrap();
    // The replicas by hand: worker j trains batches j, j + 2, j + 4 of the order.
    let batches: Vec<_> = data
        .batches(8, 4, 0, false)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let replicas: Vec<Vec<Vec<f32>>> = (0..workers)
        .map(|j| {
            let mut t = sgd_trainer(&Context::new());
            for b in batches.iter().skip(j).step_by(workers) {
                t.step_batch(b.clone()).unwrap();
            }
            values(&t)
        })
        .collect();
    for (i, got) in values(pw.trainer()).iter().enumerate() {
        for (e, g) in got.iter().enumerate() {
            let want = (replicas[0][i][e] + replicas[1][i][e]) / 2.0;
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "param {i} elem {e}: {g} vs {want}"
            );
        }
    }
    assert_eq!(pw.trainer().optimizer().steps(), k);
}

fn run_bits(threads_each: usize, frequency: u64) -> Vec<Vec<u32>> {
    let data = regression(8 * 12);
    let mut pw = ParallelWrapper::builder(sgd_trainer(&Context::new()))
        .workers(2)
        .devices(cpus(2, 2 * threads_each))
        .batch_size(8)
        .averaging_frequency(frequency)
        .progress(false)
        .build()
        .unwrap();
    pw.fit(&data, 2).unwrap();
    values(pw.trainer())
        .into_iter()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn runs_are_the_same_bits_whatever_the_threads_inside_each_device() {
    for frequency in [1, 4] {
        let a = run_bits(1, frequency);
        assert_eq!(
            a,
            run_bits(1, frequency),
            "run to run, frequency {frequency}"
        );
        assert_eq!(
            a,
            run_bits(2, frequency),
            "1 vs 2 threads a device, frequency {frequency}"
        );
    }
}

#[test]
fn two_one_thread_cpu_workers_learn_the_digits() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy")).unwrap();
    let ctx = Context::new();
    let x: Array = (ctx.tensor(raw.features().clone()) / 16.0).eval().unwrap();
    let (train, test) = Dataset::new(x, raw.labels().clone())
        .unwrap()
        .split(0.2, 2026)
        .unwrap();
    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7).unwrap();
    let opt = Optimizer::adam(&model.parameters(), 3e-3);
    let trainer = Trainer::new(model, opt, Loss::CrossEntropy).unwrap();
    for frequency in [1, 4] {
        let t = Trainer::new(
            trainer.model().replica(),
            trainer
                .optimizer()
                .replica(&trainer.model().parameters())
                .unwrap(),
            Loss::CrossEntropy,
        );
        let t = match t {
            Ok(t) => t,
            Err(_) => {
                // replica() gives new parameters: the optimiser must be over them.
                let m = trainer.model().replica();
                let o = Optimizer::adam(&m.parameters(), 3e-3);
                Trainer::new(m, o, Loss::CrossEntropy).unwrap()
            }
        };
        let mut pw = ParallelWrapper::builder(t)
            .workers(2)
            .devices(cpus(2, 2))
            .batch_size(16)
            .averaging_frequency(frequency)
            .progress(false)
            .build()
            .unwrap();
        pw.fit(&train, 12).unwrap();
        let acc = pw
            .trainer()
            .evaluate_dataset(&test, 0)
            .unwrap()
            .accuracy
            .unwrap();
        assert!(
            acc >= 0.96,
            "frequency {frequency}: held-out accuracy {acc}"
        );
    }
}
