//! Every rule of `rules.rs` against central finite differences in f64 on the reference
//! interpreter (step and tolerance in `common`), over random shapes with broadcasts and
//! views; plus the exact tie rules, the ops through which no gradient flows, and the
//! errors. The indexed and running ops' rules are checked in `index_and_scan.rs`.

mod common;

use common::{Case, Rng};
use ndfuse_autodiff::{grad, AutodiffError};
use ndfuse_ir::{AxisSlice, BinaryOp, DType, Op, ReduceOp, Shape, UnaryOp, ViewOp};

const SEEDS: u64 = 4;

#[test]
fn every_unary_rule() {
    for u in UnaryOp::ALL {
        if u == UnaryOp::Not {
            continue; // bool only
        }
        for seed in 1..=SEEDS {
            let mut rng = Rng(seed * 7919 + u as u64);
            let mut c = Case::new();
            let s = rng.shape(3);
            let x = c.input(&s, || match u {
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => {
                    rng.uniform(0.5, 2.0)
                }
                UnaryOp::Log1p => rng.uniform(-0.5, 2.0),
                _ => rng.away_from_zero(),
            });
            let y = c.un(u, x);
            let mut rng2 = Rng(seed);
            let l = c.weighted_loss(y, &mut rng2);
            c.check(&format!("{} on {s:?}", u.name()), l, &[x]);
        }
    }
}

/// A shape `out` broadcasts from: some extents set to 1, maybe leading axes dropped.
fn operand_shape(rng: &mut Rng, out: &[usize]) -> Vec<usize> {
    let drop = rng.below(out.len() + 1).min(1);
    out[drop..]
        .iter()
        .map(|&d| if rng.below(3) == 0 { 1 } else { d })
        .collect()
}

#[test]
fn every_differentiable_binary_rule_with_broadcasting() {
    use BinaryOp as B;
    for b in [B::Add, B::Sub, B::Mul, B::Div, B::Pow, B::Max, B::Min] {
        for seed in 1..=SEEDS {
            let mut rng = Rng(seed * 104_729 + b as u64);
            let mut out = rng.shape(3);
            if out.is_empty() {
                out.push(3);
            }
            let (sa, sb) = (operand_shape(&mut rng, &out), operand_shape(&mut rng, &out));
            let mut c = Case::new();
            let x = c.input(&sa, || match b {
                B::Pow => rng.uniform(0.5, 2.0),
                _ => rng.uniform(-2.0, 2.0),
            });
            let y = c.input(&sb, || match b {
                B::Div => rng.away_from_zero(),
                _ => rng.uniform(-2.0, 2.0),
            });
            let (xb, yb) = (c.bcast(x, &out), c.bcast(y, &out));
            let z = c.bin(b, xb, yb);
            let l = c.weighted_loss(z, &mut rng);
            c.check(&format!("{} of {sa:?} and {sb:?}", b.name()), l, &[x, y]);
        }
    }
}

#[test]
fn max_and_min_split_ties_evenly() {
    for (b, r) in [
        (BinaryOp::Max, ReduceOp::Max),
        (BinaryOp::Min, ReduceOp::Min),
    ] {
        // maximum(x, x'): with x == x' each operand gets half.
        let mut c = Case::new();
        let x = c.input(&[3], || 1.5);
        let y = c.input(&[3], || 1.5);
        let z = c.bin(b, x, y);
        let l = c.reduce(ReduceOp::Sum, z, &[0], false);
        let g = c.grads(l, &[x, y]);
        assert_eq!(g, vec![vec![0.5; 3], vec![0.5; 3]], "{}", b.name());
        // reduce_max over [1, 3, 3, 2]: the two 3s share.
        let mut c = Case::new();
        let mut vals = [1.0, 3.0, 3.0, 2.0].into_iter();
        let x = c.input(&[4], || vals.next().unwrap_or(0.0));
        let x = if r == ReduceOp::Min {
            c.un(UnaryOp::Neg, x)
        } else {
            x
        };
        let m = c.reduce(r, x, &[0], false);
        let g = c.grads(m, &[c.g.operands(m)[0]]);
        assert_eq!(g[0], vec![0.0, 0.5, 0.5, 0.0], "{}", r.name());
    }
}

