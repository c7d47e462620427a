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

use super::function::{cl_type, Lowering, Offset};
use cranelift_codegen::ir::{
    types, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_module::Module;
use ndfuse_ir::{BinaryOp, DKind, Expr, Kernel, Level, UnaryOp};

/// The largest row cache, in bytes: every cached value of a row together. Small enough
/// for any thread's stack (rayon's workers get 2 MiB) and for the L2 cache of a core,
/// large enough for a softmax row of 16K f32.
pub(super) const ROW_CACHE_BYTES: i64 = 64 * 1024;

/// Bytes between stack probes: the guard page size the stack of a thread has at least.
const PROBE_STEP: i64 = 4096;

/// What each sweep of a row program computes, loads from the cache and stores to it.
/// Sweeps are numbered as the reduction sweeps (0..sweeps), the store sweep last.
pub(super) struct CachePlan {
    /// Per sweep: the element values it has (computed, or loaded from the cache).
    pub need: Vec<Vec<bool>>,
    /// Per sweep: the element values it loads from the cache instead of computing.
    pub load: Vec<Vec<bool>>,
    /// Per sweep: the element values it stores to the cache after computing them.
    pub store: Vec<Vec<bool>>,
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
pub(super) fn plan(
    kernel: &Kernel,
    levels: &[Level],
    targets: &[Vec<usize>],
    row_len: i64,
) -> Option<CachePlan> {
    let n = kernel.body.len();
    let element = |v: usize| levels[v] == Level::Element;
    // Element values that contain a transcendental.
    let mut expensive = vec![false; n];
    for (v, ins) in kernel.body.iter().enumerate() {
        expensive[v] = element(v)
            && (costly(&ins.expr)
                || Kernel::operands(&ins.expr)
                    .iter()
                    .any(|x| expensive[x.index()]));
    }
    let mut computed_in: Vec<Option<usize>> = vec![None; n];
    let mut at: Vec<Option<i64>> = vec![None; n];
    let mut bytes = 0i64;
    let mut plan = CachePlan {
        need: Vec::new(),
        load: Vec::new(),
        store: vec![vec![false; n]; targets.len()],
        at: Vec::new(),
        bytes: 0,
    };
    for (t, sweep_targets) in targets.iter().enumerate() {
        let mut need = vec![false; n];
        let mut load = vec![false; n];
        for &v in sweep_targets {
            need[v] |= element(v);
        }
        for v in (0..n).rev() {
            if !need[v] {
                continue;
            }
            if at[v].is_some() {
                load[v] = true;
                continue;
            }
            let dtype = kernel.body[v].dtype;
            let row_bytes = row_len * dtype.compute_dtype().size_bytes() as i64;
            if let Some(k) = computed_in[v] {
                if expensive[v]
                    && dtype.kind() == DKind::Float
                    && bytes + row_bytes <= ROW_CACHE_BYTES
                {
                    at[v] = Some(bytes);
                    bytes += row_bytes;
                    plan.store[k][v] = true;
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
        for v in 0..n {
            if need[v] && !load[v] && computed_in[v].is_none() {
                computed_in[v] = Some(t);
            }
        }
        plan.need.push(need);
        plan.load.push(load);
    }
    plan.at = at;
    plan.bytes = bytes;
    (bytes > 0).then_some(plan)
}

/// The row cache as a sweep sees it.
#[derive(Clone, Copy)]
pub(super) struct SweepCache<'a> {
    /// The address of the cache.
    pub base: Value,
    pub plan: &'a CachePlan,
    /// The sweep's number (see [`CachePlan`]).
    pub sweep: usize,
}

impl SweepCache<'_> {
    /// Whether the sweep loads `v` from the cache.
    pub fn loads(&self, v: usize) -> bool {
        self.plan.load[self.sweep][v]
    }

    /// Whether the sweep stores `v` to the cache once computed.
    pub fn stores(&self, v: usize) -> bool {
        self.plan.store[self.sweep][v]
    }
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
