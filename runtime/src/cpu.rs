//! The CPU backend's evaluation: runs a schedule step by step on host buffers and
//! reports which path (JIT or interpreter) every step took and how long compiling and
//! running took. Compiled kernels are kept in a cache by kernel description.
//!
//! Kernel outputs are written into buffers of the host cache ([`crate::host_cache`]):
//! an intermediate goes back to the cache as soon as its last reader ran (so a later
//! step of the same eval may write into it), an output when the caller drops it, and
//! the next eval of the same graph finds its buffers there, already mapped.

use crate::alloc::{host_cache, Limits};
use crate::backend_kind::BackendKind;
use crate::code_cache::{CodeCacheLimits, CompileCacheStats, Lru};
use crate::compile::{compile, graph_cache_stats, Compiled, KernelRef};
use crate::config::Config;
use crate::device_id::DeviceId;
use crate::error::RuntimeError;
use crate::evaluation::Evaluation;
use crate::gemm::run_contraction;
use crate::routines::run_routine;
use crate::step_path::StepPath;
use ndfuse_codegen_cpu::CompiledKernel;
use ndfuse_ir::interp;
use ndfuse_ir::{Graph, HostArray, Kernel, NodeId, Storage};
use ndfuse_passes::Step;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Compiled kernels by description: a hit skips Cranelift entirely. Descriptions carry
/// shapes, strides and dtypes, so equal descriptions compile to identical code. Bounded
/// by `max_kernel_cache_entries` and `max_kernel_cache` (bytes of machine code), least
/// recently used evicted first; an evicted kernel's code is unmapped when the last
/// evaluation running it drops it (each kernel owns its own JIT module).
type KernelCache = Mutex<Lru<Kernel, Arc<CompiledKernel>>>;

fn kernel_cache() -> &'static KernelCache {
    static CACHE: OnceLock<KernelCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Lru::new(CodeCacheLimits::kernels(&Config::default()))))
}

fn lock_kernels() -> std::sync::MutexGuard<'static, Lru<Kernel, Arc<CompiledKernel>>> {
    kernel_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Compiled kernels by shape family ([`Kernel::family_key`]): up to
/// [`FAMILY_VARIANTS`] members of each family whose code a new member may run
/// ([`CompiledKernel::rebind`], which checks that the code is the same), held weakly,
/// so the kernel cache alone decides how long code lives. Bounded like the kernel
/// cache by entries. `enabled` follows `kernel_families` of the latest eval.
struct Families {
    enabled: bool,
    map: Lru<Kernel, Vec<Weak<CompiledKernel>>>,
}

/// Compiled members kept per family: the size classes whose code differs (a wide
/// path from `blocks::BLOCKS_FROM` positions on, an extent of 1 dropped from the
/// index plan) need one each; more than a few means the extent reaches the code.
const FAMILY_VARIANTS: usize = 4;

fn lock_families() -> std::sync::MutexGuard<'static, Families> {
    static CACHE: OnceLock<Mutex<Families>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            Mutex::new(Families {
                enabled: true,
                map: Lru::new(CodeCacheLimits::kernels(&Config::default())),
            })
        })
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Operations per element of the CPU JIT's compiled code for `kernel`
/// ([`CompiledKernel::ops_per_element`]), when the kernel cache holds it (any
/// evaluation that ran it compiled it, unless it was evicted since); `None` otherwise.
pub fn jit_ops_per_element(kernel: &Kernel) -> Option<f64> {
    lock_kernels()
        .get(kernel)
        .and_then(|(c, _)| c.ops_per_element())
}

/// What the compiled-code caches did so far and hold now: CPU kernels (with bytes of
/// machine code) and compiled graphs; hits, misses, evictions, entries, limits.
///
/// ```
/// let s = ndfuse_runtime::compile_cache_stats();
/// assert!(s.kernels.entries <= s.kernels.max_entries.max(1));
/// ```
pub fn compile_cache_stats() -> CompileCacheStats {
    CompileCacheStats {
        kernels: lock_kernels().stats(),
        graphs: graph_cache_stats(),
    }
}

