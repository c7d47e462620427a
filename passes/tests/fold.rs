//! Before/after snapshots of constant folding, each also checked by evaluating the
//! graph before and after with the interpreter (bit-identical outputs).

mod common;

use common::{before_after, run_pass, Build};
use ndfuse_ir::{
    ArgReduceOp, BinaryOp, DType, Graph, Op, ReduceOp, Scalar, Shape, UnaryOp, ViewOp,
};
use ndfuse_passes::Fold;

fn s(d: &[usize]) -> Shape {
    Shape::new(d.to_vec())
}

#[test]
fn arithmetic_on_constants_becomes_one_fill() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[4]));
    let two = g.add_const(Scalar::F(2.0), DType::F32, s(&[4]));
    let three = g.add_const(Scalar::F(3.0), DType::F32, s(&[4]));
    let five = g.op(Op::Binary(BinaryOp::Add), &[two, three]);
    let e = g.op(Op::Unary(UnaryOp::Exp), &[five]);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[x, e]);
    g.add_output(y);
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn half_precision_rounds_like_the_interpreter() {
    // 0.1 + 0.2 in f16 rounds to f16 after the add; exp(20) overflows f16 to inf.
    let mut g = Graph::new();
    let a = g.add_const(Scalar::F(0.1), DType::F16, s(&[3]));
    let b = g.add_const(Scalar::F(0.2), DType::F16, s(&[3]));
    let sum = g.op(Op::Binary(BinaryOp::Add), &[a, b]);
    let big = g.add_const(Scalar::F(20.0), DType::F16, s(&[3]));
    let inf = g.op(Op::Unary(UnaryOp::Exp), &[big]);
    let third = g.add_const(Scalar::F(1.0 / 3.0), DType::BF16, s(&[3]));
    let sq = g.op(Op::Unary(UnaryOp::Square), &[third]);
    g.add_output(sum);
    g.add_output(inf);
    g.add_output(sq);
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn integers_wrap_and_comparisons_give_bools() {
    let mut g = Graph::new();
    let max = g.add_const(Scalar::I(i64::from(i32::MAX)), DType::I32, s(&[2]));
    let one = g.add_const(Scalar::I(1), DType::I32, s(&[2]));
    let wrapped = g.op(Op::Binary(BinaryOp::Add), &[max, one]);
    let lt = g.op(Op::Binary(BinaryOp::Lt), &[wrapped, one]);
    let neg_min = g.op(Op::Unary(UnaryOp::Neg), &[wrapped]);
    let nan = g.add_const(Scalar::F(f64::NAN), DType::F64, s(&[2]));
    let ne = g.op(Op::Binary(BinaryOp::Ne), &[nan, nan]);
    let eq = g.op(Op::Binary(BinaryOp::Eq), &[nan, nan]);
    let both = g.op(Op::Binary(BinaryOp::And), &[lt, ne]);
    let not = g.op(Op::Unary(UnaryOp::Not), &[eq]);
    let p = g.add_const(Scalar::I(3), DType::I64, s(&[2]));
    let e = g.add_const(Scalar::I(41), DType::I64, s(&[2]));
    let pow = g.op(Op::Binary(BinaryOp::Pow), &[p, e]);
    for o in [neg_min, both, not, pow] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn nan_and_signed_zero_follow_ieee() {
    let mut g = Graph::new();
    let nan = g.add_const(Scalar::F(f64::NAN), DType::F32, s(&[2]));
    let one = g.add_const(Scalar::F(1.0), DType::F32, s(&[2]));
    let zero = g.add_const(Scalar::F(0.0), DType::F32, s(&[2]));
    let nz = g.add_const(Scalar::F(-0.0), DType::F32, s(&[2]));
    let max = g.op(Op::Binary(BinaryOp::Max), &[nan, one]);
    let pow0 = g.op(Op::Binary(BinaryOp::Pow), &[nan, zero]);
    let min0 = g.op(Op::Binary(BinaryOp::Min), &[zero, nz]);
    let sum0 = g.op(Op::Binary(BinaryOp::Add), &[nz, zero]);
    let div = g.op(Op::Binary(BinaryOp::Div), &[one, nz]);
    let relu = g.op(Op::Unary(UnaryOp::Relu), &[nz]);
    for o in [max, pow0, min0, sum0, div, relu] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn casts_of_constants() {
    let mut g = Graph::new();
    let v = g.add_const(Scalar::F(-3.7), DType::F64, s(&[2]));
    let to_i32 = g.op(Op::Cast { to: DType::I32 }, &[v]);
    let nan = g.add_const(Scalar::F(f64::NAN), DType::F64, s(&[2]));
    let nan_i = g.op(Op::Cast { to: DType::I64 }, &[nan]);
    let big = g.add_const(Scalar::F(1e10), DType::F64, s(&[2]));
    let big_i = g.op(Op::Cast { to: DType::I32 }, &[big]);
    let h = g.add_const(Scalar::F(70000.0), DType::F32, s(&[2]));
    let h16 = g.op(Op::Cast { to: DType::F16 }, &[h]);
    let t = g.add_const(Scalar::B(true), DType::Bool, s(&[2]));
    let t32 = g.op(Op::Cast { to: DType::F32 }, &[t]);
    let i = g.add_const(Scalar::I((1 << 53) + 1), DType::I64, s(&[2]));
    let i64_f32 = g.op(Op::Cast { to: DType::F32 }, &[i]);
    for o in [to_i32, nan_i, big_i, h16, t32, i64_f32] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn where_and_views_of_constants() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[2, 3]));
    let c = g.add_const(Scalar::F(1.5), DType::F32, Shape::scalar());
    let b = g.op(Op::View(ViewOp::BroadcastTo(s(&[2, 3]))), &[c]);
    let r = g.op(Op::View(ViewOp::Reshape(s(&[3, 2]))), &[b]);
    let p = g.op(Op::View(ViewOp::Permute(vec![1, 0])), &[r]);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[x, p]);
    let t = g.add_const(Scalar::B(false), DType::Bool, s(&[2, 3]));
    let w = g.op(Op::Where, &[t, p, b]);
    g.add_output(y);
    g.add_output(w);
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn only_order_independent_reductions_fold() {
    let mut g = Graph::new();
    let f = g.add_const(Scalar::F(0.1), DType::F32, s(&[3, 5]));
    let red = |g: &mut Graph, op, src| {
        g.op(
            Op::Reduce {
                op,
                axes: vec![1],
                keepdims: false,
            },
            &[src],
        )
    };
    let max = red(&mut g, ReduceOp::Max, f);
    let mean = red(&mut g, ReduceOp::Mean, f);
    // Not folded: sums and products round by order on real backends.
    let sum = red(&mut g, ReduceOp::Sum, f);
    let prod = red(&mut g, ReduceOp::Prod, f);
    // Not folded: a mean of -0s is +0 (the accumulator starts at +0).
    let nz = g.add_const(Scalar::F(-0.0), DType::F32, s(&[3, 5]));
    let mean_nz = red(&mut g, ReduceOp::Mean, nz);
    // Not folded: an f64 sum of copies can round or overflow.
    let d = g.add_const(Scalar::F(1e308), DType::F64, s(&[3, 5]));
    let mean_d = red(&mut g, ReduceOp::Mean, d);
    let i = g.add_const(Scalar::I(-4), DType::I32, s(&[3, 5]));
    let min_i = red(&mut g, ReduceOp::Min, i);
    let nan = g.add_const(Scalar::F(f64::NAN), DType::F64, s(&[3, 5]));
    let arg = g.op(
        Op::ArgReduce {
            op: ArgReduceOp::ArgMax,
            axis: 0,
            keepdims: true,
        },
        &[nan],
    );
    for o in [max, mean, sum, prod, mean_nz, mean_d, min_i, arg] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Fold, &g));
}

#[test]
fn nothing_to_fold_is_unchanged() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[4]));
    let c = g.add_const(Scalar::F(2.0), DType::F32, s(&[4]));
    let y = g.op(Op::Binary(BinaryOp::Mul), &[x, c]);
    g.add_output(y);
    let (_, changed) = run_pass(&Fold, &g);
    assert!(!changed);
}
