//! [`Ranks`] over MPI processes (rsmpi on the system's MPI: MPICH or Open MPI), with a
//! bound on every wait: collectives are MPI's non-blocking ones polled against a
//! deadline, and a rank that died or hangs is named in the error.
//!
//! Each collective call is preceded by an arrival exchange: every rank posts a small
//! non-blocking send of the call's sequence number to every other rank and a receive
//! from each. When the deadline passes, the peers whose arrival has not come are the
//! ranks that did not reach this collective (dead, hung, or stuck earlier). That is
//! R - 1 eight-byte messages per rank per call, negligible next to a gradient for the
//! rank counts one machine or a small cluster runs.
//!
//! After a timeout the pending requests are abandoned (their buffers leaked, since MPI
//! may still write into them) and MPI is not finalised on drop (finalising would wait
//! for the dead peer): the process is expected to report the error and end the run
//! with [`MpiRanks::abort`] (a hung rank is ended with it).
//!
//! A rank that dies: under MPICH's `mpiexec -disable-auto-cleanup` the launcher keeps the
//! other ranks running and sends them SIGUSR1 (its notice that a process of the run
//! ended; the default action of SIGUSR1 would end them silently). [`MpiRanks::init`]
//! installs a handler that records the notice; after it every rank holds a roll call
//! (each sends every other its rank, once), and a collective that then fails at its
//! deadline gives [`Error::RankLost`] naming the ranks not heard from, even one that died
//! after reaching the collective (MPICH's ch4:ucx does not fail the pending requests on
//! its own: they stay pending). Errors MPI returns (the
//! communicator's handler is `MPI_ERRORS_RETURN`) end the collective at once, also as
//! [`Error::RankLost`], with MPI's message.

