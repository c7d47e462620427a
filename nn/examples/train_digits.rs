//! Trains a 64-128-10 MLP (ReLU, Adam, cross-entropy) on the UCI optical handwritten
//! digits (nn/data/digits, CC BY 4.0) and scores it on a fixed held-out 20%.
//!
//! `cargo run --release --example train_digits [-- --epochs N --plot curves.svg]`

use ndfuse::Context;
use ndfuse_nn::{
    epoch_line, Activation, Dataset, FitOptions, Layer, Loss, Optimizer, Schedule, Sequential,
    Trainer,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut epochs, mut plot) = (30u64, None::<PathBuf>);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--epochs" => epochs = args.next().ok_or("--epochs needs a number")?.parse()?,
            "--plot" => plot = Some(args.next().ok_or("--plot needs a path")?.into()),
            other => {
                return Err(
                    format!("unknown argument {other:?} (--epochs N, --plot FILE.svg)").into(),
                )
            }
        }
    }
    let start = Instant::now();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy"))?;
    let ctx = Context::new();
    // Pixels are 0..=16: scaled to [0, 1] once.
    let x = ctx.tensor(raw.features().clone()) / 16.0;
    let data = Dataset::new(x.eval()?, raw.labels().clone())?;
    let (train, test) = data.split(0.2, 2026)?;
    println!(
        "digits: {} training and {} held-out images of 8x8, 10 classes",
        train.len(),
        test.len()
    );

    let model = Sequential::mlp(&ctx, &[64, 128, 10], Activation::Relu, 7)?;
    let batch = 32;
    let steps = epochs * train.len().div_ceil(batch) as u64;
    let schedule = Schedule::Cosine {
        base: 3e-3,
        floor: 1e-4,
        steps,
    };
    let opt = Optimizer::adam(&model.parameters(), 3e-3).schedule(schedule);
    let mut trainer = Trainer::new(model, opt, Loss::CrossEntropy)?;
    let opts = FitOptions {
        epochs,
        batch_size: batch,
        seed: 1,
        ..FitOptions::default()
    };
    let history = trainer.fit_with(&train, Some(&test), &opts, |e| {
        println!("{}", epoch_line(e));
        std::ops::ControlFlow::Continue(())
    })?;
    let last = history
        .epochs
        .last()
        .and_then(|e| e.validation)
        .ok_or("no epoch ran")?;
    println!(
        "held-out accuracy {:.2}% after {} epochs ({} steps) in {:.2} s",
        last.accuracy.unwrap_or(0.0) * 100.0,
        history.epochs.len(),
        history.step_losses.len(),
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = plot {
        history.plot(&path, "digits: 64-128-10 MLP, Adam")?;
        println!("curves written to {}", path.display());
    }
    Ok(())
}
