//! Every op as a `Tensor` method and through `std::ops`. This is where numpy's implicit
//! rules become explicit IR: type promotion inserts casts, broadcasting inserts
//! `broadcast_to` views, negative axes are normalised, and integer operands of
//! float-valued ops are cast to f64 (as numpy does).

use crate::tensor::Tensor;
use ndfuse_ir::{
    ArgReduceOp, AxisSlice, BinaryOp, DType, IntList, IrError, Op, ReduceOp, Scalar, Shape,
    TensorType, UnaryOp, ViewOp,
};
use std::panic::Location;

/// The right-hand side of a binary op: a tensor or a scalar literal. Literals are weak
/// (numpy's NEP 50): `x * 2.0` keeps `x`'s dtype.
#[derive(Clone, Debug)]
pub enum Operand {
    /// A tensor.
    Tensor(Tensor),
    /// A literal.
    Scalar(Scalar),
}

macro_rules! operand_from {
    ($($t:ty => |$v:ident| $e:expr),* $(,)?) => {$(
        impl From<$t> for Operand {
            fn from($v: $t) -> Operand { $e }
        }
    )*};
}
operand_from! {
    Tensor => |t| Operand::Tensor(t),
    &Tensor => |t| Operand::Tensor(t.clone()),
    f64 => |v| Operand::Scalar(Scalar::F(v)),
    f32 => |v| Operand::Scalar(Scalar::F(f64::from(v))),
    i64 => |v| Operand::Scalar(Scalar::I(v)),
    i32 => |v| Operand::Scalar(Scalar::I(i64::from(v))),
    bool => |v| Operand::Scalar(Scalar::B(v)),
}

/// Which axes a reduction covers: `..` for all of them, or a list (negative counts
/// from the end). An empty list reduces nothing, as numpy's `axis=()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Axes {
    /// Every axis.
    All,
    /// These axes.
    These(Vec<i64>),
}

impl From<std::ops::RangeFull> for Axes {
    fn from(_: std::ops::RangeFull) -> Axes {
        Axes::All
    }
}
impl From<i64> for Axes {
    fn from(a: i64) -> Axes {
        Axes::These(vec![a])
    }
}
impl From<i32> for Axes {
    fn from(a: i32) -> Axes {
        Axes::These(vec![i64::from(a)])
    }
}
impl From<&[i64]> for Axes {
    fn from(a: &[i64]) -> Axes {
        Axes::These(a.to_vec())
    }
}
impl<const N: usize> From<&[i64; N]> for Axes {
    fn from(a: &[i64; N]) -> Axes {
        Axes::These(a.to_vec())
    }
}
impl<const N: usize> From<[i64; N]> for Axes {
    fn from(a: [i64; N]) -> Axes {
        Axes::These(a.to_vec())
    }
}
impl From<Vec<i64>> for Axes {
    fn from(a: Vec<i64>) -> Axes {
        Axes::These(a)
    }
}

/// One axis of a slice, Python style: `start:stop:step` with optional bounds and
/// negative indices counting from the end. Ranges convert: `(1..9).into()`, `(..).into()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceArg {
    /// First index (default: the start, or the end for a negative step).
    pub start: Option<i64>,
    /// One past the last index (default: past the end in the step's direction).
    pub stop: Option<i64>,
    /// Distance between indices; not zero.
    pub step: i64,
}

impl SliceArg {
    /// `start:stop:step`.
    pub fn new(start: Option<i64>, stop: Option<i64>, step: i64) -> SliceArg {
        SliceArg { start, stop, step }
    }

    /// `:` — the whole axis.
    pub fn all() -> SliceArg {
        SliceArg::new(None, None, 1)
    }

    /// The same bounds with another step: `SliceArg::from(1..9).step(2)` is `1:9:2`.
    pub fn step(self, step: i64) -> SliceArg {
        SliceArg { step, ..self }
    }
}

