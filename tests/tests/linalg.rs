//! The LAPACK level (`ndfuse::linalg`): the CPU's library calls (faer) against the f64
//! reference interpreter (textbook algorithms), reconstructions and residuals on well-
//! and ill-conditioned matrices (condition numbers 1 to 1e6), batched, in every float
//! dtype, at sizes 0, 1, 2, 17 and 64; the composites (inv, pinv, lstsq, the norms,
//! cond); gradients on the CPU against the interpreter's; the expression language's
//! tuple indexing; and bad input as numpy's `LinAlgError`.
//!
//! Tolerances, per dtype, relative to the matrix's scale: results that the conventions
//! make unique (factors, values, solutions) agree with the interpreter to `c n eps
//! cond` (backward-stable algorithms); reconstructions (`q r = a`, `u s vh = a`, `v w v^T
//! = a`, `p l u = a`, `l l^T = a`) hold to `c n eps ||a||` whatever the condition.

mod linalg_support;
use linalg_support::{identity, mm, transpose};
use ndfuse::linalg::{self, Norm, QrMode, Side};
use ndfuse::{Array, BackendKind, Context, DType, Tensor};

fn ctx(backend: BackendKind, dtype: DType) -> Context {
    Context::builder()
        .backend(backend)
        .dtype(dtype)
        .build()
        .expect("a context")
}

/// xorshift64*: deterministic data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let u = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        u as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// A random orthogonal `n x n`: the product of three Householder reflections.
fn orthogonal(rng: &mut Rng, n: usize) -> Vec<f64> {
    let mut q = identity(n);
    for _ in 0..3 {
        let v = rng.vec(n);
        let vv: f64 = v.iter().map(|x| x * x).sum();
        let mut h = identity(n);
        for i in 0..n {
            for j in 0..n {
                h[i * n + j] -= 2.0 * v[i] * v[j] / vv;
            }
        }
        q = mm(&q, &h, n, n, n);
    }
    q
}

/// The `j`-th of `k` values falling geometrically from 1 to `1 / cond`.
fn geometric(cond: f64, j: usize, k: usize) -> f64 {
    if k > 1 {
        cond.powf(-(j as f64) / (k - 1) as f64)
    } else {
        1.0
    }
}

/// `u diag(s) v^T` with random orthogonal `u`, `v` and singular values from 1 down to
/// `1 / cond`, geometrically: an `m x n` matrix of that condition number.
fn conditioned(rng: &mut Rng, m: usize, n: usize, cond: f64) -> Vec<f64> {
    let (u, v) = (orthogonal(rng, m), orthogonal(rng, n));
    let k = m.min(n);
    let mut us = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..k {
            us[i * n + j] = u[i * m + j] * geometric(cond, j, k);
        }
    }
    mm(&us, &transpose(&v, n, n), m, n, n)
}

/// A symmetric positive-definite `n x n` of condition number about `cond`.
fn spd(rng: &mut Rng, n: usize, cond: f64) -> Vec<f64> {
    let q = orthogonal(rng, n);
    let mut qd = q.clone();
    for i in 0..n {
        for j in 0..n {
            qd[i * n + j] *= geometric(cond, j, n);
        }
    }
    mm(&qd, &transpose(&q, n, n), n, n, n)
}

/// A batch of `count` matrices from `f`, as one tensor `[count, m, n]` (`[m, n]` when
/// `count` is 0).
fn batch(c: &Context, count: usize, m: usize, n: usize, mut f: impl FnMut() -> Vec<f64>) -> Tensor {
    let data: Vec<f64> = (0..count.max(1)).flat_map(|_| f()).collect();
    let shape: Vec<usize> = if count == 0 {
        vec![m, n]
    } else {
        vec![count, m, n]
    };
    c.from_vec(data, &shape)
        .expect("data")
        .cast(c.default_dtype())
}

/// `max |got - want| / (1 + max |want|)`.
fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = 1.0 + want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
        / scale
}

fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 9.765_625e-4,
        _ => 7.812_5e-3,
    }
}

fn eval(ts: &[&Tensor]) -> Vec<Array> {
    ts[0].context().eval(ts).expect("eval")
}

