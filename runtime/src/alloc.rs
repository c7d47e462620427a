//! Caching allocators: a freed buffer goes back to a cache and serves the next request
//! of its size class, so repeated evaluations write into memory the OS has already
//! mapped instead of paying a page fault per 4 KiB of every fresh output.
//!
//! # Design
//!
//! - [`Cache`] is generic over a [`RawAlloc`], the allocator underneath: the host one
//!   here ([`HostAlloc`]), a device one (cudarc) later, with the same limits, size
//!   classes, statistics and [`Cache::trim`]. A block frees its memory when it is
//!   dropped (a `Vec` does, a `CudaSlice` does), so the cache frees a block by dropping it.
//! - **Size classes**: a request is rounded up to four classes per power of two
//!   (…, 1 MiB, 1.25 MiB, 1.5 MiB, 1.75 MiB, 2 MiB, …; at least 256 bytes), so a
//!   buffer serves requests up to 25 % smaller than itself and no more.
//! - **ND4J's limits** ([`Limits`], from `max_host_cacheable_length` /
//!   `max_host_cache` and the two device keys): a request whose class exceeds the
//!   cacheable length is allocated at its exact size and freed when dropped, never
//!   cached; the bytes held never exceed the total: a returned block first evicts the
//!   least recently returned ones, and a block larger than the total is freed.
//! - **Thread-safe**: one mutex around the free lists and counters; allocating and
//!   freeing memory (the slow part) happen outside it.
//! - **Host buffers are typed storage.** The executor and the JIT work on
//!   [`HostArray`], whose storage is a typed `Vec` (`ir::Storage`). Rather than a new
//!   pointer-based storage that every interpreter and codegen path would have to learn,
//!   the host cache recycles those `Vec`s whole: a block is a [`Storage`] whose capacity
//!   is the class, and blocks are keyed by dtype as well as class (an `f32` buffer never
//!   turns into an `i64` one, so no `unsafe` reinterpretation is needed). An array
//!   handed out by [`Cache::array`] carries the cache as its home
//!   ([`ndfuse_ir::Recycle`]): dropping the array, whether it is an intermediate the
//!   executor releases after its last reader or an output the user is done with, gives
//!   the `Vec` back. Cloning an array gives a copy with no home.
//! - **Huge pages**: fresh host buffers of 4 MiB and more ask the kernel for
//!   transparent huge pages (`madvise(MADV_HUGEPAGE)`, Linux): a fresh 64 MiB output then
//!   takes about 32 faults instead of 16 384. They are allocated zeroed
//!   (`alloc_zeroed`), which for large sizes maps fresh zero pages without touching them,
//!   so the advice comes before the first fault.
//!
//! ```
//! use ndfuse_runtime::{host_cache, Limits};
//! use ndfuse_ir::{DType, Shape};
//! let cache = host_cache();
//! let a = cache.array(DType::F32, Shape::new([1000])).unwrap();
//! drop(a); // back to the cache
//! let b = cache.array(DType::F32, Shape::new([1000])).unwrap(); // the same buffer
//! assert!(cache.stats().hits >= 1);
//! # drop(b);
//! ```

use crate::config::Config;
use ndfuse_ir::{DType, HostArray, Recycle, Shape, Storage};
use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// Why an allocation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The allocator underneath had no memory left (after the cache freed what it held).
    #[error("{memory} allocation of {bytes} bytes failed: out of memory")]
    OutOfMemory {
        /// Which memory (`host`, `cuda:0`).
        memory: String,
        /// The size asked for.
        bytes: usize,
    },
    /// The size does not fit this platform's address space.
    #[error("{memory} allocation of {bytes} bytes is larger than this platform can address")]
    TooLarge {
        /// Which memory.
        memory: String,
        /// The size asked for.
        bytes: usize,
    },
    /// The allocator underneath failed for another reason (a device error).
    #[error("{memory} allocation of {bytes} bytes failed: {reason}")]
    Failed {
        /// Which memory.
        memory: String,
        /// The size asked for.
        bytes: usize,
        /// What the allocator said.
        reason: String,
    },
}

