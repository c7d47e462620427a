//! The fuzz suites' shared harness: how many cases to run (`NDFUSE_FUZZ_CASES`), and
//! one case run on a thread of its own under a time budget, so that a panic, an
//! unwinding abort of the case or a hang fails the test with the input printed instead
//! of killing or stalling the whole run.

use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Duration;

/// Cases per property: `NDFUSE_FUZZ_CASES` when set (a long run, say in release),
/// else `ci` (a few hundred to a few thousand, well under 20 s in a debug build).
pub fn cases(ci: u32) -> u32 {
    std::env::var("NDFUSE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(ci)
}

/// The proptest configuration of a fuzz property: `cases(ci)` cases, no regression
/// file (crashes found become named tests instead), few shrink steps (each may wait
/// out a hang's budget).
pub fn config(ci: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: cases(ci),
        failure_persistence: None,
        max_shrink_iters: 200,
        ..proptest::test_runner::Config::default()
    }
}

/// Runs `case(input)` on its own thread: `Ok(r)` with its result, or `Err` naming the
/// input when it panicked or ran past `budget` (the stuck thread is left behind; the
/// test fails anyway).
pub fn run_case<T, R>(
    input: &T,
    budget: Duration,
    case: impl FnOnce() -> R + Send + 'static,
) -> Result<R, String>
where
    T: Debug + ?Sized,
    R: Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("fuzz-case".into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(case));
            let _ = tx.send(r);
        })
        .map_err(|e| format!("cannot start a case thread: {e}"))?;
    match rx.recv_timeout(budget) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(p)) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(a non-string payload)".into());
            Err(format!("PANIC on input {input:?}: {msg}"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "HANG: no answer within {budget:?} on input {input:?}"
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!(
            "the case thread died without an answer on input {input:?}"
        )),
    }
}

/// Like [`run_case`], as a proptest failure.
pub fn check<T, R>(
    input: &T,
    budget: Duration,
    case: impl FnOnce() -> R + Send + 'static,
) -> Result<R, proptest::test_runner::TestCaseError>
where
    T: Debug + ?Sized,
    R: Send + 'static,
{
    run_case(input, budget, case).map_err(proptest::test_runner::TestCaseError::fail)
}
