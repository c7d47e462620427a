//! The row cache of a row program: element values that a later sweep needs and that
//! cost a transcendental to recompute are kept, one row at a time, in a buffer on the
//! kernel function's stack (so each thread has its own).
//!
//! ```text
//! softmax, without the cache:          with it (e = exp(x - m) cached):
//!   sweep 0: m = max x                   sweep 0: m = max x
//!   sweep 1: s = sum exp(x - m)          sweep 1: e = exp(x - m); cache[j] = e; s = sum e
//!   stores:  out = exp(x - m) / s        stores:  out = cache[j] / s
//! ```
//!
//! A cached value is the very value the first sweep computed (vector and scalar code
//! give the same bits: `vmath`), stored in its register type and loaded back, so results
//! are unchanged bit for bit. Whether a kernel caches, and what, depends on its body and
//! shapes only (the buffer has a fixed size limit, [`ROW_CACHE_BYTES`]), never on the
//! number of threads. Split kernels, whose row is spread over calls, never cache.
//!
//! With a wide tier (`Lowering::wide`), a value `op(u)` whose op has a wide routine
//! (exp, expm1, tanh, sigmoid, erf, log, log1p on f32; f16 and bf16 compute in f32)
//! is made a whole row at a time, before the first sweep that needs it, by a *fill
//! pass*: a loop that computes `u` (the same instructions as before) into the value's
//! row, then one call of the routine over the row in place; every sweep loads it.
//!
//! ```text
//! softmax on the wide path:
//!   sweep 0: m = ndfuse_wide_max(x, row_len)      (f32 x contiguous along the row)
//!   fill:    cache[j] = x - m;  ndfuse_wide_exp(cache, cache, row_len)
//!            (f32 x contiguous along the row: ndfuse_wide_exp_shift(x, m, cache, row_len,
//!            next row of x), which fetches the next row into L2 meanwhile)
//!   sweep 1: s = ndfuse_wide_sum(cache, row_len)
//!   stores:  out = cache[j] / s                    (ndfuse_wide_div(cache, s, out, row_len);
//!                                                   `_stream` past 64 MiB of output)
//! ```
//!
//! The routine gives the inline code's bits (`wide`), so the cached values are the
//! same. A sweep that is one f32 sum of a filled value and nothing else is one call of
//! the wide row sum (`wide::reduce`, `rows`), in its own order of additions, fixed by
//! the row's length: its bits are the same on every tier and thread count but may
//! differ from the 128-bit loop's. Any other sum's bits depend on its loop's shape
//! (vector or scalar, accumulators), which is decided from the values the sweep has on
//! the 128-bit code ([`CachePlan::narrow_need`]); the wide plan is kept only where each
//! sweep has a subset of those, else the kernel takes the 128-bit plan. Values that feed one
//! sweep only (log-sum-exp's exp) are made this way too: the routine's speed pays for
//! writing and reading the row in L1 or L2. Kernels below `blocks::BLOCKS_FROM`
//! positions stay on the 128-bit code, as element-wise ones do.

