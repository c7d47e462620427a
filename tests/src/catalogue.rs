//! The fusion catalogue: graphs users write, each with the number of kernels fusion must
//! produce and its tolerance against the reference interpreter. Shared by the CPU
//! fusion tests (`fusion_catalogue.rs`) and the CUDA code tests (`cuda_codegen.rs`).
//!
//! Tolerance per entry: `Exact` (bit-identical, NaN matching NaN) wherever the kernel
//! rounds at the same steps as the node-by-node reference (element-wise ops, max, min,
//! argmax, integer sums); `F32_ACC` where f32 sums or products accumulate in f32 while
//! the reference sums exactly (see the constant); `F32_STEPS` and `Close` where a
//! composite reduction is lowered to steps that each round in the kernel's dtype while
//! the reference computes the whole node in f64 and rounds once.

use ndfuse::{Context, DType, SliceArg, Tensor};

/// How close a backend's result must be to the reference.
#[derive(Clone, Copy, Debug)]
pub enum Tol {
    /// Bit-identical (NaN matching NaN).
    Exact,
    /// Within `rtol * |want| + atol` (rtol, atol).
    Close(f64, f64),
}

/// f32 steps that each round: a few ulp relative, absolute at the terms' scale.
pub const F32_STEPS: Tol = Tol::Close(2e-6, 1e-6);

/// f32 sums and products accumulate in f32 in a fixed sequential order (the mission:
/// reductions accumulate in f32); the reference sums exactly in f64 and rounds once. The
/// error is bounded by (n - 1) eps sum|x|; over these rows (n up to 70 000, |x| up to
/// about 10) it measured at most 1e-6 relative, and 4e-6 absolute on a sum that cancels.
pub const F32_ACC: Tol = Tol::Close(1e-5, 1e-5);

/// One inline f32 transcendental (the CPU backend's `vmath`: at most 2 ulp each,
/// `ndfuse_codegen_cpu::f32_ulp_bound`) of exactly rounded operands: 2 ulp is at most
/// 2 · 2^-23 relative.
pub const F32_VMATH: Tol = Tol::Close(2.4e-7, 1e-30);

/// gelu's `0.5 x (1 + tanh(u))`: tanh's 2 ulp (at most 2^-23 absolute, |tanh| < 1)
/// carried through the `1 +` (which may cancel) and scaled by |x|/2 ≤ 4 over these
/// inputs (within 4 sigma): 4 · 2^-22 ≈ 9.5e-7 absolute; the tail's three roundings
/// and the tanh's own relative error, 2 · 2^-23 relative, stated with margin.
pub const F32_GELU: Tol = Tol::Close(5e-7, 1e-6);

/// `exp(x)^2 + sin(exp(x))`: exp's 1 ulp doubles in the square and moves sin's
/// argument by |t| · 2^-23, which t² dominates (no cancellation: t² + sin t > 0); with
/// the roundings, at most 4 · 2^-23 relative.
pub const F32_EXP_SIN: Tol = Tol::Close(5e-7, 1e-30);

/// One catalogue entry.
#[derive(Debug)]
pub struct Case {
    /// Shown in failures and snapshot names.
    pub name: &'static str,
    /// Kernels fusion must produce.
    pub kernels: usize,
    /// Tolerance against the reference.
    pub tol: Tol,
    /// Builds the outputs in a context.
    pub build: fn(&Context) -> Vec<Tensor>,
}

/// Normal random input of `shape` (mean 0.5, std 2), seeded.
pub fn x(ctx: &Context, shape: &[usize], seed: u64) -> Tensor {
    ctx.rand_normal(shape, 0.5, 2.0, seed)
}

