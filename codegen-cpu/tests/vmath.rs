//! The inline f32 math library (`vmath`) against the f64 reference rounded to f32:
//! each op over 2^20 sampled inputs (log-uniform magnitudes of both signs, half over
//! the whole f32 range and half over the op's interesting range) plus edge cases (±0,
//! ±inf, NaN, subnormals, overflow and underflow thresholds), through the vector loop
//! of a contiguous kernel and the scalar loop of a transposed one. The max ULP error
//! must stay within the bound the library documents (`f32_ulp_bound`); both loops
//! must agree bit for bit. Each test prints the measured max ULP.

mod builder;
mod sampling;

use builder::{array, compiled, run, view, KernelBuilder};
use ndfuse_codegen_cpu::{f32_ulp_bound, use_fma, POW_F32_ULP};
use ndfuse_ir::interp::{binary_f64, unary_f64};
use ndfuse_ir::{BinaryOp, DType, HostArray, Shape, UnaryOp};
use sampling::{edge_cases, next_up, Rng};

/// Sampled inputs per op (besides the edge cases).
const SAMPLES: usize = 1 << 20;

/// Inputs for `op`: half over all finite magnitudes, half over 2^emin..2^emax, plus
/// the edge cases; an even count (the scalar run reads them as a [2, n/2] transpose).
fn inputs(seed: u64, range: (i32, i32)) -> Vec<f32> {
    let mut v = sampling::inputs(seed, range, SAMPLES);
    if v.len() % 2 == 1 {
        v.push(0.25);
    }
    v
}

/// Distance in ULP between two f32: the count of floats between them (±0 are one
/// point); 0 when both are NaN, `u64::MAX` when only one is.
fn ulp_distance(a: f32, b: f32) -> u64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => return 0,
        (true, false) | (false, true) => return u64::MAX,
        _ => {}
    }
    let ordered = |x: f32| -> i64 {
        let i = i64::from(x.to_bits() as i32);
        if i < 0 {
            i64::from(i32::MIN) - i
        } else {
            i
        }
    };
    ordered(a).abs_diff(ordered(b))
}

/// A 1-d f32 array of `xs` (through f64, which holds every f32 exactly).
fn f32_array(xs: &[f32]) -> HostArray {
    let wide: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
    HostArray::from_f64s(DType::F32, Shape::new([xs.len()]), &wide)
}

/// Runs `kernel` on `inputs`, one f32 output.
fn run_f32(kernel: &ndfuse_ir::Kernel, inputs: &[&HostArray]) -> Vec<f32> {
    let ck = compiled(kernel);
    let mut out = HostArray::zeros(DType::F32, kernel.domain.clone());
    ck.run(inputs, &mut [&mut out])
        .unwrap_or_else(|e| panic!("{e}"));
    out.as_slice::<f32>().expect("f32 output").to_vec()
}

/// `op` on `xs` through the vector loop (contiguous load) and the scalar loop (the
/// same buffer read transposed): both results, in the order of `xs`.
fn run_unary(op: UnaryOp, xs: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let n = xs.len();
    let input = f32_array(xs);

    let mut kb = KernelBuilder::new("k0_vmath", &[n]);
    let x = kb.load(DType::F32);
    let y = kb.unary(op, x);
    kb.store(y);
    let k = kb.build();
    let vector = run_f32(&k, &[&input]);

    // out[i, j] = in[j * 2 + i]: a strided load, so the scalar loop.
    let h = n / 2;
    let mut kb = KernelBuilder::new("k0_vmath_strided", &[2, h]);
    let x = kb.load_view(DType::F32, n, view(&[2, h], &[1, 2], 0));
    let y = kb.unary(op, x);
    kb.store(y);
    let k = kb.build();
    let t = run_f32(&k, &[&input]);
    let mut scalar = vec![0.0; n];
    for i in 0..2 {
        for j in 0..h {
            scalar[j * 2 + i] = t[i * h + j];
        }
    }
    (vector, scalar)
}