/// The allocator under a [`Cache`]: host memory, or one device's memory.
///
/// A block frees its memory when dropped; the cache never frees otherwise.
pub trait RawAlloc: Send + Sync {
    /// What must match besides the size for a cached block to serve a request (the
    /// dtype of host storage; `()` for untyped device memory).
    type Kind: Copy + Eq + Hash + fmt::Debug + Send + Sync;
    /// An allocation.
    type Block: Send;
    /// The memory's name in statistics and errors (`host`, `cuda:0`).
    fn name(&self) -> &str;
    /// A block of `kind` holding at least `bytes` bytes.
    fn alloc(&self, kind: Self::Kind, bytes: usize) -> Result<Self::Block, AllocError>;
    /// A block's kind and the bytes it holds (its capacity, not the part in use).
    fn describe(&self, block: &Self::Block) -> (Self::Kind, usize);
}

/// ND4J's two limits of one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest buffer kept, bytes: a request whose size class is larger is allocated
    /// at its exact size and freed when dropped.
    pub max_cacheable_length: u64,
    /// The most bytes the cache holds at once.
    pub max_cache: u64,
}

impl Limits {
    /// The host limits of a configuration (`max_host_cacheable_length`, `max_host_cache`).
    pub fn host(cfg: &Config) -> Limits {
        Limits {
            max_cacheable_length: cfg.max_host_cacheable_length(),
            max_cache: cfg.max_host_cache(),
        }
    }

    /// The device limits of a configuration (`max_device_cacheable_length`,
    /// `max_device_cache`).
    pub fn device(cfg: &Config) -> Limits {
        Limits {
            max_cacheable_length: cfg.max_device_cacheable_length(),
            max_cache: cfg.max_device_cache(),
        }
    }
}

/// What a cache did since it was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests served by a cached block.
    pub hits: u64,
    /// Requests that went to the allocator underneath (`uncacheable` included).
    pub misses: u64,
    /// Misses larger than the cacheable length: allocated exactly, never cached.
    pub uncacheable: u64,
    /// Blocks taken back into the cache.
    pub returned: u64,
    /// Blocks freed instead of kept: too large, evicted to stay under the total, or
    /// dropped by `trim` or a lower limit.
    pub released: u64,
    /// Bytes held by the cache now (free blocks only; buffers in use are not counted).
    pub bytes_cached: u64,
    /// Blocks held now.
    pub blocks_cached: u64,
    /// The most bytes the cache ever held at once.
    pub high_water_mark: u64,
    /// The limits in force.
    pub limits: Limits,
}

impl fmt::Display for CacheStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hits, {} misses ({} too large to cache), {} in {} block{} cached (high-water {}); \
             limits: {} a buffer, {} in all",
            self.hits,
            self.misses,
            self.uncacheable,
            mib(self.bytes_cached),
            self.blocks_cached,
            if self.blocks_cached == 1 { "" } else { "s" },
            mib(self.high_water_mark),
            mib(self.limits.max_cacheable_length),
            mib(self.limits.max_cache),
        )
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The smallest size class.
pub const MIN_CLASS: usize = 256;

/// The size class of a request of `bytes`: at least [`MIN_CLASS`], else `bytes` rounded
/// up to a quarter of its power of two (1 MiB + 1 byte -> 1.25 MiB). `None` when the
/// class would not fit a `usize`.
pub fn size_class(bytes: usize) -> Option<usize> {
    if bytes <= MIN_CLASS {
        return Some(MIN_CLASS);
    }
    // The power of two at or below `bytes`; a quarter of it is the step.
    let step = (1usize << (usize::BITS - 1 - bytes.leading_zeros())) / 4;
    bytes.checked_next_multiple_of(step)
}

/// The largest size class a block of `cap` bytes can serve (`None`: smaller than
/// [`MIN_CLASS`]).
fn class_below(cap: usize) -> Option<usize> {
    if cap < MIN_CLASS {
        return None;
    }
    let step = (1usize << (usize::BITS - 1 - cap.leading_zeros())) / 4;
    Some((cap / step * step).max(MIN_CLASS))
}

/// A free block, with the order it came back in (for evicting the oldest first).
struct Free<B> {
    seq: u64,
    block: B,
}

/// What the mutex guards.
struct State<K, B> {
    /// Free blocks by kind and class; the back of each queue is the most recent.
    /// By kind and size class; looked up twice per buffer of every eval, so FxHash.
    free: rustc_hash::FxHashMap<(K, usize), VecDeque<Free<B>>>,
    next_seq: u64,
    stats: CacheStats,
}

