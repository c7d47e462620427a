//! The LAPACK-level ops ([`LinalgOp`]) in f64 on one matrix at a time, by textbook
//! algorithms: the oracle the library routines are tested against, written to be
//! obviously right rather than fast (all are O(n^3) per sweep or factorisation, with no
//! blocking).
//!
//! - `cholesky`: the column-by-column Cholesky–Banachiewicz recurrence on the lower
//!   triangle. Backward stable: `L L^T = A + E`, `|E| <= c n eps |L| |L^T|`.
//! - `solve`, `lu`, `det`, `slogdet`: Gaussian elimination with partial pivoting (the
//!   largest magnitude, the first on a tie: LAPACK's `getrf` choice), then forward and
//!   back substitution. Backward stable in practice (growth factor small); the error in
//!   `x` is about `cond(A) eps`.
//! - `triangular_solve`: substitution, backward stable; `x @ t = b` is solved as
//!   `t^T @ x^T = b^T`.
//! - `qr`: Householder reflectors (`geqrf`'s, with `H = I` where the column is already
//!   reduced), `Q` accumulated backwards from the identity. Backward stable; `Q` is
//!   orthonormal to a few eps.
//! - `svd`, `svdvals`: one-sided (Hestenes) Jacobi on whichever of `A`, `A^T` is tall,
//!   after scaling by a power of two so that squares neither overflow nor underflow: plane
//!   rotations of column pairs until every pair is orthogonal to `rows * eps` relative.
//!   Singular values to a few `eps ||A||` (small ones often better), singular vectors
//!   orthonormal to a few eps. Vectors that the nonzero singular values do not determine
//!   (zero singular values, the full case's extra ones) are completed from the standard
//!   basis by Gram–Schmidt, twice.
//! - `eigh`, `eigvalsh`: the cyclic Jacobi eigenvalue method on the (scaled) symmetric
//!   matrix, rotating while `|a_pq| > eps sqrt(|a_pp a_qq|)`: eigenvalues to a few `eps
//!   ||A||` or better, `V` a product of rotations, orthonormal to a few eps even for
//!   repeated eigenvalues.
//!
//! Both Jacobi methods converge quadratically: random, rank-deficient, clustered and
//! Hilbert matrices up to 300 x 300 settle in at most 12 sweeps. Were 60 sweeps not to
//! settle the last rounding-level rotations, the result is returned as it stands: only
//! non-finite input fails.
//!
//! Failures are numpy's `LinAlgError` cases with LAPACK's `info`: an exactly zero pivot
//! (`solve`, `triangular_solve`; not `lu`, `det`, `slogdet`, which complete), a leading
//! minor that is not positive definite (`cholesky`), and NaN or infinite input to the
//! iterative solvers (`svd`, `svdvals`, `eigh`, `eigvalsh`). Signs follow
//! [`crate::linalg`]'s conventions.

#![allow(clippy::needless_range_loop)]

use crate::linalg::{
    canonical_column_signs, canonical_qr_signs, canonical_row_signs, LinalgFailure, LinalgOp,
};

const EPS: f64 = f64::EPSILON;
/// The most Jacobi sweeps (about 10 are needed: convergence is quadratic).
const MAX_SWEEPS: usize = 60;

/// Evaluates `op` on ONE matrix problem: `a` is m x n row-major, `b` (for Solve /
/// TriangularSolve) is row-major with extents `b_rows x b_cols`. Returns the result in
/// the op's layout: for packed ops the parts concatenated in the order
/// `op.parts(m, n)` gives (each row-major), for Cholesky the n x n L (zeros above the
/// diagonal), for Solve/TriangularSolve a result of b's extents, for Det one value,
/// for Svdvals/Eigvalsh the values. Signs follow the canonical conventions of
/// crate::linalg (apply the helpers from there).
pub(super) fn eval_one(
    op: LinalgOp,
    a: &[f64],
    m: usize,
    n: usize,
    b: Option<(&[f64], usize, usize)>,
) -> Result<Vec<f64>, LinalgFailure> {
    debug_assert_eq!(a.len(), m * n, "{op}: a's length");
    debug_assert!(!op.square() || m == n, "{op}: a is not square");
    debug_assert_eq!(b.is_some(), op.arity() == 2, "{op}: b");
    let b = b.unwrap_or((&[], 0, 0));
    debug_assert_eq!(b.0.len(), b.1 * b.2, "{op}: b's length");
    match op {
        LinalgOp::Cholesky => cholesky(a, n),
        LinalgOp::Solve => solve(a, n, b),
        // The inverse solves for the identity's columns.
        LinalgOp::Inv => {
            let eye: Vec<f64> = (0..n * n)
                .map(|i| f64::from(u8::from(i / n == i % n)))
                .collect();
            solve(a, n, (&eye, n, n))
        }
        LinalgOp::TriangularSolve {
            lower,
            left,
            unit_diagonal,
        } => triangular_solve(a, n, lower, left, unit_diagonal, b),
        LinalgOp::Lu => Ok(lu_parts(a, m, n)),
        LinalgOp::Det => Ok(vec![det(a, n)]),
        LinalgOp::Slogdet => Ok(slogdet(a, n).to_vec()),
        LinalgOp::Qr { complete } => Ok(qr(a, m, n, complete)),
        LinalgOp::Svd { full } => svd(a, m, n, full),
        LinalgOp::Svdvals => Ok(jacobi_svd(a, m, n)?.sigma),
        LinalgOp::Eigh { upper } => eigh(a, n, upper, true),
        LinalgOp::Eigvalsh { upper } => eigh(a, n, upper, false),
    }
}

// ---------------------------------------------------------------------------------------
// Small helpers.
// ---------------------------------------------------------------------------------------

