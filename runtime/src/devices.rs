//! Devices: the set of places an evaluation can run (every CUDA GPU the registry finds,
//! and the CPU, whole or split into several CPU devices of their own worker threads),
//! thread <-> device affinity, batches placed over the set, and the move to another
//! device when one runs out of memory.
//!
//! This is ND4J's multi-device model:
//!
//! - **Affinity**: a thread is bound to one device at a time. Explicitly with
//!   [`bind_thread`] (ND4J's `attachThreadToDevice`), or, when `allow_multi_gpu` is on,
//!   the set hands each new thread the next device round-robin (the GPUs; the CPU
//!   devices when there is no GPU) and keeps it there.
//! - **Placement**: a batch of independent evaluations ([`DeviceSet::execute_batch`])
//!   goes to the devices in priority order, one job each in turn: with the default
//!   priorities every GPU gets work before the first CPU device does ("exhaust the GPUs,
//!   then add CPUs"). Each device runs its jobs on its own thread, so devices work at
//!   the same time.
//! - **Out of memory**: when a device reports [`AllocError::OutOfMemory`], the
//!   evaluation moves to the next device by priority; the move is logged on stderr and
//!   recorded in [`Evaluation::moves`]. Other errors are returned as they are: a
//!   program that is wrong on one device is wrong on all of them.
//!
//! A device is anything that implements the small [`Device`] trait, so tests and
//! embedders can add their own (a device that always reports out-of-memory shows the
//! fallback without a GPU).
//!
//! ```
//! use ndfuse_runtime::{Config, CpuDevice, Device, DeviceSet};
//! use std::sync::Arc;
//! let cfg = Config::builder()
//!     .config_file(None)
//!     .environment(Vec::<(String, String)>::new())
//!     .build()
//!     .unwrap();
//! // Two CPU devices of one worker thread each.
//! let set = DeviceSet::new(
//!     CpuDevice::split(2, 2)?
//!         .into_iter()
//!         .map(|d| Arc::new(d) as Arc<dyn Device>)
//!         .collect(),
//!     &cfg,
//! )?;
//! assert_eq!(set.placement(3).iter().map(|d| d.to_string()).collect::<Vec<_>>(),
//!            ["cpu:0", "cpu:1", "cpu:0"]);
//! # Ok::<(), ndfuse_runtime::DeviceError>(())
//! ```

