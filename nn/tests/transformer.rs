//! The transformer layers against host references written here in f64 loops (RMSNorm,
//! both rotary layouts, the embedding's gradient, multi-head attention with grouped
//! heads and rotary embedding), construction errors, and a tiny GPT end to end: its
//! loss falls, the CPU backend and the interpreter give one loss curve, and a resumed
//! run equals a straight one bit for bit. Then the fortunes corpus (skipped with a
//! printed reason where Debian's `fortunes` is not installed, unless
//! `NDFUSE_REQUIRE_DATA=1`).

mod support;

use ndfuse::{Array, AttentionLayout, BackendKind, Context, DType, Tensor};
use ndfuse_nn::{
    AttentionConfig, BlockConfig, CharCorpus, Embedding, FeedForward, FeedForwardKind, Gpt,
    GptConfig, Init, Layer, Loss, Mode, MultiHeadAttention, NormKind, PositionEmbedding, Positions,
    RmsNorm, Rope, RopeLayout, Split, Trainer, TransformerBlock,
};
use std::path::{Path, PathBuf};
use support::{tiny_batch, tiny_config, tiny_optimizer};

fn vals(t: &Tensor) -> Vec<f64> {
    t.eval().unwrap().to_f64_vec()
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i}: {a} vs reference {b}"
        );
    }
}

// ----- shapes and errors -----

#[test]
fn every_layer_gives_the_documented_shapes() {
    let ctx = Context::new();
    let eval = Mode::eval();
    let e = Embedding::new(&ctx, "tok", 11, 8, Init::Normal(0.0, 0.02), 1).unwrap();
    let ids = ctx.from_vec(vec![0i32, 3, 10, 3, 1, 2], &[2, 3]).unwrap();
    let h = e.forward(&ids, &eval);
    assert_eq!(h.shape().unwrap(), &[2, 3, 8]);
    let p = PositionEmbedding::new(&ctx, "pos", 5, 8, Init::Normal(0.0, 0.02), 2).unwrap();
    assert_eq!(p.forward(&h, &eval).shape().unwrap(), &[2, 3, 8]);
    // Longer than the table: an error naming the shapes, not a panic.
    let long = ctx.ones(&[1, 6, 8]);
    assert!(p.forward(&long, &eval).eval().is_err());
    let rope = Rope::new(8, RopeLayout::Interleaved).unwrap();
    assert_eq!(
        rope.apply(&ctx.ones(&[2, 4, 3, 8])).shape().unwrap(),
        &[2, 4, 3, 8]
    );
    let rms = RmsNorm::new(&ctx, "rms", 8, 1e-6).unwrap();
    assert_eq!(rms.forward(&h, &eval).shape().unwrap(), &[2, 3, 8]);
    let gqa = AttentionConfig {
        n_kv_heads: 2,
        rope: Some(RopeLayout::HalfSplit),
        ..AttentionConfig::new(8, 4)
    };
    let mha = MultiHeadAttention::new(&ctx, "attn", &gqa, 3).unwrap();
    assert_eq!(mha.forward(&h, &eval).shape().unwrap(), &[2, 3, 8]);
    // One packed projection: 4 query heads of 2, then 2 key and 2 value heads of 2.
    assert_eq!(mha.projections()[0].weight().shape(), vec![8, 16]);
    for kind in [FeedForwardKind::GeluMlp, FeedForwardKind::SwiGlu] {
        let init = Init::Normal(0.0, 0.02);
        let f = FeedForward::new(&ctx, "mlp", kind, 8, 20, init, init, 4).unwrap();
        assert_eq!(f.forward(&h, &eval).shape().unwrap(), &[2, 3, 8]);
        let n = f.parameters().len();
        assert_eq!(
            n,
            if kind == FeedForwardKind::SwiGlu {
                3
            } else {
                4
            }
        );
    }
    let cfg = BlockConfig {
        norm: NormKind::RmsNorm,
        feed_forward: FeedForwardKind::SwiGlu,
        ..BlockConfig::new(8, 2)
    };
    let block = TransformerBlock::new(&ctx, "h0", &cfg, 5).unwrap();
    assert_eq!(block.forward(&h, &eval).eval().unwrap().shape(), &[2, 3, 8]);
}

