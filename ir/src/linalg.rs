//! The LAPACK level: which decomposition or solve an [`Op::Linalg`](crate::Op::Linalg)
//! node computes, how its results are packed along the last axis, why one can fail, and
//! the sign conventions that make every result unique.
//!
//! Operands are batches of row-major matrices: `a [..., m, n]` (square where the op
//! says so), `b [..., n, k]`, with equal leading (batch) axes. Float dtypes only; f16
//! and bf16 are computed in f32 and rounded once.
//!
//! **Packed results.** An op with several results (LAPACK's tuples: `qr`, `svd`, `eigh`,
//! `lu`, `slogdet`) gives one tensor `[..., len]` whose last axis holds the parts one
//! after another, each row-major ([`LinalgOp::parts`]). The frontend hands out each
//! part as a view of it, so `qr(a)[0]` and `qr(a)[1]` share one decomposition.
//!
//! **Signs.** A decomposition is unique only up to signs, and LAPACK, faer and cuSOLVER
//! choose them differently. ndfuse fixes them, so that every backend gives the same
//! result: `qr`'s `R` has a non-negative diagonal; each column of `eigh`'s `V`, and each
//! column of `svd`'s `U` (with the matching row of `Vh`), has its entry of largest
//! magnitude positive (the first such entry on a tie). numpy leaves them as LAPACK
//! returns them, so compare with numpy through reconstructions, not raw factors.

use std::fmt;
use std::ops::Neg;

/// One LAPACK-level operation. Operands `a` (and `b` for the solves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinalgOp {
    /// The lower Cholesky factor `L` of a symmetric positive-definite `a [..., n, n]`
    /// (`a = L L^T`; only the lower triangle of `a` is read). Result `[..., n, n]`.
    Cholesky,
    /// `x` with `a @ x = b`: `a [..., n, n]`, `b [..., n, k]`; result `[..., n, k]`.
    /// LU with partial pivoting.
    Solve,
    /// `x` with `t @ x = b` (`left`) or `x @ t = b`, where `t` is the lower (`lower`) or
    /// upper triangle of `a [..., n, n]`, with ones on its diagonal when
    /// `unit_diagonal`; `b [..., n, k]` (left) or `[..., k, n]`; result of `b`'s shape.
    TriangularSolve {
        /// Read the lower triangle (else the upper).
        lower: bool,
        /// Solve `t @ x = b` (else `x @ t = b`).
        left: bool,
        /// Take the diagonal as ones without reading it.
        unit_diagonal: bool,
    },
    /// The inverse of square `a [..., n, n]`, `[..., n, n]`: LU with partial pivoting,
    /// then the inverses of the triangular factors (LAPACK's `getri`). A singular
    /// matrix fails as in `solve`.
    Inv,
    /// scipy's `lu`: `a = P @ L @ U` with partial pivoting, `a [..., m, n]`, `k =
    /// min(m, n)`: parts `P [m, m]`, `L [m, k]` (unit lower), `U [k, n]`.
    Lu,
    /// The determinant of `a [..., n, n]`; result `[...]`.
    Det,
    /// `(sign, log|det|)` of `a [..., n, n]`: parts `[1]`, `[1]` (sign 0 and log -inf for
    /// a singular matrix, as numpy).
    Slogdet,
    /// `a = Q @ R`, `a [..., m, n]`, `k = min(m, n)`: reduced parts `Q [m, k]`, `R [k,
    /// n]`; `complete`: `Q [m, m]`, `R [m, n]`. `R`'s diagonal is non-negative.
    Qr {
        /// numpy's `mode='complete'` (else `'reduced'`).
        complete: bool,
    },
    /// `a = U @ diag(S) @ Vh`, `a [..., m, n]`, `k = min(m, n)`, `S` descending: reduced
    /// parts `U [m, k]`, `S [k]`, `Vh [k, n]`; `full`: `U [m, m]`, `S [k]`, `Vh [n, n]`.
    Svd {
        /// numpy's `full_matrices=True`.
        full: bool,
    },
    /// The singular values of `a [..., m, n]`, descending; result `[..., min(m, n)]`.
    Svdvals,
    /// The eigenvalues (ascending) and eigenvectors (columns) of a symmetric `a [...,
    /// n, n]`, from its lower triangle (its upper one when `upper`): parts `w [n]`, `V
    /// [n, n]`.
    Eigh {
        /// numpy's `UPLO='U'`.
        upper: bool,
    },
    /// The eigenvalues of a symmetric `a [..., n, n]`, ascending; result `[..., n]`.
    Eigvalsh {
        /// numpy's `UPLO='U'`.
        upper: bool,
    },
}