#[test]
fn comparisons_logical_ops_and_arg_reductions_pass_no_gradient() {
    let mut rng = Rng(5);
    let mut c = Case::new();
    let x = c.input(&[2, 3], || rng.uniform(-1.0, 1.0));
    let y = c.input(&[2, 3], || rng.uniform(-1.0, 1.0));
    let mut terms = Vec::new();
    for b in [BinaryOp::Lt, BinaryOp::Ge, BinaryOp::Eq, BinaryOp::Ne] {
        let cmp = c.bin(b, x, y);
        let t = c.bin(BinaryOp::And, cmp, cmp);
        terms.push(c.op(Op::Cast { to: DType::F64 }, &[t]));
    }
    let am = c.op(
        Op::ArgReduce {
            op: ndfuse_ir::ArgReduceOp::ArgMax,
            axis: 1,
            keepdims: true,
        },
        &[x],
    );
    let am = c.op(Op::Cast { to: DType::F64 }, &[am]);
    let am = c.bcast(am, &[2, 3]);
    let mut s = am;
    for t in terms {
        s = c.bin(BinaryOp::Add, s, t);
    }
    let l = c.weighted_loss(s, &mut rng);
    assert_eq!(c.grads(l, &[x, y]), vec![vec![0.0; 6], vec![0.0; 6]]);
}

#[test]
fn where_sends_the_gradient_to_the_branch_its_condition_picks() {
    for seed in 1..=SEEDS {
        let mut rng = Rng(seed + 11);
        let mut c = Case::new();
        let k = c.input(&[3, 4], || rng.uniform(-1.0, 1.0));
        let zero =
            c.g.add_const(ndfuse_ir::Scalar::F(0.0), DType::F64, Shape::new([3, 4]));
        let cond = c.bin(BinaryOp::Gt, k, zero);
        let a = c.input(&[4], || rng.uniform(-2.0, 2.0));
        let b = c.input(&[3, 1], || rng.uniform(-2.0, 2.0));
        let (ab, bb) = (c.bcast(a, &[3, 4]), c.bcast(b, &[3, 4]));
        let sa = c.un(UnaryOp::Sin, ab);
        let w = c.op(Op::Where, &[cond, sa, bb]);
        let l = c.weighted_loss(w, &mut rng);
        c.check("where", l, &[a, b, k]);
    }
}

#[test]
fn casts_carry_the_gradient_back_to_a_float_and_stop_at_an_integer() {
    // f64 -> f32 -> square -> f64 on multiples of 1/64 with a step of 1/64: every value
    // is exact in f32, and central differences of a quadratic are exact.
    let mut rng = Rng(3);
    let mut c = Case::new();
    let x = c.input(&[2, 3], || (rng.uniform(-2.0, 2.0) * 64.0).round() / 64.0);
    let f = c.op(Op::Cast { to: DType::F32 }, &[x]);
    let s = c.un(UnaryOp::Square, f);
    let back = c.op(Op::Cast { to: DType::F64 }, &[s]);
    let i = c.op(Op::Cast { to: DType::I32 }, &[x]);
    let i = c.op(Op::Cast { to: DType::F64 }, &[i]);
    let y = c.bin(BinaryOp::Add, back, i);
    let r = c.input(&[2, 3], || (rng.uniform(-1.0, 1.0) * 8.0).round() / 8.0);
    let p = c.bin(BinaryOp::Mul, y, r);
    let l = c.reduce(ReduceOp::Sum, p, &[0, 1], false);
    c.check_with("cast f64 -> f32 -> f64 and f64 -> i32", l, &[x], 1.0 / 64.0);
}

#[test]
fn every_view_rule() {
    let views: Vec<(Vec<usize>, ViewOp)> = vec![
        (vec![2, 3, 4], ViewOp::Reshape(Shape::new([4, 6]))),
        (vec![6], ViewOp::Reshape(Shape::new([2, 1, 3]))),
        (vec![2, 3, 4], ViewOp::Permute(vec![2, 0, 1])),
        (vec![3, 4], ViewOp::Permute(vec![1, 0])),
        (
            vec![7],
            ViewOp::Slice(vec![AxisSlice {
                start: 1,
                step: 2,
                len: 3,
            }]),
        ),
        (
            vec![6],
            ViewOp::Slice(vec![AxisSlice {
                start: 5,
                step: -2,
                len: 3,
            }]),
        ),
        (
            vec![3, 5, 4],
            ViewOp::Slice(vec![
                AxisSlice::full(3),
                AxisSlice {
                    start: 1,
                    step: 1,
                    len: 3,
                },
                AxisSlice {
                    start: 3,
                    step: -1,
                    len: 4,
                },
            ]),
        ),
        (vec![3, 1], ViewOp::BroadcastTo(Shape::new([2, 3, 4]))),
        (vec![4], ViewOp::BroadcastTo(Shape::new([3, 4]))),
        (vec![], ViewOp::BroadcastTo(Shape::new([2, 2]))),
        (vec![3, 4], ViewOp::ExpandDims(1)),
        (vec![3, 1, 4, 1], ViewOp::Squeeze(vec![1, 3])),
    ];
    for (k, (s, v)) in views.into_iter().enumerate() {
        let mut rng = Rng(k as u64 + 1);
        let mut c = Case::new();
        let x = c.input(&s, || rng.uniform(-2.0, 2.0));
        let y = c.view(v.clone(), x);
        let y = c.un(UnaryOp::Sin, y);
        let l = c.weighted_loss(y, &mut rng);
        c.check(&format!("{v:?} of {s:?}"), l, &[x]);
    }
}

