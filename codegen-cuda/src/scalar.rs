//! CUDA C text for one value of a kernel body: types, literals, loads and stores with
//! their conversions, every unary / binary op, casts, and the small device helpers they
//! need (emitted into a kernel's source only when it uses them).
//!
//! Semantics follow the reference interpreter (`ndfuse_ir::interp`) op for op:
//! - integers wrap (the arithmetic is done in the unsigned type, where C defines it);
//!   integer division by zero gives 0 and `MIN / -1` gives `MIN`;
//! - `max` / `min` propagate NaN and prefer `+0` / `-0` on equal zeros;
//! - float to int casts saturate to i64 with NaN to 0, then wrap to the target width;
//! - a cast to a half type rounds to that type (`__float2half_rn`, `__ll2half_rn`, ...);
//!   other half values are computed in f32 and rounded only when stored.
//!
//! Math functions. f64 values use CUDA's double functions; f32 and half values use the
//! single-precision ones. Their maximum errors, from the CUDA C++ Programming Guide
//! ("Mathematical Functions", full-range, default `-ftz=false -prec-div=true
//! -prec-sqrt=true`), against the correctly rounded f32 result the reference gives:
//!
//! | op                      | f32 max ulp | f64 max ulp |
//! |-------------------------|-------------|-------------|
//! | add sub mul div sqrt    | 0 (IEEE)    | 0 (IEEE)    |
//! | exp                     | 2           | 1           |
//! | log, log1p, expm1       | 1           | 1           |
//! | sin, cos                | 2           | 2           |
//! | tanh                    | 2           | 1           |
//! | erf                     | 2           | 2           |
//! | pow                     | 4           | 2           |
//! | rsqrt = 1 / sqrt(x)     | 1 (two IEEE steps) | 1    |
//! | sigmoid (exp, add, div) | 4           | 3           |
//! | floor ceil round abs    | 0           | 0           |
//!
//! Half values (f16, bf16) take `exp` and `sigmoid` from the fast intrinsics: `__expf`
//! (at most `2 + floor(1.173 |x|)` ulp of f32; `|x| <= 104` before the result leaves
//! f32's range, so under 2^-15 relative) and `__fdividef` (2 ulp). Half rounding's unit
//! is 2^-11 (f16) or 2^-8 (bf16): the result still lands within one half ulp step of the
//! reference, the budget of the full-precision functions, at a third of their
//! instructions (seen on an H100: f16 gelu at 2^26 elements was compute-bound, 63% of
//! the copy bandwidth, with `expf` and an IEEE division).
//!
//! Kernels are compiled with `--fmad=false`, so `a * b + c` rounds twice as the
//! reference does instead of being contracted into one FMA: element-wise arithmetic is
//! bit-identical to the reference and only the functions above may differ.

use ndfuse_ir::{BinaryOp, DKind, DType, Scalar, UnaryOp};
use std::collections::BTreeSet;

/// Device helpers a kernel's source may need; emitted in this order before the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Helper {
    /// NaN-propagating max / min for float and double.
    MaxMin,
    /// Overflow-safe logistic function.
    Sigmoid,
    /// The logistic function of a half value, from the fast intrinsics.
    SigmoidHalf,
    /// Saturating float to i64 conversion (NaN to 0).
    F2I,
    /// Integer division total over every divisor.
    IntDiv,
    /// Integer power by squaring.
    IntPow,
    /// Aligned 16-byte vectors for vectorised loads and stores.
    Vec4,
    /// Arg-reduction comparison and combining.
    Arg,
    /// `random_uniform`'s counter-based hash.
    Random,
    /// A gather's index, wrapped once when negative and clamped into its axis.
    GatherIndex,
}

