//! End-to-end tests of the `ndfuse` binary: results against numpy-computed `.npy`
//! fixtures (made by `fixtures/make_fixtures.py`, committed so that no test needs
//! Python), every bad-input case (exit status, the one stderr line, no output file
//! left behind), error columns, the JSON report, `explain`, and `bench` (on tiny
//! shapes: the figures themselves are the bench's business, not a test's).

use ndfuse::Array;
use ndfuse_ir::Storage;
use std::path::{Path, PathBuf};
use std::process::Command;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

struct Run {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary in the fixtures folder (so inputs are named by file name).
fn ndfuse(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_ndfuse"))
        .args(args)
        .current_dir(FIXTURES)
        .output()
        .expect("the ndfuse binary runs");
    Run {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A fresh, empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("ndfuse-cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// An output read back with the library's `.npy` reader (the one the binary uses).
fn load(path: &Path) -> Array {
    ndfuse::npy::read_npy(path).unwrap_or_else(|e| panic!("{e}"))
}

fn values(s: &Storage) -> Vec<f64> {
    match s {
        Storage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        Storage::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        Storage::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        Storage::F64(v) => v.clone(),
        Storage::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        Storage::I64(v) => v.iter().map(|&x| x as f64).collect(),
        Storage::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
    }
}

/// Same dtype, same shape, and values within the dtype's tolerance (exact for ints
/// and bools).
fn assert_matches(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let rtol = match want.dtype() {
        ndfuse_ir::DType::F16 | ndfuse_ir::DType::BF16 => 2e-3,
        ndfuse_ir::DType::F32 => 2e-5,
        ndfuse_ir::DType::F64 => 1e-12,
        _ => 0.0,
    };
    for (k, (g, w)) in values(got.as_host().storage())
        .iter()
        .zip(values(want.as_host().storage()))
        .enumerate()
    {
        let ok = g == &w || (g - w).abs() <= rtol * w.abs().max(1e-1) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {k}: ndfuse {g}, numpy {w}");
    }
}

/// (expression, inputs, expected fixture) — the expressions of make_fixtures.py.
const CASES: &[(&str, &[&str], &str)] = &[
    ("sum(exp(a * b + 1), axis=1)", &["a", "b"], "sum_exp"),
    ("softmax(a, axis=-1)", &["a"], "softmax"),
    ("layernorm(a, axis=-1, eps=1e-5)", &["a"], "layernorm"),
    ("-a ** 2", &["a"], "neg_pow"),
    ("where(m, a, -a) + b", &["m", "a", "b"], "where"),
    ("fortran * 2 - 1", &["fortran"], "fortran"),
    ("fortran3", &["fortran3"], "fortran3"),
    ("i + 1", &["i"], "int_add"),
    ("i / 2", &["i"], "int_div"),
    ("i * j", &["i", "j"], "int_mul"),
    ("argmax(a, axis=1)", &["a"], "argmax"),
    ("argmin(a)", &["a"], "argmin_flat"),
    ("a[1:3, ::-2]", &["a"], "slice"),
    ("a[-1]", &["a"], "index"),
    ("transpose(a) * 3", &["a"], "transpose"),
    ("reshape(a, [8, -1])", &["a"], "reshape"),
    ("cast(a, f16)", &["a"], "cast_f16"),
    ("mean(a)", &["a"], "mean_all"),
    ("sum(a, axis=[0, 1], keepdims=true)", &["a"], "sum_keep"),
    ("a > 0", &["a"], "gt"),
    ("maximum(a, 0.5) - minimum(b, 0)", &["a", "b"], "maxmin"),
    ("gelu(a)", &["a"], "gelu"),
    ("var(a, axis=0)", &["a"], "var"),
    ("std(d)", &["d"], "std"),
    ("bigendian + 1", &["bigendian"], "bigendian"),
    ("h * 2", &["h"], "f16_mul"),
    ("2 ** d", &["d"], "lit_pow"),
    (
        "expand_dims(b, axis=0) + squeeze(reshape(b, [8, 1]), axis=1)",
        &["b"],
        "views",
    ),
    ("a @ mw", &["a", "mw"], "matmul"),
    ("a @ mwb", &["a", "mwb"], "matmul_batched"),
];

fn eval_case(expr: &str, inputs: &[&str], out: &Path, extra: &[&str]) -> Run {
    let specs: Vec<String> = inputs.iter().map(|n| format!("{n}={n}.npy")).collect();
    let out = out.to_string_lossy().into_owned();
    let mut args = vec!["eval", expr, "--output", &out];
    for s in &specs {
        args.extend(["--input", s.as_str()]);
    }
    args.extend(extra);
    ndfuse(&args)
}

#[test]
fn eval_matches_numpy_on_every_backend() {
    let dir = scratch("numpy");
    for backend in ["cpu", "interp"] {
        for (expr, inputs, expected) in CASES {
            let out = dir.join(format!("{expected}-{backend}.npy"));
            let r = eval_case(expr, inputs, &out, &["--backend", backend]);
            assert!(r.ok, "{expr} on {backend}: {}", r.stderr);
            let want = load(&Path::new(FIXTURES).join(format!("expected_{expected}.npy")));
            assert_matches(&load(&out), &want, &format!("{expr} on {backend}"));
        }
    }
}

#[test]
fn fortran_order_input_is_read_row_major() {
    let dir = scratch("fortran");
    let out = dir.join("o.npy");
    let r = eval_case("fortran3[1, 2]", &["fortran3"], &out, &[]);
    assert!(r.ok, "{}", r.stderr);
    // Row-major arange(24).reshape(2, 3, 4)[1, 2] is 20, 21, 22, 23.
    assert_eq!(
        load(&out).as_host().storage(),
        &Storage::I32(vec![20, 21, 22, 23])
    );
    assert!(
        r.stdout.starts_with("i32[4]\n[20, 21, 22, 23]"),
        "{}",
        r.stdout
    );
}

#[test]
fn prints_dtype_shape_and_values() {
    let r = ndfuse(&["eval", "-2 ** 2"]);
    assert_eq!((r.ok, r.stdout.as_str()), (true, "i64[]\n-4\n"));
    let r = ndfuse(&["eval", "2 ** -1"]);
    assert_eq!(r.stdout, "f32[]\n0.5\n");
    let r = ndfuse(&["eval", "i[0]", "--input", "i=i.npy"]);
    assert!(r.stdout.starts_with("i32[5]\n["), "{}", r.stdout);
    let r = ndfuse(&["eval", "m[0:2, 0:2]", "--input", "m=m.npy"]);
    assert!(r.stdout.starts_with("bool[2,2]\n[["), "{}", r.stdout);
    // numpy's summarisation: more than 1000 elements show 3 at each edge.
    let r = ndfuse(&["eval", "x", "--random", "x=40x50"]);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "f32[40,50]");
    assert_eq!(lines.len(), 1 + 7, "3 rows, ..., 3 rows: {}", r.stdout);
    assert_eq!(lines[4].trim(), "...,");
    assert_eq!(
        lines[1].matches(", ").count(),
        6,
        "3 + ... + 3 columns: {}",
        lines[1]
    );
}

#[test]
fn random_inputs_are_seeded_per_name() {
    let once = |args: &[&str]| {
        let r = ndfuse(args);
        assert!(r.ok, "{args:?}: {}", r.stderr);
        r.stdout
    };
    let a = once(&["eval", "x", "--random", "x=5"]);
    assert_eq!(a, once(&["eval", "x", "--random", "x=5", "--seed", "0"]));
    assert_ne!(a, once(&["eval", "x", "--random", "x=5", "--seed", "1"]));
    assert_ne!(
        a,
        once(&["eval", "y", "--random", "y=5"]),
        "names get their own streams"
    );
    // Adding an input does not change the others.
    assert_eq!(
        a,
        once(&["eval", "x", "--random", "x=5", "--random", "z=3"])
    );
    assert!(once(&["eval", "x", "--random", "x=5", "--dtype", "f64"]).starts_with("f64[5]"));
    let ints = once(&["eval", "k", "--random", "k=100:i32"]);
    assert!(ints.starts_with("i32[100]"));
    let vals: Vec<i64> = ints
        .lines()
        .skip(1)
        .collect::<String>()
        .replace(['[', ']', '\n'], " ")
        .split(',')
        .map(|v| v.trim().parse().expect("an int"))
        .collect();
    assert!(vals.iter().all(|v| (-10..10).contains(v)), "{vals:?}");
    assert!(once(&["eval", "b", "--random", "b=4:bool"]).starts_with("bool[4]"));
    assert!(once(&["eval", "s * 2", "--random", "s="]).starts_with("f32[]\n"));
}

#[test]
fn report_json_has_the_contract_keys() {
    let r = ndfuse(&[
        "eval",
        "sum(exp(a * b + 1), axis=1)",
        "--input",
        "a=a.npy",
        "--input",
        "b=b.npy",
        "--repeat",
        "3",
        "--report",
        "json",
    ]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        r.stdout.lines().count(),
        1,
        "one JSON object on one line: {}",
        r.stdout
    );
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("valid JSON");
    assert_eq!(v["backend"], "cpu");
    assert_eq!(
        v["kernels"], 1,
        "a * b + 1 and exp fuse into one kernel: {v}"
    );
    assert_eq!(v["repeat"], 3);
    for key in ["compile_ms", "eval_ms"] {
        assert!(v[key].as_f64().is_some_and(|x| x >= 0.0), "{key}: {v}");
    }
    // One kernel with the sum fused in: it reads a (128 B) and b (32 B) and writes
    // f32[4] (16 B).
    assert_eq!(v["bytes_moved"], 128 + 32 + 16);
    assert!(
        v["gbps"].is_null() || v["gbps"].as_f64().is_some_and(|x| x > 0.0),
        "{v}"
    );
    let r = ndfuse(&[
        "eval",
        "a * 2",
        "--input",
        "a=a.npy",
        "--backend",
        "interp",
        "--report",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("valid JSON");
    assert_eq!(
        (v["backend"].as_str(), v["kernels"].as_u64()),
        (Some("interp"), Some(0))
    );
}

#[test]
fn explain_shows_graph_schedule_kernels_and_code() {
    let r = ndfuse(&[
        "explain",
        "softmax(x, axis=-1) * y",
        "--shape",
        "x=4x8",
        "--shape",
        "y=8:f64",
    ]);
    assert!(r.ok, "{}", r.stderr);
    let s = &r.stdout;
    for want in [
        "== inputs\nin0 = x : f32[4,8]\nin1 = y : f64[8]\n",
        "== graph\n%0 = input \"in0\" : f32[4,8]\n",
        "== schedule (backend cpu: 1 kernel, 0 interpreter steps)",
        "== kernels\n",
        "step 0: k0_reduce_max_",
        "reads 192 B, writes 256 B",
        "== code (Cranelift IR",
    ] {
        assert!(s.contains(want), "explain lacks {want:?}:\n{s}");
    }
    // Which fused kernels the JIT compiles yet, and the exact text of the schedule,
    // are pinned by the workspace's snapshot tests; here: the sections are all there.
    // Inputs are numbered in the order the expression first uses them.
    let r = ndfuse(&[
        "explain",
        "y * 2 + x",
        "--shape",
        "x=3",
        "--shape",
        "y=4x3:i32",
    ]);
    assert!(
        r.stdout.contains("in0 = y : i32[4,3]\nin1 = x : f32[3]\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("%0 = input \"in0\" : i32[4,3]"),
        "{}",
        r.stdout
    );
    // An element-wise kernel is JIT-compiled, and its Cranelift IR is shown.
    for want in ["[jit]", "== code (Cranelift IR", "function %k0_"] {
        assert!(r.stdout.contains(want), "lacks {want:?}:\n{}", r.stdout);
    }
    let r = ndfuse(&["explain", "exp(x)", "--shape", "x=3", "--backend", "interp"]);
    assert!(
        r.ok && r.stdout.contains("nothing is fused"),
        "{}",
        r.stdout
    );
}

/// Runs a failing command with `--output` into a fresh folder: non-zero exit, one line
/// on stderr containing `want`, nothing on stdout, and the folder still empty.
fn assert_fails(name: &str, args: &[&str], want: &str) {
    let dir = scratch(&format!("fail-{name}"));
    let out = dir.join("out.npy");
    let out_s = out.to_string_lossy().into_owned();
    let mut all: Vec<&str> = args.to_vec();
    if args.first() == Some(&"eval") {
        all.extend(["--output", &out_s]);
    }
    let r = ndfuse(&all);
    assert!(!r.ok, "{name}: {args:?} should fail");
    assert!(
        r.code.is_some_and(|c| c != 0),
        "{name}: exit status {:?}",
        r.code
    );
    assert_eq!(
        r.stderr.lines().count(),
        1,
        "{name}: one line on stderr:\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(want),
        "{name}: stderr {:?} lacks {want:?}",
        r.stderr
    );
    assert_eq!(r.stdout, "", "{name}");
    let left: Vec<_> = std::fs::read_dir(&dir).expect("scratch").collect();
    assert!(left.is_empty(), "{name}: files left behind: {left:?}");
}

#[test]
fn every_bad_input_fails_with_one_line_and_no_output() {
    let dir = scratch("corrupt");
    let header = |h: &str| {
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend_from_slice(&(h.len() as u16).to_le_bytes());
        v.extend_from_slice(h.as_bytes());
        v
    };
    let files: &[(&str, Vec<u8>)] = &[
        ("magic.npy", b"not an npy file at all".to_vec()),
        ("truncated.npy", {
            let mut v = header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }\n");
            v.extend_from_slice(&[0; 10]);
            v
        }),
        ("header.npy", header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8)")),
        ("uint8.npy", {
            let mut v = header("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }\n");
            v.extend_from_slice(&[1, 2]);
            v
        }),
        ("huge.npy", header("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }\n")),
    ];
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("write fixture");
    }
    let corrupt = |f: &str| format!("x={}", dir.join(f).display());
    let (magic, truncated, hdr, uint8, huge) = (
        corrupt("magic.npy"),
        corrupt("truncated.npy"),
        corrupt("header.npy"),
        corrupt("uint8.npy"),
        corrupt("huge.npy"),
    );
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "missing-file",
            &["eval", "x", "--input", "x=no_such.npy"],
            "error: --input x=no_such.npy: cannot read: No such file",
        ),
        (
            "bad-magic",
            &["eval", "x", "--input", &magic],
            "not a .npy file",
        ),
        (
            "truncated",
            &["eval", "x", "--input", &truncated],
            "truncated: header says f32[4,8] (128 bytes of data) but the file holds 10 bytes",
        ),
        (
            "bad-header",
            &["eval", "x", "--input", &hdr],
            "corrupt .npy header",
        ),
        (
            "bad-npy-dtype",
            &["eval", "x", "--input", &uint8],
            "unsupported dtype '|u1' (uint8)",
        ),
        ("huge-shape", &["eval", "x", "--input", &huge], "too large"),
        (
            "shape-mismatch",
            &["eval", "a + j", "--input", "a=a.npy", "--input", "j=j.npy"],
            "error at column 3: add: shapes f32[4,8] and i64[5] do not broadcast",
        ),
        (
            "unknown-input",
            &["eval", "a + q", "--input", "a=a.npy"],
            "error at column 5: unknown input 'q' (inputs: a)",
        ),
        (
            "bad-random-dtype",
            &["eval", "x", "--random", "x=3:f8"],
            "--random x=3:f8: unknown dtype 'f8'",
        ),
        (
            "bad-dtype-flag",
            &["eval", "x", "--random", "x=3", "--dtype", "f8"],
            "invalid value 'f8' for '--dtype <DTYPE>'",
        ),
        (
            "bad-shape",
            &["eval", "x", "--random", "x=4x-4"],
            "bad shape '4x-4'",
        ),
        (
            "bad-shape-comma",
            &["eval", "x", "--shape-typo", "x=4,4"],
            "unexpected argument",
        ),
        (
            "bad-name",
            &["eval", "x", "--random", "2x=4"],
            "'2x' is not a valid input name",
        ),
        (
            "no-equals",
            &["eval", "x", "--input", "a.npy"],
            "--input a.npy: expected NAME=...",
        ),
        (
            "duplicate",
            &["eval", "x", "--random", "x=3", "--input", "x=a.npy"],
            "input 'x' is given more than once",
        ),
        (
            "bf16-output",
            &["eval", "x", "--random", "x=3:bf16"],
            "numpy has no bf16 dtype",
        ),
        (
            "cuda",
            &["eval", "x", "--random", "x=3", "--backend", "cuda"],
            "backend cuda is not available",
        ),
        (
            "bad-backend",
            &["eval", "x", "--random", "x=3", "--backend", "gpu"],
            "[possible values: auto, cpu, cuda, interp]",
        ),
        (
            "zero-repeat",
            &["eval", "x", "--random", "x=3", "--repeat", "0"],
            "--repeat",
        ),
        (
            "axis",
            &["eval", "sum(a, axis=2)", "--input", "a=a.npy"],
            "error at column 1: sum: axis 2 is out of range for f32[4,8] (rank 2)",
        ),
        (
            "reshape",
            &["eval", "reshape(a, [3, -1])", "--input", "a=a.npy"],
            "cannot reshape f32[4,8] (32 elements) into [3,-1]",
        ),
        (
            "bool-arith",
            &["eval", "m + 1", "--input", "m=m.npy"],
            "error at column 3: add",
        ),
        (
            "missing-expr",
            &["eval"],
            "required arguments were not provided: <EXPR>",
        ),
        (
            "explain-no-shape",
            &["explain", "x + 1"],
            "unknown input 'x' (no inputs given: add --shape NAME=SHAPE[:DTYPE])",
        ),
        (
            "bench-no-case",
            &["bench", "nosuchcase", "--tiny"],
            "error: bench: no case matches 'nosuchcase' (cases: gelu, chain,",
        ),
        ("bench-zero-repeat", &["bench", "--repeat", "0"], "--repeat"),
    ];
    for (name, args, want) in cases {
        assert_fails(name, args, want);
    }
}

#[test]
fn a_failed_run_leaves_an_existing_output_untouched() {
    let dir = scratch("untouched");
    let out = dir.join("out.npy");
    std::fs::write(&out, b"precious").expect("write");
    let out_s = out.to_string_lossy().into_owned();
    let r = ndfuse(&[
        "eval", "a + j", "--input", "a=a.npy", "--input", "j=j.npy", "--output", &out_s,
    ]);
    assert!(!r.ok);
    assert_eq!(std::fs::read(&out).expect("still there"), b"precious");
    // A successful run replaces it completely, with no temporary file left over.
    let r = ndfuse(&["eval", "a * 1", "--input", "a=a.npy", "--output", &out_s]);
    assert!(r.ok, "{}", r.stderr);
    assert_matches(
        &load(&out),
        &load(&Path::new(FIXTURES).join("a.npy")),
        "overwrite",
    );
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 1);
    // A directory is not a file to write.
    let d = dir.to_string_lossy().into_owned();
    let r = ndfuse(&["eval", "a", "--input", "a=a.npy", "--output", &d]);
    assert!(!r.ok && r.stderr.contains("is a directory"), "{}", r.stderr);
}

