//! Native routines for the nodes the fusion pass gives a step of their own
//! (`Step::Interp`): scatter-add, cumsum / cumprod and argsort, run in parallel on the
//! current rayon pool instead of the f64 reference interpreter. [`run_routine`] picks
//! one by op; for any other op it returns `None` and the caller interprets the node.
//!
//! Every routine gives the same bits on every thread count: work is split into pieces
//! fixed by the shape (or, where the split changes nothing, by the threads), and each
//! output element is computed by one piece in one fixed order.
//!
//! Where the results differ from the interpreter's (which computes floats in f64 and
//! rounds once per node):
//! - **scatter_add**: f32 and f64 accumulate in their own dtype, f16 and bf16 in f32,
//!   rounded once at the end; integers wrap (exact). Contributions to one element are
//!   added in increasing position order along the axis, as the interpreter adds them.
//! - **scan**: f32 runs in f32, f64 in f64, f16 and bf16 in f32 rounded at each store
//!   (the op's documented semantics); integers run in i64, wrapping (exact). A long axis
//!   with few lanes is scanned in blocks of [`SCAN_BLOCK`] positions, each block starting
//!   from the running value of the blocks before it (their totals combined in order):
//!   the float bits then depend on the block size, fixed, never on the threads.
//! - **argsort**: exact. A stable sort has one answer, however it is computed: rows of
//!   [`RADIX_MIN`] positions or more sort by LSD radix on order-preserving integer keys,
//!   shorter rows by comparison on (key, position) pairs. `k` below the extent (top_k)
//!   sorts the whole row and keeps the first `k`.

use crate::alloc::host_cache;
use crate::attention;
use crate::error::RuntimeError;
use half::{bf16, f16};
use ndfuse_ir::interp::InterpError;
use ndfuse_ir::{DType, HostArray, Node, Op, ScanOp, Shape, Storage, TensorType};
use rayon::prelude::*;
use std::marker::PhantomData;

/// The native routine for `node` applied to `operands`, on the current rayon pool;
/// `None` when the node's op has no routine, or its operands do not give its type (the
/// interpreter then reports what is wrong).
///
/// ```
/// use ndfuse_ir::{DType, Graph, HostArray, Op, ScanOp, Shape};
/// let mut g = Graph::new();
/// let x = g.add_input("x", DType::F32, Shape::new([3]));
/// let s = g.add(Op::Scan { op: ScanOp::Sum, axis: 0, reverse: false }, &[x]).unwrap();
/// let a = HostArray::from_f64s(DType::F32, Shape::new([3]), &[1.0, 2.0, 3.0]);
/// let out = ndfuse_runtime::run_routine(g.node(s), &[&a]).unwrap().unwrap();
/// assert_eq!(out.to_f64s(), vec![1.0, 3.0, 6.0]);
/// ```
pub fn run_routine(
    node: &Node,
    operands: &[&HostArray],
) -> Option<Result<HostArray, RuntimeError>> {
    if let Op::QuantMatMul(spec) = &node.op {
        if !operands_fit(node, operands) {
            return None;
        }
        return Some(crate::quant::run(spec, node, operands));
    }
    if let Op::Linalg(l) = node.op {
        if !operands_fit(node, operands) {
            return None;
        }
        return Some(crate::linalg::run(l, node, operands));
    }
    if matches!(node.op, Op::Attention(_) | Op::AttentionBackward(_)) {
        if !operands_fit(node, operands) {
            return None;
        }
        return attention::run(node, operands);
    }
    if !matches!(
        node.op,
        Op::ScatterAdd { .. } | Op::Scan { .. } | Op::Argsort { .. }
    ) {
        return None;
    }
    if !operands_fit(node, operands) {
        return None;
    }
    Some(match (&node.op, operands) {
        (Op::ScatterAdd { axis }, [x, idx, v]) => scatter_add(x, idx, v, *axis),
        (Op::Scan { op, axis, reverse }, [x]) => scan(*op, x, *axis, *reverse),
        (
            Op::Argsort {
                axis,
                descending,
                k,
            },
            [x],
        ) => argsort(x, *axis, *descending, *k),
        _ => return None,
    })
}

/// Whether `operands` give `node`'s type (else the interpreter reports what is wrong).
fn operands_fit(node: &Node, operands: &[&HostArray]) -> bool {
    let types: Vec<TensorType> = operands
        .iter()
        .map(|a| TensorType {
            dtype: a.dtype(),
            shape: a.shape().clone(),
        })
        .collect();
    matches!(ndfuse_ir::infer(&node.op, &types), Ok(t) if t.dtype == node.dtype && t.shape == node.shape)
}

