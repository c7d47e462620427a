//! `MatMul`, `Gemm` and `Einsum`: products through ndfuse's contraction (the fused-epilogue
//! GEMM).

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
    Support::new(
        "Einsum",
        "any number of operands, explicit or implicit output, ellipsis (broadcast), \
         repeated labels (diagonals, gathered); pairwise contractions as batched matmuls",
    ),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "MatMul" => matmul(n),
        "Gemm" => gemm(n),
        "Einsum" => einsum(n),
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

/// A label of an einsum term: a letter, or one axis of the ellipsis (`ELL + k`, the
/// ellipsis' axes right-aligned across the operands).
const ELL: u32 = 0x1_0000;

/// An operand being contracted: the tensor and the label of each of its axes.
struct Term {
    t: Tensor,
    labels: Vec<u32>,
}

/// The letters of one term with its `...` expanded to `ell_rank - k` labels for `k`
/// ellipsis axes (the trailing ones), for a tensor of rank `rank`.
fn parse_term(n: &Node, s: &str, rank: Option<usize>, ell_max: usize) -> Result<Vec<u32>> {
    let (pre, post, has_ell) = match s.split_once("...") {
        Some((a, b)) => (a, b, true),
        None => (s, "", false),
    };
    let letters = |p: &str| -> Result<Vec<u32>> {
        p.chars()
            .map(|c| {
                if c.is_ascii_alphabetic() {
                    Ok(c as u32)
                } else {
                    Err(n.bad(format!("einsum term '{s}' has '{c}'")))
                }
            })
            .collect()
    };
    let (a, b) = (letters(pre)?, letters(post)?);
    let ell = match (has_ell, rank) {
        (false, Some(r)) if r != a.len() => {
            return Err(n.bad(format!("einsum term '{s}' for an operand of rank {r}")))
        }
        (false, _) => 0,
        (true, Some(r)) => r
            .checked_sub(a.len() + b.len())
            .ok_or_else(|| n.bad(format!("einsum term '{s}' for an operand of rank {r}")))?,
        (true, None) => ell_max,
    };
    let mut v = a;
    v.extend((ell_max - ell..ell_max).map(|k| ELL + k as u32));
    v.extend(b);
    Ok(v)
}

/// `t` summed over `axes`, in its own dtype (integer sums widen to i64).
fn sum_keep_dtype(n: &Node, t: &Tensor, axes: &[i64]) -> Result<Tensor> {
    if axes.is_empty() {
        return Ok(t.clone());
    }
    let d = n
        .check(t.clone())?
        .dtype()
        .map_err(|e| n.bad(e.to_string()))?;
    let s = t.sum(axes);
    Ok(if s.dtype().ok() == Some(d) {
        s
    } else {
        s.cast(d)
    })
}

impl Term {
    fn dims(&self) -> Vec<usize> {
        self.t.shape().map(<[usize]>::to_vec).unwrap_or_default()
    }

    /// The diagonal of every label repeated in the term (a gather of `i * (s + 1)` on
    /// the two axes flattened into one).
    fn diagonals(mut self, n: &Node) -> Result<Term> {
        loop {
            let Some((i, j)) = (0..self.labels.len()).find_map(|i| {
                (i + 1..self.labels.len())
                    .find(|&j| self.labels[j] == self.labels[i])
                    .map(|j| (i, j))
            }) else {
                return Ok(self);
            };
            let dims = self.dims();
            if dims[i] != dims[j] {
                return Err(n.bad(format!(
                    "einsum label repeated on axes of {} and {}",
                    dims[i], dims[j]
                )));
            }
            let s = dims[i];
            let others: Vec<usize> = (0..dims.len()).filter(|&a| a != i && a != j).collect();
            let mut perm: Vec<i64> = others.iter().map(|&a| a as i64).collect();
            perm.extend([i as i64, j as i64]);
            let mut shape: Vec<i64> = others.iter().map(|&a| dims[a] as i64).collect();
            shape.push((s * s) as i64);
            let idx: Vec<i64> = (0..s as i64).map(|k| k * (s as i64 + 1)).collect();
            let t = self.t.permute(&perm).reshape(&shape);
            self.t = t.take(&n.i64s(&idx)?, others.len() as i64);
            let label = self.labels[i];
            self.labels = others.iter().map(|&a| self.labels[a]).collect();
            self.labels.push(label);
        }
    }