/// The helpers' source, in [`Helper`] order.
pub(crate) fn helper_source(needs: &BTreeSet<Helper>) -> String {
    let mut s = String::new();
    for h in needs {
        s.push_str(match h {
            Helper::MaxMin => {
                "// max / min as the reference: NaN if either is NaN; +0 beats -0 for max.\n\
__device__ __forceinline__ float nd_maxf(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : a > b ? a : b > a ? b : signbit(a) ? b : a; }\n\
__device__ __forceinline__ float nd_minf(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : a < b ? a : b < a ? b : signbit(a) ? a : b; }\n\
__device__ __forceinline__ double nd_max(double a, double b) { return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000LL) : a > b ? a : b > a ? b : signbit(a) ? b : a; }\n\
__device__ __forceinline__ double nd_min(double a, double b) { return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000LL) : a < b ? a : b < a ? b : signbit(a) ? a : b; }\n"
            }
            Helper::Sigmoid => {
                "// e^x / (1 + e^x) for x < 0 keeps the tiny results 1 / (1 + e^-x) loses.\n\
__device__ __forceinline__ float nd_sigmoidf(float x) { if (x >= 0.0f) return 1.0f / (1.0f + expf(-x)); float e = expf(x); return e / (1.0f + e); }\n\
__device__ __forceinline__ double nd_sigmoid(double x) { if (x >= 0.0) return 1.0 / (1.0 + exp(-x)); double e = exp(x); return e / (1.0 + e); }\n"
            }
            Helper::SigmoidHalf => {
                "// Half values: e = e^-|x| in (0, 1], so 1 + e in (1, 2] suits __fdividef; e / (1 + e) for x < 0.\n\
__device__ __forceinline__ float nd_sigmoidh(float x) { const float e = __expf(-fabsf(x)); const float r = __fdividef(1.0f, 1.0f + e); return x >= 0.0f ? r : e * r; }\n"
            }
            Helper::F2I => {
                "// float to i64: saturating, NaN to 0 (the reference's cast rule).\n\
__device__ __forceinline__ long long nd_f2ll(double x) { return x != x ? 0LL : x >= 9223372036854775807.0 ? 9223372036854775807LL : x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1) : (long long)x; }\n"
            }
            Helper::IntDiv => {
                "// integer division: 0 for a zero divisor, MIN / -1 wraps to MIN.\n\
__device__ __forceinline__ int nd_div_i32(int a, int b) { return b == 0 ? 0 : (b == -1 ? (int)(0u - (unsigned)a) : a / b); }\n\
__device__ __forceinline__ long long nd_div_i64(long long a, long long b) { return b == 0 ? 0LL : (b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b); }\n"
            }
            Helper::IntPow => {
                "// integer power: wrapping, by squaring; a negative exponent truncates the exact power.\n\
__device__ __forceinline__ long long nd_pow_i64(long long b, long long e) {\n\
  if (e < 0) return b == 1 ? 1LL : b == -1 ? ((e & 1) ? -1LL : 1LL) : 0LL;\n\
  unsigned long long acc = 1ull, x = (unsigned long long)b, k = (unsigned long long)e;\n\
  while (k) { if (k & 1ull) acc *= x; x *= x; k >>= 1; }\n\
  return (long long)acc;\n\
}\n"
            }
            Helper::Vec4 => {
                "// N consecutive elements (16 bytes), loaded and stored as one aligned access.\n\
template <typename T, int N> struct __align__(N * sizeof(T)) nd_vec { T v[N]; };\n"
            }
            Helper::Arg => {
                "// arg-reductions: (value, index) pairs, index -1 for none yet; the first NaN,\n\
// else the first extreme, wins, whatever order partial results combine in.\n\
template <typename T> __device__ __forceinline__ bool nd_isnan(T x) { return x != x; }\n\
template <bool MAX, typename T> __device__ __forceinline__ bool nd_arg_better(T x, long long i, T y, long long j) {\n\
  if (j < 0) return i >= 0;\n\
  if (i < 0) return false;\n\
  bool xn = nd_isnan(x), yn = nd_isnan(y);\n\
  if (xn || yn) return xn && (!yn || i < j);\n\
  if (MAX ? x > y : x < y) return true;\n\
  return x == y && i < j;\n\
}\n"
            }
            Helper::Random => {
                "// random_uniform (ndfuse_ir::op::random_bits): lowbias32 mixes of the key and the\n\
// element's own row-major index i; (bits >> 8) * 2^-24 is exact in float.\n\
__device__ __forceinline__ unsigned nd_mix32(unsigned x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x; }\n\
__device__ __forceinline__ float nd_random_uniform(long long key, long long i) {\n\
\x20 const unsigned long long k = (unsigned long long)key, c = (unsigned long long)i;\n\
\x20 const unsigned h = nd_mix32((unsigned)k ^ nd_mix32((unsigned)(k >> 32) ^ nd_mix32((unsigned)(c >> 32) ^ 0x9e3779b9u)));\n\
\x20 const unsigned bits = nd_mix32(nd_mix32((unsigned)c ^ h) + h);\n\
\x20 return (float)(bits >> 8) * 5.9604644775390625e-8f;\n\
}\n"
            }
            Helper::GatherIndex => {
                "// a gather's index k along an axis of n: k + n when negative, then clamped to 0..n-1,\n\
// so that no index, checked or not, reads outside the buffer.\n\
__device__ __forceinline__ long long nd_gather_index(long long k, long long n) { k = k < 0 ? k + n : k; return k < 0 ? 0LL : k >= n ? n - 1 : k; }\n"
            }
        });
    }
    s
}

