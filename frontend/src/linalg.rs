//! The LAPACK level, with the Array API standard's `linalg` names and numpy's semantics:
//! solves, decompositions and the norms built on them, batched over leading axes,
//! differentiable.
//!
//! A decomposition is one node ([`ndfuse_ir::Op::Linalg`]) that runs as a library call
//! (faer on the CPU); its results (`qr`'s `q` and `r`, `svd`'s `u`, `s`, `vh`...) are
//! views of that one node, so using every part costs one decomposition. The element-wise
//! work around it fuses into the kernels before and after it. `inv`, `pinv`, `lstsq`,
//! `matrix_norm` and `cond` are composites of the primitives, differentiated through
//! their definitions.
//!
//! **Signs.** Factors are unique only up to signs: ndfuse fixes them (`qr`'s `r` has a
//! non-negative diagonal; each eigenvector, and each left singular vector with its right
//! one, has its entry of largest magnitude positive) so that every backend gives the
//! same result. numpy returns LAPACK's signs: compare through reconstructions.
//!
//! **Dtypes.** f32 and f64 natively; f16 and bf16 are computed in f32 and rounded once.
//! Integer matrices are an error (cast them first).
//!
//! **Accuracy** (f32: eps = 6e-8; f64: 1.1e-16), as LAPACK's backward-stable algorithms
//! promise: `solve`, `inv`, `det` (LU with partial pivoting), `cholesky`, `qr`
//! (Householder), `svd` and `eigh` have a backward error of a small multiple of `n eps
//! ||a||`; a solution's forward error grows with the condition number, `~ cond(a) n eps`
//! relative. Eigen- and singular values are accurate to `~ n eps ||a||` absolute; vectors
//! to that over the gap to the nearest other value.
//!
//! **Errors.** A singular matrix in `solve`/`inv`/`triangular_solve` and a matrix that is
//! not positive definite in `cholesky` fail the evaluation with numpy's `LinAlgError`
//! text, naming the op, the batch position and the pivot or minor; shapes that do not
//! fit name both shapes and the call site.
//!
//! **Gradients** (the formulas JAX uses): cholesky, solve, triangular_solve, inv, det and
//! slogdet, qr (reduced, `m >= n`), eigh and eigvalsh (distinct eigenvalues), svd
//! (reduced, distinct non-zero singular values) and svdvals; lstsq, pinv, the norms and
//! cond through their definitions. `lu` has none (differentiate `solve` or `det`).

use crate::error::Error;
use crate::ops::SliceArg;
use crate::tensor::Tensor;
use ndfuse_ir::{LinalgOp, Op};
use std::panic::Location;

type At = &'static Location<'static>;

/// `a`'s dims, or the poisoned tensor of its error.
fn dims(a: &Tensor) -> Result<Vec<usize>, Tensor> {
    a.shape()
        .map(|s| s.to_vec())
        .map_err(|e| Tensor::poisoned(&a.ctx, e))
}

/// `a`'s matrix extents `(m, n)`, or the poisoned tensor naming `what` when it has no
/// two matrix axes.
fn matrix_extents(a: &Tensor, what: &'static str, at: At) -> Result<(usize, usize), Tensor> {
    match dims(a)? {
        d if d.len() >= 2 => Ok((d[d.len() - 2], d[d.len() - 1])),
        d => Err(argument(
            a,
            what,
            format!("a {d:?} needs two matrix axes"),
            at,
        )),
    }
}

/// An argument error at `at`.
fn argument(a: &Tensor, what: &'static str, why: String, at: At) -> Tensor {
    Tensor::poisoned(&a.ctx, Error::Argument { what, why, at })
}

/// `x` with its last two axes swapped (numpy's `matrix_transpose`, `.mT`).
#[track_caller]
pub fn matrix_transpose(x: &Tensor) -> Tensor {
    let at = Location::caller();
    match x.rank() {
        Ok(r) if r >= 2 => {
            let mut perm: Vec<i64> = (0..r as i64).collect();
            perm.swap(r - 2, r - 1);
            x.permute(&perm)
        }
        Ok(r) => argument(
            x,
            "matrix_transpose",
            format!("a tensor of rank {r} has no two matrix axes"),
            at,
        ),
        Err(e) => Tensor::poisoned(&x.ctx, e),
    }
}