use super::function::{cl_type, Lowering, Offset};
use crate::wide::Tier;
use cranelift_codegen::ir::AbiParam;
use cranelift_codegen::ir::{
    types, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_module::Linkage;
use cranelift_module::Module;
use ndfuse_ir::{BinaryOp, DKind, DType, Expr, Kernel, Level, UnaryOp};
use std::sync::OnceLock;

/// The largest row cache, in bytes: every cached value of a row together. Small enough
/// for any thread's stack (rayon's workers get 2 MiB) and for the L2 cache of a core,
/// large enough for a softmax row of 16K f32.
pub(super) const ROW_CACHE_BYTES: i64 = 64 * 1024;

/// Bytes between stack probes: the guard page size the stack of a thread has at least.
const PROBE_STEP: i64 = 4096;

/// What one pass over a row computes, loads from the cache and stores to it.
#[derive(Clone)]
pub(super) struct Pass {
    /// The element values it has (computed, or loaded from the cache).
    pub need: Vec<bool>,
    /// The element values it loads from the cache instead of computing.
    pub load: Vec<bool>,
    /// The element values it stores to the cache after computing them.
    pub store: Vec<bool>,
    /// For a fill pass: the wide values whose operand it stores into their rows, each
    /// then run over its row in place by its wide routine (none for a sweep).
    pub fill: Vec<usize>,
}

/// What each pass of a row program computes, loads from the cache and stores to it.
/// Passes `0..=sweeps` are the sweeps, numbered as the reduction sweeps (0..sweeps),
/// the store sweep last; the fill passes (with a wide tier only) come after them and
/// run where [`CachePlan::before`] says.
pub(super) struct CachePlan {
    pub passes: Vec<Pass>,
    /// Per sweep: the fill passes that run before it, in order.
    pub before: Vec<Vec<usize>>,
    /// Per sweep: the element values it has on the 128-bit code alone. The shape of a
    /// reduction's vector loop (vector or scalar, accumulators), and so the bits of a
    /// sum, is decided from these on either path.
    pub narrow_need: Vec<Vec<bool>>,
    /// Per instruction: the byte offset of its row in the cache, if cached.
    pub at: Vec<Option<i64>>,
    /// Bytes of the whole cache.
    pub bytes: i64,
}

/// Whether `expr` is an op whose recomputation is worth a load: a transcendental (a
/// polynomial of tens of operations, or a call).
fn costly(expr: &Expr) -> bool {
    match expr {
        Expr::Unary(op, _) => matches!(
            op,
            UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Expm1
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Erf
        ),
        Expr::Binary(op, _, _) => *op == BinaryOp::Pow,
        _ => false,
    }
}

/// The cache plan of a row program whose sweeps compute the element values `targets`
/// (one list per sweep, the store sweep last), over rows of `row_len` elements; `None`
/// when nothing is worth caching or fits.
///
/// Sweeps are planned in order. The values a sweep needs are found walking the body
/// backwards from its targets, so a value is met before its operands: one that an
/// earlier sweep computed, contains a transcendental and fits in what is left of the
/// cache is loaded instead of computed, and its operands are not needed for it.
///
/// With a wide tier (`wide`), an element value `op(u)` whose op has a wide routine is
/// made for the whole row before the first sweep that needs it, when its row fits: a
/// fill pass computes `u` into the value's row, the routine runs over the row in
/// place, and every sweep loads it. The routine gives the inline code's bits, so the
/// values are the same; the plan is kept only where no sweep then computes a value it
/// did not compute on the 128-bit code (see [`CachePlan::narrow_need`]).
pub(super) fn plan(
    kernel: &Kernel,
    levels: &[Level],
    targets: &[Vec<usize>],
    row_len: i64,
    wide: Option<Tier>,
) -> Option<CachePlan> {
    let narrow = Planner::new(kernel, levels, row_len, None).run(targets);
    let narrow_need: Vec<Vec<bool>> = match &narrow {
        Some(p) => p.passes[..targets.len()]
            .iter()
            .map(|p| p.need.clone())
            .collect(),
        None => targets
            .iter()
            .map(|t| element_closure(kernel, levels, t))
            .collect(),
    };
    // Small kernels stay on the 128-bit code, as element-wise ones do (`blocks`):
    // their compile time matters more than their run time.
    let with_wide = wide
        .filter(|_| crate::vmath::builder::use_fma())
        .filter(|_| kernel.domain.numel() >= crate::blocks::BLOCKS_FROM)
        .and_then(|t| Planner::new(kernel, levels, row_len, Some(t)).run(targets))
        .filter(|p| {
            // Every sweep's values are among those it has on the 128-bit code.
            p.passes[..targets.len()]
                .iter()
                .zip(&narrow_need)
                .all(|(p, n)| p.need.iter().zip(n).all(|(&w, &n)| !w || n))
        });
    let mut plan = with_wide.or(narrow)?;
    plan.narrow_need = narrow_need;
    Some(plan)
}

/// The element values a pass must compute: `targets` and their element-level operands,
/// transitively (as `sweep::element_closure`, which sits above this file).
fn element_closure(kernel: &Kernel, levels: &[Level], targets: &[usize]) -> Vec<bool> {
    let mut need = vec![false; kernel.body.len()];
    for &t in targets {
        need[t] |= levels[t] == Level::Element;
    }
    for v in (0..kernel.body.len()).rev() {
        if need[v] {
            for x in Kernel::operands(&kernel.body[v].expr) {
                need[x.index()] |= levels[x.index()] == Level::Element;
            }
        }
    }
    need
}

/// The wide routine's op of instruction `v`, where `v` may be made by one: an element
/// unary op on f32 values (f16 and bf16 compute in f32) that the inline math computes
/// and the tier has a routine for, of an element operand.
fn wide_op(kernel: &Kernel, levels: &[Level], v: usize, tier: Tier) -> Option<UnaryOp> {
    let Expr::Unary(op, u) = kernel.body[v].expr else {
        return None;
    };
    let f32_compute = |x: usize| kernel.body[x].dtype.compute_dtype() == DType::F32;
    (levels[v] == Level::Element
        && levels[u.index()] == Level::Element
        && f32_compute(v)
        && f32_compute(u.index())
        && crate::vmath::inline_for(op, DType::F32)
        && crate::wide::unary_fn(op, tier).is_some())
    .then_some(op)
}

/// The planning state (see [`plan`]).
struct Planner<'k> {
    kernel: &'k Kernel,
    levels: &'k [Level],
    row_len: i64,
    wide: Option<Tier>,
    /// Element values that contain a transcendental.
    expensive: Vec<bool>,
    /// The pass that first computes each value, once planned.
    computed_in: Vec<Option<usize>>,
    /// Cached values whose row is written by a pass planned so far.
    ready: Vec<bool>,
    at: Vec<Option<i64>>,
    bytes: i64,
    passes: Vec<Pass>,
}

