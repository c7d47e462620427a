//! The inline f64 math (`vmath` on `F64` and `F64X2`) against the f64 reference (libm,
//! through `ndfuse_ir::interp`): each op over 2^20 sampled inputs (log-uniform
//! magnitudes of both signs, half over the whole f64 range and half over the op's
//! interesting range) plus edge cases (±0, ±inf, NaN, subnormals, overflow and
//! underflow thresholds with their neighbours), through the vector loop of a
//! contiguous kernel and the scalar loop of a transposed one. The max ULP error must
//! stay within the documented bound (`f64_ulp_bound`); both loops must agree bit for
//! bit; the small kernels' shared out-of-line copies must give the same bits. Each
//! test prints the measured max.

mod builder;

use builder::{compiled, view, KernelBuilder};
use ndfuse_codegen_cpu::{f64_ulp_bound, use_fma};
use ndfuse_ir::interp::unary_f64;
use ndfuse_ir::{DType, HostArray, Shape, UnaryOp};

const SAMPLES: usize = 1 << 20;

/// xorshift64*, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// An f64 of random sign and mantissa whose binary exponent is uniform in
    /// `[emin, emax]` (below -1022: subnormals).
    fn log_uniform(&mut self, emin: i32, emax: i32) -> f64 {
        let r = self.next();
        let e = emin + (self.next() % (emax - emin + 1) as u64) as i32;
        let mant = r & 0x000F_FFFF_FFFF_FFFF;
        let v = if e < -1022 {
            f64::from_bits((mant | 0x0010_0000_0000_0000) >> (-1022 - e).min(53))
        } else {
            f64::from_bits((((e + 1023) as u64) << 52) | mant)
        };
        if r >> 63 == 1 {
            -v
        } else {
            v
        }
    }
}

fn edge_cases() -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::from_bits(1),
        f64::from_bits(0x000F_FFFF_FFFF_FFFF),
        f64::MIN_POSITIVE,
        f64::MAX,
        1.0,
    ];
    let thresholds: [f64; 19] = [
        709.782_712_893_384,         // exp overflows above
        -708.396_418_532_264_1,      // exp becomes subnormal below
        -744.440_071_921_381_3,      // exp reaches the smallest subnormal
        -745.133_219_101_941_1,      // exp rounds to 0 below
        709.089_565_712_824,         // n = 1024 in expm1
        -37.429_947_750_237_04,      // expm1 rounds to -1
        5.551_115_123_125_783e-17,   // 2^-54: expm1 returns x below
        1.110_223_024_625_156_5e-16, // 2^-53: log1p returns x below
        19.061_547_465_398_5,        // tanh rounds to 1 from about here
        19.1,                        // tanh's clamp
        0.549_306_144_334_054_8,     // tanh changes form
        0.346_573_590_279_972_6,     // ln2/2: exp's reduction boundary
        1_048_576.0,                 // 2^20: sin and cos call the exact function from here
        std::f64::consts::FRAC_PI_2, // sin, cos near a multiple of π/2
        std::f64::consts::PI,
        355.0, // close to 113·π
        -1.0,  // log1p(-1) = -inf
        0.5,
        2.0,
    ];
    for &t in &thresholds {
        // The neighbours: one bit pattern either side.
        let up = f64::from_bits(t.to_bits() + 1);
        let down = f64::from_bits(t.to_bits() - 1);
        for x in [t, up, down] {
            v.push(x);
            v.push(-x);
        }
    }
    v
}

fn inputs(seed: u64, (emin, emax): (i32, i32)) -> Vec<f64> {
    let mut rng = Rng(seed);
    let mut v = edge_cases();
    for i in 0..SAMPLES {
        v.push(if i % 2 == 0 {
            rng.log_uniform(-1074, 1023)
        } else {
            rng.log_uniform(emin, emax)
        });
    }
    if v.len() % 2 == 1 {
        v.push(0.25);
    }
    v
}

/// Floats between `a` and `b` (±0 one point); 0 for two NaNs, `u64::MAX` for one.
fn ulp_distance(a: f64, b: f64) -> u64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => return 0,
        (true, false) | (false, true) => return u64::MAX,
        _ => {}
    }
    let ordered = |x: f64| -> i128 {
        let i = i128::from(x.to_bits() as i64);
        if i < 0 {
            i128::from(i64::MIN) - i
        } else {
            i
        }
    };
    ordered(a).abs_diff(ordered(b)) as u64
}

fn run_f64(kernel: &ndfuse_ir::Kernel, input: &HostArray) -> Vec<f64> {
    let ck = compiled(kernel);
    let mut out = HostArray::zeros(DType::F64, kernel.domain.clone());
    ck.run(&[input], &mut [&mut out])
        .unwrap_or_else(|e| panic!("{e}"));
    out.as_slice::<f64>().expect("f64 output").to_vec()
}

