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
        // A scan, a sort or attention is a routine of its own, no compiled kernel.
        let routine = matches!(
            r.name,
            "scan_rows" | "argsort" | "attention_causal" | "quant_matvec"
        ) || r.name.starts_with("linalg_");
        assert!(
            r.kernels >= 1 || (routine && r.routine_steps >= 1 && r.interp_steps == 0),
            "{}: every case compiles to kernels: {r:?}",
            r.name
        );
        // Up to `max_runs` (3) runs; a row timed in turns with a peer, or a product's
        // row (against the FMA peak), all of three times as many.
        if r.versus.is_some() || (r.flops.is_some() && r.kind == Kind::Throughput) {
            assert_eq!(r.runs, 9, "{r:?}");
        } else {
            assert!((1..=3).contains(&r.runs), "{r:?}");
        }
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
    // The fused element-wise cases are one kernel each, and so is each product with its
    // element-wise epilogue.
    for name in [
        "gelu",
        "chain",
        "broadcast",
        "matmul_f32",
        "matmul_gelu",
        "matmul_cached",
    ] {
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
            "routine_steps",
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
            Event::TrainingStart { name } => format!("start {name}"),
            Event::TrainingDone(row) => format!("done {}", row.name()),
        });
    })
    .expect("runs");
    assert_eq!(report.rows.len(), 3);
    assert_eq!(
        seen,
        [
            "measuring",
            "bandwidth",
            "start 1/3 gelu",
            "done gelu",
            "start 2/3 gelu_f16",
            "done gelu_f16",
            "start 3/3 matmul_gelu",
            "done matmul_gelu"
        ]
    );
}

#[test]
fn the_matmul_cases_report_flops_against_the_widest_fma_peak() {
    let report = run_suite(Some("matmul"), &BenchOptions::tiny()).expect("runs");
    let names: Vec<&str> = report.rows.iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        [
            "matmul_f32",
            "matmul_gelu",
            "matmul_f16",
            "matmul_bf16",
            "matmul_cached"
        ]
    );
    let fma = &report.machine.fma;
    // Figures only, no speed compared: the tiny probe is microseconds, thread start-up
    // included, on a machine others may be using.
    assert!(fma.flops_1t > 0.0 && fma.flops_all > 0.0, "{fma:?}");
    assert_eq!(fma.threads, report.machine.cores, "{fma:?}");
    // The probe is the widest the CPU has, chosen at run time.
    #[cfg(target_arch = "x86_64")]
    {
        let want = if std::arch::is_x86_feature_detected!("avx512f") {
            16
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            8
        } else {
            4
        };
        assert_eq!(fma.lanes, want, "{fma:?}");
    }
    let row = |name: &str| {
        report
            .rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name}"))
    };
    // Tiny shapes: (M, N, K) = (24, 40, 36) and (32, 48, 20).
    assert_eq!(row("matmul_f32").flops, Some(2.0 * 24.0 * 40.0 * 36.0));
    assert_eq!(row("matmul_gelu").flops, Some(2.0 * 32.0 * 48.0 * 20.0));
    assert_eq!(row("matmul_cached").flops, Some(2.0 * 16.0 * 16.0 * 16.0));
    for r in report.rows.iter().filter(|r| r.kind == Kind::Throughput) {
        let flops = r.flops.expect("a product counts its FLOPs");
        let gflops = r.gflops.expect("GFLOP/s");
        let fraction = r.fma_peak_fraction.expect("a fraction of the FMA peak");
        assert!(fraction > 0.0 && gflops > 0.0, "{r:?}");
        assert!(
            (gflops * 1e9 / fma.flops_all - fraction).abs() <= 1e-9 * fraction,
            "{r:?}"
        );
        assert!(
            (flops / (r.median_ms * 1e-3) / 1e9 - gflops).abs() <= 1e-9 * gflops,
            "{r:?}"
        );
        // The floor of a product is its FLOPs at the FMA peak.
        let floor = r.compute_floor_ms.expect("compute floor");
        assert!(
            (floor - flops / fma.flops_all * 1e3).abs() <= 1e-9 * floor,
            "{r:?}"
        );
        // A product and its element-wise epilogue are one kernel.
        assert_eq!(r.kernels, 1, "{r:?}");
    }
    // gelu(x @ w + b) against the bare product, timed in the same case.
    let gelu = row("matmul_gelu")
        .versus
        .as_ref()
        .expect("versus the bare product");
    assert_eq!(gelu.what, "bare x @ w");
    assert!(gelu.median_ms > 0.0);
    // The ratio is the median of the turns' ratios, so it lies within their range.
    let (lo, hi) = gelu.ratio_range;
    assert!(0.0 < lo && lo <= gelu.ratio && gelu.ratio <= hi, "{gelu:?}");
    // f16 and bf16 operands against the product of the same values in f32, timed in
    // turns in the same case.
    for name in ["matmul_f16", "matmul_bf16"] {
        let v = row(name).versus.as_ref().expect("versus f32 operands");
        assert_eq!(v.what, "f32 operands");
        assert!(v.median_ms > 0.0);
        let (lo, hi) = v.ratio_range;
        assert!(0.0 < lo && lo <= v.ratio && v.ratio <= hi, "{v:?}");
    }
    assert!(row("matmul_f32").versus.is_none());
    let table = report.table();
    assert!(table.contains("| GFLOP/s | of FMA peak |"), "{table}");
    assert!(table.contains("f32 FMA peak, widest vectors ("), "{table}");
    assert!(table.contains("x bare x @ w (turns "), "{table}");
    assert!(table.contains("x f32 operands ("), "{table}");
    assert!(table.contains("compute peak (independent f32x4"), "{table}");
}

