//! The context: default dtype (ND4J's `setDTypeForContext`), backend choice, device
//! set and the host cache it uses. Constructors (`constructors.rs`) and evaluation
//! (`eval.rs`) are methods of the same type defined in the files above it.
//!
//! The default dtype comes, highest first, from code ([`ContextBuilder::dtype`],
//! [`Context::set_default_dtype`]), then the `default_dtype` configuration key
//! (`NDFUSE_DEFAULT_DTYPE`, then `ndfuse.toml`), then f32; [`Context::dtype_origin`]
//! says which.

use crate::error::{Error, Result};
use ndfuse_ir::DType;
use ndfuse_runtime::{BackendKind, Config, ConfigSource, DeviceId, DeviceSet};
use std::panic::Location;
use std::sync::{Arc, OnceLock, RwLock};

#[derive(Debug)]
struct Settings {
    dtype: DType,
    /// Where `dtype` came from: the builder or a setter (code), or the configuration.
    dtype_origin: ConfigSource,
    backend: BackendKind,
    /// The context's own device set; `None`: the process's ([`DeviceSet::global`]).
    devices: Option<Arc<DeviceSet>>,
}

/// Where tensors are made and evaluated: holds the default dtype used by constructors
/// and the backend `eval` runs on. Cheap to clone (shared); `Send + Sync`.
///
/// ```
/// use ndfuse::{Context, DType};
/// let ctx = Context::builder().dtype(DType::F64).build()?;
/// let x = ctx.ones(&[2, 3]);
/// assert_eq!(x.dtype()?, DType::F64);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Context(Arc<RwLock<Settings>>);

impl Default for Context {
    fn default() -> Context {
        Context::new()
    }
}

/// Builder for a [`Context`].
#[derive(Debug, Clone)]
pub struct ContextBuilder {
    dtype: Option<DType>,
    config: Option<Config>,
    backend: BackendKind,
    devices: Option<Arc<DeviceSet>>,
}

impl ContextBuilder {
    /// The default dtype of constructors and literals (a float dtype). Overrides the
    /// `default_dtype` configuration key; when not set, that key decides (f32 when
    /// nobody set it).
    pub fn dtype(mut self, dtype: DType) -> ContextBuilder {
        self.dtype = Some(dtype);
        self
    }

    /// Evaluations run on these devices instead of the process's set: a bound or
    /// round-robin placed thread on its device, others on the set's first device by
    /// priority, batches over all of them. The backend setting is then not used.
    pub fn devices(mut self, devices: Arc<DeviceSet>) -> ContextBuilder {
        self.devices = Some(devices);
        self
    }

    /// Reads the `default_dtype` key from this configuration instead of loading one from
    /// the file and the environment (for embedders that build their own [`Config`]).
    pub fn config(mut self, config: Config) -> ContextBuilder {
        self.config = Some(config);
        self
    }

    /// The backend `eval` uses (auto if not set).
    pub fn backend(mut self, backend: BackendKind) -> ContextBuilder {
        self.backend = backend;
        self
    }

    /// The context; `Err` when the dtype is not a float dtype, or when no dtype was
    /// given and the configuration cannot be loaded (an unknown key, a bad value).
    #[track_caller]
    pub fn build(self) -> Result<Context> {
        let at = Location::caller();
        let (dtype, dtype_origin) = match (self.dtype, self.config) {
            (Some(d), _) => (d, ConfigSource::Builder),
            (None, Some(cfg)) => from_config(&cfg),
            (None, None) => {
                from_config(&Config::load().map_err(ndfuse_runtime::RuntimeError::from)?)
            }
        };
        check_default_dtype(dtype, at)?;
        Ok(Context(Arc::new(RwLock::new(Settings {
            dtype,
            dtype_origin,
            backend: self.backend,
            devices: self.devices,
        }))))
    }
}

/// The configuration's `default_dtype` and where it came from. The parser accepts only
/// float dtypes, so the value needs no further check.
fn from_config(cfg: &Config) -> (DType, ConfigSource) {
    let origin = cfg
        .origin("default_dtype")
        .cloned()
        .unwrap_or(ConfigSource::Default);
    (cfg.default_dtype(), origin)
}

fn check_default_dtype(dtype: DType, at: &'static Location<'static>) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::Argument {
            what: "default dtype",
            why: format!("{dtype} is not a float dtype (use f16, bf16, f32 or f64)"),
            at,
        })
    }
}

impl Context {
    /// A context with the auto backend and the configured default dtype
    /// (`default_dtype`: `NDFUSE_DEFAULT_DTYPE`, else `ndfuse.toml`, else f32).
    ///
    /// A configuration that cannot be loaded (an unknown key, a bad value) gives f32
    /// here; every `eval` loads the configuration too and returns that error, so the
    /// mistake is reported rather than lost. [`ContextBuilder::build`] returns it at once.
    pub fn new() -> Context {
        let (dtype, dtype_origin) = match Config::load() {
            Ok(cfg) => from_config(&cfg),
            Err(_) => (DType::F32, ConfigSource::Default),
        };
        Context(Arc::new(RwLock::new(Settings {
            dtype,
            dtype_origin,
            backend: BackendKind::Auto,
            devices: None,
        })))
    }

