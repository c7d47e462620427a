//! `Config`: precedence default < file < env < builder, errors that name key, source and
//! the nearest key, and `explain()`'s provenance. Tests that set variables run in a child
//! process (this binary, re-run on one test), since the environment is process-global.

use ndfuse_runtime::{Config, ConfigError, ConfigSource, KEYS};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child: what the child test should do instead of returning at once.
const CHILD: &str = "CONFIG_TEST_CHILD";
/// `key=value;key=value` applied with the builder in the child.
const CHILD_BUILDER: &str = "CONFIG_TEST_BUILDER";

/// The child's entry point: loads the configuration the real way (process environment,
/// working directory) and prints `explain()` or the error between markers.
#[test]
fn child_entry() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mut b = Config::builder();
    for kv in std::env::var(CHILD_BUILDER).unwrap_or_default().split(';') {
        if let Some((k, v)) = kv.split_once('=') {
            b = b.set(k, v);
        }
    }
    match b.build() {
        Ok(cfg) => print!("<<<\n{}>>>\n", cfg.explain()),
        Err(e) => print!("<<<\nERROR: {e}\n>>>\n"),
    }
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ndfuse-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Runs `child_entry` in `cwd` with only `vars` of ours set (inherited NDFUSE_* and
/// BACKEND_PRIORITY_* removed) and `builder` applied; returns what it printed.
fn child(cwd: &Path, vars: &[(&str, &str)], builder: &str) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .current_dir(cwd)
        .env(CHILD, "1")
        .env(CHILD_BUILDER, builder);
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
    let start = stdout.find("<<<\n").map(|i| i + 4);
    let end = stdout.find(">>>");
    match (start, end) {
        (Some(s), Some(e)) if s <= e => stdout[s..e].to_string(),
        _ => panic!(
            "child printed no result:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The `explain()` line of `key`.
fn line<'a>(explain: &'a str, key: &str) -> &'a str {
    explain
        .lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no line for {key} in\n{explain}"))
}

/// Builder with no file and an empty environment: the parent's own variables must not
/// leak into in-process tests.
fn isolated() -> ndfuse_runtime::ConfigBuilder {
    Config::builder()
        .config_file(None)
        .environment(Vec::<(String, String)>::new())
}

#[test]
fn precedence_default_file_env_builder() {
    let dir = scratch("precedence");
    std::fs::write(
        dir.join("ndfuse.toml"),
        "# ndfuse settings\nmax_grid_size = 1\nmax_block_size = 2\ncpu_threads = 3\ndebug = 1\n",
    )
    .expect("write ndfuse.toml");
    let out = child(
        &dir,
        &[
            ("NDFUSE_MAX_BLOCK_SIZE", "20"),
            ("NDFUSE_CPU_THREADS", "30"),
            ("BACKEND_PRIORITY_CPU", "7"),
        ],
        "cpu_threads=300",
    );
    // default: nobody set it.
    assert_eq!(
        line(&out, "backend_priority_gpu")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["backend_priority_gpu", "=", "100", "(default)"]
    );
    // file only.
    assert!(
        line(&out, "max_grid_size").contains("= 1  (file ndfuse.toml:2)"),
        "{out}"
    );
    assert!(
        line(&out, "debug").contains("= 1  (file ndfuse.toml:5)"),
        "{out}"
    );
    // env over file.
    assert!(
        line(&out, "max_block_size").contains("= 20  (env NDFUSE_MAX_BLOCK_SIZE)"),
        "{out}"
    );
    // ND4J's alias.
    assert!(
        line(&out, "backend_priority_cpu").contains("= 7  (env BACKEND_PRIORITY_CPU)"),
        "{out}"
    );
    // builder over env over file.
    assert!(
        line(&out, "cpu_threads").contains("= 300  (builder)"),
        "{out}"
    );
}

#[test]
fn ndfuse_config_names_the_file_over_the_working_directory() {
    let dir = scratch("named");
    std::fs::write(dir.join("ndfuse.toml"), "max_grid_size = 1\n").expect("write");
    let other = dir.join("other.toml");
    std::fs::write(&other, "max_grid_size = 2\n").expect("write");
    let out = child(
        &dir,
        &[("NDFUSE_CONFIG", other.to_str().expect("utf-8 path"))],
        "",
    );
    assert!(line(&out, "max_grid_size").contains("= 2  (file "), "{out}");
    assert!(
        line(&out, "max_grid_size").contains("other.toml:1)"),
        "{out}"
    );
}

#[test]
fn no_file_means_defaults() {
    let dir = scratch("nofile");
    let out = child(&dir, &[], "");
    for k in KEYS {
        assert!(line(&out, k.name).ends_with("(default)"), "{out}");
    }
}

#[test]
fn ndfuse_config_naming_a_missing_file_is_an_error() {
    let dir = scratch("missing");
    let out = child(&dir, &[("NDFUSE_CONFIG", "/nonexistent/ndfuse.toml")], "");
    assert!(
        out.starts_with("ERROR: NDFUSE_CONFIG=\"/nonexistent/ndfuse.toml\": no such file"),
        "{out}"
    );
}

#[test]
fn non_integer_priority_names_the_variable() {
    let dir = scratch("prio");
    let out = child(&dir, &[("BACKEND_PRIORITY_CPU", "abc")], "");
    assert!(out.contains("ERROR: bad value \"abc\" for 'backend_priority_cpu' in env BACKEND_PRIORITY_CPU: expected an integer"), "{out}");
    let out = child(&dir, &[("BACKEND_PRIORITY_GPU", "1.5")], "");
    assert!(out.contains("env BACKEND_PRIORITY_GPU"), "{out}");
}

#[test]
fn ndfuse_spelling_beats_nd4j_alias_and_dump_alias_works() {
    let dir = scratch("alias");
    let out = child(
        &dir,
        &[
            ("BACKEND_PRIORITY_GPU", "5"),
            ("NDFUSE_BACKEND_PRIORITY_GPU", "6"),
            ("NDFUSE_DUMP", "/tmp/d"),
            // Test switches are not keys and are let through.
            ("NDFUSE_REQUIRE_CUDA", "0"),
        ],
        "",
    );
    assert!(
        line(&out, "backend_priority_gpu").contains("= 6  (env NDFUSE_BACKEND_PRIORITY_GPU)"),
        "{out}"
    );
    assert!(
        line(&out, "dump_dir").contains("= /tmp/d  (env NDFUSE_DUMP)"),
        "{out}"
    );
}

#[test]
fn unknown_env_var_suggests_the_variable() {
    let dir = scratch("unknown-env");
    let out = child(&dir, &[("NDFUSE_MAX_GRID_SZIE", "8")], "");
    assert!(
        out.contains("unknown key 'max_grid_szie' in env NDFUSE_MAX_GRID_SZIE; did you mean 'NDFUSE_MAX_GRID_SIZE'?"),
        "{out}"
    );
}

#[test]
fn unknown_file_key_suggests_the_key_with_file_and_line() {
    let dir = scratch("unknown-file");
    std::fs::write(dir.join("ndfuse.toml"), "debug = 0\nmax_grid_szie = 8\n").expect("write");
    let out = child(&dir, &[], "");
    assert!(
        out.contains(
            "unknown key 'max_grid_szie' in file ndfuse.toml:2; did you mean 'max_grid_size'?"
        ),
        "{out}"
    );
}

#[test]
fn unknown_builder_key_suggests_the_key() {
    let e = isolated()
        .set("alow_multi_gpu", "true")
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown key 'alow_multi_gpu' in builder; did you mean 'allow_multi_gpu'?"
    );
    // Nothing near: no suggestion.
    let e = isolated().set("colour", "red").build().unwrap_err();
    assert_eq!(e.to_string(), "unknown key 'colour' in builder");
}