#[test]
fn expression_errors_name_the_column() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "exp(a) + 1.5 * exq(a)",
            16,
            "unknown function 'exq' (did you mean 'exp'?)",
        ),
        ("a + * b", 5, "expected an operand, found '*'"),
        ("a < b < c", 7, "chained comparison"),
        ("exp(a, a)", 8, "exp() takes at most 1 argument (x), got 2"),
        ("sum(a, axes=1)", 8, "sum() has no keyword 'axes'"),
        ("sum(a, axis=1.5)", 13, "axis must be an integer"),
        ("softmax(a, eps=1)", 12, "softmax() has no keyword 'eps'"),
        ("where(m, a)", 1, "where() is missing argument 'y'"),
        ("a + 1.2.3", 5, "bad literal '1.2.3'"),
        (
            "a + 99999999999999999999",
            5,
            "bad literal '99999999999999999999': integer out of range",
        ),
        ("cast(a, f8)", 9, "unknown dtype 'f8'"),
        ("a[1:2, 3, 4]", 2, "too many indices"),
        ("a[9]", 3, "index 9 is out of bounds for axis 0 with size 4"),
        ("a[::0]", 5, "slice step cannot be zero"),
        ("(a + b", 7, "expected ')' to close the '(' at column 1"),
        ("a & m", 3, "unexpected character '&' (use and(a, b))"),
        ("a // 2", 3, "floor division"),
        ("exp", 1, "exp is a function"),
        (
            "exp(a) * transpose(a, [0, 2])",
            10,
            "permute: [0,2] is not a permutation",
        ),
        (
            "log(a) + matmul(a, a)",
            10,
            "matmul: f32[4,8] @ f32[4,8]: 8 != 4",
        ),
        ("b @ a", 3, "matmul: f32[8] @ f32[4,8]: 8 != 4"),
        ("a * 2 @ m", 7, "matmul: bool[4,8] is not allowed"),
        ("2 @ a", 3, "matmul: a literal has no matrix product"),
        ("a.T", 2, "write transpose(x) for x.T"),
        ("sum(a, keepdims=1)", 17, "keepdims must be true or false"),
        ("a + 1 = 2", 7, "use == to compare"),
        (
            "take(a, b, axis=1)",
            1,
            "take: f32[8] is not allowed: indices must be integers",
        ),
        (
            "concat([a, b], axis=1)",
            1,
            "concat: f32[4,8] and f32[8] must agree on every axis but axis 1",
        ),
        ("concat([], axis=0)", 1, "concat: no tensors to join"),
        ("pad(a, [[1, -1], [0, 0]])", 13, "pad width -1 is negative"),
        ("pad(a, 1, mode='wrap')", 16, "unknown pad mode 'wrap'"),
        ("pad(a, 1, mode='edge)", 16, "unterminated string"),
        (
            "pad(a, [[0, 0], [8, 0]], mode=\"reflect\")",
            1,
            "pad: reflect widths (8, 0) on axis 1 of extent 8: at most 7 each for f32[4,8]",
        ),
        (
            "top_k(a, 9)",
            1,
            "top_k: k = 9 is more than the 8 positions of the last axis (axis 1) of f32[4,8]",
        ),
        ("arange(0, 4, 0)", 14, "the step must not be zero"),
        ("one_hot(a, 3)", 1, "one_hot: f32[4,8] is not allowed"),
        ("a + 'x'", 5, "a string is only allowed as an argument"),
    ];
    for (expr, col, want) in cases {
        let r = ndfuse(&[
            "eval", expr, "--input", "a=a.npy", "--input", "b=b.npy", "--input", "m=m.npy",
        ]);
        let line = r.stderr.trim_end();
        assert!(!r.ok, "{expr} should fail");
        let prefix = format!("error at column {col}: ");
        assert!(
            line.starts_with(&prefix) && line.contains(want),
            "{expr}: got {line:?}, want {prefix}...{want}"
        );
    }
}