    /// The term summed over the labels `drop` says to.
    fn sum_out(mut self, n: &Node, drop: impl Fn(u32) -> bool) -> Result<Term> {
        let axes: Vec<i64> = (0..self.labels.len())
            .filter(|&a| drop(self.labels[a]))
            .map(|a| a as i64)
            .collect();
        self.t = sum_keep_dtype(n, &self.t, &axes)?;
        self.labels.retain(|&l| !drop(l));
        Ok(self)
    }

    /// The term's axes in the order of `labels` (each one of its own), reshaped to
    /// `groups`: per group, the product of its labels' extents.
    fn grouped(&self, order: &[u32], groups: &[&[u32]]) -> (Tensor, Vec<usize>) {
        let dims = self.dims();
        let pos = |l: &u32| self.labels.iter().position(|m| m == l).unwrap_or(0);
        let perm: Vec<i64> = order.iter().map(|l| pos(l) as i64).collect();
        let shape: Vec<i64> = groups
            .iter()
            .map(|g| g.iter().map(|l| dims[pos(l)] as i64).product())
            .collect();
        let each = order.iter().map(|l| dims[pos(l)]).collect();
        (self.t.permute(&perm).reshape(&shape), each)
    }
}

fn einsum(n: &Node) -> Result<Vec<Tensor>> {
    let eq: String = n
        .string("equation")?
        .ok_or_else(|| n.bad("attribute 'equation' is required"))?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != n.arity() {
        return Err(n.bad(format!("equation '{eq}' for {} inputs", n.arity())));
    }
    let mut ell_max = 0;
    for (i, s) in specs.iter().enumerate() {
        if let Some((a, b)) = s.split_once("...") {
            let r = n.shape(i)?.len();
            ell_max = ell_max.max(r.saturating_sub(a.len() + b.len()));
        }
    }
    let mut parsed = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        parsed.push(parse_term(n, s, Some(n.shape(i)?.len()), ell_max)?);
    }
    let out: Vec<u32> = match rhs {
        Some(r) => parse_term(n, r, None, ell_max)?,
        None => {
            // numpy's implicit output: the ellipsis, then the letters used exactly once.
            let mut v: Vec<u32> = (0..ell_max as u32).map(|k| ELL + k).collect();
            let mut letters: Vec<u32> = parsed
                .iter()
                .flatten()
                .copied()
                .filter(|&l| l < ELL)
                .collect();
            letters.sort_unstable();
            let once: Vec<u32> = letters
                .iter()
                .copied()
                .filter(|l| letters.iter().filter(|m| *m == l).count() == 1)
                .collect();
            v.extend(once);
            v
        }
    };
    let mut terms = Vec::new();
    for (i, labels) in parsed.into_iter().enumerate() {
        terms.push(
            Term {
                t: n.input(i)?.clone(),
                labels,
            }
            .diagonals(n)?,
        );
    }
    for (k, l) in out.iter().enumerate() {
        if out[..k].contains(l) || !terms.iter().any(|t| t.labels.contains(l)) {
            return Err(n.bad(format!(
                "einsum output of '{eq}' repeats or invents a label"
            )));
        }
    }
    // Letters must agree across operands (the ellipsis' axes broadcast).
    for a in 0..terms.len() {
        for b in a + 1..terms.len() {
            let (da, db) = (terms[a].dims(), terms[b].dims());
            for (i, l) in terms[a].labels.iter().enumerate() {
                if let Some(j) = terms[b].labels.iter().position(|m| m == l) {
                    if da[i] != db[j] && da[i] != 1 && db[j] != 1 {
                        return Err(
                            n.bad(format!("einsum '{eq}': extents {} and {}", da[i], db[j]))
                        );
                    }
                }
            }
        }
    }
    let mut terms = terms.into_iter();
    let first = terms.next().ok_or_else(|| n.bad("einsum of no operands"))?;
    let rest: Vec<Term> = terms.collect();
    let needed =
        |l: u32, later: &[Term]| out.contains(&l) || later.iter().any(|t| t.labels.contains(&l));
    let mut acc = first.sum_out(n, |l| !needed(l, &rest))?;
    for (k, b) in rest.iter().enumerate() {
        let later = &rest[k + 1..];
        let b = Term {
            t: b.t.clone(),
            labels: b.labels.clone(),
        };
        let in_a = acc.labels.clone();
        let b = b.sum_out(n, |l| !needed(l, later) && !in_a.contains(&l))?;
        acc = contract(n, acc, b, |l| needed(l, later))?;
    }
    let acc = acc.sum_out(n, |l| !out.contains(&l))?;
    let perm: Vec<i64> = out
        .iter()
        .map(|l| acc.labels.iter().position(|m| m == l).unwrap_or(0) as i64)
        .collect();
    let y = if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        acc.t
    } else {
        acc.t.permute(&perm)
    };
    Ok(vec![y])
}

