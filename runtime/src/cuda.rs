//! The CUDA device: one context and one stream per device (cudarc's driver API, loaded
//! at run time), a module cache of NVRTC-compiled kernels, a caching device allocator
//! with ND4J's limits, and the evaluation of a schedule on the device.
//!
//! Transfers go through page-locked staging buffers, from a second cache of the same
//! kind (`Cache<PinnedAlloc>`, under the host limits), so the driver copies by DMA and
//! uploads run asynchronously on the stream.
//!
//! An evaluation uploads the graph's inputs once, runs every kernel step on device
//! buffers (intermediates never visit the host; each goes back to the device cache right
//! after its last reader is launched, which is safe because everything runs in order on
//! one stream), and downloads the outputs. Routine steps (scatter-add, scans, argsort)
//! run emitted routines on the device; what has no CUDA code runs on the host
//! (`cuda_host`: the CPU routine or the interpreter) between downloads and uploads.
//!
//! Errors: a launch that the driver rejects is an `Err` at once; a fault inside a kernel
//! surfaces at the next synchronisation (the download of the outputs, or right after
//! each launch with `NDFUSE_DEBUG >= 1`, which also times each kernel). Out of device
//! memory, after the cache has freed what it holds, is `RuntimeError::Alloc` with
//! `AllocError::OutOfMemory`, which the caller can act on (move to another device).

use crate::alloc::{AllocError, Cache, Limits, Pooled, RawAlloc};
use crate::code_cache::{CodeCacheLimits, Lru};
use crate::config::Config;
use crate::cublas::{self, Lt, LtProduct};
use crate::cuda_host::{
    check_routine_sizes, check_scatter_indices, check_sizes, release_reads, run_on_host,
};
use crate::error::RuntimeError;
use crate::step_path::StepPath;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use ndfuse_codegen_cuda::{CompileOptions, CudaKernel, CudaOptions, ImageKind};
use ndfuse_ir::{DType, Graph, HostArray, NodeId};
use ndfuse_passes::{Schedule, Step};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Device memory of one device, for the caching allocator.
#[derive(Debug)]
pub struct DeviceAlloc {
    name: String,
    stream: Arc<CudaStream>,
}

impl RawAlloc for DeviceAlloc {
    type Kind = ();
    type Block = CudaSlice<u8>;

    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, _: (), bytes: usize) -> Result<CudaSlice<u8>, AllocError> {
        // SAFETY: the memory is uninitialised; every user writes a buffer (an upload
        // or a kernel's stores, which cover every element) before anything reads it.
        unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.map_err(|e| {
            if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                AllocError::OutOfMemory {
                    memory: self.name.clone(),
                    bytes,
                }
            } else {
                AllocError::Failed {
                    memory: self.name.clone(),
                    bytes,
                    reason: format!("{e:?}"),
                }
            }
        })
    }

    fn describe(&self, block: &CudaSlice<u8>) -> ((), usize) {
        ((), block.len())
    }
}

/// Page-locked host memory of one device's context: the staging buffers of transfers
/// (the driver copies from and to them by DMA, asynchronously on the stream).
#[derive(Debug)]
pub struct PinnedAlloc {
    name: String,
    stream: Arc<CudaStream>,
}

impl RawAlloc for PinnedAlloc {
    type Kind = ();
    type Block = PinnedHostSlice<u8>;

    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, _: (), bytes: usize) -> Result<PinnedHostSlice<u8>, AllocError> {
        // Flags 0, not write-combined: the host reads downloads back from it.
        // SAFETY: the memory is uninitialised; a staging buffer is always written (by
        // the host before an upload, by the device before the host reads a download)
        // before it is read.
        unsafe {
            self.stream
                .context()
                .alloc_pinned_with_flags::<u8>(bytes.max(1), 0)
        }
        .map_err(|e| AllocError::Failed {
            memory: self.name.clone(),
            bytes,
            reason: format!("{e:?}"),
        })
    }

    fn describe(&self, block: &PinnedHostSlice<u8>) -> ((), usize) {
        ((), block.len())
    }
}

/// One CUDA device ready to run kernels.
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    stream: Arc<CudaStream>,
    cache: Arc<Cache<DeviceAlloc>>,
    staging: Arc<Cache<PinnedAlloc>>,
    /// Host arrays kept on the device ([`CudaDevice::make_resident`]), by address, with
    /// a weak handle that says whether the array still lives.
    resident: Mutex<HashMap<usize, Resident>>,
    /// Loaded modules by (arch, source), bounded like the CPU kernel cache
    /// (`max_kernel_cache_entries`, `max_kernel_cache` bytes of image), least recently
    /// used unloaded first (when the last launch holding it is done).
    modules: Mutex<Lru<(String, String), Arc<Loaded>>>,
    /// cuBLASLt for the products it takes, made on the first product (`None`: the
    /// library is missing, or `NDFUSE_CUDA_GEMM=emitted`).
    lt: OnceLock<Option<Lt>>,
}

