//! Two registers of a tier as one: [`Pair`], for the loops of `map::map` and
//! `map::map_sum`.
//!
//! The wide math is a long chain of dependent operations per register (gelu's tail is
//! about 40, with a division: some 90 cycles from the load to the store on AMD Zen 4),
//! longer than a core's floating-point scheduler can see past to the next register's.
//! Each operation of a `Pair` is the tier's operation on the first register, then on
//! the second, so two independent chains come interleaved in the instruction stream
//! and the core runs one while the other waits. On the development VM (Zen 4,
//! AVX-512), gelu's tail over values of N(0, 1) went from 0.445 to 0.397 ns an element
//! (one thread, in L2), and the AVX2 tier's gains are larger.
//!
//! Every operation is lane by lane, as the tier's own; only [`Lanes::all`] sees both
//! registers, and the wide math branches on it only between paths that give the same
//! bits (its routines' rule: which lanes share a register does not matter), so a pair
//! gives each lane the bits one register would.

use super::lanes::Lanes;

/// Two registers of the tier `L`, one after the other in memory.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pair<L>(pub(super) L);

/// Applies one operation of `L` to each half of its arguments, in order.
macro_rules! both {
    ($l:expr, $op:ident, $($arg:expr),+) => {
        ($l.$op($($arg.0),+), $l.$op($($arg.1),+))
    };
}

impl<L: Lanes> Lanes for Pair<L> {
    const LANES: usize = 2 * L::LANES;
    type F = (L::F, L::F);
    type I = (L::I, L::I);
    type M = (L::M, L::M);

    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> Self::F {
        // SAFETY: the caller's contract covers 2·L::LANES f32 at p: the first register
        // at p, the second at p + L::LANES.
        unsafe { (self.0.load(p), self.0.load(p.add(L::LANES))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: Self::F) {
        // SAFETY: as `load`'s, for writing.
        unsafe {
            self.0.store(p, v.0);
            self.0.store(p.add(L::LANES), v.1);
        }
    }
    #[inline(always)]
    fn splat(self, v: f32) -> Self::F {
        let s = self.0.splat(v);
        (s, s)
    }
    #[inline(always)]
    fn first(self, v: Self::F) -> f32 {
        self.0.first(v.0)
    }
    #[inline(always)]
    fn add(self, a: Self::F, b: Self::F) -> Self::F {
        both!(self.0, add, a, b)
    }
    #[inline(always)]
    fn sub(self, a: Self::F, b: Self::F) -> Self::F {
        both!(self.0, sub, a, b)
    }
    #[inline(always)]
    fn mul(self, a: Self::F, b: Self::F) -> Self::F {
        both!(self.0, mul, a, b)
    }
    #[inline(always)]
    fn div(self, a: Self::F, b: Self::F) -> Self::F {
        both!(self.0, div, a, b)
    }
    #[inline(always)]
    fn fma(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        both!(self.0, fma, a, b, c)
    }
    #[inline(always)]
    fn abs(self, a: Self::F) -> Self::F {
        both!(self.0, abs, a)
    }
    #[inline(always)]
    fn neg(self, a: Self::F) -> Self::F {
        both!(self.0, neg, a)
    }
    #[inline(always)]
    fn max(self, a: Self::F, b: Self::F) -> Self::F {
        both!(self.0, max, a, b)
    }
    #[inline(always)]
    fn lt(self, a: Self::F, b: Self::F) -> Self::M {
        both!(self.0, lt, a, b)
    }
    #[inline(always)]
    fn ge(self, a: Self::F, b: Self::F) -> Self::M {
        both!(self.0, ge, a, b)
    }
    #[inline(always)]
    fn eq(self, a: Self::F, b: Self::F) -> Self::M {
        both!(self.0, eq, a, b)
    }
    #[inline(always)]
    fn sel(self, m: Self::M, a: Self::F, b: Self::F) -> Self::F {
        both!(self.0, sel, m, a, b)
    }
    #[inline(always)]
    fn all(self, m: Self::M) -> bool {
        // `&`, not `&&`: one branch on both registers' masks, not two.
        self.0.all(m.0) & self.0.all(m.1)
    }
    #[inline(always)]
    fn bits(self, a: Self::F) -> Self::I {
        both!(self.0, bits, a)
    }
    #[inline(always)]
    fn float(self, i: Self::I) -> Self::F {
        both!(self.0, float, i)
    }
    #[inline(always)]
    fn to_float(self, i: Self::I) -> Self::F {
        both!(self.0, to_float, i)
    }
    #[inline(always)]
    fn isplat(self, v: i32) -> Self::I {
        let s = self.0.isplat(v);
        (s, s)
    }
    #[inline(always)]
    fn iadd(self, a: Self::I, b: Self::I) -> Self::I {
        both!(self.0, iadd, a, b)
    }
    #[inline(always)]
    fn isub(self, a: Self::I, b: Self::I) -> Self::I {
        both!(self.0, isub, a, b)
    }
    #[inline(always)]
    fn and(self, a: Self::I, b: Self::I) -> Self::I {
        both!(self.0, and, a, b)
    }
    #[inline(always)]
    fn or(self, a: Self::I, b: Self::I) -> Self::I {
        both!(self.0, or, a, b)
    }
    #[inline(always)]
    fn imin(self, a: Self::I, b: Self::I) -> Self::I {
        both!(self.0, imin, a, b)
    }
    #[inline(always)]
    fn imax(self, a: Self::I, b: Self::I) -> Self::I {
        both!(self.0, imax, a, b)
    }
    #[inline(always)]
    fn shl(self, a: Self::I, n: i32) -> Self::I {
        (self.0.shl(a.0, n), self.0.shl(a.1, n))
    }
    #[inline(always)]
    fn sra(self, a: Self::I, n: i32) -> Self::I {
        (self.0.sra(a.0, n), self.0.sra(a.1, n))
    }
    #[inline(always)]
    fn srl(self, a: Self::I, n: i32) -> Self::I {
        (self.0.srl(a.0, n), self.0.srl(a.1, n))
    }
}
