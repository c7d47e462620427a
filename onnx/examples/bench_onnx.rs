//! Latency of the real ONNX models on this machine, warm (the graph and its kernels
//! compiled by the first run): silero-vad over 10 s of 16 kHz audio (313 chunks of
//! 512 samples plus 64 of context) and PP-OCRv4's text detector on a 640x640 page.
//! `scripts/onnx_peer.py` times onnxruntime on the same inputs; run the two back to back.
//!
//! `NDFUSE_ONNX=DIR cargo run --release -p ndfuse-onnx --example bench_onnx [RUNS [NAME]]`
//! (NAME: run only the rows whose description holds it, `silero` or `detector`)

use ndfuse::{Array, Context};
use ndfuse_onnx::Model;
use std::path::PathBuf;
use std::time::Instant;

fn signal(shape: &[usize], scale: f64) -> Array {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| {
            let i = i as f64;
            (scale * (0.5 * (0.37 * i).sin() + 0.5 * (0.011 * i).cos())) as f32
        })
        .collect();
    Array::from_vec(v, shape).expect("shape")
}

/// A row: what it is, the model's path under NDFUSE_ONNX, its inputs.
type Case = (&'static str, &'static str, Vec<(String, Array)>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::var_os("NDFUSE_ONNX").ok_or("set NDFUSE_ONNX (scripts/fetch_onnx.sh DIR)")?,
    );
    let runs: usize = std::env::args().nth(1).map_or(Ok(10), |s| s.parse())?;
    let cases: Vec<Case> = vec![
        (
            "silero-vad, 10 s of audio",
            "silero-vad/silero_vad_16k_sequence.onnx",
            vec![
                ("input".into(), signal(&[313, 576], 0.2)),
                ("h".into(), signal(&[1, 1, 128], 0.0)),
                ("c".into(), signal(&[1, 1, 128], 0.0)),
            ],
        ),
        (
            "PP-OCRv4 detector, 640x640",
            "rapidocr/ch_PP-OCRv4_det_infer.onnx",
            vec![("x".into(), signal(&[1, 3, 640, 640], 1.0))],
        ),
    ];
    let only = std::env::args().nth(2);
    let ctx = Context::new();
    for (what, rel, inputs) in cases {
        if only.as_deref().is_some_and(|o| !what.contains(o)) {
            continue;
        }
        let model = Model::load(dir.join(rel))?;
        let t0 = Instant::now();
        let (_, report) = model.run_report(&ctx, &inputs)?;
        let first = t0.elapsed().as_secs_f64();
        let mut times = Vec::with_capacity(runs);
        let mut build = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let outs = model.build(&ctx, &inputs)?;
            build.push(t.elapsed().as_secs_f64());
            let tensors: Vec<&ndfuse::Tensor> = outs.iter().map(|(_, t)| t).collect();
            ctx.eval(&tensors)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        build.sort_by(f64::total_cmp);
        println!(
            "{what}: median {:.2} ms (min {:.2}, max {:.2}; of which import {:.2} ms), first run {:.0} ms, {} kernels",
            times[runs / 2] * 1e3,
            times[0] * 1e3,
            times[runs - 1] * 1e3,
            build[runs / 2] * 1e3,
            first * 1e3,
            report.kernel_count()
        );
    }
    Ok(())
}
