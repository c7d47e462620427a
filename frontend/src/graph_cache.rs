//! The graphs last built from tensors on this thread, so that evaluating the same
//! tensors again skips lowering their expression DAG (a fifth of a small cached
//! re-evaluation) and hands the runtime the very graph value its compile cache holds a
//! clone of (a hit confirmed without comparing nodes: see `Graph::stamp`).
//!
//! Exactness: a tensor's expression never changes once built, so the graph of the same
//! output tensors is always the same graph. An entry names its outputs by `Weak`
//! pointers: while an entry lives, the allocation it points to cannot be reused by
//! another tensor, so pointer equality with a live tensor means the same tensor. An
//! entry keeps no data alive: its leaves are held weakly too (the outputs hold them
//! strongly through their expressions as long as the caller holds the outputs).

use crate::error::Result;
use crate::tensor::{Expr, Inner, Tensor};
use ndfuse_ir::{Graph, HostArray, NodeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Entries kept per thread: enough for a loop that evaluates a few different graphs.
const ENTRIES: usize = 8;

/// Graphs of more nodes are not kept: lowering a large graph again costs little next
/// to running it, and a dead entry's graph stays in memory until it is evicted.
const MAX_NODES: usize = 4096;

/// The data bound to each input node of a graph.
pub(crate) type Bindings = HashMap<NodeId, Arc<HostArray>>;

struct Entry {
    outputs: Vec<Weak<Inner>>,
    graph: Arc<Graph>,
    inputs: Vec<(NodeId, Weak<HostArray>)>,
}

impl Entry {
    fn is_for(&self, outputs: &[&Tensor]) -> bool {
        self.outputs.len() == outputs.len()
            && self
                .outputs
                .iter()
                .zip(outputs)
                .all(|(w, t)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&t.inner)))
    }

    /// The input bindings, `None` if a leaf's data is gone (it cannot be while the
    /// outputs live; rebuilt rather than trusted).
    fn bindings(&self) -> Option<Bindings> {
        self.inputs
            .iter()
            .map(|(n, w)| Some((*n, w.upgrade()?)))
            .collect()
    }

    fn is_dead(&self) -> bool {
        self.outputs.iter().any(|w| w.strong_count() == 0)
    }
}

