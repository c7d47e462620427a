//! The block formats of GGML's quantised tensors (Q8_0, Q4_0, Q4_1), as the GGUF
//! specification and llama.cpp's `ggml-common.h` define them: a row is cut into blocks
//! of 32 weights; each block holds an f16 scale `d` (and, for Q4_1, an f16 minimum `m`)
//! followed by the quantised values.
//!
//! - `Q8_0`: `d`, then 32 signed bytes `q`; `w = d * q`. 34 bytes.
//! - `Q4_0`: `d`, then 16 bytes whose low nibbles are weights 0..16 and high nibbles
//!   weights 16..32; `w = d * (q - 8)`. 18 bytes.
//! - `Q4_1`: `d`, `m`, then the 16 bytes of nibbles as Q4_0; `w = d * q + m`. 20 bytes.
//!
//! Dequantisation is written once here, in f32 with the format's own operations (the
//! f16 scale widened exactly, one multiply and, for Q4_1, one add), so every path that
//! reads these blocks gives the same bits.

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

    /// The 32 weights of `block` (exactly [`BlockFormat::block_bytes`] bytes) into `out`.
    pub fn dequantize_block(self, block: &[u8], out: &mut [f32; BLOCK]) {
        let half_at = |i: usize| f16::from_le_bytes([block[i], block[i + 1]]).to_f32();
        let d = half_at(0);
        match self {
            BlockFormat::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(&block[2..2 + BLOCK]) {
                    *o = d * f32::from(q as i8);
                }
            }
            BlockFormat::Q4_0 => nibbles(&block[2..], out, |q| d * (f32::from(q) - 8.0)),
            BlockFormat::Q4_1 => {
                let m = half_at(2);
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
}

/// The 32 4-bit values of 16 bytes (low nibbles first, then high), each through `f`.
fn nibbles(qs: &[u8], out: &mut [f32; BLOCK], f: impl Fn(u8) -> f32) {
    for (j, &byte) in qs[..BLOCK / 2].iter().enumerate() {
        out[j] = f(byte & 0x0f);
        out[j + BLOCK / 2] = f(byte >> 4);
    }
}