#[test]
fn explain_shows_the_cuda_c_without_a_gpu() {
    let r = ndfuse(&[
        "explain",
        "softmax(x, axis=-1)",
        "--shape",
        "x=64x4096",
        "--backend",
        "cuda",
    ]);
    assert!(r.ok, "{}", r.stderr);
    for want in [
        "== code (CUDA C, as NVRTC compiles it, with its launches)",
        "// launch k0_",
        "extern \"C\" __global__ void __launch_bounds__(256) k0_",
        "block per row, 256 threads per block, row in registers (16 per lane)",
        "__shfl_xor_sync",
    ] {
        assert!(r.stdout.contains(want), "lacks {want:?}:\n{}", r.stdout);
    }
}

#[test]
fn backends_lists_what_is_built() {
    let r = ndfuse(&["backends"]);
    assert!(r.ok);
    for want in [
        "cpu     available",
        "interp  available",
        "cuda    not available",
        "auto picks: cpu",
        "max_grid_size               = 4096  (default)",
        "default_dtype               = f32  (default)",
    ] {
        assert!(r.stdout.contains(want), "lacks {want:?}:\n{}", r.stdout);
    }
    // Where each value came from: an ND4J-style priority set in the environment...
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ndfuse"))
        .arg("backends")
        .env("BACKEND_PRIORITY_CPU", "7")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("backend_priority_cpu        = 7  (env BACKEND_PRIORITY_CPU)"),
        "{text}"
    );
    // ...and a value that does not parse is one clear error naming the variable.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ndfuse"))
        .arg("backends")
        .env("BACKEND_PRIORITY_CPU", "abc")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("BACKEND_PRIORITY_CPU"),
        "{err}"
    );
}

