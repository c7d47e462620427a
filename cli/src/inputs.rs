//! The named inputs of an expression: `--input NAME=FILE.npy`, `--random
//! NAME=SHAPE[:DTYPE]` and `--shape NAME=SHAPE[:DTYPE]`, turned into leaf tensors.
//!
//! SHAPE is dims joined by `x` (`4096x4096`); a scalar is the empty shape (`x=` or
//! `x=:f64`) or `()`.

use ndfuse::expr::parse_dtype;
use ndfuse::{Context, DType, Error, Tensor};
use ndfuse_ir::Storage;

/// `NAME=REST` split at the first `=`, with NAME checked to be usable in an expression.
pub fn split_named<'s>(flag: &str, spec: &'s str) -> Result<(&'s str, &'s str), String> {
    let (name, rest) = spec
        .split_once('=')
        .ok_or_else(|| format!("{flag} {spec}: expected NAME=..."))?;
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ident {
        return Err(format!(
            "{flag} {spec}: '{name}' is not a valid input name (letters, digits and _, not starting with a digit)"
        ));
    }
    if matches!(name, "true" | "false" | "True" | "False" | "None") {
        return Err(format!(
            "{flag} {spec}: '{name}' is reserved and cannot name an input"
        ));
    }
    Ok((name, rest))
}

/// `SHAPE[:DTYPE]`, with `default` when no dtype is given.
pub fn parse_shape_spec(
    flag: &str,
    spec: &str,
    rest: &str,
    default: DType,
) -> Result<(Vec<usize>, DType), String> {
    let (shape, dtype) = match rest.rsplit_once(':') {
        Some((s, d)) => {
            let dtype = parse_dtype(d).ok_or_else(|| {
                format!("{flag} {spec}: unknown dtype '{d}' (use f16, bf16, f32, f64, i32, i64 or bool)")
            })?;
            (s, dtype)
        }
        None => (rest, default),
    };
    let shape = shape.trim();
    if shape.is_empty() || shape == "()" {
        return Ok((Vec::new(), dtype));
    }
    let dims = shape
        .split('x')
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            format!(
                "{flag} {spec}: bad shape '{shape}': write dims joined by x, like 4096x4096 (an empty shape is a scalar)"
            )
        })?;
    let fits = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size_bytes()))
        .is_some();
    if !fits {
        return Err(format!(
            "{flag} {spec}: shape '{shape}' is too large to allocate"
        ));
    }
    Ok((dims, dtype))
}

/// A leaf tensor owning `data`.
pub fn tensor_from_storage(
    ctx: &Context,
    data: Storage,
    shape: &[usize],
) -> Result<Tensor, String> {
    let t = match data {
        Storage::F16(v) => ctx.from_vec(v, shape),
        Storage::BF16(v) => ctx.from_vec(v, shape),
        Storage::F32(v) => ctx.from_vec(v, shape),
        Storage::F64(v) => ctx.from_vec(v, shape),
        Storage::I32(v) => ctx.from_vec(v, shape),
        Storage::I64(v) => ctx.from_vec(v, shape),
        Storage::Bool(v) => ctx.from_vec(v, shape),
    };
    t.map_err(|e| e.reason())
}

/// `--input NAME=FILE.npy`.
pub fn load_npy(ctx: &Context, spec: &str) -> Result<(String, Tensor), String> {
    let (name, file) = split_named("--input", spec)?;
    if file.is_empty() {
        return Err(format!("--input {spec}: expected NAME=FILE.npy"));
    }
    let t = ctx
        .load_npy(file)
        .map_err(|e| format!("--input {name}={file}: {}", file_reason(&e)))?;
    Ok((name.to_string(), t))
}

/// The reason of a `.npy` read or write error without the path, which the caller's
/// message already names through the flag (`--input x=a.npy: cannot read: No such
/// file or directory`).
pub fn file_reason(e: &Error) -> String {
    match e {
        Error::Io { action, source, .. } => {
            let s = source.to_string();
            // Rust's " (os error 2)" says nothing more than the words before it.
            let reason = s.find(" (os error").map_or(s.as_str(), |i| &s[..i]);
            format!("cannot {action}: {reason}")
        }
        Error::Npy { why, .. } => why.clone(),
        other => other.reason(),
    }
}

