//! The kernel builder: accumulates one fused group as a [`Kernel`] (deduplicated buffers
//! and loads, an SSA body with levels, stores) and lowers composite reductions to
//! primitives on the way.

use super::boundary::Source;
use super::rows::keepdims_shape;
use crate::plan::{self, TargetDesc};
use crate::schedule::Step;
use ndfuse_ir::{
    reduced_shape, Accumulate, ArgReduceOp, BinaryOp, Buffer, Contraction, DType, Expr, Graph,
    Instr, Kernel, Level, NodeId, Prologue, ReduceOp, Scalar, Shape, Store, UnaryOp, ValueId, View,
};

/// The product's input index until [`KernelBuilder::finish`] knows it (the last input).
const PRODUCT: usize = usize::MAX;
use std::collections::HashMap;

/// Accumulates one kernel: deduplicated buffers and loads, SSA body with levels, stores.
pub(super) struct KernelBuilder {
    pub(super) domain: Shape,
    pub(super) reduce_axes: Vec<usize>,
    pub(super) inputs: Vec<NodeId>,
    pub(super) buffers: Vec<Buffer>,
    pub(super) body: Vec<Instr>,
    pub(super) levels: Vec<Level>,
    pub(super) memo: HashMap<Instr, ValueId>,
    pub(super) outputs: Vec<Buffer>,
    pub(super) stores: Vec<Store>,
    /// The group's matrix product, its `product` input still [`PRODUCT`].
    pub(super) contraction: Option<Contraction>,
}

impl KernelBuilder {
    pub(super) fn new(domain: Shape, reduce_axes: Vec<usize>) -> KernelBuilder {
        KernelBuilder {
            domain,
            reduce_axes,
            inputs: Vec::new(),
            buffers: Vec::new(),
            body: Vec::new(),
            levels: Vec::new(),
            memo: HashMap::new(),
            outputs: Vec::new(),
            stores: Vec::new(),
            contraction: None,
        }
    }

    fn row_len(&self) -> usize {
        self.reduce_axes
            .iter()
            .map(|&a| self.domain.dims()[a])
            .product()
    }

    fn rows(&self) -> usize {
        reduced_shape(&self.domain, &self.reduce_axes, false).numel()
    }

    pub(super) fn push(&mut self, dtype: DType, expr: Expr) -> ValueId {
        let ins = Instr { dtype, expr };
        if let Some(&v) = self.memo.get(&ins) {
            return v;
        }
        // Same rule as Kernel::levels, kept as the body grows.
        let level = match &ins.expr {
            Expr::Const(_) | Expr::Reduce(..) | Expr::ArgReduce(..) => Level::Row,
            Expr::Load { view, .. }
            | Expr::Random { view, .. }
            | Expr::Position { view }
            | Expr::Gather { view, .. } => {
                let still = !self.reduce_axes.is_empty()
                    && Kernel::operands(&ins.expr)
                        .iter()
                        .all(|v| self.levels[v.index()] == Level::Row)
                    && self
                        .reduce_axes
                        .iter()
                        .all(|&a| view.shape.dims()[a] == 1 || view.strides[a] == 0);
                if still {
                    Level::Row
                } else {
                    Level::Element
                }
            }
            e => {
                if Kernel::operands(e)
                    .iter()
                    .any(|v| self.levels[v.index()] == Level::Element)
                {
                    Level::Element
                } else {
                    Level::Row
                }
            }
        };
        let v = ValueId(
            u32::try_from(self.body.len()).expect("kernels have fewer than 2^32 instructions"),
        );
        self.memo.insert(ins.clone(), v);
        self.body.push(ins);
        self.levels.push(level);
        v
    }

