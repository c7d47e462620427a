//! f16 and bf16 kernels against the reference interpreter and the `half` crate: every
//! bit pattern through a load and a store, f32 -> half rounding on ties, subnormals,
//! overflow thresholds and NaNs, casts that must round once (f64 and integers to half),
//! every op on contiguous, strided and broadcast inputs, and half row programs (sum,
//! softmax, layernorm) under every plan.
//!
//! Tolerances:
//! - exact (the same bits) for loads, stores, casts, and every op computed inline (IEEE
//!   arithmetic, comparisons, rounding functions): half values are computed in f32 and
//!   rounded once, exactly as the reference does. A NaN that passes through loads,
//!   stores and casts keeps its bits (quieted, payload kept, as the `half` crate
//!   converts); a NaN that arithmetic makes only has to be a NaN (neither the reference
//!   nor the f32 kernels define its sign or payload);
//! - ops of the inline math library with a documented f32 error bound
//!   (`f32_ulp_bound`, `POW_F32_ULP`: exp, log, rsqrt, tanh, ..., pow): at most 1 ulp
//!   of the half type. Their f32 result may be a few f32 ulps from the reference's,
//!   which can move it across one half rounding boundary, never two;
//! - reductions: the f32 accumulation differs from the reference's compensated f64 sum
//!   by at most `1e-5 * |w| + 1e-6 * S` (`S` the sum of |terms|, as in `reduce.rs`),
//!   plus 1 ulp of the half type for the final rounding that this difference can move.

mod builder;

use builder::{compiled, run, view, zeroed_outputs, KernelBuilder};
use half::{bf16, f16};
use ndfuse_codegen_cpu::{f32_ulp_bound, POW_F32_ULP};
use ndfuse_ir::interp::eval_kernel;
use ndfuse_ir::round::{int_to_float, to_bf16, to_f16};
use ndfuse_ir::{
    Accumulate, ArgReduceOp, BinaryOp, DType, Expr, HostArray, Instr, Kernel, Plan, Scalar, Shape,
    Storage, UnaryOp, ValueId, View,
};

const HALVES: [DType; 2] = [DType::F16, DType::BF16];

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn bits32(&mut self) -> u32 {
        ((self.next() << 16) ^ self.next()) as u32
    }
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 31) as f64
    }
}

/// The 16 bits of element `i` of a half array.
fn bits_at(a: &HostArray, i: usize) -> u16 {
    match a.storage() {
        Storage::F16(v) => v[i].to_bits(),
        Storage::BF16(v) => v[i].to_bits(),
        other => panic!("not a half array: {other:?}"),
    }
}

/// The bits of every element of a float array (f16/bf16 as u16, f32 as u32, f64 as
/// u64), for exact comparison, NaN payloads included.
fn all_bits(a: &HostArray) -> Vec<u64> {
    match a.storage() {
        Storage::F16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::BF16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
        _ => (0..a.len())
            .map(|i| a.storage().get_f64(i).to_bits())
            .collect(),
    }
}

/// A 1-d half array holding exactly `bits`.
fn from_bits(dtype: DType, bits: &[u16]) -> HostArray {
    let storage = match dtype {
        DType::F16 => Storage::F16(bits.iter().map(|&b| f16::from_bits(b)).collect()),
        DType::BF16 => Storage::BF16(bits.iter().map(|&b| bf16::from_bits(b)).collect()),
        _ => panic!("{dtype} is not a half type"),
    };
    HostArray::new(Shape::new([bits.len()]), storage).expect("length matches")
}

fn host(dtype: DType, shape: &[usize], vals: &[f64]) -> HostArray {
    HostArray::from_f64s(dtype, Shape::new(shape), vals)
}

/// A view of `n` elements reading a buffer of `n` backwards (the scalar, strided path).
fn reversed(n: usize) -> View {
    view(&[n], &[-1], n as isize - 1)
}

/// Runs `kernel` through the JIT and the interpreter; every output must have the same
/// bits, or (`any_nan`) be a NaN where the reference has one.
fn exact(kernel: &Kernel, inputs: &[&HostArray], what: &str) {
    exact_nan(kernel, inputs, what, false);
}