#[test]
fn attention_runs_and_a_filtered_f16_product_still_has_its_f32_peer() {
    let report = run_suite(Some("attention"), &BenchOptions::tiny()).expect("runs");
    let names: Vec<&str> = report.rows.iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        ["attention", "attention_causal", "attention_causal_grad"]
    );
    let r = &report.rows[0];
    // Tiny shapes: 2 heads of [12, 8]; two products of 2*12*12*8 FLOPs each.
    assert_eq!(r.flops, Some(2.0 * 2.0 * (2.0 * 12.0 * 12.0 * 8.0)));
    assert!(r.fma_peak_fraction.is_some_and(|f| f > 0.0), "{r:?}");
    // Written with the primitives, it runs as the fused attention routine.
    assert_eq!(r.routine_steps, 1, "{r:?}");
    // Forward and backward: the attention routine and its backward's.
    assert_eq!(report.rows[2].routine_steps, 2, "{:?}", report.rows[2]);
    // A product of f16 operands times its f32 peer itself, so it has one alone.
    let report = run_suite(Some("matmul_f16"), &BenchOptions::tiny()).expect("runs");
    assert_eq!(report.rows.len(), 1);
    let v = report.rows[0].versus.as_ref();
    assert!(
        v.is_some_and(|v| v.what == "f32 operands"),
        "{:?}",
        report.rows[0]
    );
}

#[test]
fn the_json_object_carries_the_fma_peak_and_the_flop_figures() {
    let report = run_suite(Some("matmul_"), &BenchOptions::tiny()).expect("runs");
    let v = report.to_json();
    let fma = &v["machine"]["fma"];
    for key in ["flops_per_s_1t", "flops_per_s"] {
        assert!(fma[key].as_f64().is_some_and(|g| g > 0.0), "{key}: {v}");
        assert!(
            v["machine"]["compute"][key]
                .as_f64()
                .is_some_and(|g| g > 0.0),
            "{key}: {v}"
        );
    }
    assert!(fma["isa"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert!(fma["lanes"]
        .as_u64()
        .is_some_and(|l| [4, 8, 16].contains(&l)));
    // The 128-bit figure's keys are unchanged.
    for key in [
        "vector_ops_per_s",
        "vector_ops_per_s_1t",
        "trials",
        "threads",
    ] {
        assert!(v["machine"]["compute"][key].is_number(), "{key}: {v}");
    }
    let rows = v["rows"].as_array().expect("rows");
    for row in rows {
        for key in ["flops", "gflops", "fraction_of_fma_peak"] {
            assert!(row[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {row}");
        }
        // The keys every row had before.
        for key in [
            "gbps",
            "fraction_of_bandwidth",
            "compute_floor_ms",
            "x_floor",
        ] {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
    }
    let gelu = rows
        .iter()
        .find(|r| r["name"] == "matmul_gelu")
        .expect("row");
    assert_eq!(gelu["versus"]["what"], "bare x @ w");
    assert!(gelu["versus"]["ratio"].as_f64().is_some_and(|x| x > 0.0));
    let f32_row = rows
        .iter()
        .find(|r| r["name"] == "matmul_f32")
        .expect("row");
    assert!(f32_row["versus"].is_null());
}
