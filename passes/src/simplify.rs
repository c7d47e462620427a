//! Algebraic simplification: a table of local rewrite rules, one match arm each, run
//! to a fixed point. Only rules that are exact for every input under IEEE 754 and the
//! interpreter's integer semantics are here: `x + 0.0` is not (`-0 + +0 = +0`), nor is
//! `x * 0.0` (`NaN * 0 = NaN`, `-1 * 0 = -0`), nor `x - x` (`inf - inf = NaN`).
//! Every rule is checked by a test that evaluates the graph before and after on inputs
//! including NaN, ±inf and ±0.

use crate::pass::{Pass, PassCx, PassError};
use crate::rewrite::{const_value, run_to_fixed_point, sole_operand, Rewrite};
use ndfuse_ir::{BinaryOp as B, DType, Graph, NodeId, Op, Scalar, UnaryOp as U};

/// Removes identities and cancelling pairs with exact rewrite rules.
#[derive(Clone, Copy, Debug, Default)]
pub struct Simplify;

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, g: &mut Graph, cx: &PassCx) -> Result<bool, PassError> {
        run_to_fixed_point(g, cx, self.name(), simplify_node)
    }
}

/// The rule table. Constants are uniform fills of the node's dtype, so "is the constant
/// 1" is a question about one scalar; `Scalar` equality is bitwise (`-0.0 != 0.0`).
fn simplify_node(g: &Graph, id: NodeId) -> Option<Rewrite> {
    use Rewrite::{New, Use};
    let is = |c: NodeId, want: Scalar| const_value(g, c) == Some(want);
    let one = |c: NodeId| is(c, Scalar::F(1.0)) || is(c, Scalar::I(1));
    let unary = |n: NodeId| match g.node(n).op {
        Op::Unary(u) => Some(u),
        _ => None,
    };
    let node = g.node(id);
    let operands = g.operands(id);
    let rewrite = match (&node.op, operands.as_slice()) {
        // x * 1 => x
        (Op::Binary(B::Mul), &[x, c]) if one(c) => Use(x),
        // 1 * x => x
        (Op::Binary(B::Mul), &[c, x]) if one(c) => Use(x),
        // x / 1 => x
        (Op::Binary(B::Div), &[x, c]) if one(c) => Use(x),
        // x ** 1 => x   (IEEE pow(x, 1) is x, NaN and ±0 included)
        (Op::Binary(B::Pow), &[x, c]) if one(c) => Use(x),
        // x - (+0.0) => x   (-0 - +0 = -0; but x - (-0.0) is not: -0 - -0 = +0)
        (Op::Binary(B::Sub), &[x, c]) if is(c, Scalar::F(0.0)) => Use(x),
        // x + (-0.0) => x   (+0 + -0 = +0; but x + (+0.0) is not: -0 + +0 = +0)
        (Op::Binary(B::Add), &[x, c]) if is(c, Scalar::F(-0.0)) => Use(x),
        // (-0.0) + x => x
        (Op::Binary(B::Add), &[c, x]) if is(c, Scalar::F(-0.0)) => Use(x),
        // x + 0 => x   (integers have no signed zero)
        (Op::Binary(B::Add), &[x, c]) if is(c, Scalar::I(0)) => Use(x),
        // 0 + x => x   (integers)
        (Op::Binary(B::Add), &[c, x]) if is(c, Scalar::I(0)) => Use(x),
        // x - 0 => x   (integers)
        (Op::Binary(B::Sub), &[x, c]) if is(c, Scalar::I(0)) => Use(x),
        // x * 0 => 0   (integers only: for floats NaN * 0 = NaN and -1 * 0 = -0)
        (Op::Binary(B::Mul), &[_, c]) if is(c, Scalar::I(0)) => Use(c),
        // 0 * x => 0   (integers only)
        (Op::Binary(B::Mul), &[c, _]) if is(c, Scalar::I(0)) => Use(c),
        // maximum(x, x) => x   (a NaN stays a NaN; ±0 is returned as it is)
        (Op::Binary(B::Max), &[x, y]) if x == y => Use(x),
        // minimum(x, x) => x
        (Op::Binary(B::Min), &[x, y]) if x == y => Use(x),
        // x and x => x
        (Op::Binary(B::And), &[x, y]) if x == y => Use(x),
        // x or x => x
        (Op::Binary(B::Or), &[x, y]) if x == y => Use(x),
        // where(c, x, x) => x
        (Op::Where, &[_, x, y]) if x == y => Use(x),
        // where(true, a, b) => a
        (Op::Where, &[c, a, _]) if is(c, Scalar::B(true)) => Use(a),
        // where(false, a, b) => b
        (Op::Where, &[c, _, b]) if is(c, Scalar::B(false)) => Use(b),
        // neg(neg x) => x   (a sign flip twice; integer wrapping undoes itself too)
        (Op::Unary(U::Neg), &[n]) if unary(n) == Some(U::Neg) => Use(sole_operand(g, n)?),
        // not(not x) => x
        (Op::Unary(U::Not), &[n]) if unary(n) == Some(U::Not) => Use(sole_operand(g, n)?),
        // abs(abs x) => abs x
        (Op::Unary(U::Abs), &[n]) if unary(n) == Some(U::Abs) => Use(n),
        // abs(neg x) => abs x   (integers too: both wrap MIN to MIN)
        (Op::Unary(U::Abs), &[n]) if unary(n) == Some(U::Neg) => {
            New(Op::Unary(U::Abs), vec![sole_operand(g, n)?])
        }
        // cast(x: T -> T) => x
        (Op::Cast { to }, &[x]) if g.node(x).dtype == *to => Use(x),
        // cast(cast(x: T -> W) -> T) => x   when W holds every value of T
        (Op::Cast { to }, &[w]) if exact_widening(g, w).is_some_and(|x| g.node(x).dtype == *to) => {
            Use(exact_widening(g, w)?)
        }
        // cast(cast(x: T -> W) -> V) => cast(x -> V)   when W holds every value of T
        (Op::Cast { to }, &[w]) if exact_widening(g, w).is_some() => {
            New(Op::Cast { to: *to }, vec![exact_widening(g, w)?])
        }
        _ => return None,
    };
    Some(rewrite)
}

/// `x` when `w = cast(x)` to a dtype that holds every value of `x`'s dtype exactly: the
/// cast is then the identity on values, and a cast after it sees `x`'s own values.
fn exact_widening(g: &Graph, w: NodeId) -> Option<NodeId> {
    let Op::Cast { to: wide } = g.node(w).op else {
        return None;
    };
    let x = sole_operand(g, w)?;
    holds(wide, g.node(x).dtype).then_some(x)
}

/// Whether every value of `narrow` converts to `wide` and back unchanged.
fn holds(wide: DType, narrow: DType) -> bool {
    use DType::*;
    match (narrow, wide) {
        (t, w) if t == w => true,
        // false and true are 0 and 1 in every dtype.
        (Bool, _) => true,
        // Fewer exponent and mantissa bits in both (f16 and bf16 do not hold each other).
        (F16 | BF16, F32 | F64) | (F32, F64) => true,
        // 32 bits fit in i64 and in f64's 53-bit significand; i64 fits no float.
        (I32, I64 | F64) => true,
        _ => false,
    }
}
