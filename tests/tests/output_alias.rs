//! An output that is a reshape of a whole buffer is that buffer under the output's
//! shape (`Placement::Alias`): no copy kernel. The cases where one buffer must be handed
//! back twice (the value and its reshape both outputs, an output listed twice, a reshape
//! of an input) copy instead; a view that reorders (a transpose) is still a kernel.
//! Values, shapes and kernel counts are checked against the interpreter.

use ndfuse_ir::{DType, Graph, HostArray, NodeId, Op, Shape, UnaryOp, ViewOp};
use ndfuse_passes::Placement;
use ndfuse_runtime::{execute, BackendKind};
use std::collections::HashMap;
use std::sync::Arc;

fn input(g: &mut Graph) -> (NodeId, HashMap<NodeId, Arc<HostArray>>) {
    let x = g.add_input("x", DType::F32, Shape::new([6, 4]));
    let v: Vec<f64> = (0..24).map(|i| f64::from(i) / 8.0 - 1.0).collect();
    let a = HostArray::from_f64s(DType::F32, Shape::new([6, 4]), &v);
    (x, HashMap::from([(x, Arc::new(a))]))
}

fn view(g: &mut Graph, v: ViewOp, x: NodeId) -> NodeId {
    g.add(Op::View(v), &[x]).expect("view")
}

/// Runs `g` on the CPU and the interpreter, checks the outputs' shapes and bits, and
/// returns the CPU's kernel count and the placement of each output.
fn check(g: &Graph, inputs: &HashMap<NodeId, Arc<HostArray>>) -> (usize, Vec<Placement>) {
    let want = execute(g, inputs, BackendKind::Interp).expect("reference evaluates");
    let got = execute(g, inputs, BackendKind::Cpu).expect("cpu evaluates");
    assert_eq!(got.outputs.len(), want.outputs.len());
    for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
        assert_eq!(a.shape(), b.shape(), "output {i}");
        assert_eq!(a.to_f64s(), b.to_f64s(), "output {i}");
    }
    let schedule = got.schedule.as_ref().expect("the CPU schedules");
    let placements = got
        .graph
        .outputs()
        .iter()
        .map(|o| schedule.placement[o].clone())
        .collect();
    (schedule.kernel_count(), placements)
}

#[test]
fn a_reshaped_kernel_value_is_its_buffer() {
    let mut g = Graph::new();
    let (x, inputs) = input(&mut g);
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    let r = view(&mut g, ViewOp::Reshape(Shape::new([2, 3, 4])), y);
    g.add_output(r);
    let (kernels, placements) = check(&g, &inputs);
    assert_eq!(kernels, 1);
    assert!(
        matches!(placements[0], Placement::Alias { .. }),
        "{placements:?}"
    );
}

#[test]
fn a_value_and_its_reshape_both_outputs_are_both_handed_back() {
    for order in [[0, 1], [1, 0]] {
        let mut g = Graph::new();
        let (x, inputs) = input(&mut g);
        let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        let r = view(&mut g, ViewOp::Reshape(Shape::new([24])), y);
        let outs = [y, r];
        for k in order {
            g.add_output(outs[k]);
        }
        g.add_output(r);
        let (kernels, _) = check(&g, &inputs);
        assert_eq!(kernels, 1, "order {order:?}");
    }
}

#[test]
fn a_reshaped_input_is_copied_and_a_transpose_is_a_kernel() {
    let mut g = Graph::new();
    let (x, inputs) = input(&mut g);
    let r = view(&mut g, ViewOp::Reshape(Shape::new([4, 6])), x);
    let t = view(&mut g, ViewOp::Permute(vec![1, 0]), x);
    g.add_output(r);
    g.add_output(t);
    let (kernels, placements) = check(&g, &inputs);
    assert_eq!(kernels, 1, "the transpose's copy");
    assert!(
        matches!(placements[0], Placement::Alias { .. }),
        "{placements:?}"
    );
    assert!(
        matches!(placements[1], Placement::InKernel { .. }),
        "{placements:?}"
    );
}
