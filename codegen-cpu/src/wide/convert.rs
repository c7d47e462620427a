//! f16 and bf16 <-> f32 conversions of whole blocks on wide registers.

use super::tier::{LoadFn, StoreFn, Tier};
use ndfuse_ir::DType;

/// The conversion of `dtype` elements to f32 at `tier`.
pub(super) fn load_fn(dtype: DType, tier: Tier) -> Option<LoadFn> {
    let _ = (dtype, tier);
    None
}

/// The conversion of f32 to `dtype` elements at `tier`.
pub(super) fn store_fn(dtype: DType, tier: Tier) -> Option<StoreFn> {
    let _ = (dtype, tier);
    None
}
