//! Compiling emitted CUDA C with NVRTC, loaded at run time through cudarc.
//!
//! - **Arch**: [`CompileOptions::arch`] is the device's own (`sm_90` for an H100): NVRTC
//!   then produces a CUBIN the driver loads without a JIT step. A `compute_XX` arch
//!   produces PTX instead (for a device newer than this NVRTC knows).
//! - **Options**: `--fmad=false` (no contraction of `a * b + c`: element-wise arithmetic
//!   stays bit-identical to the reference), `--std=c++17`, and `-I` for the CUDA headers
//!   when a kernel uses f16/bf16 ([`include_dirs`] finds them).
//! - **Caches**: in memory, keyed by (arch, source); on disk in `cache_dir`, one file per
//!   kernel named by the source's hash, the NVRTC version and the arch, with the source
//!   beside it: a hit is a file read after the saved source compares equal (so a hash
//!   collision is a miss, never a wrong kernel). Files are written to a temporary name
//!   and renamed, so a crash never leaves a partial image.
//! - **Failures**: an NVRTC error is [`CudaError::Compile`] with the program log and the
//!   path of the saved source (the cache directory, else the system's temporary one).

use crate::{CudaError, CudaKernel};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// What NVRTC produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// Device code for one architecture (`sm_XX`).
    Cubin,
    /// PTX text (for `compute_XX`), compiled by the driver when loaded.
    Ptx,
}

/// Where a compiled image came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// NVRTC compiled it just now.
    Nvrtc,
    /// The in-memory cache.
    Memory,
    /// The on-disk cache.
    Disk,
}

/// How to compile.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// `sm_XX` (CUBIN) or `compute_XX` (PTX).
    pub arch: String,
    /// Directories searched for `cuda_fp16.h` / `cuda_bf16.h`.
    pub include_dirs: Vec<PathBuf>,
    /// On-disk cache directory; `None` keeps kernels in memory only.
    pub cache_dir: Option<PathBuf>,
}

impl CompileOptions {
    /// Options for a device of compute capability `major.minor`, headers from
    /// [`include_dirs`], no disk cache.
    pub fn for_capability(major: i32, minor: i32) -> CompileOptions {
        CompileOptions {
            arch: format!("sm_{major}{minor}"),
            include_dirs: include_dirs(),
            cache_dir: None,
        }
    }
}

/// A compiled kernel image.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    /// The kernel's name.
    pub kernel: String,
    /// CUBIN bytes or PTX text.
    pub image: Vec<u8>,
    /// Which of the two.
    pub kind: ImageKind,
    /// Where it came from.
    pub origin: Origin,
    /// Milliseconds spent (compiling, or loading from disk).
    pub millis: f64,
}

/// NVRTC's version, loading the library on first use. `Err` names what was looked for
/// when the library is not on the loader's path.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    static VERSION: OnceLock<Result<(i32, i32), CudaError>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            // SAFETY: loading the NVRTC shared library runs its initialisers, which have
            // no preconditions; cudarc only tries the names it lists.
            let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
            if !present {
                return Err(CudaError::NvrtcMissing {
                    reason: format!(
                        "none of {:?} is on the library path (set LD_LIBRARY_PATH to the directory holding libnvrtc.so.12, e.g. the `nvidia/cuda_nvrtc/lib` of `pip install nvidia-cuda-nvrtc-cu12`)",
                        cudarc::get_lib_name_candidates("nvrtc")
                            .into_iter()
                            .filter(|n| n.contains(".so"))
                            .take(3)
                            .collect::<Vec<_>>()
                    ),
                });
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: the library is present (checked above); both pointers are valid
            // for one write each.
            let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
            rc.result().map_err(|e| CudaError::Nvrtc {
                call: "nvrtcVersion",
                detail: format!("{e:?}"),
            })?;
            Ok((major, minor))
        })
        .clone()
}

/// The virtual architectures this NVRTC compiles for, as `major * 10 + minor` (`90` is
/// sm_90): each CUDA release drops old ones (NVRTC 13 has no sm_70).
pub fn nvrtc_supported_archs() -> Result<Vec<i32>, CudaError> {
    nvrtc_version()?;
    let err = |call: &'static str| {
        move |e: cudarc::nvrtc::result::NvrtcError| CudaError::Nvrtc {
            call,
            detail: format!("{e:?}"),
        }
    };
    let mut n = 0;
    // SAFETY: the library is loaded (nvrtc_version succeeded); the pointer is valid for
    // one write.
    unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(err("nvrtcGetNumSupportedArchs"))?;
    let mut archs = vec![0; n.max(0) as usize];
    // SAFETY: `archs` holds the `n` entries NVRTC said it will write.
    unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(err("nvrtcGetSupportedArchs"))?;
    Ok(archs)
}

