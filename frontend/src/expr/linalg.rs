//! The LAPACK level in expressions, numpy's `linalg` spellings: `solve(a, b)`,
//! `cholesky(a, upper=false)`, `inv(a)`, `det(a)`, `svdvals(a)`, `eigvalsh(a,
//! UPLO='L')`, `pinv(a, rtol=None)`, `triangular_solve(a, b, upper=false, left=true,
//! unit_diagonal=false)`, `matrix_norm(a, ord='fro')`, `cond(a, p=None)`,
//! `matrix_transpose(a)`, and the functions whose results are tuples, indexed:
//! `qr(a, mode='reduced')[i]`, `svd(a, full_matrices=true)[i]`, `eigh(a, UPLO='L')[i]`,
//! `slogdet(a)[i]`, `lu(a)[i]`, `lstsq(a, b, rcond=None)[i]`. Two indexings of one
//! call (`qr(a)[0] @ qr(a)[1]`) build the same node twice, which common-subexpression
//! elimination makes one decomposition.

use super::call::{
    bind, float_literal, int_literal, is_none, linalg_unindexed, opt, req, str_literal,
    tuple_items, LINALG_TUPLES,
};
use super::parse::{ExprError, IndexItem, Kwarg, Lit, Node};
use crate::linalg::{self, Norm, QrMode, Side};
use crate::tensor::Tensor;

/// `'L'` / `'U'` (numpy's `UPLO`), as "reads the upper triangle".
fn uplo(n: &Node) -> Result<bool, ExprError> {
    match str_literal(n, "UPLO")? {
        "L" | "l" => Ok(false),
        "U" | "u" => Ok(true),
        s => Err(ExprError::new(
            n.pos,
            format!("UPLO must be 'L' or 'U', not '{s}'"),
        )),
    }
}

/// A flag given as `true`/`false` (or 1/0).
fn flag(n: &Node, what: &str) -> Result<bool, ExprError> {
    match &n.kind {
        super::parse::Kind::Lit(Lit::Bool(b)) => Ok(*b),
        _ => int_literal(n, what).map(|v| v != 0),
    }
}

/// numpy's `ord` of a matrix norm: `'fro'`, `'nuc'`, or 1, -1, 2, -2, `inf`, `-inf`.
fn norm_literal(n: &Node) -> Result<Norm, ExprError> {
    if let Ok(s) = str_literal(n, "ord") {
        return match s {
            "fro" => Ok(Norm::Fro),
            "nuc" => Ok(Norm::Nuc),
            "inf" => Ok(Norm::Inf),
            "-inf" => Ok(Norm::NegInf),
            _ => Err(ExprError::new(
                n.pos,
                format!("ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, not '{s}'"),
            )),
        };
    }
    let v = float_literal(n, "ord")?;
    Ok(match v {
        1.0 => Norm::One,
        -1.0 => Norm::NegOne,
        2.0 => Norm::Two,
        -2.0 => Norm::NegTwo,
        f64::INFINITY => Norm::Inf,
        f64::NEG_INFINITY => Norm::NegInf,
        _ => {
            return Err(ExprError::new(
                n.pos,
                format!("ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, not {v}"),
            ))
        }
    })
}

/// An optional float argument (`None` when absent or `None`).
fn opt_float(a: &[Option<&Node>], i: usize, what: &str) -> Result<Option<f64>, ExprError> {
    match opt(a, i) {
        Some(n) if !is_none(n) => float_literal(n, what).map(Some),
        _ => Ok(None),
    }
}

