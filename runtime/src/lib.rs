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
mod attention;
mod backend;
mod backend_kind;
mod code_cache;
mod compile;
mod config;
mod cpu;
#[cfg(feature = "cuda")]
mod cublas;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_host;
mod device_id;
mod devices;
mod env;
mod env_keys;
mod error;
mod evaluation;
mod executor;
mod gemm;
mod gemm_packed;
mod gemm_tier;
mod gemv;
mod linalg;
mod quant;
mod quant_x86;
mod routines;
mod step_path;
mod target;

pub use alloc::{
    host_cache, host_cache_stats, minor_page_faults, size_class, AllocError, Cache, CacheStats,
    HostAlloc, HostCache, Limits, Pooled, RawAlloc, HUGE_PAGE_MIN_BYTES, MIN_CLASS,
};
pub use backend::{
    choose, Backend, CpuBackend, CudaBackend, DeviceInfo, InterpBackend, Registry, RegistryEntry,
};
pub use backend_kind::BackendKind;
pub use code_cache::{CodeCacheLimits, CodeCacheStats, CompileCacheStats};
pub use config::{
    Config, ConfigBuilder, ConfigError, ConfigSource, KeyInfo, CONFIG_FILE, CONFIG_VAR, KEYS,
};
pub use cpu::{compile_cache_stats, jit_ops_per_element};
#[cfg(feature = "cuda")]
pub use cublas::{cublaslt_call, cublaslt_epilogue};
#[cfg(feature = "cuda")]
pub use cuda::{device as cuda_device, device_count as cuda_device_count, CudaDevice, DeviceAlloc};
pub use device_id::{DeviceId, DeviceKind, DeviceMove};
pub use devices::{
    bind_thread, bound_device, unbind_thread, CpuDevice, Device, DeviceSet, GpuDevice, Inputs,
};
pub use error::{DeviceError, RuntimeError};
pub use evaluation::Evaluation;
pub use executor::{execute, explain, Explanation};
pub use gemm_tier::ProductTier;
/// The CPU code generator's error, which [`RuntimeError::Codegen`] carries.
pub use ndfuse_codegen_cpu::CodegenError;
pub use routines::{run_routine, RADIX_MIN, SCAN_BLOCK};
pub use step_path::StepPath;