fn exact_nan(kernel: &Kernel, inputs: &[&HostArray], what: &str, any_nan: bool) {
    let want = eval_kernel(kernel, inputs).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    let got = run(kernel, inputs);
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.dtype(), w.dtype(), "{what}: out{o} dtype");
        if !g.dtype().is_float() {
            assert_eq!(g.storage(), w.storage(), "{what}: out{o}\n{kernel}");
            continue;
        }
        let (gb, wb) = (all_bits(g), all_bits(w));
        for i in 0..gb.len() {
            let nans = g.storage().get_f64(i).is_nan() && w.storage().get_f64(i).is_nan();
            if any_nan && nans {
                continue;
            }
            assert_eq!(
                gb[i],
                wb[i],
                "{what}: out{o}[{i}] = {:?} ({:#x}), reference {:?} ({:#x}); input0 {:?}",
                g.storage().get_f64(i),
                gb[i],
                w.storage().get_f64(i),
                wb[i],
                inputs
                    .first()
                    .map(|a| a.storage().get_f64(i % a.len().max(1)))
            );
        }
    }
}

/// Position of `bits` of a half type on the number line, so that adjacent values differ
/// by 1 (±0 both 0).
fn ordinal(bits: u16) -> i32 {
    let mag = i32::from(bits & 0x7FFF);
    if bits & 0x8000 != 0 {
        -mag
    } else {
        mag
    }
}

/// The spacing of the half type `dtype` at `x` (its ulp there, subnormals included).
fn half_ulp(x: f64, dtype: DType) -> f64 {
    let (mant, min_exp) = match dtype {
        DType::F16 => (10, -14),
        _ => (7, -126),
    };
    let e = if x == 0.0 {
        min_exp
    } else {
        (x.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - mant)
}

// ---------------------------------------------------------------------------------------
// Loads, stores, casts.
// ---------------------------------------------------------------------------------------

#[test]
fn every_bit_pattern_round_trips_through_load_and_store() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for d in HALVES {
        let input = from_bits(d, &all);
        let n = all.len();
        // Contiguous: the vector loop; reversed: the scalar loop with a strided load.
        for (how, v) in [
            ("contiguous", View::contiguous(Shape::new([n]))),
            ("reversed", reversed(n)),
        ] {
            let mut kb = KernelBuilder::new("k0_copy", &[n]);
            let x = kb.load_view(d, n, v.clone());
            kb.store(x);
            let k = kb.build();
            // The path this case is meant to take: four halves a load (or whole registers
            // of them on the wide path, `NDFUSE_CPU_WIDE`), or one.
            let clif = compiled(&k).clif().to_string();
            let vector = clif.contains("uload16x4") || clif.contains("; blocks of");
            assert_eq!(vector, how == "contiguous", "{d} {how}");
            let got = &run(&k, &[&input])[0];
            for i in 0..n {
                let src = if how == "reversed" { n - 1 - i } else { i };
                let b = all[src];
                let is_nan = match d {
                    DType::F16 => f16::from_bits(b).is_nan(),
                    _ => bf16::from_bits(b).is_nan(),
                };
                // A NaN comes back quiet, payload kept; everything else unchanged.
                let quiet = if d == DType::F16 { 0x0200 } else { 0x0040 };
                let want = if is_nan { b | quiet } else { b };
                assert_eq!(bits_at(got, i), want, "{d} {how}: {b:#06x}");
            }
            exact(&k, &[&input], &format!("{d} copy {how}"));
        }
        // Widened to f32 and to f64: exact, as the `half` crate widens.
        for to in [DType::F32, DType::F64] {
            let mut kb = KernelBuilder::new("k0_widen", &[n]);
            let x = kb.load(d);
            let y = kb.cast(x, to);
            kb.store(y);
            let k = kb.build();
            let got = &run(&k, &[&input])[0];
            for (i, &b) in all.iter().enumerate() {
                let want = match d {
                    DType::F16 => f16::from_bits(b).to_f64(),
                    _ => bf16::from_bits(b).to_f64(),
                };
                let g = got.storage().get_f64(i);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{d} -> {to}: {b:#06x} gave {g:?}, want {want:?}"
                );
            }
            exact(&k, &[&input], &format!("{d} -> {to}"));
        }
    }
}