/// Checks `op` within its documented bound over its inputs and prints the max error.
fn check_unary(op: UnaryOp, seed: u64, range: (i32, i32)) {
    let bound = u64::from(f32_ulp_bound(op).expect("a vmath op has a documented bound"));
    let xs = inputs(seed, range);
    let (vector, scalar) = run_unary(op, &xs);
    let mut worst = (0u64, 0.0f32, 0.0f32, 0.0f32);
    for (i, &x) in xs.iter().enumerate() {
        assert_eq!(
            vector[i].to_bits(),
            scalar[i].to_bits(),
            "{}({x:e}): the vector loop gave {:e}, the scalar loop {:e}",
            op.name(),
            vector[i],
            scalar[i]
        );
        let want = unary_f64(op, f64::from(x)) as f32;
        let d = ulp_distance(vector[i], want);
        if d > worst.0 {
            worst = (d, x, vector[i], want);
        }
    }
    println!(
        "{} f32 ({}): max {} ulp over {} inputs (at x = {:e}: got {:e}, reference {:e}); bound {bound}",
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
    // Signed zeros come back with the reference's sign (the ULP metric merges them).
    for x in [0.0f32, -0.0] {
        let i = xs
            .iter()
            .position(|v| v.to_bits() == x.to_bits())
            .expect("edge");
        let want = unary_f64(op, f64::from(x)) as f32;
        assert_eq!(vector[i].to_bits(), want.to_bits(), "{}({x:?})", op.name());
    }
}

#[test]
fn exp_within_bound() {
    check_unary(UnaryOp::Exp, 1, (-30, 7));
}

#[test]
fn expm1_within_bound() {
    check_unary(UnaryOp::Expm1, 2, (-30, 7));
}

#[test]
fn log_within_bound() {
    check_unary(UnaryOp::Log, 3, (-3, 3));
}

#[test]
fn log1p_within_bound() {
    check_unary(UnaryOp::Log1p, 4, (-30, 3));
}

#[test]
fn tanh_within_bound() {
    check_unary(UnaryOp::Tanh, 5, (-30, 4));
}

#[test]
fn sigmoid_within_bound() {
    check_unary(UnaryOp::Sigmoid, 6, (-30, 7));
}

#[test]
fn erf_within_bound() {
    check_unary(UnaryOp::Erf, 7, (-30, 3));
}

#[test]
fn rsqrt_within_bound() {
    check_unary(UnaryOp::Rsqrt, 8, (-149, 127));
}

#[test]
fn sin_within_bound() {
    check_unary(UnaryOp::Sin, 9, (-30, 25));
}

#[test]
fn cos_within_bound() {
    check_unary(UnaryOp::Cos, 10, (-30, 25));
}

#[test]
fn pow_within_bound() {
    // x over every magnitude and sign; y from small integers (exact cases, odd and
    // even powers of negative bases), halves, and log-uniform values that take the
    // result through overflow and underflow.
    let mut rng = Rng(11);
    let edges = edge_cases();
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for i in 0..SAMPLES {
        let x = if i % 2 == 0 {
            rng.log_uniform(-149, 127)
        } else {
            rng.log_uniform(-8, 8)
        };
        let y = match i % 4 {
            0 => ((rng.next() % 41) as i32 - 20) as f32,
            1 => ((rng.next() % 41) as i32 - 20) as f32 + 0.5,
            _ => rng.log_uniform(-20, 8),
        };
        xs.push(x);
        ys.push(y);
    }
    for &x in &edges {
        for y in [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            2.0,
            3.0,
            -3.0,
            0.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ] {
            xs.push(x);
            ys.push(y);
            xs.push(y);
            ys.push(x);
        }
    }
    let n = xs.len();
    let a = f32_array(&xs);
    let b = f32_array(&ys);
    let mut kb = KernelBuilder::new("k0_pow", &[n]);
    let x = kb.load(DType::F32);
    let y = kb.load(DType::F32);
    let p = kb.binary(BinaryOp::Pow, x, y);
    kb.store(p);
    let got = run_f32(&kb.build(), &[&a, &b]);
    // The scalar loop (both operands read transposed) gives the vector loop's bits.
    assert_eq!(
        n % 2,
        0,
        "an even count of pow inputs, for the transposed run"
    );
    {
        let h = n / 2;
        let mut kb = KernelBuilder::new("k0_pow_strided", &[2, h]);
        let x = kb.load_view(DType::F32, n, view(&[2, h], &[1, 2], 0));
        let y = kb.load_view(DType::F32, n, view(&[2, h], &[1, 2], 0));
        let p = kb.binary(BinaryOp::Pow, x, y);
        kb.store(p);
        let t = run_f32(&kb.build(), &[&a, &b]);
        for i in 0..2 {
            for j in 0..h {
                let (s, v) = (t[i * h + j], got[j * 2 + i]);
                assert!(
                    s.to_bits() == v.to_bits() || (s.is_nan() && v.is_nan()),
                    "pow({:e}, {:e}): scalar loop {s:e}, vector loop {v:e}",
                    xs[j * 2 + i],
                    ys[j * 2 + i]
                );
            }
        }
    }
    let mut worst = (0u64, 0.0f32, 0.0f32, 0.0f32, 0.0f32);
    for i in 0..n {
        let want = binary_f64(BinaryOp::Pow, f64::from(xs[i]), f64::from(ys[i])) as f32;
        let d = ulp_distance(got[i], want);
        if d > worst.0 {
            worst = (d, xs[i], ys[i], got[i], want);
        }
        if want == 0.0 {
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "pow({:e}, {:e})",
                xs[i],
                ys[i]
            );
        }
    }
    println!(
        "pow f32 ({}): max {} ulp over {n} inputs (at ({:e}, {:e}): got {:e}, reference {:e}); bound {POW_F32_ULP}",
        if use_fma() { "fused" } else { "unfused" },
        worst.0, worst.1, worst.2, worst.3, worst.4
    );
    assert!(
        worst.0 <= u64::from(POW_F32_ULP),
        "pow({:e}, {:e}) = {:e}, reference {:e}: {} ulp",
        worst.1,
        worst.2,
        worst.3,
        worst.4,
        worst.0
    );
}

