//! Scaled dot-product attention: `softmax(scale * q @ k^T + bias, masked) @ v`, with
//! causal and padding masks, grouped-query heads and dropout on the probabilities.
//!
//! [`Tensor::attention`] builds one fused node ([`ndfuse_ir::Op::Attention`]): the
//! streaming softmax over blocks of keys, so the `[Tq, Tk]` scores never reach memory;
//! its gradient is one node too ([`ndfuse_ir::Op::AttentionBackward`], recomputing the
//! probabilities per block). [`Attention::unfused`] builds the same function from the
//! primitives instead (two products, the masks from iotas, a softmax): the graph the
//! fused node is tested against.

use crate::error::Error;
use crate::index::iota_at;
use crate::ops::SliceArg;
use crate::tensor::Tensor;
use ndfuse_ir::{AttentionLayout, AttentionSpec, CausalMask, DType, Op, Scalar};
use std::panic::Location;

type At = &'static Location<'static>;

/// Which keys a query sees by position. `true` converts to [`Causal::TopLeft`] (torch's
/// and jax's `is_causal`), `false` to [`Causal::None`].
pub type Causal = CausalMask;

/// The settings of [`Tensor::attention_with`], built like [`crate::Conv`]:
///
/// ```
/// use ndfuse::{Attention, Causal};
/// let ctx = ndfuse::Context::new();
/// let q = ctx.rand_uniform(&[2, 4, 8, 16], -1.0, 1.0, 0);
/// let kv = ctx.rand_uniform(&[2, 2, 8, 16], -1.0, 1.0, 1); // 2 key/value heads for 4 query heads
/// let lengths = ctx.from_vec(vec![8i64, 5], &[2])?;
/// let o = q.attention_with(&kv, &kv, &Attention::new().causal(Causal::TopLeft).key_lengths(&lengths));
/// assert_eq!(o.eval()?.shape(), &[2, 4, 8, 16]);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Attention {
    causal: Causal,
    scale: Option<f64>,
    bias: Option<Tensor>,
    key_lengths: Option<Tensor>,
    dropout: Option<(f64, Tensor)>,
    layout: AttentionLayout,
    unfused: bool,
    /// Set by [`Tensor::attention_qkv`]: the packed operand and its head counts.
    packed: Option<(Tensor, usize, usize)>,
}

impl Attention {
    /// No mask, scale `1 / sqrt(D)`, no bias, no dropout, fused.
    pub fn new() -> Self {
        Self::default()
    }

    /// The causal mask (see [`Causal`]).
    pub fn causal(mut self, causal: impl Into<Causal>) -> Self {
        self.causal = causal.into();
        self
    }

    /// The factor of `q @ k^T` (default `1 / sqrt(D)`, `D` the query's last extent).
    pub fn scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// An additive bias on the scaled scores, broadcastable to `[..., Hq, Tq, Tk]`
    /// (ALiBi, relative positions, a float mask of `-inf`s).
    pub fn bias(mut self, bias: &Tensor) -> Self {
        self.bias = Some(bias.clone());
        self
    }

    /// Per-sequence key lengths (i32 or i64, of the batch axes' shape: `[B]` for
    /// `q [B, H, T, D]`): key `j` of sequence `b` is seen only when `j < lengths[b]`.
    pub fn key_lengths(mut self, lengths: &Tensor) -> Self {
        self.key_lengths = Some(lengths.clone());
        self
    }

    /// Inverted dropout on the probabilities with rate `p`, from the counter-based random
    /// op under `key` ([`Tensor::dropout`]'s mask over `[..., Hq, Tq, Tk]`).
    pub fn dropout(mut self, p: f64, key: &Tensor) -> Self {
        self.dropout = Some((p, key.clone()));
        self
    }

