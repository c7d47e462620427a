//! The reference interpreter: evaluates a graph node by node, or a kernel description
//! element by element, with f64 math. It is the correctness oracle that every backend is
//! differential-tested against, so it favours plain, obviously-right code over speed
//! (while staying linear in the number of elements).
//!
//! Graph semantics: float math is done in f64 and rounded to the node's dtype after
//! every node ([`crate::round::round_f64`]); integers are exact with two's-complement
//! wrapping to the dtype's width. Kernel semantics ([`eval_kernel`]) differ in one way:
//! half types compute in f32 and round to the storage dtype only at stores, as the
//! backends do.
//!
//! Transcendental functions are Rust's `f64` methods, which call the platform's C library
//! (glibc's are within about 0.5 ulp, closer than the `libm` crate's); std has no `erf`,
//! so that one comes from `libm`. Tests of f64 results should therefore allow an ulp.

use crate::array::{HostArray, Storage};
use crate::dtype::{DType, Scalar};
use crate::error::TensorType;
use crate::graph::{Graph, NodeId};
use crate::infer::infer;
use crate::kernel::{Expr, Kernel};
use crate::op::{ArgReduceOp, BinaryOp, Node, Op, ReduceOp, UnaryOp, ViewOp};
use crate::round::{int_to_float, round_f64, wrap_int};
use crate::shape::{Shape, View};
use crate::verify::{verify, VerifyError, VerifyErrors};
use std::borrow::Cow;
use std::collections::HashMap;

/// Why the interpreter could not evaluate a graph, node or kernel.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// An input node reachable from the outputs has no array bound to it.
    #[error("input {name:?} ({node}) has no array bound to it")]
    MissingInput {
        /// The input node.
        node: NodeId,
        /// Its name.
        name: String,
    },
    /// The array bound to an input has another dtype or shape than the input node.
    #[error("input {name:?} expects {expected}, got {got}")]
    InputMismatch {
        /// The input's name.
        name: String,
        /// The input node's type.
        expected: TensorType,
        /// The bound array's type.
        got: TensorType,
    },
    /// The graph (or, for [`eval_node`], the node with its operands) fails verification.
    #[error(transparent)]
    Invalid(#[from] VerifyErrors),
    /// The arrays passed to [`eval_kernel`] do not fit the kernel, or the kernel
    /// description is malformed.
    #[error("kernel {kernel}: {detail}")]
    KernelArgs {
        /// The kernel's name.
        kernel: String,
        /// What does not fit.
        detail: String,
    },
}

// ---------------------------------------------------------------------------------------
// Scalar semantics, shared by the graph and kernel paths.
// ---------------------------------------------------------------------------------------

/// `op` applied to `x` in f64, not rounded (the caller rounds to the dtype).
///
/// `not` treats 0 as false and anything else (NaN included) as true, returning 0 or 1.
///
/// ```
/// use ndfuse_ir::{interp::unary_f64, UnaryOp};
/// assert_eq!(unary_f64(UnaryOp::Sigmoid, -1000.0), 0.0);
/// assert_eq!(unary_f64(UnaryOp::Round, 2.5), 2.0);
/// ```
pub fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        // The comparisons fail for ±0 and NaN, which are returned as they are.
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Square => x * x,
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => {
            // For x < 0, e^x / (1 + e^x) keeps the tiny results that 1 / (1 + e^-x)
            // loses once e^-x overflows; neither form can produce NaN from a non-NaN.
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                let e = x.exp();
                e / (1.0 + e)
            }
        }
        UnaryOp::Relu => {
            // maximum(-0, +0) is +0, so relu never returns -0; NaN passes through.
            if x.is_nan() || x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Not => f64::from(u8::from(x == 0.0)),
    }
}

/// `op` on integers with i64 wrapping arithmetic (wrap to a narrower dtype afterwards
/// with [`crate::round::wrap_int`]; two's-complement wrapping commutes with that).
///
/// Ops a verified graph never applies to integers (the float-only unary ops) are
/// computed in f64 and truncated like a cast, so the function is total.
pub fn unary_i64(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        // abs(MIN) wraps to MIN, as numpy's does.
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Sign => x.signum(),
        UnaryOp::Square => x.wrapping_mul(x),
        UnaryOp::Relu => x.max(0),
        UnaryOp::Not => i64::from(x == 0),
        _ => unary_f64(op, x as f64) as i64,
    }
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and +0 is greater than -0.
fn max_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else if a.is_sign_negative() {
        // Equal values: only ±0 differ, and the positive one wins.
        b
    } else {
        a
    }
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN, and -0 is less than +0.
fn min_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else if a.is_sign_negative() {
        a
    } else {
        b
    }
}

/// Arithmetic `op` on f64 values, not rounded. `max`/`min` propagate NaN and order
/// -0 below +0; `pow` follows IEEE `pow` (`pow(x, 0) = 1` even for NaN).
///
/// Comparisons return 1 or 0 and logical ops treat non-zero (NaN included) as true, so
/// the function is total; [`compare_f64`] is the intended way to compare.
pub fn binary_f64(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => max_f64(a, b),
        BinaryOp::Min => min_f64(a, b),
        _ => f64::from(u8::from(compare_f64(op, a, b))),
    }
}

