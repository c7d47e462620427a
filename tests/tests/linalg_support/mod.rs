//! Host-side row-major f64 matrices shared by the linear-algebra tests: the products,
//! transposes and identities their checks are written with (plain loops, the oracle's
//! arithmetic, never the library under test).

#![allow(dead_code)]

/// Row-major `a @ b` (`m x k` by `k x n`).
pub fn mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

/// The transpose of row-major `a` (`m x n`).
pub fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..n * m).map(|x| a[(x % m) * n + x / m]).collect()
}

/// The identity `n x n`.
pub fn identity(n: usize) -> Vec<f64> {
    (0..n * n)
        .map(|x| f64::from(u8::from(x / n == x % n)))
        .collect()
}
