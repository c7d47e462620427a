//! GGML's block-quantised matrices (llama.cpp's Q8_0, Q4_0 and Q4_1), the weights of
//! [`crate::Op::QuantMatMul`]. A row of `k` weights is cut into blocks of [`BLOCK`];
//! each block holds an f16 scale `d` (and, for Q4_1, an f16 minimum `m`), then the
//! quantised values:
//!
//! - `Q8_0`: `d`, then 32 signed bytes `q`; `w = d * q`. 34 bytes.
//! - `Q4_0`: `d`, then 16 bytes whose low nibbles are weights 0..16 and high nibbles
//!   weights 16..32; `w = d * (q - 8)`. 18 bytes.
//! - `Q4_1`: `d`, `m`, then the 16 bytes of nibbles as Q4_0; `w = d * q + m`. 20 bytes.
//!
//! In a graph the blocks travel as an i32 tensor `[n, row_words]`: row `r`'s bytes,
//! little-endian, from word 0 of the row, padded with zero bytes to a whole word
//! ([`QuantSpec::row_words`]). The IR has no byte dtype, and a word holds four bytes
//! exactly, so the blocks are neither widened nor copied again.

use half::f16;

/// The weights of one block.
pub const BLOCK: usize = 32;

/// A GGML quantised block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// 8-bit values with an f16 scale.
    Q8_0,
    /// 4-bit values around 8 with an f16 scale.
    Q4_0,
    /// 4-bit values with an f16 scale and an f16 minimum.
    Q4_1,
}

impl BlockFormat {
    /// The bytes of one block of 32 weights.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 2 + BLOCK,
            BlockFormat::Q4_0 => 2 + BLOCK / 2,
            BlockFormat::Q4_1 => 4 + BLOCK / 2,
        }
    }

    /// The format's GGML name.
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q8_0 => "Q8_0",
            BlockFormat::Q4_0 => "Q4_0",
            BlockFormat::Q4_1 => "Q4_1",
        }
    }

    /// The format of a GGML name.
    pub fn from_name(name: &str) -> Option<BlockFormat> {
        [BlockFormat::Q8_0, BlockFormat::Q4_0, BlockFormat::Q4_1]
            .into_iter()
            .find(|f| f.name() == name)
    }

    /// The 32 weights of `block` (exactly [`BlockFormat::block_bytes`] bytes) into `out`,
    /// in f32: the f16 scale widened exactly, one multiply and, for Q4_1, one add. Every
    /// path that dequantises these blocks to f32 gives these bits.
    pub fn dequantize_block(self, block: &[u8], out: &mut [f32; BLOCK]) {
        let d = half_at(block, 0);
        match self {
            BlockFormat::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(&block[2..2 + BLOCK]) {
                    *o = d * f32::from(q as i8);
                }
            }
            BlockFormat::Q4_0 => nibbles(&block[2..], out, |q| d * (f32::from(q) - 8.0)),
            BlockFormat::Q4_1 => {
                let m = half_at(block, 2);
                nibbles(&block[4..], out, |q| d * f32::from(q) + m);
            }
        }
    }

    /// The weights of whole blocks `data` (a multiple of the block size) into `out`
    /// (32 per block).
    pub fn dequantize(self, data: &[u8], out: &mut [f32]) {
        let mut tmp = [0f32; BLOCK];
        for (block, dst) in data
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(BLOCK))
        {
            self.dequantize_block(block, &mut tmp);
            dst.copy_from_slice(&tmp);
        }
    }

    /// The exact value of weight `j` of `block` in f64 (the reference interpreter's:
    /// `d * q` and `d * q + m` are exact in f64, whatever f32 rounds them to).
    pub fn weight_f64(self, block: &[u8], j: usize) -> f64 {
        let d = f64::from(half_at(block, 0));
        let nibble = |qs: &[u8]| {
            let byte = qs[j % (BLOCK / 2)];
            f64::from(if j < BLOCK / 2 {
                byte & 0x0f
            } else {
                byte >> 4
            })
        };
        match self {
            BlockFormat::Q8_0 => d * f64::from(block[2 + j] as i8),
            BlockFormat::Q4_0 => d * (nibble(&block[2..]) - 8.0),
            BlockFormat::Q4_1 => d * nibble(&block[4..]) + f64::from(half_at(block, 2)),
        }
    }
}

/// The f16 at byte `i` of `b`, widened.
fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 32 4-bit values of 16 bytes (low nibbles first, then high), each through `f`.
fn nibbles(qs: &[u8], out: &mut [f32; BLOCK], f: impl Fn(u8) -> f32) {
    for (j, &byte) in qs[..BLOCK / 2].iter().enumerate() {
        out[j] = f(byte & 0x0f);
        out[j + BLOCK / 2] = f(byte >> 4);
    }
}

/// The format and row length of a quantised matrix operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// The block format.
    pub format: BlockFormat,
    /// Weights per row (the product's inner extent), a multiple of [`BLOCK`].
    pub k: usize,
}

impl QuantSpec {
    /// The bytes of one row's blocks.
    pub fn row_bytes(&self) -> usize {
        self.k / BLOCK * self.format.block_bytes()
    }

    /// The i32 words a row takes (its bytes rounded up to a whole word).
    pub fn row_words(&self) -> usize {
        self.row_bytes().div_ceil(4)
    }
}

/// The bytes of a row of i32 words, little-endian.
pub fn words_to_bytes(words: &[i32], out: &mut Vec<u8>) {
    out.clear();
    out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
}

/// Rows of block bytes (`rows` rows of `spec.row_bytes()` bytes each, back to back) as
/// the i32 words of the graph's operand (each row padded to a whole word).
pub fn bytes_to_words(spec: &QuantSpec, rows: usize, bytes: &[u8]) -> Vec<i32> {
    let (rb, rw) = (spec.row_bytes(), spec.row_words());
    let mut words = Vec::with_capacity(rows * rw);
    let mut padded = vec![0u8; rw * 4];
    for row in bytes.chunks_exact(rb).take(rows) {
        padded[..rb].copy_from_slice(row);
        words.extend(
            padded
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    words
}
