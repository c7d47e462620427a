//! The suite's results as a text table and as one JSON object.

use crate::options::{Kind, Size};
use crate::peak::ComputePeak;
use crate::run::BenchReport;
use crate::training::{ParallelRow, StepRow, TrainingRow};
use std::fmt::Write as _;

/// A training row as JSON (snake_case keys; `kind` is `step` or `parallel`).
fn training_json(row: &TrainingRow) -> serde_json::Value {
    match row {
        TrainingRow::Step(r) => serde_json::json!({
            "name": r.name,
            "kind": "step",
            "model": r.model,
            "batch": r.batch,
            "backend": r.backend,
            "kernels": r.kernels,
            "runs": r.runs,
            "median_ms": r.median_ms,
            "min_ms": r.min_ms,
            "flops": r.flops,
            "gflops": r.gflops,
            "fraction_of_fma_peak": r.fma_peak_fraction,
            "allocations_per_step": r.allocations_per_step,
            "loss": r.loss,
        }),
        TrainingRow::Parallel(r) => serde_json::json!({
            "name": r.name,
            "kind": "parallel",
            "model": r.model,
            "workers": r.workers,
            "threads_per_worker": r.threads_per_worker,
            "averaging_frequency": r.frequency,
            "batch_per_worker": r.batch,
            "samples": r.samples,
            "runs": r.runs,
            "samples_per_sec": r.samples_per_sec,
            "scaling_efficiency": r.efficiency,
            "rounds": r.rounds,
            "averaging_ms_per_round": r.averaging_ms_per_round,
            "busy_fraction": r.busy_fraction,
            "loss": r.loss,
        }),
    }
}

/// A multiply/add probe as JSON; `flops_per_s` are its lane operations a second.
fn compute_json(c: &ComputePeak) -> serde_json::Value {
    serde_json::json!({
        "isa": c.isa,
        "lanes": c.lanes,
        "chains": c.chains,
        "trials": c.trials,
        "threads": c.threads,
        "vector_ops_per_s_1t": c.ops_1t,
        "vector_ops_per_s": c.ops_all,
        "flops_per_s_1t": c.flops_1t(),
        "flops_per_s": c.flops_all(),
    })
}

