//! Row programs on the wide path (their wide values made a whole row at a time in the
//! row cache by the AVX-512/AVX2 routines) against the same kernels on the 128-bit
//! code alone, for softmax on f32, f16 and bf16 at rows of 4096, 1007 and 5 elements,
//! a log-sum-exp, a row program whose tanh and sigmoid are cached, a chain of two wide
//! ops in one sweep, and a row read across a transposed view; on 1, 2 and 4 threads.
//! Each checks that the wide path called the routines and that the 128-bit code did
//! not, and that every tier and thread count gives the same bits.
//! Kernels below 2^16 positions stay on the 128-bit code (as element-wise ones do).
//! Tolerance: the same bits (two NaNs count as equal whatever their payload), except
//! where a sweep is the wide row sum (`ndfuse_wide_sum`, its own order of additions):
//! there within 2nε (n-term sums, ε = 2^-24) of the 128-bit code (see [`Tol`]).
//! The row sum itself: its order transcribed here (the same bits), within n·ε·Σ|x| of
//! an f64 sum, NaN and infinities as a sum; the shifted exp (`ndfuse_wide_exp_shift`):
//! the bits of the subtraction then the exp routine; the row max (`ndfuse_wide_max`):
//! IEEE `maximum` (NaN, +0 above -0) on every tier, a row-max kernel the 128-bit bits;
//! the row division (`ndfuse_wide_div`, and `_stream` with non-temporal stores at any
//! alignment): IEEE division, and in a kernel the 128-bit bits.

mod builder;
mod paths;

use builder::{view, KernelBuilder};
use ndfuse_codegen_cpu::compile_with;
use ndfuse_codegen_cpu::wide;
use ndfuse_ir::{Accumulate, BinaryOp, DType, HostArray, Kernel, Shape, UnaryOp};
use paths::{bits, run_on, tiers};

/// Inputs of `kernel` (see `paths::inputs`).
fn inputs(kernel: &Kernel) -> Vec<HostArray> {
    paths::inputs(kernel, 0x9E37_79B9_7F4A_7C15, 4999)
}

/// How close the wide path must come to the 128-bit code.
#[derive(Clone, Copy, Debug)]
enum Tol {
    /// The same bits: no sum of the kernel is the wide row sum.
    Bits,
    /// A sum of the kernel over rows of `n` elements is the wide row sum
    /// (`ndfuse_wide_sum`), whose order of additions differs from the 128-bit loop's.
    /// Each n-term f32 sum is within n·ε·Σ|x| of the exact one (ε = 2^-24), so the two
    /// differ by at most 2nε·Σ|x|; in these kernels that moves an output by at most
    /// 2nε relative to max(|output|, 1) (softmax: Σ|e| = s, a relative error of s;
    /// log-sum-exp: log s moves by at most 2nε absolute; a mean of tanh values, |t| <= 1,
    /// moves sigmoid(t - mean)·t by at most 2nε relative), plus 4ε for the roundings
    /// after it. NaN only against NaN, an infinity only against the same one.
    SumOf(usize),
}

impl Tol {
    fn holds(self, got: f64, want: f64) -> bool {
        if got.is_nan() || want.is_nan() {
            return got.is_nan() && want.is_nan();
        }
        match self {
            Tol::Bits => got.to_bits() == want.to_bits(),
            Tol::SumOf(_) if got.is_infinite() || want.is_infinite() => got == want,
            Tol::SumOf(n) => {
                let eps = f64::powi(2.0, -24);
                (got - want).abs() <= (2.0 * n as f64 * eps + 4.0 * eps) * want.abs().max(1.0)
            }
        }
    }
}

