//! Fault injection: a device that fails from its 8th evaluation on (step 7, counting
//! from 0). With `OnFailure::Continue` training goes on with the other worker and no
//! sample is lost; with `OnFailure::Stop` the run returns the error naming the device
//! and leaves the last good parameters in a checkpoint. Each run has a time bound: a
//! hang fails the test instead of stalling it.

use ndfuse::{Context, CpuDevice, Device, DeviceId, DeviceSet};
use ndfuse_ir::{Graph, HostArray};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_runtime::{Config, Evaluation, Inputs, RuntimeError};
use ndfuse_train::{Error, OnFailure, ParallelReport, ParallelWrapper};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

/// A CPU device whose evaluations fail from call `fail_from` (counting from 0) on, as a
/// GPU whose kernel launches start failing would.
#[derive(Debug)]
struct Flaky {
    inner: CpuDevice,
    calls: AtomicUsize,
    fail_from: usize,
}

impl Device for Flaky {
    fn id(&self) -> DeviceId {
        self.inner.id()
    }
    fn is_gpu(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        format!("flaky {}", self.inner.describe())
    }
    fn execute(
        &self,
        g: &Graph,
        inputs: &Inputs,
        cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.fail_from {
            return Err(RuntimeError::Cuda(format!(
                "{}: kernel launch failed (injected)",
                self.id()
            )));
        }
        self.inner.execute(g, inputs, cfg)
    }
    fn transfer(&self, a: &HostArray) -> Result<HostArray, RuntimeError> {
        self.inner.transfer(a)
    }
}

/// cpu:0 works; cpu:1 fails from its 8th evaluation on.
fn devices() -> Arc<DeviceSet> {
    let mut cpus = CpuDevice::split(2, 2).unwrap().into_iter();
    let good = cpus.next().unwrap();
    let flaky = Flaky {
        inner: cpus.next().unwrap(),
        calls: AtomicUsize::new(0),
        fail_from: 7,
    };
    let set: Vec<Arc<dyn Device>> = vec![Arc::new(good), Arc::new(flaky)];
    Arc::new(DeviceSet::new(set, &Config::load().unwrap()).unwrap())
}

fn data() -> Dataset {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[8 * 30, 5], 0.0, 1.0, 1).eval().unwrap();
    let y = ctx.tensor(x.clone()).sum_keepdims(1).eval().unwrap();
    Dataset::new(x, y).unwrap()
}

fn trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[5, 8, 1], Activation::Tanh, 2).unwrap();
    let opt = Optimizer::sgd(&model.parameters(), 0.05);
    Trainer::new(model, opt, Loss::Mse).unwrap()
}

/// Runs `fit` on a thread, failing the test if it takes more than 60 s.
fn bounded(
    policy: OnFailure,
    frequency: u64,
    checkpoint: Option<std::path::PathBuf>,
) -> (Result<ParallelReport, Error>, Trainer<Sequential>) {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut b = ParallelWrapper::builder(trainer())
            .workers(2)
            .devices(devices())
            .batch_size(8)
            .averaging_frequency(frequency)
            .on_failure(policy)
            .progress(false);
        if let Some(p) = checkpoint {
            b = b.checkpoint(p);
        }
        let mut pw = b.build().unwrap();
        let r = pw.fit(&data(), 2);
        let _ = tx.send((r, pw.into_trainer()));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("fit hung (no answer in 60 s)")
}

#[test]
fn continue_drops_the_failed_worker_and_loses_no_sample() {
    for frequency in [1, 3] {
        let (r, _) = bounded(OnFailure::Continue, frequency, None);
        let report = r.unwrap_or_else(|e| panic!("frequency {frequency}: {e}"));
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        let f = &report.failures[0];
        assert_eq!(f.device, DeviceId::cpu(1));
        assert!(f.message.contains("injected"), "{}", f.message);
        // Every sample of both epochs was trained exactly once: the failed worker's
        // batch went back to the queue.
        let trained: usize = report.workers.iter().map(|w| w.samples).sum();
        assert_eq!(
            trained,
            2 * 8 * 30,
            "frequency {frequency}: {:?}",
            report.workers
        );
        assert_eq!(
            report.epochs.iter().map(|e| e.samples).sum::<usize>(),
            2 * 8 * 30
        );
        assert!(report
            .workers
            .iter()
            .any(|w| w.failed && w.device == DeviceId::cpu(1)));
    }
}

#[test]
fn stop_returns_the_error_naming_the_device_and_saves_the_last_good_parameters() {
    let dir = std::env::temp_dir().join(format!("ndfuse-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("last-good.safetensors");
    let (r, stopped) = bounded(OnFailure::Stop, 1, Some(path.clone()));
    let err = r.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("cpu:1") && text.contains("injected"),
        "{text}"
    );
    assert!(matches!(err, Error::Worker { step: 7, .. }), "{err:?}");
    // The checkpoint holds the trainer's parameters as they were after step 6: loading
    // it into a fresh trainer gives the same bits.
    let mut fresh = trainer();
    fresh.load(&path).unwrap();
    for (a, b) in fresh
        .model()
        .parameters()
        .iter()
        .zip(stopped.model().parameters())
    {
        assert_eq!(a.array().unwrap(), b.array().unwrap());
    }
    assert_eq!(fresh.optimizer().steps(), 7);
}