    /// The operands' layout: [`AttentionLayout::Bthd`] takes q, k and v as
    /// `[B, T, H, D]` and gives `[B, Tq, Hq, Dv]` (FlashAttention's order: the heads of a
    /// `[B, T, H * D]` projection are a free reshape, no transpose before or after).
    pub fn layout(mut self, layout: AttentionLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Builds the attention from the primitives (products, masks, softmax) instead of the
    /// fused node: the reference graph, and the plan for cases the fused node lacks.
    pub fn unfused(mut self) -> Self {
        self.unfused = true;
        self
    }
}

impl Tensor {
    /// Scaled dot-product attention (torch's `scaled_dot_product_attention`), one fused
    /// node: `softmax(scale * q @ k^T, masked) @ v` with `q [..., Hq, Tq, D]`,
    /// `k [..., Hkv, Tk, D]`, `v [..., Hkv, Tk, Dv]` to `[..., Hq, Tq, Dv]`. Fewer key/value
    /// heads than query heads is grouped-query attention (query head `h` reads key/value
    /// head `h / (Hq / Hkv)`). A query row that sees no key gives zeros. Errors (head
    /// counts that do not divide, head dimensions that differ) name the shapes and the
    /// call site.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let q = ctx.rand_uniform(&[1, 2, 4, 8], -1.0, 1.0, 0);
    /// let o = q.attention(&q, &q, true, 0.125).eval()?;
    /// assert_eq!(o.shape(), &[1, 2, 4, 8]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        causal: impl Into<Causal>,
        scale: f64,
    ) -> Tensor {
        let opts = Attention::new().causal(causal).scale(scale);
        attention_at(self, k, v, &opts, Location::caller())
    }

    /// [`Tensor::attention`] with every setting: padding masks, an additive bias,
    /// dropout, the unfused plan.
    #[track_caller]
    pub fn attention_with(&self, k: &Tensor, v: &Tensor, opts: &Attention) -> Tensor {
        attention_at(self, k, v, opts, Location::caller())
    }
}

impl Tensor {
    /// Attention on packed projections (FlashAttention's `qkvpacked`, GPT-2's `c_attn`):
    /// this tensor is `qkv [B, T, (Hq + 2 Hkv) D]`, at each position the `q_heads` query
    /// heads, then the `kv_heads` key heads, then the value heads, `D` features each. The
    /// result is `[B, T, Hq, D]` (so `[B, T, Hq * D]` is a free reshape), and the
    /// gradient of `qkv` comes out of the backward node in `qkv`'s own layout: one
    /// projection's product feeds the attention and takes its gradient with no copy
    /// between. `opts` as [`Tensor::attention_with`] (its layout is ignored).
    ///
    /// ```
    /// use ndfuse::Attention;
    /// let ctx = ndfuse::Context::new();
    /// let qkv = ctx.rand_uniform(&[2, 10, 3 * 4 * 8], -1.0, 1.0, 0); // 4 heads of 8
    /// let o = qkv.attention_qkv(4, 4, &Attention::new().causal(true));
    /// assert_eq!(o.eval()?.shape(), &[2, 10, 4, 8]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn attention_qkv(&self, q_heads: usize, kv_heads: usize, opts: &Attention) -> Tensor {
        let at = Location::caller();
        let fail = |why: String| {
            Tensor::poisoned(
                &self.ctx,
                Error::Argument {
                    what: "attention_qkv",
                    why,
                    at,
                },
            )
        };
        let shape = match self.shape() {
            Ok(s) => s.to_vec(),
            Err(e) => return Tensor::poisoned(&self.ctx, e),
        };
        let per = q_heads + 2 * kv_heads;
        let fits = shape.len() == 3 && kv_heads > 0 && q_heads.is_multiple_of(kv_heads);
        if !fits || !shape[2].is_multiple_of(per) {
            return fail(format!(
                "qkv {shape:?} must be [B, T, (Hq + 2 Hkv) D] with Hkv = {kv_heads} dividing Hq = {q_heads} (Hq + 2 Hkv = {per})"
            ));
        }
        let (b, t, d) = (shape[0] as i64, shape[1] as i64, (shape[2] / per) as i64);
        let part = |first: usize, heads: usize| {
            let (lo, hi) = (first as i64 * d, (first + heads) as i64 * d);
            self.slice(&[SliceArg::all(), SliceArg::all(), (lo..hi).into()])
                .reshape(&[b, t, heads as i64, d])
        };
        let q = part(0, q_heads);
        let k = part(q_heads, kv_heads);
        let v = part(q_heads + kv_heads, kv_heads);
        let mut bthd = opts.clone().layout(AttentionLayout::Bthd);
        if !opts.unfused {
            bthd.packed = Some((self.clone(), q_heads, kv_heads));
        }
        attention_at(&q, &k, &v, &bthd, at)
    }
}

