//! Evaluation: the tensors' graph (cached per thread) run on the context's backend or
//! device set, one graph or a batch over every device, and what it did
//! ([`Report`]); placing data on devices; explaining a graph without running it.

use crate::array::Array;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph_cache::build_graph;
use crate::report::{DeviceArray, Report};
use crate::tensor::Tensor;
use ndfuse_ir::Graph;
use ndfuse_runtime::{BackendKind, Config, DeviceId, Evaluation};
use std::sync::Arc;

impl Context {
    /// Evaluates several tensors in one graph (shared subexpressions are computed once)
    /// on this context's backend.
    pub fn eval(&self, outputs: &[&Tensor]) -> Result<Vec<Array>> {
        Ok(self.eval_report(outputs)?.0)
    }

    /// Like [`Context::eval`], also returning what happened: the kernels, the path each
    /// part took, and timings.
    pub fn eval_report(&self, outputs: &[&Tensor]) -> Result<(Vec<Array>, Report)> {
        let (graph, inputs) = crate::graph_cache::graph_of(outputs)?;
        self.eval_graph(graph, inputs)
    }

    /// Evaluates a lowered graph with its input bindings on this context's backend or
    /// device set.
    pub(crate) fn eval_graph(
        &self,
        graph: Arc<Graph>,
        inputs: crate::graph_cache::Bindings,
    ) -> Result<(Vec<Array>, Report)> {
        let own = self.own_devices();
        let ev = match own {
            Some(set) => {
                let cfg = Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
                set.execute(&graph, &inputs, &cfg)?
            }
            // The runtime places bound threads (and every thread under
            // `allow_multi_gpu`) on the process's device set.
            None => ndfuse_runtime::execute(&graph, &inputs, self.backend())?,
        };
        Ok(report(graph, ev))
    }

    /// Evaluates independent groups of outputs (each group one graph, as
    /// [`Context::eval`]) over every device of the context's set at once: one group per
    /// device in priority order, GPUs before CPUs with the default priorities. The
    /// first error, if any, is returned.
    pub fn eval_batch(&self, batch: &[&[&Tensor]]) -> Result<Vec<Vec<Array>>> {
        Ok(self
            .eval_batch_report(batch)?
            .into_iter()
            .map(|(a, _)| a)
            .collect())
    }

    /// Like [`Context::eval_batch`], with each group's report (its device, and the
    /// devices it left because they ran out of memory).
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.arange(0.0, 4.0, 1.0)?;
    /// let (a, b) = (x.exp(), &x * 2.0);
    /// let out = ctx.eval_batch_report(&[&[&a], &[&b]])?;
    /// assert_eq!(out[1].0[0].to_vec::<f32>()?, vec![0.0, 2.0, 4.0, 6.0]);
    /// assert!(out.iter().all(|(_, r)| r.moves().is_empty()));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn eval_batch_report(&self, batch: &[&[&Tensor]]) -> Result<Vec<(Vec<Array>, Report)>> {
        let built = batch
            .iter()
            .map(|outputs| crate::graph_cache::graph_of(outputs))
            .collect::<Result<Vec<_>>>()?;
        let cfg = Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
        let set = self.devices()?;
        let jobs: Vec<_> = built.iter().map(|(g, i)| (&**g, i)).collect();
        let results = set.execute_batch(&jobs, &cfg);
        built
            .into_iter()
            .zip(results)
            .map(|((graph, _), r)| Ok(report(graph, r?)))
            .collect()
    }

    /// A copy of `a` made for `device` of this context's set, which records where it
    /// went. On a CPU device the copy is written by that device's threads (first touch
    /// places its pages near them); on a GPU it is a host copy (an `Array` handed back by
    /// value cannot be tracked): [`Context::keep_on_device`] keeps a tensor's data on
    /// a GPU between evaluations. `Err` when the set has no such device.
    ///
    /// ```
    /// use ndfuse::{Context, DeviceId};
    /// let ctx = Context::new();
    /// let a = ctx.ones(&[3]).eval()?;
    /// let on = ctx.to_device(&a, &DeviceId::cpu(0))?;
    /// assert_eq!((on.device(), on.array()), (&DeviceId::cpu(0), &a));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn to_device(&self, a: &Array, device: &DeviceId) -> Result<DeviceArray> {
        self.to_device_copy(a, device)
    }

    /// Keeps the data of `t`, a tensor made from data (`from_vec`, `from_array`, the
    /// random constructors...), on `device` for the evaluations that follow, as long as
    /// `t` (or a tensor built from it) lives: a GPU uploads it once now instead of at
    /// every evaluation; on the host there is nothing to move. `Err` for a tensor that
    /// holds no data of its own (an expression: evaluate it and make a tensor of the
    /// result) or a device not in the set.
    ///
    /// ```
    /// use ndfuse::{Context, DeviceId};
    /// let ctx = Context::new();
    /// let w = ctx.rand_normal(&[256, 256], 0.0, 1.0, 7);
    /// ctx.keep_on_device(&w, &DeviceId::cpu(0))?;
    /// assert!(ctx.keep_on_device(&(&w * 2.0), &DeviceId::cpu(0)).is_err());
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn keep_on_device(&self, t: &Tensor, device: &DeviceId) -> Result<()> {
        let at = std::panic::Location::caller();
        let e = t.expr()?;
        let Some(data) = &e.data else {
            return Err(Error::Argument {
                what: "keep_on_device",
                why: "the tensor is an expression, not data: evaluate it and keep a tensor of the result".into(),
                at,
            });
        };
        self.devices()?.make_resident(data, device)?;
        Ok(())
    }

    fn to_device_copy(&self, a: &Array, device: &DeviceId) -> Result<DeviceArray> {
        let copy = self.devices()?.to_device(&a.0, device)?;
        Ok(DeviceArray {
            array: Array(copy),
            device: device.clone(),
        })
    }

    /// The graph the given tensors compile to, in the stable text form, before any
    /// pass ran (`%4 = add %2, %3 : f32[4,8]`).
    pub fn graph_text(&self, outputs: &[&Tensor]) -> Result<String> {
        Ok(build_graph(outputs)?.0.to_string())
    }
}