    /// A value read from outside the kernel at `level`: a row value's source has the
    /// row shape, so its index map is stretched over the domain (stride 0 along the
    /// reduced axes).
    pub(super) fn source(&mut self, src: Source, dtype: DType, level: Level, g: &Graph) -> ValueId {
        match src {
            Source::Const(c) => self.push(dtype, Expr::Const(c)),
            Source::Buffer { base, view } => {
                let view = self.stretch(view, level);
                let input = self.input(base, dtype, g);
                self.push(dtype, Expr::Load { input, view })
            }
            Source::Random { key, view } => {
                let view = self.stretch(view, level);
                let key = match *key {
                    Source::Const(c) => self.push(DType::I64, Expr::Const(c)),
                    // The 0-d key, the same at every position.
                    Source::Buffer { base, view: kv } => {
                        let ones = Shape::new(vec![1; self.domain.rank()]);
                        let kv = kv
                            .reshape(&ones)
                            .expect("a 0-d view takes size-1 axes")
                            .broadcast_to(&self.domain);
                        let input = self.input(base, DType::I64, g);
                        self.push(DType::I64, Expr::Load { input, view: kv })
                    }
                    // A 0-d view of an iota is one element: a constant.
                    Source::Iota { start, step, view } => self.push(
                        DType::I64,
                        Expr::Const(Scalar::I(start + step * view.offset as i64)),
                    ),
                    Source::Random { .. } => {
                        unreachable!("a key is i64 and a random op f32 (infer checks)")
                    }
                };
                self.push(dtype, Expr::Random { key, view })
            }
            Source::Iota { start, step, view } => {
                let view = self.stretch(view, level);
                let p = self.push(DType::I64, Expr::Position { view });
                let p = if step == 1 {
                    p
                } else {
                    let s = self.push(DType::I64, Expr::Const(Scalar::I(step)));
                    self.push(DType::I64, Expr::Binary(BinaryOp::Mul, p, s))
                };
                let p = if start == 0 {
                    p
                } else {
                    let s = self.push(DType::I64, Expr::Const(Scalar::I(start)));
                    self.push(DType::I64, Expr::Binary(BinaryOp::Add, p, s))
                };
                if dtype == DType::I64 {
                    p
                } else {
                    self.push(dtype, Expr::Cast(p))
                }
            }
        }
    }

    /// The i64 coordinate of each domain position along `axis`.
    pub(super) fn coordinate(&mut self, axis: usize) -> ValueId {
        let mut strides = vec![0isize; self.domain.rank()];
        strides[axis] = 1;
        let view = View {
            shape: self.domain.clone(),
            strides,
            offset: 0,
        };
        self.push(DType::I64, Expr::Position { view })
    }

    /// An i64 constant.
    pub(super) fn int(&mut self, v: i64) -> ValueId {
        self.push(DType::I64, Expr::Const(Scalar::I(v)))
    }

    /// A row value's index map stretched over the domain (its source has the row shape).
    fn stretch(&self, view: View, level: Level) -> View {
        if level == Level::Row && !self.reduce_axes.is_empty() {
            view.reshape(&keepdims_shape(&self.domain, &self.reduce_axes))
                .expect("a row shape differs from the keepdims shape only by size-1 axes")
                .broadcast_to(&self.domain)
        } else {
            view
        }
    }

    /// The input index of `base`'s buffer, added once.
    pub(super) fn input(&mut self, base: NodeId, dtype: DType, g: &Graph) -> usize {
        match self.inputs.iter().position(|&b| b == base) {
            Some(i) => i,
            None => {
                self.inputs.push(base);
                self.buffers.push(Buffer {
                    dtype,
                    len: g.node(base).shape.numel(),
                });
                self.inputs.len() - 1
            }
        }
    }

    /// The kernel's matrix product of buffers `lhs` and `rhs` (each read in its own
    /// dtype) through views of shapes `[batch..., M, K]` and `[batch..., K, N]`,
    /// accumulated in `acc`, each operand element going through its prologue steps
    /// first: the value of the product at each domain position (a load of the product
    /// buffer).
    pub(super) fn contraction(
        &mut self,
        lhs: (NodeId, View),
        rhs: (NodeId, View),
        acc: DType,
        block_rows: usize,
        (lhs_prologue, rhs_prologue): (Vec<Prologue>, Vec<Prologue>),
        g: &Graph,
    ) -> ValueId {
        let l = self.input(lhs.0, g.node(lhs.0).dtype, g);
        let r = self.input(rhs.0, g.node(rhs.0).dtype, g);
        self.contraction = Some(Contraction {
            lhs: l,
            lhs_view: lhs.1,
            rhs: r,
            rhs_view: rhs.1,
            product: PRODUCT,
            dtype: acc,
            block_rows,
            lhs_prologue,
            rhs_prologue,
        });
        let view = View::contiguous(self.domain.clone());
        self.push(
            acc,
            Expr::Load {
                input: PRODUCT,
                view,
            },
        )
    }

    /// `x * n` or `x / n` (n = the row length) computed in `x`'s compute dtype, so a
    /// count too large for a half type stays exact.
    fn by_count(&mut self, x: ValueId, dtype: DType, op: BinaryOp) -> ValueId {
        let n = self.row_len();
        if dtype.is_int() {
            let c = self.push(dtype, Expr::Const(Scalar::I(n as i64)));
            return self.push(dtype, Expr::Binary(op, x, c));
        }
        let cd = dtype.compute_dtype();
        let x = if cd == dtype {
            x
        } else {
            self.push(cd, Expr::Cast(x))
        };
        let c = self.push(cd, Expr::Const(Scalar::F(n as f64).cast(cd)));
        let r = self.push(cd, Expr::Binary(op, x, c));
        if cd == dtype {
            r
        } else {
            self.push(dtype, Expr::Cast(r))
        }
    }