/// Least work (elements) worth handing to a rayon task of its own.
const TASK_MIN: usize = 1 << 14;

/// Tasks per rayon job so that each job has about [`TASK_MIN`] elements of work.
fn min_tasks(work_per_task: usize) -> usize {
    (TASK_MIN / work_per_task.max(1)).max(1)
}

// ---------------------------------------------------------------------------------------
// Disjoint writes.
// ---------------------------------------------------------------------------------------

/// An output buffer that parallel tasks write at positions no two of them share (the
/// bands of a scan or scatter-add, the buckets of a radix pass), where the positions
/// of one task are not one contiguous slice.
struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a `Disjoint` is made from an exclusive borrow, so nothing outside the
// parallel loop that shares it touches the buffer while it lives; inside, each caller
// of `segment` / `write` promises that no other task touches the same positions (see
// each call), so no element is accessed by two threads at once.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    fn new(data: &'a mut [T]) -> Self {
        Disjoint {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    /// Elements `start..start + len`, for one task to write.
    ///
    /// # Safety
    /// No other task reads or writes these elements while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn segment(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "segment {start}+{len} outside {} elements (a bug)",
            self.len
        );
        // SAFETY: in bounds (checked just above); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// Writes element `i`.
    ///
    /// # Safety
    /// `i < len`, and no other task reads or writes element `i` during the loop.
    unsafe fn write(&self, i: usize, v: T) {
        debug_assert!(i < self.len, "write {i} outside {} elements", self.len);
        // SAFETY: in bounds and exclusive by the caller's promise.
        unsafe { self.ptr.add(i).write(v) }
    }
}

// ---------------------------------------------------------------------------------------
// Scatter-add.
// ---------------------------------------------------------------------------------------

/// An element type scatter-add accumulates, and in what.
trait Accumulate: Copy + Send + Sync {
    type Acc: Copy + Send + Sync;
    fn widen(self) -> Self::Acc;
    fn narrow(a: Self::Acc) -> Self;
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

macro_rules! accumulate_in_self {
    ($t:ty, $add:expr) => {
        impl Accumulate for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn narrow(a: $t) -> $t {
                a
            }
            fn add(a: $t, b: $t) -> $t {
                $add(a, b)
            }
        }
    };
}
accumulate_in_self!(f32, |a: f32, b: f32| a + b);
accumulate_in_self!(f64, |a: f64, b: f64| a + b);
accumulate_in_self!(i32, i32::wrapping_add);
accumulate_in_self!(i64, i64::wrapping_add);

macro_rules! accumulate_in_f32 {
    ($t:ty) => {
        impl Accumulate for $t {
            type Acc = f32;
            fn widen(self) -> f32 {
                self.to_f32()
            }
            fn narrow(a: f32) -> $t {
                <$t>::from_f32(a)
            }
            fn add(a: f32, b: f32) -> f32 {
                a + b
            }
        }
    };
}
accumulate_in_f32!(f16);
accumulate_in_f32!(bf16);

/// An index element (i32 or i64).
trait IndexElem: Copy + Send + Sync + Into<i64> {}
impl IndexElem for i32 {}
impl IndexElem for i64 {}

/// Most elements of one band's accumulator (`n` rows of `band` columns) before bands
/// narrow; bands never narrow below [`BAND_MIN`] columns.
const SCATTER_SCRATCH: usize = 1 << 15;
/// Fewest columns of a scatter-add band (when the inner extent has them).
const BAND_MIN: usize = 16;
/// Most columns of a band (of a scan or scatter-add).
const BAND_MAX: usize = 512;