impl From<std::ops::Range<i64>> for SliceArg {
    fn from(r: std::ops::Range<i64>) -> SliceArg {
        SliceArg::new(Some(r.start), Some(r.end), 1)
    }
}
impl From<std::ops::RangeFrom<i64>> for SliceArg {
    fn from(r: std::ops::RangeFrom<i64>) -> SliceArg {
        SliceArg::new(Some(r.start), None, 1)
    }
}
impl From<std::ops::RangeTo<i64>> for SliceArg {
    fn from(r: std::ops::RangeTo<i64>) -> SliceArg {
        SliceArg::new(None, Some(r.end), 1)
    }
}
impl From<std::ops::RangeFull> for SliceArg {
    fn from(_: std::ops::RangeFull) -> SliceArg {
        SliceArg::all()
    }
}

const BOOL_ARITH: &str = "bool has no arithmetic; cast it to a number first";

/// Normalises one axis (`-1` is the last) against `rank` positions.
pub(crate) fn norm_axis(
    op: &'static str,
    axis: i64,
    rank: usize,
    x: &TensorType,
) -> Result<usize, IrError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(IrError::AxisOutOfRange {
            op,
            axis,
            operand: x.clone(),
        })
    }
}

/// Normalises, sorts and checks a list of axes.
fn norm_axes(op: &'static str, axes: &Axes, x: &TensorType) -> Result<Vec<usize>, IrError> {
    let rank = x.shape.rank();
    let mut out = match axes {
        Axes::All => (0..rank).collect(),
        Axes::These(list) => list
            .iter()
            .map(|&a| norm_axis(op, a, rank, x))
            .collect::<Result<Vec<_>, _>>()?,
    };
    out.sort_unstable();
    if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
        return Err(IrError::DuplicateAxis {
            op,
            axis: w[0],
            operand: x.clone(),
        });
    }
    Ok(out)
}

/// The dtype a binary op computes in, from the operand types (numpy's promotion, with
/// weak literals); `Err` names the offending operand.
fn binary_dtype(
    op: BinaryOp,
    l: (&Operand, DType),
    r: (&Operand, DType),
) -> Result<DType, IrError> {
    let weak = |o: &Operand| matches!(o, Operand::Scalar(_));
    let ((lo, ld), (ro, rd)) = (l, r);
    let bad = |d: DType| IrError::BadDType {
        op: op.name(),
        operand: TensorType {
            dtype: d,
            shape: Shape::scalar(),
        },
        why: BOOL_ARITH,
    };
    if op.is_logical() {
        // Logical ops never promote: non-bool operands are reported by inference.
        return Ok(if ld == DType::Bool { rd } else { ld });
    }
    // A weak literal adopts the tensor's dtype when the kinds agree; a float literal
    // with an integer tensor gives f64 (numpy).
    let d = match (weak(lo), weak(ro)) {
        (false, true) | (true, false) => {
            let (td, sd) = if weak(ro) { (ld, rd) } else { (rd, ld) };
            match (td.kind(), sd.kind()) {
                (_, _) if td == DType::Bool && sd == DType::Bool => DType::Bool,
                (ndfuse_ir::DKind::Bool, _) => return Err(bad(td)),
                (_, ndfuse_ir::DKind::Bool) => return Err(bad(sd)),
                (ndfuse_ir::DKind::Int, ndfuse_ir::DKind::Float) => DType::F64,
                _ => td,
            }
        }
        _ => {
            let p = if op.is_comparison() {
                DType::promote_compare(ld, rd)
            } else {
                DType::promote(ld, rd)
            };
            p.ok_or_else(|| bad(if ld == DType::Bool { ld } else { rd }))?
        }
    };
    if d == DType::Bool && !op.is_comparison() {
        return Err(bad(d));
    }
    Ok(match op {
        // `/` is true division.
        BinaryOp::Div if d.is_int() => DType::F64,
        _ => d,
    })
}

impl Tensor {
    fn to_operand_tensor(&self, o: &Operand, dtype: DType, shape: &Shape) -> Tensor {
        match o {
            Operand::Tensor(t) => t.clone(),
            Operand::Scalar(s) => Tensor::constant(&self.ctx, *s, dtype, shape.clone()),
        }
    }

