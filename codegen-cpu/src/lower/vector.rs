//! Vector reduction sweeps: the inner loop of a float reduction over contiguous
//! elements, with Cranelift's 128-bit vectors (f32x4, f64x2) and several independent
//! accumulators, so the loop is bound by memory rather than by the latency of one chain
//! of adds.
//!
//! ```text
//! before:    row values splatted to vectors; STREAMS*PER_STREAM vector accumulators per
//!            reduction, each the operation's identity in every lane; the vector part
//!            of the range cut into STREAMS parts of h elements, read side by side
//! vhead(j):  for s in 0..STREAMS, p in 0..PER_STREAM: the W elements from
//!            j + s*h + p*W as vectors (contiguous loads), acc[s][p] = acc[s][p] (+) x
//!            brif j + PER_STREAM*W < lo + h, vhead(...), vdone
//! vdone:     acc = (acc[0][0] (+) acc[0][1]) (+) (acc[1][0] (+) acc[1][1]), then its
//!            lanes pairwise: (l0 (+) l1) (+) (l2 (+) l3)
//! tail:      the scalar sweep over lo + STREAMS*h..hi, starting from that value
//! ```
//!
//! The order of operations, and so every bit of a float sum, depends on the sweep's
//! range only (which depends on shapes only), never on threads. It is not the element
//! order of a scalar sweep: a sum or product of f32 differs from the sequential one by
//! rounding (within the usual `n * eps * sum|x|` bound; it is usually closer to the
//! exact value, since it adds in 16 (f32) or 8 (f64) interleaved partial sums). Max and min do not
//! depend on the order: `fmax`/`fmin` propagate NaN and order -0 below +0 in any
//! association.
//!
//! Cranelift lowers a vector `fmax`/`fmin` with those semantics to eight x86
//! instructions, which made a max sweep (softmax's first) compute-bound. The loop
//! therefore keeps max and min in the x86 form instead, `acc < x ? x : acc` (one
//! `maxps`; min alike), which is exact except in two cases it is blind to, each
//! tracked by a flag vector OR-ed in the loop: a NaN element (the form never takes
//! one: flag `x != x`) and the sign of a zero result (it keeps the first of -0 and +0:
//! flag "an element was +0" for max, "-0" for min). After the loop, a NaN flag makes
//! the result NaN, and a zero result becomes +0 (max) or -0 (min) where its flag is
//! set, which is what `fmax`/`fmin` over the same elements give. Five instructions
//! an element vector instead of eight.
//!
//! Element-wise kernels (no reduce axes) get a vector loop too, over the positions of
//! their range in steps of two vectors, with the scalar loop finishing the rest; each
//! position computes exactly what the scalar loop would, so results are unchanged.
//!
//! A sweep is vectorised only when every element value it computes is a float of the
//! reductions' one dtype, loaded contiguously along the row or computed by an op that
//! has a vector form here (`+ - * / max min`, `neg abs sqrt square`, the inline math).
//!
//! Integer sweeps and element-wise loops (i32x4, i64x2) vectorise too where every op is
//! one whose vector form wraps exactly as the scalar one (`+ - * max min neg`): the
//! same bits in any order, so integer sums need no ordering argument.
//!
//! Arg reductions carry, per accumulator, the best values and their indices (lanes of
//! the values' width: i32 for f32 rows, which must be shorter than 2^31). A lane
//! takes an element where it is strictly better or the first NaN, as the scalar loop
//! does, so each lane holds the first best of the elements it saw; after the loop the
//! candidates combine pairwise, the better value or on a tie (equal values, two NaNs)
//! the smaller index: the row's first best element, as the reference's.

use super::function::{cl_type, vector_input_flags, Lowering, Offset};
use super::sweep::{Acc, AccInfo, Bound, Range, SweepEnv};
use crate::index::{Access, IndexPlan};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::MemFlagsData;
use cranelift_codegen::ir::{types, Endianness, InstBuilder, Type, Value};
use cranelift_module::Module;
use ndfuse_ir::{Accumulate, ArgReduceOp, BinaryOp, DType, Expr, Kernel, Level, UnaryOp, ValueId};

/// Parts of a sweep's vector range read side by side: a core keeps more misses in
/// flight over two streams of memory than one (a full sum of 64M f32 on one thread of
/// the development VM: 8.7 GB/s with one stream, 9.8-10.7 GB/s with two).
const STREAMS: i64 = 2;
const _: () = assert!(
    STREAMS.count_ones() == 1,
    "stream_bounds shifts by log2(STREAMS)"
);

/// Vectors read from each stream per iteration, each into its own accumulator: with
/// the streams, four independent accumulators per reduction, enough to hide the latency
/// of a vector add (about 4 cycles, one issued per cycle) behind loads. A sweep that
/// computes a transcendental per element takes one (see `heavy`).
const PER_STREAM: i64 = 2;