/// [`Tensor::attention`] as a free function.
#[track_caller]
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: impl Into<Causal>,
    scale: f64,
) -> Tensor {
    q.attention(k, v, causal, scale)
}

/// The checked extents of one attention.
struct Dims {
    batch: Vec<usize>,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
}

fn dims(q: &[usize], k: &[usize], v: &[usize]) -> Result<Dims, String> {
    let shapes = || format!("q {q:?}, k {k:?}, v {v:?}");
    let r = q.len();
    if r < 2 || k.len() != r || v.len() != r {
        return Err(format!(
            "{}: q, k and v must have one rank, 2 axes or more ([..., H, T, D])",
            shapes()
        ));
    }
    let heads = |s: &[usize]| if r >= 3 { s[r - 3] } else { 1 };
    let batch = if r >= 3 { q[..r - 3].to_vec() } else { vec![] };
    if r >= 3 && (k[..r - 3] != batch[..] || v[..r - 3] != batch[..]) {
        return Err(format!("{}: the batch axes differ", shapes()));
    }
    let (hq, hkv) = (heads(q), heads(k));
    if heads(v) != hkv {
        return Err(format!(
            "{}: k has {hkv} heads and v {}",
            shapes(),
            heads(v)
        ));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(format!(
            "{}: the {hkv} key/value heads must divide the {hq} query heads",
            shapes()
        ));
    }
    let (tq, d) = (q[r - 2], q[r - 1]);
    let (tk, dk) = (k[r - 2], k[r - 1]);
    if dk != d {
        return Err(format!(
            "{}: the head dimensions differ (q {d}, k {dk})",
            shapes()
        ));
    }
    if v[r - 2] != tk {
        return Err(format!(
            "{}: k has {tk} keys and v {} values",
            shapes(),
            v[r - 2]
        ));
    }
    Ok(Dims {
        batch,
        hq,
        hkv,
        tq,
        tk,
        d,
        dv: v[r - 1],
    })
}

fn attention_at(q: &Tensor, k: &Tensor, v: &Tensor, opts: &Attention, at: At) -> Tensor {
    let fail = |why: String| {
        Tensor::poisoned(
            &q.ctx,
            Error::Argument {
                what: "attention",
                why,
                at,
            },
        )
    };
    let (qt, kt, vt) = match (q.ty(), k.ty(), v.ty()) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Tensor::poisoned(&q.ctx, e),
    };
    let (qs, ks, vs) = (qt.shape.dims(), kt.shape.dims(), vt.shape.dims());
    if opts.layout == AttentionLayout::Bthd && [qs, ks, vs].iter().any(|s| s.len() != 4) {
        return fail(format!(
            "q {qs:?}, k {ks:?}, v {vs:?}: the [B, T, H, D] layout takes 4 axes"
        ));
    }
    // The checks read [..., H, T, D]; the other layout swaps T and H for them.
    if let AttentionLayout::Packed { .. } = opts.layout {
        return fail("the packed layout takes one operand: call qkv.attention_qkv".into());
    }
    let bhtd = |s: &[usize]| match opts.layout {
        AttentionLayout::Bhtd => s.to_vec(),
        _ => vec![s[0], s[2], s[1], s[3]],
    };
    let dm = match dims(&bhtd(qs), &bhtd(ks), &bhtd(vs)) {
        Ok(d) => d,
        Err(why) => return fail(why),
    };
    if !qt.dtype.is_float() || kt.dtype != qt.dtype || vt.dtype != qt.dtype {
        return fail(format!(
            "q {}, k {} and v {} must be one float dtype",
            qt.dtype, kt.dtype, vt.dtype
        ));
    }
    let mut scores: Vec<usize> = dm.batch.clone();
    scores.extend([dm.hq, dm.tq, dm.tk]);
    if let Some(b) = &opts.bias {
        let bt = match b.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&q.ctx, e),
        };
        let bd = bt.shape.dims();
        let fits = bd.len() <= scores.len()
            && bd
                .iter()
                .rev()
                .zip(scores.iter().rev())
                .all(|(&b, &s)| b == s || b == 1);
        if !fits || !bt.dtype.is_float() {
            return fail(format!(
                "the bias {} {:?} must be a float broadcastable to the scores {scores:?} (q {qs:?}, k {ks:?})",
                bt.dtype, bd
            ));
        }
    }
    if let Some(l) = &opts.key_lengths {
        let lt = match l.ty() {
            Ok(t) => t,
            Err(e) => return Tensor::poisoned(&q.ctx, e),
        };
        if lt.shape.dims() != &dm.batch[..] || !matches!(lt.dtype, DType::I32 | DType::I64) {
            return fail(format!(
                "key_lengths {} {:?} must be i32 or i64 of the batch axes' shape {:?} (q {qs:?})",
                lt.dtype,
                lt.shape.dims(),
                dm.batch
            ));
        }
    }
    if let Some((p, _)) = &opts.dropout {
        if !(0.0..1.0).contains(p) {
            return fail(format!("dropout p = {p} is outside [0, 1)"));
        }
    }
    let scale = opts.scale.unwrap_or(1.0 / (dm.d as f64).sqrt());
    if opts.unfused && opts.layout == AttentionLayout::Bthd {
        let swap = |t: &Tensor| t.permute(&[0, 2, 1, 3]);
        unfused(&swap(q), &swap(k), &swap(v), &dm, scale, opts, at).permute(&[0, 2, 1, 3])
    } else if opts.unfused {
        unfused(q, k, v, &dm, scale, opts, at)
    } else {
        fused(q, k, v, &dm, scale, opts, at)
    }
}

