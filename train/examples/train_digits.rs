//! Trains a 64-128-10 MLP (ReLU, Adam, cross-entropy) on the UCI optical handwritten
//! digits (nn/data/digits, CC BY 4.0) and scores it on a fixed held-out 20%; with
//! `--distributed` (feature `mpi`), over the ranks of an `mpiexec` run.
//!
//! `cargo run --release --example train_digits [-- --epochs N --plot curves.svg]`
//!
//! `cargo build --release --example train_digits --features ndfuse-train/mpi`, then
//! `mpiexec -n 4 target/release/examples/train_digits --distributed [--workers N]
//! [--frequency k] [--batch b] [--checkpoint DIR] [--resume FILE]`: rank 0 alone prints
//! the curve and saves `DIR/latest.safetensors` after every epoch; `--resume` makes
//! every rank load a checkpoint and go on from the epoch it was saved after.

use ndfuse::Context;
use ndfuse_nn::{
    epoch_line, Activation, Dataset, FitOptions, Layer, Loss, Optimizer, Schedule, Sequential,
    Trainer,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The command line.
#[derive(Debug, Default)]
struct Args {
    epochs: u64,
    plot: Option<PathBuf>,
    distributed: bool,
    workers: usize,
    frequency: u64,
    batch: Option<usize>,
    checkpoint: Option<PathBuf>,
    resume: Option<PathBuf>,
}

const USAGE: &str = "--epochs N, --plot FILE.svg, --distributed [--workers N --frequency K \
                     --batch B --checkpoint DIR --resume FILE]";

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        epochs: 30,
        workers: 1,
        frequency: 1,
        ..Args::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => a.epochs = value("--epochs")?.parse()?,
            "--plot" => a.plot = Some(value("--plot")?.into()),
            "--distributed" => a.distributed = true,
            "--workers" => a.workers = value("--workers")?.parse()?,
            "--frequency" => a.frequency = value("--frequency")?.parse()?,
            "--batch" => a.batch = Some(value("--batch")?.parse()?),
            "--checkpoint" => a.checkpoint = Some(value("--checkpoint")?.into()),
            "--resume" => a.resume = Some(value("--resume")?.into()),
            other => return Err(format!("unknown argument {other:?} ({USAGE})").into()),
        }
    }
    let distributed_only = a.checkpoint.is_some()
        || a.resume.is_some()
        || a.batch.is_some()
        || a.workers != 1
        || a.frequency != 1;
    if distributed_only && !a.distributed {
        return Err(
            "--workers, --frequency, --batch, --checkpoint and --resume go with \
                    --distributed"
                .into(),
        );
    }
    Ok(a)
}

/// The digits (features / 16), split 80/20 with a fixed seed.
fn digits(ctx: &Context) -> Result<(Dataset, Dataset), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/data/digits");
    let raw = Dataset::from_npy(&dir.join("features.npy"), &dir.join("labels.npy"))?;
    // Pixels are 0..=16: scaled to [0, 1] once.
    let x = ctx.tensor(raw.features().clone()) / 16.0;
    let data = Dataset::new(x.eval()?, raw.labels().clone())?;
    Ok(data.split(0.2, 2026)?)
}

