//! `ndfuse bench [SUITE] [--json] [--repeat N] [--tiny] [--backend B]`: the library's
//! benchmark suite (`ndfuse::bench`) with a progress line per case on a terminal.

use crate::choices::Backend;
use crate::failure::Failure;
use ndfuse_bench::{run_suite_with, BenchOptions, Event, Size};
use std::io::{IsTerminal as _, Write as _};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Run only the cases whose name contains SUITE: gelu, chain, softmax, layernorm,
    /// sum, colsum, broadcast, embedding, scan_rows, argsort, quant_matvec, gelu_f16, compile_new,
    /// compile_cached, matmul_f32, matmul_gelu, attention, attention_causal,
    /// attention_causal_grad, matmul_f16, matmul_bf16, matmul_cached, conv2d, the LAPACK
    /// level (`linalg` selects them all: linalg_{solve,solve64,cholesky,qr,inv,det,svd,
    /// eigh}_{f64,f32}, linalg_solve_batched_{f64,f32}); and the training
    /// rows (`train` selects them all): train_step_mlp, train_parallel_1w1t,
    /// train_parallel_1w2t, train_parallel_2w1t_f1, train_parallel_2w1t_f8.
    suite: Option<String>,
    /// Print one JSON object (machine, measured bandwidths, rows, training rows) instead
    /// of the table.
    #[arg(long)]
    json: bool,
    /// At most N timed runs of each case after its warm-up run; a case stops earlier
    /// once it has run for 1 s and at least 3 times, but a case timed in turns with a
    /// peer (its note's ratio) or a matrix product's (against the FMA peak) takes 3N
    /// turns, all of them.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// The same cases on tiny shapes (and a small bandwidth measurement): a smoke test
    /// of the suite in well under a second, not a measurement.
    #[arg(long)]
    tiny: bool,
    /// Backend of the cases. With cuda the rows are timed by CUDA events (kernels only)
    /// and measured against the device's own copy bandwidth, measured in the same run.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
}

pub fn run(a: &BenchArgs) -> Result<(), Failure> {
    let mut opts = if a.tiny {
        BenchOptions::tiny()
    } else {
        BenchOptions::default()
    };
    opts.max_runs = a.repeat as usize;
    opts.backend = a.backend.into();
    // Progress goes to a person watching, never into a pipe or a log.
    let progress = std::io::stderr().is_terminal();
    let mut on_event = |e: Event<'_>| {
        if !progress {
            return;
        }
        match e {
            Event::MeasuringBandwidth { array_bytes } => eprintln!(
                "ndfuse bench: measuring memory bandwidth (copy and triad over 3 x {} MiB, then a read-only sweep) and the compute probes",
                array_bytes >> 20
            ),
            Event::Bandwidth(bw) => eprintln!(
                "ndfuse bench: bandwidth {:.1} GB/s ({})",
                bw.gbps(),
                bw.source()
            ),
            Event::CaseStart { index, total, case } => eprintln!(
                "ndfuse bench: [{index}/{total}] {} `{}` on {}",
                case.name,
                case.expr,
                case.inputs_text()
            ),
            Event::TrainingStart { name } => eprintln!("ndfuse bench: training row {name}"),
            Event::CaseDone(_) | Event::TrainingDone(_) => {}
        }
    };
    let report = run_suite_with(a.suite.as_deref(), &opts, &mut on_event)
        .map_err(|e| Failure::plain(e.reason()))?;
    let text = if a.json {
        format!("{}\n", report.to_json())
    } else {
        let mut t = report.table();
        if report.size == Size::Tiny {
            t.push_str("\n(tiny shapes: a smoke test, not a measurement)\n");
        }
        t
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}
