//! Element-wise kernels on the wide path: the kernel's work is cut into blocks of
//! [`BLOCK`] positions, and each block goes through a fixed list of steps while it is
//! in L1: JIT-compiled 128-bit loops for the cheap instructions (segments), and the
//! wide routines (`wide`) for what costs the most per element: the transcendental ops
//! and the f16/bf16 conversions of loads and stores.
//!
//! ```text
//! gelu(x), x: f16[16M]           for each block of 512 positions b..e:
//!   load f16 x    -> s0              wide f16 -> f32        x[b..e]  -> s0
//!   segment 0     -> s1              JIT: s1 = 1.5957·(s0 + 0.0447·s0³)
//!   sigmoid s1    -> s2              wide sigmoid           s1       -> s2
//!   segment 1     -> s3              JIT: s3 = s0 · s2
//!   store f16 s3  -> out             wide f32 -> f16        s3       -> out[b..e]
//! ```
//!
//! A segment is an ordinary element-wise kernel (`Kernel`) over f32 buffers and the
//! kernel's own domain, built here from the cheap instructions between two wide ops and
//! compiled by the JIT as any other kernel: its inputs are the kernel's f32 inputs
//! (read through their own views, broadcast ones included) and the scratch slots it
//! reads, its outputs the slots later steps read and, for the last segment, the
//! kernel's outputs. A slot is `BLOCK` f32 on the running thread's stack, read and
//! written contiguously; the segment's pointer to it is moved back by the block's
//! start, so the JIT code indexes it by domain position like every other buffer.
//!
//! Half values are held in f32 by the 128-bit code from load to store, so a segment
//! computes them as f32 instructions: every instruction gives the bits it gives in
//! the kernel compiled whole, the wide routines give the 128-bit code's bits
//! (`wide`), and the result is the same bits on either path and any thread count.
//!
//! Which kernels: element-wise ones (matrix products' epilogues included: their
//! product is an input the runtime fills first) of at least [`BLOCKS_FROM`] positions
//! ([`HALF_BLOCKS_FROM`] for those with f16 or bf16 to convert)
//! whose instructions are loads, constants, unary and binary ops all of one float type
//! (f32, f16 or bf16), except that an f32 kernel may round what it stores into f16 or
//! bf16 outputs (a cast used by stores alone, done by the store's conversion: the
//! epilogue of a half matrix product), whose half loads are contiguous, whose wide
//! ops read values held contiguously, and that have some work for the wide routines
//! (a wide op, or a half type to convert). Anything else, or a kernel that would need more than
//! [`MAX_SLOTS`] slots, compiles whole as before.

use crate::shared_math::SHARED_MATH_BELOW;
use crate::wide::exp::{GeluFn, GeluSumFn};
use crate::wide::{self, LoadFn, StoreFn, Tier, UnaryFn};
use ndfuse_ir::{
    BinaryOp, Buffer, DType, Expr, Instr, Kernel, Plan, Store, UnaryOp, ValueId, View,
};

/// Positions per block: 2 KiB per f32 slot, so a block's slots stay in L1.
pub(crate) const BLOCK: usize = 512;

/// Scratch slots a kernel may use (24 KiB of stack at most).
pub(crate) const MAX_SLOTS: usize = 12;

/// Pointers a segment may take (its inputs and outputs).
pub(crate) const MAX_SEGMENT_PTRS: usize = 32;

/// Kernels below this many positions compile whole: their compile time matters more
/// than their run time (they call the shared math instead, see `shared_math`)...
pub(crate) const BLOCKS_FROM: usize = SHARED_MATH_BELOW;

/// ...but kernels that load or store f16 or bf16 take blocks from one block of
/// positions on: the 128-bit code converts halves in integer instructions (Cranelift
/// has no F16C), about 6 ns an element to round an f32 into f16, which made the
/// epilogue of a 64 x 64 f16 product 24 µs, against the routines' fraction of a ns.
pub(crate) const HALF_BLOCKS_FROM: usize = BLOCK;

/// Where a step's operand lives, for the block at positions `b..e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// An input buffer of the kernel (f32), at position `b`.
    Input(usize),
    /// An output buffer of the kernel (f32), at position `b`.
    Output(usize),
    /// A scratch slot.
    Slot(usize),
}

