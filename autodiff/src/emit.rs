//! A small builder over `Graph` for the rules: typed helpers (`mul`, `spread`,
//! `sum_to`...) that add nodes of the same IR and report an ill-typed node as a bug in
//! the rule that built it, plus the constant arrays (slice scatters) the caller binds.

use crate::error::AutodiffError;
use ndfuse_ir::{
    AxisSlice, BinaryOp, DType, Graph, HostArray, NodeId, Op, ReduceOp, Scalar, ScanOp, Shape,
    UnaryOp, ViewOp,
};

/// Adds gradient nodes to a graph on behalf of one rule at a time.
#[derive(Debug)]
pub(crate) struct Emit<'g> {
    pub(crate) g: &'g mut Graph,
    /// The op whose rule is running (named in a rule's error).
    pub(crate) rule: &'static str,
    /// Input nodes added for constant arrays, with their data.
    pub(crate) constants: Vec<(NodeId, HostArray)>,
}

pub(crate) type Built = Result<NodeId, AutodiffError>;

impl Emit<'_> {
    pub(crate) fn op(&mut self, op: Op, operands: &[NodeId]) -> Built {
        let rule = self.rule;
        self.g
            .add(op, operands)
            .map_err(|source| AutodiffError::Rule { rule, source })
    }

    pub(crate) fn shape(&self, x: NodeId) -> Shape {
        self.g.node(x).shape.clone()
    }

    pub(crate) fn dtype(&self, x: NodeId) -> DType {
        self.g.node(x).dtype
    }

    /// A constant of `like`'s dtype and shape.
    pub(crate) fn full_like(&mut self, like: NodeId, v: f64) -> NodeId {
        let (dtype, shape) = (self.dtype(like), self.shape(like));
        self.g.add_const(Scalar::F(v), dtype, shape)
    }

    pub(crate) fn unary(&mut self, u: UnaryOp, x: NodeId) -> Built {
        self.op(Op::Unary(u), &[x])
    }

    pub(crate) fn binary(&mut self, b: BinaryOp, x: NodeId, y: NodeId) -> Built {
        self.op(Op::Binary(b), &[x, y])
    }

    pub(crate) fn add(&mut self, x: NodeId, y: NodeId) -> Built {
        self.binary(BinaryOp::Add, x, y)
    }

    pub(crate) fn sub(&mut self, x: NodeId, y: NodeId) -> Built {
        self.binary(BinaryOp::Sub, x, y)
    }

    pub(crate) fn mul(&mut self, x: NodeId, y: NodeId) -> Built {
        self.binary(BinaryOp::Mul, x, y)
    }

    pub(crate) fn div(&mut self, x: NodeId, y: NodeId) -> Built {
        self.binary(BinaryOp::Div, x, y)
    }

    /// `x * v` for a constant `v`.
    pub(crate) fn scale(&mut self, x: NodeId, v: f64) -> Built {
        let c = self.full_like(x, v);
        self.mul(x, c)
    }

    /// `x + v` for a constant `v`.
    pub(crate) fn offset(&mut self, x: NodeId, v: f64) -> Built {
        let c = self.full_like(x, v);
        self.add(x, c)
    }

    /// `x == v` for a constant `v` (bool).
    pub(crate) fn equals(&mut self, x: NodeId, v: f64) -> Built {
        let c = self.full_like(x, v);
        self.binary(BinaryOp::Eq, x, c)
    }

    pub(crate) fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Built {
        self.op(Op::Where, &[cond, a, b])
    }

    /// `where(cond, x, 0)`.
    pub(crate) fn keep(&mut self, cond: NodeId, x: NodeId) -> Built {
        let z = self.full_like(x, 0.0);
        self.select(cond, x, z)
    }

    pub(crate) fn cast(&mut self, x: NodeId, to: DType) -> Built {
        if self.dtype(x) == to {
            return Ok(x);
        }
        self.op(Op::Cast { to }, &[x])
    }

    pub(crate) fn view(&mut self, v: ViewOp, x: NodeId) -> Built {
        self.op(Op::View(v), &[x])
    }

    /// `x` with its last two axes swapped (a matrix product's operands, the LAPACK
    /// level's factors).
    pub(crate) fn matrix_transpose(&mut self, x: NodeId) -> Built {
        let r = self.shape(x).rank();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.view(ViewOp::Permute(perm), x)
    }

    pub(crate) fn reshape(&mut self, x: NodeId, shape: &Shape) -> Built {
        if &self.shape(x) == shape {
            return Ok(x);
        }
        self.view(ViewOp::Reshape(shape.clone()), x)
    }

    pub(crate) fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keep: bool) -> Built {
        self.op(
            Op::Reduce {
                op,
                axes: axes.to_vec(),
                keepdims: keep,
            },
            &[x],
        )
    }

    /// A reduction's result (or gradient) `r` over `axes` of `shape`, broadcast back to
    /// `shape`: reshaped to the keepdims shape, then `broadcast_to`.
    pub(crate) fn spread(&mut self, r: NodeId, axes: &[usize], shape: &Shape) -> Built {
        let kept = ndfuse_ir::reduced_shape(shape, axes, true);
        let r = self.reshape(r, &kept)?;
        if &kept == shape {
            return Ok(r);
        }
        self.view(ViewOp::BroadcastTo(shape.clone()), r)
    }

    /// Sums `g` over the axes a broadcast from `shape` stretched, back to `shape` (the
    /// gradient of `broadcast_to`, and of matmul's batch broadcast).
    pub(crate) fn sum_to(&mut self, g: NodeId, shape: &Shape) -> Built {
        let from = self.shape(g);
        if &from == shape {
            return Ok(g);
        }
        let lead = from.rank() - shape.rank();
        let axes: Vec<usize> = (0..from.rank())
            .filter(|&i| i < lead || (shape.dims()[i - lead] == 1 && from.dims()[i] != 1))
            .collect();
        let s = if axes.is_empty() {
            g
        } else {
            self.reduce(ReduceOp::Sum, g, &axes, true)?
        };
        self.reshape(s, shape)
    }

    /// `x`'s positions `start..start + len` along `axis`, every other axis whole.
    pub(crate) fn slice_axis(&mut self, x: NodeId, axis: usize, start: usize, len: usize) -> Built {
        let dims = self.shape(x).dims().to_vec();
        if start == 0 && len == dims[axis] {
            return Ok(x);
        }
        let slices = dims
            .iter()
            .enumerate()
            .map(|(a, &d)| {
                if a == axis {
                    AxisSlice {
                        start: start as i64,
                        step: 1,
                        len,
                    }
                } else {
                    AxisSlice::full(d)
                }
            })
            .collect();
        self.view(ViewOp::Slice(slices), x)
    }

    /// The inclusive running `op` of `x` along `axis`.
    pub(crate) fn scan(&mut self, op: ScanOp, x: NodeId, axis: usize, reverse: bool) -> Built {
        self.op(Op::Scan { op, axis, reverse }, &[x])
    }

    /// The i64 values `start + i` (`i` in `0..shape[axis]`) laid along `axis` of `shape`
    /// and broadcast over its other axes: each position's coordinate on `axis`, offset.
    pub(crate) fn positions(&mut self, shape: &Shape, axis: usize, start: i64) -> Built {
        let len = shape.dims()[axis];
        let iota = self.op(
            Op::Iota {
                len,
                start,
                step: 1,
            },
            &[],
        )?;
        let mut line = vec![1; shape.rank()];
        line[axis] = len;
        let r = self.reshape(iota, &Shape::new(line))?;
        if &self.shape(r) == shape {
            return Ok(r);
        }
        self.view(ViewOp::BroadcastTo(shape.clone()), r)
    }

    /// An input node holding `data`, bound by the caller (see `Backward::constants`).
    pub(crate) fn constant(&mut self, data: HostArray) -> NodeId {
        let name = format!("autodiff_const{}", self.constants.len());
        let id = self.g.add_input(name, data.dtype(), data.shape().clone());
        self.constants.push((id, data));
        id
    }
}
