//! Fused attention's gradient as CUDA C
//! ([`Op::AttentionBackward`](ndfuse_ir::Op::AttentionBackward)): the three launches of
//! FlashAttention-2's backward without atomics, on the plan and the shared text of
//! `attention.rs` (whose docs describe the algorithm).
//!
//! - `_stats`, a thread per query row: `lse_i` and `D_i = do_i . o_i` into the scratch
//!   buffer (two values of the compute type per query row).
//! - `_dkv`, a thread per key row of each key/value head: `dV_j` and `dK_j` over the
//!   query heads sharing it, then their rows, in increasing order, the query rows staged
//!   through shared memory.
//! - `_dq`, a thread per query row: `dQ_i` over its keys, staged as in the forward.

use super::attention::{features, open, Attn, Role};
use super::launch::{CudaKernel, CudaOptions};
use crate::scalar;
use ndfuse_ir::{CausalMask, TensorType};
use std::fmt::Write as _;

impl Attn<'_> {
    /// The gradient's kernel: `_stats`, `_dkv`, `_dq` (each only when it has work),
    /// the result packed `[dq | dk | dv]` (or qkv's gradient).
    pub(crate) fn backward_kernel(
        &self,
        operands: &[TensorType],
        opts: &CudaOptions,
    ) -> CudaKernel {
        let name = format!("attention_backward_{}", self.dt);
        let strategy = format!(
            "stats, dk/dv per key row, dq per query row: one thread per query (then key) row, {} rows a block; keys (then queries) in tiles of {} rows through shared memory; {} math",
            self.threads, self.tile, self.real
        );
        let (mut src, uses_half) = self.head(&name, operands, &strategy);
        let mut launches = Vec::new();
        let rows = self.b * self.hq * self.tq;
        let scratch_bytes = (2 * rows * self.real.size_bytes()).max(16);
        let params = self.params(operands, true);
        let (q_len, kv_len) = (self.q_len(), self.k_len() + self.v_len());
        if q_len + kv_len > 0 {
            if rows > 0 {
                let f = format!("{name}_stats");
                self.stats(&mut src, &f, &params);
                launches.push(self.launch(f, self.query_blocks(), opts));
            }
            if kv_len > 0 {
                let f = format!("{name}_dkv");
                self.dkv(&mut src, &f, &params);
                let key_blocks = self.b * self.hkv * self.tk.div_ceil(self.threads as usize);
                launches.push(self.launch(f, key_blocks, opts));
            }
            if q_len > 0 {
                let f = format!("{name}_dq");
                self.dq(&mut src, &f, &params);
                launches.push(self.launch(f, self.query_blocks(), opts));
            }
        }
        CudaKernel {
            name,
            source: src,
            launches,
            scratch_bytes,
            strategy,
            uses_half,
        }
    }

    /// `T* nd_lse = ..., * nd_dd = ...`: the scratch buffer's two values per query row.
    pub(super) fn scratch_rows(&self) -> String {
        let t = self.t();
        format!(
            "  {t}* nd_lse = ({t}*)scratch;\n  {t}* nd_dd = nd_lse + {};\n",
            self.b * self.hq * self.tq
        )
    }

    /// The backward's first launch: each query row's log-sum-exp and `do . o`.
    pub(super) fn stats(&self, src: &mut String, f: &str, params: &[String]) {
        let (t, d, dv) = (self.t(), self.d, self.dv);
        let z = self.lit(0.0);
        open(src, f, self.threads, params);
        src.push_str(&self.shared("nd_k", d));
        src.push_str(&self.scratch_rows());
        src.push_str(&self.query_block());
        let _ = writeln!(
            src,
            "    {t} q[{}];\n    {t} m = {}, sum = {z};",
            d.max(1),
            self.lit(f64::NEG_INFINITY)
        );
        src.push_str(&self.load_query_row());
        src.push_str(&self.key_tiles(false));
        src.push_str(&self.softmax_tile("", ""));
        let _ = writeln!(
            src,
            "    if (live) {{\n      \
             const nd_idx row = bh * {tq} + i, o = {at};\n      \
             // +inf for a row that sees no key (or only -inf scores): exp(s - lse) = 0.\n      \
             nd_lse[row] = sum > {z} ? m + {log}(sum) : {inf};\n      \
             {t} dd = {z};\n{dot}      \
             nd_dd[row] = dd;\n    }}\n  }}\n}}",
            tq = self.tq,
            at = self.row(Role::O, "b", "h", "i"),
            log = self.log(),
            inf = self.lit(f64::INFINITY),
            dot = features(
                "      ",
                dv,
                &format!(
                    "dd += {} * {};",
                    self.load(self.input(Role::DO), "o + c"),
                    self.load(self.input(Role::O), "o + c")
                )
            ),
        );
    }

    /// The backward's second launch: dk and dv, a thread per key row.
    pub(super) fn dkv(&self, src: &mut String, f: &str, params: &[String]) {
        let (t, d, dv, tq, tile) = (self.t(), self.d, self.dv, self.tq, self.tile);
        let bk = self.threads as usize;
        let kt = self.tk.div_ceil(bk);
        let group = self.hq / self.hkv;
        let z = self.lit(0.0);
        open(src, f, self.threads, params);
        src.push_str(&self.shared("nd_q", d));
        src.push_str(&self.shared("nd_g", dv));
        let _ = writeln!(
            src,
            "  __shared__ {t} nd_l[{tile}];\n  __shared__ {t} nd_d[{tile}];"
        );
        src.push_str(&self.scratch_rows());
        src.push_str(&self.read_key());
        let first = match self.spec.causal {
            CausalMask::None => "0".to_string(),
            CausalMask::TopLeft => "j0".into(),
            CausalMask::BottomRight => format!("j0 - ({})", self.tk as i64 - tq as i64),
        };
        let klen = match self.lens {
            Some(p) => format!("nd_klen(in{p}, b)"),
            None => self.tk.to_string(),
        };
        let _ = write!(
            src,
            "  for (nd_idx l = blockIdx.x; l < {nblk}; l += gridDim.x) {{\n    \
             // Keys j0 .. j0 + {bk} of key/value head kh of batch b; this thread's is key j.\n    \
             const nd_idx bkh = l / {kt}, j0 = l % {kt} * {bk};\n    \
             const nd_idx b = bkh / {hkv}, kh = bkh % {hkv};\n    \
             const nd_idx j = j0 + (nd_idx)threadIdx.x;\n    \
             const bool live = j < {tk};\n    \
             const nd_idx ko = live ? {krow} : 0, vo = live ? {vrow} : 0;\n    \
             {t} kr[{dm}], vr[{dvm}], dk[{dm}], dv[{dvm}];\n",
            nblk = self.b * self.hkv * kt,
            hkv = self.hkv,
            tk = self.tk,
            krow = self.row(Role::K, "b", "kh", "j"),
            vrow = self.row(Role::V, "b", "kh", "j"),
            dm = d.max(1),
            dvm = dv.max(1),
        );
        src.push_str(&features(
            "    ",
            d,
            &format!(
                "{{ kr[c] = live ? {} : {z}; dk[c] = {z}; }}",
                self.load(self.input(Role::K), "ko + c")
            ),
        ));
        src.push_str(&features(
            "    ",
            dv,
            &format!(
                "{{ vr[c] = live ? {} : {z}; dv[c] = {z}; }}",
                self.load(self.input(Role::V), "vo + c")
            ),
        ));
        let _ = write!(
            src,
            "    // The first query row that sees key j0 (later keys are seen from later rows on);\n    \
             // none when j0 is past the batch's key length.\n    \
             nd_idx first = {first};\n    \
             first = first < 0 ? 0 : first;\n    \
             if (j0 >= {klen}) first = {tq};\n    \
             for (nd_idx g = 0; g < {group}; ++g) {{\n      \
             // The query heads sharing head kh, in order, then their rows, in order.\n      \
             const nd_idx h = kh * {group} + g, bh = b * {hq} + h;\n      \
             for (nd_idx t0 = first; t0 < {tq}; t0 += {tile}) {{\n        \
             __syncthreads();  // the last tile's readers are done\n",
            hq = self.hq,
        );
        let at = |role: Role| move |r: &str| self.row(role, "b", "h", r);
        let ind = "        ";
        let (q, g) = (
            ("nd_q", self.input(Role::Q), d),
            ("nd_g", self.input(Role::DO), dv),
        );
        src.push_str(&self.stage(ind, q, "t0", tq, &at(Role::Q)));
        src.push_str(&self.stage(ind, g, "t0", tq, &at(Role::DO)));
        let (f, times_f) = self.dropout("          ", "i", "j");
        let ds = format!(
            "p * (dp{times_f} - nd_d[r]) * {}",
            self.lit(self.spec.scale())
        );
        let _ = write!(
            src,
            "        for (int e = threadIdx.x; e < {tile}; e += blockDim.x) {{\n          \
             const nd_idx r = t0 + e;\n          \
             nd_l[e] = r < {tq} ? nd_lse[bh * {tq} + r] : {z};\n          \
             nd_d[e] = r < {tq} ? nd_dd[bh * {tq} + r] : {z};\n        }}\n        \
             __syncthreads();\n        \
             if (!live) continue;\n        \
             const nd_idx n = {tq} - t0 < {tile} ? {tq} - t0 : {tile};\n        \
             for (nd_idx r = 0; r < n; ++r) {{\n          \
             const nd_idx i = t0 + r;\n          \
             if (j >= {seen}) continue;\n{score}          \
             const {t} p = {exp}(sc - nd_l[r]);\n          \
             {t} dp = {z};\n{dpdot}{f}          \
             const {t} pd = p{times_f};\n{dvacc}          \
             const {t} ds = {ds};\n{dkacc}        }}\n      }}\n    }}\n",
            seen = self.seen("b", "i"),
            score = self.score(
                "          ",
                &format!("nd_q[r * {d} + c]"),
                "kr[c]",
                ("b", "h", "i", "j")
            ),
            exp = self.exp(),
            dpdot = features(
                "          ",
                dv,
                &format!("dp += nd_g[r * {dv} + c] * vr[c];")
            ),
            dvacc = features(
                "          ",
                dv,
                &format!("dv[c] += pd * nd_g[r * {dv} + c];")
            ),
            dkacc = features(
                "          ",
                d,
                &format!("dk[c] += ds * nd_q[r * {d} + c];")
            ),
        );
        // Packed: dk and dv go where k and v are in qkv; else after dq, then after dk.
        let (dk_at, dv_at) = if self.packed {
            (String::new(), String::new())
        } else {
            let q_len = self.b * self.hq * tq * d;
            let k_len = self.b * self.hkv * self.tk * d;
            (format!("{q_len} + "), format!("{} + ", q_len + k_len))
        };
        let _ = writeln!(
            src,
            "    if (live) {{\n{}{}    }}\n  }}\n}}",
            features(
                "      ",
                d,
                &format!(
                    "out0[{dk_at}ko + c] = {};",
                    scalar::store_conv(self.dt, "dk[c]")
                )
            ),
            features(
                "      ",
                dv,
                &format!(
                    "out0[{dv_at}vo + c] = {};",
                    scalar::store_conv(self.dt, "dv[c]")
                )
            ),
        );
    }

    /// The backward's third launch: dq, a thread per query row.
    pub(super) fn dq(&self, src: &mut String, f: &str, params: &[String]) {
        let (t, d, dv) = (self.t(), self.d, self.dv);
        let z = self.lit(0.0);
        open(src, f, self.threads, params);
        src.push_str(&self.shared("nd_k", d));
        src.push_str(&self.shared("nd_v", dv));
        src.push_str(&self.scratch_rows());
        src.push_str(&self.read_key());
        src.push_str(&self.query_block());
        let _ = writeln!(
            src,
            "    const nd_idx qo = live ? {} : 0, oo = live ? {} : 0;\n    \
             const {t} li = live ? nd_lse[bh * {tq} + i] : {z}, di = live ? nd_dd[bh * {tq} + i] : {z};\n    \
             {t} q[{dm}], g[{dvm}], dq[{dm}];",
            self.row(Role::Q, "b", "h", "i"),
            self.row(Role::DO, "b", "h", "i"),
            tq = self.tq,
            dm = d.max(1),
            dvm = dv.max(1),
        );
        src.push_str(&features(
            "    ",
            d,
            &format!(
                "{{ q[c] = live ? {} : {z}; dq[c] = {z}; }}",
                self.load(self.input(Role::Q), "qo + c")
            ),
        ));
        src.push_str(&features(
            "    ",
            dv,
            &format!(
                "g[c] = live ? {} : {z};",
                self.load(self.input(Role::DO), "oo + c")
            ),
        ));
        src.push_str(&self.key_tiles(true));
        let (f, times_f) = self.dropout("        ", "i", "j0 + r");
        let _ = write!(
            src,
            "      for (nd_idx r = 0; r < n; ++r) {{\n{score}        \
             const {t} p = {exp}(sc - li);\n        \
             {t} dp = {z};\n{dpdot}{f}        \
             const {t} ds = p * (dp{times_f} - di) * {scale};\n{dqacc}      }}\n    }}\n",
            score = self.score(
                "        ",
                "q[c]",
                &format!("nd_k[r * {d} + c]"),
                ("b", "h", "i", "j0 + r")
            ),
            exp = self.exp(),
            dpdot = features("        ", dv, &format!("dp += g[c] * nd_v[r * {dv} + c];")),
            scale = self.lit(self.spec.scale()),
            dqacc = features("        ", d, &format!("dq[c] += ds * nd_k[r * {d} + c];")),
        );
        let _ = writeln!(
            src,
            "    if (live) {{\n{}    }}\n  }}\n}}",
            features(
                "      ",
                d,
                &format!("out0[qo + c] = {};", scalar::store_conv(self.dt, "dq[c]"))
            )
        );
    }
}
