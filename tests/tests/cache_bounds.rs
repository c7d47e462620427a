//! Issue 18, third row: one `Context` evaluating `softmax(x, -1).sum(1)` over ever new
//! shapes keeps its memory bounded. Kernels are specialised per shape, so each shape
//! compiles new kernels and a new graph; the compiled-code caches evict the least
//! recently used beyond their limits, and an evicted kernel's machine code is unmapped.
//!
//! Small limits here, so that the debug build evicts within a few hundred shapes. The
//! full run of the issue (20,000 shapes, default limits, release build):
//! `CACHE_BOUNDS_SHAPES=20000 CACHE_BOUNDS_DEFAULTS=1 cargo test --release -p
//! ndfuse-tests --test cache_bounds -- --nocapture`.
//!
//! One test in this file: the caches are the process's, shared by every test thread.

use ndfuse::{BackendKind, Context};
use std::time::Instant;

/// Resident memory of this process, bytes (`VmRSS` of `/proc/self/status`).
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// Bytes of anonymous executable mappings of this process: where cranelift-jit puts
/// machine code. An evicted kernel whose code were not unmapped would keep its pages
/// for ever.
fn code_mapped() -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("Linux /proc");
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // address perms offset device inode, and no path: anonymous.
            if f.len() != 5 || !f[1].starts_with("r-x") {
                return None;
            }
            let (lo, hi) = f[0].split_once('-')?;
            let lo = u64::from_str_radix(lo, 16).ok()?;
            Some(u64::from_str_radix(hi, 16).ok()? - lo)
        })
        .sum()
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok()
}

/// The `i`-th shape: all distinct, small (at most 8 x 2,600 elements).
fn shape(i: usize) -> [usize; 2] {
    [1 + i % 8, 1 + i / 8]
}

#[test]
fn new_shapes_forever_keep_memory_bounded() {
    let rss_start = resident();
    let shapes = env_usize("CACHE_BOUNDS_SHAPES").unwrap_or(3000);
    let defaults = std::env::var("CACHE_BOUNDS_DEFAULTS").is_ok_and(|v| v == "1");
    let (kernel_cap, kernel_bytes, graph_cap): (u64, u64, u64) = if defaults {
        (1024, 64 << 20, 256)
    } else {
        // The byte limit binds first: 16 kernels of one page.
        (24, 64 << 10, 16)
    };
    // Every eval reads its configuration from the environment (the context's own
    // configuration only gives its dtype); this is the file's only test, set before
    // any eval.
    for (key, value) in [
        ("NDFUSE_MAX_KERNEL_CACHE_ENTRIES", kernel_cap.to_string()),
        ("NDFUSE_MAX_KERNEL_CACHE", kernel_bytes.to_string()),
        ("NDFUSE_MAX_GRAPH_CACHE_ENTRIES", graph_cap.to_string()),
    ] {
        std::env::set_var(key, value);
    }
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("a CPU context");

    let eval = |i: usize| {
        let [r, c] = shape(i);
        let x = ctx.rand_uniform(&[r, c], -1.0, 1.0, i as u64);
        let y = x.softmax(-1).sum(1);
        let out = ctx.eval(&[&y]).expect("eval");
        let v = out[0].to_f64_vec();
        assert_eq!(v.len(), r);
        for s in v {
            // Each row of a softmax sums to one.
            assert!((s - 1.0).abs() < 1e-4, "shape {r}x{c}: row sums to {s}");
        }
    };

    // Warm-up: past the caps, so that the caches are full and evicting, and the
    // allocator has its working set.
    let warm = shapes.min(if defaults { 2000 } else { 200 });
    for i in 0..warm {
        eval(i);
    }
    let (rss0, maps0) = (resident(), code_mapped());
    let start = Instant::now();
    let (mut rss_max, mut maps_max) = (rss0, maps0);
    for i in warm..shapes {
        eval(i);
        let s = ctx.compile_cache_stats();
        assert!(
            s.kernels.entries <= kernel_cap && s.graphs.entries <= graph_cap,
            "after shape {i}: {s}"
        );
        if i % 50 == 0 {
            rss_max = rss_max.max(resident());
            maps_max = maps_max.max(code_mapped());
        }
    }
    let took = start.elapsed();
    // What eviction costs: shapes evicted long ago compile again (and give the same
    // answers), against shapes still cached.
    let k = 8;
    let timed = |range: std::ops::Range<usize>| {
        let t = Instant::now();
        range.for_each(eval);
        t.elapsed().as_secs_f64() * 1e3 / k as f64
    };
    let hit_ms = timed(shapes - k..shapes);
    let miss_ms = timed(0..k);
    let s = ctx.compile_cache_stats();
    let (rss1, maps1) = (resident(), code_mapped());
    rss_max = rss_max.max(rss1);
    maps_max = maps_max.max(maps1);
    let per_shape = took.as_secs_f64() * 1e3 / (shapes - warm).max(1) as f64;
    println!(
        "{shapes} shapes ({warm} warm-up): resident {:.1} MB at the start, {:.1} -> {:.1} MB (peak {:.1} MB), \
         code mapped {} -> {} KiB (peak {} KiB); {per_shape:.3} ms a shape after \
         warm-up; re-evaluating a cached shape {hit_ms:.3} ms, an evicted one {miss_ms:.3} ms\n{s}",
        rss_start as f64 / 1e6,
        rss0 as f64 / 1e6,
        rss1 as f64 / 1e6,
        rss_max as f64 / 1e6,
        maps0 >> 10,
        maps1 >> 10,
        maps_max >> 10,
    );
    assert!(
        s.kernels.evictions > 0 && s.graphs.evictions > 0,
        "the caches never evicted: {s}"
    );
    assert!(s.kernels.high_water_entries <= kernel_cap, "{s}");
    assert!(s.graphs.high_water_entries <= graph_cap, "{s}");
    // The byte limit holds, but for a single kernel larger than it (kept alone).
    assert!(s.kernels.bytes <= kernel_bytes, "{s}");
    // Evicted kernels' code is unmapped: the JIT's mappings grow by no more than the
    // code the cache holds.
    assert!(
        maps_max <= maps0 + kernel_bytes,
        "code mappings grew from {maps0} to {maps_max} bytes: evicted code is not freed"
    );
    // The ceiling: far less than 64 MB above the start whatever the shapes
    // (without eviction the same loop grows by about 29 KB a shape).
    let ceiling = if defaults { 64 << 20 } else { 8 << 20 };
    assert!(
        rss_max < rss0 + ceiling,
        "resident memory grew from {:.1} MB to {:.1} MB over {} shapes",
        rss0 as f64 / 1e6,
        rss_max as f64 / 1e6,
        shapes - warm
    );
}
