//! Every op on every dtype it is defined for, checked against plain Rust arithmetic per
//! element and against hand-written IEEE special cases (±0, NaN, ±inf, ties).

mod builder;

use builder::{array, run, KernelBuilder};
use ndfuse_ir::{BinaryOp, DType, HostArray, Scalar, UnaryOp};

const SPECIAL: [f64; 16] = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    1.5,
    -1.5,
    2.5,
    -2.5,
    0.5,
    -0.5,
    3.75e-3,
    1e30,
    -7e18,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];

/// Bit-equal, or both NaN (NaN signs and payloads are unspecified).
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn run_unary(op: UnaryOp, dtype: DType, xs: &[f64]) -> HostArray {
    let mut kb = KernelBuilder::new(&format!("k0_{}", op.name()), &[xs.len()]);
    let x = kb.load(dtype);
    let y = kb.unary(op, x);
    kb.store(y);
    run(&kb.build(), &[&array(dtype, &[xs.len()], xs)]).remove(0)
}

fn run_binary(op: BinaryOp, dtype: DType, xs: &[f64], ys: &[f64]) -> HostArray {
    let mut kb = KernelBuilder::new(&format!("k0_{}", op.name()), &[xs.len()]);
    let x = kb.load(dtype);
    let y = kb.load(dtype);
    let z = kb.binary(op, x, y);
    kb.store(z);
    let n = xs.len();
    run(
        &kb.build(),
        &[&array(dtype, &[n], xs), &array(dtype, &[n], ys)],
    )
    .remove(0)
}

/// All pairs of `vals`, as two columns.
fn pairs(vals: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for &a in vals {
        for &b in vals {
            xs.push(a);
            ys.push(b);
        }
    }
    (xs, ys)
}

/// Checks a float result element by element against `want` computed in the dtype.
fn check_floats(what: &str, got: &HostArray, xs: &[f64], want: impl Fn(usize) -> f64) {
    for (i, g) in got.to_f64s().into_iter().enumerate() {
        let w = want(i);
        assert!(
            same(g, w),
            "{what} at {i} (input {}): got {g:?}, want {w:?}",
            xs[i]
        );
    }
}

#[test]
fn float_unary_inline_ops() {
    type F32Fn = fn(f32) -> f32;
    type F64Fn = fn(f64) -> f64;
    let cases: [(UnaryOp, F32Fn, F64Fn); 11] = [
        (UnaryOp::Neg, |x| -x, |x| -x),
        (UnaryOp::Abs, f32::abs, f64::abs),
        (
            UnaryOp::Sign,
            |x| {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            },
            |x| {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            },
        ),
        (UnaryOp::Sqrt, f32::sqrt, f64::sqrt),
        // f32: sqrt, then the division, each rounded in f32 (the same code on vectors;
        // within 1 ulp of the reference's single rounding: tests/vmath.rs).
        (UnaryOp::Rsqrt, |x| 1.0 / x.sqrt(), |x| 1.0 / x.sqrt()),
        (UnaryOp::Square, |x| x * x, |x| x * x),
        (UnaryOp::Recip, |x| 1.0 / x, |x| 1.0 / x),
        (UnaryOp::Floor, f32::floor, f64::floor),
        (UnaryOp::Ceil, f32::ceil, f64::ceil),
        (UnaryOp::Round, f32::round_ties_even, f64::round_ties_even),
        (
            UnaryOp::Relu,
            |x| if x.is_nan() || x > 0.0 { x } else { 0.0 },
            |x| {
                if x.is_nan() || x > 0.0 {
                    x
                } else {
                    0.0
                }
            },
        ),
    ];
    let mut xs = SPECIAL.to_vec();
    xs.extend([1e-40, 0.49999997, 4.5, -3.5, 123456.78]);
    for (op, f32_fn, f64_fn) in cases {
        let got = run_unary(op, DType::F32, &xs);
        check_floats(&format!("{} f32", op.name()), &got, &xs, |i| {
            f64::from(f32_fn(xs[i] as f32))
        });
        let got = run_unary(op, DType::F64, &xs);
        check_floats(&format!("{} f64", op.name()), &got, &xs, |i| f64_fn(xs[i]));
    }
}