/// `kernel` with the wide routines of every tier comes within `tol` of the 128-bit
/// code, and calls each routine of `routines` (and, with `Tol::SumOf`, the wide row
/// sum) only on the wide path. Every tier and thread count gives the same bits.
fn check(kernel: &Kernel, routines: &[UnaryOp], tol: Tol) {
    let ins = inputs(kernel);
    let narrow = compile_with(kernel, None).expect("compiles on the 128-bit code");
    let mut names: Vec<String> = routines
        .iter()
        .map(|op| format!("ndfuse_wide_{}", op.name()))
        .collect();
    if let Tol::SumOf(_) = tol {
        names.push("ndfuse_wide_sum".to_string());
    }
    for name in &names {
        assert!(
            !narrow.clif().contains(name),
            "{}: None calls {name}",
            kernel.name
        );
    }
    let want = run_on(&narrow, kernel, &ins, 2);
    // A row with an ordinary value somewhere: the comparison is not of NaNs only.
    assert!(
        want.iter()
            .map(bits)
            .any(|o| o.iter().any(|&b| b != u64::MAX)),
        "{}: every output is NaN",
        kernel.name
    );
    let mut wide_bits: Option<Vec<Vec<u64>>> = None;
    for tier in tiers() {
        let ck = compile_with(kernel, Some(tier)).expect("compiles on the wide path");
        for name in &names {
            assert!(
                ck.clif().contains(name),
                "{} ({}): no call of {name}\n{}",
                kernel.name,
                tier.name(),
                ck.clif()
            );
        }
        if let Tol::Bits = tol {
            assert!(
                !ck.clif().contains("ndfuse_wide_sum"),
                "{} ({}): the wide row sum where the bits must stay",
                kernel.name,
                tier.name()
            );
        }
        for threads in [1, 2, 4] {
            let got = run_on(&ck, kernel, &ins, threads);
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                let (g, w) = (g.storage(), w.storage());
                if let Some(i) = (0..g.len()).find(|&i| !tol.holds(g.get_f64(i), w.get_f64(i))) {
                    panic!(
                        "{} ({}, {threads} threads) output {o} position {i}: {} against {} \
                         on the 128-bit code ({tol:?})",
                        kernel.name,
                        tier.name(),
                        g.get_f64(i),
                        w.get_f64(i)
                    );
                }
            }
            let got_bits: Vec<Vec<u64>> = got.iter().map(bits).collect();
            match &wide_bits {
                None => wide_bits = Some(got_bits),
                Some(first) => assert!(
                    first == &got_bits,
                    "{} ({}, {threads} threads): other bits than the first tier on 1 thread",
                    kernel.name,
                    tier.name()
                ),
            }
        }
    }
}

/// The tolerance of a kernel whose sum over rows of `len` is of a wide `dtype` value:
/// f32 ones are summed by the wide row sum; f16 and bf16 ones keep the 128-bit loop.
fn sum_tol(dtype: DType, len: usize) -> Tol {
    match dtype {
        DType::F32 => Tol::SumOf(len),
        _ => Tol::Bits,
    }
}

/// softmax over the rows of [rows, len]: m = max x; e = exp(x - m); s = sum e; e / s.
fn softmax(dtype: DType, rows: usize, len: usize) -> Kernel {
    let mut kb = KernelBuilder::new(&format!("k_softmax_{dtype}_{len}"), &[rows, len]);
    kb.reduce_over(&[1]);
    let x = kb.load(dtype);
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let s = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    kb.build()
}

#[test]
fn softmax_on_every_float_type_and_row_length_matches_the_128_bit_code() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, len) in [(24, 4096), (67, 1000 + 7), (13_200, 5)] {
            check(
                &softmax(dtype, rows, len),
                &[UnaryOp::Exp],
                sum_tol(dtype, len),
            );
        }
    }
}

/// Whether `kernel` compiled for every tier calls `ndfuse_wide_exp_shift` (the fill
/// pass and the exp of `exp(x - m)` in one routine reading the row of `x`).
fn shifts(kernel: &Kernel) -> Vec<bool> {
    tiers()
        .into_iter()
        .map(|t| {
            let ck = compile_with(kernel, Some(t)).expect("compiles");
            ck.clif().contains("ndfuse_wide_exp_shift")
        })
        .collect()
}

