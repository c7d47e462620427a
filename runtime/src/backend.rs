//! The backend registry: which backends are compiled in, which are usable here and why
//! the others are not, and which one `auto` picks.
//!
//! Each backend is probed when a [`Registry`] is discovered. A rejected backend keeps
//! its reason ("libcuda.so not found", "not compiled with CUDA"), so asking for it gives
//! an error a user can act on instead of ND4J's bare "no backend found".
//!
//! Choice, highest first: an explicit backend in code, then the config's `backend` key,
//! then `auto`: the available backend with the highest priority
//! (`backend_priority_gpu` for CUDA, `backend_priority_cpu` for the CPU; the reference
//! interpreter sits just below the CPU, as a fallback). Ties go to the earlier backend in
//! registry order (cuda, cpu, interp): GPUs first, as ND4J does.
//!
//! ```
//! use ndfuse_runtime::{BackendKind, Config, Registry};
//! let cfg = Config::builder()
//!     .config_file(None)
//!     .environment(Vec::<(String, String)>::new())
//!     .build()
//!     .unwrap();
//! let reg = Registry::discover(&cfg);
//! assert!(reg.get(BackendKind::Cpu).is_some_and(|e| e.is_available()));
//! ```

use crate::backend_kind::BackendKind;
use crate::config::Config;
use crate::error::RuntimeError;
use std::fmt;

/// One device a backend can run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// A readable name ("host (x86_64)").
    pub name: String,
    /// Hardware threads (CPU cores) or multiprocessors.
    pub threads: usize,
    /// Memory in bytes, when known.
    pub memory: Option<u64>,
}

/// A backend compiled into this build.
pub trait Backend: fmt::Debug + Send + Sync {
    /// The name used on the command line and in the config (`cpu`).
    fn name(&self) -> &'static str;
    /// Which [`BackendKind`] this is.
    fn kind(&self) -> BackendKind;
    /// The priority `auto` ranks it by, from the config.
    fn priority(&self, cfg: &Config) -> i64;
    /// The devices it can use here, or why it cannot run.
    fn probe(&self, cfg: &Config) -> Result<Vec<DeviceInfo>, String>;
}

/// The host CPU through the Cranelift JIT.
#[derive(Debug)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn priority(&self, cfg: &Config) -> i64 {
        cfg.backend_priority_cpu()
    }
    fn probe(&self, cfg: &Config) -> Result<Vec<DeviceInfo>, String> {
        Ok(vec![host_device(cfg)])
    }
}

/// The f64 reference interpreter.
#[derive(Debug)]
pub struct InterpBackend;

impl Backend for InterpBackend {
    fn name(&self) -> &'static str {
        "interp"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Interp
    }
    fn priority(&self, cfg: &Config) -> i64 {
        // Just below the CPU: the interpreter is the fallback and the reference, never
        // the first choice while the JIT is there.
        cfg.backend_priority_cpu().saturating_sub(1)
    }
    fn probe(&self, cfg: &Config) -> Result<Vec<DeviceInfo>, String> {
        Ok(vec![host_device(cfg)])
    }
}

fn host_device(cfg: &Config) -> DeviceInfo {
    // Read once: on Linux it reads cgroup files, which costs more than a small eval.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    let threads = match cfg.cpu_threads() {
        0 => cores,
        n => n,
    };
    DeviceInfo {
        name: format!("host ({})", std::env::consts::ARCH),
        threads,
        memory: None,
    }
}

/// NVIDIA GPUs through the CUDA driver.
#[derive(Debug)]
pub struct CudaBackend;

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn priority(&self, cfg: &Config) -> i64 {
        cfg.backend_priority_gpu()
    }
    fn probe(&self, _cfg: &Config) -> Result<Vec<DeviceInfo>, String> {
        probe_cuda()
    }
}

#[cfg(not(feature = "cuda"))]
fn probe_cuda() -> Result<Vec<DeviceInfo>, String> {
    Err("not compiled with CUDA (build ndfuse-runtime with the `cuda` feature)".into())
}

#[cfg(feature = "cuda")]
fn probe_cuda() -> Result<Vec<DeviceInfo>, String> {
    // Whether a driver is installed does not change while the process runs; looking on
    // disk at every evaluation cost more than a small kernel.
    static PROBE: std::sync::OnceLock<Result<Vec<DeviceInfo>, String>> = std::sync::OnceLock::new();
    PROBE.get_or_init(probe_cuda_once).clone()
}