#[test]
fn float_special_cases_by_hand() {
    let bits = |a: &HostArray| -> Vec<u64> { a.to_f64s().iter().map(|v| v.to_bits()).collect() };
    let zeros = [0.0, -0.0];
    for d in [DType::F32, DType::F64] {
        // sign keeps ±0; relu maps -0 to +0; round is half to even.
        assert_eq!(
            bits(&run_unary(UnaryOp::Sign, d, &zeros)),
            bits(&array(d, &[2], &zeros))
        );
        assert_eq!(
            bits(&run_unary(UnaryOp::Relu, d, &[-0.0])),
            vec![0.0f64.to_bits()]
        );
        assert!(run_unary(UnaryOp::Sign, d, &[f64::NAN]).to_f64s()[0].is_nan());
        let r = run_unary(UnaryOp::Round, d, &[0.5, 1.5, 2.5, -0.5, -2.5]).to_f64s();
        assert_eq!(
            bits(&array(DType::F64, &[5], &r)),
            bits(&array(DType::F64, &[5], &[0.0, 2.0, 2.0, -0.0, -2.0]))
        );
        // maximum/minimum: +0 > -0 in both orders, NaN from either side.
        let mx = run_binary(
            BinaryOp::Max,
            d,
            &[-0.0, 0.0, f64::NAN, 1.0],
            &[0.0, -0.0, 1.0, f64::NAN],
        )
        .to_f64s();
        assert_eq!(
            (mx[0].to_bits(), mx[1].to_bits()),
            (0.0f64.to_bits(), 0.0f64.to_bits())
        );
        assert!(mx[2].is_nan() && mx[3].is_nan());
        let mn = run_binary(
            BinaryOp::Min,
            d,
            &[-0.0, 0.0, f64::NAN, 1.0],
            &[0.0, -0.0, 1.0, f64::NAN],
        )
        .to_f64s();
        assert_eq!(
            (mn[0].to_bits(), mn[1].to_bits()),
            ((-0.0f64).to_bits(), (-0.0f64).to_bits())
        );
        assert!(mn[2].is_nan() && mn[3].is_nan());
        // NaN compares false except for !=.
        let nan = [f64::NAN];
        for (op, want) in [
            (BinaryOp::Eq, false),
            (BinaryOp::Ne, true),
            (BinaryOp::Lt, false),
            (BinaryOp::Le, false),
            (BinaryOp::Gt, false),
            (BinaryOp::Ge, false),
        ] {
            let got = run_binary(op, d, &nan, &nan);
            assert_eq!(
                got.as_slice::<bool>(),
                Some(&[want][..]),
                "{} NaN NaN",
                op.name()
            );
        }
        // sqrt(-0) = -0, sqrt(-1) = NaN.
        let s = run_unary(UnaryOp::Sqrt, d, &[-0.0, -1.0]).to_f64s();
        assert_eq!(s[0].to_bits(), (-0.0f64).to_bits());
        assert!(s[1].is_nan());
    }
}

#[test]
fn float_binary_ops() {
    let (xs, ys) = pairs(&SPECIAL);
    type F32Fn = fn(f32, f32) -> f32;
    type F64Fn = fn(f64, f64) -> f64;
    let cases: [(BinaryOp, F32Fn, F64Fn); 4] = [
        (BinaryOp::Add, |a, b| a + b, |a, b| a + b),
        (BinaryOp::Sub, |a, b| a - b, |a, b| a - b),
        (BinaryOp::Mul, |a, b| a * b, |a, b| a * b),
        (BinaryOp::Div, |a, b| a / b, |a, b| a / b),
    ];
    for (op, f32_fn, f64_fn) in cases {
        let got = run_binary(op, DType::F32, &xs, &ys);
        check_floats(&format!("{} f32", op.name()), &got, &xs, |i| {
            f64::from(f32_fn(xs[i] as f32, ys[i] as f32))
        });
        let got = run_binary(op, DType::F64, &xs, &ys);
        check_floats(&format!("{} f64", op.name()), &got, &xs, |i| {
            f64_fn(xs[i], ys[i])
        });
    }
    for (op, cmp) in [
        (BinaryOp::Eq, f64::eq as fn(&f64, &f64) -> bool),
        (BinaryOp::Ne, f64::ne),
        (BinaryOp::Lt, f64::lt),
        (BinaryOp::Le, f64::le),
        (BinaryOp::Gt, f64::gt),
        (BinaryOp::Ge, f64::ge),
    ] {
        for d in [DType::F32, DType::F64] {
            let got = run_binary(op, d, &xs, &ys);
            let want: Vec<bool> = xs.iter().zip(&ys).map(|(a, b)| cmp(a, b)).collect();
            assert_eq!(got.as_slice::<bool>(), Some(&want[..]), "{} {d}", op.name());
        }
    }
}

