//! Matrix products on the CPU backend: the GEMM fills the product block by block and the
//! JIT-compiled epilogue runs over each block (runtime/src/gemm.rs). Every test compares
//! with the reference interpreter (f64 sums rounded once, node by node) under a stated
//! tolerance, checks that the whole graph is ONE kernel that the JIT ran (not the
//! interpreter), and the determinism test checks the same bits on 1, 2 and 4 threads.

use ndfuse::{matmul, Array, BackendKind, Context, DType, SliceArg, Tensor};
use ndfuse_runtime::StepPath;

/// Slope bound of the epilogues tested: gelu's derivative is at most 1.13 (relu, tanh,
/// additions and casts: at most 1), so an error in the product grows by at most this.
const LIPSCHITZ: f64 = 1.2;

/// Bits of accumulation per dtype: the machine epsilon of what the product sums in.
/// A K-term sum with an FMA or a multiply and an add per term errs by at most
/// `(K + 2) * eps * sum |a||b|` (the classic gamma_K bound with room for the final
/// rounding); f16 and bf16 operands are widened exactly and summed in f32.
fn acc_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        _ => f64::from(f32::EPSILON),
    }
}

/// Unit roundoff (half an ulp, relative) of the output dtype: each rounding of a value
/// to it, by the reference after every node or by the kernel at its store, moves it by
/// at most this times its magnitude. f16 output: one f16 ulp after the f32 sum.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON / 2.0,
        DType::F32 => f64::from(f32::EPSILON) / 2.0,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        // Integers: exact (wrapping) in both.
        _ => 0.0,
    }
}

/// How far a result may be from the reference.
#[derive(Clone, Copy, Debug)]
struct Tol {
    /// The contracted extent.
    k: usize,
    /// Dtype of the operands (f16/bf16 accumulate in f32).
    operands: DType,
    /// Roundings on the two paths together: the reference's one per node after the
    /// product, the kernel's store, and two more for an inline transcendental (2 ulp).
    roundings: f64,
    /// Bound of the magnitudes added to the product in the epilogue (a bias or residual
    /// in [-1, 1) each), which intermediate roundings scale with.
    added: f64,
}

impl Tol {
    fn new(k: usize, operands: DType, roundings: f64, added: f64) -> Tol {
        Tol {
            k,
            operands,
            roundings,
            added,
        }
    }

    /// `|got - want|` allowed at an element whose terms' magnitudes sum to `s`.
    fn allowed(&self, out: DType, s: f64, want: f64) -> f64 {
        let sum = LIPSCHITZ * acc_eps(self.operands) * (self.k as f64 + 2.0) * s;
        sum + self.roundings * unit_roundoff(out) * (s + self.added + want.abs())
    }
}

/// An input: uniform in [lo, hi) cast to `dtype`, already evaluated so the product's
/// kernel is the only kernel (a cast would be a kernel of its own).
fn input(ctx: &Context, shape: &[usize], dtype: DType, (lo, hi): (f64, f64), seed: u64) -> Tensor {
    ctx.set_backend(BackendKind::Interp);
    let a = ctx
        .rand_uniform(shape, lo, hi, seed)
        .cast(dtype)
        .eval()
        .expect("an input evaluates");
    ctx.from_array(&a)
}

/// Values of each dtype's tests: floats in [-1, 1); integers large enough that sums
/// of products wrap (i32: |a b| up to 1e10; i64: up to 1e24).
fn range(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::I32 => (-1e5, 1e5),
        DType::I64 => (-1e12, 1e12),
        _ => (-1.0, 1.0),
    }
}

/// `|t|` in f64 (exact for every float and the integers used here): operands of the
/// reference's `sum |a||b|`.
fn abs64(t: &Tensor) -> Tensor {
    t.cast(DType::F64).abs()
}