/// The same tensors built on both backends by `build`, compared within `bound`.
fn same_on_both(what: &str, dtype: DType, bound: f64, build: impl Fn(&Context) -> Vec<Tensor>) {
    let (ci, cc) = (
        ctx(BackendKind::Interp, dtype),
        ctx(BackendKind::Cpu, dtype),
    );
    let (ti, tc) = (build(&ci), build(&cc));
    let (ri, rc) = (
        eval(&ti.iter().collect::<Vec<_>>()),
        eval(&tc.iter().collect::<Vec<_>>()),
    );
    for (k, (i, c)) in ri.iter().zip(&rc).enumerate() {
        assert_eq!(i.shape(), c.shape(), "{what} [{k}]: shapes");
        let e = rel(&c.to_f64_vec(), &i.to_f64_vec());
        assert!(
            e <= bound,
            "{what} [{k}] ({dtype}): cpu vs interp {e:.3e} > {bound:.3e}"
        );
    }
}

#[test]
fn every_op_on_the_cpu_matches_the_interpreter() {
    for dtype in [DType::F64, DType::F32] {
        for (count, n) in [(0, 1), (2, 2), (3, 5), (0, 17), (2, 17), (0, 64)] {
            let tol = 200.0 * n as f64 * eps(dtype);
            let what = |op: &str| format!("{op} batch {count} n {n}");
            same_on_both(&what("cholesky/solve/det"), dtype, tol * 10.0, |c| {
                let mut rng = Rng(7 + n as u64);
                let a = batch(c, count, n, n, || spd(&mut rng, n, 10.0));
                let b = batch(c, count, n, 3, || rng.vec(n * 3));
                let sl = linalg::slogdet(&a);
                vec![
                    linalg::cholesky(&a, false),
                    linalg::solve(&a, &b),
                    linalg::det(&a),
                    sl.sign,
                    sl.logabsdet,
                    linalg::inv(&a),
                ]
            });
            for (m, n2) in [(n, n), (n + 3, n), (n, n + 2)] {
                same_on_both(
                    &what(&format!("qr/svd/lu {m}x{n2}")),
                    dtype,
                    tol * 10.0,
                    |c| {
                        let mut rng = Rng(99 + (m * n2) as u64);
                        let a = batch(c, count, m, n2, || conditioned(&mut rng, m, n2, 30.0));
                        let q = linalg::qr(&a, QrMode::Reduced);
                        let s = linalg::svd(&a, false);
                        let l = linalg::lu(&a);
                        vec![q.q, q.r, s.u, s.s, s.vh, linalg::svdvals(&a), l.p, l.l, l.u]
                    },
                );
            }
            same_on_both(&what("eigh"), dtype, tol * 10.0, |c| {
                let mut rng = Rng(5 + n as u64);
                let a = batch(c, count, n, n, || {
                    let s = spd(&mut rng, n, 50.0);
                    // Shifted: eigenvalues of both signs.
                    (0..n * n)
                        .map(|x| s[x] - if x / n == x % n { 0.3 } else { 0.0 })
                        .collect()
                });
                let e = linalg::eigh(&a, false);
                let u = linalg::eigh(&a, true);
                vec![
                    e.eigenvalues,
                    e.eigenvectors,
                    linalg::eigvalsh(&a, false),
                    u.eigenvectors,
                ]
            });
        }
    }
}