/// The catalogue.
pub const CATALOGUE: &[Case] = &[
    Case {
        name: "gelu",
        kernels: 1,
        tol: F32_GELU,
        build: |c| vec![x(c, &[1000], 1).gelu()],
    },
    Case {
        name: "three-input chain",
        kernels: 1,
        tol: F32_VMATH,
        build: |c| vec![(&x(c, &[64, 16], 1) * &x(c, &[64, 16], 2) + &x(c, &[64, 16], 3)).tanh()],
    },
    Case {
        name: "exp(a*b+c).sum(1)",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            vec![
                (&x(c, &[32, 24], 1) * &x(c, &[32, 24], 2) + &x(c, &[24], 3))
                    .exp()
                    .sum(1),
            ]
        },
    },
    Case {
        name: "mean of rows",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[40, 30], 4).mean(1)],
    },
    Case {
        name: "var of rows",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[40, 30], 5).var(-1)],
    },
    Case {
        name: "std of columns",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[40, 30], 6).std(0)],
    },
    Case {
        name: "softmax",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[16, 33], 7).softmax(-1)],
    },
    Case {
        name: "log_softmax",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[16, 33], 8).log_softmax(-1)],
    },
    Case {
        name: "layernorm",
        kernels: 1,
        tol: Tol::Close(1e-5, 1e-5),
        build: |c| vec![x(c, &[12, 64], 9).layernorm(-1, 1e-5)],
    },
    Case {
        name: "column sum",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[64, 48], 10).sum(0)],
    },
    Case {
        name: "full sum",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[70_000], 11).sum(..)],
    },
    Case {
        name: "argmax and argmin",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| {
            let a = x(c, &[20, 17], 12);
            vec![a.argmax(1), a.argmin(1)]
        },
    },
    Case {
        name: "broadcast [N,1] + [M]",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![&x(c, &[50, 1], 13) + &x(c, &[40], 14)],
    },
    Case {
        name: "diamond: one value, two consumers",
        kernels: 1,
        tol: F32_EXP_SIN,
        build: |c| {
            let t = x(c, &[300], 15).exp();
            vec![&t * &t + t.sin()]
        },
    },
    Case {
        name: "transpose then add",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![&x(c, &[24, 16], 16).transpose() + &x(c, &[16, 24], 17)],
    },
    Case {
        name: "sibling reductions share one pass",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            let a = x(c, &[30, 20], 18);
            vec![a.sum(1), a.max(1), a.min(1), a.prod(1)]
        },
    },
    Case {
        name: "reductions over different axes of one input",
        kernels: 2,
        tol: F32_ACC,
        build: |c| {
            let a = x(c, &[30, 20], 19);
            vec![a.sum(0), a.sum(1)]
        },
    },
    Case {
        name: "a value consumed by reductions over different axes is materialised",
        kernels: 2,
        tol: F32_ACC,
        build: |c| {
            let y = x(c, &[30, 20], 20).exp();
            vec![y.sum(0), y.sum(1)]
        },
    },
    Case {
        name: "centering with a keepdims mean",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| {
            let a = x(c, &[25, 40], 21);
            vec![&a - &a.mean_keepdims(1)]
        },
    },
    Case {
        name: "norms",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| {
            let a = x(c, &[30, 20], 22);
            vec![a.norm1(1), a.norm2(1)]
        },
    },
    Case {
        name: "a reduction of a row-fused result",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[16, 33], 23).softmax(-1).sum(-1)],
    },
    Case {
        name: "epilogue after a reduction",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            let a = x(c, &[30, 20], 24);
            vec![(&a * &a).sum(1).sqrt() + 1.0]
        },
    },
    Case {
        name: "reduction over non-adjacent axes",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[6, 5, 7], 25).sum([0, 2])],
    },
    Case {
        name: "integer sum accumulates in i64",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![x(c, &[40, 30], 26).mul(1000.0).cast(DType::I32).sum(1)],
    },
    Case {
        name: "reshaped reduction result",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[30, 20], 27).mean(1).reshape(&[-1, 1]) * 2.0],
    },
    Case {
        name: "softmax of a transposed input",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[33, 16], 28).transpose().softmax(-1)],
    },
    Case {
        name: "a reduction of a reduction",
        kernels: 2,
        tol: F32_ACC,
        build: |c| vec![x(c, &[30, 20], 29).sum(1).max(0)],
    },
    Case {
        name: "where against a row mean",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| {
            let a = x(c, &[25, 40], 30);
            vec![a.gt(a.mean_keepdims(1)).where_(&a, 0.0)]
        },
    },
    Case {
        name: "reversed slices reduced",
        kernels: 1,
        tol: F32_ACC,
        build: |c| {
            vec![x(c, &[30, 20], 31)
                .slice(&[SliceArg::new(None, None, -3)])
                .sum(1)]
        },
    },
    Case {
        name: "a broadcast input reduced along its stride-0 axis",
        kernels: 1,
        tol: F32_STEPS,
        build: |c| vec![x(c, &[30, 1], 32).broadcast_to(&[30, 20]).mean(1)],
    },
    Case {
        name: "transpose then reduce",
        kernels: 1,
        tol: F32_ACC,
        build: |c| vec![x(c, &[20, 30], 33).transpose().sum(1)],
    },
    Case {
        name: "cast chains",
        kernels: 1,
        tol: Tol::Exact,
        build: |c| vec![(x(c, &[100], 34).cast(DType::F16).cast(DType::F32) * 2.0).cast(DType::F64)],
    },
];
