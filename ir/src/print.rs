//! The stable text form of a graph: topological order, renumbered from `%0`, one node a
//! line, `%4 = add %2, %3 : f32[4,8]`, then `return` with the outputs. What a snapshot
//! pins is exactly what a user sees in a dump. Also Graphviz output (`to_dot`).

use crate::dtype::{DType, Scalar};
use crate::graph::{Graph, NodeId};
use crate::op::{Op, ViewOp};
use std::collections::HashMap;
use std::fmt::{self, Write as _};

/// Numbering of the printed form: node id -> printed number.
fn numbering(order: &[NodeId]) -> HashMap<NodeId, usize> {
    order.iter().enumerate().map(|(i, &n)| (n, i)).collect()
}

fn print_order(g: &Graph) -> Vec<NodeId> {
    // A cyclic graph (only ever seen by the verifier) still prints, in id order.
    g.topo_order().unwrap_or_else(|_| g.node_ids())
}

/// Writes the attributes of `op` after its operands (`, axes=[1]`), or before them for
/// inputs and constants.
fn write_op(out: &mut String, g: &Graph, id: NodeId, num: &HashMap<NodeId, usize>) {
    let node = g.node(id);
    let name = |n: NodeId| {
        num.get(&n)
            .map_or_else(|| format!("{n}?"), |i| format!("%{i}"))
    };
    let operands: Vec<String> = g.operands(id).into_iter().map(name).collect();
    let _ = write!(out, "{}", node.op.name());
    match &node.op {
        Op::Input { name } => {
            let _ = write!(out, " {name:?}");
        }
        Op::Const { value } => {
            let _ = write!(out, " {}", const_text(*value, node.dtype));
        }
        _ => {}
    }
    if !operands.is_empty() {
        let _ = write!(out, " {}", operands.join(", "));
    }
    let _ = match &node.op {
        Op::Reduce { axes, keepdims, .. } => write!(
            out,
            ", axes={}{}",
            list(axes),
            if *keepdims { ", keepdims" } else { "" }
        ),
        Op::ArgReduce { axis, keepdims, .. } => write!(
            out,
            ", axis={axis}{}",
            if *keepdims { ", keepdims" } else { "" }
        ),
        Op::View(v) => match v {
            ViewOp::Reshape(s) | ViewOp::BroadcastTo(s) => write!(out, ", {s}"),
            ViewOp::Permute(p) => write!(out, ", {}", list(p)),
            ViewOp::Slice(sl) => {
                let dims = g.operands(id).first().map(|&o| g.node(o).shape.clone());
                let parts: Vec<String> = sl
                    .iter()
                    .enumerate()
                    .map(|(i, s)| match dims.as_ref().and_then(|d| d.dims().get(i)) {
                        Some(&d) if s.is_full(d) => ":".to_string(),
                        _ => s.to_string(),
                    })
                    .collect();
                write!(out, ", [{}]", parts.join(", "))
            }
            ViewOp::ExpandDims(a) => write!(out, ", axis={a}"),
            ViewOp::Squeeze(a) => write!(out, ", axes={}", list(a)),
        },
        Op::Iota { len, start, step } => write!(out, " start={start}, step={step}, len={len}"),
        Op::Gather { axis } | Op::ScatterAdd { axis } | Op::Concat { axis, .. } => {
            write!(out, ", axis={axis}")
        }
        Op::Pad {
            widths,
            mode,
            value,
        } => {
            let w: Vec<String> = widths.iter().map(|(a, b)| format!("({a},{b})")).collect();
            let _ = write!(out, ", [{}], {}", w.join(","), mode.name());
            match mode {
                crate::op::PadMode::Constant => {
                    write!(out, ", value={}", const_text(*value, node.dtype))
                }
                _ => Ok(()),
            }
        }
        Op::Scan { axis, reverse, .. } => write!(
            out,
            ", axis={axis}{}",
            if *reverse { ", reverse" } else { "" }
        ),
        Op::Argsort {
            axis,
            descending,
            k,
        } => write!(
            out,
            ", axis={axis}, k={k}{}",
            if *descending { ", descending" } else { "" }
        ),
        Op::QuantMatMul(spec) => write!(out, ", {}, k={}", spec.format.name(), spec.k),
        Op::Linalg(l) => match *l {
            crate::linalg::LinalgOp::TriangularSolve {
                lower,
                left,
                unit_diagonal,
            } => write!(
                out,
                ", {}, {}{}",
                if lower { "lower" } else { "upper" },
                if left { "left" } else { "right" },
                if unit_diagonal { ", unit_diagonal" } else { "" }
            ),
            crate::linalg::LinalgOp::Qr { complete: true } => write!(out, ", complete"),
            crate::linalg::LinalgOp::Svd { full: true } => write!(out, ", full"),
            crate::linalg::LinalgOp::Eigh { upper: true }
            | crate::linalg::LinalgOp::Eigvalsh { upper: true } => write!(out, ", upper"),
            _ => Ok(()),
        },
        Op::Attention(spec) | Op::AttentionBackward(spec) => {
            let _ = write!(
                out,
                ", causal={}, scale={}",
                spec.causal.name(),
                const_text(spec.scale, DType::F32)
            );
            match spec.layout {
                crate::op::AttentionLayout::Bhtd => {}
                crate::op::AttentionLayout::Bthd => {
                    let _ = write!(out, ", layout=bthd");
                }
                crate::op::AttentionLayout::Packed { q_heads, kv_heads } => {
                    let _ = write!(out, ", layout=packed({q_heads},{kv_heads})");
                }
            }
            if spec.bias {
                let _ = write!(out, ", bias");
            }
            if spec.key_lengths {
                let _ = write!(out, ", key_lengths");
            }
            match spec.dropout {
                Some(p) => write!(out, ", dropout={}", const_text(p, DType::F32)),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    };
    let _ = write!(out, " : {}{}", node.dtype, node.shape);
}

/// `[0,2]`: lists print like shapes, without spaces.
fn list(v: &[usize]) -> String {
    let parts: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// A constant as the shortest text that reads back to the same value of its dtype
/// (`0.044715` for an f32, not the f64 expansion of its bits).
pub(crate) fn const_text(value: Scalar, dtype: DType) -> String {
    match (value, dtype) {
        (Scalar::F(v), DType::F32) => format!("{:?}", v as f32),
        (Scalar::F(v), DType::F16) => format!("{:?}", half::f16::from_f64(v).to_f32()),
        (Scalar::F(v), DType::BF16) => format!("{:?}", half::bf16::from_f64(v).to_f32()),
        (v, _) => v.to_string(),
    }
}

impl Graph {
    /// The text form with a note after each node (`  ; k0 jit`), when `note` gives one.
    pub fn to_text_with(&self, note: &dyn Fn(NodeId) -> Option<String>) -> String {
        let order = print_order(self);
        let num = numbering(&order);
        let mut out = String::new();
        for &id in &order {
            let _ = write!(out, "%{} = ", num[&id]);
            write_op(&mut out, self, id, &num);
            if let Some(n) = note(id) {
                let _ = write!(out, "  ; {n}");
            }
            out.push('\n');
        }
        let outs: Vec<String> = self
            .outputs()
            .iter()
            .map(|o| {
                num.get(o)
                    .map_or_else(|| format!("{o}?"), |i| format!("%{i}"))
            })
            .collect();
        let _ = writeln!(out, "return {}", outs.join(", "));
        out
    }

    /// The printed number (`%n` in [`Graph`]'s Display) of each node.
    pub fn print_numbering(&self) -> HashMap<NodeId, usize> {
        numbering(&print_order(self))
    }

    /// Graphviz `dot` text: one box per node labelled like the text form, edges labelled
    /// with their operand slot when the user has more than one operand.
    pub fn to_dot(&self) -> String {
        let order = print_order(self);
        let num = numbering(&order);
        let mut out = String::from("digraph ndfuse {\n  node [shape=box, fontname=monospace];\n");
        for &id in &order {
            let mut label = String::new();
            write_op(&mut label, self, id, &num);
            let style = if self.is_output(id) {
                ", style=bold"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  n{} [label=\"%{} = {}\"{style}];",
                num[&id],
                num[&id],
                label.replace('\\', "\\\\").replace('"', "\\\"")
            );
        }
        for &id in &order {
            let ops = self.operands(id);
            for (slot, o) in ops.iter().enumerate() {
                let (Some(a), Some(b)) = (num.get(o), num.get(&id)) else {
                    continue;
                };
                if ops.len() > 1 {
                    let _ = writeln!(out, "  n{a} -> n{b} [label=\"{slot}\"];");
                } else {
                    let _ = writeln!(out, "  n{a} -> n{b};");
                }
            }
        }
        out.push_str("}\n");
        out
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text_with(&|_| None))
    }
}
