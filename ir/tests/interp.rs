//! Tests of the reference interpreter against hand-computed values: every op on every
//! dtype it takes (special values included), casts, reductions, views, `eval_node`,
//! `eval_kernel` and the errors. Expected values are literals worked out by hand (or
//! with an independent exact-rounding script), never computed by the code under test.

use ndfuse_ir::interp::{eval, eval_kernel, eval_node, InterpError};
use ndfuse_ir::{
    ArgReduceOp, AxisSlice, BinaryOp, Buffer, DType, Expr, Graph, HostArray, Instr, Kernel, Node,
    NodeId, Op, Plan, ReduceOp, Scalar, Shape, Storage, Store, TensorType, UnaryOp, ValueId, View,
    ViewOp,
};
use std::collections::HashMap;
use std::f64::consts::{E, LN_2, SQRT_2};
use BinaryOp as B;
use DType::*;
use UnaryOp as U;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;
/// The float dtypes in the order of the `[f16, bf16, f32, f64]` expectation arrays.
const FLOATS: [DType; 4] = [F16, BF16, F32, F64];

/// The same expected value in every float dtype.
fn all(v: f64) -> [f64; 4] {
    [v; 4]
}

fn floats(dtype: DType, shape: &[usize], vals: &[f64]) -> HostArray {
    // Test inputs are exact in `dtype`, so the conversion does not round.
    HostArray::from_f64s(dtype, Shape::from(shape), vals)
}

fn ints(dtype: DType, shape: &[usize], vals: &[i64]) -> HostArray {
    HostArray::new(Shape::from(shape), Storage::from_i64s(dtype, vals)).expect("length matches")
}

fn bools(shape: &[usize], vals: &[bool]) -> HostArray {
    HostArray::new(Shape::from(shape), Storage::Bool(vals.to_vec())).expect("length matches")
}

/// Builds a graph of `op` on one input per array, evaluates it, returns the result.
fn apply(op: Op, args: &[HostArray]) -> HostArray {
    let mut g = Graph::new();
    let ids: Vec<NodeId> = args
        .iter()
        .enumerate()
        .map(|(i, a)| g.add_input(format!("in{i}"), a.dtype(), a.shape().clone()))
        .collect();
    let y = g
        .add(op.clone(), &ids)
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    g.add_output(y);
    let bind: HashMap<NodeId, HostArray> = ids.into_iter().zip(args.iter().cloned()).collect();
    let mut out = eval(&g, &bind).unwrap_or_else(|e| panic!("{op:?}: {e}"));
    assert_eq!(out.len(), 1);
    out.remove(0)
}

/// Bit-exact comparison: NaN matches any NaN, -0.0 does not match 0.0.
fn same(a: f64, b: f64) -> bool {
    if b.is_nan() {
        a.is_nan()
    } else {
        a.to_bits() == b.to_bits()
    }
}

fn assert_floats(got: &HostArray, want: &[f64], what: &str) {
    let g = got.to_f64s();
    assert_eq!(g.len(), want.len(), "{what}: element count");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(same(a, b), "{what}[{i}]: got {a:?}, want {b:?}");
    }
}

fn get_ints(a: &HostArray) -> Vec<i64> {
    (0..a.len()).map(|i| a.storage().get_i64(i)).collect()
}

fn get_bools(a: &HostArray) -> Vec<bool> {
    a.as_slice::<bool>().expect("a bool array").to_vec()
}

fn shape(a: &HostArray) -> Vec<usize> {
    a.shape().dims().to_vec()
}

// ------------------------------------------------------------------------------------
// Unary ops
// ------------------------------------------------------------------------------------

/// An input exact in every float dtype, and the true result rounded to
/// `[f16, bf16, f32, f64]`.
type UnaryRow = (f64, [f64; 4]);

#[rustfmt::skip]
fn unary_float_table() -> Vec<(UnaryOp, Vec<UnaryRow>)> {
    vec![
        (U::Neg, vec![
            (1.5, all(-1.5)),
            (0.0, all(-0.0)),
            (-0.0, all(0.0)),
            (INF, all(-INF)),
            (-INF, all(INF)),
            (NAN, all(NAN)),
        ]),
        (U::Abs, vec![
            (-2.5, all(2.5)),
            (-0.0, all(0.0)),
            (0.0, all(0.0)),
            (-INF, all(INF)),
            (NAN, all(NAN)),
        ]),
        (U::Sign, vec![
            (3.0, all(1.0)),
            (-2.0, all(-1.0)),
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (INF, all(1.0)),
            (-INF, all(-1.0)),
            (NAN, all(NAN)),
        ]),
        (U::Exp, vec![
            (0.0, all(1.0)),
            (-0.0, all(1.0)),
            (1.0, [2.71875, 2.71875, 2.7182817459106445, E]),
            (-1.0, [0.367919921875, 0.3671875, 0.3678794503211975, 0.36787944117144233]),
            (12.0, [INF, 162816.0, 162754.796875, 162754.79141900392]),
            (100.0, [INF, INF, INF, 2.6881171418161356e+43]),
            (-1000.0, all(0.0)),
            (INF, all(INF)),
            (-INF, all(0.0)),
            (NAN, all(NAN)),
        ]),
        (U::Log, vec![
            (1.0, all(0.0)),
            (2.0, [0.693359375, 0.69140625, 0.6931471824645996, LN_2]),
            (0.0, all(-INF)),
            (-0.0, all(-INF)),
            (-1.0, all(NAN)),
            (INF, all(INF)),
            (-INF, all(NAN)),
            (NAN, all(NAN)),
        ]),
        (U::Log1p, vec![
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (1.0, [0.693359375, 0.69140625, 0.6931471824645996, LN_2]),
            (-1.0, all(-INF)),
            (-2.0, all(NAN)),
            (INF, all(INF)),
            (NAN, all(NAN)),
        ]),
        (U::Expm1, vec![
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (1.0, [1.71875, 1.71875, 1.718281865119934, 1.718281828459045]),
            (-INF, all(-1.0)),
            (INF, all(INF)),
            (NAN, all(NAN)),
        ]),
        (U::Sqrt, vec![
            (4.0, all(2.0)),
            (2.0, [1.4140625, 1.4140625, 1.4142135381698608, SQRT_2]),
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (-1.0, all(NAN)),
            (INF, all(INF)),
            (-INF, all(NAN)),
            (NAN, all(NAN)),
        ]),
        (U::Rsqrt, vec![
            (4.0, all(0.5)),
            (2.0, [0.70703125, 0.70703125, 0.7071067690849304, 0.7071067811865475]),
            (0.0, all(INF)),
            (-0.0, all(-INF)),
            (-1.0, all(NAN)),
            (INF, all(0.0)),
            (NAN, all(NAN)),
        ]),
        (U::Square, vec![
            (3.0, all(9.0)),
            (-3.0, all(9.0)),
            (-0.0, all(0.0)),
            (1.5, all(2.25)),
            (-INF, all(INF)),
            (NAN, all(NAN)),
        ]),
        (U::Recip, vec![
            (2.0, all(0.5)),
            (3.0, [0.333251953125, 0.333984375, 0.3333333432674408, 0.3333333333333333]),
            (0.0, all(INF)),
            (-0.0, all(-INF)),
            (INF, all(0.0)),
            (-INF, all(-0.0)),
            (NAN, all(NAN)),
        ]),
        (U::Sin, vec![
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (1.0, [0.84130859375, 0.83984375, 0.8414709568023682, 0.8414709848078965]),
            (-2.0, [-0.9091796875, -0.91015625, -0.9092974066734314, -0.9092974268256817]),
            (INF, all(NAN)),
            (NAN, all(NAN)),
        ]),
        (U::Cos, vec![
            (0.0, all(1.0)),
            (1.0, [0.54052734375, 0.5390625, 0.5403022766113281, 0.5403023058681398]),
            (2.0, [-0.416259765625, -0.416015625, -0.416146844625473, -0.4161468365471424]),
            (-INF, all(NAN)),
            (NAN, all(NAN)),
        ]),
        (U::Tanh, vec![
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (1.0, [0.76171875, 0.76171875, 0.7615941762924194, 0.7615941559557649]),
            (-0.5, [-0.462158203125, -0.462890625, -0.46211716532707214, -0.46211715726000974]),
            (100.0, all(1.0)),
            (INF, all(1.0)),
            (-INF, all(-1.0)),
            (NAN, all(NAN)),
        ]),
        (U::Sigmoid, vec![
            (0.0, all(0.5)),
            (1.0, [0.73095703125, 0.73046875, 0.7310585975646973, 0.7310585786300049]),
            (-1.0, [0.26904296875, 0.26953125, 0.2689414322376251, 0.2689414213699951]),
            (1000.0, all(1.0)),
            (-1000.0, all(0.0)),
            (INF, all(1.0)),
            (-INF, all(0.0)),
            (NAN, all(NAN)),
        ]),
        (U::Relu, vec![
            (2.0, all(2.0)),
            (-2.0, all(0.0)),
            (-0.0, all(0.0)),
            (0.0, all(0.0)),
            (INF, all(INF)),
            (-INF, all(0.0)),
            (NAN, all(NAN)),
        ]),
        (U::Erf, vec![
            (0.0, all(0.0)),
            (-0.0, all(-0.0)),
            (1.0, [0.8427734375, 0.84375, 0.8427007794380188, 0.8427007929497149]),
            (0.5, [0.5205078125, 0.51953125, 0.5204998850822449, 0.5204998778130465]),
            (-2.0, [-0.9951171875, -0.99609375, -0.9953222870826721, -0.9953222650189527]),
            (INF, all(1.0)),
            (-INF, all(-1.0)),
            (NAN, all(NAN)),
        ]),
        (U::Floor, vec![
            (1.5, all(1.0)),
            (-1.5, all(-2.0)),
            (-0.5, all(-1.0)),
            (0.5, all(0.0)),
            (-0.0, all(-0.0)),
            (INF, all(INF)),
            (NAN, all(NAN)),
        ]),
        (U::Ceil, vec![
            (1.5, all(2.0)),
            (-1.5, all(-1.0)),
            (-0.5, all(-0.0)),
            (0.5, all(1.0)),
            (-0.0, all(-0.0)),
            (-INF, all(-INF)),
            (NAN, all(NAN)),
        ]),
        (U::Round, vec![
            (0.5, all(0.0)),
            (1.5, all(2.0)),
            (2.5, all(2.0)),
            (-0.5, all(-0.0)),
            (-1.5, all(-2.0)),
            (2.75, all(3.0)),
            (-0.0, all(-0.0)),
            (INF, all(INF)),
            (NAN, all(NAN)),
        ]),
    ]
}

#[test]
fn unary_ops_on_every_float_dtype() {
    let table = unary_float_table();
    let covered: Vec<UnaryOp> = table.iter().map(|(op, _)| *op).collect();
    for op in UnaryOp::ALL {
        assert_eq!(
            covered.contains(&op),
            op != U::Not,
            "{} coverage",
            op.name()
        );
    }
    for (op, rows) in &table {
        let xs: Vec<f64> = rows.iter().map(|r| r.0).collect();
        for (k, &dtype) in FLOATS.iter().enumerate() {
            let want: Vec<f64> = rows.iter().map(|r| r.1[k]).collect();
            let got = apply(Op::Unary(*op), &[floats(dtype, &[xs.len()], &xs)]);
            assert_eq!(got.dtype(), dtype);
            assert_floats(&got, &want, &format!("{} {dtype} of {xs:?}", op.name()));
        }
    }
}

#[test]
fn unary_dtype_specific_rounding_overflow_and_subnormals() {
    let f32_min_sub = 2f64.powi(-149); // 1.4e-45
    let f16_min_sub = 2f64.powi(-24); // 5.96e-8
    let bf16_min_sub = 2f64.powi(-133); // 9.2e-41
    let f64_min_sub = 5e-324;
    let rows: &[(UnaryOp, DType, f64, f64)] = &[
        // Subnormal inputs survive (no flush to zero) and keep their sign.
        (U::Neg, F32, f32_min_sub, -f32_min_sub),
        (U::Abs, F32, -f32_min_sub, f32_min_sub),
        (U::Sign, F32, f32_min_sub, 1.0),
        (U::Floor, F32, -f32_min_sub, -1.0),
        (U::Round, F32, f32_min_sub, 0.0),
        (U::Sqrt, F32, 2f64.powi(-148), 2f64.powi(-74)),
        // 2^-150 is exactly half the smallest f32 subnormal: ties to even, to 0.
        (U::Square, F32, 2f64.powi(-75), 0.0),
        (U::Square, F32, 2f64.powi(-74), 2f64.powi(-148)),
        (U::Recip, F32, f32_min_sub, INF),
        (U::Exp, F32, 100.0, INF),
        (U::Exp, F32, 88.0, 1.6516362661361307e38),
        (U::Neg, F16, f16_min_sub, -f16_min_sub),
        (U::Square, F16, 2f64.powi(-12), f16_min_sub),
        (U::Square, F16, 300.0, INF),
        (U::Sqrt, F16, f16_min_sub, 2f64.powi(-12)),
        (U::Recip, F16, f16_min_sub, INF),
        (U::Exp, F16, 11.0, 59872.0),
        (U::Exp, F16, 12.0, INF),
        (U::Abs, BF16, -bf16_min_sub, bf16_min_sub),
        (U::Square, BF16, 2f64.powi(-65), 2f64.powi(-130)),
        (U::Square, BF16, 2f64.powi(64), INF),
        (U::Exp, BF16, 88.0, 1.6548888547522203e38),
        (U::Neg, F64, f64_min_sub, -f64_min_sub),
        (U::Sqrt, F64, f64_min_sub, 2f64.powi(-537)),
        (U::Square, F64, 2f64.powi(-600), 0.0),
        (U::Exp, F64, 709.0, 8.218407461554972e307),
        (U::Exp, F64, 710.0, INF),
        (U::Sigmoid, F64, -1000.0, 0.0),
        (U::Sigmoid, F64, 1000.0, 1.0),
        (U::Expm1, F64, 1e-300, 1e-300),
        (U::Log1p, F64, -1e-300, -1e-300),
    ];
    for &(op, dtype, x, want) in rows {
        let got = apply(Op::Unary(op), &[floats(dtype, &[1], &[x])]);
        assert_floats(&got, &[want], &format!("{} {dtype} of {x:e}", op.name()));
    }
}