#[test]
fn a_tied_gpt_shares_the_embedding_and_an_untied_one_has_a_head() {
    let ctx = Context::new();
    let cfg = GptConfig::new(16, 8, 32, 2, 4);
    let tied = Gpt::new(&ctx, &cfg).unwrap();
    let names: Vec<String> = tied.parameters().iter().map(|p| p.name().into()).collect();
    assert!(!names.iter().any(|n| n.starts_with("head")), "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "names are unique: {names:?}");
    // 2 blocks of 4 * 32^2 + 4 * 32 (attention), 2 * 32 * 128 + 128 + 32 (MLP), 4 * 32
    // (two LayerNorms); the tables 16 * 32 and 8 * 32; the final LayerNorm 2 * 32.
    let block = 4 * 32 * 32 + 4 * 32 + 2 * 32 * 128 + 128 + 32 + 4 * 32;
    assert_eq!(tied.parameter_count(), 2 * block + 16 * 32 + 8 * 32 + 64);
    let untied = Gpt::new(
        &ctx,
        &GptConfig {
            tied: false,
            ..cfg.clone()
        },
    )
    .unwrap();
    assert_eq!(untied.parameter_count(), tied.parameter_count() + 32 * 16);
    let ids = ctx.from_vec((0..16i64).collect(), &[2, 8]).unwrap();
    let logits = tied.forward(&ids, &Mode::eval());
    assert_eq!(logits.shape().unwrap(), &[2, 8, 16]);
    // A replica computes the same function from its own parameters.
    let replica = tied.duplicate();
    assert!(!replica.parameters()[0].same(&tied.parameters()[0]));
    assert_eq!(vals(&replica.forward(&ids, &Mode::eval())), vals(&logits));
    // Rotary positions: no table.
    let rope = Gpt::new(
        &ctx,
        &GptConfig {
            positions: Positions::Rope(RopeLayout::Interleaved),
            ..cfg
        },
    )
    .unwrap();
    assert_eq!(rope.parameter_count(), tied.parameter_count() - 8 * 32);
    assert_eq!(
        rope.forward(&ids, &Mode::eval()).eval().unwrap().shape(),
        &[2, 8, 16]
    );
}

#[test]
fn bad_head_counts_are_errors_naming_the_numbers() {
    let ctx = Context::new();
    let err = MultiHeadAttention::new(&ctx, "a", &AttentionConfig::new(30, 4), 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("n_heads = 4") && err.contains("d_model = 30"),
        "{err}"
    );
    let gqa = AttentionConfig {
        n_kv_heads: 3,
        ..AttentionConfig::new(32, 4)
    };
    let err = MultiHeadAttention::new(&ctx, "a", &gqa, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("n_kv_heads = 3") && err.contains("n_heads = 4"),
        "{err}"
    );
    let err = Rope::new(7, RopeLayout::HalfSplit).unwrap_err().to_string();
    assert!(err.contains('7'), "{err}");
    // Head dimension 6 / 2 = 3 is odd: rotary embedding refuses it.
    let odd = GptConfig {
        positions: Positions::Rope(RopeLayout::HalfSplit),
        ..GptConfig::new(10, 4, 6, 1, 2)
    };
    assert!(Gpt::new(&ctx, &odd).is_err());
    let err = Gpt::new(&ctx, &GptConfig::new(0, 4, 8, 1, 2))
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocab = 0"), "{err}");
}

// ----- host references -----

#[test]
fn rmsnorm_matches_the_formula() {
    let ctx = Context::new();
    let x = ctx.rand_normal(&[3, 5, 16], 0.5, 2.0, 7);
    let rms = RmsNorm::new(&ctx, "rms", 16, 1e-5).unwrap();
    // A non-trivial scale.
    let w: Vec<f32> = (0..16).map(|i| 0.5 + i as f32 * 0.1).collect();
    rms.parameters()[0]
        .replace(Array::from_vec(w.clone(), &[16]).unwrap())
        .unwrap();
    let got = vals(&rms.forward(&x, &Mode::eval()));
    let xs = vals(&x);
    let mut want = Vec::new();
    for row in xs.chunks(16) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 16.0;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        want.extend(row.iter().zip(&w).map(|(v, w)| v * inv * f64::from(*w)));
    }
    // f32 arithmetic against f64: a few ulps.
    close(&got, &want, 1e-5, "rmsnorm");
}