/// Evaluates `y` on the CPU backend and on the interpreter and asserts: `kernels`
/// kernels, every one run by the JIT; every element within `tol` (exact for integers),
/// where `scale` (same shape as `y`) holds each element's `sum |a||b|`, evaluated by the
/// interpreter.
fn check_kernels(ctx: &Context, y: &Tensor, scale: &Tensor, tol: Tol, kernels: usize, what: &str) {
    ctx.set_backend(BackendKind::Interp);
    let want = ctx.eval(&[y, scale]).expect("the reference evaluates");
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx.eval_report(&[y]).expect("the CPU evaluates");
    let paths = &report.evaluation().paths;
    assert_eq!(
        report.kernel_count(),
        kernels,
        "{what}: {}",
        report.annotated_graph()
    );
    assert!(
        paths.iter().all(|p| matches!(p, StepPath::Jit { .. })) && !paths.is_empty(),
        "{what}: not run by the JIT: {paths:?}\n{}",
        report.annotated_graph()
    );
    compare(&got[0], &want[0], &want[1], tol, what);
}

/// [`check_kernels`] of a graph that is ONE kernel: the product and its epilogue.
fn check(ctx: &Context, y: &Tensor, scale: &Tensor, tol: Tol, what: &str) {
    check_kernels(ctx, y, scale, tol, 1, what);
}

/// Element-by-element comparison (see [`check_kernels`]).
fn compare(got: &Array, want: &Array, scale: &Array, tol: Tol, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let out = got.dtype();
    let (g, w, s) = (got.to_f64_vec(), want.to_f64_vec(), scale.to_f64_vec());
    assert_eq!(w.len(), s.len(), "{what}: the scale has the result's shape");
    for (i, ((&a, &b), &s)) in g.iter().zip(&w).zip(&s).enumerate() {
        let ok = if out.is_float() {
            (a - b).abs() <= tol.allowed(out, s, b)
        } else {
            a == b
        };
        assert!(
            ok,
            "{what}: element {i} is {a:e}, the reference says {b:e} (allowed {:e}, sum |a||b| = {s:e})",
            tol.allowed(out, s, b)
        );
    }
}

/// `x @ w` for `[m, k] @ [k, n]` of `dtype`, then `epilogue` (with `b`: [n], `r`:
/// [m, n]); checks it against the reference.
fn product(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    (roundings, added): (f64, f64),
    epilogue: impl Fn(&Tensor, &Tensor, &Tensor) -> Tensor,
) {
    let ctx = Context::new();
    let x = input(&ctx, &[m, k], dtype, range(dtype), 1);
    let w = input(&ctx, &[k, n], dtype, range(dtype), 2);
    let b = input(&ctx, &[n], dtype, range(dtype), 3);
    let r = input(&ctx, &[m, n], dtype, range(dtype), 4);
    let y = epilogue(&x.matmul(&w), &b, &r);
    let scale = abs64(&x).matmul(&abs64(&w));
    let what = format!("{dtype} {m}x{k} @ {k}x{n}");
    check(
        &ctx,
        &y,
        &scale,
        Tol::new(k, dtype, roundings, added),
        &what,
    );
}

/// Roundings and added magnitudes of a bare product: the reference rounds once, the
/// kernel once.
const BARE: (f64, f64) = (2.0, 0.0);

/// Every size in {0, 1, 7, 65, 1023} on every axis, in f32 (bare products).
#[test]
fn f32_sizes() {
    for mnk in [
        (0, 7, 65),
        (7, 0, 65),
        (7, 65, 0),
        (1, 1, 1),
        (1, 1023, 7),
        (1023, 1, 65),
        (65, 7, 1023),
        (7, 1023, 1),
        (65, 65, 65),
        (1023, 65, 1023),
    ] {
        product(DType::F32, mnk, BARE, |p, _, _| p.clone());
    }
}

/// The other dtypes, a covering set each (bare and with a bias; integers wrap).
#[test]
fn other_dtypes() {
    for dtype in [DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
        for mnk in [(0, 7, 7), (7, 65, 0), (1, 7, 65), (65, 1, 7), (7, 7, 1)] {
            product(dtype, mnk, BARE, |p, _, _| p.clone());
        }
        // The reference rounds the product and the sum; the kernel the sum.
        product(dtype, (65, 1023, 7), (3.0, 1.0), |p, b, _| p + b);
        product(dtype, (1023, 7, 65), (3.0, 1.0), |p, _, r| p + r);
    }
}

