//! The LAPACK level on the CPU: each matrix of an [`Op::Linalg`] node's batch is one
//! call into `faer` (pure Rust; its products run on the same `gemm` 0.19 micro-kernels
//! as ndfuse's own), the matrices of a batch in parallel on the current rayon pool.
//!
//! f32 and f64 compute in their own dtype; f16 and bf16 widen to f32, compute, and round
//! once into the result. The results follow the sign conventions of
//! [`ndfuse_ir::linalg`], so they match the interpreter's and every other backend's. A
//! matrix with no result (singular, not positive definite) is an error naming the op,
//! its batch position and the failing pivot or minor, like numpy's `LinAlgError`: the
//! first such matrix in batch order, whatever the threads did.
//!
//! Where the checks differ from LAPACK's: `solve` and `triangular_solve` fail on an
//! exactly zero pivot (LAPACK's `getrf`/`trtrs` info), never on a small one; a NaN
//! input gives NaN results, as in numpy.

use crate::error::RuntimeError;
use faer::linalg::solvers::Solve;
use faer::{MatRef, Par, Side};
use half::{bf16, f16};
use ndfuse_ir::interp::InterpError;
use ndfuse_ir::linalg::{canonical_column_signs, canonical_qr_signs, canonical_row_signs};
use ndfuse_ir::{DType, HostArray, LinalgFailure, LinalgOp, Node, Shape, Storage};
use rayon::prelude::*;

/// The float types the library computes in.
trait Real: faer::traits::RealField + ndfuse_ir::linalg::SignedReal + Copy + Send + Sync {
    fn of(x: f64) -> Self;
    fn ln_abs(self) -> Self;
}

impl Real for f32 {
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn ln_abs(self) -> f32 {
        self.abs().ln()
    }
}

impl Real for f64 {
    fn of(x: f64) -> f64 {
        x
    }
    fn ln_abs(self) -> f64 {
        self.abs().ln()
    }
}

/// `node` (an [`Op::Linalg`]) on `operands`, whose types fit it.
pub(crate) fn run(
    op: LinalgOp,
    node: &Node,
    operands: &[&HostArray],
) -> Result<HostArray, RuntimeError> {
    let a = operands[0];
    let d = a.shape().dims();
    let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
    let batch = Shape::new(&d[..d.len() - 2]);
    let count = batch.numel();
    let b = operands.get(1).map(|b| {
        let bd = b.shape().dims();
        (bd[bd.len() - 2], bd[bd.len() - 1])
    });
    let fail = |(index, failure): (usize, LinalgFailure)| {
        RuntimeError::Interp(InterpError::Linalg {
            op: op.name(),
            batch: batch.unravel(index),
            failure,
        })
    };
    let shape = node.shape.clone();
    let storage = match (a.storage(), operands.get(1).map(|b| b.storage())) {
        (Storage::F64(av), bv) => {
            let bv = bv.map(|s| match s {
                Storage::F64(v) => v.as_slice(),
                _ => unreachable!("infer gives both operands one dtype"),
            });
            Storage::F64(batched(op, (av, m, n), bv.zip(b), count, shape.numel()).map_err(fail)?)
        }
        (Storage::F32(av), bv) => {
            let bv = bv.map(|s| match s {
                Storage::F32(v) => v.as_slice(),
                _ => unreachable!("infer gives both operands one dtype"),
            });
            Storage::F32(batched(op, (av, m, n), bv.zip(b), count, shape.numel()).map_err(fail)?)
        }
        (s, bv) => {
            // Half types: widened to f32, rounded once at the end.
            let widen = |s: &Storage| -> Vec<f32> {
                match s {
                    Storage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                    Storage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
                    _ => unreachable!("infer admits float operands only"),
                }
            };
            let (av, bw) = (widen(s), bv.map(widen));
            let out = batched(op, (&av, m, n), bw.as_deref().zip(b), count, shape.numel())
                .map_err(fail)?;
            match node.dtype {
                DType::F16 => Storage::F16(out.into_iter().map(f16::from_f32).collect()),
                _ => Storage::BF16(out.into_iter().map(bf16::from_f32).collect()),
            }
        }
    };
    Ok(HostArray::new(shape, storage).expect("every op fills its result's elements"))
}

/// Every one of the `count` matrices of the batch, in parallel; the first failure in
/// batch order.
fn batched<T: Real>(
    op: LinalgOp,
    (a, m, n): (&[T], usize, usize),
    b: Option<(&[T], (usize, usize))>,
    count: usize,
    total: usize,
) -> Result<Vec<T>, (usize, LinalgFailure)> {
    let mut out = vec![T::of(0.0); total];
    let Some(per_out) = total.checked_div(count).filter(|&p| p > 0) else {
        return Ok(out);
    };
    // One matrix per task: a decomposition is far more work than a task's overhead.
    let failures: Vec<(usize, LinalgFailure)> = out
        .par_chunks_mut(per_out)
        .enumerate()
        .filter_map(|(i, o)| {
            let ai = &a[i * m * n..(i + 1) * m * n];
            let bi = b.map(|(bv, (r, c))| (&bv[i * r * c..(i + 1) * r * c], r, c));
            one(op, ai, m, n, bi, o).err().map(|f| (i, f))
        })
        .collect();
    match failures.into_iter().min_by_key(|f| f.0) {
        Some(f) => Err(f),
        None => Ok(out),
    }
}

