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
//!
//! Layouts. ndfuse's matrices are row-major, faer's column-major; an element-by-element
//! transposing copy of a 1024 x 1024 f64 matrix costs 5-8 ms on the VMs we measure on,
//! as much as its Cholesky factorisation, and every fresh buffer costs its page faults
//! (about 2 us each there). So the hot paths copy nothing they need not and factor in
//! place, in buffers of the runtime's host cache: `cholesky` factors its result
//! buffer, holding a copy of `a`, as the row-major matrix it is (faer's in-place
//! Cholesky is as fast there as on column-major storage); `solve`, `det` and `slogdet`
//! factor `a` copied tile by tile into column-major storage (factoring `a^T`, the free
//! view, would pivot otherwise than LAPACK and call other matrices singular), and solve
//! in the result buffer; `triangular_solve` reads `a` through a view and solves in its
//! result buffer; `lu` and `qr` copy `a` tile by tile into column-major storage; `eigh` and `svd` decompose the free column-major view
//! (`a^T`: the same symmetric matrix from the other triangle, or the SVD with `U` and
//! `V` swapped). Every result has the same bits on any thread count: QR, SVD and the
//! eigensolver run sequentially (faer's parallel QR and SVD do not), which sets faer's
//! process-wide parallelism to sequential for every caller of its high-level API. One matrix alone gets faer's parallel algorithms on the current
//! rayon pool; a batch runs its matrices in parallel, each sequentially.

use crate::alloc::host_cache;
use crate::error::RuntimeError;
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::lu::partial_pivoting as pp;
use faer::{Mat, MatMut, MatRef, Par, Side};
use half::{bf16, f16};
use ndfuse_ir::interp::InterpError;
use ndfuse_ir::linalg::{canonical_column_signs, canonical_qr_signs, canonical_row_signs};
use ndfuse_ir::{DType, HostArray, LinalgFailure, LinalgOp, Node, Shape, Storage};
use rayon::prelude::*;

/// The float types the library computes in.
trait Real: faer::traits::RealField + ndfuse_ir::linalg::SignedReal + Copy + Send + Sync {
    const DTYPE: DType;
    fn of(x: f64) -> Self;
    fn ln_abs(self) -> Self;
    fn finite(self) -> bool;
    /// The elements of an array of [`Real::DTYPE`].
    fn elems(a: &mut HostArray) -> &mut [Self];
}

impl Real for f32 {
    const DTYPE: DType = DType::F32;
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn ln_abs(self) -> f32 {
        self.abs().ln()
    }
    fn finite(self) -> bool {
        self.is_finite()
    }
    fn elems(a: &mut HostArray) -> &mut [f32] {
        match a.storage_mut() {
            Storage::F32(v) => v,
            _ => unreachable!("an f32 array holds f32 storage"),
        }
    }
}

impl Real for f64 {
    const DTYPE: DType = DType::F64;
    fn of(x: f64) -> f64 {
        x
    }
    fn ln_abs(self) -> f64 {
        self.abs().ln()
    }
    fn finite(self) -> bool {
        self.is_finite()
    }
    fn elems(a: &mut HostArray) -> &mut [f64] {
        match a.storage_mut() {
            Storage::F64(v) => v,
            _ => unreachable!("an f64 array holds f64 storage"),
        }
    }
}

/// A buffer of `len` elements from the host cache (its contents are stale).
fn work<T: Real>(len: usize) -> Result<HostArray, LinalgFailure> {
    host_cache()
        .array(T::DTYPE, Shape::new([len]))
        .map_err(|_| LinalgFailure::OutOfMemory)
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
    let cache = host_cache();
    match (a.storage(), operands.get(1).map(|b| b.storage())) {
        (Storage::F64(av), bv) => {
            let bv = bv.map(|s| match s {
                Storage::F64(v) => v.as_slice(),
                _ => unreachable!("infer gives both operands one dtype"),
            });
            let mut out = cache.array(DType::F64, shape)?;
            batched(op, (av, m, n), bv.zip(b), count, f64::elems(&mut out)).map_err(fail)?;
            Ok(out)
        }
        (Storage::F32(av), bv) => {
            let bv = bv.map(|s| match s {
                Storage::F32(v) => v.as_slice(),
                _ => unreachable!("infer gives both operands one dtype"),
            });
            let mut out = cache.array(DType::F32, shape)?;
            batched(op, (av, m, n), bv.zip(b), count, f32::elems(&mut out)).map_err(fail)?;
            Ok(out)
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
            let mut wide = cache.array(DType::F32, shape.clone())?;
            let o = f32::elems(&mut wide);
            batched(op, (&av, m, n), bw.as_deref().zip(b), count, o).map_err(fail)?;
            let mut out = cache.array(node.dtype, shape)?;
            match out.storage_mut() {
                Storage::F16(h) => h
                    .iter_mut()
                    .zip(o.iter())
                    .for_each(|(h, x)| *h = f16::from_f32(*x)),
                Storage::BF16(h) => h
                    .iter_mut()
                    .zip(o.iter())
                    .for_each(|(h, x)| *h = bf16::from_f32(*x)),
                _ => unreachable!("a half result holds half storage"),
            }
            Ok(out)
        }
    }
}

