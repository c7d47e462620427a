//! Property test: random element-wise graphs over random shapes and input layouts
//! (contiguous, transposed, broadcast, reversed slices) evaluate on the Cranelift path
//! to the same values as the reference interpreter, and always as at most ONE kernel.
//!
//! Tolerance: 0 ulp (bit-identical, NaN matching NaN, -0.0 distinct from +0.0) for the
//! random programs. This holds because the JIT's f32 arithmetic is IEEE-exact like the
//! reference's f64-then-round (53 >= 2*24 + 2 bits, so no double rounding for + - * /
//! sqrt), and the f64 transcendentals that are not inline call the reference's own
//! functions. Programs therefore draw only the exact ops of their dtype: the inline
//! transcendentals (all of them in f32; exp, log, log1p, expm1, tanh, sigmoid, sin
//! and cos in f64) have a documented ulp bound per function (`ndfuse_codegen_cpu::f32_ulp_bound`,
//! `f64_ulp_bound`), and a bound per function says nothing about a chain of them
//! (`x - exp(y)` cancels). Those are checked by the second property, one
//! transcendental applied to a random layout, within its own documented bound.

use ndfuse::{BackendKind, Context, DType, SliceArg, Tensor};
use ndfuse_codegen_cpu::{f32_ulp_bound, f64_ulp_bound, POW_F32_ULP};
use ndfuse_ir::{BinaryOp, UnaryOp};
use ndfuse_tests::assert_matches;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Layout {
    Contiguous,
    Transposed,
    Broadcast(u8),
    Reversed,
}

#[derive(Clone, Debug)]
enum Step {
    Unary(usize, usize),
    Binary(usize, usize, usize),
    Literal(usize, f64, bool),
    WhereGt(usize, usize, usize, usize),
    CastRoundTrip(usize),
}

const UNARY: [UnaryOp; 20] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sign,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Erf,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
];
const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
    BinaryOp::Max,
    BinaryOp::Min,
];

/// The IEEE-exact unary ops: all that f32 programs use (see the module docs).
const UNARY_EXACT: [UnaryOp; 10] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sign,
    UnaryOp::Sqrt,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Relu,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
];
const BINARY_EXACT: [BinaryOp; 6] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
];

/// The unary and binary ops programs of `dtype` draw from.
fn ops(dtype: DType) -> (&'static [UnaryOp], &'static [BinaryOp]) {
    if dtype == DType::F32 {
        (&UNARY_EXACT, &BINARY_EXACT)
    } else {
        (&UNARY_F64_EXACT, &BINARY)
    }
}

/// The unary ops of UNARY whose f64 form is exact (no inline code): those without an
/// `f64_ulp_bound`.
const UNARY_F64_EXACT: [UnaryOp; 12] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sign,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Relu,
    UnaryOp::Erf,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
];

#[test]
fn the_f64_exact_ops_are_those_without_a_bound() {
    let want: Vec<UnaryOp> = UNARY
        .into_iter()
        .filter(|&u| f64_ulp_bound(u).is_none())
        .collect();
    assert_eq!(UNARY_F64_EXACT.to_vec(), want);
}

fn unary(t: &Tensor, op: UnaryOp) -> Tensor {
    match op {
        UnaryOp::Neg => t.neg(),
        UnaryOp::Abs => t.abs(),
        UnaryOp::Sign => t.sign(),
        UnaryOp::Exp => t.exp(),
        UnaryOp::Log => t.log(),
        UnaryOp::Log1p => t.log1p(),
        UnaryOp::Expm1 => t.expm1(),
        UnaryOp::Sqrt => t.sqrt(),
        UnaryOp::Rsqrt => t.rsqrt(),
        UnaryOp::Square => t.square(),
        UnaryOp::Recip => t.recip(),
        UnaryOp::Sin => t.sin(),
        UnaryOp::Cos => t.cos(),
        UnaryOp::Tanh => t.tanh(),
        UnaryOp::Sigmoid => t.sigmoid(),
        UnaryOp::Relu => t.relu(),
        UnaryOp::Erf => t.erf(),
        UnaryOp::Floor => t.floor(),
        UnaryOp::Ceil => t.ceil(),
        UnaryOp::Round => t.round(),
        UnaryOp::Not => t.logical_not(),
    }
}

fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Tensor {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.pow(b),
        BinaryOp::Max => a.maximum(b),
        BinaryOp::Min => a.minimum(b),
        other => unreachable!("not generated: {other:?}"),
    }
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        3 => Just(Layout::Contiguous),
        1 => Just(Layout::Transposed),
        1 => any::<u8>().prop_map(Layout::Broadcast),
        1 => Just(Layout::Reversed),
    ]
}

fn step(n_prev: usize, dtype: DType) -> impl Strategy<Value = Step> {
    let i = 0..n_prev;
    let (un, bin) = ops(dtype);
    prop_oneof![
        (0..un.len(), i.clone()).prop_map(|(o, a)| Step::Unary(o, a)),
        (0..bin.len(), i.clone(), i.clone()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        (i.clone(), -3.0f64..3.0, any::<bool>()).prop_map(|(a, v, lhs)| Step::Literal(a, v, lhs)),
        (i.clone(), i.clone(), i.clone(), i.clone())
            .prop_map(|(a, b, c, d)| Step::WhereGt(a, b, c, d)),
        i.prop_map(Step::CastRoundTrip),
    ]
}

#[derive(Clone, Debug)]
struct Program {
    dtype: DType,
    shape: Vec<usize>,
    inputs: Vec<Layout>,
    steps: Vec<Step>,
    seed: u64,
}

fn program() -> impl Strategy<Value = Program> {
    (
        prop_oneof![Just(DType::F32), Just(DType::F64)],
        prop::collection::vec(
            prop_oneof![1 => Just(0usize), 2 => Just(1usize), 6 => 2usize..7],
            0..4,
        ),
        prop::collection::vec(layout(), 1..4),
        any::<u64>(),
    )
        .prop_flat_map(|(dtype, shape, inputs, seed)| {
            let n = inputs.len();
            // Each step may use any earlier value; indices are taken modulo the count
            // of values that exist when the step runs.
            prop::collection::vec(step(n + 8, dtype), 1..9).prop_map(move |steps| Program {
                dtype,
                shape: shape.clone(),
                inputs: inputs.clone(),
                steps,
                seed,
            })
        })
}

/// The program's inputs, each in its layout, uniform in [-3, 3).
fn inputs(ctx: &Context, p: &Program) -> Vec<Tensor> {
    let rank = p.shape.len();
    let mut vals: Vec<Tensor> = Vec::new();
    for (k, l) in p.inputs.iter().enumerate() {
        let seed = p.seed.wrapping_add(k as u64);
        let t = match l {
            Layout::Transposed if rank >= 2 => {
                let rev: Vec<usize> = p.shape.iter().rev().copied().collect();
                ctx.rand_uniform(&rev, -3.0, 3.0, seed).transpose()
            }
            Layout::Broadcast(mask) => {
                let small: Vec<usize> = p
                    .shape
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if mask >> i & 1 == 1 { 1 } else { d })
                    .collect();
                ctx.rand_uniform(&small, -3.0, 3.0, seed)
                    .broadcast_to(&p.shape)
            }
            Layout::Reversed if rank >= 1 => {
                // Rows 2d-1, 2d-3, ..., 1 of a 2d-row tensor: d rows, stride -2.
                let mut big = p.shape.clone();
                big[0] *= 2;
                ctx.rand_uniform(&big, -3.0, 3.0, seed)
                    .slice(&[SliceArg::new(Some(-1), None, -2)])
            }
            _ => ctx.rand_uniform(&p.shape, -3.0, 3.0, seed),
        };
        vals.push(t);
    }
    vals
}

