//! Fused attention as CUDA C ([`Op::Attention`](ndfuse_ir::Op::Attention) and
//! [`Op::AttentionBackward`](ndfuse_ir::Op::AttentionBackward)): FlashAttention's
//! algorithm on the SIMT cores, one thread per row, so the `[Tq, Tk]` scores never reach
//! memory and every output element is computed by one thread in a fixed order (no
//! atomics: the same bits on every run, grid and block size).
//!
//! - **Forward** (`attention_DT`): one block per `(batch, query head, tile of query
//!   rows)`, a thread per query row holding its q row and its `Dv` accumulator in
//!   registers. The keys and values the block's last row sees (causal limit, key length)
//!   are staged through shared memory in tiles of up to [`KEY_TILE`] rows (fewer for wide
//!   heads, so a tile stays within [`TILE_BYTES`]); each thread scores the tile's keys it
//!   sees, then the streaming softmax rescales its running sum and accumulator by
//!   `exp(m_old - m_new)` once per tile and adds `p v` (dropout's factor applied to `p`
//!   after the sum took it). A row that sees no key (or only `-inf` scores) stores zeros.
//! - **Backward** (FlashAttention-2's, without atomics), three launches on a scratch
//!   buffer of two values per query row:
//!   `_stats` recomputes each row's log-sum-exp `lse_i` (the forward's streaming max and
//!   sum; `+inf` for a row that sees no key, so its probabilities are 0) and
//!   `D_i = do_i . o_i`; `_dkv` gives a thread each key row of a key/value head, walking
//!   the query rows of every query head sharing it (heads, then rows, in increasing
//!   order) through shared memory, accumulating `dV_j += P_ij F_ij do_i` and
//!   `dK_j += dS_ij q_i` with `P_ij = exp(s_ij - lse_i)`,
//!   `dS_ij = P_ij (F_ij do_i . v_j - D_i) scale` (`F` the dropout factor); `_dq` gives a
//!   thread each query row again, its keys staged as in the forward, accumulating
//!   `dQ_i += dS_ij k_j`. The result is packed `[dq | dk | dv]`
//!   (`emit/attention_backward.rs`).
//!
//! Every layout of [`AttentionLayout`] reads its rows in place (`[B, H, T, D]`,
//! `[B, T, H, D]`, or the packed `qkv [B, T, (Hq + 2 Hkv) D]`, whose backward writes dq,
//! dk and dv where q, k and v are).
//!
//! f32, f16 and bf16 compute in f32 (halves converted on load, rounded once on store),
//! f64 in f64. Tile sizes depend only on the head dimensions and the dtype, never on the
//! launch shape, so the order of every sum is fixed by the node alone. Heads wider than
//! [`ATTENTION_MAX_HEAD_DIM`] get no kernel (the runtime runs them on the host).
//!
//! What is left: tensor cores (`mma`/`wmma` for `Q K^T` and `P V` on f16/bf16, as
//! FlashAttention-2 does: this is a correct SIMT design, not a fast one), register
//! tiling of several rows per thread, and splitting long key ranges across blocks for
//! few, long rows (decode steps).

use super::launch::{CudaKernel, CudaOptions, Launch};
use crate::scalar::{self, Helper};
use ndfuse_ir::{AttentionLayout, AttentionSpec, CausalMask, DType, Scalar, TensorType};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The widest head (`D` of q and k, `Dv` of v) the device routine takes: each thread
/// keeps a row of each in registers (local memory past the register file).
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;
/// Threads per block wanted: one query (or key) row each.
const ROWS: u32 = 64;
/// Most rows of a tile staged through shared memory.
pub(crate) const KEY_TILE: usize = 32;
/// Most bytes of shared memory the staged tiles take (under the 48 KiB of static shared
/// memory every device allows).
pub(crate) const TILE_BYTES: usize = 32 * 1024;

