//! The caching allocators: each of ND4J's limits, reuse on drop, trim, statistics,
//! eight threads sharing one cache, the host cache's typed storage and huge pages, and
//! the executor taking its buffers from the host cache.
//!
//! The generic tests run a [`Cache`] over a ledger allocator that numbers its blocks and
//! records every free, so a lost, shared or doubly freed block shows.

use ndfuse::{Context, Tensor};
use ndfuse_ir::{DType, Shape};
use ndfuse_runtime::{
    host_cache, AllocError, Cache, CacheStats, HostAlloc, Limits, RawAlloc, HUGE_PAGE_MIN_BYTES,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the ledger allocator handed out and what came back freed.
#[derive(Debug, Default)]
struct Ledger {
    allocated: AtomicU64,
    freed: Mutex<HashSet<u64>>,
}

impl Ledger {
    /// Blocks allocated and not freed yet.
    fn live(&self) -> u64 {
        self.allocated.load(Ordering::SeqCst) - self.freed.lock().unwrap().len() as u64
    }
}

/// An allocator of numbered blocks that remembers each free.
#[derive(Debug, Default)]
struct LedgerAlloc(Arc<Ledger>);

#[derive(Debug)]
struct Block {
    id: u64,
    kind: u8,
    bytes: usize,
    ledger: Arc<Ledger>,
}

impl Drop for Block {
    fn drop(&mut self) {
        let first = self.ledger.freed.lock().unwrap().insert(self.id);
        assert!(first, "block {} freed twice", self.id);
    }
}

impl RawAlloc for LedgerAlloc {
    type Kind = u8;
    type Block = Block;
    fn name(&self) -> &str {
        "ledger"
    }
    fn alloc(&self, kind: u8, bytes: usize) -> Result<Block, AllocError> {
        let id = self.0.allocated.fetch_add(1, Ordering::SeqCst);
        Ok(Block {
            id,
            kind,
            bytes,
            ledger: Arc::clone(&self.0),
        })
    }
    fn describe(&self, b: &Block) -> (u8, usize) {
        (b.kind, b.bytes)
    }
}

fn ledger_cache(
    max_cacheable_length: u64,
    max_cache: u64,
) -> (Arc<Cache<LedgerAlloc>>, Arc<Ledger>) {
    let ledger = Arc::new(Ledger::default());
    let cache = Arc::new(Cache::new(
        LedgerAlloc(Arc::clone(&ledger)),
        Limits {
            max_cacheable_length,
            max_cache,
        },
    ));
    (cache, ledger)
}

#[test]
fn a_dropped_buffer_serves_the_next_request_of_its_class() {
    let (cache, ledger) = ledger_cache(1 << 20, 16 << 20);
    let a = cache.alloc(0, 1000).unwrap();
    assert_eq!(a.bytes, 1024, "1000 bytes round up to the 1 KiB class");
    let id = a.id;
    drop(a);
    assert_eq!(ledger.live(), 1, "dropped into the cache, not freed");
    let b = cache.alloc(0, 900).unwrap();
    assert_eq!(b.id, id, "the same class reuses the block");
    let c = cache.alloc(0, 1100).unwrap();
    assert_ne!(c.id, id, "a larger class does not");
    drop(b);
    let d = cache.alloc(1, 1000).unwrap();
    assert_ne!(d.id, id, "another kind does not either");
    let s = cache.stats();
    assert_eq!((s.hits, s.misses), (1, 3));
}

#[test]
fn a_buffer_larger_than_the_cacheable_length_is_never_cached() {
    let (cache, ledger) = ledger_cache(4096, 1 << 20);
    let big = cache.alloc(0, 5000).unwrap();
    assert_eq!(
        big.bytes, 5000,
        "an uncacheable request is allocated exactly"
    );
    drop(big);
    assert_eq!(ledger.live(), 0, "freed at once");
    let s = cache.stats();
    assert_eq!((s.misses, s.uncacheable, s.released), (1, 1, 1));
    assert_eq!((s.bytes_cached, s.blocks_cached), (0, 0));
    // At the limit exactly it is kept.
    drop(cache.alloc(0, 4096).unwrap());
    assert_eq!(cache.stats().bytes_cached, 4096);
    // A block the cache did not issue is judged the same way.
    cache.give(LedgerAlloc(Arc::clone(&ledger)).alloc(0, 8192).unwrap());
    assert_eq!(cache.stats().bytes_cached, 4096);
    assert_eq!(ledger.live(), 1);
}

#[test]
fn the_cache_never_holds_more_than_its_total() {
    let (cache, ledger) = ledger_cache(4096, 10_000);
    let blocks: Vec<_> = (0..5).map(|_| cache.alloc(0, 4096).unwrap()).collect();
    let ids: Vec<u64> = blocks.iter().map(|b| b.id).collect();
    drop(blocks); // returned in order: the first ones are the oldest
    let s = cache.stats();
    assert_eq!(
        s.bytes_cached, 8192,
        "two 4 KiB blocks fit under 10 000 bytes"
    );
    assert!(s.high_water_mark <= 10_000);
    assert_eq!(s.released, 3);
    assert_eq!(ledger.live(), 2);
    // The two most recently returned survive, and the most recent is served first.
    assert_eq!(cache.alloc(0, 4096).unwrap().id, ids[4]);
    let freed = ledger.freed.lock().unwrap().clone();
    assert_eq!(freed, ids[..3].iter().copied().collect());
    // A total smaller than a cacheable block keeps nothing.
    let (tiny, tiny_ledger) = ledger_cache(4096, 2000);
    drop(tiny.alloc(0, 4096).unwrap());
    assert_eq!(tiny.stats().bytes_cached, 0);
    assert_eq!(tiny_ledger.live(), 0);
}

#[test]
fn lowering_the_limits_frees_what_no_longer_fits() {
    let (cache, ledger) = ledger_cache(1 << 20, 1 << 30);
    let blocks: Vec<_> = [1 << 20, 4096, 4096]
        .into_iter()
        .map(|n| cache.alloc(0, n).unwrap())
        .collect();
    drop(blocks);
    assert_eq!(cache.stats().bytes_cached, (1 << 20) + 8192);
    cache.set_limits(Limits {
        max_cacheable_length: 8192,
        max_cache: 4096,
    });
    let s = cache.stats();
    assert_eq!((s.bytes_cached, s.blocks_cached), (4096, 1));
    assert_eq!(ledger.live(), 1);
}

#[test]
fn trim_frees_every_cached_block_and_leaves_buffers_in_use() {
    let (cache, ledger) = ledger_cache(1 << 20, 1 << 30);
    let kept = cache.alloc(0, 300).unwrap();
    for n in [1000, 2000, 3000] {
        drop(cache.alloc(0, n).unwrap());
    }
    let cached = cache.stats().bytes_cached;
    assert_eq!(cached, 1024 + 2048 + 3072);
    assert_eq!(cache.trim(), cached);
    assert_eq!(ledger.live(), 1, "only the buffer in use is left");
    let s = cache.stats();
    assert_eq!((s.bytes_cached, s.blocks_cached), (0, 0));
    assert_eq!(s.high_water_mark, cached, "the high-water mark stays");
    drop(kept);
    assert_eq!(
        cache.stats().blocks_cached,
        1,
        "a buffer in use still comes back"
    );
}

#[test]
fn stats_count_hits_misses_bytes_and_the_high_water_mark() {
    let (cache, _ledger) = ledger_cache(1 << 20, 1 << 30);
    let a = cache.alloc(0, 4096).unwrap();
    let b = cache.alloc(0, 4096).unwrap();
    drop((a, b));
    let c = cache.alloc(0, 4096).unwrap();
    let s = cache.stats();
    assert_eq!(
        s,
        CacheStats {
            hits: 1,
            misses: 2,
            uncacheable: 0,
            returned: 2,
            released: 0,
            bytes_cached: 4096,
            blocks_cached: 1,
            high_water_mark: 8192,
            limits: cache.limits(),
        }
    );
    let text = s.to_string();
    assert!(text.starts_with("1 hits, 2 misses"), "{text}");
    drop(c);
}

#[test]
fn eight_threads_allocating_and_freeing_lose_and_share_no_block() {
    // A total that forces evictions, a cacheable length that some requests exceed.
    let (cache, ledger) = ledger_cache(64 << 10, 256 << 10);
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    const ROUNDS: u64 = 3000;
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (cache, in_use) = (Arc::clone(&cache), Arc::clone(&in_use));
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for _ in 0..ROUNDS {
                    // xorshift: sizes from 1 byte to 96 KiB, 1 to 4 blocks held at once.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let bytes = (x % (96 << 10)) as usize + 1;
                    let b = cache.alloc((x % 2) as u8, bytes).unwrap();
                    assert!(b.bytes >= bytes && b.kind == (x % 2) as u8);
                    assert!(
                        in_use.lock().unwrap().insert(b.id),
                        "block {} handed to two users",
                        b.id
                    );
                    held.push(b);
                    if held.len() > (x % 4) as usize {
                        let b = held.swap_remove(0);
                        in_use.lock().unwrap().remove(&b.id);
                        drop(b);
                    }
                }
                for b in held {
                    in_use.lock().unwrap().remove(&b.id);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no thread panicked");
    }
    let s = cache.stats();
    assert_eq!(s.hits + s.misses, 8 * ROUNDS, "every request counted once");
    assert_eq!(s.misses, ledger.allocated.load(Ordering::SeqCst));
    assert!(s.hits > 0, "blocks were reused");
    assert!(
        s.high_water_mark <= 256 << 10,
        "the total held under contention"
    );
    assert_eq!(
        ledger.live(),
        s.blocks_cached,
        "every live block is in the cache"
    );
    cache.trim();
    assert_eq!(ledger.live(), 0, "nothing lost");
    // Every block allocated was freed exactly once (the ledger panics on a second free).
    assert_eq!(
        ledger.freed.lock().unwrap().len() as u64,
        ledger.allocated.load(Ordering::SeqCst)
    );
}

#[test]
fn host_arrays_come_back_as_typed_storage() {
    let cache = Arc::new(Cache::new(
        HostAlloc::default(),
        Limits {
            max_cacheable_length: 1 << 20,
            max_cache: 16 << 20,
        },
    ));
    let a = cache.array(DType::F32, Shape::new([10, 100])).unwrap();
    assert!(a.has_home());
    assert_eq!((a.dtype(), a.len()), (DType::F32, 1000));
    assert!(
        a.as_slice::<f32>().unwrap().iter().all(|&v| v == 0.0),
        "fresh is zero"
    );
    let ptr = a.storage().as_ptr();
    let b = a.clone();
    assert!(!b.has_home(), "a copy is the caller's own");
    drop(a);
    let c = cache.array(DType::F32, Shape::new([900])).unwrap();
    assert_eq!(c.storage().as_ptr(), ptr, "the same Vec, shortened");
    assert_eq!(c.len(), 900);
    let d = cache.array(DType::I32, Shape::new([1000])).unwrap();
    assert_ne!(d.storage().as_ptr(), ptr);
    // Reshaping keeps the home.
    let e = c.reshaped(Shape::new([30, 30])).unwrap();
    drop((b, d, e));
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (1, 2, 2));
}

