//! The wide (AVX-512 / AVX2) exp and log families against the 128-bit inline math:
//! for every tier the host has, `wide::unary` must give the very bits of a JIT kernel
//! `load f32 -> op -> store` over a domain of 64 Ki elements compiled on the 128-bit
//! path (`compile_with(kernel, None)`: Cranelift's inline math, neither the wide
//! routines nor the precompiled shared math, which are built from the same generic
//! code and so could not catch its drift), on 2^20 log-uniform
//! samples of both signs plus edge cases, the same sampler as `tests/vmath.rs`. Two
//! NaNs count as equal whatever their payloads and signs (neither path promises a
//! payload); every other result must match bit for bit, signed zeros included. Tails
//! (n = 0, 1, lanes - 1, lanes + 1, 1000) are checked against the same reference
//! (in place is checked by `wide::math`'s unit test, as the safe API takes two slices).
//!
//! The wide path exists only with fused multiply-adds: without FMA (or under
//! `NDFUSE_CPU_FMA=0`), or on a host without AVX2, the tests print why and pass. A
//! missing routine for one of the ops fails.
//!
//! `wide_timing` prints ns/element of each routine against the JIT over 1 Mi elements
//! on one thread (figures, not assertions); the JIT runs its 128-bit code under
//! `NDFUSE_CPU_WIDE=0`, and otherwise a kernel that large calls the wide routines. Every test holds one lock,
//! so the timing runs alone.

mod builder;
mod sampling;

use builder::{compiled, KernelBuilder};
use ndfuse_codegen_cpu::{compile_with, use_fma, wide};
use ndfuse_ir::{DType, HostArray, Shape, UnaryOp};
use sampling::Rng;
use std::sync::Mutex;
use std::time::Instant;

/// Sampled inputs per op (besides the edge cases).
const SAMPLES: usize = 1 << 20;

/// The JIT reference's domain: 64 Ki, so the kernel inlines the math (below, it would
/// call the shared math, precompiled from the generic code where there is a wide
/// tier); compiled with no tier, it never takes a wide block path.
const DOMAIN: usize = 1 << 16;

/// One test at a time, so the timing is not shared with the others' work.
static SERIAL: Mutex<()> = Mutex::new(());

/// A 1-d f32 array of `xs` (through f64, which holds every f32 exactly).
fn f32_array(xs: &[f32]) -> HostArray {
    let wide: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
    HostArray::from_f64s(DType::F32, Shape::new([xs.len()]), &wide)
}

/// The kernel `out = op(in)` over `n` f32.
fn kernel(op: UnaryOp, n: usize) -> ndfuse_ir::Kernel {
    let mut kb = KernelBuilder::new("k0_wide_math", &[n]);
    let x = kb.load(DType::F32);
    let y = kb.unary(op, x);
    kb.store(y);
    kb.build()
}

/// `op` on `xs` through the JIT's 128-bit inline code, `DOMAIN` elements a run (the
/// last batch padded with zeros).
fn jit(op: UnaryOp, xs: &[f32]) -> Vec<f32> {
    let k = kernel(op, DOMAIN);
    let ck = compile_with(&k, None).unwrap_or_else(|e| panic!("{e}\n{k}"));
    let mut out = Vec::with_capacity(xs.len());
    for batch in xs.chunks(DOMAIN) {
        let mut padded = batch.to_vec();
        padded.resize(DOMAIN, 0.0);
        let input = f32_array(&padded);
        let mut y = HostArray::zeros(DType::F32, Shape::new([DOMAIN]));
        ck.run(&[&input], &mut [&mut y])
            .unwrap_or_else(|e| panic!("{e}"));
        out.extend_from_slice(&y.as_slice::<f32>().expect("f32 output")[..batch.len()]);
    }
    out
}

/// Same bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The tiers to test, or `None` (with the reason printed) where there is no wide path.
fn tiers(what: &str) -> Option<Vec<wide::Tier>> {
    if !use_fma() {
        println!("{what}: skipped, the inline math is unfused (no FMA or NDFUSE_CPU_FMA=0)");
        return None;
    }
    let tiers = wide::available();
    if tiers.is_empty() {
        println!("{what}: skipped, the host has neither AVX-512F nor AVX2+FMA+F16C");
        return None;
    }
    Some(tiers)
}

