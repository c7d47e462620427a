//! The pass manager: runs a list of graph-to-graph passes and does the work every pass
//! shares (verification after each pass, timing, the per-pass IR log, dumps, disabling
//! by name), so that the passes themselves only rewrite the graph.
//!
//! The list runs in *laps*: after the last pass the manager starts again from the first,
//! and stops once every enabled pass has run once in a row without changing anything.
//! Clean-up passes feed each other (CSE merges duplicates that let `simplify` fire,
//! whose rewrites create new duplicates), and laps reach the common fixed point without
//! the list having to guess how often to repeat each pass. A pipeline that never
//! settles is a bug in a rule and ends in [`PassError::LapLimit`].

use crate::pass::{Pass, PassCx, PassError};
use ndfuse_ir::{verify, Graph};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Names that `disabled` may hold for stages run after this pipeline by its caller
/// (fusion turns the optimised graph into kernels); the manager accepts and ignores
/// them so one `NDFUSE_DISABLE_PASSES` list can name every stage.
pub const LATER_STAGES: &[&str] = &["fusion"];

/// How to run the pipeline. The runtime fills it from its configuration
/// (`NDFUSE_DEBUG`, `NDFUSE_DUMP`, `NDFUSE_DISABLE_PASSES`); passes never read the
/// environment themselves.
#[derive(Clone, Debug)]
pub struct PassOptions {
    /// Verify the graph before the first pass and after each pass, and check that a
    /// pass reporting "unchanged" left the IR text as it was. Default: on in debug and
    /// test builds.
    pub verify: bool,
    /// Names of passes to skip (they are logged as disabled).
    pub disabled: Vec<String>,
    /// Write `00-input.txt` and `NN-pass.txt` (the IR after each pass) here, creating
    /// the directory.
    pub dump_dir: Option<PathBuf>,
    /// At 3 or more, print the IR after each pass to stderr as the pipeline runs.
    pub debug_level: u8,
    /// Keep the IR text after each changing pass in the [`PassLog`] (for `ndfuse
    /// explain`). Printing costs time on every compile; the runtime's hot path may turn
    /// it off.
    pub record_ir: bool,
    /// Laps over the pipeline before giving up (see the module docs).
    pub max_laps: usize,
    /// Handed to every pass.
    pub cx: PassCx,
}

impl Default for PassOptions {
    fn default() -> PassOptions {
        PassOptions {
            verify: cfg!(debug_assertions),
            disabled: Vec::new(),
            dump_dir: None,
            debug_level: 0,
            record_ir: true,
            max_laps: 16,
            cx: PassCx::default(),
        }
    }
}

impl PassOptions {
    /// Splits a list like `"cse, fold"` (the value of `NDFUSE_DISABLE_PASSES`) into
    /// names: commas or whitespace separate, empty items are dropped.
    ///
    /// ```
    /// use ndfuse_passes::PassOptions;
    /// assert_eq!(PassOptions::parse_pass_list(" cse,fold ,,"), ["cse", "fold"]);
    /// ```
    pub fn parse_pass_list(list: &str) -> Vec<String> {
        list.split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// These options with the passes named in `list` (see [`Self::parse_pass_list`])
    /// disabled as well.
    pub fn with_disabled(mut self, list: &str) -> PassOptions {
        self.disabled.extend(PassOptions::parse_pass_list(list));
        self
    }

    fn is_disabled(&self, name: &str) -> bool {
        self.disabled.iter().any(|d| d == name)
    }
}

/// What happened to one pass in one lap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassStatus {
    /// The pass rewrote the graph.
    Changed,
    /// The pass ran and left the graph as it was.
    Unchanged,
    /// The pass was skipped because it is in [`PassOptions::disabled`].
    Disabled,
}

/// One line of the [`PassLog`].
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// The pass.
    pub name: &'static str,
    /// Which lap over the pipeline (from 1).
    pub lap: usize,
    /// What it did.
    pub status: PassStatus,
    /// Time spent in the pass itself (verification and printing excluded).
    pub duration: Duration,
    /// The IR after the pass, when it changed the graph and IR recording is on.
    pub ir_after: Option<String>,
}

impl PassRecord {
    /// Whether the pass changed the graph.
    pub fn changed(&self) -> bool {
        self.status == PassStatus::Changed
    }

