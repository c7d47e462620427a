//! `MatMul` and `Gemm`: products through ndfuse's contraction (the fused-epilogue GEMM).

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::Tensor;

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "MatMul",
        "numpy's matmul: 1-D operands promoted, batch axes broadcast",
    ),
    Support::new(
        "Gemm",
        "alpha, beta, transA, transB; C broadcast (optional)",
    ),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "MatMul" => matmul(n),
        "Gemm" => gemm(n),
        _ => return None,
    })
}

fn matmul(n: &Node) -> Result<Vec<Tensor>> {
    Ok(vec![n.input(0)?.matmul(n.input(1)?)])
}

fn gemm(n: &Node) -> Result<Vec<Tensor>> {
    let (mut a, mut b) = (n.input(0)?.clone(), n.input(1)?.clone());
    if n.int_or("transA", 0)? != 0 {
        a = a.transpose();
    }
    if n.int_or("transB", 0)? != 0 {
        b = b.transpose();
    }
    let alpha = n.float_or("alpha", 1.0)?;
    let beta = n.float_or("beta", 1.0)?;
    let mut y = a.matmul(&b);
    if alpha != 1.0 {
        y = y.mul(alpha);
    }
    if let Some(c) = n.opt_input(2) {
        y = if beta == 1.0 {
            y.add(c)
        } else {
            y.add(c.mul(beta))
        };
    }
    Ok(vec![y])
}