#[test]
fn gelu_and_softmax_style_kernels_vectorise() {
    // tanh, exp, erf and sigmoid no longer keep an f32 kernel on the scalar loop.
    for op in [
        UnaryOp::Tanh,
        UnaryOp::Exp,
        UnaryOp::Erf,
        UnaryOp::Sigmoid,
        UnaryOp::Log,
    ] {
        // 2^16 elements: large enough for inline math (smaller kernels call the shared
        // copy, see below).
        let mut kb = KernelBuilder::new("k0_vec", &[1 << 16]);
        let x = kb.load(DType::F32);
        let y = kb.unary(op, x);
        kb.store(y);
        // The 128-bit code itself (on the wide path the op is a wide routine instead).
        let ck = ndfuse_codegen_cpu::compile_with(&kb.build(), None).expect("compiles");
        assert!(
            ck.clif().contains("f32x4"),
            "{} did not vectorise:\n{}",
            op.name(),
            ck.clif()
        );
        assert!(
            !ck.clif().contains("call "),
            "{} still calls:\n{}",
            op.name(),
            ck.clif()
        );
    }
}

#[test]
fn small_kernels_call_the_shared_math_and_get_the_same_bits() {
    // Below 2^16 elements a kernel calls one out-of-line copy of the math per scalar
    // or f32x4 (compiled once per process from the same builder) instead of inlining
    // it: faster to compile, and bit-identical to the inline code.
    let n = 1 << 16;
    let vals: Vec<f64> = (0..n)
        .map(|i| f64::from(((i as f64 - n as f64 / 2.0) * 7.3e-4) as f32))
        .collect();
    let big_in = array(DType::F32, &[n], &vals);
    for op in [
        UnaryOp::Tanh,
        UnaryOp::Exp,
        UnaryOp::Expm1,
        UnaryOp::Log1p,
        UnaryOp::Erf,
        UnaryOp::Sigmoid,
        UnaryOp::Log,
        UnaryOp::Rsqrt,
    ] {
        let build = |len: usize| {
            let mut kb = KernelBuilder::new("k0_shared", &[len]);
            let x = kb.load(DType::F32);
            let y = kb.unary(op, x);
            kb.store(y);
            kb.build()
        };
        let inline = run(&build(n), &[&big_in]);
        let small_len = 1003; // a vector part and a scalar tail
        let small = build(small_len);
        let ck = compiled(&small);
        assert!(
            ck.clif().contains("call ") && ck.clif().contains("f32x4"),
            "{}: a small kernel calls the shared code from its vector loop:\n{}",
            op.name(),
            ck.clif()
        );
        let small_in = array(DType::F32, &[small_len], &vals[..small_len]);
        let got = run(&small, &[&small_in]);
        let (g, w) = (got[0].to_f64s(), inline[0].to_f64s());
        for (k, a) in g.iter().enumerate() {
            assert!(
                a.to_bits() == w[k].to_bits() || (a.is_nan() && w[k].is_nan()),
                "{} [{k}]: shared {a:e}, inline {:e}",
                op.name(),
                w[k]
            );
        }
    }
}

