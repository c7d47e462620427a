//! A property test: random graphs of differentiable ops (element-wise chains, shared
//! subexpressions, broadcast reductions, reversing slices, matmuls) differentiated
//! with respect to all their inputs agree with central finite differences (step and
//! tolerance in `common`).

mod common;

use common::{Case, Rng};
use ndfuse_ir::{AxisSlice, BinaryOp, NodeId, Op, ReduceOp, UnaryOp, ViewOp};
use proptest::prelude::*;

/// Builds a random graph of `steps` ops over `[m, n]` values and checks its gradient.
fn random_graph(seed: u64, steps: usize, m: usize, n: usize) {
    let mut rng = Rng(seed | 1);
    let mut c = Case::new();
    let mut inputs = Vec::new();
    let mut vals: Vec<NodeId> = Vec::new();
    for _ in 0..2 {
        let x = c.input(&[m, n], || rng.uniform(-1.5, 1.5));
        inputs.push(x);
        vals.push(x);
    }
    let row = c.input(&[n], || rng.uniform(-1.5, 1.5));
    inputs.push(row);
    vals.push(c.bcast(row, &[m, n]));
    let w = c.input(&[n, n], || rng.uniform(-0.7, 0.7));
    inputs.push(w);
    for _ in 0..steps {
        let a = vals[rng.below(vals.len())];
        let b = vals[rng.below(vals.len())];
        let v = match rng.below(6) {
            0 => {
                let u = [
                    UnaryOp::Sin,
                    UnaryOp::Cos,
                    UnaryOp::Tanh,
                    UnaryOp::Sigmoid,
                    UnaryOp::Erf,
                    UnaryOp::Neg,
                ][rng.below(6)];
                c.un(u, a)
            }
            1 => {
                let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max][rng.below(4)];
                c.bin(op, a, b)
            }
            2 => {
                // a / (2 + sin b): a denominator in [1, 3]
                let s = c.un(UnaryOp::Sin, b);
                let two = c.g.add_const(
                    ndfuse_ir::Scalar::F(2.0),
                    ndfuse_ir::DType::F64,
                    ndfuse_ir::Shape::new([m, n]),
                );
                let d = c.bin(BinaryOp::Add, s, two);
                c.bin(BinaryOp::Div, a, d)
            }
            3 => {
                let r = [
                    ReduceOp::Sum,
                    ReduceOp::Mean,
                    ReduceOp::Max,
                    ReduceOp::Var,
                    ReduceOp::Norm2,
                ][rng.below(5)];
                let axis = rng.below(2);
                let red = c.reduce(r, a, &[axis], true);
                let red = c.bcast(red, &[m, n]);
                c.bin(BinaryOp::Add, a, red)
            }
            4 => c.view(
                ViewOp::Slice(vec![
                    AxisSlice::full(m),
                    AxisSlice {
                        start: n as i64 - 1,
                        step: -1,
                        len: n,
                    },
                ]),
                a,
            ),
            _ => c.op(Op::MatMul, &[a, w]),
        };
        vals.push(v);
    }
    let last = vals[vals.len() - 1];
    let l = c.weighted_loss(last, &mut rng);
    c.check(
        &format!("random graph (seed {seed}, {steps} ops, [{m},{n}])"),
        l,
        &inputs,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_graphs_of_differentiable_ops(seed in any::<u64>(), steps in 1usize..10, m in 1usize..4, n in 1usize..4) {
        random_graph(seed, steps, m, n);
    }
}
