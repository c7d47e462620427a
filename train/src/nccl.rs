//! `NcclRanks`: the ranks of an MPI run whose large reductions (gradients, parameters)
//! go through NCCL on each rank's GPU, MPI handing NCCL's unique id to every rank and
//! still carrying the small scalar collectives. Feature `nccl` (which needs `mpi`);
//! cudarc loads libcuda and libnccl at run time, so it builds without either.

use crate::error::{Error, Result};
use crate::mpi::MpiRanks;
use crate::ranks::Ranks;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use ndfuse::{Array, DType};
use std::sync::{Arc, Mutex};

/// A NCCL communicator, moved into the lock that serialises its use.
struct Communicator(Comm);

// SAFETY: NCCL lets a communicator be used from any host thread as long as two calls
// on it never overlap; `NcclRanks` only reaches it through its `Mutex`, so calls are
// serialised, and `Comm` holds nothing tied to the thread that made it (a handle and an
// `Arc` of the stream, which cudarc makes `Send + Sync`).
unsafe impl Send for Communicator {}

/// The ranks of an `mpiexec` run with one GPU each: sums of f32 and f64 arrays go
/// through `ncclAllReduce` on the rank's device (copied in and out: ndfuse's evaluated
/// arrays are host arrays); the scalar collectives and the equality check go through
/// MPI, whose deadline also bounds them.
pub struct NcclRanks {
    mpi: MpiRanks,
    stream: Arc<CudaStream>,
    comm: Mutex<Communicator>,
}

impl std::fmt::Debug for NcclRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclRanks")
            .field("mpi", &self.mpi)
            .field("device", &self.stream.context().ordinal())
            .finish()
    }
}

fn nccl_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Argument {
        what: "NcclRanks",
        why: format!("{what}: {e:?}"),
    }
}

impl NcclRanks {
    /// NCCL over `mpi`'s ranks, this rank on CUDA device `ordinal` (commonly the rank's
    /// index among the ranks of its host). Rank 0 makes NCCL's unique id and MPI
    /// broadcasts it; every rank then joins the communicator (which waits for all).
    ///
    /// # Errors
    /// No CUDA driver or device, no libnccl, or NCCL's own set-up failing.
    pub fn new(mpi: MpiRanks, ordinal: usize) -> Result<NcclRanks> {
        // cudarc loads the libraries on first use and panics when one is missing: ask
        // first, so a machine without them gets an error.
        // SAFETY: each call only tries to open the library by its known names
        // (libloading) and reports whether that worked; nothing else runs.
        let present = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nccl::sys::is_culib_present(),
            )
        };
        match present {
            (false, _) => return Err(nccl_error("CUDA driver", "libcuda cannot be loaded")),
            (_, false) => return Err(nccl_error("NCCL", "libnccl cannot be loaded")),
            _ => {}
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| nccl_error("CUDA device", e))?;
        let stream = ctx.default_stream();
        let mut id = [0u8; 128];
        if mpi.rank() == 0 {
            let made = Id::new().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
            for (b, c) in id.iter_mut().zip(made.internal()) {
                *b = *c as u8;
            }
        }
        mpi.broadcast_bytes(0, &mut id)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (c, b) in internal.iter_mut().zip(id) {
            *c = b as std::ffi::c_char;
        }
        let comm = Comm::from_rank(
            Arc::clone(&stream),
            mpi.rank(),
            mpi.size(),
            Id::uninit(internal),
        )
        .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        Ok(NcclRanks {
            mpi,
            stream,
            comm: Mutex::new(Communicator(comm)),
        })
    }

    /// The MPI ranks underneath.
    pub fn mpi(&self) -> &MpiRanks {
        &self.mpi
    }

    /// Sums `host` across the ranks through NCCL on this rank's device.
    fn sum<T: cudarc::driver::DeviceRepr + cudarc::nccl::safe::NcclType + Copy>(
        &self,
        host: &[T],
    ) -> Result<Vec<T>> {
        let comm = self
            .comm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut dev = self
            .stream
            .clone_htod(host)
            .map_err(|e| nccl_error("copy to the device", e))?;
        comm.0
            .all_reduce_in_place(&mut dev, &ReduceOp::Sum)
            .map_err(|e| nccl_error("ncclAllReduce", e))?;
        self.stream
            .clone_dtoh(&dev)
            .map_err(|e| nccl_error("copy from the device", e))
    }
}

impl Ranks for NcclRanks {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn size(&self) -> usize {
        self.mpi.size()
    }

    fn allreduce_sum(&self, arrays: &mut [Array]) -> Result<()> {
        for a in arrays.iter_mut() {
            let summed = match a.dtype() {
                DType::F32 => Array::from_vec(self.sum(a.as_slice::<f32>()?)?, a.shape())?,
                DType::F64 => Array::from_vec(self.sum(a.as_slice::<f64>()?)?, a.shape())?,
                other => {
                    return Err(Error::Argument {
                        what: "NcclRanks::allreduce_sum",
                        why: format!("{other} arrays are not reduced (f32 and f64 only)"),
                    })
                }
            };
            *a = summed;
        }
        Ok(())
    }

    fn allreduce_sum_f64(&self, values: &mut [f64]) -> Result<()> {
        self.mpi.allreduce_sum_f64(values)
    }

    fn allreduce_max_f64(&self, values: &mut [f64]) -> Result<()> {
        self.mpi.allreduce_max_f64(values)
    }

    fn all_equal(&self, value: u64) -> Result<bool> {
        self.mpi.all_equal(value)
    }
}