/// The outputs moved out of `ev` and the report that keeps the rest.
fn report(graph: Arc<Graph>, mut ev: Evaluation) -> (Vec<Array>, Report) {
    // Moved, not copied: the arrays are the host cache's buffers and go back to it
    // when the caller drops them (the report's evaluation keeps no outputs).
    let arrays = std::mem::take(&mut ev.outputs)
        .into_iter()
        .map(Array)
        .collect();
    (arrays, Report { graph, ev })
}

impl Context {
    /// The IR graph the given tensors compile to, before any pass ran, without
    /// evaluating anything: for tools that schedule or inspect it (`ndfuse explain`).
    /// Inputs are named `in0, in1, ...` as in [`Context::graph_text`].
    pub fn graph(&self, outputs: &[&Tensor]) -> Result<Graph> {
        Ok(build_graph(outputs)?.0)
    }

    /// What evaluating `outputs` on this context's backend does, without running it: the
    /// graph, where each node goes (kernel, stored and why, or the interpreter), every
    /// kernel description with the path it takes and the bytes it moves, and the
    /// generated Cranelift IR. Kernels are compiled into the cache on the way.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.rand_uniform(&[4, 8], -1.0, 1.0, 0);
    /// let text = ctx.explain(&[&(x.exp() * 2.0).sum(1)])?;
    /// assert!(text.contains("== kernels") && text.contains("k0_exp_mul_sum"));
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn explain(&self, outputs: &[&Tensor]) -> Result<String> {
        let g = self.graph(outputs)?;
        let ex = ndfuse_runtime::explain(&g, self.backend())?;
        Ok(explain_text(&ex))
    }
}

/// Formats an explanation in sections (`== graph`, `== passes`, `== schedule`,
/// `== kernels`, `== code`).
fn explain_text(ex: &ndfuse_runtime::Explanation) -> String {
    use ndfuse_passes::Step;
    use std::fmt::Write as _;
    let mut s = String::new();
    let g = &ex.graph;
    if let Some(log) = &ex.passes {
        let input = log.input.clone().unwrap_or_default();
        let _ = writeln!(s, "== graph\n{input}");
        let _ = writeln!(
            s,
            "== passes (IR after each; unchanged passes marked)\n{}",
            log.to_text(false)
        );
    } else {
        let _ = writeln!(s, "== graph\n{g}");
    }
    let Some(sched) = &ex.schedule else {
        let _ = writeln!(
            s,
            "== schedule (backend {})\nnone: every node is evaluated by the f64 reference interpreter, one at a time; nothing is fused or compiled",
            ex.backend.name()
        );
        return s;
    };
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let kernels = sched.kernel_count();
    let _ = writeln!(
        s,
        "== schedule (backend {}: {}, {})",
        ex.backend.name(),
        plural(kernels, "kernel"),
        plural(sched.steps.len() - kernels, "interpreter step")
    );
    s.push_str(&sched.annotate(g, &|i| ex.paths.get(i).map(|p| p.short().to_string())));
    let _ = writeln!(s, "\n== kernels");
    let num = g.print_numbering();
    for (i, (step, path)) in sched.steps.iter().zip(&ex.paths).enumerate() {
        match step {
            Step::Kernel { kernel, .. } => {
                let _ = writeln!(
                    s,
                    "step {i}: {} [{path}] reads {} B, writes {} B",
                    kernel.name,
                    kernel.bytes_in(),
                    kernel.bytes_out()
                );
                let _ = write!(s, "{kernel}");
            }
            Step::Interp { node, reason, .. } => {
                let n = num
                    .get(node)
                    .map_or_else(|| "?".into(), ToString::to_string);
                let _ = writeln!(
                    s,
                    "step {i}: interp %{n} {} ; {reason}",
                    g.node(*node).op.name()
                );
            }
        }
    }
    let cuda = ex.backend == BackendKind::Cuda;
    let _ = writeln!(
        s,
        "\n== code ({})",
        if cuda {
            "CUDA C, as NVRTC compiles it, with its launches"
        } else {
            "Cranelift IR, before Cranelift's own optimisations"
        }
    );
    if ex.code.is_empty() {
        let _ = writeln!(s, "(no kernel is compiled)");
    }
    let comment = if cuda { "//" } else { ";" };
    for (name, code) in &ex.code {
        let _ = writeln!(s, "{comment} {name}\n{}", code.trim_end());
    }
    s
}
