//! Property test: random small graphs full of constants, duplicates, double negations,
//! cast chains and view chains. The pipeline (and each pass alone) must keep every
//! output bit-for-bit under the interpreter, leave a graph that verifies, and be
//! idempotent.

mod common;

use common::{assert_same, inputs_for};
use ndfuse_ir::interp::eval;
use ndfuse_ir::{
    verify, ArgReduceOp, AxisSlice, BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, Shape,
    UnaryOp, ViewOp,
};
use ndfuse_passes::{optimize, pipeline, PassCx, PassOptions};
use proptest::prelude::*;

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::Bool,
];

const FLOAT_CONSTS: [f64; 10] = [
    1.0,
    0.0,
    -0.0,
    f64::NAN,
    f64::INFINITY,
    2.0,
    -1.5,
    0.1,
    -1.0,
    1e308,
];

const INT_CONSTS: [i64; 7] = [0, 1, -1, 2, i32::MAX as i64, i64::MIN, 7];

const UNARY: [UnaryOp; 8] = [
    UnaryOp::Neg,
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Not,
    UnaryOp::Exp,
    UnaryOp::Sqrt,
    UnaryOp::Relu,
    UnaryOp::Sign,
];

const BINARY: [BinaryOp; 10] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Lt,
    BinaryOp::Eq,
    BinaryOp::And,
];

const REDUCE: [ReduceOp; 5] = [
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Mean,
    ReduceOp::Sum,
    ReduceOp::Prod,
];