/// One step of a block.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// Input `input` (f16 or bf16) widened into a slot.
    Load {
        input: usize,
        slot: usize,
        dtype: DType,
        f: LoadFn,
    },
    /// Segment `index` (the JIT function of `BlockPlan::segments[index]`).
    Segment { index: usize },
    /// A wide op from one place to another.
    Unary {
        op: UnaryOp,
        src: Place,
        dst: Place,
        f: UnaryFn,
    },
    /// gelu's tail, `x · sigmoid(c2 · (x + c1 · x³))`, from one place to another (see
    /// [`gelu_tails`]).
    Gelu {
        src: Place,
        dst: Place,
        c1: f32,
        c2: f32,
        f: GeluFn,
    },
    /// gelu's tail over `x = src + b`, with `b` row `offset..` of input `bias` broadcast
    /// over rows of `row` positions (a matrix product's bias; see [`gelu_tails`]).
    GeluSum {
        src: Place,
        bias: usize,
        offset: isize,
        row: usize,
        dst: Place,
        c1: f32,
        c2: f32,
        f: GeluSumFn,
    },
    /// A slot rounded into output `output` (f16 or bf16).
    Store {
        slot: usize,
        output: usize,
        dtype: DType,
        f: StoreFn,
    },
}

/// A kernel cut into steps over blocks.
#[derive(Debug)]
pub(crate) struct BlockPlan {
    /// The tier of the wide routines.
    pub(crate) tier: Tier,
    /// The segments, to compile (each a plain f32 element-wise kernel).
    pub(crate) segments: Vec<Kernel>,
    /// For each segment, where each of its buffers (inputs, then outputs) lives.
    pub(crate) places: Vec<Vec<Place>>,
    /// What runs on every block, in order.
    pub(crate) steps: Vec<Step>,
    /// Scratch slots a block needs.
    pub(crate) slots: usize,
    /// The kernel's inputs (its pointers come first, then the outputs').
    pub(crate) inputs: usize,
}

/// Where the value of an instruction of the whole kernel can be had.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    /// An f32 input, read where it is.
    Input(usize),
    /// A constant, written again where it is needed.
    Const,
    /// Computed by segment `seg`; `slot` when later steps read it.
    Cheap { seg: usize, slot: Option<usize> },
    /// Computed by a wide op into a place.
    Wide(Place),
}

