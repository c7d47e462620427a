//! The JIT: compiles a lowered kernel for the host with Cranelift, owns the code memory,
//! and is the only place that turns it into a callable function and calls it.

use crate::blocks::{self, BlockPlan};
use crate::error::CodegenError;
use crate::lower::layout::{ColumnBand, Phase, SplitLayout, BAND};
use crate::prepared::{ClifParts, Prepared};
use crate::wide::{self, Tier};
use cranelift_jit::JITModule;
use cranelift_module::{Module, ModuleError};
use ndfuse_ir::{Buffer, HostArray, Kernel};
use rayon::prelude::*;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The machine-level type of every kernel (see the crate docs for the ABI). `unsafe`
/// because the code trusts its arguments: the pointers must back the kernel's buffers.
type KernelFn = blocks::SegmentFn;

/// What a stage calls over a range of units: one JIT-compiled function, or the steps of
/// a kernel on the wide path (`blocks`) with its segments' functions.
#[derive(Clone)]
pub(crate) enum Entry {
    Jit(KernelFn),
    Blocks {
        plan: Arc<BlockPlan>,
        segments: Vec<KernelFn>,
    },
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::Jit(_) => f.write_str("Jit"),
            Entry::Blocks { plan, .. } => write!(
                f,
                "Blocks({}, {} steps)",
                plan.tier.name(),
                plan.steps.len()
            ),
        }
    }
}

impl Entry {
    /// Runs the entry over units `start..end`.
    ///
    /// # Safety
    /// As for a kernel's function: `ptrs` are the kernel's buffers (inputs, outputs, then
    /// any scratch) checked by `checked_pointers`, `start <= end <= extent`, and no other
    /// thread touches the outputs' units `start..end` meanwhile.
    pub(crate) unsafe fn call(&self, ptrs: &[*mut u8], start: i64, end: i64) {
        match self {
            // SAFETY: the caller's contract is the function's.
            Entry::Jit(f) => unsafe { f(ptrs.as_ptr(), start, end) },
            // SAFETY: the caller's contract, for an element-wise kernel (the only kind
            // `blocks::plan` takes): its buffers are f32, f16 or bf16 of `numel`
            // elements (`checked_pointers`), and `segments` are the plan's compiled
            // segments, in order.
            Entry::Blocks { plan, segments } => unsafe {
                blocks::run(plan, segments, ptrs, start as usize, end as usize)
            },
        }
    }
}

/// Elements of work in one chunk of a parallel [`CompiledKernel::run`]: big enough that
/// handing a chunk to a thread costs nothing next to running it (tens of microseconds
/// of work at the least), small enough that a few hundred chunks balance the threads of
/// a large kernel. A constant, so that chunk boundaries depend on the kernel's shape
/// only and never on the thread count.
const CHUNK_WORK: usize = 1 << 16;

/// Units per chunk of a parallel run of one phase, from the kernel's shape alone.
///
/// Positions are cut every [`CHUNK_WORK`] positions, a multiple of any vector width, so
/// a chunk starts where the whole-domain loop would be aligned too. Rows are grouped so
/// that a chunk holds at least [`CHUNK_WORK`] elements (an empty row still counts as one
/// unit of work: its per-row stores); a row is never cut by a chunk, so every reduction
/// within a row stays sequential within its call. The (row, chunk) units of a split
/// kernel's per-chunk phases are grouped the same way, `unit_len` elements each; its
/// partials are combined in chunk order by the next phase, never across calls.
fn chunk_units(unit: Unit, unit_len: usize) -> usize {
    match unit {
        Unit::Positions => CHUNK_WORK,
        Unit::Rows | Unit::RowChunks => CHUNK_WORK.div_ceil(unit_len.max(1)),
    }
}

/// The page size the JIT's code mappings are counted in ([`CompiledKernel::code_bytes`]):
/// 4 KiB on x86-64 and on aarch64 Linux.
const CODE_PAGE: usize = 4096;

