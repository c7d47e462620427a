//! Which micro-kernels the CPU's float products run: the `gemm` crate's AVX-512F ones
//! (64 of its lhs rows by 6 columns: four zmm registers by six broadcasts, 24
//! accumulators), its AVX2+FMA ones (16 by 6), or its scalar ones, chosen once per
//! process from the tier the element-wise kernels use (`NDFUSE_CPU_WIDE`, see
//! `ndfuse_codegen_cpu::wide`), so `NDFUSE_CPU_WIDE=avx2` runs every product on AVX2 on
//! a host with AVX-512 too.
//!
//! `gemm::gemm` picks the widest kernels the host has and cannot be told otherwise, so
//! [`gemm`] here does what it does before its dispatch (puts the destination's unit
//! stride first and makes every stride positive) and then calls the crate's driver,
//! `gemm_basic_generic`, with the chosen tier's kernels. On the tier `gemm::gemm` would
//! pick, the bits are the crate's; on any one tier they do not depend on the thread
//! count (the crate never splits K across threads).
//!
//! On the 2-core Intel Xeon VM of 2026-11-29 (two 512-bit FMA units per core), 2048^3
//! f32 ran at 313 GFLOP/s on the AVX-512F kernels against 160 on the AVX2 ones (`gemm`
//! 0.18 had no AVX-512 kernels on stable Rust).

use gemm::Parallelism;
use gemm_common::gemm::gemm_basic_generic;
use gemm_common::microkernel::MicroKernelFn;
use gemm_common::simd::{Scalar, V3};
use std::sync::OnceLock;

/// The micro-kernels of the CPU's float products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProductTier {
    /// AVX-512F: 16 f32 lanes, 64 x 6 f32 tiles (32 x 6 for f64).
    Avx512,
    /// AVX2 and FMA: 8 f32 lanes, 16 x 6 f32 tiles (8 x 6 for f64).
    Fma,
    /// No vector FMA: the crate's scalar kernels.
    Scalar,
}

impl ProductTier {
    /// The tier of this process: AVX-512F where the element-wise kernels use it, AVX2+FMA
    /// where they use AVX2, and where the wide path is off (`NDFUSE_CPU_WIDE=off`) the
    /// widest the host has (the switch is about the element-wise kernels' width).
    pub fn current() -> ProductTier {
        static TIER: OnceLock<ProductTier> = OnceLock::new();
        *TIER.get_or_init(|| {
            use ndfuse_codegen_cpu::wide::{self, Tier};
            match wide::tier() {
                Some(Tier::Avx512) => ProductTier::Avx512,
                Some(Tier::Avx2) => ProductTier::Fma,
                None if Tier::Avx512.available() => ProductTier::Avx512,
                None if Tier::Avx2.available() => ProductTier::Fma,
                None => ProductTier::Scalar,
            }
        })
    }

    /// `AVX-512F`, `AVX2+FMA`, `scalar`.
    pub fn name(self) -> &'static str {
        match self {
            ProductTier::Avx512 => "AVX-512F",
            ProductTier::Fma => "AVX2+FMA",
            ProductTier::Scalar => "scalar",
        }
    }

    /// f32 lanes of one of the tier's registers.
    pub fn f32_lanes(self) -> usize {
        self.f32_kernels().map_or(1, |k| k.lanes)
    }

    /// The tier's f32 micro-kernels, for the packed GEMM (`gemm_packed`); `None` for
    /// the scalar tier, which it does not run.
    pub(crate) fn f32_kernels(self) -> Option<F32Kernels> {
        match self {
            ProductTier::Avx512 => {
                use gemm_f32::microkernel::avx512f::f32 as k;
                Some(F32Kernels {
                    lanes: 16,
                    mr: k::MR_DIV_N * 16,
                    nr: k::NR,
                    ukr: &k::UKR,
                })
            }
            ProductTier::Fma => {
                use gemm_f32::microkernel::fma::f32 as k;
                Some(F32Kernels {
                    lanes: 8,
                    mr: k::MR_DIV_N * 8,
                    nr: k::NR,
                    ukr: &k::UKR,
                })
            }
            ProductTier::Scalar => None,
        }
    }
}