/// A buffer of the evaluation: borrowed from the caller or produced by a step.
enum Buf<'a> {
    Borrowed(&'a HostArray),
    Owned(HostArray),
}

impl Buf<'_> {
    fn get(&self) -> &HostArray {
        match self {
            Buf::Borrowed(a) => a,
            Buf::Owned(a) => a,
        }
    }
}

/// Runs `g` with the CPU JIT; kernels split their work on `pool`, or, when `None`, on
/// `cpu_threads` workers (0: the current rayon pool).
pub(crate) fn run_cpu(
    g: &Graph,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &Config,
    pool: Option<&rayon::ThreadPool>,
) -> Result<Evaluation, RuntimeError> {
    let own_pool = match pool {
        Some(_) => None,
        None => worker_pool(cfg.cpu_threads()),
    };
    let pool = pool.or(own_pool.as_deref());
    // The limits follow the configuration of this eval (a no-op when unchanged).
    let cache = host_cache();
    cache.set_limits(Limits::host(cfg));
    lock_kernels().set_limits(CodeCacheLimits::kernels(cfg));
    {
        let mut families = lock_families();
        families.enabled = cfg.kernel_families();
        families.map.set_limits(CodeCacheLimits {
            bytes: u64::MAX,
            ..CodeCacheLimits::kernels(cfg)
        });
    }
    let (compiled_graph, compile_cached) =
        compile(g, false, cfg, &ndfuse_passes::TargetDesc::cpu())?;
    let Compiled {
        graph: optimized,
        log: passes,
        schedule,
        debug,
        last_read,
        jit,
    } = &*compiled_graph;
    let debug = *debug;
    let g = &**optimized;
    // The steps run on a worker of the pool their kernels split work on: called from
    // outside it (a user's thread), each step's parallel region would be injected into
    // the pool and waited for, ~10-20 µs a step (a decode step of 430 steps lost ~40%
    // of its time to it); from inside, a region is a local push that idle workers steal.
    // The buffers the outputs are: theirs, or the buffer an output reshapes.
    let sources: Vec<NodeId> = g
        .outputs()
        .iter()
        .map(|&o| schedule.output_buffer(o))
        .collect();
    let run_steps = || -> Result<_, RuntimeError> {
        let mut bufs: rustc_hash::FxHashMap<NodeId, Buf<'_>> =
            inputs.iter().map(|(&n, a)| (n, Buf::Borrowed(a))).collect();
        let mut paths = Vec::with_capacity(schedule.steps.len());
        let (mut compile_time, mut run_time) = (Duration::ZERO, Duration::ZERO);
        for (i, step) in schedule.steps.iter().enumerate() {
            let read = |n: &NodeId| -> &HostArray {
                bufs.get(n)
                    .unwrap_or_else(|| {
                        panic!("step {i} reads {n} before it is written (a scheduling bug)")
                    })
                    .get()
            };
            let (results, path) = match step {
                Step::Kernel {
                    kernel,
                    inputs: ins,
                    outputs: outs,
                } => {
                    let args: Vec<&HostArray> = ins.iter().map(read).collect();
                    // A user's index out of range is an error before the kernel reads.
                    interp::check_indices(kernel, &args)?;
                    let start = Instant::now();
                    let lock = || {
                        jit.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                    };
                    // The kernel an earlier run found, unless the kernel cache evicted it.
                    let known = lock()[i].as_ref().and_then(KernelRef::get);
                    let (results, path, compiled_in, code) =
                        run_kernel(kernel, known, &args, debug, pool)?;
                    if let Some(code) = code {
                        lock()[i] = Some(code);
                    }
                    compile_time += compiled_in;
                    let ran = start.elapsed().saturating_sub(compiled_in);
                    run_time += ran;
                    if debug >= 1 {
                        let bytes = kernel.bytes_in() + kernel.bytes_out();
                        let secs = ran.as_secs_f64();
                        let gbps = if secs > 0.0 {
                            bytes as f64 / secs / 1e9
                        } else {
                            0.0
                        };
                        eprintln!(
                            "ndfuse: {} [{path}] {:.3} ms, {bytes} B, {gbps:.2} GB/s",
                            kernel.name,
                            secs * 1e3
                        );
                    }
                    // A kernel writes flat buffers; each takes its node's shape.
                    let shaped = outs.iter().zip(results).map(|(&n, a)| {
                        let shape = g.node(n).shape.clone();
                        let a = a
                            .reshaped(shape)
                            .expect("a kernel output holds its node's element count (a scheduling bug otherwise)");
                        (n, a)
                    });
                    (shaped.collect::<Vec<_>>(), path)
                }
                Step::Interp { node, operands, .. } => {
                    let args: Vec<&HostArray> = operands.iter().map(read).collect();
                    let start = Instant::now();
                    let n = g.node(*node);
                    // Scatter-add, scans and argsort have native routines (on the same
                    // pool as kernels); any other node is interpreted.
                    let native = || run_routine(n, &args);
                    let routine = match pool {
                        Some(pool) => pool.install(native),
                        None => native(),
                    };
                    let (out, path) = match routine {
                        Some(out) => (
                            out?,
                            StepPath::Routine {
                                device: "cpu".into(),
                            },
                        ),
                        None => (interp::eval_node(n, &args)?, StepPath::Interp),
                    };
                    run_time += start.elapsed();
                    (vec![(*node, out)], path)
                }
            };
            for (n, a) in results {
                bufs.insert(n, Buf::Owned(a));
            }
            paths.push(path);
            for &r in step.reads() {
                if last_read.get(&r) == Some(&i) && !g.is_output(r) && !sources.contains(&r) {
                    bufs.remove(&r);
                }
            }
        }
        // Outputs move out of the buffer table (their memory goes back to the cache when the
        // caller drops them); an input returned as an output, or a buffer that is an
        // output again later (listed twice, or reshaped by another), is copied. An
        // output aliasing a buffer takes its own shape.
        let outs = g.outputs();
        let outputs = outs
            .iter()
            .zip(&sources)
            .enumerate()
            .map(|(k, (o, src))| {
                let last_mention = !sources[k + 1..].contains(src);
                let a = match bufs.remove(src) {
                    Some(Buf::Owned(a)) if last_mention => a,
                    Some(b) => {
                        let copy = copy_of(b.get());
                        bufs.insert(*src, b);
                        copy?
                    }
                    None => panic!("output {o} was never computed (a scheduling bug)"),
                };
                Ok(if src == o {
                    a
                } else {
                    a.reshaped(g.node(*o).shape.clone())
                        .expect("an aliased output has its buffer's element count")
                })
            })
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        Ok((outputs, paths, compile_time, run_time))
    };
    let (outputs, paths, compile_time, run_time) = match pool {
        Some(p) if p.current_thread_index().is_none() => p.install(run_steps)?,
        Some(_) => run_steps()?,
        None if rayon::current_thread_index().is_none() => rayon::scope(|_| run_steps())?,
        None => run_steps()?,
    };
    Ok(Evaluation {
        outputs,
        backend: BackendKind::Cpu,
        graph: Arc::clone(optimized),
        passes: Some(Arc::clone(passes)),
        schedule: Some(Arc::clone(schedule)),
        compile_cached,
        paths,
        compile_time,
        run_time,
        device: DeviceId::cpu(0),
        moves: Vec::new(),
    })
}

