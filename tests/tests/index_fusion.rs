//! Reads at computed positions fuse: a gather, a concat, a pad and an iota are loads of
//! the element-wise kernel that consumes them, not kernels of their own. Every test
//! checks the kernel count AND the values against the reference interpreter, on graphs
//! built in the IR (the frontend's `take`, `concat` and `pad` build the same ops).

use ndfuse_ir::{DType, Graph, HostArray, NodeId, Op, PadMode, Scalar, Shape, ViewOp};
use ndfuse_runtime::{execute, BackendKind, StepPath};
use std::collections::HashMap;
use std::sync::Arc;

type Inputs = HashMap<NodeId, Arc<HostArray>>;

fn floats(shape: &[usize], seed: u64) -> HostArray {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f64) / 250.0 - 2.0)
        .collect();
    HostArray::from_f64s(DType::F32, Shape::new(shape.to_vec()), &v)
}

fn ints(shape: &[usize], vals: &[i64]) -> HostArray {
    let v: Vec<f64> = vals.iter().map(|&x| x as f64).collect();
    HostArray::from_f64s(DType::I64, Shape::new(shape.to_vec()), &v)
}

/// Runs `g` on the CPU and the interpreter; returns the CPU's kernel count (JIT
/// kernels) after checking the outputs are bit-identical (reads move values; the
/// element-wise math of these graphs is exact or identically rounded).
fn check(g: &Graph, inputs: &Inputs) -> usize {
    let want = execute(g, inputs, BackendKind::Interp).expect("reference evaluates");
    let got = execute(g, inputs, BackendKind::Cpu).expect("cpu evaluates");
    if std::env::var("DBG").is_ok() {
        eprintln!("{}", got.schedule.as_ref().unwrap().to_text(&got.graph));
    }
    for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
        assert_eq!(a.shape(), b.shape(), "output {i}");
        let (a, b) = (a.to_f64s(), b.to_f64s());
        for (j, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x == y || (x.is_nan() && y.is_nan()),
                "output {i} element {j}: cpu {x} vs interp {y}"
            );
        }
    }
    let schedule = got.schedule.as_ref().expect("the CPU backend schedules");
    for p in &got.paths {
        assert!(
            matches!(p, StepPath::Jit { .. }),
            "every step is JIT-compiled: {p:?}\n{}",
            schedule.to_text(&got.graph)
        );
    }
    schedule.kernel_count()
}

/// The graph after the clean-up passes, annotated with where each node went, then the
/// kernels: the fusion report a snapshot pins.
fn report(g: &Graph) -> String {
    let mut g = g.clone();
    ndfuse_passes::optimize(&mut g, &ndfuse_passes::PassOptions::default()).expect("passes");
    let s = ndfuse_passes::schedule(&g);
    format!("{}\n{}", s.annotate(&g, &|_| None), s.to_text(&g))
}

fn view(g: &mut Graph, v: ViewOp, x: NodeId) -> NodeId {
    g.add(Op::View(v), &[x]).expect("view")
}

/// `take(emb, tokens, axis=0) * 8 + take(pos, arange(T), axis=0)`, built as the
/// frontend builds `take`: ONE kernel, no intermediate buffer.
#[test]
fn embedding_lookup_scale_and_positions_is_one_kernel() {
    let (v, d, p, b, t) = (50, 19, 7, 3, 5);
    let mut g = Graph::new();
    let emb = g.add_input("emb", DType::F32, Shape::new([v, d]));
    let pos = g.add_input("pos", DType::F32, Shape::new([p, d]));
    let tok = g.add_input("tokens", DType::I64, Shape::new([b, t]));
    // take(emb, tokens, 0): table [b, v, d], indices [b, t, d], gathered along 1.
    let e3 = view(&mut g, ViewOp::ExpandDims(0), emb);
    let e3 = view(&mut g, ViewOp::BroadcastTo(Shape::new([b, v, d])), e3);
    let i3 = view(&mut g, ViewOp::ExpandDims(2), tok);
    let i3 = view(&mut g, ViewOp::BroadcastTo(Shape::new([b, t, d])), i3);
    let x = g.add(Op::Gather { axis: 1 }, &[e3, i3]).unwrap();
    let eight = g.add_const(Scalar::F(8.0), DType::F32, Shape::new([b, t, d]));
    let x = g
        .add(Op::Binary(ndfuse_ir::BinaryOp::Mul), &[x, eight])
        .unwrap();
    // take(pos, arange(t), 0): [t, d], then broadcast against [b, t, d].
    let ar = g
        .add(
            Op::Iota {
                len: t,
                start: 0,
                step: 1,
            },
            &[],
        )
        .unwrap();
    let ar = view(&mut g, ViewOp::ExpandDims(1), ar);
    let ar = view(&mut g, ViewOp::BroadcastTo(Shape::new([t, d])), ar);
    let y = g.add(Op::Gather { axis: 0 }, &[pos, ar]).unwrap();
    let y = view(&mut g, ViewOp::ExpandDims(0), y);
    let y = view(&mut g, ViewOp::BroadcastTo(Shape::new([b, t, d])), y);
    let out = g
        .add(Op::Binary(ndfuse_ir::BinaryOp::Add), &[x, y])
        .unwrap();
    g.add_output(out);
    let toks: Vec<i64> = (0..(b * t) as i64).map(|i| (i * 7) % 50 - 3).collect();
    let inputs: Inputs = HashMap::from([
        (emb, Arc::new(floats(&[v, d], 1))),
        (pos, Arc::new(floats(&[p, d], 2))),
        (tok, Arc::new(ints(&[b, t], &toks))),
    ]);
    assert_eq!(check(&g, &inputs), 1);
    insta::assert_snapshot!(report(&g));
}