#[cfg(feature = "cuda")]
fn probe_cuda_once() -> Result<Vec<DeviceInfo>, String> {
    let Some(path) = find_libcuda() else {
        return Err("libcuda.so not found (no NVIDIA driver on this machine)".into());
    };
    // Kernels are compiled at run time: without NVRTC the driver alone runs nothing.
    let (major, minor) = ndfuse_codegen_cuda::nvrtc_version().map_err(|e| e.to_string())?;
    if (major, minor) < MIN_NVRTC {
        return Err(format!(
            "NVRTC {major}.{minor} is older than required ({}.{})",
            MIN_NVRTC.0, MIN_NVRTC.1
        ));
    }
    let count =
        crate::cuda::device_count().map_err(|e| format!("driver at {}: {e}", path.display()))?;
    if count == 0 {
        return Err(format!("0 devices (driver at {})", path.display()));
    }
    let blas = if crate::cublas::available() {
        ", cuBLASLt"
    } else {
        ", emitted GEMMs only"
    };
    (0..count)
        .map(|i| {
            let ctx = cudarc::driver::CudaContext::new(i)
                .map_err(|e| format!("device {i}: cuCtxCreate: {e:?}"))?;
            let name = ctx.name().unwrap_or_else(|_| format!("CUDA device {i}"));
            let (cc_major, cc_minor) = ctx.compute_capability().unwrap_or((0, 0));
            let sms = ctx
                .attribute(
                    cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                )
                .unwrap_or(0);
            Ok(DeviceInfo {
                name: format!("{name} (sm_{cc_major}{cc_minor}, NVRTC {major}.{minor}{blas})"),
                threads: usize::try_from(sms).unwrap_or(0),
                memory: ctx.total_mem().ok().map(|m| m as u64),
            })
        })
        .collect()
}

/// The oldest NVRTC whose output the emitted kernels are tested with (12.0: `sm_90`).
#[cfg(feature = "cuda")]
const MIN_NVRTC: (i32, i32) = (12, 0);

/// The CUDA driver library, looked up where the dynamic loader would find it, without
/// loading it: loading waits for the backend that will use it.
#[cfg(feature = "cuda")]
fn find_libcuda() -> Option<std::path::PathBuf> {
    // LD_LIBRARY_PATH is the loader's setting, not ndfuse's, so it is read here rather
    // than through Config.
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/lib64/stubs",
            "/usr/local/nvidia/lib64",
            "/usr/lib/wsl/lib",
        ]
        .map(std::path::PathBuf::from),
    );
    dirs.iter()
        // The stub in cuda/lib64/stubs links but cannot run anything: not a driver.
        .filter(|d| !d.ends_with("stubs"))
        .flat_map(|d| ["libcuda.so.1", "libcuda.so"].map(|f| d.join(f)))
        .find(|p| p.is_file())
}

/// What probing one backend found.
#[derive(Debug)]
pub struct RegistryEntry {
    /// The backend's name.
    pub name: &'static str,
    /// Which backend.
    pub kind: BackendKind,
    /// Its priority under the config it was discovered with.
    pub priority: i64,
    /// Its devices, or why it was rejected.
    pub status: Result<Vec<DeviceInfo>, String>,
}

impl RegistryEntry {
    /// Whether it can run here.
    pub fn is_available(&self) -> bool {
        self.status.is_ok()
    }
}

/// Every backend compiled in, probed.
#[derive(Debug)]
pub struct Registry {
    entries: Vec<RegistryEntry>,
}

/// The backends compiled in, in tie-break order (GPUs first).
fn compiled_in() -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(CudaBackend),
        Box::new(CpuBackend),
        Box::new(InterpBackend),
    ]
}

impl Registry {
    /// Probes every compiled-in backend under `cfg`.
    pub fn discover(cfg: &Config) -> Registry {
        Registry::from_backends(cfg, compiled_in())
    }

    /// Probes the given backends (for tests and embedders with backends of their own).
    pub fn from_backends(cfg: &Config, backends: Vec<Box<dyn Backend>>) -> Registry {
        let entries = backends
            .iter()
            .map(|b| RegistryEntry {
                name: b.name(),
                kind: b.kind(),
                priority: b.priority(cfg),
                status: b.probe(cfg),
            })
            .collect();
        Registry { entries }
    }

