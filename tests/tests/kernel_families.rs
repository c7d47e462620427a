//! Issue 31: kernels that differ only in their leading extent (a batch, a number of
//! rows) share one compile. The CPU kernel cache looks a new kernel up by its shape
//! family (`Kernel::family_key`) and runs a compiled member's code when the new kernel
//! lowers to the very same functions (`CompiledKernel::rebind`), so a stream of batch
//! sizes compiles each kernel once per size class, and a partial last batch compiles
//! nothing.
//!
//! One test in this file: the caches and their counters are the process's.

use ndfuse::{BackendKind, Context, Tensor};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

/// (compiles, rebinds) of the CPU kernel cache so far.
fn counters(ctx: &Context) -> (u64, u64) {
    let s = ctx.compile_cache_stats().kernels;
    (s.misses, s.rebound)
}

/// Runs `f` and returns what it compiled and rebound.
fn delta(ctx: &Context, f: impl FnOnce()) -> (u64, u64) {
    let (c0, r0) = counters(ctx);
    f();
    let (c1, r1) = counters(ctx);
    (c1 - c0, r1 - r0)
}

#[test]
fn a_stream_of_leading_extents_compiles_each_kernel_once_per_size_class() {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("a CPU context");
    let input = |shape: &[usize], seed: u64| -> Tensor {
        ctx.from_vec(values(shape.iter().product(), seed), shape)
            .expect("a tensor")
    };

    // softmax(x, -1).sum(1) over 1..=300 rows of 96: a row program. 300 rows of 96
    // stay below the wide path's size class, so one compile (and one for the single
    // row, whose index plan drops the axis) serves every row count.
    let (compiles, rebound) = delta(&ctx, || {
        for rows in 1..=300 {
            let x = input(&[rows, 96], rows as u64);
            let y = x.softmax(-1).sum(1);
            let out = ctx.eval(&[&y]).expect("eval")[0].to_f64_vec();
            assert_eq!(out.len(), rows);
            for s in out {
                assert!((s - 1.0).abs() < 1e-5, "{rows} rows: a row sums to {s}");
            }
        }
    });
    println!("softmax rows 1..=300: {compiles} compiles, {rebound} rebound");
    assert!(compiles <= 4, "{compiles} compiles for 300 row counts");
    assert!(rebound >= 296, "only {rebound} of 300 row counts rebound");

    // An MLP layer's forward pass, gelu(x @ w + b), for full batches of 64 and a
    // partial last batch of 23: the partial batch compiles nothing.
    let w = input(&[48, 32], 1);
    let b = input(&[32], 2);
    let layer = |batch: usize, seed: u64| {
        let x = input(&[batch, 48], seed);
        let y = (x.matmul(&w) + &b).gelu();
        ctx.eval(&[&y]).expect("eval")[0].to_f64_vec()
    };
    let full = delta(&ctx, || {
        layer(64, 3);
        layer(64, 4);
    });
    let partial = delta(&ctx, || {
        layer(23, 5);
    });
    println!(
        "gelu(x @ w + b): full batches {full:?}, partial batch {partial:?} (compiles, rebound)"
    );
    assert!(full.0 >= 1, "the first batch compiles");
    assert_eq!(
        partial.0, 0,
        "the partial batch compiled {} kernels",
        partial.0
    );
    assert!(partial.1 >= 1);

    // A decode loop: `softmax(q @ k[:T].T) @ v[:T]` for T = 1..=256, the shape of a
    // language model's step with a growing cache. Attention runs as a routine (no
    // compile); the three copies around it are flat loops, compiled for T = 1 (whose
    // one-row slices schedule differently) and once more for every other T.
    let (qv, kv, vv) = (values(64, 11), values(256 * 64, 12), values(256 * 64, 13));
    let q = ctx.from_vec(qv.clone(), &[1, 64]).unwrap();
    let k = ctx.from_vec(kv.clone(), &[256, 64]).unwrap();
    let v = ctx.from_vec(vv.clone(), &[256, 64]).unwrap();
    let decode = delta(&ctx, || {
        for t in 1..=256usize {
            let rows = [ndfuse::SliceArg::new(None, Some(t as i64), 1)];
            let scores = q.matmul(&k.slice(&rows).transpose());
            let y = scores.softmax(-1).matmul(&v.slice(&rows));
            let got = ctx.eval(&[&y]).expect("eval")[0].to_f64_vec();
            // The step in f64: scores, their softmax, the weighted rows of v.
            let s: Vec<f64> = (0..t)
                .map(|j| (0..64).map(|d| f64::from(qv[d] * kv[j * 64 + d])).sum())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..64 {
                let want: f64 = (0..t).map(|j| e[j] / z * f64::from(vv[j * 64 + d])).sum();
                assert!(
                    (got[d] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "T = {t}, element {d}: {} vs {want}",
                    got[d]
                );
            }
        }
    });
    println!(
        "decode loop, T = 1..=256: {} compiles, {} rebound",
        decode.0, decode.1
    );
    assert!(decode.0 <= 6, "{} compiles over 256 decode steps", decode.0);

    // The rebound kernel computes what the interpreter does.
    let x = input(&[23, 48], 5);
    let y = (x.matmul(&w) + &b).gelu();
    let jit = ctx.eval(&[&y]).expect("eval")[0].to_f64_vec();
    let interp = Context::builder()
        .backend(BackendKind::Interp)
        .build()
        .expect("an interpreter context");
    let xi = interp.from_vec(values(23 * 48, 5), &[23, 48]).unwrap();
    let wi = interp.from_vec(values(48 * 32, 1), &[48, 32]).unwrap();
    let bi = interp.from_vec(values(32, 2), &[32]).unwrap();
    let yi = (xi.matmul(&wi) + &bi).gelu();
    let want = interp.eval(&[&yi]).expect("eval")[0].to_f64_vec();
    for (k, (a, e)) in jit.iter().zip(&want).enumerate() {
        assert!(
            (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
            "element {k}: {a} vs {e}"
        );
    }
}

/// Inputs for `kernel`'s buffers: values in [-2, 2) (0 and 1 for bool), from `seed`.
fn kernel_inputs(kernel: &ndfuse_ir::Kernel, seed: u64) -> Vec<ndfuse_ir::HostArray> {
    kernel
        .inputs
        .iter()
        .enumerate()
        .map(|(k, b)| {
            let vals: Vec<f64> = values(b.len, seed + k as u64)
                .iter()
                .map(|&v| match b.dtype {
                    ndfuse::DType::Bool => f64::from(u8::from(v > 0.0)),
                    d if !d.is_float() => f64::from(v.round()),
                    _ => f64::from(v),
                })
                .collect();
            ndfuse_ir::HostArray::from_f64s(b.dtype, ndfuse_ir::Shape::new([b.len]), &vals)
        })
        .collect()
}

/// Runs compiled `code` over `kernel`'s buffers and returns the outputs' bits.
fn run_code(
    code: &ndfuse_codegen_cpu::CompiledKernel,
    kernel: &ndfuse_ir::Kernel,
    inputs: &[ndfuse_ir::HostArray],
) -> Vec<Vec<u64>> {
    let mut outs: Vec<ndfuse_ir::HostArray> = kernel
        .outputs
        .iter()
        .map(|b| ndfuse_ir::HostArray::zeros(b.dtype, ndfuse_ir::Shape::new([b.len])))
        .collect();
    let ins: Vec<&ndfuse_ir::HostArray> = inputs.iter().collect();
    let mut refs: Vec<&mut ndfuse_ir::HostArray> = outs.iter_mut().collect();
    code.run(&ins, &mut refs).expect("the arguments fit");
    outs.iter()
        .map(|o| o.to_f64s().iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The differential check of issue 31: graphs built at many leading extents, each
/// kernel compiled for the first extent of its family and rebound for the others;
/// wherever a rebind is accepted, the rebound code gives the same bits as a kernel
/// compiled for that very shape, on the same inputs.
#[test]
fn rebound_kernels_give_the_bits_of_kernels_compiled_for_their_shape() {
    use ndfuse::DType;
    type Build = fn(&Context, usize) -> Vec<Tensor>;
    let cases: &[(&str, Build)] = &[
        ("softmax rows of 96", |ctx, l| {
            vec![ctx.rand_uniform(&[l, 96], -2.0, 2.0, 1).softmax(-1)]
        }),
        ("sum over the last two axes", |ctx, l| {
            vec![ctx.rand_uniform(&[l, 8, 16], -2.0, 2.0, 2).sum(2).sum(1)]
        }),
        ("gelu with a broadcast bias, 4096 wide", |ctx, l| {
            let x = ctx.rand_uniform(&[l, 4096], -2.0, 2.0, 3);
            let b = ctx.rand_uniform(&[4096], -1.0, 1.0, 4);
            vec![(x + &b).gelu()]
        }),
        ("exp times a per-row scale", |ctx, l| {
            let x = ctx.rand_uniform(&[l, 3, 40], -2.0, 2.0, 5);
            let s = ctx.rand_uniform(&[l, 3, 1], 0.5, 1.5, 6);
            vec![x.exp() * &s]
        }),
        (
            "an f16 cast, an argmax and a layernorm over rows",
            |ctx, l| {
                let x = ctx.rand_uniform(&[l, 50], -2.0, 2.0, 7);
                vec![x.cast(DType::F16) * 2.0, x.argmax(1), x.layernorm(-1, 1e-5)]
            },
        ),
        ("integer arithmetic", |ctx, l| {
            let x = ctx.rand_uniform(&[l, 33], -20.0, 20.0, 8).cast(DType::I32);
            vec![x.clone() * &x + 3]
        }),
    ];
    let extents = [2, 1, 3, 5, 16, 17, 100, 333];
    let (mut rebound, mut members) = (0, 0);
    for &(name, build) in cases {
        let ctx = Context::new();
        // Compiled members by family key, and each kernel's compile for the check.
        let mut families: Vec<(ndfuse_ir::Kernel, ndfuse_codegen_cpu::CompiledKernel)> = Vec::new();
        for l in extents {
            let outs = build(&ctx, l);
            let refs: Vec<&Tensor> = outs.iter().collect();
            let g = ctx.graph(&refs).expect("builds");
            let schedule = ndfuse_passes::schedule(&g);
            for kernel in schedule.kernels() {
                let Some(key) = kernel.family_key() else {
                    continue;
                };
                let compiled = ndfuse_codegen_cpu::compile(kernel).expect("compiles");
                let Some((_, first)) = families.iter().find(|(k, _)| *k == key) else {
                    families.push((key, compiled));
                    continue;
                };
                members += 1;
                let Some(code) = first.rebind(kernel).expect("lowers") else {
                    continue;
                };
                rebound += 1;
                assert!(code.shares_code());
                let inputs = kernel_inputs(kernel, l as u64);
                assert_eq!(
                    run_code(&code, kernel, &inputs),
                    run_code(&compiled, kernel, &inputs),
                    "{name}, leading extent {l}: {} rebound gives other bits than compiled\n{kernel}",
                    kernel.name
                );
            }
        }
    }
    println!("{rebound} of {members} later members rebound");
    // Most members share code: only extent 1 and the wide path's size class differ.
    assert!(
        rebound * 3 >= members * 2,
        "only {rebound} of {members} rebound"
    );
}