/// The vector type of a sweep over `need` for `accs`, or `None` when it stays scalar
/// (see the module docs).
pub(super) fn sweep_type(
    kernel: &Kernel,
    env: &SweepEnv<'_>,
    need: &[bool],
    accs: &[AccInfo],
) -> Option<Type> {
    let dtype = accs.first()?.2;
    let vt = lane_vector(dtype)?;
    if accs.iter().any(|&(_, _, xd)| xd != dtype) {
        return None;
    }
    // An arg reduction's indices are held in lanes as wide as the values: i32 lanes
    // for f32 rows, which must then be shorter than 2^31.
    let row: u64 = kernel
        .reduce_axes
        .iter()
        .map(|&a| kernel.domain.dims()[a] as u64)
        .product();
    let arg = accs.iter().any(|&(acc, _, _)| matches!(acc, Acc::Arg(_)));
    if arg && vt.lane_bits() == 32 && row >= 1 << 31 {
        return None;
    }
    values_vectorise(kernel, env, need, dtype).then_some(vt)
}

/// Whether every element value of `need` is of `dtype` and has a vector form in a
/// sweep: a load contiguous along the row, or a vector op.
fn values_vectorise(kernel: &Kernel, env: &SweepEnv<'_>, need: &[bool], dtype: DType) -> bool {
    kernel.body.iter().enumerate().all(|(v, ins)| {
        !need[v]
            || (ins.dtype == dtype
                && match &ins.expr {
                    Expr::Load { .. } => {
                        matches!(env.ix.loads[v], Some((_, Access::Contiguous)))
                    }
                    e => vector_op(kernel, e, dtype),
                })
    })
}

/// The vector type of an element-store sweep over `need` storing `stores`, or `None`
/// when it stays scalar: the stored values and everything they need vectorise (as for
/// a reduction sweep) and the output is contiguous along the row.
pub(super) fn store_sweep_type(
    kernel: &Kernel,
    env: &SweepEnv<'_>,
    need: &[bool],
    stores: &[&ndfuse_ir::Store],
) -> Option<Type> {
    let dtype = kernel.body[stores.first()?.value.index()].dtype;
    let vt = lane_vector(dtype)?;
    let same = stores
        .iter()
        .all(|st| kernel.body[st.value.index()].dtype == dtype);
    let contiguous = matches!(env.ix.out, Some((_, Access::Contiguous)));
    (same && contiguous && values_vectorise(kernel, env, need, dtype)).then_some(vt)
}

/// The vector type of a fill pass over `need` writing the values of `operands`, or
/// `None` when it stays scalar: they and everything they need vectorise (as for a
/// reduction sweep). Its elements are independent: vector or scalar, the same bits.
pub(super) fn fill_type(
    kernel: &Kernel,
    env: &SweepEnv<'_>,
    need: &[bool],
    operands: &[usize],
) -> Option<Type> {
    let dtype = kernel.body[*operands.first()?].dtype;
    let vt = lane_vector(dtype)?;
    let same = operands.iter().all(|&u| kernel.body[u].dtype == dtype);
    (same && values_vectorise(kernel, env, need, dtype)).then_some(vt)
}

/// The 128-bit vector holding values of `dtype` (half values in f32 lanes; i32 and
/// i64 in their own lanes, for the integer ops `vector_op` admits).
pub(super) fn lane_vector(dtype: DType) -> Option<Type> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Some(types::F32X4),
        DType::F64 => Some(types::F64X2),
        DType::I32 => Some(types::I32X4),
        DType::I64 => Some(types::I64X2),
        _ => None,
    }
}

/// Vectors per iteration of an element-store sweep.
const STORE_UNROLL: i64 = 2;

/// Whether `expr`, an element op of `dtype`, has a vector form here (on float
/// vectors): the transcendentals `vmath` builds do (f16/bf16 compute in f32).
pub(super) fn vector_op(kernel: &Kernel, expr: &Expr, dtype: DType) -> bool {
    if !dtype.is_float() {
        // Integers: the wrapping ops whose vector forms are exactly the scalar ones.
        return match expr {
            Expr::Unary(op, _) => matches!(op, UnaryOp::Neg),
            Expr::Binary(op, _, _) => matches!(
                op,
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min
            ),
            _ => false,
        };
    }
    match expr {
        Expr::Unary(op, _) => {
            matches!(
                op,
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Square
            ) || crate::vmath::inline_for(*op, dtype)
                // sin and cos (f32 in f64x2 halves, `vmath::trig::sin_cos_f32x4`; f64 by
                // `vmath::trig::sin_cos_f64`), in
                // kernels large enough to pay for compiling that code (small ones keep
                // the scalar loop; the same bits either way).
                || (matches!(op, UnaryOp::Sin | UnaryOp::Cos)
                    && matches!(dtype.compute_dtype(), DType::F32 | DType::F64)
                    && !crate::shared_math::applies(kernel))
        }
        Expr::Binary(op, _, _) => {
            matches!(
                op,
                BinaryOp::Add
                    | BinaryOp::Sub
                    | BinaryOp::Mul
                    | BinaryOp::Div
                    | BinaryOp::Max
                    | BinaryOp::Min
            ) || (*op == BinaryOp::Pow
                // pow of f32 in f64x2 halves (`vmath::pow::pow_f32x4`), as sin and cos.
                && dtype.compute_dtype() == DType::F32
                && !crate::shared_math::applies(kernel))
        }
        _ => false,
    }
}

