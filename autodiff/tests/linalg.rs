//! The LAPACK level's rules (`autodiff/src/linalg.rs`) against central finite
//! differences in f64 on the reference interpreter (step and tolerance in `common`),
//! on batched, well-conditioned inputs: SPD matrices for cholesky (fed as the input, so
//! the differences also perturb the upper triangle the forward never reads, whose
//! gradient must be 0), `random + n I` for the solves and determinants, symmetric
//! matrices with well-separated eigenvalues for eigh, tall and wide matrices with
//! well-separated singular values for qr and svd. The losses weigh every element of
//! the (packed) result, sign-convention-dependent factors included: the step is far
//! too small to flip a sign choice. Plus the cases with no rule, which must be errors.

mod common;

use common::{Case, Rng, H, TOL};
use ndfuse_autodiff::{grad, AutodiffError};
use ndfuse_ir::{BinaryOp, LinalgOp, NodeId, Op};

/// An f64 input of `shape` holding `vals` (row-major).
fn values(c: &mut Case, shape: &[usize], vals: &[f64]) -> NodeId {
    assert_eq!(
        vals.len(),
        shape.iter().product::<usize>(),
        "one value per position"
    );
    let mut it = vals.iter();
    c.input(shape, || *it.next().expect("one value per position"))
}

/// `batch` row-major `m x n` matrices, uniform in `[-s, s)`, plus `diag[i]` on
/// position `(i, i)` (where `diag` has an entry), each matrix times `signs[b]`.
fn matrices(rng: &mut Rng, batch: usize, m: usize, n: usize, s: f64, diag: &[f64]) -> Vec<f64> {
    let mut v = Vec::with_capacity(batch * m * n);
    for _ in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let d = if i == j {
                    diag.get(i).copied().unwrap_or(0.0)
                } else {
                    0.0
                };
                v.push(rng.uniform(-s, s) + d);
            }
        }
    }
    v
}

/// `batch` SPD matrices `B B^T + n I`, `B` uniform in `[-1, 1)`.
fn spd(rng: &mut Rng, batch: usize, n: usize) -> Vec<f64> {
    let b = matrices(rng, batch, n, n, 1.0, &[]);
    let mut v = Vec::with_capacity(batch * n * n);
    for k in 0..batch {
        let bk = &b[k * n * n..(k + 1) * n * n];
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n).map(|t| bk[i * n + t] * bk[j * n + t]).sum();
                v.push(dot + if i == j { n as f64 } else { 0.0 });
            }
        }
    }
    v
}

/// `batch` matrices whose `lower` (else upper) triangle, with the diagonal, is that of
/// a symmetric matrix with eigenvalues near `0, 5, 10, ...` (Gershgorin: each within
/// `n - 1` of its centre, uniform entries in `[-1, 1)` off the diagonal); the other
/// triangle holds unrelated values the forward must ignore.
fn symmetric_read(rng: &mut Rng, batch: usize, n: usize, lower: bool) -> Vec<f64> {
    let mut v = Vec::with_capacity(batch * n * n);
    for _ in 0..batch {
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let x = if i == j {
                    5.0 * i as f64 + rng.uniform(-0.5, 0.5)
                } else {
                    rng.uniform(-1.0, 1.0)
                };
                let (r, c) = if lower { (i, j) } else { (j, i) };
                a[r * n + c] = x;
            }
        }
        for i in 0..n {
            for j in 0..n {
                let unread = if lower { j > i } else { j < i };
                if unread {
                    a[i * n + j] = rng.uniform(-3.0, 3.0);
                }
            }
        }
        v.extend(a);
    }
    v
}

/// Like `Case::check`, but returns the largest relative error seen (printed with
/// `--nocapture`), asserting it is within `TOL`.
fn check(c: &Case, what: &str, loss: NodeId, wrt: &[NodeId]) -> f64 {
    let got = c.grads(loss, wrt);
    let mut worst: f64 = 0.0;
    for (k, &w) in wrt.iter().enumerate() {
        let fd = c.finite_diff(loss, w, H);
        for (i, (&a, &n)) in got[k].iter().zip(&fd).enumerate() {
            let err = (a - n).abs() / n.abs().max(1.0);
            assert!(
                err <= TOL,
                "{what}: d loss / d {w}[{i}] (shape {:?}): grad {a}, finite differences {n}, relative error {err:e}",
                c.shape(w)
            );
            worst = worst.max(err);
        }
    }
    eprintln!("{what}: max relative error {worst:e}");
    worst
}