/// A kernel compiled to machine code, ready to run on host arrays.
///
/// It is `Send + Sync`: JIT code only reads its inputs and writes the range of outputs
/// it is given, so threads may run disjoint ranges of one compiled kernel (as
/// [`CompiledKernel::run`] does).
pub struct CompiledKernel {
    pub(crate) name: String,
    /// The Cranelift IR of each function before optimisation, with its legend of
    /// imports; rendered as text on first [`CompiledKernel::clif`] (formatting a large
    /// function costs about as much as a quarter of compiling it).
    clif_parts: Arc<ClifParts>,
    /// Comment lines before the functions: the steps of a kernel on the wide path.
    preface: String,
    clif: Arc<OnceLock<String>>,
    compile_time: Duration,
    pub(crate) inputs: Vec<Buffer>,
    pub(crate) outputs: Vec<Buffer>,
    /// The unit of a range of the public API: rows for a kernel with reduce axes,
    /// positions otherwise.
    pub(crate) unit: Unit,
    /// How many units a whole run covers (`rows()` or the domain's `numel()`).
    pub(crate) extent: usize,
    /// The functions to run, in order, each over all its units before the next: one,
    /// or the phases of a split kernel.
    pub(crate) stages: Vec<Stage>,
    /// 8-byte slots of scratch memory a run needs (0 but for split kernels): passed
    /// after the buffers in the pointer array.
    pub(crate) scratch_slots: usize,
    /// For each input, whether the body loads it only at each position's own offset
    /// (the contiguous view of the domain): what [`Self::run_units_in_place`] needs.
    pub(crate) read_in_place: Vec<bool>,
    /// Instructions of the element loops per element ([`Self::ops_per_element`]).
    cost: Arc<Cost>,
    /// Executable memory the module maps ([`Self::code_bytes`]).
    code_bytes: usize,
    /// The wide path's tier the code was compiled for.
    tier: Option<Tier>,
    /// Whether the code is another kernel's ([`Self::rebind`]).
    shares_code: bool,
    /// Behind a mutex only to make the kernel `Sync` (`JITModule` is not); it is never
    /// locked, only freed when the last kernel running it is dropped ([`Self::rebind`]
    /// shares it).
    _code: Arc<Mutex<CodeMemory>>,
}

impl fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledKernel")
            .field("name", &self.name)
            .field("compile_time", &self.compile_time)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("unit", &self.unit)
            .field("extent", &self.extent)
            .field("stages", &self.stages)
            .field("scratch_slots", &self.scratch_slots)
            .finish_non_exhaustive()
    }
}

/// What the `start..end` of a kernel's function count (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Row-major positions of the domain (kernels without reduce axes).
    Positions,
    /// Rows, in row-major order of the kept axes (kernels with reduce axes).
    Rows,
    /// `row * splits + chunk`: the chunks of the rows of a split kernel, in order.
    RowChunks,
}

impl Unit {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Unit::Positions => "the domain's",
            Unit::Rows => "the kernel's rows",
            Unit::RowChunks => "the kernel's row chunks",
        }
    }
}

/// One compiled function of a kernel and how its runs are cut.
#[derive(Clone, Debug)]
pub(crate) struct Stage {
    pub(crate) entry: Entry,
    /// Units per row of the kernel (1, or `splits` for `RowChunks`).
    per_row: usize,
    /// How many units a whole run covers.
    extent: usize,
    /// Units per chunk of a parallel run ([`chunk_units`]).
    chunk: usize,
}

/// A JIT module whose code memory is freed when it is dropped (cranelift-jit leaks it
/// otherwise), on success and error paths alike.
struct CodeMemory {
    module: Option<JITModule>,
}

impl CodeMemory {
    fn module(&mut self) -> &mut JITModule {
        self.module
            .as_mut()
            .expect("the module is only taken by drop")
    }
}

impl Drop for CodeMemory {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: the only function pointers obtained from this module are the
            // stage entries of the `CompiledKernel` that compiled it and of the kernels
            // `rebind` made from it (or none, when compilation failed); each of them
            // holds this `CodeMemory` through the same `Arc`. The pointers are private,
            // never handed out, and only called through `&CompiledKernel`; this drop
            // runs when the last `Arc` goes, i.e. when every kernel holding a pointer
            // is gone, so no call is running and none can follow.
            unsafe { module.free_memory() };
        }
    }
}

/// Compiles `kernel` to machine code for the host, on the wide path where the kernel
/// takes it and the host has one (`wide::tier`, `blocks`).
///
/// Returns [`CodegenError::Unsupported`] when [`supports`] refuses the kernel and
/// [`CodegenError::Cranelift`] when Cranelift fails (a bug in lowering, reported with
/// the annotated function).
pub fn compile(kernel: &Kernel) -> Result<CompiledKernel, CodegenError> {
    compile_with(kernel, wide::tier())
}