/// Every one of the `count` matrices of the batch into `out`, in parallel; the first
/// failure in batch order.
fn batched<T: Real>(
    op: LinalgOp,
    (a, m, n): (&[T], usize, usize),
    b: Option<(&[T], (usize, usize))>,
    count: usize,
    out: &mut [T],
) -> Result<(), (usize, LinalgFailure)> {
    let Some(per_out) = out.len().checked_div(count).filter(|&p| p > 0) else {
        return Ok(());
    };
    let one_at = |i: usize, o: &mut [T], par: Par| {
        let ai = &a[i * m * n..(i + 1) * m * n];
        let bi = b.map(|(bv, (r, c))| (&bv[i * r * c..(i + 1) * r * c], r, c));
        one(op, ai, m, n, bi, o, par).map_err(|f| (i, f))
    };
    if count == 1 {
        // One matrix: faer's own parallel algorithms on the current pool, run from one of
        // its workers. Called from a thread outside the pool (the evaluating thread when
        // no pool is installed), each of faer's many parallel regions would be injected
        // into the pool and waited for across threads: QR of a 1024 x 1024 f64 matrix
        // took 65 ms that way against 36 ms from a worker.
        return rayon::scope(|_| one_at(0, out, Par::rayon(0)));
    }
    // Matrices in parallel, each sequential: a decomposition is far more work than a
    // task's overhead.
    let failures: Vec<(usize, LinalgFailure)> = out
        .par_chunks_mut(per_out)
        .enumerate()
        .filter_map(|(i, o)| one_at(i, o, Par::Seq).err())
        .collect();
    match failures.into_iter().min_by_key(|f| f.0) {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// The side of the square tiles the layout changes copy by. Rows of a 1024-wide f64
/// matrix are 8 KiB apart, so a tile's rows all fall in one L1 set: 8 of them fit its
/// ways, 32 thrash it (a 1024 x 1024 f64 transposing copy took 4.7 ms with 32 x 32
/// tiles, 2.3 ms with 8 x 8, on the Xeon VM).
const TILE: usize = 8;

/// Calls `f(i, j)` for every position of an `m x n` matrix, tile by tile: the order
/// of the layout changes below, which read along one axis and write along the other.
fn by_tiles(m: usize, n: usize, mut f: impl FnMut(usize, usize)) {
    for ib in (0..m).step_by(TILE) {
        for jb in (0..n).step_by(TILE) {
            for j in jb..(jb + TILE).min(n) {
                for i in ib..(ib + TILE).min(m) {
                    f(i, j);
                }
            }
        }
    }
}

/// Writes `mat` into `out` row-major (see the module docs).
fn put<T: Real>(out: &mut [T], mat: MatRef<'_, T>) {
    let c = mat.ncols();
    by_tiles(mat.nrows(), c, |i, j| out[i * c + j] = mat[(i, j)]);
}

/// The row-major `m x n` matrix `a` as a column-major faer matrix.
fn col_major<T: Real>(a: &[T], m: usize, n: usize) -> Mat<T> {
    let mut out = Mat::<T>::zeros(m, n);
    by_tiles(m, n, |i, j| out[(i, j)] = a[i * n + j]);
    out
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

/// Square `a` (`n x n`, row-major) copied tile by tile into column-major storage of the
/// host cache and factored there in place by LU with partial pivoting (LAPACK's
/// `getrf` on `a`, as numpy calls it: the same pivots, so the same matrices are found
/// singular): the factors (unit lower `L` and upper `U` in one matrix) and the row
/// permutation `fwd`, `inv` with `P a = L U`.
fn lu_of<T: Real>(
    a: &[T],
    n: usize,
    par: Par,
) -> Result<(HostArray, Vec<usize>, Vec<usize>), LinalgFailure> {
    let mut w = work::<T>(n * n)?;
    let lu = T::elems(&mut w);
    by_tiles(n, n, |i, j| lu[j * n + i] = a[i * n + j]);
    let (mut fwd, mut inv) = (vec![0usize; n], vec![0usize; n]);
    let req = pp::factor::lu_in_place_scratch::<usize, T>(n, n, par, Default::default());
    let mut mem = MemBuffer::new(req);
    pp::factor::lu_in_place(
        MatMut::from_column_major_slice_mut(lu, n, n),
        &mut fwd,
        &mut inv,
        par,
        MemStack::new(&mut mem),
        Default::default(),
    );
    Ok((w, fwd, inv))
}

/// faer's high-level decompositions (qr, svd, eigh, lu's factors) take their threads
/// from its process-wide setting, and its parallel QR and SVD give other bits on other
/// thread counts (the last bits of Q and U differ between 1 and 2 threads); ndfuse's
/// results may not depend on the threads, so those run sequentially (QR of 1024 x 1024
/// f64 about 10% slower on the Xeon VM, SVD 5%). Cholesky and LU are called with their
/// threads explicitly and give the same bits on any count (tested).
fn sequential_high_level_calls() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| faer::set_global_parallelism(Par::Seq));
}

/// One matrix: `a` (m x n), `b` (rows x cols) for the solves, the result into `out`
/// (whose old contents are stale).
fn one<T: Real>(
    op: LinalgOp,
    a: &[T],
    m: usize,
    n: usize,
    b: Option<(&[T], usize, usize)>,
    out: &mut [T],
    par: Par,
) -> Result<(), LinalgFailure> {
    let k = m.min(n);
    let zero = T::of(0.0);
    sequential_high_level_calls();
    match op {
        LinalgOp::Cholesky => {
            // In place on the result, row-major: its lower triangle is a's.
            out.copy_from_slice(a);
            let req = faer::linalg::cholesky::llt::factor::cholesky_in_place_scratch::<T>(
                n,
                par,
                Default::default(),
            );
            let mut mem = MemBuffer::new(req);
            faer::linalg::cholesky::llt::factor::cholesky_in_place(
                MatMut::from_row_major_slice_mut(out, n, n),
                Default::default(),
                par,
                MemStack::new(&mut mem),
                Default::default(),
            )
            .map_err(|e| match e {
                faer::linalg::cholesky::llt::factor::LltError::NonPositivePivot { index } => {
                    LinalgFailure::NotPositiveDefinite { minor: index + 1 }
                }
            })?;
            for i in 0..n {
                out[i * n + i + 1..(i + 1) * n].fill(zero);
            }
        }
        LinalgOp::Solve => {
            let (bv, r, c) = b.expect("solve has two operands");
            if n == 0 || c == 0 {
                return Ok(());
            }
            let (mut w, fwd, inv) = lu_of(a, n, par)?;
            let lu = MatRef::from_column_major_slice(T::elems(&mut w), n, n);
            if let Some(pivot) = (0..n).find(|&i| lu[(i, i)] == zero) {
                return Err(LinalgFailure::Singular { pivot });
            }
            // a x = b with P a = L U: solved in the result, row-major.
            out.copy_from_slice(bv);
            let perm = faer::perm::PermRef::new_checked(&fwd, &inv, n);
            let req = pp::solve::solve_in_place_scratch::<usize, T>(n, c, par);
            let mut mem = MemBuffer::new(req);
            pp::solve::solve_in_place(
                lu,
                lu,
                perm,
                MatMut::from_row_major_slice_mut(out, r, c),
                par,
                MemStack::new(&mut mem),
            );
        }
        LinalgOp::Inv => {
            if n == 0 {
                return Ok(());
            }
            let (mut w, fwd, inv) = lu_of(a, n, par)?;
            let lu = MatRef::from_column_major_slice(T::elems(&mut w), n, n);
            if let Some(pivot) = (0..n).find(|&i| lu[(i, i)] == zero) {
                return Err(LinalgFailure::Singular { pivot });
            }
            // getri: the triangular factors inverted and multiplied, column-major in a
            // host-cache buffer, then written row-major (faster than solving for the
            // identity's columns: 45 against 75 ms for 1024^2 f64 on the Xeon VM).
            let mut x = work::<T>(n * n)?;
            let xs = T::elems(&mut x);
            let perm = faer::perm::PermRef::new_checked(&fwd, &inv, n);
            let req = pp::inverse::inverse_scratch::<usize, T>(n, par);
            let mut mem = MemBuffer::new(req);
            pp::inverse::inverse(
                MatMut::from_column_major_slice_mut(xs, n, n),
                lu,
                lu,
                perm,
                par,
                MemStack::new(&mut mem),
            );
            put(out, MatRef::from_column_major_slice(xs, n, n));
        }
        LinalgOp::TriangularSolve {
            lower,
            left,
            unit_diagonal,
        } => {
            let (bv, r, c) = b.expect("triangular_solve has two operands");
            if !unit_diagonal {
                if let Some(pivot) = (0..n).find(|&i| a[i * n + i] == zero) {
                    return Err(LinalgFailure::Singular { pivot });
                }
            }
            if r * c == 0 {
                return Ok(());
            }
            out.copy_from_slice(bv);
            let am = MatRef::from_row_major_slice(a, n, n);
            // x @ t = b is t^T @ x^T = b^T: the other triangle of the transpose, with
            // x^T the column-major view of the row-major result.
            let (t, x, lower) = if left {
                (am, MatMut::from_row_major_slice_mut(out, r, c), lower)
            } else {
                (
                    am.transpose(),
                    MatMut::from_column_major_slice_mut(out, c, r),
                    !lower,
                )
            };
            use faer::linalg::triangular_solve as ts;
            match (lower, unit_diagonal) {
                (true, false) => ts::solve_lower_triangular_in_place(t, x, par),
                (true, true) => ts::solve_unit_lower_triangular_in_place(t, x, par),
                (false, false) => ts::solve_upper_triangular_in_place(t, x, par),
                (false, true) => ts::solve_unit_upper_triangular_in_place(t, x, par),
            }
        }
        LinalgOp::Lu => lu_parts(a, m, n, out),
        LinalgOp::Det | LinalgOp::Slogdet => {
            let (sign, logabs, det) = if n == 0 {
                (1.0, zero, T::of(1.0))
            } else {
                let (mut w, fwd, _) = lu_of(a, n, par)?;
                let lu = MatRef::from_column_major_slice(T::elems(&mut w), n, n);
                determinant(lu, &fwd)
            };
            if op == LinalgOp::Det {
                out[0] = det;
            } else {
                out[0] = T::of(sign);
                out[1] = logabs;
            }
        }
        LinalgOp::Qr { complete } => {
            out.fill(zero);
            let kq = if complete { m } else { k };
            let (q_out, r_out) = out.split_at_mut(m * kq);
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
            let qr = col_major(a, m, n).qr();
            if complete {
                put(q_out, qr.compute_Q().as_ref());
                put(r_out, qr.R());
            } else {
                put(q_out, qr.compute_thin_Q().as_ref());
                put(r_out, qr.thin_R());
            }
            canonical_qr_signs(q_out, m, kq, r_out, kq, n);
        }
        LinalgOp::Svd { full } => {
            out.fill(zero);
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
            // The column-major view is a^T = V S U^T: its U is a's V and its V a's U.
            let at = MatRef::from_column_major_slice(a, n, m);
            let svd = if full { at.svd() } else { at.thin_svd() }
                .map_err(|_| LinalgFailure::NoConvergence)?;
            put(u_out, svd.V());
            let s = svd.S().column_vector();
            for (i, o) in s_out.iter_mut().enumerate() {
                *o = s[i];
            }
            put(vh_out, svd.U().transpose());
            canonical_column_signs(u_out, m, uc, Some((vh_out, vr, n)));
            canonical_row_signs(vh_out, n, uc.min(vr));
        }
        LinalgOp::Svdvals => {
            if k == 0 {
                return Ok(());
            }
            let s = MatRef::from_column_major_slice(a, n, m)
                .singular_values()
                .map_err(|_| LinalgFailure::NoConvergence)?;
            out.copy_from_slice(&s);
        }
        LinalgOp::Eigh { upper } | LinalgOp::Eigvalsh { upper } => {
            if n == 0 {
                return Ok(());
            }
            // The column-major view is a^T: a's lower triangle is its upper one.
            let at = MatRef::from_column_major_slice(a, n, n);
            let side = if upper { Side::Lower } else { Side::Upper };
            if let LinalgOp::Eigvalsh { .. } = op {
                let w = at
                    .self_adjoint_eigenvalues(side)
                    .map_err(|_| LinalgFailure::NoConvergence)?;
                out.copy_from_slice(&w);
                return Ok(());
            }
            let e = at
                .self_adjoint_eigen(side)
                .map_err(|_| LinalgFailure::NoConvergence)?;
            let (w_out, v_out) = out.split_at_mut(n);
            let w = e.S().column_vector();
            for (i, o) in w_out.iter_mut().enumerate() {
                *o = w[i];
            }
            put(v_out, e.U());
            canonical_column_signs(v_out, n, n, None);
        }
    }
    Ok(())
}

/// `(sign, log|det|, det)` from LU factors and the row permutation: `(0, -inf, 0)` when a pivot is zero. The determinant is the product
/// of the pivots in order, as LAPACK-based `det`s compute it (it may overflow where
/// `slogdet` does not).
fn determinant<T: Real>(lu: MatRef<'_, T>, fwd: &[usize]) -> (f64, T, T) {
    let n = lu.nrows();
    let mut sign = parity(fwd);
    let (mut log, mut det) = (T::of(0.0), T::of(sign));
    for i in 0..n {
        let d = lu[(i, i)];
        det *= d;
        if d == T::of(0.0) {
            return (0.0, T::of(f64::NEG_INFINITY), T::of(0.0));
        }
        if d < T::of(0.0) {
            sign = -sign;
        }
        log += d.ln_abs();
    }
    (sign, log, det)
}

/// scipy's `lu`: `P [m, m]`, `L [m, k]`, `U [k, n]` with `a = P @ L @ U`.
fn lu_parts<T: Real>(a: &[T], m: usize, n: usize, out: &mut [T]) {
    let k = m.min(n);
    out.fill(T::of(0.0));
    let (p_out, rest) = out.split_at_mut(m * m);
    let (l_out, u_out) = rest.split_at_mut(m * k);
    if k == 0 {
        for i in 0..m {
            p_out[i * m + i] = T::of(1.0);
        }
        return;
    }
    let lu = col_major(a, m, n).partial_piv_lu();
    put(l_out, lu.L());
    put(u_out, lu.U());
    let finite = |v: &[T]| v.iter().all(|x| x.finite());
    if finite(l_out) && finite(u_out) || !finite(a) {
        // faer's `P a = L U`: row i of `P a` is row fwd[i] of a, so `a = P^T L U`.
        let (fwd, _) = lu.P().arrays();
        for (i, &f) in fwd.iter().enumerate() {
            p_out[f * m + i] = T::of(1.0);
        }
        return;
    }
    // An exactly zero pivot: faer divided by it. LAPACK's getrf leaves that column
    // unscaled and goes on, as scipy returns it; so does this unblocked elimination
    // (the singular case only).
    let fwd = lu_unblocked(a, m, n, l_out, u_out);
    for (i, &f) in fwd.iter().enumerate() {
        p_out[f * m + i] = T::of(1.0);
    }
}

/// Gaussian elimination with partial pivoting on row-major `a` (`m x n`), LAPACK's
/// `getf2`: the largest magnitude pivots (the first on a tie), a zero pivot column
/// skipped. Writes `L [m, k]` and `U [k, n]`; returns `fwd` with row `i` of `P a` being
/// row `fwd[i]` of `a`.
fn lu_unblocked<T: Real>(a: &[T], m: usize, n: usize, l: &mut [T], u: &mut [T]) -> Vec<usize> {
    let k = m.min(n);
    let mut w = a.to_vec();
    let mut fwd: Vec<usize> = (0..m).collect();
    for j in 0..k {
        let abs = |x: T| if x < T::of(0.0) { -x } else { x };
        let p = (j..m).fold(j, |best, i| {
            if abs(w[i * n + j]) > abs(w[best * n + j]) {
                i
            } else {
                best
            }
        });
        if p != j {
            for c in 0..n {
                w.swap(j * n + c, p * n + c);
            }
            fwd.swap(j, p);
        }
        let d = w[j * n + j];
        if d == T::of(0.0) {
            continue;
        }
        for i in j + 1..m {
            let f = w[i * n + j] / d;
            w[i * n + j] = f;
            for c in j + 1..n {
                let x = w[j * n + c];
                w[i * n + c] -= f * x;
            }
        }
    }
    for i in 0..m {
        for j in 0..k {
            l[i * k + j] = match i.cmp(&j) {
                std::cmp::Ordering::Greater => w[i * n + j],
                std::cmp::Ordering::Equal => T::of(1.0),
                std::cmp::Ordering::Less => T::of(0.0),
            };
        }
    }
    for i in 0..k {
        for j in 0..n {
            u[i * n + j] = if j >= i { w[i * n + j] } else { T::of(0.0) };
        }
    }
    fwd
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