/// `x` with `v[p]` added at `p with p[axis] := idx[p]`; an index outside `-n..n` is the
/// interpreter's error, found before anything is written.
fn scatter_add(
    x: &HostArray,
    idx: &HostArray,
    v: &HostArray,
    axis: usize,
) -> Result<HostArray, RuntimeError> {
    let (outer, n, inner) = x.shape().around_axis(axis);
    let m = idx.shape().dims()[axis];
    let bad = match idx.storage() {
        Storage::I32(ks) => first_out_of_range(ks, n),
        Storage::I64(ks) => first_out_of_range(ks, n),
        _ => unreachable!("indices are i32 or i64 (infer checks)"),
    };
    if let Some((p, value)) = bad {
        return Err(InterpError::IndexOutOfRange {
            op: "scatter_add",
            axis,
            value,
            position: idx.shape().unravel(p),
            extent: n,
        }
        .into());
    }
    let mut out = host_cache().array(x.dtype(), x.shape().clone())?;
    if out.is_empty() {
        return Ok(out);
    }
    let dims = Dims { outer, n, m, inner };
    macro_rules! by_index {
        ($xs:expr, $vs:expr, $os:expr) => {
            match idx.storage() {
                Storage::I32(ks) => scatter_typed($xs, ks, $vs, $os, dims),
                Storage::I64(ks) => scatter_typed($xs, ks, $vs, $os, dims),
                _ => unreachable!("indices are i32 or i64 (infer checks)"),
            }
        };
    }
    match (x.storage(), v.storage(), out.storage_mut()) {
        (Storage::F16(a), Storage::F16(b), Storage::F16(o)) => by_index!(a, b, o),
        (Storage::BF16(a), Storage::BF16(b), Storage::BF16(o)) => by_index!(a, b, o),
        (Storage::F32(a), Storage::F32(b), Storage::F32(o)) => by_index!(a, b, o),
        (Storage::F64(a), Storage::F64(b), Storage::F64(o)) => by_index!(a, b, o),
        (Storage::I32(a), Storage::I32(b), Storage::I32(o)) => by_index!(a, b, o),
        (Storage::I64(a), Storage::I64(b), Storage::I64(o)) => by_index!(a, b, o),
        _ => unreachable!("scatter_add's data, values and result share a numeric dtype"),
    }
    Ok(out)
}

/// The first index (position, value) outside `-n..n`, in row-major order.
fn first_out_of_range<I: IndexElem>(ks: &[I], n: usize) -> Option<(usize, i64)> {
    let n = n as i64;
    let p = ks
        .par_iter()
        .with_min_len(TASK_MIN)
        .position_first(|&k| !(-n..n).contains(&k.into()))?;
    Some((p, ks[p].into()))
}

/// Extents of a scatter-add: `x` is `[outer, n, inner]`, `idx` and `v` `[outer, m, inner]`.
#[derive(Clone, Copy)]
struct Dims {
    outer: usize,
    n: usize,
    m: usize,
    inner: usize,
}

/// Scatter-add over tasks (outer position, band of inner columns): each task owns its
/// columns of every row of `out`, accumulates them in a scratch of `T::Acc` (seeded
/// from `x`), going through `idx` in increasing position, and stores them once.
fn scatter_typed<T: Accumulate, I: IndexElem>(x: &[T], ks: &[I], v: &[T], out: &mut [T], d: Dims) {
    let Dims { outer, n, m, inner } = d;
    let band = (SCATTER_SCRATCH / n.max(1))
        .clamp(BAND_MIN, BAND_MAX)
        .min(inner);
    let bands = inner.div_ceil(band);
    let dst = Disjoint::new(out);
    (0..outer * bands)
        .into_par_iter()
        .with_min_len(min_tasks((n + m) * band))
        .for_each_init(Vec::new, |acc: &mut Vec<T::Acc>, t| {
            let (o, i0) = (t / bands, (t % bands) * band);
            let w = band.min(inner - i0);
            acc.clear();
            for r in 0..n {
                let s = (o * n + r) * inner + i0;
                acc.extend(x[s..s + w].iter().map(|&a| a.widen()));
            }
            let n_i = n as i64;
            for j in 0..m {
                let s = (o * m + j) * inner + i0;
                for (c, (&k, &a)) in ks[s..s + w].iter().zip(&v[s..s + w]).enumerate() {
                    // In range: `first_out_of_range` found none outside -n..n.
                    let k: i64 = k.into();
                    let r = if k < 0 { k + n_i } else { k } as usize;
                    let e = &mut acc[r * w + c];
                    *e = T::add(*e, a.widen());
                }
            }
            for r in 0..n {
                // SAFETY: columns i0..i0 + w of row (o, r) belong to task t alone
                // (tasks are distinct (o, band) pairs).
                let row = unsafe { dst.segment((o * n + r) * inner + i0, w) };
                for (e, &a) in row.iter_mut().zip(&acc[r * w..(r + 1) * w]) {
                    *e = T::narrow(a);
                }
            }
        });
}

// ---------------------------------------------------------------------------------------
// Scans.
// ---------------------------------------------------------------------------------------