impl LinalgOp {
    /// The name the text form and errors use (the Array API's).
    pub fn name(self) -> &'static str {
        match self {
            LinalgOp::Cholesky => "cholesky",
            LinalgOp::Solve => "solve",
            LinalgOp::Inv => "inv",
            LinalgOp::TriangularSolve { .. } => "triangular_solve",
            LinalgOp::Lu => "lu",
            LinalgOp::Det => "det",
            LinalgOp::Slogdet => "slogdet",
            LinalgOp::Qr { .. } => "qr",
            LinalgOp::Svd { .. } => "svd",
            LinalgOp::Svdvals => "svdvals",
            LinalgOp::Eigh { .. } => "eigh",
            LinalgOp::Eigvalsh { .. } => "eigvalsh",
        }
    }

    /// How many operands it takes.
    pub fn arity(self) -> usize {
        match self {
            LinalgOp::Solve | LinalgOp::TriangularSolve { .. } => 2,
            _ => 1,
        }
    }

    /// Whether `a` must be square.
    pub fn square(self) -> bool {
        !matches!(
            self,
            LinalgOp::Lu | LinalgOp::Qr { .. } | LinalgOp::Svd { .. } | LinalgOp::Svdvals
        )
    }

    /// Whether the result is packed parts along a last axis of its own (see the module
    /// docs); the others give one tensor of their natural shape.
    pub fn packed(self) -> bool {
        matches!(
            self,
            LinalgOp::Lu
                | LinalgOp::Slogdet
                | LinalgOp::Qr { .. }
                | LinalgOp::Svd { .. }
                | LinalgOp::Eigh { .. }
        )
    }

    /// The shapes of the result's parts for one matrix `a [m, n]`, in packing order
    /// (one part, the whole result, for an op that is not packed; `b`'s extents do not
    /// matter to the packed ops).
    pub fn parts(self, m: usize, n: usize) -> Vec<Vec<usize>> {
        let k = m.min(n);
        match self {
            LinalgOp::Cholesky | LinalgOp::Inv => vec![vec![n, n]],
            LinalgOp::Lu => vec![vec![m, m], vec![m, k], vec![k, n]],
            LinalgOp::Det => vec![vec![]],
            LinalgOp::Slogdet => vec![vec![1], vec![1]],
            LinalgOp::Qr { complete: false } => vec![vec![m, k], vec![k, n]],
            LinalgOp::Qr { complete: true } => vec![vec![m, m], vec![m, n]],
            LinalgOp::Svd { full: false } => vec![vec![m, k], vec![k], vec![k, n]],
            LinalgOp::Svd { full: true } => vec![vec![m, m], vec![k], vec![n, n]],
            LinalgOp::Svdvals => vec![vec![k]],
            LinalgOp::Eigh { .. } => vec![vec![n], vec![n, n]],
            LinalgOp::Eigvalsh { .. } => vec![vec![n]],
            // The result has b's shape; parts are never asked of the solves.
            LinalgOp::Solve | LinalgOp::TriangularSolve { .. } => vec![],
        }
    }

    /// The packed length of one matrix's result (the sum of its parts' sizes).
    pub fn packed_len(self, m: usize, n: usize) -> usize {
        self.parts(m, n)
            .iter()
            .map(|p| p.iter().product::<usize>())
            .sum()
    }
}

impl fmt::Display for LinalgOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match *self {
            LinalgOp::TriangularSolve {
                lower,
                left,
                unit_diagonal,
            } => write!(
                f,
                "[{}, {}{}]",
                if lower { "lower" } else { "upper" },
                if left { "left" } else { "right" },
                if unit_diagonal { ", unit" } else { "" }
            ),
            LinalgOp::Qr { complete: true } => f.write_str("[complete]"),
            LinalgOp::Svd { full: true } => f.write_str("[full]"),
            LinalgOp::Eigh { upper: true } | LinalgOp::Eigvalsh { upper: true } => {
                f.write_str("[upper]")
            }
            _ => Ok(()),
        }
    }
}

/// Why one matrix of a batch has no result: numpy's `LinAlgError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinalgFailure {
    /// `U[pivot, pivot]` of the LU factorisation is exactly zero (0-based).
    Singular {
        /// The zero pivot.
        pivot: usize,
    },
    /// The leading minor of order `minor` (1-based, as LAPACK counts) is not positive
    /// definite.
    NotPositiveDefinite {
        /// The order of the first minor that failed.
        minor: usize,
    },
    /// The iteration did not converge (an eigen- or singular-value solver on NaN or
    /// infinite input).
    NoConvergence,
    /// The workspace of the factorisation could not be allocated.
    OutOfMemory,
}

impl fmt::Display for LinalgFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinalgFailure::Singular { pivot } => {
                write!(f, "singular matrix (pivot {pivot} of U is zero)")
            }
            LinalgFailure::NotPositiveDefinite { minor } => write!(
                f,
                "matrix is not positive definite (leading minor of order {minor})"
            ),
            LinalgFailure::NoConvergence => f.write_str("did not converge (is the input finite?)"),
            LinalgFailure::OutOfMemory => f.write_str("out of memory for the workspace"),
        }
    }
}