#[test]
fn bad_values_name_key_and_source() {
    let e = isolated().set("debug", "5").build().unwrap_err();
    assert_eq!(
        e.to_string(),
        "bad value \"5\" for 'debug' in builder: expected a level from 0 to 4"
    );
    let e = isolated().set("default_dtype", "i32").build().unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::BadValue {
                key: "default_dtype",
                ..
            }
        ),
        "{e}"
    );
    let e = isolated().set("max_grid_size", "0").build().unwrap_err();
    assert!(e.to_string().contains("expected a positive integer"), "{e}");
    let e = isolated()
        .set("allow_multi_gpu", "maybe")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("'allow_multi_gpu'"), "{e}");
    let e = isolated()
        .environment([("NDFUSE_CPU_THREADS", "-1")])
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "bad value \"-1\" for 'cpu_threads' in env NDFUSE_CPU_THREADS: expected a non-negative integer"
    );
}

#[test]
fn file_values_are_typed_and_checked() {
    let dir = scratch("typed");
    let f = dir.join("ndfuse.toml");
    std::fs::write(
        &f,
        "allow_multi_gpu = true\ndisable_passes = [\"cse\", \"fusion\"]\nbackend = \"interp\"\ndefault_dtype = \"bf16\"\nmax_host_cache = 2048\n",
    )
    .expect("write");
    let cfg = isolated()
        .config_file(Some(f.clone()))
        .build()
        .expect("valid file");
    assert!(cfg.allow_multi_gpu());
    assert_eq!(cfg.disable_passes(), ["cse", "fusion"]);
    assert_eq!(cfg.backend(), ndfuse_runtime::BackendKind::Interp);
    assert_eq!(cfg.default_dtype(), ndfuse_ir::DType::BF16);
    assert_eq!(cfg.max_host_cache(), 2048);
    assert_eq!(
        cfg.origin("max_host_cache"),
        Some(&ConfigSource::File {
            path: f.clone(),
            line: Some(5)
        })
    );

    std::fs::write(&f, "max_grid_size = 1.5\n").expect("write");
    let e = isolated().config_file(Some(f.clone())).build().unwrap_err();
    assert!(
        e.to_string()
            .starts_with("bad value \"1.5\" for 'max_grid_size' in file "),
        "{e}"
    );
    assert!(e.to_string().contains("ndfuse.toml:1"), "{e}");

    std::fs::write(&f, "max_grid_size = = 3\n").expect("write");
    let e = isolated().config_file(Some(f.clone())).build().unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
    assert!(e.to_string().contains("line 1"), "{e}");
}

