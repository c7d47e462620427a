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
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds an input bound at evaluation time.
    pub fn add_input(&mut self, name: impl Into<String>, dtype: DType, shape: Shape) -> NodeId {
        let op = Op::Input { name: name.into() };
        NodeId(self.g.add_node(Node { op, dtype, shape }))
    }

    /// Adds a constant tensor filled with `value` converted to `dtype`.
    pub fn add_const(&mut self, value: Scalar, dtype: DType, shape: Shape) -> NodeId {
        let op = Op::Const {
            value: value.cast(dtype),
        };
        NodeId(self.g.add_node(Node { op, dtype, shape }))
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
        let id = NodeId(self.g.add_node(node));
        for (slot, &o) in operands.iter().enumerate() {
            let slot = u8::try_from(slot).expect("ops have at most 3 operands");
            self.g.add_edge(o.0, id.0, Slot(slot));
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
        self.outputs.push(id);
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
        self.g.remove_node(id.0);
        self.outputs.retain(|&o| o != id);
    }

    /// Makes every user of `old` (and the output list) refer to `new` instead.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) {
        let edges: Vec<_> = self
            .g
            .edges_directed(old.0, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, target, slot) in edges {
            self.g.remove_edge(e);
            self.g.add_edge(new.0, target, slot);
        }
        for o in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Nodes in a topological order (operands before users), ties broken by the lowest
    /// id so the order is deterministic. `Err` with a node on a cycle if there is one.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, NodeId> {
        let mut indegree: std::collections::HashMap<NodeIndex<u32>, usize> = self
            .g
            .node_indices()
            .map(|n| (n, self.g.edges_directed(n, Direction::Incoming).count()))
            .collect();
        let mut ready: BinaryHeap<std::cmp::Reverse<NodeIndex<u32>>> = indegree
            .iter()
            .filter(|&(_, &d)| d == 0)
            .map(|(&n, _)| std::cmp::Reverse(n))
            .collect();
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(NodeId(n));
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = indegree
                    .get_mut(&e.target())
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
                .filter(|&(_, &d)| d > 0)
                .map(|(&n, _)| n)
                .min()
                .expect("a cycle leaves some node unvisited");
            Err(NodeId(stuck))
        }
    }

    /// The nodes reachable backwards from the outputs (what evaluating them needs), in
    /// topological order. Falls back to all nodes if the graph has a cycle.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        let mut live = vec![false; self.g.node_bound()];
        let mut stack: Vec<NodeId> = self.outputs.clone();
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut live[n.index()], true) {
                stack.extend(self.operands(n));
            }
        }
        self.topo_order()
            .unwrap_or_else(|_| self.node_ids())
            .into_iter()
            .filter(|n| live[n.index()])
            .collect()
    }

    /// A hash of the whole graph (every node's op, dtype, shape and operands, and the
    /// outputs): equal graphs hash equally, so a pass that claims it changed nothing can
    /// be checked without printing the graph twice.
    pub fn fingerprint(&self) -> u64 {
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
    }

    /// Whether `other` is the same graph node for node: the same ids holding the same
    /// ops, dtypes and shapes with the same operands, and the same outputs. (What a
    /// cache keyed by [`Graph::fingerprint`] checks, so a hash collision cannot hit.)
    pub fn same_as(&self, other: &Graph) -> bool {
        self.outputs == other.outputs
            && self.g.node_count() == other.g.node_count()
            && self.g.node_indices().all(|n| {
                other.g.node_weight(n) == self.g.node_weight(n)
                    && self.operands(NodeId(n)) == other.operands(NodeId(n))
            })
    }

    /// The underlying petgraph graph, read-only (for algorithms petgraph provides).
    pub fn petgraph(&self) -> &StableDiGraph<Node, Slot> {
        &self.g
    }
}
