//! The loops of the wide routines over arrays: [`map`] and [`map_sum`], two registers
//! at a time (a [`Pair`]) and then one, with the function of a register as an [`Op`];
//! and [`routines!`], which defines each tier's routine of an op with them.

use super::lanes::Lanes;
use super::pair::Pair;

/// The widest register of any tier, in f32 lanes (the tail buffer of [`map`]).
const MAX_LANES: usize = 16;

/// A function of one register, as a type (so that [`map`] calls it directly and
/// `#[inline(always)]` holds all the way into the routine: a function pointer or
/// `Fn` shim would be compiled apart, without the tier's features). Its value holds
/// the function's constants, if any (gelu's).
pub(super) trait Op {
    fn apply<L: Lanes>(&self, l: L, x: L::F) -> L::F;
}

/// Where the pairs of registers of `n` f32 end, and where the whole registers end: the
/// first two loops' bounds of [`map`] and [`map_sum`] (a partial register follows).
#[inline(always)]
fn extents<L: Lanes>(n: usize) -> (usize, usize) {
    const { assert!(L::LANES <= MAX_LANES) };
    (n - n % (2 * L::LANES), n - n % L::LANES)
}

/// `op` over `src[0..n]` into `dst[0..n]`, two registers at a time (a [`Pair`], whose
/// two chains of operations overlap), then one; the last partial
/// register goes through a stack buffer of one register (its unused lanes 0.0), so it
/// gets the bits a full one would.
///
/// # Safety
/// `src` must be valid for reading and `dst` for writing `n` f32; they may be the same
/// pointer, and must not overlap otherwise.
#[inline(always)]
pub(super) unsafe fn map<L: Lanes, O: Op>(l: L, op: &O, src: *const f32, dst: *mut f32, n: usize) {
    let (pairs, full) = extents::<L>(n);
    let two = Pair(l);
    let mut i = 0;
    while i < pairs {
        // SAFETY: i + 2·LANES <= pairs <= n, so both registers lie inside the caller's
        // ranges; they are read whole before they are written, so in place works.
        unsafe { two.store(dst.add(i), op.apply(two, two.load(src.add(i)))) };
        i += 2 * L::LANES;
    }
    if i < full {
        // SAFETY: as above, for the one register left (i + LANES <= full <= n).
        unsafe { l.store(dst.add(i), op.apply(l, l.load(src.add(i)))) };
    }
    let rest = n - full;
    if rest > 0 {
        let mut buf = [0.0f32; MAX_LANES];
        // SAFETY: `src[full..n]` lies in the caller's range and `buf` (a local) holds
        // MAX_LANES >= rest elements; a local cannot overlap the caller's memory.
        unsafe { std::ptr::copy_nonoverlapping(src.add(full), buf.as_mut_ptr(), rest) };
        // SAFETY: `buf` holds MAX_LANES >= LANES f32.
        let y = op.apply(l, unsafe { l.load(buf.as_ptr()) });
        // SAFETY: as above.
        unsafe { l.store(buf.as_mut_ptr(), y) };
        // SAFETY: `dst[full..n]` lies in the caller's range; `buf` is a local.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), dst.add(full), rest) };
    }
}

