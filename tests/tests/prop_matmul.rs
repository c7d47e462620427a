//! Property test of the matrix product with its epilogues: random M, N, K in 0..=9,
//! batch shapes that broadcast (each operand a right-aligned part of a common batch of
//! rank 0..=2 and extents 1..=3, with 1s), operands given transposed or not, each with a
//! random prologue (a scale, an f16 round trip, both), and a random chain of
//! element-wise epilogue ops, in f32 and f64; the `cpu` backend must agree with the
//! `interp` backend (the reference, node by node in f64 rounded per node). The
//! prologues round the same values the same way on both backends, so only their
//! magnitude (up to 3) scales the product's bound.
//!
//! Tolerance: an error bound carried through the chain ([`Bound`]), never a constant.
//! With inputs in [-1, 1] the product is at most K in magnitude and a GEMM's sum of K
//! terms in the dtype is at most `K² u` from the reference's once-rounded sum (u the unit
//! roundoff: 2^-24 for f32, 2^-53 for f64). Each op then maps (magnitude M, error E):
//! `+ bias`: M + 1, E + u M; `* s`: |s| M, |s| E + u M; relu: unchanged (1-Lipschitz);
//! tanh, sigmoid, exp: the op's Lipschitz constant times E plus 3 ulp of the result (the
//! CPU backend's vmath bound is at most 3 ulp, `f64_ulp_bound(Tanh)`); the f16 round trip:
//! E + one f16 ulp of M (2^-10 M, at least 2^-24), since two values E apart may round to
//! neighbouring f16 values. Elements are compared within twice the final E, the factor
//! covering the roundings of the steps the bound counts once.

use ndfuse::{BackendKind, Context, DType, Tensor};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Epi {
    Bias,
    Scale(f64),
    Relu,
    Tanh,
    Sigmoid,
    /// `exp(v / 8)`: exp of a value small enough not to overflow.
    ExpSmall,
    /// `cast(cast(v, f16), dtype)`.
    F16,
}

fn epi() -> impl Strategy<Value = Epi> {
    prop_oneof![
        Just(Epi::Bias),
        prop::sample::select(vec![0.5, -1.5, 2.0]).prop_map(Epi::Scale),
        Just(Epi::Relu),
        Just(Epi::Tanh),
        Just(Epi::Sigmoid),
        Just(Epi::ExpSmall),
        Just(Epi::F16),
    ]
}

/// Magnitude and absolute-error bound of a value (see the module docs).
#[derive(Clone, Copy, Debug)]
struct Bound {
    m: f64,
    e: f64,
}

/// A common batch shape and, for each operand, which of its trailing axes it has (its
/// rank) and which of those it holds at extent 1 (a broadcast).
#[derive(Clone, Debug)]
struct Batch {
    common: Vec<usize>,
    rank: [usize; 2],
    ones: [Vec<bool>; 2],
}

fn batch() -> impl Strategy<Value = Batch> {
    prop::collection::vec(1usize..=3, 0..=2).prop_flat_map(|common| {
        let r = common.len();
        (
            Just(common),
            [0..=r, 0..=r],
            [
                prop::collection::vec(any::<bool>(), r),
                prop::collection::vec(any::<bool>(), r),
            ],
        )
            .prop_map(|(common, rank, ones)| Batch { common, rank, ones })
    })
}

impl Batch {
    /// Operand `i`'s batch axes: the trailing `rank[i]` axes of the common batch, some
    /// of them 1.
    fn of(&self, i: usize) -> Vec<usize> {
        let r = self.common.len();
        (r - self.rank[i]..r)
            .map(|a| if self.ones[i][a] { 1 } else { self.common[a] })
            .collect()
    }
}

/// An operand of logical shape `[batch..., rows, cols]`, built transposed
/// (`[batch..., cols, rows]` then the last two axes swapped) when `t`.
fn operand(ctx: &Context, batch: &[usize], rows: usize, cols: usize, t: bool, seed: u64) -> Tensor {
    let mut shape = batch.to_vec();
    shape.extend(if t { [cols, rows] } else { [rows, cols] });
    let x = ctx.rand_uniform(&shape, -1.0, 1.0, seed);
    if t {
        let r = shape.len();
        let mut perm: Vec<i64> = (0..r as i64).collect();
        perm.swap(r - 2, r - 1);
        x.permute(&perm)
    } else {
        x
    }
}

/// An operand prologue: what the graph computes on an operand before the product (a
/// step the product applies as it reads the operand, `ndfuse_ir::Prologue`).
#[derive(Clone, Copy, Debug)]
enum Pro {
    None,
    /// `x * s`.
    Scale(f64),
    /// `cast(cast(x, f16), dtype)`: a rounding, then the widening back.
    F16,
    /// `cast(x * 3, f16)` then back: a chain.
    ScaleF16,
}

fn pro() -> impl Strategy<Value = Pro> {
    prop_oneof![
        Just(Pro::None),
        prop::sample::select(vec![0.5, 3.0, -0.125]).prop_map(Pro::Scale),
        Just(Pro::F16),
        Just(Pro::ScaleF16),
    ]
}

