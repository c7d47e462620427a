//! Matrix products: [`Tensor::matmul`] and [`matmul`] with numpy's semantics. 1-D
//! operands are promoted (a vector on the left is a row, on the right a column) and the
//! added axis removed from the result; leading (batch) axes broadcast; dtypes promote as
//! for `mul`. The product is one IR node whose element-wise consumers fuse into it as
//! an epilogue.

use crate::tensor::Tensor;
use ndfuse_ir::{DType, IrError, Op, TensorType};
use std::panic::Location;

impl Tensor {
    /// The matrix product `self @ rhs` (numpy's `matmul`).
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let a = ctx.from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let b = ctx.from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
    /// let c = a.matmul(&b).eval()?;
    /// assert_eq!((c.shape(), c.to_vec::<f32>()?), (&[2usize, 2][..], vec![4.0, 5.0, 10.0, 11.0]));
    /// // Contracted extents that differ are an error naming both operands.
    /// let err = a.matmul(&a).eval().unwrap_err().to_string();
    /// assert!(err.starts_with("matmul: f32[2,3] @ f32[2,3]: 3 != 2"), "{err}");
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        matmul_at(self, rhs, Location::caller())
    }
}

/// The matrix product `a @ b` (numpy's `matmul`); see [`Tensor::matmul`].
#[track_caller]
pub fn matmul(a: &Tensor, b: &Tensor) -> Tensor {
    matmul_at(a, b, Location::caller())
}

fn matmul_at(a: &Tensor, b: &Tensor, at: &'static Location<'static>) -> Tensor {
    let (lt, rt) = match (a.ty(), b.ty()) {
        (Ok(l), Ok(r)) => (l, r),
        (Err(e), _) | (_, Err(e)) => return Tensor::poisoned(&a.ctx, e),
    };
    const OP: &str = "matmul";
    let bad = |operand: &TensorType, why: &'static str| IrError::BadDType {
        op: OP,
        operand: operand.clone(),
        why,
    };
    for t in [&lt, &rt] {
        if t.shape.rank() == 0 {
            return a.fail(
                bad(
                    t,
                    "a 0-d operand has no matrix product (multiply with * to scale)",
                ),
                at,
            );
        }
        if t.dtype == DType::Bool {
            return a.fail(
                bad(t, "bool has no arithmetic; cast it to a number first"),
                at,
            );
        }
    }
    let (ld, rd) = (lt.shape.dims(), rt.shape.dims());
    // The contracted extents, checked here so that the message names the operands as
    // given (not as promoted from 1-D).
    let lk = ld[ld.len() - 1];
    let rk = if rd.len() == 1 {
        rd[0]
    } else {
        rd[rd.len() - 2]
    };
    if lk != rk {
        let e = IrError::Contraction {
            op: OP,
            lhs: lt.clone(),
            rhs: rt.clone(),
            lhs_k: lk,
            rhs_k: rk,
        };
        return a.fail(e, at);
    }
    let Some(dtype) = DType::promote(lt.dtype, rt.dtype) else {
        return a.fail(bad(&rt, "no common dtype"), at);
    };
    let cast = |t: &Tensor, from: DType| {
        if from == dtype {
            t.clone()
        } else {
            t.cast(dtype)
        }
    };
    let (mut x, mut y) = (cast(a, lt.dtype), cast(b, rt.dtype));
    if ld.len() == 1 {
        x = x.expand_dims(0);
    }
    if rd.len() == 1 {
        y = y.expand_dims(-1);
    }
    let mut out = Tensor::build(Op::MatMul, &[&x, &y], at);
    // Remove the axes the promotion added: the row of a 1-D left operand, the column of
    // a 1-D right one.
    if rd.len() == 1 {
        out = out.squeeze(&[-1]);
    }
    if ld.len() == 1 {
        out = out.squeeze(&[-1 - i64::from(rd.len() != 1)]);
    }
    out
}
