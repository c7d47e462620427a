//! What the wide-path suites (`wide_blocks`, `wide_rows`) share: the tiers to compare,
//! seeded inputs, a run on a given number of threads, and outputs as comparable bits.
#![allow(dead_code)] // each test binary uses a different part

use super::builder::zeroed_outputs;
use ndfuse_codegen_cpu::wide::{self, Tier};
use ndfuse_codegen_cpu::{use_fma, CompiledKernel};
use ndfuse_ir::{HostArray, Kernel, Shape};

/// The tiers to compare with the 128-bit code: the host's, none where there is no wide
/// path at all (no tier, or unfused inline math: `NDFUSE_CPU_FMA=0`).
pub fn tiers() -> Vec<Tier> {
    if !use_fma() {
        eprintln!("the inline math is unfused here: there is no wide path to compare");
        return Vec::new();
    }
    let t = wide::available();
    if t.is_empty() {
        eprintln!("no wide tier on this host: nothing to compare");
    }
    t
}

/// Inputs of `kernel` from `seed`: values over [-12, 12], and every `special`-th
/// position a NaN, an infinity, -0 or 100 in turn.
pub fn inputs(kernel: &Kernel, seed: u64, special: usize) -> Vec<HostArray> {
    let mut s = seed;
    kernel
        .inputs
        .iter()
        .map(|b| {
            let vals: Vec<f64> = (0..b.len)
                .map(|i| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    match i % special {
                        0 => f64::NAN,
                        1 => f64::INFINITY,
                        2 => -0.0,
                        3 => 100.0,
                        _ => ((s >> 11) as f64 / (1u64 << 53) as f64) * 24.0 - 12.0,
                    }
                })
                .collect();
            HostArray::from_f64s(b.dtype, Shape::new([b.len]), &vals)
        })
        .collect()
}

/// `ck` (compiled from `kernel`) run on `ins` by a pool of `threads` threads.
pub fn run_on(
    ck: &CompiledKernel,
    kernel: &Kernel,
    ins: &[HostArray],
    threads: usize,
) -> Vec<HostArray> {
    let mut outs = zeroed_outputs(kernel);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    pool.install(|| {
        let refs: Vec<&HostArray> = ins.iter().collect();
        let mut out_refs: Vec<&mut HostArray> = outs.iter_mut().collect();
        ck.run(&refs, &mut out_refs).expect("runs");
    });
    outs
}

/// Each element's f64 bits, every NaN alike (neither path defines the payload of a
/// NaN that arithmetic makes).
pub fn bits(a: &HostArray) -> Vec<u64> {
    (0..a.len())
        .map(|i| {
            let v = a.storage().get_f64(i);
            if v.is_nan() {
                u64::MAX
            } else {
                v.to_bits()
            }
        })
        .collect()
}