/// Epilogues: bias add, relu, gelu, tanh, residual add, a cast to f16, all fused.
#[test]
fn epilogues() {
    let mnk = (65, 129, 1023);
    // Roundings: the reference's nodes (the product and each node after it; gelu is 7:
    // square, mul, mul, add, mul, sigmoid, mul), the kernel's store, and 2 for an inline
    // transcendental's 2 ulp; added: one [-1, 1) term per bias or residual.
    product(DType::F32, mnk, (3.0, 1.0), |p, b, _| p + b);
    product(DType::F32, mnk, (4.0, 1.0), |p, b, _| (p + b).relu());
    product(DType::F32, mnk, (12.0, 1.0), |p, b, _| (p + b).gelu());
    product(DType::F32, mnk, (5.0, 0.0), |p, _, _| p.tanh());
    product(DType::F32, mnk, (13.0, 2.0), |p, b, r| (p + b).gelu() + r);
    product(DType::F32, mnk, (3.0, 0.0), |p, _, _| p.cast(DType::F16));
    product(DType::F64, mnk, (12.0, 1.0), |p, b, _| (p + b).gelu());
    product(DType::F16, mnk, (12.0, 1.0), |p, b, _| (p + b).gelu());
    product(DType::BF16, mnk, (5.0, 0.0), |p, _, _| p.tanh());
    product(DType::I32, mnk, (0.0, 0.0), |p, b, r| (p + b).relu() + r);
}

/// Operands read through views: a transpose, strided slices (every other row, every
/// other column, reversed rows), in f32 and f16 (whose widening copies the view).
#[test]
fn views() {
    for dtype in [DType::F32, DType::F16] {
        let ctx = Context::new();
        let (m, n, k) = (65, 33, 129);
        let x = input(&ctx, &[m, k], dtype, range(dtype), 5);
        let wt = input(&ctx, &[n, k], dtype, range(dtype), 6).transpose();
        let tall = input(&ctx, &[2 * m, k], dtype, range(dtype), 7);
        let wide = input(&ctx, &[k, 2 * n + 1], dtype, range(dtype), 8);
        let every_other_row = tall.slice(&[SliceArg::new(None, None, 2)]);
        let odd_cols = wide.slice(&[SliceArg::all(), SliceArg::new(Some(1), None, 2)]);
        let reversed = x.slice(&[SliceArg::new(None, None, -1)]);
        for (what, a, b) in [
            ("x @ transpose(w)", &x, &wt),
            ("x[::2, :] @ transpose(w)", &every_other_row, &wt),
            ("x @ w[:, 1::2]", &x, &odd_cols),
            ("x[::-1] @ w[:, 1::2]", &reversed, &odd_cols),
            ("transpose(x[::2]) @ x", &every_other_row.transpose(), &x),
        ] {
            let kk = a.shape().expect("a shape")[1];
            let scale = abs64(a).matmul(&abs64(b));
            let y = a.matmul(b).relu();
            check(
                &ctx,
                &y,
                &scale,
                Tol::new(kk, dtype, 3.0, 0.0),
                &format!("{dtype} {what}"),
            );
        }
    }
}

/// Batch axes broadcast ([3, 1, M, K] @ [4, K, N]: the lhs's batch of 1 and the rhs's
/// missing axis have stride 0), and 1-D operands (promoted, then the axis removed).
#[test]
fn batches_and_vectors() {
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        let ctx = Context::new();
        let (m, n, k) = (17, 9, 65);
        let x = input(&ctx, &[3, 1, m, k], dtype, range(dtype), 9);
        let w = input(&ctx, &[4, k, n], dtype, range(dtype), 10);
        let b = input(&ctx, &[n], dtype, range(dtype), 11);
        let v = input(&ctx, &[k], dtype, range(dtype), 12);
        let x2 = input(&ctx, &[m, k], dtype, range(dtype), 13);
        let w2 = input(&ctx, &[k, n], dtype, range(dtype), 14);
        // A 1-D result is the product with its added axis squeezed away: a view of the
        // whole product, handed back as its buffer under the 1-D shape (no copy kernel).
        let cases: [(&str, Tensor, Tensor, f64, usize); 4] = [
            (
                "[3,1,M,K] @ [4,K,N] + b",
                &x.matmul(&w) + &b,
                abs64(&x).matmul(&abs64(&w)),
                1.0,
                1,
            ),
            (
                "v @ w",
                v.matmul(&w2),
                abs64(&v).matmul(&abs64(&w2)),
                0.0,
                1,
            ),
            (
                "x @ v",
                matmul(&x2, &v),
                abs64(&x2).matmul(&abs64(&v)),
                0.0,
                1,
            ),
            ("v @ v", v.matmul(&v), abs64(&v).matmul(&abs64(&v)), 0.0, 1),
        ];
        for (what, y, scale, added, kernels) in cases {
            let tol = Tol::new(k, dtype, 2.0 + added, added);
            check_kernels(&ctx, &y, &scale, tol, kernels, &format!("{dtype} {what}"));
        }
    }
}