/// Comparison `op` on f64 values: NaN compares false except for `ne`. Logical ops
/// treat non-zero (NaN included) as true; arithmetic ops give "result is non-zero".
pub fn compare_f64(op: BinaryOp, a: f64, b: f64) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        BinaryOp::And => a != 0.0 && b != 0.0,
        BinaryOp::Or => a != 0.0 || b != 0.0,
        _ => binary_f64(op, a, b) != 0.0,
    }
}

/// `base ** exp` on integers: wrapping power by squaring for `exp >= 0`; for `exp < 0`
/// the exact result truncated toward zero (1 for base 1, ±1 for base -1, else 0), where
/// numpy raises instead.
fn pow_i64(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut acc, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    acc
}

/// Arithmetic `op` on integers with i64 wrapping (wrap to a narrower dtype afterwards
/// with [`crate::round::wrap_int`]). `pow` with a negative exponent gives the exact power
/// truncated toward zero (1 for base 1, ±1 for base -1, else 0), where numpy raises.
///
/// `div` never reaches integers in a verified graph (it is true division); here it
/// truncates toward zero and gives 0 for a zero divisor, so the function is total.
/// Comparisons and logical ops give 1 or 0.
pub fn binary_i64(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::Pow => pow_i64(a, b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        _ => i64::from(compare_i64(op, a, b)),
    }
}

/// Comparison `op` on integers (bools compare as 0 < 1). Logical ops treat non-zero as
/// true; arithmetic ops give "result is non-zero".
pub fn compare_i64(op: BinaryOp, a: i64, b: i64) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        BinaryOp::And => a != 0 && b != 0,
        BinaryOp::Or => a != 0 || b != 0,
        _ => binary_i64(op, a, b) != 0,
    }
}

// ---------------------------------------------------------------------------------------
// Values by kind, and element-wise maps over them.
// ---------------------------------------------------------------------------------------

/// The elements of a tensor by kind: floats already rounded to their dtype, ints wrapped
/// to their width.
#[derive(Clone, Debug)]
enum Vals {
    F(Vec<f64>),
    I(Vec<i64>),
    B(Vec<bool>),
}

impl Vals {
    fn len(&self) -> usize {
        match self {
            Vals::F(v) => v.len(),
            Vals::I(v) => v.len(),
            Vals::B(v) => v.len(),
        }
    }

    fn from_storage(s: &Storage) -> Vals {
        match s {
            Storage::F16(v) => Vals::F(v.iter().map(|x| x.to_f64()).collect()),
            Storage::BF16(v) => Vals::F(v.iter().map(|x| x.to_f64()).collect()),
            Storage::F32(v) => Vals::F(v.iter().map(|&x| f64::from(x)).collect()),
            Storage::F64(v) => Vals::F(v.clone()),
            Storage::I32(v) => Vals::I(v.iter().map(|&x| i64::from(x)).collect()),
            Storage::I64(v) => Vals::I(v.clone()),
            Storage::Bool(v) => Vals::B(v.clone()),
        }
    }

    /// Storage of `dtype`; the values are already of that dtype, so nothing rounds.
    fn into_storage(self, dtype: DType) -> Storage {
        match self {
            Vals::F(v) => Storage::from_f64s(dtype, &v),
            Vals::I(v) => Storage::from_i64s(dtype, &v),
            Vals::B(v) => Storage::Bool(v),
        }
    }

    /// `len` copies of `value` converted to `dtype`, floats rounded to `round_to`.
    fn fill(value: Scalar, dtype: DType, round_to: DType, len: usize) -> Vals {
        match value.cast(dtype) {
            Scalar::F(x) => Vals::F(vec![round_f64(x, round_to); len]),
            Scalar::I(x) => Vals::I(vec![x; len]),
            Scalar::B(x) => Vals::B(vec![x; len]),
        }
    }

    /// The elements at `offsets`, in that order.
    fn gather(&self, offsets: impl Iterator<Item = usize>) -> Vals {
        match self {
            Vals::F(v) => Vals::F(offsets.map(|o| v[o]).collect()),
            Vals::I(v) => Vals::I(offsets.map(|o| v[o]).collect()),
            Vals::B(v) => Vals::B(offsets.map(|o| v[o]).collect()),
        }
    }

    /// Bools as 0/1 integers, for ops that treat them as numbers.
    fn bools_as_ints(v: &[bool]) -> Vec<i64> {
        v.iter().map(|&b| i64::from(b)).collect()
    }

    /// The values as f64 (ints converted exactly where they fit, bools 0/1).
    fn to_f64s(&self) -> Vec<f64> {
        match self {
            Vals::F(v) => v.clone(),
            Vals::I(v) => v.iter().map(|&x| x as f64).collect(),
            Vals::B(v) => v.iter().map(|&b| f64::from(u8::from(b))).collect(),
        }
    }
}

/// Unary `op` element-wise; floats rounded to `round_to`, ints wrapped to its width.
fn map_unary(op: UnaryOp, x: &Vals, round_to: DType) -> Vals {
    match x {
        Vals::F(v) => Vals::F(
            v.iter()
                .map(|&a| round_f64(unary_f64(op, a), round_to))
                .collect(),
        ),
        Vals::I(v) => Vals::I(
            v.iter()
                .map(|&a| wrap_int(unary_i64(op, a), round_to))
                .collect(),
        ),
        Vals::B(v) => Vals::B(
            v.iter()
                .map(|&a| unary_i64(op, i64::from(a)) != 0)
                .collect(),
        ),
    }
}

