//! Loss and accuracy curves written as an SVG plot.
//!
//! [`plot_curves`] draws one panel per entry, stacked top to bottom, each with its own
//! y axis and a legend, with `plotters`' SVG backend only: no bitmap encoders, no font
//! libraries (text is written as SVG `<text>` and the viewer picks the font).
//!
//! Non-finite points (a loss that went NaN or infinite) are skipped, not refused: the
//! curve's legend entry says how many were left out, so a diverged run still gets its
//! plot and the gap shows where it went wrong.
//!
//! ```
//! use ndfuse_nn::{plot_curves, Curve};
//! let path = std::env::temp_dir().join(format!("ndfuse-nn-plot-doc-{}.svg", std::process::id()));
//! let train = Curve::new("train", vec![(1.0, 0.9), (2.0, 0.5), (3.0, 0.3)]);
//! let valid = Curve::new("validation", vec![(1.0, 1.0), (2.0, 0.6), (3.0, 0.45)]);
//! plot_curves(&path, "digits", "epoch", &[("loss", &[train, valid])])?;
//! assert!(std::fs::read_to_string(&path)?.contains("validation"));
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::{Error, Result};
use plotters::prelude::*;
use std::io::Write as _;
use std::ops::Range;
use std::path::Path;

/// One named line: `(x, y)` points in the order they are joined.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    /// The legend's name for it ("train", "validation").
    pub name: String,
    /// The points, joined in this order.
    pub points: Vec<(f64, f64)>,
}

impl Curve {
    /// A curve named `name` through `points`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Curve {
        Curve {
            name: name.into(),
            points,
        }
    }
}

/// Width of the picture and height of one panel, in SVG pixels.
const WIDTH: u32 = 900;
const PANEL_HEIGHT: u32 = 360;
const TITLE_HEIGHT: u32 = 40;

/// Writes `panels` (a name such as "loss" and its curves) as an SVG at `path`,
/// atomically, one panel under the other, under `title`, all sharing `x_label`.
///
/// `Err` when `path` does not end in `.svg` (SVG is the only format), when there are no
/// panels or a panel has no curves, or when the file cannot be written. Non-finite
/// points are skipped and counted in the legend.
pub fn plot_curves(
    path: &Path,
    title: &str,
    x_label: &str,
    panels: &[(&str, &[Curve])],
) -> Result<()> {
    let refuse = |why: String| Error::Plot {
        path: path.to_path_buf(),
        why,
    };
    let is_svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !is_svg {
        return Err(refuse(
            "only SVG plots are written: give the file a .svg extension".into(),
        ));
    }
    if panels.is_empty() {
        return Err(refuse("no panels to plot".into()));
    }
    if let Some((name, _)) = panels.iter().find(|(_, curves)| curves.is_empty()) {
        return Err(refuse(format!("panel {name:?} has no curves")));
    }
    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels.len() as u32;
    let mut svg = String::new();
    draw(&mut svg, (WIDTH, height), title, x_label, panels)
        .map_err(|e| refuse(format!("drawing failed: {e}")))?;
    ndfuse::npy::write_atomic(path, |f| f.write_all(svg.as_bytes())).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Draws the whole picture into `svg`.
fn draw(
    svg: &mut String,
    size: (u32, u32),
    title: &str,
    x_label: &str,
    panels: &[(&str, &[Curve])],
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 24))?;
    for (area, (name, curves)) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let finite: Vec<Vec<(f64, f64)>> = curves
            .iter()
            .map(|c| {
                c.points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect()
            })
            .collect();
        let all = finite.iter().flatten();
        let xs = span(all.clone().map(|p| p.0));
        let ys = pad(span(all.map(|p| p.1)));
        let mut chart = ChartBuilder::on(area)
            .caption(*name, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(xs, ys)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(*name)
            .draw()?;
        for (i, (curve, points)) in curves.iter().zip(finite).enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            let skipped = curve.points.len() - points.len();
            let label = if skipped == 0 {
                curve.name.clone()
            } else {
                format!("{} ({skipped} non-finite points skipped)", curve.name)
            };
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// The smallest range holding `values`; `0..1` when there are none, and one unit wide
/// around a single value (plotters needs a range of positive width).
fn span(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        0.0..1.0
    } else if lo == hi {
        lo - 0.5..hi + 0.5
    } else {
        lo..hi
    }
}

/// `r` widened by 5% on each side, so that lines do not run along the frame.
fn pad(r: Range<f64>) -> Range<f64> {
    let d = (r.end - r.start) * 0.05;
    r.start - d..r.end + d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_of_no_one_and_many_values() {
        assert_eq!(span([].into_iter()), 0.0..1.0);
        assert_eq!(span([2.0].into_iter()), 1.5..2.5);
        assert_eq!(span([3.0, -1.0, 2.0].into_iter()), -1.0..3.0);
        assert_eq!(pad(0.0..10.0), -0.5..10.5);
    }
}
