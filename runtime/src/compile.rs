//! The graph compile cache: the clean-up passes and fusion of a graph for a target, kept
//! by the graph's fingerprint and the options it was compiled under.

use crate::code_cache::{CodeCacheLimits, CodeCacheStats, Lru, Recency};
use crate::config::Config;
use crate::error::RuntimeError;
use ndfuse_codegen_cpu::CompiledKernel;
use ndfuse_ir::{verify, Graph, NodeId};
use ndfuse_passes::{PassLog, Schedule};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The clean-up passes on a copy of `g`, then fusion: the graph that runs, what each
/// pass did, and the schedule. Input nodes keep their ids, so bindings stay valid.
/// The IR after each pass is recorded when `record_ir` (for `explain`) or when a dump or
/// debug level asks for it: printing a large graph after every pass of every eval
/// would cost more than the passes.
pub(crate) fn compile(
    g: &Graph,
    record_ir: bool,
    cfg: &Config,
    target: &ndfuse_passes::TargetDesc,
) -> Result<(Arc<Compiled>, bool), RuntimeError> {
    // A graph compiled before with the same options skips passes and fusion: re-running
    // them would be most of a small eval's cost. Entries are found by the graph's
    // structural hash and confirmed option for option and node for node, so a
    // collision cannot return another graph's schedule. (`same_as` is immediate for
    // the very graph value cached here, or a clone of it, as the frontend passes when
    // the same tensors are evaluated again: see `Graph::stamp`.)
    let fingerprint = g.fingerprint();
    let options = CompileOptions {
        disabled: cfg.disable_passes(),
        record_ir,
        debug: cfg.debug(),
        target: target.name,
    };
    let hit = {
        let mut cache = compile_cache()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The limits follow the configuration of this eval (a no-op when unchanged).
        cache.set_limits(CodeCacheLimits::graphs(cfg));
        let hit = cache
            .get_mut(&fingerprint)
            .and_then(|entries| {
                entries
                    .iter()
                    .find(|e| e.options.borrowed() == options && e.source.same_as(g))
            })
            .map(|e| Arc::clone(&e.compiled));
        cache.count(hit.is_some());
        hit
    };
    if let Some(hit) = hit {
        return Ok((hit, true));
    }
    let mut opts = crate::env::pass_options_from(cfg);
    // A hit is a graph equal node for node to one verified here before.
    verify(g)?;
    opts.record_ir = record_ir || opts.debug_level >= 3 || opts.dump_dir.is_some();
    let mut optimized = g.clone();
    let log = ndfuse_passes::optimize(&mut optimized, &opts)?;
    let fuse = !opts.disabled.iter().any(|p| p == "fusion");
    let schedule = ndfuse_passes::schedule_with(&optimized, target, fuse);
    if opts.debug_level >= 2 {
        // The fusion report: where each node went and why, then every kernel and plan.
        eprint!(
            "ndfuse: fusion report\n{}{}",
            schedule.annotate(&optimized, &|_| None),
            schedule.to_text(&optimized)
        );
    }
    let mut last_read = rustc_hash::FxHashMap::default();
    for (i, s) in schedule.steps.iter().enumerate() {
        for &r in s.reads() {
            last_read.insert(r, i);
        }
    }
    let jit = Mutex::new(vec![None; schedule.steps.len()]);
    let compiled = Arc::new(Compiled {
        graph: Arc::new(optimized),
        log: Arc::new(log),
        schedule: Arc::new(schedule),
        debug: opts.debug_level,
        last_read,
        jit,
    });
    let entry = CompileEntry {
        options: CompileOptions {
            disabled: options.disabled.to_vec(),
            record_ir: options.record_ir,
            debug: options.debug,
            target: options.target,
        },
        // Stamped first, so that the cached clone shares `g`'s stamp.
        source: {
            g.stamp();
            g.clone()
        },
        compiled: Arc::clone(&compiled),
    };
    let mut cache = compile_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match cache.get_mut(&fingerprint) {
        Some(entries) => {
            // Another thread may have compiled the same graph meanwhile: keep one entry.
            if !entries
                .iter()
                .any(|e| e.options == entry.options && e.source.same_as(&entry.source))
            {
                // Variants of one fingerprint (other options, or a hash collision) are
                // few; the oldest goes beyond a handful, so one slot stays bounded too.
                if entries.len() >= VARIANTS_PER_GRAPH {
                    entries.remove(0);
                }
                entries.push(entry);
            }
        }
        None => {
            // Least recently used graphs go beyond `max_graph_cache_entries`; with
            // them go their schedules, and their hold on nothing else (kernels are
            // held weakly: see `Compiled::jit`).
            cache.insert(fingerprint, vec![entry], 0);
        }
    }
    Ok((compiled, false))
}

