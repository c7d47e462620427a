//! Shared by the gradient checks: a seeded generator, graph-building shorthands, and
//! the finite-difference comparison on the f64 reference interpreter.
//!
//! The check: the loss is `sum(f(x...) * r)` for a fixed random `r` (so every output
//! element weighs differently), differentiated by `grad` and by central differences
//! `(L(x + h e_i) - L(x - h e_i)) / 2h` with `h = 6e-6`, about the cube root of f64's
//! epsilon, which balances the truncation error (`h^2 / 6 |L'''|`, ~1e-11) against the
//! rounding error (`eps |L| / h`, ~4e-11 |L|). Each element must agree to a relative
//! error of 1e-6: `|grad - fd| <= 1e-6 max(1, |fd|)` (an absolute 1e-6 for gradients
//! below 1 in size, where a relative error of a near-zero value means nothing).

#![allow(dead_code)]

use ndfuse_autodiff::grad;
use ndfuse_ir::{
    interp, BinaryOp, DType, Graph, HostArray, NodeId, Op, ReduceOp, Shape, UnaryOp, ViewOp,
};
use std::collections::HashMap;

/// The finite-difference step (see the module docs).
pub const H: f64 = 6e-6;
/// The allowed relative error.
pub const TOL: f64 = 1e-6;

/// xorshift64*: deterministic, no dependency.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `|x|` in `[0.1, 2)` with a random sign: away from the kinks at 0.
    pub fn away_from_zero(&mut self) -> f64 {
        let v = self.uniform(0.1, 2.0);
        if self.next() & 1 == 0 {
            v
        } else {
            -v
        }
    }
    /// A shape of rank `0..=max_rank`, extents 1 to 4.
    pub fn shape(&mut self, max_rank: usize) -> Vec<usize> {
        let r = self.below(max_rank + 1);
        (0..r).map(|_| 1 + self.below(4)).collect()
    }
}

/// A graph under test with its inputs' values.
#[derive(Debug, Default)]
pub struct Case {
    pub g: Graph,
    pub values: HashMap<NodeId, HostArray>,
}

impl Case {
    pub fn new() -> Case {
        Case::default()
    }

    /// An f64 input of `shape` with values from `gen`.
    pub fn input(&mut self, shape: &[usize], mut gen: impl FnMut() -> f64) -> NodeId {
        self.input_of(DType::F64, shape, &mut gen)
    }

    pub fn input_of(&mut self, dt: DType, shape: &[usize], gen: &mut dyn FnMut() -> f64) -> NodeId {
        let name = format!("x{}", self.values.len());
        let id = self.g.add_input(name, dt, Shape::new(shape));
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n).map(|_| gen()).collect();
        self.values
            .insert(id, HostArray::from_f64s(dt, Shape::new(shape), &vals));
        id
    }

    pub fn op(&mut self, op: Op, x: &[NodeId]) -> NodeId {
        self.g.add(op, x).expect("a legal test graph")
    }
    pub fn un(&mut self, u: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary(u), &[x])
    }
    pub fn bin(&mut self, b: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
        self.op(Op::Binary(b), &[x, y])
    }
    pub fn view(&mut self, v: ViewOp, x: NodeId) -> NodeId {
        self.op(Op::View(v), &[x])
    }
    pub fn bcast(&mut self, x: NodeId, to: &[usize]) -> NodeId {
        if self.g.node(x).shape.dims() == to {
            return x;
        }
        self.view(ViewOp::BroadcastTo(Shape::new(to)), x)
    }
    pub fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdims: bool) -> NodeId {
        self.op(
            Op::Reduce {
                op,
                axes: axes.to_vec(),
                keepdims,
            },
            &[x],
        )
    }
    pub fn shape(&self, x: NodeId) -> Vec<usize> {
        self.g.node(x).shape.dims().to_vec()
    }

    /// `sum(y * r)` over all axes for a random weight `r`: the scalar loss.
    pub fn weighted_loss(&mut self, y: NodeId, rng: &mut Rng) -> NodeId {
        let dt = self.g.node(y).dtype;
        let s = self.shape(y);
        let r = self.input_of(dt, &s, &mut || rng.uniform(-1.0, 1.0));
        let p = self.bin(BinaryOp::Mul, y, r);
        let axes: Vec<usize> = (0..s.len()).collect();
        self.reduce(ReduceOp::Sum, p, &axes, false)
    }

    fn loss_at(&self, loss: NodeId, values: &HashMap<NodeId, HostArray>) -> f64 {
        let mut g = self.g.clone();
        g.add_output(loss);
        let out = interp::eval(&g, values).expect("the forward graph evaluates");
        out[out.len() - 1].to_f64s()[0]
    }

    /// `grad`'s gradients of `loss` with respect to `wrt`, evaluated on the interpreter.
    pub fn grads(&self, loss: NodeId, wrt: &[NodeId]) -> Vec<Vec<f64>> {
        let b = grad(&self.g, loss, wrt).expect("grad builds");
        let mut values = self.values.clone();
        values.extend(b.constants.iter().cloned());
        let out = interp::eval(&b.graph, &values).expect("the backward graph evaluates");
        let first = out.len() - wrt.len();
        for (k, &w) in wrt.iter().enumerate() {
            assert_eq!(out[first + k].shape(), &self.g.node(w).shape, "grad shape");
            assert_eq!(out[first + k].dtype(), self.g.node(w).dtype, "grad dtype");
        }
        out[first..].iter().map(|a| a.to_f64s()).collect()
    }

    /// Central differences of `loss` with respect to every element of `w`, step `h`.
    pub fn finite_diff(&self, loss: NodeId, w: NodeId, h: f64) -> Vec<f64> {
        let base = &self.values[&w];
        let (dt, shape) = (base.dtype(), base.shape().clone());
        let vals = base.to_f64s();
        (0..vals.len())
            .map(|i| {
                let at = |d: f64| {
                    let mut v = vals.clone();
                    v[i] += d;
                    let mut values = self.values.clone();
                    values.insert(w, HostArray::from_f64s(dt, shape.clone(), &v));
                    self.loss_at(loss, &values)
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect()
    }

    /// Asserts `grad` agrees with central differences for every `wrt`, at step `h`.
    pub fn check_with(&self, what: &str, loss: NodeId, wrt: &[NodeId], h: f64) {
        let got = self.grads(loss, wrt);
        for (k, &w) in wrt.iter().enumerate() {
            let fd = self.finite_diff(loss, w, h);
            for (i, (&a, &n)) in got[k].iter().zip(&fd).enumerate() {
                let err = (a - n).abs() / n.abs().max(1.0);
                assert!(
                    err <= TOL,
                    "{what}: d loss / d {w}[{i}] (shape {:?}): grad {a}, finite differences {n}, relative error {err:e}",
                    self.shape(w)
                );
            }
        }
    }

    /// [`Case::check_with`] at the standard step [`H`].
    pub fn check(&self, what: &str, loss: NodeId, wrt: &[NodeId]) {
        self.check_with(what, loss, wrt, H);
    }
}