/// A host array's copy on the device.
#[derive(Debug)]
struct Resident {
    host: std::sync::Weak<HostArray>,
    device: Arc<Pooled<DeviceAlloc>>,
}

/// A kernel's module, loaded, with its functions.
#[derive(Debug)]
struct Loaded {
    functions: HashMap<String, CudaFunction>,
    origin: ndfuse_codegen_cuda::Origin,
}

fn driver_err(call: &str, e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError::Cuda(format!("{call}: {e:?}"))
}

/// Device `ordinal`, created on first use and kept for the process.
pub fn device(ordinal: usize, cfg: &Config) -> Result<Arc<CudaDevice>, RuntimeError> {
    type Devices = Mutex<HashMap<usize, Arc<CudaDevice>>>;
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    let mut map = devices.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&ordinal) {
        d.cache.set_limits(Limits::device(cfg));
        return Ok(Arc::clone(d));
    }
    driver_present()?;
    let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("cuCtxCreate", e))?;
    let capability = ctx
        .compute_capability()
        .map_err(|e| driver_err("cuDeviceGetAttribute", e))?;
    let name = ctx.name().map_err(|e| driver_err("cuDeviceGetName", e))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| driver_err("cuStreamCreate", e))?;
    let cache = Arc::new(Cache::new(
        DeviceAlloc {
            name: format!("cuda:{ordinal}"),
            stream: Arc::clone(&stream),
        },
        Limits::device(cfg),
    ));
    let staging = Arc::new(Cache::new(
        PinnedAlloc {
            name: format!("cuda:{ordinal} pinned host"),
            stream: Arc::clone(&stream),
        },
        Limits::host(cfg),
    ));
    let d = Arc::new(CudaDevice {
        ordinal,
        name,
        capability,
        stream,
        cache,
        staging,
        resident: Mutex::new(HashMap::new()),
        modules: Mutex::new(Lru::new(CodeCacheLimits::kernels(cfg))),
        lt: OnceLock::new(),
    });
    map.insert(ordinal, Arc::clone(&d));
    Ok(d)
}

/// Whether the CUDA driver library can be loaded (cudarc panics on first use when it
/// cannot, so every entry point asks first).
fn driver_present() -> Result<(), RuntimeError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loading the driver library runs its initialisers, which have no
    // preconditions; cudarc only tries the names it lists.
    let ok = *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() });
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::Unavailable {
            backend: "cuda",
            reason: "libcuda.so could not be loaded (no NVIDIA driver on this machine)".into(),
        })
    }
}

/// Number of CUDA devices the driver reports.
pub fn device_count() -> Result<usize, RuntimeError> {
    driver_present()?;
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| driver_err("cuDeviceGetCount", e))
}

/// The emitter's limits from the configuration, for no device in particular (no
/// tensor cores; [`run`] names its device's compute capability).
pub fn cuda_options(cfg: &Config) -> CudaOptions {
    CudaOptions {
        max_block_size: cfg.max_block_size(),
        max_grid_size: cfg.max_grid_size(),
        compute_capability: None,
    }
}

impl CudaDevice {
    /// `name (sm_XY)`.
    pub fn describe(&self) -> String {
        format!(
            "{} (sm_{}{})",
            self.name, self.capability.0, self.capability.1
        )
    }

    /// The device's caching allocator.
    pub fn cache(&self) -> &Arc<Cache<DeviceAlloc>> {
        &self.cache
    }

    /// cuBLASLt, where this device can use it. A handle that cannot be made (the
    /// library loads but fails) leaves the products to the emitted GEMMs, said once on
    /// stderr.
    fn lt(&self) -> Option<&Lt> {
        self.lt
            .get_or_init(|| {
                Lt::new(&self.stream).unwrap_or_else(|e| {
                    eprintln!(
                        "ndfuse: cuda:{}: no cuBLASLt ({e}); matrix products use the emitted GEMMs",
                        self.ordinal
                    );
                    None
                })
            })
            .as_ref()
    }