impl<K: Copy + Eq + Hash, B> State<K, B> {
    /// Removes the least recently returned block, if any.
    fn evict_oldest(&mut self, size: impl Fn(&B) -> usize) -> Option<B> {
        let key = *self
            .free
            .iter()
            .filter_map(|(k, q)| q.front().map(|f| (k, f.seq)))
            .min_by_key(|&(_, seq)| seq)?
            .0;
        let queue = self.free.get_mut(&key)?;
        let f = queue.pop_front()?;
        if queue.is_empty() {
            self.free.remove(&key);
        }
        self.forget(size(&f.block));
        Some(f.block)
    }

    /// Counts a block of `bytes` leaving the cache to be freed.
    fn forget(&mut self, bytes: usize) {
        self.stats.bytes_cached -= bytes as u64;
        self.stats.blocks_cached -= 1;
        self.stats.released += 1;
    }
}

/// A caching allocator over `A` (see the module documentation).
pub struct Cache<A: RawAlloc> {
    raw: A,
    state: Mutex<State<A::Kind, A::Block>>,
}

impl<A: RawAlloc> fmt::Debug for Cache<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("memory", &self.raw.name())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<A: RawAlloc> Cache<A> {
    /// An empty cache over `raw` with `limits`.
    pub fn new(raw: A, limits: Limits) -> Cache<A> {
        Cache {
            raw,
            state: Mutex::new(State {
                free: rustc_hash::FxHashMap::default(),
                next_seq: 0,
                stats: CacheStats {
                    hits: 0,
                    misses: 0,
                    uncacheable: 0,
                    returned: 0,
                    released: 0,
                    bytes_cached: 0,
                    blocks_cached: 0,
                    high_water_mark: 0,
                    limits,
                },
            }),
        }
    }

    /// The allocator underneath.
    pub fn raw(&self) -> &A {
        &self.raw
    }

    fn lock(&self) -> MutexGuard<'_, State<A::Kind, A::Block>> {
        // The state is consistent between statements: a panic elsewhere cannot break it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn size(&self) -> impl Fn(&A::Block) -> usize + '_ {
        |b| self.raw.describe(b).1
    }

    /// A block of `kind` holding at least `bytes` bytes: a cached one of the request's
    /// size class when there is one, else a new one (of the class, or of exactly
    /// `bytes` when the class is larger than the cacheable length). Give it back with
    /// [`Cache::give`] (or let [`Cache::alloc`] do it). When the allocator underneath is
    /// out of memory, everything cached is freed and the allocation tried once more.
    pub fn take(&self, kind: A::Kind, bytes: usize) -> Result<A::Block, AllocError> {
        let class = size_class(bytes).ok_or_else(|| AllocError::TooLarge {
            memory: self.raw.name().to_string(),
            bytes,
        })?;
        let cacheable = {
            let mut st = self.lock();
            let cacheable = class as u64 <= st.stats.limits.max_cacheable_length;
            if cacheable {
                if let Some(queue) = st.free.get_mut(&(kind, class)) {
                    let hit = queue.pop_back();
                    if queue.is_empty() {
                        st.free.remove(&(kind, class));
                    }
                    if let Some(f) = hit {
                        st.stats.bytes_cached -= self.raw.describe(&f.block).1 as u64;
                        st.stats.blocks_cached -= 1;
                        st.stats.hits += 1;
                        return Ok(f.block);
                    }
                }
            } else {
                st.stats.uncacheable += 1;
            }
            st.stats.misses += 1;
            cacheable
        };
        let size = if cacheable { class } else { bytes };
        match self.raw.alloc(kind, size) {
            Err(AllocError::OutOfMemory { .. }) => {
                // Memory is short: what the cache holds goes first.
                self.trim();
                self.raw.alloc(kind, size)
            }
            other => other,
        }
    }

    /// Takes a block back: kept for the next request of its class, or freed when it is
    /// larger than the cacheable length or the total. Room under the total is made by
    /// freeing the least recently returned blocks. Any block of the right kind may be
    /// given, also one the cache did not issue.
    pub fn give(&self, block: A::Block) {
        let (kind, cap) = self.raw.describe(&block);
        let mut freed = Vec::new();
        {
            let mut st = self.lock();
            let limits = st.stats.limits;
            match class_below(cap) {
                Some(class)
                    if cap as u64 <= limits.max_cacheable_length
                        && cap as u64 <= limits.max_cache =>
                {
                    while st.stats.bytes_cached + cap as u64 > limits.max_cache {
                        match st.evict_oldest(self.size()) {
                            Some(b) => freed.push(b),
                            None => break,
                        }
                    }
                    let seq = st.next_seq;
                    st.next_seq += 1;
                    st.free
                        .entry((kind, class))
                        .or_default()
                        .push_back(Free { seq, block });
                    let s = &mut st.stats;
                    s.bytes_cached += cap as u64;
                    s.blocks_cached += 1;
                    s.returned += 1;
                    s.high_water_mark = s.high_water_mark.max(s.bytes_cached);
                }
                _ => {
                    st.stats.released += 1;
                    freed.push(block);
                }
            }
        }
        // Freeing (munmap for large blocks) happens outside the lock.
        drop(freed);
    }

    /// Frees every cached block; returns the bytes freed.
    pub fn trim(&self) -> u64 {
        let freed: Vec<A::Block> = {
            let mut st = self.lock();
            let free = std::mem::take(&mut st.free);
            let blocks: Vec<A::Block> = free
                .into_values()
                .flat_map(|q| q.into_iter().map(|f| f.block))
                .collect();
            st.stats.released += blocks.len() as u64;
            st.stats.bytes_cached = 0;
            st.stats.blocks_cached = 0;
            blocks
        };
        freed.iter().map(|b| self.raw.describe(b).1 as u64).sum()
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.lock().stats.limits
    }

    /// Changes the limits; cached blocks that no longer fit are freed at once (the
    /// largest-than-cacheable ones, then the oldest until the total is met).
    pub fn set_limits(&self, limits: Limits) {
        let mut freed = Vec::new();
        {
            let mut st = self.lock();
            if st.stats.limits == limits {
                return;
            }
            st.stats.limits = limits;
            let too_big: Vec<(A::Kind, usize)> = st
                .free
                .keys()
                .filter(|&&(_, class)| class as u64 > limits.max_cacheable_length)
                .copied()
                .collect();
            for key in too_big {
                for f in st.free.remove(&key).into_iter().flatten() {
                    st.forget(self.raw.describe(&f.block).1);
                    freed.push(f.block);
                }
            }
            while st.stats.bytes_cached > limits.max_cache {
                match st.evict_oldest(self.size()) {
                    Some(b) => freed.push(b),
                    None => break,
                }
            }
        }
        drop(freed);
    }

    /// What the cache did so far and holds now.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// A block (see [`Cache::take`]) that goes back to this cache when dropped.
    pub fn alloc(self: &Arc<Self>, kind: A::Kind, bytes: usize) -> Result<Pooled<A>, AllocError> {
        Ok(Pooled {
            block: Some(self.take(kind, bytes)?),
            cache: Arc::clone(self),
        })
    }
}