/// The offset at position 0 of a load that is contiguous from there on (a contiguous
/// view, or a slice of one: one group of stride 1), or `None`.
fn contiguous_from(plan: &IndexPlan, access: &Option<Access>) -> Option<i64> {
    match access {
        Some(Access::Contiguous) => Some(0),
        Some(Access::Strided { offset, strides }) if plan.extents.len() == 1 && strides == &[1] => {
            Some(*offset)
        }
        _ => None,
    }
}

/// Vectors per iteration of an element-wise vector loop.
const ELEMENTWISE_UNROLL: i64 = 2;

/// Whether value `v` is not stored and every use of it is `uses(expr)`.
fn used_only_as(kernel: &Kernel, v: usize, uses: impl Fn(&Expr, ValueId) -> bool) -> bool {
    let id = ValueId(v as u32);
    !kernel.stores.iter().any(|s| s.value == id)
        && kernel
            .body
            .iter()
            .all(|ins| !Kernel::operands(&ins.expr).contains(&id) || uses(&ins.expr, id))
}

/// The vector type of an element-wise kernel's loop, or `None` when it stays scalar:
/// every value is a float of the stored values' one dtype, every load contiguous or of
/// one fixed element (`load_access[v]` is `None` for a fixed load, already loaded
/// before the loop), and every other instruction a constant or an op with a vector
/// form. Besides: a random op whose positions run contiguously below 2^32 from a key
/// loaded before the loop (the key stays a scalar: its schedule is splatted), and a
/// float comparison used only as `where` conditions (a lane mask that `where` selects
/// with): dropout's kernel.
pub(super) fn elementwise_type(
    kernel: &Kernel,
    plan: &IndexPlan,
    load_access: &[Option<Access>],
) -> Option<Type> {
    let dtype = kernel.body[kernel.stores.first()?.value.index()].dtype;
    let vt = lane_vector(dtype)?;
    let is_key = |v: usize| {
        kernel.body[v].dtype == DType::I64
            && matches!(kernel.body[v].expr, Expr::Load { .. })
            && load_access[v].is_none()
    };
    let ok = kernel.body.iter().enumerate().all(|(v, ins)| match &ins.expr {
        Expr::Load { .. } if dtype != DType::I64 && is_key(v) => used_only_as(kernel, v, |e, id| {
            matches!(e, Expr::Random { key, .. } if *key == id)
        }),
        Expr::Random { key, view } => {
            ins.dtype == dtype
                && is_key(key.index())
                && super::random::below_2_32(view)
                && contiguous_from(plan, &load_access[v]).is_some()
        }
        Expr::Binary(op, x, _) if op.is_comparison() && dtype.is_float() => {
            kernel.body[x.index()].dtype == dtype
                && used_only_as(kernel, v, |e, id| {
                    matches!(e, Expr::Where(c, a, b) if *c == id && *a != id && *b != id)
                })
        }
        // Its condition is a comparison kept as a mask (the rule above).
        Expr::Where(..) => ins.dtype == dtype && dtype.is_float(),
        e => {
            ins.dtype == dtype
                && match e {
                    Expr::Load { .. } => {
                        load_access[v].is_none()
                            || contiguous_from(plan, &load_access[v]).is_some()
                    }
                    Expr::Const(_) => true,
                    e => vector_op(kernel, e, dtype),
                }
        }
    });
    ok.then_some(vt)
}

