//! The graph verifier: checks every structural and typing invariant and reports every
//! problem it finds, not only the first. The pass manager runs it after each pass in
//! debug and test builds.

use crate::graph::{Graph, NodeId};
use crate::infer::infer;
use crate::op::Op;
use std::collections::HashMap;
use std::fmt;

/// One problem found by [`verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The offending node (raw id), when the problem is about one node.
    pub node: Option<NodeId>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.node {
            Some(n) => write!(f, "{n}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// All problems of a graph, printed one a line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the graph is invalid ({} problems):\n{}", .0.len(), .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
pub struct VerifyErrors(pub Vec<VerifyError>);

/// Checks `g`: operand counts and slots, types against [`infer`], acyclicity, outputs
/// that exist, unique input names. `Ok` or every problem.
pub fn verify(g: &Graph) -> Result<(), VerifyErrors> {
    let mut errs = Vec::new();
    let mut err = |node: Option<NodeId>, message: String| errs.push(VerifyError { node, message });

    if let Err(n) = g.topo_order() {
        err(Some(n), "is on a cycle".into());
    }
    let mut names: HashMap<&str, NodeId> = HashMap::new();
    for id in g.node_ids() {
        let node = g.node(id);
        let slots = g.operand_slots(id);
        let want: Vec<u8> = (0..node.op.arity() as u8).collect();
        if slots != want {
            err(
                Some(id),
                format!(
                    "{} expects operand slots {want:?}, has {slots:?}",
                    node.op.name()
                ),
            );
            continue;
        }
        match &node.op {
            Op::Input { name } => {
                if let Some(prev) = names.insert(name, id) {
                    err(
                        Some(id),
                        format!("input name {name:?} is also used by {prev}"),
                    );
                }
            }
            Op::Const { value } => {
                if value.cast(node.dtype) != *value {
                    err(
                        Some(id),
                        format!("constant {value} is not a {} value", node.dtype),
                    );
                }
            }
            op => {
                let types: Vec<_> = g.operands(id).into_iter().map(|o| g.ty(o)).collect();
                match infer(op, &types) {
                    Err(e) => err(Some(id), e.to_string()),
                    Ok(t) if t.dtype != node.dtype || t.shape != node.shape => err(
                        Some(id),
                        format!(
                            "{} is typed {}{} but its operands give {t}",
                            op.name(),
                            node.dtype,
                            node.shape
                        ),
                    ),
                    Ok(_) => {}
                }
            }
        }
    }
    for &o in g.outputs() {
        if !g.contains(o) {
            err(None, format!("output {o} is not a node"));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(VerifyErrors(errs))
    }
}