/// `sum(op(a...) * r)` for a random `r`, checked against finite differences with
/// respect to every operand; returns the largest error.
fn check_op(what: &str, op: LinalgOp, operands: &[(&[usize], Vec<f64>)], seed: u64) -> f64 {
    let mut c = Case::new();
    let xs: Vec<NodeId> = operands.iter().map(|(s, v)| values(&mut c, s, v)).collect();
    let y = c.op(Op::Linalg(op), &xs);
    let l = c.weighted_loss(y, &mut Rng(seed));
    check(&c, what, l, &xs)
}

#[test]
fn cholesky_reads_only_the_lower_triangle() {
    let mut rng = Rng(11);
    for (shape, seed) in [(vec![2, 3, 3], 1), (vec![4, 4], 2), (vec![2, 1, 2, 2], 3)] {
        let (n, batch) = (
            shape[shape.len() - 1],
            shape[..shape.len() - 2].iter().product(),
        );
        let a = spd(&mut rng, batch, n);
        check_op(
            &format!("cholesky {shape:?}"),
            LinalgOp::Cholesky,
            &[(&shape, a.clone())],
            seed,
        );
        // The upper triangle gets exactly 0.
        let mut c = Case::new();
        let x = values(&mut c, &shape, &a);
        let y = c.op(Op::Linalg(LinalgOp::Cholesky), &[x]);
        let l = c.weighted_loss(y, &mut Rng(seed));
        let g = &c.grads(l, &[x])[0];
        for (p, &v) in g.iter().enumerate() {
            if p % n > (p / n) % n {
                assert_eq!(v, 0.0, "cholesky: the unread {p} gets a gradient");
            }
        }
    }
}

#[test]
fn solve_both_operands() {
    let mut rng = Rng(12);
    let a = matrices(&mut rng, 2, 3, 3, 1.0, &[3.0, 3.0, 3.0]);
    let b = matrices(&mut rng, 2, 3, 2, 1.0, &[]);
    check_op(
        "solve [2,3,3] [2,3,2]",
        LinalgOp::Solve,
        &[(&[2, 3, 3], a), (&[2, 3, 2], b)],
        4,
    );
    let a = matrices(&mut rng, 1, 4, 4, 1.0, &[4.0; 4]);
    let b = matrices(&mut rng, 1, 4, 1, 1.0, &[]);
    check_op(
        "solve [4,4] [4,1]",
        LinalgOp::Solve,
        &[(&[4, 4], a), (&[4, 1], b)],
        5,
    );
}

#[test]
fn triangular_solve_every_variant() {
    let mut rng = Rng(13);
    for lower in [true, false] {
        for left in [true, false] {
            for unit_diagonal in [false, true] {
                let op = LinalgOp::TriangularSolve {
                    lower,
                    left,
                    unit_diagonal,
                };
                // The unread triangle (and a unit diagonal) hold values the forward
                // ignores; their gradient must be 0.
                let a = matrices(&mut rng, 2, 3, 3, 0.5, &[3.0, -2.5, 3.5]);
                let bs: [usize; 3] = if left { [2, 3, 2] } else { [2, 2, 3] };
                let b = matrices(&mut rng, 2, bs[1], bs[2], 1.0, &[]);
                check_op(&format!("{op}"), op, &[(&[2, 3, 3], a), (&bs, b)], 6);
            }
        }
    }
}

#[test]
fn det_and_slogdet_of_both_signs() {
    let mut rng = Rng(14);
    // The second matrix of each batch is negated: a negative determinant (n = 3).
    let mut a = matrices(&mut rng, 2, 3, 3, 1.0, &[3.0, 3.0, 3.0]);
    for x in &mut a[9..] {
        *x = -*x;
    }
    check_op("det [2,3,3]", LinalgOp::Det, &[(&[2, 3, 3], a.clone())], 7);
    check_op("slogdet [2,3,3]", LinalgOp::Slogdet, &[(&[2, 3, 3], a)], 8);
    let a = matrices(&mut rng, 1, 2, 2, 1.0, &[2.0, -2.0]);
    check_op("det [2,2]", LinalgOp::Det, &[(&[2, 2], a.clone())], 9);
    check_op("slogdet [2,2]", LinalgOp::Slogdet, &[(&[2, 2], a)], 10);
}