impl<M: Module> Lowering<'_, '_, M> {
    /// The vector loop of an element-wise kernel over positions `[start, vend)`, where
    /// `vend` is `start` plus the largest multiple of the step that fits before `end`;
    /// returns `vend`, where the scalar loop takes over. `fixed` holds the values of
    /// fixed loads (made before the loop); `in_bases` and `out_bases` are the buffers.
    pub(super) fn elementwise_vectors(
        &mut self,
        kernel: &Kernel,
        (start, end): (Value, Value),
        (plan, load_access): (&IndexPlan, &[Option<Access>]),
        fixed: &[Option<Value>],
        vt: Type,
        (in_bases, out_bases): (&[Value], &[Value]),
    ) -> Result<Value, String> {
        let width = i64::from(vt.lane_count());
        let step = width * ELEMENTWISE_UNROLL;
        // Loop invariants as vectors: fixed loads and constants; a random op's key stays
        // a scalar, its schedule is splatted.
        let mut invariant: Vec<Option<Value>> = vec![None; kernel.body.len()];
        let mut streams: Vec<Option<Value>> = vec![None; kernel.body.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            let scalar = match (&ins.expr, fixed[v]) {
                (Expr::Load { .. }, Some(x)) if cl_type(ins.dtype) != vt.lane_type() => {
                    invariant[v] = Some(x);
                    continue;
                }
                (Expr::Load { .. }, Some(x)) => x,
                (Expr::Const(_), _) => self.compute(kernel, v, &invariant)?,
                (Expr::Random { key, .. }, _) => {
                    let key = fixed[key.index()].expect("a fixed key (elementwise_type)");
                    let h = self.random_stream(key, None);
                    streams[v] = Some(self.b.ins().splat(types::I32X4, h));
                    continue;
                }
                _ => continue,
            };
            invariant[v] = Some(self.b.ins().splat(vt, scalar));
        }
        // Lane numbers 0..4, added to a random op's first position.
        let iota = if streams.iter().any(Option::is_some) {
            let zero = self.b.ins().iconst(types::I32, 0);
            let mut v = self.b.ins().splat(types::I32X4, zero);
            for l in 1..4u8 {
                let n = self.b.ins().iconst(types::I32, i64::from(l));
                v = self.b.ins().insertlane(v, n, l);
            }
            Some(v)
        } else {
            None
        };
        let len = self.b.ins().isub(end, start);
        let vlen = self.b.ins().band_imm_s(len, -step);
        let vend = self.b.ins().iadd(start, vlen);
        let flags = vector_input_flags();
        self.counted_loop(start, Bound::Value(vend), step, true, &[], |lw, i, _| {
            for u in 0..ELEMENTWISE_UNROLL {
                let at = Offset {
                    var: Some(i),
                    elems: u * width,
                };
                let mut vals = invariant.clone();
                let lane = u * width;
                for (v, ins) in kernel.body.iter().enumerate() {
                    if vals[v].is_some() {
                        continue;
                    }
                    let value = match &ins.expr {
                        Expr::Load { input, .. } => {
                            let from = contiguous_from(plan, &load_access[v])
                                .expect("vector loads are contiguous (elementwise_type)");
                            let off = Offset {
                                var: Some(i),
                                elems: from + lane,
                            };
                            let (addr, imm) = lw.address(in_bases[*input], off, ins.dtype);
                            lw.load_typed(ins.dtype, vt, flags, addr, imm)
                        }
                        // Positions from + i + lane + 0..4, all below 2^32: the low
                        // halves are the positions themselves.
                        Expr::Random { .. } => {
                            let from = contiguous_from(plan, &load_access[v])
                                .expect("random positions are contiguous (elementwise_type)");
                            let first = lw.b.ins().iadd_imm_s(i, from + lane);
                            let low = lw.b.ins().ireduce(types::I32, first);
                            let low = lw.b.ins().splat(types::I32X4, low);
                            let iota = iota.expect("made for random ops");
                            let c0 = lw.b.ins().iadd(low, iota);
                            let h = streams[v].expect("made for random ops");
                            lw.random_value(h, c0)
                        }
                        _ => lw.compute(kernel, v, &vals)?,
                    };
                    vals[v] = Some(value);
                }
                for st in &kernel.stores {
                    let value = vals[st.value.index()].expect("stored values are computed");
                    let dtype = kernel.body[st.value.index()].dtype;
                    let (addr, imm) = lw.address(out_bases[st.output], at, dtype);
                    // Element-aligned only, like the loads.
                    let store_flags = MemFlagsData::new().with_notrap();
                    lw.store_typed(dtype, store_flags, value, addr, imm);
                }
            }
            Ok(Vec::new())
        })?;
        Ok(vend)
    }