/// A seed for input `name` derived from the run's seed, so that every input gets its
/// own stream and adding an input does not change the others (FNV-1a of the name,
/// mixed with the seed; fixed here so that seeds reproduce across releases).
pub fn name_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `--random NAME=SHAPE[:DTYPE]`: floats uniform in [-1, 1), integers uniform in
/// [-10, 10), bools fair coin flips; all from [`Context::rand_uniform`].
pub fn random(ctx: &Context, spec: &str, seed: u64) -> Result<(String, Tensor), String> {
    let (name, rest) = split_named("--random", spec)?;
    let (shape, dtype) = parse_shape_spec("--random", spec, rest, ctx.default_dtype())?;
    let s = name_seed(seed, name);
    let (low, high) = match dtype {
        d if d.is_float() => (-1.0, 1.0),
        DType::Bool => (0.0, 1.0),
        _ => (-10.0, 10.0),
    };
    // Draw in f64 and round once into the dtype, as rand_uniform does for its own
    // default dtype: the same seed gives the same values whatever --dtype says. Every
    // buffer is allocated fallibly: a shape too large for the memory is one line.
    let flag_spec = format!("--random {spec}");
    let oom = |e: Error| format!("{flag_spec}: {}", e.reason());
    let vals = ctx.rand_uniform_f64s(&shape, low, high, s).map_err(oom)?;
    let data = match dtype {
        DType::F64 => Storage::F64(vals),
        DType::Bool => try_storage(&flag_spec, dtype, &shape, |i| {
            f64::from(u8::from(vals[i] < 0.5))
        })?,
        d if d.is_int() => try_storage(&flag_spec, dtype, &shape, |i| vals[i].floor())?,
        _ => try_storage(&flag_spec, dtype, &shape, |i| vals[i])?,
    };
    let t = tensor_from_storage(ctx, data, &shape)?;
    Ok((name.to_string(), t))
}

/// Storage of `dtype` and `shape` with element `i` converted from `f(i)`, or the one
/// line of `--random SPEC` / `--shape SPEC` (`flag_spec`) when the memory is short.
fn try_storage(
    flag_spec: &str,
    dtype: DType,
    shape: &[usize],
    f: impl FnMut(usize) -> f64,
) -> Result<Storage, String> {
    let n = shape.iter().product();
    Storage::try_from_fn(dtype, n, f).ok_or_else(|| {
        let e = Error::OutOfMemory {
            bytes: n as u128 * dtype.size_bytes() as u128,
            what: format!("{dtype}{}", ndfuse_ir::Shape::from(shape)),
        };
        format!("{flag_spec}: {}", e.reason())
    })
}

/// `--shape NAME=SHAPE[:DTYPE]` for `explain`: a zero-filled leaf. Explain never
/// evaluates, but a leaf must hold data of its shape to be part of a graph.
pub fn zeros(ctx: &Context, spec: &str) -> Result<(String, Tensor, DType, Vec<usize>), String> {
    let (name, rest) = split_named("--shape", spec)?;
    let (shape, dtype) = parse_shape_spec("--shape", spec, rest, ctx.default_dtype())?;
    let data = try_storage(&format!("--shape {spec}"), dtype, &shape, |_| 0.0)?;
    let t = tensor_from_storage(ctx, data, &shape)?;
    Ok((name.to_string(), t, dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_specs() {
        let p = |s: &str| parse_shape_spec("--random", s, s, DType::F32);
        assert_eq!(p("4096x4096"), Ok((vec![4096, 4096], DType::F32)));
        assert_eq!(p("3:i64"), Ok((vec![3], DType::I64)));
        assert_eq!(p(":f64"), Ok((vec![], DType::F64)));
        assert_eq!(p("()"), Ok((vec![], DType::F32)));
        assert_eq!(p("0x5:bool"), Ok((vec![0, 5], DType::Bool)));
        assert!(p("4x?").is_err_and(|e| e.contains("bad shape '4x?'")));
        assert!(p("4:f8").is_err_and(|e| e.contains("unknown dtype 'f8'")));
        assert!(p("4,4").is_err());
        assert!(p("99999999999x99999999999").is_err_and(|e| e.contains("too large")));
    }

    #[test]
    fn names() {
        assert_eq!(split_named("--input", "x_1=a.npy"), Ok(("x_1", "a.npy")));
        assert!(split_named("--input", "1x=a.npy").is_err());
        assert!(split_named("--input", "a.npy").is_err());
        assert!(split_named("--input", "true=a.npy").is_err());
        assert_ne!(name_seed(0, "x"), name_seed(0, "y"));
        assert_ne!(name_seed(0, "x"), name_seed(1, "x"));
    }
}
