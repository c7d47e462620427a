//! The routines: graph nodes that are not element-wise and run as steps of their own
//! (`Step::Interp`), rendered as CUDA C of their own. Each works on the `[outer, n,
//! inner]` decomposition of its operand around the axis (a *lane* is one `(outer,
//! inner)` pair: the `n` elements `inner` apart), like the CPU runtime's routines
//! (`runtime/src/routines.rs`), and gives the same bits on every run and grid size.
//!
//! - **scatter_add**: `NAME_copy` copies `x` to the output (or, for f16/bf16, to an f32
//!   accumulator in the scratch buffer); `NAME_add` walks each lane's indices with one
//!   thread, in increasing position, adding `v` (no atomics: deterministic); for half
//!   types `NAME_round` rounds the accumulator into the output once. An index outside
//!   `-n..n` is skipped (the runtime checks them on the host first and reports it).
//! - **cumsum / cumprod**: lanes of at most [`SCAN_SHORT`] positions, or many lanes side
//!   by side (inner of a warp or more), run one thread per lane, sequentially along the
//!   axis. Other lanes run one block per lane: the axis in chunks of [`SCAN_CHUNK`]
//!   positions in scan order, each chunk [`SCAN_SLOTS`] slots of four positions; the
//!   slots' totals are scanned in shared memory (Hillis-Steele, a fixed tree), and each
//!   slot then runs sequentially from the carry of the chunks before it combined with
//!   the slots before it. The tree depends on the constants only, never on the block or
//!   grid size. Floats accumulate in their own type, halves in f32 (rounded at each
//!   store), integers in i64, wrapping.
//! - **argsort**: one block per lane; the lane's (key, position) pairs are sorted in
//!   shared memory by a bitonic network, padded to a power of two with pairs that sort
//!   last. Keys are order-preserving unsigned integers (floats: `-0` as `+0`, every NaN
//!   above `+inf`; descending: the keys' complement), ties broken by position, so the
//!   sort is the stable one. Rows longer than [`ARGSORT_MAX_ROW`] get no kernel
//!   ([`RoutineCode::Host`]): the runtime sorts them on the host.
//! - **attention / attention_backward**: FlashAttention's streaming softmax, a thread
//!   per query (or key) row, tiles staged through shared memory (`emit/attention.rs`,
//!   the gradient's launches in `emit/attention_backward.rs`).
//!   Heads wider than [`ATTENTION_MAX_HEAD_DIM`](crate::ATTENTION_MAX_HEAD_DIM) get no kernel.

use super::attention;
use super::launch::{CudaKernel, CudaOptions, Launch};
use crate::scalar;
use crate::CudaError;
use ndfuse_ir::{DType, Node, Op, ScanOp, TensorType};
use std::fmt::Write as _;

/// Scan lanes this short run one thread per lane.
pub const SCAN_SHORT: usize = 64;
/// Slots of a scan chunk (the width of the shared-memory tree).
pub const SCAN_SLOTS: usize = 256;
/// Positions of a scan chunk: [`SCAN_SLOTS`] slots of four.
pub const SCAN_CHUNK: usize = SCAN_SLOTS * 4;
/// Longest argsort row sorted on the device (in shared memory).
pub const ARGSORT_MAX_ROW: usize = 2048;

/// What runs a routine node on a CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoutineCode {
    /// An emitted kernel. Its functions take the operands' pointers (in slot order), the
    /// output's pointer, then (when `scratch_bytes > 0`) the scratch buffer's. No
    /// launches when the output is empty.
    Kernel(CudaKernel),
    /// No kernel for this node; why (the node runs on the host).
    Host(String),
}