/// One attention node's extents, options and parameters.
pub(crate) struct Attn<'a> {
    pub(super) spec: &'a AttentionSpec,
    /// The gradient's kernels rather than the forward's.
    pub(super) backward: bool,
    /// One `qkv` operand ([`AttentionLayout::Packed`]) in place of q, k and v.
    pub(super) packed: bool,
    /// The operands' (and result's) dtype.
    pub(super) dt: DType,
    /// The type the arithmetic runs in: f64 for f64, else f32.
    pub(super) real: DType,
    pub(super) b: usize,
    pub(super) hq: usize,
    pub(super) hkv: usize,
    pub(super) tq: usize,
    pub(super) tk: usize,
    pub(super) d: usize,
    pub(super) dv: usize,
    /// The bias operand: its parameter number, dtype and its strides over
    /// `(b, h, i, j)` (0 along its broadcast extents).
    pub(super) bias: Option<(usize, DType, [usize; 4])>,
    /// The key lengths' parameter number.
    pub(super) lens: Option<usize>,
    /// The dropout key's parameter number.
    pub(super) key: Option<usize>,
    /// Threads per block (rows per block).
    pub(super) threads: u32,
    /// Rows per staged tile.
    pub(super) tile: usize,
}

/// Which tensor a row lives in: q, k, v (and their gradients), o (and the result), do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Q,
    K,
    V,
    O,
    DO,
}

impl Role {
    /// Whether the packed layout keeps this tensor's rows in its one `qkv` operand.
    fn packed(self) -> bool {
        matches!(self, Role::Q | Role::K | Role::V)
    }
}

/// The plan of an attention node (`backward`: of its gradient) applied to `operands`,
/// or why it has no kernel (heads wider than [`ATTENTION_MAX_HEAD_DIM`]); then
/// [`Attn::forward_kernel`] or `Attn::backward_kernel` (`attention_backward.rs`)
/// renders it. The operands were checked against the node by the caller.
pub(crate) fn plan<'a>(
    spec: &'a AttentionSpec,
    backward: bool,
    operands: &[TensorType],
    opts: &CudaOptions,
) -> Result<Attn<'a>, String> {
    let (b, hq, hkv, tq, tk, d, dv) = match spec.layout {
        AttentionLayout::Packed { q_heads, kv_heads } => {
            let e = operands[0].shape.dims();
            let d = e[2] / (q_heads + 2 * kv_heads);
            (e[0], q_heads, kv_heads, e[1], e[1], d, d)
        }
        layout => {
            let split = |t: &TensorType| layout.split(t.shape.dims());
            let (b, hq, tq, d) = split(&operands[0]);
            let (_, hkv, tk, _) = split(&operands[1]);
            (b, hq, hkv, tq, tk, d, split(&operands[2]).3)
        }
    };
    if d.max(dv) > ATTENTION_MAX_HEAD_DIM {
        return Err(format!(
            "attention heads of {d} and {dv} features: the device routine keeps rows of up to {ATTENTION_MAX_HEAD_DIM} in registers"
        ));
    }
    let dt = operands[0].dtype;
    let real = if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let tensors = spec.layout.tensors();
    let mut next = tensors + if backward { 2 } else { 0 };
    let mut take = |on: bool| {
        on.then(|| {
            next += 1;
            next - 1
        })
    };
    let bias = take(spec.bias).map(|p| {
        let bd = operands[p].shape.dims();
        let full = [b, hq, tq, tk];
        let mut strides = [0; 4];
        let mut s = 1;
        for a in (0..4).rev() {
            strides[a] = if bd[a] == 1 && full[a] != 1 { 0 } else { s };
            s *= bd[a];
        }
        (p, operands[p].dtype, strides)
    });
    let lens = take(spec.key_lengths);
    let key = take(spec.dropout.is_some());
    // Shared memory per staged row: k and v (forward, dq) or q and do plus two stats (dkv).
    let per_row = (d.max(1) + dv.max(1) + 2) * real.size_bytes();
    let a = Attn {
        spec,
        backward,
        packed: tensors == 1,
        dt,
        real,
        b,
        hq,
        hkv,
        tq,
        tk,
        d,
        dv,
        bias,
        lens,
        key,
        threads: threads(opts, ROWS),
        tile: (TILE_BYTES / per_row).clamp(1, KEY_TILE),
    };
    Ok(a)
}

/// Threads per block: `want`, within the options' limit (a power of two, 32 at least).
fn threads(opts: &CudaOptions, want: u32) -> u32 {
    let max = opts.max_block_size.clamp(32, 1024);
    let max = 1 << (31 - max.leading_zeros());
    want.clamp(32, max)
}

