//! The op graph: nodes on a petgraph `StableGraph` (so passes can delete nodes without
//! renumbering the rest), typed node ids, and edges from operand to user that record
//! which operand slot they fill.

use crate::dtype::{DType, Scalar};
use crate::error::{IrError, TensorType};
use crate::infer::infer;
use crate::op::{Node, Op};
use crate::shape::Shape;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A node of a [`Graph`]; printed as `%n`. Ids stay valid while other nodes are removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(NodeIndex<u32>);

impl NodeId {
    /// The raw index (stable for the graph's lifetime).
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0.index())
    }
}

/// The operand slot an edge fills in its user (0 for the first operand).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot(pub u8);

/// A computation graph of tensor ops with a list of outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: StableDiGraph<Node, Slot>,
    outputs: Vec<NodeId>,
    /// What is known about this exact graph value; emptied by every mutation (all of
    /// which go through [`Graph::g_mut`] and [`Graph::outputs_mut`]), kept by `clone`.
    memo: Memo,
}

/// Facts about a graph value, computed on first use.
#[derive(Clone, Debug, Default)]
struct Memo {
    /// [`Graph::fingerprint`].
    fingerprint: OnceLock<u64>,
    /// [`Graph::stamp`].
    stamp: OnceLock<u64>,
    /// [`Graph::live_inputs`].
    live_inputs: OnceLock<Vec<NodeId>>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// The petgraph graph for a change: forgets the memo first.
    fn g_mut(&mut self) -> &mut StableDiGraph<Node, Slot> {
        self.memo = Memo::default();
        &mut self.g
    }

    /// The output list for a change: forgets the memo first.
    fn outputs_mut(&mut self) -> &mut Vec<NodeId> {
        self.memo = Memo::default();
        &mut self.outputs
    }

    /// Adds an input bound at evaluation time.
    pub fn add_input(&mut self, name: impl Into<String>, dtype: DType, shape: Shape) -> NodeId {
        let op = Op::Input { name: name.into() };
        NodeId(self.g_mut().add_node(Node { op, dtype, shape }))
    }

    /// Adds a constant tensor filled with `value` converted to `dtype`.
    pub fn add_const(&mut self, value: Scalar, dtype: DType, shape: Shape) -> NodeId {
        let op = Op::Const {
            value: value.cast(dtype),
        };
        NodeId(self.g_mut().add_node(Node { op, dtype, shape }))
    }

    /// Adds `op` applied to `operands`, inferring its dtype and shape; an `Err` when the
    /// op is not legal on them (see [`crate::infer()`]).
    pub fn add(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId, IrError> {
        let types: Vec<TensorType> = operands.iter().map(|&o| self.ty(o)).collect();
        let t = infer(&op, &types)?;
        Ok(self.add_node(
            Node {
                op,
                dtype: t.dtype,
                shape: t.shape,
            },
            operands,
        ))
    }

    /// Adds a node as given, without inference (for passes and for testing the
    /// verifier, which catches any inconsistency).
    pub fn add_node(&mut self, node: Node, operands: &[NodeId]) -> NodeId {
        let g = self.g_mut();
        let id = NodeId(g.add_node(node));
        for (slot, &o) in operands.iter().enumerate() {
            let slot = u8::try_from(slot)
                .expect("a node has at most 256 operands (the frontend splits longer concats)");
            g.add_edge(o.0, id.0, Slot(slot));
        }
        id
    }

    /// The node's op, dtype and shape.
    ///
    /// # Panics
    /// When `id` is not in this graph (a stale id is a bug in the caller).
    pub fn node(&self, id: NodeId) -> &Node {
        self.g
            .node_weight(id.0)
            .unwrap_or_else(|| panic!("node {id} is not in the graph (a stale id is a bug)"))
    }

    /// The node's dtype and shape.
    pub fn ty(&self, id: NodeId) -> TensorType {
        let n = self.node(id);
        TensorType {
            dtype: n.dtype,
            shape: n.shape.clone(),
        }
    }

    /// Whether `id` names a live node.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.0)
    }

