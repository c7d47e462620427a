//! The real models' folder for the tests that need it: `NDFUSE_MODELS` (filled by
//! `scripts/fetch_models.sh DIR`). Without it a test prints why it is skipped and
//! passes, unless `NDFUSE_REQUIRE_MODELS=1` (CI), where it fails.

#![allow(dead_code)]

use std::path::PathBuf;

/// `NDFUSE_MODELS/rel` when it exists; `None` (after printing why) when the models are
/// not there and not required; a panic when they are required.
pub fn model_file(rel: &str) -> Option<PathBuf> {
    let required = std::env::var("NDFUSE_REQUIRE_MODELS").is_ok_and(|v| v == "1");
    let path = std::env::var_os("NDFUSE_MODELS").map(|d| PathBuf::from(d).join(rel));
    match path {
        Some(p) if p.exists() => Some(p),
        other => {
            let why = match other {
                Some(p) => format!("{} does not exist", p.display()),
                None => "NDFUSE_MODELS is not set".to_string(),
            };
            assert!(
                !required,
                "NDFUSE_REQUIRE_MODELS=1 but {why} (run scripts/fetch_models.sh DIR and set NDFUSE_MODELS=DIR)"
            );
            eprintln!("skipped: {why} (run scripts/fetch_models.sh DIR and set NDFUSE_MODELS=DIR)");
            None
        }
    }
}

/// A fixture of `models/tests/fixtures`, parsed.
pub fn fixture(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `v` as a list of unsigned ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