/// `x` through prologue `p`, and the largest magnitude of the result (`x` in [-1, 1]).
fn prologue(x: Tensor, p: Pro, dtype: DType) -> (Tensor, f64) {
    match p {
        Pro::None => (x, 1.0),
        Pro::Scale(s) => (x * s, s.abs()),
        Pro::F16 => (x.cast(DType::F16).cast(dtype), 1.0),
        Pro::ScaleF16 => ((x * 3.0).cast(DType::F16).cast(dtype), 3.0),
    }
}

fn build(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    batch: &Batch,
    (ta, tb): (bool, bool),
    pro: [Pro; 2],
    chain: &[Epi],
    seed: u64,
) -> (Context, Tensor, f64) {
    let ctx = Context::builder()
        .dtype(dtype)
        .build()
        .expect("a float dtype");
    let u = if dtype == DType::F64 {
        2f64.powi(-53)
    } else {
        2f64.powi(-24)
    };
    let a = operand(&ctx, &batch.of(0), m, k, ta, seed);
    let b = operand(&ctx, &batch.of(1), k, n, tb, seed.wrapping_add(1));
    // Operand prologues: the same rounded values on both backends, so only their
    // magnitude enters the bound.
    let (a, sa) = prologue(a, pro[0], dtype);
    let (b, sb) = prologue(b, pro[1], dtype);
    let mut v = a.matmul(&b);
    let kf = k as f64;
    let mut bd = Bound {
        m: kf * sa * sb,
        e: (kf * kf + 1.0) * u * sa * sb,
    };
    let ulps = |x: f64| 3.0 * 2.0 * u * x;
    for (i, op) in chain.iter().enumerate() {
        bd = match *op {
            Epi::Bias => {
                let bias = ctx.rand_uniform(&[n], -1.0, 1.0, seed.wrapping_add(2 + i as u64));
                v = v + &bias;
                Bound {
                    m: bd.m + 1.0,
                    e: bd.e + u * (bd.m + 1.0),
                }
            }
            Epi::Scale(s) => {
                v = v * s;
                Bound {
                    m: bd.m * s.abs(),
                    e: bd.e * s.abs() + u * bd.m * s.abs(),
                }
            }
            Epi::Relu => {
                v = v.relu();
                bd
            }
            Epi::Tanh => {
                v = v.tanh();
                Bound {
                    m: bd.m.min(1.0),
                    e: bd.e + ulps(1.0),
                }
            }
            Epi::Sigmoid => {
                v = v.sigmoid();
                Bound {
                    m: 1.0,
                    e: bd.e / 4.0 + ulps(1.0),
                }
            }
            Epi::ExpSmall => {
                v = (v * 0.125).exp();
                let top = (bd.m / 8.0).exp();
                Bound {
                    m: top,
                    e: (bd.e / 8.0 + u * bd.m / 8.0) * top + ulps(top),
                }
            }
            Epi::F16 => {
                v = v.cast(DType::F16).cast(dtype);
                Bound {
                    m: bd.m,
                    e: bd.e + (bd.m * 2f64.powi(-10)).max(2f64.powi(-24)),
                }
            }
        };
    }
    (ctx, v, 2.0 * bd.e)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn cpu_matmul_with_epilogues_equals_the_interp_backend(
        f64_ in any::<bool>(),
        m in 0usize..=9,
        n in 0usize..=9,
        k in 0usize..=9,
        batch in batch(),
        ta in any::<bool>(),
        tb in any::<bool>(),
        pa in pro(),
        pb in pro(),
        chain in prop::collection::vec(epi(), 0..=4),
        seed in any::<u64>(),
    ) {
        let dtype = if f64_ { DType::F64 } else { DType::F32 };
        let (ctx, y, tol) = build(dtype, (m, n, k), &batch, (ta, tb), [pa, pb], &chain, seed);
        let mut want_shape = batch.common.clone();
        for (i, d) in want_shape.iter_mut().enumerate() {
            // A common axis every operand holds at 1 (or lacks) is 1 in the result.
            let held = |o: usize| {
                let r = batch.common.len();
                i >= r - batch.rank[o] && !batch.ones[o][i]
            };
            if !held(0) && !held(1) {
                *d = 1;
            }
        }
        let lead = batch.common.len() - batch.rank[0].max(batch.rank[1]);
        want_shape.drain(..lead);
        want_shape.extend([m, n]);
        prop_assert_eq!(y.shape().expect("a valid graph"), &want_shape[..]);
        ctx.set_backend(BackendKind::Interp);
        let want = y.eval().expect("reference evaluates");
        ctx.set_backend(BackendKind::Cpu);
        let (got, report) = ctx.eval_report(&[&y]).expect("cpu evaluates");
        prop_assert_eq!(got[0].dtype(), dtype);
        prop_assert_eq!(got[0].shape(), want.shape());
        for (i, (g, w)) in got[0].to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
            prop_assert!(
                (g - w).abs() <= tol,
                "element {}: cpu {:e}, interp {:e}, |diff| {:e} > {:e}\n{:?}\n{}",
                i, g, w, (g - w).abs(), tol, chain, report.kernels_text()
            );
        }
    }
}