    /// Every backend, found and rejected, in registry order.
    pub fn entries(&self) -> &[RegistryEntry] {
        &self.entries
    }

    /// The entry of `kind`, if compiled in.
    pub fn get(&self, kind: BackendKind) -> Option<&RegistryEntry> {
        self.entries.iter().find(|e| e.kind == kind)
    }

    /// The backend to run: `explicit` (from code) when it is not `Auto`, else the
    /// config's `backend` key when it is not `auto`, else the available backend with
    /// the highest priority. A requested backend that cannot run is an error with the
    /// reason its probe gave.
    pub fn choose(
        &self,
        cfg: &Config,
        explicit: Option<BackendKind>,
    ) -> Result<BackendKind, RuntimeError> {
        let requested = explicit
            .filter(|&k| k != BackendKind::Auto)
            .unwrap_or(cfg.backend());
        if requested != BackendKind::Auto {
            return match self.get(requested) {
                Some(RegistryEntry { status: Ok(_), .. }) => Ok(requested),
                Some(RegistryEntry {
                    status: Err(reason),
                    ..
                }) => Err(RuntimeError::Unavailable {
                    backend: requested.name(),
                    reason: reason.clone(),
                }),
                None => Err(RuntimeError::Unavailable {
                    backend: requested.name(),
                    reason: "not compiled into this build".into(),
                }),
            };
        }
        let mut best: Option<&RegistryEntry> = None;
        for e in self.entries.iter().filter(|e| e.is_available()) {
            // Strictly greater: on a tie the earlier entry (registry order) stays.
            if best.is_none_or(|b| e.priority > b.priority) {
                best = Some(e);
            }
        }
        best.map(|e| e.kind).ok_or_else(|| RuntimeError::NoBackend {
            reasons: self
                .entries
                .iter()
                .filter_map(|e| e.status.as_ref().err().map(|r| format!("{}: {r}", e.name)))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

/// A table of every backend: name, status, priority, devices or reason.
impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            match &e.status {
                Ok(devices) => {
                    let list: Vec<String> = devices
                        .iter()
                        .map(|d| format!("{}, {} threads", d.name, d.threads))
                        .collect();
                    writeln!(
                        f,
                        "{:<7} available      priority {:<5} {}",
                        e.name,
                        e.priority,
                        list.join("; ")
                    )?;
                }
                Err(reason) => writeln!(
                    f,
                    "{:<7} not available  priority {:<5} {reason}",
                    e.name, e.priority
                )?,
            }
        }
        Ok(())
    }
}

/// Discovers the registry under `cfg` and chooses (see [`Registry::choose`]).
pub fn choose(cfg: &Config, explicit: Option<BackendKind>) -> Result<BackendKind, RuntimeError> {
    Registry::discover(cfg).choose(cfg, explicit)
}

/// The backend `execute` and `explain` run for `requested`. The CPU and the interpreter
/// are always there, so naming one skips loading the config and probing; `Auto` and
/// CUDA go through [`choose`].
pub(crate) fn resolve(requested: BackendKind, cfg: &Config) -> Result<BackendKind, RuntimeError> {
    match requested {
        BackendKind::Cpu | BackendKind::Interp => Ok(requested),
        BackendKind::Auto | BackendKind::Cuda => {
            // The compiled-in probes give the same verdict all process long (CUDA's is
            // probed once; the CPU and the interpreter are always there), so the choice
            // is a function of these settings alone. Remembered for the last settings:
            // discovering the registry allocates, on every evaluation.
            type Choice = ((BackendKind, BackendKind, i64, i64), BackendKind);
            static LAST: std::sync::Mutex<Option<Choice>> = std::sync::Mutex::new(None);
            let key = (
                requested,
                cfg.backend(),
                cfg.backend_priority_cpu(),
                cfg.backend_priority_gpu(),
            );
            let mut last = LAST
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((seen, chosen)) = *last {
                if seen == key {
                    return Ok(chosen);
                }
            }
            // Errors are not kept: they are made again, with their reasons, each time.
            let chosen = choose(cfg, Some(requested))?;
            *last = Some((key, chosen));
            Ok(chosen)
        }
    }
}
