//! `ndfuse::linalg` on the CPU against numpy and scipy: the results that
//! `scripts/linalg_fixtures.py` stored in `tests/fixtures/linalg_numpy.json` (numpy 2.4,
//! scipy 1.17, OpenBLAS LAPACK; regenerate with `/tmp/peers-venv/bin/python
//! scripts/linalg_fixtures.py`). Every op runs in f64, and in f32 on the well-conditioned
//! inputs (compared with numpy's f64 results on the same values); the 1e6-conditioned
//! `ill6` is checked in f32 only through its reconstructions.
//!
//! **Tolerances.** `eps` is the dtype's (f64 2.2e-16, f32 1.2e-7), `n = max(m, n)`, and
//! `kappa` the input's 2-norm condition number, stored with the fixture (`<input>/kappa`:
//! 2.2 to 51 for the well-conditioned inputs, 1e6 for `ill6`, `s_1 / s_rank` for the
//! rank-2 `rankdef`). Errors are measured in the matrix's scale: `max |got - want|`
//! over `max |want|` (factors, solutions), over `s_max = ||a||_2` (singular values,
//! eigenvalues, the spectral norms) or element-wise relative (det, cond, the other
//! norms).
//!
//! * backward `= 8 n eps`: what backward-stable algorithms promise whatever the
//!   condition: singular values and eigenvalues (Weyl: absolute `||E|| <= c n eps
//!   ||a||`), the norms, and every reconstruction (`q r`, `u s vh`, `v w v^T`, `p l u`,
//!   `l l^T` against `a`; `q^T q`, `u^T u`, `v^T v` against `I`). n = 6: f64 1.1e-14, f32
//!   5.7e-6.
//! * forward `= 4 n eps kappa`: solutions (`solve`, `triangular_solve`), `inv`, `pinv`,
//!   `det` and `logabsdet`, `cond`, `cholesky`, and the sign-free factors (`|R|`, `|Q|`,
//!   scipy's `l`, `u`): first-order perturbation theory multiplies the backward error by
//!   the condition number. f64: 9e-15 to 1.4e-13 on the well-conditioned inputs, 5.3e-9
//!   on `ill6` (`cond n eps` = 1.3e-9, times 4); f32: 5e-6 to 7e-5.
//! * `lstsq`'s solution: forward times `kappa` (the `kappa^2 ||r|| / (||a|| ||x||)` term of
//!   least-squares sensitivity), its residuals in units of `||b||^2`.
//! * Singular and eigen-vectors (signs differ from LAPACK's): `|U^T U_numpy| = I` to
//!   backward `* s_max / gap`, `gap` the smallest distance from a value to another one (or
//!   to 0 for the vectors of a non-square matrix): the `eps ||a|| / gap` of Davis-Kahan.
//! * Exact: ranks, `slogdet`'s sign, scipy's permutation `p`, the structural zeros and
//!   unit diagonal of `l`, `u`, `r`, and the sign conventions (`diag(r) >= 0`; the entry
//!   of largest magnitude of each eigenvector and left singular vector is positive); and
//!   on the exactly singular `sing4` (f64), numpy's det 0, slogdet (0, -inf), scipy's lu
//!   and a "singular" error from solve and inv.
//!
//! Run with `--nocapture` for each check's error, tolerance and ratio.

mod linalg_support;
use linalg_support::{identity, mm, transpose};
use ndfuse::linalg::{self, Norm, QrMode, Side};
use ndfuse::{Array, BackendKind, Context, DType, Tensor};
use std::collections::BTreeMap;

// ---- The fixture: a small JSON reader (the tests crate has no serde_json). ----