    /// The node's operands in slot order. Edges with duplicate or missing slots (an
    /// invalid graph) come out in slot order as far as they exist; the verifier
    /// reports them.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut ops: Vec<(u8, NodeId)> = self
            .g
            .edges_directed(id.0, Direction::Incoming)
            .map(|e| (e.weight().0, NodeId(e.source())))
            .collect();
        ops.sort_by_key(|&(slot, _)| slot);
        ops.into_iter().map(|(_, n)| n).collect()
    }

    /// The operand slots of `id` as recorded on its edges, sorted (for the verifier).
    pub fn operand_slots(&self, id: NodeId) -> Vec<u8> {
        let mut s: Vec<u8> = self
            .g
            .edges_directed(id.0, Direction::Incoming)
            .map(|e| e.weight().0)
            .collect();
        s.sort_unstable();
        s
    }

    /// The nodes that use `id` as an operand, each once, in id order.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let mut u: Vec<NodeId> = self
            .g
            .neighbors_directed(id.0, Direction::Outgoing)
            .map(NodeId)
            .collect();
        u.sort_unstable();
        u.dedup();
        u
    }

    /// The graph's outputs, in the order the user asked for them.
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Marks `id` as an output (a node may be listed more than once).
    pub fn add_output(&mut self, id: NodeId) {
        self.outputs_mut().push(id);
    }

    /// Whether `id` is one of the outputs.
    pub fn is_output(&self, id: NodeId) -> bool {
        self.outputs.contains(&id)
    }

    /// Every live node id, in id order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.g.node_indices().map(NodeId).collect()
    }

    /// Number of live nodes.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// Removes a node and its edges. Users of it become invalid (the verifier says so).
    pub fn remove(&mut self, id: NodeId) {
        self.g_mut().remove_node(id.0);
        self.outputs_mut().retain(|&o| o != id);
    }

    /// Makes every user of `old` (and the output list) refer to `new` instead.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) {
        let edges: Vec<_> = self
            .g
            .edges_directed(old.0, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        let g = self.g_mut();
        for (e, target, slot) in edges {
            g.remove_edge(e);
            g.add_edge(new.0, target, slot);
        }
        for o in self.outputs_mut() {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Nodes in a topological order (operands before users), ties broken by the lowest
    /// id so the order is deterministic. `Err` with a node on a cycle if there is one.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, NodeId> {
        // In-degrees by raw index (a vector, not a map: this runs on every evaluation);
        // `None` for indices of removed nodes.
        let mut indegree: Vec<Option<usize>> = vec![None; self.g.node_bound()];
        let mut ready = BinaryHeap::new();
        for n in self.g.node_indices() {
            let d = self.g.edges_directed(n, Direction::Incoming).count();
            indegree[n.index()] = Some(d);
            if d == 0 {
                ready.push(std::cmp::Reverse(n));
            }
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(NodeId(n));
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = indegree[e.target().index()]
                    .as_mut()
                    .expect("edge target is a node");
                *d -= 1;
                if *d == 0 {
                    ready.push(std::cmp::Reverse(e.target()));
                }
            }
        }
        if order.len() == self.g.node_count() {
            Ok(order)
        } else {
            let stuck = indegree
                .iter()
                .position(|d| d.is_some_and(|d| d > 0))
                .expect("a cycle leaves some node unvisited");
            Err(NodeId(NodeIndex::new(stuck)))
        }
    }

    /// Whether each raw index is a node the outputs need (indexed by [`NodeId::index`],
    /// `node_bound` long).
    fn live_mask(&self) -> Vec<bool> {
        let mut live = vec![false; self.g.node_bound()];
        let mut stack: Vec<NodeIndex<u32>> = self.outputs.iter().map(|o| o.0).collect();
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut live[n.index()], true) {
                stack.extend(self.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        live
    }

    /// The nodes reachable backwards from the outputs (what evaluating them needs), in
    /// topological order. Falls back to all nodes if the graph has a cycle.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        let live = self.live_mask();
        self.topo_order()
            .unwrap_or_else(|_| self.node_ids())
            .into_iter()
            .filter(|n| live[n.index()])
            .collect()
    }

    /// The input nodes the outputs need, in id order (a cheaper walk than
    /// [`Graph::live_nodes`] when only the inputs matter; the executor checks their
    /// bindings on every evaluation). Computed once per graph value.
    pub fn live_inputs(&self) -> &[NodeId] {
        self.memo.live_inputs.get_or_init(|| {
            let live = self.live_mask();
            self.g
                .node_indices()
                .filter(|n| live[n.index()] && self.g[*n].op.is_input())
                .map(NodeId)
                .collect()
        })
    }

    /// A hash of the whole graph (every node's op, dtype, shape and operands, and the
    /// outputs): equal graphs hash equally, so a pass that claims it changed nothing can
    /// be checked without printing the graph twice. Computed once per graph value (a
    /// clone keeps it, a change forgets it).
    pub fn fingerprint(&self) -> u64 {
        *self.memo.fingerprint.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for n in self.g.node_indices() {
                let node = &self.g[n];
                (n.index(), &node.op, node.dtype, &node.shape).hash(&mut h);
                for e in self.g.edges_directed(n, Direction::Incoming) {
                    (e.source().index(), e.weight().0).hash(&mut h);
                }
            }
            self.outputs.hash(&mut h);
            h.finish()
        })
    }

    /// A number no other graph value of this process has: clones share it (they are
    /// the same value), and any change gives the graph a new one on the next call.
    /// Graphs with equal stamps are equal, which lets [`Graph::same_as`] answer a cache
    /// holding a clone of this graph without comparing nodes.
    pub fn stamp(&self) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        *self
            .memo
            .stamp
            .get_or_init(|| NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether `other` is the same graph node for node: the same ids holding the same
    /// ops, dtypes and shapes with the same operands, and the same outputs. (What a
    /// cache keyed by [`Graph::fingerprint`] checks, so a hash collision cannot hit.)
    pub fn same_as(&self, other: &Graph) -> bool {
        if let (Some(a), Some(b)) = (self.memo.stamp.get(), other.memo.stamp.get()) {
            if a == b {
                return true;
            }
        }
        // Operands as (slot, source) pairs in slot order, in two buffers reused
        // across nodes.
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        let operands = |g: &Graph, n: NodeIndex<u32>, buf: &mut Vec<(u8, usize)>| {
            buf.clear();
            buf.extend(
                g.g.edges_directed(n, Direction::Incoming)
                    .map(|e| (e.weight().0, e.source().index())),
            );
            buf.sort_unstable();
        };
        self.outputs == other.outputs
            && self.g.node_count() == other.g.node_count()
            && self.g.node_indices().all(|n| {
                if other.g.node_weight(n) != self.g.node_weight(n) {
                    return false;
                }
                operands(self, n, &mut mine);
                operands(other, n, &mut theirs);
                mine == theirs
            })
    }

    /// The underlying petgraph graph, read-only (for algorithms petgraph provides).
    pub fn petgraph(&self) -> &StableDiGraph<Node, Slot> {
        &self.g
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::UnaryOp;

    fn exp_of_input() -> Graph {
        let mut g = Graph::new();
        let x = g.add_input("x", DType::F32, Shape::from(&[4][..]));
        let y = g.add(Op::Unary(UnaryOp::Exp), &[x]).expect("exp of f32");
        g.add_output(y);
        g
    }

    #[test]
    fn a_clone_shares_the_stamp_and_a_change_drops_it() {
        let g = exp_of_input();
        let stamp = g.stamp();
        let mut c = g.clone();
        assert_eq!(c.stamp(), stamp);
        assert!(c.same_as(&g));
        let fp = c.fingerprint();
        let x = c.node_ids()[0];
        c.add_output(x);
        assert_ne!(c.stamp(), stamp, "a changed graph must not keep its stamp");
        assert_ne!(c.fingerprint(), fp, "nor its fingerprint");
        assert!(!c.same_as(&g) && !g.same_as(&c));
    }

    #[test]
    fn same_as_compares_nodes_when_stamps_differ() {
        let (a, b) = (exp_of_input(), exp_of_input());
        assert_ne!(a.stamp(), b.stamp());
        assert!(a.same_as(&b));
        let mut c = exp_of_input();
        let x = c.node_ids()[0];
        let y = c.add(Op::Unary(UnaryOp::Neg), &[x]).expect("neg of f32");
        c.replace_all_uses(c.outputs()[0], y);
        assert!(!a.same_as(&c));
    }

    #[test]
    fn live_inputs_are_the_inputs_live_nodes_lists() {
        let mut g = exp_of_input();
        let _unused = g.add_input("z", DType::F32, Shape::from(&[4][..]));
        let w = g.add_input("w", DType::F32, Shape::from(&[4][..]));
        let x = g.node_ids()[0];
        let s = g
            .add(Op::Binary(crate::op::BinaryOp::Add), &[w, x])
            .expect("add");
        g.add_output(s);
        let from_live: Vec<NodeId> = g
            .live_nodes()
            .into_iter()
            .filter(|&n| g.node(n).op.is_input())
            .collect();
        assert_eq!(g.live_inputs(), from_live);
        assert_eq!(from_live.len(), 2);
    }
}
