//! Fused attention on the CPU ([`Op::Attention`] and [`Op::AttentionBackward`]):
//! FlashAttention's algorithm on blocks of [`BLOCK_Q`] query rows by [`BLOCK_K`] keys,
//! so the `[Tq, Tk]` scores never exist beyond one block (a few pages of L1/L2).
//!
//! - **Forward**: one rayon task per `(batch, head, block of queries)`. For each block of
//!   keys up to the last the block's rows see (causal and padding masks skip whole
//!   blocks), `S = scale * Q K^T` on the GEMM micro-kernels, the bias added, masked
//!   positions `-inf`; the streaming softmax keeps each row's running max `m` and sum
//!   `l`, rescales the accumulator by `exp(m_old - m_new)` and adds `P V` (the dropout
//!   mask applied to `P` after `l` took it). At the end each row is divided by `l`; a
//!   row that saw no key is zeros.
//! - **Backward** (FlashAttention-2's, without atomics, so the bits do not depend on the
//!   threads): a pass over query blocks recomputes each row's log-sum-exp and
//!   `D_i = do_i . o_i`; then one task per `(batch, key/value head, block of keys)`
//!   walks the query blocks of every query head sharing it, recomputes
//!   `P = exp(S - lse)` and accumulates `dV += P^T dO`, `dK += dS^T Q` with
//!   `dS = P (dP - D) scale`, `dP = dO V^T`; a last pass per query block accumulates
//!   `dQ += dS K`. Nothing of size `[Tq, Tk]` is stored.
//!
//! f32 and the half types run in f32 (halves converted on load, rounded once on store),
//! f64 in f64. The exponentials are the wide path's (`ndfuse_codegen_cpu::wide`) where
//! the host has one. Every output element is written by one task in a fixed order.

use crate::alloc::host_cache;
use crate::error::RuntimeError;
use crate::gemm_tier::{self, ProductTier, TierFloat};
use gemm::Parallelism;
use half::{bf16, f16};
use ndfuse_codegen_cpu::wide;
use ndfuse_ir::op::random_uniform;
use ndfuse_ir::{AttentionLayout, AttentionSpec, CausalMask, DType, HostArray, Node, Op, Storage};
use rayon::prelude::*;
use std::borrow::Cow;

/// Query rows of a block.
pub const BLOCK_Q: usize = 64;
/// Keys of a block.
pub const BLOCK_K: usize = 128;

/// The routine for an attention node, `None` for any other node.
pub(crate) fn run(node: &Node, operands: &[&HostArray]) -> Option<Result<HostArray, RuntimeError>> {
    let (spec, backward) = match &node.op {
        Op::Attention(s) => (s, false),
        Op::AttentionBackward(s) => (s, true),
        _ => return None,
    };
    Some(match node.dtype {
        DType::F64 => attention::<f64>(spec, backward, node, operands),
        _ => attention::<f32>(spec, backward, node, operands),
    })
}