/// `||recon - a|| / ||a||`-style checks for each decomposition on the CPU.
#[test]
fn decompositions_reconstruct_their_matrix_at_every_condition() {
    for dtype in [DType::F64, DType::F32] {
        let c = ctx(BackendKind::Cpu, dtype);
        for cond in [1.0, 1e3, 1e6] {
            for (m, n) in [(17, 17), (64, 40), (40, 64), (1, 1), (2, 2)] {
                let mut rng = Rng(cond as u64 + (m * 131 + n) as u64);
                let a = batch(&c, 2, m, n, || conditioned(&mut rng, m, n, cond));
                let tol = 50.0 * m.max(n) as f64 * eps(dtype);
                let mt = linalg::matrix_transpose;
                let q = linalg::qr(&a, QrMode::Reduced);
                let qc = linalg::qr(&a, QrMode::Complete);
                let s = linalg::svd(&a, false);
                let sf = linalg::svd(&a, true);
                let l = linalg::lu(&a);
                let k = m.min(n);
                let sd = s.s.expand_dims(-2);
                // The full factors' first k columns (rows) carry the decomposition.
                use ndfuse::SliceArg;
                let all = SliceArg::all;
                let uf_k = sf.u.slice(&[all(), all(), (0..k as i64).into()]);
                let vh_k = sf.vh.slice(&[all(), (0..k as i64).into()]);
                let checks: Vec<(&str, Tensor, Tensor)> = vec![
                    ("q r", q.q.matmul(&q.r), a.clone()),
                    ("q^T q", mt(&q.q).matmul(&q.q), eye(&c, 2, k)),
                    ("complete q r", qc.q.matmul(&qc.r), a.clone()),
                    ("complete q^T q", mt(&qc.q).matmul(&qc.q), eye(&c, 2, m)),
                    ("u s vh", s.u.mul(&sd).matmul(&s.vh), a.clone()),
                    ("u^T u", mt(&s.u).matmul(&s.u), eye(&c, 2, k)),
                    ("vh vh^T", s.vh.matmul(&mt(&s.vh)), eye(&c, 2, k)),
                    (
                        "full u s vh",
                        uf_k.mul(sf.s.expand_dims(-2)).matmul(&vh_k),
                        a.clone(),
                    ),
                    ("full u^T u", mt(&sf.u).matmul(&sf.u), eye(&c, 2, m)),
                    ("full vh vh^T", sf.vh.matmul(&mt(&sf.vh)), eye(&c, 2, n)),
                    ("p l u", l.p.matmul(&l.l).matmul(&l.u), a.clone()),
                ];
                let (names, pairs): (Vec<&str>, Vec<(Tensor, Tensor)>) =
                    checks.into_iter().map(|(w, x, y)| (w, (x, y))).unzip();
                let flat: Vec<&Tensor> = pairs.iter().flat_map(|(x, y)| [x, y]).collect();
                let r = eval(&flat);
                for (i, w) in names.iter().enumerate() {
                    let e = rel(&r[2 * i].to_f64_vec(), &r[2 * i + 1].to_f64_vec());
                    assert!(
                        e <= tol,
                        "{w} of {m}x{n} cond {cond:e} ({dtype}): {e:.3e} > {tol:.3e}"
                    );
                }
            }
        }
    }
}

/// The identity `[batch, n, n]` in `c`'s dtype.
fn eye(c: &Context, batch: usize, n: usize) -> Tensor {
    c.ones(&[batch, n, n])
        .cast(c.default_dtype())
        .tril(0)
        .triu(0)
}

#[test]
fn solves_are_backward_stable_on_ill_conditioned_matrices() {
    for dtype in [DType::F64, DType::F32] {
        let c = ctx(BackendKind::Cpu, dtype);
        for cond in [1.0, 1e3, 1e6] {
            let n = 64;
            let mut rng = Rng(3 + cond as u64);
            let a = batch(&c, 3, n, n, || conditioned(&mut rng, n, n, cond));
            let p = batch(&c, 3, n, n, || spd(&mut rng, n, cond));
            let b = batch(&c, 3, n, 4, || rng.vec(n * 4));
            let x = linalg::solve(&a, &b);
            let l = linalg::cholesky(&p, false);
            let y = linalg::triangular_solve(&l, &b, false, Side::Left, false);
            // The right side: z l^T = b^T, so z = y^T... of l^T: compare z l^T with b^T.
            let lt = linalg::matrix_transpose(&l);
            let bt = linalg::matrix_transpose(&b);
            let z = linalg::triangular_solve(&lt, &bt, true, Side::Right, false).matmul(&lt);
            // Residuals relative to ||a|| ||x|| (backward error), and l l^T = p.
            let r = eval(&[
                &a.matmul(&x).sub(&b),
                &x,
                &l.matmul(&linalg::matrix_transpose(&l)),
                &p,
                &l.matmul(&y),
                &z,
                &bt,
            ]);
            let tol = 100.0 * n as f64 * eps(dtype);
            let xmax = r[1].to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let res = r[0].to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert!(
                res / (1.0 + xmax) <= tol,
                "solve residual {res:e} (cond {cond:e}, {dtype})"
            );
            let e = rel(&r[2].to_f64_vec(), &r[3].to_f64_vec());
            assert!(e <= tol, "l l^T = p: {e:e} (cond {cond:e}, {dtype})");
            let bt = b.cast(DType::F64);
            let want = eval(&[&bt])[0].to_f64_vec();
            let e = rel(&r[4].to_f64_vec(), &want);
            assert!(
                e <= tol * cond.sqrt().max(1.0),
                "l y = b: {e:e} (cond {cond:e}, {dtype})"
            );
            let e = rel(&r[5].to_f64_vec(), &r[6].to_f64_vec());
            assert!(
                e <= tol * cond.sqrt().max(1.0),
                "z l^T = b^T: {e:e} (cond {cond:e}, {dtype})"
            );
        }
    }
}