    /// The `-- pass NAME (0.021 ms)` header line, with or without the time.
    fn header(&self, with_times: bool) -> String {
        let lap = if self.lap > 1 {
            format!(", lap {}", self.lap)
        } else {
            String::new()
        };
        match self.status {
            PassStatus::Disabled => format!("-- pass {}{lap} (disabled)", self.name),
            _ if with_times => format!(
                "-- pass {}{lap} ({:.3} ms)",
                self.name,
                self.duration.as_secs_f64() * 1e3
            ),
            _ => format!("-- pass {}{lap}", self.name),
        }
    }

    /// Header and body: the IR, "(unchanged)", or nothing for a disabled pass.
    fn write_to(&self, out: &mut String, with_times: bool) {
        out.push_str(&self.header(with_times));
        out.push('\n');
        match (self.status, &self.ir_after) {
            (PassStatus::Unchanged, _) => out.push_str("(unchanged)\n"),
            (PassStatus::Changed, Some(ir)) => out.push_str(ir),
            (PassStatus::Changed, None) => out.push_str("(changed; IR not recorded)\n"),
            (PassStatus::Disabled, _) => {}
        }
    }
}

/// The record of one pipeline run: the input IR and one [`PassRecord`] per pass run.
/// Its Display is the Halide-style log `ndfuse explain` prints: `-- pass fold (0.021
/// ms)` followed by the IR after it, or `(unchanged)`.
#[derive(Clone, Debug, Default)]
pub struct PassLog {
    /// The IR before the first pass (when IR recording is on).
    pub input: Option<String>,
    /// Every pass run (and every disabled pass, once), in order.
    pub records: Vec<PassRecord>,
}

impl PassLog {
    /// Whether any pass changed the graph.
    pub fn changed(&self) -> bool {
        self.records.iter().any(PassRecord::changed)
    }

    /// The log as text; without times it is deterministic (for snapshot tests).
    pub fn to_text(&self, with_times: bool) -> String {
        let mut out = String::new();
        if let Some(ir) = &self.input {
            out.push_str("-- input\n");
            out.push_str(ir);
        }
        for r in &self.records {
            r.write_to(&mut out, with_times);
        }
        out
    }

    /// Total time spent in passes.
    pub fn total_time(&self) -> Duration {
        self.records.iter().map(|r| r.duration).sum()
    }
}

impl fmt::Display for PassLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text(true))
    }
}

/// Runs a list of passes with the shared work done once, here.
#[derive(Debug)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
}

impl PassManager {
    /// A manager for `passes`, run in this order (see `pipeline()`).
    pub fn new(passes: Vec<Box<dyn Pass>>) -> PassManager {
        PassManager { passes }
    }

