//! Fused attention and its gradient in f64, one query row at a time: the textbook
//! formulas, no blocking, no streaming softmax. The routines that block and stream are
//! tested against this.

use super::random::key_of;
use super::vals::{Tensor, Vals};
use crate::dtype::DType;
use crate::op::{random_uniform, AttentionLayout, AttentionSpec};
use crate::round::round_f64;

/// The extents of one attention, from `q [B, Hq, Tq, D]`, `k [B, Hkv, Tk, D]`,
/// `v [B, Hkv, Tk, Dv]`.
#[derive(Clone, Copy)]
struct Dims {
    layout: AttentionLayout,
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
}

/// The operands past q, k, v (and o, do), read as the spec says.
struct Extras<'a> {
    bias: Option<&'a Tensor>,
    lengths: Option<&'a [i64]>,
    key: Option<i64>,
}

fn floats(t: &Tensor) -> &[f64] {
    match &t.vals {
        Vals::F(v) => v,
        _ => panic!("attention's float operand is not float; infer checks it (a bug)"),
    }
}

fn extras<'a>(spec: &AttentionSpec, rest: &[&'a Tensor]) -> Extras<'a> {
    let mut it = rest.iter();
    let bias = spec
        .bias
        .then(|| *it.next().expect("infer counts operands"));
    let lengths = spec
        .key_lengths
        .then(|| match &it.next().expect("infer counts").vals {
            Vals::I(l) => &l[..],
            _ => panic!("key lengths are i64; infer checks it (a bug)"),
        });
    let key = spec
        .dropout
        .map(|_| key_of(&it.next().expect("infer counts operands").vals));
    Extras { bias, lengths, key }
}

fn dims(layout: AttentionLayout, q: &Tensor, k: &Tensor, v: &Tensor) -> Dims {
    let (b, hq, tq, d) = layout.split(q.shape.dims());
    let (_, hkv, tk, _) = layout.split(k.shape.dims());
    let dv = layout.split(v.shape.dims()).3;
    Dims {
        layout,
        b,
        hq,
        hkv,
        tq,
        tk,
        d,
        dv,
    }
}

impl Dims {
    /// The offset of query row `(b, h, i)` in q (`width` features: D for q, Dv for the
    /// result, o and do).
    fn q_row(&self, b: usize, h: usize, i: usize, width: usize) -> usize {
        self.layout.row((b, h, i), self.hq, self.tq, width).0
    }

    /// The offset of key row `(b, kh, j)` in k or v (`width` features).
    fn k_row(&self, b: usize, kh: usize, j: usize, width: usize) -> usize {
        self.layout.row((b, kh, j), self.hkv, self.tk, width).0
    }
}