#[derive(Debug)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn fail<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("JSON: {what} at byte {}", self.i))
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            self.fail(&format!("expected '{}'", c as char))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.eat(b':')?;
                    fields.push((key, self.value()?));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return self.fail("expected ',' or '}'"),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return self.fail("expected ',' or ']'"),
                    }
                }
            }
            Some(b'"') => self.string().map(Json::Str),
            Some(b't') if self.s[self.i..].starts_with(b"true") => {
                self.i += 4;
                Ok(Json::Bool(true))
            }
            Some(b'f') if self.s[self.i..].starts_with(b"false") => {
                self.i += 5;
                Ok(Json::Bool(false))
            }
            Some(b'n') if self.s[self.i..].starts_with(b"null") => {
                self.i += 4;
                Ok(Json::Null)
            }
            Some(c) if *c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
                    )
                {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).expect("ascii");
                // Rust's parse is correctly rounded: Python's repr round-trips exactly.
                text.parse::<f64>()
                    .map(Json::Num)
                    .or_else(|_| self.fail(&format!("bad number {text:?}")))
            }
            _ => self.fail("expected a value"),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if self.s.get(self.i) != Some(&b'"') {
            return self.fail("expected a string");
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match self.s.get(self.i) {
                None => return self.fail("unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return String::from_utf8(out).or_else(|_| self.fail("bad UTF-8"));
                }
                Some(b'\\') => {
                    let c = self.s.get(self.i + 1).copied();
                    self.i += 2;
                    match c {
                        Some(b'n') => out.push(b'\n'),
                        Some(b't') => out.push(b'\t'),
                        Some(b'r') => out.push(b'\r'),
                        Some(b'b') => out.push(8),
                        Some(b'f') => out.push(12),
                        Some(b'u') => {
                            let hex = self
                                .s
                                .get(self.i..self.i + 4)
                                .and_then(|h| std::str::from_utf8(h).ok())
                                .and_then(|h| u32::from_str_radix(h, 16).ok());
                            self.i += 4;
                            let ch = hex.and_then(char::from_u32).unwrap_or('\u{fffd}');
                            out.extend_from_slice(ch.to_string().as_bytes());
                        }
                        Some(c) => out.push(c),
                        None => return self.fail("unterminated escape"),
                    }
                }
                Some(&c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }
}

fn parse_json(text: &str) -> Json {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let v = p.value().unwrap_or_else(|e| panic!("{e}"));
    p.ws();
    assert_eq!(p.i, text.len(), "JSON: trailing characters");
    v
}

/// One stored array: row-major f64 data and its shape.
#[derive(Clone, Debug)]
struct Arr {
    shape: Vec<usize>,
    data: Vec<f64>,
}

struct Fixture {
    meta: BTreeMap<String, String>,
    arrays: BTreeMap<String, Arr>,
}

fn field<'a>(obj: &'a [(String, Json)], key: &str) -> &'a Json {
    obj.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("fixture: no field {key:?}"))
}

fn number(v: &Json) -> f64 {
    match v {
        Json::Num(x) => *x,
        // JSON has no non-finite numbers: the generator writes them as strings.
        Json::Str(s) if s == "inf" => f64::INFINITY,
        Json::Str(s) if s == "-inf" => f64::NEG_INFINITY,
        Json::Str(s) if s == "nan" => f64::NAN,
        other => panic!("fixture: not a number: {other:?}"),
    }
}

fn load() -> Fixture {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/linalg_numpy.json");
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e} (regenerate: python scripts/linalg_fixtures.py)"));
    let Json::Obj(top) = parse_json(&text) else {
        panic!("fixture: not an object")
    };
    let Json::Obj(meta) = field(&top, "meta") else {
        panic!("fixture: meta")
    };
    let meta = meta
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Json::Str(s) => s.clone(),
                Json::Num(x) => x.to_string(),
                Json::Bool(b) => b.to_string(),
                other => format!("{other:?}"),
            };
            (k.clone(), v)
        })
        .collect();
    let Json::Obj(arrays) = field(&top, "arrays") else {
        panic!("fixture: arrays")
    };
    let arrays = arrays
        .iter()
        .map(|(name, v)| {
            let Json::Obj(a) = v else {
                panic!("fixture: {name} is not an object")
            };
            let (Json::Arr(shape), Json::Arr(data)) = (field(a, "shape"), field(a, "data")) else {
                panic!("fixture: {name}: shape and data must be arrays")
            };
            let shape: Vec<usize> = shape.iter().map(|d| number(d) as usize).collect();
            let data: Vec<f64> = data.iter().map(number).collect();
            assert_eq!(
                shape.iter().product::<usize>(),
                data.len(),
                "fixture: {name}: shape {shape:?} and {} values",
                data.len()
            );
            (name.clone(), Arr { shape, data })
        })
        .collect();
    Fixture { meta, arrays }
}

impl Fixture {
    fn get(&self, name: &str) -> &Arr {
        self.arrays
            .get(name)
            .unwrap_or_else(|| panic!("fixture: no array {name:?}"))
    }

    fn has(&self, name: &str) -> bool {
        self.arrays.contains_key(name)
    }

    fn scalar(&self, name: &str) -> f64 {
        let a = self.get(name);
        assert_eq!(a.data.len(), 1, "{name}: a scalar");
        a.data[0]
    }
}

// ---- Tolerances and the record of checks. ----

/// The constants `c` of the module's `c n eps` (backward) and `c n eps kappa` (forward):
/// the errors measured on the CPU (faer) stay under 1.4 n eps and 0.5 n eps kappa.
const C_BACKWARD: f64 = 8.0;
const C_FORWARD: f64 = 4.0;

fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    }
}

/// The tolerances of one input in one dtype (see the module's docs).
#[derive(Clone, Copy)]
struct Tol {
    backward: f64,
    forward: f64,
}

impl Tol {
    fn new(dtype: DType, n: usize, kappa: f64) -> Tol {
        let b = n as f64 * eps(dtype);
        Tol {
            backward: C_BACKWARD * b,
            forward: C_FORWARD * b * kappa.max(1.0),
        }
    }
}

/// Every check's error and tolerance; `finish` prints them and fails on any over.
struct Checks {
    dtype: DType,
    rows: Vec<(String, f64, f64)>,
}

impl Checks {
    fn new(dtype: DType) -> Checks {
        Checks {
            dtype,
            rows: Vec::new(),
        }
    }