/// Rotary embedding on the host: `x [n, T, d]`, pair `i` at `(2i, 2i + 1)` or
/// `(i, i + d/2)`, angle `t * base^(-2i / d)`.
fn rope_host(x: &[f64], t: usize, d: usize, layout: RopeLayout, base: f64) -> Vec<f64> {
    let mut out = x.to_vec();
    for (r, row) in x.chunks(d).enumerate() {
        let pos = (r % t) as f64;
        for i in 0..d / 2 {
            let theta = pos * base.powf(-2.0 * i as f64 / d as f64);
            let (ia, ib) = match layout {
                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                RopeLayout::HalfSplit => (i, i + d / 2),
            };
            let (a, b) = (row[ia], row[ib]);
            out[r * d + ia] = a * theta.cos() - b * theta.sin();
            out[r * d + ib] = b * theta.cos() + a * theta.sin();
        }
    }
    out
}

#[test]
fn both_rope_layouts_match_the_host_and_differ_by_a_permutation() {
    let ctx = Context::new();
    let (t, d) = (40, 16);
    let x = ctx.rand_normal(&[2, 3, t, d], 0.0, 1.0, 3);
    let xs = vals(&x);
    for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
        let rope = Rope::new(d, layout).unwrap();
        let got = vals(&rope.apply(&x));
        // f32 angles up to 39 rad and f32 sin/cos against f64: a few f32 ulps of 39.
        close(
            &got,
            &rope_host(&xs, t, d, layout, 10_000.0),
            2e-5,
            &format!("{layout:?}"),
        );
        let other = rope_host(&xs, t, d, layout, 500_000.0);
        close(
            &vals(&rope.clone().base(500_000.0).apply(&x)),
            &other,
            2e-5,
            "base",
        );
    }
    // Interleaved(x) = P^-1 HalfSplit(P x), P moving feature 2i to i and 2i + 1 to
    // i + d/2.
    let to_half: Vec<i64> = (0..d as i64 / 2)
        .map(|i| 2 * i)
        .chain((0..d as i64 / 2).map(|i| 2 * i + 1))
        .collect();
    let mut back = vec![0i64; d];
    for (j, &i) in to_half.iter().enumerate() {
        back[i as usize] = j as i64;
    }
    let to_half = ctx.from_vec(to_half, &[d]).unwrap();
    let back = ctx.from_vec(back, &[d]).unwrap();
    let half = Rope::new(d, RopeLayout::HalfSplit).unwrap();
    let inter = Rope::new(d, RopeLayout::Interleaved).unwrap();
    let via_half = half.apply(&x.take(&to_half, -1)).take(&back, -1);
    // The same f32 operations on the same values, in another order of features.
    close(
        &vals(&via_half),
        &vals(&inter.apply(&x)),
        1e-6,
        "permutation",
    );
}

#[test]
fn the_embedding_gradient_is_a_scatter_add() {
    let ctx = Context::builder().dtype(DType::F64).build().unwrap();
    let (v, d) = (7, 3);
    let e = Embedding::new(&ctx, "tok", v, d, Init::Normal(0.0, 1.0), 1).unwrap();
    let ids: Vec<i64> = vec![3, 0, 3, 6, 3, 1, 0, 5, 2, 3];
    let idt = ctx.from_vec(ids.clone(), &[2, 5]).unwrap();
    let w = ctx.rand_normal(&[2, 5, d], 0.0, 1.0, 9);
    let table = e.weight().value();
    let loss = (&table.take(&idt, 0) * &w).sum(..);
    let g = ndfuse::grad(&loss, &[&table]).unwrap();
    let ws = vals(&w);
    let mut want = vec![0.0; v * d];
    for (k, &id) in ids.iter().enumerate() {
        for j in 0..d {
            want[id as usize * d + j] += ws[k * d + j];
        }
    }
    // f64 sums of at most four terms.
    close(&vals(&g[0]), &want, 1e-14, "embedding gradient");
}

