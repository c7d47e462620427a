//! The wide path's f16/bf16 <-> f32 block conversions (`wide::load`, `wide::store`)
//! against the 128-bit JIT code's conversions and the `half` crate, on every tier the
//! host has: every one of the 65,536 half bit patterns widened, and f32 values rounded
//! to half (every f16 and bf16 value, the midpoints between neighbours and a quarter
//! away on both sides, 2^20 random bit patterns, NaNs of every kind, and the overflow
//! and subnormal thresholds). Tolerance: the same bits, NaN payloads included, at every
//! length (tails shorter than a register go through another path of the routine).

mod builder;

use builder::{run, KernelBuilder};
use half::{bf16, f16};
use ndfuse_codegen_cpu::wide::{self, Tier};
use ndfuse_ir::{DType, HostArray, Shape, Storage};

const HALVES: [DType; 2] = [DType::F16, DType::BF16];

/// The tiers to check; the test fails on an x86-64 host with AVX2 and F16C that offers
/// none (the routines would be missing), and is skipped elsewhere.
fn tiers() -> Vec<Tier> {
    let tiers = wide::available();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        assert!(
            !tiers.is_empty(),
            "the host has AVX2 and F16C: a tier must be available"
        );
    }
    if tiers.is_empty() {
        eprintln!("no wide tier on this host: nothing to check");
    }
    tiers
}

/// Half bits of `dtype` as little-endian bytes.
fn bytes(bits: &[u16]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}

/// The JIT's conversion of f32 values to `dtype` (a cast kernel, then a store), in
/// slices of 4096 (the small kernels' code path, the 128-bit one).
fn jit_store(dtype: DType, xs: &[f32]) -> Vec<u16> {
    let mut out = Vec::with_capacity(xs.len());
    for part in xs.chunks(4096) {
        let mut k = KernelBuilder::new("k_to_half", &[part.len()]);
        let x = k.load(DType::F32);
        let h = k.cast(x, dtype);
        k.store(h);
        let input =
            HostArray::new(Shape::new([part.len()]), Storage::F32(part.to_vec())).expect("sized");
        let outs = run(&k.build(), &[&input]);
        match outs[0].storage() {
            Storage::F16(v) => out.extend(v.iter().map(|h| h.to_bits())),
            Storage::BF16(v) => out.extend(v.iter().map(|h| h.to_bits())),
            other => panic!("not a half array: {other:?}"),
        }
    }
    out
}

/// The JIT's widening of half bits of `dtype` to f32 bits.
fn jit_load(dtype: DType, bits: &[u16]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bits.len());
    for part in bits.chunks(4096) {
        let mut k = KernelBuilder::new("k_from_half", &[part.len()]);
        let h = k.load(dtype);
        let x = k.cast(h, DType::F32);
        k.store(x);
        let storage = match dtype {
            DType::F16 => Storage::F16(part.iter().map(|&b| f16::from_bits(b)).collect()),
            _ => Storage::BF16(part.iter().map(|&b| bf16::from_bits(b)).collect()),
        };
        let input = HostArray::new(Shape::new([part.len()]), storage).expect("sized");
        let outs = run(&k.build(), &[&input]);
        out.extend(
            outs[0]
                .as_slice::<f32>()
                .expect("f32")
                .iter()
                .map(|x| x.to_bits()),
        );
    }
    out
}

#[test]
fn every_half_bit_pattern_widens_as_the_jit_and_the_half_crate_do() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for tier in tiers() {
        for dtype in HALVES {
            let expected = jit_load(dtype, &all);
            for n in [all.len(), 0, 1, tier.lanes() - 1, tier.lanes() + 1, 1000] {
                let mut got = vec![0f32; n];
                assert!(wide::load(dtype, tier, &bytes(&all[..n]), &mut got));
                for (i, g) in got.iter().enumerate() {
                    let want = expected[i];
                    assert_eq!(
                        g.to_bits(),
                        want,
                        "{} {dtype} {:#06x} (n = {n}): got {:#010x}, the JIT gives {want:#010x}",
                        tier.name(),
                        all[i],
                        g.to_bits()
                    );
                    let crate_value = match dtype {
                        DType::F16 => f16::from_bits(all[i]).to_f32(),
                        _ => bf16::from_bits(all[i]).to_f32(),
                    };
                    assert!(
                        g.to_bits() == crate_value.to_bits()
                            || (g.is_nan() && crate_value.is_nan()),
                        "{dtype} {:#06x}: {g} against the half crate's {crate_value}",
                        all[i]
                    );
                }
            }
        }
    }
}