#[test]
fn inv_batched_and_of_a_negative_determinant() {
    let mut rng = Rng(19);
    let a = matrices(&mut rng, 2, 3, 3, 1.0, &[3.0, -3.0, 3.0]);
    check_op("inv [2,3,3]", LinalgOp::Inv, &[(&[2, 3, 3], a)], 21);
    let a = matrices(&mut rng, 1, 4, 4, 1.0, &[2.0, 2.0, -2.0, 2.0]);
    check_op("inv [4,4]", LinalgOp::Inv, &[(&[4, 4], a)], 22);
}

#[test]
fn qr_reduced_and_square_complete() {
    let mut rng = Rng(15);
    let a = matrices(&mut rng, 2, 4, 3, 1.0, &[2.0, -2.0, 2.0]);
    let op = LinalgOp::Qr { complete: false };
    check_op("qr [2,4,3]", op, &[(&[2, 4, 3], a)], 11);
    let a = matrices(&mut rng, 2, 3, 3, 1.0, &[2.0, 2.0, -2.0]);
    for complete in [false, true] {
        let op = LinalgOp::Qr { complete };
        check_op(&format!("{op} [2,3,3]"), op, &[(&[2, 3, 3], a.clone())], 12);
    }
    let a = matrices(&mut rng, 1, 5, 2, 1.0, &[2.0, 2.0]);
    check_op(
        "qr [5,2]",
        LinalgOp::Qr { complete: false },
        &[(&[5, 2], a)],
        13,
    );
}

#[test]
fn eigh_and_eigvalsh_from_either_triangle() {
    let mut rng = Rng(16);
    for upper in [false, true] {
        let a = symmetric_read(&mut rng, 2, 3, !upper);
        let op = LinalgOp::Eigh { upper };
        check_op(&format!("{op} [2,3,3]"), op, &[(&[2, 3, 3], a.clone())], 14);
        let op = LinalgOp::Eigvalsh { upper };
        check_op(&format!("{op} [2,3,3]"), op, &[(&[2, 3, 3], a)], 15);
        let a = symmetric_read(&mut rng, 1, 4, !upper);
        let op = LinalgOp::Eigh { upper };
        check_op(&format!("{op} [4,4]"), op, &[(&[4, 4], a)], 16);
    }
}

#[test]
fn svd_tall_wide_and_square_full() {
    let mut rng = Rng(17);
    let cases: [(&[usize], bool); 4] = [
        (&[2, 4, 3], false),
        (&[2, 3, 4], false),
        (&[2, 3, 3], true),
        (&[5, 2], false),
    ];
    for (k, (shape, full)) in cases.into_iter().enumerate() {
        let r = shape.len();
        let (m, n) = (shape[r - 2], shape[r - 1]);
        let batch = shape[..r - 2].iter().product();
        // Singular values near 6, 4, 2: well separated and away from 0.
        let a = matrices(&mut rng, batch, m, n, 0.5, &[6.0, -4.0, 2.0]);
        let op = LinalgOp::Svd { full };
        check_op(
            &format!("{op} {shape:?}"),
            op,
            &[(shape, a.clone())],
            20 + k as u64,
        );
        let op = LinalgOp::Svdvals;
        check_op(&format!("{op} {shape:?}"), op, &[(shape, a)], 30 + k as u64);
    }
}

#[test]
fn gradients_of_shared_operands_accumulate() {
    // A Gaussian-process-like loss: x^T a^-1 x and log|det a| through cholesky, all from
    // the same a and b.
    let mut rng = Rng(18);
    let mut c = Case::new();
    let a = spd(&mut rng, 2, 3);
    let a = values(&mut c, &[2, 3, 3], &a);
    let bv = matrices(&mut rng, 2, 3, 1, 1.0, &[]);
    let b = values(&mut c, &[2, 3, 1], &bv);
    let l = c.op(Op::Linalg(LinalgOp::Cholesky), &[a]);
    let z = c.op(
        Op::Linalg(LinalgOp::TriangularSolve {
            lower: true,
            left: true,
            unit_diagonal: false,
        }),
        &[l, b],
    );
    let x = c.op(Op::Linalg(LinalgOp::Solve), &[a, b]);
    let sd = c.op(Op::Linalg(LinalgOp::Slogdet), &[a]);
    let lz = c.weighted_loss(z, &mut rng);
    let lx = c.weighted_loss(x, &mut rng);
    let ls = c.weighted_loss(sd, &mut rng);
    let s = c.bin(BinaryOp::Add, lz, lx);
    let s = c.bin(BinaryOp::Add, s, ls);
    check(&c, "cholesky + solves + slogdet of one a", s, &[a, b]);
}