    /// The reduction sweep over `range` in vectors of `vt` (see the module docs):
    /// `carried` are the scalar starting accumulators (the identities), one per plain
    /// reduction of `accs`; returns the final scalar accumulators. `scalar` emits one
    /// element of the scalar sweep, for the tail.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vector_reduce(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        (need, shape): (&[bool], &[bool]),
        accs: &[AccInfo],
        carried: &[(Type, Value)],
        values: &[Option<Value>],
        (range, vt): (Range, Type),
        scalar: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<Vec<Value>, String> {
        let width = i64::from(vt.lane_count());
        // A sweep that computes a transcendental per element is bound by that code, not
        // by the latency of its adds: one vector per stream and iteration, which keeps
        // its constants and temporaries in registers (sum(exp(x)) over rows of
        // [4096, 4096] on the development VM: 16.9 ms with two, 11.2 ms with one).
        // Decided from `shape`, the values of the sweep on the 128-bit code, so that
        // loading a wide value instead of computing it changes no bit of a sum.
        let per_stream = if heavy(kernel, shape) { 1 } else { PER_STREAM };
        let accumulators = STREAMS * per_stream;
        // Each iteration reads PER_STREAM vectors from each of STREAMS streams, one
        // accumulator per vector: the vector part is cut into STREAMS equal parts of
        // `h` elements read side by side.
        let step = width * per_stream;
        let vvals = self.row_splats(kernel, env, need, values, vt);
        let (lo, h, hi, guard) = self.stream_bounds(range, step * STREAMS);
        // Reduction k's accumulators start at slots[k]: one vector each for a plain
        // reduction, two (best values, their indices) for an arg one.
        let ivt = vt.as_int();
        let mut vcarried = Vec::with_capacity(carried.len() * accumulators as usize);
        let mut slots = Vec::with_capacity(accs.len());
        let mut c = 0;
        for &(acc, _, _) in accs {
            slots.push(vcarried.len());
            let splat = self.b.ins().splat(vt, carried[c].1);
            c += 1;
            // An arg reduction's indices start at 0 (any: the first element wins).
            let zero = matches!(acc, Acc::Arg(_)).then(|| {
                let zero = self.b.ins().iconst(ivt.lane_type(), 0);
                self.b.ins().splat(ivt, zero)
            });
            for _ in 0..accumulators {
                vcarried.push((vt, splat));
                if let Some(zero) = zero {
                    vcarried.push((ivt, zero));
                }
            }
            if zero.is_some() {
                c += 1;
            }
        }
        // The lane numbers 0..W, for the indices of an arg reduction.
        let iota = if accs.iter().any(|&(acc, _, _)| matches!(acc, Acc::Arg(_))) {
            let zero = self.b.ins().iconst(ivt.lane_type(), 0);
            let mut v = self.b.ins().splat(ivt, zero);
            for l in 1..vt.lane_count() {
                let n = self.b.ins().iconst(ivt.lane_type(), i64::from(l));
                v = self.b.ins().insertlane(v, n, l as u8);
            }
            Some(v)
        } else {
            None
        };
        // The NaN and zero flags of each float max or min (see the module docs), after
        // the accumulators: flags[k] is the index of reduction k's pair.
        let mut flags = vec![None; accs.len()];
        for (k, &(acc, _, xd)) in accs.iter().enumerate() {
            if pseudo_min_max(acc, xd).is_some() {
                flags[k] = Some(vcarried.len());
                let zero = self.b.ins().iconst(ivt.lane_type(), 0);
                let none = self.b.ins().splat(ivt, zero);
                vcarried.push((ivt, none));
                vcarried.push((ivt, none));
            }
        }
        let hend = match h {
            Bound::Const(h) => Bound::Const(h),
            Bound::Value(h) => Bound::Value(self.b.ins().iadd(lo, h)),
        };
        let vfinals = self.counted_loop(lo, hend, step, guard, &vcarried, |lw, j, state| {
            let mut next = state.to_vec();
            for s in 0..STREAMS {
                // Stream s starts s * h elements further on.
                let (js, skip) = match h {
                    Bound::Const(h) => (j, s * h),
                    Bound::Value(_) if s == 0 => (j, 0),
                    Bound::Value(h) => {
                        let far = if s == 1 {
                            h
                        } else {
                            lw.b.ins().imul_imm_s(h, s)
                        };
                        (lw.b.ins().iadd(j, far), 0)
                    }
                };
                for p in 0..per_stream {
                    let lane = skip + p * width;
                    let vals = lw.element_vectors(kernel, env, need, (js, lane), &vvals, vt)?;
                    let a = (s * per_stream + p) as usize;
                    for (k, &(acc, x, xd)) in accs.iter().enumerate() {
                        let xv = vals[x].expect("the operand is computed in the sweep");
                        let op = match acc {
                            Acc::Plain(op) => op,
                            Acc::Arg(op) => {
                                // Lane l holds the element at js + lane + l.
                                let at = slots[k] + 2 * a;
                                let base = lw.b.ins().iadd_imm_s(js, lane);
                                let base = if ivt.lane_type() == types::I64 {
                                    base
                                } else {
                                    lw.b.ins().ireduce(ivt.lane_type(), base)
                                };
                                let base = lw.b.ins().splat(ivt, base);
                                let idx = lw.b.ins().iadd(base, iota.expect("made for args"));
                                let better = lw.arg_better(op, xd, xv, state[at]);
                                let mask = lw.b.ins().bitcast(vt, lane_flags(), better);
                                next[at] = lw.b.ins().bitselect(mask, xv, state[at]);
                                next[at + 1] = lw.b.ins().bitselect(better, idx, state[at + 1]);
                                continue;
                            }
                        };
                        let at = slots[k] + a;
                        match (pseudo_min_max(acc, xd), flags[k]) {
                            (Some(max), Some(f)) => {
                                next[at] = lw.pseudo_min_max(max, state[at], xv);
                                let (nan, zero) = lw.min_max_flags(max, xv);
                                next[f] = lw.b.ins().bor(next[f], nan);
                                next[f + 1] = lw.b.ins().bor(next[f + 1], zero);
                            }
                            _ => next[at] = lw.accumulate(op, xd, state[at], xv),
                        }
                    }
                }
            }
            Ok(next)
        })?;
        // The scalar tail starts after the last stream.
        let vend = match h {
            Bound::Const(h) => Bound::Const(h * STREAMS),
            Bound::Value(h) => {
                let all = self.b.ins().imul_imm_s(h, STREAMS);
                Bound::Value(self.b.ins().iadd(lo, all))
            }
        };
        // Accumulators, then lanes, combined pairwise in a fixed order.
        let mut scalars = Vec::with_capacity(carried.len());
        let mut c = 0;
        for (k, &(acc, _, xd)) in accs.iter().enumerate() {
            let op = match acc {
                Acc::Plain(op) => op,
                Acc::Arg(op) => {
                    // Every (value, index) of every accumulator's lanes, combined
                    // pairwise: the better value, or on a tie (equal, or both NaN) the
                    // smaller index, which is the reference's first best element.
                    let mut cands = Vec::new();
                    for a in 0..accumulators as usize {
                        let at = slots[k] + 2 * a;
                        for l in 0..vt.lane_count() as u8 {
                            let v = self.b.ins().extractlane(vfinals[at], l);
                            let i = self.b.ins().extractlane(vfinals[at + 1], l);
                            let i = if ivt.lane_type() == types::I64 {
                                i
                            } else {
                                self.b.ins().sextend(types::I64, i)
                            };
                            cands.push((v, i));
                        }
                    }
                    while cands.len() > 1 {
                        cands = cands
                            .chunks(2)
                            .map(|p| self.arg_combine(op, xd, p[0], p[1]))
                            .collect();
                    }
                    scalars.push((carried[c].0, cands[0].0));
                    scalars.push((carried[c + 1].0, cands[0].1));
                    c += 2;
                    continue;
                }
            };
            let at = slots[k];
            let mut level: Vec<Value> = vfinals[at..at + accumulators as usize].to_vec();
            while level.len() > 1 {
                level = level
                    .chunks(2)
                    .map(|p| self.accumulate(op, xd, p[0], p[1]))
                    .collect();
            }
            let mut lanes: Vec<Value> = (0..vt.lane_count())
                .map(|l| self.b.ins().extractlane(level[0], l as u8))
                .collect();
            while lanes.len() > 1 {
                lanes = lanes
                    .chunks(2)
                    .map(|p| self.accumulate(op, xd, p[0], p[1]))
                    .collect();
            }
            let mut result = lanes[0];
            if let (Some(max), Some(f)) = (pseudo_min_max(acc, xd), flags[k]) {
                result = self.settle_min_max(max, result, vfinals[f], vfinals[f + 1]);
            }
            scalars.push((carried[c].0, result));
            c += 1;
        }
        self.scalar_tail(range, (vend, hi), &scalars, scalar)
    }