#[test]
fn unary_ops_on_integers_wrap() {
    let (min32, max32) = (i64::from(i32::MIN), i64::from(i32::MAX));
    let rows: &[(UnaryOp, DType, i64, i64)] = &[
        (U::Neg, I32, 5, -5),
        (U::Neg, I32, min32, min32),
        (U::Neg, I32, max32, -max32),
        (U::Abs, I32, -7, 7),
        (U::Abs, I32, min32, min32),
        (U::Sign, I32, -9, -1),
        (U::Sign, I32, 0, 0),
        (U::Sign, I32, 4, 1),
        (U::Square, I32, -3, 9),
        (U::Square, I32, 46341, -2147479015),
        (U::Relu, I32, -3, 0),
        (U::Relu, I32, 3, 3),
        (U::Relu, I32, min32, 0),
        (U::Neg, I64, i64::MIN, i64::MIN),
        (U::Neg, I64, min32, 2147483648),
        (U::Abs, I64, i64::MIN, i64::MIN),
        (U::Abs, I64, min32, 2147483648),
        (U::Sign, I64, i64::MIN, -1),
        (U::Sign, I64, i64::MAX, 1),
        (U::Square, I64, 46341, 2147488281),
        (U::Square, I64, 3037000500, -9223372036709301616),
        (U::Relu, I64, i64::MAX, i64::MAX),
        (U::Relu, I64, -1, 0),
    ];
    for &(op, dtype, x, want) in rows {
        let got = apply(Op::Unary(op), &[ints(dtype, &[1], &[x])]);
        assert_eq!(got.dtype(), dtype);
        assert_eq!(get_ints(&got), vec![want], "{} {dtype} of {x}", op.name());
    }
}

#[test]
fn not_on_bools() {
    let got = apply(Op::Unary(U::Not), &[bools(&[2], &[true, false])]);
    assert_eq!(get_bools(&got), vec![false, true]);
}

#[test]
fn sigmoid_keeps_tiny_f64_results() {
    // e^-720 / (1 + e^-720) = e^-720, a subnormal f64 that 1 / (1 + e^720) loses.
    let got = apply(Op::Unary(U::Sigmoid), &[floats(F64, &[1], &[-720.0])]);
    let v = got.to_f64s()[0];
    let want = 2.0322308024e-313;
    assert!(
        v > 0.0 && (v - want).abs() <= 1e-321,
        "sigmoid(-720) = {v:e}"
    );
}

// ------------------------------------------------------------------------------------
// Binary ops
// ------------------------------------------------------------------------------------

/// Inputs exact in every float dtype, and the true result rounded to
/// `[f16, bf16, f32, f64]`.
type BinaryRow = (f64, f64, [f64; 4]);

#[rustfmt::skip]
fn binary_float_table() -> Vec<(BinaryOp, Vec<BinaryRow>)> {
    let third = [0.333251953125, 0.333984375, 0.3333333432674408, 0.3333333333333333];
    let sqrt2 = [1.4140625, 1.4140625, 1.4142135381698608, SQRT_2];
    vec![
        (B::Add, vec![
            (1.0, 2.0, all(3.0)),
            (INF, -INF, all(NAN)),
            (NAN, 1.0, all(NAN)),
            (-0.0, -0.0, all(-0.0)),
            (-0.0, 0.0, all(0.0)),
            (INF, 1.0, all(INF)),
        ]),
        (B::Sub, vec![
            (3.0, 5.0, all(-2.0)),
            (INF, INF, all(NAN)),
            (0.0, 0.0, all(0.0)),
            (-0.0, 0.0, all(-0.0)),
            (-0.0, -0.0, all(0.0)),
            (1.0, NAN, all(NAN)),
        ]),
        (B::Mul, vec![
            (1.5, -2.0, all(-3.0)),
            (0.0, INF, all(NAN)),
            (-0.0, 5.0, all(-0.0)),
            (-1.0, -0.0, all(0.0)),
            (NAN, 0.0, all(NAN)),
        ]),
        (B::Div, vec![
            (1.0, 0.0, all(INF)),
            (-1.0, 0.0, all(-INF)),
            (1.0, -0.0, all(-INF)),
            (0.0, 0.0, all(NAN)),
            (INF, INF, all(NAN)),
            (-0.0, 2.0, all(-0.0)),
            (1.0, 3.0, third),
        ]),
        (B::Pow, vec![
            (2.0, 10.0, all(1024.0)),
            (NAN, 0.0, all(1.0)),
            (1.0, NAN, all(1.0)),
            (-2.0, 0.5, all(NAN)),
            (0.0, -1.0, all(INF)),
            (-0.0, -1.0, all(-INF)),
            (2.0, -1.0, all(0.5)),
            (4.0, 0.5, all(2.0)),
            (-2.0, 3.0, all(-8.0)),
            (INF, -1.0, all(0.0)),
            (2.0, 0.5, sqrt2),
        ]),
        (B::Max, vec![
            (1.0, 2.0, all(2.0)),
            (NAN, 1.0, all(NAN)),
            (1.0, NAN, all(NAN)),
            (-0.0, 0.0, all(0.0)),
            (0.0, -0.0, all(0.0)),
            (-0.0, -0.0, all(-0.0)),
            (-INF, -1.0, all(-1.0)),
        ]),
        (B::Min, vec![
            (1.0, 2.0, all(1.0)),
            (NAN, 1.0, all(NAN)),
            (1.0, NAN, all(NAN)),
            (-0.0, 0.0, all(-0.0)),
            (0.0, -0.0, all(-0.0)),
            (INF, 3.0, all(3.0)),
        ]),
    ]
}

#[test]
fn binary_arithmetic_on_every_float_dtype() {
    for (op, rows) in binary_float_table() {
        let a: Vec<f64> = rows.iter().map(|r| r.0).collect();
        let b: Vec<f64> = rows.iter().map(|r| r.1).collect();
        for (k, &dtype) in FLOATS.iter().enumerate() {
            let want: Vec<f64> = rows.iter().map(|r| r.2[k]).collect();
            let n = a.len();
            let got = apply(
                Op::Binary(op),
                &[floats(dtype, &[n], &a), floats(dtype, &[n], &b)],
            );
            assert_eq!(got.dtype(), dtype);
            assert_floats(&got, &want, &format!("{} {dtype}", op.name()));
        }
    }
}

#[test]
fn binary_float_rounding_and_overflow_per_dtype() {
    let rows: &[(BinaryOp, DType, f64, f64, f64)] = &[
        // One past the last integer step: a tie, rounded to even.
        (B::Add, F16, 2048.0, 1.0, 2048.0),
        (B::Add, F16, 2048.0, 3.0, 2052.0),
        (B::Add, BF16, 256.0, 1.0, 256.0),
        (B::Add, F32, 16777216.0, 1.0, 16777216.0),
        (B::Add, F64, 9007199254740992.0, 1.0, 9007199254740992.0),
        // 65504 + 16 = 65520 is half-way to 2^16: ties to even overflow to inf.
        (B::Add, F16, 65504.0, 16.0, INF),
        (B::Mul, F16, 256.0, 256.0, INF),
        (B::Mul, BF16, 2f64.powi(100), 2f64.powi(100), INF),
        (B::Mul, F32, 2f64.powi(100), 2f64.powi(100), INF),
        (B::Mul, F64, 2f64.powi(100), 2f64.powi(100), 2f64.powi(200)),
        (B::Pow, F16, 2.0, 16.0, INF),
        (B::Pow, F32, 2.0, 128.0, INF),
        (B::Div, F32, 1.0, 2f64.powi(-149), INF),
    ];
    for &(op, dtype, a, b, want) in rows {
        let got = apply(
            Op::Binary(op),
            &[floats(dtype, &[1], &[a]), floats(dtype, &[1], &[b])],
        );
        assert_floats(
            &got,
            &[want],
            &format!("{} {dtype} of {a:e}, {b:e}", op.name()),
        );
    }
}

#[test]
fn binary_arithmetic_on_integers_wraps() {
    let (min32, max32) = (i64::from(i32::MIN), i64::from(i32::MAX));
    let rows: &[(BinaryOp, DType, i64, i64, i64)] = &[
        (B::Add, I32, max32, 1, min32),
        (B::Add, I32, -5, 3, -2),
        (B::Sub, I32, min32, 1, max32),
        (B::Mul, I32, 65536, 65536, 0),
        (B::Mul, I32, -3, 4, -12),
        (B::Mul, I32, 46341, 46341, -2147479015),
        (B::Pow, I32, 2, 10, 1024),
        (B::Pow, I32, 2, 31, min32),
        (B::Pow, I32, 2, 32, 0),
        (B::Pow, I32, 3, 0, 1),
        (B::Pow, I32, 0, 0, 1),
        (B::Pow, I32, -3, 3, -27),
        (B::Pow, I32, 3, 40, 689956897),
        // Negative exponents: the exact power truncated toward zero (numpy raises).
        (B::Pow, I32, 1, -5, 1),
        (B::Pow, I32, -1, -3, -1),
        (B::Pow, I32, -1, -4, 1),
        (B::Pow, I32, 2, -1, 0),
        (B::Pow, I32, -2, -1, 0),
        (B::Pow, I32, 0, -1, 0),
        (B::Max, I32, min32, -1, -1),
        (B::Max, I32, 5, 5, 5),
        (B::Min, I32, min32, max32, min32),
        (B::Add, I64, i64::MAX, 1, i64::MIN),
        (B::Add, I64, max32, 1, 2147483648),
        (B::Sub, I64, i64::MIN, 1, i64::MAX),
        (B::Mul, I64, 65536, 65536, 4294967296),
        (B::Mul, I64, 1 << 32, 1 << 32, 0),
        (B::Pow, I64, 2, 31, 2147483648),
        (B::Pow, I64, 2, 63, i64::MIN),
        (B::Pow, I64, 2, 64, 0),
        (B::Pow, I64, 3, 40, -6289078614652622815),
        (B::Pow, I64, -1, i64::MAX, -1),
        (B::Pow, I64, -1, i64::MIN, 1),
        (B::Pow, I64, 1, i64::MIN, 1),
        (B::Pow, I64, 5, -2, 0),
        (B::Max, I64, i64::MIN, i64::MAX, i64::MAX),
        (B::Min, I64, i64::MIN, i64::MAX, i64::MIN),
    ];
    for &(op, dtype, a, b, want) in rows {
        let got = apply(
            Op::Binary(op),
            &[ints(dtype, &[1], &[a]), ints(dtype, &[1], &[b])],
        );
        assert_eq!(got.dtype(), dtype);
        assert_eq!(
            get_ints(&got),
            vec![want],
            "{} {dtype} of {a}, {b}",
            op.name()
        );
    }
}

#[test]
fn comparisons_on_floats_with_nan_and_signed_zero() {
    let pairs = [
        (1.0, 2.0),
        (2.0, 1.0),
        (1.0, 1.0),
        (NAN, 1.0),
        (1.0, NAN),
        (NAN, NAN),
        (-0.0, 0.0),
        (INF, INF),
        (-INF, INF),
    ];
    let (t, f) = (true, false);
    let table: &[(BinaryOp, [bool; 9])] = &[
        (B::Eq, [f, f, t, f, f, f, t, t, f]),
        (B::Ne, [t, t, f, t, t, t, f, f, t]),
        (B::Lt, [t, f, f, f, f, f, f, f, t]),
        (B::Le, [t, f, t, f, f, f, t, t, t]),
        (B::Gt, [f, t, f, f, f, f, f, f, f]),
        (B::Ge, [f, t, t, f, f, f, t, t, f]),
    ];
    let a: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let b: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    for &(op, want) in table {
        for dtype in FLOATS {
            let got = apply(
                Op::Binary(op),
                &[floats(dtype, &[9], &a), floats(dtype, &[9], &b)],
            );
            assert_eq!(got.dtype(), Bool);
            assert_eq!(get_bools(&got), want, "{} {dtype}", op.name());
        }
    }
}

