//! Before/after snapshots of reshapes of products moving below their element-wise
//! readers, each checked with the interpreter (same bits, verified, idempotent).

mod common;

use common::{run_pass, Build};
use ndfuse_ir::{BinaryOp, DType, Graph, NodeId, Op, Scalar, Shape, UnaryOp, ViewOp};
use ndfuse_passes::SinkReshapes;

fn s(d: &[usize]) -> Shape {
    Shape::new(d.to_vec())
}

fn view(g: &mut Graph, v: ViewOp, x: NodeId) -> NodeId {
    g.op(Op::View(v), &[x])
}

/// A convolution's product `[N, O, H * W]`, reshaped to NCHW.
fn product(g: &mut Graph) -> NodeId {
    let w = g.add_input("w", DType::F32, s(&[4, 6]));
    let cols = g.add_input("cols", DType::F32, s(&[2, 6, 12]));
    let p = g.op(Op::MatMul, &[w, cols]);
    view(g, ViewOp::Reshape(s(&[2, 4, 3, 4])), p)
}

#[test]
fn a_convolutions_epilogue_moves_onto_the_products_shape() {
    let mut g = Graph::new();
    let y = product(&mut g);
    // + bias[O] (broadcast from [O, 1, 1]), relu, * 0.5, + a residual [N, O, H, W].
    let b = g.add_input("b", DType::F32, s(&[4, 1, 1]));
    let b = view(&mut g, ViewOp::BroadcastTo(s(&[2, 4, 3, 4])), b);
    let y = g.op(Op::Binary(BinaryOp::Add), &[y, b]);
    let y = g.op(Op::Unary(UnaryOp::Relu), &[y]);
    let half = g.add_const(Scalar::F(0.5), DType::F32, s(&[2, 4, 3, 4]));
    let y = g.op(Op::Binary(BinaryOp::Mul), &[y, half]);
    let skip = g.add_input("skip", DType::F32, s(&[2, 4, 3, 4]));
    let y = g.op(Op::Binary(BinaryOp::Add), &[y, skip]);
    // Read by a sum over the spatial axes (not element-wise: the reshape stays above it).
    let y = g.op(
        Op::Reduce {
            op: ndfuse_ir::ReduceOp::Sum,
            axes: vec![2, 3],
            keepdims: false,
        },
        &[y],
    );
    g.add_output(y);
    let (text, changed) = run_pass(&SinkReshapes, &g);
    assert!(changed);
    insta::assert_snapshot!(text);
}

#[test]
fn a_broadcast_the_reshape_cannot_carry_keeps_the_op_below_it() {
    // A per-column value [1, 1, 1, W] is neither whole nor ones on the merged H * W.
    let mut g = Graph::new();
    let y = product(&mut g);
    let c = g.add_input("c", DType::F32, s(&[1, 1, 1, 4]));
    let c = view(&mut g, ViewOp::BroadcastTo(s(&[2, 4, 3, 4])), c);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[y, c]);
    g.add_output(y);
    let (_, changed) = run_pass(&SinkReshapes, &g);
    assert!(!changed);
}

#[test]
fn an_output_moves_above_its_reshape_too() {
    // The reshape becomes the output: the product's buffer under the output's shape.
    let mut g = Graph::new();
    let y = product(&mut g);
    let y = g.op(Op::Unary(UnaryOp::Relu), &[y]);
    g.add_output(y);
    let (text, changed) = run_pass(&SinkReshapes, &g);
    assert!(changed);
    assert!(
        text.ends_with("%6 = reshape %5, [2,4,3,4] : f32[2,4,3,4]\nreturn %6\n"),
        "{text}"
    );
}

#[test]
fn a_reshape_of_a_plain_input_stays() {
    // Not a product's value: nothing to join.
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, s(&[2, 12]));
    let y = view(&mut g, ViewOp::Reshape(s(&[2, 3, 4])), x);
    let y = g.op(Op::Unary(UnaryOp::Exp), &[y]);
    g.add_output(y);
    let (_, changed) = run_pass(&SinkReshapes, &g);
    assert!(!changed);
}