/// A copy of `a` in a buffer of the host cache. Its size is the user's, so memory that
/// cannot be had (after the cache freed what it held) is [`RuntimeError::Alloc`], as for
/// every other buffer of an evaluation, not an abort.
fn copy_of(a: &HostArray) -> Result<HostArray, RuntimeError> {
    let mut copy = host_cache().array(a.dtype(), a.shape().clone())?;
    match (copy.storage_mut(), a.storage()) {
        (Storage::F16(d), Storage::F16(s)) => d.copy_from_slice(s),
        (Storage::BF16(d), Storage::BF16(s)) => d.copy_from_slice(s),
        (Storage::F32(d), Storage::F32(s)) => d.copy_from_slice(s),
        (Storage::F64(d), Storage::F64(s)) => d.copy_from_slice(s),
        (Storage::I32(d), Storage::I32(s)) => d.copy_from_slice(s),
        (Storage::I64(d), Storage::I64(s)) => d.copy_from_slice(s),
        (Storage::Bool(d), Storage::Bool(s)) => d.copy_from_slice(s),
        _ => unreachable!("the copy has its source's dtype and length (a bug otherwise)"),
    }
    Ok(copy)
}

/// A compiled kernel from the cache, or freshly compiled and cached; `None` with the
/// reason when the codegen cannot compile it yet. The one place that decides which path
/// a kernel takes, for `execute` and `explain` alike.
pub(crate) fn compiled(
    kernel: &Kernel,
) -> Result<(Option<Arc<CompiledKernel>>, StepPath, Duration), RuntimeError> {
    let (c, path, took) = compiled_ref(kernel)?;
    Ok((c.map(|(c, _)| c), path, took))
}