#[test]
fn comparisons_on_integers() {
    let a = [1, 2, i64::from(i32::MIN), -1];
    let b = [2, 1, i64::from(i32::MAX), -1];
    let (t, f) = (true, false);
    let table: &[(BinaryOp, [bool; 4])] = &[
        (B::Eq, [f, f, f, t]),
        (B::Ne, [t, t, t, f]),
        (B::Lt, [t, f, t, f]),
        (B::Le, [t, f, t, t]),
        (B::Gt, [f, t, f, f]),
        (B::Ge, [f, t, f, t]),
    ];
    for &(op, want) in table {
        for dtype in [I32, I64] {
            let got = apply(
                Op::Binary(op),
                &[ints(dtype, &[4], &a), ints(dtype, &[4], &b)],
            );
            assert_eq!(get_bools(&got), want, "{} {dtype}", op.name());
        }
    }
    // i64 extremes do not go through f64 (2^63 - 1 and 2^63 - 2 are one f64).
    let got = apply(
        Op::Binary(B::Lt),
        &[
            ints(I64, &[1], &[i64::MAX - 1]),
            ints(I64, &[1], &[i64::MAX]),
        ],
    );
    assert_eq!(get_bools(&got), [true]);
}

#[test]
fn comparisons_and_logic_on_bools() {
    let (t, f) = (true, false);
    let a = [f, f, t, t];
    let b = [f, t, f, t];
    let table: &[(BinaryOp, [bool; 4])] = &[
        (B::Eq, [t, f, f, t]),
        (B::Ne, [f, t, t, f]),
        // false < true
        (B::Lt, [f, t, f, f]),
        (B::Le, [t, t, f, t]),
        (B::Gt, [f, f, t, f]),
        (B::Ge, [t, f, t, t]),
        (B::And, [f, f, f, t]),
        (B::Or, [f, t, t, t]),
    ];
    for &(op, want) in table {
        let got = apply(Op::Binary(op), &[bools(&[4], &a), bools(&[4], &b)]);
        assert_eq!(get_bools(&got), want, "{}", op.name());
    }
}

#[test]
fn every_binary_op_is_tested() {
    let arithmetic: Vec<BinaryOp> = binary_float_table().iter().map(|(op, _)| *op).collect();
    for op in BinaryOp::ALL {
        assert!(
            arithmetic.contains(&op) || op.is_comparison() || op.is_logical(),
            "{} has no test",
            op.name()
        );
    }
}

// ------------------------------------------------------------------------------------
// where and cast
// ------------------------------------------------------------------------------------

#[test]
fn where_selects_per_element() {
    let c = bools(&[2, 2], &[true, false, true, false]);
    let got = apply(
        Op::Where,
        &[
            c,
            floats(F32, &[2, 2], &[1.0, 2.0, NAN, -0.0]),
            floats(F32, &[2, 2], &[10.0, NAN, 30.0, 0.0]),
        ],
    );
    assert_eq!(shape(&got), [2, 2]);
    assert_floats(&got, &[1.0, NAN, NAN, 0.0], "where f32");

    let got = apply(
        Op::Where,
        &[
            bools(&[2], &[true, false]),
            ints(I64, &[2], &[i64::MIN, 1]),
            ints(I64, &[2], &[2, i64::MAX]),
        ],
    );
    assert_eq!(get_ints(&got), [i64::MIN, i64::MAX]);

    let got = apply(
        Op::Where,
        &[
            bools(&[3], &[true, false, false]),
            bools(&[3], &[false, true, true]),
            bools(&[3], &[true, false, true]),
        ],
    );
    assert_eq!(get_bools(&got), [false, false, true]);
}