/// `op` over `a[i] + b[i]` (one f32 addition, as a kernel's `add` rounds it) for
/// `i < n`, into `dst[0..n]`: [`map`] over the sums, which never leave registers.
///
/// # Safety
/// `a` and `b` must be valid for reading and `dst` for writing `n` f32; `dst` may be
/// `a` or `b`, and must not overlap them otherwise.
#[inline(always)]
pub(super) unsafe fn map_sum<L: Lanes, O: Op>(
    l: L,
    op: &O,
    (a, b): (*const f32, *const f32),
    dst: *mut f32,
    n: usize,
) {
    let (pairs, full) = extents::<L>(n);
    let two = Pair(l);
    let mut i = 0;
    while i < pairs {
        // SAFETY: i + 2·LANES <= pairs <= n, so the registers lie inside the caller's
        // ranges; those of a and b are read whole before dst's are written.
        unsafe {
            let x = two.add(two.load(a.add(i)), two.load(b.add(i)));
            two.store(dst.add(i), op.apply(two, x));
        }
        i += 2 * L::LANES;
    }
    if i < full {
        // SAFETY: as above, for the one register left (i + LANES <= full <= n).
        unsafe {
            let x = l.add(l.load(a.add(i)), l.load(b.add(i)));
            l.store(dst.add(i), op.apply(l, x));
        }
    }
    let rest = n - full;
    if rest > 0 {
        let mut bufs = [[0.0f32; MAX_LANES]; 2];
        // SAFETY: `a[full..n]` and `b[full..n]` lie in the caller's ranges and each
        // local buffer holds MAX_LANES >= rest elements; locals overlap nothing.
        unsafe {
            std::ptr::copy_nonoverlapping(a.add(full), bufs[0].as_mut_ptr(), rest);
            std::ptr::copy_nonoverlapping(b.add(full), bufs[1].as_mut_ptr(), rest);
        }
        // SAFETY: each buffer holds MAX_LANES >= LANES f32.
        let x = unsafe { l.add(l.load(bufs[0].as_ptr()), l.load(bufs[1].as_ptr())) };
        let y = op.apply(l, x);
        // SAFETY: as above.
        unsafe { l.store(bufs[0].as_mut_ptr(), y) };
        // SAFETY: `dst[full..n]` lies in the caller's range; the buffer is a local.
        unsafe { std::ptr::copy_nonoverlapping(bufs[0].as_ptr(), dst.add(full), rest) };
    }
}

/// Defines the two routines of one op, `$avx512` and `$avx2`, as `UnaryFn`s running
/// the generic `$f` (a `fn(L, L::F) -> L::F`) on each tier's registers, through the
/// [`Op`] `$op`; and its shared math on 128 bits (an [`Xmm`] register): `$x4`, one
/// `f32x4` in and out, and `$x1`, one `f32` (splat, computed, lane 0), with the C ABI
/// of the Cranelift functions they replace (`(f32x4) -> f32x4` and `(f32) -> f32`,
/// both in `xmm0` under System V).
macro_rules! routines {
    ($op:ident, $f:ident, $avx512:ident, $avx2:ident, $x4:ident, $x1:ident) => {
        #[doc = concat!("`", stringify!($f), "` as an [`Op`](super::map::Op).")]
        #[derive(Debug)]
        struct $op;

        impl super::map::Op for $op {
            #[inline(always)]
            fn apply<L: super::lanes::Lanes>(&self, l: L, x: L::F) -> L::F {
                $f(l, x)
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,fma,f16c")]
        pub(super) unsafe extern "C" fn $avx512(src: *const f32, dst: *mut f32, n: usize) {
            // SAFETY: a `UnaryFn`'s contract: the caller checked that the host has this
            // routine's features (the token's requirement) and that `src` and `dst`
            // are valid for `n` f32, equal or not overlapping (`map`'s).
            unsafe { super::map::map(super::lanes::Avx512::assume(), &$op, src, dst, n) }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe extern "C" fn $avx2(src: *const f32, dst: *mut f32, n: usize) {
            // SAFETY: as for the AVX-512 routine, with AVX2's features.
            unsafe { super::map::map(super::lanes::Avx2::assume(), &$op, src, dst, n) }
        }

        // `__m128` is C's type of the same name: System V passes it in `xmm0` both
        // ways, as Cranelift passes an `f32x4` (the lint knows no SIMD types).
        #[allow(improper_ctypes_definitions)]
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe extern "C" fn $x4(
            x: std::arch::x86_64::__m128,
        ) -> std::arch::x86_64::__m128 {
            // SAFETY: a `SharedX4Fn`'s contract: the caller checked that the host has
            // AVX2 and FMA (the token's requirement).
            $f(unsafe { super::lanes::Xmm::assume() }, x)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe extern "C" fn $x1(x: f32) -> f32 {
            // SAFETY: a `SharedX1Fn`'s contract: the caller checked that the host has
            // AVX2 and FMA (the token's requirement).
            let l = unsafe { super::lanes::Xmm::assume() };
            super::lanes::Lanes::first(l, $f(l, super::lanes::Lanes::splat(l, x)))
        }
    };
}
pub(super) use routines;