/// The float a routine computes in.
trait Real:
    TierFloat
    + Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::AddAssign
    + std::ops::MulAssign
{
    const ZERO: Self;
    const NEG_INF: Self;
    fn of(v: f64) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    /// The array's elements in this type (borrowed when it holds them).
    fn read(a: &HostArray) -> Cow<'_, [Self]>;
    /// `dst[j] = exp(src[j] - shift)`.
    fn exp_shift(src: &[Self], shift: Self, dst: &mut [Self]);
    /// The largest of `src` (`-inf` when empty).
    fn max_of(src: &[Self]) -> Self;
    /// The sum of `src`.
    fn sum_of(src: &[Self]) -> Self;
    /// The storage's elements when it holds this type.
    fn direct(out: &mut Storage) -> Option<&mut [Self]>;
    /// `vals` rounded into a storage that does not hold this type ([`Real::direct`]
    /// gave none): f32 into f16 or bf16.
    fn store(vals: &[Self], out: &mut Storage);
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const NEG_INF: f32 = f32::NEG_INFINITY;
    fn of(v: f64) -> f32 {
        v as f32
    }
    fn exp(self) -> f32 {
        f32::exp(self)
    }
    fn ln(self) -> f32 {
        f32::ln(self)
    }
    fn read(a: &HostArray) -> Cow<'_, [f32]> {
        match a.storage() {
            Storage::F32(v) => Cow::Borrowed(v),
            Storage::F16(v) => Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
            Storage::BF16(v) => Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
            s => Cow::Owned((0..s.len()).map(|i| s.get_f64(i) as f32).collect()),
        }
    }
    fn exp_shift(src: &[f32], shift: f32, dst: &mut [f32]) {
        if let Some(tier) = wide::tier() {
            if wide::exp_shift(tier, src, shift, dst) {
                return;
            }
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = (s - shift).exp();
        }
    }
    fn max_of(src: &[f32]) -> f32 {
        if let Some(m) = wide::tier().and_then(|t| wide::max(t, src)) {
            return m;
        }
        src.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x))
    }
    fn sum_of(src: &[f32]) -> f32 {
        if let Some(s) = wide::tier().and_then(|t| wide::sum(t, src)) {
            return s;
        }
        src.iter().sum()
    }
    fn direct(out: &mut Storage) -> Option<&mut [f32]> {
        match out {
            Storage::F32(o) => Some(o),
            _ => None,
        }
    }
    fn store(vals: &[f32], out: &mut Storage) {
        match out {
            Storage::F16(o) => o
                .iter_mut()
                .zip(vals)
                .for_each(|(o, v)| *o = f16::from_f32(*v)),
            Storage::BF16(o) => o
                .iter_mut()
                .zip(vals)
                .for_each(|(o, v)| *o = bf16::from_f32(*v)),
            _ => unreachable!("attention's result is a float of q's dtype (infer checks it)"),
        }
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const NEG_INF: f64 = f64::NEG_INFINITY;
    fn of(v: f64) -> f64 {
        v
    }
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn ln(self) -> f64 {
        f64::ln(self)
    }
    fn read(a: &HostArray) -> Cow<'_, [f64]> {
        match a.storage() {
            Storage::F64(v) => Cow::Borrowed(v),
            s => Cow::Owned((0..s.len()).map(|i| s.get_f64(i)).collect()),
        }
    }
    fn exp_shift(src: &[f64], shift: f64, dst: &mut [f64]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = (s - shift).exp();
        }
    }
    fn max_of(src: &[f64]) -> f64 {
        src.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x))
    }
    fn sum_of(src: &[f64]) -> f64 {
        src.iter().sum()
    }
    fn direct(out: &mut Storage) -> Option<&mut [f64]> {
        match out {
            Storage::F64(o) => Some(o),
            _ => None,
        }
    }
    fn store(_: &[f64], _: &mut Storage) {
        unreachable!("an f64 attention's result is f64, which `direct` takes (infer checks it)")
    }
}

/// `dst (m x n) [+]= beta * lhs (m x k) @ rhs (k x n)`, each operand as (slice, column
/// stride, row stride), on this process's micro-kernels, one thread.
#[allow(clippy::too_many_arguments)]
fn product<T: Real>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    drs: usize,
    lhs: (&[T], usize, usize),
    rhs: (&[T], usize, usize),
    beta: T,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * drs..r * drs + n].fill(T::ZERO);
            }
        }
        return;
    }
    let reach = |(s, cs, rs): (&[T], usize, usize), rows: usize, cols: usize| {
        assert!(
            (rows - 1) * rs + (cols - 1) * cs < s.len(),
            "a block product reaches past its operand (a bug)"
        );
    };
    reach(lhs, m, k);
    reach(rhs, k, n);
    reach((&*dst, 1, drs), m, n);
    // SAFETY: every element the strides reach is inside its slice (checked just above:
    // the farthest, `(rows - 1) * rs + (cols - 1) * cs`, is in bounds, and all strides
    // are non-negative); `dst` is an exclusive borrow, so it overlaps neither operand and
    // nothing else touches it during the call; sizes are non-zero.
    unsafe {
        gemm_tier::gemm(
            ProductTier::current(),
            (m, n, k),
            (dst.as_mut_ptr(), 1, drs as isize),
            (lhs.0.as_ptr(), lhs.1 as isize, lhs.2 as isize),
            (rhs.0.as_ptr(), rhs.1 as isize, rhs.2 as isize),
            beta,
            accumulate,
            Parallelism::None,
        );
    }
}

/// The keys and the values of an attention whose operands are not packed.
type KeysValues<'a, T> = (Cow<'a, [T]>, Cow<'a, [T]>);

/// The offset of query row `(h, i)` in a backward task's dQ buffer.
type RowAt<'b> = &'b (dyn Fn(usize, usize) -> usize + Sync);

/// The extents and extra operands of one attention.
struct Problem<'a, T: Real> {
    spec: AttentionSpec,
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    /// q, or the packed qkv.
    q: Cow<'a, [T]>,
    /// k and v (none when packed in `q`).
    kv: Option<KeysValues<'a, T>>,
    /// The packed layout's row width `(Hq + 2 Hkv) D` (0 otherwise).
    width: usize,
    /// The bias's values and extents `[B|1, Hq|1, Tq|1, Tk|1]`.
    bias: Option<(Cow<'a, [T]>, [usize; 4])>,
    lengths: Option<&'a [i64]>,
    key: Option<i64>,
}

