//! `Config`: every setting of ndfuse, read in one place, with where each value came from.
//!
//! # Sources and precedence
//!
//! Highest first; a higher source overrides a lower one key by key:
//!
//! 1. **code**: [`Config::builder`] (`.set("max_grid_size", "1024")` or a typed setter);
//! 2. **environment**: `NDFUSE_<KEY>` with the key upper-cased (`NDFUSE_MAX_GRID_SIZE`),
//!    and ND4J's `BACKEND_PRIORITY_CPU` / `BACKEND_PRIORITY_GPU` for the two priority
//!    keys and `NDFUSE_DUMP` for `dump_dir` (the `NDFUSE_<KEY>` spelling wins when both
//!    are set); an empty variable counts as unset;
//! 3. **file**: `ndfuse.toml` at the path in `NDFUSE_CONFIG` (a missing file named there
//!    is an error), else `./ndfuse.toml` when it exists, else none;
//! 4. **default**: the table below.
//!
//! An unknown key (in the file, or an `NDFUSE_*` variable that is not a key) and a value
//! that does not parse are errors that name the key, where it came from and, for an
//! unknown key, the nearest valid one. `NDFUSE_CONFIG` (the file),
//! `NDFUSE_CUDA_INCLUDE` (where NVRTC finds the CUDA headers), `NDFUSE_REQUIRE_CUDA` and
//! `NDFUSE_REQUIRE_NVRTC`, `NDFUSE_REQUIRE_DATA`, `NDFUSE_REQUIRE_MODELS` (test switches),
//! `NDFUSE_MODELS` (the pretrained models' folder), `NDFUSE_CI_VENV` (CI's venv),
//! `NDFUSE_CUDA_GEMM` (`emitted`: no cuBLASLt) and `NDFUSE_MPI_TIMEOUT_S`
//! (ndfuse-train's MPI bound) are not keys and are let through.
//!
//! # Keys
//!
//! | key | type | default | meaning |
//! | --- | --- | --- | --- |
//! | `backend_priority_cpu` | integer | 0 | priority of the CPU backend; `auto` picks the highest available |
//! | `backend_priority_gpu` | integer | 100 | priority of GPU backends (above the CPU when one is present) |
//! | `backend` | auto, cpu, cuda, interp | auto | the backend used when code asks for `auto` |
//! | `default_dtype` | f16, bf16, f32, f64 | f32 | dtype of constructors and literals (ND4J's `setDTypeForContext`) |
//! | `cpu_threads` | integer | 0 | CPU worker threads; 0 = all cores |
//! | `max_host_cacheable_length` | bytes | 256 MiB | largest host buffer the host cache keeps (large outputs are where reuse saves the most page faults) |
//! | `max_host_cache` | bytes | 1 GiB | total bytes the host cache may hold |
//! | `max_device_cacheable_length` | bytes | 16 MiB | largest device buffer the device cache keeps |
//! | `max_device_cache` | bytes | 1 GiB | total bytes the device cache may hold per device |
//! | `max_grid_size` | integer | 4096 | upper bound on CUDA blocks per launch |
//! | `max_block_size` | integer | 256 | upper bound on CUDA threads per block |
//! | `allow_multi_gpu` | bool | false | spread threads over every GPU (ND4J's `allowMultiGPU`) |
//! | `max_kernel_cache_entries` | integer | 1024 | compiled kernels kept in memory (CPU; CUDA modules per device); the least recently used go beyond |
//! | `max_kernel_cache` | bytes | 64 MiB | their machine code (CPU) or images (CUDA) |
//! | `max_graph_cache_entries` | integer | 256 | compiled graphs (passes, fusion, schedule) kept in memory |
//! | `kernel_families` | bool | true | a CPU kernel that differs from a compiled one only in its extents runs that one's code when it lowers to the same functions (no compile) |
//! | `kernel_cache_dir` | path | none | where compiled kernels are kept on disk; none = memory only |
//! | `debug` | 0..4 | 0 | 1: a line per kernel, 2: + fusion report, 3: + IR after each pass, 4: + generated code |
//! | `dump_dir` | path | none | IR before and after each pass written here |
//! | `disable_passes` | list | empty | passes to skip by name (`fold`, `simplify`, `views`, `cse`, `dce`, `fusion`) |
//!
//! In the file, integers and booleans may be written as TOML values or as strings, and
//! `disable_passes` as an array or a comma-separated string. In the environment and the
//! builder every value is a string.
//!
//! ```
//! use ndfuse_runtime::{Config, ConfigSource};
//! let cfg = Config::builder()
//!     .config_file(None)
//!     .environment(Vec::<(String, String)>::new())
//!     .set("max_grid_size", "1024")
//!     .build()
//!     .unwrap();
//! assert_eq!(cfg.max_grid_size(), 1024);
//! assert_eq!(cfg.origin("max_grid_size"), Some(&ConfigSource::Builder));
//! assert!(cfg.explain().contains("max_grid_size"));
//! ```

