//! Element-wise operators: arithmetic with multidirectional broadcasting, comparisons
//! and logic, the activations, casts, `Where` and `Clip`.

use crate::error::Result;
use crate::node::Node;
use ndfuse::{DType, Tensor};

/// `Add`, `Sub`, `Mul`, `Div`, `Pow` and the comparisons and logic ops.
pub fn binary(n: &Node) -> Result<Vec<Tensor>> {
    let (a, b) = (n.input(0)?, n.input(1)?);
    let t = match n.op() {
        "Add" => a.add(b),
        "Sub" => a.sub(b),
        "Mul" => a.mul(b),
        "Div" => {
            let d = a.dtype().ok();
            let q = a.div(b);
            // ONNX divides integers in their own type, truncating toward zero.
            match d {
                Some(d) if !d.is_float() && d != DType::Bool => q.cast(DType::F64).cast(d),
                _ => q,
            }
        }
        // The exponent may have another type; the result has the base's.
        "Pow" => {
            let d = n.dtype(0)?;
            // A constant exponent of 1, 2 or -1 (a norm's square) is the product or the
            // reciprocal, each correctly rounded as pow is: no pow call per element.
            let e = match n.inputs.get(1).and_then(|v| v.as_ref()) {
                Some(v) if v.constant && v.known.as_ref().is_some_and(|k| k.len() == 1) => {
                    v.known.as_ref().map(|k| k.to_f64_vec()[0])
                }
                _ => None,
            };
            let same_shape = n.shape(0)? == broadcast_shape(&n.shape(0)?, &n.shape(1)?);
            match e {
                Some(e) if d.is_float() && same_shape && e == 1.0 => a.clone(),
                Some(e) if d.is_float() && same_shape && e == 2.0 => a.mul(a),
                Some(e) if d.is_float() && same_shape && e == -1.0 => a.recip(),
                _ if d.is_float() => a.pow(b.cast(d)),
                _ => a.cast(DType::F64).pow(b.cast(DType::F64)).cast(d),
            }
        }
        "Equal" => a.eq(b),
        "Less" => a.lt(b),
        "LessOrEqual" => a.le(b),
        "Greater" => a.gt(b),
        "GreaterOrEqual" => a.ge(b),
        "And" => a.and(b),
        "Or" => a.or(b),
        "Xor" => a.ne(b),
        "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" => {
            return Err(n.unsupported("bitwise operators"))
        }
        op => unreachable!("binary() called for {op}"),
    };
    Ok(vec![t])
}

/// `Mod`: `fmod=1` keeps the dividend's sign (C's fmod); `fmod=0` the divisor's
/// (Python's %), which ONNX allows only for integers.
pub fn modulo(n: &Node) -> Result<Vec<Tensor>> {
    let (a, b) = (n.input(0)?, n.input(1)?);
    let d = n.dtype(0)?;
    let fmod = n.int_or("fmod", 0)? == 1;
    if d.is_float() && !fmod {
        return Err(n.bad("fmod=0 on floats (the specification requires fmod=1)"));
    }
    let (fa, fb) = (a.cast(DType::F64), b.cast(DType::F64));
    let q = fa.div(&fb);
    let q = if fmod { trunc(&q) } else { q.floor() };
    let r = fa.sub(q.mul(&fb));
    // A zero divisor leaves the dividend (fmod gives NaN for floats, as C does).
    let r = if d.is_float() {
        r
    } else {
        fb.eq(0.0).where_(&fa, &r)
    };
    Ok(vec![r.cast(d)])
}

fn trunc(x: &Tensor) -> Tensor {
    x.lt(0.0).where_(x.ceil(), x.floor())
}

/// `Max`, `Min`, `Sum`, `Mean` over any number of inputs, broadcast together.
pub fn variadic(n: &Node) -> Result<Vec<Tensor>> {
    let ins = n.all_inputs()?;
    let Some((first, rest)) = ins.split_first() else {
        return Err(n.bad("needs at least one input"));
    };
    let mut acc = (*first).clone();
    for t in rest {
        acc = match n.op() {
            "Max" => acc.maximum(*t),
            "Min" => acc.minimum(*t),
            _ => acc.add(*t),
        };
    }
    if n.op() == "Mean" {
        acc = acc.div(ins.len() as f64);
    }
    // One input of `Sum`/`Max` still broadcasts to itself: a copy.
    Ok(vec![acc])
}

