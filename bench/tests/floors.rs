//! The machine's vector width and read-only bandwidth in the report: the widest-vector
//! multiply/add probe beside the 128-bit one, each element-wise row's wide and 128-bit
//! floors, and the read-only bandwidth the `sum` row is measured against, in the table
//! and in the JSON object of `ndfuse bench --tiny --json`.

use ndfuse_bench::{run_suite, BenchOptions, BenchReport, Kind};
use std::sync::Mutex;

/// The tiny suite with a longer compute probe (about a millisecond a trial, not tens of
/// microseconds), so that thread start-up does not swamp the two probes it compares,
/// and the best of five trials, not two (with 2^16 iterations and two trials, a wide
/// probe read at half the 128-bit one's rate in 2 of 12 runs on the 2-core VM).
fn opts() -> BenchOptions {
    BenchOptions {
        peak_iterations: 1 << 18,
        stream_trials: 5,
        ..BenchOptions::tiny()
    }
}

/// The suite over the cases `filter` names, one run at a time in this binary: the
/// tests compare probes measured on every thread, and a suite running beside them in
/// another test's thread (the harness runs tests at once) made the widest FMA probe
/// read below the 128-bit one in a CI run.
fn suite(filter: Option<&str>) -> BenchReport {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    run_suite(filter, &opts()).expect("the suite runs")
}

fn number(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {v}"))
}

#[test]
fn the_json_object_has_the_wide_probe_the_read_bandwidth_and_both_floors() {
    let report = suite(None);
    let v = report.to_json();
    let m = &v["machine"];
    let wide = &m["wide_compute"];
    for key in [
        "vector_ops_per_s",
        "vector_ops_per_s_1t",
        "flops_per_s",
        "flops_per_s_1t",
    ] {
        assert!(number(wide, key) > 0.0, "{key}: {wide}");
    }
    assert!(
        wide["isa"].as_str().is_some_and(|s| !s.is_empty()),
        "{wide}"
    );
    assert_eq!(wide["chains"], 12, "{wide}");
    // The wide probe is the widest the CPU has, chosen at run time.
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
        assert_eq!(wide["lanes"], want, "{wide}");
    }
    assert_eq!(m["compute"]["lanes"], 4, "{}", m["compute"]);
    // Lane operations: lanes per vector operation, in both probes.
    for probe in [wide, &m["compute"]] {
        let lanes = number(probe, "lanes");
        let (ops, flops) = (
            number(probe, "vector_ops_per_s"),
            number(probe, "flops_per_s"),
        );
        assert!((ops * lanes - flops).abs() <= 1e-9 * flops, "{probe}");
    }
    let read = &m["read_bandwidth"];
    for key in [
        "read_1t_gbps",
        "read_all_gbps",
        "gbps",
        "over_machine_bandwidth",
    ] {
        assert!(number(read, key) > 0.0, "{key}: {read}");
    }
    assert_eq!(read["bytes"], 1 << 20, "{read}");
    assert_eq!(
        number(read, "gbps"),
        number(read, "read_1t_gbps").max(number(read, "read_all_gbps"))
    );
    let rows = v["rows"].as_array().expect("rows");
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no row {name}"))
    };
    // A routine (a scan, a sort) runs no compiled kernel whose operations are counted:
    // it has the memory floor only.
    let routine = |r: &&serde_json::Value| {
        ["scan_rows", "argsort", "quant_matvec"].contains(&r["name"].as_str().unwrap_or(""))
    };
    for r in rows
        .iter()
        .filter(|r| r["kind"] == "throughput" && routine(r))
    {
        assert!(
            r["floor_128_ms"].is_null() && number(r, "memory_floor_ms") > 0.0,
            "{r}"
        );
    }
    for r in rows
        .iter()
        .filter(|r| r["kind"] == "throughput" && !routine(r))
    {
        let (narrow, wide) = (number(r, "floor_128_ms"), number(r, "wide_floor_ms"));
        assert!(narrow > 0.0 && wide > 0.0, "{r}");
        // A kernel is never slower on the widest vectors than on 128-bit ones.
        assert!(
            wide <= narrow,
            "{}: wide {wide} ms, 128-bit {narrow} ms",
            r["name"]
        );
        // x floor is against the larger of the memory floor and the wide floor.
        assert_eq!(r["compute_floor_ms"], r["wide_floor_ms"], "{r}");
        let floor = number(r, "memory_floor_ms").max(wide);
        let x = number(r, "x_floor");
        assert!(
            (x * floor - number(r, "median_ms")).abs() <= 1e-9 * x * floor,
            "{r}"
        );
    }
    // The sum only reads: its GB/s over the read-only bandwidth. gelu writes what it
    // reads: no such fraction.
    let sum = row("sum");
    let fraction = number(sum, "fraction_of_read_bandwidth");
    assert!(
        (fraction * number(read, "gbps") - number(sum, "gbps")).abs() <= 1e-9 * fraction,
        "{sum}"
    );
    assert!(row("gelu")["fraction_of_read_bandwidth"].is_null());
    assert!(row("compile_new")["fraction_of_read_bandwidth"].is_null());
    assert!(row("compile_new")["floor_128_ms"].is_null());
}

#[test]
fn the_table_prints_both_probes_the_read_bandwidth_and_both_floors() {
    let report = suite(Some("sum"));
    let table = report.table();
    for want in [
        "read-only bandwidth (sum of a 1 MiB f32 buffer, ",
        "compute peak (independent f32x4 mul/add chains, ",
        "compute peak, widest vectors (independent ",
        "| of bandwidth | of read bw |",
        "| 128-bit floor ms | wide floor ms | x floor |",
        "wide = the same lane operations",
    ] {
        assert!(table.contains(want), "no {want:?} in\n{table}");
    }
    let sum = report.rows.iter().find(|r| r.name == "sum").expect("row");
    assert_eq!(sum.kind, Kind::Throughput);
    let read = sum
        .read_fraction
        .expect("the sum reports its read fraction");
    assert!(
        table.contains(&format!("| {:.1}% |", read * 100.0)),
        "{table}"
    );
    let (narrow, wide) = (
        sum.floor_128_ms.expect("128-bit floor"),
        sum.compute_floor_ms.expect("wide floor"),
    );
    assert!(
        table.contains(&format!("| {narrow:.2} | {wide:.2} |")),
        "{table}"
    );
}