    /// The better of two (value, index) candidates of an arg reduction: `b` where its
    /// value is better (strictly, or the first NaN), or where neither is better (equal
    /// values, or two NaNs) and its index is smaller.
    fn arg_combine(
        &mut self,
        op: ArgReduceOp,
        dtype: DType,
        a: (Value, Value),
        b: (Value, Value),
    ) -> (Value, Value) {
        let b_better = self.arg_better(op, dtype, b.0, a.0);
        let a_better = self.arg_better(op, dtype, a.0, b.0);
        let either = self.b.ins().bor(a_better, b_better);
        let earlier = self.b.ins().icmp(IntCC::SignedLessThan, b.1, a.1);
        let tie_b = self.b.ins().band_not(earlier, either);
        let take_b = self.b.ins().bor(b_better, tie_b);
        (
            self.b.ins().select(take_b, b.0, a.0),
            self.b.ins().select(take_b, b.1, a.1),
        )
    }

    /// One step of the x86-form max (`max`) or min of the vector loop: `acc < x ? x :
    /// acc` or `x < acc ? x : acc` (one `maxps`/`minps`; see the module docs).
    fn pseudo_min_max(&mut self, max: bool, acc: Value, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(acc);
        let (a, b) = if max { (acc, x) } else { (x, acc) };
        let lt = self.b.ins().fcmp(FloatCC::LessThan, a, b);
        let mask = self.b.ins().bitcast(ty, lane_flags(), lt);
        self.b.ins().bitselect(mask, x, acc)
    }

    /// The lanes of `x` that are NaN, and those that are +0 (`max`) or -0 (min), as
    /// integer masks.
    fn min_max_flags(&mut self, max: bool, x: Value) -> (Value, Value) {
        let ity = self.b.func.dfg.value_type(x).as_int();
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let bits = self.b.ins().bitcast(ity, lane_flags(), x);
        let lane = ity.lane_type();
        let zero_bits = if max { 0 } else { 1i64 << (lane.bits() - 1) };
        let z = self.b.ins().iconst(lane, zero_bits);
        let z = self.b.ins().splat(ity, z);
        let zero = self.b.ins().icmp(IntCC::Equal, bits, z);
        (nan, zero)
    }

    /// The exact max (`max`) or min from the x86-form `result` and the loop's flags:
    /// NaN if an element was, the right zero if the result is a zero and the flag of
    /// that zero is set, else `result`.
    fn settle_min_max(&mut self, max: bool, result: Value, nan: Value, zero: Value) -> Value {
        let ty = self.b.func.dfg.value_type(result);
        let any_nan = self.b.ins().vany_true(nan);
        let any_zero = self.b.ins().vany_true(zero);
        let (right_zero, nan_value) = if ty == types::F64 {
            let z = if max { 0.0 } else { -0.0 };
            (self.b.ins().f64const(z), self.b.ins().f64const(f64::NAN))
        } else {
            let z = if max { 0.0f32 } else { -0.0 };
            (self.b.ins().f32const(z), self.b.ins().f32const(f32::NAN))
        };
        let zero_c = self.b.ins().fcmp(FloatCC::Equal, result, right_zero);
        let fix_zero = self.b.ins().band(zero_c, any_zero);
        let v = self.b.ins().select(fix_zero, right_zero, result);
        self.b.ins().select(any_nan, nan_value, v)
    }