/// `a` times `b` summed over their common labels that `keep` does not keep: one batched
/// matrix product of [batch, a's own] by [batch, b's own] through the contracted ones.
fn contract(n: &Node, a: Term, b: Term, keep: impl Fn(u32) -> bool) -> Result<Term> {
    let (da, db) = (a.dims(), b.dims());
    let size =
        |t: &Term, d: &[usize], l: u32| d[t.labels.iter().position(|&m| m == l).unwrap_or(0)];
    let common: Vec<u32> = a
        .labels
        .iter()
        .copied()
        .filter(|l| b.labels.contains(l))
        .collect();
    // A contracted label of extent 1 on one side broadcasts: sum each side on its own.
    let uneven: Vec<u32> = common
        .iter()
        .copied()
        .filter(|&l| !keep(l) && size(&a, &da, l) != size(&b, &db, l))
        .collect();
    let a = a.sum_out(n, |l| uneven.contains(&l))?;
    let b = b.sum_out(n, |l| uneven.contains(&l))?;
    let batch: Vec<u32> = common
        .iter()
        .copied()
        .filter(|&l| keep(l) && !uneven.contains(&l))
        .collect();
    let con: Vec<u32> = common
        .iter()
        .copied()
        .filter(|&l| !keep(l) && !uneven.contains(&l))
        .collect();
    let a_own: Vec<u32> = a
        .labels
        .iter()
        .copied()
        .filter(|l| !b.labels.contains(l))
        .collect();
    let b_own: Vec<u32> = b
        .labels
        .iter()
        .copied()
        .filter(|l| !a.labels.contains(l))
        .collect();
    let mut groups: Vec<&[u32]> = batch.chunks(1).collect();
    let order_a: Vec<u32> = [&batch[..], &a_own, &con].concat();
    groups.extend([&a_own[..], &con[..]]);
    let (ta, ea) = a.grouped(&order_a, &groups);
    let mut groups: Vec<&[u32]> = batch.chunks(1).collect();
    let order_b: Vec<u32> = [&batch[..], &con, &b_own].concat();
    groups.extend([&con[..], &b_own[..]]);
    let (tb, eb) = b.grouped(&order_b, &groups);
    let mut shape: Vec<i64> = (0..batch.len()).map(|i| ea[i].max(eb[i]) as i64).collect();
    shape.extend(
        ea[batch.len()..batch.len() + a_own.len()]
            .iter()
            .map(|&e| e as i64),
    );
    shape.extend(eb[batch.len() + con.len()..].iter().map(|&e| e as i64));
    let t = ta.matmul(&tb).reshape(&shape);
    Ok(Term {
        t,
        labels: [&batch[..], &a_own, &b_own].concat(),
    })
}