    /// A primitive reduction of `x`; a row value (the same along the row) folds to what
    /// combining `n` copies gives.
    fn accumulate(&mut self, acc: Accumulate, x: ValueId, dtype: DType) -> ValueId {
        if self.levels[x.index()] == Level::Element {
            return self.push(dtype, Expr::Reduce(acc, x));
        }
        match acc {
            Accumulate::Sum => self.by_count(x, dtype, BinaryOp::Mul),
            Accumulate::Prod => self.by_count(x, dtype, BinaryOp::Pow),
            Accumulate::Max | Accumulate::Min => x,
        }
    }

    /// The graph reduction `op` of `x` (of dtype `from`) giving dtype `to`, lowered to
    /// primitives (see the `fusion` module docs).
    pub(super) fn reduce(&mut self, op: ReduceOp, x: ValueId, from: DType, to: DType) -> ValueId {
        let x = if from == to {
            x
        } else {
            self.push(to, Expr::Cast(x))
        };
        let d = to;
        match op {
            ReduceOp::Sum => self.accumulate(Accumulate::Sum, x, d),
            ReduceOp::Prod => self.accumulate(Accumulate::Prod, x, d),
            ReduceOp::Max => self.accumulate(Accumulate::Max, x, d),
            ReduceOp::Min => self.accumulate(Accumulate::Min, x, d),
            ReduceOp::Mean => {
                let s = self.accumulate(Accumulate::Sum, x, d);
                self.by_count(s, d, BinaryOp::Div)
            }
            ReduceOp::Norm1 => {
                let a = self.push(d, Expr::Unary(UnaryOp::Abs, x));
                self.accumulate(Accumulate::Sum, a, d)
            }
            ReduceOp::Norm2 => {
                let sq = self.push(d, Expr::Unary(UnaryOp::Square, x));
                let s = self.accumulate(Accumulate::Sum, sq, d);
                self.push(d, Expr::Unary(UnaryOp::Sqrt, s))
            }
            ReduceOp::Var | ReduceOp::Std => {
                let mean = self.reduce(ReduceOp::Mean, x, d, d);
                let dev = self.push(d, Expr::Binary(BinaryOp::Sub, x, mean));
                let sq = self.push(d, Expr::Unary(UnaryOp::Square, dev));
                let s = self.accumulate(Accumulate::Sum, sq, d);
                let var = self.by_count(s, d, BinaryOp::Div);
                if op == ReduceOp::Std {
                    self.push(d, Expr::Unary(UnaryOp::Sqrt, var))
                } else {
                    var
                }
            }
        }
    }

    /// argmax/argmin of `x`; the first position (0) for a row value.
    pub(super) fn arg_reduce(&mut self, op: ArgReduceOp, x: ValueId) -> ValueId {
        if self.levels[x.index()] == Level::Row {
            return self.push(DType::I64, Expr::Const(Scalar::I(0)));
        }
        self.push(DType::I64, Expr::ArgReduce(op, x))
    }

    /// Stores `value` for a node of `level`: an element node gets every position (a
    /// broadcast row value included), a row node one element per row.
    pub(super) fn store(&mut self, value: ValueId, dtype: DType, level: Level) {
        let len = match level {
            Level::Element => self.domain.numel(),
            Level::Row => self.rows(),
        };
        self.outputs.push(Buffer { dtype, len });
        self.stores.push(Store {
            value,
            output: self.outputs.len() - 1,
        });
    }

    pub(super) fn finish(self, names: &[&str], outputs: Vec<NodeId>, target: &TargetDesc) -> Step {
        // Readable, stable names: the first few ops, then how many more (`mul_add_exp_etc3`).
        const SHOWN: usize = 4;
        let mut name = names
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join("_");
        if names.len() > SHOWN {
            name.push_str(&format!("_etc{}", names.len() - SHOWN));
        }
        let (plan, mut plan_reason) = plan::choose(&self.domain, &self.reduce_axes, target);
        let (mut buffers, mut body) = (self.buffers, self.body);
        let mut contraction = self.contraction;
        if let Some(c) = &mut contraction {
            // The product becomes the last input, now that every other one is known.
            c.product = buffers.len();
            buffers.push(Buffer {
                dtype: c.dtype,
                len: self.domain.numel(),
            });
            for ins in &mut body {
                if let Expr::Load { input, .. } = &mut ins.expr {
                    if *input == PRODUCT {
                        *input = c.product;
                    }
                }
            }
            plan_reason = plan::gemm_block_rows(&self.domain, c.dtype.size_bytes(), target).1;
        }
        let kernel = Kernel {
            name,
            domain: self.domain,
            reduce_axes: self.reduce_axes,
            inputs: buffers,
            outputs: self.outputs,
            body,
            stores: self.stores,
            plan,
            plan_reason,
            contraction,
        };
        Step::Kernel {
            kernel,
            inputs: self.inputs,
            outputs,
        }
    }
}
