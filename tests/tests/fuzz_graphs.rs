//! Fuzzing of graphs built through the API, valid and not: random programs over inputs
//! of random shapes (ranks 0-3, extents 0-4) and dtypes apply element-wise ops between
//! any two values (shapes that do not broadcast included), reductions, softmax and
//! squeezes over random axes (out of range included), casts to every dtype, reshapes
//! to random shapes, transposes and matrix products of whatever two values come up.
//! Each program is built and evaluated in an `interp` and a `cpu` context. Property:
//! both evaluations return; when both give arrays they have the same shape and dtype
//! and equal values within a tolerance (NaN and infinities where the reference has
//! them); a program one backend refuses the other refuses too. Never a panic, hang or
//! abort. `NDFUSE_FUZZ_CASES` raises the count.

mod fuzz_support;

use fuzz_support::{check, config};
use ndfuse::{Array, BackendKind, Context, DType, Tensor};
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

const BUDGET: Duration = Duration::from_secs(60);

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::Bool,
];

#[derive(Clone, Debug)]
enum Step {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Reduce(u8, usize, i64, bool),
    Softmax(usize, i64),
    Cast(usize, usize),
    Reshape(usize, Vec<i64>),
    Transpose(usize),
    Matmul(usize, usize),
    ExpandDims(usize, i64),
    Squeeze(usize, i64),
}

fn step() -> impl Strategy<Value = Step> {
    let v = 0usize..16;
    let axis = -4i64..4;
    prop_oneof![
        (0u8..8, v.clone()).prop_map(|(o, a)| Step::Unary(o, a)),
        (0u8..6, v.clone(), v.clone()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        (0u8..4, v.clone(), axis.clone(), any::<bool>())
            .prop_map(|(o, a, x, k)| Step::Reduce(o, a, x, k)),
        (v.clone(), axis.clone()).prop_map(|(a, x)| Step::Softmax(a, x)),
        (v.clone(), 0..DTYPES.len()).prop_map(|(a, d)| Step::Cast(a, d)),
        (v.clone(), prop::collection::vec(-1i64..5, 0..4)).prop_map(|(a, s)| Step::Reshape(a, s)),
        v.clone().prop_map(Step::Transpose),
        (v.clone(), v.clone()).prop_map(|(a, b)| Step::Matmul(a, b)),
        (v.clone(), axis.clone()).prop_map(|(a, x)| Step::ExpandDims(a, x)),
        (v, axis).prop_map(|(a, x)| Step::Squeeze(a, x)),
    ]
}

#[derive(Clone, Debug)]
struct Program {
    inputs: Vec<(Vec<usize>, usize)>,
    steps: Vec<Step>,
}

fn program() -> impl Strategy<Value = Program> {
    let shape = prop::collection::vec(prop_oneof![4 => 1usize..5, 1 => Just(0usize)], 0..4);
    let dtype = prop_oneof![4 => Just(0usize), 2 => Just(1usize), 1 => 2usize..6];
    (
        prop::collection::vec((shape, dtype), 1..4),
        prop::collection::vec(step(), 1..8),
    )
        .prop_map(|(inputs, steps)| Program { inputs, steps })
}

fn contexts() -> &'static (Context, Context) {
    static CTX: OnceLock<(Context, Context)> = OnceLock::new();
    CTX.get_or_init(|| {
        let make = |b| Context::builder().backend(b).build().expect("context");
        (make(BackendKind::Interp), make(BackendKind::Cpu))
    })
}

/// The program's last value (and every value it made) in `ctx`.
fn build(ctx: &Context, p: &Program) -> Tensor {
    let mut vals: Vec<Tensor> = p
        .inputs
        .iter()
        .enumerate()
        .map(|(i, (shape, d))| {
            ctx.rand_uniform(shape, -1.5, 1.5, 7 + i as u64)
                .cast(DTYPES[*d])
        })
        .collect();
    for s in &p.steps {
        let at = |i: &usize| vals[i % vals.len()].clone();
        let t = match s {
            Step::Unary(o, a) => {
                let x = at(a);
                match o {
                    0 => x.exp(),
                    1 => x.tanh(),
                    2 => x.relu(),
                    3 => x.neg(),
                    4 => x.abs(),
                    5 => x.sqrt(),
                    6 => x.sigmoid(),
                    _ => x.logical_not(),
                }
            }
            Step::Binary(o, a, b) => {
                let (x, y) = (at(a), at(b));
                match o {
                    0 => x.add(&y),
                    1 => x.mul(&y),
                    2 => x.sub(&y),
                    3 => x.maximum(&y),
                    4 => x.lt(&y),
                    _ => x.div(&y),
                }
            }
            Step::Reduce(o, a, axis, keep) => {
                let x = at(a);
                let axes: Vec<i64> = vec![*axis];
                match (o, keep) {
                    (0, false) => x.sum(axes),
                    (0, true) => x.sum_keepdims(axes),
                    (1, false) => x.max(axes),
                    (1, true) => x.max_keepdims(axes),
                    (2, _) => x.mean(axes),
                    _ => x.argmax(*axis),
                }
            }
            Step::Softmax(a, axis) => at(a).softmax(*axis),
            Step::Cast(a, d) => at(a).cast(DTYPES[*d]),
            Step::Reshape(a, shape) => at(a).reshape(shape),
            Step::Transpose(a) => at(a).transpose(),
            Step::Matmul(a, b) => at(a).matmul(&at(b)),
            Step::ExpandDims(a, axis) => at(a).expand_dims(*axis),
            Step::Squeeze(a, axis) => at(a).squeeze(&[*axis]),
        };
        vals.push(t);
    }
    vals.pop().expect("at least one step")
}