/// A kernel from the kernel cache with the entry's hold for a compiled graph to keep.
type Held = (Arc<CompiledKernel>, KernelRef);

/// [`compiled`], with the kernel cache entry's hold for a compiled graph to keep.
fn compiled_ref(kernel: &Kernel) -> Result<(Option<Held>, StepPath, Duration), RuntimeError> {
    if let Err(reason) = ndfuse_codegen_cpu::supports(kernel) {
        return Ok((None, StepPath::KernelInterp { reason }, Duration::ZERO));
    }
    let held = |(c, used): (&Arc<CompiledKernel>, &crate::code_cache::Recency)| {
        let r = KernelRef {
            kernel: Arc::downgrade(c),
            used: used.clone(),
        };
        (Arc::clone(c), r)
    };
    let cached = lock_kernels().get(kernel).map(held);
    if let Some(c) = cached {
        return Ok((Some(c), StepPath::Jit { cached: true }, Duration::ZERO));
    }
    // A member of a known shape family runs that member's code when it lowers to the
    // same functions: a lowering instead of a compile. Outside the locks, as compiles.
    let started = Instant::now();
    // The key is computed outside the lock: another thread's lookup need not wait.
    let enabled = lock_families().enabled;
    let family = if enabled { kernel.family_key() } else { None };
    let members: Vec<Arc<CompiledKernel>> = family
        .as_ref()
        .and_then(|key| {
            let mut families = lock_families();
            let members = families.map.get_mut(key)?;
            members.retain(|m| m.strong_count() > 0);
            Some(members.iter().filter_map(Weak::upgrade).collect())
        })
        .unwrap_or_default();
    for member in members {
        if let Some(rebound) = member.rebind(kernel)? {
            // Its bytes are the member's: counted again, so the byte limit still
            // bounds the code alive (an evicted member's code lives on in these).
            let bytes = rebound.code_bytes() as u64;
            let rebound = Arc::new(rebound);
            // The family holds the newest kernel running this code, so the code stays
            // findable while any kernel of the cache still runs it.
            if let Some(key) = &family {
                let mut families = lock_families();
                if let Some(slot) = families.map.get_mut(key).and_then(|m| {
                    m.iter_mut()
                        .find(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&member)))
                }) {
                    *slot = Arc::downgrade(&rebound);
                }
            }
            let mut cache = lock_kernels();
            cache.count_rebound();
            let c = held(cache.insert(kernel.clone(), rebound, bytes));
            return Ok((Some(c), StepPath::Jit { cached: true }, started.elapsed()));
        }
    }
    // Compiled outside the lock: other threads' look-ups go on meanwhile.
    let c = Arc::new(ndfuse_codegen_cpu::compile(kernel)?);
    let took = started.elapsed();
    let bytes = c.code_bytes() as u64;
    if let Some(key) = family {
        let mut families = lock_families();
        let weak = Arc::downgrade(&c);
        match families.map.get_mut(&key) {
            Some(members) => {
                if members.len() >= FAMILY_VARIANTS {
                    members.remove(0);
                }
                members.push(weak);
            }
            None => {
                families.map.insert(key, vec![weak], 0);
            }
        }
    }
    let c = held(lock_kernels().insert(kernel.clone(), c, bytes));
    Ok((Some(c), StepPath::Jit { cached: false }, took))
}