#[test]
fn softmax_on_f32_rows_reads_its_exp_from_the_row_in_one_routine() {
    for len in [4096, 1007, 5] {
        let k = softmax(DType::F32, 66_000usize.div_ceil(len), len);
        assert!(shifts(&k).iter().all(|&s| s), "f32 rows of {len}");
    }
    // f16 rows are converted first: a fill pass, then the exp routine.
    let k = softmax(DType::F16, 24, 4096);
    assert!(shifts(&k).iter().all(|&s| !s), "f16");
}

#[test]
fn a_shifted_exp_stored_as_is_keeps_the_bits_of_the_128_bit_code() {
    // exp(x - m) with no sum after it: the routine's values themselves are the output.
    for (rows, len) in [(24, 4096), (67, 1007), (13_200, 5)] {
        let mut kb = KernelBuilder::new(&format!("k_exp_shift_{len}"), &[rows, len]);
        kb.reduce_over(&[1]);
        let x = kb.load(DType::F32);
        let m = kb.reduce(Accumulate::Max, x);
        let d = kb.binary(BinaryOp::Sub, x, m);
        let e = kb.unary(UnaryOp::Exp, d);
        kb.store(e);
        let k = kb.build();
        assert!(shifts(&k).iter().all(|&s| s), "rows of {len}");
        check(&k, &[UnaryOp::Exp], Tol::Bits);
    }
}

#[test]
fn the_shifted_exp_gives_the_bits_of_the_subtraction_then_the_exp_routine() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        88.7,
        -104.0,
    ];
    for n in [1usize, 5, 15, 16, 17, 1007, 4096] {
        let mut x = mixed(n, 0xE4 + n as u64);
        for (i, &s) in specials.iter().enumerate() {
            if i * 7 < n {
                x[i * 7] = s;
            }
        }
        for shift in [0.0f32, 3.5, -2.25, 100.0, f32::INFINITY, f32::NAN] {
            let d: Vec<f32> = x.iter().map(|&v| v - shift).collect();
            for tier in tiers() {
                let mut want = vec![0.0f32; n];
                assert!(wide::unary(UnaryOp::Exp, tier, &d, &mut want));
                let mut got = vec![0.0f32; n];
                assert!(wide::exp_shift(tier, &x, shift, &mut got));
                for j in 0..n {
                    let same = got[j].to_bits() == want[j].to_bits()
                        || (got[j].is_nan() && want[j].is_nan());
                    assert!(
                        same,
                        "n = {n}, shift {shift}, {} at {j}: exp({} - shift) = {} against {}",
                        tier.name(),
                        x[j],
                        got[j],
                        want[j]
                    );
                }
            }
        }
    }
}

#[test]
fn softmax_across_a_transposed_view_matches() {
    // Rows read with a stride: the fill pass and the sweeps stay scalar.
    let (rows, len) = (130, 515);
    let mut kb = KernelBuilder::new("k_softmax_transposed", &[rows, len]);
    kb.reduce_over(&[1]);
    let x = kb.load_view(
        DType::F32,
        rows * len,
        view(&[rows, len], &[1, rows as isize], 0),
    );
    let m = kb.reduce(Accumulate::Max, x);
    let d = kb.binary(BinaryOp::Sub, x, m);
    let e = kb.unary(UnaryOp::Exp, d);
    let s = kb.reduce(Accumulate::Sum, e);
    let o = kb.binary(BinaryOp::Div, e, s);
    kb.store(o);
    let k = kb.build();
    assert!(
        shifts(&k).iter().all(|&s| !s),
        "a strided row is filled first"
    );
    check(&k, &[UnaryOp::Exp], Tol::SumOf(len));
}