    /// A builder for a context with other settings.
    pub fn builder() -> ContextBuilder {
        ContextBuilder {
            dtype: None,
            config: None,
            backend: BackendKind::Auto,
            devices: None,
        }
    }

    /// The process-wide context used by [`Tensor::from_vec`] and friends.
    pub fn global() -> &'static Context {
        static GLOBAL: OnceLock<Context> = OnceLock::new();
        GLOBAL.get_or_init(Context::new)
    }

    fn settings(&self) -> std::sync::RwLockReadGuard<'_, Settings> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The context's own device set, if it was given one ([`ContextBuilder::devices`]).
    pub(crate) fn own_devices(&self) -> Option<Arc<DeviceSet>> {
        self.settings().devices.clone()
    }

    fn settings_mut(&self) -> std::sync::RwLockWriteGuard<'_, Settings> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The dtype constructors and float literals use when none is given.
    pub fn default_dtype(&self) -> DType {
        self.settings().dtype
    }

    /// Where the default dtype came from: [`ConfigSource::Builder`] when code chose it
    /// (the builder or [`Context::set_default_dtype`]), else the configuration's source
    /// of `default_dtype` (an environment variable, the file, or the default).
    ///
    /// ```
    /// use ndfuse::{Context, ConfigSource, DType};
    /// let ctx = Context::builder().dtype(DType::F16).build()?;
    /// assert_eq!(ctx.dtype_origin(), ConfigSource::Builder);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn dtype_origin(&self) -> ConfigSource {
        self.settings().dtype_origin.clone()
    }

    /// Sets the default dtype, like ND4J's `setDTypeForContext`. Affects tensors made
    /// afterwards; `Err` for a non-float dtype.
    #[track_caller]
    pub fn set_default_dtype(&self, dtype: DType) -> Result<()> {
        check_default_dtype(dtype, Location::caller())?;
        let mut s = self.settings_mut();
        s.dtype = dtype;
        s.dtype_origin = ConfigSource::Builder;
        Ok(())
    }

    /// The backend `eval` uses.
    pub fn backend(&self) -> BackendKind {
        self.settings().backend
    }

    /// Chooses the backend `eval` uses.
    pub fn set_backend(&self, backend: BackendKind) {
        self.settings_mut().backend = backend;
    }

    /// The device set this context's evaluations use: its own
    /// ([`ContextBuilder::devices`]) or the process's ([`DeviceSet::global`]: every
    /// CUDA device found, then the whole CPU as `cpu:0`).
    pub fn devices(&self) -> Result<Arc<DeviceSet>> {
        if let Some(set) = &self.settings().devices {
            return Ok(Arc::clone(set));
        }
        let cfg = Config::load().map_err(ndfuse_runtime::RuntimeError::from)?;
        Ok(DeviceSet::global(&cfg).map_err(ndfuse_runtime::RuntimeError::from)?)
    }

    /// Binds the current thread to `device` (ND4J's thread <-> device affinity): this
    /// thread's evaluations run there until [`crate::unbind_thread`]. `Err` when this
    /// context's device set has no such device.
    ///
    /// ```
    /// use ndfuse::{Context, DeviceId};
    /// let ctx = Context::new();
    /// ctx.bind_thread(&DeviceId::cpu(0))?;
    /// let (_, report) = ctx.eval_report(&[&ctx.ones(&[4]).exp()])?;
    /// assert_eq!(report.device(), &DeviceId::cpu(0));
    /// assert!(ctx.bind_thread(&DeviceId::cuda(99)).is_err());
    /// ndfuse::unbind_thread();
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn bind_thread(&self, device: &DeviceId) -> Result<()> {
        self.devices()?
            .get(device)
            .map_err(ndfuse_runtime::RuntimeError::from)?;
        ndfuse_runtime::bind_thread(device.clone());
        Ok(())
    }

    /// What the host buffer cache did so far and holds now: hits, misses, bytes cached,
    /// high-water mark and limits. The cache is shared by every context of the process
    /// (outputs and intermediates of every eval come from it).
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.rand_uniform(&[1000], -1.0, 1.0, 1);
    /// drop(ctx.eval(&[&x.exp()])?); // the output's buffer goes back to the cache
    /// drop(ctx.eval(&[&x.exp()])?); // and serves the second eval
    /// assert!(ctx.cache_stats().hits >= 1);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn cache_stats(&self) -> ndfuse_runtime::CacheStats {
        ndfuse_runtime::host_cache_stats()
    }

    /// What the compiled-code caches did so far and hold now: CPU kernels (entries and
    /// bytes of machine code) and compiled graphs, with hits, misses, evictions and the
    /// limits in force (`max_kernel_cache_entries`, `max_kernel_cache`,
    /// `max_graph_cache_entries`). Shared by every context of the process.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.rand_uniform(&[1000], -1.0, 1.0, 1);
    /// drop(ctx.eval(&[&x.exp()])?);
    /// let s = ctx.compile_cache_stats();
    /// assert!(s.graphs.entries >= 1 && s.graphs.entries <= s.graphs.max_entries);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn compile_cache_stats(&self) -> ndfuse_runtime::CompileCacheStats {
        ndfuse_runtime::compile_cache_stats()
    }

    /// Frees every buffer the host cache holds (buffers in use stay); returns the bytes
    /// freed.
    pub fn trim_cache(&self) -> u64 {
        ndfuse_runtime::host_cache().trim()
    }
}