    fn check(&mut self, what: impl Into<String>, err: f64, tol: f64) {
        self.rows.push((what.into(), err, tol));
    }

    /// An exact property: error 0 when it holds, 1 when not (tolerance 0).
    fn exact(&mut self, what: impl Into<String>, holds: bool) {
        self.rows
            .push((what.into(), if holds { 0.0 } else { 1.0 }, 0.0));
    }

    fn finish(self) {
        let mut failed = Vec::new();
        let mut worst = (String::new(), 0.0f64);
        for (what, err, tol) in &self.rows {
            let ok = err <= tol; // NaN fails
            let ratio = if *tol > 0.0 { err / tol } else { *err };
            println!(
                "{} {what:<44} err {err:9.2e}  tol {tol:9.2e}  ratio {ratio:6.3}{}",
                self.dtype,
                if ok { "" } else { "  FAIL" }
            );
            if !ok {
                failed.push(format!("{what}: {err:.3e} > {tol:.3e}"));
            }
            if *tol > 0.0 && ratio > worst.1 {
                worst = (what.clone(), ratio);
            }
        }
        if worst.0.is_empty() {
            worst.0 = "exact checks only".into();
        }
        println!(
            "{}: {} checks, worst error/tolerance {:.3} ({})",
            self.dtype,
            self.rows.len(),
            worst.1,
            worst.0
        );
        assert!(
            failed.is_empty(),
            "{} of {} checks against numpy failed in {}:\n{}",
            failed.len(),
            self.rows.len(),
            self.dtype,
            failed.join("\n")
        );
    }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// `max |got - want| / scale`; shapes must agree.
fn abs_err(got: &[f64], want: &[f64], scale: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) })
        / scale
}

/// `max |got - want| / max |want|`.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    abs_err(got, want, max_abs(want).max(f64::MIN_POSITIVE))
}

/// `max_i |got_i - want_i| / |want_i|`.
fn elementwise_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(f64::MIN_POSITIVE))
        .fold(0.0, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) })
}

// ---- Host-side matrices (f64, row-major). ----

/// The matrices of a batched `[..., m, n]` array, with `(m, n)`.
fn matrices<'a>(data: &'a [f64], shape: &[usize]) -> (Vec<&'a [f64]>, usize, usize) {
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let chunks = if m * n == 0 {
        Vec::new()
    } else {
        data.chunks(m * n).collect()
    };
    (chunks, m, n)
}

/// The smallest distance from each of `s` to another one (and to 0 when `with_zero`).
fn smallest_gap(s: &[f64], with_zero: bool) -> f64 {
    let mut gap = f64::INFINITY;
    for (i, a) in s.iter().enumerate() {
        if with_zero {
            gap = gap.min(a.abs());
        }
        for b in &s[i + 1..] {
            gap = gap.min((a - b).abs());
        }
    }
    gap
}

/// `max | |x^T y| - I |` for `x`, `y` with `k` orthonormal columns of length `m`: 0 when
/// they span the same vectors up to signs.
fn unsigned_overlap(x: &[f64], y: &[f64], m: usize, k: usize) -> f64 {
    let g = mm(&transpose(x, m, k), y, k, m, k);
    let i = identity(k);
    g.iter()
        .zip(&i)
        .map(|(a, b)| (a.abs() - b).abs())
        .fold(0.0, f64::max)
}

/// Whether each column of `v [m, k]` has its entry of largest magnitude positive.
fn largest_entries_positive(v: &[f64], m: usize, k: usize) -> bool {
    (0..k).all(|j| {
        let col: Vec<f64> = (0..m).map(|i| v[i * k + j]).collect();
        let top = col
            .iter()
            .copied()
            .fold(0.0f64, |t, x| if x.abs() > t.abs() { x } else { t });
        top > 0.0
    })
}

// ---- Running ndfuse. ----

fn ctx(dtype: DType) -> Context {
    Context::builder()
        .backend(BackendKind::Cpu)
        .dtype(dtype)
        .build()
        .expect("a context")
}

fn tensor(c: &Context, a: &Arr) -> Tensor {
    c.from_vec(a.data.clone(), &a.shape)
        .expect("fixture data")
        .cast(c.default_dtype())
}

/// Evaluates `ts` in one call, each result as (shape, f64 values).
fn run(c: &Context, ts: &[&Tensor]) -> Vec<(Vec<usize>, Vec<f64>)> {
    c.eval(ts)
        .unwrap_or_else(|e| panic!("eval: {e}"))
        .iter()
        .map(|a: &Array| (a.shape().to_vec(), a.to_f64_vec()))
        .collect()
}

/// The inputs checked in `dtype`: every one in f64; in f32 all but the 1e6-conditioned.
fn wanted(dtype: DType, input: &str) -> bool {
    dtype == DType::F64 || input != "ill6"
}

/// The tolerances of `input`: its `n = max(m, n)` and stored condition number.
fn tol_of(fx: &Fixture, dtype: DType, input: &str) -> Tol {
    let s = &fx.get(input).shape;
    let n = s[s.len() - 2].max(s[s.len() - 1]);
    Tol::new(dtype, n, fx.scalar(&format!("{input}/kappa")))
}

