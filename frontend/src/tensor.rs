//! The lazy tensor handle: a cheap, shareable pointer into an expression DAG that
//! nothing evaluates until `eval`.

use crate::array::Array;
use crate::context::Context;
use crate::error::{Error, Result};
use ndfuse_ir::{DType, HostArray, IrError, Op, Scalar, Shape, TensorType};
use std::panic::Location;
use std::sync::Arc;

/// A node of the user's expression DAG.
#[derive(Debug)]
pub(crate) struct Expr {
    pub(crate) op: Op,
    pub(crate) dtype: DType,
    pub(crate) shape: Shape,
    pub(crate) src: Vec<Tensor>,
    /// Data of a leaf (`Op::Input`).
    pub(crate) data: Option<Arc<HostArray>>,
}

impl Drop for Expr {
    /// Drops the expression DAG iteratively: the default recursive drop of a chain of a
    /// hundred thousand ops would overflow the stack.
    fn drop(&mut self) {
        let mut stack: Vec<Tensor> = std::mem::take(&mut self.src);
        while let Some(t) = stack.pop() {
            // The last handle: take the operands before the node itself drops.
            if let Ok(Inner::Ok(mut e)) = Arc::try_unwrap(t.inner) {
                stack.append(&mut e.src);
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum Inner {
    Ok(Expr),
    /// A tensor built by an illegal op: the first error, with its call site.
    Err(Error),
}

/// A lazily evaluated n-dimensional array.
///
/// Building ops only records them; [`Tensor::eval`] (or [`Context::eval`] for several
/// outputs sharing one graph) compiles the whole expression into fused kernels and
/// runs them. Cloning is a reference-count increment; tensors are `Send + Sync`.
///
/// Ops never panic on bad input: an op that is not legal on its operands (shapes that
/// do not broadcast, an axis out of range, bool arithmetic...) returns a tensor that
/// carries the error, with the call site of the op, and `eval` returns it as `Err`.
///
/// ```
/// use ndfuse::{Context, Tensor};
/// let ctx = Context::new();
/// let a = ctx.from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let y = (&a * &a + 1.0).exp().sum(1);
/// assert_eq!(y.shape()?, &[2]);
/// let out = y.eval()?.to_vec::<f32>()?;
/// assert!((out[0] - (2f32.exp() + 5f32.exp())).abs() < 1e-3);
/// # Ok::<(), ndfuse::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Tensor {
    pub(crate) inner: Arc<Inner>,
    pub(crate) ctx: Context,
}

impl Tensor {
    pub(crate) fn from_expr(ctx: &Context, e: Expr) -> Tensor {
        Tensor {
            inner: Arc::new(Inner::Ok(e)),
            ctx: ctx.clone(),
        }
    }

    pub(crate) fn poisoned(ctx: &Context, e: Error) -> Tensor {
        Tensor {
            inner: Arc::new(Inner::Err(e)),
            ctx: ctx.clone(),
        }
    }

    /// A leaf holding `data`.
    pub(crate) fn leaf(ctx: &Context, data: HostArray) -> Tensor {
        let e = Expr {
            op: Op::Input {
                name: String::new(),
            },
            dtype: data.dtype(),
            shape: data.shape().clone(),
            src: Vec::new(),
            data: Some(Arc::new(data)),
        };
        Tensor::from_expr(ctx, e)
    }

    /// A constant of `shape` filled with `value` converted to `dtype`.
    pub(crate) fn constant(ctx: &Context, value: Scalar, dtype: DType, shape: Shape) -> Tensor {
        let e = Expr {
            op: Op::Const {
                value: value.cast(dtype),
            },
            dtype,
            shape,
            src: Vec::new(),
            data: None,
        };
        Tensor::from_expr(ctx, e)
    }

    pub(crate) fn expr(&self) -> Result<&Expr> {
        match &*self.inner {
            Inner::Ok(e) => Ok(e),
            Inner::Err(err) => Err(err.clone()),
        }
    }

    /// The shape, or the error this tensor carries.
    pub fn shape(&self) -> Result<&[usize]> {
        Ok(self.expr()?.shape.dims())
    }

    /// The element type, or the error this tensor carries.
    pub fn dtype(&self) -> Result<DType> {
        Ok(self.expr()?.dtype)
    }

    /// The number of axes, or the error this tensor carries.
    pub fn rank(&self) -> Result<usize> {
        Ok(self.expr()?.shape.rank())
    }

    /// The error this tensor carries, if it was built by an illegal op.
    pub fn error(&self) -> Option<&Error> {
        match &*self.inner {
            Inner::Ok(_) => None,
            Inner::Err(e) => Some(e),
        }
    }

    /// Whether this tensor holds data of its own (made from a vector, an array, a file or
    /// a random constructor) rather than being an expression over other tensors.
    pub fn is_data(&self) -> bool {
        matches!(&*self.inner, Inner::Ok(e) if e.data.is_some())
    }

    /// The context this tensor was built in (its default dtype and backend).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Evaluates this tensor on its context's backend.
    pub fn eval(&self) -> Result<Array> {
        let mut out = self.ctx.eval(&[self])?;
        Ok(out.pop().expect("one output per tensor"))
    }

    pub(crate) fn ty(&self) -> Result<TensorType> {
        let e = self.expr()?;
        Ok(TensorType {
            dtype: e.dtype,
            shape: e.shape.clone(),
        })
    }

    /// Builds `op` over `src`, inferring its type; a poisoned tensor (with `at`) when
    /// the op is illegal or an operand is already poisoned.
    pub(crate) fn build(op: Op, src: &[&Tensor], at: &'static Location<'static>) -> Tensor {
        Tensor::build_in(&src[0].ctx, op, src, at)
    }

    /// [`Tensor::build`] in `ctx`, for ops that may have no operand (an iota).
    pub(crate) fn build_in(
        ctx: &Context,
        op: Op,
        src: &[&Tensor],
        at: &'static Location<'static>,
    ) -> Tensor {
        let mut types = Vec::with_capacity(src.len());
        for s in src {
            match s.ty() {
                Ok(t) => types.push(t),
                Err(e) => return Tensor::poisoned(ctx, e),
            }
        }
        match ndfuse_ir::infer(&op, &types) {
            Ok(t) => Tensor::from_expr(
                ctx,
                Expr {
                    op,
                    dtype: t.dtype,
                    shape: t.shape,
                    src: src.iter().map(|&s| s.clone()).collect(),
                    data: None,
                },
            ),
            Err(source) => Tensor::poisoned(ctx, Error::Op { source, at }),
        }
    }

    /// A poisoned tensor for `source` at `at`, in this tensor's context.
    pub(crate) fn fail(&self, source: IrError, at: &'static Location<'static>) -> Tensor {
        Tensor::poisoned(&self.ctx, Error::Op { source, at })
    }
}