/// A block from [`Cache::alloc`]; dropping it gives it back to the cache.
pub struct Pooled<A: RawAlloc> {
    /// `Some` until dropped or detached.
    block: Option<A::Block>,
    cache: Arc<Cache<A>>,
}

impl<A: RawAlloc> Pooled<A> {
    /// The block, detached from the cache: it is freed when dropped.
    pub fn into_inner(mut self) -> A::Block {
        self.block
            .take()
            .expect("a Pooled holds its block until dropped (a bug otherwise)")
    }
}

impl<A: RawAlloc> Deref for Pooled<A> {
    type Target = A::Block;
    fn deref(&self) -> &A::Block {
        self.block
            .as_ref()
            .expect("a Pooled holds its block until dropped (a bug otherwise)")
    }
}

impl<A: RawAlloc> DerefMut for Pooled<A> {
    fn deref_mut(&mut self) -> &mut A::Block {
        self.block
            .as_mut()
            .expect("a Pooled holds its block until dropped (a bug otherwise)")
    }
}

impl<A: RawAlloc> Drop for Pooled<A> {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            self.cache.give(b);
        }
    }
}

impl<A: RawAlloc> fmt::Debug for Pooled<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let described = self.block.as_ref().map(|b| self.cache.raw.describe(b));
        f.debug_struct("Pooled")
            .field("memory", &self.cache.raw.name())
            .field("kind_and_bytes", &described)
            .finish()
    }
}

// ----- host memory -----

/// Fresh host buffers of this size and more ask for transparent huge pages.
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// The size of an x86-64 / aarch64 (4 KiB base pages) transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Host memory: typed `Vec` storage from the global allocator, zeroed, with huge pages
/// asked for when large (see the module documentation).
#[derive(Debug, Default)]
pub struct HostAlloc {
    /// Bytes the kernel accepted huge-page advice for.
    advised: AtomicU64,
}