/// The unfused math (hosts without FMA, or `NDFUSE_CPU_FMA=0`) is held to the same
/// bounds: this binary runs its `_within_bound` tests (and the sigmoid saturation
/// check, `_keep_their_bits`) again in a child process with FMA turned off (the choice
/// is made once per process), and the child must say it ran them unfused.
#[test]
fn the_unfused_math_is_held_to_the_same_bounds() {
    if std::env::var_os("NDFUSE_CPU_FMA").is_some() {
        return; // The child itself, or a run that already chose.
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "_within_bound",
            "_keep_their_bits",
            "--nocapture",
            "--test-threads",
            "2",
        ])
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
        "exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "pow",
    ] {
        assert!(
            text.contains(&format!("{op} f32 (unfused)")),
            "the child did not run {op} unfused:\n{text}"
        );
    }
    assert!(
        text.contains("sigmoid saturation (unfused)"),
        "the child did not run the sigmoid saturation check unfused:\n{text}"
    );
}

#[test]
fn ulp_distance_counts_floats_between() {
    assert_eq!(ulp_distance(1.0, next_up(1.0)), 1);
    assert_eq!(ulp_distance(0.0, -0.0), 0);
    assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 2);
    assert_eq!(ulp_distance(f32::NAN, f32::NAN), 0);
    assert_eq!(ulp_distance(f32::NAN, 1.0), u64::MAX);
    assert_eq!(ulp_distance(f32::MAX, f32::INFINITY), 1);
}