/// Whether this kernel gives huge pages to memory that asks (`always` or `madvise`).
fn thp_available() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| !s.contains("[never]"))
}

#[test]
fn large_fresh_host_buffers_ask_for_huge_pages() {
    let raw = HostAlloc::default();
    let small = raw.alloc(DType::F32, HUGE_PAGE_MIN_BYTES - 4).unwrap();
    assert_eq!(raw.huge_page_bytes(), 0, "small buffers do not ask");
    let big = raw.alloc(DType::F32, 64 << 20).unwrap();
    if thp_available() {
        assert_eq!(raw.huge_page_bytes(), 64 << 20);
    } else {
        eprintln!("transparent huge pages are off here: the advice is refused");
    }
    assert_eq!(big.len(), 16 << 20);
    drop((small, big));
}

/// The executor tests share the process's host cache: they run one at a time.
static HOST_CACHE_USERS: Mutex<()> = Mutex::new(());

fn input(ctx: &Context, n: usize, seed: u64) -> Tensor {
    ctx.rand_uniform(&[n], -1.0, 1.0, seed)
}

#[test]
fn a_second_eval_of_the_same_graph_writes_into_the_first_ones_buffer() {
    let _one = HOST_CACHE_USERS.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = Context::new();
    let x = input(&ctx, 100_003, 1);
    let y = (&x * 2.0 + 1.0).exp();
    let first = y.eval().unwrap();
    let want = first.to_vec::<f32>().unwrap();
    let ptr = first.as_host().storage().as_ptr();
    assert!(
        first.as_host().has_home(),
        "the output came from the host cache"
    );
    drop(first);
    let before = ctx.cache_stats();
    let second = y.eval().unwrap();
    let after = ctx.cache_stats();
    assert_eq!(second.as_host().storage().as_ptr(), ptr, "the same buffer");
    assert!(after.hits > before.hits);
    assert_eq!(after.misses, before.misses, "no fresh allocation");
    assert_eq!(second.to_vec::<f32>().unwrap(), want);
}

#[test]
fn intermediates_go_back_before_the_eval_returns_and_results_stay_the_same() {
    let _one = HOST_CACHE_USERS.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = Context::new();
    let x = input(&ctx, 50_000, 2);
    // A whole-array sum feeds an element-wise kernel: two kernels, one intermediate.
    let y = &x / x.abs().sum(..) * 1000.0;
    host_cache().trim();
    let (out, report) = ctx.eval_report(&[&y]).unwrap();
    assert!(report.kernel_count() >= 2, "{}", report.kernels_text());
    let fresh = out[0].to_vec::<f32>().unwrap();
    assert!(
        ctx.cache_stats().blocks_cached >= 1,
        "the intermediate went back while the output is still held"
    );
    drop(out);
    // Fill the cache with buffers holding other values, then evaluate again: recycled
    // memory must not change a bit of the result.
    let noise = (input(&ctx, 50_000, 3) * 7.0 + 3.0).exp();
    drop(noise.eval().unwrap());
    let before = ctx.cache_stats();
    let again = y.eval().unwrap().to_vec::<f32>().unwrap();
    assert!(ctx.cache_stats().hits > before.hits);
    assert_eq!(
        again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        fresh.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