#[test]
fn integer_ops_wrap() {
    let vals = [0.0, 1.0, -1.0, 7.0, -7.0, 3.0, 2147483647.0, -2147483648.0];
    let (xs, ys) = pairs(&vals);
    let to_i = |v: &[f64]| -> Vec<i64> { v.iter().map(|&x| x as i64).collect() };
    let (xi, yi) = (to_i(&xs), to_i(&ys));
    type IntBin = fn(i64, i64) -> i64;
    let bins: [(BinaryOp, IntBin, IntBin); 5] = [
        (
            BinaryOp::Add,
            |a, b| (a as i32).wrapping_add(b as i32) as i64,
            i64::wrapping_add,
        ),
        (
            BinaryOp::Sub,
            |a, b| (a as i32).wrapping_sub(b as i32) as i64,
            i64::wrapping_sub,
        ),
        (
            BinaryOp::Mul,
            |a, b| (a as i32).wrapping_mul(b as i32) as i64,
            i64::wrapping_mul,
        ),
        (BinaryOp::Max, i64::max, i64::max),
        (BinaryOp::Min, i64::min, i64::min),
    ];
    let ints =
        |a: &HostArray| -> Vec<i64> { (0..a.len()).map(|i| a.storage().get_i64(i)).collect() };
    for (op, f32bit, f64bit) in bins {
        let got = ints(&run_binary(op, DType::I32, &xs, &ys));
        let want: Vec<i64> = xi.iter().zip(&yi).map(|(&a, &b)| f32bit(a, b)).collect();
        assert_eq!(got, want, "{} i32", op.name());
        // i64 with values beyond i32 too.
        let big: Vec<f64> = xs.iter().map(|x| x * 4294967296.0).collect();
        let got = ints(&run_binary(op, DType::I64, &big, &ys));
        let want: Vec<i64> = big
            .iter()
            .zip(&yi)
            .map(|(&a, &b)| f64bit(a as i64, b))
            .collect();
        assert_eq!(got, want, "{} i64", op.name());
    }
    for op in [
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
    ] {
        for d in [DType::I32, DType::I64] {
            let got = run_binary(op, d, &xs, &ys);
            let want: Vec<bool> = xi
                .iter()
                .zip(&yi)
                .map(|(a, b)| match op {
                    BinaryOp::Eq => a == b,
                    BinaryOp::Ne => a != b,
                    BinaryOp::Lt => a < b,
                    BinaryOp::Le => a <= b,
                    BinaryOp::Gt => a > b,
                    _ => a >= b,
                })
                .collect();
            assert_eq!(got.as_slice::<bool>(), Some(&want[..]), "{} {d}", op.name());
        }
    }
    type IntUn = fn(i32) -> i32;
    let uns: [(UnaryOp, IntUn); 5] = [
        (UnaryOp::Neg, i32::wrapping_neg),
        (UnaryOp::Abs, i32::wrapping_abs),
        (UnaryOp::Sign, i32::signum),
        (UnaryOp::Square, |x| x.wrapping_mul(x)),
        (UnaryOp::Relu, |x| x.max(0)),
    ];
    for (op, f) in uns {
        let got = ints(&run_unary(op, DType::I32, &vals));
        let want: Vec<i64> = vals.iter().map(|&v| i64::from(f(v as i32))).collect();
        assert_eq!(got, want, "{} i32", op.name());
        let got = ints(&run_unary(
            op,
            DType::I64,
            &[-9.223372036854776e18, 5.0, -5.0, 0.0],
        ));
        let want: Vec<i64> = [i64::MIN, 5, -5, 0]
            .iter()
            .map(|&v| match op {
                UnaryOp::Neg => v.wrapping_neg(),
                UnaryOp::Abs => v.wrapping_abs(),
                UnaryOp::Sign => v.signum(),
                UnaryOp::Square => v.wrapping_mul(v),
                _ => v.max(0),
            })
            .collect();
        assert_eq!(got, want, "{} i64", op.name());
    }
}