/// sigmoid as it is written, from exp's own bits: e = exp(-|x|) (the exp kernel, whose
/// fast and general paths give the same bits), then 1/(1 + e) for x ≥ 0 and
/// e/(1 + e) below, each rounded once as the kernel rounds them.
fn sigmoid_from_exp_f32(x: f32, e: f32) -> f32 {
    let num = if x >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

fn sigmoid_from_exp_f64(x: f64, e: f64) -> f64 {
    let num = if x >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

/// `op` on f64 `xs` through the vector loop and the scalar loop (a transposed read).
fn run_unary_f64(op: UnaryOp, xs: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = xs.len();
    let input = HostArray::from_f64s(DType::F64, Shape::new([n]), xs);
    let run = |k: &ndfuse_ir::Kernel| {
        let mut out = HostArray::zeros(DType::F64, k.domain.clone());
        compiled(k)
            .run(&[&input], &mut [&mut out])
            .unwrap_or_else(|e| panic!("{e}"));
        out.as_slice::<f64>().expect("f64 output").to_vec()
    };
    let mut kb = KernelBuilder::new("k0_vmath_f64", &[n]);
    let x = kb.load(DType::F64);
    let y = kb.unary(op, x);
    kb.store(y);
    let vector = run(&kb.build());
    let h = n / 2;
    let mut kb = KernelBuilder::new("k0_vmath_f64_strided", &[2, h]);
    let x = kb.load_view(DType::F64, n, view(&[2, h], &[1, 2], 0));
    let y = kb.unary(op, x);
    kb.store(y);
    let t = run(&kb.build());
    let mut scalar = vec![0.0; n];
    for i in 0..2 {
        for j in 0..h {
            scalar[j * 2 + i] = t[i * h + j];
        }
    }
    (vector, scalar)
}

/// Every f32 from `lo` to `hi` (both of one sign, `lo` nearer zero) and its negation.
fn every_f32(lo: f32, hi: f32, v: &mut Vec<f32>) {
    for b in lo.to_bits()..=hi.to_bits() {
        v.push(f32::from_bits(b));
        v.push(-f32::from_bits(b));
    }
}

/// sigmoid's bits where it saturates (x ≥ 40: 1, x ≤ exp's lower clamp: +0) and
/// around exp's fast-path edge (87) are those of `(x ≥ 0 ? 1 : e) / (1 + e)` with `e`
/// from the exp kernel: every f32 around the thresholds, a stride through all bit
/// patterns (NaNs and infinities included), random f64s and the f64 thresholds,
/// through the vector and the scalar loop; and unfused (the unfused runner above runs
/// it again in a child process). It
/// pins those bits for a faster saturated path (one that skips exp's general path for
/// such lanes was tried and cost gelu 20% on ordinary inputs, so it is not in).
#[test]
fn sigmoid_saturated_lanes_keep_their_bits() {
    let mut xs = edge_cases();
    every_f32(36.0, 44.0, &mut xs);
    every_f32(85.0, 90.0, &mut xs);
    every_f32(100.0, 108.0, &mut xs);
    xs.extend((0..=u32::MAX).step_by(4099).map(f32::from_bits));
    if xs.len() % 2 == 1 {
        xs.push(0.25);
    }
    let neg_abs: Vec<f32> = xs.iter().map(|x| -x.abs()).collect();
    let (e, _) = run_unary(UnaryOp::Exp, &neg_abs);
    let (vector, scalar) = run_unary(UnaryOp::Sigmoid, &xs);
    for (i, &x) in xs.iter().enumerate() {
        let want = sigmoid_from_exp_f32(x, e[i]);
        for (got, lp) in [(vector[i], "vector"), (scalar[i], "scalar")] {
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "sigmoid({x:e}) in the {lp} loop: {got:e}, from exp {want:e}"
            );
        }
    }
    let at = |x: f32| xs.iter().position(|&v| v == x).expect("a threshold");
    for x in [40.0f32, 104.0, f32::MAX, f32::INFINITY] {
        assert_eq!(vector[at(x)], 1.0, "sigmoid({x:e})");
    }
    for x in [-104.0f32, -f32::MAX, f32::NEG_INFINITY] {
        assert_eq!(vector[at(x)].to_bits(), 0.0f32.to_bits(), "sigmoid({x:e})");
    }

    let mut rng = Rng(12);
    let mut ws: Vec<f64> = (0..1 << 18)
        .map(|i| {
            let r = rng.next();
            let m = if i % 2 == 0 { 0.0 } else { 800.0 };
            // Uniform over [-m - 60, m + 60]: the saturated range and its edges.
            let u = (r >> 11) as f64 / (1u64 << 53) as f64;
            (2.0 * u - 1.0) * (m + 60.0)
        })
        .collect();
    for t in [40.0f64, 708.0, 745.133_219_101_941_1, 746.0, f64::MAX] {
        let mut y = t;
        for _ in 0..64 {
            ws.extend([y, -y]);
            y = f64::from_bits(y.to_bits() + 1);
        }
        let mut y = t;
        for _ in 0..64 {
            y = f64::from_bits(y.to_bits() - 1);
            ws.extend([y, -y]);
        }
    }
    ws.extend([0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.0]);
    let neg_abs: Vec<f64> = ws.iter().map(|x| -x.abs()).collect();
    let (e, _) = run_unary_f64(UnaryOp::Exp, &neg_abs);
    let (vector, scalar) = run_unary_f64(UnaryOp::Sigmoid, &ws);
    for (i, &x) in ws.iter().enumerate() {
        let want = sigmoid_from_exp_f64(x, e[i]);
        for (got, lp) in [(vector[i], "vector"), (scalar[i], "scalar")] {
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "f64 sigmoid({x:e}) in the {lp} loop: {got:e}, from exp {want:e}"
            );
        }
    }
    println!(
        "sigmoid saturation ({}): {} f32 and {} f64 inputs keep their bits",
        if use_fma() { "fused" } else { "unfused" },
        xs.len(),
        ws.len()
    );
}