use crate::error::{Error, Result};
use crate::ranks::Ranks;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::raw::AsRaw;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;
use ndfuse::{Array, DType};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tag of arrival messages (collectives do not use tags; this keeps them apart from
/// any point-to-point traffic of the application).
const ARRIVAL_TAG: i32 = 0x4e44;

/// The default bound on one collective, overridden by `NDFUSE_MPI_TIMEOUT_S`.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The default bucket: at most 4 MiB reduced by one MPI call.
const DEFAULT_BUCKET_BYTES: usize = 4 << 20;

/// How many times the launcher has signalled that a process of the run ended (MPICH's
/// hydra sends SIGUSR1 to the remaining processes under `-disable-auto-cleanup`).
static ENDED_NOTICES: AtomicU64 = AtomicU64::new(0);

/// SIGUSR1's number where the launcher's notice is caught: 10 on Linux but for MIPS and
/// SPARC; elsewhere no handler is installed (and a launcher that signals the survivors
/// ends them).
const SIGUSR1: Option<c_int> = if cfg!(all(
    target_os = "linux",
    not(any(
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc64"
    ))
)) {
    Some(10)
} else {
    None
};

extern "C" {
    /// C's `signal` (glibc: BSD semantics, the handler stays installed and interrupted
    /// calls restart).
    fn signal(signum: c_int, handler: extern "C" fn(c_int)) -> usize;
}

/// Records the launcher's notice; only an atomic add (async-signal-safe).
extern "C" fn on_ended_notice(_: c_int) {
    ENDED_NOTICES.fetch_add(1, Ordering::SeqCst);
}

/// The processes of an `mpiexec` run as [`Ranks`] of a [`crate::ParallelWrapper`].
///
/// ```no_run
/// # fn main() -> ndfuse_train::Result<()> {
/// use std::time::Duration;
/// let ranks = ndfuse_train::MpiRanks::init()?.deadline(Duration::from_secs(30));
/// # Ok(()) }
/// ```
pub struct MpiRanks {
    /// Keeps MPI initialised; finalised on drop unless a collective failed.
    universe: ManuallyDrop<Universe>,
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    local: usize,
    bucket_bytes: usize,
    deadline: Duration,
    /// The sequence number of the next collective; the lock also serialises calls
    /// (MPI is initialised for serialised use).
    sequence: Mutex<u64>,
    /// The roll call after the launcher's notice (used under the `sequence` lock).
    roll_call: Mutex<Option<RollCall>>,
    failed: AtomicBool,
}

impl std::fmt::Debug for MpiRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiRanks")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("bucket_bytes", &self.bucket_bytes)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl MpiRanks {
    /// Initialises MPI (serialised threading: the wrapper calls collectives from one
    /// thread at a time) and takes `MPI_COMM_WORLD`. The deadline is 60 s unless
    /// `NDFUSE_MPI_TIMEOUT_S` says otherwise; `Err` when MPI was already initialised,
    /// or the variable is not a positive number. Replaces the process's SIGUSR1
    /// handler with one that records the launcher's notice that a process of the run
    /// ended (see the module's documentation).
    pub fn init() -> Result<MpiRanks> {
        let refuse = |why: String| Error::Argument {
            what: "MpiRanks::init",
            why,
        };
        let deadline = match std::env::var("NDFUSE_MPI_TIMEOUT_S") {
            Ok(s) => match s.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && v.is_finite() => Duration::from_secs_f64(v),
                _ => {
                    return Err(refuse(format!(
                        "NDFUSE_MPI_TIMEOUT_S={s:?} is not a positive number of seconds"
                    )))
                }
            },
            Err(_) => DEFAULT_DEADLINE,
        };
        let (universe, _) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| refuse("MPI is already initialised in this process".into()))?;
        let world = universe.world();
        // Errors are returned rather than fatal: a collective that MPI fails is reported
        // with the ranks that did not arrive, and one it leaves pending is bounded by the
        // deadline.
        // SAFETY: MPI is initialised (above) and both handles are MPI's own constants.
        unsafe {
            mpi::ffi::MPI_Comm_set_errhandler(
                mpi::ffi::RSMPI_COMM_WORLD,
                mpi::ffi::RSMPI_ERRORS_RETURN,
            );
        }
        if let Some(sigusr1) = SIGUSR1 {
            // After MPI_Init, so that this handler is the one in place.
            // SAFETY: the handler only adds to an atomic, which is async-signal-safe; the
            // signal number is SIGUSR1's on this target.
            unsafe { signal(sigusr1, on_ended_notice) };
        }
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let local = world.split_shared(0).size() as usize;
        Ok(MpiRanks {
            universe: ManuallyDrop::new(universe),
            world,
            rank,
            size,
            local,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            deadline,
            sequence: Mutex::new(0),
            roll_call: Mutex::new(None),
            failed: AtomicBool::new(false),
        })
    }

    /// The longest one collective may wait for the other ranks (default 60 s).
    pub fn deadline(mut self, limit: Duration) -> MpiRanks {
        self.deadline = limit;
        self
    }

    /// The most bytes one MPI reduction carries (default 4 MiB, at least one element).
    pub fn bucket_bytes(mut self, bytes: usize) -> MpiRanks {
        self.bucket_bytes = bytes.max(8);
        self
    }

    /// The ranks on this machine (sharing its memory), this one included: what a
    /// rank divides the machine's cores by.
    pub fn local_size(&self) -> usize {
        self.local
    }

    /// The name of the host this rank runs on (MPI's processor name).
    pub fn host(&self) -> String {
        mpi::environment::processor_name().unwrap_or_default()
    }

    /// Copies `bytes` of rank `root` into every rank's `bytes` (for set-up, such as
    /// handing NCCL's unique id to every rank). Bounded like every collective here: it
    /// is a maximum over the ranks (the others contribute zeros) through the same
    /// arrival exchange and deadline, one u64 per byte, which costs nothing for the
    /// 128 bytes of an id. `Err` when `root` is not a rank, or as a reduction fails.
    pub fn broadcast_bytes(&self, root: usize, bytes: &mut [u8]) -> Result<()> {
        if root >= self.size {
            return Err(Error::Argument {
                what: "MpiRanks::broadcast_bytes",
                why: format!("root {root} is not one of the {} ranks", self.size),
            });
        }
        let mine = if self.rank == root {
            bytes.iter().map(|&b| u64::from(b)).collect()
        } else {
            vec![0; bytes.len()]
        };
        let parts = Parts {
            u64_max: mine,
            ..Parts::default()
        };
        let got = self.reduce("broadcast_bytes", parts)?;
        for (b, v) in bytes.iter_mut().zip(got.u64_max) {
            // Every value is one of root's bytes.
            *b = v as u8;
        }
        Ok(())
    }

    /// Ends every rank of the run (MPI_Abort: the launcher kills them all) with exit
    /// status `code`: what a rank does after it has reported a failed collective, so
    /// that ranks hung or waiting elsewhere do not outlive the run. Standard output and
    /// error are flushed and the launcher is given 200 ms to forward them first: the
    /// launcher acts on the abort at once, and what this rank (or another survivor) has
    /// just written could otherwise be lost with the run.
    pub fn abort(&self, code: i32) -> ! {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        std::thread::sleep(Duration::from_millis(200));
        self.world.abort(code)
    }

    /// One collective call: the arrival exchange, then every reduction of `parts` in
    /// buckets, all non-blocking and polled until done or the deadline.
    fn reduce(&self, what: &'static str, parts: Parts) -> Result<Parts> {
        let mut sequence = self
            .sequence
            .lock()
            .map_err(|_| self.fail(what, 0, Vec::new()))?;
        let seq = *sequence;
        *sequence += 1;
        if self.size == 1 {
            return Ok(parts);
        }
        let send = parts.clone();
        let mut recv = parts;
        let mut arrived = vec![u64::MAX; self.size];
        let start = Instant::now();
        let elems = |bytes_per: usize| (self.bucket_bytes / bytes_per).max(1);
        let mut roll = self
            .roll_call
            .lock()
            .map_err(|_| self.fail(what, seq, Vec::new()))?;
        let outcome = mpi::request::scope(|scope| {
            let mut sends = Vec::new();
            let mut arrivals = Vec::new();
            for (peer, slot) in arrived.iter_mut().enumerate() {
                if peer == self.rank {
                    continue;
                }
                let p = self.world.process_at_rank(peer as i32);
                sends.push(Some(p.immediate_send_with_tag(scope, &seq, ARRIVAL_TAG)));
                arrivals.push((
                    peer,
                    Some(p.immediate_receive_into_with_tag(scope, slot, ARRIVAL_TAG)),
                ));
            }
            let w = &self.world;
            let mut f32s = Vec::new();
            for (s, r) in send
                .f32_sum
                .chunks(elems(4))
                .zip(recv.f32_sum.chunks_mut(elems(4)))
            {
                f32s.push(Some(w.immediate_all_reduce_into(
                    scope,
                    s,
                    r,
                    SystemOperation::sum(),
                )));
            }
            let mut f64s = Vec::new();
            for (s, r, op) in [
                (&send.f64_sum, &mut recv.f64_sum, SystemOperation::sum()),
                (&send.f64_max, &mut recv.f64_max, SystemOperation::max()),
            ] {
                for (s, r) in s.chunks(elems(8)).zip(r.chunks_mut(elems(8))) {
                    f64s.push(Some(w.immediate_all_reduce_into(scope, s, r, op)));
                }
            }
            let mut u64s = Vec::new();
            for (s, r, op) in [
                (&send.u64_min, &mut recv.u64_min, SystemOperation::min()),
                (&send.u64_max, &mut recv.u64_max, SystemOperation::max()),
            ] {
                for (s, r) in s.chunks(elems(8)).zip(r.chunks_mut(elems(8))) {
                    u64s.push(Some(w.immediate_all_reduce_into(scope, s, r, op)));
                }
            }
            let mut spins = 0u32;
            loop {
                let mut progress = Ok(true);
                for step in [
                    advance(&mut sends),
                    advance(&mut f32s),
                    advance(&mut f64s),
                    advance(&mut u64s),
                ]
                .into_iter()
                .chain(
                    arrivals
                        .iter_mut()
                        .map(|(_, r)| advance(std::slice::from_mut(r))),
                ) {
                    progress = match (progress, step) {
                        (Err(e), _) | (_, Err(e)) => Err(e),
                        (Ok(a), Ok(b)) => Ok(a && b),
                    };
                }
                if let Err(code) = RollCall::advance(&mut roll, self.rank, self.size) {
                    progress = Err(code);
                }
                // A roll call started just now is given a moment to hear the others.
                let settled = roll
                    .as_ref()
                    .is_none_or(|r| r.started.elapsed() >= ROLL_CALL_SETTLE.min(self.deadline));
                let failed = match progress {
                    Ok(true) => return Ok(()),
                    Ok(false) if start.elapsed() < self.deadline || !settled => None,
                    Ok(false) => Some(Failure::Deadline),
                    Err(code) => Some(Failure::Mpi(code)),
                };
                if let Some(failure) = failed {
                    let missing: Vec<usize> = arrivals
                        .iter()
                        .filter(|(_, r)| r.is_some())
                        .map(|(peer, _)| *peer)
                        .collect();
                    abandon(&mut sends);
                    abandon(&mut f32s);
                    abandon(&mut f64s);
                    abandon(&mut u64s);
                    for (_, r) in &mut arrivals {
                        abandon(std::slice::from_mut(r));
                    }
                    return Err((failure, missing));
                }
                // MPI progresses only inside its calls: poll eagerly at first, then
                // give the cores to the ranks still computing (a machine may run more
                // ranks than it has cores).
                spins += 1;
                if spins < 1000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        });
        match outcome {
            Ok(()) => {
                for (peer, &got) in arrived.iter().enumerate() {
                    if peer != self.rank && got != seq {
                        return Err(self.fail(what, seq, vec![peer]));
                    }
                }
                Ok(recv)
            }
            Err((failure, missing)) => {
                // MPI may still write into these buffers: they must outlive the
                // abandoned requests, so they are never freed.
                std::mem::forget(send);
                std::mem::forget(recv);
                std::mem::forget(arrived);
                // After the launcher's notice, the ranks not heard in the roll call are
                // the ones gone, whether or not they reached this collective first.
                let missing = roll.as_ref().map_or(missing, RollCall::unheard);
                Err(match failure {
                    Failure::Mpi(code) => {
                        self.lost(what, seq, missing, format!("MPI: {}", mpi_message(code)))
                    }
                    Failure::Deadline if ENDED_NOTICES.load(Ordering::SeqCst) > 0 => self.lost(
                        what,
                        seq,
                        missing,
                        format!(
                            "the launcher reported that a process of the run ended, and the \
                             collective did not complete within {} s",
                            self.deadline.as_secs_f64()
                        ),
                    ),
                    Failure::Deadline => self.fail(what, seq, missing),
                })
            }
        }
    }

    fn fail(&self, what: &'static str, sequence: u64, missing: Vec<usize>) -> Error {
        self.failed.store(true, Ordering::SeqCst);
        Error::Rank {
            rank: self.rank,
            what,
            sequence,
            missing,
            seconds: self.deadline.as_secs_f64(),
        }
    }

    fn lost(&self, what: &'static str, sequence: u64, lost: Vec<usize>, why: String) -> Error {
        self.failed.store(true, Ordering::SeqCst);
        Error::RankLost {
            rank: self.rank,
            what,
            sequence,
            lost,
            why,
        }
    }
}