/// What [`run_kernel`] returns: the outputs, the path, the compile time, and the
/// kernel cache's hold on the kernel it looked up (`None` when it ran `known`, or when
/// the interpreter ran it).
type KernelRun = (Vec<HostArray>, StepPath, Duration, Option<KernelRef>);

/// Runs one kernel: `known` (the compiled kernel an earlier run of the same compiled
/// graph used), else JIT-compiled (see [`compiled`]), or in the interpreter when the
/// codegen cannot compile it yet.
fn run_kernel(
    kernel: &Kernel,
    known: Option<Arc<CompiledKernel>>,
    args: &[&HostArray],
    debug: u8,
    pool: Option<&rayon::ThreadPool>,
) -> Result<KernelRun, RuntimeError> {
    let (compiled, held, path, took) = match known {
        Some(c) => (
            Some(c),
            None,
            StepPath::Jit { cached: true },
            Duration::ZERO,
        ),
        None => {
            let (c, path, took) = compiled_ref(kernel)?;
            let (c, held) = c.unzip();
            (c, held, path, took)
        }
    };
    if let (Some(c), StepPath::Jit { cached: false }, 4..) = (&compiled, &path, debug) {
        eprintln!("ndfuse: Cranelift IR of {}\n{}", kernel.name, c.clif());
    }
    let Some(compiled) = compiled else {
        return Ok((interp::eval_kernel(kernel, args)?, path, took, None));
    };
    // Every element of every output is written by the kernel (`CompiledKernel::run`
    // covers the whole domain), so a recycled buffer's old contents never show.
    let cache = host_cache();
    let mut outs: Vec<HostArray> = kernel
        .outputs
        .iter()
        .map(|b| cache.array(b.dtype, ndfuse_ir::Shape::new([b.len])))
        .collect::<Result<_, _>>()?;
    let mut out_refs: Vec<&mut HostArray> = outs.iter_mut().collect();
    // The parallel entry: chunks fixed by the kernel's shape run on the current rayon
    // pool (the global one, or the caller's inside `install`), or on the given pool (a
    // CPU device's, or `cpu_threads` workers); outputs are the same bits either way.
    let run = |out_refs: &mut [&mut HostArray]| -> Result<(), RuntimeError> {
        match &kernel.contraction {
            // The product (the last input, never bound by the schedule) is scratch from
            // the host cache; every element of it is written before the epilogue reads
            // it, block by block (`gemm::run_contraction`).
            Some(c) => {
                let shape = ndfuse_ir::Shape::new([kernel.domain.numel()]);
                let mut product = cache.array(c.dtype, shape)?;
                run_contraction(kernel, c, &compiled, args, &mut product, out_refs)
            }
            None => Ok(compiled.run(args, out_refs)?),
        }
    };
    match pool {
        Some(pool) => pool.install(|| run(&mut out_refs))?,
        None => run(&mut out_refs)?,
    }
    Ok((outs, path, took, held))
}

/// The pool for `cpu_threads` workers, `None` for 0 (use the current pool). One pool per
/// size, built on first use and kept: building threads per eval would dominate it.
fn worker_pool(cpu_threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    if cpu_threads == 0 {
        return None;
    }
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(p) = pools.get(&cpu_threads) {
        return Some(Arc::clone(p));
    }
    // A pool that cannot be built (the OS refused threads) falls back to the current one.
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(cpu_threads)
            .thread_name(|i| format!("ndfuse-cpu-{i}"))
            .build()
            .ok()?,
    );
    pools.insert(cpu_threads, Arc::clone(&pool));
    Some(pool)
}
