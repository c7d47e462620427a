//! The `--report json` object of `ndfuse eval`.

use ndfuse::Report;
use std::time::Duration;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median of `xs` (the mean of the middle two for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// One JSON object for `runs` evaluations of the same expression: compile time is the
/// first run's (later runs hit the kernel cache), eval time the median run time with
/// compilation excluded.
pub fn json(runs: &[Report]) -> serde_json::Value {
    let Some(first) = runs.first() else {
        return serde_json::Value::Null;
    };
    let ev = first.evaluation();
    let eval_ms = median(runs.iter().map(|r| ms(r.evaluation().run_time)).collect());
    let bytes = first.bytes_moved();
    // GB/s is undefined for a run too short for the clock to see.
    let gbps = (eval_ms > 0.0).then(|| bytes as f64 / (eval_ms * 1e-3) / 1e9);
    serde_json::json!({
        "backend": ev.backend.name(),
        "kernels": first.kernel_count(),
        "compile_ms": ms(ev.compile_time),
        "eval_ms": eval_ms,
        "bytes_moved": bytes,
        "gbps": gbps,
        "repeat": runs.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}