#[test]
fn half_types_compute_in_f32_and_round_once() {
    for dtype in [DType::F16, DType::BF16] {
        let mut rng = Rng(11);
        let data: Vec<f64> = (0..2).flat_map(|_| spd(&mut rng, 5, 4.0)).collect();
        let c32 = ctx(BackendKind::Cpu, DType::F32);
        let ch = ctx(BackendKind::Cpu, dtype);
        // The same (rounded) input in both: the half result is the f32 result rounded.
        let ah = ch
            .from_vec(data.clone(), &[2, 5, 5])
            .expect("data")
            .cast(dtype);
        let a32 = ah.cast(DType::F32);
        let a32 = c32
            .from_vec(eval(&[&a32])[0].to_f64_vec(), &[2, 5, 5])
            .expect("data")
            .cast(DType::F32);
        let wh = [
            linalg::cholesky(&ah, false),
            linalg::eigvalsh(&ah, false),
            linalg::det(&ah),
        ];
        let w32 = [
            linalg::cholesky(&a32, false),
            linalg::eigvalsh(&a32, false),
            linalg::det(&a32),
        ];
        for (h, f) in wh.iter().zip(&w32) {
            let (h, f) = (eval(&[h])[0].clone(), eval(&[&f.cast(dtype)])[0].clone());
            assert_eq!(h.dtype(), dtype);
            assert_eq!(
                h.to_f64_vec(),
                f.to_f64_vec(),
                "{dtype}: rounded once from f32"
            );
        }
    }
}

#[test]
fn composites_follow_their_definitions() {
    let c = ctx(BackendKind::Cpu, DType::F64);
    let mut rng = Rng(21);
    // A rank-2 6x4 matrix: pinv and lstsq must find the minimum-norm solution.
    let u = rng.vec(6 * 2);
    let v = rng.vec(2 * 4);
    let low = mm(&u, &v, 6, 2, 4);
    let a = c.from_vec(low.clone(), &[6, 4]).expect("data");
    let b = c.from_vec(rng.vec(6 * 2), &[6, 2]).expect("data");
    let p = linalg::pinv(&a, None);
    let ls = linalg::lstsq(&a, &b, None);
    let mt = linalg::matrix_transpose;
    let r = eval(&[
        &a.matmul(&p).matmul(&a),
        &a,
        &p.matmul(&a).matmul(&p),
        &p,
        &ls.solution,
        &p.matmul(&b),
        &ls.rank,
        &mt(&a).matmul(&a.matmul(&ls.solution).sub(&b)),
        &ls.residuals,
        &a.matmul(&ls.solution).sub(&b).square().sum(0),
    ]);
    assert!(
        rel(&r[0].to_f64_vec(), &r[1].to_f64_vec()) < 1e-12,
        "a p a = a"
    );
    assert!(
        rel(&r[2].to_f64_vec(), &r[3].to_f64_vec()) < 1e-12,
        "p a p = p"
    );
    assert!(
        rel(&r[4].to_f64_vec(), &r[5].to_f64_vec()) < 1e-12,
        "lstsq = pinv b"
    );
    assert_eq!(r[6].to_f64_vec(), vec![2.0], "rank");
    assert!(
        r[7].to_f64_vec().iter().all(|x| x.abs() < 1e-12),
        "normal equations"
    );
    assert!(
        rel(&r[8].to_f64_vec(), &r[9].to_f64_vec()) < 1e-12,
        "residuals"
    );

    // Norms against their definitions on a fixed matrix, and cond.
    let m = c
        .from_vec(vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3])
        .expect("data");
    let s = eval(&[&linalg::svdvals(&m)])[0].to_f64_vec();
    let want = [
        (Norm::Fro, 91.0f64.sqrt()),
        (Norm::Nuc, s[0] + s[1]),
        (Norm::Two, s[0]),
        (Norm::NegTwo, s[1]),
        (Norm::One, 9.0),
        (Norm::NegOne, 5.0),
        (Norm::Inf, 15.0),
        (Norm::NegInf, 6.0),
    ];
    for (ord, w) in want {
        let got = eval(&[&linalg::matrix_norm(&m, ord)])[0].to_f64_vec()[0];
        assert!((got - w).abs() < 1e-12 * w, "{ord:?}: {got} != {w}");
    }
    let cond = eval(&[&linalg::cond(&m, None)])[0].to_f64_vec()[0];
    assert!((cond - s[0] / s[1]).abs() < 1e-12 * cond);
    let sq = c.from_vec(vec![4.0, 1.0, 2.0, 3.0], &[2, 2]).expect("data");
    let c1 = eval(&[&linalg::cond(&sq, Some(Norm::One))])[0].to_f64_vec()[0];
    // ||a||_1 = 6, inv = [[0.3, -0.1], [-0.2, 0.4]]: ||inv||_1 = 0.5.
    assert!((c1 - 3.0).abs() < 1e-12, "cond_1 = {c1}");
}