/// The wide-path plan of `kernel` at `tier`, or `None` when it compiles whole (see the
/// module docs for which kernels do not).
pub(crate) fn plan(kernel: &Kernel, tier: Tier) -> Option<BlockPlan> {
    let n = kernel.domain.numel();
    let dtype = kernel.body.first()?.dtype;
    // A contraction kernel is an element-wise one whose product is its last input,
    // filled before each range runs (see `support`): its epilogue takes blocks too.
    if n < HALF_BLOCKS_FROM
        || !kernel.reduce_axes.is_empty()
        || kernel.plan != Plan::Elementwise
        || !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        || kernel.outputs.iter().any(|b| b.len != n)
    {
        return None;
    }
    let half = dtype.is_half();
    // An f32 kernel may round what it stores into f16 or bf16 outputs (a matrix
    // product's epilogue `cast(x @ w, f16)`): a cast from f32 used by stores alone,
    // into outputs of its type. The cast is the store's conversion step.
    let narrowing = narrowing_casts(kernel, dtype)?;
    if n < BLOCKS_FROM && !half && !narrowing.iter().any(|&c| c) {
        return None;
    }
    // gelu's tail in f32 kernels: one wide step for the seven instructions.
    let (gelu, absorbed) = match (dtype, wide::gelu_fns(tier)) {
        (DType::F32, Some(fns)) => gelu_tails(kernel, fns),
        _ => (
            vec![None; kernel.body.len()],
            vec![false; kernel.body.len()],
        ),
    };
    let wide_op = |v: usize| match kernel.body[v].expr {
        _ if absorbed[v] => false,
        _ if gelu[v].is_some() => true,
        Expr::Unary(op, _) => wide::unary_fn(op, tier).is_some(),
        _ => false,
    };
    for (v, ins) in kernel.body.iter().enumerate() {
        // f32 inputs are read where they are, through any view (segments keep the
        // kernel's domain and views); half ones are widened block by block, so they
        // must be contiguous.
        let ok = narrowing[v]
            || ins.dtype == dtype
                && match &ins.expr {
                    Expr::Load { input, view } => {
                        kernel.inputs[*input].dtype == dtype
                            && view.shape == kernel.domain
                            && (!half || view.is_contiguous())
                    }
                    Expr::Const(_) | Expr::Unary(..) | Expr::Binary(..) => true,
                    _ => false,
                };
        if !ok {
            return None;
        }
    }
    let narrows = narrowing.iter().any(|&c| c);
    if !half && !narrows && !(0..kernel.body.len()).any(wide_op) {
        return None;
    }

    let body = &kernel.body;
    // The segment of each cheap instruction: the wide ops before it.
    let mut seg_of = vec![0usize; body.len()];
    let mut wides = 0;
    for (v, seg) in seg_of.iter_mut().enumerate() {
        *seg = wides;
        if wide_op(v) {
            wides += 1;
        }
    }
    let last = wides;
    // Who uses each value: instructions (by index) and stores.
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); body.len()];
    for (v, ins) in body.iter().enumerate() {
        for u in Kernel::operands(&ins.expr) {
            users[u.index()].push(v);
        }
    }
    let mut stored = vec![0usize; body.len()];
    for s in &kernel.stores {
        stored[s.value.index()] += 1;
    }

    let mut slots = 0;
    let mut new_slot = || {
        slots += 1;
        slots - 1
    };
    let mut steps = Vec::new();
    // Half inputs are widened once per block, into slots.
    let mut input_place: Vec<Option<Place>> = vec![None; kernel.inputs.len()];
    for ins in body {
        if let Expr::Load { input, .. } = ins.expr {
            if input_place[input].is_none() {
                input_place[input] = Some(if half {
                    let slot = new_slot();
                    steps.push(Step::Load {
                        input,
                        slot,
                        dtype,
                        f: wide::load_fn(dtype, tier)?,
                    });
                    Place::Slot(slot)
                } else {
                    Place::Input(input)
                });
            }
        }
    }

    let mut source: Vec<Source> = Vec::with_capacity(body.len());
    for (v, ins) in body.iter().enumerate() {
        source.push(match ins.expr {
            Expr::Load { input, .. } => Source::Input(input),
            Expr::Const(_) => Source::Const,
            // Done by its store's conversion step, after the last segment.
            _ if narrowing[v] => Source::Cheap {
                seg: last,
                slot: None,
            },
            // Computed inside gelu's wide step, never held anywhere.
            _ if absorbed[v] => Source::Cheap {
                seg: seg_of[v],
                slot: None,
            },
            _ if wide_op(v) => {
                // Straight into an f32 output when that is all the value is for.
                let direct = !half && users[v].is_empty() && stored[v] == 1;
                let place = match kernel.stores.iter().find(|s| s.value.index() == v) {
                    Some(s) if direct => Place::Output(s.output),
                    _ => Place::Slot(new_slot()),
                };
                Source::Wide(place)
            }
            _ => {
                let seg = seg_of[v];
                let later = users[v].iter().any(|&u| wide_op(u) || seg_of[u] != seg)
                    || (stored[v] > 0 && seg != last);
                Source::Cheap {
                    seg,
                    slot: later.then(&mut new_slot),
                }
            }
        });
    }
    // The last segment stores the outputs; half outputs go through slots.
    let mut out_slot: Vec<Option<usize>> = vec![None; kernel.outputs.len()];
    for s in &kernel.stores {
        if kernel.outputs[s.output].dtype.is_half() {
            out_slot[s.output] = Some(new_slot());
        }
    }
    if slots > MAX_SLOTS {
        return None;
    }

    // Where a later step reads a value whole, block by block: an f32 input only
    // through a contiguous view (a broadcast one is read by segments alone).
    let place_of = |u: ValueId| -> Option<Place> {
        match source[u.index()] {
            Source::Input(input) => match &body[u.index()].expr {
                Expr::Load { view, .. } if half || view.is_contiguous() => input_place[input],
                _ => None,
            },
            Source::Cheap { slot, .. } => slot.map(Place::Slot),
            Source::Wide(p) => Some(p),
            Source::Const => None,
        }
    };

    let mut segments = Vec::new();
    let mut places = Vec::new();
    let mut wide_seen = 0;
    let mut emit_segment = |seg: usize, steps: &mut Vec<Step>| -> Option<()> {
        let mut b = SegmentBuilder::new(kernel, seg, n);
        for (v, ins) in body.iter().enumerate() {
            if !narrowing[v]
                && !absorbed[v]
                && matches!(source[v], Source::Cheap { seg: s, .. } if s == seg)
            {
                let local = b.instr(v, ins, &source, &place_of)?;
                if let Source::Cheap {
                    slot: Some(slot), ..
                } = source[v]
                {
                    b.store(local, Place::Slot(slot));
                }
            }
        }
        if seg == last {
            for s in &kernel.stores {
                // A narrowing cast's operand goes to the slot its store converts.
                let v = match body[s.value.index()].expr {
                    Expr::Cast(x) if narrowing[s.value.index()] => x,
                    _ => s.value,
                };
                let direct_wide =
                    matches!(source[v.index()], Source::Wide(Place::Output(o)) if o == s.output);
                if direct_wide {
                    continue;
                }
                let local = b.value(v, &source, &place_of)?;
                let place = match out_slot[s.output] {
                    Some(slot) => Place::Slot(slot),
                    None => Place::Output(s.output),
                };
                b.store(local, place);
            }
        }
        if let Some((k, p)) = b.finish() {
            if p.len() > MAX_SEGMENT_PTRS {
                return None;
            }
            steps.push(Step::Segment {
                index: segments.len(),
            });
            segments.push(k);
            places.push(p);
        }
        Some(())
    };
    for (v, ins) in body.iter().enumerate() {
        if !wide_op(v) {
            continue;
        }
        emit_segment(wide_seen, &mut steps)?;
        wide_seen += 1;
        let Source::Wide(dst) = source[v] else {
            unreachable!("a wide op's value is Wide")
        };
        if let Some(g) = gelu[v] {
            steps.push(match g.bias {
                Some(b) => Step::GeluSum {
                    src: place_of(b.p)?,
                    bias: b.input,
                    offset: b.offset,
                    row: *kernel.domain.dims().last()?,
                    dst,
                    c1: g.c1,
                    c2: g.c2,
                    f: b.f,
                },
                None => Step::Gelu {
                    src: place_of(g.x)?,
                    dst,
                    c1: g.c1,
                    c2: g.c2,
                    f: g.f,
                },
            });
        } else if let Expr::Unary(op, x) = ins.expr {
            // A constant operand has no place: compile whole (folding removes these).
            let src = place_of(x)?;
            let f = wide::unary_fn(op, tier)?;
            steps.push(Step::Unary { op, src, dst, f });
        }
    }
    emit_segment(last, &mut steps)?;
    for s in &kernel.stores {
        if let Some(slot) = out_slot[s.output] {
            let dtype = kernel.outputs[s.output].dtype;
            steps.push(Step::Store {
                slot,
                output: s.output,
                dtype,
                f: wide::store_fn(dtype, tier)?,
            });
        }
    }
    Some(BlockPlan {
        tier,
        segments,
        places,
        steps,
        slots,
        inputs: kernel.inputs.len(),
    })
}

