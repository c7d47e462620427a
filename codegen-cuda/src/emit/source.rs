//! The emitter's state for one kernel (`Gen`) and the translation unit around the plan
//! code: the header comment, includes and index type, the helpers the body asked for,
//! each function's signature, launch geometry, and the scratch buffer's layout.

use super::launch::{CudaKernel, CudaOptions, Launch};
use crate::scalar::{self, Helper};
use ndfuse_ir::{Expr, Kernel, Level, Plan};
use std::collections::BTreeSet;
use std::fmt::Write as _;

pub(super) struct Gen<'k> {
    pub(super) k: &'k Kernel,
    pub(super) opts: CudaOptions,
    pub(super) needs: BTreeSet<Helper>,
    pub(super) levels: Vec<Level>,
    /// Per instruction: 0 if it needs no reduction result, else one more than the
    /// sweep of the latest reduction it depends on (a reduction runs in sweep
    /// `stage - 1`).
    pub(super) stage: Vec<usize>,
    pub(super) sweeps: usize,
    pub(super) body: String,
    /// Index type: `int` when every position and offset fits, else `long long`.
    pub(super) wide: bool,
}

impl<'k> Gen<'k> {
    pub(super) fn new(k: &'k Kernel, opts: &CudaOptions) -> Gen<'k> {
        let (stage, sweeps) = k.stages();
        let limit = (i32::MAX / 2) as usize;
        // Random ops' and positions' offsets are offsets too, into no buffer (a slice of
        // a huge op may reach past 2^31 from a small domain). A gather's offsets stay in
        // its buffer (`Kernel::check`), and its indices are clamped in 64 bits before
        // they are narrowed.
        let random_reach = k.body.iter().any(|ins| match &ins.expr {
            Expr::Random { view, .. } | Expr::Position { view } => {
                view.span().is_some_and(|(_, hi)| hi > limit as i128)
            }
            _ => false,
        });
        let wide = k.domain.numel() > limit
            || random_reach
            || k.inputs.iter().chain(&k.outputs).any(|b| b.len > limit);
        let mut opts = *opts;
        opts.max_block_size = pow2_floor(opts.max_block_size.clamp(32, 1024));
        opts.max_grid_size = opts.max_grid_size.max(1);
        Gen {
            k,
            opts,
            needs: BTreeSet::new(),
            levels: k.levels(),
            stage,
            sweeps,
            body: String::new(),
            wide,
        }
    }

    pub(super) fn finish(self, launches: Vec<Launch>, strategy: String) -> CudaKernel {
        let k = self.k;
        let uses_half = k
            .inputs
            .iter()
            .chain(&k.outputs)
            .map(|b| b.dtype)
            .chain(k.body.iter().map(|i| i.dtype))
            .chain(k.contraction.iter().flat_map(|c| {
                c.lhs_prologue
                    .iter()
                    .chain(&c.rhs_prologue)
                    .filter_map(|s| match s {
                        ndfuse_ir::Prologue::Cast(to) => Some(*to),
                        _ => None,
                    })
            }))
            .any(scalar::is_half);
        let mut src = String::new();
        let _ = writeln!(
            src,
            "// ndfuse kernel {}: domain {}{}, plan {}",
            k.name,
            k.domain,
            if k.reduce_axes.is_empty() {
                String::new()
            } else {
                format!(" reducing axes {:?}", k.reduce_axes)
            },
            k.plan
        );
        let _ = writeln!(src, "// {strategy}");
        if uses_half {
            src.push_str("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
        }
        let _ = writeln!(
            src,
            "typedef {} nd_idx;",
            if self.wide { "long long" } else { "int" }
        );
        src.push_str(&scalar::helper_source(&self.needs));
        src.push_str(&self.body);
        let scratch_bytes = self.scratch_layout().1;
        CudaKernel {
            name: k.name.clone(),
            source: src,
            launches,
            scratch_bytes,
            strategy,
            uses_half,
        }
    }

    /// `extern "C" __global__ void NAME(params) {` with launch bounds. A contraction's
    /// product has no parameter: the GEMM keeps it in registers.
    pub(super) fn open_function(&mut self, name: &str, threads: u32) {
        let k = self.k;
        let product = k.contraction.as_ref().map(|c| c.product);
        let mut params: Vec<String> = k
            .inputs
            .iter()
            .enumerate()
            .filter(|&(i, _)| Some(i) != product)
            .map(|(i, b)| {
                format!(
                    "const {}* __restrict__ in{i}",
                    scalar::storage_type(b.dtype)
                )
            })
            .collect();
        params.extend(
            k.outputs
                .iter()
                .enumerate()
                .map(|(i, b)| format!("{}* __restrict__ out{i}", scalar::storage_type(b.dtype))),
        );
        if self.scratch_layout().1 > 0 {
            params.push("unsigned char* __restrict__ scratch".into());
        }
        let _ = writeln!(
            self.body,
            "\nextern \"C\" __global__ void __launch_bounds__({threads}) {name}({}) {{",
            params.join(", ")
        );
    }

    pub(super) fn grid_for(&self, work_items: usize, per_block: usize) -> u32 {
        let blocks = work_items.div_ceil(per_block.max(1)).max(1);
        blocks.min(self.opts.max_grid_size as usize) as u32
    }

    /// Accumulator C types of reduction `i`: (value type, whether it carries an index).
    pub(super) fn acc_types(&self, i: usize) -> (&'static str, bool) {
        match &self.k.body[i].expr {
            Expr::Reduce(_, _) => (scalar::compute_type(self.k.body[i].dtype), false),
            Expr::ArgReduce(_, a) => (scalar::compute_type(self.k.body[a.index()].dtype), true),
            _ => unreachable!("acc_types of a reduction"),
        }
    }

    // -----------------------------------------------------------------------------------
    // The scratch buffer (split reductions' partials and results)

    /// Byte layout of the scratch buffer: per reduction (in body order), its partials
    /// (`rows * splits` accumulator values, then as many i64 indices for
    /// arg-reductions) and its results (`rows` values of the instruction's type).
    /// Returns (per reduction: instruction, partials offset, results offset) and the
    /// total, every region 16-byte aligned.
    pub(super) fn scratch_layout(&self) -> (Vec<(usize, usize, usize)>, usize) {
        let Plan::Split { rows, splits, .. } = self.k.plan else {
            return (Vec::new(), 0);
        };
        let mut at = 0usize;
        let mut slots = Vec::new();
        for (i, ins) in self.k.body.iter().enumerate() {
            if !matches!(ins.expr, Expr::Reduce(..) | Expr::ArgReduce(..)) {
                continue;
            }
            let (t, arg) = self.acc_types(i);
            let partials = at;
            at = (at + rows * splits * c_size(t)).next_multiple_of(16);
            if arg {
                at = (at + rows * splits * 8).next_multiple_of(16);
            }
            let results = at;
            at = (at + rows * c_size(scalar::compute_type(ins.dtype))).next_multiple_of(16);
            slots.push((i, partials, results));
        }
        (slots, at)
    }

    /// (partials offset, results offset) of reduction `i` in the scratch buffer.
    pub(super) fn scratch_slot(&self, i: usize) -> (usize, usize) {
        let (slots, _) = self.scratch_layout();
        let (_, p, r) = slots
            .into_iter()
            .find(|s| s.0 == i)
            .expect("every reduction has a scratch slot");
        (p, r)
    }
}

fn pow2_floor(x: u32) -> u32 {
    if x == 0 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

/// Bytes of one value of C type `t`.
pub(super) fn c_size(t: &str) -> usize {
    match t {
        "double" | "long long" => 8,
        "bool" => 1,
        _ => 4,
    }
}
