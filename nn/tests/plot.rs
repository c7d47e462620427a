//! Plots: an SVG with the curves and their names, and the refusals.

use ndfuse_nn::{plot_curves, Curve, Error};
use std::fs;
use std::path::PathBuf;

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-nn-plot-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn curves() -> (Vec<Curve>, Vec<Curve>) {
    let epochs = 1..=10;
    let loss = vec![
        Curve::new(
            "train_loss",
            epochs.clone().map(|e| (e as f64, 2.0 / e as f64)).collect(),
        ),
        Curve::new(
            "validation_loss",
            epochs
                .clone()
                .map(|e| (e as f64, 2.2 / e as f64 + 0.05))
                .collect(),
        ),
    ];
    let accuracy = vec![Curve::new(
        "validation_accuracy",
        epochs.map(|e| (e as f64, 1.0 - 0.5 / e as f64)).collect(),
    )];
    (loss, accuracy)
}

#[test]
fn writes_an_svg_with_every_panel_curve_and_name() {
    let dir = scratch("svg");
    let path = dir.join("curves.svg");
    let (loss, accuracy) = curves();
    plot_curves(
        &path,
        "digits mlp",
        "epoch",
        &[("loss", &loss), ("accuracy", &accuracy)],
    )
    .unwrap();
    let svg = fs::read_to_string(&path).unwrap();
    assert!(
        svg.trim_start().starts_with("<svg"),
        "{}",
        &svg[..80.min(svg.len())]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    for text in [
        "digits mlp",
        "epoch",
        "loss",
        "accuracy",
        "train_loss",
        "validation_loss",
        "validation_accuracy",
    ] {
        assert!(svg.contains(text), "{text} is not in the SVG");
    }
    // Three data lines of ten points each, at least (plus axes and legend strokes).
    let lines = svg.matches("<polyline").count() + svg.matches("<path").count();
    assert!(lines >= 3, "{lines} lines");
    assert!(
        svg.split("<polyline")
            .skip(1)
            .any(|p| p.split("points=\"").nth(1).is_some_and(|pts| pts
                .split('"')
                .next()
                .unwrap()
                .split(' ')
                .filter(|s| !s.is_empty())
                .count()
                == 10)),
        "no 10-point polyline"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn non_finite_points_are_skipped_and_counted_in_the_legend() {
    let dir = scratch("nan");
    let path = dir.join("diverged.svg");
    let c = Curve::new(
        "train",
        vec![
            (1.0, 1.0),
            (2.0, f64::NAN),
            (3.0, 0.5),
            (4.0, f64::INFINITY),
        ],
    );
    plot_curves(&path, "t", "step", &[("loss", &[c])]).unwrap();
    let svg = fs::read_to_string(&path).unwrap();
    assert!(
        svg.contains("train (2 non-finite points skipped)"),
        "legend lacks the note"
    );
    assert!(
        !svg.contains("NaN") && !svg.contains("inf"),
        "a non-finite value reached the SVG"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_other_formats_and_empty_input() {
    let dir = scratch("refuse");
    let (loss, _) = curves();
    for name in ["curves.png", "curves", "curves.svg.pdf"] {
        let err = plot_curves(&dir.join(name), "t", "x", &[("loss", &loss)]).unwrap_err();
        assert!(matches!(err, Error::Plot { .. }), "{name}: {err}");
        let text = err.to_string();
        assert!(text.contains("SVG") && text.contains(name), "{text}");
    }
    let err = plot_curves(&dir.join("a.svg"), "t", "x", &[]).unwrap_err();
    assert!(err.to_string().contains("no panels"), "{err}");
    let err = plot_curves(&dir.join("a.svg"), "t", "x", &[("loss", &[])]).unwrap_err();
    assert!(err.to_string().contains("\"loss\" has no curves"), "{err}");
    assert!(!dir.join("a.svg").exists());
    // Upper-case extensions are still SVG.
    plot_curves(&dir.join("b.SVG"), "t", "x", &[("loss", &loss)]).unwrap();
    fs::remove_dir_all(&dir).unwrap();
}
