//! The bound on the compiled-code caches (CPU kernels, compiled graphs, CUDA modules):
//! least-recently-used eviction by entry count and bytes, and the counters
//! `ndfuse backends` shows.
//!
//! Kernels are specialised per shape, so a program fed ever new shapes compiles ever
//! new kernels; without a bound every one of them, and its machine code, stayed for
//! the life of the process (issue 18: 29 KB per shape, 8 MB -> 584 MB over 20,000
//! shapes). Beyond the limits a shape seen again is compiled again.

use crate::config::Config;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The clock of every cache's recency: one tick per use, process-wide.
static CLOCK: AtomicU64 = AtomicU64::new(1);

fn now() -> u64 {
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// When an entry was last used. Shared with holders that use the entry without a
/// look-up (a compiled graph remembers its kernels), so that such uses keep the entry
/// recent without taking the cache's lock.
#[derive(Clone, Debug)]
pub(crate) struct Recency(Arc<AtomicU64>);

impl Recency {
    fn new() -> Recency {
        Recency(Arc::new(AtomicU64::new(now())))
    }

    /// Marks the entry used now.
    pub(crate) fn touch(&self) {
        self.0.store(now(), Ordering::Relaxed);
    }

    fn at(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A cache's limits: at most `entries` entries and `bytes` bytes. The entry just
/// inserted is always kept, even when it alone is larger than `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeCacheLimits {
    /// The most entries held at once.
    pub entries: u64,
    /// The most bytes held at once (`u64::MAX`: no byte limit, for caches whose entries'
    /// sizes are not known).
    pub bytes: u64,
}

impl CodeCacheLimits {
    /// The kernel caches' limits (`max_kernel_cache_entries`, `max_kernel_cache`): CPU
    /// kernels, and each CUDA device's loaded modules.
    pub fn kernels(cfg: &Config) -> CodeCacheLimits {
        CodeCacheLimits {
            entries: cfg.max_kernel_cache_entries().into(),
            bytes: cfg.max_kernel_cache(),
        }
    }

    /// The graph cache's limits (`max_graph_cache_entries`; graphs have no byte size).
    pub fn graphs(cfg: &Config) -> CodeCacheLimits {
        CodeCacheLimits {
            entries: cfg.max_graph_cache_entries().into(),
            bytes: u64::MAX,
        }
    }
}

/// What a compiled-code cache did since the process started and holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeCacheStats {
    /// Look-ups that found the entry.
    pub hits: u64,
    /// Look-ups that did not (each is followed by a compile).
    pub misses: u64,
    /// Look-ups that did not find the entry but ran the code of a compiled member of
    /// its shape family instead of compiling (CPU kernels: `kernel_families`); not
    /// counted in `misses`.
    pub rebound: u64,
    /// Entries dropped to stay within the limits (their code is freed once the last
    /// evaluation using them finishes).
    pub evictions: u64,
    /// Entries held now.
    pub entries: u64,
    /// Bytes held now (0 for a cache without sizes).
    pub bytes: u64,
    /// The most entries ever held at once.
    pub high_water_entries: u64,
    /// The most bytes ever held at once.
    pub high_water_bytes: u64,
    /// The limits in force (zero before the first evaluation sets them).
    pub max_entries: u64,
    /// The byte limit in force (`u64::MAX`: none).
    pub max_bytes: u64,
}

impl fmt::Display for CodeCacheStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hits, {} misses, {}{} evictions; {} entr{} held (high-water {})",
            self.hits,
            self.misses,
            if self.rebound > 0 {
                format!("{} rebound to a family's code, ", self.rebound)
            } else {
                String::new()
            },
            self.evictions,
            self.entries,
            if self.entries == 1 { "y" } else { "ies" },
            self.high_water_entries,
        )?;
        if self.max_bytes != u64::MAX {
            write!(
                f,
                ", {} (high-water {})",
                kib(self.bytes),
                kib(self.high_water_bytes)
            )?;
        }
        write!(f, "; limits: {} entries", self.max_entries)?;
        if self.max_bytes != u64::MAX {
            write!(f, ", {}", kib(self.max_bytes))?;
        }
        Ok(())
    }
}

fn kib(bytes: u64) -> String {
    format!("{:.1} KiB", bytes as f64 / 1024.0)
}

/// The compiled-code caches' statistics: CPU kernels and compiled graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileCacheStats {
    /// Compiled CPU kernels, by kernel description; bytes are their machine code.
    pub kernels: CodeCacheStats,
    /// Compiled graphs (passes, fusion, schedule), by graph and options; no bytes.
    pub graphs: CodeCacheStats,
}

impl fmt::Display for CompileCacheStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernels: {}\ngraphs:  {}", self.kernels, self.graphs)
    }
}

struct Slot<V> {
    value: V,
    bytes: u64,
    used: Recency,
}

/// A map with least-recently-used eviction, bounded by entries and bytes. Not
/// synchronised: each cache keeps one behind its own mutex.
pub(crate) struct Lru<K, V> {
    map: HashMap<K, Slot<V>, rustc_hash::FxBuildHasher>,
    bytes: u64,
    limits: CodeCacheLimits,
    stats: CodeCacheStats,
}

impl<K, V> Lru<K, V> {
    /// The statistics, with the entries and bytes held now.
    pub(crate) fn stats(&self) -> CodeCacheStats {
        CodeCacheStats {
            entries: self.map.len() as u64,
            bytes: self.bytes,
            max_entries: self.limits.entries,
            max_bytes: self.limits.bytes,
            ..self.stats
        }
    }
}