/// The tag of roll-call messages.
const ROLL_CALL_TAG: i32 = 0x4e45;

/// How long a roll call is given to hear the live ranks before a collective that has
/// passed its deadline is failed (at most the deadline).
const ROLL_CALL_SETTLE: Duration = Duration::from_millis(500);

/// After the launcher's notice that a process ended, every rank sends every other its
/// rank once, from whichever collective it is in (all the live ranks are polling the
/// same stuck collective, or reach it). When a collective then fails, the peers not
/// heard from are the ones gone: this names a rank that died after it had reached the
/// collective (its arrival came, the reduction never completes), which the arrival
/// exchange cannot. Its buffers are leaked and its requests never completed (a dead
/// peer never answers), and MPI is not finalised after a notice.
struct RollCall {
    /// When this rank posted its part.
    started: Instant,
    /// Per peer, the pending receive of its word (`None` once heard, and for this rank).
    heard: Vec<Option<RawRequest>>,
}

/// An MPI request handle kept across collectives.
struct RawRequest(mpi::ffi::MPI_Request);

// SAFETY: a request handle is MPI's opaque handle (an integer in MPICH, a pointer in
// Open MPI) with no thread affinity; it is only used under MpiRanks' lock, which
// serialises MPI calls as the threading level requires.
unsafe impl Send for RawRequest {}