/// f32 values where rounding to `d` is delicate: every value of `d` as an f32, every
/// midpoint between neighbours (a tie) and the f32s either side of it, the overflow
/// thresholds, f32 subnormals, NaNs with payloads, then `random` random bit patterns.
fn rounding_sample(d: DType, random: usize) -> Vec<f32> {
    let widen = |b: u16| -> f32 {
        match d {
            DType::F16 => f16::from_bits(b).to_f32(),
            _ => bf16::from_bits(b).to_f32(),
        }
    };
    let max_finite: u16 = if d == DType::F16 { 0x7BFF } else { 0x7F7F };
    let mut v = Vec::new();
    for b in 0..=max_finite {
        let lo = widen(b);
        let hi = widen(b + 1); // the next value up; infinity after the largest
        let mid = if hi.is_infinite() {
            // The overflow threshold: max + half an ulp.
            lo + (lo - widen(b - 1)) / 2.0
        } else {
            (lo + hi) / 2.0 // exact: one more bit than the half type
        };
        for x in [
            lo,
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ] {
            v.push(x);
            v.push(-x);
        }
    }
    v.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007F_FFFF),
        65504.0,
        65519.996,
        65520.0,
        65536.0,
        3.4e38,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001), // signalling, payload only in low bits
        f32::from_bits(0x7FBF_FFFF),
        f32::from_bits(0xFFC0_2000),
        f32::from_bits(0x7FE1_2345),
    ]);
    let mut rng = Lcg(0x5eed ^ d.size_bytes() as u64);
    v.extend((0..random).map(|_| f32::from_bits(rng.bits32())));
    v
}

#[test]
fn f32_to_half_rounds_to_nearest_even_once() {
    for d in HALVES {
        let xs = rounding_sample(d, 1 << 20);
        // An odd length: vector loop and scalar tail.
        let n = xs.len() | 1;
        let mut vals = xs.clone();
        vals.resize(n, 0.5);
        let input = HostArray::new(Shape::new([n]), Storage::F32(vals.clone())).expect("length");
        for (how, v) in [
            ("contiguous", View::contiguous(Shape::new([n]))),
            ("reversed", reversed(n)),
        ] {
            let mut kb = KernelBuilder::new("k0_round", &[n]);
            let x = kb.load_view(DType::F32, n, v);
            let y = kb.cast(x, d);
            kb.store(y);
            let k = kb.build();
            let got = &run(&k, &[&input])[0];
            for i in 0..n {
                let x = if how == "reversed" {
                    vals[n - 1 - i]
                } else {
                    vals[i]
                };
                // The `half` crate rounds f32 correctly (hardware F16C where present).
                let want = match d {
                    DType::F16 => f16::from_f32(x).to_bits(),
                    _ => bf16::from_f32(x).to_bits(),
                };
                let reference = match d {
                    DType::F16 => to_f16(f64::from(x)).to_bits(),
                    _ => to_bf16(f64::from(x)).to_bits(),
                };
                assert_eq!(
                    reference, want,
                    "{d}: the reference and `half` agree on {x:e}"
                );
                assert_eq!(
                    bits_at(got, i),
                    want,
                    "{d} {how}: {x:e} ({:#010x})",
                    x.to_bits()
                );
            }
        }
    }
}