/// [`compile`] with the wide path's tier chosen by the caller: `None` compiles the
/// kernel whole on the 128-bit code, `Some(tier)` takes the wide path where the kernel
/// allows it (a tier the host lacks, or unfused inline math, counts as `None`). Both
/// give the same bits, except where a row program's wide reduction sums in its own
/// fixed order (`wide::sum`); tests and benchmarks compare them.
pub fn compile_with(kernel: &Kernel, tier: Option<Tier>) -> Result<CompiledKernel, CodegenError> {
    let started = Instant::now();
    let prepared = Prepared::of(kernel, tier)?;
    let cranelift = |message: String| CodegenError::Cranelift {
        kernel: kernel.name.clone(),
        message,
    };
    let mut code = CodeMemory {
        module: Some(prepared.module(kernel)?),
    };
    let module = code.module();
    let mut cost = Cost::default();
    let mut code_bytes = 0;
    let mut ids = Vec::new();
    let clif_parts = prepared.lower_functions(kernel, module, |module, ctx, id, names| {
        module.define_function(id, ctx).map_err(|e| match e {
            ModuleError::Compilation(err) => cranelift(
                cranelift_codegen::print_errors::pretty_error(&ctx.func, err),
            ),
            other => cranelift(other.to_string()),
        })?;
        // `ctx.func` is now the optimised function. A split kernel's combine phases
        // loop over partials, not elements.
        let phase = prepared
            .phases
            .get(ids.len())
            .copied()
            .unwrap_or(Phase::Whole);
        if prepared.layout.is_none() || phase.per_chunk() {
            if let Some(c) = crate::cost::ops_per_element(&ctx.func) {
                cost.ops = Some(cost.ops.unwrap_or(0.0) + c.ops);
                cost.calls.extend(
                    c.calls
                        .iter()
                        .filter_map(|&(id, n)| Some((*names.get(&id)?, n))),
                );
            }
        }
        // cranelift-jit maps each function that does not fit the rest of the last
        // mapping into a new one of whole pages, so this bounds what it maps.
        if let Some(code) = ctx.compiled_code() {
            code_bytes += code.code_buffer().len().next_multiple_of(CODE_PAGE);
        }
        ids.push(id);
        Ok(())
    })?;
    if let Some(plan) = &prepared.block_plan {
        // A plan of wide steps alone (gelu from an input to an output) has no segment.
        cost.ops.get_or_insert(0.0);
        cost.narrow = plan
            .steps
            .iter()
            .filter_map(|step| match *step {
                blocks::Step::Unary { op, .. } => Some(Narrow::Unary(op)),
                blocks::Step::Gelu { .. } => Some(Narrow::Gelu),
                blocks::Step::GeluSum { .. } => Some(Narrow::GeluSum),
                blocks::Step::Load { dtype, .. } => Some(Narrow::Load(dtype)),
                blocks::Step::Store { dtype, .. } => Some(Narrow::Store(dtype)),
                blocks::Step::Segment { .. } => None,
            })
            .collect();
    }
    module
        .finalize_definitions()
        .map_err(|e| cranelift(e.to_string()))?;
    let functions: Vec<KernelFn> = ids
        .iter()
        .map(|&id| entry_point(module.get_finalized_function(id)))
        .collect();
    let preface = prepared.preface();
    let tier = prepared.tier;
    let entries = match prepared.block_plan {
        Some(plan) => vec![Entry::Blocks {
            plan: Arc::new(plan),
            segments: functions,
        }],
        None => functions.into_iter().map(Entry::Jit).collect(),
    };
    Ok(CompiledKernel {
        clif_parts: Arc::new(clif_parts),
        preface,
        clif: Arc::new(OnceLock::new()),
        compile_time: started.elapsed(),
        cost: Arc::new(cost),
        code_bytes,
        tier,
        shares_code: false,
        _code: Arc::new(Mutex::new(code)),
        ..CompiledKernel::bound(kernel, entries)
    })
}

impl CompiledKernel {
    /// The run-time description of `kernel` around functions `entries` (its phases in
    /// order, or one wide-path entry): units, extents, chunks, scratch; what a run
    /// needs of the kernel besides its code. Code, text and cost are left empty.
    fn bound(kernel: &Kernel, entries: Vec<Entry>) -> CompiledKernel {
        let layout = SplitLayout::of(kernel);
        let band = ColumnBand::of(kernel).is_some();
        let (unit, extent) = if kernel.reduce_axes.is_empty() {
            (Unit::Positions, kernel.domain.numel())
        } else {
            (Unit::Rows, kernel.rows())
        };
        let phases = layout.as_ref().map_or(vec![Phase::Whole], |l| l.phases());
        let stages = entries
            .into_iter()
            .enumerate()
            .map(|(k, entry)| {
                if matches!(entry, Entry::Blocks { .. }) {
                    return Stage {
                        entry,
                        per_row: 1,
                        extent,
                        chunk: chunk_units(Unit::Positions, 1),
                    };
                }
                let phase = phases.get(k).copied().unwrap_or(Phase::Whole);
                let (unit, per_row, unit_len) = match (&layout, phase) {
                    (Some(l), p) if p.per_chunk() => (Unit::RowChunks, l.splits, l.chunk_len),
                    (Some(l), _) => (Unit::Rows, 1, l.splits),
                    (None, _) => (unit, 1, kernel.row_len()),
                };
                // A band kernel's call covers whole bands of columns (but the last).
                let mut chunk = chunk_units(unit, unit_len);
                if band {
                    chunk = chunk.next_multiple_of(BAND);
                }
                Stage {
                    entry,
                    per_row,
                    extent: extent * per_row,
                    chunk,
                }
            })
            .collect();
        CompiledKernel {
            name: kernel.name.clone(),
            clif_parts: Arc::default(),
            preface: String::new(),
            clif: Arc::default(),
            compile_time: Duration::ZERO,
            inputs: kernel.inputs.clone(),
            outputs: kernel.outputs.clone(),
            unit,
            extent,
            stages,
            scratch_slots: layout.as_ref().map_or(0, |l| l.scratch_slots()),
            read_in_place: (0..kernel.inputs.len())
                .map(|k| kernel.reads_in_place(k))
                .collect(),
            cost: Arc::default(),
            code_bytes: 0,
            tier: None,
            shares_code: false,
            _code: Arc::new(Mutex::new(CodeMemory { module: None })),
        }
    }