/// Multi-head attention on the host from the layer's parameters: `x [B, T, C]`.
fn mha_host(mha: &MultiHeadAttention, x: &[f64], b: usize, t: usize) -> Vec<f64> {
    let cfg = mha.config();
    let (c, h, hkv, dh) = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
    let project = |l: &ndfuse_nn::Linear, x: &[f64], out: usize| -> Vec<f64> {
        let w = l.weight().array().unwrap().to_f64_vec();
        let bias = l.bias().map(|p| p.array().unwrap().to_f64_vec());
        let inp = w.len() / out;
        let mut y = vec![0.0; x.len() / inp * out];
        for (r, row) in x.chunks(inp).enumerate() {
            for o in 0..out {
                let mut s = bias.as_ref().map_or(0.0, |b| b[o]);
                for i in 0..inp {
                    s += row[i] * w[i * out + o];
                }
                y[r * out + o] = s;
            }
        }
        y
    };
    let [pqkv, po] = mha.projections();
    let width = c + 2 * hkv * dh;
    let all = project(pqkv, x, width);
    let cols = |lo: usize, n: usize| -> Vec<f64> {
        all.chunks(width)
            .flat_map(|r| r[lo..lo + n].to_vec())
            .collect()
    };
    let (q, k, v) = (cols(0, c), cols(c, hkv * dh), cols(c + hkv * dh, hkv * dh));
    // [B, T, H, Dh] -> [B, H, T, Dh] rows, then rotary embedding per (batch, head) for
    // queries and keys.
    let heads = |y: &[f64], n: usize, rotate: bool| -> Vec<f64> {
        let mut out = vec![0.0; y.len()];
        for bi in 0..b {
            for ti in 0..t {
                for hi in 0..n {
                    for j in 0..dh {
                        out[((bi * n + hi) * t + ti) * dh + j] =
                            y[((bi * t + ti) * n + hi) * dh + j];
                    }
                }
            }
        }
        match cfg.rope {
            Some(l) if rotate => rope_host(&out, t, dh, l, 10_000.0),
            _ => out,
        }
    };
    let (q, k, v) = (
        heads(&q, h, true),
        heads(&k, hkv, true),
        heads(&v, hkv, false),
    );
    let scale = 1.0 / (dh as f64).sqrt();
    let mut joined = vec![0.0; b * t * c];
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / (h / hkv);
            for i in 0..t {
                let seen = if cfg.causal { i + 1 } else { t };
                let row =
                    |r: &[f64], base: usize, j: usize| r[(base * t + j) * dh..][..dh].to_vec();
                let qi = row(&q, bi * h + hi, i);
                let s: Vec<f64> = (0..seen)
                    .map(|j| {
                        let kj = row(&k, bi * hkv + kh, j);
                        qi.iter().zip(&kj).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    let vj = row(&v, bi * hkv + kh, j);
                    for dd in 0..dh {
                        joined[(bi * t + i) * c + hi * dh + dd] += ej / z * vj[dd];
                    }
                }
            }
        }
    }
    project(po, &joined, c)
}