/// Checks every tier's routine for `op` against the JIT on the sampled inputs, whole
/// and in tails.
fn check(op: UnaryOp, seed: u64, range: (i32, i32)) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tiers) = tiers(op.name()) else {
        return;
    };
    let xs = sampling::inputs(seed, range, SAMPLES);
    let want = jit(op, &xs);
    for tier in tiers {
        let mut got = vec![0.0f32; xs.len()];
        assert!(
            wide::unary(op, tier, &xs, &mut got),
            "no {} routine for {}",
            tier.name(),
            op.name()
        );
        let bad: Vec<usize> = (0..xs.len()).filter(|&i| !same(got[i], want[i])).collect();
        if let Some(&i) = bad.first() {
            panic!(
                "{} {}: {} of {} inputs differ from the 128-bit code; first at x = {:e} ({:#010x}): wide {:e} ({:#010x}), 128-bit {:e} ({:#010x})",
                tier.name(),
                op.name(),
                bad.len(),
                xs.len(),
                xs[i],
                xs[i].to_bits(),
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            );
        }
        // Tails, from several starting points (the first holds the edge cases).
        let lanes = tier.lanes();
        for n in [0, 1, lanes - 1, lanes + 1, 1000] {
            for start in [0, 7, 100_003] {
                let src = &xs[start..start + n];
                // Filled with a value no result has, so unwritten elements show.
                let mut dst = vec![f32::from_bits(0x7FC0_1234); n];
                assert!(wide::unary(op, tier, src, &mut dst));
                for (i, (&g, &w)) in dst.iter().zip(&want[start..start + n]).enumerate() {
                    assert!(
                        same(g, w) && g.to_bits() != 0x7FC0_1234,
                        "{} {} over {n} elements from {start}: element {i} (x = {:e}) gave {g:e}, the 128-bit code {w:e}",
                        tier.name(),
                        op.name(),
                        src[i]
                    );
                }
            }
        }
        // Mismatched lengths are refused, nothing written.
        let mut short = vec![1.0f32; 3];
        assert!(!wide::unary(op, tier, &xs[..4], &mut short));
        assert_eq!(short, [1.0; 3]);
        println!(
            "{} {}: {} inputs bit-identical to the 128-bit code",
            tier.name(),
            op.name(),
            xs.len()
        );
    }
}

#[test]
fn exp_matches_128_bit() {
    check(UnaryOp::Exp, 1, (-30, 7));
}

#[test]
fn expm1_matches_128_bit() {
    check(UnaryOp::Expm1, 2, (-30, 7));
}

#[test]
fn log_matches_128_bit() {
    check(UnaryOp::Log, 3, (-3, 3));
}

#[test]
fn log1p_matches_128_bit() {
    check(UnaryOp::Log1p, 4, (-30, 3));
}

#[test]
fn tanh_matches_128_bit() {
    check(UnaryOp::Tanh, 5, (-30, 4));
}

#[test]
fn sigmoid_matches_128_bit() {
    check(UnaryOp::Sigmoid, 6, (-30, 7));
}

#[test]
fn erf_matches_128_bit() {
    check(UnaryOp::Erf, 7, (-30, 3));
}