    /// This kernel's machine code, run over `kernel`'s buffers and extents, when
    /// `kernel` compiles to exactly the same code: the same Cranelift functions before
    /// optimisation, imports and wide-path steps, which it checks by lowering `kernel`
    /// (no Cranelift compile: a fraction of its cost). `None` when the code differs.
    ///
    /// This is how one compile serves a family of shapes: kernels that differ only in
    /// their leading extent (a batch, a sequence length) usually lower to the same
    /// functions, because the extent reaches the code only as the `start..end` of each
    /// call. Where it does reach it (a size class of the wide path, a split kernel's
    /// scratch layout, an axis of extent 1 dropped from the index plan), the functions
    /// differ and `kernel` needs a compile of its own.
    pub fn rebind(&self, kernel: &Kernel) -> Result<Option<CompiledKernel>, CodegenError> {
        let prepared = Prepared::of(kernel, self.tier)?;
        // The wide path's steps run from this kernel's plan: the new one's must be the
        // same, as must the buffers the code addresses.
        let signature = |p: &BlockPlan| format!("{:?} {} {}", p.steps, p.slots, p.inputs);
        let plan_of = |stages: &[Stage]| match stages.first().map(|s| &s.entry) {
            Some(Entry::Blocks { plan, .. }) => Some(signature(plan)),
            _ => None,
        };
        if prepared.tier != self.tier
            || prepared.preface() != self.preface
            || prepared.block_plan.as_ref().map(signature) != plan_of(&self.stages)
            || kernel.inputs.len() != self.inputs.len()
            || kernel.outputs.len() != self.outputs.len()
            || kernel
                .inputs
                .iter()
                .zip(&self.inputs)
                .any(|(a, b)| a.dtype != b.dtype)
            || kernel
                .outputs
                .iter()
                .zip(&self.outputs)
                .any(|(a, b)| a.dtype != b.dtype)
        {
            return Ok(None);
        }
        let mut module = prepared.module(kernel)?;
        let parts = prepared.lower_functions(kernel, &mut module, |_, _, _, _| Ok(()))?;
        if *self.clif_parts != parts {
            return Ok(None);
        }
        let entries = self.stages.iter().map(|s| s.entry.clone()).collect();
        Ok(Some(CompiledKernel {
            clif_parts: Arc::clone(&self.clif_parts),
            preface: self.preface.clone(),
            clif: Arc::clone(&self.clif),
            cost: Arc::clone(&self.cost),
            code_bytes: self.code_bytes,
            tier: self.tier,
            shares_code: true,
            _code: Arc::clone(&self._code),
            ..CompiledKernel::bound(kernel, entries)
        }))
    }

    /// Whether this kernel runs another kernel's machine code ([`Self::rebind`]): its
    /// [`Self::code_bytes`] are that kernel's, counted once with it.
    pub fn shares_code(&self) -> bool {
        self.shares_code
    }
}

/// What a kernel executes per element, as [`CompiledKernel::ops_per_element`] reports
/// it: counted at compile time without the callees, which are added on first ask
/// (counting a shared function may compile its Cranelift version, which a kernel
/// that never reports its cost should not pay for).
#[derive(Debug, Default)]
struct Cost {
    /// The counted loops' own instructions per element.
    ops: Option<f64>,
    /// Calls per element of each shared function.
    calls: Vec<(&'static str, f64)>,
    /// A kernel on the wide path: what each wide step does, counted as the 128-bit
    /// code that would do it.
    narrow: Vec<Narrow>,
    total: OnceLock<Option<f64>>,
}

impl Cost {
    fn total(&self) -> Option<f64> {
        let mut ops = self.ops?;
        for &(name, n) in &self.calls {
            ops += n * crate::shared_math::ops_of(name)? as f64;
        }
        for &n in &self.narrow {
            ops += narrow_ops(n)?;
        }
        Some(ops)
    }
}

/// A step of the wide path, as the 128-bit code does it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Narrow {
    Unary(ndfuse_ir::UnaryOp),
    /// gelu's tail (`blocks::Step::Gelu`): its seven instructions.
    Gelu,
    /// gelu's tail over a bias add (`blocks::Step::GeluSum`): the add's load and
    /// instruction too.
    GeluSum,
    Load(ndfuse_ir::DType),
    Store(ndfuse_ir::DType),
}

