//! The ONNX backend test suite's node tests on the `cpu` and `interp` backends. Needs
//! `NDFUSE_ONNX` (filled by `scripts/fetch_onnx.sh DIR`); without it the test prints why
//! it is skipped and passes, unless `NDFUSE_REQUIRE_ONNX=1` (CI), where it fails.
//!
//! `tests/node_expected.txt` lists every test that passes. A listed test that does not
//! pass fails this test (a regression); a test that passes and is not listed is printed
//! so that the list only grows.

use ndfuse::BackendKind;
use ndfuse_onnx::suite::{node_tests, run_test, table, Outcome};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn suite_dir() -> Option<PathBuf> {
    let required = std::env::var("NDFUSE_REQUIRE_ONNX").is_ok_and(|v| v == "1");
    let dir = std::env::var_os("NDFUSE_ONNX").map(|d| PathBuf::from(d).join("node"));
    match dir {
        Some(d) if d.is_dir() => Some(d),
        other => {
            let why = match other {
                Some(d) => format!("{} does not exist", d.display()),
                None => "NDFUSE_ONNX is not set".into(),
            };
            assert!(!required, "NDFUSE_REQUIRE_ONNX=1 but {why} (run scripts/fetch_onnx.sh DIR and set NDFUSE_ONNX=DIR)");
            eprintln!("skipped: {why} (run scripts/fetch_onnx.sh DIR and set NDFUSE_ONNX=DIR)");
            None
        }
    }
}

#[test]
fn onnx_node_tests() {
    let Some(dir) = suite_dir() else { return };
    let only = std::env::var("NDFUSE_ONNX_ONLY").ok();
    let tests: Vec<PathBuf> = node_tests(&dir)
        .unwrap()
        .into_iter()
        .filter(|p| {
            only.as_deref()
                .is_none_or(|o| p.to_string_lossy().contains(o))
        })
        .collect();
    let results: Vec<_> = tests
        .iter()
        .map(|t| run_test(t, &[BackendKind::Cpu, BackendKind::Interp]))
        .collect();
    let verbose = std::env::var("NDFUSE_ONNX_VERBOSE").is_ok_and(|v| v == "1");
    for r in &results {
        match &r.outcome {
            Outcome::Failed(w) => eprintln!("FAIL {}: {w}", r.name),
            Outcome::Unsupported(w) if verbose => eprintln!("UNSUPPORTED {}: {w}", r.name),
            _ => {}
        }
    }
    println!("{}", table(&results));
    let expected: BTreeSet<&str> = include_str!("node_expected.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let passed: BTreeSet<&str> = results
        .iter()
        .filter(|r| r.outcome == Outcome::Passed)
        .map(|r| r.name.as_str())
        .collect();
    let ran: BTreeSet<&str> = results.iter().map(|r| r.name.as_str()).collect();
    let new: Vec<&&str> = passed.difference(&expected).collect();
    if !new.is_empty() {
        println!(
            "{} tests pass that onnx/tests/node_expected.txt does not list:",
            new.len()
        );
        for n in &new {
            println!("{n}");
        }
    }
    let regressed: Vec<String> = expected
        .iter()
        .filter(|n| ran.contains(*n) && !passed.contains(*n))
        .map(|n| {
            let r = results.iter().find(|r| r.name == *n).unwrap();
            format!("{n}: {:?}", r.outcome)
        })
        .collect();
    let missing: Vec<&&str> = expected
        .iter()
        .filter(|n| only.is_none() && !ran.contains(*n))
        .collect();
    assert!(
        regressed.is_empty() && missing.is_empty(),
        "expected to pass but did not:\n{}\nnot in the suite: {missing:?}",
        regressed.join("\n")
    );
}