/// Binary `op` element-wise on operands of one kind; comparisons and logical ops give
/// bools, arithmetic keeps the kind (floats rounded to `round_to`, ints wrapped).
fn map_binary(op: BinaryOp, a: &Vals, b: &Vals, round_to: DType) -> Vals {
    let to_bool = op.is_comparison() || op.is_logical();
    match (a, b) {
        (Vals::F(x), Vals::F(y)) if to_bool => Vals::B(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| compare_f64(op, p, q))
                .collect(),
        ),
        (Vals::F(x), Vals::F(y)) => Vals::F(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| round_f64(binary_f64(op, p, q), round_to))
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) if to_bool => Vals::B(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| compare_i64(op, p, q))
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) => Vals::I(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| wrap_int(binary_i64(op, p, q), round_to))
                .collect(),
        ),
        (Vals::B(x), Vals::B(y)) => Vals::B(
            x.iter()
                .zip(y)
                .map(|(&p, &q)| compare_i64(op, i64::from(p), i64::from(q)))
                .collect(),
        ),
        _ => panic!(
            "{} on operands of different kinds passed validation (a bug)",
            op.name()
        ),
    }
}

/// `where(c, a, b)` element-wise.
fn select(c: &Vals, a: &Vals, b: &Vals) -> Vals {
    let Vals::B(c) = c else {
        panic!("a non-bool where condition passed validation (a bug)");
    };
    match (a, b) {
        (Vals::F(x), Vals::F(y)) => Vals::F(
            c.iter()
                .zip(x.iter().zip(y))
                .map(|(&k, (&p, &q))| if k { p } else { q })
                .collect(),
        ),
        (Vals::I(x), Vals::I(y)) => Vals::I(
            c.iter()
                .zip(x.iter().zip(y))
                .map(|(&k, (&p, &q))| if k { p } else { q })
                .collect(),
        ),
        (Vals::B(x), Vals::B(y)) => Vals::B(
            c.iter()
                .zip(x.iter().zip(y))
                .map(|(&k, (&p, &q))| if k { p } else { q })
                .collect(),
        ),
        _ => panic!("where branches of different kinds passed validation (a bug)"),
    }
}

/// Conversion to `to` with the rules of [`Scalar::cast`]; floats are rounded to
/// `round_to` (the target itself in a graph, its compute dtype in a kernel). Integers
/// convert to floats with one rounding ([`int_to_float`]).
fn cast(x: &Vals, to: DType, round_to: DType) -> Vals {
    use crate::dtype::DKind;
    match (x, to.kind()) {
        (Vals::F(v), DKind::Float) => Vals::F(v.iter().map(|&a| round_f64(a, round_to)).collect()),
        // `as i64` truncates toward zero, saturates and maps NaN to 0 (Scalar::cast).
        (Vals::F(v), DKind::Int) => Vals::I(v.iter().map(|&a| wrap_int(a as i64, to)).collect()),
        (Vals::F(v), DKind::Bool) => Vals::B(v.iter().map(|&a| a != 0.0).collect()),
        (Vals::I(v), DKind::Float) => {
            Vals::F(v.iter().map(|&a| int_to_float(a, round_to)).collect())
        }
        (Vals::I(v), DKind::Int) => Vals::I(v.iter().map(|&a| wrap_int(a, to)).collect()),
        (Vals::I(v), DKind::Bool) => Vals::B(v.iter().map(|&a| a != 0).collect()),
        (Vals::B(v), DKind::Float) => Vals::F(v.iter().map(|&a| f64::from(u8::from(a))).collect()),
        (Vals::B(v), DKind::Int) => Vals::I(Vals::bools_as_ints(v)),
        (Vals::B(v), DKind::Bool) => Vals::B(v.clone()),
    }
}

// ---------------------------------------------------------------------------------------
// Index maps.
// ---------------------------------------------------------------------------------------

/// Buffer offsets of the indices of `dims` in row-major order, under `strides` from
/// `base`: the index map of a view, walked with an odometer so each step is O(1)
/// amortised.
struct Offsets<'a> {
    dims: &'a [usize],
    strides: &'a [isize],
    index: Vec<usize>,
    cur: isize,
    left: usize,
}

impl<'a> Offsets<'a> {
    /// The offsets from row-major position `first` on.
    fn starting_at(dims: &'a [usize], strides: &'a [isize], base: isize, first: usize) -> Self {
        let numel: usize = dims.iter().product();
        let mut index = vec![0; dims.len()];
        let mut rest = first;
        for (i, &d) in index.iter_mut().zip(dims).rev() {
            if d > 0 {
                *i = rest % d;
                rest /= d;
            }
        }
        let cur = index
            .iter()
            .zip(strides)
            .fold(base, |acc, (&i, &s)| acc + i as isize * s);
        Offsets {
            dims,
            strides,
            index,
            cur,
            left: numel.saturating_sub(first),
        }
    }

    fn new(dims: &'a [usize], strides: &'a [isize], base: isize) -> Self {
        Offsets::starting_at(dims, strides, base, 0)
    }