/// Instructions per element of `step` in 128-bit code, once per process: the
/// difference between kernels compiled whole with and without it (an op against a
/// copy; half loads and stores against f32 ones, from copies and sums).
fn narrow_ops(step: Narrow) -> Option<f64> {
    use ndfuse_ir::{DType, Expr, Instr, Plan, Shape, Store, ValueId, View};
    static DONE: OnceLock<Mutex<std::collections::HashMap<Narrow, Option<f64>>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    if let Some(&hit) = done.lock().unwrap_or_else(|p| p.into_inner()).get(&step) {
        return hit;
    }
    // Large enough for the inline math (smaller kernels call the shared copies).
    let n = crate::shared_math::SHARED_MATH_BELOW;
    // `out = op(x)` (a copy without op), or `out = x + y` with `add`.
    let kernel = |d: DType, op: Option<ndfuse_ir::UnaryOp>, add: bool| {
        let shape = Shape::new([n]);
        let inputs = if add { 2 } else { 1 };
        let mut body: Vec<Instr> = (0..inputs)
            .map(|input| Instr {
                dtype: d,
                expr: Expr::Load {
                    input,
                    view: View::contiguous(shape.clone()),
                },
            })
            .collect();
        if let Some(op) = op {
            body.push(Instr {
                dtype: d,
                expr: Expr::Unary(op, ValueId(0)),
            });
        }
        if add {
            body.push(Instr {
                dtype: d,
                expr: Expr::Binary(ndfuse_ir::BinaryOp::Add, ValueId(0), ValueId(1)),
            });
        }
        let last = body.len() - 1;
        Kernel {
            name: "k_cost".into(),
            domain: shape,
            inputs: vec![Buffer { dtype: d, len: n }; inputs],
            outputs: vec![Buffer { dtype: d, len: n }],
            body,
            stores: vec![Store {
                value: ValueId(last as u32),
                output: 0,
            }],
            reduce_axes: vec![],
            plan: Plan::Elementwise,
            plan_reason: "cost".into(),
            contraction: None,
        }
    };
    let count = |k: Kernel| compile_with(&k, None).ok()?.ops_per_element();
    let copy = |d: DType| count(kernel(d, None, false));
    let add = |d: DType| count(kernel(d, None, true));
    // What a half load costs beyond an f32 load: (2 loads + add + store) - (1 load +
    // store), in the half type less in f32.
    let load = |d: DType| Some((add(d)? - copy(d)?) - (add(DType::F32)? - copy(DType::F32)?));
    // gelu's tail whole: x · sigmoid(1.5 · (x + 0.5 · x·x²)), less the copy.
    let gelu = || {
        use ndfuse_ir::{BinaryOp, Scalar, UnaryOp};
        let mut k = kernel(DType::F32, None, false);
        let ins = |expr| Instr {
            dtype: DType::F32,
            expr,
        };
        let v = ValueId;
        k.body.extend([
            ins(Expr::Unary(UnaryOp::Square, v(0))),
            ins(Expr::Binary(BinaryOp::Mul, v(0), v(1))),
            ins(Expr::Const(Scalar::F(0.5))),
            ins(Expr::Binary(BinaryOp::Mul, v(2), v(3))),
            ins(Expr::Binary(BinaryOp::Add, v(0), v(4))),
            ins(Expr::Const(Scalar::F(1.5))),
            ins(Expr::Binary(BinaryOp::Mul, v(5), v(6))),
            ins(Expr::Unary(UnaryOp::Sigmoid, v(7))),
            ins(Expr::Binary(BinaryOp::Mul, v(0), v(8))),
        ]);
        k.stores[0].value = v(9);
        Some(count(k)? - copy(DType::F32)?)
    };
    let ops = match step {
        Narrow::Gelu => gelu(),
        Narrow::GeluSum => (|| Some(gelu()? + add(DType::F32)? - copy(DType::F32)?))(),
        Narrow::Unary(op) => {
            (|| Some(count(kernel(DType::F32, Some(op), false))? - copy(DType::F32)?))()
        }
        Narrow::Load(d) => load(d),
        // A half copy is a half load and a half store.
        Narrow::Store(d) => (|| Some(copy(d)? - copy(DType::F32)? - load(d)?))(),
    };
    let ops = ops.map(|o| o.max(0.0));
    done.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(step, ops);
    ops
}