    /// Applies a binary op with numpy broadcasting and promotion (`lhs` or `rhs` may be
    /// a literal, not both).
    fn binary_any(
        lhs: Operand,
        rhs: Operand,
        op: BinaryOp,
        at: &'static Location<'static>,
    ) -> Tensor {
        let anchor = match (&lhs, &rhs) {
            (Operand::Tensor(t), _) | (_, Operand::Tensor(t)) => t.clone(),
            _ => unreachable!("a binary op has a tensor operand (the API only builds such)"),
        };
        let ty = |o: &Operand| -> Result<Option<TensorType>, crate::Error> {
            match o {
                Operand::Tensor(t) => t.ty().map(Some),
                Operand::Scalar(_) => Ok(None),
            }
        };
        let (lt, rt) = match (ty(&lhs), ty(&rhs)) {
            (Ok(l), Ok(r)) => (l, r),
            (Err(e), _) | (_, Err(e)) => return Tensor::poisoned(&anchor.ctx, e),
        };
        let scalar_dtype = |s: &Operand| match s {
            Operand::Scalar(Scalar::F(_)) => DType::F64,
            Operand::Scalar(Scalar::I(_)) => DType::I64,
            _ => DType::Bool,
        };
        let ld = lt.as_ref().map_or_else(|| scalar_dtype(&lhs), |t| t.dtype);
        let rd = rt.as_ref().map_or_else(|| scalar_dtype(&rhs), |t| t.dtype);
        let dtype = match binary_dtype(op, (&lhs, ld), (&rhs, rd)) {
            Ok(d) => d,
            Err(IrError::BadDType { op, why, .. }) => {
                // Name the real operand (with its shape) rather than the bare dtype.
                let operand = [&lt, &rt]
                    .into_iter()
                    .flatten()
                    .find(|t| t.dtype == DType::Bool)
                    .cloned()
                    .or_else(|| lt.clone())
                    .or_else(|| rt.clone())
                    .expect("one operand is a tensor");
                return anchor.fail(IrError::BadDType { op, operand, why }, at);
            }
            Err(e) => return anchor.fail(e, at),
        };
        let shape = match (&lt, &rt) {
            (Some(l), Some(r)) => match Shape::broadcast(&l.shape, &r.shape) {
                Some(s) => s,
                None => {
                    return anchor.fail(
                        IrError::Broadcast {
                            op: op.name(),
                            lhs: l.clone(),
                            rhs: r.clone(),
                        },
                        at,
                    )
                }
            },
            (Some(t), None) | (None, Some(t)) => t.shape.clone(),
            (None, None) => unreachable!("a binary op has a tensor operand"),
        };
        // Logical ops keep their operands' dtypes so inference reports non-bools.
        let cast_to = if op.is_logical() { None } else { Some(dtype) };
        let prep = |o: &Operand| -> Tensor {
            let t = anchor.to_operand_tensor(o, dtype, &shape);
            let t = match cast_to {
                Some(d) => t.cast_at(d, at),
                None => t,
            };
            t.broadcast_at(&shape, at)
        };
        let (l, r) = (prep(&lhs), prep(&rhs));
        Tensor::build(Op::Binary(op), &[&l, &r], at)
    }

    fn binary(
        &self,
        rhs: impl Into<Operand>,
        op: BinaryOp,
        at: &'static Location<'static>,
    ) -> Tensor {
        Tensor::binary_any(Operand::Tensor(self.clone()), rhs.into(), op, at)
    }

    pub(crate) fn cast_at(&self, dtype: DType, at: &'static Location<'static>) -> Tensor {
        match self.dtype() {
            Ok(d) if d == dtype => self.clone(),
            _ => Tensor::build(Op::Cast { to: dtype }, &[self], at),
        }
    }

    pub(crate) fn broadcast_at(&self, shape: &Shape, at: &'static Location<'static>) -> Tensor {
        match self.expr() {
            Ok(e) if &e.shape == shape => self.clone(),
            _ => Tensor::build(Op::View(ViewOp::BroadcastTo(shape.clone())), &[self], at),
        }
    }

    fn unary(&self, op: UnaryOp, at: &'static Location<'static>) -> Tensor {
        // numpy computes float functions of integers in f64.
        let x = match self.dtype() {
            Ok(d) if d.is_int() && op.is_float_only() => self.cast_at(DType::F64, at),
            _ => self.clone(),
        };
        Tensor::build(Op::Unary(op), &[&x], at)
    }