/// The fused node, on `[B, H, T, D]` views of the operands (batch axes flattened).
fn fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dm: &Dims,
    scale: f64,
    opts: &Attention,
    at: At,
) -> Tensor {
    let nb = dm.batch.len();
    let b = dm.batch.iter().product::<usize>() as i64;
    let four = |t: &Tensor, h: usize, rows: usize, d: usize| match opts.layout {
        AttentionLayout::Bhtd => t.reshape(&[b, h as i64, rows as i64, d as i64]),
        _ => t.clone(),
    };
    let mut operands = match &opts.packed {
        Some((qkv, _, _)) => vec![qkv.clone()],
        None => vec![
            four(q, dm.hq, dm.tq, dm.d),
            four(k, dm.hkv, dm.tk, dm.d),
            four(v, dm.hkv, dm.tk, dm.dv),
        ],
    };
    if let Some(bias) = &opts.bias {
        // Size-1 axes in front up to the scores' rank; the batch axes become one, of
        // extent 1 when the bias does not vary over them (broadcast first when it
        // varies over some of them only).
        let bd = bias.shape().map(|s| s.to_vec()).unwrap_or_default();
        let mut full = vec![1usize; nb + 3 - bd.len()];
        full.extend(&bd);
        let tail: Vec<i64> = full[nb..].iter().map(|&d| d as i64).collect();
        let mut t = bias.reshape(&full.iter().map(|&d| d as i64).collect::<Vec<_>>());
        let varies: usize = full[..nb].iter().product();
        let lead = if varies == 1 {
            1
        } else {
            if varies != b as usize {
                let mut widened = dm.batch.clone();
                widened.extend(&full[nb..]);
                t = t.broadcast_to(&widened);
            }
            b
        };
        operands.push(t.reshape(&[lead, tail[0], tail[1], tail[2]]));
    }
    if let Some(l) = &opts.key_lengths {
        operands.push(l.cast(DType::I64).reshape(&[b]));
    }
    if let Some((_, key)) = &opts.dropout {
        operands.push(key.clone());
    }
    let layout = match &opts.packed {
        Some((_, q_heads, kv_heads)) => AttentionLayout::Packed {
            q_heads: *q_heads,
            kv_heads: *kv_heads,
        },
        None => opts.layout,
    };
    let spec = AttentionSpec {
        layout,
        causal: opts.causal,
        scale: Scalar::F(scale),
        bias: opts.bias.is_some(),
        key_lengths: opts.key_lengths.is_some(),
        dropout: opts.dropout.as_ref().map(|(p, _)| Scalar::F(*p)),
    };
    let refs: Vec<&Tensor> = operands.iter().collect();
    Tensor::build(Op::Attention(spec), &refs, at).reshape(&out_shape(q, dm, opts.layout))
}

