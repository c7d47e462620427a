//! Concurrency stress (issue 18, item 5): 8 threads share one CPU `Context` (and its
//! device set) and evaluate a mix of graphs (element-wise chains, reductions over
//! either axis, softmax, gelu(x @ w + b)) over a pool of shapes larger than the
//! compiled-code caches, set small through the config keys
//! (`max_kernel_cache_entries`, `max_kernel_cache`, `max_graph_cache_entries`), so
//! that kernels and graphs are evicted and recompiled all the time (the keys go through
//! the process environment, which every eval reads). Checked: every
//! result equals the interpreter's (an `interp` context on the same device set); the
//! caches' entries and bytes, sampled every 20 ms, never exceed the limits; resident
//! memory after warm-up stays within a fixed margin; and progress never stops for
//! `STALL` (the test thread is the watchdog: a deadlock fails the test with a message,
//! it does not hang CI).
//!
//! Runs `STRESS_SECS` seconds (default 20). One test in this file: the caches
//! are the process's.

use ndfuse::{BackendKind, Context, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const STALL: Duration = Duration::from_secs(30);
/// Resident growth allowed after warm-up: the host buffer cache and allocator arenas
/// settle within it; a leak of compiled code per shape (~30 KB each) over thousands of
/// evaluations does not.
const RSS_MARGIN: u64 = 48 << 20;

/// Resident memory, bytes (`/proc/self/statm`, second field, in pages).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    pages * 4096
}

fn shapes() -> Vec<[usize; 2]> {
    let mut v = Vec::new();
    for r in [1, 3, 8, 17, 33] {
        for c in [1, 5, 16, 31, 64, 100] {
            v.push([r, c]);
        }
    }
    v
}

/// Case `kind` at `shape` built in `ctx` (inputs from seeds, so both contexts agree).
fn case(ctx: &Context, kind: usize, [r, c]: [usize; 2], seed: u64) -> Tensor {
    let x = ctx.rand_uniform(&[r, c], -2.0, 2.0, seed);
    match kind % 6 {
        0 => (x.exp() * 0.5 + 1.0).tanh(),
        1 => x.softmax(-1),
        2 => x.sum(0) + x.max(0),
        3 => x.mean(1).sqrt(),
        4 => {
            let w = ctx.rand_uniform(&[c, 7], -1.0, 1.0, seed + 1);
            let b = ctx.rand_uniform(&[7], -1.0, 1.0, seed + 2);
            (x.matmul(&w) + &b).gelu()
        }
        _ => x.log_softmax(0).abs().sum(1),
    }
}

fn equal(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-4 * (1.0 + w.abs()))
}

#[test]
fn eight_threads_share_one_context_under_small_caches() {
    let secs: u64 = std::env::var("STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    // Through the process's environment: every eval loads the configuration (a
    // context's own `Config` only gives its default dtype). This file's one test owns
    // the process.
    for (key, value) in [
        ("NDFUSE_MAX_KERNEL_CACHE_ENTRIES", "12".to_string()),
        ("NDFUSE_MAX_KERNEL_CACHE", (96 << 10).to_string()),
        ("NDFUSE_MAX_GRAPH_CACHE_ENTRIES", "6".to_string()),
    ] {
        std::env::set_var(key, value);
    }
    let cpu = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("cpu context");
    let interp = Context::builder()
        .backend(BackendKind::Interp)
        .devices(cpu.devices().expect("devices"))
        .build()
        .expect("interp context");

    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let shapes = shapes();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cpu, interp) = (cpu.clone(), interp.clone());
            let (progress, stop, failures) = (progress.clone(), stop.clone(), failures.clone());
            let shapes = shapes.clone();
            std::thread::spawn(move || {
                let mut i = t * 7;
                while !stop.load(Ordering::Relaxed) {
                    let kind = i % 6;
                    let shape = shapes[(i * 13 + t) % shapes.len()];
                    let seed = (i % 50) as u64;
                    let got = cpu.eval(&[&case(&cpu, kind, shape, seed)]);
                    let want = interp.eval(&[&case(&interp, kind, shape, seed)]);
                    match (got, want) {
                        (Ok(g), Ok(w)) if equal(&g[0].to_f64_vec(), &w[0].to_f64_vec()) => {}
                        (g, w) => failures.lock().unwrap().push(format!(
                            "thread {t}: case {kind} at {shape:?}: cpu {:?} vs interp {:?}",
                            g.map(|a| a[0].to_f64_vec()),
                            w.map(|a| a[0].to_f64_vec())
                        )),
                    }
                    progress.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();

    // The test thread: sampler and watchdog.
    let start = Instant::now();
    let warm_up = Duration::from_secs(secs / 3);
    let (mut last, mut last_change) = (0, Instant::now());
    let mut rss_after_warm_up: Option<u64> = None;
    let mut rss_max = 0;
    let mut samples = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(20));
        let s = cpu.compile_cache_stats();
        samples += 1;
        for (what, c) in [("kernels", s.kernels), ("graphs", s.graphs)] {
            assert!(
                c.entries <= c.max_entries && c.bytes <= c.max_bytes,
                "{what} cache above its limits: {c}"
            );
        }
        let now = progress.load(Ordering::Relaxed);
        if now != last {
            (last, last_change) = (now, Instant::now());
        } else if last_change.elapsed() > STALL {
            stop.store(true, Ordering::Relaxed);
            panic!(
                "no evaluation finished for {STALL:?} after {now}: deadlock? (the workers are left behind)"
            );
        }
        if start.elapsed() >= warm_up {
            let rss = resident();
            rss_after_warm_up.get_or_insert(rss);
            rss_max = rss_max.max(rss);
        }
        let f = failures.lock().unwrap();
        assert!(f.is_empty(), "wrong results: {f:#?}");
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let f = failures.lock().unwrap();
    assert!(f.is_empty(), "wrong results: {f:#?}");
    let s = cpu.compile_cache_stats();
    let base = rss_after_warm_up.expect("sampled after warm-up");
    eprintln!(
        "{} evaluations on {THREADS} threads in {:?}, {samples} samples; rss {} -> max {} MiB\n{s}",
        progress.load(Ordering::Relaxed),
        start.elapsed(),
        base >> 20,
        rss_max >> 20
    );
    assert!(
        s.kernels.evictions > 0 && s.graphs.evictions > 0,
        "the caches evicted: {s}"
    );
    assert!(
        rss_max <= base + RSS_MARGIN,
        "resident memory grew from {} to {} MiB after warm-up",
        base >> 20,
        rss_max >> 20
    );
}
