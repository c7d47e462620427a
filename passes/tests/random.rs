//! Fusion of the random op: computed inside the element-wise kernels that read it (its
//! views folded into its index map), never in a kernel with reductions (those read a
//! buffer an element-wise kernel fills), stored before a matrix product reads it; not
//! merged by CSE across keys, not folded. Every schedule is run kernel by kernel on the
//! interpreter and compared bit for bit with the graph's own evaluation.

use ndfuse_ir::interp::{eval, eval_kernel};
use ndfuse_ir::{
    BinaryOp, DType, Expr, Graph, HostArray, NodeId, Op, ReduceOp, Scalar, Shape, Storage, ViewOp,
};
use ndfuse_passes::{optimize, schedule, PassOptions, Schedule, Step};
use std::collections::HashMap;

fn key_array(key: i64) -> HostArray {
    HostArray::new(Shape::scalar(), Storage::from_i64s(DType::I64, &[key])).expect("one element")
}

fn f32s(shape: &[usize], seed: usize) -> HostArray {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i * 7 + seed) % 13) as f64 - 6.0).collect();
    HostArray::from_f64s(DType::F32, Shape::new(shape), &v)
}

/// Runs `s` kernel by kernel on the interpreter; the outputs of `g`.
fn run(g: &Graph, s: &Schedule, inputs: &HashMap<NodeId, HostArray>) -> Vec<HostArray> {
    let mut bufs = inputs.clone();
    for step in &s.steps {
        let Step::Kernel {
            kernel,
            inputs,
            outputs,
        } = step
        else {
            panic!("no interpreted steps expected");
        };
        let args: Vec<&HostArray> = inputs.iter().map(|n| &bufs[n]).collect();
        let outs = eval_kernel(kernel, &args).unwrap_or_else(|e| panic!("{e}\n{kernel}"));
        for (o, a) in outputs.iter().zip(outs) {
            let a = a.reshaped(g.node(*o).shape.clone()).expect("same size");
            bufs.insert(*o, a);
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

fn bits(a: &[HostArray]) -> Vec<Vec<u64>> {
    a.iter()
        .map(|x| x.to_f64s().into_iter().map(f64::to_bits).collect())
        .collect()
}

/// Schedules `g`, checks it against the graph's evaluation, returns the schedule.
fn checked(g: &Graph, inputs: &HashMap<NodeId, HostArray>) -> Schedule {
    let s = schedule(g);
    let want = eval(g, inputs).expect("evaluates");
    assert_eq!(bits(&run(g, &s, inputs)), bits(&want), "{}", s.to_text(g));
    s
}

fn randoms(s: &Schedule) -> Vec<(usize, bool)> {
    s.kernels()
        .map(|k| {
            let n = k
                .body
                .iter()
                .filter(|i| matches!(i.expr, Expr::Random { .. }))
                .count();
            (n, k.reduce_axes.is_empty())
        })
        .collect()
}

#[test]
fn random_times_x_plus_y_is_one_kernel() {
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let x = g.add_input("x", DType::F32, Shape::new([64, 33]));
    let y = g.add_input("y", DType::F32, Shape::new([64, 33]));
    let r = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([64, 33]),
            },
            &[k],
        )
        .unwrap();
    let m = g.add(Op::Binary(BinaryOp::Mul), &[r, x]).unwrap();
    let a = g.add(Op::Binary(BinaryOp::Add), &[m, y]).unwrap();
    g.add_output(a);
    let inputs = HashMap::from([
        (k, key_array(5)),
        (x, f32s(&[64, 33], 1)),
        (y, f32s(&[64, 33], 2)),
    ]);
    let s = checked(&g, &inputs);
    assert_eq!(s.kernel_count(), 1, "{}", s.to_text(&g));
    assert_eq!(randoms(&s), vec![(1, true)]);
}

#[test]
fn views_of_a_random_op_fold_into_its_index_map() {
    // r: [33, 64]; out = r.T * x + r[0:1, :64] broadcast... all in one kernel over [64, 33].
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let x = g.add_input("x", DType::F32, Shape::new([64, 33]));
    let r = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([33, 64]),
            },
            &[k],
        )
        .unwrap();
    let t = g.add(Op::View(ViewOp::Permute(vec![1, 0])), &[r]).unwrap();
    let m = g.add(Op::Binary(BinaryOp::Mul), &[t, x]).unwrap();
    // A [33] random op broadcast over rows.
    let r2 = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([33]),
            },
            &[k],
        )
        .unwrap();
    let b = g
        .add(Op::View(ViewOp::BroadcastTo(Shape::new([64, 33]))), &[r2])
        .unwrap();
    let a = g.add(Op::Binary(BinaryOp::Add), &[m, b]).unwrap();
    g.add_output(a);
    let inputs = HashMap::from([(k, key_array(-3)), (x, f32s(&[64, 33], 4))]);
    let s = checked(&g, &inputs);
    assert_eq!(s.kernel_count(), 1, "{}", s.to_text(&g));
    assert_eq!(randoms(&s), vec![(2, true)]);
}