const NORMS: [(&str, Norm); 8] = [
    ("fro", Norm::Fro),
    ("nuc", Norm::Nuc),
    ("2", Norm::Two),
    ("-2", Norm::NegTwo),
    ("1", Norm::One),
    ("-1", Norm::NegOne),
    ("inf", Norm::Inf),
    ("-inf", Norm::NegInf),
];

/// solve, inv, det, slogdet, cond (every p), cholesky, eigvalsh, svdvals, pinv, lstsq,
/// matrix_norm and triangular_solve against numpy's values.
fn values(dtype: DType) {
    let fx = load();
    let c = ctx(dtype);
    let mut ck = Checks::new(dtype);
    let get = |name: &str| tensor(&c, fx.get(name));

    // The square solves, inverses, determinants and conditions.
    for k in ["wc4", "batch3", "spd5", "ill6"] {
        if !wanted(dtype, k) {
            continue;
        }
        let tol = tol_of(&fx, dtype, k);
        let a = get(k);
        let sl = linalg::slogdet(&a);
        let outs = [
            linalg::solve(&a, &get(&format!("{k}/solve_b"))),
            linalg::solve(&a, &get(&format!("{k}/solve_vb"))),
            linalg::inv(&a),
            linalg::det(&a),
            sl.sign,
            sl.logabsdet,
            linalg::cond(&a, None),
            linalg::cond(&a, Some(Norm::One)),
            linalg::cond(&a, Some(Norm::Inf)),
        ];
        let r = run(&c, &outs.iter().collect::<Vec<_>>());
        let names = [
            "solve",
            "solve_v",
            "inv",
            "det",
            "slogdet_sign",
            "slogdet_logabsdet",
            "cond_none",
            "cond_1",
            "cond_inf",
        ];
        for ((shape, got), name) in r.iter().zip(names) {
            let want = fx.get(&format!("{k}/{name}"));
            ck.exact(format!("{k} {name} shape"), *shape == want.shape);
            let what = format!("{k} {name}");
            match name {
                "solve" | "solve_v" | "inv" => {
                    ck.check(what, rel_err(got, &want.data), tol.forward)
                }
                "det" | "cond_none" | "cond_1" | "cond_inf" => {
                    ck.check(what, elementwise_err(got, &want.data), tol.forward)
                }
                "slogdet_sign" => ck.exact(what, *got == want.data),
                _ => ck.check(what, abs_err(got, &want.data, 1.0), tol.forward),
            }
        }
    }

    // Cholesky (numpy's lower factor; `upper` is its transpose).
    {
        let tol = tol_of(&fx, dtype, "spd5");
        let a = get("spd5");
        let r = run(
            &c,
            &[&linalg::cholesky(&a, false), &linalg::cholesky(&a, true)],
        );
        let want = fx.get("spd5/cholesky");
        ck.check("spd5 cholesky", rel_err(&r[0].1, &want.data), tol.forward);
        ck.check(
            "spd5 cholesky upper",
            rel_err(&r[1].1, &transpose(&want.data, 5, 5)),
            tol.forward,
        );
    }

    // eigvalsh, reading one triangle: the junk inputs hold garbage in the other.
    for (k, upper, want) in [
        ("spd5", false, "spd5/eigvalsh"),
        ("sym4", false, "sym4/eigvalsh"),
        ("sym4", true, "sym4/eigvalsh"),
        ("sym4_junk_upper", false, "sym4/eigvalsh"),
        ("sym4_junk_lower", true, "sym4/eigvalsh"),
    ] {
        let tol = tol_of(&fx, dtype, want.split('/').next().expect("input"));
        let r = run(&c, &[&linalg::eigvalsh(&get(k), upper)]);
        let want = &fx.get(want).data;
        ck.check(
            format!("{k} eigvalsh upper={upper}"),
            abs_err(&r[0].1, want, max_abs(want)),
            tol.backward,
        );
    }

    // svdvals, pinv, the eight norms and cond (2-norm) on every shape.
    for k in ["wc4", "batch3", "spd5", "tall", "wide", "rankdef", "ill6"] {
        if !wanted(dtype, k) {
            continue;
        }
        let tol = tol_of(&fx, dtype, k);
        let a = get(k);
        // `rankdef`'s small integers are exact in f32 too, but its computed null singular
        // values are ~eps32 ||a||, the default cutoff's scale (5 eps32): cut in the gap.
        let rtol = (dtype == DType::F32 && k == "rankdef").then_some(1e-4);
        let mut outs = vec![linalg::svdvals(&a), linalg::pinv(&a, rtol)];
        outs.extend(NORMS.iter().map(|(_, o)| linalg::matrix_norm(&a, *o)));
        // (The square inputs' cond was checked with the other norms' conds above.)
        let has_cond = fx.has(&format!("{k}/cond_none")) && ["tall", "wide"].contains(&k);
        if has_cond {
            outs.push(linalg::cond(&a, None));
        }
        let r = run(&c, &outs.iter().collect::<Vec<_>>());
        let s_want = &fx.get(&format!("{k}/svdvals")).data;
        let smax = max_abs(s_want);
        ck.check(
            format!("{k} svdvals"),
            abs_err(&r[0].1, s_want, smax),
            tol.backward,
        );
        let pinv = fx.get(&format!("{k}/pinv"));
        ck.exact(format!("{k} pinv shape"), r[1].0 == pinv.shape);
        ck.check(
            format!("{k} pinv"),
            rel_err(&r[1].1, &pinv.data),
            tol.forward,
        );
        for (i, (name, _)) in NORMS.iter().enumerate() {
            let want = &fx.get(&format!("{k}/norm_{name}")).data;
            let got = &r[2 + i].1;
            let err = match *name {
                // From the singular values: absolute in ||a||'s scale (the smallest one
                // of `rankdef` is 0 in exact arithmetic).
                "nuc" | "2" | "-2" => abs_err(got, want, smax),
                _ => elementwise_err(got, want),
            };
            ck.check(format!("{k} norm {name}"), err, tol.backward);
        }
        if has_cond {
            let want = &fx.get(&format!("{k}/cond_none")).data;
            ck.check(
                format!("{k} cond_none"),
                elementwise_err(&r[10].1, want),
                tol.forward,
            );
        }
    }

    // lstsq with a matrix and a vector b.
    for k in ["tall", "wide", "rankdef"] {
        let tol = tol_of(&fx, dtype, k);
        let kappa = fx.scalar(&format!("{k}/kappa"));
        let a = get(k);
        let rcond = (dtype == DType::F32 && k == "rankdef").then_some(1e-4);
        let ls = linalg::lstsq(&a, &get(&format!("{k}/lstsq_b")), rcond);
        let lv = linalg::lstsq(&a, &get(&format!("{k}/lstsq_vb")), rcond);
        let r = run(
            &c,
            &[
                &ls.solution,
                &ls.residuals,
                &ls.rank,
                &ls.singular_values,
                &lv.solution,
                &lv.residuals,
            ],
        );
        for (i, x) in [(0, "lstsq_x"), (4, "lstsq_vx")] {
            let want = fx.get(&format!("{k}/{x}"));
            ck.exact(format!("{k} {x} shape"), r[i].0 == want.shape);
            ck.check(
                format!("{k} {x}"),
                rel_err(&r[i].1, &want.data),
                tol.forward * kappa,
            );
        }
        ck.exact(
            format!("{k} lstsq rank"),
            r[2].1 == fx.get(&format!("{k}/lstsq_rank")).data,
        );
        let s = &fx.get(&format!("{k}/lstsq_s")).data;
        ck.check(
            format!("{k} lstsq s"),
            abs_err(&r[3].1, s, max_abs(s)),
            tol.backward,
        );
        for (i, b, res) in [(1, "lstsq_b", "lstsq_res"), (5, "lstsq_vb", "lstsq_vres")] {
            let b = &fx.get(&format!("{k}/{b}")).data;
            let bb: f64 = b.iter().map(|x| x * x).sum();
            if fx.has(&format!("{k}/{res}")) {
                let want = &fx.get(&format!("{k}/{res}")).data;
                ck.check(
                    format!("{k} {res}"),
                    abs_err(&r[i].1, want, bb),
                    tol.forward,
                );
            } else if k == "wide" {
                // numpy returns none (m < n); the true residuals are 0.
                ck.check(
                    format!("{k} {res} = 0"),
                    abs_err(&r[i].1, &vec![0.0; r[i].1.len()], bb),
                    tol.forward,
                );
            }
        }
    }

    // Triangular solves: one triangle of a full matrix, left and right.
    {
        let tol = tol_of(&fx, dtype, "tri5");
        let (t, b, rb) = (get("tri5"), get("tri5/tri_b"), get("tri5/tri_rb"));
        let ts = linalg::triangular_solve;
        let r = run(
            &c,
            &[
                &ts(&t, &b, false, Side::Left, false),
                &ts(&t, &b, true, Side::Left, false),
                &ts(&t, &b, false, Side::Left, true),
                &ts(&t, &rb, true, Side::Right, false),
            ],
        );
        for (i, name) in [
            "tri_lower",
            "tri_upper",
            "tri_unit_lower",
            "tri_right_upper",
        ]
        .iter()
        .enumerate()
        {
            let want = fx.get(&format!("tri5/{name}"));
            ck.exact(format!("tri5 {name} shape"), r[i].0 == want.shape);
            ck.check(
                format!("tri5 {name}"),
                rel_err(&r[i].1, &want.data),
                tol.forward,
            );
        }
    }
    ck.finish();
}