impl<'k> Planner<'k> {
    fn new(kernel: &'k Kernel, levels: &'k [Level], row_len: i64, wide: Option<Tier>) -> Self {
        let n = kernel.body.len();
        let element = |v: usize| levels[v] == Level::Element;
        let mut expensive = vec![false; n];
        for (v, ins) in kernel.body.iter().enumerate() {
            expensive[v] = element(v)
                && (costly(&ins.expr)
                    || Kernel::operands(&ins.expr)
                        .iter()
                        .any(|x| expensive[x.index()]));
        }
        Planner {
            kernel,
            levels,
            row_len,
            wide,
            expensive,
            computed_in: vec![None; n],
            ready: vec![false; n],
            at: vec![None; n],
            bytes: 0,
            passes: Vec::new(),
        }
    }

    fn run(mut self, targets: &[Vec<usize>]) -> Option<CachePlan> {
        let n = self.kernel.body.len();
        let empty = Pass {
            need: vec![false; n],
            load: vec![false; n],
            store: vec![false; n],
            fill: Vec::new(),
        };
        self.passes = vec![empty; targets.len()];
        let mut before = vec![Vec::new(); targets.len()];
        for (t, sweep_targets) in targets.iter().enumerate() {
            let (need, load, fills) = self.walk(sweep_targets);
            self.fill_chain(fills, &mut before[t]);
            self.passes[t].need = need;
            self.passes[t].load = load;
            self.planned(t);
        }
        (self.bytes > 0).then_some(CachePlan {
            passes: self.passes,
            before,
            narrow_need: Vec::new(),
            at: self.at,
            bytes: self.bytes,
        })
    }

    /// Room for one more row of `v`'s values: its offset, if it fits.
    fn allocate(&mut self, v: usize) -> Option<i64> {
        let dtype = self.kernel.body[v].dtype;
        let row_bytes = self.row_len * dtype.compute_dtype().size_bytes() as i64;
        (self.bytes + row_bytes <= ROW_CACHE_BYTES).then(|| {
            let at = self.bytes;
            self.at[v] = Some(at);
            self.bytes += row_bytes;
            at
        })
    }

