//! Trains the CNN on Fashion-MNIST (Debian's `dataset-fashion-mnist`): conv 3x3
//! 32 (pad 1) + ReLU + max-pool 2, conv 3x3 64 (pad 1) + ReLU + max-pool 2, flatten,
//! linear 3136 -> 128 + ReLU, linear 128 -> 10; cross-entropy, Adam 1e-3, batch 128,
//! pixels / 255; then scores the 10,000 test images after every epoch.
//!
//! `cargo run --release --example train_fashion [-- --epochs N --subset N --plot FILE.svg
//! --data DIR]`: `--subset` trains on the first N training images (a quick run).

use ndfuse::{Context, Conv, Pool};
use ndfuse_nn::{
    epoch_line, Activation, Conv2d, FashionMnist, FitOptions, Flatten, Init, Layer, Linear, Loss,
    MaxPool2d, Optimizer, Sequential, Trainer,
};
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str = "--epochs N, --subset N, --plot FILE.svg, --data DIR";

struct Args {
    epochs: u64,
    subset: Option<usize>,
    plot: Option<PathBuf>,
    data: PathBuf,
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        epochs: 8,
        subset: None,
        plot: None,
        data: FashionMnist::DIR.into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => a.epochs = value("--epochs")?.parse()?,
            "--subset" => a.subset = Some(value("--subset")?.parse()?),
            "--plot" => a.plot = Some(value("--plot")?.into()),
            "--data" => a.data = value("--data")?.into(),
            other => return Err(format!("unknown argument {other:?} ({USAGE})").into()),
        }
    }
    Ok(a)
}

/// The CNN, weights He-uniform from fixed seeds.
fn model(ctx: &Context) -> Result<Sequential, Box<dyn std::error::Error>> {
    let same = || Conv::new().padding(1);
    Ok(Sequential::new()
        .push(Conv2d::new(
            ctx,
            "conv1",
            1,
            32,
            3,
            same(),
            Init::HeUniform,
            1,
        )?)
        .push(Activation::Relu)
        .push(MaxPool2d(Pool::new(2)))
        .push(Conv2d::new(
            ctx,
            "conv2",
            32,
            64,
            3,
            same(),
            Init::HeUniform,
            2,
        )?)
        .push(Activation::Relu)
        .push(MaxPool2d(Pool::new(2)))
        .push(Flatten)
        .push(Linear::new(
            ctx,
            "fc1",
            64 * 7 * 7,
            128,
            Init::HeUniform,
            3,
        )?)
        .push(Activation::Relu)
        .push(Linear::new(ctx, "fc2", 128, 10, Init::GlorotUniform, 4)?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let start = Instant::now();
    let ctx = Context::new();
    let data = FashionMnist::load(&args.data)?;
    let train = match args.subset {
        Some(n) => data
            .train
            .subset(&(0..n.min(data.train.len())).collect::<Vec<_>>())?,
        None => data.train,
    };
    println!(
        "Fashion-MNIST: {} training and {} test images of 28x28, 10 classes ({:.1} s to load)",
        train.len(),
        data.test.len(),
        start.elapsed().as_secs_f64()
    );
    let model = model(&ctx)?;
    let opt = Optimizer::adam(&model.parameters(), 1e-3);
    let mut trainer = Trainer::new(model, opt, Loss::CrossEntropy)?;
    let opts = FitOptions {
        epochs: args.epochs,
        batch_size: 128,
        // Scored 1000 images at a time: the windows' matrix of all 10,000 at once would
        // take 2.3 GB.
        eval_batch: 1000,
        seed: 1,
        ..FitOptions::default()
    };
    let history = trainer.fit_with(&train, Some(&data.test), &opts, |e| {
        println!("{}", epoch_line(e));
        std::ops::ControlFlow::Continue(())
    })?;
    let last = history
        .epochs
        .last()
        .and_then(|e| e.validation)
        .ok_or("no epoch ran")?;
    println!(
        "test accuracy {:.2}% after {} epochs ({} steps) in {:.1} s",
        last.accuracy.unwrap_or(0.0) * 100.0,
        history.epochs.len(),
        history.step_losses.len(),
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = args.plot {
        history.plot(&path, "Fashion-MNIST: 2-conv CNN, Adam 1e-3")?;
        println!("curves written to {}", path.display());
    }
    Ok(())
}