use crate::backend_kind::BackendKind;
use ndfuse_ir::DType;
use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::env_keys::CONFIG_VAR;
use crate::env_keys::NOT_KEYS;

/// The file looked for in the working directory when `NDFUSE_CONFIG` is unset.
pub const CONFIG_FILE: &str = "ndfuse.toml";

/// Variables accepted as aliases of keys: ND4J's names for the priorities, and
/// `NDFUSE_DUMP`, the name the README documented before `dump_dir` was a key.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("BACKEND_PRIORITY_CPU", "backend_priority_cpu"),
    ("BACKEND_PRIORITY_GPU", "backend_priority_gpu"),
    ("NDFUSE_DUMP", "dump_dir"),
];

/// One key: its name, type, default (as shown by `explain`) and meaning.
#[derive(Clone, Copy, Debug)]
pub struct KeyInfo {
    /// The key as written in the file and the builder.
    pub name: &'static str,
    /// The type, as shown in errors ("an integer", "one of auto, cpu, cuda, interp").
    pub expected: &'static str,
    /// The default, as `explain` prints it.
    pub default: &'static str,
    /// What the key does.
    pub doc: &'static str,
}

/// Every key, in the order `explain` prints them.
pub const KEYS: &[KeyInfo] = &[
    key(
        "backend_priority_cpu",
        "an integer",
        "0",
        "priority of the CPU backend",
    ),
    key(
        "backend_priority_gpu",
        "an integer",
        "100",
        "priority of GPU backends",
    ),
    key(
        "backend",
        "one of auto, cpu, cuda, interp",
        "auto",
        "backend used when code asks for auto",
    ),
    key(
        "default_dtype",
        "one of f16, bf16, f32, f64",
        "f32",
        "dtype of constructors and literals",
    ),
    key(
        "cpu_threads",
        "a non-negative integer",
        "0",
        "CPU worker threads; 0 = all cores",
    ),
    key(
        "max_host_cacheable_length",
        "a size in bytes",
        "268435456",
        "largest host buffer the cache keeps",
    ),
    key(
        "max_host_cache",
        "a size in bytes",
        "1073741824",
        "total bytes the host cache may hold",
    ),
    key(
        "max_device_cacheable_length",
        "a size in bytes",
        "16777216",
        "largest device buffer the cache keeps",
    ),
    key(
        "max_device_cache",
        "a size in bytes",
        "1073741824",
        "total bytes the device cache may hold",
    ),
    key(
        "max_grid_size",
        "a positive integer",
        "4096",
        "upper bound on CUDA blocks per launch",
    ),
    key(
        "max_block_size",
        "a positive integer",
        "256",
        "upper bound on CUDA threads per block",
    ),
    key(
        "allow_multi_gpu",
        "true or false",
        "false",
        "spread threads over every GPU",
    ),
    key(
        "max_kernel_cache_entries",
        "a positive integer",
        "1024",
        "compiled kernels kept in memory",
    ),
    key(
        "max_kernel_cache",
        "a size in bytes",
        "67108864",
        "machine code of the kernels kept",
    ),
    key(
        "max_graph_cache_entries",
        "a positive integer",
        "256",
        "compiled graphs kept in memory",
    ),
    key(
        "kernel_families",
        "true or false",
        "true",
        "kernels of one shape family share a compile",
    ),
    key(
        "kernel_cache_dir",
        "a path",
        "none",
        "compiled kernels kept on disk here",
    ),
    key("debug", "a level from 0 to 4", "0", "diagnostics on stderr"),
    key(
        "dump_dir",
        "a path",
        "none",
        "IR before and after each pass written here",
    ),
    key(
        "disable_passes",
        "a list of pass names",
        "",
        "passes to skip by name",
    ),
];

