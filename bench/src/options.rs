//! How the suite runs: which shapes, how many timed runs, which backend, and what a
//! case measures.

use ndfuse::BackendKind;
use std::time::Duration;

/// Which shapes the suite runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// The shapes of the issue: 16M-element vectors, 4096x4096 matrices, ...
    Full,
    /// Small shapes of the same cases: the suite in well under a second, for tests.
    Tiny,
}

/// How the suite runs.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Full or tiny shapes.
    pub size: Size,
    /// The most timed runs of a case (after one warm-up run); a case timed in turns
    /// with a peer, or a matrix product's, takes three times as many, all of them.
    pub max_runs: usize,
    /// A case stops early once it has run this long and at least `min_runs` times,
    /// so that slow cases do not take minutes.
    pub time_budget: Duration,
    /// The fewest timed runs of a case (capped by `max_runs`).
    pub min_runs: usize,
    /// Bytes of each of the three STREAM arrays.
    pub stream_array_bytes: usize,
    /// STREAM trials; the best of them is reported, as STREAM does.
    pub stream_trials: usize,
    /// Bytes of the buffer the read-only bandwidth sums (its trials are
    /// `stream_trials`).
    pub read_bytes: usize,
    /// The backend of the cases.
    pub backend: BackendKind,
    /// Iterations of the compute-peak loops per thread and trial (24 vector operations
    /// each: 12 chains of a multiply and an add); their trials are `stream_trials`.
    pub peak_iterations: u64,
}

impl Default for BenchOptions {
    /// Full shapes, at most 10 runs or about 1 s a case, 3 x 64 MiB STREAM arrays, a
    /// 256 MiB read-only buffer.
    fn default() -> BenchOptions {
        BenchOptions {
            size: Size::Full,
            max_runs: 10,
            time_budget: Duration::from_secs(1),
            min_runs: 3,
            // Far beyond the L2 of the development machine; its nominal L3 (260 MiB,
            // shared with the whole host) gave the same triad from 32 MiB to 512 MiB.
            stream_array_bytes: 64 << 20,
            stream_trials: 5,
            // A 64M-element f32 buffer, the `sum` case's input.
            read_bytes: 256 << 20,
            backend: BackendKind::Auto,
            // About 10-30 ms a trial on the development machine.
            peak_iterations: 1 << 22,
        }
    }
}

impl BenchOptions {
    /// Tiny shapes, 3 runs, 1 MiB STREAM arrays and read buffer: the whole suite in a
    /// moment.
    pub fn tiny() -> BenchOptions {
        BenchOptions {
            size: Size::Tiny,
            max_runs: 3,
            time_budget: Duration::ZERO,
            min_runs: 1,
            stream_array_bytes: 1 << 20,
            stream_trials: 2,
            read_bytes: 1 << 20,
            backend: BackendKind::Auto,
            peak_iterations: 1 << 12,
        }
    }
}

/// What a case measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Time of a warm evaluation (kernels cached) against the bytes it must move.
    Throughput,
    /// First evaluation of a graph never seen before: passes, JIT and run.
    CompileNew,
    /// Re-evaluation of a graph whose kernels are cached: the fixed overhead.
    Cached,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Throughput => "throughput",
            Kind::CompileNew => "compile_new",
            Kind::Cached => "cached",
        }
    }
}
