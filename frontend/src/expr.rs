//! The expression language (numexpr's `evaluate`): numpy-like text such as
//! `softmax(x, axis=-1)` parsed once and bound to named tensors, giving a lazy
//! [`Tensor`] built through the same API a Rust caller uses. The `ndfuse` CLI is a thin
//! shell over this module.
//!
//! ```
//! use ndfuse::{Context, Expr};
//! let ctx = Context::new();
//! let x = ctx.from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! // In one call...
//! let y = ctx.evaluate("sum(exp(x), axis=1)", &[("x", &x)])?;
//! // ...or parse once and bind later, as often as needed.
//! let e = Expr::parse("sum(exp(x), axis=1)")?;
//! assert_eq!(e.bind(&ctx, &[("x", &x)])?.eval()?.to_vec::<f32>()?, y.to_vec::<f32>()?);
//! // Errors name the column of the expression where they arise.
//! let err = ctx.evaluate("x + ones", &[("x", &x)]).unwrap_err();
//! assert!(err.to_string().starts_with("at column 5"));
//! # Ok::<(), ndfuse::Error>(())
//! ```
//!
//! Layers: `parse` (text -> AST with byte positions) < `call` (binding call arguments
//! to signatures, literal arguments) < `lower` (AST -> tensors), and this face on top.

mod call;
mod conv;
mod linalg;
mod lower;
mod parse;

pub use call::parse_dtype;
pub use parse::ExprError;

use crate::array::Array;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A parsed expression, ready to be bound to tensors any number of times.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    text: String,
    ast: parse::Node,
}

/// An expression bound to tensors: its lazy result and the inputs it names.
#[derive(Clone, Debug)]
pub struct Bound {
    /// The lazy result.
    pub tensor: Tensor,
    /// The input names the expression uses, in the order it first names them (the
    /// graph numbers its inputs `in0, in1, ...` in the same order).
    pub used: Vec<String>,
}

impl Expr {
    /// Parses `text`; the error names the column where it stops making sense.
    pub fn parse(text: &str) -> Result<Expr> {
        let ast = parse::parse(text).map_err(|e| expr_error(text, &e))?;
        Ok(Expr {
            text: text.to_string(),
            ast,
        })
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The lazy tensor the expression computes over `inputs` (name, tensor), in
    /// `ctx` (the dtype of a literal that stands alone is its default). Nothing runs.
    pub fn bind(&self, ctx: &Context, inputs: &[(&str, &Tensor)]) -> Result<Tensor> {
        let mut named = BTreeMap::new();
        for (name, t) in inputs {
            if named.insert(name.to_string(), (*t).clone()).is_some() {
                return Err(Error::Expr {
                    column: 0,
                    message: format!("input '{name}' is given more than once"),
                });
            }
        }
        self.bind_named(ctx, &named, "(name, tensor) pairs to the inputs")
            .map(|b| b.tensor)
            .map_err(|e| expr_error(&self.text, &e))
    }

    /// Like [`Expr::bind`] over a map of inputs, keeping the positioned error (for a
    /// caller that draws its own message, as the CLI does) and the names used.
    /// `input_hint` says how inputs are given, for the message when none is.
    pub fn bind_named(
        &self,
        ctx: &Context,
        inputs: &BTreeMap<String, Tensor>,
        input_hint: &'static str,
    ) -> std::result::Result<Bound, ExprError> {
        let mut lowerer = lower::Lowerer::new(ctx, inputs, input_hint);
        let tensor = lowerer.lower(&self.ast)?;
        Ok(Bound {
            tensor,
            used: lowerer.used,
        })
    }
}

impl FromStr for Expr {
    type Err = Error;

    fn from_str(text: &str) -> Result<Expr> {
        Expr::parse(text)
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Context {
    /// Evaluates the expression `text` over `inputs` (name, tensor) now: numexpr's
    /// `evaluate`. See [`Expr`] to parse once and bind many times.
    ///
    /// ```
    /// let ctx = ndfuse::Context::new();
    /// let x = ctx.from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// let y = ctx.evaluate("x * 2 + 1", &[("x", &x)])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![3.0, 5.0, 7.0]);
    /// # Ok::<(), ndfuse::Error>(())
    /// ```
    pub fn evaluate(&self, text: &str, inputs: &[(&str, &Tensor)]) -> Result<Array> {
        Expr::parse(text)?.bind(self, inputs)?.eval()
    }
}

fn expr_error(text: &str, e: &ExprError) -> Error {
    Error::Expr {
        column: e.column(text),
        message: e.message.clone(),
    }
}