#[test]
fn builder_missing_file_is_an_error() {
    let e = isolated()
        .config_file(Some(PathBuf::from("/nonexistent/x.toml")))
        .build()
        .unwrap_err();
    assert!(matches!(e, ConfigError::MissingFile { .. }), "{e}");
}

#[test]
fn typed_setters_and_explain_order() {
    let cfg = isolated()
        .backend_priority_cpu(-3)
        .default_dtype(ndfuse_ir::DType::F16)
        .allow_multi_gpu(true)
        .disable_passes(["dce"])
        .dump_dir("/tmp/dump")
        .build()
        .expect("valid");
    assert_eq!(cfg.backend_priority_cpu(), -3);
    assert_eq!(cfg.dump_dir(), Some(Path::new("/tmp/dump")));
    let explain = cfg.explain();
    let keys: Vec<&str> = explain
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let want: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    assert_eq!(keys, want, "one line per key, in KEYS order");
    assert!(
        line(&explain, "default_dtype").contains("= f16  (builder)"),
        "{explain}"
    );
    assert!(
        line(&explain, "disable_passes").contains("= dce  (builder)"),
        "{explain}"
    );
    assert!(
        line(&explain, "max_device_cache").contains("= 1073741824  (default)"),
        "{explain}"
    );
    // Later builder values win over earlier ones.
    let cfg = isolated()
        .set("debug", "1")
        .debug(2)
        .build()
        .expect("valid");
    assert_eq!(cfg.debug(), 2);
}