/// `op` on `xs` through the vector loop (contiguous) and the scalar loop (read
/// transposed), in the order of `xs`.
fn run_unary(op: UnaryOp, xs: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = xs.len();
    let input = HostArray::from_f64s(DType::F64, Shape::new([n]), xs);
    let mut kb = KernelBuilder::new("k0_vmath64", &[n]);
    let x = kb.load(DType::F64);
    let y = kb.unary(op, x);
    kb.store(y);
    let vector = run_f64(&kb.build(), &input);
    let h = n / 2;
    let mut kb = KernelBuilder::new("k0_vmath64_strided", &[2, h]);
    let x = kb.load_view(DType::F64, n, view(&[2, h], &[1, 2], 0));
    let y = kb.unary(op, x);
    kb.store(y);
    let t = run_f64(&kb.build(), &input);
    let mut scalar = vec![0.0; n];
    for i in 0..2 {
        for j in 0..h {
            scalar[j * 2 + i] = t[i * h + j];
        }
    }
    (vector, scalar)
}

fn check(op: UnaryOp, seed: u64, range: (i32, i32)) {
    let bound = u64::from(f64_ulp_bound(op).expect("an inline f64 op has a documented bound"));
    let xs = inputs(seed, range);
    let (vector, scalar) = run_unary(op, &xs);
    let mut worst = (0u64, 0.0f64, 0.0f64, 0.0f64);
    for (i, &x) in xs.iter().enumerate() {
        assert_eq!(
            vector[i].to_bits(),
            scalar[i].to_bits(),
            "{}({x:e}): vector loop {:e}, scalar loop {:e}",
            op.name(),
            vector[i],
            scalar[i]
        );
        let want = unary_f64(op, x);
        let d = ulp_distance(vector[i], want);
        if d > worst.0 {
            worst = (d, x, vector[i], want);
        }
    }
    println!(
        "{} f64 ({}): max {} ulp over {} inputs (at x = {:e}: got {:e}, reference {:e}); bound {bound}",
        op.name(),
        if use_fma() { "fused" } else { "unfused" },
        worst.0,
        xs.len(),
        worst.1,
        worst.2,
        worst.3
    );
    assert!(
        worst.0 <= bound,
        "{}({:e}) = {:e}, reference {:e}: {} ulp > documented {bound}",
        op.name(),
        worst.1,
        worst.2,
        worst.3,
        worst.0
    );
    for x in [0.0f64, -0.0] {
        let i = xs
            .iter()
            .position(|v| v.to_bits() == x.to_bits())
            .expect("edge");
        let want = unary_f64(op, x);
        assert_eq!(vector[i].to_bits(), want.to_bits(), "{}({x:?})", op.name());
    }
    // A small kernel calls the shared out-of-line copy: the same bits.
    let small: Vec<f64> = xs
        .iter()
        .copied()
        .step_by(xs.len() / 4000)
        .take(4000)
        .collect();
    let (sv, _) = run_unary(op, &small);
    for (k, &x) in small.iter().enumerate() {
        let i = xs
            .iter()
            .position(|v| v.to_bits() == x.to_bits())
            .expect("sampled");
        assert!(
            sv[k].to_bits() == vector[i].to_bits() || (sv[k].is_nan() && vector[i].is_nan()),
            "{}({x:e}): shared {:e}, inline {:e}",
            op.name(),
            sv[k],
            vector[i]
        );
    }
}

#[test]
fn exp_f64_within_bound() {
    check(UnaryOp::Exp, 11, (-12, 10));
}

#[test]
fn expm1_f64_within_bound() {
    check(UnaryOp::Expm1, 12, (-60, 10));
}

#[test]
fn log_f64_within_bound() {
    check(UnaryOp::Log, 13, (-3, 3));
}

#[test]
fn log1p_f64_within_bound() {
    check(UnaryOp::Log1p, 14, (-60, 3));
}

#[test]
fn tanh_f64_within_bound() {
    check(UnaryOp::Tanh, 15, (-60, 5));
}

#[test]
fn sigmoid_f64_within_bound() {
    check(UnaryOp::Sigmoid, 16, (-60, 10));
}

#[test]
fn sin_f64_within_bound() {
    check(UnaryOp::Sin, 17, (-30, 19));
}

#[test]
fn cos_f64_within_bound() {
    check(UnaryOp::Cos, 18, (-30, 19));
}

/// The unfused forms (no FMA) are held to the same bounds, in a child process.
#[test]
fn the_unfused_f64_math_is_held_to_the_same_bounds() {
    if std::env::var_os("NDFUSE_CPU_FMA").is_some() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["_f64_within_bound", "--nocapture", "--test-threads", "2"])
        .env("NDFUSE_CPU_FMA", "0")
        .output()
        .expect("the test binary runs again");
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    assert!(
        out.status.success(),
        "the unfused run failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for op in [
        "exp", "expm1", "log", "log1p", "tanh", "sigmoid", "sin", "cos",
    ] {
        assert!(
            text.contains(&format!("{op} f64 (unfused)")),
            "the child did not run {op} unfused:\n{text}"
        );
    }
}