/// Renders routine `node` (scatter-add, a scan, argsort, attention or its backward)
/// applied to operands of types `operands` as CUDA C; [`RoutineCode::Host`] for any other
/// op, for argsort rows longer than [`ARGSORT_MAX_ROW`] and for attention heads wider than
/// [`ATTENTION_MAX_HEAD_DIM`](crate::ATTENTION_MAX_HEAD_DIM). The text depends only on the node, the operand types and
/// `opts`.
///
/// ```
/// use ndfuse_codegen_cuda::{emit_routine, CudaOptions, RoutineCode};
/// use ndfuse_ir::{DType, Graph, Op, ScanOp, Shape};
/// let mut g = Graph::new();
/// let x = g.add_input("x", DType::F32, Shape::new([8, 1000]));
/// let s = g.add(Op::Scan { op: ScanOp::Sum, axis: 1, reverse: false }, &[x]).unwrap();
/// let code = emit_routine(g.node(s), &[g.ty(x)], &CudaOptions::default()).unwrap();
/// let RoutineCode::Kernel(k) = code else { panic!("a scan has a kernel") };
/// assert_eq!(k.name, "cumsum_f32");
/// assert_eq!(k.launches.len(), 1);
/// ```
pub fn emit_routine(
    node: &Node,
    operands: &[TensorType],
    opts: &CudaOptions,
) -> Result<RoutineCode, CudaError> {
    if !matches!(
        node.op,
        Op::ScatterAdd { .. }
            | Op::Scan { .. }
            | Op::Argsort { .. }
            | Op::Attention(_)
            | Op::AttentionBackward(_)
    ) {
        return Ok(RoutineCode::Host(format!(
            "{} has no CUDA routine",
            node.op.name()
        )));
    }
    let invalid = |problems: String| CudaError::Invalid {
        kernel: node.op.name().to_string(),
        problems,
    };
    match ndfuse_ir::infer(&node.op, operands) {
        Ok(t) if t.dtype == node.dtype && t.shape == node.shape => {}
        Ok(t) => {
            return Err(invalid(format!(
                "the operands give {} {}, the node says {} {}",
                t.dtype, t.shape, node.dtype, node.shape
            )))
        }
        Err(e) => return Err(invalid(e.to_string())),
    }
    let block = threads(opts, 256);
    let r = match (&node.op, operands) {
        (Op::ScatterAdd { axis }, [x, idx, _]) => scatter_add(x, idx, *axis, block, opts),
        (Op::Scan { op, axis, reverse }, [x]) => scan(*op, x, *axis, *reverse, block, opts),
        (
            Op::Argsort {
                axis,
                descending,
                k,
            },
            [x],
        ) => {
            let (_, n, _) = split_at(x, *axis);
            if n > ARGSORT_MAX_ROW {
                return Ok(RoutineCode::Host(format!(
                    "argsort rows of {n} positions: the device sorts rows of up to {ARGSORT_MAX_ROW} in shared memory"
                )));
            }
            argsort(x, *axis, *descending, *k, opts)
        }
        (Op::Attention(spec), _) | (Op::AttentionBackward(spec), _) => {
            let backward = matches!(node.op, Op::AttentionBackward(_));
            match attention::plan(spec, backward, operands, opts) {
                Ok(a) if backward => a.backward_kernel(operands, opts),
                Ok(a) => a.forward_kernel(operands, opts),
                Err(why) => return Ok(RoutineCode::Host(why)),
            }
        }
        _ => return Err(invalid(format!("{} operands", operands.len()))),
    };
    Ok(RoutineCode::Kernel(r))
}

/// `(outer, n, inner)`: the extents before, at and after `axis`.
fn split_at(t: &TensorType, axis: usize) -> (usize, usize, usize) {
    let d = t.shape.dims();
    (
        d[..axis].iter().product(),
        d[axis],
        d[axis + 1..].iter().product(),
    )
}

/// Threads per block: `want`, within the options' limit (a power of two, 32 at least).
fn threads(opts: &CudaOptions, want: u32) -> u32 {
    let max = opts.max_block_size.clamp(32, 1024);
    let max = 1 << (31 - max.leading_zeros());
    want.clamp(32, max)
}