/// Directories holding the CUDA headers half-precision kernels include: each entry of
/// `NDFUSE_CUDA_INCLUDE` (a path list), then `$CUDA_HOME/include`, `$CUDA_PATH/include`
/// and `/usr/local/cuda/include`, those that have `cuda_fp16.h` or `crt/mma.h` (which
/// tensor-core kernels' `<mma.h>` includes; PyPI ships it apart, in the include
/// directory of `nvidia-cuda-nvcc-cu12`).
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("NDFUSE_CUDA_INCLUDE") {
        dirs.extend(std::env::split_paths(&v));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(v).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs.retain(|d| d.join("cuda_fp16.h").is_file() || d.join("crt").join("mma.h").is_file());
    dirs.dedup();
    dirs
}

/// Images by (arch, source), each with when it was last used. Bounded: the runtime keeps
/// its own (configurable) cache of loaded modules in front of this one, so this one only
/// serves a kernel loaded again (on another device, or after the runtime evicted it).
type MemoryCache = Mutex<HashMap<(String, String), (Arc<Compiled>, u64)>>;

/// The most images the memory cache keeps; the least recently used go first.
const MEMORY_CACHE_ENTRIES: usize = 256;

/// The most image bytes the memory cache keeps.
const MEMORY_CACHE_BYTES: usize = 64 << 20;

/// Uses of the memory cache, for its recency.
static MEMORY_CLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn tick() -> u64 {
    MEMORY_CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Drops least recently used images, never `keep`, until the cache is within
/// [`MEMORY_CACHE_ENTRIES`] and [`MEMORY_CACHE_BYTES`].
fn evict(cache: &mut HashMap<(String, String), (Arc<Compiled>, u64)>, keep: &(String, String)) {
    let mut bytes: usize = cache.values().map(|(c, _)| c.image.len()).sum();
    while cache.len() > MEMORY_CACHE_ENTRIES || bytes > MEMORY_CACHE_BYTES {
        let oldest = cache
            .iter()
            .filter(|(k, _)| *k != keep)
            .min_by_key(|(_, (_, used))| *used)
            .map(|(k, _)| k.clone());
        let Some((c, _)) = oldest.and_then(|k| cache.remove(&k)) else {
            break;
        };
        bytes -= c.image.len();
    }
}

fn memory_cache() -> &'static MemoryCache {
    static CACHE: OnceLock<MemoryCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Empties the in-memory cache (the disk cache stays): the next [`compile`] of each
/// kernel reads the disk cache or runs NVRTC. For tests and benchmarks of those paths.
pub fn clear_memory_cache() {
    memory_cache().lock().expect("cache lock").clear();
}

/// FNV-1a, 64 bits: stable across releases and platforms, for file names only (a
/// collision is caught by comparing the saved source).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Compiles `kernel` (from memory or disk when cached).
pub fn compile(kernel: &CudaKernel, opts: &CompileOptions) -> Result<Arc<Compiled>, CudaError> {
    let key = (opts.arch.clone(), kernel.source.clone());
    if let Some((hit, used)) = memory_cache().lock().expect("cache lock").get_mut(&key) {
        *used = tick();
        let mut c = (**hit).clone();
        c.origin = Origin::Memory;
        c.millis = 0.0;
        return Ok(Arc::new(c));
    }
    let version = nvrtc_version()?;
    let kind = if opts.arch.starts_with("sm_") {
        ImageKind::Cubin
    } else {
        ImageKind::Ptx
    };
    let stem = format!(
        "{}-{:016x}-nvrtc{}.{}-{}",
        kernel.name,
        fnv1a(kernel.source.as_bytes()),
        version.0,
        version.1,
        opts.arch
    );
    let ext = if kind == ImageKind::Cubin {
        "cubin"
    } else {
        "ptx"
    };
    let start = Instant::now();
    // What was found or compiled, kept in memory for the next call.
    let keep = |image: Vec<u8>, origin: Origin| {
        let c = Arc::new(Compiled {
            kernel: kernel.name.clone(),
            image,
            kind,
            origin,
            millis: start.elapsed().as_secs_f64() * 1e3,
        });
        let mut cache = memory_cache().lock().expect("cache lock");
        cache.insert(key.clone(), (Arc::clone(&c), tick()));
        evict(&mut cache, &key);
        c
    };
    if let Some(dir) = &opts.cache_dir {
        if let Some(image) =
            read_cached(dir, &stem, ext, &kernel.source).filter(|image| image_is_whole(kind, image))
        {
            return Ok(keep(image, Origin::Disk));
        }
    }
    let options = nvrtc_options(kernel, opts);
    let image = match run_nvrtc(kernel, &options, kind) {
        Ok(image) => image,
        Err(log) => {
            let dir = opts
                .cache_dir
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("ndfuse-failed-kernels"));
            let source_path = dir.join(format!("{stem}.cu"));
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(&source_path, &kernel.source);
            return Err(CudaError::Compile {
                kernel: kernel.name.clone(),
                options: options.join(" "),
                log,
                source_path,
            });
        }
    };
    if let Some(dir) = &opts.cache_dir {
        write_cached(dir, &stem, ext, &kernel.source, &image)?;
    }
    Ok(keep(image, Origin::Nvrtc))
}