#[test]
fn multi_head_attention_matches_the_host() {
    let ctx = Context::new();
    let (b, t, c) = (2, 6, 16);
    let x = ctx.rand_normal(&[b, t, c], 0.0, 1.0, 21);
    let xs = vals(&x);
    let cases = [
        AttentionConfig::new(c, 4),
        AttentionConfig {
            n_kv_heads: 2,
            init: Init::Normal(0.0, 0.3),
            ..AttentionConfig::new(c, 4)
        },
        AttentionConfig {
            rope: Some(RopeLayout::HalfSplit),
            init: Init::Normal(0.0, 0.3),
            ..AttentionConfig::new(c, 4)
        },
        AttentionConfig {
            n_kv_heads: 2,
            rope: Some(RopeLayout::HalfSplit),
            init: Init::Normal(0.0, 0.3),
            ..AttentionConfig::new(c, 4)
        },
        AttentionConfig {
            n_kv_heads: 1,
            causal: false,
            rope: Some(RopeLayout::Interleaved),
            init: Init::Normal(0.0, 0.3),
            ..AttentionConfig::new(c, 4)
        },
    ];
    for (i, cfg) in cases.iter().enumerate() {
        let mha = MultiHeadAttention::new(&ctx, "attn", cfg, 30 + i as u64).unwrap();
        let got = vals(&mha.forward(&x, &Mode::eval()));
        // f32 products and a softmax against f64: a few ulps of each sum.
        close(
            &got,
            &mha_host(&mha, &xs, b, t),
            2e-5,
            &format!("case {i}: {cfg:?}"),
        );
    }
}

#[test]
fn attention_on_the_fused_op_equals_its_unfused_graph_in_training() {
    let ctx = Context::new();
    let (b, t, c) = (2, 7, 16);
    let x = ctx.rand_normal(&[b, t, c], 0.0, 1.0, 4);
    let cfg = AttentionConfig {
        n_kv_heads: 2,
        dropout: 0.25,
        rope: Some(RopeLayout::HalfSplit),
        init: Init::Normal(0.0, 0.3),
        ..AttentionConfig::new(c, 4)
    };
    let mha = MultiHeadAttention::new(&ctx, "attn", &cfg, 8).unwrap();
    let mode = Mode::train(ctx.key(11));
    let fused = mha.forward(&x, &mode);
    let [q, k, v] = mha.heads(&x, &mode).unwrap();
    let opts = mha.options(&mode).layout(AttentionLayout::Bthd).unfused();
    let y = q
        .attention_with(&k, &v, &opts)
        .reshape(&[b as i64, t as i64, c as i64]);
    let unfused = mha.projections()[1].forward(&y, &mode);
    // The same function, dropout mask included; f32 sums in another order.
    close(&vals(&fused), &vals(&unfused), 1e-5, "forward");
    let w = ctx.rand_normal(&[b, t, c], 0.0, 1.0, 5);
    let params: Vec<Tensor> = mha.parameters().iter().map(|p| p.value()).collect();
    let wrt: Vec<&Tensor> = params.iter().collect();
    let gf = ndfuse::grad(&(&fused * &w).sum(..), &wrt).unwrap();
    let gu = ndfuse::grad(&(&unfused * &w).sum(..), &wrt).unwrap();
    for (i, (a, b)) in gf.iter().zip(&gu).enumerate() {
        close(&vals(a), &vals(b), 1e-4, &format!("gradient {i}"));
    }
}

// ----- a tiny GPT end to end -----

fn tiny_trainer(ctx: &Context, cfg: &GptConfig) -> Trainer<Gpt> {
    let model = Gpt::new(ctx, cfg).unwrap();
    let opt = tiny_optimizer(&model);
    Trainer::new(model, opt, Loss::CrossEntropy)
        .unwrap()
        .seed(5)
}

fn tiny_curve(t: &mut Trainer<Gpt>, steps: std::ops::Range<u64>) -> Vec<f64> {
    steps
        .map(|s| {
            let (x, y) = tiny_batch(s);
            t.step(&x, &y).unwrap()
        })
        .collect()
}