    /// The values a pass with `targets` needs and those it loads, walking backwards;
    /// the wide values it found to make before it, in SSA order.
    fn walk(&mut self, targets: &[usize]) -> (Vec<bool>, Vec<bool>, Vec<usize>) {
        let (kernel, levels) = (self.kernel, self.levels);
        let n = kernel.body.len();
        let element = |v: usize| levels[v] == Level::Element;
        let mut need = vec![false; n];
        let mut load = vec![false; n];
        let mut fills = Vec::new();
        for &v in targets {
            need[v] |= element(v);
        }
        for v in (0..n).rev() {
            if !need[v] {
                continue;
            }
            if self.at[v].is_some() {
                debug_assert!(self.ready[v], "only rows already written are read (a bug)");
                load[v] = true;
                continue;
            }
            let wide = self.wide.and_then(|t| wide_op(kernel, levels, v, t));
            if wide.is_some() && self.allocate(v).is_some() {
                load[v] = true;
                fills.push(v);
                continue;
            }
            if let Some(k) = self.computed_in[v] {
                if self.expensive[v]
                    && kernel.body[v].dtype.kind() == DKind::Float
                    && self.allocate(v).is_some()
                {
                    self.passes[k].store[v] = true;
                    self.ready[v] = true;
                    load[v] = true;
                    continue;
                }
            }
            for x in Kernel::operands(&kernel.body[v].expr) {
                if element(x.index()) {
                    need[x.index()] = true;
                }
            }
        }
        fills.reverse();
        (need, load, fills)
    }

    /// Marks what pass `p` computes as computed there, unless an earlier pass did.
    fn planned(&mut self, p: usize) {
        for v in 0..self.kernel.body.len() {
            let pass = &self.passes[p];
            if pass.need[v] && !pass.load[v] && self.computed_in[v].is_none() {
                self.computed_in[v] = Some(p);
            }
        }
    }

    /// Fill passes making the wide values `pending` (their rows allocated), appended
    /// to `order` in the order they run: each makes the values whose operand does not
    /// need another pending one, after the passes that make what it needs in turn.
    fn fill_chain(&mut self, mut pending: Vec<usize>, order: &mut Vec<usize>) {
        let operand = |kernel: &Kernel, v: usize| Kernel::operands(&kernel.body[v].expr)[0].index();
        while !pending.is_empty() {
            // The first pending value needs none of the later ones (SSA order).
            let group: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&v| !self.reaches(operand(self.kernel, v), &pending))
                .collect();
            pending.retain(|v| !group.contains(v));
            let operands: Vec<usize> = group.iter().map(|&v| operand(self.kernel, v)).collect();
            let (need, load, nested) = self.walk(&operands);
            self.fill_chain(nested, order);
            let p = self.passes.len();
            self.passes.push(Pass {
                store: vec![false; need.len()],
                need,
                load,
                fill: group.clone(),
            });
            self.planned(p);
            for v in group {
                self.ready[v] = true;
            }
            order.push(p);
        }
    }

    /// Whether computing `u` (down to the rows already written) needs one of `values`.
    fn reaches(&self, u: usize, values: &[usize]) -> bool {
        let mut need = vec![false; u + 1];
        need[u] = true;
        for v in (0..=u).rev() {
            if !need[v] {
                continue;
            }
            if values.contains(&v) {
                return true;
            }
            if self.ready[v] {
                continue;
            }
            for x in Kernel::operands(&self.kernel.body[v].expr) {
                if self.levels[x.index()] == Level::Element {
                    need[x.index()] = true;
                }
            }
        }
        false
    }
}

/// The row cache as a sweep sees it.
#[derive(Clone, Copy)]
pub(super) struct SweepCache<'a> {
    /// The address of the cache.
    pub base: Value,
    pub plan: &'a CachePlan,
    /// The pass's number (see [`CachePlan`]): a sweep's, or a fill pass's.
    pub sweep: usize,
}

impl SweepCache<'_> {
    /// The pass's part of the plan.
    pub fn pass(&self) -> &Pass {
        &self.plan.passes[self.sweep]
    }

    /// Whether the pass loads `v` from the cache.
    pub fn loads(&self, v: usize) -> bool {
        self.pass().load[v]
    }

    /// Whether the pass stores `v` to the cache once computed.
    pub fn stores(&self, v: usize) -> bool {
        self.pass().store[v]
    }
}