    /// Compiles (or finds) `k` and loads its functions.
    fn load(&self, k: &CudaKernel, cfg: &Config) -> Result<Arc<Loaded>, RuntimeError> {
        let arch = format!("sm_{}{}", self.capability.0, self.capability.1);
        let key = (arch.clone(), k.source.clone());
        {
            let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
            modules.set_limits(CodeCacheLimits::kernels(cfg));
            if let Some((l, _)) = modules.get(&key) {
                return Ok(Arc::clone(l));
            }
        }
        let opts = CompileOptions {
            arch,
            include_dirs: ndfuse_codegen_cuda::include_dirs(),
            cache_dir: cfg.kernel_cache_dir().map(|p| p.to_path_buf()),
        };
        let compiled = ndfuse_codegen_cuda::compile(k, &opts)?;
        let ptx = match compiled.kind {
            ImageKind::Cubin => cudarc::nvrtc::Ptx::from_binary(compiled.image.clone()),
            ImageKind::Ptx => {
                cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(&compiled.image).into_owned())
            }
        };
        let module = self
            .stream
            .context()
            .load_module(ptx)
            .map_err(|e| driver_err("cuModuleLoadData", e))?;
        let mut functions = HashMap::new();
        for l in &k.launches {
            let f = module
                .load_function(&l.function)
                .map_err(|e| driver_err("cuModuleGetFunction", e))?;
            functions.insert(l.function.clone(), f);
        }
        let loaded = Arc::new(Loaded {
            functions,
            origin: compiled.origin,
        });
        let bytes = compiled.image.len() as u64;
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        let (held, _) = modules.insert(key, loaded, bytes);
        Ok(Arc::clone(held))
    }

    /// Keeps a copy of `a` on the device for every later evaluation that reads it, for
    /// as long as `a` lives (the device copy goes back to the device cache after `a` is
    /// dropped, at the next evaluation on this device). Host arrays never change once
    /// shared, so the copy cannot go stale.
    pub fn make_resident(&self, a: &Arc<HostArray>) -> Result<(), RuntimeError> {
        if self.resident_copy(a).is_some() {
            return Ok(());
        }
        let mut staged = Vec::new();
        let buf = self.upload(a, &mut staged)?;
        self.stream
            .synchronize()
            .map_err(|e| driver_err("cuStreamSynchronize", e))?;
        drop(staged);
        self.resident
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                Arc::as_ptr(a) as usize,
                Resident {
                    host: Arc::downgrade(a),
                    device: Arc::new(buf),
                },
            );
        Ok(())
    }

    /// The device copy of `a`, if it was made resident; drops copies of arrays that
    /// died.
    fn resident_copy(&self, a: &Arc<HostArray>) -> Option<Arc<Pooled<DeviceAlloc>>> {
        let mut map = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, r| r.host.strong_count() > 0);
        map.get(&(Arc::as_ptr(a) as usize))
            .filter(|r| r.host.upgrade().is_some_and(|h| Arc::ptr_eq(&h, a)))
            .map(|r| Arc::clone(&r.device))
    }

    /// Bytes of host arrays kept on the device.
    pub fn resident_bytes(&self) -> usize {
        let mut map = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, r| r.host.strong_count() > 0);
        map.values().map(|r| r.device.len()).sum()
    }

    fn alloc(&self, bytes: usize) -> Result<Pooled<DeviceAlloc>, RuntimeError> {
        Ok(self.cache.alloc((), bytes)?)
    }

    /// Copies `a` to a new device buffer through a pinned staging buffer, which joins
    /// `staged` (it must live until the stream has run the copy).
    fn upload(
        &self,
        a: &HostArray,
        staged: &mut Vec<Pooled<PinnedAlloc>>,
    ) -> Result<Pooled<DeviceAlloc>, RuntimeError> {
        let bytes = a.len() * a.dtype().size_bytes();
        let mut buf = self.alloc(bytes)?;
        if bytes > 0 {
            // SAFETY: the storage holds `len` plain elements (no padding; bools are one
            // byte of 0 or 1) at `as_ptr`, alive while `a` is borrowed.
            let host = unsafe { std::slice::from_raw_parts(a.storage().as_ptr(), bytes) };
            let mut stage = self.staging.alloc((), bytes)?;
            let pinned = stage
                .as_mut_slice()
                .map_err(|e| driver_err("cuEventSynchronize", e))?;
            pinned[..bytes].copy_from_slice(host);
            let mut view = buf.slice_mut(0..bytes);
            self.stream
                .memcpy_htod(&pinned[..bytes], &mut view)
                .map_err(|e| driver_err("cuMemcpyHtoDAsync", e))?;
            staged.push(stage);
        }
        Ok(buf)
    }

    fn download(
        &self,
        buf: &CudaSlice<u8>,
        dtype: ndfuse_ir::DType,
        shape: ndfuse_ir::Shape,
    ) -> Result<HostArray, RuntimeError> {
        let mut a = crate::alloc::host_cache().array(dtype, shape)?;
        let bytes = a.len() * dtype.size_bytes();
        if bytes > 0 {
            let mut stage = self.staging.alloc((), bytes)?;
            let view = buf.slice(0..bytes);
            {
                let pinned = stage
                    .as_mut_slice()
                    .map_err(|e| driver_err("cuEventSynchronize", e))?;
                self.stream
                    .memcpy_dtoh(&view, &mut pinned[..bytes])
                    .map_err(|e| driver_err("cuMemcpyDtoHAsync", e))?;
            }
            self.stream
                .synchronize()
                .map_err(|e| driver_err("cuStreamSynchronize", e))?;
            let pinned = stage
                .as_mut_slice()
                .map_err(|e| driver_err("cuEventSynchronize", e))?;
            // SAFETY: the storage holds exactly `bytes` bytes at `as_mut_ptr`, borrowed
            // mutably; the device wrote each element whole (a kernel stores every
            // element, bools as 0 or 1), so every byte copied makes a valid element.
            let host =
                unsafe { std::slice::from_raw_parts_mut(a.storage_mut().as_mut_ptr(), bytes) };
            host.copy_from_slice(&pinned[..bytes]);
        }
        Ok(a)
    }

    /// Launches every function of `k` in order; returns events recorded on the stream
    /// before the first and after the last, to time them.
    fn launch(
        &self,
        k: &CudaKernel,
        loaded: &Loaded,
        args: &[&CudaSlice<u8>],
    ) -> Result<(CudaEvent, CudaEvent), RuntimeError> {
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .stream
            .record_event(timing)
            .map_err(|e| driver_err("cuEventRecord", e))?;
        let ptrs: Vec<u64> = args
            .iter()
            .map(|s| {
                let (p, _sync) = s.device_ptr(&self.stream);
                p
            })
            .collect();
        for l in &k.launches {
            let f = &loaded.functions[&l.function];
            let mut b = self.stream.launch_builder(f);
            for p in &ptrs {
                b.arg(p);
            }
            let cfg = LaunchConfig {
                grid_dim: (l.grid, 1, 1),
                block_dim: (l.block.0, l.block.1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the function was compiled from `k`'s source, whose parameters are
            // the kernel's input pointers (none for a contraction's product, which the
            // emitted GEMM keeps in registers), output pointers and (when it has one)
            // the scratch pointer, in that order: exactly `ptrs`. `check_sizes` checked
            // that count and that every buffer holds at least the bytes the kernel
            // description says it reads or writes, and all of them stay alive (and are
            // not handed to another user) until the stream has run this launch.
            unsafe { b.launch(cfg) }.map_err(|e| driver_err(&l.function, e))?;
        }
        let end = self
            .stream
            .record_event(timing)
            .map_err(|e| driver_err("cuEventRecord", e))?;
        Ok((start, end))
    }
}

impl CudaDevice {
    /// Device-to-device copy bandwidth, GB/s counting bytes read and written: the best
    /// of `trials` copies of `bytes` (the floor a memory-bound kernel is measured
    /// against).
    pub fn copy_bandwidth(&self, bytes: usize, trials: usize) -> Result<f64, RuntimeError> {
        let src = self.alloc(bytes)?;
        let mut dst = self.alloc(bytes)?;
        let best = self.best_ms(trials, || {
            self.stream
                .memcpy_dtod(&*src, &mut *dst)
                .map_err(|e| driver_err("cuMemcpyDtoDAsync", e))
        })?;
        Ok(2.0 * bytes as f64 / (best * 1e-3) / 1e9)
    }

    /// The fastest of `trials` runs of the device work `work` enqueues (after one more
    /// to warm up), ms by CUDA events around it.
    fn best_ms(
        &self,
        trials: usize,
        mut work: impl FnMut() -> Result<(), RuntimeError>,
    ) -> Result<f64, RuntimeError> {
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut best = f64::INFINITY;
        for _ in 0..trials.max(1) + 1 {
            let a = self
                .stream
                .record_event(timing)
                .map_err(|e| driver_err("cuEventRecord", e))?;
            work()?;
            let b = self
                .stream
                .record_event(timing)
                .map_err(|e| driver_err("cuEventRecord", e))?;
            b.synchronize()
                .map_err(|e| driver_err("cuEventSynchronize", e))?;
            let ms = f64::from(
                a.elapsed_ms(&b)
                    .map_err(|e| driver_err("cuEventElapsedTime", e))?,
            );
            best = best.min(ms);
        }
        Ok(best)
    }
}

/// The FMA-peak probe: 8 independent f32 FMA chains a thread (enough to hide the FMA
/// latency at full occupancy), summed at the end and stored only on an impossible value,
/// so nothing is dead code and nothing but the FMAs reaches memory.
const FMA_PROBE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) nd_fma_peak(float* out, int iters, float a, float b) {
  float x0 = threadIdx.x * 1e-7f, x1 = x0 + 1e-7f, x2 = x0 + 2e-7f, x3 = x0 + 3e-7f;
  float x4 = x0 + 4e-7f, x5 = x0 + 5e-7f, x6 = x0 + 6e-7f, x7 = x0 + 7e-7f;
  for (int i = 0; i < iters; ++i) {
    x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
    x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
  }
  const float s = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
  if (s == 1234.5678f) out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"#;

impl CudaDevice {
    /// The device's f32 FMA peak, GFLOP/s (2 a fused multiply-add): the best of `trials`
    /// launches of [`FMA_PROBE`] over 16 blocks of 256 threads per multiprocessor, timed
    /// by CUDA events. The floor of the f32 matrix products, which run on the same units
    /// (tensor cores are not counted: their products are f16/bf16).
    pub fn fma_peak(&self, trials: usize) -> Result<f64, RuntimeError> {
        let ctx = self.stream.context();
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| driver_err("cuDeviceGetAttribute", e))?;
        let ptx = cudarc::nvrtc::compile_ptx(FMA_PROBE)
            .map_err(|e| RuntimeError::Cuda(format!("the FMA probe did not compile: {e:?}")))?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| driver_err("cuModuleLoadData", e))?;
        let f = module
            .load_function("nd_fma_peak")
            .map_err(|e| driver_err("cuModuleGetFunction", e))?;
        let (blocks, threads, iters) = (sms.max(1) as u32 * 16, 256u32, 1i32 << 14);
        let out = self.alloc(blocks as usize * threads as usize * 4)?;
        let (a, b) = (0.999_999f32, 1e-6f32);
        let best = self.best_ms(trials, || {
            let mut launch = self.stream.launch_builder(&f);
            let (p, _sync) = out.device_ptr(&self.stream);
            launch.arg(&p).arg(&iters).arg(&a).arg(&b);
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: nd_fma_peak takes (float*, int, float, float): `p` points at
            // `blocks * threads` floats, one per thread, the most it writes; the scalars
            // match the parameters' types; `out` lives until best_ms has synchronised
            // on the launch's end event.
            unsafe { launch.launch(cfg) }
                .map(|_| ())
                .map_err(|e| driver_err("nd_fma_peak", e))
        })?;
        let flops = 2.0 * 8.0 * f64::from(iters) * f64::from(blocks) * f64::from(threads);
        Ok(flops / (best * 1e-3) / 1e9)
    }
}