    /// The element-store sweep over `range` in vectors of `vt`, two a step, then the
    /// scalar sweep (`scalar`, one element) for the tail; `stores` write values of
    /// `need` at `out_kept` plus the element's position along the row.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vector_store_sweep(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        need: &[bool],
        (stores, out_kept, out_bases): (&[&ndfuse_ir::Store], &Offset, &[Value]),
        values: &[Option<Value>],
        (range, vt): (Range, Type),
        scalar: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<(), String> {
        let mut vvals = self.row_splats(kernel, env, need, values, vt);
        // A stored row value is broadcast along the row.
        for st in stores {
            let v = st.value.index();
            if env.levels[v] == Level::Row {
                let s = values[v].expect("row values are computed before the sweep");
                vvals[v] = Some(self.b.ins().splat(vt, s));
            }
        }
        let emit = |lw: &mut Self, vals: &[Option<Value>], j: Value, lane: i64| {
            let var = match out_kept.var {
                Some(k) => lw.b.ins().iadd(k, j),
                None => j,
            };
            let at = Offset {
                var: Some(var),
                elems: out_kept.elems + lane,
            };
            for st in stores {
                let value = vals[st.value.index()].expect("stored values are computed");
                let dtype = kernel.body[st.value.index()].dtype;
                let (addr, imm) = lw.address(out_bases[st.output], at, dtype);
                // Element-aligned only, like the loads.
                let flags = MemFlagsData::new().with_notrap();
                lw.store_typed(dtype, flags, value, addr, imm);
            }
        };
        self.vector_elements(kernel, env, need, &vvals, (range, vt), emit, scalar)
    }