/// The same bits on 1, 2 and 4 threads: a 1023x65x1023 f32 product with a gelu epilogue
/// (one block: one unit, so 1 thread runs it unit by unit and 2 or 4 spread the GEMM
/// over threads), and batched products (3 units: batch-parallel on 1 and 2 threads,
/// GEMM-parallel on 4; 16 units: batch-parallel on all).
#[test]
fn one_two_and_four_threads_give_the_same_bits() {
    let ctx = Context::new();
    let f = DType::F32;
    let x = input(&ctx, &[1023, 1023], f, range(f), 15);
    let w = input(&ctx, &[1023, 65], f, range(f), 16);
    let b = input(&ctx, &[65], f, range(f), 17);
    let q = input(&ctx, &[3, 200, 300], f, range(f), 18);
    let kv = input(&ctx, &[300, 500], f, range(f), 19);
    let many = input(&ctx, &[16, 64, 96], f, range(f), 20);
    let many_w = input(&ctx, &[16, 96, 80], f, range(f), 21);
    let outs = [
        (x.matmul(&w) + &b).gelu(),
        q.matmul(&kv).tanh(),
        many.matmul(&many_w).relu(),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    ctx.set_backend(BackendKind::Cpu);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        pool.install(|| ctx.eval_report(&refs).expect("evaluates"))
    };
    let (one, report) = run(1);
    assert!(
        report
            .evaluation()
            .paths
            .iter()
            .all(|p| matches!(p, StepPath::Jit { .. })),
        "{}",
        report.annotated_graph()
    );
    for threads in [2, 4] {
        let (other, _) = run(threads);
        for (i, (p, q)) in one.iter().zip(&other).enumerate() {
            let (p, q) = (p.to_f64_vec(), q.to_f64_vec());
            assert!(
                p.iter().zip(&q).all(|(a, b)| a.to_bits() == b.to_bits()),
                "output {i} differs between 1 and {threads} threads"
            );
        }
    }
}

/// Evaluates `outs` on the CPU backend and returns them with the report's kernel count,
/// asserting that the JIT ran every kernel.
fn eval_jit(ctx: &Context, outs: &[&Tensor], what: &str) -> (Vec<Array>, usize) {
    ctx.set_backend(BackendKind::Cpu);
    let (got, report) = ctx.eval_report(outs).expect("the CPU evaluates");
    let paths = &report.evaluation().paths;
    assert!(
        paths.iter().all(|p| matches!(p, StepPath::Jit { .. })) && !paths.is_empty(),
        "{what}: not run by the JIT: {paths:?}\n{}",
        report.annotated_graph()
    );
    (got, report.kernel_count())
}