#[test]
fn a_tiny_gpt_learns() {
    let ctx = Context::new();
    // GPT-2's recipe, and Llama's: RMSNorm, SwiGLU, rotary positions, grouped heads,
    // an untied head.
    let llama = GptConfig {
        norm: NormKind::RmsNorm,
        feed_forward: FeedForwardKind::SwiGlu,
        hidden: 64,
        positions: Positions::Rope(RopeLayout::HalfSplit),
        n_kv_heads: 2,
        tied: false,
        bias: false,
        ..tiny_config()
    };
    for cfg in [tiny_config(), llama] {
        let mut t = tiny_trainer(&ctx, &cfg);
        let losses = tiny_curve(&mut t, 0..20);
        assert!(
            (losses[0] - 16f64.ln()).abs() < 0.1,
            "a fresh model is near uniform: {}",
            losses[0]
        );
        assert!(
            losses[19] < 0.6 * losses[0],
            "20 AdamW steps of {cfg:?}: {losses:?}"
        );
    }
}

#[test]
fn cpu_and_interpreter_give_the_same_gpt_loss_curve() {
    let cfg = GptConfig {
        dropout: 0.1,
        ..tiny_config()
    };
    let curve = |backend| {
        let ctx = Context::builder().backend(backend).build().unwrap();
        let mut t = tiny_trainer(&ctx, &cfg);
        tiny_curve(&mut t, 0..20)
    };
    let (cpu, interp) = (curve(BackendKind::Cpu), curve(BackendKind::Interp));
    for (i, (a, b)) in cpu.iter().zip(&interp).enumerate() {
        // f32 tolerance: rounding differs (the interpreter rounds each op from f64, the
        // JIT fused chains and its own summation order), growing a little per step.
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "step {i}: cpu {a} vs interp {b}\n{cpu:?}\n{interp:?}"
        );
    }
}

