//! Differential tests against the reference interpreter (`ndfuse_ir::interp`): every op
//! on every dtype it is defined for, every cast, random index maps, and fused kernels.
//!
//! Tolerance: 0 ulp (bit-equal, or both NaN) for every op on every dtype but the
//! transcendentals that are inline code (`vmath`), each with a documented max error
//! (`f32_ulp_bound`, `POW_F32_ULP`, `f64_ulp_bound`: 1 to 3 ulp); the other f64
//! transcendentals call the reference interpreter's own functions and stay exact.

mod builder;

use builder::{run, view, KernelBuilder};
use ndfuse_codegen_cpu::{f32_ulp_bound, f64_ulp_bound, POW_F32_ULP};
use ndfuse_ir::interp::eval_kernel;
use ndfuse_ir::{BinaryOp, DType, HostArray, Kernel, Scalar, Shape, Storage, UnaryOp};

/// Allowed error in ulps of (f32, f64) for the op named `op`: the inline library's
/// documented bounds, none otherwise (see the module docs).
fn tolerance(op: &str) -> (u64, u64) {
    if op == BinaryOp::Pow.name() {
        return (u64::from(POW_F32_ULP), 0);
    }
    let unary = UnaryOp::ALL.into_iter().find(|u| u.name() == op);
    let bound = |f: fn(UnaryOp) -> Option<u32>| unary.and_then(f).map_or(0, u64::from);
    (bound(f32_ulp_bound), bound(f64_ulp_bound))
}

const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];

/// A small deterministic generator (no dependency needed for a fixed test sequence).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 31) as f64
    }
}

/// Test inputs of `dtype`: IEEE special values (all of them, whatever `n`), then a
/// spread of magnitudes up to `n` values.
fn values(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Lcg(seed);
    let mut v: Vec<f64> = match dtype {
        DType::Bool => vec![0.0, 1.0],
        DType::I32 | DType::I64 => {
            let mut v = vec![
                0.0,
                1.0,
                -1.0,
                2.0,
                -2.0,
                3.0,
                -3.0,
                7.0,
                31.0,
                2147483647.0,
                -2147483648.0,
            ];
            if dtype == DType::I64 {
                v.extend([9.2e18, -9.2e18, 4294967296.0, 65.0, 63.0]);
            }
            v
        }
        _ => vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -0.5,
            2.5,
            -2.5,
            1e-40,
            1e-300,
            3.4e38,
            1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ],
    };
    while v.len() < n {
        let x = match dtype {
            DType::Bool => rng.below(2) as f64,
            DType::I32 | DType::I64 => rng.below(2001) as f64 - 1000.0,
            _ => {
                let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                // Mostly the range where functions are interesting, some far out.
                let mag = if rng.below(4) == 0 {
                    10f64.powf(rng.unit() * 12.0 - 6.0)
                } else {
                    rng.unit() * 12.0
                };
                sign * mag
            }
        };
        v.push(x);
    }
    v
}

fn host(dtype: DType, vals: &[f64]) -> HostArray {
    HostArray::from_f64s(dtype, Shape::new([vals.len()]), vals)
}

/// Bit-equal, or both NaN.
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn ulps(a: f64, b: f64, dtype: DType) -> u64 {
    if same(a, b) {
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

/// Runs `kernel` through the JIT and the interpreter and compares every output; returns
/// the largest ulp error seen (0 for exact types).
fn compare(kernel: &Kernel, inputs: &[&HostArray], what: &str, tol: (u64, u64)) -> u64 {
    let want = eval_kernel(kernel, inputs).unwrap_or_else(|e| panic!("{what}: interpreter: {e}"));
    let got = run(kernel, inputs);
    let mut worst = 0;
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.dtype(), w.dtype(), "{what}: out{o} dtype");
        assert_eq!(g.len(), w.len(), "{what}: out{o} length");
        let dtype = g.dtype();
        if !dtype.is_float() {
            assert_eq!(g.storage(), w.storage(), "{what}: out{o}\n{kernel}");
            continue;
        }
        let limit = if dtype == DType::F32 { tol.0 } else { tol.1 };
        for i in 0..g.len() {
            let (gv, wv) = (g.storage().get_f64(i), w.storage().get_f64(i));
            let u = ulps(gv, wv, dtype);
            let input_at = |k: usize| {
                inputs
                    .get(k)
                    .map(|a| a.storage().get_f64(i % a.len().max(1)))
            };
            assert!(
                u <= limit,
                "{what}: out{o}[{i}] = {gv:?}, reference {wv:?} ({u} ulp > {limit}); inputs {:?}, {:?}",
                input_at(0),
                input_at(1)
            );
            worst = worst.max(u);
        }
    }
    worst
}

fn unary_legal(op: UnaryOp, d: DType) -> bool {
    match op {
        UnaryOp::Not => d == DType::Bool,
        _ if op.is_float_only() => d.is_float(),
        _ => d != DType::Bool,
    }
}