/// One part of a packed result: positions `start..start + part.product()` of the last
/// axis of `packed [..., len]`, reshaped to `batch + part`.
fn part(packed: &Tensor, batch: &[usize], start: usize, part: &[usize]) -> Tensor {
    let len: usize = part.iter().product();
    let mut args = vec![SliceArg::all(); batch.len()];
    args.push((start as i64..(start + len) as i64).into());
    let shape: Vec<i64> = batch.iter().chain(part).map(|&d| d as i64).collect();
    packed.slice(&args).reshape(&shape)
}

/// The node of packed `op` on `a`, split into its parts.
fn decompose(op: LinalgOp, a: &Tensor, at: At) -> Vec<Tensor> {
    let d = match dims(a) {
        Ok(d) => d,
        Err(p) => return vec![p; op.parts(2, 2).len()],
    };
    let node = Tensor::build(Op::Linalg(op), &[a], at);
    if d.len() < 2 {
        // Not a matrix: the node carries infer's error to every part.
        return vec![node; op.parts(2, 2).len()];
    }
    let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
    let batch = &d[..d.len() - 2];
    let mut start = 0;
    op.parts(m, n)
        .iter()
        .map(|p| {
            let t = part(&node, batch, start, p);
            start += p.iter().product::<usize>();
            t
        })
        .collect()
}

/// `a` and `b` broadcast to their common batch axes (numpy's rule for the stacked
/// operands of `solve`), `b` given as `[..., n, k]`.
fn broadcast_batch(
    a: &Tensor,
    b: &Tensor,
    what: &'static str,
    at: At,
) -> Result<(Tensor, Tensor), Tensor> {
    let (da, db) = (dims(a)?, dims(b)?);
    if da.len() < 2 || db.len() < 2 {
        return Err(argument(
            a,
            what,
            format!("a {da:?} and b {db:?} need two matrix axes"),
            at,
        ));
    }
    let (ba, bb) = (
        ndfuse_ir::Shape::new(&da[..da.len() - 2]),
        ndfuse_ir::Shape::new(&db[..db.len() - 2]),
    );
    let Some(batch) = ndfuse_ir::Shape::broadcast(&ba, &bb) else {
        return Err(argument(
            a,
            what,
            format!("the batch axes of a {da:?} and b {db:?} do not broadcast"),
            at,
        ));
    };
    let to = |x: &Tensor, d: &[usize]| {
        let mut s = batch.dims().to_vec();
        s.extend_from_slice(&d[d.len() - 2..]);
        if s == d {
            x.clone()
        } else {
            x.broadcast_to(&s)
        }
    };
    Ok((to(a, &da), to(b, &db)))
}

/// `x` with `a @ x = b` for square `a [..., n, n]`; `b` is `[..., n, k]`, or `[n]` (a
/// vector: numpy 2 reads `b` as a vector only when it is 1-D). Batch axes broadcast.
/// LU with partial pivoting; a singular matrix is an error naming its batch position
/// and the zero pivot.
#[track_caller]
pub fn solve(a: &Tensor, b: &Tensor) -> Tensor {
    solve_at(a, b, Location::caller())
}

fn solve_at(a: &Tensor, b: &Tensor, at: At) -> Tensor {
    let vector = matches!(b.rank(), Ok(1));
    let b2 = if vector { b.expand_dims(-1) } else { b.clone() };
    let (a, b2) = match broadcast_batch(a, &b2, "solve", at) {
        Ok(x) => x,
        Err(p) => return p,
    };
    let x = Tensor::build(Op::Linalg(LinalgOp::Solve), &[&a, &b2], at);
    if vector {
        x.squeeze(&[-1])
    } else {
        x
    }
}

/// Which side the triangular matrix multiplies in [`triangular_solve`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Side {
    /// `t @ x = b`.
    #[default]
    Left,
    /// `x @ t = b`.
    Right,
}

/// `x` with `t @ x = b` (`Side::Left`; `x @ t = b` on the right), `t` the lower triangle
/// of `a [..., n, n]` (the upper one when `upper`), its diagonal read as ones when
/// `unit_diagonal` (scipy's `solve_triangular`, torch's `solve_triangular`). `b` is
/// `[..., n, k]` (left) or `[..., k, n]` (right), with `a`'s batch axes broadcast.
#[track_caller]
pub fn triangular_solve(
    a: &Tensor,
    b: &Tensor,
    upper: bool,
    side: Side,
    unit_diagonal: bool,
) -> Tensor {
    let at = Location::caller();
    let (a, b) = match broadcast_batch(a, b, "triangular_solve", at) {
        Ok(x) => x,
        Err(p) => return p,
    };
    let op = LinalgOp::TriangularSolve {
        lower: !upper,
        left: side == Side::Left,
        unit_diagonal,
    };
    Tensor::build(Op::Linalg(op), &[&a, &b], at)
}

