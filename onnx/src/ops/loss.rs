//! The loss operators: `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss`, as
//! gathers and reductions.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{DType, Tensor};

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "NegativeLogLikelihoodLoss",
        "[N, C, d...] inputs, weight, ignore_index, reduction none/sum/mean",
    ),
    Support::new(
        "SoftmaxCrossEntropyLoss",
        "as NegativeLogLikelihoodLoss on log_softmax over axis 1; the log_prob output",
    ),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "NegativeLogLikelihoodLoss" => n.input(0).and_then(|x| nll(n, x).map(|l| vec![l])),
        "SoftmaxCrossEntropyLoss" => sce(n),
        _ => return None,
    })
}

fn sce(n: &Node) -> Result<Vec<Tensor>> {
    let x = n.input(0)?;
    if n.shape(0)?.len() < 2 {
        return Err(n.bad("scores of rank < 2"));
    }
    let logp = x.log_softmax(1);
    let loss = nll(n, &logp)?;
    Ok(vec![loss, logp])
}

/// `-x[n, t[n, d], d] * w[t[n, d]]`, reduced; targets equal to `ignore_index` count
/// nothing (and weigh nothing in the mean).
fn nll(n: &Node, x: &Tensor) -> Result<Tensor> {
    let dims = n.shape(0)?;
    if dims.len() < 2 {
        return Err(n.bad(format!("input of rank {} (needs [N, C, ...])", dims.len())));
    }
    let t = n.input(1)?.cast(DType::I64);
    let ignore = n.int("ignore_index")?;
    let reduction = n.string("reduction")?.unwrap_or_else(|| "mean".into());
    let keep = ignore.map(|i| t.ne(i));
    let safe = match &keep {
        Some(k) => k.where_(&t, 0i64),
        None => t.clone(),
    };
    let picked = x.take_along_axis(&safe.expand_dims(1), 1).squeeze(&[1]);
    let dtype = x.dtype().unwrap_or(DType::F32);
    let mut w = n.opt_input(2).map(|w| w.take(&safe, 0));
    if let Some(k) = &keep {
        let k = k.cast(dtype);
        w = Some(match w {
            Some(w) => w.mul(&k),
            None => k,
        });
    }
    let loss = match &w {
        Some(w) => picked.neg().mul(w),
        None => picked.neg(),
    };
    Ok(match reduction.as_str() {
        "none" => loss,
        "sum" => loss.sum(..),
        "mean" => match &w {
            Some(w) => loss.sum(..).div(w.sum(..)),
            None => loss.mean(..),
        },
        other => return Err(n.bad(format!("reduction='{other}'"))),
    })
}