/// The symbol of `op`'s wide routine (`wide::symbol`), as the `'static` name the
/// imports of a function are kept by; one string per op for the process.
fn wide_symbol(op: UnaryOp) -> &'static str {
    static NAMES: OnceLock<Vec<(UnaryOp, &'static str)>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        crate::wide::UNARY_OPS
            .iter()
            .map(|&op| {
                let name: &'static str = Box::leak(crate::wide::symbol(op).into_boxed_str());
                (op, name)
            })
            .collect()
    });
    names
        .iter()
        .find(|(o, _)| *o == op)
        .map(|&(_, name)| name)
        .expect("only ops with a wide routine are filled (a bug)")
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The cache's stack buffer, made in a block that dominates the row loop; its
    /// address. Every page of it is written once, from the top down, before any other
    /// use: Cranelift emits no stack probes (`enable_probestack` is off), and a frame
    /// larger than a guard page must not step over it; the first write into the guard
    /// page faults instead of writing past it into other memory.
    pub(super) fn row_cache(&mut self, plan: &CachePlan) -> Value {
        let size = u32::try_from(plan.bytes).expect("the row cache is at most ROW_CACHE_BYTES");
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            size,
            4,
        ));
        let base = self.b.ins().stack_addr(self.ptr_ty, slot, 0);
        let zero = self.b.ins().iconst(types::I32, 0);
        let mut top = plan.bytes - 4;
        loop {
            let at = i32::try_from(top).expect("the row cache is at most ROW_CACHE_BYTES");
            // Trapping stores, kept in order: a probe may fault (see above).
            self.b.ins().store(MemFlagsData::new(), zero, base, at);
            if top == 0 {
                break;
            }
            top = (top - PROBE_STEP).max(0);
        }
        base
    }

    /// Instruction `v`'s value at element `j + lane` of the row from the cache: one
    /// value of `ty` (a scalar, or a vector of consecutive elements).
    pub(super) fn cache_load(
        &mut self,
        kernel: &Kernel,
        cache: &SweepCache<'_>,
        v: usize,
        (j, lane): (Value, i64),
        ty: Type,
    ) -> Value {
        let (addr, imm) = self.cache_address(kernel, cache, v, (j, lane));
        self.b.ins().load(ty, cache_flags(), addr, imm)
    }

    /// Stores `value`, instruction `v`'s value at element `j + lane` of the row (a
    /// scalar or a vector), to the cache.
    pub(super) fn cache_store(
        &mut self,
        kernel: &Kernel,
        cache: &SweepCache<'_>,
        v: usize,
        (j, lane): (Value, i64),
        value: Value,
    ) {
        let (addr, imm) = self.cache_address(kernel, cache, v, (j, lane));
        self.b.ins().store(cache_flags(), value, addr, imm);
    }

    /// Runs the wide routine of `op` over the cached row of `v` in place: one call of
    /// `ndfuse_wide_<op>(row, row, row_len)`, declared as an import (C ABI, the
    /// module's default call convention) on first use.
    pub(super) fn wide_call(
        &mut self,
        cache: &SweepCache<'_>,
        (v, op): (usize, UnaryOp),
        row_len: i64,
    ) -> Result<(), String> {
        let ptr = self.ptr_ty;
        let fref = self.wide_import(wide_symbol(op), &[ptr, ptr, ptr], None)?;
        let at = cache.plan.at[v].expect("filled values are cached (a bug)");
        let row = self.b.ins().iadd_imm_s(cache.base, at);
        let n = self.b.ins().iconst(self.ptr_ty, row_len);
        self.b.ins().call(fref, &[row, row, n]);
        Ok(())
    }

    /// The sum of the cached row of the f32 value `v`: one call of the wide path's row
    /// sum `ndfuse_wide_sum(row, row_len)` (`wide::reduce`, its own order of additions).
    pub(super) fn wide_sum_call(
        &mut self,
        cache: &SweepCache<'_>,
        v: usize,
        row_len: i64,
    ) -> Result<Value, String> {
        let at = cache.plan.at[v].expect("summed rows are cached (a bug)");
        let row = self.b.ins().iadd_imm_s(cache.base, at);
        self.wide_reduce_call(crate::wide::reduce::SUM_SYMBOL, row, row_len)
    }

    /// A row reduction of the wide path (`wide::reduce`: `name(src, row_len) -> f32`)
    /// over the `row_len` f32 at `src`: one call.
    pub(super) fn wide_reduce_call(
        &mut self,
        name: &'static str,
        src: Value,
        row_len: i64,
    ) -> Result<Value, String> {
        let ptr = self.ptr_ty;
        let fref = self.wide_import(name, &[ptr, ptr], Some(types::F32))?;
        let n = self.b.ins().iconst(self.ptr_ty, row_len);
        let call = self.b.ins().call(fref, &[src, n]);
        Ok(self.b.inst_results(call)[0])
    }

    /// `v = exp(src[j] - shift)` into the cached row of `v`, `src` the address of the
    /// row's first element: one call of `ndfuse_wide_exp_shift(src, shift, row,
    /// row_len, next)` (`wide::shift`), the fill pass and the exp in one, which
    /// prefetches the `row_len` f32 at `next` (the next row's, or any address).
    pub(super) fn wide_exp_shift_call(
        &mut self,
        cache: &SweepCache<'_>,
        v: usize,
        (src, shift, next): (Value, Value, Value),
        row_len: i64,
    ) -> Result<(), String> {
        let at = cache.plan.at[v].expect("filled values are cached (a bug)");
        let row = self.b.ins().iadd_imm_s(cache.base, at);
        let ptr = self.ptr_ty;
        let name = crate::wide::shift::EXP_SHIFT_SYMBOL;
        let fref = self.wide_import(name, &[ptr, types::F32, ptr, ptr, ptr], None)?;
        let n = self.b.ins().iconst(self.ptr_ty, row_len);
        self.b.ins().call(fref, &[src, shift, row, n, next]);
        Ok(())
    }

    /// A row routine of the wide path (`wide::shift`: `name(src, x, dst, row_len)`,
    /// `x` an f32) over the `row_len` f32 at `src` into those at `dst`: one call.
    pub(super) fn wide_row_call(
        &mut self,
        name: &'static str,
        (src, x, dst): (Value, Value, Value),
        row_len: i64,
    ) -> Result<(), String> {
        let ptr = self.ptr_ty;
        let fref = self.wide_import(name, &[ptr, types::F32, ptr, ptr], None)?;
        let n = self.b.ins().iconst(self.ptr_ty, row_len);
        self.b.ins().call(fref, &[src, x, dst, n]);
        Ok(())
    }

    /// The wide routine `name` (C ABI, the module's default call convention) as a
    /// function of this one, declared as an import on first use.
    fn wide_import(
        &mut self,
        name: &'static str,
        params: &[Type],
        ret: Option<Type>,
    ) -> Result<cranelift_codegen::ir::FuncRef, String> {
        if let Some(&(_, _, fref)) = self.imports.iter().find(|(n, _, _)| *n == name) {
            return Ok(fref);
        }
        let mut sig = self.module.make_signature();
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.extend(ret.map(AbiParam::new));
        let id = self
            .module
            .declare_function(name, Linkage::Import, &sig)
            .map_err(|e| format!("declaring {name}: {e}"))?;
        let fref = self.module.declare_func_in_func(id, self.b.func);
        self.imports.push((name, id, fref));
        Ok(fref)
    }

    fn cache_address(
        &mut self,
        kernel: &Kernel,
        cache: &SweepCache<'_>,
        v: usize,
        (j, lane): (Value, i64),
    ) -> (Value, i32) {
        let dtype = kernel.body[v].dtype.compute_dtype();
        debug_assert_eq!(cl_type(dtype).bytes() as usize, dtype.size_bytes());
        let row = cache.plan.at[v].expect("only cached values are loaded or stored (a bug)");
        let off = Offset {
            var: Some(j),
            elems: lane,
        };
        let (addr, imm) = self.address(cache.base, off, dtype);
        let imm = i64::from(imm) + row;
        let imm = i32::try_from(imm).expect("the row cache is at most ROW_CACHE_BYTES");
        (addr, imm)
    }
}

/// In bounds of the stack slot, never trapping; element-aligned only (a vector may
/// start at any element).
fn cache_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}