/// Positions of a block of a blocked scan (see the module docs). Fixed: the float bits
/// of a blocked scan depend on it.
pub const SCAN_BLOCK: usize = 1 << 14;
/// A scan with fewer lanes than this, along an axis of two blocks or more, runs blocked.
const SCAN_FEW_LANES: usize = 16;

/// Rows of a scan along the innermost axis run side by side in one task (see
/// `scan_with`).
const SCAN_ROWS: usize = 8;

/// Positions of one row scanned before the next row's (see `scan_with`).
const SCAN_COLS: usize = 16;

/// The arithmetic of a scan's accumulator.
trait Arith: Copy + Send + Sync {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
}

macro_rules! arith_float {
    ($t:ty) => {
        impl Arith for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            fn add(self, b: $t) -> $t {
                self + b
            }
            fn mul(self, b: $t) -> $t {
                self * b
            }
        }
    };
}
arith_float!(f32);
arith_float!(f64);

impl Arith for i64 {
    const ZERO: i64 = 0;
    const ONE: i64 = 1;
    fn add(self, b: i64) -> i64 {
        self.wrapping_add(b)
    }
    fn mul(self, b: i64) -> i64 {
        self.wrapping_mul(b)
    }
}

/// An element type a scan reads: what it accumulates in and what it stores.
trait ScanElem: Copy + Send + Sync {
    type Acc: Arith;
    type Out: Copy + Send + Sync;
    fn load(self) -> Self::Acc;
    fn store(a: Self::Acc) -> Self::Out;
}

macro_rules! scan_elem {
    ($t:ty, $acc:ty, $out:ty, $load:expr, $store:expr) => {
        impl ScanElem for $t {
            type Acc = $acc;
            type Out = $out;
            fn load(self) -> $acc {
                $load(self)
            }
            fn store(a: $acc) -> $out {
                $store(a)
            }
        }
    };
}
scan_elem!(f32, f32, f32, |a| a, |a| a);
scan_elem!(f64, f64, f64, |a| a, |a| a);
scan_elem!(f16, f32, f16, f16::to_f32, f16::from_f32);
scan_elem!(bf16, f32, bf16, bf16::to_f32, bf16::from_f32);
scan_elem!(i32, i64, i64, i64::from, |a| a);
scan_elem!(i64, i64, i64, |a| a, |a| a);

/// The inclusive running `op` along `axis` (backwards when `reverse`).
fn scan(op: ScanOp, x: &HostArray, axis: usize, reverse: bool) -> Result<HostArray, RuntimeError> {
    let dtype = if x.dtype().is_int() {
        DType::I64
    } else {
        x.dtype()
    };
    let mut out = host_cache().array(dtype, x.shape().clone())?;
    if out.is_empty() {
        return Ok(out);
    }
    let dims = x.shape().around_axis(axis);
    macro_rules! by_op {
        ($xs:expr, $os:expr) => {
            scan_typed($xs, $os, dims, reverse, op)
        };
    }
    match (x.storage(), out.storage_mut()) {
        (Storage::F16(a), Storage::F16(o)) => by_op!(a, o),
        (Storage::BF16(a), Storage::BF16(o)) => by_op!(a, o),
        (Storage::F32(a), Storage::F32(o)) => by_op!(a, o),
        (Storage::F64(a), Storage::F64(o)) => by_op!(a, o),
        (Storage::I32(a), Storage::I64(o)) => by_op!(a, o),
        (Storage::I64(a), Storage::I64(o)) => by_op!(a, o),
        _ => unreachable!("a scan of bool is refused by infer; ints scan into i64"),
    }
    Ok(out)
}

/// Positions `0..n` in scan order.
fn order(n: usize, reverse: bool) -> impl Iterator<Item = usize> {
    (0..n).map(move |j| if reverse { n - 1 - j } else { j })
}

/// A scan of `x` (`[outer, n, inner]`) into `out` with `op`'s identity and combiner.
fn scan_typed<T: ScanElem>(
    x: &[T],
    out: &mut [T::Out],
    dims: (usize, usize, usize),
    reverse: bool,
    op: ScanOp,
) {
    match op {
        ScanOp::Sum => scan_with(x, out, dims, reverse, T::Acc::ZERO, T::Acc::add),
        ScanOp::Prod => scan_with(x, out, dims, reverse, T::Acc::ONE, T::Acc::mul),
    }
}