    fn of_view(view: &'a View) -> Self {
        Offsets::new(view.shape.dims(), &view.strides, view.offset)
    }
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        let out = self.cur;
        self.left -= 1;
        if self.left > 0 {
            for d in (0..self.dims.len()).rev() {
                self.index[d] += 1;
                self.cur += self.strides[d];
                if self.index[d] < self.dims[d] {
                    break;
                }
                self.cur -= self.strides[d] * self.dims[d] as isize;
                self.index[d] = 0;
            }
        }
        Some(usize::try_from(out).expect("a checked view never reaches before its buffer (a bug)"))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// The view `op` makes of a contiguous operand of `shape`.
fn view_of(op: &ViewOp, shape: &Shape) -> View {
    let base = View::contiguous(shape.clone());
    match op {
        // A contiguous operand reshapes to the contiguous layout of the new shape.
        ViewOp::Reshape(to) => base
            .reshape(to)
            .unwrap_or_else(|| View::contiguous(to.clone())),
        ViewOp::Permute(perm) => base.permute(perm),
        ViewOp::Slice(slices) => base.slice(slices),
        ViewOp::BroadcastTo(to) => base.broadcast_to(to),
        ViewOp::ExpandDims(axis) => base.expand_dims(*axis),
        ViewOp::Squeeze(axes) => base.squeeze(axes),
    }
}

// ---------------------------------------------------------------------------------------
// Reductions.
// ---------------------------------------------------------------------------------------

/// Neumaier's compensated sum: the rounding error of each addition is carried in `c`.
/// It starts from +0.0, as a backend's accumulator does, so a sum of -0.0s is +0.0.
#[derive(Default)]
struct Neumaier {
    sum: f64,
    c: f64,
}

impl Neumaier {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.c += (self.sum - t) + x;
        } else {
            self.c += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn total(&self) -> f64 {
        // Once the sum is inf or NaN the compensation is inf - inf garbage; the plain
        // sum already has the IEEE answer.
        if self.sum.is_finite() {
            self.sum + self.c
        } else {
            self.sum
        }
    }

    fn of(xs: impl Iterator<Item = f64>) -> f64 {
        let mut s = Neumaier::default();
        xs.for_each(|x| s.add(x));
        s.total()
    }
}

/// sqrt(sum x^2), scaled by a power of two near max |x| so that the squares neither
/// overflow nor underflow; the scaling is exact.
fn norm2(lane: &[f64]) -> f64 {
    if lane.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let big = lane.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if big == f64::INFINITY || big == 0.0 {
        return big;
    }
    let k = (big.log2().floor() as i32).clamp(-1022, 1023);
    let scale = 2f64.powi(k);
    Neumaier::of(lane.iter().map(|&x| (x / scale) * (x / scale))).sqrt() * scale
}

/// Population variance, two passes: the mean, then the mean of squared deviations.
fn variance(lane: &[f64]) -> f64 {
    let n = lane.len() as f64;
    let mean = Neumaier::of(lane.iter().copied()) / n;
    Neumaier::of(lane.iter().map(|&x| (x - mean) * (x - mean))) / n
}

/// One float reduction of a lane (unrounded).
fn reduce_f64(op: ReduceOp, lane: &[f64]) -> f64 {
    let n = lane.len() as f64;
    match op {
        ReduceOp::Sum => Neumaier::of(lane.iter().copied()),
        // An empty lane is 0 / 0 = NaN.
        ReduceOp::Mean => Neumaier::of(lane.iter().copied()) / n,
        // Empty max/min is rejected when the graph is built; NaN is the honest value.
        ReduceOp::Max => lane.iter().copied().reduce(max_f64).unwrap_or(f64::NAN),
        ReduceOp::Min => lane.iter().copied().reduce(min_f64).unwrap_or(f64::NAN),
        ReduceOp::Prod => lane.iter().product(),
        ReduceOp::Norm1 => Neumaier::of(lane.iter().map(|x| x.abs())),
        ReduceOp::Norm2 => norm2(lane),
        ReduceOp::Var => variance(lane),
        ReduceOp::Std => variance(lane).sqrt(),
    }
}

/// One integer reduction of a lane (sum, prod, max, min), wrapping in i64.
fn reduce_i64(op: ReduceOp, lane: &[i64]) -> i64 {
    match op {
        ReduceOp::Prod => lane.iter().fold(1i64, |a, &x| a.wrapping_mul(x)),
        // Empty max/min is rejected when the graph is built.
        ReduceOp::Max => lane.iter().copied().max().unwrap_or(0),
        ReduceOp::Min => lane.iter().copied().min().unwrap_or(0),
        _ => lane.iter().fold(0i64, |a, &x| a.wrapping_add(x)),
    }
}

/// The kept and reduced parts of a contiguous layout of `dims`: (dims, strides) of the
/// axes not in `axes`, then of the axes in `axes`, each in axis order.
type Split = ((Vec<usize>, Vec<isize>), (Vec<usize>, Vec<isize>));

fn split_axes(shape: &Shape, axes: &[usize]) -> Split {
    let strides = shape.contiguous_strides();
    let (mut kept, mut red) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for (a, (&d, &s)) in shape.dims().iter().zip(&strides).enumerate() {
        let part = if axes.contains(&a) {
            &mut red
        } else {
            &mut kept
        };
        part.0.push(d);
        part.1.push(s);
    }
    (kept, red)
}

/// Reduces a contiguous tensor of `shape` over `axes`; output elements come in
/// row-major order of the kept axes (the same with or without keepdims).
fn reduce(op: ReduceOp, x: &Vals, shape: &Shape, axes: &[usize], out: DType) -> Vals {
    let ((kd, ks), (rd, rs)) = split_axes(shape, axes);
    // Offsets of a lane's elements from its first one, shared by every lane.
    let rel: Vec<usize> = Offsets::new(&rd, &rs, 0).collect();
    let int_path = matches!(
        op,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min
    );
    let ints: Option<Cow<'_, [i64]>> = match x {
        Vals::I(v) if int_path => Some(Cow::Borrowed(v)),
        Vals::B(v) if int_path => Some(Cow::Owned(Vals::bools_as_ints(v))),
        _ => None,
    };
    if let Some(v) = ints {
        let mut lane = Vec::new();
        let r = Offsets::new(&kd, &ks, 0)
            .map(|base| {
                lane.clear();
                lane.extend(rel.iter().map(|&o| v[base + o]));
                wrap_int(reduce_i64(op, &lane), out)
            })
            .collect();
        // Max/min of bools (never built) would come back as 0/1 ints: cast them.
        return cast(&Vals::I(r), out, out);
    }
    let v: Cow<'_, [f64]> = match x {
        Vals::F(v) => Cow::Borrowed(v),
        _ => Cow::Owned(x.to_f64s()),
    };
    let mut lane = Vec::new();
    let r = Offsets::new(&kd, &ks, 0)
        .map(|base| {
            lane.clear();
            lane.extend(rel.iter().map(|&o| v[base + o]));
            reduce_f64(op, &lane)
        })
        .collect();
    cast(&Vals::F(r), out, out)
}