/// The result's shape: the query's with `Dv` last.
fn out_shape(q: &Tensor, dm: &Dims, layout: AttentionLayout) -> Vec<i64> {
    if layout == AttentionLayout::Bthd {
        return [dm.batch[0], dm.tq, dm.hq, dm.dv]
            .map(|d| d as i64)
            .to_vec();
    }
    let mut out: Vec<i64> = dm.batch.iter().map(|&d| d as i64).collect();
    if q.rank().map(|r| r >= 3).unwrap_or(true) {
        out.push(dm.hq as i64);
    }
    out.extend([dm.tq as i64, dm.dv as i64]);
    out
}

/// The primitives' graph: two products, the masks from iotas, a softmax that gives zeros
/// on a row with no visible key.
fn unfused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dm: &Dims,
    scale: f64,
    opts: &Attention,
    at: At,
) -> Tensor {
    let g = dm.hq / dm.hkv;
    let mut grouped: Vec<i64> = dm.batch.iter().map(|&d| d as i64).collect();
    grouped.extend([dm.hkv as i64, g as i64]);
    let with = |tail: &[usize]| {
        let mut s = grouped.clone();
        s.extend(tail.iter().map(|&d| d as i64));
        s
    };
    // [..., Hkv, g, T, D] for the queries, [..., Hkv, 1, T, D] for keys and values: the
    // shared heads are a broadcast in the product, never a copy.
    let qg = q.reshape(&with(&[dm.tq, dm.d]));
    let mut kv_shape = with(&[dm.tk, dm.d]);
    let r = kv_shape.len();
    kv_shape[r - 3] = 1;
    let kg = k.reshape(&kv_shape);
    kv_shape[r - 1] = dm.dv as i64;
    let vg = v.reshape(&kv_shape);
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(r - 1, r - 2);
    let s = qg.matmul(&kg.permute(&perm)) * scale;
    let mut s_shape: Vec<i64> = dm.batch.iter().map(|&d| d as i64).collect();
    s_shape.extend([dm.hq as i64, dm.tq as i64, dm.tk as i64]);
    let mut s = s.reshape(&s_shape);
    if let Some(bias) = &opts.bias {
        s = &s + &bias.cast(s.dtype().unwrap_or(DType::F32));
    }
    // Which keys each query sees: [Tq, Tk] from positions, [..., 1, 1, Tk] from lengths.
    let rows = iota_at(&q.ctx, dm.tq, 0, 1, at).expand_dims(-1);
    let cols = iota_at(&q.ctx, dm.tk, 0, 1, at);
    let mut keep: Option<Tensor> = match opts.causal {
        CausalMask::None => None,
        CausalMask::TopLeft => Some(cols.le(&rows)),
        CausalMask::BottomRight => Some(cols.le(&(&rows + (dm.tk as i64 - dm.tq as i64)))),
    };
    if let Some(l) = &opts.key_lengths {
        let mut ls: Vec<i64> = dm.batch.iter().map(|&d| d as i64).collect();
        ls.extend([1, 1, 1]);
        let seen = cols.lt(l.cast(DType::I64).reshape(&ls));
        keep = Some(match keep {
            Some(k) => k.and(&seen),
            None => seen,
        });
    }
    // Divided through the reciprocal, not `/`: the attention pass (which matches the
    // softmax's division) leaves this graph be, so it stays the reference.
    let p = match &keep {
        None => {
            let e = (&s - &s.max_keepdims(-1)).exp();
            &e * &e.sum_keepdims(-1).recip()
        }
        Some(keep) => {
            let masked = keep.where_(&s, f64::NEG_INFINITY);
            let m = masked.max_keepdims(-1);
            let m = m.eq(f64::NEG_INFINITY).where_(0.0, &m);
            let e = keep.where_((&s - &m).exp(), 0.0);
            let total = e.sum_keepdims(-1);
            &e * &total.eq(0.0).where_(1.0, &total).recip()
        }
    };
    let p = match &opts.dropout {
        None => p,
        Some((rate, key)) => p.dropout(*rate, key),
    };
    let pg = p.reshape(&with(&[dm.tq, dm.tk]));
    pg.matmul(&vg)
        .reshape(&out_shape(q, dm, AttentionLayout::Bhtd))
}