/// A scan of `x` (`[outer, n, inner]`) into `out`: blocked (few long lanes), by rows
/// (the axis is innermost), or by bands of inner columns.
fn scan_with<T: ScanElem, F>(
    x: &[T],
    out: &mut [T::Out],
    (outer, n, inner): (usize, usize, usize),
    reverse: bool,
    id: T::Acc,
    f: F,
) where
    F: Fn(T::Acc, T::Acc) -> T::Acc + Sync,
{
    if outer * inner < SCAN_FEW_LANES && n >= 2 * SCAN_BLOCK {
        return scan_blocked(x, out, (outer, n, inner), reverse, id, f);
    }
    if inner == 1 {
        // Rows are scanned SCAN_ROWS at a time, a block of SCAN_COLS positions of each
        // in turn: each row's running value is one chain of dependent adds (4 cycles
        // each), and the next row's block, independent, overlaps it in the core's
        // out-of-order window. Every row still combines in its own order: the same bits
        // as one row at a time.
        out.par_chunks_mut(n * SCAN_ROWS)
            .zip(x.par_chunks(n * SCAN_ROWS))
            .with_min_len(min_tasks(n * SCAN_ROWS))
            .for_each(|(rows, xs)| {
                let mut acc = [id; SCAN_ROWS];
                let mut done = 0;
                while done < n {
                    let w = SCAN_COLS.min(n - done);
                    // Positions done..done + w in scan order.
                    let span = if reverse {
                        n - done - w..n - done
                    } else {
                        done..done + w
                    };
                    for ((row, x), a) in rows.chunks_mut(n).zip(xs.chunks(n)).zip(&mut acc) {
                        let (row, x) = (&mut row[span.clone()], &x[span.clone()]);
                        let mut step = |(e, &v): (&mut T::Out, &T)| {
                            *a = f(*a, v.load());
                            *e = T::store(*a);
                        };
                        if reverse {
                            row.iter_mut().zip(x).rev().for_each(&mut step);
                        } else {
                            row.iter_mut().zip(x).for_each(&mut step);
                        }
                    }
                    done += w;
                }
            });
        return;
    }
    let band = inner.min(BAND_MAX);
    let bands = inner.div_ceil(band);
    let dst = Disjoint::new(out);
    (0..outer * bands)
        .into_par_iter()
        .with_min_len(min_tasks(n * band))
        .for_each_init(Vec::new, |acc: &mut Vec<T::Acc>, t| {
            let (o, i0) = (t / bands, (t % bands) * band);
            let w = band.min(inner - i0);
            acc.clear();
            acc.resize(w, id);
            for j in order(n, reverse) {
                let s = (o * n + j) * inner + i0;
                // SAFETY: columns i0..i0 + w of row (o, j) belong to task t alone.
                let row = unsafe { dst.segment(s, w) };
                for ((e, a), &v) in row.iter_mut().zip(acc.iter_mut()).zip(&x[s..s + w]) {
                    *a = f(*a, v.load());
                    *e = T::store(*a);
                }
            }
        });
}

/// A scan of few long lanes in blocks of [`SCAN_BLOCK`] positions: each block's totals
/// (in parallel), then each block's carry (the totals of the blocks before it, in scan
/// order), then each block scanned from its carry (in parallel).
fn scan_blocked<T: ScanElem, F>(
    x: &[T],
    out: &mut [T::Out],
    (outer, n, inner): (usize, usize, usize),
    reverse: bool,
    id: T::Acc,
    f: F,
) where
    F: Fn(T::Acc, T::Acc) -> T::Acc + Sync,
{
    let blocks = n.div_ceil(SCAN_BLOCK);
    // Block b of outer position o: positions j0..j1 of the axis.
    let span = |b: usize| (b * SCAN_BLOCK, ((b + 1) * SCAN_BLOCK).min(n));
    let fold = |o: usize, b: usize, acc: &mut [T::Acc], mut each: Option<&mut [T::Out]>| {
        let (j0, j1) = span(b);
        for j in order(j1 - j0, reverse).map(|j| j0 + j) {
            let s = (o * n + j) * inner;
            for (c, (a, &v)) in acc.iter_mut().zip(&x[s..s + inner]).enumerate() {
                *a = f(*a, v.load());
                if let Some(e) = each.as_deref_mut() {
                    e[(j - j0) * inner + c] = T::store(*a);
                }
            }
        }
    };
    let totals: Vec<Vec<T::Acc>> = (0..outer * blocks)
        .into_par_iter()
        .map(|t| {
            let mut acc = vec![id; inner];
            fold(t / blocks, t % blocks, &mut acc, None);
            acc
        })
        .collect();
    // Carries in scan order: forward, block b starts from blocks 0..b; reverse, from
    // blocks b + 1.. (combined from the last one down).
    let mut carries = vec![vec![id; inner]; outer * blocks];
    for o in 0..outer {
        let mut run = vec![id; inner];
        for b in order(blocks, reverse) {
            carries[o * blocks + b].clone_from(&run);
            for (r, &t) in run.iter_mut().zip(&totals[o * blocks + b]) {
                *r = f(*r, t);
            }
        }
    }
    let dst = Disjoint::new(out);
    carries
        .into_par_iter()
        .enumerate()
        .for_each(|(t, mut acc)| {
            let (o, b) = (t / blocks, t % blocks);
            let (j0, j1) = span(b);
            // SAFETY: block b of outer position o is its own range of rows.
            let rows = unsafe { dst.segment((o * n + j0) * inner, (j1 - j0) * inner) };
            fold(o, b, &mut acc, Some(rows));
        });
}