/// Writes `mat` (row-major) into `out`.
fn put<T: Real>(out: &mut [T], mat: MatRef<'_, T>) {
    let c = mat.ncols();
    for i in 0..mat.nrows() {
        for j in 0..c {
            out[i * c + j] = mat[(i, j)];
        }
    }
}

/// The first exactly zero entry of `mat`'s diagonal.
fn zero_pivot<T: Real>(mat: MatRef<'_, T>) -> Option<usize> {
    (0..mat.nrows().min(mat.ncols())).find(|&i| mat[(i, i)] == T::of(0.0))
}

/// The parity of the permutation `fwd` (+1 even, -1 odd).
fn parity(fwd: &[usize]) -> f64 {
    let mut seen = vec![false; fwd.len()];
    let mut sign = 1.0;
    for s in 0..fwd.len() {
        let (mut j, mut len) = (s, 0);
        while !seen[j] {
            seen[j] = true;
            j = fwd[j];
            len += 1;
        }
        if len > 0 && len % 2 == 0 {
            sign = -sign;
        }
    }
    sign
}

/// One matrix: `a` (m x n), `b` (rows x cols) for the solves, the result into `out`.
fn one<T: Real>(
    op: LinalgOp,
    a: &[T],
    m: usize,
    n: usize,
    b: Option<(&[T], usize, usize)>,
    out: &mut [T],
) -> Result<(), LinalgFailure> {
    let am = MatRef::from_row_major_slice(a, m, n);
    let k = m.min(n);
    match op {
        LinalgOp::Cholesky => {
            if n == 0 {
                return Ok(());
            }
            let llt = am.llt(Side::Lower).map_err(|e| match e {
                faer::linalg::cholesky::llt::factor::LltError::NonPositivePivot { index } => {
                    LinalgFailure::NotPositiveDefinite { minor: index + 1 }
                }
            })?;
            put(out, llt.L());
        }
        LinalgOp::Solve => {
            let (bv, r, c) = b.expect("solve has two operands");
            if n == 0 || c == 0 {
                return Ok(());
            }
            let lu = am.partial_piv_lu();
            if let Some(pivot) = zero_pivot(lu.U()) {
                return Err(LinalgFailure::Singular { pivot });
            }
            let x = lu.solve(MatRef::from_row_major_slice(bv, r, c));
            put(out, x.as_ref());
        }
        LinalgOp::TriangularSolve {
            lower,
            left,
            unit_diagonal,
        } => {
            let (bv, r, c) = b.expect("triangular_solve has two operands");
            if !unit_diagonal {
                if let Some(pivot) = (0..n).find(|&i| am[(i, i)] == T::of(0.0)) {
                    return Err(LinalgFailure::Singular { pivot });
                }
            }
            if r * c == 0 {
                return Ok(());
            }
            let bm = MatRef::from_row_major_slice(bv, r, c);
            // x @ t = b is t^T @ x^T = b^T: the other triangle of the transpose.
            let (t, mut x, lower) = if left {
                (am, bm.to_owned(), lower)
            } else {
                (am.transpose(), bm.transpose().to_owned(), !lower)
            };
            use faer::linalg::triangular_solve as ts;
            let par = Par::Seq;
            match (lower, unit_diagonal) {
                (true, false) => ts::solve_lower_triangular_in_place(t, x.as_mut(), par),
                (true, true) => ts::solve_unit_lower_triangular_in_place(t, x.as_mut(), par),
                (false, false) => ts::solve_upper_triangular_in_place(t, x.as_mut(), par),
                (false, true) => ts::solve_unit_upper_triangular_in_place(t, x.as_mut(), par),
            }
            if left {
                put(out, x.as_ref());
            } else {
                put(out, x.as_ref().transpose());
            }
        }
        LinalgOp::Lu => lu_parts(am, m, n, out),
        LinalgOp::Det | LinalgOp::Slogdet => {
            let (sign, logabs) = slogdet(am, n);
            if op == LinalgOp::Det {
                out[0] = det(am, n);
            } else {
                out[0] = T::of(sign);
                out[1] = logabs;
            }
        }
        LinalgOp::Qr { complete } => {
            let kq = if complete { m } else { k };
            let (q_len, r_rows) = (m * kq, kq);
            let (q_out, r_out) = out.split_at_mut(q_len);
            if m == 0 {
                return Ok(());
            }
            if n == 0 {
                // Q is the identity of the kept columns; R is empty.
                for i in 0..kq {
                    q_out[i * kq + i] = T::of(1.0);
                }
                return Ok(());
            }
            let qr = am.qr();
            if complete {
                put(q_out, qr.compute_Q().as_ref());
                put(r_out, qr.R());
            } else {
                put(q_out, qr.compute_thin_Q().as_ref());
                put(r_out, qr.thin_R());
            }
            canonical_qr_signs(q_out, m, kq, r_out, r_rows, n);
        }
        LinalgOp::Svd { full } => {
            let (uc, vr) = if full { (m, n) } else { (k, k) };
            let (u_out, rest) = out.split_at_mut(m * uc);
            let (s_out, vh_out) = rest.split_at_mut(k);
            if k == 0 {
                // Nothing to decompose: the full bases are identities.
                for i in 0..uc.min(m) {
                    u_out[i * uc + i] = T::of(1.0);
                }
                for i in 0..vr.min(n) {
                    vh_out[i * n + i] = T::of(1.0);
                }
                return Ok(());
            }
            let svd = if full { am.svd() } else { am.thin_svd() }
                .map_err(|_| LinalgFailure::NoConvergence)?;
            put(u_out, svd.U());
            let s = svd.S().column_vector();
            for i in 0..k {
                s_out[i] = s[i];
            }
            put(vh_out, svd.V().transpose());
            canonical_column_signs(u_out, m, uc, Some((vh_out, vr, n)));
            canonical_row_signs(vh_out, n, uc.min(vr));
        }
        LinalgOp::Svdvals => {
            if k == 0 {
                return Ok(());
            }
            let s = am
                .singular_values()
                .map_err(|_| LinalgFailure::NoConvergence)?;
            out.copy_from_slice(&s);
        }
        LinalgOp::Eigh { upper } | LinalgOp::Eigvalsh { upper } => {
            if n == 0 {
                return Ok(());
            }
            let side = if upper { Side::Upper } else { Side::Lower };
            if let LinalgOp::Eigvalsh { .. } = op {
                let w = am
                    .self_adjoint_eigenvalues(side)
                    .map_err(|_| LinalgFailure::NoConvergence)?;
                out.copy_from_slice(&w);
                return Ok(());
            }
            let e = am
                .self_adjoint_eigen(side)
                .map_err(|_| LinalgFailure::NoConvergence)?;
            let (w_out, v_out) = out.split_at_mut(n);
            let w = e.S().column_vector();
            for i in 0..n {
                w_out[i] = w[i];
            }
            put(v_out, e.U());
            canonical_column_signs(v_out, n, n, None);
        }
    }
    Ok(())
}