const fn key(
    name: &'static str,
    expected: &'static str,
    default: &'static str,
    doc: &'static str,
) -> KeyInfo {
    KeyInfo {
        name,
        expected,
        default,
        doc,
    }
}

/// Where an effective value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// Nobody set it.
    Default,
    /// The configuration file, with the key's line when it could be found.
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line of the key.
        line: Option<usize>,
    },
    /// An environment variable.
    Env {
        /// The variable's name.
        var: String,
    },
    /// [`ConfigBuilder`] in code.
    Builder,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::Default => f.write_str("default"),
            ConfigSource::File {
                path,
                line: Some(l),
            } => write!(f, "file {}:{l}", path.display()),
            ConfigSource::File { path, line: None } => write!(f, "file {}", path.display()),
            ConfigSource::Env { var } => write!(f, "env {var}"),
            ConfigSource::Builder => f.write_str("builder"),
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key nobody knows.
    #[error("unknown key '{key}' in {origin}{}", suggest(.suggestion))]
    UnknownKey {
        /// The key as given (for a variable, its name without `NDFUSE_`, lower-cased).
        key: String,
        /// Where it was given.
        origin: ConfigSource,
        /// The nearest valid key, spelt as the source spells keys.
        suggestion: Option<String>,
    },
    /// A value that does not parse as its key's type.
    #[error("bad value {value:?} for '{key}' in {origin}: expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// Where it was given.
        origin: ConfigSource,
        /// What the key takes.
        expected: &'static str,
    },
    /// `NDFUSE_CONFIG` names a file that is not there.
    #[error("{CONFIG_VAR}={path:?}: no such file")]
    MissingFile {
        /// The path given.
        path: PathBuf,
    },
    /// The file exists but could not be read.
    #[error("cannot read {path:?}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The file is not valid TOML (the message carries line and column).
    #[error("{path:?} is not valid TOML: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

fn suggest(s: &Option<String>) -> String {
    s.as_ref()
        .map(|k| format!("; did you mean '{k}'?"))
        .unwrap_or_default()
}

/// A value as a source gives it: strings from the environment and the builder, TOML
/// values from the file.
#[derive(Clone, Debug)]
enum Raw {
    Str(String),
    Int(i64),
    Bool(bool),
    List(Vec<String>),
}

impl fmt::Display for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Raw::Str(s) => f.write_str(s),
            Raw::Int(i) => write!(f, "{i}"),
            Raw::Bool(b) => write!(f, "{b}"),
            Raw::List(l) => f.write_str(&l.join(",")),
        }
    }
}

/// The effective configuration. Read with [`Config::load`] (file and environment) or
/// [`Config::builder`] (plus values from code).
#[derive(Clone, Debug)]
pub struct Config {
    backend_priority_cpu: i64,
    backend_priority_gpu: i64,
    backend: BackendKind,
    default_dtype: DType,
    cpu_threads: usize,
    max_host_cacheable_length: u64,
    max_host_cache: u64,
    max_device_cacheable_length: u64,
    max_device_cache: u64,
    max_grid_size: u32,
    max_block_size: u32,
    allow_multi_gpu: bool,
    max_kernel_cache_entries: u32,
    max_kernel_cache: u64,
    max_graph_cache_entries: u32,
    kernel_families: bool,
    kernel_cache_dir: Option<PathBuf>,
    debug: u8,
    dump_dir: Option<PathBuf>,
    disable_passes: Vec<String>,
    /// Parallel to [`KEYS`].
    origins: Vec<ConfigSource>,
}

