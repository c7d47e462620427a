//! The reference interpreter: evaluates a graph node by node, or a kernel description
//! element by element, with f64 math. It is the correctness oracle that every backend is
//! differential-tested against, so it favours plain, obviously-right code over speed
//! (while staying linear in the number of elements).
//!
//! Graph semantics: float math is done in f64 and rounded to the node's dtype after
//! every node ([`crate::round::round_f64`]); integers are exact with two's-complement
//! wrapping to the dtype's width. Kernel semantics ([`eval_kernel`]) differ in one way:
//! half types compute in f32 and round to the storage dtype only at stores, as the
//! backends do.
//!
//! Transcendental functions are Rust's `f64` methods, which call the platform's C library
//! (glibc's are within about 0.5 ulp, closer than the `libm` crate's); std has no `erf`,
//! so that one comes from `libm`. Tests of f64 results should therefore allow an ulp.
//!
//! This file evaluates graphs; the rest sits beside it, layered bottom to top: `scalar`
//! (one op on one value), `vals` (elements by kind, a node's value), `views` (index maps),
//! `elementwise` (unary, binary, `where`, casts), `random` (random number sources),
//! `reduce` (reductions, arg-reductions),
//! `error`, and `kernel` (kernel descriptions, by chunk or by row).

mod attention;
mod contract;
mod elementwise;
mod error;
mod index;
mod kernel;
mod linalg;
mod random;
mod reduce;
mod scalar;
mod scan;
mod vals;
mod views;

use error::room_for;
pub use error::InterpError;
pub use index::pad_source;
pub use kernel::{check_index, check_indices, eval_kernel};
pub use scalar::{binary_f64, binary_i64, compare_f64, compare_i64, unary_f64, unary_i64};
pub use scan::total_order_f64;

use crate::array::HostArray;
use crate::error::TensorType;
use crate::graph::{Graph, NodeId};
use crate::infer::infer;
use crate::op::{Node, Op};
use crate::verify::{verify, VerifyError, VerifyErrors};
use elementwise::{cast, map_binary, map_unary, select};
use reduce::{arg_reduce, reduce};
use std::collections::HashMap;
use vals::{Tensor, Vals};
use views::{view_of, Offsets};

/// [`Op::Linalg`] over every matrix of the batch, each in f64 and rounded once; the
/// first matrix that fails names its batch position.
fn linalg_batch(
    op: crate::linalg::LinalgOp,
    operands: &[&Tensor],
    node: &Node,
) -> Result<Vals, InterpError> {
    let a = &operands[0];
    let d = a.shape.dims();
    let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
    let batch_shape = crate::shape::Shape::new(&d[..d.len() - 2]);
    let batch = batch_shape.numel();
    let av = a.vals.to_f64s();
    let b = operands.get(1).map(|b| {
        let bd = b.shape.dims();
        (b.vals.to_f64s(), bd[bd.len() - 2], bd[bd.len() - 1])
    });
    let per_out = node.shape.numel() / batch.max(1);
    let mut out = Vec::with_capacity(node.shape.numel());
    for i in 0..batch {
        let bi = b
            .as_ref()
            .map(|(v, r, c)| (&v[i * r * c..(i + 1) * r * c], *r, *c));
        let r =
            linalg::eval_one(op, &av[i * m * n..(i + 1) * m * n], m, n, bi).map_err(|failure| {
                InterpError::Linalg {
                    op: op.name(),
                    batch: batch_shape.unravel(i),
                    failure,
                }
            })?;
        debug_assert_eq!(r.len(), per_out, "{op}: a wrong result length (a bug)");
        out.extend(
            r.into_iter()
                .map(|x| crate::round::round_f64(x, node.dtype)),
        );
    }
    Ok(Vals::F(out))
}

/// [`Op::QuantMatMul`]: `x @ w^T` with each weight's exact value (in f64), summed in f64
/// and rounded once to f32.
fn quant_matmul(spec: &crate::quant::QuantSpec, operands: &[&Tensor]) -> Vals {
    let (x, w) = (operands[0].vals.to_f64s(), operands[1].vals.to_f64s());
    let (k, rw) = (spec.k, spec.row_words());
    let n = w.len() / rw.max(1);
    let bb = spec.format.block_bytes();
    // Each row's weights, exactly.
    let mut rows = vec![0f64; n * k];
    let mut bytes = Vec::new();
    for (r, row) in rows.chunks_exact_mut(k).enumerate() {
        let words: Vec<i32> = w[r * rw..(r + 1) * rw].iter().map(|&v| v as i32).collect();
        crate::quant::words_to_bytes(&words, &mut bytes);
        for (j, dst) in row.iter_mut().enumerate() {
            let b = j / crate::quant::BLOCK;
            *dst = spec
                .format
                .weight_f64(&bytes[b * bb..(b + 1) * bb], j % crate::quant::BLOCK);
        }
    }
    let mut out = Vec::with_capacity(x.len() / k.max(1) * n);
    for xr in x.chunks_exact(k) {
        for wr in rows.chunks_exact(k) {
            let dot: f64 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            out.push(crate::round::round_f64(dot, crate::DType::F32));
        }
    }
    Vals::F(out)
}

