//! The environment variables that steer compilation, read in one place:
//!
//! | variable | meaning |
//! | --- | --- |
//! | `NDFUSE_DEBUG=0..4` | 3 and up: the IR after each pass on stderr |
//! | `NDFUSE_DUMP=DIR` | the IR before and after each pass written to files in DIR |
//! | `NDFUSE_DISABLE_PASSES=a,b` | passes to skip by name (`fold`, `simplify`, `views`, `cse`, `dce`, `fusion`) |
//!
//! A value that does not parse is an error naming the variable, never silently ignored.
//! (The configuration issue folds these into `Config` with file and builder layers.)

use crate::error::RuntimeError;
use ndfuse_passes::PassOptions;
use std::path::PathBuf;

/// Pass options from the environment, with the manager's defaults otherwise.
pub(crate) fn pass_options() -> Result<PassOptions, RuntimeError> {
    let mut opts = PassOptions::default();
    if let Some(v) = var("NDFUSE_DEBUG") {
        opts.debug_level = v
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|&l| l <= 4)
            .ok_or_else(|| RuntimeError::Env {
                var: "NDFUSE_DEBUG",
                value: v.clone(),
                why: "expected a level from 0 to 4".into(),
            })?;
    }
    if let Some(v) = var("NDFUSE_DUMP") {
        opts.dump_dir = Some(PathBuf::from(v));
    }
    if let Some(v) = var("NDFUSE_DISABLE_PASSES") {
        opts.disabled = PassOptions::parse_pass_list(&v);
    }
    Ok(opts)
}

/// A set, non-empty variable.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}