impl Default for Config {
    /// The defaults of the key table, every origin [`ConfigSource::Default`].
    fn default() -> Config {
        Config {
            backend_priority_cpu: 0,
            // GPU above CPU, as ND4J does when both are on the classpath.
            backend_priority_gpu: 100,
            backend: BackendKind::Auto,
            default_dtype: DType::F32,
            cpu_threads: 0,
            // Large: a fresh 64 MiB output costs ~12 ms of page faults against ~1 ms into
            // a reused buffer, and ND4J caches large host buffers too.
            max_host_cacheable_length: 256 << 20,
            max_host_cache: 1 << 30,
            max_device_cacheable_length: 16 << 20,
            max_device_cache: 1 << 30,
            max_grid_size: 4096,
            max_block_size: 256,
            allow_multi_gpu: false,
            // A kernel's code is a page or two (4-8 KiB) and its heap about as much
            // again: the defaults hold a few thousand shapes' worth of kernels.
            max_kernel_cache_entries: 1024,
            max_kernel_cache: 64 << 20,
            max_graph_cache_entries: 256,
            kernel_families: true,
            kernel_cache_dir: None,
            debug: 0,
            dump_dir: None,
            disable_passes: Vec::new(),
            origins: vec![ConfigSource::Default; KEYS.len()],
        }
    }
}

impl Config {
    /// The configuration from the file and the process environment, over the defaults.
    pub fn load() -> Result<Config, ConfigError> {
        Config::builder().build()
    }

    /// A builder whose values override the file and the environment.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// Priority of the CPU backend (`backend_priority_cpu`).
    pub fn backend_priority_cpu(&self) -> i64 {
        self.backend_priority_cpu
    }
    /// Priority of GPU backends (`backend_priority_gpu`).
    pub fn backend_priority_gpu(&self) -> i64 {
        self.backend_priority_gpu
    }
    /// The backend used when code asks for `auto` (`backend`).
    pub fn backend(&self) -> BackendKind {
        self.backend
    }
    /// The dtype of constructors and literals (`default_dtype`).
    pub fn default_dtype(&self) -> DType {
        self.default_dtype
    }
    /// CPU worker threads, 0 = all cores (`cpu_threads`).
    pub fn cpu_threads(&self) -> usize {
        self.cpu_threads
    }
    /// Largest host buffer the host cache keeps, bytes.
    pub fn max_host_cacheable_length(&self) -> u64 {
        self.max_host_cacheable_length
    }
    /// Total bytes the host cache may hold.
    pub fn max_host_cache(&self) -> u64 {
        self.max_host_cache
    }
    /// Largest device buffer the device cache keeps, bytes.
    pub fn max_device_cacheable_length(&self) -> u64 {
        self.max_device_cacheable_length
    }
    /// Total bytes the device cache may hold.
    pub fn max_device_cache(&self) -> u64 {
        self.max_device_cache
    }
    /// Upper bound on CUDA blocks per launch.
    pub fn max_grid_size(&self) -> u32 {
        self.max_grid_size
    }
    /// Upper bound on CUDA threads per block.
    pub fn max_block_size(&self) -> u32 {
        self.max_block_size
    }
    /// Whether threads may be spread over every GPU.
    pub fn allow_multi_gpu(&self) -> bool {
        self.allow_multi_gpu
    }
    /// Whether a CPU kernel may run the code of a compiled kernel of its shape family
    /// (`kernel_families`).
    pub fn kernel_families(&self) -> bool {
        self.kernel_families
    }
    /// Compiled kernels kept in memory: CPU kernels, and CUDA modules per device
    /// (`max_kernel_cache_entries`).
    pub fn max_kernel_cache_entries(&self) -> u32 {
        self.max_kernel_cache_entries
    }
    /// Bytes of machine code (CPU) or module images (CUDA) kept (`max_kernel_cache`).
    pub fn max_kernel_cache(&self) -> u64 {
        self.max_kernel_cache
    }
    /// Compiled graphs kept in memory (`max_graph_cache_entries`).
    pub fn max_graph_cache_entries(&self) -> u32 {
        self.max_graph_cache_entries
    }
    /// Where compiled kernels are kept on disk (none: memory only).
    pub fn kernel_cache_dir(&self) -> Option<&Path> {
        self.kernel_cache_dir.as_deref()
    }
    /// The debug level, 0 to 4.
    pub fn debug(&self) -> u8 {
        self.debug
    }
    /// Where the IR before and after each pass is written.
    pub fn dump_dir(&self) -> Option<&Path> {
        self.dump_dir.as_deref()
    }
    /// Passes to skip by name.
    pub fn disable_passes(&self) -> &[String] {
        &self.disable_passes
    }

    /// Where the effective value of `key` came from; `None` for an unknown key.
    pub fn origin(&self, key: &str) -> Option<&ConfigSource> {
        KEYS.iter()
            .position(|k| k.name == key)
            .and_then(|i| self.origins.get(i))
    }