/// The one-input operators and activations.
pub fn unary(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let alpha = |d: f64| n.float_or("alpha", d);
    let t = match n.op() {
        "Abs" => x.abs(),
        "Neg" => x.neg(),
        "Exp" => x.exp(),
        "Log" => x.log(),
        "Sqrt" => x.sqrt(),
        "Reciprocal" => x.recip(),
        "Sin" => x.sin(),
        "Cos" => x.cos(),
        "Tan" => x.sin().div(x.cos()),
        "Sinh" => x.exp().sub(x.neg().exp()).mul(0.5),
        "Cosh" => x.exp().add(x.neg().exp()).mul(0.5),
        "Tanh" => x.tanh(),
        "Sigmoid" => x.sigmoid(),
        "Relu" => x.relu(),
        "Erf" => x.erf(),
        "Floor" => x.floor(),
        "Ceil" => x.ceil(),
        "Round" => x.round(),
        "Sign" => x.sign(),
        "Not" => x.logical_not(),
        "Identity" => x.clone(),
        "Softsign" => x.div(x.abs().add(1.0)),
        // log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|).
        "Softplus" => softplus(x),
        "Mish" => x.mul(softplus(x).tanh()),
        "Elu" => {
            let a = alpha(1.0)?;
            x.lt(0.0).where_(x.expm1().mul(a), x)
        }
        "Celu" => {
            let a = alpha(1.0)?;
            x.relu().add(x.div(a).expm1().mul(a).minimum(0.0))
        }
        "Selu" => {
            let a = alpha(1.673_263_192_176_818_8)?;
            let g = n.float_or("gamma", 1.050_700_987_355_480_5)?;
            x.le(0.0).where_(x.expm1().mul(a), x).mul(g)
        }
        "LeakyRelu" => {
            let a = alpha(0.01)?;
            x.lt(0.0).where_(x.mul(a), x)
        }
        "ThresholdedRelu" => {
            let a = alpha(1.0)?;
            x.gt(a).where_(x, 0.0)
        }
        "HardSigmoid" => {
            let a = alpha(0.2)?;
            let b = n.float_or("beta", 0.5)?;
            x.mul(a).add(b).maximum(0.0).minimum(1.0)
        }
        "HardSwish" => x.mul(x.div(6.0).add(0.5).maximum(0.0).minimum(1.0)),
        "Gelu" => match n.string("approximate")?.as_deref() {
            None | Some("none") => x.gelu_erf(),
            Some("tanh") => x.gelu(),
            Some(other) => return Err(n.bad(format!("approximate='{other}'"))),
        },
        "IsNaN" => x.ne(x),
        "IsInf" => {
            let pos = n.int_or("detect_positive", 1)? != 0;
            let neg = n.int_or("detect_negative", 1)? != 0;
            let p = x.eq(f64::INFINITY);
            let m = x.eq(f64::NEG_INFINITY);
            match (pos, neg) {
                (true, true) => p.or(&m),
                (true, false) => p,
                (false, true) => m,
                (false, false) => x.ne(x).and(x.eq(x)),
            }
        }
        "Shrink" => {
            let l = n.float_or("lambd", 0.5)?;
            let b = n.float_or("bias", 0.0)?;
            x.lt(-l).where_(x.add(b), x.gt(l).where_(x.sub(b), 0.0))
        }
        op => unreachable!("unary() called for {op}"),
    };
    Ok(vec![t])
}

fn softplus(x: &Tensor) -> Tensor {
    x.relu().add(x.abs().neg().exp().log1p())
}

/// `PRelu`: `x` where positive, else `slope * x` (the slope broadcasts).
pub fn prelu(n: &Node) -> Result<Vec<Tensor>> {
    let (x, s) = (n.input(0)?, n.input(1)?);
    Ok(vec![x.lt(0.0).where_(x.mul(s), x)])
}

/// `Cast` and `CastLike`.
pub fn cast(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let to = if n.op() == "CastLike" {
        n.dtype(1)?
    } else {
        let code = n
            .int("to")?
            .ok_or_else(|| n.bad("attribute 'to' is required"))?;
        crate::tensor::dtype_of(code as i32)
            .map_err(|w| n.unsupported(format!("casting to {w}")))?
    };
    let from = n.dtype(0)?;
    // Floats to integers truncate toward zero (C's cast, numpy's astype).
    if from.is_float() && !to.is_float() && to != DType::Bool {
        return Ok(vec![trunc(x).cast(to)]);
    }
    Ok(vec![x.cast(to)])
}

/// `Where(cond, a, b)`.
pub fn where_(n: &Node) -> Result<Vec<Tensor>> {
    let (c, a, b) = (n.input(0)?, n.input(1)?, n.input(2)?);
    Ok(vec![c.where_(a, b)])
}

/// `Clip`: bounds as attributes (opset < 11) or optional inputs.
pub fn clip(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let mut y = x.clone();
    if n.opset < 11 {
        if let Some(lo) = n.float("min")? {
            y = y.maximum(lo);
        }
        if let Some(hi) = n.float("max")? {
            y = y.minimum(hi);
        }
        return Ok(vec![y]);
    }
    if let Some(lo) = n.opt_input(1) {
        y = y.maximum(lo.reshape(&[]));
    }
    if let Some(hi) = n.opt_input(2) {
        y = y.minimum(hi.reshape(&[]));
    }
    Ok(vec![y])
}

/// `Dropout` at inference: the input, and an all-true mask when asked for.
pub fn dropout(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    let training = match n.known(2)? {
        Some(a) => a.to_f64_vec().first().copied().unwrap_or(0.0) != 0.0,
        None => false,
    };
    if training {
        return Err(n.unsupported("training_mode=true (random dropout)"));
    }
    let mask = x.ne(x).logical_not();
    Ok(vec![x.clone(), mask])
}

/// Numpy's broadcast of two shapes (the longer rank; extents equal or 1), or `a` when
/// they do not broadcast (the op that uses them reports that).
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    let get = |s: &[usize], i: usize| {
        if i + s.len() < r {
            1
        } else {
            s[i + s.len() - r]
        }
    };
    (0..r)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, 1) => x,
            (1, y) => y,
            (x, _) => x,
        })
        .collect()
}