fn nvrtc_options(kernel: &CudaKernel, opts: &CompileOptions) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={}", opts.arch),
        "--fmad=false".to_string(),
        "--std=c++17".to_string(),
    ];
    if kernel.uses_half {
        o.extend(
            opts.include_dirs
                .iter()
                .map(|d| format!("-I{}", d.display())),
        );
    }
    o
}

/// The image, or NVRTC's log on failure.
fn run_nvrtc(kernel: &CudaKernel, options: &[String], kind: ImageKind) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let src = CString::new(kernel.source.as_bytes()).map_err(|e| e.to_string())?;
    let name = CString::new(format!("{}.cu", kernel.name)).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` was just created and is destroyed once, below; `src` and `name`
    // outlive it.
    let compiled = unsafe { result::compile_program(prog, options) };
    let out = match compiled {
        Err(e) => {
            // SAFETY: `prog` is live.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| c_chars_to_string(&l))
                .unwrap_or_default();
            Err(format!("{e:?}\n{log}"))
        }
        Ok(()) => match kind {
            // SAFETY: `prog` is live and compiled.
            ImageKind::Ptx => unsafe { result::get_ptx(prog) }
                .map(|p| c_chars_to_string(&p).into_bytes())
                .map_err(|e| format!("nvrtcGetPTX: {e:?}")),
            ImageKind::Cubin => {
                let mut size = 0usize;
                // SAFETY: `prog` is live and compiled; `size` is valid for one write.
                unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                    .result()
                    .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))
                    .and_then(|()| {
                        let mut buf = vec![0u8; size];
                        // SAFETY: `buf` holds exactly the `size` bytes NVRTC reported.
                        unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast::<c_char>()) }
                            .result()
                            .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))
                            .map(|()| buf)
                    })
            }
        },
    };
    // SAFETY: `prog` is live and not used again.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn read_cached(dir: &Path, stem: &str, ext: &str, source: &str) -> Option<Vec<u8>> {
    let saved = std::fs::read_to_string(dir.join(format!("{stem}.cu"))).ok()?;
    if saved != source {
        return None;
    }
    std::fs::read(dir.join(format!("{stem}.{ext}"))).ok()
}

/// Whether a cached image is whole enough to hand to the driver: a damaged file (cut
/// short, overwritten, another file's bytes) is a miss and gets recompiled, not loaded.
/// A cubin is a 64-bit ELF file whose section and program header tables lie inside
/// it; PTX is text that declares its version and target and ends with a closing brace.
fn image_is_whole(kind: ImageKind, image: &[u8]) -> bool {
    match kind {
        ImageKind::Cubin => {
            let u16_at = |o: usize| {
                image
                    .get(o..o + 2)
                    .map(|b| u64::from(u16::from_le_bytes([b[0], b[1]])))
            };
            let u64_at = |o: usize| {
                image
                    .get(o..o + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_le_bytes)
            };
            // ELF64 header: magic, class 2 (64-bit), data 1 (little-endian); e_phoff at
            // 0x20, e_shoff at 0x28, e_phentsize/e_phnum at 0x36/0x38, e_shentsize/
            // e_shnum at 0x3A/0x3C.
            let table_fits =
                |off: Option<u64>, size: Option<u64>, num: Option<u64>| match (off, size, num) {
                    (Some(o), Some(s), Some(n)) => o
                        .checked_add(s.saturating_mul(n))
                        .is_some_and(|end| end <= image.len() as u64),
                    _ => false,
                };
            image.len() >= 64
                && image.starts_with(b"\x7fELF\x02\x01")
                && table_fits(u64_at(0x20), u16_at(0x36), u16_at(0x38))
                && table_fits(u64_at(0x28), u16_at(0x3A), u16_at(0x3C))
        }
        ImageKind::Ptx => std::str::from_utf8(image).is_ok_and(|text| {
            let text = text.trim_end_matches(['\0', ' ', '\n', '\r', '\t']);
            text.contains(".version") && text.contains(".target") && text.ends_with('}')
        }),
    }
}

fn write_cached(
    dir: &Path,
    stem: &str,
    ext: &str,
    source: &str,
    image: &[u8],
) -> Result<(), CudaError> {
    let err = |path: &Path, e: std::io::Error| CudaError::Cache {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    // The image first: a source without its image is a miss, never a wrong hit.
    for (name, bytes) in [
        (format!("{stem}.{ext}"), image),
        (format!("{stem}.cu"), source.as_bytes()),
    ] {
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(|e| err(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| err(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_cached_images_are_misses() {
        let ptx = b".version 8.5\n.target sm_90\n.address_size 64\n.entry k() {\n ret;\n}\n\0";
        assert!(image_is_whole(ImageKind::Ptx, ptx));
        assert!(
            !image_is_whole(ImageKind::Ptx, &ptx[..ptx.len() / 2]),
            "cut short"
        );
        assert!(!image_is_whole(ImageKind::Ptx, b"\xff\xfe garbage"));
        assert!(!image_is_whole(ImageKind::Ptx, b""));
        // A minimal ELF64 header whose tables lie inside a 256-byte file.
        let mut elf = vec![0u8; 256];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[0x28..0x30].copy_from_slice(&128u64.to_le_bytes()); // e_shoff
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        elf[0x38..0x3A].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        elf[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        elf[0x3C..0x3E].copy_from_slice(&2u16.to_le_bytes()); // e_shnum
        assert!(image_is_whole(ImageKind::Cubin, &elf));
        assert!(
            !image_is_whole(ImageKind::Cubin, &elf[..200]),
            "section table cut off"
        );
        assert!(
            !image_is_whole(ImageKind::Cubin, &elf[..40]),
            "header cut off"
        );
        let mut wrong = elf.clone();
        wrong[0] = b'X';
        assert!(!image_is_whole(ImageKind::Cubin, &wrong), "not ELF");
        assert!(!image_is_whole(ImageKind::Cubin, ptx), "text as a cubin");
    }

    #[test]
    fn memory_cache_evicts_the_least_recently_used() {
        let image = |n: usize| Compiled {
            kernel: "k".to_string(),
            image: vec![0; n],
            kind: ImageKind::Ptx,
            origin: Origin::Nvrtc,
            millis: 0.0,
        };
        let key = |i: usize| ("sm_80".to_string(), format!("src {i}"));
        let mut cache = HashMap::new();
        for i in 0..MEMORY_CACHE_ENTRIES + 10 {
            cache.insert(key(i), (Arc::new(image(1)), i as u64));
        }
        // Key 3 was used last; the 10 oldest others go.
        cache.get_mut(&key(3)).expect("present").1 = u64::MAX;
        evict(&mut cache, &key(0));
        assert_eq!(cache.len(), MEMORY_CACHE_ENTRIES);
        assert!(cache.contains_key(&key(0)) && cache.contains_key(&key(3)));
        assert!(!cache.contains_key(&key(1)) && !cache.contains_key(&key(11)));
        assert!(cache.contains_key(&key(12)));
        // One image over the byte limit stays alone.
        cache.insert(key(9999), (Arc::new(image(MEMORY_CACHE_BYTES + 1)), 0));
        evict(&mut cache, &key(9999));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
