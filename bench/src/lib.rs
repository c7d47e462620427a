//! The built-in benchmark suite of `ndfuse bench`: each case is built with the library
//! API, timed end to end, and set against the ideal bytes it must move and this
//! machine's memory bandwidth, measured in the same run by a STREAM-like copy and triad.
//!
//! The floor of a memory-bound kernel is `ideal bytes / bandwidth`, where the ideal
//! bytes are every input read once plus every output written once (from the shapes and
//! dtypes, whatever the kernels actually did). A row's fraction of the bandwidth is how
//! close the case came to that floor: 1.0 is at the floor.
//!
//! A kernel can be bound by compute instead (Cranelift's x86 vectors are 128 bits wide,
//! and a transcendental costs tens of vector operations): each row also has two compute
//! floors from the operations its compiled kernels execute
//! ([`ndfuse_runtime::jit_ops_per_element`] times the elements of each kernel's domain,
//! counted as 128-bit operations). The *128-bit floor* is those operations at this
//! machine's peak rate of independent f32x4 multiplies and adds on all threads
//! ([`measure_compute_peak`]): what the JIT's width can reach. The *wide floor* is the
//! same lane operations (4 per counted operation) at the lane rate of the same
//! multiply/add probe run with the widest vectors the CPU has (AVX-512F zmm, else AVX2
//! ymm; [`measure_widest_compute_peak`]): it assumes every counted operation, loads,
//! stores, conversions and shuffles included, becomes `lanes / 4` times fewer widest
//! operations, each as fast as the probe's multiplies and adds (no cost for tails,
//! masks or lane crossings). On a machine whose widest operations run as many a second
//! as its 128-bit ones, the wide floor is the 128-bit one over `lanes / 4`. A row's
//! time is reported against the larger of the memory floor and the wide floor, and the
//! table says which binds. Both probes are measured in the same run.
//!
//! The machine's read-only bandwidth is measured in the same run too
//! ([`measure_read_bandwidth`]: one buffer summed with the widest loads and 8
//! accumulators a thread); a case that reads at least 16 times what it writes (`sum`,
//! `colsum`) also reports its fraction of it.
//!
//! The matrix products (`matmul_*`, `attention`) count FLOPs instead (`2*M*N*K` per
//! product): their wide floor is those FLOPs over this machine's f32 FMA peak with
//! the widest vectors the CPU has (AVX-512F, else AVX2+FMA, detected at run time;
//! [`measure_fma_peak`]), measured in the same run, and each such row reports GFLOP/s
//! and its fraction of that peak; their 128-bit floor is the FLOPs at the f32x4
//! multiply/add probe's FLOP rate. The report shows the 128-bit figure beside the FMA
//! peak in the same unit, so a reader sees how much of the machine the JIT's width can
//! reach.
//!
//! Each row also counts the minor page faults of one evaluation (`getrusage`, median
//! over the timed runs): with outputs and intermediates recycled by the host cache, a
//! steady-state loop touches no fresh page, so the figure is about zero; a buffer
//! larger than `max_host_cacheable_length` is fresh memory in every run and shows up
//! here (about 32 faults per 64 MiB with huge pages, 16 384 without).
//!
//! ```
//! use ndfuse_bench::{run_suite, BenchOptions};
//! // The tiny variant: the same cases on small shapes, for tests and smoke runs.
//! let report = run_suite(Some("gelu"), &BenchOptions::tiny())?;
//! assert_eq!(report.rows.len(), 3); // gelu, gelu_f16 and matmul_gelu
//! assert!(report.rows.iter().all(|r| r.kernels >= 1));
//! println!("{}", report.table());
//! # Ok::<(), ndfuse::Error>(())
//! ```
//!
//! The training rows (selected by names containing `train`, run after the cases) time
//! one training step of a 784-512-512-10 ReLU MLP (forward, backward, Adam) on batch
//! 128, set against the same FMA peak by the FLOPs of its products
//! ([`TrainingShape::step_flops`]), with its kernel count and host allocations per step;
//! and data-parallel training of it (`ParallelWrapper`) over CPU devices, in samples a
//! second against one worker of one thread.
//!
//! Layers: `options` < `cases` < `peak` < `machine` < `training` < `run` < `report`.

mod cases;
mod machine;
mod options;
mod peak;
mod report;
mod run;
mod training;

