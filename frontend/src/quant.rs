//! Block-quantised matrices (llama.cpp's Q8_0, Q4_0 and Q4_1) and their product:
//! [`QuantMatrix`] holds the blocks of `n` rows of `k` weights as the graph's i32 operand
//! (see [`ndfuse_ir::quant`]), and [`Tensor::quant_matmul`] is `x @ w^T` read from them
//! ([`ndfuse_ir::Op::QuantMatMul`]), each weight dequantised inside the product.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use ndfuse_ir::quant::{bytes_to_words, BlockFormat, QuantSpec};
use ndfuse_ir::{DType, Op};
use std::panic::Location;

/// A matrix of `n` rows of `k` weights in a block format: the blocks as an i32 tensor
/// `[n, row_words]`, and the spec the product needs.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    blocks: Tensor,
    spec: QuantSpec,
    rows: usize,
}

impl QuantMatrix {
    /// The matrix whose rows' blocks are `bytes` (`n` rows of `k / 32` blocks each, back
    /// to back, as a GGUF file stores them), in `ctx`.
    ///
    /// # Errors
    /// `Error::Argument` at the call site when `k` is not a positive multiple of 32 or
    /// `bytes` is not `n` rows of blocks.
    #[track_caller]
    pub fn from_blocks(
        ctx: &Context,
        format: BlockFormat,
        n: usize,
        k: usize,
        bytes: &[u8],
    ) -> Result<QuantMatrix> {
        let at = Location::caller();
        let spec = QuantSpec { format, k };
        let fits = k > 0 && k.is_multiple_of(ndfuse_ir::quant::BLOCK);
        if !fits || bytes.len() != n * spec.row_bytes() {
            return Err(Error::Argument {
                what: "QuantMatrix::from_blocks",
                why: format!(
                    "{} bytes for {n} rows of {k} {} weights ({} bytes a row; k a multiple of 32)",
                    bytes.len(),
                    format.name(),
                    if fits { spec.row_bytes() } else { 0 }
                ),
                at,
            });
        }
        let blocks = ctx.from_vec(bytes_to_words(&spec, n, bytes), &[n, spec.row_words()])?;
        Ok(QuantMatrix {
            blocks,
            spec,
            rows: n,
        })
    }

    /// The matrix whose blocks are already an i32 tensor `[n, row_words]` (a graph's
    /// operand, or data made elsewhere) of rows of `k` weights in `format`. Nothing is
    /// checked here: a tensor of another dtype or shape makes [`Tensor::quant_matmul`]'s
    /// result carry the error, naming both shapes.
    pub fn from_words(blocks: &Tensor, format: BlockFormat, k: usize) -> QuantMatrix {
        let rows = blocks
            .shape()
            .map_or(0, |s| s.first().copied().unwrap_or(0));
        QuantMatrix {
            blocks: blocks.clone(),
            spec: QuantSpec { format, k },
            rows,
        }
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.spec.format
    }

    /// `[n, k]`: rows and weights per row.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.spec.k]
    }

    /// The bytes the blocks take.
    pub fn bytes(&self) -> usize {
        self.rows * self.spec.row_bytes()
    }

    /// The blocks, i32 `[n, row_words]`.
    pub fn blocks(&self) -> &Tensor {
        &self.blocks
    }
}

impl Tensor {
    /// `self @ w^T` for `self` `[..., k]` and the quantised `w` (`[n, k]`): `[..., n]`,
    /// f32. An f16, bf16 or f64 `self` is cast to f32 first. Not differentiable.
    ///
    /// ```
    /// use ndfuse::{BlockFormat, QuantMatrix};
    /// let ctx = ndfuse::Context::new();
    /// // One Q8_0 row: scale 0.5 (f16 0x3800), values 0..32.
    /// let mut block = vec![0x00u8, 0x38];
    /// block.extend((0..32).map(|v| v as u8));
    /// let w = QuantMatrix::from_blocks(&ctx, BlockFormat::Q8_0, 1, 32, &block)?;
    /// let y = ctx.ones(&[1, 32]).quant_matmul(&w).eval()?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.5 * (0..32).sum::<i32>() as f32]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn quant_matmul(&self, w: &QuantMatrix) -> Tensor {
        let at = Location::caller();
        let x = match self.dtype() {
            Ok(DType::F32) | Err(_) => self.clone(),
            Ok(_) => self.cast(DType::F32),
        };
        Tensor::build(Op::QuantMatMul(w.spec), &[&x, &w.blocks], at)
    }
}