fn binary_legal(op: BinaryOp, d: DType) -> bool {
    if op.is_comparison() {
        true
    } else if op.is_logical() {
        d == DType::Bool
    } else if op == BinaryOp::Div {
        d.is_float()
    } else {
        d != DType::Bool
    }
}

#[test]
fn every_unary_op_on_every_dtype() {
    for op in UnaryOp::ALL {
        for d in DTYPES.into_iter().filter(|&d| unary_legal(op, d)) {
            let xs = values(d, 400, 7);
            let mut kb = KernelBuilder::new(&format!("k0_{}", op.name()), &[xs.len()]);
            let x = kb.load(d);
            let y = kb.unary(op, x);
            kb.store(y);
            let k = kb.build();
            let worst = compare(
                &k,
                &[&host(d, &xs)],
                &format!("{} {d}", op.name()),
                tolerance(op.name()),
            );
            if worst > 0 {
                eprintln!("{} {d}: max {worst} ulp", op.name());
            }
        }
    }
}

#[test]
fn every_binary_op_on_every_dtype() {
    for op in BinaryOp::ALL {
        for d in DTYPES.into_iter().filter(|&d| binary_legal(op, d)) {
            // Every pair of the special values, then random pairs.
            let base = values(d, 0, 1);
            let mut xs = Vec::new();
            let mut ys = Vec::new();
            for &a in &base {
                for &b in &base {
                    xs.push(a);
                    ys.push(b);
                }
            }
            xs.extend(values(d, 300, 11).into_iter().skip(base.len()));
            ys.extend(values(d, 300, 13).into_iter().skip(base.len()));
            if op == BinaryOp::Pow && d.is_int() {
                // Exponents that exercise squaring, wrapping and the negative rule.
                ys = ys.iter().map(|y| y.rem_euclid(70.0) - 5.0).collect();
            }
            let mut kb = KernelBuilder::new(&format!("k0_{}", op.name()), &[xs.len()]);
            let x = kb.load(d);
            let y = kb.load(d);
            let z = kb.binary(op, x, y);
            kb.store(z);
            let k = kb.build();
            let (a, b) = (host(d, &xs), host(d, &ys));
            let worst = compare(
                &k,
                &[&a, &b],
                &format!("{} {d}", op.name()),
                tolerance(op.name()),
            );
            if worst > 0 {
                eprintln!("{} {d}: max {worst} ulp", op.name());
            }
        }
    }
}

#[test]
fn where_on_every_dtype() {
    for d in DTYPES {
        let n = 64;
        let c = values(DType::Bool, n, 3);
        let (xs, ys) = (values(d, n, 5), values(d, n, 9));
        let mut kb = KernelBuilder::new("k0_where", &[n]);
        let cv = kb.load(DType::Bool);
        let x = kb.load(d);
        let y = kb.load(d);
        let w = kb.select(cv, x, y);
        kb.store(w);
        let k = kb.build();
        compare(
            &k,
            &[&host(DType::Bool, &c), &host(d, &xs), &host(d, &ys)],
            &format!("where {d}"),
            (0, 0),
        );
    }
}

#[test]
fn every_cast() {
    for from in DTYPES {
        let mut xs = values(from, 200, 17);
        if from.is_float() {
            xs.extend([
                2147483648.0,
                3e9,
                -3e9,
                1e19,
                -1e19,
                9007199254740993.0,
                255.5,
                -0.7,
            ]);
        }
        if from == DType::I64 {
            xs.extend([9007199254740993.0, 9.2e18, -4611686018427387904.0]);
        }
        let mut input = host(from, &xs);
        if from == DType::I64 {
            // Values whose f32 rounding differs when it goes through f64 (not exact in f64 above).
            if let Storage::I64(v) = input.storage_mut() {
                v.extend([
                    (1 << 53) + (1 << 29) + 1,
                    i64::MAX,
                    i64::MIN,
                    -(1 << 62) - 1,
                ]);
            }
            input =
                HostArray::new(Shape::new([input.len()]), input.storage().clone()).expect("length");
        }
        for to in DTYPES {
            let mut kb = KernelBuilder::new("k0_cast", &[input.len()]);
            let x = kb.load(from);
            let y = kb.cast(x, to);
            kb.store(y);
            compare(
                &kb.build(),
                &[&input],
                &format!("cast {from} -> {to}"),
                (0, 0),
            );
        }
    }
}