/// The Cholesky factor of a symmetric positive-definite `a [..., n, n]`: lower `l`
/// with `a = l @ l^T` (reading `a`'s lower triangle), or, when `upper`, `u = l^T` with
/// `a = u^T @ u`. A matrix that is not positive definite is an error naming the minor.
#[track_caller]
pub fn cholesky(a: &Tensor, upper: bool) -> Tensor {
    let l = Tensor::build(Op::Linalg(LinalgOp::Cholesky), &[a], Location::caller());
    if upper {
        matrix_transpose(&l)
    } else {
        l
    }
}

/// The inverse of square `a [..., n, n]` (LAPACK's `getri`: LU with partial pivoting,
/// then the triangular factors inverted); a singular matrix is an error naming its
/// batch position and the zero pivot, as in [`solve`].
#[track_caller]
pub fn inv(a: &Tensor) -> Tensor {
    Tensor::build(Op::Linalg(LinalgOp::Inv), &[a], Location::caller())
}

/// The determinant of `a [..., n, n]`, `[...]` (from LU; it may overflow where
/// [`slogdet`] does not).
#[track_caller]
pub fn det(a: &Tensor) -> Tensor {
    Tensor::build(Op::Linalg(LinalgOp::Det), &[a], Location::caller())
}

/// [`slogdet`]'s result.
#[derive(Clone, Debug)]
pub struct Slogdet {
    /// `1`, `-1`, or `0` for a singular matrix.
    pub sign: Tensor,
    /// `log|det a|` (`-inf` for a singular matrix).
    pub logabsdet: Tensor,
}

/// The sign and the log of the absolute value of `det(a)`, `[...]` each.
#[track_caller]
pub fn slogdet(a: &Tensor) -> Slogdet {
    let mut p = decompose(LinalgOp::Slogdet, a, Location::caller());
    let squeeze = |t: Tensor| t.squeeze(&[-1]);
    let logabsdet = squeeze(p.pop().expect("two parts"));
    Slogdet {
        sign: squeeze(p.pop().expect("two parts")),
        logabsdet,
    }
}

/// [`lu`]'s result: `a = p @ l @ u`.
#[derive(Clone, Debug)]
pub struct Lu {
    /// The row permutation `[..., m, m]`.
    pub p: Tensor,
    /// Unit lower trapezoidal `[..., m, k]`.
    pub l: Tensor,
    /// Upper trapezoidal `[..., k, n]`.
    pub u: Tensor,
}

/// scipy's `lu` with partial pivoting, `a [..., m, n]`, `k = min(m, n)`. Not
/// differentiable (differentiate [`solve`] or [`det`] instead).
#[track_caller]
pub fn lu(a: &Tensor) -> Lu {
    let mut p = decompose(LinalgOp::Lu, a, Location::caller()).into_iter();
    let (p, l, u) = (p.next(), p.next(), p.next());
    Lu {
        p: p.expect("three parts"),
        l: l.expect("three parts"),
        u: u.expect("three parts"),
    }
}

/// [`qr`]'s result: `a = q @ r`.
#[derive(Clone, Debug)]
pub struct Qr {
    /// Orthonormal columns, `[..., m, k]` (complete: `[..., m, m]`).
    pub q: Tensor,
    /// Upper trapezoidal with a non-negative diagonal, `[..., k, n]` (complete: `[...,
    /// m, n]`).
    pub r: Tensor,
}

/// numpy's `qr` modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QrMode {
    /// `q [..., m, k]`, `r [..., k, n]`, `k = min(m, n)`.
    #[default]
    Reduced,
    /// `q [..., m, m]`, `r [..., m, n]`.
    Complete,
}

/// Householder QR of `a [..., m, n]`.
#[track_caller]
pub fn qr(a: &Tensor, mode: QrMode) -> Qr {
    let op = LinalgOp::Qr {
        complete: mode == QrMode::Complete,
    };
    let mut p = decompose(op, a, Location::caller()).into_iter();
    let (q, r) = (p.next(), p.next());
    Qr {
        q: q.expect("two parts"),
        r: r.expect("two parts"),
    }
}