#[test]
fn log_sum_exp_matches() {
    // exp(x - m) feeds one sweep only: not cached on the 128-bit code, made wide here.
    for dtype in [DType::F32, DType::BF16] {
        for (rows, len) in [(40, 4096), (66, 1007)] {
            let mut kb = KernelBuilder::new(&format!("k_lse_{dtype}_{len}"), &[rows, len]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let m = kb.reduce(Accumulate::Max, x);
            let d = kb.binary(BinaryOp::Sub, x, m);
            let e = kb.unary(UnaryOp::Exp, d);
            let s = kb.reduce(Accumulate::Sum, e);
            let l = kb.unary(UnaryOp::Log, s);
            let y = kb.binary(BinaryOp::Add, l, m);
            kb.store_rows(y);
            check(&kb.build(), &[UnaryOp::Exp], sum_tol(dtype, len));
        }
    }
}

#[test]
fn cached_tanh_and_sigmoid_match() {
    // t = tanh(x) is made before sweep 0 and read by the stores; sigmoid(t - mean t)
    // is made from the cached t before the stores.
    for dtype in [DType::F32, DType::F16] {
        for (rows, len) in [(33, 2048), (66, 1007), (13_200, 5)] {
            let mut kb = KernelBuilder::new(&format!("k_tanh_sig_{dtype}_{len}"), &[rows, len]);
            kb.reduce_over(&[1]);
            let x = kb.load(dtype);
            let t = kb.unary(UnaryOp::Tanh, x);
            let s = kb.reduce(Accumulate::Sum, t);
            let n = kb.constant(dtype, ndfuse_ir::Scalar::F(len as f64));
            let mean = kb.binary(BinaryOp::Div, s, n);
            let c = kb.binary(BinaryOp::Sub, t, mean);
            let g = kb.unary(UnaryOp::Sigmoid, c);
            let y = kb.binary(BinaryOp::Mul, g, t);
            kb.store(y);
            kb.store(t);
            let tol = sum_tol(dtype, len);
            check(&kb.build(), &[UnaryOp::Tanh, UnaryOp::Sigmoid], tol);
        }
    }
}

#[test]
fn a_chain_of_wide_ops_in_one_sweep_matches() {
    // softplus(x) = log1p(exp(x)): exp is made first, then log1p from its row.
    let (rows, len) = (30, 3000 + 1);
    let mut kb = KernelBuilder::new("k_softplus_norm", &[rows, len]);
    kb.reduce_over(&[1]);
    let x = kb.load(DType::F32);
    let e = kb.unary(UnaryOp::Exp, x);
    let p = kb.unary(UnaryOp::Log1p, e);
    let s = kb.reduce(Accumulate::Sum, p);
    let mx = kb.reduce(Accumulate::Max, e);
    let o = kb.binary(BinaryOp::Div, p, s);
    let q = kb.binary(BinaryOp::Div, e, mx);
    kb.store(o);
    kb.store(q);
    // Sweep 0 also takes the max: not a lone sum, so the 128-bit loop's bits.
    check(&kb.build(), &[UnaryOp::Exp, UnaryOp::Log1p], Tol::Bits);
}

#[test]
fn small_row_programs_stay_on_the_128_bit_code() {
    // Below 2^16 positions (`blocks::BLOCKS_FROM`), as element-wise kernels.
    let k = softmax(DType::F32, 15, 4096);
    assert!(k.domain.numel() < 1 << 16);
    for tier in tiers() {
        let ck = compile_with(&k, Some(tier)).expect("compiles");
        assert!(!ck.clif().contains("ndfuse_wide_"), "{}", tier.name());
    }
    check(&k, &[], Tol::Bits);
}

/// The wide row sum's order (`wide::reduce`'s docs), transcribed in plain f32: 64
/// partial sums (element j into partial j % 64) over the whole steps of 64, the fixed
/// pairwise tree, then the tail elements in order.
fn sum_in_order(x: &[f32]) -> f32 {
    let full = x.len() - x.len() % 64;
    let mut p = [0.0f32; 64];
    for (j, &v) in x[..full].iter().enumerate() {
        p[j % 64] += v;
    }
    let q: Vec<f32> = (0..16)
        .map(|l| (p[l] + p[l + 16]) + (p[l + 32] + p[l + 48]))
        .collect();
    let q8: Vec<f32> = (0..8).map(|l| q[l] + q[l + 8]).collect();
    let q4: Vec<f32> = (0..4).map(|l| q8[l] + q8[l + 4]).collect();
    let q2 = [q4[0] + q4[2], q4[1] + q4[3]];
    let mut t = q2[0] + q2[1];
    for &v in &x[full..] {
        t += v;
    }
    t
}

/// `n` values of both signs over many magnitudes (2^-20 .. 2^20).
fn mixed(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let m = (s >> 40) as f32 / (1u64 << 24) as f32 + 0.5;
            let e = ((s >> 8) % 41) as i32 - 20;
            let sign = if s & 1 == 0 { 1.0 } else { -1.0 };
            sign * m * 2f32.powi(e)
        })
        .collect()
}

