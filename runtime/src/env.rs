//! Pass options from [`Config`], the one place configuration is read (STYLE 15):
//!
//! | key (variable) | meaning |
//! | --- | --- |
//! | `debug` (`NDFUSE_DEBUG=0..4`) | 3 and up: the IR after each pass on stderr |
//! | `dump_dir` (`NDFUSE_DUMP_DIR=DIR`, or `NDFUSE_DUMP`) | the IR before and after each pass written to files in DIR |
//! | `disable_passes` (`NDFUSE_DISABLE_PASSES=a,b`) | passes to skip by name (`fold`, `simplify`, `views`, `cse`, `dce`, `fusion`) |
//!
//! A value that does not parse is an error naming the key and its source, never
//! silently ignored.

use crate::config::Config;
use ndfuse_passes::PassOptions;

/// Pass options from a loaded configuration.
pub(crate) fn pass_options_from(cfg: &Config) -> PassOptions {
    PassOptions {
        debug_level: cfg.debug(),
        dump_dir: cfg.dump_dir().map(Into::into),
        disabled: cfg.disable_passes().to_vec(),
        ..PassOptions::default()
    }
}