#[test]
fn f64_and_integer_casts_to_half_round_once() {
    for d in HALVES {
        // f64: every f32 of the sample, then values just off the ties by less than an
        // f32 ulp (rounding to f32 first would make them ties and round them to even).
        let mut xs: Vec<f64> = rounding_sample(d, 1 << 16)
            .into_iter()
            .map(f64::from)
            .collect();
        let mut rng = Lcg(99);
        for _ in 0..(1 << 16) {
            let x = xs[(rng.next() as usize) % xs.len()];
            let tiny = x.abs() * 2f64.powi(-30 - (rng.next() % 20) as i32);
            xs.push(x + tiny);
            xs.push(x - tiny);
        }
        xs.extend([
            2049.0 + 2f64.powi(-30),
            1e300,
            -1e300,
            1e-300,
            65519.99999999,
            65520.0,
        ]);
        let input = host(DType::F64, &[xs.len()], &xs);
        let mut kb = KernelBuilder::new("k0_f64_half", &[xs.len()]);
        let x = kb.load(DType::F64);
        let y = kb.cast(x, d);
        kb.store(y);
        let k = kb.build();
        let got = &run(&k, &[&input])[0];
        for (i, &x) in xs.iter().enumerate() {
            let want = match d {
                DType::F16 => to_f16(x).to_bits(),
                _ => to_bf16(x).to_bits(),
            };
            assert_eq!(bits_at(got, i), want, "{d}: f64 {x:e}");
        }
        exact(&k, &[&input], &format!("f64 -> {d}"));

        // Integers: near powers of two, ties of 11 and 8 significant bits with and
        // without sticky bits, the extremes.
        let mut ints: Vec<i64> = vec![0, 1, -1, 2049, 2051, 4097, 65504, 65519, 65520, 65536];
        for s in 0..63 {
            let p = 1i64 << s;
            for off in [-3, -1, 0, 1, 3] {
                ints.push(p.wrapping_add(off));
                ints.push(p.wrapping_add(off).wrapping_neg());
            }
            // A tie at 8 and 11 bits, then the same plus a sticky bit far below.
            for bits in [8, 11] {
                if s > bits {
                    let tie = p + (p >> bits);
                    ints.extend([tie, tie + 1, -tie, -tie - 1, tie + (p >> (bits - 1))]);
                }
            }
        }
        ints.extend([i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1]);
        ints.extend((0..4096).map(|_| (rng.next() << 31 ^ rng.next()) as i64 >> (rng.next() % 60)));
        for from in [DType::I64, DType::I32] {
            let vals: Vec<i64> = if from == DType::I32 {
                ints.iter().map(|&v| i64::from(v as i32)).collect()
            } else {
                ints.clone()
            };
            let storage = if from == DType::I32 {
                Storage::I32(vals.iter().map(|&v| v as i32).collect())
            } else {
                Storage::I64(vals.clone())
            };
            let input = HostArray::new(Shape::new([vals.len()]), storage).expect("length");
            let mut kb = KernelBuilder::new("k0_int_half", &[vals.len()]);
            let x = kb.load(from);
            let y = kb.cast(x, d);
            kb.store(y);
            let k = kb.build();
            let got = &run(&k, &[&input])[0];
            for (i, &v) in vals.iter().enumerate() {
                let want = int_to_float(v, d);
                let g = got.storage().get_f64(i);
                assert_eq!(g.to_bits(), want.to_bits(), "{from} {v} -> {d}");
            }
            exact(&k, &[&input], &format!("{from} -> {d}"));
        }
    }
}