// ---------------------------------------------------------------------------------------
// Graph evaluation.
// ---------------------------------------------------------------------------------------

/// Computes a validated, non-input node from its operands' values; an index out of
/// range is the one error.
fn compute(node: &Node, operands: &[&Tensor]) -> Result<Tensor, InterpError> {
    let numel = node.shape.numel();
    let vals = match &node.op {
        Op::Input { name } => {
            panic!("input {name:?} is bound by eval, never computed (a bug in the caller)")
        }
        Op::Const { value } => Vals::fill(*value, node.dtype, node.dtype, numel),
        Op::Unary(u) => map_unary(*u, &operands[0].vals, node.dtype),
        Op::Binary(b) => map_binary(*b, &operands[0].vals, &operands[1].vals, operands[0].dtype),
        Op::Where => select(&operands[0].vals, &operands[1].vals, &operands[2].vals),
        Op::Cast { to } => cast(&operands[0].vals, *to, *to),
        Op::Reduce { op, axes, .. } => {
            reduce(*op, &operands[0].vals, &operands[0].shape, axes, node.dtype)
        }
        Op::ArgReduce { op, axis, .. } => {
            arg_reduce(*op, &operands[0].vals, &operands[0].shape, *axis)
        }
        Op::View(v) => {
            let view = view_of(v, &operands[0].shape);
            operands[0].vals.gather(Offsets::of_view(&view))
        }
        Op::MatMul => contract::matmul(operands[0], operands[1], &node.shape, node.dtype),
        Op::RandomUniform { .. } => random::uniform_at(random::key_of(&operands[0].vals), 0..numel),
        Op::Iota { len, start, step } => index::iota(*len, *start, *step),
        Op::Gather { axis } => index::gather(operands[0], operands[1], *axis)?,
        Op::ScatterAdd { axis } => {
            index::scatter_add(operands[0], operands[1], operands[2], *axis, node.dtype)?
        }
        Op::Concat { axis, .. } => index::concat(operands, *axis, &node.shape),
        Op::Pad {
            widths,
            mode,
            value,
        } => index::pad(operands[0], widths, *mode, *value, &node.shape, node.dtype),
        Op::Scan { op, axis, reverse } => {
            // Integers accumulate in i64; floats keep their dtype.
            scan::scan(
                *op,
                &operands[0].vals,
                &operands[0].shape,
                *axis,
                *reverse,
                node.dtype,
            )
        }
        Op::Argsort {
            axis,
            descending,
            k,
        } => scan::argsort(
            &operands[0].vals,
            &operands[0].shape,
            *axis,
            *descending,
            *k,
        ),
        Op::Attention(spec) => attention::attention(spec, operands, node.dtype),
        Op::AttentionBackward(spec) => attention::attention_backward(spec, operands, node.dtype),
        Op::Linalg(l) => linalg_batch(*l, operands, node)?,
        Op::QuantMatMul(spec) => quant_matmul(spec, operands),
    };
    debug_assert_eq!(
        vals.len(),
        numel,
        "{} produced a wrong element count (a bug)",
        node.op.name()
    );
    Ok(Tensor {
        dtype: node.dtype,
        shape: node.shape.clone(),
        vals,
    })
}