/// One tier's f32 micro-kernels: `ukr[mr / lanes - 1][nr - 1]` computes a tile of up to
/// `mr` of the crate's lhs rows by up to `nr` of its columns.
#[derive(Clone, Copy)]
pub(crate) struct F32Kernels {
    pub(crate) lanes: usize,
    pub(crate) mr: usize,
    pub(crate) nr: usize,
    pub(crate) ukr: &'static [[MicroKernelFn<f32>; 6]],
}

/// The float types the crate multiplies here, each with its kernels per tier.
pub(crate) trait TierFloat: Copy + 'static {
    /// The product's scale (`beta`).
    const ONE: Self;

    /// `gemm_basic_generic` on `tier`'s kernels, with the arguments in the crate's
    /// normal form (see [`gemm`]).
    ///
    /// # Safety
    /// As `gemm::gemm`'s; the host runs `tier` ([`ProductTier::current`] checked).
    #[allow(clippy::too_many_arguments)]
    unsafe fn basic(
        tier: ProductTier,
        shape: (usize, usize, usize),
        dst: (*mut Self, isize, isize),
        lhs: (*const Self, isize, isize),
        rhs: (*const Self, isize, isize),
        beta: Self,
        accumulate: bool,
        par: Parallelism,
    );
}

/// `gemm_basic_generic` on one module of kernels (`$m::$t`), with the crate's arguments
/// (`read_dst` = `$acc`, alpha 1: `dst = dst + beta * lhs @ rhs` when accumulating,
/// `beta * lhs @ rhs` otherwise; no conjugation).
macro_rules! basic {
    ($simd:expr, $t:ident, $krate:ident :: $m:ident, $lanes:expr,
     $shape:expr, $dst:expr, $lhs:expr, $rhs:expr, $beta:expr, $acc:expr, $par:expr) => {{
        use $krate::microkernel::$m::$t as k;
        let (m, n, kk) = $shape;
        gemm_basic_generic::<
            _,
            $t,
            { $lanes },
            { k::MR_DIV_N * $lanes },
            { k::NR },
            { k::MR_DIV_N },
            { k::H_M },
            { k::H_N },
        >(
            $simd,
            m,
            n,
            kk,
            $dst.0,
            $dst.1,
            $dst.2,
            $acc,
            $lhs.0,
            $lhs.1,
            $lhs.2,
            $rhs.0,
            $rhs.1,
            $rhs.2,
            1.0,
            $beta,
            false,
            false,
            false,
            |a, b, c| a * b + c,
            &k::UKR,
            &k::H_UKR,
            false,
            $par,
        )
    }};
}

/// [`TierFloat`] for `$t`, whose kernels are crate `$krate`'s, `$v4` and `$v3` lanes a
/// register on the AVX-512F and AVX2 tiers.
macro_rules! tier_float {
    ($t:ident, $krate:ident, $v4:expr, $v3:expr) => {
        impl TierFloat for $t {
            const ONE: $t = 1.0;

            /// # Safety
            /// As [`TierFloat::basic`]'s.
            unsafe fn basic(
                tier: ProductTier,
                shape: (usize, usize, usize),
                dst: (*mut $t, isize, isize),
                lhs: (*const $t, isize, isize),
                rhs: (*const $t, isize, isize),
                beta: $t,
                accumulate: bool,
                par: Parallelism,
            ) {
                let (d, l, r) = (dst, lhs, rhs);
                // SAFETY: the caller's contract; each tier's simd token exists on this
                // host (`ProductTier::current`), checked again by `try_new`.
                unsafe {
                    match simd_tokens(tier) {
                        Tokens::V4(s) => {
                            basic!(
                                s,
                                $t,
                                $krate::avx512f,
                                $v4,
                                shape,
                                d,
                                l,
                                r,
                                beta,
                                accumulate,
                                par
                            )
                        }
                        Tokens::V3(s) => {
                            basic!(
                                s,
                                $t,
                                $krate::fma,
                                $v3,
                                shape,
                                d,
                                l,
                                r,
                                beta,
                                accumulate,
                                par
                            )
                        }
                        Tokens::Scalar => {
                            basic!(
                                Scalar,
                                $t,
                                $krate::scalar,
                                1,
                                shape,
                                d,
                                l,
                                r,
                                beta,
                                accumulate,
                                par
                            )
                        }
                    }
                }
            }
        }
    };
}

