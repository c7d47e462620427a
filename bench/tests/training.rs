//! The training rows of the suite on tiny shapes: the step row and the parallel rows
//! run, with kernels, finite positive times, no host allocation per steady-state step
//! and a finite scaling efficiency. Alone in its test binary: the host cache's counters
//! are process-wide, and another test's evaluations would count as this step's
//! allocations.

use ndfuse_bench::{run_suite, training_names, BenchOptions, TrainingRow};

#[test]
fn the_tiny_training_rows_run_with_their_figures() {
    let report = run_suite(Some("train"), &BenchOptions::tiny()).expect("the rows run");
    // No case's name contains "train": the filter selects the training rows alone.
    assert!(report.rows.is_empty(), "{:?}", report.rows);
    let names: Vec<&str> = report.training.iter().map(|r| r.name()).collect();
    assert_eq!(
        names,
        [
            "train_step_mlp",
            "train_parallel_1w1t",
            "train_parallel_1w2t",
            "train_parallel_2w1t_f1",
            "train_parallel_2w1t_f8",
        ]
    );
    assert_eq!(names, training_names());
    let peak = report.machine.fma.flops_all;
    for row in &report.training {
        match row {
            TrainingRow::Step(r) => {
                assert!(r.kernels >= 1, "{r:?}");
                assert!(r.runs >= 1, "{r:?}");
                assert!(
                    r.median_ms.is_finite() && r.min_ms > 0.0 && r.min_ms <= r.median_ms,
                    "{r:?}"
                );
                // 16-32-32-10 on batch 8: 2*8*(2*(512 + 1024 + 320) + 1024 + 320).
                assert_eq!(r.flops, 80_896.0, "{r:?}");
                let gflops = r.flops / (r.median_ms * 1e-3) / 1e9;
                assert!((r.gflops - gflops).abs() <= 1e-9 * gflops, "{r:?}");
                let fraction = r.fma_peak_fraction.expect("a CPU step has a peak fraction");
                assert!(
                    (fraction * peak - r.gflops * 1e9).abs() <= 1e-6 * peak,
                    "{r:?}"
                );
                assert_eq!(r.allocations_per_step, 0.0, "{r:?}");
                assert!(r.loss.is_finite() && r.loss > 0.0, "{r:?}");
            }
            TrainingRow::Parallel(r) => {
                assert!(r.runs >= 1, "{r:?}");
                assert_eq!(r.samples, 8 * 32, "{r:?}");
                assert!(
                    r.samples_per_sec.is_finite() && r.samples_per_sec > 0.0,
                    "{r:?}"
                );
                let e = r.efficiency.expect("the baseline ran");
                assert!(e.is_finite() && e > 0.0, "{r:?}");
                assert_eq!(r.busy_fraction.len(), r.workers, "{r:?}");
                assert!(
                    r.busy_fraction.iter().all(|b| (0.0..=1.0).contains(b)),
                    "{r:?}"
                );
                assert!(r.averaging_ms_per_round.is_finite(), "{r:?}");
                // 32 batches an epoch: one per round at frequency 1 on 1 worker, two a
                // round on 2 workers, 16 a round at frequency 8 on 2 (two averagings).
                let want = match (r.workers, r.frequency) {
                    (1, 1) => 32,
                    (2, 1) => 16,
                    (2, 8) => 2,
                    _ => unreachable!("{r:?}"),
                };
                assert_eq!(r.rounds, want, "{r:?}");
                assert!(r.loss.is_finite(), "{r:?}");
            }
        }
    }
    // The baseline against itself.
    let TrainingRow::Parallel(base) = &report.training[1] else {
        panic!("the baseline is a parallel row");
    };
    assert_eq!(base.efficiency, Some(1.0));
    // The others per thread: 1 worker of 2 threads is set against 2 baseline threads.
    for row in &report.training[2..] {
        let TrainingRow::Parallel(r) = row else {
            panic!("parallel rows follow the step row");
        };
        let threads = (r.workers * r.threads_per_worker) as f64;
        assert_eq!(threads, 2.0, "{r:?}");
        let want = r.samples_per_sec / (2.0 * base.samples_per_sec);
        assert!(
            (r.efficiency.expect("efficiency") - want).abs() <= 1e-12,
            "{r:?}"
        );
    }
    let table = report.table();
    assert!(
        table.contains("\ntraining:\n- train_step_mlp: 16-32-32-10 relu on batch 8"),
        "{table}"
    );
    assert!(
        table.contains("- train_parallel_2w1t_f8: 2 workers x 1 thread, frequency 8"),
        "{table}"
    );
    assert!(!table.contains("| case |"), "no case ran: {table}");
    let json = report.to_json();
    let t = &json["training"];
    assert_eq!(t[0]["name"], "train_step_mlp");
    assert_eq!(t[0]["allocations_per_step"], 0.0);
    assert!(t[0]["fraction_of_fma_peak"].is_number(), "{json}");
    assert!(t[4]["scaling_efficiency"].is_number(), "{json}");
    assert!(t[4]["averaging_ms_per_round"].is_number(), "{json}");
    assert_eq!(t[4]["busy_fraction"].as_array().map(Vec::len), Some(2));
}