#[test]
fn every_reduction_rule() {
    for r in ReduceOp::ALL {
        for seed in 1..=SEEDS {
            let mut rng = Rng(seed * 31 + r as u64);
            let mut s = rng.shape(3);
            if s.is_empty() {
                s.push(4);
            }
            let mut axes: Vec<usize> = (0..s.len()).filter(|_| rng.below(2) == 0).collect();
            if axes.is_empty() {
                axes.push(rng.below(s.len()));
            }
            let keep = rng.below(2) == 0;
            let mut c = Case::new();
            let x = c.input(&s, || rng.away_from_zero());
            let y = c.reduce(r, x, &axes, keep);
            let l = c.weighted_loss(y, &mut rng);
            c.check(&format!("{} of {s:?} over {axes:?}", r.name()), l, &[x]);
        }
    }
}

#[test]
fn prod_at_zeros() {
    // One zero in a row: its gradient is the product of the others; two: all zero.
    for zeros in [&[1][..], &[0, 2]] {
        let mut rng = Rng(9);
        let mut c = Case::new();
        let mut i = 0;
        let x = c.input(&[2, 4], || {
            i += 1;
            if zeros.contains(&(i - 1)) {
                0.0
            } else {
                rng.away_from_zero()
            }
        });
        let y = c.reduce(ReduceOp::Prod, x, &[1], false);
        let l = c.weighted_loss(y, &mut rng);
        c.check(&format!("prod with zeros at {zeros:?}"), l, &[x]);
    }
}

#[test]
fn matmul_with_batch_broadcast() {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[1, 1], &[1, 3]),
    ];
    for (k, (sa, sb)) in shapes.into_iter().enumerate() {
        let mut rng = Rng(k as u64 + 40);
        let mut c = Case::new();
        let a = c.input(sa, || rng.uniform(-1.0, 1.0));
        let b = c.input(sb, || rng.uniform(-1.0, 1.0));
        let y = c.op(Op::MatMul, &[a, b]);
        let y = c.un(UnaryOp::Tanh, y);
        let l = c.weighted_loss(y, &mut rng);
        c.check(&format!("matmul {sa:?} @ {sb:?}"), l, &[a, b]);
    }
}

#[test]
fn several_users_accumulate() {
    let mut rng = Rng(77);
    let mut c = Case::new();
    let x = c.input(&[3, 2], || rng.uniform(-1.0, 1.0));
    let sq = c.un(UnaryOp::Square, x);
    let s = c.un(UnaryOp::Sin, x);
    let p = c.bin(BinaryOp::Mul, sq, s);
    let y = c.bin(BinaryOp::Add, p, x);
    let y = c.bin(BinaryOp::Mul, y, x);
    let l = c.weighted_loss(y, &mut rng);
    c.check("x (x^2 sin x + x)", l, &[x]);
}

#[test]
fn a_non_scalar_loss_is_an_error_naming_its_type() {
    let mut c = Case::new();
    let x = c.input(&[2, 3], || 1.0);
    let y = c.un(UnaryOp::Exp, x);
    let e = grad(&c.g, y, &[x]).expect_err("a [2,3] loss");
    assert!(matches!(e, AutodiffError::LossNotScalar { .. }));
    assert!(e.to_string().contains("f64[2,3]"), "{e}");
    let i = c.op(Op::Cast { to: DType::I64 }, &[x]);
    let s = c.reduce(ReduceOp::Sum, i, &[0, 1], false);
    let e = grad(&c.g, s, &[x]).expect_err("an integer loss");
    assert!(e.to_string().contains("i64[]"), "{e}");
}

#[test]
fn a_wrt_the_loss_does_not_depend_on_gets_zeros_and_an_integer_wrt_is_an_error() {
    let mut c = Case::new();
    let x = c.input(&[2], || 1.0);
    let unused = c.input(&[3, 2], || 5.0);
    let l = c.reduce(ReduceOp::Sum, x, &[0], false);
    assert_eq!(c.grads(l, &[unused, x]), vec![vec![0.0; 6], vec![1.0; 2]]);
    // The loss with respect to itself is 1.
    assert_eq!(c.grads(l, &[l]), vec![vec![1.0]]);
    let i = c.input_of(DType::I32, &[2], &mut || 1.0);
    let e = grad(&c.g, l, &[i]).expect_err("an i32 wrt");
    assert!(e.to_string().contains("i32[2]"), "{e}");
}