/// `extern "C" __global__ void __launch_bounds__(T) NAME(params) {`.
pub(super) fn open(src: &mut String, name: &str, threads: u32, params: &[String]) {
    let _ = writeln!(
        src,
        "\nextern \"C\" __global__ void __launch_bounds__({threads}) {name}({}) {{",
        params.join(", ")
    );
}

/// `for (int c = 0; c < n; ++c) BODY` over a head's features, unrolled so that the
/// register rows stay in registers.
pub(super) fn features(ind: &str, n: usize, body: &str) -> String {
    format!("{ind}#pragma unroll\n{ind}for (int c = 0; c < {n}; ++c) {body}\n")
}

impl Attn<'_> {
    /// The compute type's C name.
    pub(super) fn t(&self) -> &'static str {
        scalar::compute_type(self.real)
    }

    /// A literal of the compute type.
    pub(super) fn lit(&self, x: f64) -> String {
        scalar::literal(Scalar::F(x), self.real)
    }

    pub(super) fn exp(&self) -> &'static str {
        if self.real == DType::F64 {
            "exp"
        } else {
            "expf"
        }
    }

    pub(super) fn log(&self) -> &'static str {
        if self.real == DType::F64 {
            "log"
        } else {
            "logf"
        }
    }

    /// Element `at` of operand `p` (of the operands' dtype) in the compute type.
    pub(super) fn load(&self, p: usize, at: &str) -> String {
        scalar::load_conv(self.dt, &format!("in{p}[{at}]"))
    }

    /// The parameter number of `role`'s operand (q, k, v, then o and do).
    pub(super) fn input(&self, role: Role) -> usize {
        let qkv = if self.packed { 1 } else { 3 };
        match role {
            Role::Q => 0,
            Role::K | Role::V if self.packed => 0,
            Role::K => 1,
            Role::V => 2,
            Role::O => qkv,
            Role::DO => qkv + 1,
        }
    }

    /// The offset of feature 0 of row `t` of head `h` of batch `b` in `role`'s operand
    /// (and its gradient), in the node's layout.
    pub(super) fn row(&self, role: Role, b: &str, h: &str, t: &str) -> String {
        let (heads, time, feats, first) = match role {
            Role::Q => (self.hq, self.tq, self.d, 0),
            Role::K => (self.hkv, self.tk, self.d, self.hq),
            Role::V => (self.hkv, self.tk, self.dv, self.hq + self.hkv),
            Role::O | Role::DO => (self.hq, self.tq, self.dv, 0),
        };
        match self.spec.layout {
            AttentionLayout::Bhtd => format!("(({b} * {heads} + {h}) * {time} + {t}) * {feats}"),
            AttentionLayout::Packed { .. } if role.packed() => {
                let per = self.hq + 2 * self.hkv;
                let h = if first == 0 {
                    h.to_string()
                } else {
                    format!("{first} + {h}")
                };
                format!("(({b} * {time} + {t}) * {per} + {h}) * {feats}")
            }
            _ => format!("(({b} * {time} + {t}) * {heads} + {h}) * {feats}"),
        }
    }

    /// How many keys query row `i` of batch `b` sees (an `nd_idx`).
    pub(super) fn seen(&self, b: &str, i: &str) -> String {
        match self.lens {
            Some(p) => format!("nd_seen(in{p}, {b}, {i})"),
            None => format!("nd_seen({b}, {i})"),
        }
    }

    /// The parameters: the operands in slot order, the output, the scratch buffer.
    pub(super) fn params(&self, operands: &[TensorType], scratch: bool) -> Vec<String> {
        let mut ps: Vec<String> = operands
            .iter()
            .enumerate()
            .map(|(i, t)| {
                format!(
                    "const {}* __restrict__ in{i}",
                    scalar::storage_type(t.dtype)
                )
            })
            .collect();
        ps.push(format!(
            "{}* __restrict__ out0",
            scalar::storage_type(self.dt)
        ));
        if scratch {
            ps.push("unsigned char* __restrict__ scratch".into());
        }
        ps
    }

    /// The device helpers every function of the node uses: which keys a row sees, the
    /// bias, the dropout factor.
    pub(super) fn helpers(&self) -> String {
        let (t, tq, tk) = (self.t(), self.tq, self.tk);
        let mut s = String::new();
        if self.key.is_some() {
            s.push_str(&scalar::helper_source(&BTreeSet::from([Helper::Random])));
        }
        let lens = if self.lens.is_some() {
            s.push_str(&format!(
                "// Keys batch b has: its key length, within 0..{tk}.\n\
                 __device__ __forceinline__ nd_idx nd_klen(const long long* __restrict__ lens, nd_idx b) {{\n  \
                 const long long l = lens[b];\n  \
                 return (nd_idx)(l < 0 ? 0 : l > {tk} ? {tk} : l);\n}}\n"
            ));
            "const long long* __restrict__ lens, "
        } else {
            ""
        };
        let limit = match self.spec.causal {
            CausalMask::None => format!("{tk}LL"),
            CausalMask::TopLeft => "(long long)i + 1".into(),
            CausalMask::BottomRight => format!("(long long)i + ({})", 1 + tk as i64 - tq as i64),
        };
        let _ = write!(
            s,
            "// Keys query row i of batch b sees, 0..{tk}: j < {} (causal {}){}.\n\
             __device__ __forceinline__ nd_idx nd_seen({lens}nd_idx b, nd_idx i) {{\n  \
             long long n = {limit};\n",
            match self.spec.causal {
                CausalMask::None => tk.to_string(),
                CausalMask::TopLeft => "i + 1".into(),
                CausalMask::BottomRight => "i + 1 + Tk - Tq".into(),
            },
            self.spec.causal.name(),
            if self.lens.is_some() {
                " and j < the key length"
            } else {
                ""
            },
        );
        if self.spec.causal != CausalMask::None {
            let _ = writeln!(s, "  n = n < {tk} ? n : {tk};");
        }
        if self.lens.is_some() {
            s.push_str("  const long long l = nd_klen(lens, b);\n  n = n < l ? n : l;\n");
        } else {
            s.push_str("  (void)b;\n");
        }
        s.push_str("  return (nd_idx)(n < 0 ? 0 : n);\n}\n");
        if let Some((_, bd, st)) = self.bias {
            let terms: Vec<String> = ["b", "h", "i", "j"]
                .iter()
                .zip(st)
                .filter(|(_, s)| *s != 0)
                .map(|(v, s)| {
                    if s == 1 {
                        v.to_string()
                    } else {
                        format!("{v} * {s}")
                    }
                })
                .collect();
            let at = if terms.is_empty() {
                "0".to_string()
            } else {
                terms.join(" + ")
            };
            let _ = write!(
                s,
                "// The bias of score (b, h, i, j) (broadcast extents have stride 0).\n\
                 __device__ __forceinline__ {t} nd_bias(const {}* __restrict__ bias, nd_idx b, nd_idx h, nd_idx i, nd_idx j) {{\n  \
                 (void)b; (void)h; (void)i; (void)j;\n  \
                 return ({t}){};\n}}\n",
                scalar::storage_type(bd),
                scalar::load_conv(bd, &format!("bias[{at}]"))
            );
        }
        if let Some(p) = self.spec.dropout {
            let rate = p.to_f64();
            let _ = write!(
                s,
                "// Dropout's factor for score (bh = b * {hq} + h, i, j): kept when its element of\n\
                 // random_uniform over [B, {hq}, {tq}, {tk}] is >= {rate} (as f32), scaled by 1 / (1 - {rate}).\n\
                 __device__ __forceinline__ {t} nd_drop(long long key, nd_idx bh, nd_idx i, nd_idx j) {{\n  \
                 const long long e = ((long long)bh * {tq} + i) * {tk} + j;\n  \
                 return nd_random_uniform(key, e) >= {} ? {} : {};\n}}\n",
                scalar::literal(Scalar::F(rate), DType::F32),
                self.lit(1.0 / (1.0 - rate)),
                self.lit(0.0),
                hq = self.hq,
            );
        }
        s
    }

    /// The lines that compute `sc`, the score of query row `i` (features `qa`, a C
    /// expression in `c`) against key `j` (features `ka`), for head `h` of batch `b`.
    pub(super) fn score(
        &self,
        ind: &str,
        qa: &str,
        ka: &str,
        (b, h, i, j): (&str, &str, &str, &str),
    ) -> String {
        let t = self.t();
        let mut s = format!("{ind}{t} dot = {};\n", self.lit(0.0));
        s.push_str(&features(ind, self.d, &format!("dot += {qa} * {ka};")));
        let bias = match self.bias {
            Some((p, _, _)) => format!(" + nd_bias(in{p}, {b}, {h}, {i}, {j})"),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "{ind}const {t} sc = {} * dot{bias};",
            self.lit(self.spec.scale())
        );
        s
    }

    /// Stages rows `row0 ..` (up to a tile, zeros past `rows`) of operand `p`, `feats`
    /// features a row, into shared array `arr`; `at(r)` is the offset of row `r`.
    pub(super) fn stage(
        &self,
        ind: &str,
        (arr, p, feats): (&str, usize, usize),
        row0: &str,
        rows: usize,
        at: &dyn Fn(&str) -> String,
    ) -> String {
        if feats == 0 {
            return String::new();
        }
        let n = self.tile * feats;
        format!(
            "{ind}for (int e = threadIdx.x; e < {n}; e += blockDim.x) {{\n{ind}  \
             const nd_idx r = {row0} + e / {feats};\n{ind}  \
             {arr}[e] = r < {rows} ? {} : {};\n{ind}}}\n",
            self.load(p, &format!("{} + e % {feats}", at("r"))),
            self.lit(0.0)
        )
    }

    /// The head of a function over query rows: the grid-stride loop over blocks of
    /// [`Attn::threads`] rows of one head, this thread's row `i`, the keys it sees
    /// (`seen`) and those the block's last row sees (`reach`).
    pub(super) fn query_block(&self) -> String {
        let (bq, tq) = (self.threads as usize, self.tq);
        let qt = tq.div_ceil(bq);
        format!(
            "  for (nd_idx l = blockIdx.x; l < {nblk}; l += gridDim.x) {{\n    \
             // Query rows i0 .. i0 + {bq} of head h of batch b; this thread's is row i.\n    \
             const nd_idx bh = l / {qt}, i0 = l % {qt} * {bq};\n    \
             const nd_idx b = bh / {hq}, h = bh % {hq}, kh = h / {group};\n    \
             const nd_idx i = i0 + (nd_idx)threadIdx.x;\n    \
             const bool live = i < {tq};\n    \
             const nd_idx seen = live ? {seen} : 0;\n    \
             // Rows further down see no fewer keys: the block's last row bounds its tiles.\n    \
             const nd_idx reach = {reach};\n",
            nblk = self.b * self.hq * qt,
            hq = self.hq,
            group = self.hq / self.hkv,
            seen = self.seen("b", "i"),
            reach = self.seen(
                "b",
                &format!("(i0 + {} < {tq} ? i0 + {} : {})", bq - 1, bq - 1, tq - 1)
            ),
        )
    }

    /// This thread's query row into `q` (zeros past the last row).
    pub(super) fn load_query_row(&self) -> String {
        let row = format!("{} + c", self.row(Role::Q, "b", "h", "i"));
        let load = self.load(self.input(Role::Q), &row);
        features(
            "    ",
            self.d,
            &format!("q[c] = live ? {load} : {};", self.lit(0.0)),
        )
    }

    /// The loop over the key tiles a query block sees: k (and v when `values`) staged,
    /// `n` the keys of the tile this thread's row sees.
    pub(super) fn key_tiles(&self, values: bool) -> String {
        let tile = self.tile;
        let mut s = format!(
            "    for (nd_idx j0 = 0; j0 < reach; j0 += {tile}) {{\n      \
             __syncthreads();  // the last tile's readers are done\n"
        );
        let at = |role: Role| move |r: &str| self.row(role, "b", "kh", r);
        let ind = "      ";
        let k = ("nd_k", self.input(Role::K), self.d);
        s.push_str(&self.stage(ind, k, "j0", self.tk, &at(Role::K)));
        if values {
            let v = ("nd_v", self.input(Role::V), self.dv);
            s.push_str(&self.stage(ind, v, "j0", self.tk, &at(Role::V)));
        }
        let _ = write!(
            s,
            "      __syncthreads();\n      \
             const nd_idx n = seen - j0 < {tile} ? seen - j0 : {tile};\n"
        );
        s
    }

    /// `const long long key = inK[0];` when dropout needs it.
    pub(super) fn read_key(&self) -> String {
        self.key
            .map(|p| format!("  const long long key = in{p}[0];\n"))
            .unwrap_or_default()
    }

    /// With dropout, the line that draws score `(bh, i, j)`'s factor `f`; and the text
    /// that multiplies by it (`" * f"`). Nothing without dropout.
    pub(super) fn dropout(&self, ind: &str, i: &str, j: &str) -> (String, &'static str) {
        match self.key {
            Some(_) => (
                format!("{ind}const {} f = nd_drop(key, bh, {i}, {j});\n", self.t()),
                " * f",
            ),
            None => (String::new(), ""),
        }
    }

    /// Shared tiles of `name` for `feats`-feature rows.
    pub(super) fn shared(&self, name: &str, feats: usize) -> String {
        format!(
            "  __shared__ {} {name}[{}];\n",
            self.t(),
            self.tile * feats.max(1)
        )
    }

    /// The streaming max and sum of this thread's row over a staged tile (`s` its scores);
    /// `rescale` the lines run with `alpha` after the sum is rescaled, `add` those run
    /// per key with its `p` after the sum took it.
    pub(super) fn softmax_tile(&self, rescale: &str, add: &str) -> String {
        let (t, tile) = (self.t(), self.tile);
        let ninf = self.lit(f64::NEG_INFINITY);
        let mut s = format!(
            "      if (n > 0) {{\n        \
             {t} s[{tile}];\n        \
             {t} top = {ninf};\n        \
             for (nd_idx r = 0; r < n; ++r) {{\n"
        );
        s.push_str(&self.score(
            "          ",
            "q[c]",
            &format!("nd_k[r * {} + c]", self.d),
            ("b", "h", "i", "j0 + r"),
        ));
        let _ = write!(
            s,
            "          s[r] = sc;\n          \
             top = sc > top ? sc : top;\n        }}\n        \
             const {t} mn = top > m ? top : m;\n        \
             if (mn != {ninf}) {{\n          \
             // exp(-inf) = 0: nothing to rescale before the row's first finite score.\n          \
             const {t} alpha = {exp}(m - mn);\n          \
             sum *= alpha;\n{rescale}          \
             for (nd_idx r = 0; r < n; ++r) {{\n            \
             {t} p = {exp}(s[r] - mn);\n            \
             sum += p;\n{add}          }}\n          \
             m = mn;\n        }}\n      }}\n    }}\n",
            exp = self.exp(),
        );
        s
    }

    /// The translation unit's head: what it computes, the includes, the index type and
    /// the helpers; with the strategy and whether it uses half types.
    pub(super) fn head(
        &self,
        name: &str,
        operands: &[TensorType],
        strategy: &str,
    ) -> (String, bool) {
        let shapes: Vec<String> = operands.iter().map(|t| t.to_string()).collect();
        let mut what = format!(
            "{} of {} (causal {}, scale {}",
            if self.backward {
                "attention_backward"
            } else {
                "attention"
            },
            shapes.join(", "),
            self.spec.causal.name(),
            self.spec.scale()
        );
        match self.spec.layout {
            AttentionLayout::Bhtd => {}
            AttentionLayout::Packed { .. } => what.push_str(", packed qkv [B, T, (Hq + 2 Hkv) D]"),
            _ => what.push_str(", layout [B, T, H, D]"),
        }
        if let Some(p) = self.spec.dropout {
            let _ = write!(what, ", dropout {}", p.to_f64());
        }
        what.push(')');
        let half =
            scalar::is_half(self.dt) || self.bias.is_some_and(|(_, bd, _)| scalar::is_half(bd));
        let bias_len = self.bias.map_or(0, |(p, _, _)| operands[p].shape.numel());
        let wide = [
            self.q_len(),
            self.k_len(),
            self.v_len(),
            self.o_len(),
            bias_len,
        ]
        .iter()
        .any(|&l| l > (i32::MAX / 2) as usize);
        let mut src = format!("// ndfuse routine {name}: {what}\n// {strategy}\n");
        if half {
            src.push_str("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
        }
        let _ = writeln!(
            src,
            "typedef {} nd_idx;",
            if wide { "long long" } else { "int" }
        );
        src.push_str(&self.helpers());
        (src, half)
    }

    /// Elements of q (and dq), k, v, and the result (o, do).
    pub(super) fn q_len(&self) -> usize {
        self.b * self.hq * self.tq * self.d
    }

    pub(super) fn k_len(&self) -> usize {
        self.b * self.hkv * self.tk * self.d
    }

    pub(super) fn v_len(&self) -> usize {
        self.b * self.hkv * self.tk * self.dv
    }

    pub(super) fn o_len(&self) -> usize {
        self.b * self.hq * self.tq * self.dv
    }

    /// A launch of `f` over `blocks` blocks of [`Attn::threads`].
    pub(super) fn launch(&self, f: String, blocks: usize, opts: &CudaOptions) -> Launch {
        Launch {
            function: f,
            grid: blocks.clamp(1, opts.max_grid_size.max(1) as usize) as u32,
            block: (self.threads, 1),
        }
    }

    /// Blocks of query rows: a block per [`Attn::threads`] rows of each head.
    pub(super) fn query_blocks(&self) -> usize {
        self.b * self.hq * self.tq.div_ceil(self.threads as usize)
    }

    /// The forward's kernel: one launch (none when the result is empty).
    pub(crate) fn forward_kernel(&self, operands: &[TensorType], opts: &CudaOptions) -> CudaKernel {
        let name = format!("attention_{}", self.dt);
        let strategy = format!(
            "streaming softmax: one thread per query row, {} rows a block; keys and values in tiles of {} rows through shared memory; {} math",
            self.threads, self.tile, self.real
        );
        let (mut src, uses_half) = self.head(&name, operands, &strategy);
        let mut launches = Vec::new();
        if self.o_len() > 0 {
            let params = self.params(operands, false);
            self.forward(&mut src, &name, &params);
            launches.push(self.launch(name.clone(), self.query_blocks(), opts));
        }
        CudaKernel {
            name,
            source: src,
            launches,
            scratch_bytes: 0,
            strategy,
            uses_half,
        }
    }

    /// The forward: the streaming softmax over the key tiles, then `acc / sum`.
    pub(super) fn forward(&self, src: &mut String, f: &str, params: &[String]) {
        let (t, d, dv) = (self.t(), self.d, self.dv);
        let z = self.lit(0.0);
        open(src, f, self.threads, params);
        src.push_str(&self.shared("nd_k", d));
        src.push_str(&self.shared("nd_v", dv));
        src.push_str(&self.read_key());
        src.push_str(&self.query_block());
        let _ = writeln!(
            src,
            "    {t} q[{}], acc[{}];\n    {t} m = {}, sum = {z};",
            d.max(1),
            dv.max(1),
            self.lit(f64::NEG_INFINITY)
        );
        src.push_str(&self.load_query_row());
        src.push_str(&features("    ", dv, &format!("acc[c] = {z};")));
        src.push_str(&self.key_tiles(true));
        let rescale = features("          ", dv, "acc[c] *= alpha;");
        let (f, times_f) = self.dropout("            ", "i", "j0 + r");
        let add = format!(
            "{f}{}{}",
            if self.key.is_some() {
                format!("            p = p{times_f};\n")
            } else {
                String::new()
            },
            features(
                "            ",
                dv,
                &format!("acc[c] += p * nd_v[r * {dv} + c];")
            )
        );
        src.push_str(&self.softmax_tile(&rescale, &add));
        let _ = writeln!(
            src,
            "    if (live) {{\n      const nd_idx o = {};\n{}    }}\n  }}\n}}",
            self.row(Role::O, "b", "h", "i"),
            features(
                "      ",
                dv,
                &format!(
                    "out0[o + c] = {};",
                    scalar::store_conv(self.dt, &format!("sum > {z} ? acc[c] / sum : {z}"))
                )
            )
        );
    }
}