// ---------------------------------------------------------------------------------------
// Argsort.
// ---------------------------------------------------------------------------------------

/// Rows this long or longer sort by LSD radix; shorter ones by comparison.
pub const RADIX_MIN: usize = 1 << 11;
/// Bits of a radix digit.
const DIGIT_BITS: u32 = 11;
/// Buckets of a radix pass.
const BUCKETS: usize = 1 << DIGIT_BITS;

/// The order-preserving key of an f32: numpy's order (-0 equal to +0, every NaN equal
/// and above +inf) as unsigned integers.
fn f32_key(x: f32) -> u64 {
    if x.is_nan() {
        return u64::from(u32::MAX);
    }
    // + 0.0 turns -0 into +0 (round to nearest).
    let b = (x + 0.0).to_bits();
    // Negative: every bit flips (larger magnitudes sort first); positive: the sign bit.
    u64::from(b ^ (((b as i32 >> 31) as u32) | 0x8000_0000))
}

/// [`f32_key`] for f64 (a 64-bit key).
fn f64_key(x: f64) -> u64 {
    if x.is_nan() {
        return u64::MAX;
    }
    let b = (x + 0.0).to_bits();
    b ^ (((b as i64 >> 63) as u64) | (1 << 63))
}

/// A (key, position) pair packed so that integer order is key order, then position:
/// sorting pairs, stably or not, is the stable sort of the keys.
trait Item: Copy + Ord + Default + Send + Sync {
    /// Bits of the key.
    const KEY_BITS: u32;
    fn pack(key: u64, pos: usize) -> Self;
    /// The radix digit of the key starting at bit `shift`.
    fn digit(self, shift: u32) -> usize;
    fn pos(self) -> usize;
    /// `f` of two buffers of `n` items (contents unspecified).
    fn with_buffers<R>(
        n: usize,
        f: impl FnOnce(&mut [Self], &mut [Self]) -> R,
    ) -> Result<R, RuntimeError>;
}

/// The top bit of an i64 item, flipped so that signed order is the unsigned order of
/// (key, position).
const TOP: u64 = 1 << 63;

/// A 32-bit key above a 32-bit position, the top bit flipped. An i64 rather than a
/// u64 so that its buffers come from the host cache (mapped already, huge pages).
impl Item for i64 {
    const KEY_BITS: u32 = 32;
    fn pack(key: u64, pos: usize) -> i64 {
        (((key << 32) | pos as u64) ^ TOP) as i64
    }
    fn digit(self, shift: u32) -> usize {
        (((self as u64 ^ TOP) >> (32 + shift)) as usize) & (BUCKETS - 1)
    }
    fn pos(self) -> usize {
        (self as u64 & 0xFFFF_FFFF) as usize
    }
    fn with_buffers<R>(
        n: usize,
        f: impl FnOnce(&mut [i64], &mut [i64]) -> R,
    ) -> Result<R, RuntimeError> {
        let shape = Shape::new([n]);
        let mut a = host_cache().array(DType::I64, shape.clone())?;
        let mut b = host_cache().array(DType::I64, shape)?;
        match (a.storage_mut(), b.storage_mut()) {
            (Storage::I64(a), Storage::I64(b)) => Ok(f(a, b)),
            _ => unreachable!("the host cache gives an i64 array the i64 storage"),
        }
    }
}