impl RollCall {
    /// Posts the roll call once the launcher's notice has come, then tests the pending
    /// receives once; `Err` with MPI's code when a call fails.
    fn advance(
        roll: &mut Option<RollCall>,
        rank: usize,
        size: usize,
    ) -> std::result::Result<(), c_int> {
        if roll.is_none() {
            if ENDED_NOTICES.load(Ordering::SeqCst) == 0 {
                return Ok(());
            }
            *roll = Some(RollCall::post(rank, size)?);
        }
        let Some(call) = roll.as_mut() else {
            return Ok(());
        };
        for slot in call.heard.iter_mut() {
            let Some(request) = slot.as_mut() else {
                continue;
            };
            let mut flag: c_int = 0;
            let mut status = MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
            // SAFETY: a live request of this roll call; flag and status are writable.
            let rc = unsafe { mpi::ffi::MPI_Test(&mut request.0, &mut flag, status.as_mut_ptr()) };
            if rc != mpi::ffi::MPI_SUCCESS as c_int {
                return Err(rc);
            }
            if flag != 0 {
                *slot = None;
            }
        }
        Ok(())
    }

    /// Sends this rank's word to every peer and posts a receive from each.
    fn post(rank: usize, size: usize) -> std::result::Result<RollCall, c_int> {
        let word: &'static u64 = Box::leak(Box::new(rank as u64));
        let mut heard = Vec::with_capacity(size);
        for peer in 0..size {
            if peer == rank {
                heard.push(None);
                continue;
            }
            let slot: &'static mut u64 = Box::leak(Box::new(u64::MAX));
            // SAFETY: MPI is initialised (an MpiRanks exists); both buffers are leaked,
            // so they outlive the requests; one u64 each, as the datatype and count say.
            let (rc, request) = unsafe {
                let mut send = mpi::ffi::RSMPI_REQUEST_NULL;
                let rc = mpi::ffi::MPI_Isend(
                    (word as *const u64).cast(),
                    1,
                    mpi::ffi::RSMPI_UINT64_T,
                    peer as c_int,
                    ROLL_CALL_TAG,
                    mpi::ffi::RSMPI_COMM_WORLD,
                    &mut send,
                );
                if rc != mpi::ffi::MPI_SUCCESS as c_int {
                    return Err(rc);
                }
                // Never waited for: MPI completes and frees it on its own.
                mpi::ffi::MPI_Request_free(&mut send);
                let mut request = mpi::ffi::RSMPI_REQUEST_NULL;
                let rc = mpi::ffi::MPI_Irecv(
                    (slot as *mut u64).cast(),
                    1,
                    mpi::ffi::RSMPI_UINT64_T,
                    peer as c_int,
                    ROLL_CALL_TAG,
                    mpi::ffi::RSMPI_COMM_WORLD,
                    &mut request,
                );
                (rc, request)
            };
            if rc != mpi::ffi::MPI_SUCCESS as c_int {
                return Err(rc);
            }
            heard.push(Some(RawRequest(request)));
        }
        Ok(RollCall {
            started: Instant::now(),
            heard,
        })
    }