/// A bare product (an identity epilogue: the GEMM writes straight into the output) and
/// the same product stored by an epilogue that also computes something else (the general
/// path: the GEMM fills the product scratch and the compiled epilogue copies it into the
/// output) give the same bits, for f32, f64 and i32, over shapes of one unit, many
/// units (which a bare product runs as one GEMM), a batch, and a transposed operand; on
/// 1, 2 and 4 threads.
#[test]
fn identity_epilogue_matches_the_general_path() {
    for dtype in [DType::F32, DType::F64, DType::I32] {
        let ctx = Context::new();
        let x = input(&ctx, &[300, 70], dtype, range(dtype), 22);
        let w = input(&ctx, &[70, 513], dtype, range(dtype), 23);
        let q = input(&ctx, &[3, 65, 129], dtype, range(dtype), 24);
        let kt = input(&ctx, &[3, 33, 129], dtype, range(dtype), 25).permute(&[0, 2, 1]);
        // N = 4096 in f32: blocks of 32 rows, units of 512: three units in one matrix.
        let tall = input(&ctx, &[1100, 8], dtype, range(dtype), 26);
        let tall_w = input(&ctx, &[8, 4096], dtype, range(dtype), 27);
        // Two units (of 872 and 328 rows in f32) and two blocks of K: the bare product runs as
        // one GEMM over all 1200 rows (`whole_rows`), the general path in units.
        let deep = input(&ctx, &[1200, 600], dtype, range(dtype), 28);
        let deep_w = input(&ctx, &[600, 300], dtype, range(dtype), 29);
        for (what, a, b) in [
            ("300x70 @ 70x513", &x, &w),
            ("3x65x129 @ transpose(3x33x129)", &q, &kt),
            ("1100x8 @ 8x4096", &tall, &tall_w),
            ("1200x600 @ 600x300", &deep, &deep_w),
        ] {
            let what = format!("{dtype} {what}");
            let bare = a.matmul(b);
            let (identity, kernels) = eval_jit(&ctx, &[&bare], &what);
            assert_eq!(kernels, 1, "{what}: the bare product is one kernel");
            // The product and product + 1 from one kernel of two outputs.
            let product = a.matmul(b);
            let plus_one = &product + 1.0;
            for threads in [1, 2, 4] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                let (general, kernels) =
                    pool.install(|| eval_jit(&ctx, &[&product, &plus_one], &what));
                assert_eq!(kernels, 1, "{what}: the product and its use are one kernel");
                let (p, q) = (identity[0].to_f64_vec(), general[0].to_f64_vec());
                assert_eq!(p.len(), q.len(), "{what}");
                assert!(
                    p.iter().zip(&q).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: the identity epilogue and the general path differ on {threads} threads"
                );
                let (bare_threads, _) = pool.install(|| eval_jit(&ctx, &[&bare], &what));
                let r = bare_threads[0].to_f64_vec();
                assert!(
                    p.iter().zip(&r).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: the identity epilogue differs between 1 and {threads} threads"
                );
            }
        }
    }
}

/// An epilogue that reads the product through a non-contiguous view (its transpose, or
/// its rows reversed) cannot read it block by block; whatever kernels the graph becomes,
/// the result matches the reference.
#[test]
fn product_read_through_a_view() {
    let dtype = DType::F32;
    let ctx = Context::new();
    let k = 300;
    let x = input(&ctx, &[257, k], dtype, range(dtype), 28);
    let w = input(&ctx, &[k, 257], dtype, range(dtype), 29);
    let p = x.matmul(&w);
    let scale = abs64(&x).matmul(&abs64(&w));
    let reversed = SliceArg::new(None, None, -1);
    for (what, y, scale) in [
        (
            "p + transpose(p)",
            &p + &p.transpose(),
            &scale + &scale.transpose(),
        ),
        (
            "p * 2 + p[::-1]",
            &p * 2.0 + p.slice(&[reversed]),
            &scale * 2.0 + scale.slice(&[reversed]),
        ),
    ] {
        ctx.set_backend(BackendKind::Interp);
        let want = ctx.eval(&[&y, &scale]).expect("the reference evaluates");
        let (got, _) = eval_jit(&ctx, &[&y], what);
        compare(
            &got[0],
            &want[0],
            &want[1],
            Tol::new(k, dtype, 4.0, 0.0),
            what,
        );
    }
}