impl<'a, T: Real> Problem<'a, T> {
    fn new(spec: &AttentionSpec, ops: &[&'a HostArray], backward: bool) -> Self {
        let n = spec.layout.tensors();
        let mut rest = ops[if backward { n + 2 } else { n }..].iter();
        let bias = spec.bias.then(|| {
            let a = rest.next().expect("infer counts the operands");
            let d = a.shape().dims();
            (T::read(a), [d[0], d[1], d[2], d[3]])
        });
        let lengths = spec
            .key_lengths
            .then(|| match rest.next().expect("counted").storage() {
                Storage::I64(l) => &l[..],
                _ => unreachable!("key lengths are i64 (infer checks it)"),
            });
        let key = spec
            .dropout
            .map(|_| rest.next().expect("counted").storage().get_i64(0));
        let (b, hq, hkv, tq, tk, d, dv, width, kv) = match spec.layout {
            AttentionLayout::Packed { q_heads, kv_heads } => {
                let s = ops[0].shape().dims();
                let d = s[2] / (q_heads + 2 * kv_heads);
                (s[0], q_heads, kv_heads, s[1], s[1], d, d, s[2], None)
            }
            layout => {
                let split = |a: &HostArray| layout.split(a.shape().dims());
                let ((b, hq, tq, d), (_, hkv, tk, _)) = (split(ops[0]), split(ops[1]));
                let dv = split(ops[2]).3;
                let kv = Some((T::read(ops[1]), T::read(ops[2])));
                (b, hq, hkv, tq, tk, d, dv, 0, kv)
            }
        };
        Problem {
            spec: *spec,
            b,
            hq,
            hkv,
            tq,
            tk,
            d,
            dv,
            q: T::read(ops[0]),
            kv,
            width,
            bias,
            lengths,
            key,
        }
    }

    /// The keys (the packed qkv when packed).
    fn k(&self) -> &[T] {
        self.kv.as_ref().map_or(&self.q, |(k, _)| k)
    }

    /// The values (the packed qkv when packed).
    fn v(&self) -> &[T] {
        self.kv.as_ref().map_or(&self.q, |(_, v)| v)
    }

    /// Row `t` of head `head` (counted over q's, then k's, then v's heads) of the packed
    /// qkv of batch `b`.
    fn packed_row(&self, b: usize, head: usize, t: usize) -> (usize, usize) {
        ((b * self.tq + t) * self.width + head * self.d, self.width)
    }

    /// Query row `(b, h, i)` of q: its offset and the distance to row `i + 1`.
    fn q_row(&self, b: usize, h: usize, i: usize) -> (usize, usize) {
        match self.spec.layout {
            AttentionLayout::Packed { .. } => self.packed_row(b, h, i),
            layout => layout.row((b, h, i), self.hq, self.tq, self.d),
        }
    }

    /// Row `(b, h, i)` of the result (and of o and do).
    fn o_row(&self, b: usize, h: usize, i: usize) -> (usize, usize) {
        self.spec.layout.row((b, h, i), self.hq, self.tq, self.dv)
    }

    /// Key row `(b, kh, j)` of k.
    fn k_row(&self, b: usize, kh: usize, j: usize) -> (usize, usize) {
        match self.spec.layout {
            AttentionLayout::Packed { .. } => self.packed_row(b, self.hq + kh, j),
            layout => layout.row((b, kh, j), self.hkv, self.tk, self.d),
        }
    }

    /// Value row `(b, kh, j)` of v.
    fn v_row(&self, b: usize, kh: usize, j: usize) -> (usize, usize) {
        match self.spec.layout {
            AttentionLayout::Packed { .. } => self.packed_row(b, self.hq + self.hkv + kh, j),
            layout => layout.row((b, kh, j), self.hkv, self.tk, self.dv),
        }
    }

    /// Keys query `i` of batch `b` sees: `0..seen(b, i)`.
    fn seen(&self, b: usize, i: usize) -> usize {
        let mut s = self.spec.causal.visible(i, self.tq, self.tk).max(0) as usize;
        if let Some(l) = self.lengths {
            s = s.min(l[b].clamp(0, self.tk as i64) as usize);
        }
        s
    }

    /// Keys any row of `rows` (a block's) sees: the last row's under a causal mask.
    fn block_seen(&self, b: usize, rows: std::ops::Range<usize>) -> usize {
        match self.spec.causal {
            CausalMask::None => self.seen(b, rows.start),
            _ => self.seen(b, rows.end - 1),
        }
    }

    /// The first query row that sees key `j` (`tq` when none does).
    fn first_row_seeing(&self, b: usize, j: usize) -> usize {
        if let Some(l) = self.lengths {
            if j as i64 >= l[b] {
                return self.tq;
            }
        }
        match self.spec.causal {
            CausalMask::None => 0,
            CausalMask::TopLeft => j.min(self.tq),
            CausalMask::BottomRight => (j + self.tq).saturating_sub(self.tk).min(self.tq),
        }
    }

    /// Block `s` (`rows x cols`, row stride [`BLOCK_K`]) of scaled scores for the
    /// queries `i0..` of head `h` against keys `j0..`, biased, with each row's positions
    /// past what it sees set to `-inf`; returns each row's count of seen keys in the
    /// block.
    #[allow(clippy::too_many_arguments)]
    fn scores(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        rows: usize,
        j0: usize,
        cols: usize,
        s: &mut [T],
        seen: &mut [usize],
    ) {
        let kh = h / (self.hq / self.hkv);
        let (qo, qs) = self.q_row(b, h, i0);
        let (ko, ks) = self.k_row(b, kh, j0);
        let scale = T::of(self.spec.scale());
        product(
            (rows, cols, self.d),
            s,
            BLOCK_K,
            (&self.q[qo..], 1, qs),
            (&self.k()[ko..], ks, 1),
            scale,
            false,
        );
        for r in 0..rows {
            let row = &mut s[r * BLOCK_K..r * BLOCK_K + cols];
            let n = self.seen(b, i0 + r).saturating_sub(j0).min(cols);
            seen[r] = n;
            if let Some((bias, e)) = &self.bias {
                let at = |a: usize, full: usize| if e[a] == 1 { 0 } else { full };
                let base = ((at(0, b) * e[1] + at(1, h)) * e[2] + at(2, i0 + r)) * e[3];
                if e[3] == 1 {
                    row[..n].iter_mut().for_each(|x| *x += bias[base]);
                } else {
                    row[..n]
                        .iter_mut()
                        .zip(&bias[base + j0..])
                        .for_each(|(x, y)| *x += *y);
                }
            }
            row[n..].fill(T::NEG_INF);
        }
    }

    /// Multiplies row `r` of block `p` by the dropout factors of positions
    /// `(b, h, i0 + r, j0 + j)`.
    #[allow(clippy::too_many_arguments)]
    fn drop(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        rows: usize,
        j0: usize,
        cols: usize,
        p: &mut [T],
    ) {
        let Some(key) = self.key else { return };
        let rate = self.spec.dropout_p();
        let keep = T::of(1.0 / (1.0 - rate));
        for r in 0..rows {
            let base = ((b * self.hq + h) * self.tq + i0 + r) * self.tk + j0;
            for (j, x) in p[r * BLOCK_K..r * BLOCK_K + cols].iter_mut().enumerate() {
                let u = random_uniform(key, (base + j) as u64);
                *x = if u >= rate as f32 { *x * keep } else { T::ZERO };
            }
        }
    }
}

fn attention<T: Real>(
    spec: &AttentionSpec,
    backward: bool,
    node: &Node,
    ops: &[&HostArray],
) -> Result<HostArray, RuntimeError> {
    let p = Problem::<T>::new(spec, ops, backward);
    let mut out = host_cache().array(node.dtype, node.shape.clone())?;
    let run = |dst: &mut [T]| {
        dst.fill(T::ZERO);
        if backward {
            let n = spec.layout.tensors();
            let o = T::read(ops[n]);
            let d_o = T::read(ops[n + 1]);
            self::backward(&p, &o, &d_o, dst);
        } else {
            forward(&p, dst);
        }
    };
    // Straight into the result when it holds T (f32, f64); through a buffer for the
    // half types, rounded once.
    match T::direct(out.storage_mut()) {
        Some(dst) => run(dst),
        None => {
            let mut vals = vec![T::ZERO; node.shape.numel()];
            run(&mut vals);
            T::store(&vals, out.storage_mut());
        }
    }
    Ok(out)
}

/// The forward pass into `out` (`[B, Hq, Tq, Dv]`, zeros).
fn forward<T: Real>(p: &Problem<T>, out: &mut [T]) {
    if out.is_empty() {
        return;
    }
    match p.spec.layout {
        // A task per (batch, head, block of queries): its rows are one slice.
        AttentionLayout::Bhtd => {
            out.par_chunks_mut(p.tq * p.dv)
                .enumerate()
                .for_each(|(bh, head)| {
                    let (b, h) = (bh / p.hq, bh % p.hq);
                    head.par_chunks_mut(BLOCK_Q * p.dv)
                        .enumerate()
                        .for_each(|(qb, o)| {
                            let rows = o.len() / p.dv;
                            forward_block(p, (b, h, qb * BLOCK_Q, rows), o, p.dv)
                        });
                })
        }
        // A task per (batch, block of queries), every head: their rows are one slice.
        _ => {
            let row = p.hq * p.dv;
            out.par_chunks_mut(p.tq * row)
                .enumerate()
                .for_each(|(b, seq)| {
                    seq.par_chunks_mut(BLOCK_Q * row)
                        .enumerate()
                        .for_each(|(qb, o)| {
                            let rows = o.len() / row;
                            for h in 0..p.hq {
                                forward_block(
                                    p,
                                    (b, h, qb * BLOCK_Q, rows),
                                    &mut o[h * p.dv..],
                                    row,
                                );
                            }
                        });
                })
        }
    }
}

/// Query rows `i0..i0 + rows` of head `h` into `o` (row `r` at `r * drs`).
fn forward_block<T: Real>(
    p: &Problem<T>,
    (b, h, i0, rows): (usize, usize, usize, usize),
    o: &mut [T],
    drs: usize,
) {
    let kh = h / (p.hq / p.hkv);
    let mut s = vec![T::ZERO; rows * BLOCK_K];
    let mut e = vec![T::ZERO; rows * BLOCK_K];
    let mut seen = vec![0usize; rows];
    let mut m = vec![T::NEG_INF; rows];
    let mut l = vec![T::ZERO; rows];
    let kmax = p.block_seen(b, i0..i0 + rows);
    for j0 in (0..kmax).step_by(BLOCK_K) {
        let cols = BLOCK_K.min(kmax - j0);
        p.scores(b, h, i0, rows, j0, cols, &mut s, &mut seen);
        for r in 0..rows {
            let row = &s[r * BLOCK_K..r * BLOCK_K + cols];
            let er = &mut e[r * BLOCK_K..r * BLOCK_K + cols];
            let n = seen[r];
            let top = T::max_of(&row[..n]);
            let m_new = if top > m[r] { top } else { m[r] };
            if n == 0 || m_new == T::NEG_INF {
                er.fill(T::ZERO);
                continue;
            }
            T::exp_shift(&row[..n], m_new, &mut er[..n]);
            er[n..].fill(T::ZERO);
            let corr = (m[r] - m_new).exp();
            let sum = T::sum_of(&er[..n]);
            l[r] = l[r] * corr + sum;
            if m[r] != m_new {
                o[r * drs..r * drs + p.dv]
                    .iter_mut()
                    .for_each(|x| *x *= corr);
            }
            m[r] = m_new;
        }
        p.drop(b, h, i0, rows, j0, cols, &mut e);
        let (vo, vs) = p.v_row(b, kh, j0);
        product(
            (rows, p.dv, cols),
            o,
            drs,
            (&e, 1, BLOCK_K),
            (&p.v()[vo..], 1, vs),
            T::of(1.0),
            true,
        );
    }
    for r in 0..rows {
        let inv = if l[r] > T::ZERO {
            T::of(1.0) / l[r]
        } else {
            T::ZERO
        };
        o[r * drs..r * drs + p.dv]
            .iter_mut()
            .for_each(|x| *x *= inv);
    }
}

/// Each query row's log-sum-exp (`+inf` for a row that sees no key, so its `P` is 0)
/// and `D_i = do_i . o_i`, in `[B, Hq, Tq]` order.
fn row_stats<T: Real>(p: &Problem<T>, o: &[T], d_o: &[T]) -> (Vec<T>, Vec<T>) {
    let n = p.b * p.hq * p.tq;
    let mut lse = vec![T::ZERO; n];
    let mut dd = vec![T::ZERO; n];
    lse.par_chunks_mut(BLOCK_Q)
        .zip(dd.par_chunks_mut(BLOCK_Q))
        .enumerate()
        .for_each(|(blk, (lse, dd))| {
            // Blocks never straddle heads when Tq is a multiple of BLOCK_Q; otherwise
            // walk the rows of this chunk head by head.
            let start = blk * BLOCK_Q;
            let mut r = 0;
            while r < lse.len() {
                let row = start + r;
                let (bh, i0) = (row / p.tq, row % p.tq);
                let (b, h) = (bh / p.hq, bh % p.hq);
                let rows = (lse.len() - r).min(p.tq - i0);
                stats_block(p, b, h, i0, &mut lse[r..r + rows]);
                for k in 0..rows {
                    let at = p.o_row(b, h, i0 + k).0;
                    dd[r + k] = o[at..at + p.dv]
                        .iter()
                        .zip(&d_o[at..at + p.dv])
                        .fold(T::ZERO, |a, (&x, &y)| a + x * y);
                }
                r += rows;
            }
        });
    (lse, dd)
}

/// The log-sum-exp of rows `i0..i0 + lse.len()` of head `h`.
fn stats_block<T: Real>(p: &Problem<T>, b: usize, h: usize, i0: usize, lse: &mut [T]) {
    let rows = lse.len();
    let mut s = vec![T::ZERO; rows * BLOCK_K];
    let mut e = [T::ZERO; BLOCK_K];
    let mut seen = vec![0usize; rows];
    let mut m = vec![T::NEG_INF; rows];
    let mut l = vec![T::ZERO; rows];
    let kmax = p.block_seen(b, i0..i0 + rows);
    for j0 in (0..kmax).step_by(BLOCK_K) {
        let cols = BLOCK_K.min(kmax - j0);
        p.scores(b, h, i0, rows, j0, cols, &mut s, &mut seen);
        for r in 0..rows {
            let n = seen[r];
            let row = &s[r * BLOCK_K..r * BLOCK_K + n];
            let top = T::max_of(row);
            let m_new = if top > m[r] { top } else { m[r] };
            if n == 0 || m_new == T::NEG_INF {
                continue;
            }
            T::exp_shift(row, m_new, &mut e[..n]);
            let sum = T::sum_of(&e[..n]);
            l[r] = l[r] * (m[r] - m_new).exp() + sum;
            m[r] = m_new;
        }
    }
    for r in 0..rows {
        lse[r] = if l[r] > T::ZERO {
            m[r] + l[r].ln()
        } else {
            T::of(f64::INFINITY)
        };
    }
}

/// `P = exp(S - lse)` (0 where masked) and `dS = P (dP - D) scale` with
/// `dP = (dO V^T) * dropout`, for queries `i0..i0 + rows` of head `h` against keys
/// `j0..j0 + cols`, in `w`: its scores end as `dS`, its `pd` as the dropped-out `P`.
fn grad_block<T: Real>(
    p: &Problem<T>,
    stats: (&[T], &[T]),
    d_o: &[T],
    (b, h, i0, rows): (usize, usize, usize, usize),
    (j0, cols): (usize, usize),
    w: &mut Scratch<T>,
) {
    let Scratch { s, pd, dp, seen } = w;
    let (lse, dd) = stats;
    let kh = h / (p.hq / p.hkv);
    p.scores(b, h, i0, rows, j0, cols, s, seen);
    let row0 = (b * p.hq + h) * p.tq + i0;
    for r in 0..rows {
        let n = seen[r];
        let lr = lse[row0 + r];
        let (src, dst) = (&s[r * BLOCK_K..r * BLOCK_K + n], &mut pd[r * BLOCK_K..]);
        if n > 0 && lr < T::of(f64::INFINITY) {
            T::exp_shift(src, lr, &mut dst[..n]);
        } else {
            dst[..n].fill(T::ZERO);
        }
        dst[n..cols].fill(T::ZERO);
    }
    // dP before dropout's factors: dO V^T.
    let (vo, vs) = p.v_row(b, kh, j0);
    let (oo, os) = p.o_row(b, h, i0);
    product(
        (rows, cols, p.dv),
        dp,
        BLOCK_K,
        (&d_o[oo..], 1, os),
        (&p.v()[vo..], vs, 1),
        T::of(1.0),
        false,
    );
    // With dropout, dP (of the undropped P) is dO V^T times the factors, and the
    // product with V uses the dropped P: drop both the same way.
    p.drop(b, h, i0, rows, j0, cols, dp);
    let scale = T::of(p.spec.scale());
    for r in 0..rows {
        let dr = dd[row0 + r];
        for j in 0..cols {
            let at = r * BLOCK_K + j;
            s[at] = pd[at] * (dp[at] - dr) * scale;
        }
    }
    p.drop(b, h, i0, rows, j0, cols, pd);
}

/// The buffers of one backward task: a block of scores (then `dS`), of probabilities,
/// of `dP`, and each row's count of seen keys.
struct Scratch<T> {
    s: Vec<T>,
    pd: Vec<T>,
    dp: Vec<T>,
    seen: Vec<usize>,
}

impl<T: Real> Scratch<T> {
    fn new() -> Self {
        Scratch {
            s: vec![T::ZERO; BLOCK_Q * BLOCK_K],
            pd: vec![T::ZERO; BLOCK_Q * BLOCK_K],
            dp: vec![T::ZERO; BLOCK_Q * BLOCK_K],
            seen: vec![0; BLOCK_Q],
        }
    }
}

/// Where a backward task writes: its buffers (one when q, k and v are packed), and for
/// dK and dV the buffer, the offset of the block's first key row and the distance
/// between rows; for dQ, when the task accumulates it, the buffer, the offset of query
/// row `(h, i)` and the distance between rows.
struct Grads<'a, 'b, T> {
    bufs: &'b mut [&'a mut [T]],
    dk: (usize, usize, usize),
    dv: (usize, usize, usize),
    dq: Option<(usize, RowAt<'b>, usize)>,
}

/// One block of keys `j0..j0 + cols` of key/value head `kh`: `dV += P^T dO` and
/// `dK += dS^T Q` over the query blocks (in order) of every query head sharing it, and,
/// when the destination has dQ, `dQ += dS K` for each.
fn key_block<T: Real>(
    p: &Problem<T>,
    stats: (&[T], &[T]),
    d_o: &[T],
    (b, kh, j0, cols): (usize, usize, usize, usize),
    g: &mut Grads<'_, '_, T>,
    w: &mut Scratch<T>,
) {
    let group = p.hq / p.hkv;
    let first = p.first_row_seeing(b, j0);
    let (ko, ks) = p.k_row(b, kh, j0);
    for h in kh * group..(kh + 1) * group {
        let mut i0 = first / BLOCK_Q * BLOCK_Q;
        while i0 < p.tq {
            let rows = BLOCK_Q.min(p.tq - i0);
            grad_block(p, stats, d_o, (b, h, i0, rows), (j0, cols), w);
            let one = T::of(1.0);
            let (oo, os) = p.o_row(b, h, i0);
            let (qo, qs) = p.q_row(b, h, i0);
            let (buf, at, drs) = g.dv;
            product(
                (cols, p.dv, rows),
                &mut g.bufs[buf][at..],
                drs,
                (&w.pd, BLOCK_K, 1),
                (&d_o[oo..], 1, os),
                one,
                true,
            );
            let (buf, at, drs) = g.dk;
            product(
                (cols, p.d, rows),
                &mut g.bufs[buf][at..],
                drs,
                (&w.s, BLOCK_K, 1),
                (&p.q[qo..], 1, qs),
                one,
                true,
            );
            if let Some((buf, at, drs)) = g.dq {
                let at = at(h, i0);
                product(
                    (rows, p.d, cols),
                    &mut g.bufs[buf][at..],
                    drs,
                    (&w.s, 1, BLOCK_K),
                    (&p.k()[ko..], 1, ks),
                    one,
                    true,
                );
            }
            i0 += BLOCK_Q;
        }
    }
}

/// The backward pass into `out` (zeros): `dq`, `dk`, `dv` packed.
///
/// With at least two (batch, key/value head) pairs a thread, one task per pair walks its
/// key blocks in order and accumulates dQ, dK and dV together (the scores and `dP`
/// computed once per block pair). With fewer, the work is split finer: one task per
/// block of keys for dK and dV, then one per block of queries for dQ (computing the
/// scores and `dP` again). Both paths add the same products in the same order into
/// each element, so the bits do not depend on which ran. In the `[B, T, H, D]` layout a
/// batch's rows of every head are one slice: one task per batch.
fn backward<T: Real>(p: &Problem<T>, o: &[T], d_o: &[T], out: &mut [T]) {
    if p.tq == 0 || p.tk == 0 || p.b == 0 || p.hq == 0 {
        return;
    }
    let (lse, dd) = row_stats(p, o, d_o);
    let stats = (&lse[..], &dd[..]);
    let group = p.hq / p.hkv;
    if let AttentionLayout::Packed { .. } = p.spec.layout {
        // The gradient of qkv: a batch's rows hold dQ, dK and dV side by side.
        let w = p.width;
        let at = move |h: usize, i: usize| i * w + h * p.d;
        out.par_chunks_mut(p.tq * w)
            .enumerate()
            .for_each(|(b, chunk)| {
                let mut scratch = Scratch::new();
                let mut bufs = [chunk];
                for kh in 0..p.hkv {
                    for j0 in (0..p.tk).step_by(BLOCK_K) {
                        let cols = BLOCK_K.min(p.tk - j0);
                        let mut g = Grads {
                            bufs: &mut bufs,
                            dk: (0, j0 * w + (p.hq + kh) * p.d, w),
                            dv: (0, j0 * w + (p.hq + p.hkv + kh) * p.d, w),
                            dq: Some((0, &at, w)),
                        };
                        key_block(p, stats, d_o, (b, kh, j0, cols), &mut g, &mut scratch);
                    }
                }
            });
        return;
    }
    let (nq, nk) = (p.q.len(), p.k().len());
    let (dq, rest) = out.split_at_mut(nq);
    let (dk, dv) = rest.split_at_mut(nk);
    if p.spec.layout == AttentionLayout::Bthd {
        let (qrow, krow, vrow) = (p.hq * p.d, p.hkv * p.d, p.hkv * p.dv);
        let at = move |h: usize, i: usize| i * qrow + h * p.d;
        dq.par_chunks_mut(p.tq * qrow)
            .zip(dk.par_chunks_mut(p.tk * krow))
            .zip(dv.par_chunks_mut(p.tk * vrow))
            .enumerate()
            .for_each(|(b, ((dq, dk), dv))| {
                let mut scratch = Scratch::new();
                let mut bufs = [dk, dv, dq];
                for kh in 0..p.hkv {
                    for j0 in (0..p.tk).step_by(BLOCK_K) {
                        let cols = BLOCK_K.min(p.tk - j0);
                        let mut g = Grads {
                            bufs: &mut bufs,
                            dk: (0, j0 * krow + kh * p.d, krow),
                            dv: (1, j0 * vrow + kh * p.dv, vrow),
                            dq: Some((2, &at, qrow)),
                        };
                        key_block(p, stats, d_o, (b, kh, j0, cols), &mut g, &mut scratch);
                    }
                }
            });
        return;
    }
    if p.b * p.hkv >= 2 * rayon::current_num_threads() {
        dq.par_chunks_mut(group * p.tq * p.d)
            .zip(dk.par_chunks_mut(p.tk * p.d))
            .zip(dv.par_chunks_mut(p.tk * p.dv))
            .enumerate()
            .for_each(|(bkh, ((dq, dk), dv))| {
                let (b, kh) = (bkh / p.hkv, bkh % p.hkv);
                let at = move |h: usize, i: usize| ((h - kh * group) * p.tq + i) * p.d;
                let mut scratch = Scratch::new();
                let mut bufs = [dk, dv, dq];
                for j0 in (0..p.tk).step_by(BLOCK_K) {
                    let cols = BLOCK_K.min(p.tk - j0);
                    let mut g = Grads {
                        bufs: &mut bufs,
                        dk: (0, j0 * p.d, p.d),
                        dv: (1, j0 * p.dv, p.dv),
                        dq: Some((2, &at, p.d)),
                    };
                    key_block(p, stats, d_o, (b, kh, j0, cols), &mut g, &mut scratch);
                }
            });
        return;
    }
    // dK and dV: one task per (batch, key/value head, block of keys).
    dk.par_chunks_mut(p.tk * p.d)
        .zip(dv.par_chunks_mut(p.tk * p.dv))
        .enumerate()
        .for_each(|(bkh, (dk, dv))| {
            let (b, kh) = (bkh / p.hkv, bkh % p.hkv);
            dk.par_chunks_mut(BLOCK_K * p.d)
                .zip(dv.par_chunks_mut(BLOCK_K * p.dv))
                .enumerate()
                .for_each(|(kb, (dk, dv))| {
                    let cols = dk.len() / p.d;
                    let mut w = Scratch::new();
                    let block = (b, kh, kb * BLOCK_K, cols);
                    let mut bufs = [dk, dv];
                    let mut g = Grads {
                        bufs: &mut bufs,
                        dk: (0, 0, p.d),
                        dv: (1, 0, p.dv),
                        dq: None,
                    };
                    key_block(p, stats, d_o, block, &mut g, &mut w);
                });
        });
    // dQ: one task per (batch, query head, block of queries).
    dq.par_chunks_mut(p.tq * p.d)
        .enumerate()
        .for_each(|(bh, dq)| {
            let (b, h) = (bh / p.hq, bh % p.hq);
            let kh = h / group;
            dq.par_chunks_mut(BLOCK_Q * p.d)
                .enumerate()
                .for_each(|(qb, dq)| {
                    let i0 = qb * BLOCK_Q;
                    let rows = dq.len() / p.d;
                    let mut w = Scratch::new();
                    let kmax = p.block_seen(b, i0..i0 + rows);
                    // Whole key blocks (their masked columns give dS = 0), as the
                    // per-pair path has them: the same products, the same bits.
                    for j0 in (0..kmax).step_by(BLOCK_K) {
                        let cols = BLOCK_K.min(p.tk - j0);
                        grad_block(p, stats, d_o, (b, h, i0, rows), (j0, cols), &mut w);
                        let (ko, ks) = p.k_row(b, kh, j0);
                        product(
                            (rows, p.d, cols),
                            dq,
                            p.d,
                            (&w.s, 1, BLOCK_K),
                            (&p.k()[ko..], 1, ks),
                            T::of(1.0),
                            true,
                        );
                    }
                });
        });
}