/// qr, svd (reduced and full), lu, eigh and cholesky: reconstructions, orthogonality,
/// structure and ndfuse's sign conventions on every input and dtype; against numpy up to
/// signs (and scipy's unique lu exactly) where the dtype allows.
fn decompositions(dtype: DType) {
    let fx = load();
    let c = ctx(dtype);
    let mut ck = Checks::new(dtype);

    for k in ["wc4", "batch3", "tall", "wide", "rankdef", "ill6"] {
        let tol = tol_of(&fx, dtype, k);
        let numpy = wanted(dtype, k) && fx.has(&format!("{k}/qr_r"));
        let input = fx.get(k);
        let a = tensor(&c, input);
        let q = linalg::qr(&a, QrMode::Reduced);
        let qc = linalg::qr(&a, QrMode::Complete);
        let s = linalg::svd(&a, false);
        let sf = linalg::svd(&a, true);
        let l = linalg::lu(&a);
        let r = run(
            &c,
            &[
                &q.q, &q.r, &qc.q, &qc.r, &s.u, &s.s, &s.vh, &sf.u, &sf.s, &sf.vh, &l.p, &l.l, &l.u,
            ],
        );
        let (mats, m, n) = matrices(&input.data, &input.shape);
        let kk = m.min(n);
        let batch = mats.len();
        let scale = max_abs(&input.data);
        let part = |i: usize, b: usize| -> &[f64] {
            let len = r[i].1.len() / batch;
            &r[i].1[b * len..(b + 1) * len]
        };
        // The worst error over the batch of each check, under the backward tolerance
        // (reconstructions, values) or the forward one (factors against numpy's).
        let mut worst = BTreeMap::<&str, (f64, f64)>::new();
        let mut exact = BTreeMap::<&str, bool>::new();
        let note = |w: &mut BTreeMap<&'static str, (f64, f64)>, what: &'static str, e: f64| {
            let t = if what.ends_with("numpy |r|")
                || what.ends_with("numpy |q|")
                || what.contains("scipy")
            {
                tol.forward
            } else {
                tol.backward
            };
            let x = w.entry(what).or_insert((0.0, t));
            x.0 = if e.is_nan() || x.0.is_nan() {
                f64::NAN
            } else {
                x.0.max(e)
            };
        };
        for (bi, am) in mats.iter().enumerate() {
            // qr: q r = a, q^T q = I, r upper with a non-negative diagonal.
            let (qq, rr) = (part(0, bi), part(1, bi));
            note(
                &mut worst,
                "q r = a",
                abs_err(&mm(qq, rr, m, kk, n), am, scale),
            );
            let qtq = mm(&transpose(qq, m, kk), qq, kk, m, kk);
            note(&mut worst, "q^T q = I", abs_err(&qtq, &identity(kk), 1.0));
            let upper =
                |x: &[f64], rows: usize| (0..rows * n).all(|p| p / n <= p % n || x[p] == 0.0);
            let diag_ok = (0..kk).all(|i| rr[i * n + i] >= 0.0);
            *exact.entry("r upper, diag >= 0").or_insert(true) &= upper(rr, kk) && diag_ok;
            let (qcq, qcr) = (part(2, bi), part(3, bi));
            note(
                &mut worst,
                "complete q r = a",
                abs_err(&mm(qcq, qcr, m, m, n), am, scale),
            );
            let qtq = mm(&transpose(qcq, m, m), qcq, m, m, m);
            note(
                &mut worst,
                "complete q^T q = I",
                abs_err(&qtq, &identity(m), 1.0),
            );
            *exact.entry("complete r upper").or_insert(true) &= upper(qcr, m);

            // svd: u s vh = a, orthonormal u and vh, descending s, u's largest entries > 0.
            let (u, sv, vh) = (part(4, bi), part(5, bi), part(6, bi));
            let us: Vec<f64> = (0..m * kk).map(|p| u[p] * sv[p % kk]).collect();
            note(
                &mut worst,
                "u s vh = a",
                abs_err(&mm(&us, vh, m, kk, n), am, scale),
            );
            let utu = mm(&transpose(u, m, kk), u, kk, m, kk);
            note(&mut worst, "u^T u = I", abs_err(&utu, &identity(kk), 1.0));
            let vvt = mm(vh, &transpose(vh, kk, n), kk, n, kk);
            note(&mut worst, "vh vh^T = I", abs_err(&vvt, &identity(kk), 1.0));
            *exact.entry("s descending, u's largest > 0").or_insert(true) &=
                sv.windows(2).all(|w| w[0] >= w[1]) && largest_entries_positive(u, m, kk);
            let (uf, sf_, vhf) = (part(7, bi), part(8, bi), part(9, bi));
            let ufs: Vec<f64> = (0..m * kk)
                .map(|p| uf[(p / kk) * m + p % kk] * sf_[p % kk])
                .collect();
            note(
                &mut worst,
                "full u s vh = a",
                abs_err(&mm(&ufs, &vhf[..kk * n], m, kk, n), am, scale),
            );
            let utu = mm(&transpose(uf, m, m), uf, m, m, m);
            note(
                &mut worst,
                "full u^T u = I",
                abs_err(&utu, &identity(m), 1.0),
            );
            let vvt = mm(vhf, &transpose(vhf, n, n), n, n, n);
            note(
                &mut worst,
                "full vh vh^T = I",
                abs_err(&vvt, &identity(n), 1.0),
            );

            // lu: p l u = a, p a permutation, l unit lower, u upper.
            let (p, lo, up) = (part(10, bi), part(11, bi), part(12, bi));
            let plu = mm(&mm(p, lo, m, m, kk), up, m, kk, n);
            note(&mut worst, "p l u = a", abs_err(&plu, am, scale));
            let perm = p.iter().all(|&x| x == 0.0 || x == 1.0)
                && (0..m).all(|i| (0..m).map(|j| p[i * m + j]).sum::<f64>() == 1.0)
                && (0..m).all(|j| (0..m).map(|i| p[i * m + j]).sum::<f64>() == 1.0);
            let lower_unit = (0..m * kk).all(|x| {
                let (i, j) = (x / kk, x % kk);
                (i > j) || (i == j && lo[x] == 1.0) || (i < j && lo[x] == 0.0)
            });
            *exact
                .entry("p permutation, l unit lower, u upper")
                .or_insert(true) &=
                perm && lower_unit && (0..kk * n).all(|x| x / n <= x % n || up[x] == 0.0);

            if numpy {
                let np = |what: &str| {
                    let a = fx.get(&format!("{k}/{what}"));
                    let len = a.data.len() / batch;
                    a.data[bi * len..(bi + 1) * len].to_vec()
                };
                // |R| and |Q| are LAPACK's up to the signs of R's rows (Q's columns).
                let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
                note(
                    &mut worst,
                    "|r| = numpy |r|",
                    abs_err(&abs(rr), &abs(&np("qr_r")), scale),
                );
                note(
                    &mut worst,
                    "|q| = numpy |q|",
                    abs_err(&abs(qq), &abs(&np("qr_q")), 1.0),
                );
                let s_np = np("svdvals");
                note(
                    &mut worst,
                    "s = numpy s",
                    abs_err(sv, &s_np, max_abs(&s_np)),
                );
                let gap = smallest_gap(&s_np, m != n) / max_abs(&s_np);
                note(
                    &mut worst,
                    "|u^T u_np| = I (x gap/||a||)",
                    unsigned_overlap(u, &np("svd_u"), m, kk) * gap,
                );
                let v = transpose(vh, kk, n);
                let v_np = transpose(&np("svd_vh"), kk, n);
                note(
                    &mut worst,
                    "|v^T v_np| = I (x gap/||a||)",
                    unsigned_overlap(&v, &v_np, n, kk) * gap,
                );
                // Partial pivoting without ties: scipy's factors exactly, to rounding.
                *exact.entry("p = scipy p").or_insert(true) &= p == np("lu_p").as_slice();
                note(&mut worst, "l = scipy l", abs_err(lo, &np("lu_l"), 1.0));
                note(&mut worst, "u = scipy u", abs_err(up, &np("lu_u"), scale));
            }
        }
        for (what, (e, t)) in worst {
            ck.check(format!("{k} {what}"), e, t);
        }
        for (what, holds) in exact {
            ck.exact(format!("{k} {what}"), holds);
        }
    }

    // eigh from either triangle, and cholesky's reconstruction.
    for (k, upper, sym) in [
        ("spd5", false, "spd5"),
        ("sym4", false, "sym4"),
        ("sym4", true, "sym4"),
        ("sym4_junk_upper", false, "sym4"),
        ("sym4_junk_lower", true, "sym4"),
    ] {
        let tol = tol_of(&fx, dtype, sym);
        let e = linalg::eigh(&tensor(&c, fx.get(k)), upper);
        let r = run(&c, &[&e.eigenvalues, &e.eigenvectors]);
        let a = &fx.get(sym).data;
        let n = fx.get(sym).shape[0];
        let (w, v) = (&r[0].1, &r[1].1);
        let what = |x: &str| format!("{k} eigh upper={upper} {x}");
        let vw: Vec<f64> = (0..n * n).map(|p| v[p] * w[p % n]).collect();
        let recon = mm(&vw, &transpose(v, n, n), n, n, n);
        ck.check(
            what("v w v^T = a"),
            abs_err(&recon, a, max_abs(a)),
            tol.backward,
        );
        let vtv = mm(&transpose(v, n, n), v, n, n, n);
        ck.check(
            what("v^T v = I"),
            abs_err(&vtv, &identity(n), 1.0),
            tol.backward,
        );
        let w_np = &fx.get(&format!("{sym}/eigvalsh")).data;
        let wmax = max_abs(w_np);
        ck.check(what("w = numpy w"), abs_err(w, w_np, wmax), tol.backward);
        let gap = smallest_gap(w_np, false) / wmax;
        ck.check(
            what("|v^T v_np| = I (x gap/||a||)"),
            unsigned_overlap(v, &fx.get(&format!("{sym}/eigh_v")).data, n, n) * gap,
            tol.backward,
        );
        ck.exact(
            what("ascending, largest entries > 0"),
            w.windows(2).all(|p| p[0] <= p[1]) && largest_entries_positive(v, n, n),
        );
    }
    {
        let tol = tol_of(&fx, dtype, "spd5");
        let a = fx.get("spd5");
        let r = run(&c, &[&linalg::cholesky(&tensor(&c, a), false)]);
        let l = &r[0].1;
        let llt = mm(l, &transpose(l, 5, 5), 5, 5, 5);
        ck.check(
            "spd5 l l^T = a",
            abs_err(&llt, &a.data, max_abs(&a.data)),
            tol.backward,
        );
        ck.exact(
            "spd5 l lower, diag > 0",
            (0..25).all(|x| x / 5 >= x % 5 || l[x] == 0.0) && (0..5).all(|i| l[i * 6] > 0.0),
        );
    }
    ck.finish();
}

