//! `cargo bench -p ndfuse-bench`: a few cases of the `ndfuse bench` suite under criterion,
//! with their ideal bytes as the throughput, so criterion prints the bandwidth reached
//! (in GiB/s) and tracks changes between runs; a matrix product's throughput is its
//! FLOPs instead (criterion's "elem/s" is then FLOP/s). `ndfuse bench` is the full
//! suite, with this machine's own bandwidth and FMA peak beside each figure.
//!
//! `cargo bench -p ndfuse-bench -- gelu` runs one case; the cases are the suite's, at full
//! size, built by `ndfuse_bench` so both measure the same thing.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ndfuse::Context;
use ndfuse_bench::{cases, Kind, Size};
use std::hint::black_box;
use std::time::Duration;

/// The cases that finish an evaluation in well under a second today. The large
/// products (`matmul_f32` and its siblings, `attention`) wait for the CPU's GEMM path:
/// in the reference interpreter they take seconds (see `ndfuse bench matmul`).
const CASES: &[&str] = &[
    "gelu",
    "chain",
    "broadcast",
    "colsum",
    "compile_cached",
    "matmul_cached",
];

fn suite(c: &mut Criterion) {
    let ctx = Context::new();
    let mut group = c.benchmark_group("ndfuse");
    // Evaluations of 100+ ms: ten samples over a few seconds are enough for a median.
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    for case in cases(Size::Full).iter().filter(|c| CASES.contains(&c.name)) {
        let inputs = case.make_inputs(&ctx).expect("inputs");
        let out = case.build(&inputs, 1.0);
        if let (Kind::Throughput, Some(flops)) = (case.kind, case.flops) {
            group.throughput(Throughput::Elements(flops));
        } else if case.kind == Kind::Throughput {
            let bytes = case.ideal_bytes(&ctx).expect("ideal bytes");
            group.throughput(Throughput::Bytes(bytes));
        } else {
            group.throughput(Throughput::Elements(1));
        }
        group.bench_function(case.name, |b| {
            b.iter(|| black_box(ctx.eval(&[&out]).expect("evaluates")));
        });
    }
    group.finish();
}

criterion_group!(benches, suite);
criterion_main!(benches);