#[test]
fn integer_pow() {
    let bases = [2.0, -2.0, 3.0, 1.0, -1.0, 0.0, 10.0, -1.0, 7.0];
    let exps = [10.0, 3.0, -2.0, -5.0, -3.0, 0.0, 10.0, 4.0, 40.0];
    let got = run_binary(BinaryOp::Pow, DType::I32, &bases, &exps);
    let want = [1024, -8, 0, 1, -1, 1, 1410065408, 1, 7i32.wrapping_pow(40)];
    assert_eq!(got.as_slice::<i32>(), Some(&want[..]));
    let got = run_binary(BinaryOp::Pow, DType::I64, &bases, &exps);
    let want = [
        1024,
        -8,
        0,
        1,
        -1,
        1,
        10_000_000_000,
        1,
        7i64.wrapping_pow(40),
    ];
    assert_eq!(got.as_slice::<i64>(), Some(&want[..]));
}

#[test]
fn bool_logic_compare_and_where() {
    let (xs, ys) = pairs(&[0.0, 1.0]);
    let b = |v: &[bool]| v.to_vec();
    let run_b = |op| {
        run_binary(op, DType::Bool, &xs, &ys)
            .as_slice::<bool>()
            .map(b)
    };
    assert_eq!(run_b(BinaryOp::And), Some(vec![false, false, false, true]));
    assert_eq!(run_b(BinaryOp::Or), Some(vec![false, true, true, true]));
    assert_eq!(run_b(BinaryOp::Eq), Some(vec![true, false, false, true]));
    assert_eq!(run_b(BinaryOp::Ne), Some(vec![false, true, true, false]));
    assert_eq!(run_b(BinaryOp::Lt), Some(vec![false, true, false, false]));
    assert_eq!(run_b(BinaryOp::Ge), Some(vec![true, false, true, true]));
    let not = run_unary(UnaryOp::Not, DType::Bool, &[0.0, 1.0]);
    assert_eq!(not.as_slice::<bool>(), Some(&[true, false][..]));

    // where(x > 0, x, c) with a constant branch, on every dtype it takes.
    for d in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool] {
        let mut kb = KernelBuilder::new("k0_gt_where", &[4]);
        let c = kb.load(DType::Bool);
        let x = kb.load(d);
        let k = kb.constant(d, Scalar::I(1).cast(d));
        let w = kb.select(c, x, k);
        kb.store(w);
        let cond = array(DType::Bool, &[4], &[1.0, 0.0, 1.0, 0.0]);
        let xv = array(d, &[4], &[0.0, 0.0, 0.0, 5.0]);
        let out = run(&kb.build(), &[&cond, &xv]);
        assert_eq!(out[0].to_f64s(), vec![0.0, 1.0, 0.0, 1.0], "where on {d}");
    }
}

#[test]
fn casts_between_every_pair() {
    let vals = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        2.5,
        -2.5,
        0.7,
        255.9,
        2147483648.0,
        3e9,
        -3e9,
        1e20,
        -1e20,
        9007199254740993.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let dtypes = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];
    for from in dtypes {
        let input = array(from, &[vals.len()], &vals);
        for to in dtypes {
            let mut kb = KernelBuilder::new("k0_cast", &[vals.len()]);
            let x = kb.load(from);
            let y = kb.cast(x, to);
            kb.store(y);
            let got = run(&kb.build(), &[&input]).remove(0);
            for i in 0..vals.len() {
                let s = input.storage();
                // The reference rules, restated with Rust's `as` (which saturates and
                // maps NaN to 0 for float -> int, and rounds once for int -> float).
                let want: f64 = match (from.is_float(), to) {
                    (_, DType::Bool) => f64::from(u8::from(s.get_bool(i))),
                    (true, DType::F32) => f64::from(s.get_f64(i) as f32),
                    (true, DType::F64) => s.get_f64(i),
                    (true, DType::I32) => f64::from(s.get_f64(i) as i64 as i32),
                    (true, _) => (s.get_f64(i) as i64) as f64,
                    (false, DType::F32) => f64::from(s.get_i64(i) as f32),
                    (false, DType::F64) => s.get_i64(i) as f64,
                    (false, DType::I32) => f64::from(s.get_i64(i) as i32),
                    (false, _) => s.get_i64(i) as f64,
                };
                let g = got.storage().get_f64(i);
                assert!(
                    same(g, want),
                    "cast {from} -> {to} of {:?}: got {g:?}, want {want:?}",
                    s.get_f64(i)
                );
            }
            // i64 results beyond 2^53 are not visible through f64; compare exactly.
            if to == DType::I64 && from.is_float() {
                let want: Vec<i64> = (0..vals.len())
                    .map(|i| input.storage().get_f64(i) as i64)
                    .collect();
                assert_eq!(got.as_slice::<i64>(), Some(&want[..]), "cast {from} -> i64");
            }
        }
    }
    // i64 -> f32 rounds once: 2^53 + 2^29 + 1 is just above an f32 tie that rounding
    // through f64 would create (and then break to even, downwards).
    let v: i64 = (1 << 53) + (1 << 29) + 1;
    let mut kb = KernelBuilder::new("k0_cast_i64_f32", &[1]);
    let x = kb.load(DType::I64);
    let y = kb.cast(x, DType::F32);
    kb.store(y);
    let input = HostArray::new(ndfuse_ir::Shape::new([1]), ndfuse_ir::Storage::I64(vec![v]))
        .expect("1 element");
    let got = run(&kb.build(), &[&input]).remove(0);
    assert_eq!(got.as_slice::<f32>(), Some(&[v as f32][..]));
    assert_ne!(
        v as f32, v as f64 as f32,
        "the case must tell one rounding from two"
    );
}