/// The C type a buffer of `d` holds.
pub(crate) fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "bool",
    }
}

/// The C type values of `d` are computed in (half types in f32).
pub(crate) fn compute_type(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "bool",
    }
}

/// The unsigned type integer arithmetic of `d` wraps in.
fn unsigned_type(d: DType) -> &'static str {
    match d {
        DType::I32 => "unsigned",
        _ => "unsigned long long",
    }
}

/// `random_uniform`'s value for i64 `key` at the op's own row-major position `index`
/// (an `nd_idx` expression): the interpreter's bits.
pub(crate) fn random(key: &str, index: &str, needs: &mut BTreeSet<Helper>) -> String {
    needs.insert(Helper::Random);
    format!("nd_random_uniform({key}, (long long)({index}))")
}

/// The i64 value of a position: `index`, an `nd_idx` expression, widened.
pub(crate) fn position(index: &str) -> String {
    format!("(long long)({index})")
}

/// The term `k * stride` a gather adds to its offset for an axis of `extent`, `k` being
/// the index value `index` (an i32 or i64 expression) wrapped and clamped into the axis,
/// as an `nd_idx` expression.
pub(crate) fn gather_term(
    index: &str,
    extent: usize,
    stride: isize,
    needs: &mut BTreeSet<Helper>,
) -> String {
    needs.insert(Helper::GatherIndex);
    let k = format!("(nd_idx)nd_gather_index({index}, {extent})");
    match stride {
        1 => k,
        s => format!("{k} * {s}"),
    }
}

/// `x`, a stored element of `d`, as its compute type.
pub(crate) fn load_conv(d: DType, x: &str) -> String {
    match d {
        DType::F16 => format!("__half2float({x})"),
        DType::BF16 => format!("__bfloat162float({x})"),
        _ => x.to_string(),
    }
}

/// `x`, a compute value of `d`, as a stored element (rounded once for half types).
pub(crate) fn store_conv(d: DType, x: &str) -> String {
    match d {
        DType::F16 => format!("__float2half_rn({x})"),
        DType::BF16 => format!("__float2bfloat16_rn({x})"),
        _ => x.to_string(),
    }
}

/// Whether a kernel using `d` needs `cuda_fp16.h` / `cuda_bf16.h`.
pub(crate) fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

fn f32_lit(x: f32) -> String {
    if x.is_finite() {
        let s = format!("{x:?}f");
        if x.is_sign_negative() {
            format!("({s})")
        } else {
            s
        }
    } else {
        format!("__int_as_float(0x{:08x})", x.to_bits())
    }
}

fn f64_lit(x: f64) -> String {
    if x.is_finite() {
        let s = format!("{x:?}");
        if x.is_sign_negative() {
            format!("({s})")
        } else {
            s
        }
    } else {
        format!("__longlong_as_double(0x{:016x}LL)", x.to_bits())
    }
}

/// A literal of `d`'s compute type holding `c` (already of dtype `d`), exactly.
pub(crate) fn literal(c: Scalar, d: DType) -> String {
    match (c.cast(d), d.kind()) {
        (Scalar::F(x), _) if d == DType::F64 => f64_lit(x),
        // f32 and the half types (whose values f32 holds exactly).
        (Scalar::F(x), _) => f32_lit(x as f32),
        (Scalar::I(v), _) if d == DType::I32 => {
            if v == i64::from(i32::MIN) {
                "(-2147483647 - 1)".into()
            } else if v < 0 {
                format!("({v})")
            } else {
                v.to_string()
            }
        }
        (Scalar::I(v), _) => {
            if v == i64::MIN {
                "(-9223372036854775807LL - 1)".into()
            } else if v < 0 {
                format!("({v}LL)")
            } else {
                format!("{v}LL")
            }
        }
        (Scalar::B(b), _) => if b { "true" } else { "false" }.into(),
    }
}

