//! A graph lowered once and evaluated many times with new data for chosen leaves: what a
//! training loop does every step (new batch, new parameters, new step scalars, the same
//! graph). Building the tensors, differentiating and lowering are paid once; each run
//! binds the new data and goes straight to the runtime, whose compile cache already
//! holds the graph's kernels.

use crate::array::Array;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph_cache::{lower_tensors, Bindings};
use crate::report::Report;
use crate::tensor::{Inner, Tensor};
use ndfuse_ir::{Graph, NodeId};
use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;

/// `outputs` lowered once, with `inputs` (data tensors of the graph) as slots that each
/// [`Compiled::run`] fills with new data of the same dtype and shape; every other leaf
/// keeps the data it had when compiled.
///
/// ```
/// let ctx = ndfuse::Context::new();
/// let x = ctx.from_vec(vec![1.0f32, 2.0], &[2])?;
/// let w = ctx.from_vec(vec![3.0f32, 4.0], &[2])?;
/// let f = ctx.compile(&[&(&x * &w).sum(..)], &[&x])?;
/// let out = f.run(&[&ctx.from_vec(vec![10.0f32, 1.0], &[2])?])?;
/// assert_eq!(out[0].to_vec::<f32>()?, vec![34.0]);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Compiled {
    ctx: Context,
    graph: Arc<Graph>,
    /// The input node of each slot, `None` for a slot the outputs do not read.
    slots: Vec<Option<NodeId>>,
    /// The dtype and shape each slot takes.
    types: Vec<(ndfuse_ir::DType, Vec<usize>)>,
    fixed: Bindings,
}

impl Context {
    /// Lowers `outputs` once, with `inputs` as the slots of [`Compiled::run`].
    ///
    /// # Errors
    /// The error an output carries; `Error::Argument` when an input is not a data
    /// tensor (made from data, not an expression).
    #[track_caller]
    pub fn compile(&self, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<Compiled> {
        let at = Location::caller();
        let mut types = Vec::with_capacity(inputs.len());
        for (i, t) in inputs.iter().enumerate() {
            if !t.is_data() {
                return Err(Error::Argument {
                    what: "compile",
                    why: format!("input {i} is an expression, not data"),
                    at,
                });
            }
            types.push((t.dtype()?, t.shape()?.to_vec()));
        }
        let mut leaves: HashMap<*const Inner, NodeId> = HashMap::new();
        let mut fixed = Bindings::new();
        let graph = lower_tensors(outputs, |id, t, e| {
            if let Some(data) = &e.data {
                leaves.insert(Arc::as_ptr(&t.inner), id);
                fixed.insert(id, Arc::clone(data));
            }
        })?;
        let slots: Vec<Option<NodeId>> = inputs
            .iter()
            .map(|t| leaves.get(&Arc::as_ptr(&t.inner)).copied())
            .collect();
        // A slot's data is given at every run: holding the compile-time data would keep
        // it alive (a training step's old parameters would never go back to the cache).
        for n in slots.iter().flatten() {
            fixed.remove(n);
        }
        Ok(Compiled {
            ctx: self.clone(),
            graph: Arc::new(graph),
            slots,
            types,
            fixed,
        })
    }
}

impl Compiled {
    /// Evaluates the outputs with `data[i]` in slot `i` (data tensors of the slot's
    /// dtype and shape).
    #[track_caller]
    pub fn run(&self, data: &[&Tensor]) -> Result<Vec<Array>> {
        Ok(self.run_report(data)?.0)
    }

    /// [`Compiled::run`], also returning the evaluation's report.
    #[track_caller]
    pub fn run_report(&self, data: &[&Tensor]) -> Result<(Vec<Array>, Report)> {
        let at = Location::caller();
        if data.len() != self.slots.len() {
            return Err(Error::Argument {
                what: "Compiled::run",
                why: format!("{} inputs for {} slots", data.len(), self.slots.len()),
                at,
            });
        }
        let mut bindings = self.fixed.clone();
        for (i, (t, slot)) in data.iter().zip(&self.slots).enumerate() {
            let e = t.expr()?;
            let (dtype, shape) = &self.types[i];
            let Some(d) = e
                .data
                .as_ref()
                .filter(|_| e.dtype == *dtype && e.shape.dims() == &shape[..])
            else {
                return Err(Error::Argument {
                    what: "Compiled::run",
                    why: format!(
                        "slot {i} takes data of {dtype}{shape:?}; given {}{:?}{}",
                        e.dtype,
                        e.shape.dims(),
                        if e.data.is_some() {
                            ""
                        } else {
                            " (an expression)"
                        }
                    ),
                    at,
                });
            };
            if let Some(node) = slot {
                bindings.insert(*node, Arc::clone(d));
            }
        }
        self.ctx.eval_graph(Arc::clone(&self.graph), bindings)
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}