impl HostAlloc {
    /// Bytes of fresh buffers for which the kernel accepted `MADV_HUGEPAGE` (zero where
    /// transparent huge pages are off or the OS is not Linux).
    pub fn huge_page_bytes(&self) -> u64 {
        self.advised.load(Ordering::Relaxed)
    }

    /// `len` zero elements with capacity `len`; huge pages asked for when large.
    fn zeroed<T: ZeroBits>(&self, len: usize) -> Result<Vec<T>, AllocError> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        if len == 0 {
            return Ok(Vec::new());
        }
        let layout = std::alloc::Layout::array::<T>(len).map_err(|_| AllocError::TooLarge {
            memory: "host".into(),
            bytes,
        })?;
        // SAFETY: the layout's size is non-zero: `len > 0` and every `ZeroBits` type has
        // a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(AllocError::OutOfMemory {
                memory: "host".into(),
                bytes,
            });
        }
        if bytes >= HUGE_PAGE_MIN_BYTES && advise_huge_pages(ptr, bytes) {
            self.advised.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        // SAFETY: `ptr` comes from the global allocator with `Layout::array::<T>(len)`:
        // T's alignment and `len * size_of::<T>()` bytes, so capacity `len` describes
        // the allocation exactly; all its bytes are zero and an all-zero bit pattern is a
        // valid `T` (the contract of `ZeroBits`), so all `len` elements are initialised.
        Ok(unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, len) })
    }
}

/// Element types for which all-zero bytes are a valid value (`0`, `+0.0`, `false`).
/// `alloc_zeroed` is used instead of `vec![zero; n]` because the latter writes every
/// element of `f16` / `bf16` (no zeroed-allocation shortcut for types outside std),
/// faulting every page in before the huge-page advice could apply.
trait ZeroBits: Copy {}
impl ZeroBits for half::f16 {}
impl ZeroBits for half::bf16 {}
impl ZeroBits for f32 {}
impl ZeroBits for f64 {}
impl ZeroBits for i32 {}
impl ZeroBits for i64 {}
impl ZeroBits for bool {}

/// Asks Linux to back the whole 2 MiB pages inside `[ptr, ptr + bytes)` with huge pages;
/// whether the kernel accepted.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, bytes: usize) -> bool {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
    if start >= end {
        return false;
    }
    // SAFETY: `[start, end)` lies inside the allocation of `bytes` bytes at `ptr` that the
    // caller made just now and alone owns, and both ends are page-aligned as madvise
    // requires. MADV_HUGEPAGE only changes how the kernel backs these pages (2 MiB pages
    // instead of 4 KiB ones); their contents and mapping stay as they are, so no Rust
    // value can observe it. A refusal (THP disabled) leaves ordinary pages.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _bytes: usize) -> bool {
    false
}

impl RawAlloc for HostAlloc {
    type Kind = DType;
    type Block = Storage;

    fn name(&self) -> &str {
        "host"
    }

    /// Storage of `dtype` with capacity for `bytes` (rounded up to whole elements), all
    /// of it in use and zero.
    fn alloc(&self, dtype: DType, bytes: usize) -> Result<Storage, AllocError> {
        let len = bytes.div_ceil(dtype.size_bytes());
        Ok(match dtype {
            DType::F16 => Storage::F16(self.zeroed(len)?),
            DType::BF16 => Storage::BF16(self.zeroed(len)?),
            DType::F32 => Storage::F32(self.zeroed(len)?),
            DType::F64 => Storage::F64(self.zeroed(len)?),
            DType::I32 => Storage::I32(self.zeroed(len)?),
            DType::I64 => Storage::I64(self.zeroed(len)?),
            DType::Bool => Storage::Bool(self.zeroed(len)?),
        })
    }

    fn describe(&self, s: &Storage) -> (DType, usize) {
        let capacity = match s {
            Storage::F16(v) => v.capacity(),
            Storage::BF16(v) => v.capacity(),
            Storage::F32(v) => v.capacity(),
            Storage::F64(v) => v.capacity(),
            Storage::I32(v) => v.capacity(),
            Storage::I64(v) => v.capacity(),
            Storage::Bool(v) => v.capacity(),
        };
        (s.dtype(), capacity * s.dtype().size_bytes())
    }
}

/// Sets the element count of `s` to `len` within its capacity: truncating, or filling
/// the new tail with zeros (only when a block serves a request longer than the one it
/// served before, within one size class).
fn set_len(s: &mut Storage, len: usize) {
    match s {
        Storage::F16(v) => v.resize(len, half::f16::ZERO),
        Storage::BF16(v) => v.resize(len, half::bf16::ZERO),
        Storage::F32(v) => v.resize(len, 0.0),
        Storage::F64(v) => v.resize(len, 0.0),
        Storage::I32(v) => v.resize(len, 0),
        Storage::I64(v) => v.resize(len, 0),
        Storage::Bool(v) => v.resize(len, false),
    }
}