#[test]
fn every_cast_to_and_from_half() {
    let dtypes = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];
    for from in dtypes {
        let xs = values(from, 500, 3);
        let input = host(from, &[xs.len()], &xs);
        for to in dtypes {
            if !from.is_half() && !to.is_half() {
                continue;
            }
            let mut kb = KernelBuilder::new("k0_cast", &[xs.len()]);
            let x = kb.load(from);
            let y = kb.cast(x, to);
            kb.store(y);
            exact(&kb.build(), &[&input], &format!("cast {from} -> {to}"));
        }
    }
    // A cast to the same half type rounds the f32 arithmetic before it (x * 1.001
    // is not a half value); a cast of a computed half value to f32 does not round.
    for d in HALVES {
        let xs = values(d, 300, 5);
        let input = host(d, &[xs.len()], &xs);
        for to in [d, DType::F32] {
            let mut kb = KernelBuilder::new("k0_mul_cast", &[xs.len()]);
            let x = kb.load(d);
            let c = kb.constant(d, Scalar::F(1.001).cast(d));
            let m = kb.binary(BinaryOp::Mul, x, c);
            let y = kb.cast(m, to);
            let z = kb.binary(BinaryOp::Add, y, y);
            kb.store(z);
            exact(
                &kb.build(),
                &[&input],
                &format!("{d} mul, cast to {to}, add"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Ops.
// ---------------------------------------------------------------------------------------

/// Test values of `dtype`: special values of the half types (overflow, subnormals,
/// ties of rounding functions), then a spread of magnitudes; other dtypes get a spread
/// of their own.
fn values(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Lcg(seed);
    let mut v: Vec<f64> = match dtype {
        DType::Bool => vec![0.0, 1.0],
        DType::I32 | DType::I64 => {
            vec![0.0, 1.0, -1.0, 2049.0, 65519.0, 65520.0, 1e6, -2147483648.0]
        }
        _ => vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -0.5,
            2.5,
            -3.5,
            65504.0,
            -65504.0,
            6e-8,
            -3e-5,
            1e-5,
            3e38,
            1e-39,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ],
    };
    while v.len() < n {
        let x = match dtype {
            DType::Bool => (rng.next() % 2) as f64,
            DType::I32 | DType::I64 => (rng.next() % 200_001) as f64 - 100_000.0,
            _ => {
                let sign = if rng.next().is_multiple_of(2) {
                    1.0
                } else {
                    -1.0
                };
                let mag = if rng.next().is_multiple_of(4) {
                    10f64.powf(rng.unit() * 12.0 - 8.0)
                } else {
                    rng.unit() * 12.0
                };
                sign * mag
            }
        };
        v.push(x);
    }
    v.truncate(n.max(v.len().min(n)));
    v
}

/// Whether `op`'s f32 form is exact IEEE code, so exact after rounding to half: ops
/// without a documented error bound in the inline math library.
fn inline_unary(op: UnaryOp) -> bool {
    f32_ulp_bound(op).is_none()
}

/// Runs `kernel` through the JIT and the interpreter and compares its one half output:
/// the same bits, or (`one_ulp`) at most 1 ulp of the half type apart, both NaN or
/// neither. Returns the largest distance in ulps.
fn compare_ops(kernel: &Kernel, inputs: &[&HostArray], what: &str, one_ulp: bool) -> i32 {
    if !one_ulp {
        exact_nan(kernel, inputs, what, true);
        return 0;
    }
    let want = eval_kernel(kernel, inputs).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    let got = run(kernel, inputs);
    let (g, w) = (&got[0], &want[0]);
    let mut worst = 0;
    for i in 0..g.len() {
        let (gb, wb) = (bits_at(g, i), bits_at(w, i));
        let (gv, wv) = (g.storage().get_f64(i), w.storage().get_f64(i));
        let far = if gv.is_nan() || wv.is_nan() {
            if gv.is_nan() == wv.is_nan() {
                0
            } else {
                i32::MAX
            }
        } else {
            (ordinal(gb) - ordinal(wb)).abs()
        };
        assert!(
            far <= 1,
            "{what}: out[{i}] = {gv:?}, reference {wv:?} ({far} ulp); input {:?}",
            inputs[0].storage().get_f64(i % inputs[0].len())
        );
        worst = worst.max(far);
    }
    worst
}

#[test]
fn every_unary_op_contiguous_and_strided() {
    for d in HALVES {
        let xs = values(d, 1001, 7);
        let n = xs.len();
        let input = host(d, &[n], &xs);
        for op in UnaryOp::ALL.into_iter().filter(|&op| op != UnaryOp::Not) {
            for (how, v) in [
                ("contiguous", View::contiguous(Shape::new([n]))),
                ("reversed", reversed(n)),
            ] {
                let mut kb = KernelBuilder::new(&format!("k0_{}", op.name()), &[n]);
                let x = kb.load_view(d, n, v);
                let y = kb.unary(op, x);
                kb.store(y);
                let what = format!("{} {d} {how}", op.name());
                let worst = compare_ops(&kb.build(), &[&input], &what, !inline_unary(op));
                if worst > 0 {
                    eprintln!("{what}: max {worst} ulp");
                }
            }
        }
    }
}

#[test]
fn every_binary_op_contiguous_strided_and_broadcast() {
    let (rows, cols) = (23, 29);
    for d in HALVES {
        // Every pair of special values, then random pairs.
        let base = values(d, 0, 1);
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for &a in &base {
            for &b in &base {
                xs.push(a);
                ys.push(b);
            }
        }
        let n = rows * cols;
        xs.extend(values(d, n, 11).into_iter().skip(base.len()));
        ys.extend(values(d, n, 13).into_iter().skip(base.len()));
        xs.truncate(n);
        ys.truncate(n);
        let (a, b) = (host(d, &[n], &xs), host(d, &[n], &ys));
        let row = host(d, &[cols], &values(d, cols, 17));
        let contiguous = View::contiguous(Shape::new([rows, cols]));
        // The transpose of a [cols, rows] buffer.
        let transposed = View::contiguous(Shape::new([cols, rows])).permute(&[1, 0]);
        for op in BinaryOp::ALL {
            if op.is_logical() {
                continue;
            }
            for how in ["contiguous", "transposed", "broadcast"] {
                let mut kb = KernelBuilder::new(&format!("k0_{}", op.name()), &[rows, cols]);
                let (x, y, inputs) = match how {
                    "contiguous" => (
                        kb.load_view(d, n, contiguous.clone()),
                        kb.load_view(d, n, contiguous.clone()),
                        [&a, &b],
                    ),
                    "transposed" => (
                        kb.load_view(d, n, transposed.clone()),
                        kb.load_view(d, n, contiguous.clone()),
                        [&a, &b],
                    ),
                    _ => (
                        kb.load_view(d, n, contiguous.clone()),
                        kb.load_view(d, cols, view(&[rows, cols], &[0, 1], 0)),
                        [&a, &row],
                    ),
                };
                let z = kb.binary(op, x, y);
                kb.store(z);
                let what = format!("{} {d} {how}", op.name());
                let one_ulp = op == BinaryOp::Pow && POW_F32_ULP > 0;
                let worst = compare_ops(&kb.build(), &inputs, &what, one_ulp);
                if worst > 0 {
                    eprintln!("{what}: max {worst} ulp");
                }
            }
        }
    }
}

#[test]
fn fused_half_arithmetic_rounds_only_at_the_store() {
    // gelu (tanh form) and a chain whose intermediate values are not half values:
    // the reference keeps them in f32, so must the JIT.
    for d in HALVES {
        let n = 4099;
        let xs = values(d, n, 21);
        let input = host(d, &[n], &xs);
        let mut kb = KernelBuilder::new("k0_gelu", &[n]);
        let x = kb.load(d);
        let c = |kb: &mut KernelBuilder, v: f64| kb.constant(d, Scalar::F(v).cast(d));
        let x3 = kb.binary(BinaryOp::Mul, x, x);
        let x3 = kb.binary(BinaryOp::Mul, x3, x);
        let k0 = c(&mut kb, 0.044715);
        let t = kb.binary(BinaryOp::Mul, x3, k0);
        let t = kb.binary(BinaryOp::Add, x, t);
        let k1 = c(&mut kb, 0.7978845608);
        let t = kb.binary(BinaryOp::Mul, t, k1);
        let t = kb.unary(UnaryOp::Tanh, t);
        let one = c(&mut kb, 1.0);
        let t = kb.binary(BinaryOp::Add, t, one);
        let half = c(&mut kb, 0.5);
        let h = kb.binary(BinaryOp::Mul, x, half);
        let y = kb.binary(BinaryOp::Mul, h, t);
        kb.store(y);
        compare_ops(&kb.build(), &[&input], &format!("gelu {d}"), true);

        let mut kb = KernelBuilder::new("k0_mul_add_div", &[n]);
        let x = kb.load(d);
        let third = c(&mut kb, 3.0);
        let y = kb.binary(BinaryOp::Div, x, third);
        let y = kb.binary(BinaryOp::Mul, y, y);
        let y = kb.binary(BinaryOp::Sub, y, x);
        let y = kb.unary(UnaryOp::Sqrt, y);
        let big = kb.binary(BinaryOp::Gt, y, third);
        let y = kb.select(big, y, x);
        kb.store(y);
        compare_ops(&kb.build(), &[&input], &format!("fused {d}"), false);
    }
}

// ---------------------------------------------------------------------------------------
// Row programs.
// ---------------------------------------------------------------------------------------

/// `kernel` with every summed term replaced by its absolute value (as in `reduce.rs`).
fn abs_terms(kernel: &Kernel) -> Kernel {
    let mut k = kernel.clone();
    let mut body: Vec<Instr> = Vec::new();
    let mut map: Vec<ValueId> = Vec::new();
    let re = |map: &[ValueId], v: ValueId| map[v.index()];
    for ins in &kernel.body {
        let expr = match &ins.expr {
            Expr::Reduce(Accumulate::Sum, a) => {
                body.push(Instr {
                    dtype: ins.dtype,
                    expr: Expr::Unary(UnaryOp::Abs, re(&map, *a)),
                });
                Expr::Reduce(Accumulate::Sum, ValueId(body.len() as u32 - 1))
            }
            e => e.map_operands(|v| re(&map, v)),
        };
        body.push(Instr {
            dtype: ins.dtype,
            expr,
        });
        map.push(ValueId(body.len() as u32 - 1));
    }
    for s in &mut k.stores {
        s.value = map[s.value.index()];
    }
    k.body = body;
    k
}

/// Runs `kernel` through the JIT and the interpreter and compares every output within
/// the accumulation tolerance (see the module docs); integer outputs exactly.
fn compare_rows(kernel: &Kernel, inputs: &[&HostArray], what: &str) {
    let want = eval_kernel(kernel, inputs).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    let scale = eval_kernel(&abs_terms(kernel), inputs).expect("abs kernel");
    let got = run(kernel, inputs);
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        let dtype = g.dtype();
        if !dtype.is_float() {
            assert_eq!(g.storage(), w.storage(), "{what}: out{o}\n{kernel}");
            continue;
        }
        for i in 0..g.len() {
            let (gv, wv) = (g.storage().get_f64(i), w.storage().get_f64(i));
            if gv.to_bits() == wv.to_bits() || (gv.is_nan() && wv.is_nan()) {
                continue;
            }
            let s = scale[o].storage().get_f64(i).abs();
            let mut limit = 1e-5 * wv.abs() + 1e-6 * s;
            if dtype.is_half() {
                limit += half_ulp(gv.abs().max(wv.abs()), dtype);
            }
            assert!(
                (gv - wv).abs() <= limit,
                "{what}: out{o}[{i}] = {gv:?}, reference {wv:?} (limit {limit:e})\n{kernel}"
            );
        }
    }
}

/// Row values in [-8, 8) with signed zeros and ties for max/min.
fn row_values(d: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Lcg(seed);
    (0..n)
        .map(|_| match rng.next() % 16 {
            0 => 0.0,
            1 => -0.0,
            2 => 3.0,
            _ => (rng.unit() * 16.0 - 8.0) * 0.999,
        })
        .map(|x| ndfuse_ir::round::round_f64(x, d))
        .collect()
}

/// Sum, max, min, argmax over `axes` of `domain`, stored per row, with `plan`.
fn reductions(d: DType, domain: &[usize], axes: &[usize], plan: Option<Plan>) -> Kernel {
    let mut kb = KernelBuilder::new("k0_sum_max_min", domain);
    kb.reduce_over(axes);
    if let Some(p) = plan {
        kb.plan(p);
    }
    let x = kb.load(d);
    let s = kb.reduce(Accumulate::Sum, x);
    let m = kb.reduce(Accumulate::Max, x);
    let n = kb.reduce(Accumulate::Min, x);
    kb.store_rows(s);
    kb.store_rows(m);
    kb.store_rows(n);
    if axes.len() == 1 {
        let a = kb.arg_reduce(ArgReduceOp::ArgMax, x);
        kb.store_rows(a);
    }
    kb.build()
}

#[test]
fn half_sums_under_every_plan() {
    for d in HALVES {
        let (r, c) = (37, 531);
        let x = host(d, &[r, c], &row_values(d, r * c, 3));
        let cases = [
            ("rows", reductions(d, &[r, c], &[1], None)),
            ("strided rows", reductions(d, &[r, c], &[0], None)),
            (
                "columns",
                reductions(
                    d,
                    &[r, c],
                    &[0],
                    Some(Plan::Columns {
                        cols: c,
                        col_len: r,
                    }),
                ),
            ),
            (
                "split",
                reductions(
                    d,
                    &[r, c],
                    &[1],
                    Some(Plan::Split {
                        rows: r,
                        row_len: c,
                        splits: 4,
                    }),
                ),
            ),
            ("all", reductions(d, &[r, c], &[0, 1], None)),
        ];
        for (how, k) in cases {
            compare_rows(&k, &[&x], &format!("{d} {how}"));
        }
        // A long sum: the f32 accumulator keeps what a half one would lose (2049 ones
        // sum to 2049, not 2048).
        let ones = host(d, &[1, 4099], &vec![1.0; 4099]);
        let k = reductions(d, &[1, 4099], &[1], None);
        let got = run(&k, &[&ones]);
        let want = ndfuse_ir::round::round_f64(4099.0, d);
        assert_eq!(got[0].storage().get_f64(0), want, "{d}: sum of ones");
    }
}

/// `softmax(x)` over `axis` of `domain` read through `xview`.
fn softmax(d: DType, domain: &[usize], axis: usize, len: usize, xview: View) -> Kernel {
    let mut kb = KernelBuilder::new("k0_max_sub_exp_sum_div", domain);
    kb.reduce_over(&[axis]);
    let x = kb.load_view(d, len, xview);
    let m = kb.reduce(Accumulate::Max, x);
    let s = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, s);
    let t = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, t);
    kb.store(o);
    kb.build()
}