/// Index of the first maximum (or minimum) of a lane, or of its first NaN.
fn arg_f64(op: ArgReduceOp, lane: impl Iterator<Item = f64>) -> i64 {
    let mut best: Option<(usize, f64)> = None;
    for (i, x) in lane.enumerate() {
        if x.is_nan() {
            return i as i64;
        }
        let better = match (best, op) {
            (None, _) => true,
            (Some((_, b)), ArgReduceOp::ArgMax) => x > b,
            (Some((_, b)), ArgReduceOp::ArgMin) => x < b,
        };
        if better {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as i64)
}

/// Index of the first maximum (or minimum) of a lane of integers.
fn arg_i64(op: ArgReduceOp, lane: impl Iterator<Item = i64>) -> i64 {
    let mut best: Option<(usize, i64)> = None;
    for (i, x) in lane.enumerate() {
        let better = match (best, op) {
            (None, _) => true,
            (Some((_, b)), ArgReduceOp::ArgMax) => x > b,
            (Some((_, b)), ArgReduceOp::ArgMin) => x < b,
        };
        if better {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as i64)
}

/// argmax/argmin of a contiguous tensor of `shape` along `axis`.
fn arg_reduce(op: ArgReduceOp, x: &Vals, shape: &Shape, axis: usize) -> Vals {
    let ((kd, ks), (rd, rs)) = split_axes(shape, &[axis]);
    let lanes = Offsets::new(&kd, &ks, 0);
    let rel: Vec<usize> = Offsets::new(&rd, &rs, 0).collect();
    let lane = |base: usize| rel.iter().map(move |&o| base + o);
    Vals::I(match x {
        Vals::F(v) => lanes.map(|b| arg_f64(op, lane(b).map(|o| v[o]))).collect(),
        Vals::I(v) => lanes.map(|b| arg_i64(op, lane(b).map(|o| v[o]))).collect(),
        Vals::B(v) => lanes
            .map(|b| arg_i64(op, lane(b).map(|o| i64::from(v[o]))))
            .collect(),
    })
}

// ---------------------------------------------------------------------------------------
// Graph evaluation.
// ---------------------------------------------------------------------------------------

/// A node's value: its dtype, shape and contiguous elements.
#[derive(Clone, Debug)]
struct Tensor {
    dtype: DType,
    shape: Shape,
    vals: Vals,
}

impl Tensor {
    fn from_host(a: &HostArray) -> Tensor {
        Tensor {
            dtype: a.dtype(),
            shape: a.shape().clone(),
            vals: Vals::from_storage(a.storage()),
        }
    }

    fn into_host(self) -> HostArray {
        HostArray::new(self.shape, self.vals.into_storage(self.dtype))
            .expect("the interpreter produces one value per element (a bug otherwise)")
    }
}

/// Computes a validated, non-input node from its operands' values.
fn compute(node: &Node, operands: &[&Tensor]) -> Tensor {
    let numel = node.shape.numel();
    let vals = match &node.op {
        Op::Input { name } => {
            panic!("input {name:?} is bound by eval, never computed (a bug in the caller)")
        }
        Op::Const { value } => Vals::fill(*value, node.dtype, node.dtype, numel),
        Op::Unary(u) => map_unary(*u, &operands[0].vals, node.dtype),
        Op::Binary(b) => map_binary(*b, &operands[0].vals, &operands[1].vals, operands[0].dtype),
        Op::Where => select(&operands[0].vals, &operands[1].vals, &operands[2].vals),
        Op::Cast { to } => cast(&operands[0].vals, *to, *to),
        Op::Reduce { op, axes, .. } => {
            reduce(*op, &operands[0].vals, &operands[0].shape, axes, node.dtype)
        }
        Op::ArgReduce { op, axis, .. } => {
            arg_reduce(*op, &operands[0].vals, &operands[0].shape, *axis)
        }
        Op::View(v) => {
            let view = view_of(v, &operands[0].shape);
            operands[0].vals.gather(Offsets::of_view(&view))
        }
    };
    debug_assert_eq!(
        vals.len(),
        numel,
        "{} produced a wrong element count (a bug)",
        node.op.name()
    );
    Tensor {
        dtype: node.dtype,
        shape: node.shape.clone(),
        vals,
    }
}

/// Evaluates the outputs of `graph`, in [`Graph::outputs`] order.
///
/// `inputs` binds every [`Op::Input`] node reachable from the outputs, by id; other
/// bindings are ignored. The graph is verified first. Only nodes reachable from the
/// outputs are evaluated, and each intermediate is freed once its last user ran.
///
/// ```
/// use std::collections::HashMap;
/// use ndfuse_ir::{interp::eval, DType, Graph, HostArray, Op, Shape, UnaryOp};
/// let mut g = Graph::new();
/// let x = g.add_input("x", DType::F32, Shape::new([2]));
/// let y = g.add(Op::Unary(UnaryOp::Square), &[x]).unwrap();
/// g.add_output(y);
/// let a = HostArray::from_f64s(DType::F32, Shape::new([2]), &[3.0, -0.5]);
/// let out = eval(&g, &HashMap::from([(x, a)])).unwrap();
/// assert_eq!(out[0].to_f64s(), vec![9.0, 0.25]);
/// ```
pub fn eval(
    graph: &Graph,
    inputs: &HashMap<NodeId, HostArray>,
) -> Result<Vec<HostArray>, InterpError> {
    verify(graph)?;
    let order = graph.live_nodes();
    // Uses left per node: one per distinct live user, as each user frees once.
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    let mut operands_of: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &id in &order {
        let ops = graph.operands(id);
        let mut distinct = ops.clone();
        distinct.sort_unstable();
        distinct.dedup();
        for o in distinct {
            *uses.entry(o).or_default() += 1;
        }
        operands_of.insert(id, ops);
    }
    // Check every binding before computing anything: a bad input fails fast.
    for &id in &order {
        let node = graph.node(id);
        if let Op::Input { name } = &node.op {
            let arr = inputs.get(&id).ok_or_else(|| InterpError::MissingInput {
                node: id,
                name: name.clone(),
            })?;
            if arr.dtype() != node.dtype || arr.shape() != &node.shape {
                return Err(InterpError::InputMismatch {
                    name: name.clone(),
                    expected: graph.ty(id),
                    got: TensorType {
                        dtype: arr.dtype(),
                        shape: arr.shape().clone(),
                    },
                });
            }
        }
    }
    let mut values: HashMap<NodeId, Tensor> = HashMap::new();
    for &id in &order {
        let node = graph.node(id);
        let ops = &operands_of[&id];
        let value = match &node.op {
            Op::Input { .. } => Tensor::from_host(&inputs[&id]),
            _ => {
                let args: Vec<&Tensor> = ops
                    .iter()
                    .map(|o| values.get(o).expect("operands come first in topological order and live until their last user (a bug)"))
                    .collect();
                compute(node, &args)
            }
        };
        values.insert(id, value);
        let mut distinct = ops.clone();
        distinct.sort_unstable();
        distinct.dedup();
        for o in distinct {
            let left = uses
                .get_mut(&o)
                .expect("every operand of a live node was counted");
            *left -= 1;
            if *left == 0 && !graph.is_output(o) {
                values.remove(&o);
            }
        }
    }
    let outputs = graph.outputs();
    Ok(outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            // The last listing of an output takes its value; earlier ones copy it.
            let value = if outputs[i + 1..].contains(o) {
                values.get(o).cloned()
            } else {
                values.remove(o)
            };
            value
                .expect("outputs are live and never freed (a bug)")
                .into_host()
        })
        .collect())
}