    /// The effective value of `key` as text (as `explain` prints it); `None` for an
    /// unknown key.
    pub fn value(&self, key: &str) -> Option<String> {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or_else(|| "none".to_string(), |p| p.display().to_string())
        };
        Some(match key {
            "backend_priority_cpu" => self.backend_priority_cpu.to_string(),
            "backend_priority_gpu" => self.backend_priority_gpu.to_string(),
            "backend" => self.backend.name().to_string(),
            "default_dtype" => self.default_dtype.name().to_string(),
            "cpu_threads" => self.cpu_threads.to_string(),
            "max_host_cacheable_length" => self.max_host_cacheable_length.to_string(),
            "max_host_cache" => self.max_host_cache.to_string(),
            "max_device_cacheable_length" => self.max_device_cacheable_length.to_string(),
            "max_device_cache" => self.max_device_cache.to_string(),
            "max_grid_size" => self.max_grid_size.to_string(),
            "max_block_size" => self.max_block_size.to_string(),
            "allow_multi_gpu" => self.allow_multi_gpu.to_string(),
            "max_kernel_cache_entries" => self.max_kernel_cache_entries.to_string(),
            "max_kernel_cache" => self.max_kernel_cache.to_string(),
            "max_graph_cache_entries" => self.max_graph_cache_entries.to_string(),
            "kernel_families" => self.kernel_families.to_string(),
            "kernel_cache_dir" => path(&self.kernel_cache_dir),
            "debug" => self.debug.to_string(),
            "dump_dir" => path(&self.dump_dir),
            "disable_passes" => self.disable_passes.join(","),
            _ => return None,
        })
    }

    /// Every effective value and where it came from, one line per key in [`KEYS`]
    /// order: `max_grid_size = 1024  (env NDFUSE_MAX_GRID_SIZE)`.
    pub fn explain(&self) -> String {
        let width = KEYS.iter().map(|k| k.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, origin) in KEYS.iter().zip(&self.origins) {
            let value = self.value(k.name).unwrap_or_default();
            out.push_str(&format!("{:width$} = {value}  ({origin})\n", k.name));
        }
        out
    }

    /// Sets `key` from `raw`, recording `origin`.
    fn apply(&mut self, key: &str, raw: &Raw, origin: ConfigSource) -> Result<(), ConfigError> {
        let Some(idx) = KEYS.iter().position(|k| k.name == key) else {
            return Err(unknown(key, origin, |k| k.to_string()));
        };
        let info = KEYS[idx];
        let bad = || ConfigError::BadValue {
            key: info.name,
            value: raw.to_string(),
            origin: origin.clone(),
            expected: info.expected,
        };
        let int = || -> Result<i64, ConfigError> {
            match raw {
                Raw::Int(i) => Ok(*i),
                Raw::Str(s) => s.trim().parse::<i64>().map_err(|_| bad()),
                _ => Err(bad()),
            }
        };
        // Sizes and counts: non-negative, and a size may not exceed the target type.
        let unsigned = || -> Result<u64, ConfigError> { u64::try_from(int()?).map_err(|_| bad()) };
        let positive_u32 = || -> Result<u32, ConfigError> {
            u32::try_from(unsigned()?)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(bad)
        };
        let boolean = || -> Result<bool, ConfigError> {
            match raw {
                Raw::Bool(b) => Ok(*b),
                Raw::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => Ok(true),
                    "false" | "0" | "no" | "off" => Ok(false),
                    _ => Err(bad()),
                },
                _ => Err(bad()),
            }
        };
        let text = || -> Result<String, ConfigError> {
            match raw {
                Raw::Str(s) => Ok(s.trim().to_string()),
                _ => Err(bad()),
            }
        };
        // An empty path means "none", so a builder or file can clear a lower source's path.
        let path = || -> Result<Option<PathBuf>, ConfigError> {
            let s = text()?;
            Ok((!s.is_empty() && s != "none").then(|| PathBuf::from(s)))
        };
        match info.name {
            "backend_priority_cpu" => self.backend_priority_cpu = int()?,
            "backend_priority_gpu" => self.backend_priority_gpu = int()?,
            "backend" => {
                self.backend = match text()?.to_ascii_lowercase().as_str() {
                    "auto" => BackendKind::Auto,
                    "cpu" => BackendKind::Cpu,
                    "cuda" => BackendKind::Cuda,
                    "interp" => BackendKind::Interp,
                    _ => return Err(bad()),
                }
            }
            "default_dtype" => {
                self.default_dtype = match text()?.to_ascii_lowercase().as_str() {
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    "f32" => DType::F32,
                    "f64" => DType::F64,
                    _ => return Err(bad()),
                }
            }
            "cpu_threads" => self.cpu_threads = usize::try_from(unsigned()?).map_err(|_| bad())?,
            "max_host_cacheable_length" => self.max_host_cacheable_length = unsigned()?,
            "max_host_cache" => self.max_host_cache = unsigned()?,
            "max_device_cacheable_length" => self.max_device_cacheable_length = unsigned()?,
            "max_device_cache" => self.max_device_cache = unsigned()?,
            "max_grid_size" => self.max_grid_size = positive_u32()?,
            "max_block_size" => self.max_block_size = positive_u32()?,
            "allow_multi_gpu" => self.allow_multi_gpu = boolean()?,
            "kernel_families" => self.kernel_families = boolean()?,
            "max_kernel_cache_entries" => self.max_kernel_cache_entries = positive_u32()?,
            "max_kernel_cache" => self.max_kernel_cache = unsigned()?,
            "max_graph_cache_entries" => self.max_graph_cache_entries = positive_u32()?,
            "kernel_cache_dir" => self.kernel_cache_dir = path()?,
            "debug" => {
                self.debug = u8::try_from(int()?)
                    .ok()
                    .filter(|&l| l <= 4)
                    .ok_or_else(bad)?
            }
            "dump_dir" => self.dump_dir = path()?,
            "disable_passes" => {
                self.disable_passes = match raw {
                    Raw::List(l) => l.clone(),
                    Raw::Str(s) => ndfuse_passes::PassOptions::parse_pass_list(s),
                    _ => return Err(bad()),
                }
            }
            // Every name in KEYS has an arm above; a key added to the table without one
            // is caught by the test that sets every key.
            other => panic!("config key {other} has no parser (a bug)"),
        }
        self.origins[idx] = origin;
        Ok(())
    }
}