    fn reduce_at(
        &self,
        op: ReduceOp,
        axes: Axes,
        keepdims: bool,
        at: &'static Location<'static>,
    ) -> Tensor {
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let axes = match norm_axes(op.name(), &axes, &ty) {
            Ok(a) => a,
            Err(e) => return self.fail(e, at),
        };
        let float_valued = !matches!(
            op,
            ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min
        );
        let x = if float_valued && ty.dtype.is_int() {
            self.cast_at(DType::F64, at)
        } else {
            self.clone()
        };
        Tensor::build(Op::Reduce { op, axes, keepdims }, &[&x], at)
    }

    fn arg_reduce_at(
        &self,
        op: ArgReduceOp,
        axis: i64,
        keepdims: bool,
        at: &'static Location<'static>,
    ) -> Tensor {
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        match norm_axis(op.name(), axis, ty.shape.rank(), &ty) {
            Ok(axis) => Tensor::build(Op::ArgReduce { op, axis, keepdims }, &[self], at),
            Err(e) => self.fail(e, at),
        }
    }

    pub(crate) fn view(&self, v: ViewOp, at: &'static Location<'static>) -> Tensor {
        Tensor::build(Op::View(v), &[self], at)
    }

    // ----- binary -----

    /// `self + rhs` with broadcasting.
    #[track_caller]
    pub fn add(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Add, Location::caller())
    }
    /// `self - rhs` with broadcasting.
    #[track_caller]
    pub fn sub(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Sub, Location::caller())
    }
    /// `self * rhs` with broadcasting.
    #[track_caller]
    pub fn mul(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Mul, Location::caller())
    }
    /// `self / rhs`, true division (integers give f64).
    #[track_caller]
    pub fn div(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Div, Location::caller())
    }
    /// `self ** rhs`.
    #[track_caller]
    pub fn pow(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Pow, Location::caller())
    }
    /// Element-wise maximum, NaN-propagating (numpy's `maximum`).
    #[track_caller]
    pub fn maximum(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Max, Location::caller())
    }
    /// Element-wise minimum, NaN-propagating (numpy's `minimum`).
    #[track_caller]
    pub fn minimum(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Min, Location::caller())
    }
    /// `self == rhs` -> bool.
    #[track_caller]
    pub fn eq(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Eq, Location::caller())
    }
    /// `self != rhs` -> bool.
    #[track_caller]
    pub fn ne(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Ne, Location::caller())
    }
    /// `self < rhs` -> bool.
    #[track_caller]
    pub fn lt(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Lt, Location::caller())
    }
    /// `self <= rhs` -> bool.
    #[track_caller]
    pub fn le(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Le, Location::caller())
    }
    /// `self > rhs` -> bool.
    #[track_caller]
    pub fn gt(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Gt, Location::caller())
    }
    /// `self >= rhs` -> bool.
    #[track_caller]
    pub fn ge(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Ge, Location::caller())
    }
    /// Logical and of bool tensors.
    #[track_caller]
    pub fn and(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::And, Location::caller())
    }
    /// Logical or of bool tensors.
    #[track_caller]
    pub fn or(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary(rhs, BinaryOp::Or, Location::caller())
    }

    /// `where(self, a, b)`: `a` where this bool tensor is true, else `b`, broadcasting
    /// all three; `a` and `b` promote like arithmetic (two bools stay bool).
    #[track_caller]
    pub fn where_(&self, a: impl Into<Operand>, b: impl Into<Operand>) -> Tensor {
        let at = Location::caller();
        let (a, b) = (a.into(), b.into());
        // Promotion and broadcasting of the branches reuse the comparison rules, which
        // also accept two bools.
        let probe = |o: &Operand| -> Option<TensorType> {
            match o {
                Operand::Tensor(t) => t.ty().ok(),
                Operand::Scalar(_) => None,
            }
        };
        for o in [&a, &b] {
            if let Operand::Tensor(t) = o {
                if let Err(e) = t.ty() {
                    return Tensor::poisoned(&self.ctx, e);
                }
            }
        }
        let cond = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let sd = |o: &Operand, other: Option<&TensorType>| match (o, other) {
            (Operand::Tensor(t), _) => t.dtype().ok(),
            (Operand::Scalar(s), Some(t)) => match (s, t.dtype.kind()) {
                (Scalar::F(_), ndfuse_ir::DKind::Int) => Some(DType::F64),
                (Scalar::B(_), k) if k != ndfuse_ir::DKind::Bool => None,
                (Scalar::F(_) | Scalar::I(_), ndfuse_ir::DKind::Bool) => None,
                _ => Some(t.dtype),
            },
            (Operand::Scalar(s), None) => Some(match s {
                Scalar::F(_) => self.ctx.default_dtype(),
                Scalar::I(_) => DType::I64,
                Scalar::B(_) => DType::Bool,
            }),
        };
        let (pa, pb) = (probe(&a), probe(&b));
        let dtype = match (sd(&a, pb.as_ref()), sd(&b, pa.as_ref())) {
            (Some(x), Some(y)) => DType::promote_compare(x, y),
            _ => None,
        };
        let Some(dtype) = dtype else {
            let operand = pa.or(pb).unwrap_or(cond);
            return self.fail(
                IrError::BadDType {
                    op: "where",
                    operand,
                    why: "the two branches have no common dtype (bool mixes only with bool)",
                },
                at,
            );
        };
        let mut shape = cond.shape.clone();
        for t in [&pa, &pb].into_iter().flatten() {
            match Shape::broadcast(&shape, &t.shape) {
                Some(s) => shape = s,
                None => {
                    return self.fail(
                        IrError::Broadcast {
                            op: "where",
                            lhs: TensorType {
                                dtype: cond.dtype,
                                shape,
                            },
                            rhs: t.clone(),
                        },
                        at,
                    )
                }
            }
        }
        let prep = |o: &Operand| {
            self.to_operand_tensor(o, dtype, &shape)
                .cast_at(dtype, at)
                .broadcast_at(&shape, at)
        };
        let (ta, tb) = (prep(&a), prep(&b));
        let c = self.broadcast_at(&shape, at);
        Tensor::build(Op::Where, &[&c, &ta, &tb], at)
    }

    /// Conversion to `dtype` (floats to ints truncate toward zero and saturate, NaN
    /// becomes 0; anything to bool is `!= 0`).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        self.cast_at(dtype, Location::caller())
    }

    // ----- views -----

    /// The same elements with a new shape; one dim may be `-1` (inferred).
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Tensor {
        let at = Location::caller();
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let err = |why| {
            self.fail(
                IrError::Reshape {
                    from: ty.clone(),
                    to: IntList(shape.to_vec()),
                    why,
                },
                at,
            )
        };
        if shape.iter().filter(|&&d| d == -1).count() > 1 {
            return err("at most one dim may be -1");
        }
        if shape.iter().any(|&d| d < -1) {
            return err("dims must be >= 0 (or -1 for one inferred dim)");
        }
        let known: usize = shape
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let n = ty.shape.numel();
        let dims: Vec<usize> = if shape.contains(&-1) {
            if known == 0 || n % known != 0 {
                return err("the -1 dim cannot be inferred");
            }
            shape
                .iter()
                .map(|&d| if d == -1 { n / known } else { d as usize })
                .collect()
        } else {
            shape.iter().map(|&d| d as usize).collect()
        };
        if dims.iter().product::<usize>() != n {
            return err("element counts differ");
        }
        self.view(ViewOp::Reshape(Shape(dims)), at)
    }

    /// Reorders axes: axis `i` of the result is axis `perm[i]` (negative allowed).
    #[track_caller]
    pub fn permute(&self, perm: &[i64]) -> Tensor {
        let at = Location::caller();
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let rank = ty.shape.rank() as i64;
        let p: Option<Vec<usize>> = perm
            .iter()
            .map(|&a| {
                let a = if a < 0 { a + rank } else { a };
                (0..rank).contains(&a).then_some(a as usize)
            })
            .collect();
        match p {
            Some(p) => self.view(ViewOp::Permute(p), at),
            None => self.fail(
                IrError::BadPermutation {
                    perm: IntList(perm.to_vec()),
                    operand: ty,
                },
                at,
            ),
        }
    }

    /// All axes reversed (numpy's `.T`).
    #[track_caller]
    pub fn transpose(&self) -> Tensor {
        let at = Location::caller();
        match self.rank() {
            Ok(r) => self.view(ViewOp::Permute((0..r).rev().collect()), at),
            Err(e) => Tensor::poisoned(&self.ctx, e),
        }
    }

    /// Python slicing, one [`SliceArg`] per leading axis (missing trailing axes are
    /// taken whole). Negative steps reverse.
    #[track_caller]
    pub fn slice(&self, args: &[SliceArg]) -> Tensor {
        let at = Location::caller();
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let dims = ty.shape.dims();
        if args.len() > dims.len() {
            return self.fail(
                IrError::BadSlice {
                    why: format!("{} slices given for {} axes", args.len(), dims.len()),
                    operand: ty,
                },
                at,
            );
        }
        let mut slices = Vec::with_capacity(dims.len());
        for (axis, &dim) in dims.iter().enumerate() {
            let a = args.get(axis).copied().unwrap_or_else(SliceArg::all);
            match AxisSlice::normalize(dim, a.start, a.stop, a.step) {
                Some(s) => slices.push(s),
                None => {
                    return self.fail(
                        IrError::BadSlice {
                            why: format!("step 0 on axis {axis}"),
                            operand: ty,
                        },
                        at,
                    )
                }
            }
        }
        self.view(ViewOp::Slice(slices), at)
    }

    /// numpy's `broadcast_to`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Tensor {
        self.view(ViewOp::BroadcastTo(Shape::from(shape)), Location::caller())
    }

    /// A new size-1 axis at `axis` (`-1` appends).
    #[track_caller]
    pub fn expand_dims(&self, axis: i64) -> Tensor {
        let at = Location::caller();
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        match norm_axis("expand_dims", axis, ty.shape.rank() + 1, &ty) {
            Ok(a) => self.view(ViewOp::ExpandDims(a), at),
            Err(e) => self.fail(e, at),
        }
    }

    /// Removes the given size-1 axes.
    #[track_caller]
    pub fn squeeze(&self, axes: &[i64]) -> Tensor {
        let at = Location::caller();
        let ty = match self.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        match norm_axes("squeeze", &Axes::These(axes.to_vec()), &ty) {
            Ok(a) => self.view(ViewOp::Squeeze(a), at),
            Err(e) => self.fail(e, at),
        }
    }

    /// Removes every size-1 axis.
    #[track_caller]
    pub fn squeeze_all(&self) -> Tensor {
        let at = Location::caller();
        match self.expr() {
            Ok(e) => {
                let ones = (0..e.shape.rank())
                    .filter(|&i| e.shape.dims()[i] == 1)
                    .collect();
                self.view(ViewOp::Squeeze(ones), at)
            }
            Err(e) => Tensor::poisoned(&self.ctx, e),
        }
    }

    // ----- index reductions -----

    /// Index of the first maximum along `axis` (i64); the first NaN wins, as numpy.
    #[track_caller]
    pub fn argmax(&self, axis: i64) -> Tensor {
        self.arg_reduce_at(ArgReduceOp::ArgMax, axis, false, Location::caller())
    }
    /// [`Tensor::argmax`] keeping `axis` with extent 1.
    #[track_caller]
    pub fn argmax_keepdims(&self, axis: i64) -> Tensor {
        self.arg_reduce_at(ArgReduceOp::ArgMax, axis, true, Location::caller())
    }
    /// Index of the first minimum along `axis` (i64); the first NaN wins, as numpy.
    #[track_caller]
    pub fn argmin(&self, axis: i64) -> Tensor {
        self.arg_reduce_at(ArgReduceOp::ArgMin, axis, false, Location::caller())
    }
    /// [`Tensor::argmin`] keeping `axis` with extent 1.
    #[track_caller]
    pub fn argmin_keepdims(&self, axis: i64) -> Tensor {
        self.arg_reduce_at(ArgReduceOp::ArgMin, axis, true, Location::caller())
    }

    /// Any reduction over `axes` (`..` for all), keeping them as size-1 axes or not.
    #[track_caller]
    pub fn reduce(&self, op: ReduceOp, axes: impl Into<Axes>, keepdims: bool) -> Tensor {
        self.reduce_at(op, axes.into(), keepdims, Location::caller())
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self) -> Tensor {
                self.unary(UnaryOp::$op, Location::caller())
            }
        )*}
    };
}
unary_methods! {
    /// `-x`
    neg => Neg,
    /// `|x|`
    abs => Abs,
    /// -1, 0 or 1 with the sign of x (keeps ±0 and NaN).
    sign => Sign,
    /// `e^x`
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    /// `log(1 + x)`, accurate near 0.
    log1p => Log1p,
    /// `e^x - 1`, accurate near 0.
    expm1 => Expm1,
    /// Square root.
    sqrt => Sqrt,
    /// `1 / sqrt(x)`
    rsqrt => Rsqrt,
    /// `x * x`
    square => Square,
    /// `1 / x`
    recip => Recip,
    /// Sine.
    sin => Sin,
    /// Cosine.
    cos => Cos,
    /// Hyperbolic tangent.
    tanh => Tanh,
    /// `1 / (1 + e^-x)`
    sigmoid => Sigmoid,
    /// `maximum(x, 0)`
    relu => Relu,
    /// The error function.
    erf => Erf,
    /// Round toward -inf.
    floor => Floor,
    /// Round toward +inf.
    ceil => Ceil,
    /// Round half to even (numpy's `round`).
    round => Round,
    /// Logical not of a bool tensor.
    logical_not => Not,
}

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident, $keep:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self, axes: impl Into<Axes>) -> Tensor {
                self.reduce_at(ReduceOp::$op, axes.into(), false, Location::caller())
            }
            /// The same reduction, keeping the reduced axes with extent 1.
            #[track_caller]
            pub fn $keep(&self, axes: impl Into<Axes>) -> Tensor {
                self.reduce_at(ReduceOp::$op, axes.into(), true, Location::caller())
            }
        )*}
    };
}
reduce_methods! {
    /// Sum over `axes` (`..` for all; integers accumulate in i64).
    sum, sum_keepdims => Sum,
    /// Arithmetic mean over `axes`.
    mean, mean_keepdims => Mean,
    /// Maximum over `axes`, NaN-propagating.
    max, max_keepdims => Max,
    /// Minimum over `axes`, NaN-propagating.
    min, min_keepdims => Min,
    /// Product over `axes`.
    prod, prod_keepdims => Prod,
    /// Sum of absolute values over `axes`.
    norm1, norm1_keepdims => Norm1,
    /// Euclidean norm over `axes`.
    norm2, norm2_keepdims => Norm2,
    /// Population variance (ddof = 0) over `axes`.
    var, var_keepdims => Var,
    /// Population standard deviation (ddof = 0) over `axes`.
    std, std_keepdims => Std,
}