/// Every f32 where e^x is subnormal or rounds to 0 from one (x in [-104, -87.3]), and
/// its negation (where sigmoid's e^-|x| is): the wide general path builds those results
/// from integers, without a floating-point operation that underflows, and must still
/// give the 128-bit code's bits for each of the 2.2 million, for exp and sigmoid (whose
/// quotient by 1 + e is skipped there).
#[test]
fn the_subnormal_band_matches_128_bit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tiers) = tiers("the subnormal band") else {
        return;
    };
    let (lo, hi) = (87.336_55f32.to_bits(), 104.0f32.to_bits());
    let band: Vec<f32> = (lo..=hi).map(|b| -f32::from_bits(b)).collect();
    for op in [UnaryOp::Exp, UnaryOp::Sigmoid] {
        let xs: Vec<f32> = match op {
            UnaryOp::Sigmoid => band.iter().flat_map(|&x| [x, -x]).collect(),
            _ => band.clone(),
        };
        let want = jit(op, &xs);
        for &tier in &tiers {
            let mut got = vec![0.0f32; xs.len()];
            assert!(wide::unary(op, tier, &xs, &mut got));
            let bad = (0..xs.len()).filter(|&i| !same(got[i], want[i])).count();
            let first = (0..xs.len()).find(|&i| !same(got[i], want[i]));
            assert!(
                bad == 0,
                "{} {}: {bad} of {} inputs in the subnormal band differ; first at x = {:e}",
                tier.name(),
                op.name(),
                xs.len(),
                first.map_or(0.0, |i| xs[i])
            );
            // Subnormal results are really there (the band is not all zeros).
            let subnormal = got.iter().filter(|v| v.is_subnormal()).count();
            assert!(subnormal > xs.len() / 4, "{} {}", tier.name(), op.name());
        }
    }
}

/// Ops without a wide routine get none (`false`, nothing written).
#[test]
fn other_ops_have_no_routine() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for tier in wide::available() {
        for op in [UnaryOp::Sin, UnaryOp::Rsqrt, UnaryOp::Neg] {
            let mut dst = [5.0f32; 4];
            assert!(!wide::unary(op, tier, &[1.0; 4], &mut dst), "{}", op.name());
            assert_eq!(dst, [5.0; 4]);
        }
    }
}

/// ns/element of each routine and of the JIT's 128-bit code (one thread, 1 Mi
/// elements of the op's interesting range, best of 5). Prints only.
#[test]
fn wide_timing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tiers) = tiers("timing") else {
        return;
    };
    const N: usize = 1 << 20;
    let ops = [
        (UnaryOp::Exp, (-30, 6)),
        (UnaryOp::Expm1, (-30, 6)),
        (UnaryOp::Tanh, (-30, 3)),
        (UnaryOp::Sigmoid, (-30, 6)),
        (UnaryOp::Erf, (-30, 2)),
        (UnaryOp::Log, (-30, 30)),
        (UnaryOp::Log1p, (-30, 30)),
    ];
    let best = |f: &mut dyn FnMut()| {
        f();
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
            * 1e9
            / N as f64
    };
    // Kernels of 64 Ki elements or more call the wide routines themselves unless
    // `NDFUSE_CPU_WIDE=0`: run with it set for the 128-bit figures.
    let jit_path = match wide::tier() {
        None => "JIT 128-bit".to_string(),
        Some(t) => format!("JIT ({} blocks; NDFUSE_CPU_WIDE=0 for 128-bit)", t.name()),
    };
    println!("ns/element over {N} f32, one thread, best of 5:");
    for (op, (emin, emax)) in ops {
        let mut rng = Rng(42);
        let xs: Vec<f32> = (0..N).map(|_| rng.log_uniform(emin, emax)).collect();
        let ck = compiled(&kernel(op, N));
        let input = f32_array(&xs);
        let mut out = HostArray::zeros(DType::F32, Shape::new([N]));
        let narrow = best(&mut || {
            ck.run_range(&[&input], &mut [&mut out], 0, N)
                .unwrap_or_else(|e| panic!("{e}"));
        });
        let mut line = format!("  {:8} {jit_path} {narrow:6.3}", op.name());
        for &tier in &tiers {
            let mut dst = vec![0.0f32; N];
            let t = best(&mut || assert!(wide::unary(op, tier, &xs, &mut dst)));
            // One block of 1 Ki elements in L1, N / 1 Ki times over: the compute
            // alone, as the kernels' block path sees it.
            let mut out = [0.0f32; 1024];
            let l1 = best(&mut || {
                for x in xs.chunks(1024) {
                    assert!(wide::unary(op, tier, &xs[..1024], &mut out));
                    std::hint::black_box((x, &mut out));
                }
            });
            line += &format!(
                "  {} {t:6.3} ({:.2}x; in L1 {l1:6.3})",
                tier.name(),
                narrow / t
            );
        }
        println!("{line}");
    }
}