#[test]
fn a_reduction_reads_random_values_from_an_elementwise_kernel() {
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let x = g.add_input("x", DType::F32, Shape::new([16, 40]));
    let r = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([16, 40]),
            },
            &[k],
        )
        .unwrap();
    let m = g.add(Op::Binary(BinaryOp::Mul), &[r, x]).unwrap();
    let s = g
        .add(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keepdims: false,
            },
            &[m],
        )
        .unwrap();
    g.add_output(s);
    let inputs = HashMap::from([(k, key_array(11)), (x, f32s(&[16, 40], 3))]);
    let sch = checked(&g, &inputs);
    assert_eq!(sch.kernel_count(), 2, "{}", sch.to_text(&g));
    // The random op is computed (once) by the element-wise kernel only.
    assert_eq!(
        randoms(&sch),
        vec![(1, true), (0, false)],
        "{}",
        sch.to_text(&g)
    );
}

#[test]
fn a_matmul_epilogue_computes_it_and_an_operand_is_stored() {
    let mut g = Graph::new();
    let k = g.add_input("key", DType::I64, Shape::scalar());
    let a = g.add_input("a", DType::F32, Shape::new([8, 5]));
    let b = g.add_input("b", DType::F32, Shape::new([5, 6]));
    let p = g.add(Op::MatMul, &[a, b]).unwrap();
    let r = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([8, 6]),
            },
            &[k],
        )
        .unwrap();
    let e = g.add(Op::Binary(BinaryOp::Mul), &[p, r]).unwrap();
    g.add_output(e);
    let r2 = g
        .add(
            Op::RandomUniform {
                shape: Shape::new([6, 3]),
            },
            &[k],
        )
        .unwrap();
    let q = g.add(Op::MatMul, &[e, r2]).unwrap();
    g.add_output(q);
    let inputs = HashMap::from([
        (k, key_array(2)),
        (a, f32s(&[8, 5], 0)),
        (b, f32s(&[5, 6], 1)),
    ]);
    let s = checked(&g, &inputs);
    // matmul + epilogue; the second operand filled; the second matmul.
    assert_eq!(s.kernel_count(), 3, "{}", s.to_text(&g));
    let annotated = s.annotate(&g, &|_| None);
    assert!(
        annotated.contains("a random operand of matmul (a GEMM reads memory)"),
        "{annotated}"
    );
}

#[test]
fn cse_keeps_random_ops_of_different_keys_and_fold_keeps_constant_keyed_ones() {
    let mut g = Graph::new();
    let k1 = g.add_input("k1", DType::I64, Shape::scalar());
    let k2 = g.add_input("k2", DType::I64, Shape::scalar());
    let kc = g.add_const(Scalar::I(9), DType::I64, Shape::scalar());
    let shape = Shape::new([10]);
    let mut outs = Vec::new();
    for key in [k1, k2, k1, kc] {
        let r = g
            .add(
                Op::RandomUniform {
                    shape: shape.clone(),
                },
                &[key],
            )
            .unwrap();
        outs.push(r);
    }
    let a = g
        .add(Op::Binary(BinaryOp::Add), &[outs[0], outs[1]])
        .unwrap();
    let b = g
        .add(Op::Binary(BinaryOp::Add), &[outs[2], outs[3]])
        .unwrap();
    g.add_output(a);
    g.add_output(b);
    let inputs = HashMap::from([(k1, key_array(1)), (k2, key_array(2))]);
    let want = eval(&g, &inputs).unwrap();
    let mut o = g.clone();
    optimize(&mut o, &PassOptions::default()).expect("optimizes");
    let count = o
        .live_nodes()
        .into_iter()
        .filter(|&n| o.node(n).op.is_random())
        .count();
    // k1's two ops merge; k2's and the constant key's stay.
    assert_eq!(count, 3, "{o}");
    assert_eq!(bits(&eval(&o, &inputs).unwrap()), bits(&want));
    assert_eq!(bits(&run(&o, &schedule(&o), &inputs)), bits(&want));
}