/// The identity literal of a reduction over values of `d` (compute type).
pub(crate) fn identity(op: ndfuse_ir::Accumulate, d: DType) -> String {
    use ndfuse_ir::Accumulate as A;
    let f = |x: f64| literal(Scalar::F(x), if d == DType::F64 { d } else { DType::F32 });
    match (op, d.kind()) {
        (A::Sum, DKind::Float) => f(0.0),
        (A::Prod, DKind::Float) => f(1.0),
        (A::Max, DKind::Float) => f(f64::NEG_INFINITY),
        (A::Min, DKind::Float) => f(f64::INFINITY),
        (A::Sum, _) => literal(Scalar::I(0), int_or_i32(d)),
        (A::Prod, _) => literal(Scalar::I(1), int_or_i32(d)),
        (A::Max, _) if d == DType::Bool => "false".into(),
        (A::Min, _) if d == DType::Bool => "true".into(),
        (A::Max, _) => literal(
            Scalar::I(if d == DType::I32 {
                i64::from(i32::MIN)
            } else {
                i64::MIN
            }),
            d,
        ),
        (A::Min, _) => literal(
            Scalar::I(if d == DType::I32 {
                i64::from(i32::MAX)
            } else {
                i64::MAX
            }),
            d,
        ),
    }
}

fn int_or_i32(d: DType) -> DType {
    if d == DType::Bool {
        DType::I32
    } else {
        d
    }
}

/// `acc (+) x` for a reduction accumulator of `d`'s compute type.
pub(crate) fn accumulate(
    op: ndfuse_ir::Accumulate,
    d: DType,
    acc: &str,
    x: &str,
    needs: &mut BTreeSet<Helper>,
) -> String {
    use ndfuse_ir::Accumulate as A;
    let float = d.kind() == DKind::Float;
    let suffix = if d == DType::F64 { "" } else { "f" };
    match op {
        A::Sum | A::Prod if float => {
            format!("{acc} {} {x}", if op == A::Sum { "+" } else { "*" })
        }
        A::Sum | A::Prod if d == DType::Bool => {
            // Not produced by the passes (bool sums are cast first); total anyway.
            if op == A::Sum {
                format!("{acc} || {x}")
            } else {
                format!("{acc} && {x}")
            }
        }
        A::Sum | A::Prod => {
            let u = unsigned_type(d);
            let t = compute_type(d);
            format!(
                "({t})(({u}){acc} {} ({u}){x})",
                if op == A::Sum { "+" } else { "*" }
            )
        }
        A::Max | A::Min if float => {
            needs.insert(Helper::MaxMin);
            format!(
                "nd_{}{suffix}({acc}, {x})",
                if op == A::Max { "max" } else { "min" }
            )
        }
        A::Max => format!("({x} > {acc} ? {x} : {acc})"),
        A::Min => format!("({x} < {acc} ? {x} : {acc})"),
    }
}