/// The unknown-key error for `key`, suggesting the nearest key spelt by `spell`.
fn unknown(key: &str, origin: ConfigSource, spell: impl Fn(&str) -> String) -> ConfigError {
    let needle = key.to_ascii_lowercase();
    let suggestion = KEYS
        .iter()
        .map(|k| (edit_distance(&needle, k.name), k.name))
        .min()
        // A far-off key is no help: suggest only within a third of the key's length.
        .filter(|&(d, name)| d <= (name.len() / 3).max(2))
        .map(|(_, name)| spell(name));
    ConfigError::UnknownKey {
        key: key.to_string(),
        origin,
        suggestion,
    }
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Where the file comes from: discovered, or set by the builder.
#[derive(Clone, Debug, Default)]
enum FileChoice {
    #[default]
    Discover,
    Given(Option<PathBuf>),
}

/// Values set in code, applied over the file and the environment by [`Self::build`].
///
/// ```
/// use ndfuse_runtime::{BackendKind, Config};
/// let cfg = Config::builder()
///     .config_file(None)
///     .environment(Vec::<(String, String)>::new())
///     .backend(BackendKind::Interp)
///     .max_block_size(128)
///     .build()
///     .unwrap();
/// assert_eq!(cfg.backend(), BackendKind::Interp);
/// assert_eq!(cfg.max_block_size(), 128);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ConfigBuilder {
    file: FileChoice,
    env: Option<Vec<(String, String)>>,
    values: Vec<(String, Raw)>,
}

impl ConfigBuilder {
    /// Sets `key` to `value`, parsed as the environment's values are; an unknown key
    /// or a bad value is reported by [`Self::build`].
    pub fn set(mut self, key: &str, value: impl Into<String>) -> ConfigBuilder {
        self.values.push((key.to_string(), Raw::Str(value.into())));
        self
    }

    /// Reads this file instead of discovering one (`None`: no file at all). A missing
    /// file given here is an error, as for `NDFUSE_CONFIG`.
    pub fn config_file(mut self, path: Option<PathBuf>) -> ConfigBuilder {
        self.file = FileChoice::Given(path);
        self
    }

