//! Shared helpers of the workspace tests: comparing backend results with the reference
//! interpreter under a stated tolerance, and distances in units in the last place.

pub mod catalogue;
pub mod hand_kernels;

use ndfuse::Array;
use ndfuse_ir::DType;

/// Distance in units in the last place between two f64 values of `dtype` precision:
/// 0 when bit-identical, when both are NaN, or for +0 vs -0 when `signed_zero` is off;
/// `u64::MAX` when exactly one is NaN or they differ in sign across infinities.
pub fn ulp_distance(a: f64, b: f64, dtype: DType) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    if a == b {
        return 0;
    }
    // Map each float onto a monotonic integer line (sign-magnitude to offset binary).
    fn key32(x: f32) -> i64 {
        let b = i64::from(x.to_bits() as i32);
        if b < 0 {
            i64::from(i32::MIN) - b
        } else {
            b
        }
    }
    fn key64(x: f64) -> i128 {
        let b = i128::from(x.to_bits() as i64);
        if b < 0 {
            i128::from(i64::MIN) - b
        } else {
            b
        }
    }
    match dtype {
        DType::F64 => u64::try_from((key64(a) - key64(b)).unsigned_abs()).unwrap_or(u64::MAX),
        DType::F32 => (key32(a as f32) - key32(b as f32)).unsigned_abs(),
        // Half types: count steps of the 16-bit format through f32 keys scaled down.
        DType::F16 => {
            let k = |x: f64| {
                let b = i64::from(half::f16::from_f64(x).to_bits() as i16);
                if b < 0 {
                    i64::from(i16::MIN) - b
                } else {
                    b
                }
            };
            (k(a) - k(b)).unsigned_abs()
        }
        DType::BF16 => {
            let k = |x: f64| {
                let b = i64::from(half::bf16::from_f64(x).to_bits() as i16);
                if b < 0 {
                    i64::from(i16::MIN) - b
                } else {
                    b
                }
            };
            (k(a) - k(b)).unsigned_abs()
        }
        _ => u64::from(a != b) * u64::MAX,
    }
}

/// Whether two values are the same bits (NaNs of any payload count as equal).
pub fn same_bits(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Asserts `got` equals `want` element by element within `max_ulp` (0: bit-identical,
/// NaN matching NaN, and -0.0 distinguished from +0.0), with a message naming the first
/// differing element.
pub fn assert_matches(got: &Array, want: &Array, max_ulp: u64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if max_ulp == 0 || !got.dtype().is_float() {
            same_bits(a, b)
        } else {
            ulp_distance(a, b, got.dtype()) <= max_ulp
        };
        assert!(ok, "{what}: element {i} is {a:e} ({:#x}), the reference says {b:e} ({:#x}); allowed {max_ulp} ulp", a.to_bits(), b.to_bits());
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` element by element (NaN must match
/// NaN, infinities must match exactly). For results whose error is not relative to
/// themselves: a value computed as a difference that cancels (layernorm's `x - mean`, a
/// row sum of normalised values) carries the rounding error of its terms' scale.
pub fn assert_close(got: &Array, want: &Array, rtol: f64, atol: f64, what: &str) {
    if let Err(why) = check_close(got, want, rtol, atol, what) {
        panic!("{why}");
    }
}

/// The case lines of fixture set `set` (`tests/fixtures/<set>/cases.txt`, written by a
/// script under `scripts/`), each split into its fields; comments and blanks left out.
pub fn fixture_cases(set: &str) -> Vec<Vec<String>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(set)
        .join("cases.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// Array `key` of case `case` of fixture set `set`
/// (`tests/fixtures/<set>/<case>/<key>.npy`).
pub fn fixture(set: &str, case: &str, key: &str) -> Array {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(set)
        .join(case)
        .join(format!("{key}.npy"));
    ndfuse::npy::read_npy(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// Panics unless `got` has `want`'s shape and every element is within `atol + rtol *
/// |want|` of it, whatever the two dtypes (a reference computed in f64, such as
/// PyTorch's fixtures, against a result in f32).
pub fn assert_near(what: &str, got: &Array, want: &Array, rtol: f64, atol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            (a - b).abs() <= atol + rtol * b.abs(),
            "{what}: element {i} is {a} against the reference's {b} (rtol {rtol:e}, atol {atol:e})"
        );
    }
}

/// [`assert_close`]'s check as a result, for a test that gathers every failure before
/// it fails: the first element out of tolerance (or the shape or dtype that differs).
pub fn check_close(
    got: &Array,
    want: &Array,
    rtol: f64,
    atol: f64,
    what: &str,
) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {:?}, the reference's {:?}",
            got.shape(),
            want.shape()
        ));
    }
    if got.dtype() != want.dtype() {
        return Err(format!(
            "{what}: dtype {}, the reference's {}",
            got.dtype(),
            want.dtype()
        ));
    }
    for (i, (a, b)) in got
        .to_f64_vec()
        .into_iter()
        .zip(want.to_f64_vec())
        .enumerate()
    {
        let ok = if a.is_nan() || b.is_nan() || a.is_infinite() || b.is_infinite() {
            same_bits(a, b) || (a.is_nan() && b.is_nan())
        } else {
            (a - b).abs() <= atol + rtol * b.abs()
        };
        if !ok {
            return Err(format!(
                "{what}: element {i} is {a:e}, the reference says {b:e} (rtol {rtol:e}, atol {atol:e})"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulp_distance_counts_representable_steps() {
        let one = 1.0f32;
        let next = f32::from_bits(one.to_bits() + 1);
        assert_eq!(ulp_distance(1.0, f64::from(next), DType::F32), 1);
        assert_eq!(ulp_distance(0.0, -0.0, DType::F32), 0);
        assert_eq!(
            ulp_distance(
                f64::from(f32::MIN_POSITIVE * 0.5),
                -f64::from(f32::MIN_POSITIVE * 0.5),
                DType::F32
            ),
            2 * (1 << 22)
        );
        assert_eq!(ulp_distance(f64::NAN, f64::NAN, DType::F64), 0);
        assert_eq!(ulp_distance(f64::NAN, 1.0, DType::F64), u64::MAX);
        assert_eq!(ulp_distance(1.0, 1.0 + f64::EPSILON, DType::F64), 1);
        assert!(!same_bits(0.0, -0.0));
    }
}