fn build(ctx: &Context, p: &Program) -> Vec<Tensor> {
    let mut vals = inputs(ctx, p);
    for s in &p.steps {
        let n = vals.len();
        let v = |i: usize| &vals[i % n];
        let t = match *s {
            Step::Unary(o, a) => unary(v(a), ops(p.dtype).0[o]),
            Step::Binary(o, a, b) => binary(v(a), v(b), ops(p.dtype).1[o]),
            Step::Literal(a, c, true) => v(a) * c,
            Step::Literal(a, c, false) => c - v(a),
            Step::WhereGt(a, b, c, d) => v(a).gt(v(b)).where_(v(c), v(d)),
            Step::CastRoundTrip(a) => {
                let other = if p.dtype == DType::F32 {
                    DType::F64
                } else {
                    DType::F32
                };
                v(a).cast(other).cast(p.dtype)
            }
        };
        vals.push(t);
    }
    // The last value, plus an intermediate as a second output (a kernel with two stores).
    let n = vals.len();
    vec![
        vals[n - 1].clone(),
        vals[p.inputs.len() + (n - p.inputs.len()) / 2].clone(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn jit_matches_the_interpreter(p in program()) {
        let ctx = Context::builder().dtype(p.dtype).build().expect("float dtype");
        let outs = build(&ctx, &p);
        let refs: Vec<&Tensor> = outs.iter().collect();
        ctx.set_backend(BackendKind::Interp);
        let want = ctx.eval(&refs).unwrap_or_else(|e| panic!("reference fails: {e}\n{p:?}"));
        ctx.set_backend(BackendKind::Cpu);
        let (got, report) = ctx.eval_report(&refs).expect("cpu evaluates");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_matches(g, w, 0, &format!("output {i} of {p:?}\n{}", report.annotated_graph()));
        }
        // Everything is element-wise: at most one kernel (none when the clean-up passes
        // reduce the program to its inputs), compiled by the JIT.
        prop_assert!(report.kernel_count() <= 1, "{}", report.annotated_graph());
        let jit = report.evaluation().paths.iter().all(|p| matches!(p, ndfuse_runtime::StepPath::Jit { .. }));
        prop_assert!(jit, "{}", report.annotated_graph());
    }

    #[test]
    fn transcendental_of_a_layout_is_within_its_bound(
        p in program(),
        op in 0..UNARY.len() + 1,
        scale in prop_oneof![Just(1.0f64), Just(30.0), Just(1e-3)],
    ) {
        // One transcendental (or pow) applied to inputs in random layouts, scaled to
        // reach the saturating and tiny ranges: within the documented bound of that one
        // function, 0 ulp for the exact ops among UNARY.
        let ctx = Context::builder().dtype(p.dtype).build().expect("float dtype");
        let bound_of = |u: UnaryOp| {
            let b = if p.dtype == DType::F32 { f32_ulp_bound(u) } else { f64_ulp_bound(u) };
            b.map_or(0, u64::from)
        };
        let xs = inputs(&ctx, &p);
        let x = &xs[0] * scale;
        let (y, bound) = if op == UNARY.len() {
            // pow of |x| (the inline path) and of x (negative bases call the exact
            // function) by another input.
            let e = &xs[xs.len() - 1];
            let bound = if p.dtype == DType::F32 { u64::from(POW_F32_ULP) } else { 0 };
            (x.pow(e), bound)
        } else {
            let u = UNARY[op];
            (unary(&x, u), bound_of(u))
        };
        ctx.set_backend(BackendKind::Interp);
        let want = ctx.eval(&[&y]).unwrap_or_else(|e| panic!("reference fails: {e}\n{p:?}"));
        ctx.set_backend(BackendKind::Cpu);
        let (got, report) = ctx.eval_report(&[&y]).expect("cpu evaluates");
        assert_matches(&got[0], &want[0], bound, &format!("{p:?}\n{}", report.annotated_graph()));
    }
}