impl<K, V> fmt::Debug for Lru<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lru").field("stats", &self.stats()).finish()
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// An empty cache with `limits`.
    pub(crate) fn new(limits: CodeCacheLimits) -> Lru<K, V> {
        Lru {
            map: HashMap::default(),
            bytes: 0,
            limits,
            stats: CodeCacheStats::default(),
        }
    }

    /// Sets the limits, evicting at once what no longer fits.
    pub(crate) fn set_limits(&mut self, limits: CodeCacheLimits) {
        if limits != self.limits {
            self.limits = limits;
            self.evict_to_fit(None);
        }
    }

    /// The entry for `key`, marked used, and its recency handle; counts a hit or a miss.
    pub(crate) fn get(&mut self, key: &K) -> Option<(&V, &Recency)> {
        match self.map.get(key) {
            Some(slot) => {
                slot.used.touch();
                self.stats.hits += 1;
                Some((&slot.value, &slot.used))
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The entry for `key`, marked used, without counting a look-up (the caller decides
    /// with [`Self::count`] whether what it looked for was there).
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.map.get_mut(key).map(|slot| {
            slot.used.touch();
            &mut slot.value
        })
    }

    /// Counts a look-up made with [`Self::get_mut`] as a hit or a miss.
    pub(crate) fn count(&mut self, hit: bool) {
        if hit {
            self.stats.hits += 1;
        } else {
            self.stats.misses += 1;
        }
    }

    /// Counts the last miss as a look-up served by another entry's code instead
    /// ([`CodeCacheStats::rebound`]).
    pub(crate) fn count_rebound(&mut self) {
        self.stats.misses = self.stats.misses.saturating_sub(1);
        self.stats.rebound += 1;
    }

    /// Inserts `value` of `bytes` bytes under `key` unless an entry is already there
    /// (another thread compiled the same meanwhile), then evicts the least recently
    /// used entries until the limits hold; the entry for `key` is never evicted by its
    /// own insertion. Returns the entry held and its recency handle.
    pub(crate) fn insert(&mut self, key: K, value: V, bytes: u64) -> (&V, &Recency) {
        if !self.map.contains_key(&key) {
            self.bytes = self.bytes.saturating_add(bytes);
            self.map.insert(
                key.clone(),
                Slot {
                    value,
                    bytes,
                    used: Recency::new(),
                },
            );
        }
        self.evict_to_fit(Some(&key));
        let st = &mut self.stats;
        st.high_water_entries = st.high_water_entries.max(self.map.len() as u64);
        st.high_water_bytes = st.high_water_bytes.max(self.bytes);
        let slot = self
            .map
            .get(&key)
            .expect("the entry just inserted is never evicted by its own insertion");
        slot.used.touch();
        (&slot.value, &slot.used)
    }

    /// Drops least recently used entries, never `keep`, until the limits hold (or only
    /// `keep` is left).
    fn evict_to_fit(&mut self, keep: Option<&K>) {
        let over =
            |s: &Self| s.map.len() as u64 > s.limits.entries.max(1) || s.bytes > s.limits.bytes;
        while over(self) {
            // A scan: caches hold at most a few thousand entries, and an eviction follows
            // a compile that costs a thousand times more. (Keys are cloned only here.)
            let oldest = self
                .map
                .iter()
                .filter(|(k, _)| Some(*k) != keep)
                .min_by_key(|(_, s)| s.used.at())
                .map(|(k, _)| k.clone());
            let Some(slot) = oldest.and_then(|k| self.map.remove(&k)) else {
                break;
            };
            self.bytes = self.bytes.saturating_sub(slot.bytes);
            self.stats.evictions += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(entries: u64, bytes: u64) -> CodeCacheLimits {
        CodeCacheLimits { entries, bytes }
    }

    #[test]
    fn evicts_the_least_recently_used_by_count_and_bytes() {
        let mut c: Lru<u32, &str> = Lru::new(limits(2, 100));
        c.insert(1, "a", 10);
        c.insert(2, "b", 10);
        assert!(c.get(&1).is_some()); // 2 is now the oldest
        c.insert(3, "c", 10);
        assert!(c.get(&2).is_none() && c.get(&1).is_some() && c.get(&3).is_some());
        // 95 bytes: 1 and 3 (20 bytes) cannot both stay; the older goes.
        c.insert(4, "d", 85);
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.evictions), (2, 95, 2), "{s}");
        assert!(c.get(&1).is_none() && c.get(&3).is_some());
        assert_eq!((s.hits, s.misses), (3, 1));
    }

    #[test]
    fn keeps_an_entry_larger_than_the_byte_limit_alone() {
        let mut c: Lru<u32, ()> = Lru::new(limits(8, 100));
        c.insert(1, (), 10);
        c.insert(2, (), 500);
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.evictions), (1, 500, 1), "{s}");
        // A lower limit evicts at once; a recency touch from outside counts.
        c.insert(3, (), 1);
        let (_, used) = c.insert(4, (), 1);
        let used = used.clone();
        c.get(&3);
        used.touch();
        c.set_limits(limits(1, 100));
        assert!(c.get(&4).is_some() && c.get(&3).is_none());
        assert_eq!(c.stats().entries, 1);
    }
}