/// gelu's tail in an f32 kernel: the final product `y`, with its operand `x` and
/// constants, of `y = x · sigmoid(c2 · (x + c1 · (x · square(x))))` as the passes
/// expand gelu (tanh's form).
#[derive(Clone, Copy, Debug)]
struct GeluTail {
    x: ValueId,
    c1: f32,
    c2: f32,
    f: GeluFn,
    /// Where `x` is itself `p + b` with a row-broadcast `b`, absorbed too.
    bias: Option<Bias>,
}

/// A gelu tail's operand `x = p + b` (a matrix product's bias, `gelu(x @ w + b)`):
/// `p` an f32 load through the contiguous view, `b` an f32 load of input `input`
/// broadcast over the rows of the domain (strides 0 but the last, which is 1), from
/// `offset`; `x` read by the tail alone.
#[derive(Clone, Copy, Debug)]
struct Bias {
    p: ValueId,
    input: usize,
    offset: isize,
    f: GeluSumFn,
}

/// The gelu tails of `kernel` (at each final product) and the instructions they
/// absorb: the square, the cube, the two products by constants, the sum and the
/// sigmoid, each read only by the next (operands in either order) and none stored;
/// also `x` where it is a bias added to a load ([`Bias`], run by `sum`, the routine
/// over `p + b`). The wide step computes them in registers, each operation as the
/// kernel's own instruction does (IEEE products and sums are commutative, bit for bit).
fn gelu_tails(
    kernel: &Kernel,
    (f, sum): (GeluFn, GeluSumFn),
) -> (Vec<Option<GeluTail>>, Vec<bool>) {
    let body = &kernel.body;
    let n = body.len();
    let mut users = vec![0usize; n];
    for ins in body {
        for u in Kernel::operands(&ins.expr) {
            users[u.index()] += 1;
        }
    }
    let mut stored = vec![false; n];
    for s in &kernel.stores {
        stored[s.value.index()] = true; // never absorbed
    }
    let only = |v: ValueId| {
        users[v.index()] == 1 && !stored[v.index()] && body[v.index()].dtype == DType::F32
    };
    let constant = |v: ValueId| match body[v.index()].expr {
        Expr::Const(ndfuse_ir::Scalar::F(c)) => Some(c as f32),
        _ => None,
    };
    // `a op b` with one side `want` (or a constant when `want` is None): the other.
    let other = |a: ValueId, b: ValueId, want: ValueId| {
        if a == want {
            Some(b)
        } else if b == want {
            Some(a)
        } else {
            None
        }
    };
    let by_const = |a: ValueId, b: ValueId| match (constant(a), constant(b)) {
        (None, Some(c)) => Some((a, c)),
        (Some(c), None) => Some((b, c)),
        _ => None,
    };
    let mut tails = vec![None; n];
    let mut absorbed = vec![false; n];
    for (y, ins) in body.iter().enumerate() {
        let Expr::Binary(BinaryOp::Mul, a, b) = ins.expr else {
            continue;
        };
        let found = (|| {
            // y = x · s, s = sigmoid(z)
            let (x, s) = [(a, b), (b, a)].into_iter().find(|&(_, s)| {
                matches!(body[s.index()].expr, Expr::Unary(UnaryOp::Sigmoid, _)) && only(s)
            })?;
            let Expr::Unary(_, z) = body[s.index()].expr else {
                return None;
            };
            // z = inner · c2
            let Expr::Binary(BinaryOp::Mul, za, zb) = body[z.index()].expr else {
                return None;
            };
            let (inner, c2) = by_const(za, zb).filter(|_| only(z))?;
            // inner = x + t
            let Expr::Binary(BinaryOp::Add, ia, ib) = body[inner.index()].expr else {
                return None;
            };
            let t = other(ia, ib, x).filter(|_| only(inner))?;
            // t = cube · c1
            let Expr::Binary(BinaryOp::Mul, ta, tb) = body[t.index()].expr else {
                return None;
            };
            let (cube, c1) = by_const(ta, tb).filter(|_| only(t))?;
            // cube = x · sq, sq = square(x)
            let Expr::Binary(BinaryOp::Mul, ca, cb) = body[cube.index()].expr else {
                return None;
            };
            let sq = other(ca, cb, x).filter(|_| only(cube))?;
            let ok = only(sq)
                && matches!(body[sq.index()].expr, Expr::Unary(UnaryOp::Square, o) if o == x);
            ok.then_some((x, c1, c2, [sq, cube, t, inner, z, s]))
        })();
        if let Some((x, c1, c2, parts)) = found {
            if parts.iter().any(|p| absorbed[p.index()]) || body[x.index()].dtype != DType::F32 {
                continue;
            }
            for p in parts {
                absorbed[p.index()] = true;
            }
            // x is read four times by the tail (square, cube, sum, product).
            let bias = (users[x.index()] == 4 && !stored[x.index()] && !absorbed[x.index()])
                .then(|| bias_of(kernel, x, sum))
                .flatten();
            if bias.is_some() {
                absorbed[x.index()] = true;
            }
            tails[y] = Some(GeluTail { x, c1, c2, f, bias });
        }
    }
    (tails, absorbed)
}