/// `layernorm(x)` over the last axis of [rows, cols]: `(x - mean) * rsqrt(var + eps)`.
fn layernorm(d: DType, rows: usize, cols: usize) -> Kernel {
    let mut kb = KernelBuilder::new("k0_layernorm", &[rows, cols]);
    kb.reduce_over(&[1]);
    let x = kb.load(d);
    let inv_n = kb.constant(d, Scalar::F(1.0 / cols as f64).cast(d));
    let eps = kb.constant(d, Scalar::F(1e-5).cast(d));
    let s = kb.reduce(Accumulate::Sum, x);
    let mean = kb.binary(BinaryOp::Mul, s, inv_n);
    let c = kb.binary(BinaryOp::Sub, x, mean);
    let sq = kb.unary(UnaryOp::Square, c);
    let v = kb.reduce(Accumulate::Sum, sq);
    let var = kb.binary(BinaryOp::Mul, v, inv_n);
    let ve = kb.binary(BinaryOp::Add, var, eps);
    let r = kb.unary(UnaryOp::Rsqrt, ve);
    let y = kb.binary(BinaryOp::Mul, c, r);
    kb.store(y);
    kb.build()
}

#[test]
fn half_softmax_and_layernorm() {
    for d in HALVES {
        let (r, c) = (9, 301);
        let x = host(d, &[r, c], &row_values(d, r * c, 5));
        let n = r * c;
        let contiguous = View::contiguous(Shape::new([r, c]));
        let k = softmax(d, &[r, c], 1, n, contiguous.clone());
        compare_rows(&k, &[&x], &format!("{d} softmax rows"));
        let k = softmax(d, &[r, c], 0, n, contiguous.clone());
        compare_rows(&k, &[&x], &format!("{d} softmax strided"));
        let mut k = softmax(d, &[r, c], 0, n, contiguous);
        k.plan = Plan::Columns {
            cols: c,
            col_len: r,
        };
        compare_rows(&k, &[&x], &format!("{d} softmax columns"));
        let t = View::contiguous(Shape::new([r, c])).permute(&[1, 0]);
        let k = softmax(d, &[c, r], 1, n, t);
        compare_rows(&k, &[&x], &format!("{d} softmax transposed"));
        let mut k = softmax(d, &[r, c], 1, n, View::contiguous(Shape::new([r, c])));
        k.plan = Plan::Split {
            rows: r,
            row_len: c,
            splits: 3,
        };
        compare_rows(&k, &[&x], &format!("{d} softmax split"));

        let k = layernorm(d, r, c);
        compare_rows(&k, &[&x], &format!("{d} layernorm"));
        let mut k = layernorm(d, r, c);
        k.plan = Plan::Split {
            rows: r,
            row_len: c,
            splits: 4,
        };
        compare_rows(&k, &[&x], &format!("{d} layernorm split"));
    }
}