fn grid(opts: &CudaOptions, work: usize, per_block: usize) -> u32 {
    work.div_ceil(per_block.max(1))
        .clamp(1, opts.max_grid_size.max(1) as usize) as u32
}

/// The translation unit's head: what it is, the includes halves need, the index type.
fn head(name: &str, what: &str, strategy: &str, half: bool, wide: bool) -> String {
    let mut s = format!("// ndfuse routine {name}: {what}\n// {strategy}\n");
    if half {
        s.push_str("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
    }
    let _ = writeln!(
        s,
        "typedef {} nd_idx;",
        if wide { "long long" } else { "int" }
    );
    s
}

/// Whether some extent needs 64-bit offsets.
fn wide(lens: &[usize]) -> bool {
    lens.iter().any(|&l| l > (i32::MAX / 2) as usize)
}

/// `extern "C" __global__ void __launch_bounds__(T) NAME(params) {`.
fn open(src: &mut String, name: &str, threads: u32, params: &[String]) {
    let _ = writeln!(
        src,
        "\nextern \"C\" __global__ void __launch_bounds__({threads}) {name}({}) {{",
        params.join(", ")
    );
}

fn param_in(i: usize, d: DType) -> String {
    format!("const {}* __restrict__ in{i}", scalar::storage_type(d))
}

fn param_out(d: DType) -> String {
    format!("{}* __restrict__ out0", scalar::storage_type(d))
}

/// The first offset of lane `lane` (an `nd_idx` expression) of lanes `span` apart per
/// outer position and `inner` side by side.
fn lane_start(lane: &str, inner: usize, span: usize) -> String {
    if inner == 1 {
        format!("{lane} * {span}")
    } else {
        format!("({lane} / {inner}) * {span} + {lane} % {inner}")
    }
}

/// A grid-stride loop header over `0..count` threads.
const THREAD_LOOP: &str = "for (nd_idx t = (nd_idx)blockIdx.x * blockDim.x + threadIdx.x; t < COUNT; t += (nd_idx)gridDim.x * blockDim.x) {";
/// A grid-stride loop header over `0..count` blocks.
const BLOCK_LOOP: &str = "for (nd_idx l = blockIdx.x; l < COUNT; l += gridDim.x) {";

// ---------------------------------------------------------------------------------------
// Scatter-add.
// ---------------------------------------------------------------------------------------

fn scatter_add(
    x: &TensorType,
    idx: &TensorType,
    axis: usize,
    block: u32,
    opts: &CudaOptions,
) -> CudaKernel {
    let (outer, n, inner) = split_at(x, axis);
    let m = idx.shape.dims()[axis];
    let d = x.dtype;
    let half = scalar::is_half(d);
    let name = format!("scatter_add_{d}");
    let total = outer * n * inner;
    let lanes = outer * inner;
    let strategy = format!(
        "copy, then one thread per lane of {m} indices into {n} positions{}",
        if half { ", in f32, rounded once" } else { "" }
    );
    let mut src = head(
        &name,
        &format!(
            "scatter_add along axis {axis} of {} into {}",
            idx.shape, x.shape
        ),
        &strategy,
        half,
        wide(&[total, outer * m * inner]),
    );
    let mut params = vec![
        param_in(0, d),
        param_in(1, idx.dtype),
        param_in(2, d),
        param_out(d),
    ];
    // Halves accumulate in f32 in the scratch buffer; others in the output itself.
    let (acc, scratch_bytes) = if half {
        params.push("unsigned char* __restrict__ scratch".into());
        ("((float*)scratch)", total * 4)
    } else {
        ("out0", 0)
    };
    let mut launches = Vec::new();
    if total == 0 {
        return finish(name, src, launches, scratch_bytes, strategy, half);
    }
    let f = format!("{name}_copy");
    open(&mut src, &f, block, &params);
    let _ = writeln!(
        src,
        "  {}\n    {acc}[t] = {};\n  }}\n}}",
        THREAD_LOOP.replace("COUNT", &total.to_string()),
        scalar::load_conv(d, "in0[t]")
    );
    launches.push(Launch {
        function: f,
        grid: grid(opts, total, block as usize),
        block: (block, 1),
    });
    if m > 0 {
        let add = match d {
            DType::I32 => format!("(int)((unsigned){acc}[o] + (unsigned)in2[s])"),
            DType::I64 => {
                format!("(long long)((unsigned long long){acc}[o] + (unsigned long long)in2[s])")
            }
            _ => format!("{acc}[o] + {}", scalar::load_conv(d, "in2[s]")),
        };
        let f = format!("{name}_add");
        open(&mut src, &f, block, &params);
        let _ = writeln!(
            src,
            "  // One thread per lane, its indices in increasing position: no two threads\n  \
             // touch one element, and each element's additions come in one order.\n  \
             {}\n    \
             const nd_idx x0 = {x0};\n    \
             const nd_idx i0 = {i0};\n    \
             for (nd_idx j = 0; j < {m}; ++j) {{\n      \
             const nd_idx s = i0 + j * {inner};\n      \
             long long k = (long long)in1[s];\n      \
             k = k < 0 ? k + {n} : k;\n      \
             // Checked on the host before the launch; never written out of bounds.\n      \
             if (k < 0 || k >= {n}) continue;\n      \
             const nd_idx o = x0 + (nd_idx)k * {inner};\n      \
             {acc}[o] = {add};\n    \
             }}\n  }}\n}}",
            THREAD_LOOP.replace("COUNT", &lanes.to_string()),
            x0 = lane_start("t", inner, n * inner),
            i0 = lane_start("t", inner, m * inner),
        );
        launches.push(Launch {
            function: f,
            grid: grid(opts, lanes, block as usize),
            block: (block, 1),
        });
    }
    if half {
        let f = format!("{name}_round");
        open(&mut src, &f, block, &params);
        let _ = writeln!(
            src,
            "  {}\n    out0[t] = {};\n  }}\n}}",
            THREAD_LOOP.replace("COUNT", &total.to_string()),
            scalar::store_conv(d, &format!("{acc}[t]"))
        );
        launches.push(Launch {
            function: f,
            grid: grid(opts, total, block as usize),
            block: (block, 1),
        });
    }
    finish(name, src, launches, scratch_bytes, strategy, half)
}

fn finish(
    name: String,
    source: String,
    launches: Vec<Launch>,
    scratch_bytes: usize,
    strategy: String,
    uses_half: bool,
) -> CudaKernel {
    CudaKernel {
        name,
        source,
        launches,
        scratch_bytes,
        strategy,
        uses_half,
    }
}

// ---------------------------------------------------------------------------------------
// Scans.
// ---------------------------------------------------------------------------------------

fn scan(
    op: ScanOp,
    x: &TensorType,
    axis: usize,
    reverse: bool,
    block: u32,
    opts: &CudaOptions,
) -> CudaKernel {
    let (outer, n, inner) = split_at(x, axis);
    let d = x.dtype;
    let out = if d.is_int() { DType::I64 } else { d };
    let half = scalar::is_half(d);
    let name = format!("{}_{d}", op.name());
    let lanes = outer * inner;
    let total = outer * n * inner;
    // The accumulator's type, identity, and combine of `a` and `b`.
    let acc = scalar::compute_type(out);
    let id = match (op, out) {
        (ScanOp::Sum, DType::I64) => "0LL",
        (ScanOp::Prod, DType::I64) => "1LL",
        (ScanOp::Sum, DType::F64) => "0.0",
        (ScanOp::Prod, DType::F64) => "1.0",
        (ScanOp::Sum, _) => "0.0f",
        (ScanOp::Prod, _) => "1.0f",
    };
    let sign = match op {
        ScanOp::Sum => "+",
        ScanOp::Prod => "*",
    };
    let combine = |a: &str, b: &str| -> String {
        if out == DType::I64 {
            format!("(long long)((unsigned long long)({a}) {sign} (unsigned long long)({b}))")
        } else {
            format!("{a} {sign} {b}")
        }
    };
    let load = |p: &str| -> String {
        let v = scalar::load_conv(d, &format!("in0[{p}]"));
        if d == DType::I32 {
            format!("(long long){v}")
        } else {
            v
        }
    };
    let store = |a: &str| scalar::store_conv(out, a);
    let thread_per_lane = n <= SCAN_SHORT || (inner >= 32 && lanes >= 1024);
    let strategy = if thread_per_lane {
        format!("one thread per lane of {n}, sequential")
    } else {
        format!(
            "one block per lane of {n}: chunks of {SCAN_CHUNK} (slots of 4, a {SCAN_SLOTS}-wide tree), carried"
        )
    };
    let mut src = head(
        &name,
        &format!(
            "{}{} along axis {axis} of {}",
            if reverse { "reverse " } else { "" },
            op.name(),
            x.shape
        ),
        &strategy,
        half,
        wide(&[total]),
    );
    let params = [param_in(0, d), param_out(out)];
    let mut launches = Vec::new();
    if total == 0 {
        return finish(name, src, launches, 0, strategy, half);
    }
    // Position q (in scan order) of the lane starting at `base`.
    let pos = |q: &str| -> String {
        let j = if reverse {
            format!("({} - {q})", n - 1)
        } else {
            q.to_string()
        };
        if inner == 1 {
            format!("base + {j}")
        } else {
            format!("base + {j} * {inner}")
        }
    };
    let base = format!(
        "const nd_idx base = {};",
        lane_start(if thread_per_lane { "t" } else { "l" }, inner, n * inner)
    );
    if thread_per_lane {
        open(&mut src, &name, block, &params);
        let _ = writeln!(
            src,
            "  {}\n    {base}\n    {acc} acc = {id};\n    for (nd_idx q = 0; q < {n}; ++q) {{\n      \
             const nd_idx p = {};\n      acc = {};\n      out0[p] = {};\n    }}\n  }}\n}}",
            THREAD_LOOP.replace("COUNT", &lanes.to_string()),
            pos("q"),
            combine("acc", &load("p")),
            store("acc"),
        );
        launches.push(Launch {
            function: name.clone(),
            grid: grid(opts, lanes, block as usize),
            block: (block, 1),
        });
    } else {
        open(&mut src, &name, block, &params);
        let _ = writeln!(
            src,
            "  __shared__ {acc} nd_a[{SCAN_SLOTS}];\n  __shared__ {acc} nd_b[{SCAN_SLOTS}];\n  \
             {}\n    {base}\n    {acc} carry = {id};\n    \
             for (nd_idx c0 = 0; c0 < {n}; c0 += {SCAN_CHUNK}) {{\n      \
             // Each slot's total (four positions in scan order).\n      \
             for (int s = threadIdx.x; s < {SCAN_SLOTS}; s += blockDim.x) {{\n        \
             {acc} tot = {id};\n        \
             for (int e = 0; e < 4; ++e) {{\n          \
             const nd_idx q = c0 + s * 4 + e;\n          \
             if (q < {n}) tot = {};\n        }}\n        \
             nd_a[s] = tot;\n      }}\n      __syncthreads();\n      \
             // Inclusive scan of the slots' totals: a fixed tree, whatever the block size.\n      \
             {acc}* src = nd_a;\n      {acc}* dst = nd_b;\n      \
             for (int w = 1; w < {SCAN_SLOTS}; w <<= 1) {{\n        \
             for (int s = threadIdx.x; s < {SCAN_SLOTS}; s += blockDim.x)\n          \
             dst[s] = s >= w ? {} : src[s];\n        \
             __syncthreads();\n        {acc}* tmp = src; src = dst; dst = tmp;\n      }}\n      \
             // Each slot from the carry and the slots before it.\n      \
             for (int s = threadIdx.x; s < {SCAN_SLOTS}; s += blockDim.x) {{\n        \
             {acc} acc = s > 0 ? {} : carry;\n        \
             for (int e = 0; e < 4; ++e) {{\n          \
             const nd_idx q = c0 + s * 4 + e;\n          \
             if (q < {n}) {{\n            \
             const nd_idx p = {};\n            \
             acc = {};\n            \
             out0[p] = {};\n          }}\n        }}\n      }}\n      \
             carry = {};\n      \
             __syncthreads();\n    }}\n  }}\n}}",
            BLOCK_LOOP.replace("COUNT", &lanes.to_string()),
            combine("tot", &load(&pos("q"))),
            combine("src[s - w]", "src[s]"),
            combine("carry", "src[s - 1]"),
            pos("q"),
            combine("acc", &load("p")),
            store("acc"),
            combine("carry", &format!("src[{}]", SCAN_SLOTS - 1)),
        );
        launches.push(Launch {
            function: name.clone(),
            grid: grid(opts, lanes, 1),
            block: (block, 1),
        });
    }
    finish(name, src, launches, 0, strategy, half)
}

// ---------------------------------------------------------------------------------------
// Argsort.
// ---------------------------------------------------------------------------------------

/// The order-preserving keys of floats (numpy's order: `-0` as `+0`, every NaN equal and
/// above `+inf`), by the sign-flip transform of their bits.
const KEY_F32: &str = "\
__device__ __forceinline__ unsigned nd_key_f32(float x) {
  if (isnan(x)) return 0xffffffffu;
  union { float f; unsigned u; } c;
  c.f = x == 0.0f ? 0.0f : x;
  return c.u ^ ((unsigned)((int)c.u >> 31) | 0x80000000u);
}
";

