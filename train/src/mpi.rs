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

use crate::error::{Error, Result};
use crate::ranks::Ranks;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;
use ndfuse::{Array, DType};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tag of arrival messages (collectives do not use tags; this keeps them apart from
/// any point-to-point traffic of the application).
const ARRIVAL_TAG: i32 = 0x4e44;

/// The default bound on one collective, overridden by `NDFUSE_MPI_TIMEOUT_S`.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The default bucket: at most 4 MiB reduced by one MPI call.
const DEFAULT_BUCKET_BYTES: usize = 4 << 20;

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
    /// or the variable is not a positive number.
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
        // Errors are returned rather than fatal, so a broken connection to a dead peer
        // leaves the request pending and the deadline names the peer.
        // SAFETY: MPI is initialised (above) and both handles are MPI's own constants.
        unsafe {
            mpi::ffi::MPI_Comm_set_errhandler(
                mpi::ffi::RSMPI_COMM_WORLD,
                mpi::ffi::RSMPI_ERRORS_RETURN,
            );
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

    /// Copies `bytes` of rank `root` into every rank's `bytes` (`MPI_Bcast`, blocking:
    /// for set-up, such as handing NCCL's unique id to every rank).
    pub fn broadcast_bytes(&self, root: usize, bytes: &mut [u8]) {
        use mpi::collective::Root;
        let _serial = self
            .sequence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.world
            .process_at_rank(root as i32)
            .broadcast_into(bytes);
    }

    /// Ends every rank of the run (MPI_Abort: the launcher kills them all) with exit
    /// status `code`: what a rank does after it has reported a failed collective, so
    /// that ranks hung or waiting elsewhere do not outlive the run.
    pub fn abort(&self, code: i32) -> ! {
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
                let mut done = advance(&mut sends);
                done &= advance(&mut f32s);
                done &= advance(&mut f64s);
                done &= advance(&mut u64s);
                for (_, r) in &mut arrivals {
                    done &= advance(std::slice::from_mut(r));
                }
                if done {
                    return Ok(());
                }
                if start.elapsed() >= self.deadline {
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
                    return Err(missing);
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
            Err(missing) => {
                // MPI may still write into these buffers: they must outlive the
                // abandoned requests, so they are never freed.
                std::mem::forget(send);
                std::mem::forget(recv);
                std::mem::forget(arrived);
                Err(self.fail(what, seq, missing))
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
}

impl Drop for MpiRanks {
    fn drop(&mut self) {
        if !self.failed.load(Ordering::SeqCst) {
            // SAFETY: dropped once, here; after a failure it is left alone instead,
            // because MPI_Finalize would wait for the dead peer.
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

/// Tests each pending request once; true when none is left.
fn advance<'a, D: ?Sized, S: Scope<'a>>(requests: &mut [Option<Request<'a, D, S>>]) -> bool {
    let mut done = true;
    for slot in requests.iter_mut() {
        if let Some(r) = slot.take() {
            if let Err(r) = r.test() {
                *slot = Some(r);
                done = false;
            }
        }
    }
    done
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