/// `1 step`, `3 steps`.
fn counted(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The step row's line of the training block.
fn step_line(r: &StepRow) -> String {
    format!(
        "{}: {} on batch {} ({}), forward + backward + Adam: median {:.2} ms, min {:.2} ms over {}; {:.1} GFLOP/s ({:.3} GFLOP of products), {} of the FMA peak (target 50%); {} kernels; {:.2} host allocations per step (target 0)",
        r.name,
        r.model,
        r.batch,
        r.backend,
        r.median_ms,
        r.min_ms,
        counted(r.runs, "step"),
        r.gflops,
        r.flops / 1e9,
        r.fma_peak_fraction
            .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
        r.kernels,
        r.allocations_per_step
    )
}

/// A parallel row's line of the training block.
fn parallel_line(r: &ParallelRow) -> String {
    let busy: Vec<String> = r
        .busy_fraction
        .iter()
        .map(|b| format!("{:.0}%", b * 100.0))
        .collect();
    format!(
        "{}: {} worker{} x {} thread{}, frequency {}, batch {} per worker, {} samples an epoch: {:.0} samples/s (median of {}), scaling efficiency {} per thread against 1 worker of 1 thread (target 85% at 2 workers); averaging {:.2} ms per round over {}; busy {}",
        r.name,
        r.workers,
        if r.workers == 1 { "" } else { "s" },
        r.threads_per_worker,
        if r.threads_per_worker == 1 { "" } else { "s" },
        r.frequency,
        r.batch,
        r.samples,
        r.samples_per_sec,
        counted(r.runs, "epoch"),
        r.efficiency
            .map_or_else(|| "-".into(), |e| format!("{:.1}%", e * 100.0)),
        r.averaging_ms_per_round,
        counted(r.rounds as usize, "round"),
        busy.join(" / ")
    )
}

// ----- output -----

impl BenchReport {
    /// The whole report as one JSON object: `machine` (cores, CPU, the four measured
    /// bandwidths and the one used, the read-only bandwidth, the 128-bit and widest
    /// multiply/add probes `compute` and `wide_compute`, the FMA peak), `size`, `rows`
    /// (each with its memory, `floor_128_ms` and `wide_floor_ms` floors; `compute_floor_ms`
    /// is the wide one, which `x_floor` uses), and `training` (one object per training
    /// row).
    pub fn to_json(&self) -> serde_json::Value {
        let m = &self.machine;
        let bw = &m.bandwidth;
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "expr": r.expr,
                    "inputs": r.inputs,
                    "kind": r.kind.name(),
                    "backend": r.backend,
                    "kernels": r.kernels,
                    "interp_steps": r.interp_steps,
                    "routine_steps": r.routine_steps,
                    "compiled_kernels": r.compiled_kernels,
                    "runs": r.runs,
                    "median_ms": r.median_ms,
                    "min_ms": r.min_ms,
                    "run_ms": r.run_ms,
                    "compile_ms": r.compile_ms,
                    "ideal_bytes": r.ideal_bytes,
                    "gbps": r.gbps,
                    "fraction_of_bandwidth": r.fraction,
                    "fraction_of_read_bandwidth": r.read_fraction,
                    "minor_faults_per_eval": r.faults_per_eval,
                    "warmup_minor_faults": r.warmup_faults,
                    "ops": r.ops,
                    "ops_per_element": r.ops_per_element,
                    "memory_floor_ms": r.memory_floor_ms,
                    "compute_floor_ms": r.compute_floor_ms,
                    "wide_floor_ms": r.compute_floor_ms,
                    "floor_128_ms": r.floor_128_ms,
                    "x_floor": r.x_floor(),
                    "floor_binds": r.floor().map(|(_, which)| which),
                    "flops": r.flops,
                    "gflops": r.gflops,
                    "fraction_of_fma_peak": r.fma_peak_fraction,
                    "product_tier": r.product_tier.map(|(name, _)| name),
                    "fraction_of_tier_fma_peak": r.product_tier.and_then(|(_, f)| f),
                    "versus": r.versus.as_ref().map(|v| serde_json::json!({
                        "what": v.what,
                        "median_ms": v.median_ms,
                        "ratio": v.ratio,
                        "ratio_min": v.ratio_range.0,
                        "ratio_max": v.ratio_range.1,
                    })),
                })
            })
            .collect();
        serde_json::json!({
            "machine": {
                "cores": m.cores,
                "arch": m.arch,
                "os": m.os,
                "cpu": m.cpu,
                "bandwidth": {
                    "array_bytes": bw.array_bytes,
                    "trials": bw.trials,
                    "threads": bw.threads,
                    "copy_1t_gbps": bw.copy_1t_gbps,
                    "triad_1t_gbps": bw.triad_1t_gbps,
                    "copy_all_gbps": bw.copy_all_gbps,
                    "triad_all_gbps": bw.triad_all_gbps,
                    "gbps": bw.gbps(),
                    "source": bw.source(),
                },
                "read_bandwidth": {
                    "bytes": m.read.bytes,
                    "isa": m.read.isa,
                    "trials": m.read.trials,
                    "threads": m.read.threads,
                    "read_1t_gbps": m.read.read_1t_gbps,
                    "read_all_gbps": m.read.read_all_gbps,
                    "gbps": m.read.gbps(),
                    "over_machine_bandwidth": m.read.gbps() / bw.gbps(),
                },
                "compute": compute_json(&m.compute),
                "wide_compute": compute_json(&m.wide),
                "fma": {
                    "isa": m.fma.isa,
                    "lanes": m.fma.lanes,
                    "chains": m.fma.chains,
                    "trials": m.fma.trials,
                    "threads": m.fma.threads,
                    "flops_per_s_1t": m.fma.flops_1t,
                    "flops_per_s": m.fma.flops_all,
                },
                "product_tier": {
                    "name": m.product_tier.0,
                    "fma_flops_per_s_1t": m.product_tier.1.as_ref().map(|f| f.flops_1t),
                    "fma_flops_per_s": m.product_tier.1.as_ref().map(|f| f.flops_all),
                },
                "bf16_dot": m.bf16_dot.as_ref().map(|b| serde_json::json!({
                    "isa": b.isa,
                    "flops_per_s_1t": b.flops_1t,
                    "flops_per_s": b.flops_all,
                })),
                "device": m.device.as_ref().map(|d| serde_json::json!({
                    "name": d.name,
                    "copy_gbps": d.copy_gbps,
                    "fma_gflops": d.fma_gflops,
                })),
            },
            "size": match self.size { Size::Full => "full", Size::Tiny => "tiny" },
            "rows": rows,
            "training": self.training.iter().map(training_json).collect::<Vec<_>>(),
            "host_cache": {
                "hits": self.host_cache.hits,
                "misses": self.host_cache.misses,
                "uncacheable": self.host_cache.uncacheable,
                "bytes_cached": self.host_cache.bytes_cached,
                "high_water_mark": self.host_cache.high_water_mark,
                "max_host_cacheable_length": self.host_cache.limits.max_cacheable_length,
                "max_host_cache": self.host_cache.limits.max_cache,
            },
        })
    }

    /// The machine, its bandwidth and a Markdown table of the rows.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let bw = &m.bandwidth;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "machine: {} cores, {} {}{}",
            m.cores,
            m.os,
            m.arch,
            m.cpu
                .as_deref()
                .map(|c| format!(", {c}"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            s,
            "memory bandwidth (STREAM-like, 3 x {} MiB f32, best of {}): copy {:.1} GB/s, triad {:.1} GB/s on 1 thread; copy {:.1} GB/s, triad {:.1} GB/s on {} threads",
            bw.array_bytes >> 20,
            bw.trials,
            bw.copy_1t_gbps,
            bw.triad_1t_gbps,
            bw.copy_all_gbps,
            bw.triad_all_gbps,
            bw.threads
        );
        let _ = writeln!(
            s,
            "machine bandwidth = the largest: {:.1} GB/s ({})",
            bw.gbps(),
            bw.source()
        );
        let _ = writeln!(
            s,
            "read-only bandwidth (sum of a {} MiB f32 buffer, {} loads, 8 accumulators a thread, best of {}): {:.1} GB/s on 1 thread, {:.1} GB/s on {} threads; {:.2}x the machine bandwidth: the floor of the `of read bw` column",
            m.read.bytes >> 20,
            m.read.isa,
            m.read.trials,
            m.read.read_1t_gbps,
            m.read.read_all_gbps,
            m.read.threads,
            m.read.gbps() / bw.gbps().max(1e-9)
        );
        let _ = writeln!(
            s,
            "compute peak (independent f32x4 mul/add chains, {} chains, best of {}): {:.2} G vector ops/s on 1 thread, {:.2} G on {} threads: the 128-bit floor's rate",
            m.compute.chains,
            m.compute.trials,
            m.compute.ops_1t / 1e9,
            m.compute.ops_all / 1e9,
            m.compute.threads
        );
        let w = &m.wide;
        let _ = writeln!(
            s,
            "compute peak, widest vectors (independent {} chains, {} lanes, {} chains, best of {}): {:.2} G vector ops/s on 1 thread, {:.2} G on {} threads = {:.1} G lane ops/s, {:.2}x the f32x4 probe's {:.1} G: the wide floor's rate",
            w.isa,
            w.lanes,
            w.chains,
            w.trials,
            w.ops_1t / 1e9,
            w.ops_all / 1e9,
            w.threads,
            w.flops_all() / 1e9,
            w.flops_all() / m.compute.flops_all().max(1e-9),
            m.compute.flops_all() / 1e9
        );
        let f = &m.fma;
        let _ = writeln!(
            s,
            "f32 FMA peak, widest vectors ({}, {} lanes, {} independent chains, best of {}): {:.1} GFLOP/s on 1 thread, {:.1} GFLOP/s on {} threads: the matmul rows' floor (f64 rows: half of it); the f32x4 probe above is {:.1} GFLOP/s on {} threads, {:.0}% of it",
            f.isa,
            f.lanes,
            f.chains,
            f.trials,
            f.flops_1t / 1e9,
            f.flops_all / 1e9,
            f.threads,
            m.compute.flops_all() / 1e9,
            m.compute.threads,
            m.compute.flops_all() / f.flops_all.max(1e-9) * 100.0
        );
        let _ = match &m.product_tier {
            (name, Some(t)) => writeln!(
                s,
                "products on the CPU run on the gemm crate's {name} micro-kernels: f32 FMA peak at their width ({}) {:.1} GFLOP/s on {} threads, {:.0}% of the widest; each product row says its tier and its fraction of that tier's peak",
                t.isa,
                t.flops_all / 1e9,
                t.threads,
                t.flops_all / f.flops_all.max(1e-9) * 100.0
            ),
            (name, None) => writeln!(s, "products on the CPU run on the gemm crate's {name} micro-kernels"),
        };
        if let Some(b) = &m.bf16_dot {
            let _ = writeln!(
                s,
                "bf16 dot-product peak ({}, {} independent chains, f32 accumulation, best of {}): {:.1} GFLOP/s on 1 thread, {:.1} GFLOP/s on {} threads, {:.2}x the f32 FMA peak: bf16 products widen to f32 while packing and run on the f32 kernels",
                b.isa,
                b.chains,
                b.trials,
                b.flops_1t / 1e9,
                b.flops_all / 1e9,
                b.threads,
                b.flops_all / f.flops_all.max(1e-9)
            );
        }
        if let Some(d) = &m.device {
            let _ = writeln!(
                s,
                "device: {}, device-to-device copy {:.1} GB/s (read + written), f32 FMA peak {:.1} GFLOP/s (8 independent FMA chains a thread, 16 blocks of 256 per multiprocessor, best of 5): the floors of the rows below, timed by CUDA events (transfers excluded); f16/bf16 products run on tensor cores, above the FMA peak",
                d.name, d.copy_gbps, d.fma_gflops
            );
        }
        if !self.rows.is_empty() {
            let _ = writeln!(
                s,
                "floors: memory = ideal bytes at the machine bandwidth; 128-bit = the kernels' counted operations (128-bit) at the f32x4 probe's rate; wide = the same lane operations (4 per counted operation) at the widest probe's lane rate, i.e. every counted operation (loads, stores, conversions, shuffles too) assumed to become lanes/4 times fewer widest operations as fast as the probe's mul/add, with no cost for tails, masks or lane crossings; products: FLOPs at the widest FMA peak (wide) and at the f32x4 probe's FLOP rate (128-bit); x floor = time over the larger of the memory and wide floors"
            );
        }
        s.push('\n');
        // A run of the training rows alone has no case table.
        if !self.rows.is_empty() {
            s.push_str("| case | expression | inputs | kernels | runs | median ms | ideal MB | GB/s | of bandwidth | of read bw | GFLOP/s | of FMA peak | ops/elem | 128-bit floor ms | wide floor ms | x floor | faults/eval | note |\n");
            s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        }
        for r in &self.rows {
            let plural = |n: usize| if n == 1 { "" } else { "s" };
            let mut kernels = r.kernels.to_string();
            if r.routine_steps > 0 {
                let n = r.routine_steps;
                kernels.push_str(&format!(" + {n} routine{}", plural(n)));
            }
            if r.interp_steps > 0 {
                let n = r.interp_steps;
                kernels.push_str(&format!(" ({n} step{} interpreted)", plural(n)));
            }
            let versus = r.versus.as_ref().map(|v| {
                format!(
                    "{:.3}x {} (turns {:.2}-{:.2}x; {} ms)",
                    v.ratio,
                    v.what,
                    v.ratio_range.0,
                    v.ratio_range.1,
                    if v.median_ms < 10.0 {
                        format!("{:.3}", v.median_ms)
                    } else {
                        format!("{:.1}", v.median_ms)
                    }
                )
            });
            let note = match r.kind {
                Kind::Throughput => versus.unwrap_or_default(),
                Kind::CompileNew => format!("JIT {:.3} ms of it", r.compile_ms),
                Kind::Cached => format!(
                    "overhead {:.1} µs (wall less kernel time)",
                    (r.median_ms - r.run_ms).max(0.0) * 1e3
                ),
            };
            let _ = writeln!(
                s,
                "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.expr,
                r.inputs,
                kernels,
                r.runs,
                if r.median_ms < 10.0 {
                    format!("{:.3}", r.median_ms)
                } else {
                    format!("{:.1}", r.median_ms)
                },
                if r.kind == Kind::Throughput {
                    format!("{:.1}", r.ideal_bytes as f64 / 1e6)
                } else {
                    "-".into()
                },
                r.gbps.map_or_else(|| "-".into(), |g| format!("{g:.2}")),
                r.fraction
                    .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
                r.read_fraction
                    .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
                r.gflops
                    .filter(|_| r.kind == Kind::Throughput)
                    .map_or_else(|| "-".into(), |g| format!("{g:.1}")),
                r.fma_peak_fraction
                    .filter(|_| r.kind == Kind::Throughput)
                    .map_or_else(|| "-".into(), |f| match r.product_tier {
                        Some((tier, Some(t))) if (t - f).abs() > 1e-9 => {
                            format!("{:.1}% ({tier}: {:.1}%)", f * 100.0, t * 100.0)
                        }
                        Some((tier, _)) => format!("{:.1}% ({tier})", f * 100.0),
                        None => format!("{:.1}%", f * 100.0),
                    }),
                r.ops_per_element
                    .map_or_else(|| "-".into(), |o| format!("{o:.1}")),
                r.floor_128_ms
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                r.compute_floor_ms
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                r.x_floor()
                    .zip(r.floor())
                    .map_or_else(|| "-".into(), |(x, (_, which))| format!("{x:.2}x {which}")),
                r.faults_per_eval
                    .map_or_else(|| "-".into(), |f| format!("{f:.0}")),
                note
            );
        }
        if !self.training.is_empty() {
            // A blank line after the case table; the machine's lines end with one.
            s.push_str(if self.rows.is_empty() {
                "training:\n"
            } else {
                "\ntraining:\n"
            });
            for row in &self.training {
                let line = match row {
                    TrainingRow::Step(r) => step_line(r),
                    TrainingRow::Parallel(r) => parallel_line(r),
                };
                let _ = writeln!(s, "- {line}");
            }
        }
        let _ = writeln!(
            s,
            "\nfaults/eval: minor page faults of one timed eval (median); host buffer cache after the run: {}",
            self.host_cache
        );
        s
    }
}