#[test]
fn fixture_is_numpys_and_complete() {
    let fx = load();
    for key in ["numpy", "scipy", "seed", "lapack"] {
        assert!(fx.meta.contains_key(key), "meta.{key}");
    }
    let shapes: [(&str, &[usize]); 11] = [
        ("wc4", &[4, 4]),
        ("batch3", &[2, 3, 3]),
        ("spd5", &[5, 5]),
        ("sym4", &[4, 4]),
        ("sym4_junk_upper", &[4, 4]),
        ("sym4_junk_lower", &[4, 4]),
        ("tall", &[6, 4]),
        ("wide", &[3, 5]),
        ("rankdef", &[5, 4]),
        ("ill6", &[6, 6]),
        ("tri5", &[5, 5]),
    ];
    for (name, shape) in shapes {
        assert_eq!(fx.get(name).shape, shape, "{name}");
        let kappa = fx.scalar(&format!("{name}/kappa"));
        assert!(kappa >= 1.0 && kappa.is_finite(), "{name}: kappa {kappa}");
    }
    let ill = fx.scalar("ill6/kappa");
    assert!((5e5..2e6).contains(&ill), "ill6: condition number {ill:e}");
    assert_eq!(fx.scalar("rankdef/lstsq_rank"), 2.0);
    assert!(fx.has("tall/lstsq_res") && !fx.has("wide/lstsq_res"));
    // The one non-finite value, through the fixture's "-inf" string.
    assert_eq!(fx.scalar("sing4/slogdet_logabsdet"), f64::NEG_INFINITY);
    assert!(fx
        .arrays
        .iter()
        .filter(|(k, _)| *k != "sing4/slogdet_logabsdet")
        .all(|(_, a)| a.data.iter().all(|x| x.is_finite())));
}