/// Compiled variants kept per graph fingerprint (options differ, or graphs collide).
const VARIANTS_PER_GRAPH: usize = 8;

/// The graph cache's statistics (one entry per graph fingerprint).
pub(crate) fn graph_cache_stats() -> CodeCacheStats {
    compile_cache()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .stats()
}

/// The options a compiled graph depends on besides the graph: the disabled passes,
/// whether IR is recorded, the debug level and the target. `D` is the list's storage:
/// owned in the cache, borrowed from the configuration for a look-up.
#[derive(Clone, Copy, PartialEq, Eq)]
struct CompileOptions<D> {
    disabled: D,
    record_ir: bool,
    debug: u8,
    target: &'static str,
}

impl CompileOptions<Vec<String>> {
    fn borrowed(&self) -> CompileOptions<&[String]> {
        CompileOptions {
            disabled: &self.disabled,
            record_ir: self.record_ir,
            debug: self.debug,
            target: self.target,
        }
    }
}

/// A compiled graph with what it was compiled from, to confirm a hit.
struct CompileEntry {
    options: CompileOptions<Vec<String>>,
    source: Graph,
    compiled: Arc<Compiled>,
}

/// Compiled graphs by [`Graph::fingerprint`] (the hash is already one, so the map
/// does not hash it again with SipHash), least recently used evicted first.
type CompileCache = Mutex<Lru<u64, Vec<CompileEntry>>>;

fn compile_cache() -> &'static CompileCache {
    static CACHE: OnceLock<CompileCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Lru::new(CodeCacheLimits::graphs(&Config::default()))))
}

/// What [`compile`] produces.
pub(crate) struct Compiled {
    pub(crate) graph: Arc<Graph>,
    pub(crate) log: Arc<PassLog>,
    pub(crate) schedule: Arc<Schedule>,
    /// `NDFUSE_DEBUG`: 1 = a line per kernel launched, 2 = plus the fusion report,
    /// 3 = plus the IR after each pass, 4 = plus the generated code.
    pub(crate) debug: u8,
    /// The last step that reads each buffer: it is dropped right after.
    pub(crate) last_read: rustc_hash::FxHashMap<NodeId, usize>,
    /// For the CPU target: the compiled kernel of each kernel step once a run has
    /// found or compiled it, so that re-evaluations skip `supports` and hashing the
    /// kernel description into the kernel cache (`None` until then, and for steps the
    /// interpreter runs).
    pub(crate) jit: Mutex<Vec<Option<KernelRef>>>,
}

/// A compiled graph's hold on a kernel of the kernel cache: weak, so that the kernel
/// cache alone decides how long code lives (a strong hold would keep an evicted
/// kernel's code alive for as long as the graph stays cached); with the entry's
/// recency, so that re-evaluations keep their kernels recent without a look-up.
#[derive(Clone)]
pub(crate) struct KernelRef {
    pub(crate) kernel: Weak<CompiledKernel>,
    pub(crate) used: Recency,
}

impl KernelRef {
    /// The kernel, marked used, unless the kernel cache evicted it and no evaluation
    /// holds it any more.
    pub(crate) fn get(&self) -> Option<Arc<CompiledKernel>> {
        let k = self.kernel.upgrade()?;
        self.used.touch();
        Some(k)
    }
}