/// What a CUDA evaluation produced.
pub(crate) struct CudaRun {
    pub outputs: Vec<HostArray>,
    pub paths: Vec<StepPath>,
    pub compile_time: Duration,
    /// Device time of the kernels (CUDA events around each step's launches); transfers
    /// are not in it.
    pub kernel_time: Duration,
}

/// A buffer of the evaluation: on the device (the evaluation's own, or a resident copy
/// of an input), or (for interpreter steps) on the host.
enum Buf {
    Device(Pooled<DeviceAlloc>),
    Resident(Arc<Pooled<DeviceAlloc>>),
    Host(HostArray),
}

impl Buf {
    fn device(&self) -> Option<&CudaSlice<u8>> {
        match self {
            Buf::Device(d) => Some(d),
            Buf::Resident(d) => Some(d),
            Buf::Host(_) => None,
        }
    }
}

/// A contraction kernel through cuBLASLt (see the `cublas` module): the product into
/// the output itself, or into an f32 buffer that the kernel's body then reads as an
/// element-wise kernel. Returns the outputs, the events around the step's device work,
/// and (time, whether cached) of the epilogue's compile; `None` when cuBLASLt has no
/// algorithm for the product (nothing launched: the emitted GEMM runs it).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn run_lt(
    dev: &CudaDevice,
    lt: &Lt,
    p: &LtProduct,
    kernel: &ndfuse_ir::Kernel,
    ins: &[NodeId],
    bufs: &HashMap<NodeId, Buf>,
    opts: &CudaOptions,
    cfg: &Config,
) -> Result<
    Option<(
        Vec<Pooled<DeviceAlloc>>,
        (CudaEvent, CudaEvent),
        (Duration, bool),
    )>,
    RuntimeError,
