//! Ranks simulated by threads (what MPI processes do, with a shared-memory collective):
//! 2 ranks of one worker each at frequency 1 take the steps of one process of twice the
//! batch, and their parameters are identical after every step (the wrapper's debug hash
//! check runs in these builds); at frequency 3 the result is the mean of the replicas
//! trained by hand.

mod support;

use ndfuse::{Array, BatchNorm, Context};
use ndfuse_nn::{
    Activation, BatchNorm2d, Dataset, Flatten, Init, Layer, Linear, Loss, Optimizer, Sequential,
    Trainer,
};
use ndfuse_train::{ParallelWrapper, Ranks};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A rendezvous of `size` threads: each collective waits for every rank's contribution
/// (at most 30 s), then every rank reads the combined result.
#[derive(Debug)]
struct Hub {
    size: usize,
    state: Mutex<Round>,
    turn: Condvar,
}

#[derive(Debug, Default)]
struct Round {
    generation: u64,
    parts: Vec<Option<Vec<f64>>>,
    result: Option<Vec<Vec<f64>>>,
    taken: usize,
}

impl Hub {
    fn new(size: usize) -> Arc<Hub> {
        Arc::new(Hub {
            size,
            state: Mutex::new(Round {
                parts: vec![None; size],
                ..Round::default()
            }),
            turn: Condvar::new(),
        })
    }

    /// Every rank's `mine`, in rank order.
    fn gather(&self, rank: usize, mine: Vec<f64>) -> Vec<Vec<f64>> {
        let mut s = self.state.lock().unwrap();
        // Wait for the previous round to be read by everyone.
        while s.result.is_some() {
            s = self.turn.wait(s).unwrap();
        }
        s.parts[rank] = Some(mine);
        if s.parts.iter().all(Option::is_some) {
            s.result = Some(s.parts.iter_mut().map(|p| p.take().unwrap()).collect());
            s.generation += 1;
            self.turn.notify_all();
        } else {
            let g = s.generation;
            let (guard, timeout) = self
                .turn
                .wait_timeout_while(s, Duration::from_secs(30), |s| s.generation == g)
                .unwrap();
            assert!(!timeout.timed_out(), "rank {rank}: a collective timed out");
            s = guard;
        }
        let all = s.result.clone().unwrap();
        s.taken += 1;
        if s.taken == self.size {
            s.taken = 0;
            s.result = None;
            self.turn.notify_all();
        }
        all
    }
}

#[derive(Debug)]
struct ThreadRanks {
    rank: usize,
    hub: Arc<Hub>,
}

impl Ranks for ThreadRanks {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.hub.size
    }
    fn allreduce_sum(&self, arrays: &mut [Array]) -> ndfuse_train::Result<()> {
        let flat: Vec<f64> = arrays.iter().flat_map(|a| a.to_f64_vec()).collect();
        let all = self.hub.gather(self.rank, flat);
        let mut offset = 0;
        for a in arrays.iter_mut() {
            let n = a.len();
            let sum: Vec<f32> = (0..n)
                .map(|i| all.iter().fold(0.0f32, |acc, r| acc + r[offset + i] as f32))
                .collect();
            *a = Array::from_vec(sum, a.shape()).unwrap();
            offset += n;
        }
        Ok(())
    }
    fn allreduce_sum_f64(&self, values: &mut [f64]) -> ndfuse_train::Result<()> {
        let all = self.hub.gather(self.rank, values.to_vec());
        for (i, v) in values.iter_mut().enumerate() {
            *v = all.iter().map(|r| r[i]).sum();
        }
        Ok(())
    }
    fn allreduce_max_f64(&self, values: &mut [f64]) -> ndfuse_train::Result<()> {
        let all = self.hub.gather(self.rank, values.to_vec());
        for (i, v) in values.iter_mut().enumerate() {
            *v = all.iter().map(|r| r[i]).fold(f64::MIN, f64::max);
        }
        Ok(())
    }
    fn all_equal(&self, value: u64) -> ndfuse_train::Result<bool> {
        let all = self.hub.gather(self.rank, vec![f64::from_bits(value)]);
        Ok(all.iter().all(|r| r[0].to_bits() == value))
    }
}

fn regression(n: usize) -> Dataset {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[n, 6], 0.0, 1.0, 5).eval().unwrap();
    let w = ctx.rand_normal(&[6, 2], 0.0, 1.0, 6);
    let y = ctx.tensor(x.clone()).matmul(&w).tanh().eval().unwrap();
    Dataset::new(x, y).unwrap()
}

fn sgd_trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[6, 16, 2], Activation::Tanh, 3).unwrap();
    let opt = Optimizer::sgd(&model.parameters(), 0.1).momentum(0.9);
    Trainer::new(model, opt, Loss::Mse).unwrap()
}

