//! The training loop's progress bar: loss and throughput, and with f16 loss scaling the
//! current scale and the steps skipped.
//!
//! Drawn on stderr with `indicatif` only when stderr is a terminal and the environment
//! variable `NDFUSE_PROGRESS` is not `0`; otherwise the bar is hidden and every call is
//! a cheap no-op, so tests, CI logs and redirected runs print nothing.
//!
//! ```
//! use ndfuse_nn::Progress;
//! let bar = Progress::new(100, "epoch 1");
//! for step in 1..=100 {
//!     bar.update(step, 0.5 / step as f64, 12_000.0);
//! }
//! bar.finish("epoch 1: loss 0.005");
//! ```

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// The layout: label, bar, step/total, the latest loss and throughput, elapsed<eta.
const TEMPLATE: &str = "{prefix} [{bar:32}] {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]";

/// A progress bar over a fixed number of training steps.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total_steps` steps labelled `label`; hidden unless stderr is a terminal
    /// and `NDFUSE_PROGRESS` is not `0`.
    pub fn new(total_steps: u64, label: &str) -> Progress {
        let env = std::env::var("NDFUSE_PROGRESS").ok();
        let target = if visible(std::io::stderr().is_terminal(), env.as_deref()) {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Progress::with_target(total_steps, label, target)
    }

    /// A bar that never draws (what [`Progress::new`] gives without a terminal).
    pub fn hidden(total_steps: u64, label: &str) -> Progress {
        Progress::with_target(total_steps, label, ProgressDrawTarget::hidden())
    }

    fn with_target(total_steps: u64, label: &str, target: ProgressDrawTarget) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total_steps), target);
        // The template is a constant: it parses or a test fails; keep the default style
        // rather than panic should it ever not.
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(label.to_string());
        Progress { bar }
    }

    /// Whether the bar draws anything.
    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden()
    }

    /// Moves the bar to `step` and shows the latest loss and throughput.
    pub fn update(&self, step: u64, loss: f64, samples_per_sec: f64) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.set_position(step);
        self.bar.set_message(status(loss, samples_per_sec));
    }

    /// [`Progress::update`] of a run with dynamic loss scaling: also shows the current
    /// `loss_scale` and the steps `skipped` so far.
    pub fn update_scaled(
        &self,
        step: u64,
        loss: f64,
        samples_per_sec: f64,
        loss_scale: f64,
        skipped: u64,
    ) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.set_position(step);
        self.bar.set_message(format!(
            "{} | {}",
            status(loss, samples_per_sec),
            scale_status(loss_scale, skipped)
        ));
    }

    /// Prints a line above the bar (an evaluation result, a checkpoint saved...).
    pub fn message(&self, text: &str) {
        self.bar.println(text);
    }

    /// Completes the bar and leaves `summary` in place of the loss.
    pub fn finish(&self, summary: &str) {
        self.bar.finish_with_message(summary.to_string());
    }
}

/// Whether to draw: on a terminal, unless `NDFUSE_PROGRESS=0`.
fn visible(stderr_is_terminal: bool, env: Option<&str>) -> bool {
    stderr_is_terminal && env.map(str::trim) != Some("0")
}

/// The bar's message: `loss 0.1235 | 12.3k samples/s`.
fn status(loss: f64, samples_per_sec: f64) -> String {
    let rate = if samples_per_sec >= 1e6 {
        format!("{:.2}M", samples_per_sec / 1e6)
    } else if samples_per_sec >= 1e3 {
        format!("{:.1}k", samples_per_sec / 1e3)
    } else {
        format!("{samples_per_sec:.0}")
    };
    // Small losses keep their digits: 0.0000 says nothing about 3e-6.
    let loss = if loss != 0.0 && loss.abs() < 1e-3 {
        format!("{loss:.3e}")
    } else {
        format!("{loss:.4}")
    };
    format!("loss {loss} | {rate} samples/s")
}

/// `scale 2^15, 3 skipped`: the loss scale (a power of two as one) and the steps skipped.
pub(crate) fn scale_status(scale: f64, skipped: u64) -> String {
    let log = scale.log2();
    let scale = if log.fract() == 0.0 && log.abs() < 1024.0 {
        format!("2^{log}")
    } else {
        format!("{scale:e}")
    };
    format!("scale {scale}, {skipped} skipped")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_only_on_a_terminal_unless_switched_off() {
        assert!(visible(true, None));
        assert!(visible(true, Some("1")));
        assert!(!visible(true, Some("0")));
        assert!(!visible(false, None));
        assert!(!visible(false, Some("1")));
    }

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }

    #[test]
    fn status_shows_loss_and_rate() {
        assert_eq!(status(0.123_456, 12_345.0), "loss 0.1235 | 12.3k samples/s");
        assert_eq!(status(2.0, 950.0), "loss 2.0000 | 950 samples/s");
        assert_eq!(status(1e-5, 2_500_000.0), "loss 1.000e-5 | 2.50M samples/s");
    }

    #[test]
    fn the_loss_scale_shows_as_a_power_of_two() {
        assert_eq!(scale_status(65536.0, 0), "scale 2^16, 0 skipped");
        assert_eq!(scale_status(0.5, 3), "scale 2^-1, 3 skipped");
        assert_eq!(scale_status(3.0, 1), "scale 3e0, 1 skipped");
    }

    #[test]
    fn a_hidden_bar_accepts_every_call() {
        let p = Progress::hidden(10, "test");
        assert!(p.is_hidden());
        p.update(3, 0.5, 100.0);
        p.update_scaled(4, 0.5, 100.0, 1024.0, 2);
        p.message("note");
        p.finish("done");
    }
}
