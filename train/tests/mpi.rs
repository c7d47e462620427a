//! Data-parallel training over real MPI processes: each test launches this test binary
//! again under `mpiexec -n 2` and `-n 4` (the child test `rank_program` runs only with
//! `MPICHECK_CHILD` set), bounded in time (killed and failed past the bound).
//!
//! - equivalence: R ranks of batch b at frequency 1 with SGD take the steps of one
//!   in-process trainer of batch R * b (f32 tolerance: the ranks sum R partial
//!   gradients where one process sums one batch, so the rounding differs);
//! - identical parameters on every rank (each prints the hash of its parameter bits;
//!   debug builds also run the wrapper's hash check after every step);
//! - a rank that hangs mid-training makes the others exit non-zero within the bound
//!   with an error naming it; one killed by a signal ends the run at once under a plain
//!   `mpiexec` (MPICH's launcher kills the others); under `mpiexec
//!   -disable-auto-cleanup` with each rank wrapped in a shell, a rank that aborts or is
//!   SIGKILLed is named by the survivors within the deadline, the last checkpoint loads,
//!   and a restart from it resumes; so is one killed inside a reduction it had reached;
//! - resume: 3 epochs with a checkpoint, then a new run from it, equal bit for bit to
//!   a straight run of 6 (same ranks, same reductions in the same order on the same
//!   values; a checkpoint stores f32 bits exactly).
#![cfg(feature = "mpi")]

use ndfuse::{Context, CpuDevice, Device, DeviceSet};
use ndfuse_nn::{Activation, Dataset, Layer, Loss, Optimizer, Sequential, Trainer};
use ndfuse_train::{MpiRanks, ParallelWrapper, Ranks};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Per-rank batch of the child program.
const BATCH: usize = 8;
/// The child's data: 320 samples = 40 batches of 8, a whole number of rounds on 2 or 4
/// ranks.
const SAMPLES: usize = 320;

fn regression(n: usize) -> Dataset {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[n, 6], 0.0, 1.0, 5).eval().unwrap();
    let w = ctx.rand_normal(&[6, 2], 0.0, 1.0, 6);
    let y = ctx.tensor(x.clone()).matmul(&w).tanh().eval().unwrap();
    Dataset::new(x, y).unwrap()
}

fn sgd_trainer() -> Trainer<Sequential> {
    let ctx = Context::new();
    let model = Sequential::mlp(&ctx, &[6, 16, 2], Activation::Tanh, 3).unwrap();
    let opt = Optimizer::sgd(&model.parameters(), 0.1).momentum(0.9);
    Trainer::new(model, opt, Loss::Mse).unwrap()
}