/// A verification failure of a lone node, for [`eval_node`].
fn invalid_node(message: String) -> InterpError {
    InterpError::Invalid(VerifyErrors(vec![VerifyError {
        node: None,
        message,
    }]))
}

/// Evaluates one non-input node given its operands as contiguous arrays (the runtime
/// uses this for ops a backend cannot run). For [`Op::Const`], `operands` is empty and
/// the node's dtype and shape say what to build.
///
/// The node is checked against its operands with [`crate::infer()`]; a mismatch, or an
/// input node, is [`InterpError::Invalid`].
pub fn eval_node(node: &Node, operands: &[&HostArray]) -> Result<HostArray, InterpError> {
    match &node.op {
        Op::Input { name } => {
            return Err(invalid_node(format!(
                "input {name:?} has no value to compute; bind it through eval"
            )))
        }
        Op::Const { .. } => {
            if !operands.is_empty() {
                return Err(invalid_node(format!(
                    "const takes 0 operands, got {}",
                    operands.len()
                )));
            }
        }
        op => {
            let types: Vec<TensorType> = operands
                .iter()
                .map(|a| TensorType {
                    dtype: a.dtype(),
                    shape: a.shape().clone(),
                })
                .collect();
            let t = infer(op, &types).map_err(|e| invalid_node(e.to_string()))?;
            if t.dtype != node.dtype || t.shape != node.shape {
                return Err(invalid_node(format!(
                    "{} is typed {}{} but its operands give {t}",
                    op.name(),
                    node.dtype,
                    node.shape
                )));
            }
        }
    }
    let args: Vec<Tensor> = operands.iter().map(|a| Tensor::from_host(a)).collect();
    let refs: Vec<&Tensor> = args.iter().collect();
    Ok(compute(node, &refs).into_host())
}