#[test]
fn bench_prints_a_table_and_json_with_the_contract_keys() {
    let r = ndfuse(&["bench", "--tiny", "gelu"]);
    assert!(r.ok, "{}", r.stderr);
    for want in [
        "memory bandwidth (STREAM-like",
        "machine bandwidth = the largest:",
        "| case | expression |",
        "| gelu | `gelu(x)` | x: f32[1024] |",
        "| gelu_f16 |",
        "tiny shapes",
    ] {
        assert!(r.stdout.contains(want), "lacks {want:?}:\n{}", r.stdout);
    }
    // Not a terminal: no progress lines.
    assert_eq!(r.stderr, "");

    let r = ndfuse(&["bench", "--tiny", "--json", "--repeat", "2", "compile"]);
    assert!(r.ok, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("one JSON object");
    let bw = &v["machine"]["bandwidth"];
    assert!(v["machine"]["cores"].as_u64().is_some_and(|c| c >= 1));
    for key in [
        "copy_1t_gbps",
        "triad_1t_gbps",
        "copy_all_gbps",
        "triad_all_gbps",
        "gbps",
    ] {
        assert!(bw[key].as_f64().is_some_and(|g| g > 0.0), "{key}: {bw}");
    }
    assert!(bw["source"].as_str().is_some_and(|s| s.contains("thread")));
    let rows = v["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["compile_new", "compile_cached"]);
    for row in rows {
        assert_eq!(row["backend"], "cpu");
        assert_eq!(row["kernels"], 1, "{row}");
        assert!(
            row["runs"].as_u64().is_some_and(|n| (1..=2).contains(&n)),
            "{row}"
        );
        assert!(row["median_ms"].as_f64().is_some());
        // Latency rows have no bandwidth figures.
        assert!(row["gbps"].is_null() && row["fraction_of_bandwidth"].is_null());
    }
    // A new graph is compiled on every run; the cached one never is.
    assert!(rows[0]["compiled_kernels"].as_u64().is_some_and(|n| n >= 1));
    assert_eq!(rows[1]["compiled_kernels"], 0);
}

/// `cpu_threads` sizes the worker pool; the results are the same bits whatever it is.
#[test]
fn cpu_threads_changes_the_pool_not_the_bits() {
    let dir = std::env::temp_dir().join(format!("ndfuse-cpu-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let mut files = Vec::new();
    for threads in ["1", "3"] {
        let out = dir.join(format!("out{threads}.npy"));
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_ndfuse"))
            .args([
                "eval",
                "softmax(x, axis=-1) + sum(x * x, axis=0)",
                "--random",
                "x=700x300",
            ])
            .arg("--output")
            .arg(&out)
            .env("NDFUSE_CPU_THREADS", threads)
            .status()
            .expect("runs");
        assert!(status.success());
        files.push(std::fs::read(&out).expect("written"));
    }
    assert_eq!(files[0], files[1], "1 and 3 worker threads differ");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The library's `Context::evaluate` gives the CLI's result bit for bit: the CLI is a
/// shell over the same expression language.
#[test]
fn the_library_evaluates_expressions_as_the_cli_does() {
    let dir = scratch("library");
    let ctx = ndfuse::Context::new();
    for (expr, inputs, expected) in CASES {
        let out = dir.join(format!("{expected}.npy"));
        let r = eval_case(expr, inputs, &out, &["--backend", "cpu"]);
        assert!(r.ok, "{expr}: {}", r.stderr);
        let tensors: Vec<ndfuse::Tensor> = inputs
            .iter()
            .map(|n| ctx.load_npy(Path::new(FIXTURES).join(format!("{n}.npy"))))
            .collect::<Result<_, _>>()
            .expect("fixtures load");
        let named: Vec<(&str, &ndfuse::Tensor)> = inputs.iter().copied().zip(&tensors).collect();
        let got = ctx
            .evaluate(expr, &named)
            .expect("the library evaluates it");
        assert_eq!(got, load(&out), "{expr}: library and CLI differ");
    }
}

#[test]
fn matmul_errors_exit_1_with_one_line_naming_the_column_of_the_at() {
    for (args, want) in [
        (
            &[
                "eval",
                "exp(a) + mw @ a",
                "--input",
                "a=a.npy",
                "--input",
                "mw=mw.npy",
            ][..],
            "error at column 13: matmul: f32[8,3] @ f32[4,8]: 3 != 4",
        ),
        (
            &["eval", "a @ s", "--input", "a=a.npy", "--random", "s="][..],
            "error at column 3: matmul: f32[] is not allowed",
        ),
        (
            &[
                "eval", "x @ y", "--random", "x=2x4x8", "--random", "y=3x8x5",
            ][..],
            "error at column 3: matmul: shapes f32[2,4,8] and f32[3,8,5] do not broadcast",
        ),
    ] {
        let r = ndfuse(args);
        assert_eq!(r.code, Some(1), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(r.stderr.starts_with(want), "{args:?}: {:?}", r.stderr);
        assert!(
            !r.stderr.contains(".rs:"),
            "no Rust call site: {}",
            r.stderr
        );
        assert_eq!(r.stdout, "");
    }
}

#[test]
fn explain_shows_the_matmul_node_and_the_product_in_its_kernel() {
    let r = ndfuse(&[
        "explain",
        "gelu(x @ w + b) + r",
        "--shape",
        "x=64x32",
        "--shape",
        "w=32x48",
        "--shape",
        "b=48",
        "--shape",
        "r=64x48",
    ]);
    assert!(r.ok, "{}", r.stderr);
    let s = &r.stdout;
    for want in [
        "%2 = matmul %0, %1 : f32[64,48]",
        // One kernel: the product and its whole epilogue.
        "== schedule (backend cpu: 1 kernel,",
        "stored: output of the graph",
        // The product is the kernel's last input, filled from in0 and in1.
        "  in4 = matmul in0 [64,32] strides=(32,1) offset=0, in1 [32,48] strides=(48,1) offset=0 : f32",
    ] {
        assert!(s.contains(want), "explain lacks {want:?}:\n{s}");
    }
    // A batched product of a transposed operand reads it through strides.
    let r = ndfuse(&[
        "explain",
        "x @ transpose(w, [0, 2, 1])",
        "--shape",
        "x=2x3x4",
        "--shape",
        "w=2x5x4",
    ]);
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("in1 [2,4,5] strides=(20,1,4) offset=0 : f32"),
        "{}",
        r.stdout
    );
}

/// Whether a huge allocation fails at malloc here: Linux's default heuristic
/// overcommit (mode 0) and strict accounting (mode 2) refuse one larger than the memory
/// and swap; "always" (mode 1) grants it lazily and the fill would be killed instead.
fn huge_allocations_fail() -> bool {
    match std::fs::read_to_string("/proc/sys/vm/overcommit_memory") {
        Ok(mode) => mode.trim() != "1",
        Err(_) => {
            eprintln!("skipped: no /proc/sys/vm/overcommit_memory to tell how malloc behaves");
            false
        }
    }
}

/// Total memory and swap, bytes (Linux).
fn memory_and_swap() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u128> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:")?) * 1024)
}

/// Asserts a failed run: exit status 1, one stderr line starting with `prefix`, no
/// signal (an abort or a stack overflow would show as `code: None`).
fn assert_one_line_error(r: &Run, prefix: &str) {
    assert_eq!(
        r.code,
        Some(1),
        "exit status (None: killed by a signal); stderr: {}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    assert!(
        r.stderr.starts_with(prefix),
        "{:?} should start with {prefix:?}",
        r.stderr
    );
}

#[test]
fn inputs_too_large_for_the_memory_are_one_line_not_an_abort() {
    // Bytes beyond isize::MAX: refused before any allocation, on every machine.
    let r = ndfuse(&["eval", "x+1", "--random", "x=1152921504606846976:f64"]);
    assert_one_line_error(
        &r,
        "error: --random x=1152921504606846976:f64: out of memory: 9223372036854775808 bytes",
    );
    let r = ndfuse(&["explain", "x+1", "--shape", "x=2305843009213693952x1"]);
    assert_one_line_error(
        &r,
        "error: --shape x=2305843009213693952x1: out of memory: 9223372036854775808 bytes",
    );
    // Bytes beyond usize: refused while the shape is read.
    let r = ndfuse(&["explain", "x+1", "--shape", "x=4611686018427387904x4"]);
    assert_one_line_error(&r, "error: --shape x=4611686018427387904x4: shape '4611686018427387904x4' is too large to allocate");
    if !huge_allocations_fail() {
        eprintln!("skipped the malloc cases: overcommit_memory is 1 (always)");
        return;
    }
    // 8 TB: more than this machine has, so malloc itself says no.
    let r = ndfuse(&["eval", "x+1", "--random", "x=1000000x1000000"]);
    assert_one_line_error(
        &r,
        "error: --random x=1000000x1000000: out of memory: 8000000000000 bytes",
    );
    let r = ndfuse(&["explain", "x+1", "--shape", "x=1000000x1000000"]);
    assert_one_line_error(
        &r,
        "error: --shape x=1000000x1000000: out of memory: 4000000000000 bytes",
    );
    // An output of 4 TB from an input of 4 MB: the runtime's buffer, after the cache
    // was emptied and the allocation retried.
    let r = ndfuse(&[
        "eval",
        "reshape(x,[-1,1]) + reshape(x,[1,-1])",
        "--random",
        "x=1000000",
    ]);
    assert_one_line_error(
        &r,
        "error: evaluation failed: out of memory: 4000000000000 bytes",
    );
    // The issue's own case, where it is larger than the memory and swap here.
    if memory_and_swap().is_some_and(|m| m < 80_000_000_000) {
        let r = ndfuse(&["eval", "x+1", "--random", "x=100000x100000"]);
        assert_one_line_error(
            &r,
            "error: --random x=100000x100000: out of memory: 80000000000 bytes",
        );
    }
}

#[test]
fn deep_nesting_is_one_line_not_a_stack_overflow() {
    // Linux caps one argument at 128 KiB, so 26,000 `exp(` is about the deepest call
    // nesting a command line can carry (the library test in frontend/tests/expr.rs goes
    // to 100,000); a stack overflow would show here as a signal, not as exit status 1.
    let deep =
        |open: &str, n: usize, close: &str| format!("{}x{}", open.repeat(n), close.repeat(n));
    let cases = [
        (deep("exp(", 26_000, ")"), 401),
        (deep("(", 60_000, ")"), 101),
        (format!("x{}", "+1".repeat(60_000)), 199),
        (format!("x{}", "[::1]".repeat(20_000)), 495),
        (format!("{}x", "-".repeat(100_000)), 101),
    ];
    for (expr, column) in cases {
        let r = ndfuse(&["eval", &expr, "--random", "x=3"]);
        assert_one_line_error(
            &r,
            &format!("error at column {column}: expression nested deeper than 100 levels"),
        );
    }
    // The limit itself evaluates.
    let r = ndfuse(&["eval", &deep("exp(", 99, ")"), "--random", "x=3"]);
    assert!(r.ok, "{}", r.stderr);
}

/// The indexing family through the command, with values worked out by hand from
/// numpy's semantics (inputs written here, so no new fixture is needed), on the cpu
/// backend and the interpreter.
#[test]
fn indexing_expressions_evaluate_on_every_backend() {
    let dir = scratch("indexing");
    let x = ndfuse::Context::new()
        .from_vec(vec![3.0f32, 1.0, 2.0, 0.0, 5.0, 4.0], &[2, 3])
        .and_then(|t| t.eval())
        .expect("input");
    let xs = dir.join("x.npy");
    ndfuse::npy::write_npy(&xs, &x).expect("write input");
    let input = format!("x={}", xs.display());
    let cases: &[(&str, &[usize], &[f64])] = &[
        ("take(x, arange(-1, 1), axis=1)", &[2, 2], &[2., 3., 4., 0.]),
        (
            "take_along_axis(x, argsort(x, axis=1), axis=1)",
            &[2, 3],
            &[1., 2., 3., 0., 4., 5.],
        ),
        (
            "index_add(x, arange(1, -1, -1), x, axis=0)",
            &[2, 3],
            &[3., 6., 6., 3., 6., 6.],
        ),
        (
            "concat([x, x], axis=1)",
            &[2, 6],
            &[3., 1., 2., 3., 1., 2., 0., 5., 4., 0., 5., 4.],
        ),
        (
            "stack([x, x], axis=0)",
            &[2, 2, 3],
            &[3., 1., 2., 0., 5., 4., 3., 1., 2., 0., 5., 4.],
        ),
        (
            "pad(x, [[0, 0], [2, 1]], mode='reflect')",
            &[2, 6],
            &[2., 1., 3., 1., 2., 1., 4., 5., 0., 5., 4., 5.],
        ),
        (
            "pad(x, [[1, 0], [0, 0]], value=9)",
            &[3, 3],
            &[9., 9., 9., 3., 1., 2., 0., 5., 4.],
        ),
        ("cumsum(x, axis=1)", &[2, 3], &[3., 4., 6., 0., 5., 9.]),
        ("cumprod(x, axis=0)", &[2, 3], &[3., 1., 2., 0., 5., 8.]),
        (
            "one_hot(arange(3), 3) * 2",
            &[3, 3],
            &[2., 0., 0., 0., 2., 0., 0., 0., 2.],
        ),
        (
            "tril(x, k=0) + triu(x, k=1)",
            &[2, 3],
            &[3., 1., 2., 0., 5., 4.],
        ),
        ("sort(x, axis=-1)", &[2, 3], &[1., 2., 3., 0., 4., 5.]),
        ("top_k(x, 2)", &[2, 2], &[3., 2., 5., 4.]),
        ("arange(6) * 1.0", &[6], &[0., 1., 2., 3., 4., 5.]),
    ];
    for backend in ["cpu", "interp"] {
        for (k, (expr, shape, want)) in cases.iter().enumerate() {
            let out = dir.join(format!("out-{k}-{backend}.npy"));
            let out_s = out.to_string_lossy().into_owned();
            let r = ndfuse(&[
                "eval",
                expr,
                "--input",
                &input,
                "--output",
                &out_s,
                "--backend",
                backend,
            ]);
            assert!(r.ok, "{expr} on {backend}: {}", r.stderr);
            let got = load(&out);
            assert_eq!(got.shape(), *shape, "{expr} on {backend}");
            assert_eq!(
                values(got.as_host().storage()),
                *want,
                "{expr} on {backend}"
            );
        }
    }
}

/// An index out of range is found when the expression runs: one line, a non-zero
/// exit, no output file.
#[test]
fn an_index_out_of_range_fails_with_one_line_and_no_output() {
    for backend in ["cpu", "interp"] {
        assert_fails(
            &format!("take-oob-{backend}"),
            &[
                "eval",
                "take(b, arange(4) * 3, axis=0)",
                "--input",
                "b=b.npy",
                "--backend",
                backend,
            ],
            "index 9 is out of range for axis 0 of extent 8",
        );
        assert_fails(
            &format!("index-add-oob-{backend}"),
            &[
                "eval",
                "index_add(a, arange(-5, -1), a, axis=0)",
                "--input",
                "a=a.npy",
                "--backend",
                backend,
            ],
            "index -5 is out of range",
        );
    }
}
