//! Before/after snapshots of view collapsing, each checked with the interpreter.

mod common;

use common::{before_after, run_pass, Build};
use ndfuse_ir::{AxisSlice, DType, Graph, NodeId, Op, Shape, UnaryOp, ViewOp};
use ndfuse_passes::Views;

fn s(d: &[usize]) -> Shape {
    Shape::new(d.to_vec())
}

fn view(g: &mut Graph, v: ViewOp, x: NodeId) -> NodeId {
    g.op(Op::View(v), &[x])
}

fn sl(start: i64, step: i64, len: usize) -> AxisSlice {
    AxisSlice { start, step, len }
}

#[test]
fn reshape_chains_become_one_reshape() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[2, 3, 4]));
    let a = view(&mut g, ViewOp::Reshape(s(&[6, 4])), x);
    let b = view(&mut g, ViewOp::Reshape(s(&[24])), a);
    let c = view(&mut g, ViewOp::Reshape(s(&[4, 6])), b);
    // Back to the original shape: no view at all.
    let d = view(&mut g, ViewOp::Reshape(s(&[2, 3, 4])), c);
    let e = g.op(Op::Unary(UnaryOp::Exp), &[d]);
    g.add_output(c);
    g.add_output(e);
    insta::assert_snapshot!(before_after(&Views, &g));
}

#[test]
fn expand_dims_and_squeeze_fold_into_reshape_or_cancel() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[3, 4]));
    let a = view(&mut g, ViewOp::ExpandDims(1), x);
    let r = view(&mut g, ViewOp::Reshape(s(&[12])), a);
    let b = view(&mut g, ViewOp::ExpandDims(0), x);
    let back = view(&mut g, ViewOp::Squeeze(vec![0]), b);
    let y = g.add_input("y", DType::F32, s(&[3, 1, 4]));
    let q = view(&mut g, ViewOp::Squeeze(vec![1]), y);
    let q2 = view(&mut g, ViewOp::ExpandDims(1), q);
    let none = view(&mut g, ViewOp::Squeeze(vec![]), x);
    for o in [r, back, q2, none] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Views, &g));
}

#[test]
fn permutes_compose() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F64, s(&[2, 3, 4]));
    let a = view(&mut g, ViewOp::Permute(vec![2, 0, 1]), x);
    let b = view(&mut g, ViewOp::Permute(vec![1, 2, 0]), a); // undoes a
    let c = view(&mut g, ViewOp::Permute(vec![0, 2, 1]), a);
    let t = view(&mut g, ViewOp::Permute(vec![1, 0, 2]), x);
    let tt = view(&mut g, ViewOp::Permute(vec![1, 0, 2]), t);
    let id = view(&mut g, ViewOp::Permute(vec![0, 1, 2]), x);
    for o in [b, c, tt, id] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Views, &g));
}

#[test]
fn slices_compose_with_steps_and_reversal() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::I32, s(&[10, 6]));
    // x[1:9:2, ::-1] then [::-1, 1:5:2] of that, then [1:, :] of that
    let a = view(&mut g, ViewOp::Slice(vec![sl(1, 2, 4), sl(5, -1, 6)]), x);
    let b = view(&mut g, ViewOp::Slice(vec![sl(3, -1, 4), sl(1, 2, 2)]), a);
    let c = view(&mut g, ViewOp::Slice(vec![sl(1, 1, 3), sl(0, 1, 2)]), b);
    // A full slice is no view; an empty slice of a slice stays empty.
    let full = view(&mut g, ViewOp::Slice(vec![sl(0, 1, 10), sl(0, 1, 6)]), x);
    let empty = view(&mut g, ViewOp::Slice(vec![sl(0, 1, 0), sl(0, 3, 2)]), a);
    // Reversing twice is the identity.
    let r = view(&mut g, ViewOp::Slice(vec![sl(9, -1, 10), sl(0, 1, 6)]), x);
    let rr = view(&mut g, ViewOp::Slice(vec![sl(9, -1, 10), sl(0, 1, 6)]), r);
    for o in [c, full, empty, rr] {
        g.add_output(o);
    }
    insta::assert_snapshot!(before_after(&Views, &g));
}

#[test]
fn broadcasts_compose() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[3, 1]));
    let a = view(&mut g, ViewOp::BroadcastTo(s(&[3, 4])), x);
    let b = view(&mut g, ViewOp::BroadcastTo(s(&[2, 3, 4])), a);
    let same = view(&mut g, ViewOp::BroadcastTo(s(&[3, 1])), x);
    g.add_output(b);
    g.add_output(same);
    insta::assert_snapshot!(before_after(&Views, &g));
}

#[test]
fn mixed_chains_are_left_to_fusion() {
    // permute(reshape x) and slice(broadcast x) are not merged here: fusion composes
    // them into one index map when it builds loads.
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[6, 4]));
    let r = view(&mut g, ViewOp::Reshape(s(&[2, 3, 4])), x);
    let p = view(&mut g, ViewOp::Permute(vec![2, 1, 0]), r);
    let b = view(&mut g, ViewOp::BroadcastTo(s(&[5, 6, 4])), x);
    let c = view(
        &mut g,
        ViewOp::Slice(vec![sl(0, 2, 3), sl(0, 1, 6), sl(0, 1, 4)]),
        b,
    );
    g.add_output(p);
    g.add_output(c);
    let (_, changed) = run_pass(&Views, &g);
    assert!(!changed);
}
