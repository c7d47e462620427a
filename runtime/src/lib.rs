//! # ndfuse-runtime
//!
//! Runs graphs on a backend: schedules them with `ndfuse-passes`, compiles each kernel
//! with a codegen (CPU: Cranelift JIT), falls back to the reference interpreter for what
//! a codegen cannot compile yet, and manages the buffers of an evaluation (each
//! intermediate is dropped as soon as its last reader ran).
//!
//! Backend discovery and priorities ([`Registry`]), configuration ([`Config`]), caching
//! allocators ([`host_cache`], [`Cache`]), the CUDA device, and the device set
//! ([`DeviceSet`]: thread <-> device affinity, batches over every device, moving an
//! evaluation off a device that ran out of memory). Outputs and intermediates of an
//! evaluation come from the host cache.

mod alloc;
mod backend;
mod config;
#[cfg(feature = "cuda")]
mod cuda;
mod devices;
mod env;
mod error;
mod executor;

pub use alloc::{
    host_cache, host_cache_stats, minor_page_faults, size_class, AllocError, Cache, CacheStats,
    HostAlloc, HostCache, Limits, Pooled, RawAlloc, HUGE_PAGE_MIN_BYTES, MIN_CLASS,
};
pub use backend::{
    choose, Backend, CpuBackend, CudaBackend, DeviceInfo, InterpBackend, Registry, RegistryEntry,
};
pub use config::{
    Config, ConfigBuilder, ConfigError, ConfigSource, KeyInfo, CONFIG_FILE, CONFIG_VAR, KEYS,
};
#[cfg(feature = "cuda")]
pub use cuda::{device as cuda_device, device_count as cuda_device_count, CudaDevice, DeviceAlloc};
pub use devices::{
    bind_thread, bound_device, unbind_thread, CpuDevice, Device, DeviceError, DeviceId, DeviceKind,
    DeviceMove, DeviceSet, GpuDevice, Inputs,
};
pub use error::RuntimeError;
pub use executor::{
    execute, explain, jit_ops_per_element, BackendKind, Evaluation, Explanation, StepPath,
};