/// A 64-bit key above a 64-bit position.
impl Item for u128 {
    const KEY_BITS: u32 = 64;
    fn pack(key: u64, pos: usize) -> u128 {
        (u128::from(key) << 64) | pos as u128
    }
    fn digit(self, shift: u32) -> usize {
        ((self >> (64 + shift)) as usize) & (BUCKETS - 1)
    }
    fn pos(self) -> usize {
        self as u64 as usize
    }
    fn with_buffers<R>(
        n: usize,
        f: impl FnOnce(&mut [u128], &mut [u128]) -> R,
    ) -> Result<R, RuntimeError> {
        Ok(f(&mut vec![0; n], &mut vec![0; n]))
    }
}

/// The first `k` positions that sort `x` along `axis` stably (see the module docs).
fn argsort(
    x: &HostArray,
    axis: usize,
    descending: bool,
    k: usize,
) -> Result<HostArray, RuntimeError> {
    let (outer, n, inner) = x.shape().around_axis(axis);
    let mut dims = x.shape().dims().to_vec();
    dims[axis] = k;
    let mut out = host_cache().array(DType::I64, Shape::new(dims))?;
    if out.is_empty() {
        return Ok(out);
    }
    let Storage::I64(o) = out.storage_mut() else {
        unreachable!("the host cache gives an i64 array the i64 storage")
    };
    let sort = Lanes {
        outer,
        n,
        inner,
        k,
        descending,
    };
    // 32-bit keys pack with their positions into an i64 (rows below 2^32), others
    // into a u128.
    let short = u32::try_from(n).is_ok();
    match x.storage() {
        Storage::F16(v) if short => sort.run::<_, i64>(v, |a| f32_key(a.to_f32()), o),
        Storage::BF16(v) if short => sort.run::<_, i64>(v, |a| f32_key(a.to_f32()), o),
        Storage::F32(v) if short => sort.run::<_, i64>(v, f32_key, o),
        Storage::I32(v) if short => sort.run::<_, i64>(v, |a| u64::from(a as u32 ^ 1 << 31), o),
        Storage::Bool(v) if short => sort.run::<_, i64>(v, u64::from, o),
        Storage::F16(v) => sort.run::<_, u128>(v, |a| f32_key(a.to_f32()), o),
        Storage::BF16(v) => sort.run::<_, u128>(v, |a| f32_key(a.to_f32()), o),
        Storage::F32(v) => sort.run::<_, u128>(v, f32_key, o),
        Storage::I32(v) => sort.run::<_, u128>(v, |a| u64::from(a as u32 ^ 1 << 31), o),
        Storage::Bool(v) => sort.run::<_, u128>(v, u64::from, o),
        Storage::F64(v) => sort.run::<_, u128>(v, f64_key, o),
        Storage::I64(v) => sort.run::<_, u128>(v, |a| a as u64 ^ 1 << 63, o),
    }?;
    Ok(out)
}

/// The lanes of an argsort: `x` is `[outer, n, inner]`, the result `[outer, k, inner]`.
struct Lanes {
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    descending: bool,
}