> {
    let c = kernel.contraction.as_ref().expect("a contraction kernel");
    let in_refs: Vec<&CudaSlice<u8>> = ins
        .iter()
        .map(|n| bufs[n].device().expect("uploaded above"))
        .collect();
    let out_bufs: Vec<Pooled<DeviceAlloc>> = kernel
        .outputs
        .iter()
        .map(|b| dev.alloc(b.len * b.dtype.size_bytes()))
        .collect::<Result<_, _>>()?;
    {
        let out_refs: Vec<&CudaSlice<u8>> = out_bufs.iter().map(|d| &**d).collect();
        check_sizes(kernel, &in_refs, &out_refs);
    }
    let product_len = kernel.inputs[c.product].len;
    // D: the output itself, or an f32 product buffer the body reads.
    let product = match p.direct {
        Some(_) => None,
        None => Some(dev.alloc(product_len * 4)?),
    };
    let (d, d_type) = match (p.direct, &product) {
        (Some((o, dtype)), _) => (&*out_bufs[o], dtype),
        (None, b) => (&**b.as_ref().expect("allocated above"), DType::F32),
    };
    let d_ptr = d.device_ptr(&dev.stream).0;
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = dev
        .stream
        .record_event(timing)
        .map_err(|e| driver_err("cuEventRecord", e))?;
    // SAFETY: `plan` built the operands' layouts from the kernel's views, which
    // `check_sizes` just checked against these buffers (every element a view reaches is
    // in its buffer); D is the output (its `len` elements, `batch * M * N`, of `d_type`)
    // or the product buffer of `product_len` f32; all live in `bufs`, `out_bufs` and
    // `product` until the stream has run this step (the caller keeps them until their
    // last reader, and a dropped one returns to a cache whose next user is ordered after
    // this call on the same stream).
    let ran = unsafe {
        lt.matmul(
            &dev.stream,
            p,
            in_refs[p.a.input],
            in_refs[p.b.input],
            p.bias().map(|b| in_refs[b]),
            d_ptr,
            d_type,
        )?
    };
    if !ran {
        return Ok(None);
    }
    let mut compiled = (Duration::ZERO, true);
    if let Some(product) = &product {
        // The body as an element-wise kernel over the product, now a buffer: the
        // kernel's last input, read at each position (Contraction::read_in_place).
        let epilogue = cublas::epilogue_kernel(kernel);
        let ck = ndfuse_codegen_cuda::emit(&epilogue, opts)?;
        let t = Instant::now();
        let loaded = dev.load(&ck, cfg)?;
        compiled = (
            t.elapsed(),
            loaded.origin == ndfuse_codegen_cuda::Origin::Memory,
        );
        let scratch = if ck.scratch_bytes > 0 {
            Some(dev.alloc(ck.scratch_bytes)?)
        } else {
            None
        };
        let mut args = in_refs.clone();
        args.push(product);
        let out_refs: Vec<&CudaSlice<u8>> = out_bufs.iter().map(|d| &**d).collect();
        check_sizes(&epilogue, &args, &out_refs);
        args.extend(out_refs);
        if let Some(s) = &scratch {
            args.push(s);
        }
        dev.launch(&ck, &loaded, &args)?;
    }
    let end = dev
        .stream
        .record_event(timing)
        .map_err(|e| driver_err("cuEventRecord", e))?;
    Ok(Some((out_bufs, (start, end), compiled)))
}