fn dot(x: &[f64], y: &[f64]) -> f64 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// The 2-norm, scaled by the largest magnitude so that the squares cannot overflow or
/// underflow (NaN for NaN input, infinity for infinite).
fn norm(x: &[f64]) -> f64 {
    let s = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if s == 0.0 || !s.is_finite() {
        return x.iter().map(|v| v * v).sum::<f64>().sqrt();
    }
    s * x.iter().map(|v| (v / s) * (v / s)).sum::<f64>().sqrt()
}

fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = a[i * cols + j];
        }
    }
    t
}

fn identity(rows: usize, cols: usize) -> Vec<f64> {
    let mut e = vec![0.0; rows * cols];
    for i in 0..rows.min(cols) {
        e[i * cols + i] = 1.0;
    }
    e
}

fn column(a: &[f64], rows: usize, cols: usize, j: usize) -> Vec<f64> {
    (0..rows).map(|i| a[i * cols + j]).collect()
}

/// `2^e` for `-1022 <= e <= 1023`, exactly.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// The exponent `e` of the largest magnitude in `a` (0 for a zero matrix): scaling by
/// `pow2(-e)`, which is exact, brings it to about 1.
fn scale_exponent(a: &[f64]) -> i32 {
    let s = a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if s == 0.0 {
        return 0;
    }
    (s.log2().floor() as i32).clamp(-1022, 1022)
}