impl Lanes {
    /// Sorts every lane of `x` by `key` (of [`Item::KEY_BITS`] bits at most) into `out`.
    fn run<T, I>(
        &self,
        x: &[T],
        key: impl Fn(T) -> u64 + Sync,
        out: &mut [i64],
    ) -> Result<(), RuntimeError>
    where
        T: Copy + Sync,
        I: Item,
    {
        let Lanes {
            outer,
            n,
            inner,
            k,
            descending,
        } = *self;
        // Descending: the keys' complement, so ties keep increasing positions.
        let flip = if descending {
            u64::MAX >> (64 - I::KEY_BITS)
        } else {
            0
        };
        let key = |a: T| key(a) ^ flip;
        let lanes = outer * inner;
        let threads = rayon::current_num_threads();
        if lanes < threads && n >= RADIX_MIN {
            // Few long lanes: each sorted with every thread (the order is the same).
            return I::with_buffers(n, |items, scratch| {
                for l in 0..lanes {
                    let (o, i) = (l / inner, l % inner);
                    let base = o * n * inner + i;
                    items
                        .par_iter_mut()
                        .with_min_len(TASK_MIN)
                        .enumerate()
                        .for_each(|(j, it)| *it = I::pack(key(x[base + j * inner]), j));
                    let sorted = if few(k, n) {
                        select_first(items, k)
                    } else {
                        radix_sort(items, scratch, threads)
                    };
                    let pos = |(e, it): (&mut i64, &I)| *e = it.pos() as i64;
                    if inner == 1 {
                        out[o * k..(o + 1) * k]
                            .par_iter_mut()
                            .zip(&sorted[..k])
                            .with_min_len(TASK_MIN)
                            .for_each(pos);
                    } else {
                        for (j, it) in sorted[..k].iter().enumerate() {
                            out[(o * k + j) * inner + i] = it.pos() as i64;
                        }
                    }
                }
            });
        }
        let dst = Disjoint::new(out);
        (0..lanes)
            .into_par_iter()
            .with_min_len(min_tasks(n))
            .for_each_init(
                || (Vec::new(), Vec::new()),
                |(items, scratch): &mut (Vec<I>, Vec<I>), l| {
                    let (o, i) = (l / inner, l % inner);
                    let base = o * n * inner + i;
                    items.clear();
                    items.extend((0..n).map(|j| I::pack(key(x[base + j * inner]), j)));
                    let sorted = if few(k, n) {
                        select_first(items, k)
                    } else if n < RADIX_MIN {
                        // Items are distinct (positions differ): an unstable sort is
                        // the stable one.
                        items.sort_unstable();
                        &items[..]
                    } else {
                        scratch.resize(n, I::default());
                        radix_sort(items, scratch, 1)
                    };
                    for (j, it) in sorted[..k].iter().enumerate() {
                        // SAFETY: lane l's outputs are written by its task alone, and
                        // (o * k + j) * inner + i < outer * k * inner = out.len().
                        unsafe { dst.write((o * k + j) * inner + i, it.pos() as i64) }
                    }
                },
            );
        Ok(())
    }
}

/// Whether a top-k keeps few enough of a row's `n` positions (an eighth at most) that
/// selecting them beats sorting the row.
fn few(k: usize, n: usize) -> bool {
    k.saturating_mul(8) <= n
}

/// `items` with its `k` smallest first, in order (the rest in no order): a selection,
/// then a sort of those `k`. Items are distinct (their positions differ), so these are
/// exactly the first `k` of the full sort.
fn select_first<I: Item>(items: &mut [I], k: usize) -> &mut [I] {
    if k > 0 && k < items.len() {
        items.select_nth_unstable(k - 1);
    }
    items[..k].sort_unstable();
    items
}

/// LSD radix sort of `items` by key, [`DIGIT_BITS`] bits a pass, stable by
/// construction; each pass histograms and scatters `chunks` pieces in parallel (the
/// result does not depend on `chunks`), and a pass whose digit is the same for every
/// item is skipped. `scratch` (as long as `items`) is the other buffer of the
/// ping-pong; the sorted items are in whichever of the two is returned.
fn radix_sort<'a, I: Item>(
    mut items: &'a mut [I],
    mut scratch: &'a mut [I],
    chunks: usize,
) -> &'a mut [I] {
    let n = items.len();
    assert_eq!(scratch.len(), n, "radix scratch of another length (a bug)");
    if n == 0 {
        return items;
    }
    let piece = n.div_ceil(chunks.clamp(1, n.div_ceil(TASK_MIN)));
    let histogram = |shift: u32, c: &[I]| {
        let mut h = Box::new([0usize; BUCKETS]);
        for it in c {
            h[it.digit(shift)] += 1;
        }
        h
    };
    let mut shift = 0;
    while shift < I::KEY_BITS {
        let mut hists: Vec<Box<[usize; BUCKETS]>> = items
            .par_chunks(piece)
            .map(|c| histogram(shift, c))
            .collect();
        let d0 = items[0].digit(shift);
        if hists.iter().map(|h| h[d0]).sum::<usize>() == n {
            shift += DIGIT_BITS;
            continue;
        }
        // Each piece's first slot for each digit: digits in order, pieces in order
        // within a digit (which keeps the sort stable).
        let mut run = 0;
        for d in 0..BUCKETS {
            for h in hists.iter_mut() {
                let c = h[d];
                h[d] = run;
                run += c;
            }
        }
        let dst = Disjoint::new(scratch);
        items
            .par_chunks(piece)
            .zip(hists)
            .for_each(|(c, mut next)| {
                for &it in c {
                    let d = it.digit(shift);
                    // SAFETY: the slots of digit d of this piece are its own range
                    // (counted above) inside 0..n, each slot written once.
                    unsafe { dst.write(next[d], it) };
                    next[d] += 1;
                }
            });
        std::mem::swap(&mut items, &mut scratch);
        shift += DIGIT_BITS;
    }
    items
}