/// Distance in units in the last place between two floats of `dtype`.
fn ulps(a: f64, b: f64, dtype: DType) -> u64 {
    if same(a, b) || a == b {
        return 0;
    }
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    let ord = |v: f64| -> i128 {
        if dtype == DType::F32 {
            let bits = (v as f32).to_bits() as i32;
            i128::from(if bits < 0 { i32::MIN - bits } else { bits })
        } else {
            let bits = v.to_bits() as i64;
            i128::from(if bits < 0 { i64::MIN - bits } else { bits })
        }
    };
    (ord(a) - ord(b)).unsigned_abs() as u64
}

#[test]
fn transcendentals_within_two_ulp_of_f64_math() {
    let mut xs: Vec<f64> = SPECIAL.to_vec();
    xs.extend((-60..=60).map(|i| f64::from(i) * 0.37));
    xs.extend([1e-8, -1e-8, 88.0, -87.0, 700.0, -720.0, 1e6]);
    let reference = |op: UnaryOp, x: f64| -> f64 {
        match op {
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Log1p => x.ln_1p(),
            UnaryOp::Expm1 => x.exp_m1(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Erf => libm::erf(x),
            _ => {
                if x >= 0.0 {
                    1.0 / (1.0 + (-x).exp())
                } else {
                    x.exp() / (1.0 + x.exp())
                }
            }
        }
    };
    let ops = [
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Sigmoid,
    ];
    for op in ops {
        for d in [DType::F32, DType::F64] {
            let input = array(d, &[xs.len()], &xs);
            let got = run_unary(op, d, &xs).to_f64s();
            for (i, g) in got.into_iter().enumerate() {
                let x = input.storage().get_f64(i);
                let want = ndfuse_ir::round::round_f64(reference(op, x), d);
                let u = ulps(g, want, d);
                assert!(
                    u <= 2,
                    "{} {d} of {x:?}: got {g:?}, want {want:?} ({u} ulp)",
                    op.name()
                );
            }
        }
    }
    let (bs, es) = pairs(&[
        0.0,
        -0.0,
        0.5,
        2.0,
        -2.0,
        3.0,
        10.0,
        -1.5,
        f64::INFINITY,
        f64::NAN,
    ]);
    for d in [DType::F32, DType::F64] {
        let bi = array(d, &[bs.len()], &bs);
        let ei = array(d, &[es.len()], &es);
        let got = run_binary(BinaryOp::Pow, d, &bs, &es).to_f64s();
        for (i, g) in got.into_iter().enumerate() {
            let (b, e) = (bi.storage().get_f64(i), ei.storage().get_f64(i));
            let want = ndfuse_ir::round::round_f64(b.powf(e), d);
            assert!(
                ulps(g, want, d) <= 2,
                "pow {d} of {b:?}, {e:?}: got {g:?}, want {want:?}"
            );
        }
    }
}
