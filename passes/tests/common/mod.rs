//! Shared by the pass tests: inputs full of special values, bitwise comparison of
//! interpreter results, and the before/after text that the snapshots pin.
#![allow(dead_code)] // each test binary uses a different part

use ndfuse_ir::interp::eval;
use ndfuse_ir::{verify, DType, Graph, HostArray, NodeId, Op, Shape, Storage};
use ndfuse_passes::{optimize, Pass, PassCx, PassOptions};
use std::collections::HashMap;

/// Floats that break careless rewrites: NaN, ±inf, ±0, subnormals, values that round or
/// overflow in half precision.
pub const FLOATS: [f64; 16] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -2.5,
    3.0,
    1e-40,
    65504.0,
    70000.0,
    -1e300,
    0.1,
    -7.25,
];

/// Integers at and near the edges of i32 and i64.
pub const INTS: [i64; 12] = [
    0,
    1,
    -1,
    2,
    -7,
    i32::MIN as i64,
    i32::MAX as i64,
    123_456_789,
    i64::MIN,
    i64::MAX,
    (1 << 53) + 1,
    -(1 << 40),
];

/// An array of `dtype` and `shape` cycling through the special values, starting at
/// `rot` so that two inputs meet different values at the same position.
pub fn special_array(dtype: DType, shape: &Shape, rot: usize) -> HostArray {
    let n = shape.numel();
    let data = if dtype.is_float() {
        let v: Vec<f64> = (0..n).map(|i| FLOATS[(i + rot) % FLOATS.len()]).collect();
        Storage::from_f64s(dtype, &v)
    } else if dtype.is_int() {
        let v: Vec<i64> = (0..n).map(|i| INTS[(i + rot) % INTS.len()]).collect();
        Storage::from_i64s(dtype, &v)
    } else {
        Storage::Bool((0..n).map(|i| (i + rot) % 3 != 1).collect())
    };
    HostArray::new(shape.clone(), data).expect("one value per element")
}

/// Arrays for every input of `g`, in node id order, each rotated differently.
pub fn inputs_for(g: &Graph) -> HashMap<NodeId, HostArray> {
    g.node_ids()
        .into_iter()
        .filter(|&n| g.node(n).op.is_input())
        .enumerate()
        .map(|(k, n)| {
            let node = g.node(n);
            (n, special_array(node.dtype, &node.shape, 5 * k))
        })
        .collect()
}

/// The element bits, with every NaN the same (payloads are not part of the contract).
fn bits(a: &HostArray) -> Vec<u64> {
    let s = a.storage();
    (0..a.len())
        .map(|i| match a.dtype() {
            d if d.is_float() => {
                let v = s.get_f64(i);
                if v.is_nan() {
                    u64::MAX
                } else {
                    v.to_bits()
                }
            }
            _ => s.get_i64(i) as u64,
        })
        .collect()
}

/// Panics unless both lists hold the same dtypes, shapes and element bits.
pub fn assert_same(before: &[HostArray], after: &[HostArray], what: &str) {
    assert_eq!(before.len(), after.len(), "{what}: output count");
    for (i, (a, b)) in before.iter().zip(after).enumerate() {
        assert_eq!(a.dtype(), b.dtype(), "{what}: output {i} dtype");
        assert_eq!(a.shape(), b.shape(), "{what}: output {i} shape");
        let (x, y) = (bits(a), bits(b));
        if x != y {
            panic!(
                "{what}: output {i} differs\nbefore: {:?}\nafter:  {:?}",
                a.to_f64s(),
                b.to_f64s()
            );
        }
    }
}

/// Evaluates `before` and `after` with the same special inputs and asserts bit-identical
/// outputs. Node ids of inputs survive every pass, so one binding serves both.
pub fn assert_same_values(before: &Graph, after: &Graph, what: &str) {
    let inputs = inputs_for(before);
    let a = eval(before, &inputs).expect("the test graph evaluates");
    let b = eval(after, &inputs).expect("the optimised graph evaluates");
    assert_same(&a, &b, what);
}

/// Runs one pass on a copy of `g` and checks it: the result verifies, evaluates to the
/// same bits, and a second run changes nothing. Returns the snapshot text (before, a
/// separator naming the pass, after) and whether the pass changed the graph.
pub fn run_pass(pass: &dyn Pass, g: &Graph) -> (String, bool) {
    verify(g).expect("the test graph verifies");
    let mut h = g.clone();
    let cx = PassCx::default();
    let changed = pass.run(&mut h, &cx).expect("the pass runs");
    if let Err(e) = verify(&h) {
        panic!("{} left an invalid graph: {e}\n{h}", pass.name());
    }
    assert_same_values(g, &h, pass.name());
    let again = pass.run(&mut h, &cx).expect("the pass runs again");
    assert!(!again, "{} is not idempotent:\n{h}", pass.name());
    assert_eq!(
        changed,
        g.to_string() != h.to_string(),
        "{}'s changed flag",
        pass.name()
    );
    let status = if changed { "changed" } else { "unchanged" };
    (format!("{g}--- {} ({status})\n{h}", pass.name()), changed)
}

/// [`run_pass`]'s snapshot text alone.
pub fn before_after(pass: &dyn Pass, g: &Graph) -> String {
    run_pass(pass, g).0
}

/// Runs the whole pipeline on a copy of `g` with verification, checks values and that
/// a second run changes nothing; returns the optimised graph.
pub fn optimized(g: &Graph) -> Graph {
    let mut h = g.clone();
    let opts = PassOptions {
        verify: true,
        ..PassOptions::default()
    };
    optimize(&mut h, &opts).expect("the pipeline runs");
    assert_same_values(g, &h, "pipeline");
    let text = h.to_string();
    let log = optimize(&mut h, &opts).expect("the pipeline runs again");
    assert!(
        !log.changed(),
        "the pipeline is not idempotent:\n{}",
        log.to_text(false)
    );
    assert_eq!(text, h.to_string());
    h
}

/// Shorthand for building test graphs: `b.op(op, &[a, b])`.
pub trait Build {
    fn op(&mut self, op: Op, operands: &[NodeId]) -> NodeId;
}

impl Build for Graph {
    fn op(&mut self, op: Op, operands: &[NodeId]) -> NodeId {
        let name = op.name();
        self.add(op, operands)
            .unwrap_or_else(|e| panic!("test graph: {name}: {e}"))
    }
}