/// Expected values of one cast target.
enum Want {
    F(&'static [f64]),
    I(&'static [i64]),
    B(&'static [bool]),
}

fn check(got: &HostArray, want: &Want, what: &str) {
    match want {
        Want::F(w) => assert_floats(got, w, what),
        Want::I(w) => assert_eq!(&get_ints(got), w, "{what}"),
        Want::B(w) => assert_eq!(&get_bools(got), w, "{what}"),
    }
}

/// Per source dtype: the source values and the expected result in every target dtype.
#[rustfmt::skip]
fn cast_table() -> Vec<(HostArray, [(DType, Want); 7])> {
    const T: bool = true;
    const F: bool = false;
    const P60: f64 = 1152921504606846976.0; // 2^60
    const P63: f64 = 9223372036854775808.0; // 2^63
    const F16_MIN_SUB: f64 = 5.960464477539063e-08; // 2^-24
    const BF16_MIN_SUB: f64 = 9.183549615799121e-41; // 2^-133
    vec![
        (
            floats(F64, &[8], &[NAN, 1e10, -1.5, 0.1, 3.0, -0.0, INF, 2.5]),
            [
                (F16, Want::F(&[NAN, INF, -1.5, 0.0999755859375, 3.0, -0.0, INF, 2.5])),
                (BF16, Want::F(&[NAN, 9999220736.0, -1.5, 0.10009765625, 3.0, -0.0, INF, 2.5])),
                (F32, Want::F(&[NAN, 1e10, -1.5, 0.10000000149011612, 3.0, -0.0, INF, 2.5])),
                (F64, Want::F(&[NAN, 1e10, -1.5, 0.1, 3.0, -0.0, INF, 2.5])),
                // NaN -> 0; 1e10 saturates to i64 then wraps to i32; -1.5 truncates to
                // -1; inf saturates to i64::MAX, whose low 32 bits are -1.
                (I32, Want::I(&[0, 1410065408, -1, 0, 3, 0, -1, 2])),
                (I64, Want::I(&[0, 10000000000, -1, 0, 3, 0, i64::MAX, 2])),
                (Bool, Want::B(&[T, T, T, T, T, F, T, T])),
            ],
        ),
        (
            floats(F32, &[8], &[NAN, 1e10, -1.5, 0.10000000149011612, 3.0, -0.0, -INF, 2.5]),
            [
                (F16, Want::F(&[NAN, INF, -1.5, 0.0999755859375, 3.0, -0.0, -INF, 2.5])),
                (BF16, Want::F(&[NAN, 9999220736.0, -1.5, 0.10009765625, 3.0, -0.0, -INF, 2.5])),
                (F32, Want::F(&[NAN, 1e10, -1.5, 0.10000000149011612, 3.0, -0.0, -INF, 2.5])),
                (F64, Want::F(&[NAN, 1e10, -1.5, 0.10000000149011612, 3.0, -0.0, -INF, 2.5])),
                // -inf saturates to i64::MIN, whose low 32 bits are 0.
                (I32, Want::I(&[0, 1410065408, -1, 0, 3, 0, 0, 2])),
                (I64, Want::I(&[0, 10000000000, -1, 0, 3, 0, i64::MIN, 2])),
                (Bool, Want::B(&[T, T, T, T, T, F, T, T])),
            ],
        ),
        (
            floats(F16, &[8], &[NAN, 65504.0, -1.5, 0.0999755859375, 3.0, -0.0, F16_MIN_SUB, 2.5]),
            [
                (F16, Want::F(&[NAN, 65504.0, -1.5, 0.0999755859375, 3.0, -0.0, F16_MIN_SUB, 2.5])),
                // 65504 = 0xffe0 has 11 significant bits; bf16 keeps 8: up to 2^16.
                (BF16, Want::F(&[NAN, 65536.0, -1.5, 0.10009765625, 3.0, -0.0, F16_MIN_SUB, 2.5])),
                (F32, Want::F(&[NAN, 65504.0, -1.5, 0.0999755859375, 3.0, -0.0, F16_MIN_SUB, 2.5])),
                (F64, Want::F(&[NAN, 65504.0, -1.5, 0.0999755859375, 3.0, -0.0, F16_MIN_SUB, 2.5])),
                (I32, Want::I(&[0, 65504, -1, 0, 3, 0, 0, 2])),
                (I64, Want::I(&[0, 65504, -1, 0, 3, 0, 0, 2])),
                (Bool, Want::B(&[T, T, T, T, T, F, T, T])),
            ],
        ),
        (
            floats(BF16, &[8], &[NAN, 9999220736.0, -1.5, 0.10009765625, 3.0, -0.0, BF16_MIN_SUB, -2.5]),
            [
                // 2^-133 is far below f16's smallest subnormal: +0.
                (F16, Want::F(&[NAN, INF, -1.5, 0.10009765625, 3.0, -0.0, 0.0, -2.5])),
                (BF16, Want::F(&[NAN, 9999220736.0, -1.5, 0.10009765625, 3.0, -0.0, BF16_MIN_SUB, -2.5])),
                (F32, Want::F(&[NAN, 9999220736.0, -1.5, 0.10009765625, 3.0, -0.0, BF16_MIN_SUB, -2.5])),
                (F64, Want::F(&[NAN, 9999220736.0, -1.5, 0.10009765625, 3.0, -0.0, BF16_MIN_SUB, -2.5])),
                (I32, Want::I(&[0, 1409286144, -1, 0, 3, 0, 0, -2])),
                (I64, Want::I(&[0, 9999220736, -1, 0, 3, 0, 0, -2])),
                (Bool, Want::B(&[T, T, T, T, T, F, T, T])),
            ],
        ),
        (
            ints(I32, &[8], &[i32::MIN.into(), i32::MAX.into(), -1, 0, 3, 16777217, 65520, 2049]),
            [
                // 65520 is half-way between 65504 and 2^16: ties to even, inf. 2049 is
                // a tie between 2048 and 2050: even is 2048.
                (F16, Want::F(&[-INF, INF, -1.0, 0.0, 3.0, INF, INF, 2048.0])),
                (BF16, Want::F(&[-2147483648.0, 2147483648.0, -1.0, 0.0, 3.0, 16777216.0, 65536.0, 2048.0])),
                (F32, Want::F(&[-2147483648.0, 2147483648.0, -1.0, 0.0, 3.0, 16777216.0, 65520.0, 2049.0])),
                (F64, Want::F(&[-2147483648.0, 2147483647.0, -1.0, 0.0, 3.0, 16777217.0, 65520.0, 2049.0])),
                (I32, Want::I(&[-2147483648, 2147483647, -1, 0, 3, 16777217, 65520, 2049])),
                (I64, Want::I(&[-2147483648, 2147483647, -1, 0, 3, 16777217, 65520, 2049])),
                (Bool, Want::B(&[T, T, T, F, T, T, T, T])),
            ],
        ),
        (
            ints(I64, &[8], &[i64::MIN, i64::MAX, (1 << 60) + (1 << 36) + 1, (1 << 32) + 1, -(1 << 32), (1 << 53) + 1, 0, -3]),
            [
                (F16, Want::F(&[-INF, INF, INF, INF, -INF, INF, 0.0, -3.0])),
                (BF16, Want::F(&[-P63, P63, P60, 4294967296.0, -4294967296.0, 9007199254740992.0, 0.0, -3.0])),
                // One rounding: 2^60 + 2^36 + 1 is just above the f32 half-way point
                // 2^60 + 2^36, so it rounds up (via f64 it would tie down to 2^60).
                (F32, Want::F(&[-P63, P63, 1152921642045800448.0, 4294967296.0, -4294967296.0, 9007199254740992.0, 0.0, -3.0])),
                (F64, Want::F(&[-P63, P63, 1152921573326323712.0, 4294967297.0, -4294967296.0, 9007199254740992.0, 0.0, -3.0])),
                (I32, Want::I(&[0, -1, 1, 1, 0, 1, 0, -3])),
                (I64, Want::I(&[i64::MIN, i64::MAX, (1 << 60) + (1 << 36) + 1, (1 << 32) + 1, -(1 << 32), (1 << 53) + 1, 0, -3])),
                (Bool, Want::B(&[T, T, T, T, T, T, F, T])),
            ],
        ),
        (
            bools(&[2], &[true, false]),
            [
                (F16, Want::F(&[1.0, 0.0])),
                (BF16, Want::F(&[1.0, 0.0])),
                (F32, Want::F(&[1.0, 0.0])),
                (F64, Want::F(&[1.0, 0.0])),
                (I32, Want::I(&[1, 0])),
                (I64, Want::I(&[1, 0])),
                (Bool, Want::B(&[T, F])),
            ],
        ),
    ]
}

#[test]
fn casts_between_every_pair_of_dtypes() {
    let table = cast_table();
    let mut sources: Vec<DType> = table.iter().map(|(a, _)| a.dtype()).collect();
    sources.sort();
    assert_eq!(sources, DType::ALL, "one row per source dtype");
    for (src, targets) in &table {
        let target_dtypes: Vec<DType> = targets.iter().map(|(d, _)| *d).collect();
        assert_eq!(target_dtypes, DType::ALL, "one column per target dtype");
        for (to, want) in targets {
            let got = apply(Op::Cast { to: *to }, std::slice::from_ref(src));
            assert_eq!(got.dtype(), *to);
            check(&got, want, &format!("cast {} -> {to}", src.dtype()));
        }
    }
}

#[test]
fn cast_of_three_to_bool_and_back() {
    let b = apply(Op::Cast { to: Bool }, &[ints(I32, &[3], &[3, 0, -3])]);
    assert_eq!(get_bools(&b), [true, false, true]);
    let back = apply(Op::Cast { to: F32 }, &[b]);
    assert_floats(&back, &[1.0, 0.0, 1.0], "bool -> f32");
}

// ------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------

fn reduce(op: ReduceOp, axes: &[usize], keepdims: bool) -> Op {
    Op::Reduce {
        op,
        axes: axes.to_vec(),
        keepdims,
    }
}

/// A reduction (op, axes, keepdims) with its expected shape and values.
type ReduceRow = (
    ReduceOp,
    &'static [usize],
    bool,
    &'static [usize],
    &'static [f64],
);
/// A reduction of an empty tensor (op, axes) with its expected shape and values.
type EmptyReduceRow = (ReduceOp, &'static [usize], &'static [usize], &'static [f64]);

fn arange(dtype: DType, shape: &[usize]) -> HostArray {
    let n: usize = shape.iter().product();
    floats(dtype, shape, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

#[test]
fn reductions_over_full_one_and_several_axes() {
    use ReduceOp::*;
    let x = floats(F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let rows: &[ReduceRow] = &[
        (Sum, &[0, 1], false, &[], &[21.0]),
        (Sum, &[0], false, &[3], &[5.0, 7.0, 9.0]),
        (Sum, &[1], true, &[2, 1], &[6.0, 15.0]),
        (Sum, &[0, 1], true, &[1, 1], &[21.0]),
        (Mean, &[1], false, &[2], &[2.0, 5.0]),
        (Mean, &[0], true, &[1, 3], &[2.5, 3.5, 4.5]),
        (Prod, &[1], false, &[2], &[6.0, 120.0]),
        (Max, &[0], false, &[3], &[4.0, 5.0, 6.0]),
        (Min, &[1], false, &[2], &[1.0, 4.0]),
        (Var, &[0], false, &[3], &[2.25, 2.25, 2.25]),
        (Std, &[0], false, &[3], &[1.5, 1.5, 1.5]),
        (Norm1, &[0, 1], false, &[], &[21.0]),
    ];
    for &(op, axes, keepdims, out_shape, want) in rows {
        let got = apply(reduce(op, axes, keepdims), std::slice::from_ref(&x));
        let what = format!("{} axes={axes:?} keepdims={keepdims}", op.name());
        assert_eq!(got.dtype(), F32, "{what}");
        assert_eq!(shape(&got), out_shape, "{what}");
        assert_floats(&got, want, &what);
    }
    // [2,3,4] = arange: element (i, j, k) is 12i + 4j + k.
    let y = arange(F64, &[2, 3, 4]);
    let rows: &[ReduceRow] = &[
        (Sum, &[0, 2], false, &[3], &[60.0, 92.0, 124.0]),
        (Sum, &[0, 2], true, &[1, 3, 1], &[60.0, 92.0, 124.0]),
        (Mean, &[0, 2], false, &[3], &[7.5, 11.5, 15.5]),
        (Max, &[0, 2], false, &[3], &[15.0, 19.0, 23.0]),
        (Min, &[0, 2], false, &[3], &[0.0, 4.0, 8.0]),
        (
            Sum,
            &[1],
            false,
            &[2, 4],
            &[12.0, 15.0, 18.0, 21.0, 48.0, 51.0, 54.0, 57.0],
        ),
        (Sum, &[0, 1, 2], true, &[1, 1, 1], &[276.0]),
        (Max, &[0, 1, 2], false, &[], &[23.0]),
    ];
    for &(op, axes, keepdims, out_shape, want) in rows {
        let got = apply(reduce(op, axes, keepdims), std::slice::from_ref(&y));
        let what = format!("{} axes={axes:?} keepdims={keepdims} of [2,3,4]", op.name());
        assert_eq!(shape(&got), out_shape, "{what}");
        assert_floats(&got, want, &what);
    }
}

#[test]
fn every_reduce_op_reduces_fully_to_a_scalar() {
    use ReduceOp::*;
    let x = floats(F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let rows: &[(ReduceOp, f64)] = &[
        (Sum, 10.0),
        (Mean, 2.5),
        (Max, 4.0),
        (Min, 1.0),
        (Prod, 24.0),
        (Norm1, 10.0),
        (Norm2, 5.4772257804870605), // sqrt(30) in f32
        (Var, 1.25),
        (Std, 1.1180340051651), // sqrt(1.25) in f32
    ];
    assert_eq!(rows.len(), ReduceOp::ALL.len());
    for &(op, want) in rows {
        let got = apply(reduce(op, &[0], false), std::slice::from_ref(&x));
        assert_eq!(shape(&got), Vec::<usize>::new(), "{}", op.name());
        assert_floats(&got, &[want], op.name());
    }
}

#[test]
fn var_and_std_on_every_float_dtype() {
    let std = [1.1181640625, 1.1171875, 1.1180340051651, 1.118033988749895];
    for (k, dtype) in FLOATS.into_iter().enumerate() {
        let x = floats(dtype, &[4], &[1.0, 2.0, 3.0, 4.0]);
        let var = apply(reduce(ReduceOp::Var, &[0], false), std::slice::from_ref(&x));
        assert_floats(&var, &[1.25], &format!("var {dtype}"));
        let s = apply(reduce(ReduceOp::Std, &[0], false), std::slice::from_ref(&x));
        assert_floats(&s, &[std[k]], &format!("std {dtype}"));
        let m = apply(reduce(ReduceOp::Mean, &[0], false), &[x]);
        assert_floats(&m, &[2.5], &format!("mean {dtype}"));
    }
    let x = floats(F64, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let var = apply(reduce(ReduceOp::Var, &[0], true), &[x]);
    assert_eq!(shape(&var), [1, 2]);
    assert_floats(&var, &[1.0, 1.0], "var axis 0");
}

#[test]
fn reductions_of_empty_tensors() {
    use ReduceOp::*;
    let x = floats(F32, &[0, 3], &[]);
    let rows: &[EmptyReduceRow] = &[
        (Sum, &[0], &[3], &[0.0, 0.0, 0.0]),
        (Prod, &[0], &[3], &[1.0, 1.0, 1.0]),
        (Mean, &[0], &[3], &[NAN, NAN, NAN]),
        (Var, &[0], &[3], &[NAN, NAN, NAN]),
        (Std, &[0], &[3], &[NAN, NAN, NAN]),
        (Norm1, &[0], &[3], &[0.0, 0.0, 0.0]),
        (Norm2, &[0], &[3], &[0.0, 0.0, 0.0]),
        (Sum, &[0, 1], &[], &[0.0]),
        (Prod, &[0, 1], &[], &[1.0]),
        (Mean, &[0, 1], &[], &[NAN]),
        // Reducing the non-empty axis leaves an empty result; max/min are allowed.
        (Sum, &[1], &[0], &[]),
        (Max, &[1], &[0], &[]),
        (Min, &[1], &[0], &[]),
    ];
    for &(op, axes, out_shape, want) in rows {
        let got = apply(reduce(op, axes, false), std::slice::from_ref(&x));
        let what = format!("{} axes={axes:?} of [0,3]", op.name());
        assert_eq!(shape(&got), out_shape, "{what}");
        assert_floats(&got, want, &what);
    }
    let e = ints(I32, &[0], &[]);
    let s = apply(reduce(Sum, &[0], false), std::slice::from_ref(&e));
    assert_eq!((s.dtype(), get_ints(&s)), (I64, vec![0]));
    let p = apply(reduce(Prod, &[0], false), &[e]);
    assert_eq!((p.dtype(), get_ints(&p)), (I64, vec![1]));
}

#[test]
fn reductions_over_size_one_dims() {
    let x = floats(F32, &[1, 3, 1], &[1.0, 2.0, 3.0]);
    let s = apply(
        reduce(ReduceOp::Sum, &[0, 2], false),
        std::slice::from_ref(&x),
    );
    assert_eq!(shape(&s), [3]);
    assert_floats(&s, &[1.0, 2.0, 3.0], "sum over size-1 axes");
    let m = apply(reduce(ReduceOp::Max, &[0], true), std::slice::from_ref(&x));
    assert_eq!(shape(&m), [1, 3, 1]);
    assert_floats(&m, &[1.0, 2.0, 3.0], "max over a size-1 axis");
    let v = apply(reduce(ReduceOp::Var, &[0, 2], false), &[x]);
    assert_floats(&v, &[0.0, 0.0, 0.0], "var of one element");
}

#[test]
fn reductions_propagate_nan_and_inf() {
    use ReduceOp::*;
    // Lanes (rows): [1,NaN] [NaN,1] [inf,1] [inf,-inf] [-0,0] [0,-0] [-inf,-inf]
    let x = floats(
        F32,
        &[7, 2],
        &[
            1.0, NAN, NAN, 1.0, INF, 1.0, INF, -INF, -0.0, 0.0, 0.0, -0.0, -INF, -INF,
        ],
    );
    let rows: &[(ReduceOp, [f64; 7])] = &[
        (Max, [NAN, NAN, INF, INF, 0.0, 0.0, -INF]),
        (Min, [NAN, NAN, 1.0, -INF, -0.0, -0.0, -INF]),
        (Sum, [NAN, NAN, INF, NAN, 0.0, 0.0, -INF]),
        (Mean, [NAN, NAN, INF, NAN, 0.0, 0.0, -INF]),
        (Prod, [NAN, NAN, INF, -INF, -0.0, -0.0, INF]),
        (Norm1, [NAN, NAN, INF, INF, 0.0, 0.0, INF]),
        (Norm2, [NAN, NAN, INF, INF, 0.0, 0.0, INF]),
        (Var, [NAN, NAN, NAN, NAN, 0.0, 0.0, NAN]),
        (Std, [NAN, NAN, NAN, NAN, 0.0, 0.0, NAN]),
    ];
    for (op, want) in rows {
        let got = apply(reduce(*op, &[1], false), std::slice::from_ref(&x));
        assert_floats(&got, want, op.name());
    }
}

#[test]
fn sums_accumulate_in_f64_with_compensation() {
    // Plain f64 summation loses the 1 (1e16 + 1 == 1e16); Neumaier keeps it.
    let x = floats(F64, &[3], &[1e16, 1.0, -1e16]);
    assert_floats(
        &apply(reduce(ReduceOp::Sum, &[0], false), &[x]),
        &[1.0],
        "f64 sum",
    );
    // f32 accumulation would stall at 2^24; the f64 sum 16777218 is an f32.
    let x = floats(F32, &[3], &[16777216.0, 1.0, 1.0]);
    assert_floats(
        &apply(reduce(ReduceOp::Sum, &[0], false), &[x]),
        &[16777218.0],
        "f32 sum",
    );
    // f16: the sum rounds once (2050), not per element (2048 + 1 -> 2048).
    let x = floats(F16, &[3], &[2048.0, 1.0, 1.0]);
    assert_floats(
        &apply(reduce(ReduceOp::Sum, &[0], false), &[x]),
        &[2050.0],
        "f16 sum",
    );
    let x = floats(F16, &[2], &[65504.0, 65504.0]);
    let sum = apply(reduce(ReduceOp::Sum, &[0], false), std::slice::from_ref(&x));
    assert_floats(&sum, &[INF], "f16 sum overflows");
    let mean = apply(reduce(ReduceOp::Mean, &[0], false), &[x]);
    assert_floats(&mean, &[65504.0], "f16 mean does not overflow on the way");
}

#[test]
fn norms() {
    let x = floats(F32, &[2, 3], &[-1.0, 2.0, -3.0, 0.0, -0.0, 0.0]);
    let n1 = apply(
        reduce(ReduceOp::Norm1, &[1], false),
        std::slice::from_ref(&x),
    );
    assert_floats(&n1, &[6.0, 0.0], "norm1");
    let y = floats(F32, &[1, 3], &[3.0, -4.0, 0.0]);
    assert_floats(
        &apply(reduce(ReduceOp::Norm2, &[1], false), &[y]),
        &[5.0],
        "norm2",
    );
    // Squares of 1e200 overflow f64 and squares of 1e-200 underflow: scaling avoids it.
    for (v, want) in [
        (1e200, 1.414213562373095e200),
        (1e-200, 1.414213562373095e-200),
    ] {
        let x = floats(F64, &[2], &[v, -v]);
        let got = apply(reduce(ReduceOp::Norm2, &[0], false), &[x]).to_f64s()[0];
        assert!(
            ((got - want) / want).abs() < 1e-15,
            "norm2 of ±{v:e}: {got:e}"
        );
    }
}

#[test]
fn integer_reductions_are_exact_and_widen() {
    let (min32, max32) = (i64::from(i32::MIN), i64::from(i32::MAX));
    let x = ints(I32, &[2], &[max32, 1]);
    let s = apply(reduce(ReduceOp::Sum, &[0], false), &[x]);
    assert_eq!((s.dtype(), get_ints(&s)), (I64, vec![2147483648]));
    let x = ints(I64, &[2], &[i64::MAX, 1]);
    let s = apply(reduce(ReduceOp::Sum, &[0], false), &[x]);
    assert_eq!(get_ints(&s), [i64::MIN], "i64 sum wraps");
    let x = ints(I32, &[2], &[65536, 65536]);
    let p = apply(reduce(ReduceOp::Prod, &[0], false), &[x]);
    assert_eq!((p.dtype(), get_ints(&p)), (I64, vec![4294967296]));
    let x = ints(I32, &[2, 3], &[min32, 5, -3, 7, 7, max32]);
    let mx = apply(reduce(ReduceOp::Max, &[1], true), std::slice::from_ref(&x));
    assert_eq!(
        (mx.dtype(), shape(&mx), get_ints(&mx)),
        (I32, vec![2, 1], vec![5, max32])
    );
    let mn = apply(reduce(ReduceOp::Min, &[0], false), std::slice::from_ref(&x));
    assert_eq!(get_ints(&mn), [min32, 5, -3]);
    let s = apply(reduce(ReduceOp::Sum, &[1], false), &[x]);
    assert_eq!(get_ints(&s), [min32 + 2, 14 + max32]);
    // 2^53 + 1 is not an f64: an i64 sum must not go through floats.
    let x = ints(I64, &[2], &[1 << 53, 1]);
    let s = apply(reduce(ReduceOp::Sum, &[0], false), &[x]);
    assert_eq!(get_ints(&s), [(1 << 53) + 1]);
}

// ------------------------------------------------------------------------------------
// argmax / argmin
// ------------------------------------------------------------------------------------

/// An index reduction (op, axis, keepdims) with its expected shape and indices.
type ArgRow = (ArgReduceOp, usize, bool, &'static [usize], &'static [i64]);

fn arg(op: ArgReduceOp, axis: usize, keepdims: bool) -> Op {
    Op::ArgReduce { op, axis, keepdims }
}

#[test]
fn argmax_argmin_take_the_first_tie() {
    use ArgReduceOp::*;
    let x = floats(F32, &[2, 3], &[1.0, 3.0, 3.0, 2.0, 2.0, 1.0]);
    let rows: &[ArgRow] = &[
        (ArgMax, 1, false, &[2], &[1, 0]),
        (ArgMin, 1, false, &[2], &[0, 2]),
        (ArgMax, 1, true, &[2, 1], &[1, 0]),
        (ArgMax, 0, false, &[3], &[1, 0, 0]),
        (ArgMin, 0, true, &[1, 3], &[0, 1, 1]),
    ];
    for &(op, axis, keepdims, out_shape, want) in rows {
        let got = apply(arg(op, axis, keepdims), std::slice::from_ref(&x));
        let what = format!("{} axis={axis} keepdims={keepdims}", op.name());
        assert_eq!(got.dtype(), I64, "{what}");
        assert_eq!(shape(&got), out_shape, "{what}");
        assert_eq!(get_ints(&got), want, "{what}");
    }
}

#[test]
fn argmax_argmin_special_values() {
    use ArgReduceOp::*;
    // Each row is one lane.
    let x = floats(
        F64,
        &[5, 4],
        &[
            1.0, NAN, 5.0, NAN, // the first NaN wins for both
            NAN, 1.0, 2.0, 3.0, //
            -0.0, 0.0, -0.0, 0.0, // ±0 are equal: the first
            -INF, INF, INF, -INF, //
            2.0, 2.0, 2.0, 2.0, //
        ],
    );
    let mx = apply(arg(ArgMax, 1, false), std::slice::from_ref(&x));
    assert_eq!(get_ints(&mx), [1, 0, 0, 1, 0]);
    let mn = apply(arg(ArgMin, 1, false), &[x]);
    assert_eq!(get_ints(&mn), [1, 0, 0, 0, 0]);

    let x = ints(I64, &[3], &[i64::MIN, i64::MAX, i64::MAX]);
    assert_eq!(
        get_ints(&apply(arg(ArgMax, 0, false), std::slice::from_ref(&x))),
        [1]
    );
    assert_eq!(get_ints(&apply(arg(ArgMin, 0, false), &[x])), [0]);
    let x = ints(I32, &[2, 2], &[5, -5, -5, 5]);
    assert_eq!(get_ints(&apply(arg(ArgMin, 0, false), &[x])), [1, 0]);
    // Bools: false < true.
    let x = bools(&[3], &[false, true, true]);
    assert_eq!(
        get_ints(&apply(arg(ArgMax, 0, false), std::slice::from_ref(&x))),
        [1]
    );
    assert_eq!(get_ints(&apply(arg(ArgMin, 0, false), &[x])), [0]);
    // An empty result from an empty kept axis is fine.
    let x = floats(F32, &[0, 3], &[]);
    let got = apply(arg(ArgMax, 1, true), &[x]);
    assert_eq!((shape(&got), got.len()), (vec![0, 1], 0));
}

// ------------------------------------------------------------------------------------
// Views
// ------------------------------------------------------------------------------------

fn view(v: ViewOp) -> Op {
    Op::View(v)
}

fn slice(dims: &[usize], s: &[(Option<i64>, Option<i64>, i64)]) -> ViewOp {
    ViewOp::Slice(
        dims.iter()
            .zip(s)
            .map(|(&d, &(a, b, st))| AxisSlice::normalize(d, a, b, st).expect("step != 0"))
            .collect(),
    )
}

#[test]
#[rustfmt::skip]
fn view_ops_gather_the_right_elements() {
    let full = (None, None, 1);
    let rows: Vec<(HostArray, ViewOp, &[usize], Vec<f64>)> = vec![
        // out[k][i][j] = x[i][j][k] = 12i + 4j + k
        (arange(F32, &[2, 3, 4]), ViewOp::Permute(vec![2, 0, 1]), &[4, 2, 3], vec![
            0.0, 4.0, 8.0, 12.0, 16.0, 20.0,
            1.0, 5.0, 9.0, 13.0, 17.0, 21.0,
            2.0, 6.0, 10.0, 14.0, 18.0, 22.0,
            3.0, 7.0, 11.0, 15.0, 19.0, 23.0,
        ]),
        // x[1:9:2], x[::-1], x[3:0:-2], x[2:2], x[0:5:-1]
        (arange(F32, &[10]), slice(&[10], &[(Some(1), Some(9), 2)]), &[4], vec![1.0, 3.0, 5.0, 7.0]),
        (arange(F32, &[5]), slice(&[5], &[(None, None, -1)]), &[5], vec![4.0, 3.0, 2.0, 1.0, 0.0]),
        (arange(F32, &[5]), slice(&[5], &[(Some(3), Some(0), -2)]), &[2], vec![3.0, 1.0]),
        (arange(F32, &[5]), slice(&[5], &[(Some(2), Some(2), 1)]), &[0], vec![]),
        (arange(F32, &[5]), slice(&[5], &[(Some(0), Some(5), -1)]), &[0], vec![]),
        // x[::-1, 1:3] and x[:, ::-3] of a [3,4] arange
        (arange(F32, &[3, 4]), slice(&[3, 4], &[(None, None, -1), (Some(1), Some(3), 1)]), &[3, 2],
            vec![9.0, 10.0, 5.0, 6.0, 1.0, 2.0]),
        (arange(F32, &[3, 4]), slice(&[3, 4], &[full, (None, None, -3)]), &[3, 2],
            vec![3.0, 0.0, 7.0, 4.0, 11.0, 8.0]),
        (floats(F32, &[3], &[1.0, 2.0, 3.0]), ViewOp::BroadcastTo(Shape::new([2, 3])), &[2, 3],
            vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]),
        (floats(F32, &[3, 1], &[1.0, 2.0, 3.0]), ViewOp::BroadcastTo(Shape::new([2, 3, 2])), &[2, 3, 2],
            vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]),
        (floats(F32, &[], &[7.0]), ViewOp::BroadcastTo(Shape::new([2, 2])), &[2, 2], vec![7.0; 4]),
        (arange(F32, &[3]), ViewOp::ExpandDims(0), &[1, 3], vec![0.0, 1.0, 2.0]),
        (arange(F32, &[3]), ViewOp::ExpandDims(1), &[3, 1], vec![0.0, 1.0, 2.0]),
        (floats(F32, &[], &[7.0]), ViewOp::ExpandDims(0), &[1], vec![7.0]),
        (arange(F32, &[1, 3, 1]), ViewOp::Squeeze(vec![0, 2]), &[3], vec![0.0, 1.0, 2.0]),
        (floats(F32, &[1], &[7.0]), ViewOp::Squeeze(vec![0]), &[], vec![7.0]),
        (floats(F32, &[1], &[7.0]), ViewOp::Reshape(Shape::scalar()), &[], vec![7.0]),
        (arange(F32, &[2, 3]), ViewOp::Reshape(Shape::new([3, 1, 2])), &[3, 1, 2],
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
        // Empty tensors.
        (floats(F32, &[3, 0], &[]), ViewOp::Permute(vec![1, 0]), &[0, 3], vec![]),
        (floats(F32, &[0, 3], &[]), ViewOp::Reshape(Shape::new([3, 0, 2])), &[3, 0, 2], vec![]),
        (floats(F32, &[0], &[]), ViewOp::BroadcastTo(Shape::new([2, 0])), &[2, 0], vec![]),
    ];
    for (x, v, out_shape, want) in rows {
        let what = format!("{v:?} of {}", x.shape());
        let got = apply(view(v), &[x]);
        assert_eq!(shape(&got), out_shape, "{what}");
        assert_floats(&got, &want, &what);
    }
}

#[test]
fn views_of_ints_and_bools() {
    let x = ints(I64, &[3], &[i64::MIN, 0, i64::MAX]);
    let got = apply(view(slice(&[3], &[(None, None, -1)])), &[x]);
    assert_eq!(get_ints(&got), [i64::MAX, 0, i64::MIN]);
    let x = bools(&[2, 2], &[true, true, false, false]);
    let got = apply(view(ViewOp::Permute(vec![1, 0])), &[x]);
    assert_eq!(get_bools(&got), [true, false, true, false]);
}

/// Evaluates a chain of view ops applied one after the other to `x`.
fn chain(x: HostArray, ops: &[ViewOp]) -> HostArray {
    let mut g = Graph::new();
    let input = g.add_input("x", x.dtype(), x.shape().clone());
    let mut cur = input;
    for v in ops {
        cur = g
            .add(Op::View(v.clone()), &[cur])
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
    }
    g.add_output(cur);
    let mut out = eval(&g, &HashMap::from([(input, x)])).expect("chain evaluates");
    out.remove(0)
}

#[test]
fn reshape_of_a_permuted_view() {
    // [[0,1,2],[3,4,5]] transposed is [[0,3],[1,4],[2,5]]; flattening it needs a copy,
    // which evaluating the permute node first provides.
    let got = chain(
        arange(F32, &[2, 3]),
        &[
            ViewOp::Permute(vec![1, 0]),
            ViewOp::Reshape(Shape::new([6])),
        ],
    );
    assert_floats(&got, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], "reshape(permute)");
    let got = chain(
        arange(F32, &[2, 3]),
        &[
            ViewOp::Permute(vec![1, 0]),
            ViewOp::Reshape(Shape::new([2, 3])),
        ],
    );
    assert_eq!(shape(&got), [2, 3]);
    assert_floats(
        &got,
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        "reshape(permute) to 2x3",
    );
}

#[test]
fn chains_of_views() {
    // [[0,1,2],[3,4,5]] -> [:, ::-2] = [[2,0],[5,3]] -> T = [[2,5],[0,3]]
    // -> expand_dims(0) -> broadcast_to [2,2,2] -> reshape [8]
    let got = chain(
        arange(F32, &[2, 3]),
        &[
            slice(&[2, 3], &[(None, None, 1), (None, None, -2)]),
            ViewOp::Permute(vec![1, 0]),
            ViewOp::ExpandDims(0),
            ViewOp::BroadcastTo(Shape::new([2, 2, 2])),
            ViewOp::Reshape(Shape::new([8])),
        ],
    );
    assert_floats(&got, &[2.0, 5.0, 0.0, 3.0, 2.0, 5.0, 0.0, 3.0], "chain");
    // scalar -> [1] -> [3] -> [3,1] -> squeeze -> [3]
    let got = chain(
        floats(F64, &[], &[-0.0]),
        &[
            ViewOp::ExpandDims(0),
            ViewOp::BroadcastTo(Shape::new([3])),
            ViewOp::ExpandDims(1),
            ViewOp::Squeeze(vec![1]),
        ],
    );
    assert_floats(&got, &[-0.0, -0.0, -0.0], "scalar chain");
    // An empty slice, broadcast, then summed over the empty axis.
    let mut g = Graph::new();
    let x = g.add_input("x", F32, Shape::new([5]));
    let s = g
        .add(view(slice(&[5], &[(Some(4), Some(1), 1)])), &[x])
        .expect("empty slice");
    let b = g
        .add(view(ViewOp::BroadcastTo(Shape::new([2, 0]))), &[s])
        .expect("broadcast");
    let r = g
        .add(reduce(ReduceOp::Sum, &[1], false), &[b])
        .expect("sum");
    g.add_output(r);
    let out = eval(&g, &HashMap::from([(x, arange(F32, &[5]))])).expect("evaluates");
    assert_eq!(shape(&out[0]), [2]);
    assert_floats(&out[0], &[0.0, 0.0], "sum of an empty broadcast");
}

// ------------------------------------------------------------------------------------
// Whole graphs
// ------------------------------------------------------------------------------------

#[test]
fn shared_intermediates_and_repeated_outputs() {
    // y = exp(x); z = y + y; w = z * y; outputs [z, w, y, z]: y and z are both
    // intermediates and outputs, so freeing must not drop them.
    let mut g = Graph::new();
    let x = g.add_input("x", F64, Shape::new([2]));
    let y = g.add(Op::Unary(U::Exp), &[x]).expect("exp");
    let z = g.add(Op::Binary(B::Add), &[y, y]).expect("add");
    let w = g.add(Op::Binary(B::Mul), &[z, y]).expect("mul");
    for o in [z, w, y, z] {
        g.add_output(o);
    }
    let out = eval(&g, &HashMap::from([(x, floats(F64, &[2], &[0.0, -INF]))])).expect("eval");
    assert_eq!(out.len(), 4);
    assert_floats(&out[0], &[2.0, 0.0], "z");
    assert_floats(&out[1], &[2.0, 0.0], "w");
    assert_floats(&out[2], &[1.0, 0.0], "y");
    assert_floats(&out[3], &[2.0, 0.0], "z again");
}

#[test]
fn constants_fill_their_shape_in_their_dtype() {
    let mut g = Graph::new();
    let x = g.add_input("x", F16, Shape::new([2, 2]));
    // 0.1 becomes the f16 0.0999755859375 when the constant is built.
    let c = g.add_const(Scalar::F(0.1), F16, Shape::new([2, 2]));
    let y = g.add(Op::Binary(B::Add), &[x, c]).expect("add");
    let k = g.add_const(Scalar::I(-7), I32, Shape::scalar());
    g.add_output(y);
    g.add_output(k);
    let out = eval(
        &g,
        &HashMap::from([(x, floats(F16, &[2, 2], &[0.0, 1.0, -0.0, 2048.0]))]),
    )
    .expect("eval");
    // 1 + 0.0999755859375 = 1.0999755859375 rounds to the f16 1.099609375.
    assert_floats(
        &out[0],
        &[0.0999755859375, 1.099609375, 0.0999755859375, 2048.0],
        "x + 0.1",
    );
    assert_eq!((shape(&out[1]), get_ints(&out[1])), (vec![], vec![-7]));
}

#[test]
fn f16_graphs_round_after_every_node() {
    // (a * b) + c with a = b = 1 + 2^-10, c = 2^-11: a*b rounds to 1 + 2^-9 first, and
    // 1 + 2^-9 + 2^-11 is then a tie that goes to even: 1 + 2^-9.
    let mut g = Graph::new();
    let a = g.add_input("a", F16, Shape::new([1]));
    let b = g.add_input("b", F16, Shape::new([1]));
    let c = g.add_input("c", F16, Shape::new([1]));
    let m = g.add(Op::Binary(B::Mul), &[a, b]).expect("mul");
    let s = g.add(Op::Binary(B::Add), &[m, c]).expect("add");
    g.add_output(s);
    let one_ulp = floats(F16, &[1], &[1.0009765625]);
    let bind = HashMap::from([
        (a, one_ulp.clone()),
        (b, one_ulp),
        (c, floats(F16, &[1], &[0.00048828125])),
    ]);
    assert_floats(
        &eval(&g, &bind).expect("eval")[0],
        &[1.001953125],
        "per-node rounding",
    );
}

#[test]
fn unreachable_inputs_need_no_binding() {
    let mut g = Graph::new();
    let x = g.add_input("x", F32, Shape::new([1]));
    let dead = g.add_input("dead", F32, Shape::new([1]));
    let _unused = g.add(Op::Unary(U::Neg), &[dead]).expect("neg");
    let y = g.add(Op::Unary(U::Neg), &[x]).expect("neg");
    g.add_output(y);
    let out = eval(&g, &HashMap::from([(x, floats(F32, &[1], &[2.0]))])).expect("eval");
    assert_floats(&out[0], &[-2.0], "neg");
}

// ------------------------------------------------------------------------------------
// eval_node
// ------------------------------------------------------------------------------------

#[test]
fn eval_node_on_reduce_view_const_and_binary() {
    let x = floats(F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let sum = Node {
        op: reduce(ReduceOp::Sum, &[1], false),
        dtype: F32,
        shape: Shape::new([2]),
    };
    assert_floats(
        &eval_node(&sum, &[&x]).expect("sum"),
        &[6.0, 15.0],
        "eval_node sum",
    );
    let t = Node {
        op: view(ViewOp::Permute(vec![1, 0])),
        dtype: F32,
        shape: Shape::new([3, 2]),
    };
    let got = eval_node(&t, &[&x]).expect("permute");
    assert_eq!(shape(&got), [3, 2]);
    assert_floats(&got, &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0], "eval_node permute");
    let c = Node {
        op: Op::Const {
            value: Scalar::F(0.0999755859375),
        },
        dtype: F16,
        shape: Shape::new([2, 2]),
    };
    let got = eval_node(&c, &[]).expect("const");
    assert_eq!((got.dtype(), shape(&got)), (F16, vec![2, 2]));
    assert_floats(&got, &[0.0999755859375; 4], "eval_node const");
    let add = Node {
        op: Op::Binary(B::Add),
        dtype: I32,
        shape: Shape::new([1]),
    };
    let (a, b) = (ints(I32, &[1], &[i32::MAX.into()]), ints(I32, &[1], &[1]));
    assert_eq!(
        get_ints(&eval_node(&add, &[&a, &b]).expect("add")),
        [i64::from(i32::MIN)]
    );
}

#[test]
fn eval_node_rejects_mismatched_operands_and_inputs() {
    let x = floats(F32, &[2, 3], &[0.0; 6]);
    let wrong_shape = Node {
        op: reduce(ReduceOp::Sum, &[1], false),
        dtype: F32,
        shape: Shape::new([3]),
    };
    assert!(matches!(
        eval_node(&wrong_shape, &[&x]),
        Err(InterpError::Invalid(_))
    ));
    let wrong_arity = Node {
        op: Op::Binary(B::Add),
        dtype: F32,
        shape: Shape::new([2, 3]),
    };
    assert!(matches!(
        eval_node(&wrong_arity, &[&x]),
        Err(InterpError::Invalid(_))
    ));
    let input = Node {
        op: Op::Input { name: "x".into() },
        dtype: F32,
        shape: Shape::new([2, 3]),
    };
    assert!(matches!(
        eval_node(&input, &[]),
        Err(InterpError::Invalid(_))
    ));
}

// ------------------------------------------------------------------------------------
// eval_kernel
// ------------------------------------------------------------------------------------

fn ins(dtype: DType, expr: Expr) -> Instr {
    Instr { dtype, expr }
}

fn load(input: usize, shape: &[usize], strides: &[isize], offset: isize) -> Expr {
    Expr::Load {
        input,
        view: View {
            shape: Shape::from(shape),
            strides: strides.to_vec(),
            offset,
        },
    }
}

fn kernel(
    name: &str,
    domain: &[usize],
    inputs: &[(DType, usize)],
    outputs: &[DType],
    body: Vec<Instr>,
    stores: &[(u32, usize)],
) -> Kernel {
    let n = domain.iter().product();
    Kernel {
        name: name.into(),
        domain: Shape::from(domain),
        inputs: inputs
            .iter()
            .map(|&(dtype, len)| Buffer { dtype, len })
            .collect(),
        outputs: outputs
            .iter()
            .map(|&dtype| Buffer { dtype, len: n })
            .collect(),
        body,
        stores: stores
            .iter()
            .map(|&(v, output)| Store {
                value: ValueId(v),
                output,
            })
            .collect(),
        reduce_axes: Vec::new(),
        plan: Plan::Elementwise,
        plan_reason: "test".into(),
        contraction: None,
    }
}

/// out0 = x * row + reversed(r), out1 = cast(out0, i32), over a [2,3] domain.
fn mul_add_cast_kernel() -> Kernel {
    kernel(
        "k0_mul_add_cast",
        &[2, 3],
        &[(F32, 6), (F32, 3), (F32, 3)],
        &[F32, I32],
        vec![
            ins(F32, load(0, &[2, 3], &[3, 1], 0)),
            // A broadcast row: stride 0 on the first axis.
            ins(F32, load(1, &[2, 3], &[0, 1], 0)),
            // The row read backwards: stride -1 from offset 2.
            ins(F32, load(2, &[2, 3], &[0, -1], 2)),
            ins(F32, Expr::Binary(B::Mul, ValueId(0), ValueId(1))),
            ins(F32, Expr::Binary(B::Add, ValueId(3), ValueId(2))),
            ins(I32, Expr::Cast(ValueId(4))),
        ],
        &[(4, 0), (5, 1)],
    )
}

#[test]
fn eval_kernel_with_broadcast_and_reversed_loads_and_two_stores() {
    let k = mul_add_cast_kernel();
    k.check().expect("a well-formed kernel");
    let x = floats(F32, &[6], &[1.0, 2.0, 3.0, -4.0, 5.0, 6.0]);
    let row = floats(F32, &[3], &[10.0, 20.0, 30.0]);
    let r = floats(F32, &[3], &[0.5, 0.25, 0.125]);
    let out = eval_kernel(&k, &[&x, &row, &r]).expect("kernel runs");
    assert_eq!(out.len(), 2);
    assert_eq!((out[0].dtype(), shape(&out[0])), (F32, vec![2, 3]));
    assert_floats(
        &out[0],
        &[10.125, 40.25, 90.5, -39.875, 100.25, 180.5],
        "out0",
    );
    assert_eq!((out[1].dtype(), shape(&out[1])), (I32, vec![2, 3]));
    // The cast truncates toward zero: -39.875 -> -39.
    assert_eq!(get_ints(&out[1]), [10, 40, 90, -39, 100, 180]);
}

#[test]
fn eval_kernel_computes_halves_in_f32() {
    // (a * b) + c in f16 with a = b = 1 + 2^-10, c = 2^-11. In f32 the sum is
    // 1 + 2^-9 + 2^-11 + 2^-20, just above the f16 tie, so the store rounds up to
    // 1 + 3 * 2^-10; rounding after each op (graph semantics) gives 1 + 2^-9.
    let k = kernel(
        "k1_mul_add",
        &[2],
        &[(F16, 2), (F16, 2), (F16, 1)],
        &[F16],
        vec![
            ins(F16, load(0, &[2], &[1], 0)),
            ins(F16, load(1, &[2], &[1], 0)),
            ins(F16, load(2, &[2], &[0], 0)),
            ins(F16, Expr::Binary(B::Mul, ValueId(0), ValueId(1))),
            ins(F16, Expr::Binary(B::Add, ValueId(3), ValueId(2))),
        ],
        &[(4, 0)],
    );
    let a = floats(F16, &[2], &[1.0009765625, 2.0]);
    let b = floats(F16, &[2], &[1.0009765625, 3.0]);
    let c = floats(F16, &[1], &[0.00048828125]);
    let out = eval_kernel(&k, &[&a, &b, &c]).expect("kernel runs");
    assert_eq!(out[0].dtype(), F16);
    assert_floats(&out[0], &[1.0029296875, 6.0], "f16 kernel");
}

#[test]
fn eval_kernel_explicit_casts_round_to_their_target() {
    // cast(x: f32 -> f16) - 1 with x = 1 + 2^-20: an explicit cast asks for f16
    // precision, so inside a kernel too it rounds (to 1) and the difference is 0, as in
    // the graph. Only arithmetic on half values is kept in f32 between instructions.
    let k = kernel(
        "k2_cast_sub",
        &[1],
        &[(F32, 1)],
        &[F16],
        vec![
            ins(F32, load(0, &[1], &[1], 0)),
            ins(F16, Expr::Cast(ValueId(0))),
            ins(F16, Expr::Const(Scalar::F(1.0))),
            ins(F16, Expr::Binary(B::Sub, ValueId(1), ValueId(2))),
        ],
        &[(3, 0)],
    );
    let x = floats(F32, &[1], &[1.0 + 2f64.powi(-20)]);
    let out = eval_kernel(&k, &[&x]).expect("kernel runs");
    assert_floats(&out[0], &[0.0], "kernel cast to f16");
}

#[test]
fn eval_kernel_comparisons_and_where() {
    // out0 = where(x > 0, x, 0) over i32, out1 = x > 0.
    let k = kernel(
        "k3_gt_where",
        &[4],
        &[(I32, 4)],
        &[I32, Bool],
        vec![
            ins(I32, load(0, &[4], &[1], 0)),
            ins(I32, Expr::Const(Scalar::I(0))),
            ins(Bool, Expr::Binary(B::Gt, ValueId(0), ValueId(1))),
            ins(I32, Expr::Where(ValueId(2), ValueId(0), ValueId(1))),
        ],
        &[(3, 0), (2, 1)],
    );
    let x = ints(I32, &[4], &[-2, 5, 0, i32::MAX.into()]);
    let out = eval_kernel(&k, &[&x]).expect("kernel runs");
    assert_eq!(get_ints(&out[0]), [0, 5, 0, i64::from(i32::MAX)]);
    assert_eq!(get_bools(&out[1]), [false, true, false, true]);
}

#[test]
fn eval_kernel_over_an_empty_domain_and_many_chunks() {
    let empty = kernel(
        "k4_neg",
        &[0, 3],
        &[(F32, 0)],
        &[F32],
        vec![
            ins(F32, load(0, &[0, 3], &[3, 1], 0)),
            ins(F32, Expr::Unary(U::Neg, ValueId(0))),
        ],
        &[(1, 0)],
    );
    let out = eval_kernel(&empty, &[&floats(F32, &[0], &[])]).expect("empty kernel runs");
    assert_eq!((shape(&out[0]), out[0].len()), (vec![0, 3], 0));
    // A domain larger than one evaluation chunk, read transposed.
    let (r, c) = (100, 123);
    let t = kernel(
        "k5_transpose",
        &[c, r],
        &[(F64, r * c)],
        &[F64],
        vec![ins(F64, load(0, &[c, r], &[1, c as isize], 0))],
        &[(0, 0)],
    );
    let x = arange(F64, &[r * c]);
    let out = eval_kernel(&t, &[&x]).expect("transpose runs");
    let got = out[0].to_f64s();
    for j in 0..c {
        for i in 0..r {
            assert_eq!(got[j * r + i], (i * c + j) as f64, "element ({j}, {i})");
        }
    }
}

#[test]
fn eval_kernel_checks_its_arguments() {
    let k = mul_add_cast_kernel();
    let x = floats(F32, &[6], &[0.0; 6]);
    let short = floats(F32, &[5], &[0.0; 5]);
    let row = floats(F32, &[3], &[0.0; 3]);
    let row64 = floats(F64, &[3], &[0.0; 3]);
    let cases: Vec<(Vec<&HostArray>, &str)> = vec![
        (vec![&short, &row, &row], "in0"),
        (vec![&x, &row64, &row], "in1"),
        (vec![&x, &row], "takes 3 inputs"),
    ];
    for (args, needle) in cases {
        match eval_kernel(&k, &args) {
            Err(InterpError::KernelArgs { kernel, detail }) => {
                assert_eq!(kernel, "k0_mul_add_cast");
                assert!(
                    detail.contains(needle),
                    "{detail:?} should mention {needle:?}"
                );
            }
            other => panic!("expected KernelArgs mentioning {needle:?}, got {other:?}"),
        }
    }
    // A malformed body: adding an f32 to an i32.
    let mut bad = mul_add_cast_kernel();
    bad.body[4] = ins(F32, Expr::Binary(B::Add, ValueId(3), ValueId(5)));
    bad.body.swap(4, 5);
    let err = eval_kernel(&bad, &[&x, &row, &row]).expect_err("malformed kernel");
    assert!(matches!(err, InterpError::KernelArgs { .. }), "{err:?}");
}

// ------------------------------------------------------------------------------------
// Errors of eval
// ------------------------------------------------------------------------------------

fn x_plus_y() -> (Graph, NodeId, NodeId) {
    let mut g = Graph::new();
    let x = g.add_input("x", F32, Shape::new([2]));
    let y = g.add_input("y", F32, Shape::new([2]));
    let s = g.add(Op::Binary(B::Add), &[x, y]).expect("add");
    g.add_output(s);
    (g, x, y)
}

#[test]
fn missing_input_is_an_error() {
    let (g, x, y) = x_plus_y();
    let err = eval(&g, &HashMap::from([(x, floats(F32, &[2], &[1.0, 2.0]))]))
        .expect_err("y is not bound");
    assert_eq!(
        err,
        InterpError::MissingInput {
            node: y,
            name: "y".into()
        }
    );
    assert!(err.to_string().contains("\"y\""), "{err}");
}

#[test]
fn input_of_wrong_dtype_or_shape_is_an_error() {
    let (g, x, y) = x_plus_y();
    let good = floats(F32, &[2], &[1.0, 2.0]);
    for bad in [
        floats(F64, &[2], &[1.0, 2.0]),
        floats(F32, &[1, 2], &[1.0, 2.0]),
    ] {
        let got = TensorType {
            dtype: bad.dtype(),
            shape: bad.shape().clone(),
        };
        let err = eval(&g, &HashMap::from([(x, good.clone()), (y, bad)])).expect_err("mismatch");
        assert_eq!(
            err,
            InterpError::InputMismatch {
                name: "y".into(),
                expected: TensorType {
                    dtype: F32,
                    shape: Shape::new([2])
                },
                got,
            }
        );
    }
}

#[test]
fn invalid_graph_is_an_error() {
    let mut g = Graph::new();
    let x = g.add_input("x", F32, Shape::new([2]));
    let bad = g.add_node(
        Node {
            op: Op::Unary(U::Neg),
            dtype: F32,
            shape: Shape::new([3]),
        },
        &[x],
    );
    g.add_output(bad);
    let err = eval(&g, &HashMap::from([(x, floats(F32, &[2], &[1.0, 2.0]))])).expect_err("invalid");
    match err {
        InterpError::Invalid(errs) => {
            assert_eq!(errs.0.len(), 1);
            assert_eq!(errs.0[0].node, Some(bad));
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

// ------------------------------------------------------------------------------------
// Rounding and scale
// ------------------------------------------------------------------------------------

#[test]
fn casts_to_halves_round_once() {
    // 2049 + 2^-30 is just above the f16 tie 2049 (between 2048 and 2050): 2050. Via
    // f32 it becomes 2049 exactly and ties to even: 2048.
    let got = apply(
        Op::Cast { to: F16 },
        &[floats(F64, &[1], &[2049.0000000009313])],
    );
    assert_floats(&got, &[2050.0], "f64 -> f16");
    // 1 + 2^-8 + 2^-40 is just above the bf16 tie 1 + 2^-8: 1 + 2^-7.
    let got = apply(
        Op::Cast { to: BF16 },
        &[floats(F64, &[1], &[1.0039062500000009])],
    );
    assert_floats(&got, &[1.0078125], "f64 -> bf16");
}

/// A million elements through a permute, a fused-looking chain and two reductions: the
/// interpreter must stay linear (no per-element index recomputation blow-up). Speed is
/// measured by benchmarks, not asserted here.
#[test]
fn a_million_elements_through_views_and_reductions() {
    let (r, c) = (1024, 1024);
    let mut g = Graph::new();
    let x = g.add_input("x", F32, Shape::new([r, c]));
    let t = g
        .add(view(ViewOp::Permute(vec![1, 0])), &[x])
        .expect("permute");
    let e = g.add(Op::Unary(U::Exp), &[t]).expect("exp");
    let k = g.add_const(Scalar::F(0.5), F32, Shape::new([r, c]));
    let m = g.add(Op::Binary(B::Mul), &[e, k]).expect("mul");
    let s = g
        .add(reduce(ReduceOp::Sum, &[0], false), &[m])
        .expect("sum");
    let a = g
        .add(arg(ArgReduceOp::ArgMax, 1, false), &[m])
        .expect("argmax");
    g.add_output(s);
    g.add_output(a);
    let data = HostArray::from_f64s(F32, Shape::new([r, c]), &vec![0.0; r * c]);
    let out = eval(&g, &HashMap::from([(x, data)])).expect("eval");
    assert_floats(&out[0], &vec![512.0; c], "sum of 1024 halves");
    assert_eq!(
        out[1].as_slice::<i64>(),
        Some(&vec![0i64; r][..]),
        "argmax of equal values is the first"
    );
}

// ------------------------------------------------------------------------------------
// Matrix product (Op::MatMul and a kernel's Contraction)
// ------------------------------------------------------------------------------------

#[test]
fn matmul_2x3_by_3x2_in_every_numeric_dtype() {
    // [[1,2,3],[4,5,6]] @ [[7,8],[9,10],[11,12]] = [[58,64],[139,154]].
    let (a, b) = (
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        [7.0, 8.0, 9.0, 10.0, 11.0, 12.0],
    );
    for dt in FLOATS {
        let y = apply(
            Op::MatMul,
            &[floats(dt, &[2, 3], &a), floats(dt, &[3, 2], &b)],
        );
        assert_eq!((y.dtype(), shape(&y)), (dt, vec![2, 2]), "{dt}");
        // Exact in every float dtype: 139 = 0b1000_1011 and 154 = 0b1001_1010 fit bf16's
        // 8 significant bits.
        assert_floats(&y, &[58.0, 64.0, 139.0, 154.0], &format!("{dt}"));
    }
    for dt in [I32, I64] {
        let ai: Vec<i64> = a.iter().map(|&v| v as i64).collect();
        let bi: Vec<i64> = b.iter().map(|&v| v as i64).collect();
        let y = apply(
            Op::MatMul,
            &[ints(dt, &[2, 3], &ai), ints(dt, &[3, 2], &bi)],
        );
        assert_eq!((y.dtype(), shape(&y)), (dt, vec![2, 2]), "{dt}");
        assert_eq!(get_ints(&y), [58, 64, 139, 154], "{dt}");
    }
}

#[test]
fn matmul_broadcasts_batch_axes() {
    // [2,1,2,3] @ [3,3,2] -> [2,3,2,2]: out[p,q] = A[p] @ B[q].
    // A[0] = [[1,0,0],[0,1,0]] picks rows 0 and 1 of B[q];
    // A[1] = [[1,1,1],[0,0,2]] sums B[q]'s rows and doubles its row 2.
    // B[q] = [[6q, 6q+1], [6q+2, 6q+3], [6q+4, 6q+5]].
    let a = [
        1.0, 0.0, 0.0, 0.0, 1.0, 0.0, //
        1.0, 1.0, 1.0, 0.0, 0.0, 2.0,
    ];
    let b: Vec<f64> = (0..18).map(f64::from).collect();
    let want = [
        0.0, 1.0, 2.0, 3.0, // p0 q0
        6.0, 7.0, 8.0, 9.0, // p0 q1
        12.0, 13.0, 14.0, 15.0, // p0 q2
        6.0, 9.0, 8.0, 10.0, // p1 q0: [0+2+4, 1+3+5], [2*4, 2*5]
        24.0, 27.0, 20.0, 22.0, // p1 q1
        42.0, 45.0, 32.0, 34.0, // p1 q2
    ];
    for dt in [F32, F64] {
        let y = apply(
            Op::MatMul,
            &[floats(dt, &[2, 1, 2, 3], &a), floats(dt, &[3, 3, 2], &b)],
        );
        assert_eq!(shape(&y), vec![2, 3, 2, 2]);
        assert_floats(&y, &want, &format!("batched {dt}"));
    }
    // The same with the operands' roles in the batch swapped: [3,2,3] @ [2,1,3,2]
    // broadcasts to [2,3,2,2] too (each operand contributes one batch axis).
    let y = apply(
        Op::MatMul,
        &[
            floats(F64, &[1, 2, 3], &a[..6]),
            floats(F64, &[2, 1, 3, 2], &b[..12]),
        ],
    );
    assert_eq!(shape(&y), vec![2, 1, 2, 2]);
    assert_floats(
        &y,
        &[0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0],
        "lhs batch of 1",
    );
}

#[test]
fn integer_matmul_wraps_at_the_result_width() {
    // [2^31-1, 2] @ [[1, 2], [1, 3]] = [2^31 + 1, 2^32 + 4]: i32 wraps both (as numpy's
    // int32 matmul does), i64 holds them.
    let a = [i64::from(i32::MAX), 2];
    let b = [1, 2, 1, 3];
    let y = apply(
        Op::MatMul,
        &[ints(I32, &[1, 2], &a), ints(I32, &[2, 2], &b)],
    );
    assert_eq!(get_ints(&y), [-2147483647, 4]);
    let y = apply(
        Op::MatMul,
        &[ints(I64, &[1, 2], &a), ints(I64, &[2, 2], &b)],
    );
    assert_eq!(get_ints(&y), [2147483649, 4294967300]);
    // i64 wraps at 2^63: MAX + 1 is MIN; MAX * 2 is -2.
    let y = apply(
        Op::MatMul,
        &[
            ints(I64, &[1, 2], &[i64::MAX, 1]),
            ints(I64, &[2, 2], &[1, 2, 1, 0]),
        ],
    );
    assert_eq!(get_ints(&y), [i64::MIN, -2]);
}

#[test]
fn float_matmul_rounds_once_to_its_dtype() {
    // 1 + u/2 + u/2 with u the ulp of 1: rounding once gives 1 + u; rounding each
    // partial sum would tie to even twice and give 1.
    for (dt, half_ulp) in [
        (F16, 2f64.powi(-11)),
        (BF16, 2f64.powi(-8)),
        (F32, 2f64.powi(-24)),
    ] {
        let a = floats(dt, &[1, 3], &[1.0, half_ulp, half_ulp]);
        let b = floats(dt, &[3, 1], &[1.0, 1.0, 1.0]);
        let y = apply(Op::MatMul, &[a, b]);
        assert_floats(&y, &[1.0 + 2.0 * half_ulp], &format!("{dt}"));
    }
    // 1 + 3/4 ulp rounds up to 1 + ulp in f16 (once); stepwise it would stay 1.
    let a = floats(F16, &[1, 3], &[1.0, 2f64.powi(-11), 2f64.powi(-12)]);
    let b = floats(F16, &[3, 1], &[1.0, 1.0, 1.0]);
    assert_floats(&apply(Op::MatMul, &[a, b]), &[1.0009765625], "f16 3/4 ulp");
    // An f16 product past 65504 overflows to inf once rounded: 2 * 300 * 120 = 72000.
    let a = floats(F16, &[1, 2], &[300.0, 300.0]);
    let b = floats(F16, &[2, 1], &[120.0, 120.0]);
    assert_floats(&apply(Op::MatMul, &[a, b]), &[INF], "f16 overflow");
}

#[test]
fn matmul_of_empty_extents() {
    // K = 0: every element is an empty sum, 0 (integers too).
    let y = apply(
        Op::MatMul,
        &[floats(F32, &[2, 0], &[]), floats(F32, &[0, 3], &[])],
    );
    assert_eq!(shape(&y), vec![2, 3]);
    assert_floats(&y, &[0.0; 6], "K = 0 (+0.0, as numpy)");
    // A sum of -0.0 terms is +0.0 too, as numpy's (BLAS's) sums start from +0.0.
    let y = apply(
        Op::MatMul,
        &[
            floats(F64, &[1, 2], &[-0.0, 1.0]),
            floats(F64, &[2, 1], &[1.0, -0.0]),
        ],
    );
    assert_floats(&y, &[0.0], "-0 + -0");
    let y = apply(
        Op::MatMul,
        &[ints(I32, &[1, 0], &[]), ints(I32, &[0, 2], &[])],
    );
    assert_eq!((shape(&y), get_ints(&y)), (vec![1, 2], vec![0, 0]));
    // M = 0 or N = 0: an empty result of the right shape.
    let y = apply(
        Op::MatMul,
        &[floats(F64, &[0, 3], &[]), floats(F64, &[3, 2], &[0.0; 6])],
    );
    assert_eq!((shape(&y), y.len()), (vec![0, 2], 0));
    let y = apply(
        Op::MatMul,
        &[floats(F64, &[2, 3], &[0.0; 6]), floats(F64, &[3, 0], &[])],
    );
    assert_eq!((shape(&y), y.len()), (vec![2, 0], 0));
    // An empty batch axis.
    let y = apply(
        Op::MatMul,
        &[
            floats(F32, &[0, 2, 3], &[]),
            floats(F32, &[3, 2], &[0.0; 6]),
        ],
    );
    assert_eq!((shape(&y), y.len()), (vec![0, 2, 2], 0));
}

#[test]
fn matmul_shape_inference_errors() {
    let err = |a: (DType, &[usize]), b: (DType, &[usize])| {
        let mut g = Graph::new();
        let x = g.add_input("a", a.0, Shape::from(a.1));
        let y = g.add_input("b", b.0, Shape::from(b.1));
        g.add(Op::MatMul, &[x, y]).expect_err("an invalid matmul")
    };
    // Rank below 2 (the frontend promotes 1-D operands; the IR takes none).
    let e = err((F32, &[3]), (F32, &[3, 2]));
    assert!(matches!(e, ndfuse_ir::IrError::BadDType { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("matmul: f32[3] is not allowed"),
        "{e}"
    );
    let e = err((F32, &[2, 3]), (F32, &[]));
    assert!(e.to_string().contains("f32[]"), "{e}");
    // Bool.
    let e = err((Bool, &[2, 2]), (Bool, &[2, 2]));
    assert!(
        e.to_string()
            .starts_with("matmul: bool[2,2] is not allowed"),
        "{e}"
    );
    // Two dtypes.
    let e = err((F32, &[2, 3]), (F64, &[3, 2]));
    assert!(
        matches!(e, ndfuse_ir::IrError::DTypeMismatch { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("f32[2,3] and f64[3,2]"), "{e}");
    // Contracted extents that differ: both shapes and both extents.
    let e = err((F32, &[4, 8]), (F32, &[7, 3]));
    assert_eq!(
        e,
        ndfuse_ir::IrError::Contraction {
            op: "matmul",
            lhs: TensorType {
                dtype: F32,
                shape: Shape::from(&[4, 8][..])
            },
            rhs: TensorType {
                dtype: F32,
                shape: Shape::from(&[7, 3][..])
            },
            lhs_k: 8,
            rhs_k: 7,
        }
    );
    assert!(
        e.to_string()
            .starts_with("matmul: f32[4,8] @ f32[7,3]: 8 != 7"),
        "{e}"
    );
    // Batch axes that do not broadcast (3 against 2), though K agrees.
    let e = err((F32, &[2, 4, 8]), (F32, &[3, 8, 3]));
    assert!(matches!(e, ndfuse_ir::IrError::Broadcast { .. }), "{e:?}");
    assert!(e.to_string().contains("f32[2,4,8] and f32[3,8,3]"), "{e}");
}

#[test]
fn eval_kernel_fills_a_contraction_through_strided_views_then_runs_its_epilogue() {
    // Domain [2 batches, M=2, N=2], K = 3. The left operand is one K x M matrix
    // LT = [[1,2],[3,4],[5,6]] read transposed (strides (1,2)) and broadcast over the
    // batch (stride 0): L = [[1,3,5],[2,4,6]]. The right operand holds two K x N
    // matrices R0 = [[1,0],[0,1],[1,1]], R1 = [[0,1],[1,0],[-1,-1]].
    // L @ R0 = [[6,8],[8,10]], L @ R1 = [[-2,-4],[-2,-4]]; then + bias [0.5, 1] and
    // relu of that.
    let mut k = kernel(
        "k0_matmul_add_relu",
        &[2, 2, 2],
        &[(F32, 6), (F32, 12), (F32, 2), (F32, 8)],
        &[F32, F32],
        vec![
            ins(F32, load(3, &[2, 2, 2], &[4, 2, 1], 0)),
            ins(F32, load(2, &[2, 2, 2], &[0, 0, 1], 0)),
            ins(F32, Expr::Binary(B::Add, ValueId(0), ValueId(1))),
            ins(F32, Expr::Unary(U::Relu, ValueId(2))),
        ],
        &[(2, 0), (3, 1)],
    );
    k.contraction = Some(ndfuse_ir::Contraction {
        lhs: 0,
        lhs_view: View {
            shape: Shape::from(&[2, 2, 3][..]),
            strides: vec![0, 1, 2],
            offset: 0,
        },
        rhs: 1,
        rhs_view: View {
            shape: Shape::from(&[2, 3, 2][..]),
            strides: vec![6, 2, 1],
            offset: 0,
        },
        product: 3,
        dtype: F32,
        block_rows: 1,
        lhs_prologue: Vec::new(),
        rhs_prologue: Vec::new(),
    });
    k.check().expect("a well-formed contraction kernel");
    let lt = floats(F32, &[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = floats(
        F32,
        &[12],
        &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, -1.0, -1.0],
    );
    let bias = floats(F32, &[2], &[0.5, 1.0]);
    // The product is not bound: three arguments for four inputs.
    let out = eval_kernel(&k, &[&lt, &r, &bias]).expect("kernel runs");
    assert_floats(
        &out[0],
        &[6.5, 9.0, 8.5, 11.0, -1.5, -3.0, -1.5, -3.0],
        "product + bias",
    );
    assert_floats(&out[1], &[6.5, 9.0, 8.5, 11.0, 0.0, 0.0, 0.0, 0.0], "relu");
    // Binding the product too is an argument error, not a silent overwrite.
    let prod = floats(F32, &[8], &[0.0; 8]);
    let e = eval_kernel(&k, &[&lt, &r, &bias, &prod]).expect_err("product bound");
    assert!(e.to_string().contains("takes 3 inputs, got 4"), "{e}");
    // The body may read the product only at its own position (a backend fills it block
    // by block, or keeps it in registers): a transposed load of it is malformed.
    let mut transposed = k.clone();
    transposed.body[0] = ins(F32, load(3, &[2, 2, 2], &[4, 1, 2], 0));
    let errs = transposed.check().expect_err("product read transposed");
    assert!(
        errs.iter().any(|e| e.contains("loads the product in3 through a view other than its own position")),
        "{errs:?}"
    );
    // Operand prologues: L scaled by 0.3 (in f32) then rounded to f16, R divided by 3
    // (in f32), each element as the graph's ops round it, before the product.
    let mut pro = k.clone();
    if let Some(c) = &mut pro.contraction {
        c.lhs_prologue = vec![
            ndfuse_ir::Prologue::Mul(Scalar::F(f64::from(0.3f32))),
            ndfuse_ir::Prologue::Cast(F16),
        ];
        c.rhs_prologue = vec![ndfuse_ir::Prologue::Div(Scalar::F(3.0))];
    }
    pro.check().expect("prologues of an f32 product");
    assert!(pro.to_string().contains("|> mul 0.3 |> cast f16"), "{pro}");
    assert!(pro.to_string().contains("|> div 3.0"), "{pro}");
    let out = eval_kernel(&pro, &[&lt, &r, &bias]).expect("kernel runs");
    let l: Vec<f64> = [1.0f32, 3.0, 5.0, 2.0, 4.0, 6.0]
        .iter()
        .map(|&v| f64::from(half::f16::from_f32(v * 0.3f32).to_f32()))
        .collect();
    let rv: Vec<f64> = [
        1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, -1.0, -1.0,
    ]
    .iter()
    .map(|&v| f64::from(v / 3.0f32))
    .collect();
    let mut want = Vec::new();
    for b in 0..2 {
        for i in 0..2 {
            for j in 0..2 {
                let s: f64 = (0..3).map(|q| l[i * 3 + q] * rv[b * 6 + q * 2 + j]).sum();
                want.push(f64::from(s as f32 + [0.5f32, 1.0][j]));
            }
        }
    }
    assert_floats(&out[0], &want, "prologued product + bias");
    // Prologues belong to f32 products only.
    let mut f64k = pro.clone();
    if let Some(c) = &mut f64k.contraction {
        c.dtype = F64;
    }
    let errs = f64k.check().expect_err("a prologue on an f64 product");
    assert!(
        errs.iter()
            .any(|e| e.contains("the lhs prologue of a product accumulating in f64")),
        "{errs:?}"
    );
}

// ------------------------------------------------------------------------------------
// Out of memory (issue 18): a step too large is an error, never an abort
// ------------------------------------------------------------------------------------

/// A broadcast of one element to `dims`: a result of the user's size from a tiny input.
fn broadcast_node(dims: &[usize]) -> Node {
    Node {
        op: view(ViewOp::BroadcastTo(Shape::from(dims))),
        dtype: F64,
        shape: Shape::from(dims),
    }
}

#[test]
fn a_step_beyond_the_address_space_is_out_of_memory() {
    let one = floats(F64, &[1, 1, 1], &[2.0]);
    // 2^60 elements of 16 bytes (f64 as computed and as stored): beyond isize::MAX.
    let huge = [1 << 20, 1 << 20, 1 << 20];
    let e = eval_node(&broadcast_node(&huge), &[&one]).expect_err("too large");
    assert!(
        matches!(&e, InterpError::OutOfMemory { bytes, what }
            if *bytes == 1u128 << 64 && what.starts_with("broadcast_to f64")),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "out of memory: more bytes than this platform can address for broadcast_to f64[1048576,1048576,1048576]"
    );
    // A shape whose element count overflows usize is refused the same way.
    let overflow = [1 << 40, 1 << 40, 1];
    let e = eval_node(&broadcast_node(&overflow), &[&one]).expect_err("overflows");
    assert!(matches!(e, InterpError::OutOfMemory { .. }), "{e:?}");
    // Through a whole graph: the step fails, not the process.
    let mut g = Graph::new();
    let x = g.add_input("x", F64, Shape::new([1, 1, 1]));
    let b = g
        .add(Op::View(ViewOp::BroadcastTo(Shape::from(&huge[..]))), &[x])
        .expect("broadcast");
    let y = g.add(Op::Unary(U::Neg), &[b]).expect("neg");
    g.add_output(y);
    let e = eval(&g, &HashMap::from([(x, one.clone())])).expect_err("too large");
    assert!(matches!(e, InterpError::OutOfMemory { .. }), "{e:?}");
    // Small steps still run.
    assert_floats(
        &eval_node(&broadcast_node(&[2, 1, 2]), &[&one]).expect("small"),
        &[2.0; 4],
        "small broadcast",
    );
}