/// One construction step; every index is taken modulo what it indexes, and a step that
/// builds an illegal node is skipped.
#[derive(Clone, Debug)]
enum Step {
    Input(usize),
    Const(usize, usize, bool),
    Unary(usize, usize),
    /// The same unary op twice (double negations and friends).
    UnaryTwice(usize, usize),
    /// `op(a, b)` with `b` among the nodes of `a`'s type.
    Binary(usize, usize, usize),
    /// `op(a, c)` or `op(c, a)` with `c` a constant of `a`'s type.
    BinaryConst(usize, usize, usize, bool),
    Where(usize, usize, usize),
    Cast(usize, usize),
    CastTwice(usize, usize, usize),
    /// A structural duplicate of an existing node.
    Dup(usize),
    Reshape(usize, usize),
    Permute(usize),
    Slice(usize, usize),
    Broadcast(usize),
    ExpandDims(usize, usize),
    Squeeze(usize),
    Reduce(usize, usize, usize, bool),
    ArgMax(usize, usize),
    Output(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let i = || 0usize..64;
    prop_oneof![
        1 => i().prop_map(Step::Input),
        2 => (i(), i(), any::<bool>()).prop_map(|(a, b, c)| Step::Const(a, b, c)),
        2 => (i(), i()).prop_map(|(a, b)| Step::Unary(a, b)),
        2 => (i(), i()).prop_map(|(a, b)| Step::UnaryTwice(a, b)),
        3 => (i(), i(), i()).prop_map(|(a, b, c)| Step::Binary(a, b, c)),
        3 => (i(), i(), i(), any::<bool>()).prop_map(|(a, b, c, d)| Step::BinaryConst(a, b, c, d)),
        1 => (i(), i(), i()).prop_map(|(a, b, c)| Step::Where(a, b, c)),
        1 => (i(), i()).prop_map(|(a, b)| Step::Cast(a, b)),
        2 => (i(), i(), i()).prop_map(|(a, b, c)| Step::CastTwice(a, b, c)),
        2 => i().prop_map(Step::Dup),
        1 => (i(), i()).prop_map(|(a, b)| Step::Reshape(a, b)),
        1 => i().prop_map(Step::Permute),
        1 => (i(), i()).prop_map(|(a, b)| Step::Slice(a, b)),
        1 => i().prop_map(Step::Broadcast),
        1 => (i(), i()).prop_map(|(a, b)| Step::ExpandDims(a, b)),
        1 => i().prop_map(Step::Squeeze),
        1 => (i(), i(), i(), any::<bool>()).prop_map(|(a, b, c, d)| Step::Reduce(a, b, c, d)),
        1 => (i(), i()).prop_map(|(a, b)| Step::ArgMax(a, b)),
        1 => i().prop_map(Step::Output),
    ]
}

fn const_value(dtype: DType, k: usize) -> Scalar {
    match dtype {
        d if d.is_float() => Scalar::F(FLOAT_CONSTS[k % FLOAT_CONSTS.len()]),
        d if d.is_int() => Scalar::I(INT_CONSTS[k % INT_CONSTS.len()]),
        _ => Scalar::B(k.is_multiple_of(2)),
    }
}

/// Builds the graph a list of steps describes.
fn build(steps: &[Step]) -> Graph {
    let mut g = Graph::new();
    let base = Shape::new([2, 3]);
    let x = g.add_input("in0", DType::F32, base.clone());
    let mut nodes: Vec<NodeId> = vec![x];
    let mut inputs = 1;
    for s in steps {
        let pick = |k: usize| nodes[k % nodes.len()];
        let made: Option<NodeId> = match *s {
            Step::Input(d) => {
                let n = g.add_input(
                    format!("in{inputs}"),
                    DTYPES[d % DTYPES.len()],
                    base.clone(),
                );
                inputs += 1;
                Some(n)
            }
            Step::Const(d, k, scalar) => {
                let dtype = DTYPES[d % DTYPES.len()];
                let v = const_value(dtype, k);
                if scalar {
                    let c = g.add_const(v, dtype, Shape::scalar());
                    g.add(Op::View(ViewOp::BroadcastTo(base.clone())), &[c])
                        .ok()
                } else {
                    Some(g.add_const(v, dtype, base.clone()))
                }
            }
            Step::Unary(u, a) => g.add(Op::Unary(UNARY[u % UNARY.len()]), &[pick(a)]).ok(),
            Step::UnaryTwice(u, a) => {
                let op = Op::Unary(UNARY[u % UNARY.len()]);
                g.add(op.clone(), &[pick(a)])
                    .and_then(|n| g.add(op, &[n]))
                    .ok()
            }
            Step::Binary(b, a, k) => {
                let a = pick(a);
                let same: Vec<NodeId> = nodes
                    .iter()
                    .copied()
                    .filter(|&n| g.ty(n) == g.ty(a))
                    .collect();
                let other = same[k % same.len()];
                g.add(Op::Binary(BINARY[b % BINARY.len()]), &[a, other])
                    .ok()
            }
            Step::BinaryConst(b, a, k, first) => {
                let a = pick(a);
                let n = g.node(a);
                let (dtype, shape) = (n.dtype, n.shape.clone());
                let c = g.add_const(const_value(dtype, k), dtype, shape);
                let ops = if first { [c, a] } else { [a, c] };
                g.add(Op::Binary(BINARY[b % BINARY.len()]), &ops).ok()
            }
            Step::Where(c, a, b) => {
                let (c, a) = (pick(c), pick(a));
                let same: Vec<NodeId> = nodes
                    .iter()
                    .copied()
                    .filter(|&n| g.ty(n) == g.ty(a))
                    .collect();
                let b = same[b % same.len()];
                g.add(Op::Where, &[c, a, b]).ok()
            }
            Step::Cast(a, d) => g
                .add(
                    Op::Cast {
                        to: DTYPES[d % DTYPES.len()],
                    },
                    &[pick(a)],
                )
                .ok(),
            Step::CastTwice(a, d, e) => {
                let a = pick(a);
                let back = if e % 2 == 0 {
                    g.node(a).dtype
                } else {
                    DTYPES[e % DTYPES.len()]
                };
                g.add(
                    Op::Cast {
                        to: DTYPES[d % DTYPES.len()],
                    },
                    &[a],
                )
                .and_then(|n| g.add(Op::Cast { to: back }, &[n]))
                .ok()
            }
            Step::Dup(a) => {
                let a = pick(a);
                let node = g.node(a).clone();
                match node.op {
                    Op::Input { .. } => None,
                    Op::Const { value } => Some(g.add_const(value, node.dtype, node.shape)),
                    op => {
                        let operands = g.operands(a);
                        g.add(op, &operands).ok()
                    }
                }
            }
            Step::Reshape(a, k) => {
                let targets: [&[usize]; 6] = [&[6], &[3, 2], &[2, 3], &[1, 6], &[2, 3, 1], &[6, 1]];
                let to = Shape::new(targets[k % targets.len()].to_vec());
                g.add(Op::View(ViewOp::Reshape(to)), &[pick(a)]).ok()
            }
            Step::Permute(a) => {
                let a = pick(a);
                let rank = g.node(a).shape.rank();
                let perm: Vec<usize> = (0..rank).rev().collect();
                g.add(Op::View(ViewOp::Permute(perm)), &[a]).ok()
            }
            Step::Slice(a, k) => {
                let a = pick(a);
                let dims = g.node(a).shape.dims().to_vec();
                let slices = dims
                    .iter()
                    .enumerate()
                    .map(|(axis, &d)| match (k >> (2 * axis)) % 4 {
                        0 => Some(AxisSlice::full(d)),
                        1 => AxisSlice::normalize(d, None, None, -1),
                        2 => AxisSlice::normalize(d, Some(1), None, 1),
                        _ => AxisSlice::normalize(d, None, None, 2),
                    })
                    .collect::<Option<Vec<_>>>();
                slices.and_then(|s| g.add(Op::View(ViewOp::Slice(s)), &[a]).ok())
            }
            Step::Broadcast(a) => {
                let a = pick(a);
                let mut to = vec![2];
                to.extend(
                    g.node(a)
                        .shape
                        .dims()
                        .iter()
                        .map(|&d| if d == 1 { 2 } else { d }),
                );
                g.add(Op::View(ViewOp::BroadcastTo(Shape::new(to))), &[a])
                    .ok()
            }
            Step::ExpandDims(a, k) => {
                let a = pick(a);
                let axis = k % (g.node(a).shape.rank() + 1);
                g.add(Op::View(ViewOp::ExpandDims(axis)), &[a]).ok()
            }
            Step::Squeeze(a) => {
                let a = pick(a);
                let ones: Vec<usize> = g
                    .node(a)
                    .shape
                    .dims()
                    .iter()
                    .enumerate()
                    .filter(|&(_, &d)| d == 1)
                    .map(|(i, _)| i)
                    .collect();
                g.add(Op::View(ViewOp::Squeeze(ones)), &[a]).ok()
            }
            Step::Reduce(a, r, mask, keepdims) => {
                let a = pick(a);
                let rank = g.node(a).shape.rank();
                let axes: Vec<usize> = (0..rank).filter(|i| mask >> i & 1 == 1).collect();
                let op = REDUCE[r % REDUCE.len()];
                g.add(Op::Reduce { op, axes, keepdims }, &[a]).ok()
            }
            Step::ArgMax(a, k) => {
                let a = pick(a);
                let rank = g.node(a).shape.rank();
                (rank > 0)
                    .then(|| {
                        let op = Op::ArgReduce {
                            op: ArgReduceOp::ArgMax,
                            axis: k % rank,
                            keepdims: false,
                        };
                        g.add(op, &[a]).ok()
                    })
                    .flatten()
            }
            Step::Output(a) => {
                g.add_output(pick(a));
                None
            }
        };
        nodes.extend(made);
    }
    // Every value nobody uses is an output, so most of the graph is live and every
    // pass has work on it (not only DCE).
    for n in g.node_ids() {
        if g.users(n).is_empty() && !g.node(n).op.is_input() {
            g.add_output(n);
        }
    }
    let last = *nodes.last().expect("the first input is a node");
    g.add_output(last);
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn optimize_keeps_every_output_bit_for_bit(steps in proptest::collection::vec(step(), 1..30)) {
        let g = build(&steps);
        prop_assert!(verify(&g).is_ok());
        let inputs = inputs_for(&g);
        let want = eval(&g, &inputs).expect("a built graph evaluates");

        // Each pass alone.
        for pass in pipeline() {
            let mut h = g.clone();
            pass.run(&mut h, &PassCx::default()).expect("the pass runs");
            if let Err(e) = verify(&h) {
                panic!("{} broke the graph: {e}\nbefore:\n{g}after:\n{h}", pass.name());
            }
            let got = eval(&h, &inputs).expect("the graph evaluates after the pass");
            assert_same(&want, &got, pass.name());
        }

        // The pipeline, then again: nothing left to do.
        let mut h = g.clone();
        let opts = PassOptions { verify: true, ..PassOptions::default() };
        let log = optimize(&mut h, &opts).expect("the pipeline runs");
        prop_assert!(verify(&h).is_ok());
        let got = eval(&h, &inputs).expect("the optimised graph evaluates");
        assert_same(&want, &got, &format!("pipeline\nbefore:\n{g}log:\n{}", log.to_text(false)));
        let text = h.to_string();
        let again = optimize(&mut h, &opts).expect("the pipeline runs again");
        prop_assert!(!again.changed(), "not idempotent:\n{}", again.to_text(false));
        prop_assert_eq!(text, h.to_string());
        prop_assert!(h.len() <= g.len());
    }
}