/// `CompiledKernel::run_units` (the runtime's batch-parallel epilogues): over disjoint
/// ranges it writes what `run` writes there, after `before(u)` on each range; ranges
/// that are unsorted, overlapping or past the domain, and kernels with reduce axes, are
/// refused before anything runs; an error of `before` is returned. In place
/// (`run_units_in_place`) it writes the same, and refuses an input read elsewhere than
/// at each position's own offset.
#[test]
fn run_units_checks_its_ranges() {
    use ndfuse_ir::{Buffer, Expr, HostArray, Instr, Kernel, Plan, Shape, Store, ValueId, View};
    let n = 1000;
    let domain = Shape::new([n]);
    let mut kernel = Kernel {
        name: "k0_exp".to_string(),
        domain: domain.clone(),
        reduce_axes: Vec::new(),
        inputs: vec![Buffer {
            dtype: DType::F32,
            len: n,
        }],
        outputs: vec![Buffer {
            dtype: DType::F32,
            len: n,
        }],
        body: vec![
            Instr {
                dtype: DType::F32,
                expr: Expr::Load {
                    input: 0,
                    view: View::contiguous(domain.clone()),
                },
            },
            Instr {
                dtype: DType::F32,
                expr: Expr::Unary(ndfuse_ir::UnaryOp::Exp, ValueId(0)),
            },
        ],
        stores: vec![Store {
            value: ValueId(1),
            output: 0,
        }],
        plan: Plan::Elementwise,
        plan_reason: "hand-built".to_string(),
        contraction: None,
    };
    let ck = ndfuse_codegen_cpu::compile(&kernel).expect("compiles");
    let vals: Vec<f64> = (0..n).map(|i| i as f64 / 100.0 - 5.0).collect();
    let x = HostArray::from_f64s(DType::F32, domain.clone(), &vals);
    let mut whole = HostArray::zeros(DType::F32, domain.clone());
    ck.run(&[&x], &mut [&mut whole]).expect("runs");
    let ranges = [0..7, 7..300, 300..300, 512..1000];
    let seen: Vec<std::sync::atomic::AtomicBool> =
        ranges.iter().map(|_| Default::default()).collect();
    let mut units = HostArray::zeros(DType::F32, domain.clone());
    ck.run_units(&[&x], &mut [&mut units], &ranges, |u| {
        seen[u].store(true, std::sync::atomic::Ordering::Relaxed);
        Ok::<(), ndfuse_codegen_cpu::CodegenError>(())
    })
    .expect("runs");
    assert!(seen
        .iter()
        .all(|s| s.load(std::sync::atomic::Ordering::Relaxed)));
    let (w, u) = (whole.to_f64s(), units.to_f64s());
    for i in 0..n {
        let want = if (300..512).contains(&i) { 0.0 } else { w[i] };
        assert_eq!(u[i].to_bits(), want.to_bits(), "position {i}");
    }
    let ok = |_: usize| Ok::<(), ndfuse_codegen_cpu::CodegenError>(());
    for bad in [
        vec![7..300, 0..7],
        vec![0..300, 299..400],
        vec![0..300, 900..1001],
        vec![0..7, std::ops::Range { start: 9, end: 8 }],
    ] {
        let mut out = HostArray::zeros(DType::F32, domain.clone());
        let e = ck
            .run_units(&[&x], &mut [&mut out], &bad, ok)
            .expect_err("bad ranges");
        assert!(e.to_string().contains("sorted, disjoint"), "{bad:?}: {e}");
        assert!(out.to_f64s().iter().all(|&v| v == 0.0), "{bad:?}: ran");
    }
    let mut out = HostArray::zeros(DType::F32, domain.clone());
    let e = ck
        .run_units(&[&x], &mut [&mut out], &ranges, |u| {
            if u == 2 {
                Err(ndfuse_codegen_cpu::CodegenError::Args {
                    kernel: "test".into(),
                    detail: "before failed".into(),
                })
            } else {
                Ok(())
            }
        })
        .expect_err("before fails");
    assert!(e.to_string().contains("before failed"), "{e}");
    // In place (`run_units_in_place`, the runtime's epilogue that rewrites the output
    // the GEMM filled): the input read from the output's array, the same bits; on 1
    // thread and on 4 (ranges running at once).
    for threads in [1, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a pool");
        let mut inplace = HostArray::from_f64s(DType::F32, domain.clone(), &vals);
        pool.install(|| ck.run_units_in_place(&[], &mut [&mut inplace], (0, 0), &ranges, ok))
            .expect("runs in place");
        let (w, got) = (whole.to_f64s(), inplace.to_f64s());
        for i in 0..n {
            // Outside the ranges the input is left as it was.
            let want = if (300..512).contains(&i) {
                vals[i] as f32 as f64
            } else {
                w[i]
            };
            assert_eq!(got[i].to_bits(), want.to_bits(), "in place, position {i}");
        }
    }
    // An input the body reads at other positions than its own is refused in place
    // (reversed: position i reads element n - 1 - i, which another range may have
    // rewritten already), and so is a second input given where none is expected.
    let mut reversed = kernel.clone();
    reversed.body[0].expr = Expr::Load {
        input: 0,
        view: View {
            shape: domain.clone(),
            strides: vec![-1],
            offset: n as isize - 1,
        },
    };
    let rk = ndfuse_codegen_cpu::compile(&reversed).expect("compiles");
    let mut out = HostArray::from_f64s(DType::F32, domain.clone(), &vals);
    let e = rk
        .run_units_in_place(&[], &mut [&mut out], (0, 0), &ranges, ok)
        .expect_err("not in place");
    assert!(e.to_string().contains("cannot be read in place"), "{e}");
    let e = ck
        .run_units_in_place(&[&x], &mut [&mut out], (0, 0), &ranges, ok)
        .expect_err("an input too many");
    assert!(e.to_string().contains("cannot be read in place"), "{e}");
    // A kernel with reduce axes is refused.
    kernel.name = "k1_sum".to_string();
    kernel.domain = Shape::new([10, 100]);
    kernel.reduce_axes = vec![1];
    kernel.outputs[0].len = 10;
    kernel.body[0].expr = Expr::Load {
        input: 0,
        view: View::contiguous(kernel.domain.clone()),
    };
    kernel.body[1] = Instr {
        dtype: DType::F32,
        expr: Expr::Reduce(ndfuse_ir::Accumulate::Sum, ValueId(0)),
    };
    kernel.plan = Plan::Rows {
        rows: 10,
        row_len: 100,
        contiguous: true,
    };
    let ck = ndfuse_codegen_cpu::compile(&kernel).expect("compiles");
    let mut out = HostArray::zeros(DType::F32, Shape::new([10]));
    let e = ck
        .run_units(&[&x], &mut [&mut out], &[0..4, 4..10], ok)
        .expect_err("reduce axes");
    assert!(e.to_string().contains("without reduce axes"), "{e}");
}