/// `x` as a [`Bias`] added to a load, when it is one.
fn bias_of(kernel: &Kernel, x: ValueId, f: GeluSumFn) -> Option<Bias> {
    let body = &kernel.body;
    let Expr::Binary(BinaryOp::Add, u, w) = body[x.index()].expr else {
        return None;
    };
    let load = |v: ValueId| match &body[v.index()].expr {
        Expr::Load { input, view }
            if body[v.index()].dtype == DType::F32 && view.shape == kernel.domain =>
        {
            Some((*input, view))
        }
        _ => None,
    };
    let row = |v: ValueId| {
        let (input, view) = load(v)?;
        let r = view.strides.len();
        let broadcast =
            r >= 2 && view.strides[r - 1] == 1 && view.strides[..r - 1].iter().all(|&s| s == 0);
        broadcast.then_some((input, view.offset))
    };
    [(u, w), (w, u)].into_iter().find_map(|(p, b)| {
        load(p).filter(|(_, view)| view.is_contiguous())?;
        let (input, offset) = row(b)?;
        Some(Bias {
            p,
            input,
            offset,
            f,
        })
    })
}

/// For each instruction of `kernel` (whose values are of `dtype`), whether it is a
/// narrowing cast the blocks path does as a store's conversion: `dtype` is f32, the
/// cast rounds an f32 value to f16 or bf16, and its only users are stores into outputs
/// of that type. `None` when an output is of another type than `dtype` and not fed
/// by such casts alone (the kernel compiles whole).
fn narrowing_casts(kernel: &Kernel, dtype: DType) -> Option<Vec<bool>> {
    let body = &kernel.body;
    let mut narrowing: Vec<bool> = body
        .iter()
        .map(|ins| {
            dtype == DType::F32
                && ins.dtype.is_half()
                && matches!(ins.expr, Expr::Cast(x) if body[x.index()].dtype == DType::F32)
        })
        .collect();
    for ins in body {
        for u in Kernel::operands(&ins.expr) {
            narrowing[u.index()] = false;
        }
    }
    for s in &kernel.stores {
        let out = kernel.outputs[s.output].dtype;
        let v = s.value.index();
        if narrowing[v] && body[v].dtype != out {
            narrowing[v] = false;
        }
    }
    // Every output of another type than the kernel's is fed by narrowing casts only.
    let ok = kernel
        .stores
        .iter()
        .all(|s| kernel.outputs[s.output].dtype == dtype || narrowing[s.value.index()])
        && kernel
            .outputs
            .iter()
            .enumerate()
            .all(|(o, b)| b.dtype == dtype || kernel.stores.iter().any(|s| s.output == o));
    ok.then_some(narrowing)
}