    /// Uses these variables instead of the process environment (for embedding and
    /// tests); `NDFUSE_CONFIG` among them is honoured.
    pub fn environment<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> ConfigBuilder {
        self.env = Some(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        );
        self
    }

    fn raw(mut self, key: &str, raw: Raw) -> ConfigBuilder {
        self.values.push((key.to_string(), raw));
        self
    }

    /// `backend_priority_cpu`.
    pub fn backend_priority_cpu(self, p: i64) -> ConfigBuilder {
        self.raw("backend_priority_cpu", Raw::Int(p))
    }
    /// `backend_priority_gpu`.
    pub fn backend_priority_gpu(self, p: i64) -> ConfigBuilder {
        self.raw("backend_priority_gpu", Raw::Int(p))
    }
    /// `backend`.
    pub fn backend(self, b: BackendKind) -> ConfigBuilder {
        self.raw("backend", Raw::Str(b.name().to_string()))
    }
    /// `default_dtype` (f16, bf16, f32 or f64; another dtype is reported by `build`).
    pub fn default_dtype(self, d: DType) -> ConfigBuilder {
        self.raw("default_dtype", Raw::Str(d.name().to_string()))
    }
    /// `cpu_threads`.
    pub fn cpu_threads(self, n: usize) -> ConfigBuilder {
        self.raw("cpu_threads", Raw::Str(n.to_string()))
    }
    /// `max_grid_size`.
    pub fn max_grid_size(self, n: u32) -> ConfigBuilder {
        self.raw("max_grid_size", Raw::Int(n.into()))
    }
    /// `max_block_size`.
    pub fn max_block_size(self, n: u32) -> ConfigBuilder {
        self.raw("max_block_size", Raw::Int(n.into()))
    }
    /// `allow_multi_gpu`.
    pub fn allow_multi_gpu(self, on: bool) -> ConfigBuilder {
        self.raw("allow_multi_gpu", Raw::Bool(on))
    }
    /// `kernel_families`.
    pub fn kernel_families(self, on: bool) -> ConfigBuilder {
        self.raw("kernel_families", Raw::Bool(on))
    }
    /// `debug`.
    pub fn debug(self, level: u8) -> ConfigBuilder {
        self.raw("debug", Raw::Int(level.into()))
    }
    /// `dump_dir`.
    pub fn dump_dir(self, dir: impl AsRef<Path>) -> ConfigBuilder {
        self.raw(
            "dump_dir",
            Raw::Str(dir.as_ref().to_string_lossy().into_owned()),
        )
    }
    /// `kernel_cache_dir`.
    pub fn kernel_cache_dir(self, dir: impl AsRef<Path>) -> ConfigBuilder {
        self.raw(
            "kernel_cache_dir",
            Raw::Str(dir.as_ref().to_string_lossy().into_owned()),
        )
    }
    /// `disable_passes`.
    pub fn disable_passes<S: Into<String>>(
        self,
        names: impl IntoIterator<Item = S>,
    ) -> ConfigBuilder {
        let l = names.into_iter().map(Into::into).collect();
        self.raw("disable_passes", Raw::List(l))
    }

