//! Values and memory at one position: each instruction's C expression from the per-op
//! table (`scalar`), loads with their conversion, and the element body that defines
//! every value of a position and stores the outputs.

use super::source::Gen;
use crate::scalar;
use ndfuse_ir::Expr;
use std::fmt::Write as _;

impl Gen<'_> {
    /// The C expression of instruction `i` (not a load, not a reduction), with operands
    /// named `v{n}` (or `v{n}[l]`-style through `name`).
    fn value_expr(&mut self, i: usize, name: &dyn Fn(usize) -> String) -> String {
        let ins = &self.k.body[i];
        let dt = |v: ndfuse_ir::ValueId| self.k.body[v.index()].dtype;
        match &ins.expr {
            Expr::Const(c) => scalar::literal(*c, ins.dtype),
            Expr::Unary(op, a) => {
                scalar::unary(*op, dt(*a), ins.dtype, &name(a.index()), &mut self.needs)
            }
            Expr::Binary(op, a, b) => scalar::binary(
                *op,
                dt(*a),
                &name(a.index()),
                &name(b.index()),
                &mut self.needs,
            ),
            Expr::Where(c, a, b) => format!(
                "({} ? {} : {})",
                name(c.index()),
                name(a.index()),
                name(b.index())
            ),
            Expr::Cast(a) => scalar::cast(dt(*a), ins.dtype, &name(a.index()), &mut self.needs),
            Expr::Load { .. }
            | Expr::Reduce(..)
            | Expr::ArgReduce(..)
            | Expr::Random { .. }
            | Expr::Position { .. }
            | Expr::Gather { .. } => {
                unreachable!("loads, reductions, random ops, positions and gathers are emitted by the plan code")
            }
        }
    }

    /// `const T v{i} = expr;`
    pub(super) fn define(&mut self, i: usize, ind: &str) {
        let e = self.value_expr(i, &|n| format!("v{n}"));
        let t = scalar::compute_type(self.k.body[i].dtype);
        let _ = writeln!(self.body, "{ind}const {t} v{i} = {e};");
    }

    pub(super) fn load_expr(&self, input: usize, offset: &str) -> String {
        scalar::load_conv(self.k.inputs[input].dtype, &format!("in{input}[{offset}]"))
    }

    /// The value of position or gather instruction `i` (an [`Expr::Position`] or
    /// [`Expr::Gather`]) when its view reaches offset `offset` (an `nd_idx` expression):
    /// the position widened to i64, or the gather's element at `offset` plus each axis's
    /// clamped index times its stride (operands named `v{n}`, defined before it).
    pub(super) fn computed_read(&mut self, i: usize, offset: &str) -> String {
        match &self.k.body[i].expr {
            Expr::Position { .. } => scalar::position(offset),
            Expr::Gather { input, axes, .. } => {
                let mut terms: Vec<String> = Vec::new();
                if offset != "0" {
                    terms.push(offset.to_string());
                }
                for a in axes {
                    let index = format!("v{}", a.index.0);
                    if a.stride != 0 {
                        terms.push(scalar::gather_term(
                            &index,
                            a.extent,
                            a.stride,
                            &mut self.needs,
                        ));
                    }
                }
                if terms.is_empty() {
                    terms.push("0".into());
                }
                let at = terms.join(" + ").replace("+ -", "- ");
                self.load_expr(*input, &at)
            }
            _ => unreachable!("computed_read of a position or gather (a bug)"),
        }
    }

    /// One position of an element-wise body: each load from its expression in
    /// `load_src`, the other values computed, then every store into `target` (with `{}`
    /// standing for the output's number).
    pub(super) fn element_body(&mut self, load_src: &[Option<String>], target: &str, ind: &str) {
        for (i, src) in load_src.iter().enumerate() {
            match src {
                Some(src) => {
                    let t = scalar::compute_type(self.k.body[i].dtype);
                    let _ = writeln!(self.body, "{ind}const {t} v{i} = {src};");
                }
                None => self.define(i, ind),
            }
        }
        for s in &self.k.stores {
            let d = self.k.outputs[s.output].dtype;
            let _ = writeln!(
                self.body,
                "{ind}{} = {};",
                target.replace("{}", &s.output.to_string()),
                scalar::store_conv(d, &format!("v{}", s.value.0))
            );
        }
    }
}
