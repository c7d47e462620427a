//! The cases of the suite: each built with the library API from seeded inputs, with
//! the bytes it must move at the least and, for the matrix products, the FLOPs.

use crate::options::{Kind, Size};
use half::{bf16, f16};
use ndfuse::{Attention, Context, Conv, Result, Tensor};
use ndfuse_ir::DType;

/// Builds a case's output from its inputs; `salt` is a literal the latency cases vary
/// to make a graph the kernel cache has never seen (the other cases ignore it).
type Build = fn(&[Tensor], f64) -> Tensor;

/// One case of the suite: its inputs (by type) and how its output is built.
#[derive(Clone, Debug)]
pub struct Case {
    /// The name `ndfuse bench SUITE` matches against.
    pub name: &'static str,
    /// The expression, in the CLI's language.
    pub expr: &'static str,
    /// Each input: name, shape and dtype.
    pub inputs: Vec<(&'static str, Vec<usize>, DType)>,
    /// What is measured.
    pub kind: Kind,
    /// Floating-point operations of the matrix products (`2*M*N*K` each, over the
    /// batch; the element-wise epilogues' few operations per output are not counted):
    /// the row's GFLOP/s and fraction of the FMA peak. `None` for the other cases.
    pub flops: Option<u64>,
    /// What the row's time is also set against.
    pub versus: Option<Versus>,
    /// The bytes the inputs must be read for when a case reads only part of one (a
    /// gather reads the rows its indices name, not the whole table): replaces the
    /// inputs' sizes in [`Case::ideal_bytes`]. `None`: every input is read whole.
    pub reads: Option<u64>,
    build: Build,
}

/// What a case's time is also compared with, in the same run.
#[derive(Clone, Copy, Debug)]
pub enum Versus {
    /// Another output built from the same inputs, timed right after the case
    /// (`gelu(x @ w + b)` against the bare `x @ w`); the text says what it is.
    Build(&'static str, Build),
    /// The same build on the inputs' values held in another dtype, converted once
    /// before the timed runs and timed in turns with the case (`matmul_f16` against
    /// the product of the same values in f32); the text says what it is.
    Dtype(&'static str, DType),
}

/// The 10-op element-wise graph of the latency cases: ten element-wise ops on `x`, with
/// `salt` as one of its literals.
fn ten_ops(x: &Tensor, salt: f64) -> Tensor {
    let y = x * salt; // 1 mul
    let y = (y + 1.0).tanh(); // 2 add, 3 tanh
    let y = (&y * x - 0.5).abs(); // 4 mul, 5 sub, 6 abs
    let y = (y.sqrt() + x) * 0.25; // 7 sqrt, 8 add, 9 mul
    y.maximum(x) // 10 maximum
}

const TEN_OPS: &str =
    "maximum((sqrt(abs(tanh(x * k + 1) * x - 0.5)) + x) * 0.25, x), k new each run";

/// The cases of the suite at `size`, in the order they run, with the host's shapes.
pub fn cases(size: Size) -> Vec<Case> {
    cases_on(size, false)
}

/// The cases of the suite at `size`; with `gpu`, the full shapes are a GPU's (the GPU
/// issue's figures): 2^26 elements for the element-wise rows and the full sum, rows of
/// 4096 for softmax, layernorm and a row sum (a GPU-only row), [8192, 8192] for the
/// column sum and the broadcast, 4096^3 products (with the gelu epilogue too, in f32
/// and bf16), and f16 gelu timed in turns against the same values in f32. A GPU finishes the host's shapes in tens of
/// microseconds, where launches and the tail of the grid are a large part of the time.
/// The tiny shapes are the same on both.
pub fn cases_on(size: Size, gpu: bool) -> Vec<Case> {
    let full = size == Size::Full;
    let gpu = gpu && full;
    let pick = |big: &[usize], small: &[usize]| if full { big.to_vec() } else { small.to_vec() };
    let on_gpu = |host: &[usize], device: &[usize], small: &[usize]| {
        pick(if gpu { device } else { host }, small)
    };
    let vec16m = on_gpu(&[16 << 20], &[64 << 20], &[1024]);
    let sq = on_gpu(&[4096, 4096], &[8192, 8192], &[16, 16]);
    let rows = on_gpu(&[4096, 4096], &[16384, 4096], &[16, 16]);
    let (f32_, f16_) = (DType::F32, DType::F16);
    // GPT-2's vocabulary and width, 64 sequences of 512 tokens (issue 29's figure); the
    // tiny table keeps every token in range (tokens are below 2^15).
    let (emb_rows, emb_dim) = if full { (50304, 768) } else { (1 << 15, 4) };
    let emb_tokens = pick(&[64, 512], &[2, 8]);
    let case = |name, expr, inputs, kind, build| Case {
        name,
        expr,
        inputs,
        kind,
        flops: None,
        versus: None,
        reads: None,
        build,
    };
    let tp = Kind::Throughput;
    let mut all = vec![
        case(
            "gelu",
            "gelu(x)",
            vec![("x", vec16m.clone(), f32_)],
            tp,
            |t, _| t[0].gelu(),
        ),
        case(
            "chain",
            "exp(a * b + c) * sqrt(abs(a)) - b / (1 + c * c)",
            vec![
                ("a", vec16m.clone(), f32_),
                ("b", vec16m.clone(), f32_),
                ("c", vec16m.clone(), f32_),
            ],
            tp,
            |t, _| {
                let (a, b, c) = (&t[0], &t[1], &t[2]);
                (a * b + c).exp() * a.abs().sqrt() - b / (1.0 + c * c)
            },
        ),
        case(
            "softmax",
            "softmax(x, axis=-1)",
            vec![("x", rows.clone(), f32_)],
            tp,
            |t, _| t[0].softmax(-1),
        ),
        case(
            "layernorm",
            "layernorm(x, axis=-1, eps=1e-5)",
            vec![("x", on_gpu(&[8192, 1024], &[16384, 4096], &[32, 16]), f32_)],
            tp,
            |t, _| t[0].layernorm(-1, 1e-5),
        ),
        case(
            "sum",
            "sum(x)",
            vec![("x", pick(&[64 << 20], &[4096]), f32_)],
            tp,
            |t, _| t[0].sum(..),
        ),
        case(
            "colsum",
            "sum(x, axis=0)",
            vec![("x", sq.clone(), f32_)],
            tp,
            |t, _| t[0].sum(0),
        ),
        case(
            "broadcast",
            "a * b + c",
            vec![
                ("a", sq.clone(), f32_),
                ("b", vec![sq[1]], f32_),
                ("c", vec![sq[0], 1], f32_),
            ],
            tp,
            |t, _| &t[0] * &t[1] + &t[2],
        ),
        // An embedding lookup, scaled, plus a positional table read at arange(T): one
        // kernel (the gathers are its loads). It reads the rows the tokens name, not the
        // table: tokens, then D floats per token, then the T rows of positions.
        Case {
            reads: Some({
                let (tok, d) = (emb_tokens.iter().product::<usize>() as u64, emb_dim as u64);
                tok * 8 + tok * d * 4 + emb_tokens[1] as u64 * d * 4
            }),
            ..case(
                "embedding",
                "take(emb, tokens, axis=0) * 8 + take(pos, arange(T), axis=0)",
                vec![
                    ("emb", vec![emb_rows, emb_dim], f32_),
                    ("tokens", emb_tokens.clone(), DType::I64),
                    ("pos", vec![emb_tokens[1], emb_dim], f32_),
                ],
                tp,
                |t, _| {
                    let len = t[1].shape().map_or(0, |s| s[1]);
                    t[0].take(&t[1], 0) * 8.0 + t[2].take(&t[0].context().arange_n(len), 0)
                },
            )
        },
        case(
            "scan_rows",
            "cumsum(x, axis=1)",
            vec![("x", sq.clone(), f32_)],
            tp,
            |t, _| t[0].cumsum(1),
        ),
        case(
            "argsort",
            "argsort(x)",
            vec![("x", pick(&[1 << 22], &[1000]), f32_)],
            tp,
            |t, _| t[0].argsort(-1),
        ),
        // A decode step's matrix-vector product on 4-bit weights (issue 32): SmolLM2's
        // vocabulary of 49152 rows of 576 weights in Q4_1 blocks (360 bytes a row, 90
        // words), read where they are. The blocks are random words: their f16 scales
        // are any bits, which costs the loop nothing.
        case(
            "quant_matvec",
            "quant_matmul(x, w, Q4_1, k=576)",
            vec![
                ("x", vec![1, 576], f32_),
                ("w", pick(&[49152, 90], &[64, 90]), DType::I32),
            ],
            tp,
            |t, _| {
                let w = ndfuse::QuantMatrix::from_words(&t[1], ndfuse::BlockFormat::Q4_1, 576);
                t[0].quant_matmul(&w)
            },
        ),
        Case {
            versus: gpu.then_some(Versus::Dtype("f32 values", f32_)),
            ..case(
                "gelu_f16",
                "gelu(x)",
                vec![("x", vec16m, f16_)],
                tp,
                |t, _| t[0].gelu(),
            )
        },
        case(
            "compile_new",
            TEN_OPS,
            vec![("x", vec![1000], f32_)],
            Kind::CompileNew,
            |t, salt| ten_ops(&t[0], salt),
        ),
        case(
            "compile_cached",
            "maximum((sqrt(abs(tanh(x * 1.5 + 1) * x - 0.5)) + x) * 0.25, x), again",
            vec![("x", vec![1000], f32_)],
            Kind::Cached,
            |t, _| ten_ops(&t[0], 1.5),
        ),
    ];
    if gpu {
        // A row reduction on its own (the host's rows are softmax's and layernorm's).
        all.push(case(
            "rowsum",
            "sum(x, axis=1)",
            vec![("x", rows.clone(), f32_)],
            tp,
            |t, _| t[0].sum(1),
        ));
    }
    all.extend(matmul_cases(size, gpu));
    all.push(conv_case(size));
    all.extend(linalg_cases(size));
    all
}

/// The LAPACK level (issue 33), f64 then f32: solve with 1 and 64 right-hand sides,
/// cholesky, qr, inv and det at n = 1024, svd and eigh at n = 512, and 1024 solves of
/// 32 x 32. FLOPs by LAPACK's counts (LAWN 41) for square matrices: `getrf` 2n^3/3 plus
/// `getrs` 2n^2 k per solve, `potrf` n^3/3, `geqrf` 4n^3/3 (the row also forms the
/// thin Q: counted as the factorisation alone, as the peers' rows are), inverse 2n^3,
/// det 2n^3/3; svd with vectors 22n^3 and eigh with vectors 9n^3 by convention (the
/// Golub-Van Loan estimates the peers' script uses). Inputs are uniform in [-1, 1): a
/// random square matrix is non-singular; cholesky's reads the lower triangle of a
/// matrix whose diagonal is shifted by n (diagonally dominant: positive definite);
/// eigh's reads the lower triangle of a random matrix (a symmetric one).
fn linalg_cases(size: Size) -> Vec<Case> {
    use ndfuse::linalg;
    let full = size == Size::Full;
    let (n, ns, nb, bn) = if full {
        (1024, 512, 1024, 32)
    } else {
        (16, 12, 4, 8)
    };
    let (n3, ns3) = ((n * n * n) as u64, (ns * ns * ns) as u64);
    let lu = 2 * n3 / 3;
    let mut all = Vec::new();
    for dtype in [DType::F64, DType::F32] {
        let f64_ = dtype == DType::F64;
        let pick = |a: &'static str, b: &'static str| if f64_ { a } else { b };
        let case = |name, expr, inputs, flops, build| Case {
            name,
            expr,
            inputs,
            kind: Kind::Throughput,
            flops: Some(flops),
            versus: None,
            reads: None,
            build,
        };
        let sq = |name: &'static str, m: usize| vec![(name, vec![m, m], dtype)];
        let solve = |k: usize| vec![("a", vec![n, n], dtype), ("b", vec![n, k], dtype)];
        all.extend([
            case(
                pick("linalg_solve_f64", "linalg_solve_f32"),
                "solve(a, b)",
                solve(1),
                lu + (2 * n * n) as u64,
                |t, _| linalg::solve(&t[0], &t[1]),
            ),
            case(
                pick("linalg_solve64_f64", "linalg_solve64_f32"),
                "solve(a, b), 64 right-hand sides",
                solve(64),
                lu + (2 * n * n * 64) as u64,
                |t, _| linalg::solve(&t[0], &t[1]),
            ),
            case(
                pick("linalg_cholesky_f64", "linalg_cholesky_f32"),
                "cholesky(spd)",
                sq("spd", n),
                n3 / 3,
                |t, _| linalg::cholesky(&t[0], false),
            ),
            case(
                pick("linalg_qr_f64", "linalg_qr_f32"),
                "qr(a)[0]",
                sq("a", n),
                4 * n3 / 3,
                |t, _| linalg::qr(&t[0], linalg::QrMode::Reduced).q,
            ),
            case(
                pick("linalg_inv_f64", "linalg_inv_f32"),
                "inv(a)",
                sq("a", n),
                2 * n3,
                |t, _| linalg::inv(&t[0]),
            ),
            case(
                pick("linalg_det_f64", "linalg_det_f32"),
                "det(a)",
                sq("a", n),
                lu,
                |t, _| linalg::det(&t[0]),
            ),
            case(
                pick("linalg_svd_f64", "linalg_svd_f32"),
                "svd(a, full_matrices=false)[0]",
                sq("a", ns),
                22 * ns3,
                |t, _| linalg::svd(&t[0], false).u,
            ),
            case(
                pick("linalg_eigh_f64", "linalg_eigh_f32"),
                "eigh(a)[1]",
                sq("a", ns),
                9 * ns3,
                |t, _| linalg::eigh(&t[0], false).eigenvectors,
            ),
        ]);
    }
    for dtype in [DType::F64, DType::F32] {
        let name = if dtype == DType::F64 {
            "linalg_solve_batched_f64"
        } else {
            "linalg_solve_batched_f32"
        };
        let b3 = (bn * bn * bn) as u64;
        all.push(Case {
            name,
            expr: "solve(a, b), a batch of small systems",
            inputs: vec![
                ("a", vec![nb, bn, bn], dtype),
                ("b", vec![nb, bn, 1], dtype),
            ],
            kind: Kind::Throughput,
            flops: Some(nb as u64 * (2 * b3 / 3 + (2 * bn * bn) as u64)),
            versus: None,
            reads: None,
            build: |t, _| linalg::solve(&t[0], &t[1]),
        });
    }
    all
}

/// `2*M*N*K` for each of `batch` products.
fn product_flops(batch: usize, m: usize, n: usize, k: usize) -> u64 {
    2 * (batch * m * n * k) as u64
}

/// `relu(conv2d(x, w, b, padding=1))`: a 3x3 convolution of 64 to 64 channels over
/// 56x56 images, batch 8 (a ResNet stage's layer), f32; its FLOPs are its product's
/// (`2 * N * O * out * C * 9`).
fn conv_case(size: Size) -> Case {
    let (n, c, hw) = match size {
        Size::Full => (8, 64, 56),
        Size::Tiny => (2, 3, 7),
    };
    Case {
        name: "conv2d",
        expr: "relu(conv2d(x, w, b, padding=1))",
        inputs: vec![
            ("x", vec![n, c, hw, hw], DType::F32),
            ("w", vec![c, c, 3, 3], DType::F32),
            ("b", vec![c], DType::F32),
        ],
        kind: Kind::Throughput,
        flops: Some(product_flops(n, c, hw * hw, c * 9)),
        versus: None,
        reads: None,
        build: |t, _| {
            t[0].conv2d(&t[1], Some(&t[2]), &Conv::new().padding(1))
                .relu()
        },
    }
}

/// The matrix products of the linear-algebra issue: the square f32 product, the fused
/// bias + gelu epilogue (against the bare product), attention, f16 and bf16 operands
/// (against f32), and the overhead of a cached small product.
fn matmul_cases(size: Size, gpu: bool) -> Vec<Case> {
    let full = size == Size::Full;
    // (M, N, K); the tiny shapes are not multiples of any vector or block width.
    let (sq, sq_n, sq_k) = match (full, gpu) {
        (true, true) => (4096, 4096, 4096),
        (true, false) => (2048, 2048, 2048),
        _ => (24, 40, 36),
    };
    let (gm, gn, gk) = match (full, gpu) {
        (true, true) => (4096, 4096, 4096),
        (true, false) => (4096, 4096, 1024),
        _ => (32, 48, 20),
    };
    let (heads, seq, dim) = if full { (32, 256, 64) } else { (2, 12, 8) };
    // The causal rows: [B, H, T, D] = [8, 8, 512, 64] in full.
    let (ab, ah, at) = if full { (8, 8, 512) } else { (1, 2, 70) };
    let small = if full { 64 } else { 16 };
    let product = |name, dtype: DType| Case {
        name,
        expr: "x @ w",
        inputs: vec![("x", vec![sq, sq_k], dtype), ("w", vec![sq_k, sq_n], dtype)],
        kind: Kind::Throughput,
        flops: Some(product_flops(1, sq, sq_n, sq_k)),
        versus: (dtype != DType::F32).then_some(Versus::Dtype("f32 operands", DType::F32)),
        reads: None,
        build: |t, _| t[0].matmul(&t[1]),
    };
    let bare: Build = |t, _| t[0].matmul(&t[1]);
    let gelu_epilogue = |name, dtype: DType| Case {
        name,
        expr: "gelu(x @ w + b)",
        inputs: vec![
            ("x", vec![gm, gk], dtype),
            ("w", vec![gk, gn], dtype),
            ("b", vec![gn], dtype),
        ],
        kind: Kind::Throughput,
        flops: Some(product_flops(1, gm, gn, gk)),
        versus: Some(Versus::Build("bare x @ w", bare)),
        reads: None,
        build: |t, _| (t[0].matmul(&t[1]) + &t[2]).gelu(),
    };
    let mut all = vec![
        product("matmul_f32", DType::F32),
        gelu_epilogue("matmul_gelu", DType::F32),
        Case {
            name: "attention",
            expr: "softmax(q @ transpose(k, axes=[0, 2, 1]) / 8, axis=-1) @ v",
            inputs: ["q", "k", "v"]
                .into_iter()
                .map(|n| (n, vec![heads, seq, dim], DType::F32))
                .collect(),
            kind: Kind::Throughput,
            // q @ k^T: [seq, dim] @ [dim, seq]; then [seq, seq] @ [seq, dim].
            flops: Some(2 * product_flops(heads, seq, seq, dim)),
            versus: None,
            reads: None,
            build: |t, _| {
                (t[0].matmul(&t[1].permute(&[0, 2, 1])) / 8.0)
                    .softmax(-1)
                    .matmul(&t[2])
            },
        },
        Case {
            name: "attention_causal",
            expr: "attention(q, k, v, causal=true, scale=0.125)",
            inputs: ["q", "k", "v"]
                .into_iter()
                .map(|n| (n, vec![ab, ah, at, dim], DType::F32))
                .collect(),
            kind: Kind::Throughput,
            // Two products of [T, D] by [D, T] and [T, T] by [T, D] per head, half of
            // each under the causal mask.
            flops: Some(product_flops(ab * ah, at, at, dim)),
            versus: Some(Versus::Build(
                "the primitives (softmax of masked scores)",
                |t, _| {
                    t[0].attention_with(
                        &t[1],
                        &t[2],
                        &Attention::new().causal(true).scale(0.125).unfused(),
                    )
                },
            )),
            reads: None,
            build: |t, _| t[0].attention(&t[1], &t[2], true, 0.125),
        },
        Case {
            name: "attention_causal_grad",
            expr: "grad(sum(attention(q, k, v, causal=true) * r), [q, k, v])",
            inputs: ["q", "k", "v", "r"]
                .into_iter()
                .map(|n| (n, vec![ab, ah, at, dim], DType::F32))
                .collect(),
            kind: Kind::Throughput,
            // The forward's two products and the backward's nominal five (dV, dP, dQ,
            // dK and the scores again), half of each under the mask: FlashAttention's
            // count, 3.5 times the forward.
            flops: Some(product_flops(ab * ah, at, at, dim) * 7 / 2),
            versus: Some(Versus::Build("the primitives' gradients", |t, _| {
                attention_grads(t, Attention::new().causal(true).scale(0.125).unfused())
            })),
            reads: None,
            build: |t, _| attention_grads(t, Attention::new().causal(true).scale(0.125)),
        },
        product("matmul_f16", DType::F16),
        product("matmul_bf16", DType::BF16),
        Case {
            name: "matmul_cached",
            expr: "x @ w, again",
            inputs: vec![
                ("x", vec![small, small], DType::F32),
                ("w", vec![small, small], DType::F32),
            ],
            kind: Kind::Cached,
            flops: Some(product_flops(1, small, small, small)),
            versus: None,
            reads: None,
            build: bare,
        },
    ];
    if gpu {
        all.push(gelu_epilogue("matmul_gelu_bf16", DType::BF16));
    }
    all
}

/// The gradients of `sum(attention(q, k, v) * r)` with respect to q, k and v, summed to
/// one value (so one output needs all three; the sums read them once).
fn attention_grads(t: &[Tensor], opts: Attention) -> Tensor {
    let o = t[0].attention_with(&t[1], &t[2], &opts);
    let loss = (&o * &t[3]).sum(..);
    match ndfuse::grad(&loss, &[&t[0], &t[1], &t[2]]) {
        Ok(g) => g[0].sum(..) + g[1].sum(..) + g[2].sum(..),
        // The loss is a 0-d float of float inputs: grad has nothing to refuse; should it,
        // the case's output carries an error (a reshape no shape allows) to its report.
        Err(_) => loss.reshape(&[-1, -1]),
    }
}

/// `dtype[d0,d1]`, as the IR prints types.
fn type_text(shape: &[usize], dtype: DType) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("{dtype}[{}]", dims.join(","))
}

fn nbytes(shape: &[usize], dtype: DType) -> u64 {
    shape.iter().product::<usize>() as u64 * dtype.size_bytes() as u64
}

impl Case {
    /// The output for the given inputs.
    pub fn build(&self, inputs: &[Tensor], salt: f64) -> Tensor {
        (self.build)(inputs, salt)
    }