/// Row `(b, h, i)`'s probabilities `p[j]` and dropout factors `f[j]` (`1 / (1 - p)` kept,
/// 0 dropped; 1 without dropout). All zero when the row sees no key.
fn row(
    spec: &AttentionSpec,
    x: &Extras,
    m: Dims,
    q: &[f64],
    k: &[f64],
    (b, h, i): (usize, usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let kh = h / (m.hq / m.hkv);
    let mut seen = spec.causal.visible(i, m.tq, m.tk).max(0) as usize;
    if let Some(l) = x.lengths {
        seen = seen.min(l[b].clamp(0, m.tk as i64) as usize);
    }
    let qi = &q[m.q_row(b, h, i, m.d)..][..m.d];
    let mut s = vec![f64::NEG_INFINITY; m.tk];
    for (j, sj) in s.iter_mut().enumerate().take(seen) {
        let kj = &k[m.k_row(b, kh, j, m.d)..][..m.d];
        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
        *sj = spec.scale() * dot;
        if let Some(bias) = x.bias {
            let bd = bias.shape.dims();
            let at = |e: usize, full: usize| if bd[e] == 1 { 0 } else { full };
            let idx = ((at(0, b) * bd[1] + at(1, h)) * bd[2] + at(2, i)) * bd[3] + at(3, j);
            *sj += floats(bias)[idx];
        }
    }
    let max = s[..seen].iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut p = vec![0.0; m.tk];
    if seen > 0 && max > f64::NEG_INFINITY {
        let total: f64 = s[..seen].iter().map(|v| (v - max).exp()).sum();
        for j in 0..seen {
            p[j] = (s[j] - max).exp() / total;
        }
    }
    let mut f = vec![1.0; m.tk];
    if let Some(key) = x.key {
        let rate = spec.dropout_p();
        let base = ((b * m.hq + h) * m.tq + i) * m.tk;
        for (j, fj) in f.iter_mut().enumerate() {
            let u = random_uniform(key, (base + j) as u64);
            *fj = if u >= rate as f32 {
                1.0 / (1.0 - rate)
            } else {
                0.0
            };
        }
    }
    (p, f)
}

/// [`crate::Op::Attention`]: `[B, Hq, Tq, Dv]`, rounded once to `dtype`.
pub(super) fn attention(spec: &AttentionSpec, operands: &[&Tensor], dtype: DType) -> Vals {
    if let AttentionLayout::Packed { q_heads, kv_heads } = spec.layout {
        let (parts, bthd) = unpack(spec, operands[0], q_heads, kv_heads);
        let mut ops: Vec<&Tensor> = parts.iter().collect();
        ops.extend(&operands[1..]);
        return attention(&bthd, &ops, dtype);
    }
    let (q, k, v) = (operands[0], operands[1], operands[2]);
    let m = dims(spec.layout, q, k, v);
    let x = extras(spec, &operands[3..]);
    let (qv, kv, vv) = (floats(q), floats(k), floats(v));
    let mut out = vec![0.0; m.b * m.hq * m.tq * m.dv];
    for b in 0..m.b {
        for h in 0..m.hq {
            let kh = h / (m.hq / m.hkv);
            for i in 0..m.tq {
                let (p, f) = row(spec, &x, m, qv, kv, (b, h, i));
                let o = &mut out[m.q_row(b, h, i, m.dv)..][..m.dv];
                for j in 0..m.tk {
                    let w = p[j] * f[j];
                    if w != 0.0 {
                        let vj = &vv[m.k_row(b, kh, j, m.dv)..][..m.dv];
                        o.iter_mut().zip(vj).for_each(|(o, v)| *o += w * v);
                    }
                }
            }
        }
    }
    Vals::F(out.into_iter().map(|v| round_f64(v, dtype)).collect())
}

/// [`crate::Op::AttentionBackward`]: `dq`, `dk`, `dv` packed, each rounded once to
/// `dtype`. `D_i = sum_j p_ij dp_ij` is computed from the probabilities (it equals
/// `do_i . o_i`, which the routines use).
pub(super) fn attention_backward(spec: &AttentionSpec, operands: &[&Tensor], dtype: DType) -> Vals {
    if let AttentionLayout::Packed { q_heads, kv_heads } = spec.layout {
        let (parts, bthd) = unpack(spec, operands[0], q_heads, kv_heads);
        let mut ops: Vec<&Tensor> = parts.iter().collect();
        ops.extend(&operands[1..]);
        let Vals::F(flat) = attention_backward(&bthd, &ops, dtype) else {
            unreachable!("attention's gradients are floats")
        };
        return Vals::F(pack(&flat, operands[0], q_heads, kv_heads));
    }
    let (q, k, v, d_o) = (operands[0], operands[1], operands[2], operands[4]);
    let m = dims(spec.layout, q, k, v);
    let x = extras(spec, &operands[5..]);
    let (qv, kv, vv, dov) = (floats(q), floats(k), floats(v), floats(d_o));
    let mut dq = vec![0.0; qv.len()];
    let mut dk = vec![0.0; kv.len()];
    let mut dvv = vec![0.0; vv.len()];
    let scale = spec.scale();
    for b in 0..m.b {
        for h in 0..m.hq {
            let kh = h / (m.hq / m.hkv);
            for i in 0..m.tq {
                let (p, f) = row(spec, &x, m, qv, kv, (b, h, i));
                let qo = m.q_row(b, h, i, m.d);
                let doi = &dov[m.q_row(b, h, i, m.dv)..][..m.dv];
                let mut dp = vec![0.0; m.tk];
                for j in 0..m.tk {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let vo = m.k_row(b, kh, j, m.dv);
                    let dot: f64 = doi.iter().zip(&vv[vo..vo + m.dv]).map(|(a, b)| a * b).sum();
                    dp[j] = dot * f[j];
                    let w = p[j] * f[j];
                    for c in 0..m.dv {
                        dvv[vo + c] += w * doi[c];
                    }
                }
                let di: f64 = (0..m.tk).map(|j| p[j] * dp[j]).sum();
                for j in 0..m.tk {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let ds = p[j] * (dp[j] - di) * scale;
                    let ko = m.k_row(b, kh, j, m.d);
                    for c in 0..m.d {
                        dq[qo + c] += ds * kv[ko + c];
                        dk[ko + c] += ds * qv[qo + c];
                    }
                }
            }
        }
    }
    Vals::F(
        dq.into_iter()
            .chain(dk)
            .chain(dvv)
            .map(|v| round_f64(v, dtype))
            .collect(),
    )
}

/// The packed `qkv [B, T, (Hq + 2 Hkv) D]` as q, k, v in the `[B, T, H, D]` layout, and
/// the spec in that layout.
fn unpack(
    spec: &AttentionSpec,
    qkv: &Tensor,
    hq: usize,
    hkv: usize,
) -> ([Tensor; 3], AttentionSpec) {
    let d3 = qkv.shape.dims();
    let (b, t, w) = (d3[0], d3[1], d3[2]);
    let d = w / (hq + 2 * hkv);
    let vals = floats(qkv);
    let part = |first: usize, heads: usize| {
        let mut out = Vec::with_capacity(b * t * heads * d);
        for row in 0..b * t {
            out.extend_from_slice(&vals[row * w + first * d..][..heads * d]);
        }
        Tensor {
            dtype: qkv.dtype,
            shape: crate::shape::Shape::new([b, t, heads, d]),
            vals: Vals::F(out),
        }
    };
    let parts = [part(0, hq), part(hq, hkv), part(hq + hkv, hkv)];
    let bthd = AttentionSpec {
        layout: AttentionLayout::Bthd,
        ..*spec
    };
    (parts, bthd)
}

/// `dq`, `dk`, `dv` (flat, `[B, T, H, D]` each, one after another) packed as `qkv`.
fn pack(flat: &[f64], qkv: &Tensor, hq: usize, hkv: usize) -> Vec<f64> {
    let d3 = qkv.shape.dims();
    let (b, t, w) = (d3[0], d3[1], d3[2]);
    let d = w / (hq + 2 * hkv);
    let mut out = vec![0.0; b * t * w];
    let mut at = 0;
    for (first, heads) in [(0, hq), (hq, hkv), (hq + hkv, hkv)] {
        for row in 0..b * t {
            out[row * w + first * d..][..heads * d].copy_from_slice(&flat[at..at + heads * d]);
            at += heads * d;
        }
    }
    out
}
