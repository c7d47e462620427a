//! Fuzzing of the configuration: random environments (known keys, aliases, misspelt
//! and unknown `NDFUSE_` variables, random and boundary values), random TOML files
//! (valid and broken, wrong value types, tables, huge integers, binary garbage,
//! directories) and builder values go through `Config::builder()...build()`, then
//! `explain` and `value` of every key. Property: an `Err` whose message is one line, or
//! a configuration whose values read back; never a panic or hang. The process
//! environment is never touched (`ConfigBuilder::environment`). `NDFUSE_FUZZ_CASES`
//! raises the counts.

mod fuzz_support;

use fuzz_support::{check, config};
use ndfuse::Config;
use ndfuse_runtime::KEYS;
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const BUDGET: Duration = Duration::from_secs(20);

fn scratch(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz_config");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch folder");
        d
    });
    dir.join(name)
}

fn key_name() -> impl Strategy<Value = String> {
    let known = prop::sample::select(KEYS.iter().map(|k| k.name).collect::<Vec<_>>());
    prop_oneof![
        4 => known.prop_map(str::to_string),
        1 => "[a-z_]{0,20}",
        1 => prop::sample::select(vec!["", "_", "DEBUG", "debug ", "cpu-threads", "\u{e9}"])
            .prop_map(str::to_string),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "0", "1", "-1", "2", "255", "256", "4096", "65536", "4294967295", "4294967296",
            "18446744073709551615", "18446744073709551616", "-9223372036854775808",
            "9223372036854775807", "1e3", "0x10", "1.5", "true", "false", "yes", "on", "",
            " ", "auto", "cpu", "cuda", "interp", "gpu", "f16", "bf16", "f32", "f64", "i32",
            "bool", "/tmp", ".", "..", "\0", "a,b", "fusion,cse", ",", "1 MiB", "64K",
        ])
        .prop_map(str::to_string),
        1 => any::<String>(),
    ]
}

/// A TOML line: `key = value` with the value as TOML of a random type.
fn toml_line() -> impl Strategy<Value = String> {
    let tv = prop_oneof![
        value().prop_map(|v| format!("{v:?}")),
        value(),
        prop::sample::select(vec![
            "[]",
            "[\"cse\", \"dce\"]",
            "[1, 2]",
            "{ a = 1 }",
            "1979-05-27",
            "inf",
            "nan",
            "-0",
            "99999999999999999999",
            "\"\"\"x\"\"\"",
            "[",
            "[[",
            "'",
        ])
        .prop_map(str::to_string),
    ];
    prop_oneof![
        4 => (key_name(), tv).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => prop::sample::select(vec!["[section]", "# comment", "", "=", "debug", "[[a]]"])
            .prop_map(str::to_string),
    ]
}

/// The whole of a built configuration, or the error: its `explain`, every key's value.
fn exercise(
    env: Vec<(String, String)>,
    file: Option<PathBuf>,
    set: Vec<(String, String)>,
) -> Result<usize, String> {
    let mut b = Config::builder().environment(env);
    if file.is_some() {
        b = b.config_file(file);
    }
    for (k, v) in set {
        b = b.set(&k, v);
    }
    match b.build() {
        Ok(cfg) => {
            let text = cfg.explain();
            for k in KEYS {
                assert!(cfg.value(k.name).is_some(), "{} has a value", k.name);
                assert!(cfg.origin(k.name).is_some(), "{} has an origin", k.name);
            }
            Ok(text.len())
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty(), "an error says something");
            Err(msg)
        }
    }
}

fn env_var() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        6 => key_name().prop_map(|k| format!("NDFUSE_{}", k.to_ascii_uppercase())),
        1 => prop::sample::select(vec![
            "BACKEND_PRIORITY_CPU", "BACKEND_PRIORITY_GPU", "NDFUSE_DUMP", "NDFUSE_",
            "NDFUSE_REQUIRE_CUDA", "PATH", "ndfuse_debug",
        ])
        .prop_map(str::to_string),
    ];
    (name, value())
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn random_environments_never_crash(
        env in prop::collection::vec(env_var(), 0..6),
        set in prop::collection::vec((key_name(), value()), 0..3),
    ) {
        let input = (env.clone(), set.clone());
        let _outcome = check(&input, BUDGET, move || exercise(env, None, set))?;
    }

    #[test]
    fn random_files_never_crash(lines in prop::collection::vec(toml_line(), 0..8)) {
        let n = {
            static N: AtomicU64 = AtomicU64::new(0);
            N.fetch_add(1, Ordering::Relaxed) % 64
        };
        let path = scratch(&format!("case{n}.toml"));
        let text = lines.join("\n");
        std::fs::write(&path, &text).expect("scratch write");
        let p = path.clone();
        let r = check(&text, BUDGET, move || exercise(vec![], Some(p), vec![]));
        let _ = std::fs::remove_file(&path);
        let _outcome = r?;
    }

    #[test]
    fn binary_garbage_files_are_clear_errors(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let n = {
            static N: AtomicU64 = AtomicU64::new(0);
            N.fetch_add(1, Ordering::Relaxed) % 64
        };
        let path = scratch(&format!("garbage{n}.toml"));
        std::fs::write(&path, &bytes).expect("scratch write");
        let env = vec![("NDFUSE_CONFIG".to_string(), path.display().to_string())];
        let r = check(&bytes, BUDGET, move || exercise(env, None, vec![]));
        let _ = std::fs::remove_file(&path);
        let _outcome = r?;
    }
}

/// A directory as NDFUSE_CONFIG is an error naming it, not a crash or the defaults.
#[test]
fn a_directory_as_the_config_file_is_an_error() {
    let dir = scratch("a_dir");
    std::fs::create_dir_all(&dir).expect("dir");
    let env = vec![("NDFUSE_CONFIG".to_string(), dir.display().to_string())];
    let err = exercise(env, None, vec![]).expect_err("a directory is no config");
    assert!(err.contains("a_dir"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