    /// The case's input tensors, filled with the suite's seeded uniform data in
    /// [-1, 1) (the same in every run); an input named `spd` (a square matrix) has its
    /// diagonal shifted by its extent, which makes it diagonally dominant: positive
    /// definite, for a Cholesky factorisation.
    pub fn make_inputs(&self, ctx: &Context) -> Result<Vec<Tensor>> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, (name, s, d))| {
                let x = input_data(ctx, s, *d, i as u64 + 1)?;
                if *name != "spd" {
                    return Ok(x);
                }
                let n = s[s.len() - 1];
                let shift = ctx.full_dtype(&[n, n], n as f64, *d).tril(0).triu(0);
                Ok(ctx.from_array(&(&x + &shift).eval()?))
            })
            .collect()
    }

    /// `x: f32[4096,4096], b: f32[4096]`: the inputs as text.
    pub fn inputs_text(&self) -> String {
        let parts: Vec<String> = self
            .inputs
            .iter()
            .map(|(n, s, d)| format!("{n}: {}", type_text(s, *d)))
            .collect();
        parts.join(", ")
    }

    /// The bytes the case must move at the least: every input read once and the output
    /// written once, from shapes and dtypes alone (nothing is allocated or evaluated).
    pub fn ideal_bytes(&self, ctx: &Context) -> Result<u64> {
        let input_bytes: u64 = self
            .reads
            .unwrap_or_else(|| self.inputs.iter().map(|(_, s, d)| nbytes(s, *d)).sum());
        Ok(input_bytes + self.output_bytes(ctx)?)
    }

    /// The bytes of the output, from shapes and dtypes alone.
    pub fn output_bytes(&self, ctx: &Context) -> Result<u64> {
        // Constants stand in for the inputs: they carry the types without the data.
        let standins: Vec<Tensor> = self
            .inputs
            .iter()
            .map(|(_, s, d)| ctx.full_dtype(s, 0.0, *d))
            .collect();
        let out = self.build(&standins, 1.0);
        Ok(nbytes(out.shape()?, out.dtype()?))
    }

    /// Whether the case reads at least 16 times the bytes it writes (`sum`, `colsum`):
    /// its floor is then within 6% of the read-only bandwidth's, and the row also
    /// reports its fraction of that.
    pub fn mostly_reads(&self, ctx: &Context) -> Result<bool> {
        let output = self.output_bytes(ctx)?;
        Ok(output * 17 <= self.ideal_bytes(ctx)?)
    }
}

