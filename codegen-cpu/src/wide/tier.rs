//! The tiers of the wide path (which vector width the host has, which one the kernels
//! use) and the signatures of its routines.

use ndfuse_ir::UnaryOp;
use std::sync::OnceLock;

/// A width of the wide path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// AVX-512F: 16 f32 lanes.
    Avx512,
    /// AVX2, FMA and F16C: 8 f32 lanes.
    Avx2,
}

impl Tier {
    /// f32 lanes of one register.
    pub fn lanes(self) -> usize {
        match self {
            Tier::Avx512 => 16,
            Tier::Avx2 => 8,
        }
    }

    /// `AVX-512F`, `AVX2`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Avx512 => "AVX-512F",
            Tier::Avx2 => "AVX2",
        }
    }

    /// Whether the host can run this tier's routines.
    pub fn available(self) -> bool {
        host_has(self)
    }
}

#[cfg(target_arch = "x86_64")]
fn host_has(tier: Tier) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match tier {
        Tier::Avx512 => has!("avx512f") && has!("fma") && has!("f16c"),
        Tier::Avx2 => has!("avx2") && has!("fma") && has!("f16c"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn host_has(_: Tier) -> bool {
    false
}

/// The tiers this host can run, widest first (for tests and reports).
pub fn available() -> Vec<Tier> {
    [Tier::Avx512, Tier::Avx2]
        .into_iter()
        .filter(|t| t.available())
        .collect()
}

/// The tier the kernels compiled in this process use, `None` for the 128-bit code
/// alone (see the module docs for `NDFUSE_CPU_WIDE`).
pub fn tier() -> Option<Tier> {
    static TIER: OnceLock<Option<Tier>> = OnceLock::new();
    *TIER.get_or_init(|| {
        let choice = std::env::var("NDFUSE_CPU_WIDE").unwrap_or_default();
        let choice = choice.trim().to_ascii_lowercase();
        if matches!(choice.as_str(), "0" | "off" | "no" | "false" | "128") {
            return None;
        }
        if !crate::vmath::builder::use_fma() {
            return None;
        }
        let widest = available().into_iter().next()?;
        if choice == "avx2" && Tier::Avx2.available() {
            return Some(Tier::Avx2);
        }
        Some(widest)
    })
}

/// A routine over `n` f32 (C ABI, so JIT code may call it too): reads `src[0..n]`, writes `dst[0..n]`; `src` and `dst` may
/// be the same pointer (in place), never otherwise overlapping.
pub(crate) type UnaryFn = unsafe extern "C" fn(src: *const f32, dst: *mut f32, n: usize);

/// A conversion of `n` elements to f32: reads `n` elements of the source dtype at
/// `src`, writes `dst[0..n]`.
pub(crate) type LoadFn = unsafe extern "C" fn(src: *const u8, dst: *mut f32, n: usize);

/// A conversion of `n` f32 to the destination dtype: reads `src[0..n]`, writes `n`
/// elements at `dst`.
pub(crate) type StoreFn = unsafe extern "C" fn(src: *const f32, dst: *mut u8, n: usize);

/// The unary ops that have a wide routine (at every tier).
pub(crate) const UNARY_OPS: [UnaryOp; 7] = [
    UnaryOp::Exp,
    UnaryOp::Expm1,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Erf,
    UnaryOp::Log,
    UnaryOp::Log1p,
];