/// [`KEY_F32`] for doubles.
const KEY_F64: &str = "\
__device__ __forceinline__ unsigned long long nd_key_f64(double x) {
  if (isnan(x)) return 0xffffffffffffffffull;
  union { double f; unsigned long long u; } c;
  c.f = x == 0.0 ? 0.0 : x;
  return c.u ^ ((unsigned long long)((long long)c.u >> 63) | 0x8000000000000000ull);
}
";

fn argsort(
    x: &TensorType,
    axis: usize,
    descending: bool,
    k: usize,
    opts: &CudaOptions,
) -> CudaKernel {
    let (outer, n, inner) = split_at(x, axis);
    let d = x.dtype;
    let half = scalar::is_half(d);
    let name = format!("argsort_{d}");
    let lanes = outer * inner;
    let p2 = n.max(1).next_power_of_two();
    let long_key = matches!(d, DType::F64 | DType::I64);
    let block = threads(opts, (p2 / 2) as u32);
    let strategy = format!(
        "one block per lane of {n}: bitonic sort of {p2} ({}-bit key, position) pairs in shared memory{}",
        if long_key { 64 } else { 32 },
        if k < n {
            format!(", first {k} kept")
        } else {
            String::new()
        }
    );
    let mut src = head(
        &name,
        &format!(
            "argsort{} along axis {axis} of {}, {k} kept",
            if descending { " descending" } else { "" },
            x.shape
        ),
        &strategy,
        half,
        wide(&[outer * n * inner]),
    );
    match d {
        DType::F16 | DType::BF16 | DType::F32 => src.push_str(KEY_F32),
        DType::F64 => src.push_str(KEY_F64),
        _ => {}
    }
    let params = [param_in(0, d), param_out(DType::I64)];
    let mut launches = Vec::new();
    if lanes * k == 0 {
        return finish(name, src, launches, 0, strategy, half);
    }
    let v = "in0[base + j * INNER]".replace("INNER", &inner.to_string());
    let key = match d {
        DType::F16 | DType::BF16 => format!("nd_key_f32({})", scalar::load_conv(d, &v)),
        DType::F32 => format!("nd_key_f32({v})"),
        DType::F64 => format!("nd_key_f64({v})"),
        DType::I32 => format!("((unsigned){v} ^ 0x80000000u)"),
        DType::I64 => format!("((unsigned long long){v} ^ 0x8000000000000000ull)"),
        DType::Bool => format!("(unsigned){v}"),
    };
    // Descending: the complement, so that values reverse and ties keep their order.
    let key = match (descending, long_key) {
        (false, _) => key,
        (true, false) => format!("({key} ^ 0xffffffffu)"),
        (true, true) => format!("({key} ^ 0xffffffffffffffffull)"),
    };
    open(&mut src, &name, block, &params);
    let lane = format!(
        "    const nd_idx base = {};\n    const nd_idx obase = {};\n",
        lane_start("l", inner, n * inner),
        lane_start("l", inner, k * inner)
    );
    // The pairs, the compare-and-swap of pairs a < b, and position j of the result.
    let (decl, fill, swap, read) = if long_key {
        (
            format!(
                "  __shared__ unsigned long long nd_keys[{p2}];\n  __shared__ int nd_pos[{p2}];\n"
            ),
            format!(
                "      nd_keys[j] = j < {n} ? {key} : 0xffffffffffffffffull;\n      nd_pos[j] = j;\n"
            ),
            "          const unsigned long long ka = nd_keys[a], kb = nd_keys[b];\n          \
             const int pa = nd_pos[a], pb = nd_pos[b];\n          \
             if ((ka > kb || (ka == kb && pa > pb)) == up) {\n            \
             nd_keys[a] = kb; nd_keys[b] = ka; nd_pos[a] = pb; nd_pos[b] = pa;\n          }\n"
                .to_string(),
            "(long long)nd_pos[j]",
        )
    } else {
        (
            format!("  // (key << 32) | position: integer order is the stable order.\n  __shared__ unsigned long long nd_items[{p2}];\n"),
            format!(
                "      nd_items[j] = ((unsigned long long)(j < {n} ? {key} : 0xffffffffu) << 32) | (unsigned)j;\n"
            ),
            "          const unsigned long long ia = nd_items[a], ib = nd_items[b];\n          \
             if ((ia > ib) == up) { nd_items[a] = ib; nd_items[b] = ia; }\n"
                .to_string(),
            "(long long)(nd_items[j] & 0xffffffffull)",
        )
    };
    let _ = writeln!(
        src,
        "{decl}  {}\n{lane}    \
         // Padding sorts last: the largest key, positions past the row's.\n    \
         for (int j = threadIdx.x; j < {p2}; j += blockDim.x) {{\n{fill}    }}\n    \
         __syncthreads();\n    \
         for (int size = 2; size <= {p2}; size <<= 1) {{\n      \
         for (int w = size >> 1; w > 0; w >>= 1) {{\n        \
         for (int t = threadIdx.x; t < {half_p}; t += blockDim.x) {{\n          \
         const int a = 2 * t - (t & (w - 1)), b = a + w;\n          \
         const bool up = (a & size) == 0;\n{swap}        }}\n        \
         __syncthreads();\n      }}\n    }}\n    \
         for (int j = threadIdx.x; j < {k}; j += blockDim.x) out0[obase + j * {inner}] = {read};\n    \
         __syncthreads();\n  }}\n}}",
        BLOCK_LOOP.replace("COUNT", &lanes.to_string()),
        half_p = p2 / 2,
    );
    launches.push(Launch {
        function: name.clone(),
        grid: grid(opts, lanes, 1),
        block: (block, 1),
    });
    finish(name, src, launches, 0, strategy, half)
}