/// A batch norm over images of 2 x 3 x 3, then a linear layer.
fn bn_trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let m = Sequential::new()
        .push(BatchNorm2d::new(&ctx, "bn", 2, BatchNorm::new()).unwrap())
        .push(Flatten)
        .push(Linear::new(&ctx, "fc", 18, 3, Init::GlorotUniform, 1).unwrap());
    let opt = Optimizer::sgd(&m.parameters(), 0.1);
    Trainer::new(m, opt, Loss::Mse).unwrap()
}

/// `n` images whose channels' statistics differ from image to image.
fn images(n: usize) -> Dataset {
    let ctx = Context::new();
    let noise = ctx.rand_normal(&[n, 2, 3, 3], 0.0, 1.0, 11);
    let shift = ctx.rand_normal(&[n, 2, 1, 1], 1.0, 2.0, 13);
    let x = (noise + shift).eval().unwrap();
    let y = ctx.rand_normal(&[n, 3], 0.0, 1.0, 14).eval().unwrap();
    Dataset::new(x, y).unwrap()
}

/// The model's parameters, then its buffers (batch norm's running statistics).
fn values(t: &Trainer<impl Layer>) -> Vec<Vec<f32>> {
    t.model()
        .parameters()
        .iter()
        .chain(&t.model().buffers())
        .map(|p| p.array().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

/// Trains on `ranks` threads, each one rank of one worker; returns every rank's
/// parameters and scores.
fn on_ranks(ranks: usize, frequency: u64, data: &Dataset) -> Vec<(Vec<Vec<f32>>, Vec<f64>)> {
    on_ranks_of(sgd_trainer, ranks, frequency, data)
}

fn on_ranks_of(
    trainer: fn() -> Trainer<Sequential>,
    ranks: usize,
    frequency: u64,
    data: &Dataset,
) -> Vec<(Vec<Vec<f32>>, Vec<f64>)> {
    let hub = Hub::new(ranks);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let hub = Arc::clone(&hub);
                s.spawn(move || {
                    let set = support::cpus(1, 1);
                    let mut pw = ParallelWrapper::builder(trainer())
                        .workers(1)
                        .devices(set)
                        .batch_size(8)
                        .averaging_frequency(frequency)
                        .seed(9)
                        .progress(false)
                        .ranks(Arc::new(ThreadRanks { rank, hub }))
                        .build()
                        .unwrap();
                    let report = pw.fit(data, 1).unwrap();
                    (values(pw.trainer()), report.scores)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn two_ranks_at_frequency_1_take_the_steps_of_one_process_of_twice_the_batch() {
    let data = regression(16 * 20 + 8); // the last round: one batch, rank 1 has none
    let mut single = sgd_trainer();
    let mut losses = Vec::new();
    for b in data.batches(16, 9, 0, false).unwrap() {
        losses.push(single.step_batch(b.unwrap()).unwrap());
    }
    let ranks = on_ranks(2, 1, &data);
    assert_eq!(
        ranks[0], ranks[1],
        "both ranks hold the same parameters and scores"
    );
    let (params, scores) = &ranks[0];
    assert_eq!(scores.len(), losses.len());
    for (i, (a, b)) in scores.iter().zip(&losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "step {i}: {a} vs {b}"
        );
    }
    for (p, q) in params.iter().zip(values(&single)) {
        for (a, b) in p.iter().zip(q) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

#[test]
fn two_ranks_at_frequency_3_average_their_replicas() {
    let data = regression(8 * 6);
    let ranks = on_ranks(2, 3, &data);
    assert_eq!(ranks[0].0, ranks[1].0);
    let batches: Vec<_> = data
        .batches(8, 9, 0, false)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // Rank r's one worker trains batches 3r, 3r + 1, 3r + 2.
    let replicas: Vec<Vec<Vec<f32>>> = (0..2)
        .map(|r| {
            let mut t = sgd_trainer();
            for b in &batches[3 * r..3 * r + 3] {
                t.step_batch(b.clone()).unwrap();
            }
            values(&t)
        })
        .collect();
    for (i, got) in ranks[0].0.iter().enumerate() {
        for (e, g) in got.iter().enumerate() {
            let want = (replicas[0][i][e] + replicas[1][i][e]) / 2.0;
            assert!(
                (g - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "param {i} elem {e}: {g} vs {want}"
            );
        }
    }
}

#[test]
fn two_ranks_average_running_statistics_as_two_local_workers_do() {
    // Five batches: the last round has one, and rank 1 takes part with none.
    let data = images(8 * 5);
    let ranks = on_ranks_of(bn_trainer, 2, 1, &data);
    assert_eq!(ranks[0].0, ranks[1].0, "both ranks hold the same values");
    let set = support::cpus(2, 2);
    let mut local = ParallelWrapper::builder(bn_trainer())
        .workers(2)
        .devices(set)
        .batch_size(8)
        .seed(9)
        .progress(false)
        .build()
        .unwrap();
    local.fit(&data, 1).unwrap();
    let want = values(local.trainer());
    let got = &ranks[0].0;
    assert_eq!(
        got.len(),
        6,
        "4 parameters, then the running mean and variance"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "value {i}: {a} vs {b}"
            );
        }
    }
}