/// `1 input`, `2 inputs`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Whether `array` can back `buffer`: same dtype, same number of elements.
pub(crate) fn check_array(
    role: &str,
    k: usize,
    array: &HostArray,
    buffer: &Buffer,
) -> Result<(), String> {
    if array.dtype() != buffer.dtype {
        return Err(format!(
            "{role} {k} is {}, the kernel needs {}",
            array.dtype(),
            buffer.dtype
        ));
    }
    if array.len() != buffer.len {
        return Err(format!(
            "{role} {k} has {} elements, the kernel needs {}",
            array.len(),
            buffer.len
        ));
    }
    Ok(())
}

/// The finalized code of a kernel as a callable function.
fn entry_point(code: *const u8) -> KernelFn {
    // SAFETY: `code` is the finalized, executable code of a function that `lower`
    // defined with `kernel_signature`, i.e. (pointer, i64, i64) -> () in the host's
    // default calling convention, which is `extern "C"`. Both are pointer-sized.
    unsafe { std::mem::transmute::<*const u8, KernelFn>(code) }
}

/// Runs one function of a kernel over its units (positions, rows, or row chunks)
/// `[start, end)`. Only `run_range` and `invoke_chunks` call it, with pointers from
/// [`CompiledKernel::checked_pointers`], after the checks its SAFETY comment relies on.
fn invoke(entry: &Entry, ptrs: &[*mut u8], start: usize, end: usize) {
    let as_i64 = |v: usize| i64::try_from(v).expect("numel fits i64: checked by supports()");
    let (start, end) = (as_i64(start), as_i64(end));
    // SAFETY: `checked_pointers` has checked, before building `ptrs`, that there is one
    // pointer per kernel buffer (inputs, then outputs), each to an array of the buffer's
    // dtype and exact length, outputs borrowed mutably and so distinct from each other
    // and from the inputs, followed for a split kernel by a scratch array of the
    // `SplitLayout::scratch_slots` 8-byte slots its phases address (result slots of
    // rows `r < rows`, partial slots of units `u < rows * splits`), also distinct; and
    // that the range it was given lies in `0..=extent`, where the extent is `numel`
    // (positions) or, for a kernel with reduce axes, `rows()` (rows). `run_range` passes
    // that range scaled by the stage's units per row (1, or `splits` for the row-chunk
    // phases of a split kernel), `invoke_chunks` a chunk inside the scaled whole range,
    // so `0 <= start <= end <= stage extent`. Calls that run at once on other threads
    // (`invoke_chunks`) are calls of one stage over disjoint ranges and write disjoint
    // elements (see `SharedPtrs`); stages run one after another. `supports` proved every
    // load of every domain position inside its buffer; a row `r < rows` (or chunk of a
    // row) only visits the positions of that row (and a row-level load only happens
    // when rows are not empty, so the domain is not). Stores go to a position `< numel`
    // of outputs of `numel` elements, or to `r < rows` of per-row outputs of `rows`
    // elements. Bool outputs receive only 0 or 1.
    unsafe { entry.call(ptrs, start, end) }
}

/// The pointer array of one parallel run, shared by the threads that run its chunks.
/// Only `invoke_chunks` builds one.
struct SharedPtrs<'a>(&'a [*mut u8]);

impl SharedPtrs<'_> {
    /// The pointers. A method rather than the field, so that a closure captures the
    /// whole (`Sync`) wrapper and not the bare slice of raw pointers.
    fn get(&self) -> &[*mut u8] {
        self.0
    }
}

// SAFETY: sharing the pointer array lets several threads use the buffers behind it at
// once; that is free of data races because, in `invoke_chunks` (the only place that
// builds a `SharedPtrs`):
// - every argument was checked once, before the pointers were built, by
//   `checked_pointers` (number, dtype and length of each buffer; the whole range);
// - each thread calls one function (stage) of the kernel on its own chunks, and chunks
//   are disjoint ranges of units; the next stage starts only after `for_each` returns;
// - a call over positions `[start, end)` (a kernel without reduce axes) writes only the
//   output elements of those positions; a call over rows `[start, end)` writes only
//   `out[r]` of per-row outputs, the domain positions of its rows `r` (the rows
//   partition the domain), and for a split kernel's combine phase the result slots of
//   its rows; a call over row chunks `u` (split kernels) writes only the partial slots
//   of its units, or the domain positions of its chunks of rows; so no element is
//   written by two threads, and outputs are never read (the code loads only from the
//   pointer array, input buffers, and scratch slots written by an earlier stage);
// - inputs are only read (the code never writes through an input pointer), and outputs
//   and scratch are distinct from inputs and from each other (borrowed `&mut` by `run`);
// - the arrays stay borrowed by `run` for the whole parallel loop, and rayon's
//   `for_each` returns only when every chunk has finished, so no pointer outlives them.
unsafe impl Sync for SharedPtrs<'_> {}