const SUM_LENGTHS: [usize; 12] = [0, 1, 5, 63, 64, 65, 127, 128, 1007, 4096, 4099, 100_003];

#[test]
fn the_wide_row_sum_follows_its_order_on_every_tier() {
    for n in SUM_LENGTHS {
        let x = mixed(n, 0x5EED + n as u64);
        let want = sum_in_order(&x);
        for tier in tiers() {
            let got = wide::sum(tier, &x).expect("the tier is available");
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "n = {n}, {}: {got} against {want} in the order transcribed",
                tier.name()
            );
        }
    }
}

#[test]
fn the_wide_row_sum_is_within_the_bound_of_an_n_term_f32_sum() {
    // |sum - exact| <= n·ε·Σ|x| (ε = 2^-24), the exact sum taken in f64 (exact enough:
    // its own error is below 2^-29 of Σ|x| for these lengths).
    let eps = f64::powi(2.0, -24);
    for n in SUM_LENGTHS {
        for seed in [1u64, 2, 3] {
            let x = mixed(n, seed * 0x9E37 + n as u64);
            let exact: f64 = x.iter().map(|&v| f64::from(v)).sum();
            let abs: f64 = x.iter().map(|&v| f64::from(v).abs()).sum();
            for tier in tiers() {
                let got = f64::from(wide::sum(tier, &x).expect("available"));
                let bound = n as f64 * eps * abs;
                assert!(
                    (got - exact).abs() <= bound,
                    "n = {n}, {}: {got} against {exact} (bound {bound})",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn the_wide_row_sum_gives_nan_and_infinities_as_a_sum_does() {
    for n in [5usize, 64, 1007, 4096] {
        for at in [0, n / 2, n - 1] {
            let mut x = mixed(n, 7);
            x[at] = f32::NAN;
            let mut inf = mixed(n, 7);
            inf[at] = f32::INFINITY;
            let mut both = inf.clone();
            both[n - 1 - at / 2] = f32::NEG_INFINITY;
            let big = vec![f32::MAX; n.max(2)];
            for tier in tiers() {
                let sum = |v: &[f32]| wide::sum(tier, v).expect("available");
                assert!(sum(&x).is_nan(), "n = {n}, NaN at {at}");
                assert_eq!(sum(&inf), f32::INFINITY, "n = {n}, inf at {at}");
                if n - 1 - at / 2 != at {
                    assert!(sum(&both).is_nan(), "n = {n}, inf at {at} and -inf");
                }
                assert_eq!(sum(&big), f32::INFINITY, "n = {n}: overflow");
            }
        }
    }
}

#[test]
fn softmax_rows_with_a_nan_are_nan_and_the_others_sum_to_one_on_the_wide_path() {
    let (rows, len) = (17, 4096);
    let k = softmax(DType::F32, rows, len);
    let mut x = mixed(rows * len, 11);
    for v in &mut x {
        *v = v.clamp(-30.0, 30.0);
    }
    x[3 * len + 100] = f32::NAN;
    let vals: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let ins = [HostArray::from_f64s(
        DType::F32,
        Shape::new([rows * len]),
        &vals,
    )];
    for tier in tiers() {
        let ck = compile_with(&k, Some(tier)).expect("compiles");
        assert!(ck.clif().contains("ndfuse_wide_sum"), "{}", tier.name());
        let out = run_on(&ck, &k, &ins, 2);
        let out = out[0].storage();
        for r in 0..rows {
            let row: Vec<f64> = (0..len).map(|j| out.get_f64(r * len + j)).collect();
            if r == 3 {
                assert!(row.iter().all(|v| v.is_nan()), "{}: row 3", tier.name());
                continue;
            }
            // Each output is e/s to within (2nε + ε) relative; the sum of them in f64.
            let total: f64 = row.iter().sum();
            let eps = f64::powi(2.0, -24);
            assert!(
                (total - 1.0).abs() <= 2.0 * len as f64 * eps + 2.0 * eps,
                "{} row {r}: the outputs sum to {total}",
                tier.name()
            );
        }
    }
}

/// IEEE 754-2019 `maximum` of a non-empty row, the 128-bit code's `fmax` fold: NaN if
/// any element is NaN, else the largest, +0 above -0.
fn maximum(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, &v| {
        if m.is_nan() || v.is_nan() {
            f32::NAN
        } else if v > m || (v == 0.0 && m == 0.0 && v.is_sign_positive()) {
            v
        } else {
            m
        }
    })
}

/// Rows that probe a max: zeros of both signs, infinities, NaNs of both signs.
fn max_rows(n: usize) -> Vec<Vec<f32>> {
    let neg_nan = f32::from_bits(0xFFC0_0001);
    let mut rows = vec![
        mixed(n, 3 + n as u64),
        vec![-0.0; n],
        vec![f32::NEG_INFINITY; n],
        mixed(n, 5).iter().map(|v| -v.abs()).collect(),
    ];
    for at in [0, n / 2, n - 1] {
        let mut zeros = vec![-0.0f32; n];
        zeros[at] = 0.0;
        rows.push(zeros);
        for special in [f32::NAN, neg_nan, f32::INFINITY] {
            let mut r = mixed(n, 9 + at as u64);
            r[at] = special;
            rows.push(r);
        }
    }
    rows
}

#[test]
fn the_wide_row_max_is_ieee_maximum_on_every_tier() {
    for n in [1usize, 5, 31, 32, 33, 63, 64, 65, 1007, 4096] {
        for (k, x) in max_rows(n).iter().enumerate() {
            let want = maximum(x);
            for tier in tiers() {
                let got = wide::max(tier, x).expect("available, non-empty");
                let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
                assert!(
                    same,
                    "n = {n} row {k}, {}: {got} against {want}",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn a_row_max_kernel_keeps_the_bits_of_the_128_bit_code() {
    // Rows of zeros of both signs, infinities and NaNs, then ordinary rows.
    let len = 1007;
    let mut vals: Vec<f32> = max_rows(len).concat();
    let probes = vals.len() / len;
    let rows = 66;
    vals.extend(mixed((rows - probes) * len, 21));
    let k = {
        let mut kb = KernelBuilder::new("k_row_max", &[rows, len]);
        kb.reduce_over(&[1]);
        let x = kb.load(DType::F32);
        let m = kb.reduce(Accumulate::Max, x);
        kb.store_rows(m);
        kb.build()
    };
    let vals: Vec<f64> = vals.iter().map(|&v| f64::from(v)).collect();
    let ins = [HostArray::from_f64s(
        DType::F32,
        Shape::new([rows * len]),
        &vals,
    )];
    let narrow = compile_with(&k, None).expect("compiles");
    assert!(!narrow.clif().contains("ndfuse_wide_max"));
    let want = bits(&run_on(&narrow, &k, &ins, 2)[0]);
    for tier in tiers() {
        let ck = compile_with(&k, Some(tier)).expect("compiles");
        assert!(ck.clif().contains("ndfuse_wide_max"), "{}", tier.name());
        for threads in [1, 2, 4] {
            let got = bits(&run_on(&ck, &k, &ins, threads)[0]);
            assert_eq!(got, want, "{}, {threads} threads", tier.name());
        }
    }
}

#[test]
fn the_wide_row_division_is_the_ieee_division() {
    for n in [1usize, 5, 15, 16, 17, 1007, 4096] {
        let mut x = mixed(n, 0xD1 + n as u64);
        for (i, s) in [f32::NAN, f32::INFINITY, -0.0, 0.0, f32::MIN_POSITIVE]
            .into_iter()
            .enumerate()
        {
            if i * 3 < n {
                x[i * 3] = s;
            }
        }
        for d in [3.0f32, -7.5, 1e-30, 0.0, -0.0, f32::INFINITY, f32::NAN] {
            for tier in tiers() {
                let mut got = vec![0.0f32; n];
                assert!(wide::div(tier, &x, d, &mut got));
                for j in 0..n {
                    let want = x[j] / d;
                    let same =
                        got[j].to_bits() == want.to_bits() || (got[j].is_nan() && want.is_nan());
                    assert!(
                        same,
                        "n = {n}, {}: {} / {d} = {} against {want}",
                        tier.name(),
                        x[j],
                        got[j]
                    );
                }
            }
        }
    }
}

#[test]
fn a_cached_row_divided_by_a_row_value_keeps_the_bits_of_the_128_bit_code() {
    // exp(x - m) / m: the max, the shifted exp and the division all give the 128-bit
    // code's bits on the wide path (no sum is involved).
    for (rows, len) in [(24, 4096), (67, 1007), (13_200, 5)] {
        let mut kb = KernelBuilder::new(&format!("k_exp_over_max_{len}"), &[rows, len]);
        kb.reduce_over(&[1]);
        let x = kb.load(DType::F32);
        let m = kb.reduce(Accumulate::Max, x);
        let d = kb.binary(BinaryOp::Sub, x, m);
        let e = kb.unary(UnaryOp::Exp, d);
        let o = kb.binary(BinaryOp::Div, e, m);
        kb.store(o);
        let k = kb.build();
        for tier in tiers() {
            let ck = compile_with(&k, Some(tier)).expect("compiles");
            for name in [
                "ndfuse_wide_div",
                "ndfuse_wide_max",
                "ndfuse_wide_exp_shift",
            ] {
                assert!(
                    ck.clif().contains(name),
                    "rows of {len}, {}: no {name}",
                    tier.name()
                );
            }
        }
        check(&k, &[UnaryOp::Exp], Tol::Bits);
    }
}

#[test]
fn the_streaming_row_division_is_the_ieee_division_at_any_alignment() {
    for n in [1usize, 7, 16, 17, 40, 1007] {
        let x = mixed(n, 0x57 + n as u64);
        for skew in 0..16 {
            for tier in tiers() {
                let mut buf = vec![0.0f32; n + 16];
                let dst = &mut buf[skew..skew + n];
                assert!(wide::div_stream(tier, &x, -3.25, dst));
                for j in 0..n {
                    let want = x[j] / -3.25;
                    assert_eq!(
                        dst[j].to_bits(),
                        want.to_bits(),
                        "n = {n}, skew {skew}, {j}"
                    );
                }
                assert!(buf[..skew]
                    .iter()
                    .chain(&buf[skew + n..])
                    .all(|&v| v == 0.0));
            }
        }
    }
}

#[test]
fn softmax_of_a_64_mib_output_streams_its_stores() {
    // At 64 MiB of output the division writes past the caches (`STREAM_FROM_BYTES`).
    let k = softmax(DType::F32, 4096, 4096);
    for tier in tiers() {
        let ck = compile_with(&k, Some(tier)).expect("compiles");
        assert!(
            ck.clif().contains("ndfuse_wide_div_stream"),
            "{}",
            tier.name()
        );
    }
    let small = softmax(DType::F32, 24, 4096);
    for tier in tiers() {
        let ck = compile_with(&small, Some(tier)).expect("compiles");
        assert!(
            !ck.clif().contains("ndfuse_wide_div_stream"),
            "{}",
            tier.name()
        );
    }
    check(&k, &[UnaryOp::Exp], Tol::SumOf(4096));
}