fn values(t: &Trainer<impl Layer>) -> Vec<Vec<f32>> {
    t.model()
        .parameters()
        .iter()
        .map(|p| p.array().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

/// FNV-1a over the parameters' f32 bits.
fn hash(params: &[Vec<f32>]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in params
        .iter()
        .flatten()
        .flat_map(|v| v.to_bits().to_le_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// How the victim of a fault test fails.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Stops answering (sleeps for an hour).
    Hang,
    /// Dies of SIGABRT.
    Abort,
    /// Dies of SIGKILL (sent to itself with `kill -KILL`).
    Kill,
    /// Exits with status 7 (no signal).
    Exit,
    /// Goes into the reduction (so the others see it arrive) and is SIGKILLed 300 ms
    /// later, while it waits there for a late rank.
    KillInside,
}

/// MpiRanks whose process fails at its `at`-th gradient reduction (fault injection).
#[derive(Debug)]
struct Faulty {
    inner: Arc<MpiRanks>,
    at: Option<(u64, Fault)>,
    /// Sleeps this long before this gradient reduction (a late rank).
    late: Option<(u64, Duration)>,
    calls: AtomicU64,
}

/// Sends SIGKILL to this process.
fn kill_myself() {
    let me = std::process::id().to_string();
    let _ = Command::new("kill").args(["-KILL", &me]).status();
}

impl Ranks for Faulty {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn allreduce_sum(&self, arrays: &mut [ndfuse::Array]) -> ndfuse_train::Result<()> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some((at, pause)) = self.late {
            if at == call {
                std::thread::sleep(pause);
            }
        }
        match self.at {
            Some((at, fault)) if at == call => {
                let ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_millis();
                eprintln!(
                    "rank {} fails on purpose: {fault:?} at {ms} ms",
                    self.rank()
                );
                match fault {
                    Fault::Hang => std::thread::sleep(Duration::from_secs(3600)),
                    Fault::Abort => std::process::abort(),
                    Fault::Kill => {
                        kill_myself();
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                    Fault::Exit => std::process::exit(7),
                    Fault::KillInside => {
                        std::thread::spawn(|| {
                            std::thread::sleep(Duration::from_millis(300));
                            kill_myself();
                        });
                    }
                }
            }
            _ => {}
        }
        self.inner.allreduce_sum(arrays)
    }
    fn allreduce_sum_f64(&self, values: &mut [f64]) -> ndfuse_train::Result<()> {
        self.inner.allreduce_sum_f64(values)
    }
    fn allreduce_max_f64(&self, values: &mut [f64]) -> ndfuse_train::Result<()> {
        self.inner.allreduce_max_f64(values)
    }
    fn all_equal(&self, value: u64) -> ndfuse_train::Result<bool> {
        self.inner.all_equal(value)
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

/// The program every rank runs (only under `mpiexec`, with `MPICHECK_CHILD=1`):
/// checks `broadcast_bytes` from the last rank, trains `MPICHECK_EPOCHS` epochs (from the checkpoint `MPICHECK_RESUME`, saving
/// to `MPICHECK_SAVE` on rank 0), prints `hash RANK HEX` on every rank and the
/// parameters on rank 0; `MPICHECK_ABORT=RANK:CALL:hang|abort|kill|exit|kill-inside`
/// fails that rank at its CALL-th gradient reduction (from 0), `MPICHECK_LATE=RANK:CALL:MS`
/// makes that rank MS late to it. With `MPICHECK_SAVE`, rank 0 saves
/// after every epoch (as `train_digits --checkpoint` does).
#[test]
fn rank_program() {
    if env("MPICHECK_CHILD").is_none() {
        return;
    }
    let ranks = Arc::new(MpiRanks::init().unwrap());
    if let Err(e) = child(Arc::clone(&ranks)) {
        // One write, so that ranks reporting at the same moment do not interleave.
        let line = format!("error on rank {}: {e}\n", ranks.rank());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        // Ends every rank, the hung one too (finalising would wait for it).
        ranks.abort(3);
    }
}

fn child(ranks: Arc<MpiRanks>) -> Result<(), Box<dyn std::error::Error>> {
    let rank = ranks.rank();
    let epochs: u64 = env("MPICHECK_EPOCHS").unwrap_or("2".into()).parse()?;
    let at = match env("MPICHECK_ABORT") {
        Some(s) => {
            let mut words = s.split(':');
            let mut next = || {
                words
                    .next()
                    .ok_or("MPICHECK_ABORT=RANK:CALL:hang|abort|kill|exit")
            };
            let (r, n, how) = (next()?.parse::<usize>()?, next()?.parse::<u64>()?, next()?);
            let fault = match how {
                "hang" => Fault::Hang,
                "kill" => Fault::Kill,
                "exit" => Fault::Exit,
                "kill-inside" => Fault::KillInside,
                _ => Fault::Abort,
            };
            (r == rank).then_some((n, fault))
        }
        None => None,
    };
    let late = match env("MPICHECK_LATE") {
        Some(s) => {
            let mut words = s.split(':');
            let mut next = || words.next().ok_or("MPICHECK_LATE=RANK:CALL:MS");
            let (r, n, ms) = (
                next()?.parse::<usize>()?,
                next()?.parse::<u64>()?,
                next()?.parse::<u64>()?,
            );
            (r == rank).then_some((n, Duration::from_millis(ms)))
        }
        None => None,
    };
    // broadcast_bytes: every rank ends with the last rank's bytes (all 256 values).
    let root = ranks.size() - 1;
    let want: Vec<u8> = (0..=255u8).rev().collect();
    let mut bytes = if rank == root {
        want.clone()
    } else {
        vec![7; 256]
    };
    ranks.broadcast_bytes(root, &mut bytes)?;
    if bytes != want {
        return Err(format!("broadcast_bytes from {root} gave {bytes:?}").into());
    }
    let data = regression(SAMPLES);
    let mut trainer = sgd_trainer();
    let mut first = 0;
    if let Some(path) = env("MPICHECK_RESUME") {
        trainer.load(Path::new(&path))?;
        // Steps per epoch: 40 batches over the ranks' one worker each.
        first = trainer.optimizer().steps() / (SAMPLES / BATCH / ranks.size()) as u64;
    }
    let devices: Vec<Arc<dyn Device>> = vec![Arc::new(CpuDevice::split(1, 1)?.remove(0))];
    let set = Arc::new(DeviceSet::new(devices, &ndfuse::Config::load()?)?);
    let mut pw = ParallelWrapper::builder(trainer)
        .workers(1)
        .devices(set)
        .batch_size(BATCH)
        .averaging_frequency(1)
        .seed(9)
        .progress(false)
        .ranks(Arc::new(Faulty {
            inner: ranks,
            at,
            late,
            calls: AtomicU64::new(0),
        }))
        .build()?;
    match env("MPICHECK_SAVE") {
        Some(path) => {
            for epoch in first..epochs {
                pw.run(&data, epoch..epoch + 1)?;
                if rank == 0 {
                    pw.trainer().save(Path::new(&path))?;
                }
            }
        }
        None => {
            pw.run(&data, first..epochs)?;
        }
    }
    let params = values(pw.trainer());
    // On a line of its own: libtest has printed "test rank_program ... " before.
    println!("\nhash {rank} {:016x}", hash(&params));
    if rank == 0 {
        for (i, p) in params.iter().enumerate() {
            let bits: Vec<String> = p.iter().map(|v| format!("{:08x}", v.to_bits())).collect();
            println!("param {i} {}", bits.join(" "));
        }
    }
    Ok(())
}

/// How `mpiexec` starts the ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Launch {
    /// `mpiexec -n N prog`: the launcher ends every rank when one fails.
    Plain,
    /// `mpiexec -disable-auto-cleanup -n N prog`: the others keep running when a rank
    /// exits, but MPICH 4.0.2's proxy still SIGKILLs the ranks on its machine when one is
    /// killed by a signal.
    NoCleanup,
    /// As `NoCleanup`, each rank under `sh -c 'trap "" USR1; "$@"; exit $?'`: the
    /// launcher sees a rank killed by a signal as the shell's exit status, so nothing is
    /// killed; the shell ignores the launcher's SIGUSR1 (the rank handles it).
    NoCleanupWrapped,
}

/// Runs the child program on `n` ranks with `vars`, killed and failed after `bound`.
fn mpiexec(n: usize, vars: &[(&str, String)], bound: Duration) -> Output {
    mpiexec_launched(Launch::Plain, n, vars, bound)
}

/// [`mpiexec`], launched as `launch` says.
fn mpiexec_launched(launch: Launch, n: usize, vars: &[(&str, String)], bound: Duration) -> Output {
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpiexec");
    if launch != Launch::Plain {
        cmd.arg("-disable-auto-cleanup");
    }
    cmd.args(["-n", &n.to_string()]);
    if launch == Launch::NoCleanupWrapped {
        cmd.args(["sh", "-c", r#"trap "" USR1; "$@"; exit $?"#, "rank"]);
    }
    cmd.arg(&me)
        .args([
            "--exact",
            "rank_program",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("MPICHECK_CHILD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("mpiexec runs (apt-get install mpich)");
    // Read the pipes on threads so a full pipe never blocks the ranks.
    let out_t = reader(child.stdout.take().unwrap());
    let err_t = reader(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mpiexec -n {n} ran past {bound:?}: killed\nstderr: {}",
                String::from_utf8_lossy(&err_t.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

/// Everything `pipe` yields, read on a thread.
fn reader(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = pipe.read_to_end(&mut s);
        s
    })
}

/// Each rank's hash and rank 0's parameters, from the child's stdout.
fn parse(out: &Output, n: usize) -> (Vec<u64>, Vec<Vec<f32>>) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mpiexec failed: {}\nstdout: {text}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut hashes = vec![None; n];
    let mut params = Vec::new();
    for line in text.lines() {
        // Tolerate libtest's words before ours on the line.
        let line = ["hash ", "param "]
            .iter()
            .filter_map(|w| line.find(w).map(|i| &line[i..]))
            .next()
            .unwrap_or(line);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["hash", r, h] => {
                hashes[r.parse::<usize>().unwrap()] = Some(u64::from_str_radix(h, 16).unwrap())
            }
            ["param", _, bits @ ..] => params.push(
                bits.iter()
                    .map(|b| f32::from_bits(u32::from_str_radix(b, 16).unwrap()))
                    .collect(),
            ),
            _ => {}
        }
    }
    let hashes = hashes
        .into_iter()
        .map(|h| h.expect("every rank printed its hash"))
        .collect();
    (hashes, params)
}

const BOUND: Duration = Duration::from_secs(120);

fn equivalence_on(n: usize) {
    let out = mpiexec(n, &[("MPICHECK_EPOCHS", "2".into())], BOUND);
    let (hashes, params) = parse(&out, n);
    // Identical parameters on every rank.
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "ranks differ: {hashes:x?}"
    );
    assert_eq!(hash(&params), hashes[0], "rank 0 printed what it hashed");
    // One process of batch n * 8 over the same shuffled order.
    let data = regression(SAMPLES);
    let mut single = sgd_trainer();
    for epoch in 0..2 {
        for b in data.batches(n * BATCH, 9, epoch, false).unwrap() {
            single.step_batch(b.unwrap()).unwrap();
        }
    }
    let want = values(&single);
    assert_eq!(params.len(), want.len());
    let mut moved = 0.0f32;
    for (p, q) in params.iter().zip(&want) {
        for (a, b) in p.iter().zip(q) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
            moved += (a - b).abs();
        }
    }
    // The comparison means something only if training moved the parameters.
    let start = values(&sgd_trainer());
    let travelled: f32 = start
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .sum();
    assert!(
        travelled > 1.0,
        "training moved the parameters ({travelled})"
    );
    eprintln!("{n} ranks: total |difference| {moved:e} over a total move of {travelled}");
}

#[test]
fn two_ranks_take_the_steps_of_one_process_of_twice_the_batch_with_identical_parameters() {
    equivalence_on(2);
}

#[test]
fn four_ranks_take_the_steps_of_one_process_of_four_times_the_batch_with_identical_parameters() {
    equivalence_on(4);
}

/// Runs `n` ranks of which `victim` fails at its 5th gradient reduction; the run must
/// end non-zero within the bound. Returns stdout and stderr.
fn faulty_run(n: usize, victim: usize, fault: &str) -> String {
    let bound = Duration::from_secs(60);
    let start = Instant::now();
    let out = mpiexec_launched(
        Launch::Plain,
        n,
        &[
            ("MPICHECK_EPOCHS", "2".into()),
            ("MPICHECK_ABORT", format!("{victim}:5:{fault}")),
            ("NDFUSE_MPI_TIMEOUT_S", "5".into()),
        ],
        bound,
    );
    let err =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run failed; output: {err}");
    assert!(
        err.contains(&format!("rank {victim} fails on purpose")),
        "stderr: {err}"
    );
    eprintln!(
        "{n} ranks, rank {victim} {fault}: the run ended in {:?}",
        start.elapsed()
    );
    err
}

/// A survivor reported the victim. Every survivor times out at about the same moment;
/// the first to report ends the run (MPI_Abort), so the others may be gone before they
/// print: at least one survivor's report is asserted.
fn assert_named(err: &str, n: usize, victim: usize) {
    let named = (0..n).filter(|r| *r != victim).any(|r| {
        err.contains(&format!("error on rank {r}: rank {r}: "))
            && err.contains(&format!("rank {victim} did not arrive"))
    });
    assert!(named, "a survivor names rank {victim}; stderr: {err}");
}

#[test]
fn a_rank_that_hangs_makes_the_others_exit_naming_it() {
    for (n, victim) in [(2, 0), (4, 3)] {
        let err = faulty_run(n, victim, "hang");
        assert_named(&err, n, victim);
    }
}

/// A rank killed by a signal: MPICH's launcher ends the whole run at once, before the
/// survivors' deadline. Its report names a process id and the signal of the first
/// process it saw end (the victim's SIGABRT, or a survivor it killed), not a rank; the
/// rank is named by the victim's own last line here.
#[test]
fn a_rank_killed_by_a_signal_ends_the_run_at_once() {
    for (n, victim) in [(2, 1), (4, 2)] {
        let start = Instant::now();
        let out = faulty_run(n, victim, "abort");
        assert!(
            out.contains("BAD TERMINATION"),
            "the launcher ended the run; output: {out}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "ended before any rank's 5 s deadline: {:?}",
            start.elapsed()
        );
    }
}

/// The deadline of the fault tests (`NDFUSE_MPI_TIMEOUT_S`).
const DEADLINE_S: u64 = 5;

/// The bound from a rank's death to the end of the whole run: the survivors' deadline,
/// plus 10 s for the launcher, the reports and a machine shared with other builds.
const DEATH_BOUND: Duration = Duration::from_secs(DEADLINE_S + 10);

/// When the victim said it fails (its `... at MS ms` line), as a time.
fn death_time(text: &str, victim: usize) -> SystemTime {
    let words = format!("rank {victim} fails on purpose: ");
    let line = text
        .lines()
        .find_map(|l| l.find(&words).map(|i| &l[i + words.len()..]))
        .unwrap_or_else(|| panic!("the victim said it fails; output: {text}"));
    let ms: u64 = line
        .split_whitespace()
        .nth(2)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("a time in {line:?}"));
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A rank that dies mid-training is named by the survivors within the bound, when the
/// run is launched so that the survivors outlive it: `mpiexec -disable-auto-cleanup`,
/// and, for a rank killed by a signal (SIGABRT on 2 ranks, SIGKILL on 4), each rank
/// wrapped in a shell (MPICH 4.0.2's proxy SIGKILLs every rank on its machine when one
/// is killed by a signal, `-disable-auto-cleanup` or not; through the shell it sees an
/// exit status instead). On 4 ranks a victim that exits (status 7, no signal) needs no
/// wrapper. The launcher sends the survivors SIGUSR1; `MpiRanks` records it, and at the
/// deadline every survivor fails with `Error::RankLost` naming the victim (it did not
/// arrive). The first survivor to report ends the run with `MpiRanks::abort`, which may
/// take the others before they print (it waits 200 ms first, and they time out on the
/// same collective at about the same moment, so in practice all of them print): at least
/// one survivor's report is asserted, and which reported is printed. Rank 0 saves a checkpoint after every epoch; the victim
/// dies in the third epoch, so the checkpoint of the second loads, and a restart from
/// it on every rank ends where a straight run does, bit for bit.
#[test]
fn a_rank_killed_by_a_signal_is_named_by_the_survivors() {
    for (n, victim, fault, launch) in [
        (2, 1, "abort", Launch::NoCleanupWrapped),
        (4, 2, "kill", Launch::NoCleanupWrapped),
        (4, 3, "exit", Launch::NoCleanup),
    ] {
        let per_epoch = SAMPLES / BATCH / n;
        let dir = scratch(&format!("dies{n}{fault}"));
        let ck = dir.join("latest.safetensors");
        let out = mpiexec_launched(
            launch,
            n,
            &[
                ("MPICHECK_EPOCHS", "4".into()),
                ("MPICHECK_SAVE", ck.display().to_string()),
                (
                    "MPICHECK_ABORT",
                    format!("{victim}:{}:{fault}", 2 * per_epoch + 3),
                ),
                ("NDFUSE_MPI_TIMEOUT_S", DEADLINE_S.to_string()),
            ],
            Duration::from_secs(60),
        );
        let ended = SystemTime::now();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the run failed; output: {text}");
        let took = ended
            .duration_since(death_time(&text, victim))
            .unwrap_or_else(|e| panic!("the death precedes the end ({e}); output: {text}"));
        assert!(
            took < DEATH_BOUND,
            "{n} ranks, rank {victim} {fault}: the run ended {took:?} after the death \
             (bound {DEATH_BOUND:?}); output: {text}"
        );
        let lost = format!("rank {victim} died or is unreachable");
        let reports: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("error on rank ") && l.contains(&lost))
            .collect();
        let named: Vec<usize> = (0..n)
            .filter(|r| *r != victim)
            .filter(|r| {
                let me = format!("error on rank {r}: rank {r}: ");
                reports.iter().any(|l| l.contains(&me))
            })
            .collect();
        assert!(
            !named.is_empty(),
            "a survivor names rank {victim}; output: {text}"
        );
        eprintln!(
            "{n} ranks, rank {victim} {fault}: the run ended {took:?} after the death; \
             survivors {named:?} reported: {}",
            reports[0]
        );
        // The last checkpoint written before the death: after the second epoch.
        let mut saved = sgd_trainer();
        if let Err(e) = saved.load(&ck) {
            panic!("the last checkpoint loads: {e}; output: {text}");
        }
        assert_eq!(
            saved.optimizer().steps(),
            2 * per_epoch as u64,
            "saved after two epochs; output: {text}"
        );
        if fault == "exit" {
            // The restart is shown by the two signal cases.
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        let resumed = mpiexec(
            n,
            &[
                ("MPICHECK_EPOCHS", "4".into()),
                ("MPICHECK_RESUME", ck.display().to_string()),
            ],
            BOUND,
        );
        let (h_resumed, _) = parse(&resumed, n);
        let straight = mpiexec(n, &[("MPICHECK_EPOCHS", "4".into())], BOUND);
        let (h_straight, _) = parse(&straight, n);
        assert_eq!(h_resumed, h_straight, "{n} ranks: restarted vs straight");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A rank SIGKILLed while it waits inside a reduction it has reached (rank 0 is 1.5 s late
/// to it) is named too: the others saw it arrive, so the arrival exchange cannot name
/// it; the roll call that `MpiRanks` holds after the launcher's notice does (without it
/// the report reads "every rank arrived at this collective, so the one that ended cannot
/// be named"). The bound is the deadline plus the roll call's 0.5 s, plus 10 s.
#[test]
fn a_rank_killed_inside_a_reduction_is_named_by_the_survivors() {
    let (n, victim) = (4, 1);
    let at = 2 * SAMPLES / BATCH / n + 3;
    let out = mpiexec_launched(
        Launch::NoCleanupWrapped,
        n,
        &[
            ("MPICHECK_EPOCHS", "4".into()),
            ("MPICHECK_ABORT", format!("{victim}:{at}:kill-inside")),
            ("MPICHECK_LATE", format!("0:{at}:1500")),
            ("NDFUSE_MPI_TIMEOUT_S", DEADLINE_S.to_string()),
        ],
        Duration::from_secs(60),
    );
    let ended = SystemTime::now();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run failed; output: {text}");
    let took = ended
        .duration_since(death_time(&text, victim))
        .unwrap_or_else(|e| panic!("the death precedes the end ({e}); output: {text}"));
    assert!(
        took < DEATH_BOUND + Duration::from_millis(800),
        "the run ended {took:?} after the reduction began; output: {text}"
    );
    let lost = format!("rank {victim} died or is unreachable");
    let reports: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("error on rank ") && l.contains(&lost))
        .collect();
    assert!(
        !reports.is_empty(),
        "a survivor names rank {victim}; output: {text}"
    );
    eprintln!(
        "{n} ranks, rank {victim} killed inside a reduction: the run ended {took:?} after \
         it went in; {} reports, e.g. {}",
        reports.len(),
        reports[0]
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-mpi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_run_resumed_from_a_checkpoint_equals_a_straight_run_bit_for_bit() {
    for n in [2, 4] {
        let dir = scratch(&format!("resume{n}"));
        let ck = dir.join("latest.safetensors");
        let straight = mpiexec(n, &[("MPICHECK_EPOCHS", "6".into())], BOUND);
        let (h_straight, _) = parse(&straight, n);
        let first = mpiexec(
            n,
            &[
                ("MPICHECK_EPOCHS", "3".into()),
                ("MPICHECK_SAVE", ck.display().to_string()),
            ],
            BOUND,
        );
        let (h_first, _) = parse(&first, n);
        assert_ne!(h_first[0], h_straight[0], "3 epochs are not 6");
        let resumed = mpiexec(
            n,
            &[
                ("MPICHECK_EPOCHS", "6".into()),
                ("MPICHECK_RESUME", ck.display().to_string()),
            ],
            BOUND,
        );
        let (h_resumed, _) = parse(&resumed, n);
        assert_eq!(h_resumed, h_straight, "{n} ranks: resumed vs straight");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