pub use cases::{cases, cases_on, Case, Versus};
pub use machine::{
    measure_bandwidth, measure_compute_peak, measure_fma_peak, measure_read_bandwidth,
    measure_widest_compute_peak, Bandwidth, DeviceFloor, Machine, ReadBandwidth,
};
pub use options::{BenchOptions, Kind, Size};
pub use peak::{
    measure_bf16_dot_peak, measure_tier_fma_peak, measure_wide_compute_peak, measure_wide_fma_peak,
    ComputePeak, FmaPeak,
};
pub use run::{run_suite, run_suite_with, BenchReport, Compared, Event, Row};
pub use training::{
    training_names, ParallelRow, Shape as TrainingShape, StepRow, TrainingRow, WARMUP_STEPS,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::input_data;
    use crate::run::{median, paired_ratios};
    use ndfuse::{BackendKind, Context, DType};

    #[test]
    fn ideal_bytes_are_inputs_once_plus_the_output_once() {
        let ctx = Context::new();
        const M: u64 = 1 << 20;
        const K2: u64 = 1024 * 1024;
        let want: &[(&str, u64)] = &[
            ("gelu", 2 * 64 * M),                     // 16M f32 in, 16M f32 out
            ("chain", 4 * 64 * M),                    // three inputs, one output
            ("softmax", 2 * 64 * M),                  // [4096,4096] in and out
            ("layernorm", 2 * 32 * M),                // [8192,1024] in and out
            ("sum", 256 * M + 4),                     // 64M f32 in, one f32 out
            ("colsum", 64 * M + 4096 * 4),            // [4096,4096] in, [4096] out
            ("broadcast", 2 * 64 * M + 2 * 4096 * 4), // a and out, b and c
            // tokens (i64), a row of 768 f32 per token read and written, 512 positions
            ("embedding", 32768 * 8 + 2 * 32768 * 768 * 4 + 512 * 768 * 4),
            ("scan_rows", 2 * 64 * M),    // [4096,4096] in and out
            ("argsort", 16 * M + 32 * M), // 4M f32 in, 4M i64 out
            // x [1, 576] f32, 49152 rows of 90 words of Q4_1 blocks, [1, 49152] f32 out
            ("quant_matvec", 576 * 4 + 49152 * 90 * 4 + 49152 * 4),
            ("gelu_f16", 2 * 32 * M), // 16M f16 in and out
            ("compile_new", 2 * 4000),
            ("compile_cached", 2 * 4000),
            ("matmul_f32", 3 * 16 * M), // x, w, out: 2048^2 f32 each
            ("matmul_gelu", 96 * M + 4096 * 4), // x, w [4M], out [16M], b
            ("attention", 4 * 2 * M),   // q, k, v, out: 32*256*64 f32
            ("attention_causal", 4 * 8 * M), // q, k, v, out: 8*8*512*64 f32
            ("attention_causal_grad", 4 * 8 * M + 4), // q, k, v, r; a 0-d f32 out
            ("matmul_f16", 3 * 8 * M),  // the same in f16
            ("matmul_bf16", 3 * 8 * M), // and in bf16
            ("matmul_cached", 3 * 64 * 64 * 4), // 64x64 f32: x, w, out
            // x and out [8,64,56,56], w [64,64,3,3], b [64]: f32
            (
                "conv2d",
                2 * 8 * 64 * 56 * 56 * 4 + 64 * 64 * 9 * 4 + 64 * 4,
            ),
            // The LAPACK level: n = 1024 (svd, eigh 512), f64 then f32 (half the bytes).
            ("linalg_solve_f64", (K2 + 2 * 1024) * 8), // a, b, x
            ("linalg_solve64_f64", (K2 + 2 * 64 * 1024) * 8),
            ("linalg_cholesky_f64", 2 * K2 * 8), // spd, l
            ("linalg_qr_f64", 2 * K2 * 8),       // a, q
            ("linalg_inv_f64", 2 * K2 * 8),
            ("linalg_det_f64", K2 * 8 + 8),
            ("linalg_svd_f64", 2 * K2 / 4 * 8), // a, u: 512^2
            ("linalg_eigh_f64", 2 * K2 / 4 * 8),
            ("linalg_solve_f32", (K2 + 2 * 1024) * 4),
            ("linalg_solve64_f32", (K2 + 2 * 64 * 1024) * 4),
            ("linalg_cholesky_f32", 2 * K2 * 4),
            ("linalg_qr_f32", 2 * K2 * 4),
            ("linalg_inv_f32", 2 * K2 * 4),
            ("linalg_det_f32", K2 * 4 + 4),
            ("linalg_svd_f32", 2 * K2 / 4 * 4),
            ("linalg_eigh_f32", 2 * K2 / 4 * 4),
            // 1024 systems of 32: a, b and x
            ("linalg_solve_batched_f64", 1024 * (32 * 32 + 2 * 32) * 8),
            ("linalg_solve_batched_f32", 1024 * (32 * 32 + 2 * 32) * 4),
        ];
        let all = cases(Size::Full);
        assert_eq!(all.len(), want.len());
        for (case, (name, bytes)) in all.iter().zip(want) {
            assert_eq!(case.name, *name);
            assert_eq!(case.ideal_bytes(&ctx).expect("builds"), *bytes, "{name}");
        }
        // The tiny cases are the same cases.
        let names: Vec<_> = cases(Size::Tiny).iter().map(|c| c.name).collect();
        assert_eq!(names, all.iter().map(|c| c.name).collect::<Vec<_>>());
    }

    #[test]
    fn the_cases_compute_what_they_say() {
        // Its evaluations use every thread: not beside a suite's probes.
        let _turn = one_at_a_time();
        let ctx = Context::new();
        for case in cases(Size::Tiny) {
            let inputs = case.make_inputs(&ctx).expect("data");
            let out = case.build(&inputs, 2.0).eval().expect("evaluates");
            // The same graph on the f64 reference interpreter agrees.
            let interp = Context::builder()
                .backend(BackendKind::Interp)
                .build()
                .expect("context");
            let want = interp
                .eval(&[&case.build(&inputs, 2.0)])
                .expect("reference");
            let (got, want) = (out.to_f64_vec(), want[0].to_f64_vec());
            assert_eq!(got.len(), want.len(), "{}", case.name);
            // Relative to max(|want|, 1), by the output's dtype: f16 and bf16 outputs
            // are the f32 result rounded once (half an ulp: 2^-11 and 2^-9), f32 has
            // the kernels' own approximations (tanh, exp) and the f32 sums of products
            // of up to 36 terms.
            let tol = match out.dtype() {
                DType::F16 | DType::BF16 => 1e-2,
                _ => 1e-4,
            };
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= tol * w.abs().max(1.0),
                    "{}: {g} vs {w}",
                    case.name
                );
            }
        }
    }

    #[test]
    fn input_data_is_seeded_and_in_range() {
        let ctx = Context::new();
        let a = input_data(&ctx, &[1000], DType::F32, 3)
            .and_then(|t| t.eval())
            .expect("a");
        let b = input_data(&ctx, &[1000], DType::F32, 3)
            .and_then(|t| t.eval())
            .expect("b");
        assert_eq!(a, b);
        assert!(a.to_f64_vec().iter().all(|v| (-1.0..1.0).contains(v)));
        let h = input_data(&ctx, &[4], DType::F16, 3).expect("f16");
        assert_eq!(h.dtype().expect("dtype"), DType::F16);
    }

    #[test]
    fn bandwidth_picks_the_largest_figure_and_says_which() {
        let bw = Bandwidth {
            array_bytes: 1 << 20,
            trials: 1,
            threads: 2,
            copy_1t_gbps: 9.0,
            triad_1t_gbps: 10.0,
            copy_all_gbps: 11.0,
            triad_all_gbps: 10.5,
        };
        assert_eq!(bw.gbps(), 11.0);
        assert_eq!(bw.source(), "copy, 2 threads");
        let measured = {
            let _turn = one_at_a_time();
            measure_bandwidth(1 << 20, 1)
        };
        assert_eq!(measured.array_bytes, 1 << 20);
        for g in [
            measured.copy_1t_gbps,
            measured.triad_1t_gbps,
            measured.copy_all_gbps,
            measured.triad_all_gbps,
        ] {
            assert!(g.is_finite() && g > 0.0, "{measured:?}");
        }
    }

    /// The suite over `filter`, one run at a time in this binary: its probes run on
    /// every thread, and a suite or probe running beside it in another test's thread
    /// starved the all-thread compute probe below half the one-thread figure in a CI
    /// run (the floor tests in `tests/floors.rs` take turns the same way).
    fn suite(filter: Option<&str>) -> crate::BenchReport {
        let _turn = one_at_a_time();
        run_suite(filter, &BenchOptions::tiny()).expect("runs")
    }

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        TURN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[test]
    fn rows_have_a_compute_floor_and_say_which_floor_binds() {
        let report = suite(None);
        let peak = &report.machine.compute;
        assert!(
            peak.ops_1t > 0.0 && peak.ops_all >= peak.ops_1t * 0.5,
            "{peak:?}"
        );
        let row = |name: &str| {
            report
                .rows
                .iter()
                .find(|r| r.name == name)
                .unwrap_or_else(|| panic!("no row {name}"))
        };
        let ops = |name: &str| row(name).ops_per_element.expect("ops counted");
        // A tanh per element costs many times a multiply-add streamed through.
        assert!(
            ops("gelu") > 3.0 * ops("broadcast"),
            "{} vs {}",
            ops("gelu"),
            ops("broadcast")
        );
        // A vector sum: a load and an add per 4 lanes, plus the loop's share.
        assert!(ops("sum") > 0.2 && ops("sum") < 3.0, "{}", ops("sum"));
        let wide = &report.machine.wide;
        for r in report.rows.iter().filter(|r| r.kind == Kind::Throughput) {
            let (floor, which) = r.floor().expect("throughput rows have floors");
            // A routine (a scan, a sort) runs no compiled kernel whose operations the
            // cost model counts: its one floor is the memory's.
            if matches!(r.name, "scan_rows" | "argsort" | "quant_matvec") {
                assert!(r.ops.is_none(), "{}", r.name);
                assert_eq!(
                    (floor, which),
                    (r.memory_floor_ms.expect("memory"), "memory")
                );
                continue;
            }
            let larger = r
                .memory_floor_ms
                .expect("memory")
                .max(r.compute_floor_ms.expect("compute"));
            assert_eq!(floor, larger, "{}", r.name);
            assert_eq!(which == "compute", r.compute_floor_ms > r.memory_floor_ms);
            assert!(r.x_floor().expect("ratio") > 0.0);
            // The two floors of the element-wise rows, from the probes' figures: the
            // counted operations at the 128-bit rate, and 4 lanes of each at the wide
            // probe's lane rate.
            if r.flops.is_none() {
                let ops = r.ops.expect("ops counted");
                let narrow = r.floor_128_ms.expect("128-bit floor");
                let w = r.compute_floor_ms.expect("wide floor");
                assert!((narrow - ops / peak.ops_all * 1e3).abs() <= 1e-9 * narrow);
                let want = ops * 4.0 / (wide.ops_all * wide.lanes as f64) * 1e3;
                assert!((w - want).abs() <= 1e-9 * w, "{} {w} {want}", r.name);
            }
        }
        assert!(row("compile_cached").floor().is_none());
        let table = report.table();
        assert!(
            table.contains("| ops/elem | 128-bit floor ms | wide floor ms | x floor |"),
            "{table}"
        );
        assert!(table.contains("compute peak (independent f32x4"), "{table}");
        assert!(table.contains("compute peak, widest vectors ("), "{table}");
        let json = report.to_json();
        assert!(json["rows"][0]["compute_floor_ms"].is_number(), "{json}");
        assert!(
            json["machine"]["compute"]["vector_ops_per_s"].is_number(),
            "{json}"
        );
    }

    #[test]
    fn the_read_sum_adds_every_element() {
        // Lengths around the blocks of each width (128, 64, 32 f32), small integers:
        // every order of adding them gives the exact sum.
        let mut all = vec![machine::Loads::Portable];
        if machine::Loads::detect() != machine::Loads::Portable {
            all.push(machine::Loads::detect());
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            all.push(machine::Loads::Ymm);
        }
        for loads in all {
            for n in [0, 1, 31, 32, 63, 64, 127, 128, 129, 1000, 4096 + 77] {
                let xs: Vec<f32> = (0..n).map(|i| (i % 13) as f32 - 6.0).collect();
                let want: i64 = (0..n as i64).map(|i| i % 13 - 6).sum();
                assert_eq!(machine::read_sum(&xs, loads), want as f32, "{loads:?} {n}");
            }
        }
        let read = measure_read_bandwidth(1 << 20, 1);
        assert_eq!(read.bytes, 1 << 20);
        assert!(
            read.read_1t_gbps > 0.0 && read.read_all_gbps > 0.0,
            "{read:?}"
        );
        assert_eq!(read.gbps(), read.read_1t_gbps.max(read.read_all_gbps));
    }

    #[test]
    fn the_step_flops_are_the_products_of_forward_and_backward() {
        // By hand, 784-512-512-10 on batch 128: the three layers' forward and weight
        // gradient products 2*128*2*(401 408 + 262 144 + 5 120) = 342 360 064, the
        // input gradients of layers 2 and 3 2*128*(262 144 + 5 120) = 68 419 584.
        let full = TrainingShape::of(Size::Full);
        assert_eq!(full.step_flops(), 342_360_064 + 68_419_584);
        assert_eq!(full.step_flops(), 410_779_648);
        assert_eq!(full.model_text(), "784-512-512-10 relu");
    }

    /// The FLOPs of every matrix product in one step's kernel list: the products the
    /// step really runs (each `Contraction` counts `2*batch*M*N*K`).
    fn step_product_flops(shape: &TrainingShape) -> (u64, usize) {
        use ndfuse_nn::{Activation, Layer, Loss, Optimizer, Sequential, Trainer};
        let ctx = Context::new();
        let model = Sequential::mlp(&ctx, &shape.widths, Activation::Relu, 1).expect("mlp");
        let opt = Optimizer::adam(&model.parameters(), 1e-3);
        let mut t = Trainer::new(model, opt, Loss::CrossEntropy).expect("trainer");
        let x = ctx.rand_normal(&[shape.batch, shape.widths[0]], 0.0, 1.0, 3);
        let labels: Vec<i64> = (0..shape.batch as i64).map(|i| i % 10).collect();
        let y = ctx.from_vec(labels, &[shape.batch]).expect("labels");
        let (_, report) = t.step_report(&x, &y).expect("a step");
        let schedule = report.evaluation().schedule.as_ref().expect("a schedule");
        let (mut flops, mut products) = (0, 0);
        for step in &schedule.steps {
            if let ndfuse_passes::Step::Kernel { kernel, .. } = step {
                if let Some(c) = &kernel.contraction {
                    flops += c.flops() as u64;
                    products += 1;
                }
            }
        }
        (flops, products)
    }

    #[test]
    fn the_step_flop_formula_matches_the_products_in_the_kernel_list() {
        // Three forward products, three weight gradients, two input gradients: the
        // first layer's input is data, so no kernel computes its gradient.
        for size in [Size::Tiny, Size::Full] {
            let shape = TrainingShape::of(size);
            let (flops, products) = step_product_flops(&shape);
            assert_eq!(products, 8, "{shape:?}");
            assert_eq!(flops, shape.step_flops(), "{shape:?}");
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn a_ratio_is_the_median_of_the_turns_ratios() {
        // The machine was slow (x1.5) from the second turn to the peer's run of the
        // third: the second turn's ratio is still the true one, only the third's is
        // off, and the median of the turns keeps 1.04, while the ratio of the two
        // medians reads 0.69.
        let own = [1.04, 1.56, 1.04];
        let peer = [1.0, 1.5, 1.5];
        let (ratio, (lo, hi)) = paired_ratios(&own, &peer).expect("turns");
        assert!((ratio - 1.04).abs() < 1e-12, "{ratio}");
        assert!((lo - 1.04 / 1.5).abs() < 1e-12 && (hi - 1.04).abs() < 1e-12);
        assert!((median(&own) / median(&peer) - 1.04 / 1.5).abs() < 1e-12);
        // A peer that took no time gives no ratio for its turn, and none at all alone.
        let (ratio, _) = paired_ratios(&[2.0, 3.0], &[0.0, 1.0]).expect("one turn");
        assert_eq!(ratio, 3.0);
        assert!(paired_ratios(&[1.0], &[0.0]).is_none());
        assert!(paired_ratios(&[], &[]).is_none());
    }

    #[test]
    fn a_filter_that_matches_nothing_lists_the_cases() {
        let e = run_suite(Some("nope"), &BenchOptions::tiny()).expect_err("no case");
        let text = e.to_string();
        assert!(
            text.contains("no case matches 'nope'") && text.contains("colsum"),
            "{text}"
        );
    }

    #[test]
    fn rows_count_page_faults_and_timed_runs_reuse_cached_buffers() {
        let report = suite(Some("gelu"));
        assert!(report.rows.iter().all(|r| r.faults_per_eval.is_some()));
        // Each timed run drops its output before the next: the next one reuses it.
        assert!(report.host_cache.hits >= report.rows.len() as u64);
        let table = report.table();
        assert!(table.contains("| faults/eval |"), "{table}");
        assert!(
            table.contains("host buffer cache after the run: "),
            "{table}"
        );
    }
}