    /// A fill pass (`env.cache`'s) over `range` in vectors of `vt`, two a step, then
    /// the scalar sweep (`scalar`) for the tail: for each `(v, u)` of `fills`, the
    /// values of `u` stored into `v`'s cached row.
    pub(super) fn vector_fill(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        fills: &[(usize, usize)],
        values: &[Option<Value>],
        (range, vt): (Range, Type),
        scalar: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<(), String> {
        let c = env.cache.expect("a fill pass has its cache (a bug)");
        let need = &c.pass().need;
        let vvals = self.row_splats(kernel, env, need, values, vt);
        let emit = |lw: &mut Self, vals: &[Option<Value>], j: Value, lane: i64| {
            for &(v, u) in fills {
                let value = vals[u].expect("a filled value's operand is computed");
                lw.cache_store(kernel, &c, v, (j, lane), value);
            }
        };
        self.vector_elements(kernel, env, need, &vvals, (range, vt), emit, scalar)
    }

    /// An element sweep over `range` in vectors of `vt`, two a step (`emit` writes
    /// each vector's values: `j`, then the lane offset from it), then the scalar sweep
    /// (`scalar`, one element) for the tail.
    #[allow(clippy::too_many_arguments)]
    fn vector_elements(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        need: &[bool],
        vvals: &[Option<Value>],
        (range, vt): (Range, Type),
        mut emit: impl FnMut(&mut Self, &[Option<Value>], Value, i64),
        scalar: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<(), String> {
        let width = i64::from(vt.lane_count());
        let step = width * STORE_UNROLL;
        let (lo, vend, hi, guard) = self.vector_bounds(range, step);
        self.counted_loop(lo, vend, step, guard, &[], |lw, j, _| {
            for a in 0..STORE_UNROLL {
                let vals = lw.element_vectors(kernel, env, need, (j, a * width), vvals, vt)?;
                emit(lw, &vals, j, a * width);
            }
            Ok(Vec::new())
        })?;
        self.scalar_tail(range, (vend, hi), &[], scalar)?;
        Ok(())
    }

    /// Row values that element ops of `need` use, splatted to vectors of `vt` (made
    /// once, before a vector loop), on top of `values`.
    fn row_splats(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        need: &[bool],
        values: &[Option<Value>],
        vt: Type,
    ) -> Vec<Option<Value>> {
        let mut vvals = values.to_vec();
        let mut splatted = vec![false; values.len()];
        for (v, ins) in kernel.body.iter().enumerate() {
            if !need[v] {
                continue;
            }
            for x in Kernel::operands(&ins.expr) {
                let x = x.index();
                if env.levels[x] == Level::Row && !splatted[x] {
                    let s = values[x].expect("row values are computed before the sweep");
                    vvals[x] = Some(self.b.ins().splat(vt, s));
                    splatted[x] = true;
                }
            }
        }
        vvals
    }

    /// The bounds of a vector loop over `range` in steps of `step`: `(lo, vend, hi,
    /// guard)`, where `[lo, vend)` is a multiple of `step` long, `[vend, hi)` is left to
    /// the scalar tail, and `guard` says whether the vector loop may run zero times.
    fn vector_bounds(&mut self, range: Range, step: i64) -> (Value, Bound, Bound, bool) {
        match range {
            Range::Whole(n) => {
                let lo = self.b.ins().iconst(types::I64, 0);
                let nv = n / step * step;
                (lo, Bound::Const(nv), Bound::Const(n), nv == 0)
            }
            Range::Dynamic(lo, hi) => {
                let len = self.b.ins().isub(hi, lo);
                let vlen = self.b.ins().band_imm_s(len, -step);
                let vend = self.b.ins().iadd(lo, vlen);
                (lo, Bound::Value(vend), Bound::Value(hi), true)
            }
        }
    }

    /// The bounds of a vector loop over `range` cut into `STREAMS` parts: `(lo, h, hi,
    /// guard)`, where each part is `h` elements long, a multiple of `unit / STREAMS`
    /// (`unit` is one step of every stream), `[lo + STREAMS * h, hi)` is left to the
    /// scalar tail, and `guard` says whether the loop may run zero times.
    fn stream_bounds(&mut self, range: Range, unit: i64) -> (Value, Bound, Bound, bool) {
        let part = unit / STREAMS;
        match range {
            Range::Whole(n) => {
                let lo = self.b.ins().iconst(types::I64, 0);
                let h = n / unit * part;
                (lo, Bound::Const(h), Bound::Const(n), h == 0)
            }
            Range::Dynamic(lo, hi) => {
                let len = self.b.ins().isub(hi, lo);
                let all = self.b.ins().band_imm_s(len, -unit);
                // Non-negative, and STREAMS is a power of two.
                let h = self
                    .b
                    .ins()
                    .ushr_imm_s(all, i64::from(STREAMS.trailing_zeros()));
                (lo, Bound::Value(h), Bound::Value(hi), true)
            }
        }
    }

    /// The scalar loop over `[vend, hi)` after a vector loop, carrying `carried`; none
    /// at all when a whole row's vectors covered it.
    fn scalar_tail(
        &mut self,
        range: Range,
        (vend, hi): (Bound, Bound),
        carried: &[(Type, Value)],
        scalar: impl FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, String>,
    ) -> Result<Vec<Value>, String> {
        let start = match vend {
            Bound::Const(nv) => self.b.ins().iconst(types::I64, nv),
            Bound::Value(v) => v,
        };
        match (range, vend) {
            (Range::Whole(n), Bound::Const(nv)) if nv == n => {
                Ok(carried.iter().map(|&(_, v)| v).collect())
            }
            (Range::Whole(_), _) => self.counted_loop(start, hi, 1, false, carried, scalar),
            (Range::Dynamic(..), _) => self.counted_loop(start, hi, 1, true, carried, scalar),
        }
    }

    /// Inside a vector sweep: the element values of `need` for the `W` elements from
    /// `j + lane` on, as vectors of `vt`, on top of `vvals` (row values as splats).
    fn element_vectors(
        &mut self,
        kernel: &Kernel,
        env: &SweepEnv<'_>,
        need: &[bool],
        (j, lane): (Value, i64),
        vvals: &[Option<Value>],
        vt: Type,
    ) -> Result<Vec<Option<Value>>, String> {
        let mut vals = vvals.to_vec();
        for (v, ins) in kernel.body.iter().enumerate() {
            if !need[v] {
                continue;
            }
            if let Some(c) = env.cache.as_ref().filter(|c| c.loads(v)) {
                vals[v] = Some(self.cache_load(kernel, c, v, (j, lane), vt));
                continue;
            }
            let value = match &ins.expr {
                Expr::Load { input, .. } => {
                    let kept = env.kept_offsets[v]
                        .as_ref()
                        .expect("loads have row offsets");
                    let var = match kept.var {
                        Some(k) => self.b.ins().iadd(k, j),
                        None => j,
                    };
                    let off = Offset {
                        var: Some(var),
                        elems: kept.elems + lane,
                    };
                    let (addr, imm) = self.address(env.in_bases[*input], off, ins.dtype);
                    let flags = vector_input_flags();
                    self.load_typed(ins.dtype, vt, flags, addr, imm)
                }
                _ => self.compute(kernel, v, &vals)?,
            };
            if let Some(c) = env.cache.as_ref().filter(|c| c.stores(v)) {
                self.cache_store(kernel, c, v, (j, lane), value);
            }
            vals[v] = Some(value);
        }
        Ok(vals)
    }
}

/// Whether a plain reduction `acc` of `dtype` takes the x86 form in the vector loop:
/// `Some(true)` for a float max, `Some(false)` for a float min.
fn pseudo_min_max(acc: Acc, dtype: DType) -> Option<bool> {
    match acc {
        Acc::Plain(Accumulate::Max) if dtype.is_float() => Some(true),
        Acc::Plain(Accumulate::Min) if dtype.is_float() => Some(false),
        _ => None,
    }
}

/// Flags of the bitcasts between float and integer lanes.
fn lane_flags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

/// Whether the values a sweep computes (`need`) include a transcendental: inline math
/// (or a call to its shared copy), sin, cos or pow.
fn heavy(kernel: &Kernel, need: &[bool]) -> bool {
    kernel.body.iter().enumerate().any(|(v, ins)| {
        need[v]
            && match ins.expr {
                Expr::Unary(op, _) => {
                    crate::vmath::inline_for(op, ins.dtype)
                        || matches!(op, UnaryOp::Sin | UnaryOp::Cos)
                }
                Expr::Binary(op, _, _) => op == BinaryOp::Pow,
                _ => false,
            }
    })
}