#[test]
fn half_results_do_not_depend_on_threads_or_ranges() {
    // One call over everything, and the parallel run, give the same bits.
    for d in HALVES {
        let (r, c) = (64, 1000);
        let x = host(d, &[r, c], &row_values(d, r * c, 9));
        let k = layernorm(d, r, c);
        let ck = compiled(&k);
        let mut whole = zeroed_outputs(&k);
        ck.run(&[&x], &mut whole.iter_mut().collect::<Vec<_>>())
            .expect("arguments fit");
        let mut ranged = zeroed_outputs(&k);
        for (lo, hi) in [(0, 7), (7, 40), (40, 64)] {
            ck.run_range(&[&x], &mut ranged.iter_mut().collect::<Vec<_>>(), lo, hi)
                .expect("arguments fit");
        }
        assert_eq!(all_bits(&whole[0]), all_bits(&ranged[0]), "{d}");
    }
}

// ---------------------------------------------------------------------------------------
// Generated code.
// ---------------------------------------------------------------------------------------

/// `a * b` of f16 over 10 elements: the vector loop (four halves a `uload16x4`, widened
/// in integer ops; the f32 product rounded back in integer ops and narrowed to four
/// 16-bit lanes), then the scalar loop (`uload16`, `istore16`) for the last two.
#[test]
fn clif_f16_mul() {
    let mut kb = KernelBuilder::new("k0_mul", &[10]);
    let a = kb.load(DType::F16);
    let b = kb.load(DType::F16);
    let m = kb.binary(BinaryOp::Mul, a, b);
    kb.store(m);
    let k = kb.build();
    let ck = compiled(&k);
    insta::assert_snapshot!(ck.clif());
    let xs: Vec<f64> = (0..10).map(|i| f64::from(i) * 0.7 - 3.0).collect();
    let ys: Vec<f64> = (0..10).map(|i| 1e4 - f64::from(i) * 3e3).collect();
    let (x, y) = (host(DType::F16, &[10], &xs), host(DType::F16, &[10], &ys));
    exact(&k, &[&x, &y], "f16 * f16");
}
