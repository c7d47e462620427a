//! `Attention` and `RotaryEmbedding` (opset 23), written with ndfuse's primitives so that
//! the attention pattern reaches the fusion pass like any user's.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{DType, SliceArg, Tensor};

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "Attention",
        "3-D and 4-D q/k/v, grouped-query heads, bool or additive masks (padded to the \
         keys), is_causal (with past keys), scale, softcap, past/present keys and values, \
         qk_matmul_output modes 0-3, nonpad_kv_seqlen (keys past each item's length masked)",
    ),
    Support::new(
        "RotaryEmbedding",
        "3-D (num_heads) and 4-D input, position_ids (a gather of the caches) or caches per \
         position, interleaved, rotary_embedding_dim (the rest passed through)",
    ),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "Attention" => attention(n),
        "RotaryEmbedding" => rotary(n),
        _ => return None,
    })
}

/// [B, S, H * D] to [B, H, S, D].
fn heads(x: &Tensor, h: usize, n: &Node, i: usize) -> Result<Tensor> {
    let s = n.shape(i)?;
    if s[2] % h != 0 {
        return Err(n.bad(format!(
            "input {i} of shape {s:?} does not split into {h} heads"
        )));
    }
    Ok(
        x.reshape(&[s[0] as i64, s[1] as i64, h as i64, (s[2] / h) as i64])
            .permute(&[0, 2, 1, 3]),
    )
}

fn attention(n: &Node) -> Result<Vec<Tensor>> {
    let (q, k, v) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let rank = n.shape(0)?.len();
    let (q, k, v) = if rank == 3 {
        let hq = n
            .int("q_num_heads")?
            .ok_or_else(|| n.bad("3-D inputs need q_num_heads"))? as usize;
        let hkv = n
            .int("kv_num_heads")?
            .ok_or_else(|| n.bad("3-D inputs need kv_num_heads"))? as usize;
        (
            heads(q, hq, n, 0)?,
            heads(k, hkv, n, 1)?,
            heads(v, hkv, n, 2)?,
        )
    } else if rank == 4 {
        (q.clone(), k.clone(), v.clone())
    } else {
        return Err(n.bad(format!("q of rank {rank} (3 or 4)")));
    };
    let qs = q.shape().map(<[usize]>::to_vec).unwrap_or_default();
    let dtype = n.dtype(0)?;
    let scale = match n.float("scale")? {
        Some(s) => s,
        None => 1.0 / (qs[3] as f64).sqrt(),
    };
    let past = n
        .opt_input(4)
        .map(|p| p.shape().map(|s| s[2]).unwrap_or(0))
        .unwrap_or(0);
    let k = match n.opt_input(4) {
        Some(p) => ndfuse::concat(&[p, &k], 2),
        None => k,
    };
    let v = match n.opt_input(5) {
        Some(p) => ndfuse::concat(&[p, &v], 2),
        None => v,
    };
    let (present_k, present_v) = (k.clone(), v.clone());
    let ks = k.shape().map(<[usize]>::to_vec).unwrap_or_default();
    let (sq, skv) = (qs[2], ks[2]);
    // Grouped-query heads: each key/value head repeated for its queries (h0, h0, h1, ...).
    let (hq, hkv) = (qs[1], ks[1]);
    let (k, v) = if hq != hkv {
        if hkv == 0 || hq % hkv != 0 {
            return Err(n.bad(format!("{hq} query heads for {hkv} key/value heads")));
        }
        let rep = |t: &Tensor| {
            let s = t.shape().map(<[usize]>::to_vec).unwrap_or_default();
            t.expand_dims(2)
                .broadcast_to(&[s[0], s[1], hq / hkv, s[2], s[3]])
                .reshape(&[s[0] as i64, hq as i64, s[2] as i64, s[3] as i64])
        };
        (rep(&k), rep(&v))
    } else {
        (k, v)
    };
    let qk = q.matmul(&k.permute(&[0, 1, 3, 2])).mul(scale);
    // The mask: bool (true attends) or additive, padded on the right to the keys.
    let mut bias: Option<Tensor> = match n.opt_input(3) {
        Some(m) => {
            let ms = m.shape().map(<[usize]>::to_vec).unwrap_or_default();
            let last = *ms.last().unwrap_or(&0);
            let bool_mask = m.dtype().ok() == Some(DType::Bool);
            let add = if bool_mask {
                m.where_(0.0, f64::NEG_INFINITY).cast(dtype)
            } else {
                m.clone()
            };
            let add = if last < skv {
                let mut w = vec![(0, 0); ms.len()];
                w[ms.len() - 1] = (0, skv - last);
                add.pad(&w, ndfuse::PadMode::Constant, f64::NEG_INFINITY)
            } else {
                add
            };
            Some(add)
        }
        None => None,
    };
    if let Some(lens) = n.opt_input(6) {
        // Keys at or past each batch item's length are masked: [B, 1, 1, L].
        let b = qs[0] as i64;
        let cols = n
            .ctx
            .arange_n(skv)
            .cast(DType::I64)
            .reshape(&[1, 1, 1, skv as i64]);
        let pad = cols
            .lt(lens.cast(DType::I64).reshape(&[b, 1, 1, 1]))
            .where_(0.0, f64::NEG_INFINITY)
            .cast(dtype);
        bias = Some(match bias {
            Some(x) => x.add(pad),
            None => pad,
        });
    }
    if n.int_or("is_causal", 0)? != 0 {
        let rows = n.ctx.arange_n(sq).cast(DType::I64).reshape(&[sq as i64, 1]);
        let cols = n
            .ctx
            .arange_n(skv)
            .cast(DType::I64)
            .reshape(&[1, skv as i64]);
        let causal = cols
            .sub(past as i64)
            .gt(rows)
            .where_(f64::NEG_INFINITY, 0.0)
            .cast(dtype);
        bias = Some(match bias {
            Some(b) => b.add(causal),
            None => causal,
        });
    }
    let with_bias = match &bias {
        Some(b) => qk.add(b),
        None => qk.clone(),
    };
    let mode = n.int_or("qk_matmul_output_mode", 0)?;
    let capped = match n.float("softcap")? {
        Some(c) if c > 0.0 => with_bias.div(c).tanh().mul(c),
        _ => with_bias.clone(),
    };
    if n.has("softmax_precision") {
        let code = n.int_or("softmax_precision", 1)?;
        crate::tensor::dtype_of(code as i32)
            .map_err(|w| n.unsupported(format!("softmax_precision {w}")))?;
    }
    let p = capped.softmax(-1);
    let qk_out = match mode {
        0 => qk,
        1 => with_bias,
        2 => capped,
        3 => p.clone(),
        m => return Err(n.bad(format!("qk_matmul_output_mode {m}"))),
    };
    let mut y = p.matmul(&v);
    if rank == 3 {
        let s = y.shape().map(<[usize]>::to_vec).unwrap_or_default();
        y = y
            .permute(&[0, 2, 1, 3])
            .reshape(&[s[0] as i64, s[2] as i64, (s[1] * s[3]) as i64]);
    }
    Ok(vec![y, present_k, present_v, qk_out])
}