/// One segment under construction: a 1-d f32 element-wise kernel.
struct SegmentBuilder<'k> {
    kernel: &'k Kernel,
    n: usize,
    k: Kernel,
    /// Where each input and output buffer of the segment lives.
    inputs: Vec<Place>,
    outputs: Vec<Place>,
    /// The segment's value of each instruction of the whole kernel, once emitted.
    local: Vec<Option<ValueId>>,
}

impl<'k> SegmentBuilder<'k> {
    fn new(kernel: &'k Kernel, seg: usize, n: usize) -> Self {
        let domain = kernel.domain.clone();
        SegmentBuilder {
            kernel,
            n,
            k: Kernel {
                name: format!("{}_seg{seg}", kernel.name),
                domain,
                inputs: Vec::new(),
                outputs: Vec::new(),
                body: Vec::new(),
                stores: Vec::new(),
                reduce_axes: Vec::new(),
                plan: Plan::Elementwise,
                plan_reason: kernel.plan_reason.clone(),
                contraction: None,
            },
            inputs: Vec::new(),
            outputs: Vec::new(),
            local: vec![None; kernel.body.len()],
        }
    }

    fn push(&mut self, expr: Expr) -> ValueId {
        self.k.body.push(Instr {
            dtype: DType::F32,
            expr,
        });
        ValueId(self.k.body.len() as u32 - 1)
    }

    /// A load of the buffer at `place` (one input of the segment per place) through
    /// `view`, or the contiguous view when `None`.
    fn load(&mut self, place: Place, view: Option<&View>) -> ValueId {
        let input = match self.inputs.iter().position(|&p| p == place) {
            Some(i) => i,
            None => {
                self.inputs.push(place);
                let len = match place {
                    Place::Input(k) => self.kernel.inputs[k].len,
                    _ => self.n,
                };
                self.k.inputs.push(Buffer {
                    dtype: DType::F32,
                    len,
                });
                self.inputs.len() - 1
            }
        };
        let view = view
            .cloned()
            .unwrap_or_else(|| View::contiguous(self.k.domain.clone()));
        self.push(Expr::Load { input, view })
    }

    /// The segment's value of instruction `v` of the whole kernel: computed here,
    /// loaded from where an earlier step put it, or a constant written again.
    fn value(
        &mut self,
        v: ValueId,
        source: &[Source],
        place_of: &dyn Fn(ValueId) -> Option<Place>,
    ) -> Option<ValueId> {
        if let Some(l) = self.local[v.index()] {
            return Some(l);
        }
        let l = match (&self.kernel.body[v.index()].expr, source[v.index()]) {
            (Expr::Const(c), _) => self.push(Expr::Const(*c)),
            // An f32 input through its own view; a half one from its widened slot.
            (Expr::Load { input, view }, Source::Input(_))
                if !self.kernel.body[0].dtype.is_half() =>
            {
                self.load(Place::Input(*input), Some(view))
            }
            (Expr::Load { input, .. }, Source::Input(_)) => {
                let place = place_of(v).unwrap_or(Place::Input(*input));
                self.load(place, None)
            }
            _ => self.load(place_of(v)?, None),
        };
        self.local[v.index()] = Some(l);
        Some(l)
    }

    /// Emits cheap instruction `v` of the whole kernel.
    fn instr(
        &mut self,
        v: usize,
        ins: &Instr,
        source: &[Source],
        place_of: &dyn Fn(ValueId) -> Option<Place>,
    ) -> Option<ValueId> {
        let expr = match ins.expr {
            Expr::Unary(op, a) => Expr::Unary(op, self.value(a, source, place_of)?),
            Expr::Binary(op, a, b) => {
                let a = self.value(a, source, place_of)?;
                Expr::Binary(op, a, self.value(b, source, place_of)?)
            }
            _ => return None,
        };
        let l = self.push(expr);
        self.local[v] = Some(l);
        Some(l)
    }