/// scipy's `lu`: `P [m, m]`, `L [m, k]`, `U [k, n]` with `a = P @ L @ U`.
fn lu_parts<T: Real>(am: MatRef<'_, T>, m: usize, n: usize, out: &mut [T]) {
    let k = m.min(n);
    let (p_out, rest) = out.split_at_mut(m * m);
    let (l_out, u_out) = rest.split_at_mut(m * k);
    if k == 0 {
        for i in 0..m {
            p_out[i * m + i] = T::of(1.0);
        }
        return;
    }
    let lu = am.partial_piv_lu();
    // faer's `P a = L U`: row i of `P a` is row fwd[i] of a, so `a = P^T L U`.
    let (fwd, _) = lu.P().arrays();
    for (i, &f) in fwd.iter().enumerate() {
        p_out[f * m + i] = T::of(1.0);
    }
    put(l_out, lu.L());
    put(u_out, lu.U());
}

/// `(sign, log|det|)` of the square `am` from its LU factors (`(0, -inf)` when singular).
fn slogdet<T: Real>(am: MatRef<'_, T>, n: usize) -> (f64, T) {
    if n == 0 {
        return (1.0, T::of(0.0));
    }
    let lu = am.partial_piv_lu();
    let u = lu.U();
    let mut sign = parity(lu.P().arrays().0);
    let mut log = T::of(0.0);
    for i in 0..n {
        let d = u[(i, i)];
        if d == T::of(0.0) {
            return (0.0, T::of(f64::NEG_INFINITY));
        }
        if d < T::of(0.0) {
            sign = -sign;
        }
        log += d.ln_abs();
    }
    (sign, log)
}

/// The determinant: the product of U's diagonal with the permutation's sign, multiplied
/// in order as LAPACK-based `det`s do (it may overflow where `slogdet` would not).
fn det<T: Real>(am: MatRef<'_, T>, n: usize) -> T {
    if n == 0 {
        return T::of(1.0);
    }
    let lu = am.partial_piv_lu();
    let u = lu.U();
    let mut d = T::of(parity(lu.P().arrays().0));
    for i in 0..n {
        d *= u[(i, i)];
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parity_of_a_permutation() {
        assert_eq!(parity(&[0, 1, 2]), 1.0);
        assert_eq!(parity(&[1, 0, 2]), -1.0);
        assert_eq!(parity(&[1, 2, 0]), 1.0);
    }
}