tier_float!(f32, gemm_f32, 16, 8);
tier_float!(f64, gemm_f64, 8, 4);

/// The crate's proof that the host runs a tier's instructions.
enum Tokens {
    V4(gemm_common::simd::V4),
    V3(V3),
    Scalar,
}

/// The tokens of `tier`, falling back to narrower ones where the host lacks it (not
/// reached: `ProductTier::current` only picks what the host has).
fn simd_tokens(tier: ProductTier) -> Tokens {
    if tier == ProductTier::Avx512 {
        if let Some(s) = gemm_common::simd::V4::try_new() {
            return Tokens::V4(s);
        }
    }
    if tier != ProductTier::Scalar {
        if let Some(s) = V3::try_new() {
            return Tokens::V3(s);
        }
    }
    Tokens::Scalar
}

/// `dst = beta * lhs @ rhs` (`dst += beta * lhs @ rhs` when `accumulate`): `lhs` is `m x k` (element `[i, l]` at `i * lrs + l * lcs`),
/// `rhs` `k x n`, `dst` `m x n` (`[i, j]` at `i * drs + j * dcs`), on `tier`'s kernels.
/// The normal form the crate's dispatcher gives its driver: the destination's smaller
/// stride along the driver's rows (transposing the problem), then every stride
/// positive (reversing an axis of the destination, or K, on both operands that share
/// it).
///
/// # Safety
/// As `gemm::gemm`'s: every element the strides reach is inside
/// its allocation, `dst` does not overlap the operands and nothing else accesses it.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<T: TierFloat>(
    tier: ProductTier,
    (m, n, k): (usize, usize, usize),
    (mut dst, dcs, drs): (*mut T, isize, isize),
    lhs: (*const T, isize, isize),
    rhs: (*const T, isize, isize),
    beta: T,
    accumulate: bool,
    par: Parallelism,
) {
    let transpose = dcs.abs() < drs.abs();
    let (m, n, mut dcs, mut drs, (mut l, mut lcs, mut lrs), (mut r, mut rcs, mut rrs)) =
        if transpose {
            // (A B)^T = B^T A^T: the rhs becomes the lhs, rows and columns swap.
            (n, m, drs, dcs, (rhs.0, rhs.2, rhs.1), (lhs.0, lhs.2, lhs.1))
        } else {
            (m, n, dcs, drs, lhs, rhs)
        };
    if drs < 0 && m > 0 {
        dst = dst.wrapping_offset((m - 1) as isize * drs);
        drs = -drs;
        l = l.wrapping_offset((m - 1) as isize * lrs);
        lrs = -lrs;
    }
    if dcs < 0 && n > 0 {
        dst = dst.wrapping_offset((n - 1) as isize * dcs);
        dcs = -dcs;
        r = r.wrapping_offset((n - 1) as isize * rcs);
        rcs = -rcs;
    }
    if lcs < 0 && k > 0 {
        l = l.wrapping_offset((k - 1) as isize * lcs);
        lcs = -lcs;
        r = r.wrapping_offset((k - 1) as isize * rrs);
        rrs = -rrs;
    }
    // SAFETY: the same elements as the caller's, reached from the other end of each
    // reversed axis; the caller's contract covers them.
    unsafe {
        T::basic(
            tier,
            (m, n, k),
            (dst, dcs, drs),
            (l, lcs, lrs),
            (r, rcs, rrs),
            beta,
            accumulate,
            par,
        )
    }
}

impl std::fmt::Debug for F32Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F32Kernels({} x {})", self.mr, self.nr)
    }
}