thread_local! {
    /// Most recently used first.
    static ENTRIES_OF_THREAD: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

/// The graph of `outputs` and its input bindings, as [`build_graph`] makes them, from
/// this thread's cache when the same tensors were evaluated lately.
pub(crate) fn graph_of(outputs: &[&Tensor]) -> Result<(Arc<Graph>, Bindings)> {
    let hit = ENTRIES_OF_THREAD.with_borrow_mut(|entries| {
        entries.retain(|e| !e.is_dead());
        let i = entries.iter().position(|e| e.is_for(outputs))?;
        let bindings = entries[i].bindings()?;
        entries[..=i].rotate_right(1);
        Some((Arc::clone(&entries[0].graph), bindings))
    });
    if let Some(hit) = hit {
        return Ok(hit);
    }
    let (graph, inputs) = build_graph(outputs)?;
    let graph = Arc::new(graph);
    if graph.len() <= MAX_NODES {
        let entry = Entry {
            outputs: outputs.iter().map(|t| Arc::downgrade(&t.inner)).collect(),
            graph: Arc::clone(&graph),
            inputs: inputs
                .iter()
                .map(|(&n, a)| (n, Arc::downgrade(a)))
                .collect(),
        };
        ENTRIES_OF_THREAD.with_borrow_mut(|entries| {
            entries.truncate(ENTRIES - 1);
            entries.insert(0, entry);
        });
    }
    Ok((graph, inputs))
}

/// Lowers the expression DAG under `outputs` into an IR graph plus the data of its
/// leaves. Shared subexpressions become one node. Leaves are named `in0, in1, ...` in
/// the order they are first reached, so equal expressions print identically.
pub(crate) fn build_graph(outputs: &[&Tensor]) -> Result<(Graph, HashMap<NodeId, Arc<HostArray>>)> {
    let mut data = HashMap::new();
    let g = lower_tensors(outputs, |id, _, e| {
        if let Some(arr) = &e.data {
            data.insert(id, Arc::clone(arr));
        }
    })?;
    Ok((g, data))
}

/// The walk under [`build_graph`]: the IR graph of `outputs`, calling `visit` with each
/// node as it is added, the tensor behind it and its expression (for a caller that maps
/// nodes back to tensors, as `grad` does).
pub(crate) fn lower_tensors(
    outputs: &[&Tensor],
    mut visit: impl FnMut(NodeId, &Tensor, &Expr),
) -> Result<Graph> {
    let mut g = Graph::new();
    let mut ids: HashMap<*const Inner, NodeId> = HashMap::new();
    let mut leaves = 0;
    for &t in outputs {
        t.expr()?;
    }
    for &out in outputs {
        // Iterative post-order: deep expression chains must not overflow the stack.
        let mut stack: Vec<(&Tensor, bool)> = vec![(out, false)];
        while let Some((t, expanded)) = stack.pop() {
            let key = Arc::as_ptr(&t.inner);
            if ids.contains_key(&key) {
                continue;
            }
            let e = t.expr()?;
            if !expanded {
                stack.push((t, true));
                for s in e.src.iter().rev() {
                    stack.push((s, false));
                }
                continue;
            }
            let id = match &e.data {
                Some(_) => {
                    leaves += 1;
                    g.add_input(format!("in{}", leaves - 1), e.dtype, e.shape.clone())
                }
                None => {
                    let srcs: Vec<NodeId> =
                        e.src.iter().map(|s| ids[&Arc::as_ptr(&s.inner)]).collect();
                    g.add_node(
                        ndfuse_ir::Node {
                            op: e.op.clone(),
                            dtype: e.dtype,
                            shape: e.shape.clone(),
                        },
                        &srcs,
                    )
                }
            };
            ids.insert(key, id);
            visit(id, t, e);
        }
        g.add_output(ids[&Arc::as_ptr(&out.inner)]);
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    #[test]
    fn the_same_tensors_get_the_same_graph_value_and_data() {
        let ctx = Context::new();
        let x = ctx.rand_uniform(&[8], -1.0, 1.0, 1);
        let y = (&x * 2.0).exp();
        let (g1, b1) = graph_of(&[&y]).expect("graph");
        let (g2, b2) = graph_of(&[&y]).expect("graph");
        assert!(Arc::ptr_eq(&g1, &g2));
        assert_eq!(b1.len(), 1);
        let (n, a) = b1.iter().next().expect("one input");
        assert!(Arc::ptr_eq(a, &b2[n]));
    }

    #[test]
    fn other_tensors_of_the_same_expression_get_their_own_data() {
        let ctx = Context::new();
        let (x1, x2) = (
            ctx.rand_uniform(&[8], -1.0, 1.0, 1),
            ctx.rand_uniform(&[8], -1.0, 1.0, 2),
        );
        let (y1, y2) = (x1.exp(), x2.exp());
        let (g1, b1) = graph_of(&[&y1]).expect("graph");
        let (g2, b2) = graph_of(&[&y2]).expect("graph");
        assert!(!Arc::ptr_eq(&g1, &g2) && g1.same_as(&g2));
        let (n, a1) = b1.iter().next().expect("one input");
        assert!(!Arc::ptr_eq(a1, &b2[n]));
        // And evaluating them gives each its own result.
        let out = ctx.eval(&[&y1]).expect("eval").remove(0);
        let again = ctx.eval(&[&y2]).expect("eval").remove(0);
        assert_ne!(out, again);
        assert_eq!(out, ctx.eval(&[&y1]).expect("eval").remove(0));
    }

    #[test]
    fn an_entry_keeps_no_data_alive() {
        let ctx = Context::new();
        let x = ctx.rand_uniform(&[8], -1.0, 1.0, 1);
        let y = x.exp();
        let (_, bindings) = graph_of(&[&y]).expect("graph");
        let data = Arc::downgrade(bindings.values().next().expect("one input"));
        drop((bindings, x, y));
        assert!(data.upgrade().is_none());
    }

    #[test]
    fn outputs_listed_in_another_order_are_another_graph() {
        let ctx = Context::new();
        let x = ctx.rand_uniform(&[8], -1.0, 1.0, 1);
        let (a, b) = (x.exp(), x.sin());
        let (g1, _) = graph_of(&[&a, &b]).expect("graph");
        let (g2, _) = graph_of(&[&b, &a]).expect("graph");
        assert!(!g1.same_as(&g2));
        let out = ctx.eval(&[&b, &a]).expect("eval");
        assert_eq!(out[0], b.eval().expect("eval"));
        assert_eq!(out[1], a.eval().expect("eval"));
    }
}
