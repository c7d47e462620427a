//! The ONNX backend test suite's node tests (`node/<test>/model.onnx` with its
//! `test_data_set_*/{input,output}_*.pb`), run on ndfuse backends and compared with the
//! suite's own tolerance (numpy's `assert_allclose`, rtol 1e-3, atol 1e-7).

use crate::error::OnnxError;
use crate::model::Model;
use crate::tensor::read_tensor_file;
use ndfuse::{Array, BackendKind, Context};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The suite's relative tolerance.
pub const RTOL: f64 = 1e-3;
/// The suite's absolute tolerance.
pub const ATOL: f64 = 1e-7;

/// How one test ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every output matched on every backend.
    Passed,
    /// An output differed, or an error that is not a missing feature.
    Failed(String),
    /// The model needs an operator, attribute or dtype the importer does not support.
    Unsupported(String),
}

/// One test's result.
#[derive(Clone, Debug)]
pub struct TestResult {
    /// The test's folder name (`test_add_bcast`).
    pub name: String,
    /// The operator it tests (its one node's; `composite` for several nodes).
    pub op: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// The node tests under `dir` (folders holding a `model.onnx`), sorted.
pub fn node_tests(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    v.sort();
    Ok(v)
}

/// Runs the test in folder `dir` on each backend.
pub fn run_test(dir: &Path, backends: &[BackendKind]) -> TestResult {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let model = Model::load(dir.join("model.onnx"));
    let op = match &model {
        Ok(m) => m.operator_summary(),
        Err(_) => "?".into(),
    };
    let outcome = match model {
        Ok(m) => {
            let run =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&m, dir, backends)));
            match run {
                Ok(o) => o,
                Err(p) => Outcome::Failed(format!(
                    "panicked: {}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )),
            }
        }
        Err(e) => classify(e),
    };
    TestResult { name, op, outcome }
}

fn classify(e: OnnxError) -> Outcome {
    match e {
        OnnxError::Unsupported { .. } => Outcome::Unsupported(e.to_string()),
        OnnxError::Tensor { ref why, .. } if why.ends_with("is not supported") => {
            Outcome::Unsupported(e.to_string())
        }
        e => Outcome::Failed(e.to_string()),
    }
}

fn check(m: &Model, dir: &Path, backends: &[BackendKind]) -> Outcome {
    let mut sets: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(r) => r
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))
            })
            .collect(),
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    sets.sort();
    if sets.is_empty() {
        return Outcome::Failed("no test_data_set_* folder".into());
    }
    if m.inputs().iter().chain(&m.outputs()).any(|s| !s.tensor) {
        return Outcome::Unsupported("sequence, map or optional values".into());
    }
    let declared: Vec<String> = m.inputs().into_iter().map(|s| s.name).collect();
    let outputs: Vec<String> = m.outputs().into_iter().map(|s| s.name).collect();
    for set in &sets {
        let read = |prefix: &str| -> Result<Vec<Array>, OnnxError> {
            let mut files: Vec<PathBuf> = std::fs::read_dir(set)
                .map_err(|e| OnnxError::Io {
                    path: set.clone(),
                    source: e.into(),
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                })
                .collect();
            files.sort_by_key(|p| {
                let s = p
                    .file_stem()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                s.rsplit('_')
                    .next()
                    .and_then(|i| i.parse::<usize>().ok())
                    .unwrap_or(0)
            });
            files
                .iter()
                .map(|f| read_tensor_file(f).map(|(_, a)| a))
                .collect()
        };
        let (ins, want) = match (read("input_"), read("output_")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return classify(e),
        };
        if ins.len() > declared.len() {
            return Outcome::Failed(format!(
                "{} inputs for {} declared",
                ins.len(),
                declared.len()
            ));
        }
        let named: Vec<(String, Array)> = declared.iter().cloned().zip(ins).collect();
        for &b in backends {
            let ctx = Context::new();
            ctx.set_backend(b);
            let got = match m.run(&ctx, &named) {
                Ok(g) => g,
                Err(e) => {
                    return match classify(e) {
                        Outcome::Failed(w) => Outcome::Failed(format!("{}: {w}", b.name())),
                        o => o,
                    }
                }
            };
            if got.len() != want.len() || want.len() > outputs.len() {
                return Outcome::Failed(format!(
                    "{} outputs, the suite has {}",
                    got.len(),
                    want.len()
                ));
            }
            for ((name, g), w) in got.iter().zip(&want) {
                if let Err(why) = compare(g, w) {
                    return Outcome::Failed(format!("{}: output '{name}': {why}", b.name()));
                }
            }
        }
    }
    Outcome::Passed
}

/// `assert_allclose(got, want, rtol, atol)` with NaNs equal, plus dtype and shape.
pub fn compare(got: &Array, want: &Array) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!(
            "dtype {} where the suite has {}",
            got.dtype(),
            want.dtype()
        ));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "shape {:?} where the suite has {:?}",
            got.shape(),
            want.shape()
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= ATOL + RTOL * b.abs();
        if !ok {
            let err = (a - b).abs();
            if worst.is_none_or(|(_, e)| err > e || err.is_nan()) {
                worst = Some((i, err));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => Err(format!(
            "element {i}: {} where the suite has {}",
            g[i], w[i]
        )),
    }
}

/// The results as a table by operator, closing with the summary line
/// `onnx node tests: R run, P passed, F failed, U unsupported`.
pub fn table(results: &[TestResult]) -> String {
    let mut by_op: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for r in results {
        let e = by_op.entry(&r.op).or_default();
        match r.outcome {
            Outcome::Passed => e[0] += 1,
            Outcome::Failed(_) => e[1] += 1,
            Outcome::Unsupported(_) => e[2] += 1,
        }
    }
    let mut s = format!(
        "{:<28} {:>6} {:>6} {:>6} {:>11}\n",
        "operator", "run", "passed", "failed", "unsupported"
    );
    for (op, [p, f, u]) in &by_op {
        s += &format!("{op:<28} {:>6} {p:>6} {f:>6} {u:>11}\n", p + f + u);
    }
    let p: usize = by_op.values().map(|c| c[0]).sum();
    let f: usize = by_op.values().map(|c| c[1]).sum();
    let u: usize = by_op.values().map(|c| c[2]).sum();
    s += &format!(
        "onnx node tests: {} run, {p} passed, {f} failed, {u} unsupported\n",
        results.len()
    );
    s
}