/// `RotaryEmbedding`: the rotated half (or interleaved pairs) of each head's first
/// `rotary_embedding_dim` features, computed in [B, S, H, D].
fn rotary(n: &Node) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    let x = n.input(0)?;
    let x4 = match xs.len() {
        4 => x.permute(&[0, 2, 1, 3]),
        3 => {
            let h = n.int_or("num_heads", 0)?;
            if h <= 0 || xs[2] % h as usize != 0 {
                return Err(n.bad(format!(
                    "3-D input {xs:?} needs num_heads dividing it, got {h}"
                )));
            }
            x.reshape(&[xs[0] as i64, xs[1] as i64, h, (xs[2] / h as usize) as i64])
        }
        r => return Err(n.bad(format!("input of rank {r} (3 or 4)"))),
    };
    let s4 = x4.shape().map(<[usize]>::to_vec).unwrap_or_default();
    let d = s4[3];
    let rot = match n.int_or("rotary_embedding_dim", 0)? {
        0 => d,
        r if r > 0 && r as usize <= d && r % 2 == 0 => r as usize,
        r => return Err(n.bad(format!("rotary_embedding_dim {r} for heads of {d}"))),
    };
    let half = rot / 2;
    let (mut cos, mut sin) = (n.input(1)?.clone(), n.input(2)?.clone());
    if let Some(p) = n.opt_input(3) {
        cos = cos.take(p, 0);
        sin = sin.take(p, 0);
    }
    for c in [&cos, &sin] {
        let cs = n
            .check(c.clone())?
            .shape()
            .map(<[usize]>::to_vec)
            .unwrap_or_default();
        if cs.len() != 3 || cs[2] != half || (cs[0] != s4[0] && cs[0] != 1) || cs[1] != s4[1] {
            return Err(n.bad(format!(
                "cos/sin cache {cs:?} for input [B, S, H, D] {s4:?} and {half} rotated pairs"
            )));
        }
    }
    let (cos, sin) = (cos.expand_dims(2), sin.expand_dims(2));
    let all = SliceArg::all();
    let last = |start: usize, stop: usize, step: i64| {
        x4.slice(&[
            all,
            all,
            all,
            SliceArg::new(Some(start as i64), Some(stop as i64), step),
        ])
    };
    let interleaved = n.int_or("interleaved", 0)? != 0;
    let (x1, x2) = if interleaved {
        (last(0, rot, 2), last(1, rot, 2))
    } else {
        (last(0, half, 1), last(half, rot, 1))
    };
    let real = cos.mul(&x1).sub(sin.mul(&x2));
    let imag = sin.mul(&x1).add(cos.mul(&x2));
    let mut y = if interleaved {
        ndfuse::stack(&[&real, &imag], -1).reshape(&[
            s4[0] as i64,
            s4[1] as i64,
            s4[2] as i64,
            rot as i64,
        ])
    } else {
        ndfuse::concat(&[&real, &imag], -1)
    };
    if rot < d {
        y = ndfuse::concat(&[&y, &last(rot, d, 1)], -1);
    }
    Ok(vec![if xs.len() == 3 {
        y.reshape(&xs.iter().map(|&v| v as i64).collect::<Vec<_>>())
    } else {
        y.permute(&[0, 2, 1, 3])
    }])
}