/// Half operands are converted into packing buffers kept per thread from one
/// evaluation to the next (or widened into f32 buffers of the host cache, where the
/// packed GEMM declines): evaluating an f16 (bf16) product, then another of the same
/// shapes and other values (whose panels land in the same buffers), then the first
/// again, gives the first's bits again, and both agree with the reference. Shapes give
/// a transposed operand (read element by element) and a broadcast batch.
#[test]
fn half_operands_give_the_same_bits_on_every_evaluation() {
    for dtype in [DType::F16, DType::BF16] {
        let ctx = Context::new();
        let (m, n, k) = (300, 129, 700);
        let x = input(&ctx, &[2, m, k], dtype, range(dtype), 30);
        let wt = input(&ctx, &[n, k], dtype, range(dtype), 31).transpose();
        let other_x = input(&ctx, &[2, m, k], dtype, (-4.0, 4.0), 32);
        let other_wt = input(&ctx, &[n, k], dtype, (-4.0, 4.0), 33).transpose();
        let y = x.matmul(&wt);
        let scale = abs64(&x).matmul(&abs64(&wt));
        let what = format!("{dtype} 2x{m}x{k} @ transpose({n}x{k})");
        check(&ctx, &y, &scale, Tol::new(k, dtype, BARE.0, BARE.1), &what);
        let (first, _) = eval_jit(&ctx, &[&y], &what);
        let (other, _) = eval_jit(&ctx, &[&other_x.matmul(&other_wt)], &what);
        let (again, _) = eval_jit(&ctx, &[&y], &what);
        let (p, o, q) = (
            first[0].to_f64_vec(),
            other[0].to_f64_vec(),
            again[0].to_f64_vec(),
        );
        assert_eq!(p.len(), q.len(), "{what}");
        assert!(
            p.iter().zip(&o).any(|(a, b)| a != b),
            "{what}: the other product should differ (else the test proves nothing)"
        );
        assert!(
            p.iter().zip(&q).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: a second evaluation differs from the first"
        );
    }
}

