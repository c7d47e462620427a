//! The context default dtype (ND4J's `setDTypeForContext`): used by every constructor
//! and by float literals, and read from the `default_dtype` key with precedence
//! code > env > file > default. Tests that set variables or a working directory run
//! in a child process (this binary, re-run on one test): the environment is
//! process-global.

use ndfuse::{Config, ConfigSource, Context, DType};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child: what the child test should do instead of returning at once.
const CHILD: &str = "CONFIG_DTYPE_CHILD";

/// The child's entry point: a context made the ordinary ways, reporting the dtype of a
/// constructor, of a literal expression after eval, and where the dtype came from.
#[test]
fn child_entry() {
    let Some(mode) = std::env::var_os(CHILD) else {
        return;
    };
    let ctx = match mode.to_str() {
        Some("builder") => Context::builder().dtype(DType::F64).build(),
        Some("build") => Context::builder().build(),
        _ => Ok(Context::new()),
    };
    let line = match ctx {
        Ok(ctx) => {
            let x = ctx.ones(&[3]);
            let y = (&x * 2.0 + 1).eval().map(|a| a.dtype());
            format!(
                "{} {} {:?} | {}",
                ctx.default_dtype(),
                x.dtype().map_or_else(|e| e.to_string(), |d| d.to_string()),
                y.map(|d| d.to_string()).map_err(|e| e.to_string()),
                ctx.dtype_origin()
            )
        }
        Err(e) => format!("ERROR: {e}"),
    };
    print!("<<<{line}>>>");
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ndfuse-dtype-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Runs `child_entry` in `cwd` in `mode` with only `vars` of ours set; returns its line.
fn child(cwd: &Path, mode: &str, vars: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .current_dir(cwd)
        .env(CHILD, mode);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("NDFUSE_") || k.starts_with("BACKEND_PRIORITY_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    match (stdout.find("<<<"), stdout.find(">>>")) {
        (Some(s), Some(e)) if s + 3 <= e => stdout[s + 3..e].to_string(),
        _ => panic!(
            "child printed no result:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn context_new_takes_the_dtype_from_env_over_file_over_default() {
    let bare = scratch("bare");
    assert_eq!(
        child(&bare, "new", &[]),
        "f32 f32 Ok(\"f32\") | default",
        "nobody set it"
    );

    let with_file = scratch("file");
    std::fs::write(with_file.join("ndfuse.toml"), "default_dtype = \"f64\"\n").expect("write");
    assert_eq!(
        child(&with_file, "new", &[]),
        "f64 f64 Ok(\"f64\") | file ndfuse.toml:1",
        "the file in the working directory"
    );
    assert_eq!(
        child(&with_file, "new", &[("NDFUSE_DEFAULT_DTYPE", "f16")]),
        "f16 f16 Ok(\"f16\") | env NDFUSE_DEFAULT_DTYPE",
        "env over file; the literal does not widen the f16 tensor"
    );
    assert_eq!(
        child(&with_file, "build", &[("NDFUSE_DEFAULT_DTYPE", "bf16")]),
        "bf16 bf16 Ok(\"bf16\") | env NDFUSE_DEFAULT_DTYPE",
        "a builder without a dtype reads the configuration too"
    );
    assert_eq!(
        child(&with_file, "builder", &[("NDFUSE_DEFAULT_DTYPE", "f16")]),
        "f64 f64 Ok(\"f64\") | builder",
        "code over env and file"
    );
}

#[test]
fn a_bad_default_dtype_is_an_error_naming_the_variable() {
    let dir = scratch("bad");
    let built = child(&dir, "build", &[("NDFUSE_DEFAULT_DTYPE", "i32")]);
    assert!(
        built.starts_with("ERROR: ")
            && built.contains("'default_dtype'")
            && built.contains("env NDFUSE_DEFAULT_DTYPE")
            && built.contains("f16, bf16, f32, f64"),
        "{built}"
    );
    // `Context::new` cannot fail: it falls back to f32, and eval reports the mistake.
    let new = child(&dir, "new", &[("NDFUSE_DEFAULT_DTYPE", "half")]);
    assert!(
        new.starts_with("f32 f32 Err(") && new.contains("NDFUSE_DEFAULT_DTYPE"),
        "{new}"
    );
}

#[test]
fn builder_config_gives_the_dtype_and_its_origin_without_the_process_environment() {
    let cfg = Config::builder()
        .config_file(None)
        .environment([("NDFUSE_DEFAULT_DTYPE", "bf16")])
        .build()
        .expect("valid");
    let ctx = Context::builder().config(cfg.clone()).build().expect("ok");
    assert_eq!(ctx.default_dtype(), DType::BF16);
    assert_eq!(
        ctx.dtype_origin(),
        ConfigSource::Env {
            var: "NDFUSE_DEFAULT_DTYPE".into()
        }
    );
    // Code beats the configuration it is given.
    let ctx = Context::builder()
        .config(cfg)
        .dtype(DType::F16)
        .build()
        .expect("ok");
    assert_eq!(
        (ctx.default_dtype(), ctx.dtype_origin()),
        (DType::F16, ConfigSource::Builder)
    );
    // A setter is code too.
    ctx.set_default_dtype(DType::F64).expect("float");
    assert_eq!(ctx.dtype_origin(), ConfigSource::Builder);
    assert!(ctx.set_default_dtype(DType::I32).is_err());
    assert_eq!(
        ctx.default_dtype(),
        DType::F64,
        "a refused dtype changes nothing"
    );
}

/// Every constructor makes the default dtype, and a literal on either side of every
/// arithmetic operator keeps it, through eval, for each of the four float dtypes.
#[test]
fn constructors_and_literals_follow_the_context_dtype_through_eval() {
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let ctx = Context::builder().dtype(dtype).build().expect("float");
        let made = [
            ("scalar", ctx.scalar(2.0)),
            ("full", ctx.full(&[2], 0.5)),
            ("zeros", ctx.zeros(&[2])),
            ("ones", ctx.ones(&[2])),
            ("arange", ctx.arange(0.0, 2.0, 1.0).expect("ok")),
            ("rand_uniform", ctx.rand_uniform(&[2], 0.0, 1.0, 1)),
            ("rand_normal", ctx.rand_normal(&[2], 0.0, 1.0, 1)),
        ];
        for (what, t) in &made {
            assert_eq!(t.dtype().expect("ok"), dtype, "{what} in a {dtype} context");
        }
        let x = ctx.arange(1.0, 5.0, 1.0).expect("ok");
        let exprs = [
            ("x * 2.0", &x * 2.0),
            ("2.0 * x", 2.0 * &x),
            ("x + 1", &x + 1),
            ("x / 4.0", &x / 4.0),
            ("1.0 - x", 1.0 - &x),
            ("x * 0.5f32", &x * 0.5f32),
        ];
        let want: [Vec<f64>; 6] = [
            vec![2.0, 4.0, 6.0, 8.0],
            vec![2.0, 4.0, 6.0, 8.0],
            vec![2.0, 3.0, 4.0, 5.0],
            vec![0.25, 0.5, 0.75, 1.0],
            vec![0.0, -1.0, -2.0, -3.0],
            vec![0.5, 1.0, 1.5, 2.0],
        ];
        for ((what, e), want) in exprs.iter().zip(want) {
            let a = e.eval().expect("runs");
            assert_eq!(a.dtype(), dtype, "{what} in a {dtype} context");
            // Small integers and halves are exact in every float dtype.
            assert_eq!(a.to_f64_vec(), want, "{what} in a {dtype} context");
        }
    }
}