/// A random view over the domain: any stride in -7..=7 per axis (0 = broadcast), an
/// offset that keeps it inside a buffer with some slack on both sides.
fn random_view(rng: &mut Lcg, dims: &[usize]) -> (ndfuse_ir::View, usize) {
    let strides: Vec<isize> = dims.iter().map(|_| rng.below(15) as isize - 7).collect();
    let mut lo = 0isize;
    let mut hi = 0isize;
    for (&d, &s) in dims.iter().zip(&strides) {
        let reach = (d.max(1) as isize - 1) * s;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    let offset = -lo + rng.below(3) as isize;
    let len = (offset + hi) as usize + 1 + rng.below(3) as usize;
    (view(dims, &strides, offset), len)
}

/// Random domains of rank 0 to 4 (dims 0 to 5), each with up to four random views,
/// sometimes a contiguous or fixed one; exact i64 and f64 arithmetic on the loads.
#[test]
fn random_index_maps() {
    let mut rng = Lcg(2024);
    for case in 0..300 {
        let rank = rng.below(5) as usize;
        let dims: Vec<usize> = (0..rank).map(|_| rng.below(6) as usize).collect();
        let d = if case % 2 == 0 {
            DType::I64
        } else {
            DType::F64
        };
        let mut kb = KernelBuilder::new(&format!("k{case}_views"), &dims);
        let mut inputs = Vec::new();
        let mut acc = None;
        for _ in 0..=rng.below(4) {
            let (v, len) = match rng.below(4) {
                0 => (
                    ndfuse_ir::View::contiguous(Shape::new(dims.as_slice())),
                    kb.domain().numel(),
                ),
                1 => (view(&dims, &vec![0; rank], 1), 2),
                _ => random_view(&mut rng, &dims),
            };
            let vals: Vec<f64> = (0..len).map(|_| rng.below(1000) as f64 - 500.0).collect();
            inputs.push(host(d, &vals));
            let x = kb.load_view(d, len, v);
            let scaled = {
                let c = kb.constant(d, Scalar::I(rng.below(7) as i64 + 1).cast(d));
                kb.binary(BinaryOp::Mul, x, c)
            };
            acc = Some(match acc {
                None => scaled,
                Some(a) => kb.binary(BinaryOp::Add, a, scaled),
            });
        }
        kb.store(acc.expect("at least one load"));
        let k = kb.build();
        let refs: Vec<&HostArray> = inputs.iter().collect();
        compare(&k, &refs, &format!("case {case}"), (0, 0));
    }
}

/// Fused kernels as the passes will hand them over: several ops, views and outputs.
#[test]
fn fused_kernels() {
    // softplus-ish: where(x > 0, x + log1p(exp(-x)), log1p(exp(x))) with x = a - b[j]
    // (b broadcast along rows), plus sigmoid(x) * 2 as a second output, in f32 and f64.
    for d in [DType::F32, DType::F64] {
        let mut kb = KernelBuilder::new("k0_sub_softplus_sigmoid", &[6, 7]);
        let a = kb.load(d);
        let b = kb.load_view(d, 7, view(&[6, 7], &[0, 1], 0));
        let x = kb.binary(BinaryOp::Sub, a, b);
        let zero = kb.constant(d, Scalar::F(0.0));
        let pos = kb.binary(BinaryOp::Gt, x, zero);
        let nx = kb.unary(UnaryOp::Neg, x);
        let e1 = kb.unary(UnaryOp::Exp, nx);
        let l1 = kb.unary(UnaryOp::Log1p, e1);
        let t = kb.binary(BinaryOp::Add, x, l1);
        let e2 = kb.unary(UnaryOp::Exp, x);
        let f = kb.unary(UnaryOp::Log1p, e2);
        let sp = kb.select(pos, t, f);
        let s = kb.unary(UnaryOp::Sigmoid, x);
        let two = kb.constant(d, Scalar::F(2.0));
        let s2 = kb.binary(BinaryOp::Mul, s, two);
        kb.store(sp);
        kb.store(s2);
        let k = kb.build();
        let av = host(d, &values(d, 42, 21));
        let bv = host(d, &values(d, 7, 23)[..7]);
        // Chained calls compound: each rounding of a libcall can move the next one.
        compare(&k, &[&av, &bv], &format!("softplus {d}"), (4, 4));
    }
    // Integer and bool mix through a transposed load: out = cast(where(x >= y^T, x*x, -y^T), f64).
    let mut kb = KernelBuilder::new("k1_ge_where_cast", &[4, 5]);
    let x = kb.load(DType::I32);
    let yt = kb.load_view(
        DType::I32,
        20,
        ndfuse_ir::View::contiguous(Shape::new([5, 4])).permute(&[1, 0]),
    );
    let ge = kb.binary(BinaryOp::Ge, x, yt);
    let sq = kb.unary(UnaryOp::Square, x);
    let ny = kb.unary(UnaryOp::Neg, yt);
    let w = kb.select(ge, sq, ny);
    let c = kb.cast(w, DType::F64);
    let nb = kb.unary(UnaryOp::Not, ge);
    kb.store(c);
    kb.store(nb);
    let k = kb.build();
    let xv = host(DType::I32, &values(DType::I32, 20, 31));
    let yv = host(DType::I32, &values(DType::I32, 20, 37));
    compare(&k, &[&xv, &yv], "ge_where_cast", (0, 0));
}
