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
//!   with an error naming it; one killed by a signal ends the run at once (MPICH's
//!   launcher kills the others);
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
use std::time::{Duration, Instant};

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
}

/// MpiRanks whose process fails at its `at`-th gradient reduction (fault injection).
#[derive(Debug)]
struct Faulty {
    inner: Arc<MpiRanks>,
    at: Option<(u64, Fault)>,
    calls: AtomicU64,
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
        match self.at {
            Some((at, fault)) if at == call => {
                eprintln!("rank {} fails on purpose: {fault:?}", self.rank());
                match fault {
                    Fault::Hang => std::thread::sleep(Duration::from_secs(3600)),
                    Fault::Abort => std::process::abort(),
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
/// trains `MPICHECK_EPOCHS` epochs (from the checkpoint `MPICHECK_RESUME`, saving
/// to `MPICHECK_SAVE` on rank 0), prints `hash RANK HEX` on every rank and the
/// parameters on rank 0; `MPICHECK_ABORT=RANK:CALL:hang|abort` fails that rank.
#[test]
fn rank_program() {
    if env("MPICHECK_CHILD").is_none() {
        return;
    }
    let ranks = Arc::new(MpiRanks::init().unwrap());
    if let Err(e) = child(Arc::clone(&ranks)) {
        eprintln!("error on rank {}: {e}", ranks.rank());
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
            let mut next = || words.next().ok_or("MPICHECK_ABORT=RANK:CALL:hang|abort");
            let (r, n, how) = (next()?.parse::<usize>()?, next()?.parse::<u64>()?, next()?);
            let fault = match how {
                "hang" => Fault::Hang,
                _ => Fault::Abort,
            };
            (r == rank).then_some((n, fault))
        }
        None => None,
    };
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
            calls: AtomicU64::new(0),
        }))
        .build()?;
    pw.run(&data, first..epochs)?;
    let params = values(pw.trainer());
    // On a line of its own: libtest has printed "test rank_program ... " before.
    println!("\nhash {rank} {:016x}", hash(&params));
    if rank == 0 {
        if let Some(path) = env("MPICHECK_SAVE") {
            pw.trainer().save(Path::new(&path))?;
        }
        for (i, p) in params.iter().enumerate() {
            let bits: Vec<String> = p.iter().map(|v| format!("{:08x}", v.to_bits())).collect();
            println!("param {i} {}", bits.join(" "));
        }
    }
    Ok(())
}

/// Runs the child program on `n` ranks with `vars`, killed and failed after `bound`.
fn mpiexec(n: usize, vars: &[(&str, String)], bound: Duration) -> Output {
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpiexec");
    cmd.args(["-n", &n.to_string()])
        .arg(&me)
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
    let out = mpiexec(
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
