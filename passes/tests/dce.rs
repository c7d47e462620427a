//! Before/after snapshots of dead code elimination, checked with the interpreter.

mod common;

use common::{before_after, run_pass, Build};
use ndfuse_ir::{BinaryOp, DType, Graph, Op, Scalar, Shape, UnaryOp};
use ndfuse_passes::Dce;

#[test]
fn dead_nodes_go_and_inputs_stay() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([4]));
    let unused = g.add_input("unused", DType::F32, Shape::new([4]));
    let dead = g.op(Op::Unary(UnaryOp::Exp), &[unused]);
    let c = g.add_const(Scalar::F(3.0), DType::F32, Shape::new([4]));
    let _dead2 = g.op(Op::Binary(BinaryOp::Mul), &[dead, c]);
    let live = g.op(Op::Unary(UnaryOp::Neg), &[x]);
    let _dead3 = g.op(Op::Unary(UnaryOp::Sqrt), &[live]);
    g.add_output(live);
    insta::assert_snapshot!(before_after(&Dce, &g));
}

#[test]
fn a_graph_without_dead_nodes_is_unchanged() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([4]));
    let y = g.op(Op::Unary(UnaryOp::Neg), &[x]);
    g.add_output(y);
    g.add_output(x);
    let (_, changed) = run_pass(&Dce, &g);
    assert!(!changed);
}
