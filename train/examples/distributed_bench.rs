//! The figures of docs/distributed.md: on the 784-512-512-10 MLP, the compute time of
//! one training step (`Trainer::step_report`), the measured allreduce time of its
//! gradients against the ring model fed with this machine's measured point-to-point
//! bandwidth and latency, and data-parallel samples/s across the ranks.
//!
//! `cargo build --release --example distributed_bench --features ndfuse-train/mpi`, then
//! `mpiexec -n R target/release/examples/distributed_bench [--batch B --steps N]`.

use mpi::collective::CommunicatorCollectives;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::Communicator;
use ndfuse::{Array, Context, CpuDevice, Device, DeviceSet};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::{MpiRanks, ParallelWrapper, Ranks};
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut batch, mut steps) = (64usize, 30usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--batch" => batch = args.next().ok_or("--batch N")?.parse()?,
            "--steps" => steps = args.next().ok_or("--steps N")?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let ranks = MpiRanks::init()?;
    let (rank, size) = (ranks.rank(), ranks.size());
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = (cores / ranks.local_size().max(1)).max(1);
    let devices: Vec<Arc<dyn Device>> = vec![Arc::new(CpuDevice::split(1, threads)?.remove(0))];
    let set = Arc::new(DeviceSet::new(devices, &ndfuse::Config::load()?)?);
    let ctx = Context::builder().devices(Arc::clone(&set)).build()?;
    let mlp = |ctx: &Context| -> Result<Trainer<Sequential>, Box<dyn std::error::Error>> {
        let model = Sequential::mlp(ctx, &[784, 512, 512, 10], Activation::Relu, 1)?;
        let opt = Optimizer::sgd(&model.parameters(), 0.01);
        Ok(Trainer::new(model, opt, Loss::CrossEntropy)?)
    };
    let n = batch * steps * size;
    let x = ctx.rand_normal(&[n, 784], 0.0, 1.0, 11).eval()?;
    let labels: Vec<i64> = (0..n as i64).map(|i| i % 10).collect();
    let data = Dataset::new(x, Array::from_vec(labels, &[n])?)?;

    // 1. Compute per step on this rank (every rank at once: they share the cores).
    let mut trainer = mlp(&ctx)?;
    let params: usize = trainer
        .model()
        .parameters()
        .iter()
        .map(|p| p.shape().iter().product::<usize>())
        .sum();
    let mut compute = Vec::new();
    for b in data.batches(batch, 0, 0, false)?.take(steps.min(20)) {
        let b = b?;
        let (xb, yb) = (ctx.tensor(b.features), ctx.tensor(b.labels));
        let t = Instant::now();
        trainer.step_report(&xb, &yb)?;
        compute.push(t.elapsed().as_secs_f64());
    }
    let compute = median(compute[2..].to_vec());

    // 2. Point-to-point latency and bandwidth between ranks 0 and 1 (ping-pong), then
    //    the allreduce of the MLP's gradients (its parameter shapes).
    let world = mpi::topology::SimpleCommunicator::world();
    let (mut latency, mut bandwidth) = (0.0, 0.0);
    if size > 1 && rank < 2 {
        let peer = world.process_at_rank(1 - rank as i32);
        for (bytes, reps) in [(8usize, 200usize), (8 << 20, 10)] {
            let mut buf = vec![0u8; bytes];
            let mut times = Vec::new();
            for _ in 0..reps {
                let t = Instant::now();
                if rank == 0 {
                    peer.send(&buf[..]);
                    peer.receive_into(&mut buf[..]);
                } else {
                    peer.receive_into(&mut buf[..]);
                    peer.send(&buf[..]);
                }
                times.push(t.elapsed().as_secs_f64() / 2.0);
            }
            let one_way = median(times);
            if bytes == 8 {
                latency = one_way;
            } else {
                bandwidth = bytes as f64 / (one_way - latency).max(1e-9);
            }
        }
    }
    let mut grads: Vec<Array> = trainer
        .model()
        .parameters()
        .iter()
        .map(|p| p.array())
        .collect::<Result<_, _>>()?;
    let mut reduce = Vec::new();
    for _ in 0..steps.min(20) {
        let mut g = [0.0];
        ranks.allreduce_sum_f64(&mut g)?; // start together
        let t = Instant::now();
        ranks.allreduce_sum(&mut grads)?;
        reduce.push(t.elapsed().as_secs_f64());
    }
    let reduce = median(reduce[2..].to_vec());
    // The same bytes through MPI's blocking allreduce: what MpiRanks adds (the arrival
    // exchange, polling, copies) is the difference.
    let send = vec![1.0f32; params];
    let mut recv = vec![0.0f32; params];
    let mut raw = Vec::new();
    for _ in 0..steps.min(20) {
        world.barrier();
        let t = Instant::now();
        world.all_reduce_into(
            &send[..],
            &mut recv[..],
            mpi::collective::SystemOperation::sum(),
        );
        raw.push(t.elapsed().as_secs_f64());
    }
    let raw = median(raw[2..].to_vec());

    // 3. Data-parallel training: samples/s across all ranks, averaging time per step.
    let mut pw = ParallelWrapper::builder(mlp(&ctx)?)
        .workers(1)
        .devices(set)
        .batch_size(batch)
        .progress(false)
        .ranks(Arc::new(ranks))
        .build()?;
    let report = pw.fit(&data, 1)?;
    let global = report.samples_per_sec() * size as f64;
    let avg_step = report.averaging.as_secs_f64() / report.rounds.max(1) as f64;

    if rank == 0 {
        let bytes = params * 4;
        println!("ranks {size}, {threads} threads per rank, batch {batch} per rank, {params} parameters ({:.2} MB)", bytes as f64 / 1e6);
        println!(
            "compute per step (step_report, median): {:.2} ms",
            compute * 1e3
        );
        if size > 1 {
            let r = size as f64;
            let model = 2.0 * (r - 1.0) / r * bytes as f64 / bandwidth + 2.0 * (r - 1.0) * latency;
            println!(
                "point-to-point: latency {:.1} us, bandwidth {:.2} GB/s",
                latency * 1e6,
                bandwidth / 1e9
            );
            println!(
                "allreduce of the gradients: MpiRanks {:.2} ms, MPI_Allreduce {:.2} ms, ring model {:.2} ms",
                reduce * 1e3,
                raw * 1e3,
                model * 1e3
            );
        }
        println!(
            "training: {global:.0} samples/s over {size} ranks, averaging {:.2} ms per step, {} steps in {:.2} s",
            avg_step * 1e3,
            report.rounds,
            report.total.as_secs_f64()
        );
    }
    Ok(())
}