/// Whether `got` (cpu) matches `want` (interp): same shape and dtype; values equal
/// within 1e-2 relative when the program touches half precision, 1e-3 for f32
/// (random chains of exp, division and matmul amplify rounding), NaN for NaN,
/// infinities of the same sign.
fn close(got: &Array, want: &Array, p: &Program) -> Result<(), String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "cpu gave {:?}{:?}, interp {:?}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    // The loosest precision anywhere in the program, not the result's: an f16 sum cast
    // to f64 keeps the half-precision rounding (cpu accumulates in f32 and rounds once,
    // the reference rounds as it goes).
    let dtypes = p
        .inputs
        .iter()
        .map(|(_, d)| *d)
        .chain(p.steps.iter().filter_map(|s| match s {
            Step::Cast(_, d) => Some(*d),
            _ => None,
        }));
    let tol = dtypes
        .map(|d| match DTYPES[d] {
            DType::F16 | DType::BF16 => 1e-2,
            DType::F32 => 1e-3,
            _ => 1e-6,
        })
        .fold(1e-6, f64::max);
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let same = (g.is_nan() && w.is_nan())
            || g == &w
            || (g.is_finite() && w.is_finite() && (g - w).abs() <= tol * (1.0 + w.abs()));
        if !same {
            return Err(format!("element {i}: cpu {g}, interp {w}"));
        }
    }
    Ok(())
}

fn exercise(p: &Program) -> Result<(), String> {
    let (interp, cpu) = contexts();
    let want = build(interp, p).eval();
    let got = build(cpu, p).eval();
    match (got, want) {
        (Ok(g), Ok(w)) => close(&g, &w, p),
        (Err(_), Err(_)) => Ok(()),
        (Ok(_), Err(e)) => Err(format!("interp refused ({e}) what cpu computed")),
        (Err(e), Ok(_)) => Err(format!("cpu refused ({e}) what interp computed")),
    }
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn random_api_graphs_are_errors_or_match_the_interpreter(p in program()) {
        let q = p.clone();
        check(&p, BUDGET, move || exercise(&q))?.map_err(TestCaseError::fail)?;
    }
}

/// Regression (found by the million-case run): exp, cast to f16, sum, cast to f64 differ
/// by half an f16 ulp between cpu and interp; the tolerance follows the f16 in the chain.
#[test]
fn an_f16_sum_cast_to_f64_is_compared_at_f16_precision() {
    let p = Program {
        inputs: vec![(vec![1, 2], 0)],
        steps: vec![
            Step::Unary(0, 0),
            Step::Cast(0, 2),
            Step::Reduce(0, 2, 1, false),
            Step::Cast(3, 1),
        ],
    };
    let q = p.clone();
    fuzz_support::run_case(&p, BUDGET, move || exercise(&q))
        .unwrap_or_else(|crash| panic!("{crash}"))
        .unwrap_or_else(|wrong| panic!("{wrong}"));
}

/// Regression (found by the release run): the mean over an empty axis times a 0-d value.
/// The fused kernel has empty rows, so the interpreter runs it, and its row-level loads
/// read nothing for an empty row: the product came out 0 where numpy and the graph
/// reference give NaN (0 / 0). Also a bias added to sums over empty rows.
#[test]
fn a_row_value_of_an_empty_row_is_still_read() {
    let (interp, cpu) = contexts();
    for ctx in [interp, cpu] {
        let x = ctx.zeros(&[0, 1, 1]);
        let y = ctx.full(&[], 2.0);
        let got = (x.mean(0) * &y).eval().expect("evaluates");
        let v = got.to_vec::<f32>().expect("f32");
        assert!(v.len() == 1 && v[0].is_nan(), "{:?}: {v:?}", ctx.backend());
        let x = ctx.zeros(&[3, 0]);
        let b = ctx.arange(1.0, 4.0, 1.0).expect("arange");
        let got = (x.sum(1) + &b).eval().expect("evaluates");
        assert_eq!(
            got.to_vec::<f32>().expect("f32"),
            vec![1.0, 2.0, 3.0],
            "{:?}",
            ctx.backend()
        );
    }
}