/// The host cache: typed storage of [`HostAlloc`].
pub type HostCache = Cache<HostAlloc>;

impl Recycle for HostCache {
    fn recycle(&self, data: Storage) {
        self.give(data);
    }
}

impl HostCache {
    /// An array of `dtype` and `shape` whose storage comes from the cache and goes back
    /// to it when the array is dropped. Its elements are whatever the buffer held last
    /// (zeros when fresh): the caller overwrites all of them.
    pub fn array(self: &Arc<Self>, dtype: DType, shape: Shape) -> Result<HostArray, AllocError> {
        let len = shape.numel();
        if len == 0 {
            return Ok(HostArray::zeros(dtype, shape));
        }
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| AllocError::TooLarge {
                memory: "host".into(),
                bytes: usize::MAX,
            })?;
        let mut data = self.take(dtype, bytes)?;
        set_len(&mut data, len);
        let home: Arc<dyn Recycle> = Arc::clone(self) as Arc<dyn Recycle>;
        Ok(HostArray::with_home(shape, data, home)
            .expect("the storage was sized to the shape just above (a bug otherwise)"))
    }
}

/// The process's host cache, shared by every evaluation. Its limits follow the
/// configuration of the latest evaluation (`max_host_cacheable_length`,
/// `max_host_cache`); before the first, the defaults.
pub fn host_cache() -> &'static Arc<HostCache> {
    static CACHE: OnceLock<Arc<HostCache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        Arc::new(Cache::new(
            HostAlloc::default(),
            Limits::host(&Config::default()),
        ))
    })
}

/// What the host cache did so far and holds now (see [`CacheStats`]).
pub fn host_cache_stats() -> CacheStats {
    host_cache().stats()
}

/// Minor page faults of this process so far (`getrusage(RUSAGE_SELF)`, all threads);
/// `None` where the OS does not report them. The difference around an evaluation is
/// how many pages it touched for the first time.
#[cfg(unix)]
pub fn minor_page_faults() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `struct rusage` through the pointer, which points to
    // a `rusage`-sized, aligned buffer that lives across the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so it filled the struct (which was zeroed before,
    // and all-zero is a valid `rusage` of plain integers anyway).
    let usage = unsafe { usage.assume_init() };
    u64::try_from(usage.ru_minflt).ok()
}

/// Minor page faults of this process so far; `None` where the OS does not report them.
#[cfg(not(unix))]
pub fn minor_page_faults() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_a_quarter_of_the_power_of_two() {
        assert_eq!(size_class(0), Some(256));
        assert_eq!(size_class(256), Some(256));
        assert_eq!(size_class(257), Some(320));
        assert_eq!(size_class(1 << 20), Some(1 << 20));
        assert_eq!(size_class((1 << 20) + 1), Some((1 << 20) + (1 << 18)));
        assert_eq!(size_class(64 << 20), Some(64 << 20));
        assert_eq!(size_class(usize::MAX), None);
        for bytes in [300, 4097, 1 << 22, 5_000_000, 123_456_789] {
            let c = size_class(bytes).unwrap();
            assert!(c >= bytes && (c - bytes) * 4 <= c, "{bytes} -> {c}");
            assert_eq!(class_below(c), Some(c), "a class is its own floor");
        }
        assert_eq!(class_below(255), None);
        assert_eq!(class_below(330), Some(320));
    }

    #[test]
    fn host_blocks_are_zeroed_typed_storage_of_the_class() {
        let h = HostAlloc::default();
        let s = h.alloc(DType::BF16, 1000).unwrap();
        assert_eq!(h.describe(&s), (DType::BF16, 1000));
        assert!((0..s.len()).all(|i| s.get_f64(i) == 0.0));
        let s = h.alloc(DType::Bool, 3).unwrap();
        assert_eq!(s.len(), 3);
        assert!(!s.get_bool(2));
    }

    #[test]
    fn page_faults_are_counted() {
        let before = minor_page_faults().expect("Linux reports minor faults");
        // 8 MiB touched page by page: at least some faults, however the kernel backs it.
        let mut v = vec![0u8; 8 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        assert!(minor_page_faults().unwrap() > before);
    }
}