/// An exactly singular matrix whose f64 elimination meets exact zero pivots before the
/// last one (`sing4`, small integers; OpenBLAS's `getrf` and faer's round to the same
/// exact multipliers): numpy's det 0 and slogdet (0, -inf), scipy's lu exactly (finite:
/// LAPACK leaves a zero pivot's column unscaled), and solve and inv fail as numpy's
/// `LinAlgError: Singular matrix` does. f64 only: in f32 the multiplier 2.625 / 3.5
/// rounds, the third pivot is 1.5e-7 rather than 0 and the matrix is merely
/// ill-conditioned (numpy itself computes f32 input in f64).
fn exactly_singular(dtype: DType) {
    let fx = load();
    let c = ctx(dtype);
    let a = tensor(&c, fx.get("sing4"));
    let sl = linalg::slogdet(&a);
    let lu = linalg::lu(&a);
    let r = run(
        &c,
        &[
            &linalg::det(&a),
            &sl.sign,
            &sl.logabsdet,
            &lu.p,
            &lu.l,
            &lu.u,
        ],
    );
    let mut ck = Checks::new(dtype);
    for (i, name) in [
        "det",
        "slogdet_sign",
        "slogdet_logabsdet",
        "lu_p",
        "lu_l",
        "lu_u",
    ]
    .iter()
    .enumerate()
    {
        let want = &fx.get(&format!("sing4/{name}")).data;
        ck.exact(
            format!("sing4 {name} = numpy's exactly {:?}", r[i].1),
            r[i].1 == *want,
        );
    }
    let b = c.ones(&[4, 1]).cast(dtype);
    for (what, t) in [("solve", linalg::solve(&a, &b)), ("inv", linalg::inv(&a))] {
        let err = t.eval().map(|_| ()).map_err(|e| e.to_string());
        ck.exact(
            format!("sing4 {what} fails as singular: {err:?}"),
            matches!(&err, Err(e) if e.contains("singular")),
        );
    }
    ck.finish();
}

#[test]
fn values_match_numpy_f64() {
    values(DType::F64);
}

#[test]
fn values_match_numpy_f32() {
    values(DType::F32);
}

#[test]
fn decompositions_match_numpy_up_to_signs_f64() {
    decompositions(DType::F64);
}

#[test]
fn decompositions_match_numpy_up_to_signs_f32() {
    decompositions(DType::F32);
}

#[test]
fn exactly_singular_matrices_are_numpys_f64() {
    exactly_singular(DType::F64);
}