    /// The pass names in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs the passes over `g` in laps until a full lap changes nothing (see the
    /// module docs), with verification, timing, logging and dumps as `opts` say.
    ///
    /// On `Err` the graph may be partly rewritten (or, after a verification failure,
    /// invalid): a caller that wants to go on without the pipeline should run it on a
    /// clone.
    pub fn run(&self, g: &mut Graph, opts: &PassOptions) -> Result<PassLog, PassError> {
        self.check_disabled(opts)?;
        let mut dump = Dumper::new(opts.dump_dir.as_deref())?;
        let want_text = opts.record_ir || opts.dump_dir.is_some() || opts.debug_level >= 3;
        let mut log = PassLog::default();

        if opts.verify {
            verify(g).map_err(|errors| PassError::InvalidInput {
                errors,
                ir: g.to_string(),
            })?;
        }
        // The current IR text, kept only while someone wants it.
        let mut text = want_text.then(|| g.to_string());
        if let Some(t) = &text {
            dump.write("input", t)?;
            if opts.debug_level >= 3 {
                eprint!("-- input\n{t}");
            }
            if opts.record_ir {
                log.input = Some(t.clone());
            }
        }

        let enabled = self
            .passes
            .iter()
            .filter(|p| !opts.is_disabled(p.name()))
            .count();
        let mut quiet_in_a_row = 0;
        let mut changed_this_lap = Vec::new();
        for lap in 1..=opts.max_laps {
            changed_this_lap.clear();
            for pass in &self.passes {
                if quiet_in_a_row >= enabled {
                    return Ok(log);
                }
                if opts.is_disabled(pass.name()) {
                    // Logged once: the later laps would only repeat it.
                    if lap == 1 {
                        let record = PassRecord {
                            name: pass.name(),
                            lap,
                            status: PassStatus::Disabled,
                            duration: Duration::ZERO,
                            ir_after: None,
                        };
                        self.report(&record, opts, &mut dump, text.as_deref())?;
                        log.records.push(record);
                    }
                    continue;
                }
                // A fingerprint before the pass, to catch a pass that changes the graph
                // but says it did not (which would end the laps early and mislabel the
                // log). Hashing, not printing: this runs on every pass of every eval.
                let before = opts.verify.then(|| g.fingerprint());
                let start = Instant::now();
                let changed = pass.run(g, &opts.cx)?;
                let duration = start.elapsed();
                if opts.verify {
                    verify(g).map_err(|errors| PassError::Verify {
                        pass: pass.name(),
                        errors,
                        ir: g.to_string(),
                    })?;
                }
                if !changed && before.is_some_and(|b| b != g.fingerprint()) {
                    return Err(PassError::ChangedFlag {
                        pass: pass.name(),
                        before: text.clone().unwrap_or_default(),
                        after: g.to_string(),
                    });
                }
                if changed && want_text {
                    text = Some(g.to_string());
                }
                let record = PassRecord {
                    name: pass.name(),
                    lap,
                    status: if changed {
                        PassStatus::Changed
                    } else {
                        PassStatus::Unchanged
                    },
                    duration,
                    ir_after: if changed && opts.record_ir {
                        text.clone()
                    } else {
                        None
                    },
                };
                self.report(&record, opts, &mut dump, text.as_deref())?;
                log.records.push(record);
                if changed {
                    quiet_in_a_row = 0;
                    changed_this_lap.push(pass.name());
                } else {
                    quiet_in_a_row += 1;
                }
            }
            if quiet_in_a_row >= enabled {
                return Ok(log);
            }
        }
        Err(PassError::LapLimit {
            laps: opts.max_laps,
            changed: changed_this_lap,
        })
    }

    /// Dumps and prints one record as it happens (so a later failure still leaves the
    /// log of what ran before it).
    fn report(
        &self,
        record: &PassRecord,
        opts: &PassOptions,
        dump: &mut Dumper,
        text: Option<&str>,
    ) -> Result<(), PassError> {
        let body = match record.status {
            PassStatus::Disabled => "(disabled)\n",
            _ => text.unwrap_or(""),
        };
        dump.write(record.name, body)?;
        if opts.debug_level >= 3 {
            let mut out = String::new();
            let shown = PassRecord {
                ir_after: text.map(str::to_owned),
                ..record.clone()
            };
            shown.write_to(&mut out, true);
            eprint!("{out}");
        }
        Ok(())
    }

    fn check_disabled(&self, opts: &PassOptions) -> Result<(), PassError> {
        let names = self.names();
        for d in &opts.disabled {
            if !names.contains(&d.as_str()) && !LATER_STAGES.contains(&d.as_str()) {
                let mut known: Vec<&str> = names.clone();
                known.extend(LATER_STAGES);
                known.sort_unstable();
                known.dedup();
                return Err(PassError::UnknownPass {
                    name: d.clone(),
                    known: known.join(", "),
                });
            }
        }
        Ok(())
    }
}

/// Writes numbered dump files: `00-input.txt`, `01-fold.txt`, ...
#[derive(Debug)]
struct Dumper<'a> {
    dir: Option<&'a Path>,
    next: usize,
}

impl<'a> Dumper<'a> {
    fn new(dir: Option<&'a Path>) -> Result<Dumper<'a>, PassError> {
        if let Some(d) = dir {
            std::fs::create_dir_all(d).map_err(|source| PassError::Dump {
                path: d.to_path_buf(),
                source,
            })?;
        }
        Ok(Dumper { dir, next: 0 })
    }

    fn write(&mut self, name: &str, text: &str) -> Result<(), PassError> {
        let Some(dir) = self.dir else {
            return Ok(());
        };
        let path = dir.join(format!("{:02}-{name}.txt", self.next));
        self.next += 1;
        std::fs::write(&path, text).map_err(|source| PassError::Dump { path, source })
    }
}