#[test]
fn gradients_on_the_cpu_match_the_interpreter() {
    let build = |c: &Context| {
        let mut rng = Rng(33);
        let a = batch(c, 2, 4, 4, || spd(&mut rng, 4, 5.0));
        let t = batch(c, 2, 5, 3, || conditioned(&mut rng, 5, 3, 4.0));
        let b = batch(c, 2, 4, 2, || rng.vec(8));
        let l = linalg::cholesky(&a, false);
        let x = linalg::solve(&a, &b);
        let q = linalg::qr(&t, QrMode::Reduced);
        let s = linalg::svd(&t, false);
        let e = linalg::eigh(&a, false);
        let loss = l
            .sum(..)
            .add(x.square().sum(..))
            .add(linalg::slogdet(&a).logabsdet.sum(..))
            .add(q.r.sum(..))
            .add(s.s.sum(..))
            .add(s.u.abs().sum(..))
            .add(e.eigenvalues.square().sum(..))
            .add(linalg::inv(&a).sum(..))
            .add(linalg::pinv(&t, None).sum(..));
        let g = ndfuse::grad(&loss, &[&a, &t, &b]).expect("grad");
        let mut all = vec![loss];
        all.extend(g);
        all
    };
    same_on_both("gradients", DType::F64, 1e-9, build);
}

#[test]
fn expressions_index_the_tuples_and_share_one_decomposition() {
    let c = ctx(BackendKind::Cpu, DType::F64);
    let mut rng = Rng(4);
    let a = c
        .from_vec(conditioned(&mut rng, 5, 3, 10.0), &[5, 3])
        .expect("data");
    let s = c.from_vec(spd(&mut rng, 3, 10.0), &[3, 3]).expect("data");
    let inputs = [("a", &a), ("s", &s)];
    let run = |e: &str| -> Array {
        c.evaluate(e, &inputs)
            .unwrap_or_else(|err| panic!("{e}: {err}"))
    };
    let a_back = run("qr(a)[0] @ qr(a)[1]");
    assert!(rel(&a_back.to_f64_vec(), &eval(&[&a])[0].to_f64_vec()) < 1e-13);
    let usv = run("svd(a, full_matrices=false)[0] * svd(a, full_matrices=false)[1] @ svd(a, full_matrices=false)[2]");
    assert!(rel(&usv.to_f64_vec(), &eval(&[&a])[0].to_f64_vec()) < 1e-13);
    let w = run("eigh(s)[0]");
    assert_eq!(w.to_f64_vec(), run("eigvalsh(s, UPLO='L')").to_f64_vec());
    let x = run("solve(s, matrix_transpose(a))");
    assert_eq!(x.shape(), &[3, 5]);
    assert!(run("det(inv(s)) * det(s) - 1").to_f64_vec()[0].abs() < 1e-13);
    let n = run("matrix_norm(a, ord='fro') - matrix_norm(a, ord=2)");
    assert!(n.to_f64_vec()[0] > 0.0);
    // One decomposition for every use of qr(a): the report counts one linalg step.
    let t = ndfuse::expr::Expr::parse("qr(a)[0] @ qr(a)[1] + qr(a)[0] @ qr(a, mode='reduced')[1]")
        .expect("parse")
        .bind(&c, &inputs)
        .expect("bind");
    let (_, report) = c.eval_report(&[&t]).expect("eval");
    let text = report.kernels_text();
    assert_eq!(text.matches("qr is a library call").count(), 1, "{text}");
    // The decomposition ran as the CPU's library call, not in the interpreter.
    let paths = &report.evaluation().paths;
    let routines = paths
        .iter()
        .filter(|p| matches!(p, ndfuse_runtime::StepPath::Routine { .. }))
        .count();
    assert_eq!(routines, 1, "{paths:?}");
    assert!(
        !paths
            .iter()
            .any(|p| matches!(p, ndfuse_runtime::StepPath::Interp)),
        "{paths:?}"
    );
    // Misuse is an error with the way out.
    for (e, says) in [
        ("qr(a)", "index it"),
        ("qr(a)[2]", "out of range"),
        ("svd(a)[0, 1]", "one integer"),
        ("eigh(s, UPLO='X')[0]", "'L' or 'U'"),
        ("matrix_norm(a, ord=3)", "ord must be"),
    ] {
        let err = c.evaluate(e, &inputs).expect_err(e).to_string();
        assert!(err.contains(says), "{e}: {err}");
    }
}