    /// A store of `value` into the buffer at `place`.
    fn store(&mut self, value: ValueId, place: Place) {
        self.outputs.push(place);
        self.k.outputs.push(Buffer {
            dtype: DType::F32,
            len: self.n,
        });
        self.k.stores.push(Store {
            value,
            output: self.outputs.len() - 1,
        });
    }

    /// The segment and where its buffers live (inputs, then outputs), or `None` when
    /// it stores nothing.
    fn finish(self) -> Option<(Kernel, Vec<Place>)> {
        if self.k.stores.is_empty() {
            return None;
        }
        let places = self.inputs.into_iter().chain(self.outputs).collect();
        Some((self.k, places))
    }
}

/// The machine-level type of a segment's compiled function (the kernels' ABI).
pub(crate) type SegmentFn = unsafe extern "C" fn(ptrs: *const *mut u8, start: i64, end: i64);

/// Block-sized scratch, aligned to a cache line.
#[repr(C, align(64))]
struct Scratch([f32; BLOCK * MAX_SLOTS]);

/// Runs `plan` over positions `start..end`, block by block, with `entries[i]` the
/// compiled function of segment `i` and `ptrs` the kernel's buffers (inputs, then
/// outputs) as the kernel's own function would get them.
///
/// # Safety
/// `ptrs` must point to the kernel's buffers, each of the domain's length and its
/// dtype (inputs readable, outputs writable, outputs distinct from everything else
/// but an input that the body loads only at each position's own offset, when the
/// kernel has that one output: every step reading it, a segment, runs on a block
/// before the step that writes the block of the output, the last of the plan;
/// positions `start..end` of the outputs not touched by anyone else during the call); `start <= end <= numel`; `entries` must be the compiled segments of `plan`
/// (JIT code of 1-d f32 element-wise kernels over contiguous buffers, which touch only
/// positions `lo..hi` of each buffer for a call over `lo..hi`).
pub(crate) unsafe fn run(
    plan: &BlockPlan,
    entries: &[SegmentFn],
    ptrs: &[*mut u8],
    start: usize,
    end: usize,
) {
    // Only the plan's slots are zeroed (so nothing uninitialised is ever read), not the
    // whole array: zeroing its 24 KiB cost about 250 ns a call, as much as 400
    // positions of a bias + gelu epilogue, which every short call paid (small kernels,
    // and any caller that runs a kernel in short ranges).
    let mut scratch = std::mem::MaybeUninit::<Scratch>::uninit();
    let base = scratch.as_mut_ptr().cast::<f32>();
    // SAFETY: `plan.slots <= MAX_SLOTS` (`plan` refuses more), so the first
    // `plan.slots * BLOCK` f32 lie inside the array, which `base` points to the start of
    // (`Scratch` is `repr(C)` around the array); zero bits are a valid f32.
    unsafe { base.write_bytes(0, plan.slots * BLOCK) };
    let slot = |j: usize| base.wrapping_add(j * BLOCK);
    // Without slots no step reads what another wrote (a value read later is held in a
    // slot), so the whole range is one block: no per-block round of the steps.
    let block = if plan.slots == 0 { end - start } else { BLOCK };
    let mut b = start;
    while b < end {
        let e = (b + block).min(end);
        let len = e - b;
        // Where a place is at position b (f32 everywhere but the half buffers of
        // Load and Store steps, which are 2-byte elements).
        let at = |p: Place| -> *mut f32 {
            match p {
                Place::Input(k) => ptrs[k].cast::<f32>().wrapping_add(b),
                Place::Output(k) => ptrs[plan.inputs + k].cast::<f32>().wrapping_add(b),
                Place::Slot(j) => slot(j),
            }
        };
        for step in &plan.steps {
            match *step {
                Step::Load {
                    input, slot: j, f, ..
                } => {
                    let src = ptrs[input].cast::<u16>().wrapping_add(b).cast::<u8>();
                    // SAFETY: input `input` holds `numel` 2-byte elements and
                    // `b + len = e <= numel`; slot `j` holds BLOCK >= len f32 (a plan
                    // with slots runs blocks of BLOCK).
                    unsafe { f(src, slot(j), len) };
                }
                Step::Store {
                    slot: j, output, f, ..
                } => {
                    let dst = ptrs[plan.inputs + output]
                        .cast::<u16>()
                        .wrapping_add(b)
                        .cast::<u8>();
                    // SAFETY: output `output` holds `numel` 2-byte elements, positions
                    // `b..e` are this call's; slot `j` holds `len` f32 written by the
                    // last segment of this block.
                    unsafe { f(slot(j), dst, len) };
                }
                Step::Unary { src, dst, f, .. } => {
                    // SAFETY: each place holds `len` f32 from its pointer: a slot of
                    // BLOCK, or positions `b..e` of an f32 buffer of `numel`; `dst` is an
                    // output or a slot of its own, never the source's memory unless the
                    // same place.
                    unsafe { f(at(src), at(dst), len) };
                }
                Step::Gelu {
                    src,
                    dst,
                    c1,
                    c2,
                    f,
                } => {
                    // SAFETY: as for `Step::Unary`: `len` f32 at each place, `dst` the
                    // source's memory only when the same place.
                    unsafe { f(at(src), at(dst), len, c1, c2) };
                }
                Step::GeluSum {
                    src,
                    bias,
                    offset,
                    row,
                    dst,
                    c1,
                    c2,
                    f,
                } => {
                    let (s, d) = (at(src), at(dst));
                    let b0 = ptrs[bias].cast::<f32>().wrapping_offset(offset);
                    // One call per run of the block inside a row of the domain, whose
                    // bias is `b0[col..col + run]`.
                    let mut i = 0;
                    while i < len {
                        let col = (b + i) % row;
                        let run = (row - col).min(len - i);
                        // SAFETY: as for `Step::Gelu`, over positions `b + i ..
                        // b + i + run` of the block; the bias load's view (offset +
                        // col, unit stride over the row) reads `b0[col..col + run]`,
                        // inside its input for every position (`supports` proved each
                        // load in bounds).
                        unsafe {
                            f(
                                s.wrapping_add(i),
                                b0.wrapping_add(col),
                                d.wrapping_add(i),
                                run,
                                c1,
                                c2,
                            )
                        };
                        i += run;
                    }
                }
                Step::Segment { index } => {
                    let places = &plan.places[index];
                    let mut seg_ptrs = [std::ptr::null_mut::<u8>(); MAX_SEGMENT_PTRS];
                    for (q, &p) in seg_ptrs.iter_mut().zip(places) {
                        *q = match p {
                            Place::Input(k) => ptrs[k],
                            Place::Output(k) => ptrs[plan.inputs + k],
                            // Moved back by b, so that position i (b <= i < e) is
                            // element i - b of the slot.
                            Place::Slot(j) => slot(j).wrapping_sub(b).cast(),
                        };
                    }
                    // SAFETY: the segment is a 1-d f32 element-wise kernel over
                    // contiguous buffers: its code touches only positions `b..e` of
                    // each pointer. Kernel buffers are f32 of `numel >= e` elements;
                    // a slot pointer moved back by `b` reaches, at positions `b..e`,
                    // its `len <= BLOCK` elements (a plan with slots runs blocks of
                    // BLOCK).
                    unsafe { entries[index](seg_ptrs.as_ptr(), b as i64, e as i64) };
                }
            }
        }
        b = e;
    }
}

