//! The processes of a multi-process run as the wrapper sees them: a rank, a count, and
//! the collectives it needs. The `mpi` feature implements it over MPI
//! ([`crate::MpiRanks`]); tests implement it over threads. Without ranks a wrapper is
//! one process.

use crate::error::Result;
use ndfuse::Array;
use std::fmt::Debug;

/// Collectives across the ranks of a run. Every rank calls each collective in the same
/// order with the same lengths (the wrapper's rounds are computed from the data set's
/// size, so every rank runs the same number, contributing zeros when it has no batch).
/// An implementation bounds the time it waits: a rank that died or hangs makes every
/// other rank return an error naming it instead of waiting forever.
pub trait Ranks: Debug + Send + Sync {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Sums each array element-wise across the ranks, in place (f32 or f64 arrays;
    /// large ones may be reduced in buckets).
    fn allreduce_sum(&self, arrays: &mut [Array]) -> Result<()>;
    /// Sums `values` across the ranks, in place.
    fn allreduce_sum_f64(&self, values: &mut [f64]) -> Result<()>;
    /// The maximum of `values` across the ranks, in place.
    fn allreduce_max_f64(&self, values: &mut [f64]) -> Result<()>;
    /// Whether every rank passed the same `value` (a hash of its parameters).
    fn all_equal(&self, value: u64) -> Result<bool>;
}

/// FNV-1a over the bytes of `arrays`: what ranks compare to check that they hold the
/// same parameters.
pub(crate) fn hash_arrays(arrays: &[Array]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for a in arrays {
        for v in a.to_f64_vec() {
            for b in v.to_bits().to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    h
}