fn bits(model: &Gpt) -> Vec<Vec<u32>> {
    model
        .parameters()
        .iter()
        .map(|p| {
            let v = p.array().unwrap().to_vec::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        })
        .collect()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ndfuse-gpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_gpt_saved_loaded_and_resumed_equals_a_straight_run_bit_for_bit() {
    let cfg = GptConfig {
        dropout: 0.1,
        ..tiny_config()
    };
    let ctx = Context::new();
    let mut straight = tiny_trainer(&ctx, &cfg);
    let all = tiny_curve(&mut straight, 0..12);

    let path = temp("gpt.safetensors");
    let first_ctx = Context::new();
    let mut first = tiny_trainer(&first_ctx, &cfg);
    let head = tiny_curve(&mut first, 0..6);
    first.save(&path).unwrap();
    drop(first);

    // Another context and other initial weights: everything comes from the file.
    let ctx2 = Context::new();
    let other = GptConfig {
        seed: 77,
        ..cfg.clone()
    };
    let mut resumed = tiny_trainer(&ctx2, &other);
    resumed.load(&path).unwrap();
    assert_eq!(resumed.optimizer().steps(), 6);
    let tail = tiny_curve(&mut resumed, 6..12);
    let got: Vec<u64> = head.iter().chain(&tail).map(|l| l.to_bits()).collect();
    assert_eq!(got, all.iter().map(|l| l.to_bits()).collect::<Vec<_>>());
    assert_eq!(bits(resumed.model()), bits(straight.model()));
}

// ----- the corpus -----

#[test]
fn a_missing_corpus_is_an_error_saying_what_to_install() {
    let err = CharCorpus::fortunes(Path::new("/nonexistent/ndfuse/fortunes"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/nonexistent/ndfuse/fortunes") && err.contains("apt-get install fortunes"),
        "{err}"
    );
}

#[test]
fn the_corpus_reads_plain_files_in_name_order_and_skips_the_rest() {
    let dir = temp("corpus");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("off")).unwrap();
    std::fs::write(dir.join("b"), "bb\n%\n").unwrap();
    std::fs::write(dir.join("a"), "aa\n%\n").unwrap();
    std::fs::write(dir.join("a.dat"), [0u8, 1, 2]).unwrap();
    std::fs::write(dir.join("off").join("rude"), "never").unwrap();
    std::os::unix::fs::symlink(dir.join("a"), dir.join("a.u8")).unwrap();
    std::os::unix::fs::symlink(dir.join("b"), dir.join("link")).unwrap();
    let c = CharCorpus::read_fortunes(&dir, 0.0).unwrap();
    assert_eq!(c.vocab(), &['\n', '%', 'a', 'b']);
    assert_eq!(c.decode(c.ids(Split::Train)), "aa\n%\nbb\n%\n");
    let names: Vec<_> = c
        .files()
        .iter()
        .map(|f| f.file_name().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn windows_are_seeded_in_range_and_shift_by_one() {
    let text: String = (0..500)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let c = CharCorpus::from_text(&text, 0.1).unwrap();
    assert_eq!(c.ids(Split::Train).len(), 450);
    assert_eq!(c.ids(Split::Validation).len(), 50);
    let w = c.windows(Split::Train, 6, 9, 42, 3).unwrap();
    assert_eq!(w.shape(), &[6, 10]);
    assert_eq!(
        w.to_vec::<i64>().unwrap(),
        c.windows(Split::Train, 6, 9, 42, 3)
            .unwrap()
            .to_vec::<i64>()
            .unwrap()
    );
    assert_ne!(
        w.to_vec::<i64>().unwrap(),
        c.windows(Split::Train, 6, 9, 42, 4)
            .unwrap()
            .to_vec::<i64>()
            .unwrap()
    );
    for row in w.to_vec::<i64>().unwrap().chunks(10) {
        // Consecutive letters of the alphabet cycle: each window is a run of the text.
        assert!(row.windows(2).all(|p| p[1] == (p[0] + 1) % 26), "{row:?}");
    }
    let (x, y) = c.batch(Split::Validation, 4, 49, 1, 0).unwrap();
    let (x, y) = (x.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap());
    assert_eq!(&x[1..49], &y[..48]);
    assert!(
        c.windows(Split::Validation, 1, 50, 0, 0).is_err(),
        "longer than the split"
    );
}

#[test]
fn the_fortunes_corpus_is_read_whole() {
    let Some(c) = support::fortunes() else {
        return;
    };
    assert!(c.files().len() >= 30, "{:?}", c.files());
    for f in c.files() {
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(!name.ends_with(".dat") && !name.ends_with(".u8"), "{name}");
        assert!(!f.to_string_lossy().contains("/off/"), "{}", f.display());
    }
    let mut sorted = c.vocab().to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, c.vocab());
    let (train, val) = (c.ids(Split::Train).len(), c.ids(Split::Validation).len());
    let n = train + val;
    assert!(n > 1_000_000, "{n} characters");
    assert_eq!(val, n / 10);
    // The text round-trips.
    let head = c.decode(&c.ids(Split::Train)[..2000]);
    assert_eq!(c.encode(&head).unwrap(), &c.ids(Split::Train)[..2000]);
    let (x, _) = c.batch(Split::Train, 32, 128, 1, 0).unwrap();
    assert!(x
        .to_vec::<i64>()
        .unwrap()
        .iter()
        .all(|&i| (i as usize) < c.vocab_size()));
}

#[test]
fn a_transformer_block_forward_is_six_kernels_and_the_attention() {
    // GPT-2's block on [B, T, C]: layernorm (1), the packed qkv product (2), attention
    // (the routine), the output product with the residual add in its epilogue (3),
    // layernorm (4), the MLP's first product with bias and GELU (5), its second with the
    // residual (6). No copies: the heads are read in place from the packed projection
    // and the attention writes [B, T, H, Dh], which is [B, T, C].
    let ctx = Context::new();
    let block = TransformerBlock::new(&ctx, "b", &BlockConfig::new(32, 4), 1).unwrap();
    let x = ctx.tensor(ctx.rand_normal(&[2, 16, 32], 0.0, 1.0, 1).eval().unwrap());
    let y = block.forward(&x, &Mode::eval());
    let (_, report) = ctx.eval_report(&[&y]).unwrap();
    let text = report.evaluation().annotated_graph();
    assert_eq!(report.kernel_count(), 6, "{text}");
    assert_eq!(text.matches("= attention ").count(), 1, "{text}");
    assert!(!text.contains("copy"), "{text}");
}