/// [`svd`]'s result: `a = u @ diag(s) @ vh`.
#[derive(Clone, Debug)]
pub struct Svd {
    /// Left singular vectors, `[..., m, k]` (full: `[..., m, m]`).
    pub u: Tensor,
    /// Singular values, descending, `[..., k]`.
    pub s: Tensor,
    /// Right singular vectors as rows, `[..., k, n]` (full: `[..., n, n]`).
    pub vh: Tensor,
}

/// The singular value decomposition of `a [..., m, n]`, `k = min(m, n)`; `full_matrices`
/// as numpy (its default is `true`; the reduced form is what most uses need and the
/// one with a gradient).
#[track_caller]
pub fn svd(a: &Tensor, full_matrices: bool) -> Svd {
    let op = LinalgOp::Svd {
        full: full_matrices,
    };
    let mut p = decompose(op, a, Location::caller()).into_iter();
    let (u, s, vh) = (p.next(), p.next(), p.next());
    Svd {
        u: u.expect("three parts"),
        s: s.expect("three parts"),
        vh: vh.expect("three parts"),
    }
}

/// The singular values of `a [..., m, n]`, descending, `[..., min(m, n)]`.
#[track_caller]
pub fn svdvals(a: &Tensor) -> Tensor {
    Tensor::build(Op::Linalg(LinalgOp::Svdvals), &[a], Location::caller())
}

/// [`eigh`]'s result: `a = eigenvectors @ diag(eigenvalues) @ eigenvectors^T`.
#[derive(Clone, Debug)]
pub struct Eigh {
    /// Ascending, `[..., n]`.
    pub eigenvalues: Tensor,
    /// Orthonormal columns, `[..., n, n]`.
    pub eigenvectors: Tensor,
}

/// The eigen-decomposition of a symmetric `a [..., n, n]` from its lower triangle (its
/// upper one when `upper`: numpy's `UPLO='U'`).
#[track_caller]
pub fn eigh(a: &Tensor, upper: bool) -> Eigh {
    let mut p = decompose(LinalgOp::Eigh { upper }, a, Location::caller()).into_iter();
    let (w, v) = (p.next(), p.next());
    Eigh {
        eigenvalues: w.expect("two parts"),
        eigenvectors: v.expect("two parts"),
    }
}

/// The eigenvalues of a symmetric `a [..., n, n]`, ascending.
#[track_caller]
pub fn eigvalsh(a: &Tensor, upper: bool) -> Tensor {
    Tensor::build(
        Op::Linalg(LinalgOp::Eigvalsh { upper }),
        &[a],
        Location::caller(),
    )
}

/// The default relative cutoff of [`pinv`] and [`lstsq`]: the Array API's `max(m, n)`
/// times the dtype's epsilon.
fn default_rtol(a: &Tensor, m: usize, n: usize) -> f64 {
    let eps = match a.dtype() {
        Ok(ndfuse_ir::DType::F64) => f64::EPSILON,
        Ok(ndfuse_ir::DType::F16) => 9.765_625e-4,
        Ok(ndfuse_ir::DType::BF16) => 7.812_5e-3,
        _ => f32::EPSILON as f64,
    };
    m.max(n) as f64 * eps
}

/// `1 / s` where `s > rtol * max(s)`, else 0, over the last axis of `s [..., k]`.
fn inverted_values(s: &Tensor, rtol: f64) -> (Tensor, Tensor) {
    let cutoff = &s.max_keepdims(-1) * rtol;
    let kept = s.gt(&cutoff);
    let safe = kept.where_(s, 1.0);
    (kept.where_(safe.recip(), 0.0), kept)
}

/// The Moore-Penrose pseudo-inverse `[..., n, m]` of `a [..., m, n]` through its SVD,
/// singular values at most `rtol * max(s)` taken as zero (`rtol`: `max(m, n) eps` when
/// `None`, the Array API's default).
#[track_caller]
pub fn pinv(a: &Tensor, rtol: Option<f64>) -> Tensor {
    let at = Location::caller();
    let (m, n) = match matrix_extents(a, "pinv", at) {
        Ok(e) => e,
        Err(p) => return p,
    };
    let Svd { u, s, vh } = svd(a, false);
    let (s_inv, _) = inverted_values(&s, rtol.unwrap_or_else(|| default_rtol(a, m, n)));
    // v diag(1/s) u^T: scale the columns of v, then multiply.
    matrix_transpose(&vh)
        .mul(s_inv.expand_dims(-2))
        .matmul(&matrix_transpose(&u))
}