#[test]
fn bad_input_is_numpys_linalgerror_naming_the_batch_and_pivot() {
    for backend in [BackendKind::Cpu, BackendKind::Interp] {
        let c = ctx(backend, DType::F64);
        // The second matrix of the batch is exactly singular (row 1 = 2 row 0): partial
        // pivoting meets an exactly zero third pivot. (numpy's [[1, 2, 3], [4, 5, 6],
        // [7, 8, 9]] is singular only in exact arithmetic: its pivots round to nonzero.)
        let a = c
            .from_vec(
                vec![
                    2.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 2.0, //
                    1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 1.0, 0.0, 1.0,
                ],
                &[2, 3, 3],
            )
            .expect("data");
        let b = c.ones(&[2, 3, 1]).cast(DType::F64);
        let err = linalg::solve(&a, &b)
            .eval()
            .expect_err("singular")
            .to_string();
        assert!(
            err.contains("solve")
                && err.contains("singular")
                && err.contains("[1]")
                && err.contains("pivot 2"),
            "{backend:?}: {err}"
        );
        let err = linalg::inv(&a).eval().expect_err("singular").to_string();
        assert!(err.contains("singular"), "{err}");
        // Not positive definite: the leading minor of order 2 fails.
        let p = c
            .from_vec(vec![1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0], &[3, 3])
            .expect("data");
        let err = linalg::cholesky(&p, false)
            .eval()
            .expect_err("not pd")
            .to_string();
        assert!(
            err.contains("cholesky")
                && err.contains("positive definite")
                && err.contains("order 2"),
            "{backend:?}: {err}"
        );
        // Shapes: not square, b that does not fit; both shapes named.
        let r = c.ones(&[3, 4]).cast(DType::F64);
        let err = linalg::det(&r).eval().expect_err("not square").to_string();
        assert!(err.contains("f64[3,4]") && err.contains("square"), "{err}");
        let err = linalg::solve(&a, &c.ones(&[2, 4, 1]).cast(DType::F64))
            .eval()
            .expect_err("b")
            .to_string();
        assert!(
            err.contains("f64[2,3,3]") && err.contains("f64[2,4,1]"),
            "{err}"
        );
        let err = linalg::det(&c.ones(&[3, 3]).cast(DType::I64))
            .eval()
            .expect_err("int")
            .to_string();
        assert!(err.contains("cast"), "{err}");
        // Singular det and slogdet are values, not errors (numpy).
        let s = linalg::slogdet(&a);
        let r = eval(&[&linalg::det(&a), &s.sign, &s.logabsdet]);
        assert_eq!(r[0].to_f64_vec()[1], 0.0);
        assert_eq!(r[1].to_f64_vec(), vec![1.0, 0.0]);
        assert_eq!(r[2].to_f64_vec()[1], f64::NEG_INFINITY);
    }
}