/// Runs `schedule` (of the optimised graph `g`) on device `dev`.
pub(crate) fn run(
    dev: &CudaDevice,
    g: &Graph,
    schedule: &Schedule,
    inputs: &HashMap<NodeId, Arc<HostArray>>,
    cfg: &Config,
    debug: u8,
) -> Result<CudaRun, RuntimeError> {
    // Tensor-core GEMMs for this device's capability, where NVRTC can find `crt/mma.h`
    // (`<mma.h>` includes it; PyPI ships it apart, in nvidia-cuda-nvcc): else SIMT ones.
    static MMA_H: OnceLock<bool> = OnceLock::new();
    let mma_h = *MMA_H.get_or_init(|| {
        ndfuse_codegen_cuda::include_dirs()
            .iter()
            .any(|d| d.join("crt").join("mma.h").is_file())
    });
    let (major, minor) = dev.capability;
    let opts = CudaOptions {
        compute_capability: mma_h.then_some((major.max(0) as u32, minor.max(0) as u32)),
        ..cuda_options(cfg)
    };
    let mut last_read: HashMap<NodeId, usize> = HashMap::new();
    for (i, s) in schedule.steps.iter().enumerate() {
        for &r in s.reads() {
            last_read.insert(r, i);
        }
    }
    // The outputs and the buffers they alias stay to the end.
    let kept: Vec<NodeId> = g
        .outputs()
        .iter()
        .flat_map(|&o| [o, schedule.output_buffer(o)])
        .collect();
    let mut bufs: HashMap<NodeId, Buf> = HashMap::new();
    // Staging buffers of uploads still in flight: released after the final sync.
    let mut staged: Vec<Pooled<PinnedAlloc>> = Vec::new();
    let mut timings: Vec<(CudaEvent, CudaEvent)> = Vec::new();
    let mut paths = Vec::with_capacity(schedule.steps.len());
    let mut compile_time = Duration::ZERO;
    for (i, step) in schedule.steps.iter().enumerate() {
        match step {
            Step::Kernel {
                kernel,
                inputs: ins,
                outputs: outs,
            } => {
                for n in ins {
                    if bufs.get(n).and_then(Buf::device).is_none() {
                        let dbuf = match bufs.get(n) {
                            Some(Buf::Host(a)) => Buf::Device(dev.upload(a, &mut staged)?),
                            _ => {
                                let a = inputs.get(n).unwrap_or_else(|| {
                                    panic!(
                                        "step {i} reads {n} before it is written (a scheduling bug)"
                                    )
                                });
                                match dev.resident_copy(a) {
                                    Some(r) => Buf::Resident(r),
                                    None => Buf::Device(dev.upload(a, &mut staged)?),
                                }
                            }
                        };
                        bufs.insert(*n, dbuf);
                    }
                }
                // A user's index out of range is an error before the kernel reads: the
                // index buffers are checked on the host (downloaded when on the device).
                for c in kernel.index_checks() {
                    let n = ins[c.input];
                    let ty = g.ty(n);
                    let host = match bufs.get(&n) {
                        Some(Buf::Host(a)) => a.clone(),
                        Some(b) => {
                            dev.download(b.device().expect("on the device"), ty.dtype, ty.shape)?
                        }
                        None => HostArray::clone(inputs.get(&n).unwrap_or_else(|| {
                            panic!("step {i} reads {n} before it is written (a scheduling bug)")
                        })),
                    };
                    ndfuse_ir::interp::check_index(&c, &host)?;
                }
                let lt_product = if kernel.contraction.is_some() {
                    dev.lt().zip(cublas::plan(kernel))
                } else {
                    None
                };
                if let Some((lt, p)) = lt_product {
                    let done = run_lt(dev, lt, &p, kernel, ins, &bufs, &opts, cfg)?;
                    if let Some((out_bufs, events, compiled)) = done {
                        compile_time += compiled.0;
                        if debug >= 1 {
                            events
                                .1
                                .synchronize()
                                .map_err(|e| driver_err(&kernel.name, e))?;
                            let ms = events
                                .0
                                .elapsed_ms(&events.1)
                                .map_err(|e| driver_err("cuEventElapsedTime", e))?;
                            eprintln!(
                                "ndfuse: {} [cuda:{}] {ms:.3} ms ({})",
                                kernel.name,
                                dev.ordinal,
                                cublas::cublaslt_call(kernel).unwrap_or_default()
                            );
                        }
                        timings.push(events);
                        for (n, b) in outs.iter().zip(out_bufs) {
                            bufs.insert(*n, Buf::Device(b));
                        }
                        paths.push(StepPath::Cuda {
                            cached: compiled.1,
                            device: dev.ordinal,
                        });
                        release_reads(step, i, &last_read, &kept, &mut bufs);
                        continue;
                    }
                }
                let ck = ndfuse_codegen_cuda::emit(kernel, &opts)?;
                let t = Instant::now();
                let loaded = dev.load(&ck, cfg)?;
                let took = t.elapsed();
                compile_time += took;
                if debug >= 4 && loaded.origin != ndfuse_codegen_cuda::Origin::Memory {
                    eprintln!("ndfuse: CUDA C of {}\n{}", ck.name, ck.source);
                }
                let out_bufs: Vec<Pooled<DeviceAlloc>> = kernel
                    .outputs
                    .iter()
                    .map(|b| dev.alloc(b.len * b.dtype.size_bytes()))
                    .collect::<Result<_, _>>()?;
                let scratch = if ck.scratch_bytes > 0 {
                    Some(dev.alloc(ck.scratch_bytes)?)
                } else {
                    None
                };
                {
                    let in_refs: Vec<&CudaSlice<u8>> = ins
                        .iter()
                        .map(|n| bufs[n].device().expect("uploaded above"))
                        .collect();
                    let out_refs: Vec<&CudaSlice<u8>> = out_bufs.iter().map(|d| &**d).collect();
                    check_sizes(kernel, &in_refs, &out_refs);
                    let mut args = in_refs;
                    args.extend(out_refs);
                    if let Some(s) = &scratch {
                        args.push(s);
                    }
                    let t = Instant::now();
                    timings.push(dev.launch(&ck, &loaded, &args)?);
                    if debug >= 1 {
                        dev.stream
                            .synchronize()
                            .map_err(|e| driver_err(&ck.name, e))?;
                        let secs = t.elapsed().as_secs_f64();
                        let bytes = kernel.bytes_in() + kernel.bytes_out();
                        eprintln!(
                            "ndfuse: {} [cuda:{}] {:.3} ms, {bytes} B, {:.2} GB/s ({})",
                            kernel.name,
                            dev.ordinal,
                            secs * 1e3,
                            bytes as f64 / secs.max(1e-12) / 1e9,
                            ck.strategy
                        );
                    }
                }
                for (n, b) in outs.iter().zip(out_bufs) {
                    bufs.insert(*n, Buf::Device(b));
                }
                paths.push(StepPath::Cuda {
                    cached: loaded.origin == ndfuse_codegen_cuda::Origin::Memory,
                    device: dev.ordinal,
                });
            }
            Step::Interp { node, operands, .. } => {
                // A routine runs on the device where emitted, else on the host (cuda_host).
                let n = g.node(*node);
                let types: Vec<_> = operands.iter().map(|o| g.ty(*o)).collect();
                let host = |o: &NodeId, bufs: &HashMap<NodeId, Buf>| match (bufs.get(o), g.ty(*o)) {
                    (Some(Buf::Host(a)), _) => Ok(a.clone()),
                    (Some(b), t) => {
                        dev.download(b.device().expect("on the device"), t.dtype, t.shape)
                    }
                    (None, _) => Ok(HostArray::clone(&inputs[o])),
                };
                let reason = match ndfuse_codegen_cuda::emit_routine(n, &types, &opts)? {
                    ndfuse_codegen_cuda::RoutineCode::Kernel(ck) => {
                        if let ndfuse_ir::Op::ScatterAdd { axis } = n.op {
                            let idx = host(&operands[1], &bufs)?;
                            check_scatter_indices(&idx, axis, types[0].shape.dims()[axis])?;
                        }
                        let out = dev.alloc(n.shape.numel() * n.dtype.size_bytes())?;
                        for o in operands {
                            let b = match (bufs.get(o), inputs.get(o)) {
                                (Some(Buf::Host(a)), _) => Buf::Device(dev.upload(a, &mut staged)?),
                                (None, Some(a)) => match dev.resident_copy(a) {
                                    Some(r) => Buf::Resident(r),
                                    None => Buf::Device(dev.upload(a, &mut staged)?),
                                },
                                _ => continue,
                            };
                            bufs.insert(*o, b);
                        }
                        let t = Instant::now();
                        let loaded = dev.load(&ck, cfg)?;
                        compile_time += t.elapsed();
                        let cached = loaded.origin == ndfuse_codegen_cuda::Origin::Memory;
                        let scratch = (ck.scratch_bytes > 0)
                            .then(|| dev.alloc(ck.scratch_bytes))
                            .transpose()?;
                        let mut args: Vec<&CudaSlice<u8>> = operands
                            .iter()
                            .map(|o| bufs[o].device().expect("uploaded above"))
                            .collect();
                        check_routine_sizes(&ck.name, &types, &args);
                        args.extend(std::iter::once(&*out).chain(scratch.as_deref()));
                        timings.push(dev.launch(&ck, &loaded, &args)?);
                        bufs.insert(*node, Buf::Device(out));
                        paths.push(StepPath::Cuda {
                            cached,
                            device: dev.ordinal,
                        });
                        release_reads(step, i, &last_read, &kept, &mut bufs);
                        continue;
                    }
                    ndfuse_codegen_cuda::RoutineCode::Host(reason) => reason,
                };
                let args: Vec<HostArray> = operands
                    .iter()
                    .map(|o| host(o, &bufs))
                    .collect::<Result<_, _>>()?;
                let refs: Vec<&HostArray> = args.iter().collect();
                let (out, path) = run_on_host(n, &refs, reason, debug)?;
                paths.push(path);
                bufs.insert(*node, Buf::Host(out));
            }
        }
        release_reads(step, i, &last_read, &kept, &mut bufs);
    }
    let mut outputs = Vec::with_capacity(g.outputs().len());
    for o in g.outputs() {
        // An output aliasing a buffer (a reshape of all of it) is read from that buffer
        // under its own shape.
        let src = schedule.output_buffer(*o);
        let ty = g.ty(*o);
        let a = match bufs.get(&src) {
            Some(Buf::Host(a)) => a.clone(),
            Some(b) => dev.download(
                b.device().expect("on the device"),
                ty.dtype,
                ty.shape.clone(),
            )?,
            None => HostArray::clone(
                inputs
                    .get(&src)
                    .unwrap_or_else(|| panic!("output {o} was never computed (a scheduling bug)")),
            ),
        };
        let a = a
            .reshaped(ty.shape)
            .expect("an aliased output has its buffer's element count");
        outputs.push(a);
    }
    dev.stream
        .synchronize()
        .map_err(|e| driver_err("cuStreamSynchronize", e))?;
    drop(staged);
    let mut kernel_ms = 0.0f64;
    for (a, b) in &timings {
        kernel_ms += f64::from(
            a.elapsed_ms(b)
                .map_err(|e| driver_err("cuEventElapsedTime", e))?,
        );
    }
    Ok(CudaRun {
        outputs,
        paths,
        compile_time,
        kernel_time: Duration::from_secs_f64(kernel_ms / 1e3),
    })
}