/// An index out of range is an error naming the op, the axis, the value and its
/// position, raised before the kernel reads.
#[test]
fn gather_index_out_of_range_is_an_error() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([4, 3]));
    let i = g.add_input("i", DType::I64, Shape::new([2, 3]));
    let y = g.add(Op::Gather { axis: 0 }, &[x, i]).unwrap();
    let one = g.add_const(Scalar::F(1.0), DType::F32, Shape::new([2, 3]));
    let y = g
        .add(Op::Binary(ndfuse_ir::BinaryOp::Add), &[y, one])
        .unwrap();
    g.add_output(y);
    for backend in [BackendKind::Cpu, BackendKind::Interp] {
        let inputs: Inputs = HashMap::from([
            (x, Arc::new(floats(&[4, 3], 3))),
            (i, Arc::new(ints(&[2, 3], &[0, 1, 2, 3, -4, 4]))),
        ]);
        let err = execute(&g, &inputs, backend).expect_err("index 4 of an axis of 4");
        let text = err.to_string();
        assert!(
            text.contains("gather") && text.contains("index 4") && text.contains("axis 0"),
            "{backend:?}: {text}"
        );
    }
}

/// `relu(pad(x)) + 1` in each mode, and a concat read by an element-wise op: one kernel
/// each.
#[test]
fn pad_and_concat_are_reads() {
    for mode in [PadMode::Constant, PadMode::Edge, PadMode::Reflect] {
        let mut g = Graph::new();
        let x = g.add_input("x", DType::F32, Shape::new([4, 5]));
        let p = g
            .add(
                Op::Pad {
                    widths: vec![(1, 2), (3, 0)],
                    mode,
                    value: Scalar::F(if mode == PadMode::Constant { -0.5 } else { 0.0 }),
                },
                &[x],
            )
            .unwrap();
        let r = g.add(Op::Unary(ndfuse_ir::UnaryOp::Relu), &[p]).unwrap();
        let shape = g.node(r).shape.clone();
        let one = g.add_const(Scalar::F(1.0), DType::F32, shape);
        let y = g
            .add(Op::Binary(ndfuse_ir::BinaryOp::Add), &[r, one])
            .unwrap();
        g.add_output(y);
        let inputs: Inputs = HashMap::from([(x, Arc::new(floats(&[4, 5], 4)))]);
        assert_eq!(check(&g, &inputs), 1, "{mode:?}");
        if mode == PadMode::Reflect {
            insta::assert_snapshot!("pad_reflect", report(&g));
        }
    }
    let mut g = Graph::new();
    let a = g.add_input("a", DType::F32, Shape::new([3, 2]));
    let b = g.add_input("b", DType::F32, Shape::new([3, 4]));
    let c = g.add(Op::Concat { axis: 1, parts: 3 }, &[a, b, a]).unwrap();
    let e = g.add(Op::Unary(ndfuse_ir::UnaryOp::Neg), &[c]).unwrap();
    g.add_output(e);
    let inputs: Inputs = HashMap::from([
        (a, Arc::new(floats(&[3, 2], 5))),
        (b, Arc::new(floats(&[3, 4], 6))),
    ]);
    assert_eq!(check(&g, &inputs), 1);
    insta::assert_snapshot!("concat", report(&g));
}

