//! The benchmark suite as a library: the whole suite on tiny shapes runs, every row has
//! its kernels and figures, and the JSON object has the shape `ndfuse bench --json`
//! promises. No figure is compared with a threshold: speed is the bench's to measure.

use ndfuse_bench::{cases, run_suite, run_suite_with, BenchOptions, Event, Kind, Size};

#[test]
fn the_tiny_suite_runs_every_case_with_kernel_counts() {
    let report = run_suite(None, &BenchOptions::tiny()).expect("the suite runs");
    let names: Vec<&str> = report.rows.iter().map(|r| r.name).collect();
    let all: Vec<&str> = cases(Size::Tiny).iter().map(|c| c.name).collect();
    assert_eq!(names, all);
    assert_eq!(report.size, Size::Tiny);
    assert!(report.machine.cores >= 1);
    assert!(report.machine.bandwidth.gbps() > 0.0);
    for r in &report.rows {
        assert!(
            r.kernels >= 1,
            "{}: every case compiles to kernels: {r:?}",
            r.name
        );
        assert!((1..=3).contains(&r.runs), "{r:?}");
        assert!(r.median_ms >= 0.0 && r.min_ms <= r.median_ms, "{r:?}");
        assert_eq!(r.backend, "cpu");
        match r.kind {
            Kind::Throughput => {
                let gbps = r.gbps.expect("throughput rows have GB/s");
                let fraction = r.fraction.expect("and a fraction of the bandwidth");
                let bw = report.machine.bandwidth.gbps();
                assert!(
                    (fraction * bw - gbps).abs() <= 1e-9 * gbps.max(1.0),
                    "{r:?}"
                );
                // Warmed up: nothing is compiled in the timed runs.
                assert_eq!(r.compiled_kernels, 0, "{r:?}");
            }
            Kind::CompileNew => {
                assert!(r.gbps.is_none() && r.fraction.is_none());
                assert!(r.compiled_kernels >= 1, "a new graph is compiled: {r:?}");
            }
            Kind::Cached => assert_eq!(r.compiled_kernels, 0, "{r:?}"),
        }
    }
    // The fused element-wise cases are one kernel each.
    for name in ["gelu", "chain", "broadcast"] {
        let row = report.rows.iter().find(|r| r.name == name).expect("row");
        assert_eq!(row.kernels, 1, "{row:?}");
    }
    let table = report.table();
    for name in all {
        assert!(table.contains(&format!("| {name} |")), "{table}");
    }
}

#[test]
fn the_json_object_has_machine_bandwidths_and_rows() {
    let report = run_suite(Some("sum"), &BenchOptions::tiny()).expect("runs");
    let v = report.to_json();
    let bw = &v["machine"]["bandwidth"];
    for key in [
        "copy_1t_gbps",
        "triad_1t_gbps",
        "copy_all_gbps",
        "triad_all_gbps",
        "gbps",
    ] {
        assert!(bw[key].as_f64().is_some_and(|g| g > 0.0), "{key}: {v}");
    }
    assert_eq!(bw["array_bytes"], 1 << 20);
    assert!(v["machine"]["cores"].as_u64().is_some_and(|c| c >= 1));
    assert_eq!(v["size"], "tiny");
    let rows = v["rows"].as_array().expect("rows");
    // "sum" matches the full sum and the column sum.
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["name"], "sum");
    assert_eq!(rows[0]["ideal_bytes"], 4096 * 4 + 4);
    assert_eq!(rows[1]["name"], "colsum");
    for row in rows {
        for key in [
            "name",
            "expr",
            "inputs",
            "kind",
            "backend",
            "kernels",
            "interp_steps",
            "compiled_kernels",
            "runs",
            "median_ms",
            "min_ms",
            "run_ms",
            "compile_ms",
            "ideal_bytes",
            "gbps",
            "fraction_of_bandwidth",
        ] {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
        assert_eq!(row["kind"], "throughput");
    }
}

#[test]
fn progress_events_come_in_order() {
    let mut seen = Vec::new();
    let report = run_suite_with(Some("gelu"), &BenchOptions::tiny(), &mut |e| {
        seen.push(match e {
            Event::MeasuringBandwidth { .. } => "measuring".to_string(),
            Event::Bandwidth(_) => "bandwidth".to_string(),
            Event::CaseStart { index, total, case } => {
                format!("start {index}/{total} {}", case.name)
            }
            Event::CaseDone(row) => format!("done {}", row.name),
        });
    })
    .expect("runs");
    assert_eq!(report.rows.len(), 2);
    assert_eq!(
        seen,
        [
            "measuring",
            "bandwidth",
            "start 1/2 gelu",
            "done gelu",
            "start 2/2 gelu_f16",
            "done gelu_f16"
        ]
    );
}