// ----- std::ops -----

macro_rules! std_binary {
    ($($trait:ident :: $method:ident => $op:ident),* $(,)?) => {$(
        impl<R: Into<Operand>> std::ops::$trait<R> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                self.binary(rhs, BinaryOp::$op, Location::caller())
            }
        }
        impl<R: Into<Operand>> std::ops::$trait<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                self.binary(rhs, BinaryOp::$op, Location::caller())
            }
        }
        // Literals on the left: one float and one integer type, so that `1.0 - &x` and
        // `2 * &x` infer their literal type (two float impls would make it ambiguous).
        std_binary!(@lit $trait :: $method => $op; f64, i64);
    )*};
    (@lit $trait:ident :: $method:ident => $op:ident; $($lit:ty),*) => {$(
        impl std::ops::$trait<&Tensor> for $lit {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::binary_any(self.into(), Operand::Tensor(rhs.clone()), BinaryOp::$op, Location::caller())
            }
        }
        impl std::ops::$trait<Tensor> for $lit {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::binary_any(self.into(), Operand::Tensor(rhs), BinaryOp::$op, Location::caller())
            }
        }
    )*};
}
std_binary! {
    Add::add => Add,
    Sub::sub => Sub,
    Mul::mul => Mul,
    Div::div => Div,
}

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg, Location::caller())
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg, Location::caller())
    }
}

/// `where(cond, a, b)` as a free function (numpy spelling).
#[track_caller]
pub fn where_(cond: &Tensor, a: impl Into<Operand>, b: impl Into<Operand>) -> Tensor {
    cond.where_(a, b)
}