/// The expression of a unary op on `a` (of dtype `d`), giving `out`'s compute type.
pub(crate) fn unary(
    op: UnaryOp,
    d: DType,
    out: DType,
    a: &str,
    needs: &mut BTreeSet<Helper>,
) -> String {
    match d.kind() {
        DKind::Float => {
            let dbl = d == DType::F64;
            // Half values take the fast exp (see the module docs).
            let half = matches!(d, DType::F16 | DType::BF16);
            let (f, one, zero) = if dbl {
                ("", "1.0", "0.0")
            } else {
                ("f", "1.0f", "0.0f")
            };
            match op {
                UnaryOp::Neg => format!("(-{a})"),
                UnaryOp::Abs => format!("fabs{f}({a})"),
                UnaryOp::Sign => {
                    format!("({a} > {zero} ? {one} : {a} < {zero} ? -{one} : {a})")
                }
                UnaryOp::Exp if half => format!("__expf({a})"),
                UnaryOp::Exp => format!("exp{f}({a})"),
                UnaryOp::Log => format!("log{f}({a})"),
                UnaryOp::Log1p => format!("log1p{f}({a})"),
                UnaryOp::Expm1 => format!("expm1{f}({a})"),
                UnaryOp::Sqrt => format!("sqrt{f}({a})"),
                UnaryOp::Rsqrt => format!("({one} / sqrt{f}({a}))"),
                UnaryOp::Square => format!("({a} * {a})"),
                UnaryOp::Recip => format!("({one} / {a})"),
                UnaryOp::Sin => format!("sin{f}({a})"),
                UnaryOp::Cos => format!("cos{f}({a})"),
                UnaryOp::Tanh => format!("tanh{f}({a})"),
                UnaryOp::Sigmoid if half => {
                    needs.insert(Helper::SigmoidHalf);
                    format!("nd_sigmoidh({a})")
                }
                UnaryOp::Sigmoid => {
                    needs.insert(Helper::Sigmoid);
                    format!("nd_sigmoid{f}({a})")
                }
                UnaryOp::Relu => format!("(({a} > {zero} || {a} != {a}) ? {a} : {zero})"),
                UnaryOp::Erf => format!("erf{f}({a})"),
                UnaryOp::Floor => format!("floor{f}({a})"),
                UnaryOp::Ceil => format!("ceil{f}({a})"),
                UnaryOp::Round => format!("rint{f}({a})"),
                UnaryOp::Not => format!("({a} == {zero})"),
            }
        }
        DKind::Int => {
            let t = compute_type(d);
            let u = unsigned_type(d);
            match op {
                UnaryOp::Neg => format!("({t})(0u - ({u}){a})"),
                UnaryOp::Abs => format!("({a} < 0 ? ({t})(0u - ({u}){a}) : {a})"),
                UnaryOp::Sign => format!("({t})(({a} > 0) - ({a} < 0))"),
                UnaryOp::Square => format!("({t})(({u}){a} * ({u}){a})"),
                UnaryOp::Relu => format!("({a} > 0 ? {a} : ({t})0)"),
                UnaryOp::Not => format!("({a} == 0)"),
                // The reference goes through f64 and casts back (saturating).
                _ => {
                    let x = unary(op, DType::F64, DType::F64, &format!("(double){a}"), needs);
                    float_to_int(&x, out, needs)
                }
            }
        }
        DKind::Bool => match op {
            UnaryOp::Not => format!("(!{a})"),
            UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Square => a.to_string(),
            _ => {
                let x = unary(op, DType::I32, DType::I32, &format!("(int){a}"), needs);
                format!("({x} != 0)")
            }
        },
    }
}

/// `x` (a double or float expression) cast to integer dtype `to` by the reference's rule.
fn float_to_int(x: &str, to: DType, needs: &mut BTreeSet<Helper>) -> String {
    needs.insert(Helper::F2I);
    match to {
        DType::I32 => format!("(int)nd_f2ll({x})"),
        DType::Bool => format!("(nd_f2ll({x}) != 0)"),
        _ => format!("nd_f2ll({x})"),
    }
}