// ---------------------------------------------------------------------------------------
// Kernel evaluation.
// ---------------------------------------------------------------------------------------

/// Domain positions evaluated at a time: bounds memory to a chunk per SSA value.
const CHUNK: usize = 4096;

/// Checks the arrays against the kernel's buffers and the body's types (with the graph's
/// typing rules), returning what does not fit.
fn check_kernel(kernel: &Kernel, inputs: &[&HostArray]) -> Result<(), String> {
    if inputs.len() != kernel.inputs.len() {
        return Err(format!(
            "takes {} inputs, got {}",
            kernel.inputs.len(),
            inputs.len()
        ));
    }
    for (i, (a, b)) in inputs.iter().zip(&kernel.inputs).enumerate() {
        if a.dtype() != b.dtype || a.len() != b.len {
            return Err(format!(
                "in{i} must be {}[{}], got {} with {} elements",
                b.dtype,
                b.len,
                a.dtype(),
                a.len()
            ));
        }
    }
    kernel
        .check()
        .map_err(|errs| format!("malformed: {}", errs.join("; ")))
}

/// Evaluates a kernel description element by element. `inputs` are in
/// [`Kernel::inputs`] order; the result has one array per [`Kernel::outputs`], each
/// shaped like `kernel.domain`.
///
/// Kernel semantics differ from graph semantics in one way: every instruction's float
/// result is rounded to its dtype's [`DType::compute_dtype`] (f32 for f16/bf16, so half
/// math runs in f32), and to the storage dtype only when stored. f64 never rounds.
pub fn eval_kernel(kernel: &Kernel, inputs: &[&HostArray]) -> Result<Vec<HostArray>, InterpError> {
    check_kernel(kernel, inputs).map_err(|detail| InterpError::KernelArgs {
        kernel: kernel.name.clone(),
        detail,
    })?;
    let bufs: Vec<Vals> = inputs
        .iter()
        .map(|a| Vals::from_storage(a.storage()))
        .collect();
    if !kernel.reduce_axes.is_empty() {
        return Ok(eval_row_program(kernel, &bufs));
    }
    let n = kernel.domain.numel();
    let mut outs: Vec<Vals> = kernel
        .outputs
        .iter()
        .map(|b| match b.dtype.kind() {
            crate::dtype::DKind::Float => Vals::F(Vec::with_capacity(n)),
            crate::dtype::DKind::Int => Vals::I(Vec::with_capacity(n)),
            crate::dtype::DKind::Bool => Vals::B(Vec::with_capacity(n)),
        })
        .collect();
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        let mut vals: Vec<Vals> = Vec::with_capacity(kernel.body.len());
        for ins in &kernel.body {
            let v = eval_instr(kernel, ins, &vals, len, |input, view| {
                let offs =
                    Offsets::starting_at(view.shape.dims(), &view.strides, view.offset, start);
                bufs[input].gather(offs.take(len))
            });
            vals.push(v);
        }
        for s in &kernel.stores {
            let dtype = kernel.outputs[s.output].dtype;
            match (&mut outs[s.output], &vals[s.value.index()]) {
                (Vals::F(o), Vals::F(v)) => o.extend(v.iter().map(|&x| round_f64(x, dtype))),
                (Vals::I(o), Vals::I(v)) => o.extend(v.iter().map(|&x| wrap_int(x, dtype))),
                (Vals::B(o), Vals::B(v)) => o.extend_from_slice(v),
                _ => panic!("a store of another kind than its buffer passed Kernel::check (a bug)"),
            }
        }
        start += len;
    }
    Ok(outs
        .into_iter()
        .zip(&kernel.outputs)
        .map(|(v, b)| {
            Tensor {
                dtype: b.dtype,
                shape: kernel.domain.clone(),
                vals: v,
            }
            .into_host()
        })
        .collect())
}

/// One instruction of a kernel over `width` positions (a chunk of the domain, or one
/// row with row values replicated along it); `load` gathers an input through a view.
/// Reductions combine the whole vector: only the row program may have them.
fn eval_instr(
    kernel: &Kernel,
    ins: &crate::kernel::Instr,
    vals: &[Vals],
    width: usize,
    load: impl FnOnce(usize, &View) -> Vals,
) -> Vals {
    let round_to = ins.dtype.compute_dtype();
    match &ins.expr {
        Expr::Load { input, view } => load(*input, view),
        Expr::Const(c) => Vals::fill(*c, ins.dtype, round_to, width),
        Expr::Unary(u, a) => map_unary(*u, &vals[a.index()], round_to),
        Expr::Binary(b, x, y) => {
            // A comparison's dtype is bool; its operands' dtype decides the math.
            let round_to = kernel.body[x.index()].dtype.compute_dtype();
            map_binary(*b, &vals[x.index()], &vals[y.index()], round_to)
        }
        Expr::Where(c, a, b) => select(&vals[c.index()], &vals[a.index()], &vals[b.index()]),
        // An explicit cast asks for the target's precision, even to a half type.
        Expr::Cast(a) => cast(&vals[a.index()], ins.dtype, ins.dtype),
        Expr::Reduce(acc, a) => {
            let op = match acc {
                crate::kernel::Accumulate::Sum => ReduceOp::Sum,
                crate::kernel::Accumulate::Prod => ReduceOp::Prod,
                crate::kernel::Accumulate::Max => ReduceOp::Max,
                crate::kernel::Accumulate::Min => ReduceOp::Min,
            };
            match &vals[a.index()] {
                Vals::F(lane) => Vals::F(vec![round_f64(reduce_f64(op, lane), round_to); width]),
                Vals::I(lane) => Vals::I(vec![wrap_int(reduce_i64(op, lane), ins.dtype); width]),
                Vals::B(_) => unreachable!("Kernel::check refuses bool reductions"),
            }
        }
        Expr::ArgReduce(op, a) => {
            let idx = match &vals[a.index()] {
                Vals::F(lane) => arg_f64(*op, lane.iter().copied()),
                Vals::I(lane) => arg_i64(*op, lane.iter().copied()),
                Vals::B(lane) => arg_i64(*op, lane.iter().map(|&b| i64::from(b))),
            };
            Vals::I(vec![idx; width])
        }
    }
}