impl super::lower::Lowerer<'_> {
    /// A function of [`super::call::LINALG_SINGLE`]; a tuple function without its index
    /// is an error saying to index it. Never inlined into `call`, which is on the stack
    /// once per nesting level (see `index_call`).
    #[inline(never)]
    pub(super) fn linalg_call(
        &mut self,
        name: &str,
        args: &[Node],
        kwargs: &[Kwarg],
        pos: usize,
    ) -> Result<Tensor, ExprError> {
        let t = match name {
            "solve" => {
                let a = bind(name, pos, args, kwargs, &["a", "b"])?;
                let (x, b) = (self.tensor_arg(req(&a, 0))?, self.tensor_arg(req(&a, 1))?);
                linalg::solve(&x, &b)
            }
            "cholesky" => {
                let a = bind(name, pos, args, kwargs, &["a", "upper=false"])?;
                let upper = opt(&a, 1).map(|n| flag(n, "upper")).transpose()?;
                linalg::cholesky(&self.tensor_arg(req(&a, 0))?, upper.unwrap_or(false))
            }
            "inv" | "det" | "svdvals" | "matrix_transpose" => {
                let a = bind(name, pos, args, kwargs, &["a"])?;
                let x = self.tensor_arg(req(&a, 0))?;
                match name {
                    "inv" => linalg::inv(&x),
                    "det" => linalg::det(&x),
                    "svdvals" => linalg::svdvals(&x),
                    _ => linalg::matrix_transpose(&x),
                }
            }
            "eigvalsh" => {
                let a = bind(name, pos, args, kwargs, &["a", "UPLO='L'"])?;
                let upper = opt(&a, 1).map(uplo).transpose()?.unwrap_or(false);
                linalg::eigvalsh(&self.tensor_arg(req(&a, 0))?, upper)
            }
            "pinv" => {
                let a = bind(name, pos, args, kwargs, &["a", "rtol=None"])?;
                let rtol = opt_float(&a, 1, "rtol")?;
                linalg::pinv(&self.tensor_arg(req(&a, 0))?, rtol)
            }
            "triangular_solve" => {
                let names = ["a", "b", "upper=false", "left=true", "unit_diagonal=false"];
                let a = bind(name, pos, args, kwargs, &names)?;
                let f = |i: usize, what: &str, d: bool| {
                    opt(&a, i)
                        .map(|n| flag(n, what))
                        .transpose()
                        .map(|v| v.unwrap_or(d))
                };
                let (upper, left, unit) = (
                    f(2, "upper", false)?,
                    f(3, "left", true)?,
                    f(4, "unit_diagonal", false)?,
                );
                let side = if left { Side::Left } else { Side::Right };
                let (x, b) = (self.tensor_arg(req(&a, 0))?, self.tensor_arg(req(&a, 1))?);
                linalg::triangular_solve(&x, &b, upper, side, unit)
            }
            "matrix_norm" => {
                let a = bind(name, pos, args, kwargs, &["a", "ord='fro'"])?;
                let ord = opt(&a, 1).map(norm_literal).transpose()?;
                linalg::matrix_norm(&self.tensor_arg(req(&a, 0))?, ord.unwrap_or(Norm::Fro))
            }
            "cond" => {
                let a = bind(name, pos, args, kwargs, &["a", "p=None"])?;
                let p = match opt(&a, 1) {
                    Some(n) if !is_none(n) => Some(norm_literal(n)?),
                    _ => None,
                };
                linalg::cond(&self.tensor_arg(req(&a, 0))?, p)
            }
            _ => return Err(linalg_unindexed(name, pos)),
        };
        Ok(t)
    }

    /// `name(args)[items]` for a function of [`LINALG_TUPLES`]: the item picked by the one
    /// integer index. Never inlined, as [`Self::linalg_call`].
    #[inline(never)]
    pub(super) fn linalg_item(
        &mut self,
        name: &str,
        args: &[Node],
        kwargs: &[Kwarg],
        items: &[IndexItem],
        pos: usize,
    ) -> Result<Tensor, ExprError> {
        let len = LINALG_TUPLES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, l)| *l);
        let index = match items {
            [IndexItem::Index(i)] => int_literal(i, "the index of a tuple")?,
            _ => {
                return Err(ExprError::new(
                    pos,
                    format!(
                        "{name}() returns a tuple {}: index it with one integer",
                        tuple_items(name)
                    ),
                ))
            }
        };
        let i = if index < 0 { index + len as i64 } else { index };
        if !(0..len as i64).contains(&i) {
            return Err(ExprError::new(
                pos,
                format!(
                    "index {index} is out of range for the {len} items {} of {name}()",
                    tuple_items(name)
                ),
            ));
        }
        let i = i as usize;
        let mut parts = match name {
            "qr" => {
                let a = bind(name, pos, args, kwargs, &["a", "mode='reduced'"])?;
                let mode = match opt(&a, 1).map(|n| (n, str_literal(n, "mode"))) {
                    None => QrMode::Reduced,
                    Some((_, Ok("reduced"))) => QrMode::Reduced,
                    Some((_, Ok("complete"))) => QrMode::Complete,
                    Some((n, _)) => {
                        return Err(ExprError::new(
                            n.pos,
                            "mode must be 'reduced' or 'complete'",
                        ))
                    }
                };
                let q = linalg::qr(&self.tensor_arg(req(&a, 0))?, mode);
                vec![q.q, q.r]
            }
            "svd" => {
                let a = bind(name, pos, args, kwargs, &["a", "full_matrices=true"])?;
                let full = opt(&a, 1).map(|n| flag(n, "full_matrices")).transpose()?;
                let s = linalg::svd(&self.tensor_arg(req(&a, 0))?, full.unwrap_or(true));
                vec![s.u, s.s, s.vh]
            }
            "eigh" => {
                let a = bind(name, pos, args, kwargs, &["a", "UPLO='L'"])?;
                let upper = opt(&a, 1).map(uplo).transpose()?.unwrap_or(false);
                let e = linalg::eigh(&self.tensor_arg(req(&a, 0))?, upper);
                vec![e.eigenvalues, e.eigenvectors]
            }
            "slogdet" => {
                let a = bind(name, pos, args, kwargs, &["a"])?;
                let s = linalg::slogdet(&self.tensor_arg(req(&a, 0))?);
                vec![s.sign, s.logabsdet]
            }
            "lu" => {
                let a = bind(name, pos, args, kwargs, &["a"])?;
                let l = linalg::lu(&self.tensor_arg(req(&a, 0))?);
                vec![l.p, l.l, l.u]
            }
            _ => {
                let a = bind(name, pos, args, kwargs, &["a", "b", "rcond=None"])?;
                let rcond = opt_float(&a, 2, "rcond")?;
                let (x, b) = (self.tensor_arg(req(&a, 0))?, self.tensor_arg(req(&a, 1))?);
                let l = linalg::lstsq(&x, &b, rcond);
                vec![l.solution, l.residuals, l.rank, l.singular_values]
            }
        };
        Ok(parts.swap_remove(i))
    }
}
