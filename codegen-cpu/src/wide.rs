//! The whole vector unit: routines compiled ahead of time for the host's widest
//! vectors (AVX-512F, else AVX2 with FMA and F16C), chosen at run time, that the
//! element-wise kernels call on blocks of a few hundred elements held in L1 (`blocks`)
//! and row programs call on whole rows (`lower::rows`).
//!
//! Cranelift's x86 backend emits 128-bit vectors only and has no F16C conversions, so
//! the pieces of a kernel that cost the most per element run here instead: the exp
//! and log families of the inline math (`math`, `exp`, `log`), the f16/bf16 <-> f32
//! conversions of loads and stores (`convert`), and a row program's max, shifted exp,
//! sum and division (`reduce`, `shift`). Every routine but the sum gives the very bits
//! of the 128-bit code with fused multiply-adds (`vmath`, `lower::convert`): the same
//! algorithm, operation for operation, on wider registers. The row sum adds in an order
//! of its own (64 partials, a fixed tree: the same on every tier, from the row length
//! alone), within the error bound of an n-term f32 sum of the 128-bit loop's. So the
//! documented ULP bounds hold unchanged, and the thread count changes nothing.
//!
//! `NDFUSE_CPU_WIDE` chooses the path, read once per process: `0` (or `off`, `128`)
//! keeps every kernel on the 128-bit code, `avx2` stops at AVX2 on a host with AVX-512,
//! anything else (or unset) takes the widest the host has. There is no wide path where
//! the inline math is unfused (`NDFUSE_CPU_FMA=0`, or a host without FMA): the bits
//! every x86-64 reproduces come from the 128-bit code alone.

pub(crate) mod convert;
pub(crate) mod exp;
pub(crate) mod lanes;
pub(crate) mod log;
mod map;
pub(crate) mod math;
mod pair;
pub(crate) mod reduce;
pub(crate) mod shift;
pub(crate) mod tier;

use ndfuse_ir::{DType, UnaryOp};
pub use reduce::{max, sum};
pub use shift::{div, div_stream, exp_shift};
pub use tier::{available, tier, Tier};
pub(crate) use tier::{LoadFn, StoreFn, UnaryFn, UNARY_OPS};

/// The routine of `op` on f32 at `tier`, where there is one.
pub(crate) fn unary_fn(op: UnaryOp, tier: Tier) -> Option<UnaryFn> {
    if !tier.available() {
        return None;
    }
    math::unary_fn(op, tier)
}

/// gelu's tail on f32 at `tier`: the routine over one source (`exp::GeluFn`) and the
/// one over a sum (`exp::GeluSumFn`).
pub(crate) fn gelu_fns(tier: Tier) -> Option<(exp::GeluFn, exp::GeluSumFn)> {
    if !tier.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(match tier {
            Tier::Avx512 => (exp::gelu_tanh_avx512, exp::gelu_sum_avx512),
            Tier::Avx2 => (exp::gelu_tanh_avx2, exp::gelu_sum_avx2),
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The symbol JIT code calls the routine of `op` by (`ndfuse_wide_exp`).
pub(crate) fn symbol(op: UnaryOp) -> String {
    format!("ndfuse_wide_{}", op.name())
}

/// The symbols and addresses of `tier`'s unary routines, for a JIT module whose code
/// calls them ([`symbol`]; C ABI: `(src, dst, n)`); and of its row routines: sum and
/// max (`ndfuse_wide_sum`, `ndfuse_wide_max`, `(src, n) -> f32`: `reduce`), shifted
/// exp and division (`ndfuse_wide_exp_shift`, `ndfuse_wide_div`, `(src, x, dst, n)`:
/// `shift`).
pub(crate) fn symbols(tier: Tier) -> Vec<(String, usize)> {
    UNARY_OPS
        .iter()
        .filter_map(|&op| unary_fn(op, tier).map(|f| (symbol(op), f as usize)))
        .chain(reduce::sum_fn(tier).map(|f| (reduce::SUM_SYMBOL.to_string(), f as usize)))
        .chain(reduce::max_fn(tier).map(|f| (reduce::MAX_SYMBOL.to_string(), f as usize)))
        .chain(shift::exp_shift_fn(tier).map(|f| (shift::EXP_SHIFT_SYMBOL.to_string(), f as usize)))
        .chain(shift::div_fn(tier).map(|f| (shift::DIV_SYMBOL.to_string(), f as usize)))
        .chain(
            shift::div_stream_fn(tier).map(|f| (shift::DIV_STREAM_SYMBOL.to_string(), f as usize)),
        )
        .collect()
}

/// The conversion of `dtype` (f16 or bf16) elements to f32 at `tier`.
pub(crate) fn load_fn(dtype: DType, tier: Tier) -> Option<LoadFn> {
    if !tier.available() {
        return None;
    }
    convert::load_fn(dtype, tier)
}

/// The conversion of f32 to `dtype` (f16 or bf16) elements at `tier`.
pub(crate) fn store_fn(dtype: DType, tier: Tier) -> Option<StoreFn> {
    if !tier.available() {
        return None;
    }
    convert::store_fn(dtype, tier)
}

/// `op` over `src` into `dst` with `tier`'s routine; `false` (and nothing written)
/// when there is none or the lengths differ. For tests and benchmarks of the routines
/// themselves.
pub fn unary(op: UnaryOp, tier: Tier, src: &[f32], dst: &mut [f32]) -> bool {
    let Some(f) = unary_fn(op, tier).filter(|_| src.len() == dst.len()) else {
        return false;
    };
    // SAFETY: `unary_fn` only returns routines of a tier the host has (checked by
    // `Tier::available`); `src` and `dst` are distinct slices of `n` elements each.
    unsafe { f(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
    true
}

/// `src` (the little-endian bytes of f16 or bf16 elements) converted into `dst` with
/// `tier`'s routine; `false` when there is none or the lengths do not match.
pub fn load(dtype: DType, tier: Tier, src: &[u8], dst: &mut [f32]) -> bool {
    let Some(f) = load_fn(dtype, tier).filter(|_| src.len() == dst.len() * 2) else {
        return false;
    };
    // SAFETY: a routine of a tier the host has; `src` holds `dst.len()` 2-byte
    // elements, and the slices are distinct.
    unsafe { f(src.as_ptr(), dst.as_mut_ptr(), dst.len()) };
    true
}

/// `src` converted to f16 or bf16 elements, written as little-endian bytes into
/// `dst`, with `tier`'s routine; `false` when there is none or the lengths do not
/// match.
pub fn store(dtype: DType, tier: Tier, src: &[f32], dst: &mut [u8]) -> bool {
    let Some(f) = store_fn(dtype, tier).filter(|_| dst.len() == src.len() * 2) else {
        return false;
    };
    // SAFETY: a routine of a tier the host has; `dst` holds `src.len()` 2-byte
    // elements, and the slices are distinct.
    unsafe { f(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
    true
}