    /// Defaults, then the file, then the environment, then the values set here.
    pub fn build(self) -> Result<Config, ConfigError> {
        // The one place ndfuse reads its environment (STYLE 15).
        let env: Vec<(String, String)> = match self.env {
            Some(e) => e,
            None => std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        };
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.trim().is_empty())
        };
        let mut cfg = Config::default();

        let file = match self.file {
            FileChoice::Given(p) => p.map(|p| (p, true)),
            FileChoice::Discover => match lookup(CONFIG_VAR) {
                Some(p) => Some((PathBuf::from(p), true)),
                None => Some((PathBuf::from(CONFIG_FILE), false)),
            },
        };
        if let Some((path, required)) = file {
            match std::fs::read_to_string(&path) {
                Ok(text) => cfg.apply_file(&path, &text)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if required {
                        return Err(ConfigError::MissingFile { path });
                    }
                }
                Err(error) => return Err(ConfigError::Read { path, error }),
            }
        }

        // Aliases first, so the NDFUSE_<KEY> spelling wins when both are set.
        for (var, key) in ENV_ALIASES {
            if let Some(v) = lookup(var) {
                cfg.apply(
                    key,
                    &Raw::Str(v),
                    ConfigSource::Env {
                        var: var.to_string(),
                    },
                )?;
            }
        }
        let mut ours: Vec<&(String, String)> = env
            .iter()
            .filter(|(k, v)| {
                k.starts_with("NDFUSE_")
                    && !NOT_KEYS.contains(&k.as_str())
                    && !ENV_ALIASES.iter().any(|(a, _)| a == k)
                    && !v.trim().is_empty()
            })
            .collect();
        // Sorted, so that with several bad variables the same one is reported every run.
        ours.sort();
        for (var, value) in ours {
            let key = var["NDFUSE_".len()..].to_ascii_lowercase();
            let origin = ConfigSource::Env { var: var.clone() };
            if !KEYS.iter().any(|k| k.name == key) {
                return Err(unknown(&key, origin, |k| {
                    format!("NDFUSE_{}", k.to_ascii_uppercase())
                }));
            }
            cfg.apply(&key, &Raw::Str(value.clone()), origin)?;
        }

        for (key, raw) in &self.values {
            cfg.apply(key, raw, ConfigSource::Builder)?;
        }
        Ok(cfg)
    }
}

impl Config {
    /// Applies every key of the TOML file `text` read from `path`.
    fn apply_file(&mut self, path: &Path, text: &str) -> Result<(), ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                path: path.to_path_buf(),
                // One line: toml's Display quotes the offending line, which may hold
                // control bytes or binary garbage, under a caret on lines of its own.
                message: match e.span() {
                    Some(span) => {
                        let before = &text.as_bytes()[..span.start.min(text.len())];
                        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
                        let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
                        format!("{} at line {line}, column {column}", e.message().trim())
                    }
                    None => e.message().trim().to_string(),
                },
            })?;
        for (key, value) in &table {
            let origin = ConfigSource::File {
                path: path.to_path_buf(),
                line: line_of(text, key),
            };
            let Some(info) = KEYS.iter().find(|k| k.name == key).copied() else {
                return Err(unknown(key, origin, |k| k.to_string()));
            };
            let bad = |origin| ConfigError::BadValue {
                key: info.name,
                value: value.to_string(),
                origin,
                expected: info.expected,
            };
            let raw = match value {
                toml::Value::String(s) => Raw::Str(s.clone()),
                toml::Value::Integer(i) => Raw::Int(*i),
                toml::Value::Boolean(b) => Raw::Bool(*b),
                toml::Value::Array(a) => {
                    let items: Option<Vec<String>> =
                        a.iter().map(|v| v.as_str().map(str::to_owned)).collect();
                    Raw::List(items.ok_or_else(|| bad(origin.clone()))?)
                }
                // Tables, floats and dates fit no key.
                _ => return Err(bad(origin)),
            };
            self.apply(key, &raw, origin)?;
        }
        Ok(())
    }
}

/// The 1-based line where `key` is assigned at the top level of `text`; toml's table
/// keeps no spans, and a line number is what a user needs to find the key.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix(key)
                .or_else(|| l.strip_prefix(&format!("\"{key}\"")));
            rest.is_some_and(|r| r.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("max_grid_szie", "max_grid_size"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("debug", "debug"), 0);
    }

    #[test]
    fn every_key_has_a_parser_and_a_default_that_explain_prints() {
        let cfg = Config::default();
        for k in KEYS {
            let shown = cfg.value(k.name).expect("every key has a value");
            let want = if k.default.is_empty() { "" } else { k.default };
            assert_eq!(shown, want, "{}", k.name);
            // Re-applying the default as text parses (so every key has a parser arm).
            let mut c = Config::default();
            c.apply(k.name, &Raw::Str(shown.clone()), ConfigSource::Builder)
                .unwrap_or_else(|e| panic!("{}: {e}", k.name));
        }
    }

    #[test]
    fn line_of_finds_top_level_keys() {
        let text = "# c\ndebug = 1\n  max_grid_size=3\n";
        assert_eq!(line_of(text, "debug"), Some(2));
        assert_eq!(line_of(text, "max_grid_size"), Some(3));
        assert_eq!(line_of(text, "dump_dir"), None);
    }
}