/// f32 values to round: every value of `dtype`, the points between neighbours (ties),
/// a quarter of the gap on each side, random bit patterns, NaNs and thresholds.
fn rounding_inputs(dtype: DType) -> Vec<f32> {
    let widen = |b: u16| match dtype {
        DType::F16 => f16::from_bits(b).to_f32(),
        _ => bf16::from_bits(b).to_f32(),
    };
    let mut xs = Vec::new();
    for b in 0..=u16::MAX {
        let (a, c) = (widen(b), widen(b.wrapping_add(1)));
        xs.push(a);
        if a.is_finite() && c.is_finite() && (a.is_sign_negative() == c.is_sign_negative()) {
            let mid = (a as f64 + c as f64) / 2.0;
            let gap = (c as f64 - a as f64) / 4.0;
            xs.extend([mid as f32, (mid - gap) as f32, (mid + gap) as f32]);
        }
    }
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..1 << 20 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        xs.push(f32::from_bits(s as u32));
    }
    xs.extend([
        f32::from_bits(0x7F80_0001), // signalling NaN, payload 1
        f32::from_bits(0x7FA0_0000), // signalling NaN, top payload bits
        f32::from_bits(0xFFC0_0001), // negative quiet NaN
        f32::NAN,
        65504.0,
        65519.99,
        65520.0,
        f32::MAX,
        f32::MIN_POSITIVE,
        5.960_464_5e-8,
        2.980_232_2e-8,
        2.980_232_3e-8,
        -0.0,
    ]);
    xs
}

#[test]
fn f32_rounds_to_half_as_the_jit_and_the_half_crate_do() {
    for tier in tiers() {
        for dtype in HALVES {
            let xs = rounding_inputs(dtype);
            let expected = jit_store(dtype, &xs);
            for n in [xs.len(), 0, 1, tier.lanes() - 1, tier.lanes() + 1, 1000] {
                let mut got = vec![0u8; 2 * n];
                assert!(wide::store(dtype, tier, &xs[..n], &mut got));
                for (i, pair) in got.chunks(2).enumerate() {
                    let g = u16::from_le_bytes([pair[0], pair[1]]);
                    assert_eq!(
                        g,
                        expected[i],
                        "{} {dtype} from {:e} ({:#010x}, n = {n}): got {g:#06x}, the JIT gives {:#06x}",
                        tier.name(),
                        xs[i],
                        xs[i].to_bits(),
                        expected[i]
                    );
                    if !xs[i].is_nan() {
                        let crate_bits = match dtype {
                            DType::F16 => f16::from_f32(xs[i]).to_bits(),
                            _ => bf16::from_f32(xs[i]).to_bits(),
                        };
                        assert_eq!(g, crate_bits, "{dtype} from {:e}: the half crate", xs[i]);
                    }
                }
            }
        }
    }
}

#[test]
fn lengths_that_do_not_match_convert_nothing() {
    for tier in tiers() {
        let mut dst = [0f32; 3];
        assert!(!wide::load(DType::F16, tier, &[0u8; 4], &mut dst));
        let mut bytes = [0u8; 4];
        assert!(!wide::store(DType::BF16, tier, &[1.0f32; 3], &mut bytes));
        assert!(
            !wide::load(DType::F32, tier, &[0u8; 6], &mut dst),
            "f32 is no half type"
        );
    }
}