/// Uniform values in [-1, 1) (integers: in [0, 2^15)) from a fixed seed, made straight into the dtype (no f64
/// staging: the largest input is 256 MiB of f32). A SplitMix64 stream, so the data is
/// the same in every run and release.
pub(crate) fn input_data(
    ctx: &Context,
    shape: &[usize],
    dtype: DType,
    seed: u64,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // The top 24 bits: exactly representable in f32, uniform in [-1, 1).
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    match dtype {
        DType::F16 => ctx.from_vec((0..n).map(|_| f16::from_f32(next())).collect(), shape),
        DType::BF16 => ctx.from_vec((0..n).map(|_| bf16::from_f32(next())).collect(), shape),
        DType::F64 => ctx.from_vec((0..n).map(|_| f64::from(next())).collect(), shape),
        // Indices (token ids): uniform in [0, 2^15), in range for the tables they name.
        DType::I64 => ctx.from_vec(
            (0..n).map(|_| ((next() + 1.0) * 16384.0) as i64).collect(),
            shape,
        ),
        // Words of quantised blocks: two f16 of [-1, 1) each, so that whatever half of
        // a word a block format reads as a scale is finite (and the rest, as values,
        // any bits).
        DType::I32 => ctx.from_vec(
            (0..n)
                .map(|_| {
                    let (lo, hi) = (f16::from_f32(next()), f16::from_f32(next()));
                    (u32::from(hi.to_bits()) << 16 | u32::from(lo.to_bits())) as i32
                })
                .collect(),
            shape,
        ),
        _ => ctx.from_vec((0..n).map(|_| next()).collect(), shape),
    }
}