/// A causal mask from two iotas (`where(col <= row, x, -inf)`, as `tril` builds it):
/// the iotas are positions inside the one kernel, nothing is stored but the output.
#[test]
fn a_causal_mask_from_iotas_is_one_kernel() {
    let t = 6;
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([2, t, t]));
    let r = g
        .add(
            Op::Iota {
                len: t,
                start: 0,
                step: 1,
            },
            &[],
        )
        .unwrap();
    let r = view(&mut g, ViewOp::Reshape(Shape::new([t, 1])), r);
    let r = view(&mut g, ViewOp::BroadcastTo(Shape::new([2, t, t])), r);
    let c = g
        .add(
            Op::Iota {
                len: t,
                start: 0,
                step: 1,
            },
            &[],
        )
        .unwrap();
    let c = view(&mut g, ViewOp::BroadcastTo(Shape::new([2, t, t])), c);
    let keep = g.add(Op::Binary(ndfuse_ir::BinaryOp::Le), &[c, r]).unwrap();
    let ninf = g.add_const(
        Scalar::F(f64::NEG_INFINITY),
        DType::F32,
        Shape::new([2, t, t]),
    );
    let y = g.add(Op::Where, &[keep, x, ninf]).unwrap();
    g.add_output(y);
    let inputs: Inputs = HashMap::from([(x, Arc::new(floats(&[2, t, t], 7)))]);
    assert_eq!(check(&g, &inputs), 1);
    insta::assert_snapshot!(report(&g));
}

/// Scatter-add, scans and sorts are steps of their own; the element-wise work around
/// them stays in kernels.
#[test]
fn routines_are_steps_of_their_own() {
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([4, 6]));
    let e = g.add(Op::Unary(ndfuse_ir::UnaryOp::Neg), &[x]).unwrap();
    let s = g
        .add(
            Op::Scan {
                op: ndfuse_ir::ScanOp::Sum,
                axis: 1,
                reverse: false,
            },
            &[e],
        )
        .unwrap();
    let o = g
        .add(
            Op::Argsort {
                axis: 1,
                descending: true,
                k: 3,
            },
            &[s],
        )
        .unwrap();
    let top = g.add(Op::Gather { axis: 1 }, &[s, o]).unwrap();
    g.add_output(top);
    let inputs: Inputs = HashMap::from([(x, Arc::new(floats(&[4, 6], 8)))]);
    let want = execute(&g, &inputs, BackendKind::Interp).expect("reference evaluates");
    let got = execute(&g, &inputs, BackendKind::Cpu).expect("cpu evaluates");
    // The running sum rounds to f32 at each step in the routine, once in the
    // reference: within a few ulp of the sums' magnitude (at most 12).
    for (a, b) in got.outputs[0]
        .to_f64s()
        .iter()
        .zip(want.outputs[0].to_f64s())
    {
        assert!((a - b).abs() <= 1e-5 * 12.0, "{a} vs {b}");
    }
    insta::assert_snapshot!(report(&g));
}

/// A convolution's window gather: `where(mask, take(x, idx, axis=2), 0)` with one index
/// and mask per position along the row (rows of 103 read from rows of 97, 18,963 of
/// them: 1.95 M positions, cut into ranges that start mid-row). The CPU's scalar loop
/// walks it row segment by row segment (the row's outer indices divided out once);
/// the bits are the interpreter's, in one kernel.
#[test]
fn a_window_gather_walks_row_segments_with_the_interpreters_bits() {
    let (n, c, s, l) = (63, 301, 97, 103);
    let mut g = Graph::new();
    let x = g.add_input("x", DType::F32, Shape::new([n, c, s]));
    let idx = g.add_input("idx", DType::I64, Shape::new([l]));
    let mask = g.add_input("mask", DType::Bool, Shape::new([l]));
    let i3 = view(&mut g, ViewOp::Reshape(Shape::new([1, 1, l])), idx);
    let i3 = view(&mut g, ViewOp::BroadcastTo(Shape::new([n, c, l])), i3);
    let taken = g.add(Op::Gather { axis: 2 }, &[x, i3]).unwrap();
    let m3 = view(&mut g, ViewOp::Reshape(Shape::new([1, 1, l])), mask);
    let m3 = view(&mut g, ViewOp::BroadcastTo(Shape::new([n, c, l])), m3);
    let zero = g.add_const(Scalar::F(0.0), DType::F32, Shape::new([n, c, l]));
    let out = g.add(Op::Where, &[m3, taken, zero]).unwrap();
    g.add_output(out);
    let taps: Vec<i64> = (0..l as i64).map(|j| (j * 5 + 3) % s as i64).collect();
    let inside: Vec<f64> = (0..l).map(|j| f64::from(j % 7 != 3)).collect();
    let inputs: Inputs = HashMap::from([
        (x, Arc::new(floats(&[n, c, s], 3))),
        (idx, Arc::new(ints(&[l], &taps))),
        (
            mask,
            Arc::new(HostArray::from_f64s(DType::Bool, Shape::new([l]), &inside)),
        ),
    ]);
    assert_eq!(check(&g, &inputs), 1);
}