/// The MLP and its Adam with a cosine schedule over `steps`.
fn trainer(ctx: &Context, steps: u64) -> Result<Trainer<Sequential>, Box<dyn std::error::Error>> {
    let model = Sequential::mlp(ctx, &[64, 128, 10], Activation::Relu, 7)?;
    let schedule = Schedule::Cosine {
        base: 3e-3,
        floor: 1e-4,
        steps,
    };
    let opt = Optimizer::adam(&model.parameters(), 3e-3).schedule(schedule);
    Ok(Trainer::new(model, opt, Loss::CrossEntropy)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    if args.distributed {
        return distributed(&args);
    }
    let start = Instant::now();
    let ctx = Context::new();
    let (train, test) = digits(&ctx)?;
    println!(
        "digits: {} training and {} held-out images of 8x8, 10 classes",
        train.len(),
        test.len()
    );
    let batch = 32;
    let mut trainer = trainer(&ctx, args.epochs * train.len().div_ceil(batch) as u64)?;
    let opts = FitOptions {
        epochs: args.epochs,
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
    if let Some(path) = args.plot {
        history.plot(&path, "digits: 64-128-10 MLP, Adam")?;
        println!("curves written to {}", path.display());
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn distributed(_: &Args) -> Result<(), Box<dyn std::error::Error>> {
    Err(
        "--distributed needs MPI: build with `--features ndfuse-train/mpi` (see the \
         README's \"Distributed training\")"
            .into(),
    )
}

/// Training over the ranks of an `mpiexec` run. An error is printed and the whole run
/// ends (MPI_Abort): after a failed collective MPI must not be finalised (it would wait
/// for the dead rank), and a hung rank must not outlive the others.
#[cfg(feature = "mpi")]
fn distributed(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ranks = std::sync::Arc::new(ndfuse_train::MpiRanks::init()?);
    if let Err(e) = run_ranks(args, std::sync::Arc::clone(&ranks)) {
        eprintln!("error on rank {}: {e}", ndfuse_train::Ranks::rank(&*ranks));
        ranks.abort(1);
    }
    Ok(())
}

#[cfg(feature = "mpi")]
fn run_ranks(
    args: &Args,
    ranks: std::sync::Arc<ndfuse_train::MpiRanks>,
) -> Result<(), Box<dyn std::error::Error>> {
    use ndfuse::{CpuDevice, Device, DeviceSet};
    use ndfuse_train::{ParallelWrapper, Ranks};
    use std::sync::Arc;

    let start = Instant::now();
    let (rank, size) = (ranks.rank(), ranks.size());
    let workers = args.workers.max(1);
    // The machine's cores are shared by the ranks on it.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = (cores / ranks.local_size().max(1)).max(workers);
    let devices: Vec<Arc<dyn Device>> = CpuDevice::split(workers, threads)?
        .into_iter()
        .map(|d| Arc::new(d) as _)
        .collect();
    let set = Arc::new(DeviceSet::new(devices, &ndfuse::Config::load()?)?);
    let ctx = Context::builder().devices(Arc::clone(&set)).build()?;
    let (train, test) = digits(&ctx)?;
    // By default the global batch is 32, as in one process.
    let batch = args.batch.unwrap_or((32 / (size * workers)).max(1));
    // Each worker's steps per epoch: its share of the epoch's batches.
    let per_epoch = train.len().div_ceil(batch).div_ceil(size * workers) as u64;
    let mut trainer = trainer(&ctx, args.epochs * per_epoch)?;
    let mut first = 0;
    if let Some(path) = &args.resume {
        trainer.load(path)?;
        let steps = trainer.optimizer().steps();
        if steps % per_epoch != 0 {
            return Err(format!(
                "{} was saved after {steps} steps, not at the end of an epoch of {per_epoch}",
                path.display()
            )
            .into());
        }
        first = steps / per_epoch;
    }
    if let Some(dir) = &args.checkpoint {
        std::fs::create_dir_all(dir)?;
    }
    if rank == 0 {
        println!(
            "digits on {size} ranks x {workers} workers of batch {batch} (global batch {}), \
             frequency {}, from epoch {first}",
            batch * size * workers,
            args.frequency
        );
    }
    let mut pw = ParallelWrapper::builder(trainer)
        .workers(workers)
        .devices(set)
        .batch_size(batch)
        .averaging_frequency(args.frequency)
        .seed(1)
        .ranks(ranks)
        .build()?;
    let mut accuracy = 0.0;
    let mut samples = 0;
    for epoch in first..args.epochs {
        let report = pw.run(&train, epoch..epoch + 1)?;
        let e = &report.epochs[0];
        // Every rank holds the same model; only rank 0 scores, prints and saves.
        if rank == 0 {
            let scores = pw.trainer().evaluate_dataset(&test, 0)?;
            accuracy = scores.accuracy.unwrap_or(0.0);
            samples += e.samples;
            println!(
                "epoch {}: loss {:.4}, validation loss {:.4}, accuracy {:.1}% \
                 ({:.0} samples/s on rank 0, {:.1} ms averaging)",
                epoch + 1,
                e.score,
                scores.loss,
                accuracy * 100.0,
                report.samples_per_sec(),
                report.averaging.as_secs_f64() * 1e3
            );
            if let Some(dir) = &args.checkpoint {
                pw.trainer().save(&dir.join(ndfuse_train::LATEST_FILE))?;
            }
        }
    }
    if rank == 0 {
        println!(
            "held-out accuracy {:.2}% after {} epochs in {:.2} s ({} samples on rank 0)",
            accuracy * 100.0,
            args.epochs,
            start.elapsed().as_secs_f64(),
            samples
        );
    }
    Ok(())
}
