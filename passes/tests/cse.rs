//! Before/after snapshots of common subexpression elimination, each checked with the
//! interpreter.

mod common;

use common::{before_after, run_pass, Build};
use ndfuse_ir::{BinaryOp, DType, Graph, Op, Scalar, Shape, UnaryOp, ViewOp};
use ndfuse_passes::Cse;

fn s(d: &[usize]) -> Shape {
    Shape::new(d.to_vec())
}

#[test]
fn duplicate_expressions_merge_bottom_up() {
    // (exp(x) * y + 2) computed twice, with its constants written twice.
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[4]));
    let y = g.add_input("y", DType::F32, s(&[4]));
    let mut outs = Vec::new();
    for _ in 0..2 {
        let e = g.op(Op::Unary(UnaryOp::Exp), &[x]);
        let m = g.op(Op::Binary(BinaryOp::Mul), &[e, y]);
        let two = g.add_const(Scalar::F(2.0), DType::F32, s(&[4]));
        outs.push(g.op(Op::Binary(BinaryOp::Add), &[m, two]));
    }
    let both = g.op(Op::Binary(BinaryOp::Sub), &[outs[0], outs[1]]);
    g.add_output(outs[0]);
    g.add_output(outs[1]);
    g.add_output(both);
    insta::assert_snapshot!(before_after(&Cse, &g));
}

#[test]
fn constants_merge_only_when_bitwise_equal() {
    let mut g = Graph::new();
    let mut outs = Vec::new();
    let consts = [
        (Scalar::F(0.0), DType::F32, s(&[2])),
        (Scalar::F(-0.0), DType::F32, s(&[2])), // not +0
        (Scalar::F(0.0), DType::F64, s(&[2])),  // another dtype
        (Scalar::F(0.0), DType::F32, s(&[3])),  // another shape
        (Scalar::F(f64::NAN), DType::F32, s(&[2])),
        (Scalar::F(f64::NAN), DType::F32, s(&[2])), // the same NaN
        (Scalar::F(0.0), DType::F32, s(&[2])),      // the first one again
    ];
    for (v, d, sh) in consts {
        outs.push(g.add_const(v, d, sh));
    }
    for o in outs {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Cse, &g));
}

#[test]
fn views_and_attributes_distinguish_nodes() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[2, 3]));
    let a = g.op(Op::View(ViewOp::Permute(vec![1, 0])), &[x]);
    let b = g.op(Op::View(ViewOp::Permute(vec![1, 0])), &[x]);
    let c = g.op(Op::View(ViewOp::Reshape(s(&[3, 2]))), &[x]); // same shape, other op
    let i = g.op(Op::Cast { to: DType::I32 }, &[x]);
    let j = g.op(Op::Cast { to: DType::I64 }, &[x]);
    for o in [a, b, c, i, j] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Cse, &g));
}

#[test]
fn inputs_are_never_merged_and_nothing_else_is_unchanged() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[4]));
    let y = g.add_input("y", DType::F32, s(&[4]));
    let a = g.op(Op::Binary(BinaryOp::Add), &[x, y]);
    let b = g.op(Op::Binary(BinaryOp::Add), &[y, x]); // not commuted: a different node
    g.add_output(a);
    g.add_output(b);
    let (_, changed) = run_pass(&Cse, &g);
    assert!(!changed);
}