/// Appends unit vectors of length `dim` to the orthonormal `basis` until it holds `want`:
/// the standard basis vectors in order, each orthogonalised against the basis by
/// Gram–Schmidt twice and kept when more than `0.5 / sqrt(dim)` of it remains. One always
/// remains: the squared remainders of all `dim` of them sum to `dim - basis.len()`.
fn complete_basis(basis: &mut Vec<Vec<f64>>, dim: usize, want: usize) {
    let keep = 0.5 / (dim as f64).sqrt();
    let mut next = 0;
    while basis.len() < want {
        assert!(next < dim, "no basis vector left to complete with (a bug)");
        let mut e = vec![0.0; dim];
        e[next] = 1.0;
        next += 1;
        for _ in 0..2 {
            for v in basis.iter() {
                let d = dot(v, &e);
                for (x, y) in e.iter_mut().zip(v) {
                    *x -= d * y;
                }
            }
        }
        let r = norm(&e);
        if r > keep {
            e.iter_mut().for_each(|x| *x /= r);
            basis.push(e);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cholesky, LU and the solves.
// ---------------------------------------------------------------------------------------

fn cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, LinalgFailure> {
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        let d = a[j * n + j] - (0..j).map(|p| l[j * n + p] * l[j * n + p]).sum::<f64>();
        if d.is_nan() || d <= 0.0 {
            return Err(LinalgFailure::NotPositiveDefinite { minor: j + 1 });
        }
        let ljj = d.sqrt();
        l[j * n + j] = ljj;
        for i in j + 1..n {
            let s = (0..j).map(|p| l[i * n + p] * l[j * n + p]).sum::<f64>();
            l[i * n + j] = (a[i * n + j] - s) / ljj;
        }
    }
    Ok(l)
}

/// `P A = L U` of an `m x n` matrix, packed as `getrf` packs it.
struct Lu {
    /// `L` strictly below the diagonal (its unit diagonal implied), `U` on and above.
    w: Vec<f64>,
    /// Row `i` of `L U` is row `perm[i]` of `A`.
    perm: Vec<usize>,
    /// The permutation's sign.
    sign: f64,
    /// The first exactly zero pivot (0-based); elimination skips its column.
    zero_pivot: Option<usize>,
}

fn lu_factor(a: &[f64], m: usize, n: usize) -> Lu {
    let mut w = a.to_vec();
    let mut perm: Vec<usize> = (0..m).collect();
    let (mut sign, mut zero_pivot) = (1.0, None);
    for j in 0..m.min(n) {
        let p = (j..m).fold(j, |p, i| {
            if w[i * n + j].abs() > w[p * n + j].abs() {
                i
            } else {
                p
            }
        });
        if p != j {
            for c in 0..n {
                w.swap(j * n + c, p * n + c);
            }
            perm.swap(j, p);
            sign = -sign;
        }
        let pivot = w[j * n + j];
        if pivot == 0.0 {
            zero_pivot.get_or_insert(j);
            continue;
        }
        for i in j + 1..m {
            let f = w[i * n + j] / pivot;
            w[i * n + j] = f;
            for c in j + 1..n {
                w[i * n + c] -= f * w[j * n + c];
            }
        }
    }
    Lu {
        w,
        perm,
        sign,
        zero_pivot,
    }
}

/// Overwrites `x` (`n x k`) with `t^-1 x`, `t` the lower (`lower`) or upper triangle of
/// `t` (`n x n`), with ones on its diagonal when `unit` (it is not read then).
fn substitute(t: &[f64], n: usize, lower: bool, unit: bool, x: &mut [f64], k: usize) {
    for step in 0..n {
        let i = if lower { step } else { n - 1 - step };
        let done = if lower { 0..i } else { i + 1..n };
        for p in done {
            let tip = t[i * n + p];
            for c in 0..k {
                x[i * k + c] -= tip * x[p * k + c];
            }
        }
        if !unit {
            let d = t[i * n + i];
            for c in 0..k {
                x[i * k + c] /= d;
            }
        }
    }
}

fn solve(
    a: &[f64],
    n: usize,
    (b, rows, k): (&[f64], usize, usize),
) -> Result<Vec<f64>, LinalgFailure> {
    debug_assert_eq!(rows, n, "solve: b's rows");
    let f = lu_factor(a, n, n);
    if let Some(pivot) = f.zero_pivot {
        return Err(LinalgFailure::Singular { pivot });
    }
    // x = P^T b, then L^-1 x, then U^-1 x.
    let mut x: Vec<f64> = (0..n * k).map(|i| b[f.perm[i / k] * k + i % k]).collect();
    substitute(&f.w, n, true, true, &mut x, k);
    substitute(&f.w, n, false, false, &mut x, k);
    Ok(x)
}

fn triangular_solve(
    a: &[f64],
    n: usize,
    lower: bool,
    left: bool,
    unit: bool,
    (b, rows, cols): (&[f64], usize, usize),
) -> Result<Vec<f64>, LinalgFailure> {
    if !unit {
        // As `trtrs`: the first zero on the diagonal, before any arithmetic.
        if let Some(pivot) = (0..n).find(|&i| a[i * n + i] == 0.0) {
            return Err(LinalgFailure::Singular { pivot });
        }
    }
    if left {
        debug_assert_eq!(rows, n, "triangular_solve: b's rows");
        let mut x = b.to_vec();
        substitute(a, n, lower, unit, &mut x, cols);
        Ok(x)
    } else {
        // x t = b  <=>  t^T x^T = b^T, and t^T is the other triangle of a^T.
        debug_assert_eq!(cols, n, "triangular_solve: b's columns");
        let mut xt = transpose(b, rows, cols);
        substitute(&transpose(a, n, n), n, !lower, unit, &mut xt, rows);
        Ok(transpose(&xt, cols, rows))
    }
}

/// scipy's `lu`: `P [m, m]`, `L [m, k]`, `U [k, n]` with `a = P L U`.
fn lu_parts(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let k = m.min(n);
    let f = lu_factor(a, m, n);
    let mut p = vec![0.0; m * m];
    for (i, &r) in f.perm.iter().enumerate() {
        p[r * m + i] = 1.0;
    }
    let mut l = vec![0.0; m * k];
    for i in 0..m {
        for j in 0..k.min(i) {
            l[i * k + j] = f.w[i * n + j];
        }
        if i < k {
            l[i * k + i] = 1.0;
        }
    }
    let mut u = vec![0.0; k * n];
    for i in 0..k {
        for j in i..n {
            u[i * n + j] = f.w[i * n + j];
        }
    }
    p.extend(l);
    p.extend(u);
    p
}

fn det(a: &[f64], n: usize) -> f64 {
    let f = lu_factor(a, n, n);
    (0..n).fold(f.sign, |d, i| d * f.w[i * n + i])
}

/// numpy's `slogdet`: `[sign, log|det|]`, `[0, -inf]` for an exactly zero pivot.
fn slogdet(a: &[f64], n: usize) -> [f64; 2] {
    let f = lu_factor(a, n, n);
    if f.zero_pivot.is_some() {
        return [0.0, f64::NEG_INFINITY];
    }
    let (mut sign, mut log) = (f.sign, 0.0);
    for i in 0..n {
        let d = f.w[i * n + i];
        sign *= d.signum();
        log += d.abs().ln();
    }
    [sign, log]
}

// ---------------------------------------------------------------------------------------
// Householder QR.
// ---------------------------------------------------------------------------------------

/// The unit `v` of the reflector `I - 2 v v^T` that maps `x` onto `beta e_0` with `beta =
/// -sign(x_0) ||x||` (no cancellation in `v_0 = x_0 - beta`); `None` (the identity) when
/// `x` is a multiple of `e_0` already.
fn householder(x: &[f64]) -> Option<Vec<f64>> {
    let tail = norm(&x[1..]);
    if tail == 0.0 {
        return None;
    }
    let beta = -x[0].hypot(tail).copysign(x[0]);
    let mut v = x.to_vec();
    v[0] -= beta;
    let nv = norm(&v);
    v.iter_mut().for_each(|y| *y /= nv);
    Some(v)
}

/// Applies `I - 2 v v^T` to rows `row0..row0 + v.len()` of the `? x cols` matrix `x`,
/// in columns `col0..cols`.
fn reflect(x: &mut [f64], cols: usize, row0: usize, v: &[f64], col0: usize) {
    for c in col0..cols {
        let d: f64 = (0..v.len()).map(|i| v[i] * x[(row0 + i) * cols + c]).sum();
        for i in 0..v.len() {
            x[(row0 + i) * cols + c] -= 2.0 * d * v[i];
        }
    }
}

fn qr(a: &[f64], m: usize, n: usize, complete: bool) -> Vec<f64> {
    let k = m.min(n);
    let mut r = a.to_vec();
    let mut reflectors = Vec::new();
    for j in 0..k {
        let Some(v) = householder(&column(&r, m, n, j)[j..]) else {
            continue;
        };
        reflect(&mut r, n, j, &v, j);
        for i in j + 1..m {
            r[i * n + j] = 0.0;
        }
        reflectors.push((j, v));
    }
    // Q = H_0 H_1 ... applied to the first columns of the identity.
    let q_cols = if complete { m } else { k };
    let mut q = identity(m, q_cols);
    for (j, v) in reflectors.iter().rev() {
        reflect(&mut q, q_cols, *j, v, 0);
    }
    let r_rows = if complete { m } else { k };
    r.truncate(r_rows * n);
    canonical_qr_signs(&mut q, m, q_cols, &mut r, r_rows, n);
    q.extend(r);
    q
}

// ---------------------------------------------------------------------------------------
// One-sided Jacobi SVD.
// ---------------------------------------------------------------------------------------

/// `W = G V` with orthogonal columns, for `G` the tall one of `a`, `a^T`.
struct Jacobi {
    /// `G = a` (else `a^T`).
    tall: bool,
    /// `G`'s extents, `rows >= cols`.
    rows: usize,
    cols: usize,
    /// The unit left singular vectors of `G` for its nonzero singular values, in order.
    u: Vec<Vec<f64>>,
    /// `V`'s columns, in order (`cols` of them).
    v: Vec<Vec<f64>>,
    /// `a`'s singular values, descending.
    sigma: Vec<f64>,
}

/// Rotates columns `p`, `q` of the `rows x cols` matrix `x` by `[[c, s], [-s, c]]`.
fn rotate_columns(x: &mut [f64], rows: usize, cols: usize, (p, q): (usize, usize), c: f64, s: f64) {
    for i in 0..rows {
        let (xp, xq) = (x[i * cols + p], x[i * cols + q]);
        x[i * cols + p] = c * xp - s * xq;
        x[i * cols + q] = s * xp + c * xq;
    }
}

/// `(c, s)` of the rotation that diagonalises the symmetric `[[app, apq], [apq, aqq]]`
/// (`apq != 0`), the smaller of the two angles (Golub and Van Loan's `sym.schur2`).
fn jacobi_rotation(app: f64, aqq: f64, apq: f64) -> (f64, f64) {
    let tau = (aqq - app) / (2.0 * apq);
    let t = tau.signum() / (tau.abs() + tau.hypot(1.0));
    let c = 1.0 / t.hypot(1.0);
    (c, c * t)
}

fn jacobi_svd(a: &[f64], m: usize, n: usize) -> Result<Jacobi, LinalgFailure> {
    if a.iter().any(|x| !x.is_finite()) {
        return Err(LinalgFailure::NoConvergence);
    }
    let tall = m >= n;
    let (rows, cols) = if tall { (m, n) } else { (n, m) };
    let e = scale_exponent(a);
    let mut g = if tall { a.to_vec() } else { transpose(a, m, n) };
    g.iter_mut().for_each(|x| *x *= pow2(-e));
    let mut v = identity(cols, cols);
    let tol = EPS * rows as f64;
    for _ in 0..MAX_SWEEPS {
        let mut rotated = false;
        for p in 0..cols {
            for q in p + 1..cols {
                let (mut alpha, mut beta, mut gamma) = (0.0f64, 0.0f64, 0.0f64);
                for i in 0..rows {
                    let (x, y) = (g[i * cols + p], g[i * cols + q]);
                    alpha += x * x;
                    beta += y * y;
                    gamma += x * y;
                }
                if gamma.abs() <= tol * alpha.sqrt() * beta.sqrt() {
                    continue;
                }
                rotated = true;
                let (c, s) = jacobi_rotation(alpha, beta, gamma);
                rotate_columns(&mut g, rows, cols, (p, q), c, s);
                rotate_columns(&mut v, cols, cols, (p, q), c, s);
            }
        }
        if !rotated {
            break;
        }
    }
    let w: Vec<Vec<f64>> = (0..cols).map(|j| column(&g, rows, cols, j)).collect();
    let norms: Vec<f64> = w.iter().map(|c| norm(c)).collect();
    let mut order: Vec<usize> = (0..cols).collect();
    order.sort_by(|&i, &j| norms[j].total_cmp(&norms[i]));
    let u = order
        .iter()
        .filter(|&&j| norms[j] > 0.0)
        .map(|&j| w[j].iter().map(|x| x / norms[j]).collect())
        .collect();
    Ok(Jacobi {
        tall,
        rows,
        cols,
        u,
        v: order.iter().map(|&j| column(&v, cols, cols, j)).collect(),
        sigma: order.iter().map(|&j| norms[j] * pow2(e)).collect(),
    })
}

fn svd(a: &[f64], m: usize, n: usize, full: bool) -> Result<Vec<f64>, LinalgFailure> {
    let k = m.min(n);
    let Jacobi {
        tall,
        rows,
        cols,
        u: mut left,
        v: right,
        sigma,
    } = jacobi_svd(a, m, n)?;
    complete_basis(&mut left, rows, if full { rows } else { cols });
    // G = left diag(S) right^T: for a tall a, U = left and Vh = right^T; else the reverse.
    let (u_vectors, mut vh) = if tall {
        (left, right.concat())
    } else {
        (right, left.concat())
    };
    let mut u = transpose(&u_vectors.concat(), u_vectors.len(), m);
    let (u_cols, vh_rows) = if full { (m, n) } else { (k, k) };
    canonical_column_signs(&mut u, m, u_cols, Some((&mut vh, vh_rows, n)));
    if full {
        canonical_row_signs(&mut vh, n, k);
    }
    u.extend(sigma);
    u.extend(vh);
    Ok(u)
}

// ---------------------------------------------------------------------------------------
// Cyclic Jacobi eigenvalues.
// ---------------------------------------------------------------------------------------

/// `[w, V]` (or `w` alone) of the symmetric matrix in `a`'s lower (or upper) triangle.
fn eigh(a: &[f64], n: usize, upper: bool, vectors: bool) -> Result<Vec<f64>, LinalgFailure> {
    let mut s = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let x = if upper { a[j * n + i] } else { a[i * n + j] };
            s[i * n + j] = x;
            s[j * n + i] = x;
        }
    }
    if s.iter().any(|x| !x.is_finite()) {
        return Err(LinalgFailure::NoConvergence);
    }
    let e = scale_exponent(&s);
    s.iter_mut().for_each(|x| *x *= pow2(-e));
    let mut v = identity(n, n);
    for _ in 0..MAX_SWEEPS {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (app, aqq, apq) = (s[p * n + p], s[q * n + q], s[p * n + q]);
                if apq.abs() <= EPS * app.abs().sqrt() * aqq.abs().sqrt() {
                    continue;
                }
                rotated = true;
                let (c, sn) = jacobi_rotation(app, aqq, apq);
                // S <- J^T S J, V <- V J, J = [[c, s], [-s, c]] in rows/columns p, q.
                rotate_columns(&mut s, n, n, (p, q), c, sn);
                for r in 0..n {
                    let (xp, xq) = (s[p * n + r], s[q * n + r]);
                    s[p * n + r] = c * xp - sn * xq;
                    s[q * n + r] = sn * xp + c * xq;
                }
                s[p * n + q] = 0.0;
                s[q * n + p] = 0.0;
                rotate_columns(&mut v, n, n, (p, q), c, sn);
            }
        }
        if !rotated {
            break;
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| s[i * n + i].total_cmp(&s[j * n + j]));
    let mut out: Vec<f64> = order.iter().map(|&i| s[i * n + i] * pow2(e)).collect();
    if vectors {
        let mut vs: Vec<f64> = (0..n * n).map(|ij| v[ij / n * n + order[ij % n]]).collect();
        canonical_column_signs(&mut vs, n, n, None);
        out.extend(vs);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64, uniform in [-1, 1).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
        fn matrix(&mut self, rows: usize, cols: usize) -> Vec<f64> {
            (0..rows * cols).map(|_| self.next()).collect()
        }
        /// Random `(a, m, n)` of empty, tiny, square, tall and wide shapes.
        fn cases(&mut self) -> Vec<(Vec<f64>, usize, usize)> {
            let ms = [0, 0, 3, 1, 2, 17, 9, 4, 1, 5];
            let shapes = ms.into_iter().zip([0, 3, 0, 1, 2, 17, 4, 9, 5, 1]);
            shapes.map(|(m, n)| (self.matrix(m, n), m, n)).collect()
        }
    }

    fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let entry = |i: usize, j: usize| (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        (0..m * n).map(|ij| entry(ij / n, ij % n)).collect()
    }

    /// `v diag(d) w^T`, `v [m, k]`, `w [n, k]`.
    fn vdwt(v: &[f64], d: &[f64], w: &[f64], m: usize, n: usize) -> Vec<f64> {
        let k = d.len();
        let vd: Vec<f64> = (0..m * k).map(|i| v[i] * d[i % k]).collect();
        matmul(&vd, &transpose(w, n, k), m, k, n)
    }

    /// The largest `|x - y|` must be at most `tol max(1, max |y|)`.
    fn assert_close(x: &[f64], y: &[f64], tol: f64, what: &str) {
        assert_eq!(x.len(), y.len(), "{what}: length");
        let scale = y.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let diffs = x.iter().zip(y).map(|(a, b)| (a - b).abs() / scale);
        let d = diffs.fold(0.0, |m: f64, d| if d > m || d.is_nan() { d } else { m });
        assert!(d <= tol, "{what}: off by {d:e} (tolerance {tol:e})");
    }

    /// The columns of `q` (`rows x cols`) are orthonormal.
    fn assert_orthonormal(q: &[f64], rows: usize, cols: usize, what: &str) {
        let qtq = matmul(&transpose(q, rows, cols), q, cols, rows, cols);
        assert_close(&qtq, &identity(cols, cols), 1e-13, what);
    }

    /// Each column's entry of largest magnitude (the first on a tie) is positive.
    fn assert_column_signs(v: &[f64], rows: usize, cols: usize, what: &str) {
        for c in (0..cols).map(|j| column(v, rows, cols, j)) {
            let best = (0..rows).fold(0, |b, i| if c[i].abs() > c[b].abs() { i } else { b });
            assert!(rows == 0 || c[best] >= 0.0, "{what}: a negative column");
        }
    }

    /// `op`'s parts for `a` (`m x n`), checking the packed length.
    fn parts<const P: usize>(op: LinalgOp, a: &[f64], m: usize, n: usize) -> [Vec<f64>; P] {
        let out = eval_one(op, a, m, n, None).unwrap();
        assert_eq!(out.len(), op.packed_len(m, n), "{op} {m}x{n}: length");
        let mut rest = &out[..];
        let parts: Vec<Vec<f64>> = (op.parts(m, n).iter())
            .map(|shape| {
                let (part, tail) = rest.split_at(shape.iter().product());
                rest = tail;
                part.to_vec()
            })
            .collect();
        parts.try_into().unwrap()
    }

    /// `a` (`n x n`) with `x` over its strict upper (else lower) triangle, and over the
    /// diagonal too when `diagonal` (NaN: what the op must not read).
    fn overwrite(a: &[f64], n: usize, upper: bool, diagonal: bool, x: f64) -> Vec<f64> {
        let mut a = a.to_vec();
        for i in 0..n {
            for j in 0..n {
                if (upper && j > i) || (!upper && j < i) || (diagonal && i == j) {
                    a[i * n + j] = x;
                }
            }
        }
        a
    }

    fn tri(lower: bool, left: bool, unit_diagonal: bool) -> LinalgOp {
        LinalgOp::TriangularSolve {
            lower,
            left,
            unit_diagonal,
        }
    }

    /// A random `n x n` matrix `Q1 diag(s) Q2^T` with `s` from 1 down to `1 / cond`
    /// geometrically, and `s`; symmetric positive definite (`Q2 = Q1`) if `spd`.
    fn conditioned(rng: &mut Rng, n: usize, cond: f64, spd: bool) -> (Vec<f64>, Vec<f64>) {
        let q1 = qr(&rng.matrix(n, n), n, n, false)[..n * n].to_vec();
        let q2 = qr(&rng.matrix(n, n), n, n, false)[..n * n].to_vec();
        let last = (n - 1) as f64;
        let s: Vec<f64> = (0..n).map(|i| cond.powf(-(i as f64) / last)).collect();
        (vdwt(&q1, &s, if spd { &q1 } else { &q2 }, n, n), s)
    }

    #[test]
    fn cholesky_reconstructs_from_the_lower_triangle() {
        let mut rng = Rng(1);
        for n in [0, 1, 2, 17] {
            let b = rng.matrix(n, n);
            let mut a = matmul(&b, &transpose(&b, n, n), n, n, n);
            (0..n).for_each(|i| a[i * n + i] += n as f64);
            let hidden = overwrite(&a, n, true, false, f64::NAN);
            let l = eval_one(LinalgOp::Cholesky, &hidden, n, n, None).unwrap();
            let upper = overwrite(&l, n, false, true, 0.0);
            assert!(upper.iter().all(|&x| x == 0.0), "L is lower");
            assert!((0..n).all(|i| l[i * n + i] > 0.0));
            assert_close(&vdwt(&l, &vec![1.0; n], &l, n, n), &a, 1e-14, "L L^T = A");
        }
        assert_eq!(cholesky(&[4.0], 1), Ok(vec![2.0]));
    }

    #[test]
    fn failures_name_the_pivot_or_minor() {
        let minor = |minor| Err(LinalgFailure::NotPositiveDefinite { minor });
        assert_eq!(cholesky(&[4.0, 2.0, 2.0, 1.0], 2), minor(2));
        let diag = [1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0];
        assert_eq!(cholesky(&diag, 3), minor(2));
        assert_eq!(cholesky(&[0.0], 1), minor(1));
        assert_eq!(cholesky(&[f64::NAN], 1), minor(1));
        let singular = |pivot| Err(LinalgFailure::Singular { pivot });
        let rank_one = [1.0, 2.0, 2.0, 4.0];
        assert_eq!(solve(&rank_one, 2, (&[1.0; 2], 2, 1)), singular(1));
        let zero_column = [0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 5.0, 6.0];
        assert_eq!(solve(&zero_column, 3, (&[1.0; 3], 3, 1)), singular(0));
        let upper = [1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 0.0, 0.0, 0.0];
        assert_eq!(solve(&upper, 3, (&[1.0; 3], 3, 1)), singular(2));
        // triangular_solve: the first zero on the diagonal, unless it is not read.
        let t = [2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        let b = Some((&[1.0; 3][..], 3, 1));
        assert_eq!(eval_one(tri(true, true, false), &t, 3, 3, b), singular(1));
        assert_eq!(eval_one(tri(false, false, false), &t, 3, 3, b), singular(1));
        let x = eval_one(tri(true, true, true), &t, 3, 3, b);
        assert_eq!(x, Ok(vec![1.0, 0.0, 0.0]));
        // The iterative solvers on NaN or infinite input; a triangle not read is free.
        let nan = [f64::NAN, 1.0, 2.0, 3.0];
        let inf = [1.0, 2.0, f64::INFINITY, 3.0];
        use LinalgOp::{Eigh, Eigvalsh, Svd, Svdvals};
        for op in [
            Svd { full: true },
            Svdvals,
            Eigh { upper: false },
            Eigvalsh { upper: false },
        ] {
            for x in [&nan, &inf] {
                let got = eval_one(op, x, 2, 2, None);
                assert_eq!(got, Err(LinalgFailure::NoConvergence), "{op}");
            }
        }
        let w = eval_one(Eigvalsh { upper: true }, &inf, 2, 2, None).unwrap();
        let want = [2.0 - 5f64.sqrt(), 2.0 + 5f64.sqrt()];
        assert_close(&w, &want, 1e-15, "eigvalsh of the upper triangle");
    }

    #[test]
    fn solve_has_small_residuals() {
        let mut rng = Rng(2);
        for n in [0, 1, 2, 17] {
            for k in [0, 1, 3] {
                let (a, b) = (rng.matrix(n, n), rng.matrix(n, k));
                let x = eval_one(LinalgOp::Solve, &a, n, n, Some((&b, n, k))).unwrap();
                assert_close(&matmul(&a, &x, n, n, k), &b, 1e-13, "A x = b");
            }
        }
        // Pivoting: the first column's only nonzero is below the diagonal.
        let x = solve(&[0.0, 1.0, 1.0, 0.0], 2, (&[2.0, 3.0], 2, 1));
        assert_eq!(x, Ok(vec![3.0, 2.0]));
    }

    #[test]
    fn triangular_solve_reads_one_triangle() {
        let mut rng = Rng(3);
        for n in [0, 1, 5, 17] {
            for (lower, left, unit) in (0..8).map(|i| (i & 1 == 0, i & 2 == 0, i & 4 == 0)) {
                let mut t = rng.matrix(n, n);
                (0..n).for_each(|i| t[i * n + i] = if unit { 1.0 } else { 2.0 + t[i * n + i] });
                let a = overwrite(&t, n, lower, unit, f64::NAN);
                let t = overwrite(&t, n, lower, false, 0.0);
                let (rows, cols) = if left { (n, 3) } else { (3, n) };
                let b = rng.matrix(rows, cols);
                let op = tri(lower, left, unit);
                let x = eval_one(op, &a, n, n, Some((&b, rows, cols))).unwrap();
                let tx = if left {
                    matmul(&t, &x, n, n, 3)
                } else {
                    matmul(&x, &t, 3, n, n)
                };
                assert_close(&tx, &b, 1e-13, &format!("{op} n={n}"));
            }
        }
    }

    #[test]
    fn lu_is_scipys() {
        let mut cases = Rng(4).cases();
        cases.push((vec![1.0, 2.0, 2.0, 4.0, 3.0, 6.0], 3, 2)); // rank 1
        cases.push((vec![0.0, 1.0, 0.0, 2.0], 2, 2)); // a zero pivot column
        for (a, m, n) in cases {
            let k = m.min(n);
            let [p, l, u] = parts(LinalgOp::Lu, &a, m, n);
            for i in 0..m {
                let row = &p[i * m..(i + 1) * m];
                assert_eq!(row.iter().filter(|&&x| x == 1.0).count(), 1);
                assert_eq!(row.iter().filter(|&&x| x == 0.0).count(), m - 1);
                assert_eq!(column(&p, m, m, i).iter().sum::<f64>(), 1.0);
                for (j, &x) in l[i * k..(i + 1) * k].iter().enumerate() {
                    assert!(if j == i { x == 1.0 } else { j < i || x == 0.0 });
                    assert!(x.abs() <= 1.0, "|L| <= 1 with partial pivoting");
                }
            }
            assert!((0..k).all(|i| (0..i).all(|j| u[i * n + j] == 0.0)), "U");
            let plu = matmul(&p, &matmul(&l, &u, m, k, n), m, m, n);
            assert_close(&plu, &a, 1e-14, &format!("P L U = A ({m}x{n})"));
        }
        // A tie picks the first candidate: no row exchange here.
        let [p, _, _] = parts(LinalgOp::Lu, &[1.0, 2.0, -1.0, 3.0], 2, 2);
        assert_eq!(p, identity(2, 2));
    }

    /// The determinant by cofactor expansion along the first row.
    fn cofactor_det(a: &[f64], n: usize) -> f64 {
        let minor = |j: usize| -> Vec<f64> {
            let cols = move |i| (0..n).filter(move |&c| c != j).map(move |c| a[i * n + c]);
            (1..n).flat_map(cols).collect()
        };
        let term = |j: usize| (-1f64).powi(j as i32) * a[j] * cofactor_det(&minor(j), n - 1);
        if n == 0 {
            1.0
        } else {
            (0..n).map(term).sum()
        }
    }

    #[test]
    fn det_and_slogdet() {
        let mut rng = Rng(5);
        for n in 0..6 {
            let a = rng.matrix(n, n);
            let (d, want) = (eval_one(LinalgOp::Det, &a, n, n, None), cofactor_det(&a, n));
            assert_close(&d.unwrap(), &[want], 1e-14, &format!("det {n}"));
            let [sign, log] = parts(LinalgOp::Slogdet, &a, n, n);
            assert_eq!(sign, [want.signum()]);
            assert_close(&log, &[want.abs().ln()], 1e-13, &format!("slogdet {n}"));
        }
        assert_eq!((det(&[], 0), slogdet(&[], 0)), (1.0, [1.0, 0.0]));
        assert_eq!(det(&[0.0, 1.0, 1.0, 0.0], 2), -1.0);
        let singular = [1.0, 2.0, 2.0, 4.0];
        assert_eq!(det(&singular, 2), 0.0);
        assert_eq!(slogdet(&singular, 2), [0.0, f64::NEG_INFINITY]);
        let a = rng.matrix(17, 17);
        let (d, [sign, log]) = (det(&a, 17), slogdet(&a, 17));
        assert!((sign * log.exp() - d).abs() <= 1e-12 * d.abs());
    }

    #[test]
    fn qr_reconstructs_with_a_nonnegative_diagonal() {
        let mut cases = Rng(6).cases();
        cases.push((vec![0.0, 1.0, 0.0, 2.0, 0.0, 3.0], 3, 2)); // a zero column
        for (a, m, n) in cases {
            for complete in [false, true] {
                let op = LinalgOp::Qr { complete };
                let [q, r] = parts(op, &a, m, n);
                let rows = if complete { m } else { m.min(n) };
                assert_orthonormal(&q, m, rows, &format!("{op} {m}x{n}: Q"));
                for i in 0..rows {
                    assert!((0..i.min(n)).all(|j| r[i * n + j] == 0.0), "R is upper");
                    assert!(i >= n || r[i * n + i] >= 0.0, "R's diagonal");
                }
                let qr = matmul(&q, &r, m, rows, n);
                assert_close(&qr, &a, 1e-14, &format!("{op} {m}x{n}: Q R = A"));
            }
        }
    }

    /// Checks `svd`'s parts of `a` (`m x n`) and returns `S`.
    fn check_svd(a: &[f64], m: usize, n: usize, full: bool) -> Vec<f64> {
        let (k, op) = (m.min(n), LinalgOp::Svd { full });
        let [u, s, vh] = parts(op, a, m, n);
        let (uc, vr) = if full { (m, n) } else { (k, k) };
        let what = format!("{op} {m}x{n}");
        assert_orthonormal(&u, m, uc, &format!("{what}: U"));
        assert_orthonormal(&transpose(&vh, vr, n), n, vr, &format!("{what}: Vh"));
        assert!(s.windows(2).all(|w| w[0] >= w[1]) && s.iter().all(|&x| x >= 0.0));
        assert_column_signs(&u, m, uc, &what);
        assert_column_signs(&transpose(&vh[k * n..], vr - k, n), n, vr - k, &what);
        let u_k: Vec<f64> = (0..m * k).map(|i| u[i / k * uc + i % k]).collect();
        let usv = vdwt(&u_k, &s, &transpose(&vh[..k * n], k, n), m, n);
        assert_close(&usv, a, 1e-14, &format!("{what}: U S Vh = A"));
        assert_eq!(eval_one(LinalgOp::Svdvals, a, m, n, None).unwrap(), s);
        s
    }

    #[test]
    fn svd_reconstructs_with_orthonormal_factors() {
        for (a, m, n) in Rng(7).cases() {
            assert_eq!(check_svd(&a, m, n, false), check_svd(&a, m, n, true));
        }
    }

    #[test]
    fn svd_completes_zero_singular_values() {
        let mut rng = Rng(8);
        let rank_one = matmul(&rng.matrix(5, 1), &rng.matrix(1, 3), 5, 1, 3);
        // Exactly zero singular values among nonzero ones: a zero column and a zero row.
        let exact = [3.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 1.0];
        for full in [false, true] {
            let s = check_svd(&rank_one, 5, 3, full);
            assert!(s[1] <= 1e-15 * s[0]);
            check_svd(&transpose(&rank_one, 5, 3), 3, 5, full);
            assert_eq!(check_svd(&[0.0; 12], 3, 4, full), vec![0.0; 3]);
            assert_eq!(check_svd(&[0.0; 12], 4, 3, full), vec![0.0; 3]);
            assert_eq!(check_svd(&exact, 3, 3, full)[2], 0.0);
        }
    }

    #[test]
    fn eigh_reconstructs_from_one_triangle() {
        let mut rng = Rng(9);
        for n in [0, 1, 2, 17] {
            let b = rng.matrix(n, n);
            let sym: Vec<f64> = (0..n * n).map(|i| b[i] + b[i % n * n + i / n]).collect();
            for upper in [false, true] {
                let a = overwrite(&sym, n, !upper, false, f64::NAN);
                let op = LinalgOp::Eigh { upper };
                let [w, v] = parts(op, &a, n, n);
                assert!(w.windows(2).all(|p| p[0] <= p[1]), "ascending");
                assert_orthonormal(&v, n, n, &format!("{op} {n}: V"));
                assert_column_signs(&v, n, n, &format!("{op} {n}"));
                let what = format!("{op} {n}: V diag(w) V^T = A");
                assert_close(&vdwt(&v, &w, &v, n, n), &sym, 1e-14, &what);
                let values = eval_one(LinalgOp::Eigvalsh { upper }, &a, n, n, None);
                assert_eq!(values.unwrap(), w);
            }
        }
        // Repeated eigenvalues still give orthonormal vectors.
        let (n, w) = (6, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
        let q = qr(&rng.matrix(n, n), n, n, false)[..n * n].to_vec();
        let a = vdwt(&q, &w, &q, n, n);
        let [got, v] = parts(LinalgOp::Eigh { upper: false }, &a, n, n);
        assert_close(&got, &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0], 1e-14, "repeated: w");
        assert_orthonormal(&v, n, n, "repeated: V");
        let [_, v] = parts(LinalgOp::Eigh { upper: true }, &identity(3, 3), 3, 3);
        assert_eq!(v, identity(3, 3));
    }

    #[test]
    fn ill_conditioned_matrices_keep_f64_accuracy() {
        let (mut rng, n) = (Rng(11), 17);
        let (a, s) = conditioned(&mut rng, n, 1e6, false);
        // solve: backward error at eps, forward error at cond * eps.
        let x_true = rng.matrix(n, 2);
        let b = matmul(&a, &x_true, n, n, 2);
        let x = solve(&a, n, (&b, n, 2)).unwrap();
        let ax = matmul(&a, &x, n, n, 2);
        assert_close(&ax, &b, 1e-15, "ill-conditioned A x = b");
        assert_close(&x, &x_true, 1e-8, "ill-conditioned x");
        // svd: singular values to eps ||A||, so the smallest (1e-6) to 1e-9 relative.
        let got = check_svd(&a, n, n, false);
        assert_close(&got, &s, 1e-15, "singular values");
        assert!((got[n - 1] - s[n - 1]).abs() <= 1e-9 * s[n - 1]);
        let [q, r] = parts(LinalgOp::Qr { complete: false }, &a, n, n);
        let qr = matmul(&q, &r, n, n, n);
        assert_close(&qr, &a, 1e-15, "ill-conditioned Q R = A");
        // The SPD version: cholesky, eigh.
        let (spd, lambda) = conditioned(&mut rng, n, 1e6, true);
        let l = cholesky(&spd, n).unwrap();
        let llt = vdwt(&l, &vec![1.0; n], &l, n, n);
        assert_close(&llt, &spd, 1e-15, "ill-conditioned L L^T = A");
        let w = eval_one(LinalgOp::Eigvalsh { upper: false }, &spd, n, n, None).unwrap();
        let ascending: Vec<f64> = lambda.iter().rev().copied().collect();
        assert_close(&w, &ascending, 1e-15, "ill-conditioned eigenvalues");
        assert!((w[0] - ascending[0]).abs() <= 1e-9 * ascending[0]);
    }

    #[test]
    fn scaling_keeps_extreme_magnitudes() {
        // A^T A = [[9, 12], [12, 41]] 1e400: singular values sqrt(45), sqrt(5) times 1e200.
        let s = jacobi_svd(&[3e200, 4e200, 0.0, 5e200], 2, 2).unwrap().sigma;
        let want = [45f64.sqrt() * 1e200, 5f64.sqrt() * 1e200];
        assert_close(&s, &want, 1e-15, "huge singular values");
        let tiny = jacobi_svd(&[3e-200, 0.0, 0.0, 4e-200], 2, 2).unwrap().sigma;
        assert_eq!(tiny, vec![4e-200, 3e-200]);
        let w = eigh(&[1e300, 0.0, 0.0, -1e300], 2, false, false).unwrap();
        assert_eq!(w, vec![-1e300, 1e300]);
    }
}