/// [`lstsq`]'s result.
#[derive(Clone, Debug)]
pub struct Lstsq {
    /// The least-squares solution `[..., n, k]` (`[..., n]` for a vector `b`).
    pub solution: Tensor,
    /// The squared residual norms `||b - a x||^2` per column, `[..., k]` (`[...]` for a
    /// vector `b`). Always computed (numpy returns an empty array when `rank < n` or
    /// `m <= n`; the sums here are then the true residuals, near zero for `m <= n`).
    pub residuals: Tensor,
    /// The effective rank (i64), singular values above `rcond * max(s)`.
    pub rank: Tensor,
    /// `a`'s singular values, descending.
    pub singular_values: Tensor,
}

/// numpy's `lstsq`: the `x` minimising `||a x - b||` with the smallest norm, through
/// `a`'s SVD, singular values at most `rcond * max(s)` taken as zero (`rcond`: `max(m,
/// n) eps` when `None`, numpy's default).
#[track_caller]
pub fn lstsq(a: &Tensor, b: &Tensor, rcond: Option<f64>) -> Lstsq {
    let at = Location::caller();
    let (m, n) = match matrix_extents(a, "lstsq", at) {
        Ok(e) => e,
        Err(p) => {
            return Lstsq {
                solution: p.clone(),
                residuals: p.clone(),
                rank: p.clone(),
                singular_values: p,
            }
        }
    };
    let vector = matches!(b.rank(), Ok(1));
    let b2 = if vector { b.expand_dims(-1) } else { b.clone() };
    let Svd { u, s, vh } = svd(a, false);
    let (s_inv, kept) = inverted_values(&s, rcond.unwrap_or_else(|| default_rtol(a, m, n)));
    // x = v diag(1/s) u^T b
    let utb = matrix_transpose(&u).matmul(&b2);
    let x = matrix_transpose(&vh).matmul(&utb.mul(s_inv.expand_dims(-1)));
    let r = a.matmul(&x).sub(&b2);
    let residuals = r.square().sum(-2);
    let rank = kept.cast(ndfuse_ir::DType::I64).sum(-1);
    let (solution, residuals) = if vector {
        (x.squeeze(&[-1]), residuals.squeeze(&[-1]))
    } else {
        (x, residuals)
    };
    Lstsq {
        solution,
        residuals,
        rank,
        singular_values: s,
    }
}

/// The `ord` of [`matrix_norm`] and [`cond`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Norm {
    /// Frobenius: `sqrt(sum(a^2))`.
    #[default]
    Fro,
    /// Nuclear: the sum of the singular values.
    Nuc,
    /// The largest singular value (numpy's `ord=2`).
    Two,
    /// The smallest singular value (`ord=-2`).
    NegTwo,
    /// The largest column sum of `|a|` (`ord=1`).
    One,
    /// The smallest column sum of `|a|` (`ord=-1`).
    NegOne,
    /// The largest row sum of `|a|` (`ord=inf`).
    Inf,
    /// The smallest row sum of `|a|` (`ord=-inf`).
    NegInf,
}

/// The matrix norm `ord` of `a [..., m, n]`, `[...]` (numpy's `matrix_norm`).
#[track_caller]
pub fn matrix_norm(a: &Tensor, ord: Norm) -> Tensor {
    if let Err(p) = matrix_extents(a, "matrix_norm", Location::caller()) {
        return p;
    }
    let abs = || a.abs();
    match ord {
        Norm::Fro => a.square().sum([-2i64, -1]).sqrt(),
        Norm::Nuc => svdvals(a).sum(-1),
        Norm::Two => svdvals(a).max(-1),
        Norm::NegTwo => svdvals(a).min(-1),
        Norm::One => abs().sum(-2).max(-1),
        Norm::NegOne => abs().sum(-2).min(-1),
        Norm::Inf => abs().sum(-1).max(-1),
        Norm::NegInf => abs().sum(-1).min(-1),
    }
}

/// The condition number of `a [..., m, n]` in norm `p` (`None`: the 2-norm, `s_max /
/// s_min`, for any shape; other norms need a square `a`: `norm(a) norm(inv(a))`).
#[track_caller]
pub fn cond(a: &Tensor, p: Option<Norm>) -> Tensor {
    match p.unwrap_or(Norm::Two) {
        Norm::Two => {
            let s = svdvals(a);
            s.max(-1).div(s.min(-1))
        }
        Norm::NegTwo => {
            let s = svdvals(a);
            s.min(-1).div(s.max(-1))
        }
        p => matrix_norm(a, p).mul(matrix_norm(&inv(a), p)),
    }
}