use crate::alloc::AllocError;
use crate::backend::Registry;
use crate::backend_kind::BackendKind;
use crate::config::Config;
use crate::device_id::{DeviceId, DeviceMove};
use crate::error::{DeviceError, RuntimeError};
use crate::evaluation::Evaluation;
use crate::target::{execute_on, Target};
use ndfuse_ir::{Graph, HostArray, NodeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;

/// The inputs of an evaluation: data bound to each input node.
pub type Inputs = HashMap<NodeId, Arc<HostArray>>;

/// One place evaluations can run.
pub trait Device: fmt::Debug + Send + Sync {
    /// Its id, unique in a set.
    fn id(&self) -> DeviceId;
    /// Whether it counts as a GPU: GPUs take `backend_priority_gpu` and are filled
    /// first by placement and round-robin.
    fn is_gpu(&self) -> bool;
    /// One line for listings (`host, 4 threads`).
    fn describe(&self) -> String;
    /// Its priority under `cfg`: `backend_priority_gpu` for a GPU, else
    /// `backend_priority_cpu`. Higher runs first.
    fn priority(&self, cfg: &Config) -> i64 {
        if self.is_gpu() {
            cfg.backend_priority_gpu()
        } else {
            cfg.backend_priority_cpu()
        }
    }
    /// Evaluates the outputs of `g` here. Out of memory must be
    /// `RuntimeError::Alloc(AllocError::OutOfMemory { .. })`, so the set can move on.
    fn execute(&self, g: &Graph, inputs: &Inputs, cfg: &Config)
        -> Result<Evaluation, RuntimeError>;
    /// A copy of `a` made for this device.
    fn transfer(&self, a: &HostArray) -> Result<HostArray, RuntimeError>;
    /// Keeps `a` on this device for the evaluations that follow, while `a` lives: a GPU
    /// uploads it once now instead of at every evaluation. The host has nothing to do.
    fn make_resident(&self, _a: &Arc<HostArray>) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// The CPU, or a part of it: kernels run on this device's own pool of worker threads,
/// or, for the whole host, where [`crate::execute`] runs them (the current rayon pool,
/// or `cpu_threads` workers when that key is set).
#[derive(Debug)]
pub struct CpuDevice {
    index: usize,
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

impl CpuDevice {
    /// The whole host as `cpu:0`.
    pub fn host(cfg: &Config) -> CpuDevice {
        let threads = match cfg.cpu_threads() {
            0 => host_cores(),
            n => n,
        };
        CpuDevice {
            index: 0,
            threads,
            pool: None,
        }
    }

    /// `cpu:index` with a pool of its own `threads` workers (named `ndfuse-cpu{index}-{i}`).
    pub fn with_threads(index: usize, threads: usize) -> Result<CpuDevice, DeviceError> {
        let fail = |reason: String| DeviceError::CpuSplit {
            devices: 1,
            threads,
            reason,
        };
        if threads == 0 {
            return Err(fail("a CPU device needs at least one thread".into()));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("ndfuse-cpu{index}-{i}"))
            .build()
            .map_err(|e| fail(e.to_string()))?;
        Ok(CpuDevice {
            index,
            threads,
            pool: Some(pool),
        })
    }

    /// `devices` CPU devices `cpu:0..` sharing `threads` worker threads as evenly as
    /// possible (the first ones get one more when it does not divide).
    pub fn split(devices: usize, threads: usize) -> Result<Vec<CpuDevice>, DeviceError> {
        if devices == 0 || devices > threads {
            return Err(DeviceError::CpuSplit {
                devices,
                threads,
                reason: "every CPU device needs at least one thread".into(),
            });
        }
        (0..devices)
            .map(|i| {
                CpuDevice::with_threads(i, threads / devices + usize::from(i < threads % devices))
            })
            .collect()
    }

    /// Its worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on this device's threads (for the whole host: on the caller's).
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}

fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

impl Device for CpuDevice {
    fn id(&self) -> DeviceId {
        DeviceId::cpu(self.index)
    }
    fn is_gpu(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        let whole = if self.pool.is_none() {
            "host"
        } else {
            "host part"
        };
        format!(
            "{whole} ({}), {} threads",
            std::env::consts::ARCH,
            self.threads
        )
    }
    fn execute(
        &self,
        g: &Graph,
        inputs: &Inputs,
        cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        let mut ev = execute_on(g, inputs, cfg, Target::Cpu(self.pool.as_ref()))?;
        ev.device = self.id();
        Ok(ev)
    }
    /// Copied by this device's threads, so the copy's pages are first touched (and, on
    /// a NUMA machine, placed) where this device's kernels will read them.
    fn transfer(&self, a: &HostArray) -> Result<HostArray, RuntimeError> {
        Ok(self.run(|| a.clone()))
    }
}

/// A CUDA GPU of the set, by driver ordinal: evaluations run through the CUDA backend
/// on that device (its own context, stream and device cache).
#[derive(Debug)]
pub struct GpuDevice {
    ordinal: usize,
    name: String,
}

impl GpuDevice {
    /// CUDA device `ordinal`, described as `name`. The device is opened at its first
    /// evaluation.
    pub fn new(ordinal: usize, name: impl Into<String>) -> GpuDevice {
        GpuDevice {
            ordinal,
            name: name.into(),
        }
    }
}

impl Device for GpuDevice {
    fn id(&self) -> DeviceId {
        DeviceId::cuda(self.ordinal)
    }
    fn is_gpu(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn execute(
        &self,
        g: &Graph,
        inputs: &Inputs,
        cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        execute_on(g, inputs, cfg, Target::Cuda(self.ordinal))
    }
    /// A host copy: an array handed back by value cannot be tracked, so it is not kept
    /// on the GPU; [`Device::make_resident`] keeps a shared array there.
    fn transfer(&self, a: &HostArray) -> Result<HostArray, RuntimeError> {
        Ok(a.clone())
    }
    #[cfg(feature = "cuda")]
    fn make_resident(&self, a: &Arc<HostArray>) -> Result<(), RuntimeError> {
        let cfg = Config::load()?;
        crate::cuda::device(self.ordinal, &cfg)?.make_resident(a)
    }
}

/// The devices evaluations can run on, in priority order, with the thread bindings
/// `allow_multi_gpu` hands out.
#[derive(Debug)]
pub struct DeviceSet {
    /// Highest priority first; ties keep the order given.
    devices: Vec<Arc<dyn Device>>,
    /// The next device round-robin hands out (counts GPUs, or CPU devices without GPUs).
    next: AtomicUsize,
    /// Threads round-robin placed, and where.
    assigned: Mutex<HashMap<ThreadId, DeviceId>>,
}

thread_local! {
    /// The device this thread is bound to by [`bind_thread`].
    static BOUND: RefCell<Option<DeviceId>> = const { RefCell::new(None) };
}

/// Binds the current thread to `device` (ND4J's `attachThreadToDevice`): evaluations
/// on this thread run there (on the backend `auto`, and in every device set that has
/// it; a set that lacks it reports [`DeviceError::NotInSet`]). Replaces an earlier
/// binding.
pub fn bind_thread(device: DeviceId) {
    BOUND.with(|b| *b.borrow_mut() = Some(device));
}

/// Removes the current thread's binding; returns it.
pub fn unbind_thread() -> Option<DeviceId> {
    BOUND.with(|b| b.borrow_mut().take())
}

/// The device the current thread is bound to with [`bind_thread`].
pub fn bound_device() -> Option<DeviceId> {
    BOUND.with(|b| b.borrow().clone())
}

impl DeviceSet {
    /// A set of `devices`, ordered by priority under `cfg` (highest first; ties keep
    /// the order given). `Err` when empty or when two devices share an id.
    pub fn new(devices: Vec<Arc<dyn Device>>, cfg: &Config) -> Result<DeviceSet, DeviceError> {
        if devices.is_empty() {
            return Err(DeviceError::Empty);
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e.id() == d.id()) {
                return Err(DeviceError::Duplicate { device: d.id() });
            }
        }
        let mut devices = devices;
        // Stable: equal priorities keep the caller's order.
        devices.sort_by_key(|d| std::cmp::Reverse(d.priority(cfg)));
        Ok(DeviceSet {
            devices,
            next: AtomicUsize::new(0),
            assigned: Mutex::new(HashMap::new()),
        })
    }

    /// Every CUDA device the registry finds, then the CPU split into `cpu_devices`
    /// devices sharing the host's threads (`cpu_threads`, or every core); 1 keeps the
    /// whole host as `cpu:0`, running kernels where [`crate::execute`] does.
    pub fn discover(cfg: &Config, cpu_devices: usize) -> Result<DeviceSet, DeviceError> {
        let mut devices: Vec<Arc<dyn Device>> = Vec::new();
        let registry = Registry::discover(cfg);
        if let Some(Ok(gpus)) = registry.get(BackendKind::Cuda).map(|e| &e.status) {
            for (ordinal, info) in gpus.iter().enumerate() {
                devices.push(Arc::new(GpuDevice::new(ordinal, info.name.clone())));
            }
        }
        let host = CpuDevice::host(cfg);
        if cpu_devices == 1 {
            devices.push(Arc::new(host));
        } else {
            for d in CpuDevice::split(cpu_devices, host.threads())? {
                devices.push(Arc::new(d));
            }
        }
        DeviceSet::new(devices, cfg)
    }

    /// The process's set: [`DeviceSet::discover`] with the whole CPU as one device,
    /// under the configuration of the first call.
    pub fn global(cfg: &Config) -> Result<Arc<DeviceSet>, DeviceError> {
        static GLOBAL: OnceLock<Arc<DeviceSet>> = OnceLock::new();
        if let Some(s) = GLOBAL.get() {
            return Ok(Arc::clone(s));
        }
        let set = Arc::new(DeviceSet::discover(cfg, 1)?);
        Ok(Arc::clone(GLOBAL.get_or_init(|| set)))
    }

    /// The devices, highest priority first.
    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// The device `id`, or [`DeviceError::NotInSet`].
    pub fn get(&self, id: &DeviceId) -> Result<&Arc<dyn Device>, DeviceError> {
        self.position(id).map(|i| &self.devices[i])
    }

    fn position(&self, id: &DeviceId) -> Result<usize, DeviceError> {
        self.devices
            .iter()
            .position(|d| &d.id() == id)
            .ok_or_else(|| DeviceError::NotInSet {
                device: id.clone(),
                available: self
                    .devices
                    .iter()
                    .map(|d| d.id().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Where [`DeviceSet::execute_batch`] puts `jobs` evaluations: one per device in
    /// priority order, then around again.
    pub fn placement(&self, jobs: usize) -> Vec<DeviceId> {
        (0..jobs).map(|j| self.devices[self.slot(j)].id()).collect()
    }

    /// The device (by position) job `j` of a batch is placed on.
    fn slot(&self, j: usize) -> usize {
        j % self.devices.len()
    }

    /// The device of the current thread: its [`bind_thread`] binding; else, when
    /// `allow_multi_gpu` is on, the device round-robin gave this thread (handing out
    /// the next one on its first call: the GPUs, or the CPU devices when there is no
    /// GPU); else `None`.
    pub fn device_for_thread(&self, cfg: &Config) -> Option<DeviceId> {
        if let Some(d) = bound_device() {
            return Some(d);
        }
        if !cfg.allow_multi_gpu() {
            return None;
        }
        let mut assigned = self
            .assigned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let me = std::thread::current().id();
        if let Some(d) = assigned.get(&me) {
            return Some(d.clone());
        }
        let gpus: Vec<&Arc<dyn Device>> = self.devices.iter().filter(|d| d.is_gpu()).collect();
        let pool = if gpus.is_empty() {
            self.devices.iter().collect()
        } else {
            gpus
        };
        let d = pool[self.next.fetch_add(1, Ordering::Relaxed) % pool.len()].id();
        assigned.insert(me, d.clone());
        Some(d)
    }

    /// Evaluates `g` on the current thread's device ([`DeviceSet::device_for_thread`]),
    /// or on the highest-priority device when the thread has none, moving on when a
    /// device runs out of memory.
    pub fn execute(
        &self,
        g: &Graph,
        inputs: &Inputs,
        cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        let start = match self.device_for_thread(cfg) {
            Some(id) => self.position(&id)?,
            None => 0,
        };
        self.execute_from(start, g, inputs, cfg)
    }

    /// Evaluates `g` on `device`, moving on when it runs out of memory.
    pub fn execute_on(
        &self,
        device: &DeviceId,
        g: &Graph,
        inputs: &Inputs,
        cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        let start = self.position(device)?;
        self.execute_from(start, g, inputs, cfg)
    }

    /// Tries the device at `start`, then, while devices report out of memory, every
    /// other device in priority order.
    fn execute_from(
        &self,
        start: usize,
        g: &Graph,
        inputs: &Inputs,
        cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        let order =
            std::iter::once(start).chain((0..self.devices.len()).filter(move |&i| i != start));
        let mut moves: Vec<DeviceMove> = Vec::new();
        let mut attempts: Vec<String> = Vec::new();
        for i in order {
            let dev = &self.devices[i];
            if let Some(m) = moves.last_mut() {
                m.to = dev.id();
                eprintln!(
                    "ndfuse: {} ran out of memory, evaluation moved to {} ({})",
                    m.from, m.to, m.reason
                );
            }
            match dev.execute(g, inputs, cfg) {
                Ok(mut ev) => {
                    ev.moves = moves;
                    return Ok(ev);
                }
                Err(e @ RuntimeError::Alloc(AllocError::OutOfMemory { .. })) => {
                    attempts.push(format!("{}: {e}", dev.id()));
                    moves.push(DeviceMove {
                        from: dev.id(),
                        // Filled in with the next device tried.
                        to: dev.id(),
                        reason: e.to_string(),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(DeviceError::OutOfMemoryEverywhere { attempts }.into())
    }

    /// Evaluates independent graphs, placed as [`DeviceSet::placement`] says: every
    /// device with work runs its share on a thread of its own, at the same time as the
    /// others; each evaluation moves on when its device runs out of memory. Results are
    /// in the order of `jobs`.
    pub fn execute_batch(
        &self,
        jobs: &[(&Graph, &Inputs)],
        cfg: &Config,
    ) -> Vec<Result<Evaluation, RuntimeError>> {
        let n = self.devices.len();
        let mut results: Vec<Option<Result<Evaluation, RuntimeError>>> =
            jobs.iter().map(|_| None).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n.min(jobs.len()))
                .map(|d| {
                    s.spawn(move || {
                        (0..jobs.len())
                            .filter(|&j| self.slot(j) == d)
                            .map(|j| (j, self.execute_from(d, jobs[j].0, jobs[j].1, cfg)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for h in handles {
                // A panic in a device is a bug there; carry it to the caller.
                let done = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                for (j, r) in done {
                    results[j] = Some(r);
                }
            }
        });
        results
            .into_iter()
            .map(|r| r.expect("every job is placed on exactly one device (a bug otherwise)"))
            .collect()
    }

    /// Keeps `a` on `device` for the evaluations that follow ([`Device::make_resident`]).
    pub fn make_resident(&self, a: &Arc<HostArray>, device: &DeviceId) -> Result<(), RuntimeError> {
        self.get(device)?.make_resident(a)
    }

    /// A copy of `a` made by `device` ([`Device::transfer`]).
    pub fn to_device(&self, a: &HostArray, device: &DeviceId) -> Result<HostArray, RuntimeError> {
        self.get(device)?.transfer(a)
    }
}

/// One line per device, highest priority first: id and description.
impl fmt::Display for DeviceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.devices {
            writeln!(f, "{:<8} {}", d.id().to_string(), d.describe())?;
        }
        Ok(())
    }
}