/// Runs units `start..end` of `stage` in chunks of `stage.chunk` units (counted from
/// 0, so bounds depend on shapes only) on the current rayon pool; one chunk or less runs
/// on the calling thread without touching rayon. `ptrs` come from `checked_pointers`.
fn invoke_chunks(stage: &Stage, ptrs: &[*mut u8], start: usize, end: usize) {
    let chunk = stage.chunk;
    if end - start <= chunk {
        if start < end {
            invoke(&stage.entry, ptrs, start, end);
        }
        return;
    }
    let shared = SharedPtrs(ptrs);
    (start / chunk..end.div_ceil(chunk))
        .into_par_iter()
        .for_each(|c| {
            // No overflow: `c * chunk < end <= i64::MAX` and `chunk` is small.
            let lo = (c * chunk).max(start);
            invoke(&stage.entry, shared.get(), lo, ((c + 1) * chunk).min(end));
        });
}

impl CompiledKernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Cranelift IR of the kernel as generated (every function of a split kernel,
    /// in the order its phases run), before Cranelift's optimisations:
    /// for dumps (`NDFUSE_DEBUG=4`) and snapshot tests. Imported math functions appear
    /// as `u0:<id>`; leading `;` comment lines name them. The same kernel always gives
    /// the same text.
    pub fn clif(&self) -> &str {
        self.clif.get_or_init(|| {
            let functions = self
                .clif_parts
                .iter()
                .map(|(legend, f)| format!("{legend}{}", f.display()))
                .collect::<Vec<_>>()
                .join("\n");
            format!("{}{functions}", self.preface)
        })
    }

    /// How long [`compile`] took, from checks to finalized code.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// Operations the kernel executes per element of its domain: Cranelift
    /// instructions (after Cranelift's optimisations) of its innermost loops, divided by
    /// the elements one iteration covers, summed over the loops a run sweeps; the vector
    /// loops only where there are some (scalar tails are left out). `None` when no loop
    /// could be measured. See `cost.rs` for exactly what is counted; the compute floor
    /// of `ndfuse bench` is this times the domain's elements over a measured peak rate.
    pub fn ops_per_element(&self) -> Option<f64> {
        *self.cost.total.get_or_init(|| self.cost.total())
    }

    /// Bytes of executable memory the kernel's machine code occupies: each function's
    /// code (with its constants) rounded up to whole 4 KiB pages, as cranelift-jit maps
    /// it (an upper bound when two functions of a split kernel share a page). Freed when
    /// the kernel is dropped. The kernel's other memory (its descriptions and the
    /// Cranelift IR kept for [`Self::clif`]) lives on the heap and is not counted.
    pub fn code_bytes(&self) -> usize {
        self.code_bytes
    }

    /// How many chunks [`Self::run`] cuts the kernel into (1 for a kernel that runs on the
    /// calling thread; 0 for an empty one): for a split kernel, which runs in phases, the
    /// most of any phase. Depends on the kernel's shape only.
    pub fn chunks(&self) -> usize {
        self.stages
            .iter()
            .map(|s| s.extent.div_ceil(s.chunk))
            .max()
            .unwrap_or(0)
    }

    /// Runs the kernel over its whole domain (every row, for a kernel with reduce axes),
    /// on the threads of the current rayon pool: the global one (sized by
    /// `RAYON_NUM_THREADS`), or the pool whose `install` it is called in.
    ///
    /// `inputs` and `outputs` must match the kernel's buffers in number, dtype and
    /// length (shapes are not checked: buffers are flat); otherwise
    /// [`CodegenError::Args`] names the first argument that does not, and nothing runs.
    ///
    /// The domain is cut into chunks whose boundaries depend only on the kernel's shape:
    /// runs of 64 Ki positions for a kernel without reduce axes, groups of whole rows
    /// holding at least 64 Ki elements for one with reduce axes (see [`Self::chunks`]).
    /// Each chunk is one call of the compiled code. A row is reduced sequentially by one
    /// call, except under a `Split` plan: there each of the plan's chunks of a row is
    /// reduced by one call into a partial, and a second phase combines the partials of
    /// each row in chunk order. Either way the order of every operation depends on
    /// shapes only, so the outputs are bit-identical whatever the number of threads, and
    /// to one call over the whole domain ([`Self::run_range`]). A kernel of one chunk or
    /// less runs on the calling thread.
    pub fn run(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
    ) -> Result<(), CodegenError> {
        let mut scratch = zeroed_scratch(&self.name, self.scratch_slots)?;
        let ptrs = self.checked_pointers(inputs, outputs, &mut scratch, 0, self.extent)?;
        for stage in &self.stages {
            invoke_chunks(stage, &ptrs, 0, stage.extent);
        }
        Ok(())
    }

    /// Runs the kernel over row-major positions `[start, end)` of its domain only, on the
    /// calling thread (one call, or one per phase of a split kernel); the rest of each
    /// output is left as it was. Checks the arguments as [`Self::run`] does and
    /// `start <= end <= numel`.
    ///
    /// For a kernel with reduce axes, `start..end` are **rows** instead (row-major over
    /// the kept axes, `end <= Kernel::rows()`): each row in the range is reduced whole and
    /// all of its outputs are written (every position of the row, or its one per-row
    /// element); other rows are left as they were.
    pub fn run_range(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        start: usize,
        end: usize,
    ) -> Result<(), CodegenError> {
        let mut scratch = zeroed_scratch(&self.name, self.scratch_slots)?;
        let ptrs = self.checked_pointers(inputs, outputs, &mut scratch, start, end)?;
        if start < end {
            for stage in &self.stages {
                invoke(
                    &stage.entry,
                    &ptrs,
                    start * stage.per_row,
                    end * stage.per_row,
                );
            }
        }
        Ok(())
    }

    /// Checks every argument of a run over units `[start, end)` (see [`Self::run_range`])
    /// and returns the buffer pointers in ABI order: inputs, then outputs, then (for a
    /// split kernel) `scratch`, which must hold `scratch_slots` slots. The pointers are
    /// only valid while `inputs`, `outputs` and `scratch` stay borrowed by the caller.
    pub(crate) fn checked_pointers(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        scratch: &mut [u64],
        start: usize,
        end: usize,
    ) -> Result<Vec<*mut u8>, CodegenError> {
        let bad = |detail: String| CodegenError::Args {
            kernel: self.name.clone(),
            detail,
        };
        if inputs.len() != self.inputs.len() {
            return Err(bad(format!(
                "expected {}, got {}",
                count(self.inputs.len(), "input"),
                inputs.len()
            )));
        }
        if outputs.len() != self.outputs.len() {
            return Err(bad(format!(
                "expected {}, got {}",
                count(self.outputs.len(), "output"),
                outputs.len()
            )));
        }
        for (k, (array, buffer)) in inputs.iter().zip(&self.inputs).enumerate() {
            check_array("input", k, array, buffer).map_err(bad)?;
        }
        for (k, (array, buffer)) in outputs.iter().zip(&self.outputs).enumerate() {
            check_array("output", k, array, buffer).map_err(bad)?;
        }
        if start > end || end > self.extent {
            return Err(bad(format!(
                "range {start}..{end} is not within {} 0..{}",
                self.unit.name(),
                self.extent
            )));
        }
        // Input pointers are typed `*mut` only because the ABI has one pointer array;
        // the code never writes through them.
        assert_eq!(
            scratch.len(),
            self.scratch_slots,
            "run allocates the scratch the kernel needs; a mismatch is a bug"
        );
        let mut ptrs: Vec<*mut u8> = inputs
            .iter()
            .map(|a| a.storage().as_ptr().cast_mut())
            .chain(outputs.iter_mut().map(|a| a.storage_mut().as_mut_ptr()))
            .collect();
        if self.scratch_slots > 0 {
            ptrs.push(scratch.as_mut_ptr().cast());
        }
        Ok(ptrs)
    }
}

/// The zeroed scratch of a split kernel, `slots` 8-byte slots: its size comes from the
/// user's shapes, so memory that cannot be had is an error, not an abort.
fn zeroed_scratch(kernel: &str, slots: usize) -> Result<Vec<u64>, CodegenError> {
    let mut scratch = Vec::new();
    if scratch.try_reserve_exact(slots).is_err() {
        return Err(CodegenError::OutOfMemory {
            kernel: kernel.to_string(),
            bytes: slots as u128 * 8,
        });
    }
    scratch.resize(slots, 0);
    Ok(scratch)
}

#[cfg(test)]
mod scratch_tests {
    #[test]
    fn scratch_beyond_memory_is_an_error() {
        let e = super::zeroed_scratch("k0_sum", usize::MAX).expect_err("no memory for it");
        assert_eq!(
            e.to_string(),
            format!(
                "kernel k0_sum: out of memory: {} bytes of split-reduction scratch",
                usize::MAX as u128 * 8
            )
        );
        assert_eq!(
            super::zeroed_scratch("k0_sum", 3).expect("small"),
            vec![0; 3]
        );
    }
}