/// The expression of `a op b` (both of dtype `d`).
pub(crate) fn binary(
    op: BinaryOp,
    d: DType,
    a: &str,
    b: &str,
    needs: &mut BTreeSet<Helper>,
) -> String {
    let cmp = |sym: &str| format!("({a} {sym} {b})");
    match op {
        BinaryOp::Eq => return cmp("=="),
        BinaryOp::Ne => return cmp("!="),
        BinaryOp::Lt => return cmp("<"),
        BinaryOp::Le => return cmp("<="),
        BinaryOp::Gt => return cmp(">"),
        BinaryOp::Ge => return cmp(">="),
        BinaryOp::And => return format!("(({a}) != 0 && ({b}) != 0)"),
        BinaryOp::Or => return format!("(({a}) != 0 || ({b}) != 0)"),
        _ => {}
    }
    match d.kind() {
        DKind::Float => {
            let f = if d == DType::F64 { "" } else { "f" };
            match op {
                BinaryOp::Add => cmp("+"),
                BinaryOp::Sub => cmp("-"),
                BinaryOp::Mul => cmp("*"),
                BinaryOp::Div => cmp("/"),
                BinaryOp::Pow => format!("pow{f}({a}, {b})"),
                BinaryOp::Max => {
                    needs.insert(Helper::MaxMin);
                    format!("nd_max{f}({a}, {b})")
                }
                BinaryOp::Min => {
                    needs.insert(Helper::MaxMin);
                    format!("nd_min{f}({a}, {b})")
                }
                _ => unreachable!("comparisons returned above"),
            }
        }
        DKind::Int => {
            let t = compute_type(d);
            let u = unsigned_type(d);
            let wrap = |sym: &str| format!("({t})(({u}){a} {sym} ({u}){b})");
            match op {
                BinaryOp::Add => wrap("+"),
                BinaryOp::Sub => wrap("-"),
                BinaryOp::Mul => wrap("*"),
                BinaryOp::Div => {
                    needs.insert(Helper::IntDiv);
                    let w = if d == DType::I32 { "i32" } else { "i64" };
                    format!("nd_div_{w}({a}, {b})")
                }
                BinaryOp::Pow => {
                    needs.insert(Helper::IntPow);
                    format!("({t})nd_pow_i64({a}, {b})")
                }
                BinaryOp::Max => format!("({a} > {b} ? {a} : {b})"),
                BinaryOp::Min => format!("({a} < {b} ? {a} : {b})"),
                _ => unreachable!("comparisons returned above"),
            }
        }
        DKind::Bool => match op {
            BinaryOp::Max | BinaryOp::Add => format!("({a} || {b})"),
            BinaryOp::Min | BinaryOp::Mul => format!("({a} && {b})"),
            BinaryOp::Sub => format!("({a} != {b})"),
            _ => {
                let x = binary(
                    op,
                    DType::I32,
                    &format!("(int){a}"),
                    &format!("(int){b}"),
                    needs,
                );
                format!("({x} != 0)")
            }
        },
    }
}

/// `a` (of dtype `from`) converted to dtype `to` by the reference's cast rules, as
/// `to`'s compute type. A cast to a half type rounds to it.
pub(crate) fn cast(from: DType, to: DType, a: &str, needs: &mut BTreeSet<Helper>) -> String {
    if from == to {
        return a.to_string();
    }
    match (from.kind(), to.kind()) {
        (_, DKind::Bool) => format!("({a} != 0)"),
        (DKind::Float, DKind::Int) => float_to_int(&format!("(double){a}"), to, needs),
        (DKind::Float, DKind::Float) => match to {
            DType::F16 if from == DType::F64 => format!("__half2float(__double2half({a}))"),
            DType::BF16 if from == DType::F64 => {
                format!("__bfloat162float(__double2bfloat16({a}))")
            }
            DType::F16 => format!("__half2float(__float2half_rn({a}))"),
            DType::BF16 => format!("__bfloat162float(__float2bfloat16_rn({a}))"),
            // f32 and half values are already exact floats.
            DType::F32 if from == DType::F64 => format!("(float){a}"),
            DType::F32 => a.to_string(),
            _ => format!("(double){a}"),
        },
        // Integers and bools to floats: one rounding, straight from the integer.
        (_, DKind::Float) => match to {
            DType::F16 => format!("__half2float(__ll2half_rn((long long){a}))"),
            DType::BF16 => format!("__bfloat162float(__ll2bfloat16_rn((long long){a}))"),
            DType::F32 => format!("(float){a}"),
            _ => format!("(double){a}"),
        },
        // Integer narrowing wraps; widening and bools convert exactly.
        (_, DKind::Int) => format!("({}){a}", compute_type(to)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_exact_and_parenthesised() {
        assert_eq!(literal(Scalar::F(0.5), DType::F32), "0.5f");
        assert_eq!(literal(Scalar::F(-2.0), DType::F32), "(-2.0f)");
        assert_eq!(literal(Scalar::F(0.1), DType::F64), "0.1");
        assert_eq!(
            literal(Scalar::F(f64::INFINITY), DType::F32),
            "__int_as_float(0x7f800000)"
        );
        assert_eq!(
            literal(Scalar::I(i64::from(i32::MIN)), DType::I32),
            "(-2147483647 - 1)"
        );
        assert_eq!(literal(Scalar::I(-3), DType::I64), "(-3LL)");
        assert_eq!(literal(Scalar::B(true), DType::Bool), "true");
        // f32 literals round-trip: Debug prints the shortest exact form.
        let x = 0.797_884_6_f32;
        assert_eq!(literal(Scalar::F(f64::from(x)), DType::F32), "0.7978846f");
    }
}
