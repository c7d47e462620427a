//! `quant_matmul` (x @ w^T with w in llama.cpp's Q8_0, Q4_0 and Q4_1 blocks) on the CPU
//! and in the reference interpreter, against the formats' definitions written here
//! from the GGUF specification: every weight decoded in f64 from its block, the
//! product summed in f64. Tolerance: the CPU accumulates in f32, so each result is held
//! to 1e-5 of the sum of |x| |w| over its row (about 32 f32 roundings' worth at k =
//! 576), and the interpreter (f64, rounded once) to f32's half ulp of the same.

use half::f16;
use ndfuse::{BackendKind, BlockFormat, Context, QuantMatrix};

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` rows of `k` weights in `format`: random scales (and minimums) and values.
fn random_blocks(format: BlockFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n * k / 32 {
        bytes.extend(f16::from_f64(rng.uniform(0.001, 0.1)).to_le_bytes());
        if format == BlockFormat::Q4_1 {
            bytes.extend(f16::from_f64(rng.uniform(-0.5, 0.5)).to_le_bytes());
        }
        let values = if format == BlockFormat::Q8_0 { 32 } else { 16 };
        bytes.extend((0..values).map(|_| rng.next() as u8));
    }
    bytes
}

/// Weight `j` of `block`, from the specification: Q8_0 `d * q` (q signed), Q4_0
/// `d * (q - 8)`, Q4_1 `d * q + m`; 4-bit values are the low nibbles of bytes 0..16 for
/// weights 0..16 and the high nibbles for weights 16..32.
fn spec_weight(format: BlockFormat, block: &[u8], j: usize) -> f64 {
    let half = |i: usize| f64::from(f16::from_le_bytes([block[i], block[i + 1]]));
    let nibble = |at: usize| {
        let b = block[at + j % 16];
        f64::from(if j < 16 { b & 15 } else { b >> 4 })
    };
    match format {
        BlockFormat::Q8_0 => half(0) * f64::from(block[2 + j] as i8),
        BlockFormat::Q4_0 => half(0) * (nibble(2) - 8.0),
        BlockFormat::Q4_1 => half(0) * nibble(4) + half(2),
    }
}

fn block_bytes(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q8_0 => 34,
        BlockFormat::Q4_0 => 18,
        BlockFormat::Q4_1 => 20,
    }
}

/// The rows' weights `[n, k]`, decoded by the specification.
fn decode(format: BlockFormat, bytes: &[u8], n: usize, k: usize) -> Vec<f64> {
    let bb = block_bytes(format);
    (0..n * k)
        .map(|i| {
            let b = i / 32;
            spec_weight(format, &bytes[b * bb..(b + 1) * bb], i % 32)
        })
        .collect()
}

fn ctx(backend: BackendKind) -> Context {
    Context::builder().backend(backend).build().unwrap()
}

#[test]
fn quant_matmul_matches_the_formats_definitions() {
    let mut rng = Rng(0x1234_5678);
    let (cpu, interp) = (ctx(BackendKind::Cpu), ctx(BackendKind::Interp));
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0, BlockFormat::Q4_1] {
        // m: the matrix-vector path (1..=4) and the dequantise-and-GEMM path (5, 70);
        // n: within one task, and across several with a ragged last one.
        for (m, n, k) in [
            (1, 1, 32),
            (1, 100, 576),
            (2, 33, 96),
            (3, 65, 64),
            (4, 7, 160),
            (5, 70, 96),
            (70, 130, 64),
        ] {
            let bytes = random_blocks(format, n, k, &mut rng);
            let x: Vec<f32> = (0..m * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
            let w = decode(format, &bytes, n, k);
            for (c, exact) in [(&cpu, false), (&interp, true)] {
                let wq = QuantMatrix::from_blocks(c, format, n, k, &bytes).unwrap();
                let xt = c.from_vec(x.clone(), &[m, k]).unwrap();
                let got = xt.quant_matmul(&wq).eval().unwrap();
                assert_eq!(got.shape(), &[m, n]);
                let got = got.to_vec::<f32>().unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                        let want: f64 = xr.iter().zip(wr).map(|(&a, &b)| f64::from(a) * b).sum();
                        let scale: f64 = xr
                            .iter()
                            .zip(wr)
                            .map(|(&a, &b)| (f64::from(a) * b).abs())
                            .sum();
                        let tol = if exact {
                            (want.abs() * 6e-8).max(1e-30)
                        } else {
                            1e-5 * scale + 1e-30
                        };
                        let g = f64::from(got[i * n + j]);
                        assert!(
                            (g - want).abs() <= tol,
                            "{format:?} m={m} n={n} k={k} [{i}, {j}] ({}): {g} vs {want} (tol {tol})",
                            if exact { "interp" } else { "cpu" }
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn quant_matmul_fuses_with_the_work_around_it() {
    // A cast and scale before (x in bf16, times 2), bias and GELU after, batched x.
    let mut rng = Rng(7);
    let (cpu, interp) = (ctx(BackendKind::Cpu), ctx(BackendKind::Interp));
    let (b, t, n, k) = (2, 3, 40, 64);
    let bytes = random_blocks(BlockFormat::Q4_1, n, k, &mut rng);
    let x: Vec<f32> = (0..b * t * k)
        .map(|_| rng.uniform(-1.0, 1.0) as f32)
        .collect();
    let run = |c: &Context| {
        let w = QuantMatrix::from_blocks(c, BlockFormat::Q4_1, n, k, &bytes).unwrap();
        let x = c
            .from_vec(x.clone(), &[b, t, k])
            .unwrap()
            .cast(ndfuse::DType::BF16);
        let y = (&x * 2.0).quant_matmul(&w) + 0.25;
        y.gelu().eval().unwrap().to_vec::<f32>().unwrap()
    };
    let (got, want) = (run(&cpu), run(&interp));
    assert_eq!(got.len(), b * t * n);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{g} vs {w}");
    }
}

#[test]
fn quant_matmul_errors_name_the_shapes() {
    let c = Context::new();
    let e = QuantMatrix::from_blocks(&c, BlockFormat::Q8_0, 2, 48, &[0; 68]).unwrap_err();
    assert!(e.to_string().contains("k a multiple of 32"), "{e}");
    let e = QuantMatrix::from_blocks(&c, BlockFormat::Q8_0, 2, 32, &[0; 67]).unwrap_err();
    assert!(
        e.to_string()
            .contains("67 bytes for 2 rows of 32 Q8_0 weights"),
        "{e}"
    );
    let w = QuantMatrix::from_blocks(&c, BlockFormat::Q8_0, 2, 32, &[0; 68]).unwrap();
    let e = c.ones(&[3, 64]).quant_matmul(&w).eval().unwrap_err();
    assert!(
        e.to_string().contains("f32 [..., 32]") && e.to_string().contains("[3,64]"),
        "{e}"
    );
    // Not differentiable: the gradient says why.
    let x = c.ones(&[1, 32]);
    let e = ndfuse::grad(&x.quant_matmul(&w).sum(..), &[&x]).unwrap_err();
    assert!(e.to_string().contains("quant_matmul"), "{e}");
}