/// Operands converted as the GEMM packs them (runtime/src/gemm_packed.rs: a prologue
/// step, an f16 or bf16 operand widened by a cast) give the bits of the `gemm` crate's
/// product of the same values held in f32 (materialised first, read in place), on 1,
/// 2 and 4 threads: shapes with partial tiles on both axes, several blocks of K, several
/// units of rows with a short last one, a broadcast batch, a transposed operand, and the
/// shapes where the packed GEMM declines (a row, a column, K = 2, a small product with
/// unit K strides) and the operands are copied instead.
#[test]
fn converted_operands_give_the_bits_of_their_f32_values() {
    let ctx = Context::new();
    let f = DType::F32;
    let cases: &[(&[usize], &[usize], bool)] = &[
        (&[7, 1100], &[1100, 33], false),
        (&[300, 700], &[700, 129], false),
        (&[1030, 600], &[600, 70], false),
        (&[3, 65, 40], &[40, 90], false),
        (&[200, 300], &[50, 300], true),
        (&[1, 300], &[300, 40], false),
        (&[40, 300], &[300, 1], false),
        (&[40, 2], &[2, 40], false),
        (&[8, 64], &[16, 64], true),
    ];
    for (i, &(xs, ws, transposed)) in cases.iter().enumerate() {
        let seed = 40 + 2 * i as u64;
        let x = input(&ctx, xs, f, range(f), seed);
        let w = input(&ctx, ws, f, range(f), seed + 1);
        let w = if transposed { w.transpose() } else { w };
        let what = format!("{xs:?} @ {ws:?}{}", if transposed { ".T" } else { "" });
        let mut pairs = vec![(
            (&x * 2.0).matmul(&w),
            (
                ctx.from_array(&(&x * 2.0).eval().expect("x * 2")),
                w.clone(),
            ),
            "(x * 2) @ w".to_string(),
        )];
        for half in [DType::F16, DType::BF16] {
            let xh = input(&ctx, xs, half, range(half), seed);
            let wh = ctx.from_array(&w.cast(half).eval().expect("w"));
            pairs.push((
                xh.cast(f).matmul(&wh.cast(f)),
                (
                    ctx.from_array(&xh.cast(f).eval().expect("x")),
                    ctx.from_array(&wh.cast(f).eval().expect("w")),
                ),
                format!("cast({half} x, f32) @ cast({half} w, f32)"),
            ));
        }
        for (fused, (a, b), how) in &pairs {
            let apart = a.matmul(b);
            let (want, kernels) = eval_jit(&ctx, &[&apart], &what);
            assert_eq!(kernels, 1, "{what}: {how} apart");
            let want = want[0].to_f64_vec();
            for threads in [1, 2, 4] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                let (got, kernels) = pool.install(|| eval_jit(&ctx, &[fused], &what));
                assert_eq!(kernels, 1, "{what}: {how} is one kernel");
                let got = got[0].to_f64_vec();
                assert_eq!(got.len(), want.len(), "{what}");
                let bad = got
                    .iter()
                    .zip(&want)
                    .position(|(g, w)| g.to_bits() != w.to_bits());
                assert!(
                    bad.is_none(),
                    "{what}: {how} on {threads} threads: element {bad:?} differs from the product of the f32 values"
                );
            }
        }
    }
}

/// Products run on the micro-kernels of the element-wise kernels' tier: AVX-512F where
/// the wide path uses it, AVX2+FMA where it uses AVX2 (`NDFUSE_CPU_WIDE=avx2`, which CI
/// runs this file under as well, so every test above checks both tiers on an AVX-512
/// host), and the widest the host has where the wide path is off.
#[test]
fn products_run_on_the_wide_paths_tier() {
    use ndfuse_codegen_cpu::wide::{self, Tier};
    use ndfuse_runtime::ProductTier;
    let tier = ProductTier::current();
    let want = match wide::tier() {
        Some(Tier::Avx512) => ProductTier::Avx512,
        Some(Tier::Avx2) => ProductTier::Fma,
        None if Tier::Avx512.available() => ProductTier::Avx512,
        None if Tier::Avx2.available() => ProductTier::Fma,
        None => ProductTier::Scalar,
    };
    assert_eq!(tier, want, "the product tier ({})", tier.name());
    if std::env::var("NDFUSE_CPU_WIDE").as_deref() == Ok("avx2") && Tier::Avx2.available() {
        assert_eq!(
            tier,
            ProductTier::Fma,
            "NDFUSE_CPU_WIDE=avx2 keeps products on AVX2"
        );
    }
}