/// Evaluates the outputs of `graph`, in [`Graph::outputs`] order.
///
/// `inputs` binds every [`Op::Input`] node reachable from the outputs, by id; other
/// bindings are ignored. The graph is verified first. Only nodes reachable from the
/// outputs are evaluated, and each intermediate is freed once its last user ran.
///
/// ```
/// use std::collections::HashMap;
/// use ndfuse_ir::{interp::eval, DType, Graph, HostArray, Op, Shape, UnaryOp};
/// let mut g = Graph::new();
/// let x = g.add_input("x", DType::F32, Shape::new([2]));
/// let y = g.add(Op::Unary(UnaryOp::Square), &[x]).unwrap();
/// g.add_output(y);
/// let a = HostArray::from_f64s(DType::F32, Shape::new([2]), &[3.0, -0.5]);
/// let out = eval(&g, &HashMap::from([(x, a)])).unwrap();
/// assert_eq!(out[0].to_f64s(), vec![9.0, 0.25]);
/// ```
pub fn eval(
    graph: &Graph,
    inputs: &HashMap<NodeId, HostArray>,
) -> Result<Vec<HostArray>, InterpError> {
    verify(graph)?;
    let order = graph.live_nodes();
    // Uses left per node: one per distinct live user, as each user frees once.
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    let mut operands_of: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &id in &order {
        let ops = graph.operands(id);
        let mut distinct = ops.clone();
        distinct.sort_unstable();
        distinct.dedup();
        for o in distinct {
            *uses.entry(o).or_default() += 1;
        }
        operands_of.insert(id, ops);
    }
    // Check every binding before computing anything: a bad input fails fast.
    for &id in &order {
        let node = graph.node(id);
        if let Op::Input { name } = &node.op {
            let arr = inputs.get(&id).ok_or_else(|| InterpError::MissingInput {
                node: id,
                name: name.clone(),
            })?;
            if arr.dtype() != node.dtype || arr.shape() != &node.shape {
                return Err(InterpError::InputMismatch {
                    name: name.clone(),
                    expected: graph.ty(id),
                    got: TensorType {
                        dtype: arr.dtype(),
                        shape: arr.shape().clone(),
                    },
                });
            }
        }
    }
    let mut values: HashMap<NodeId, Tensor> = HashMap::new();
    for &id in &order {
        let node = graph.node(id);
        let ops = &operands_of[&id];
        let value = match &node.op {
            Op::Input { .. } => Tensor::from_host(&inputs[&id]),
            _ => {
                room_for_node(node)?;
                let args: Vec<&Tensor> = ops
                    .iter()
                    .map(|o| values.get(o).expect("operands come first in topological order and live until their last user (a bug)"))
                    .collect();
                compute(node, &args)?
            }
        };
        values.insert(id, value);
        let mut distinct = ops.clone();
        distinct.sort_unstable();
        distinct.dedup();
        for o in distinct {
            let left = uses
                .get_mut(&o)
                .expect("every operand of a live node was counted");
            *left -= 1;
            if *left == 0 && !graph.is_output(o) {
                values.remove(&o);
            }
        }
    }
    let outputs = graph.outputs();
    Ok(outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            // The last listing of an output takes its value; earlier ones copy it.
            let value = if outputs[i + 1..].contains(o) {
                values.get(o).cloned()
            } else {
                values.remove(o)
            };
            value
                .expect("outputs are live and never freed (a bug)")
                .into_host()
        })
        .collect())
}

/// [`InterpError::OutOfMemory`] unless the value of `node` can be held: 8 bytes an
/// element as the interpreter computes it, plus the element of its dtype it becomes.
fn room_for_node(node: &Node) -> Result<(), InterpError> {
    room_for(node.shape.dims(), 8 + node.dtype.size_bytes(), || {
        format!("{} {}{}", node.op.name(), node.dtype, node.shape)
    })
}

/// A verification failure of a lone node, for [`eval_node`].
fn invalid_node(message: String) -> InterpError {
    InterpError::Invalid(VerifyErrors(vec![VerifyError {
        node: None,
        message,
    }]))
}

/// Evaluates one non-input node given its operands as contiguous arrays (the runtime
/// uses this for ops a backend cannot run). For [`Op::Const`], `operands` is empty and
/// the node's dtype and shape say what to build.
///
/// The node is checked against its operands with [`crate::infer()`]; a mismatch, or an
/// input node, is [`InterpError::Invalid`].
pub fn eval_node(node: &Node, operands: &[&HostArray]) -> Result<HostArray, InterpError> {
    match &node.op {
        Op::Input { name } => {
            return Err(invalid_node(format!(
                "input {name:?} has no value to compute; bind it through eval"
            )))
        }
        Op::Const { .. } => {
            if !operands.is_empty() {
                return Err(invalid_node(format!(
                    "const takes 0 operands, got {}",
                    operands.len()
                )));
            }
        }
        op => {
            let types: Vec<TensorType> = operands
                .iter()
                .map(|a| TensorType {
                    dtype: a.dtype(),
                    shape: a.shape().clone(),
                })
                .collect();
            let t = infer(op, &types).map_err(|e| invalid_node(e.to_string()))?;
            if t.dtype != node.dtype || t.shape != node.shape {
                return Err(invalid_node(format!(
                    "{} is typed {}{} but its operands give {t}",
                    op.name(),
                    node.dtype,
                    node.shape
                )));
            }
        }
    }
    room_for_node(node)?;
    let args: Vec<Tensor> = operands.iter().map(|a| Tensor::from_host(a)).collect();
    let refs: Vec<&Tensor> = args.iter().collect();
    Ok(compute(node, &refs)?.into_host())
}