    /// The peers not heard from.
    fn unheard(&self) -> Vec<usize> {
        (0..self.heard.len())
            .filter(|&p| self.heard[p].is_some())
            .collect()
    }
}

/// Why a collective was given up.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// The deadline passed with requests still pending.
    Deadline,
    /// MPI returned this error code from a test of a request.
    Mpi(c_int),
}

/// MPI's text for an error code.
fn mpi_message(code: c_int) -> String {
    let mut text = vec![0u8; mpi::ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters and the terminator, as
    // MPI_Error_string requires; `len` receives the length written.
    let rc = unsafe { mpi::ffi::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    if rc != mpi::ffi::MPI_SUCCESS as c_int {
        return format!("error code {code}");
    }
    text.truncate(len.clamp(0, mpi::ffi::MPI_MAX_ERROR_STRING as c_int) as usize);
    format!("{} (code {code})", String::from_utf8_lossy(&text).trim())
}

impl Drop for MpiRanks {
    fn drop(&mut self) {
        if !self.failed.load(Ordering::SeqCst) && ENDED_NOTICES.load(Ordering::SeqCst) == 0 {
            // SAFETY: dropped once, here; after a failure, or once the launcher has
            // reported that a process ended, it is left alone instead, because
            // MPI_Finalize would wait for the dead peer.
            unsafe { ManuallyDrop::drop(&mut self.universe) };
        }
    }
}

/// The operands of one collective call, by element type and operation.
#[derive(Debug, Clone, Default)]
struct Parts {
    f32_sum: Vec<f32>,
    f64_sum: Vec<f64>,
    f64_max: Vec<f64>,
    u64_min: Vec<u64>,
    u64_max: Vec<u64>,
}

/// Tests each pending request once (`MPI_Test`, its return code checked: rsmpi's `test`
/// ignores it); true when none is left, `Err` with MPI's code when a test fails (the
/// failed request stays pending, to be abandoned).
fn advance<'a, D: ?Sized, S: Scope<'a>>(
    requests: &mut [Option<Request<'a, D, S>>],
) -> std::result::Result<bool, c_int> {
    let mut done = true;
    for slot in requests.iter_mut() {
        let Some(r) = slot.take() else { continue };
        let mut raw = r.as_raw();
        let mut flag: c_int = 0;
        let mut status = MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
        // SAFETY: `raw` is the handle of a live request (it is still owned by `r`), and
        // `flag` and `status` are valid for MPI to write.
        let rc = unsafe { mpi::ffi::MPI_Test(&mut raw, &mut flag, status.as_mut_ptr()) };
        if rc != mpi::ffi::MPI_SUCCESS as c_int {
            *slot = Some(r);
            return Err(rc);
        }
        if flag != 0 {
            // SAFETY: the request completed (MPI freed it); this only unregisters it
            // from its scope.
            let _ = unsafe { r.into_raw() };
        } else {
            *slot = Some(r);
            done = false;
        }
    }
    Ok(done)
}

/// Gives up pending requests without completing them (after a timeout).
fn abandon<'a, D: ?Sized, S: Scope<'a>>(requests: &mut [Option<Request<'a, D, S>>]) {
    for r in requests.iter_mut().filter_map(Option::take) {
        // SAFETY: the buffers of these requests are leaked by the caller (never freed),
        // so they outlive the requests whatever MPI does with them later.
        let _ = unsafe { r.into_raw() };
    }
}

impl Ranks for MpiRanks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allreduce_sum(&self, arrays: &mut [Array]) -> Result<()> {
        let mut parts = Parts::default();
        for a in arrays.iter() {
            match a.dtype() {
                DType::F32 => parts.f32_sum.extend_from_slice(a.as_slice::<f32>()?),
                DType::F64 => parts.f64_sum.extend_from_slice(a.as_slice::<f64>()?),
                other => {
                    return Err(Error::Argument {
                        what: "MpiRanks::allreduce_sum",
                        why: format!("only f32 and f64 arrays are reduced, not {other:?}"),
                    })
                }
            }
        }
        let parts = self.reduce("allreduce_sum", parts)?;
        let (mut f32s, mut f64s) = (parts.f32_sum.as_slice(), parts.f64_sum.as_slice());
        for a in arrays.iter_mut() {
            let (n, shape) = (a.len(), a.shape().to_vec());
            *a = if a.dtype() == DType::F32 {
                let (mine, rest) = f32s.split_at(n);
                f32s = rest;
                Array::from_vec(mine.to_vec(), &shape)?
            } else {
                let (mine, rest) = f64s.split_at(n);
                f64s = rest;
                Array::from_vec(mine.to_vec(), &shape)?
            };
        }
        Ok(())
    }

    fn allreduce_sum_f64(&self, values: &mut [f64]) -> Result<()> {
        let parts = Parts {
            f64_sum: values.to_vec(),
            ..Parts::default()
        };
        values.copy_from_slice(&self.reduce("allreduce_sum_f64", parts)?.f64_sum);
        Ok(())
    }

    fn allreduce_max_f64(&self, values: &mut [f64]) -> Result<()> {
        let parts = Parts {
            f64_max: values.to_vec(),
            ..Parts::default()
        };
        values.copy_from_slice(&self.reduce("allreduce_max_f64", parts)?.f64_max);
        Ok(())
    }

    fn all_equal(&self, value: u64) -> Result<bool> {
        let parts = Parts {
            u64_min: vec![value],
            u64_max: vec![value],
            ..Parts::default()
        };
        let got = self.reduce("all_equal", parts)?;
        Ok(got.u64_min[0] == got.u64_max[0])
    }
}