/// `grad`'s error for `op` on an input of `shape`.
fn no_rule(op: LinalgOp, shape: &[usize]) -> AutodiffError {
    let mut c = Case::new();
    let mut rng = Rng(19);
    let x = c.input(shape, || rng.uniform(-1.0, 1.0));
    let y = c.op(Op::Linalg(op), &[x]);
    let l = c.weighted_loss(y, &mut rng);
    grad(&c.g, l, &[x]).expect_err("no rule")
}

#[test]
fn the_cases_with_no_rule_are_errors() {
    for (op, shape, says) in [
        (LinalgOp::Lu, vec![2, 3, 3], "solve"),
        (LinalgOp::Svd { full: true }, vec![2, 4, 3], "full_matrices"),
        (LinalgOp::Svd { full: true }, vec![3, 4], "full_matrices"),
        (LinalgOp::Qr { complete: false }, vec![2, 3, 4], "m < n"),
        (LinalgOp::Qr { complete: true }, vec![4, 3], "complete"),
    ] {
        let err = no_rule(op, &shape);
        assert!(
            matches!(err, AutodiffError::NoRule { op: name } if name.starts_with(op.name())),
            "{op} on {shape:?}: {err}"
        );
        let text = err.to_string();
        assert!(text.contains(says), "{op} on {shape:?}: {text}");
    }
}

#[test]
fn repeated_eigenvalues_give_nan_vectors_and_finite_values() {
    // diag(2, 2, 5) (with some garbage above the diagonal): a repeated eigenvalue.
    let a = [2.0, 7.0, -1.0, 0.0, 2.0, 3.0, 0.0, 0.0, 5.0];
    let mut c = Case::new();
    let x = values(&mut c, &[3, 3], &a);
    let y = c.op(Op::Linalg(LinalgOp::Eigh { upper: false }), &[x]);
    let l = c.weighted_loss(y, &mut Rng(40));
    let g = &c.grads(l, &[x])[0];
    assert!(g.iter().any(|v| !v.is_finite()), "eigh: {g:?}");
    // The values alone: sum(w) = trace(a), whose gradient is the identity.
    let mut c = Case::new();
    let x = values(&mut c, &[3, 3], &a);
    let w = c.op(Op::Linalg(LinalgOp::Eigvalsh { upper: false }), &[x]);
    let l = c.reduce(ndfuse_ir::ReduceOp::Sum, w, &[0], false);
    let g = &c.grads(l, &[x])[0];
    let eye = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
    for (got, want) in g.iter().zip(eye) {
        assert!((got - want).abs() < 1e-12, "eigvalsh: {g:?}");
    }
}

#[test]
fn every_rule_builds_in_f32_unbatched_and_evaluates() {
    use ndfuse_ir::DType;
    let ops = [
        LinalgOp::Cholesky,
        LinalgOp::Det,
        LinalgOp::Slogdet,
        LinalgOp::Qr { complete: false },
        LinalgOp::Svd { full: false },
        LinalgOp::Svdvals,
        LinalgOp::Eigh { upper: false },
        LinalgOp::Eigvalsh { upper: true },
        LinalgOp::Solve,
        LinalgOp::TriangularSolve {
            lower: false,
            left: false,
            unit_diagonal: true,
        },
    ];
    for op in ops {
        let mut rng = Rng(50);
        let vals = spd(&mut rng, 1, 3);
        let mut c = Case::new();
        let mut it = vals.iter();
        let x = c.input_of(DType::F32, &[3, 3], &mut || *it.next().unwrap());
        let mut xs = vec![x];
        if op.arity() == 2 {
            xs.push(c.input_of(DType::F32, &[3, 3], &mut || rng.uniform(-1.0, 1.0)));
        }
        let y = c.op(Op::Linalg(op), &xs);
        let l = c.weighted_loss(y, &mut rng);
        for g in c.grads(l, &xs) {
            assert!(g.iter().all(|v| v.is_finite()), "{op} in f32: {g:?}");
        }
    }
}