/// The magnitude order and sign test the sign conventions need, for f32 and f64.
pub trait SignedReal: Copy + PartialOrd + Neg<Output = Self> + Default {}
impl SignedReal for f32 {}
impl SignedReal for f64 {}

fn abs<T: SignedReal>(x: T) -> T {
    if x < T::default() {
        -x
    } else {
        x
    }
}

/// Whether column `j` of the row-major `rows x cols` matrix `a` should be negated to
/// have its entry of largest magnitude (the first on a tie) positive.
fn column_is_negative<T: SignedReal>(a: &[T], rows: usize, cols: usize, j: usize) -> bool {
    let mut best = T::default();
    let mut neg = false;
    for i in 0..rows {
        let x = a[i * cols + j];
        if abs(x) > best {
            best = abs(x);
            neg = x < T::default();
        }
    }
    neg
}

/// Gives each column of `v` (`rows x cols`, row-major) its entry of largest magnitude
/// positive; for each column negated, row `j` of `paired` (`paired_rows x
/// paired_cols`) is negated too (`svd`'s `Vh`), where it has such a row.
pub fn canonical_column_signs<T: SignedReal>(
    v: &mut [T],
    rows: usize,
    cols: usize,
    mut paired: Option<(&mut [T], usize, usize)>,
) {
    for j in 0..cols {
        if !column_is_negative(v, rows, cols, j) {
            continue;
        }
        for i in 0..rows {
            v[i * cols + j] = -v[i * cols + j];
        }
        if let Some((p, prow, pcols)) = paired.as_mut() {
            if j < *prow {
                for x in &mut p[j * *pcols..(j + 1) * *pcols] {
                    *x = -*x;
                }
            }
        }
    }
}

/// Gives each row of `vh` (`rows x cols`) from `from_row` on its entry of largest
/// magnitude positive: the rows of a full `Vh` that no column of `U` pairs with.
pub fn canonical_row_signs<T: SignedReal>(vh: &mut [T], cols: usize, from_row: usize) {
    for row in vh.chunks_mut(cols.max(1)).skip(from_row) {
        let mut best = T::default();
        let mut neg = false;
        for &x in row.iter() {
            if abs(x) > best {
                best = abs(x);
                neg = x < T::default();
            }
        }
        if neg {
            for x in row.iter_mut() {
                *x = -*x;
            }
        }
    }
}

/// Makes `R`'s diagonal non-negative: for each `i < min(q_cols, r_rows)` with `R[i, i]
/// < 0`, negates row `i` of `r` (`r_rows x r_cols`) and column `i` of `q` (`q_rows x
/// q_cols`).
pub fn canonical_qr_signs<T: SignedReal>(
    q: &mut [T],
    q_rows: usize,
    q_cols: usize,
    r: &mut [T],
    r_rows: usize,
    r_cols: usize,
) {
    for i in 0..q_cols.min(r_rows).min(r_cols) {
        if r[i * r_cols + i] < T::default() {
            for x in &mut r[i * r_cols..(i + 1) * r_cols] {
                *x = -*x;
            }
            for row in 0..q_rows {
                q[row * q_cols + i] = -q[row * q_cols + i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_pack_in_order() {
        assert_eq!(
            LinalgOp::Qr { complete: false }.packed_len(5, 3),
            5 * 3 + 3 * 3
        );
        assert_eq!(LinalgOp::Svd { full: true }.packed_len(2, 4), 4 + 2 + 16);
        assert_eq!(LinalgOp::Eigh { upper: false }.packed_len(3, 3), 3 + 9);
        assert_eq!(LinalgOp::Lu.packed_len(3, 2), 9 + 6 + 4);
        assert_eq!(LinalgOp::Det.packed_len(4, 4), 1);
    }

    #[test]
    fn signs_are_canonical() {
        // Columns: [-3, 1] -> negate; [2, -2] -> tie, the first (+2) wins: keep.
        let mut u = vec![-3.0, 2.0, 1.0, -2.0];
        let mut vh = vec![1.0, 2.0, 3.0, 4.0];
        canonical_column_signs(&mut u, 2, 2, Some((&mut vh, 2, 2)));
        assert_eq!(u, vec![3.0, 2.0, -1.0, -2.0]);
        assert_eq!(vh, vec![-1.0, -2.0, 3.0, 4.0]);
        let mut q = vec![1.0f32, 0.0, 0.0, 1.0];
        let mut r = vec![-2.0f32, 1.0, 0.0, 3.0];
        canonical_qr_signs(&mut q, 2, 2, &mut r, 2, 2);
        assert_eq!(
            (q, r),
            (vec![-1.0, 0.0, 0.0, 1.0], vec![2.0, -1.0, 0.0, 3.0])
        );
    }
}
