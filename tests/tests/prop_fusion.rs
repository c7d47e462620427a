//! Property test of the whole pipeline: random graphs with element-wise ops, reductions
//! over either axis (kept and broadcast back, as softmax and layernorm do), transposes and
//! diamonds go through the clean-up passes, fusion and plan choice; every kernel of the
//! resulting schedule is then evaluated by the reference interpreter (`eval_kernel`), and
//! the outputs must equal the unfused graph evaluated node by node.
//!
//! Tolerance (f64 graphs): rtol 1e-9, atol 1e-9. Element-wise steps round identically;
//! the differences come from composite reductions lowered to steps that each round
//! (mean = sum / n rounds twice; variance goes through the rounded mean), a few ulp of
//! values of order 1.

use ndfuse_ir::interp::{eval, eval_kernel};
use ndfuse_ir::{
    BinaryOp, DType, Graph, HostArray, NodeId, Op, ReduceOp, Shape, Storage, UnaryOp, ViewOp,
};
use ndfuse_passes::{optimize, schedule, PassOptions, Step};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
enum Gen {
    Unary(usize, usize),
    Binary(usize, usize, usize),
    RowReduce(usize, usize, usize),
    Transpose(usize),
}

const UNARY: [UnaryOp; 7] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Tanh,
    UnaryOp::Sin,
    UnaryOp::Sigmoid,
    UnaryOp::Square,
    UnaryOp::Relu,
];
const BINARY: [BinaryOp; 5] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Max,
    BinaryOp::Min,
];
const REDUCE: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Mean,
    ReduceOp::Var,
];

fn gen_step() -> impl Strategy<Value = Gen> {
    let i = 0..64usize;
    prop_oneof![
        (0..UNARY.len(), i.clone()).prop_map(|(o, a)| Gen::Unary(o, a)),
        (0..BINARY.len(), i.clone(), i.clone()).prop_map(|(o, a, b)| Gen::Binary(o, a, b)),
        (0..REDUCE.len(), i.clone(), 0..2usize).prop_map(|(o, a, ax)| Gen::RowReduce(o, a, ax)),
        i.prop_map(Gen::Transpose),
    ]
}

/// A random graph over [r, c] f64 values, its input data, and its outputs.
fn build(
    r: usize,
    c: usize,
    n_inputs: usize,
    steps: &[Gen],
    seed: u64,
) -> (Graph, HashMap<NodeId, HostArray>) {
    let mut g = Graph::new();
    let mut data = HashMap::new();
    let full = Shape::new([r, c]);
    let mut vals: Vec<NodeId> = Vec::new();
    let mut state = seed | 1;
    for k in 0..n_inputs {
        let id = g.add_input(format!("x{k}"), DType::F64, full.clone());
        let xs: Vec<f64> = (0..r * c)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
            })
            .collect();
        data.insert(
            id,
            HostArray::new(full.clone(), Storage::F64(xs)).expect("r * c values"),
        );
        vals.push(id);
    }
    for s in steps {
        let n = vals.len();
        let v = |i: usize| vals[i % n];
        let id = match *s {
            Gen::Unary(o, a) => g.add(Op::Unary(UNARY[o]), &[v(a)]),
            Gen::Binary(o, a, b) => g.add(Op::Binary(BINARY[o]), &[v(a), v(b)]),
            Gen::RowReduce(o, a, axis) => {
                // Reducing zero elements has no identity for max/min: use sum there.
                let empty = [r, c][axis] == 0;
                let op = if empty { ReduceOp::Sum } else { REDUCE[o] };
                let red = g
                    .add(
                        Op::Reduce {
                            op,
                            axes: vec![axis],
                            keepdims: true,
                        },
                        &[v(a)],
                    )
                    .expect("valid reduction");
                g.add(Op::View(ViewOp::BroadcastTo(full.clone())), &[red])
            }
            Gen::Transpose(a) if r == c => g.add(Op::View(ViewOp::Permute(vec![1, 0])), &[v(a)]),
            Gen::Transpose(a) => g.add(Op::Unary(UnaryOp::Neg), &[v(a)]),
        }
        .expect("valid op");
        vals.push(id);
    }
    let last = *vals.last().expect("at least one value");
    g.add_output(last);
    g.add_output(vals[vals.len() / 2]);
    let total = g
        .add(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keepdims: false,
            },
            &[last],
        )
        .expect("row sums");
    g.add_output(total);
    (g, data)
}

/// Runs the schedule's kernels in order with the interpreter.
fn run_schedule(g: &Graph, inputs: &HashMap<NodeId, HostArray>) -> Vec<HostArray> {
    let s = schedule(g);
    let mut bufs: HashMap<NodeId, HostArray> = inputs.clone();
    for step in &s.steps {
        let Step::Kernel {
            kernel,
            inputs,
            outputs,
        } = step
        else {
            panic!("fusion leaves no node to the interpreter")
        };
        let args: Vec<&HostArray> = inputs.iter().map(|n| &bufs[n]).collect();
        let outs = eval_kernel(kernel, &args).unwrap_or_else(|e| panic!("{e}\n{kernel}"));
        for (&n, a) in outputs.iter().zip(outs) {
            let a = a
                .reshaped(g.node(n).shape.clone())
                .expect("a kernel output holds its node");
            bufs.insert(n, a);
        }
    }
    // An output may be another node's buffer under its own shape (`Placement::Alias`).
    g.outputs()
        .iter()
        .map(|o| {
            bufs[&s.output_buffer(*o)]
                .clone()
                .reshaped(g.node(*o).shape.clone())
                .expect("an output holds its node's elements")
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_fused_planned_pipeline_equals_the_unfused_graph(
        r in 0usize..6,
        c in 0usize..6,
        n_inputs in 1usize..4,
        steps in prop::collection::vec(gen_step(), 1..12),
        seed in any::<u64>(),
    ) {
        let (g, inputs) = build(r, c, n_inputs, &steps, seed);
        let want = eval(&g, &inputs).expect("reference evaluates");
        let mut opt = g.clone();
        optimize(&mut opt, &PassOptions::default()).expect("passes succeed");
        let got = run_schedule(&opt, &inputs);
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            prop_assert_eq!(a.shape(), b.shape());
            for (i, (x, y)) in a.to_f64s().into_iter().zip(b.to_f64s()).enumerate() {
                let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-9 + 1e-9 * y.abs();
                prop_assert!(ok, "output {} element {}: {} vs reference {}\n{}", k, i, x, y, schedule(&opt).to_text(&opt));
            }
        }
    }
}