/// [`eval_kernel`] for a kernel with reduce axes: the row program of the kernel docs, one
/// row at a time. Row values are kept replicated along the row, so the element-wise maps
/// apply unchanged; reductions combine in f64 (sums compensated) and round once to the
/// instruction's compute dtype, as a kernel rounds its accumulator once.
fn eval_row_program(kernel: &Kernel, bufs: &[Vals]) -> Vec<HostArray> {
    use crate::kernel::Level;
    let dims = kernel.domain.dims();
    let kept: Vec<usize> = (0..dims.len())
        .filter(|a| !kernel.reduce_axes.contains(a))
        .collect();
    // Domain axes reordered kept-first: position r * row_len + j is element j of row r.
    let perm: Vec<usize> = kept.iter().chain(&kernel.reduce_axes).copied().collect();
    let (rows, row_len) = (kernel.rows(), kernel.row_len());
    let width = row_len.max(1);
    let levels = kernel.levels();
    let views: Vec<Option<View>> = kernel
        .body
        .iter()
        .map(|ins| match &ins.expr {
            Expr::Load { view, .. } => Some(view.permute(&perm)),
            _ => None,
        })
        .collect();
    let out_view = View::contiguous(kernel.domain.clone()).permute(&perm);
    let mut outs: Vec<Vals> = kernel
        .stores
        .iter()
        .map(|st| {
            let b = &kernel.outputs[st.output];
            let len = b.len;
            match b.dtype.kind() {
                crate::dtype::DKind::Float => Vals::F(vec![0.0; len]),
                crate::dtype::DKind::Int => Vals::I(vec![0; len]),
                crate::dtype::DKind::Bool => Vals::B(vec![false; len]),
            }
        })
        .collect();
    for r in 0..rows {
        let first = r * row_len;
        let mut vals: Vec<Vals> = Vec::with_capacity(kernel.body.len());
        for (i, ins) in kernel.body.iter().enumerate() {
            let v = eval_instr(kernel, ins, &vals, width, |input, _| {
                let view = views[i].as_ref().expect("loads have views");
                if row_len == 0 {
                    Vals::fill(Scalar::I(0), ins.dtype, ins.dtype, 0)
                } else {
                    let offs =
                        Offsets::starting_at(view.shape.dims(), &view.strides, view.offset, first);
                    bufs[input].gather(offs.take(row_len))
                }
            });
            vals.push(v);
        }
        for (k, st) in kernel.stores.iter().enumerate() {
            let dtype = kernel.outputs[st.output].dtype;
            let v = &vals[st.value.index()];
            // The buffer's length says whether it takes every position or one per row.
            let per_row =
                levels[st.value.index()] == Level::Row && kernel.outputs[st.output].len == rows;
            let positions: Vec<usize> = if per_row {
                vec![r]
            } else {
                Offsets::starting_at(out_view.shape.dims(), &out_view.strides, 0, first)
                    .take(row_len)
                    .collect()
            };
            match (&mut outs[k], v) {
                (Vals::F(o), Vals::F(v)) => positions
                    .iter()
                    .zip(v)
                    .for_each(|(&p, &x)| o[p] = round_f64(x, dtype)),
                (Vals::I(o), Vals::I(v)) => positions
                    .iter()
                    .zip(v)
                    .for_each(|(&p, &x)| o[p] = wrap_int(x, dtype)),
                (Vals::B(o), Vals::B(v)) => positions.iter().zip(v).for_each(|(&p, &x)| o[p] = x),
                _ => panic!("a store of another kind than its buffer passed Kernel::check (a bug)"),
            }
        }
    }
    // Outputs in `kernel.outputs` order (each is stored exactly once).
    let mut by_output: Vec<Option<HostArray>> = vec![None; kernel.outputs.len()];
    for (st, v) in kernel.stores.iter().zip(outs) {
        let b = &kernel.outputs[st.output];
        let shape = Shape::new([b.len]);
        by_output[st.output] = Some(
            Tensor {
                dtype: b.dtype,
                shape,
                vals: v,
            }
            .into_host(),
        );
    }
    by_output
        .into_iter()
        .map(|o| o.expect("every output is stored once (Kernel::check)"))
        .collect()
}