impl BlockPlan {
    /// The steps as comment lines for the kernel's Cranelift text (`; block: ...`).
    pub(crate) fn describe(&self) -> String {
        let place = |p: Place| match p {
            Place::Input(k) => format!("in{k}"),
            Place::Output(k) => format!("out{k}"),
            Place::Slot(j) => format!("s{j}"),
        };
        let mut text = format!(
            "; blocks of {BLOCK} positions, {} slots, wide routines {}:\n",
            self.slots,
            self.tier.name()
        );
        for step in &self.steps {
            let line = match *step {
                Step::Load {
                    input, slot, dtype, ..
                } => format!("load {dtype} in{input} -> s{slot}"),
                Step::Segment { index } => {
                    let places: Vec<String> =
                        self.places[index].iter().map(|&p| place(p)).collect();
                    let ins = self.segments[index].inputs.len();
                    format!(
                        "segment {index} ({}) -> {}",
                        places[..ins].join(", "),
                        places[ins..].join(", ")
                    )
                }
                Step::Unary { op, src, dst, .. } => {
                    format!("{} {} -> {}", op.name(), place(src), place(dst))
                }
                Step::Gelu {
                    src, dst, c1, c2, ..
                } => format!(
                    "gelu x * sigmoid({c2:e} * (x + {c1:e} * x^3)) {} -> {}",
                    place(src),
                    place(dst)
                ),
                Step::GeluSum {
                    src,
                    bias,
                    offset,
                    row,
                    dst,
                    c1,
                    c2,
                    ..
                } => format!(
                    "gelu x * sigmoid({c2:e} * (x + {c1:e} * x^3)), x = {} + in{bias}[{offset} + position % {row}] -> {}",
                    place(src),
                    place(dst)
                ),
                Step::Store {
                    slot,
                    output,
                    dtype,
                    ..
                } => format!("store {dtype} s{slot} -> out{output}"),
            };
            text.push_str(&format!(";   {line}\n"));
        }
        text
    }
}
