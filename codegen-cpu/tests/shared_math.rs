//! The shared math of small kernels against the inline math, through whole kernels.
//!
//! A kernel below 64 Ki elements calls one out-of-line function per `f32x4` and per
//! scalar (`ndfuse_vm_tanh_f32x4`, `ndfuse_vm_tanh_f32`) instead of inlining the math.
//! Where the process has a wide tier, the f32 exp and log families are precompiled
//! (the wide algorithms on one SSE register), so no math is JIT-compiled at run time;
//! elsewhere, and for every other op, they are Cranelift functions built from the
//! inline math. Either way a small kernel must give the bits of the same kernel over
//! 64 Ki elements compiled with no tier (`compile_with(kernel, None)`), whose math is
//! Cranelift's inline code: the oracle, which shares no code with the precompiled
//! functions. Inputs are edge cases among random bit patterns (NaNs, infinities,
//! subnormals) and values where every method of every op is used; they go through the
//! vector loop and the scalar tail (1003 elements) and the scalar code alone (3).
//! NaNs must match bit for bit too: both paths run the same instructions on the same
//! operands.
//!
//! `the_jit_compiled_shared_math_gets_the_same_bits` runs these checks again in a
//! child process with `NDFUSE_CPU_WIDE=0`, where the shared math is JIT-compiled, so
//! both paths are tested on every run.

mod builder;
mod sampling;

use builder::{compiled, KernelBuilder};
use ndfuse_codegen_cpu::{compile_with, wide};
use ndfuse_ir::{DType, HostArray, Shape, UnaryOp};

/// The reference kernel's domain: large enough to inline the math.
const INLINE: usize = 1 << 16;

/// The ops with a shared copy of the inline f32 math: the exp and log families, which
/// are precompiled where there is a wide tier, and `rsqrt`, which never is.
const OPS: [UnaryOp; 8] = [
    UnaryOp::Exp,
    UnaryOp::Expm1,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Erf,
    UnaryOp::Log,
    UnaryOp::Log1p,
    UnaryOp::Rsqrt,
];

/// The kernel `out = op(in)` over `n` f32.
fn kernel(op: UnaryOp, n: usize) -> ndfuse_ir::Kernel {
    let mut kb = KernelBuilder::new("k0_shared_math", &[n]);
    let x = kb.load(DType::F32);
    let y = kb.unary(op, x);
    kb.store(y);
    kb.build()
}

/// `INLINE` inputs: edge cases and thresholds, then random bit patterns, random
/// values of magnitude 2^-8..2^8, and the edge cases again at random places (so a
/// vector holds lanes of every kind).
fn inputs() -> Vec<f32> {
    // The math suites' edge cases and thresholds, and each less one.
    let mut edges = sampling::edge_cases();
    let shifted: Vec<f32> = edges.iter().map(|&x| x - 1.0).collect();
    edges.extend(shifted);
    let mut rng = sampling::Rng(0x9E37_79B9_7F4A_7C15);
    let mut next = || (rng.next() >> 32) as u32;
    let mut v = edges.clone();
    while v.len() < INLINE {
        let r = next();
        v.push(match v.len() % 4 {
            0 => f32::from_bits(r),
            1 | 2 => f32::from_bits((r & 0x807F_FFFF) | ((119 + (r >> 23) % 16) << 23)),
            _ => edges[r as usize % edges.len()],
        });
    }
    v
}

fn f32_array(xs: &[f32]) -> HostArray {
    let wide: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
    HostArray::from_f64s(DType::F32, Shape::new([xs.len()]), &wide)
}

/// `ck` (a kernel over `n` elements) on `xs`, `n` at a time (the last batch padded).
fn run(ck: &ndfuse_codegen_cpu::CompiledKernel, n: usize, xs: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(xs.len());
    for batch in xs.chunks(n) {
        let mut padded = batch.to_vec();
        padded.resize(n, 1.0);
        let mut y = HostArray::zeros(DType::F32, Shape::new([n]));
        ck.run(&[&f32_array(&padded)], &mut [&mut y])
            .unwrap_or_else(|e| panic!("{e}"));
        out.extend_from_slice(&y.as_slice::<f32>().expect("f32 output")[..batch.len()]);
    }
    out
}

/// Which shared math this process has for `op` (the child process's output names it).
fn path(op: UnaryOp) -> &'static str {
    if wide::tier().is_some() && op != UnaryOp::Rsqrt {
        "precompiled"
    } else {
        "JIT-compiled"
    }
}

#[test]
fn small_kernels_get_the_bits_of_the_inline_math() {
    let xs = inputs();
    for op in OPS {
        let reference = kernel(op, INLINE);
        let inline = compile_with(&reference, None).unwrap_or_else(|e| panic!("{e}"));
        let sym = format!("ndfuse_vm_{}_f32x4", op.name());
        assert!(
            !inline.clif().contains(&sym),
            "{}: the reference inlines its math:\n{}",
            op.name(),
            inline.clif()
        );
        let want = run(&inline, INLINE, &xs);
        for (n, calls) in [(1003, "f32x4"), (3, "f32")] {
            let small = compiled(&kernel(op, n));
            let sym = format!("ndfuse_vm_{}_{calls}", op.name());
            // The legend line of the import (`; u0:1 = ndfuse_vm_exp_f32`).
            assert!(
                small.clif().contains(&format!("= {sym}\n")),
                "{}: a kernel of {n} calls {sym}:\n{}",
                op.name(),
                small.clif()
            );
            let got = run(&small, n, &xs);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits(),
                    "{} ({} shared math, kernel of {n}): x = {:e} ({:#010x}) gave {g:e} ({:#010x}), inline {w:e} ({:#010x})",
                    op.name(),
                    path(op),
                    xs[i],
                    xs[i].to_bits(),
                    g.to_bits(),
                    w.to_bits()
                );
            }
        }
        println!(
            "{}: {} shared math, {} inputs bit-identical to the inline math",
            op.name(),
            path(op),
            xs.len()
        );
    }
}

/// The same checks with `NDFUSE_CPU_WIDE=0` in a child process (the choice is made
/// once per process): there the shared math is JIT-compiled from the inline math.
#[test]
fn the_jit_compiled_shared_math_gets_the_same_bits() {
    if std::env::var_os("NDFUSE_CPU_WIDE").is_some() {
        return; // The child itself, or a run that already chose.
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "small_kernels_get_the_bits_of_the_inline_math",
            "--exact",
            "--nocapture",
        ])
        .env("NDFUSE_CPU_WIDE", "0")
        .output()
        .expect("the test binary runs again");
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    assert!(
        out.status.success(),
        "the run with NDFUSE_CPU_WIDE=0 failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for op in OPS {
        assert!(
            text.contains(&format!("{}: JIT-compiled shared math", op.name())),
            "the child checked {} on the JIT-compiled shared math:\n{text}",
            op.name()
        );
    }
}
