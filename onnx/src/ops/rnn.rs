//! `LSTM`, `GRU` and `RNN`: the time loop unrolled into the graph (the sequence length is
//! static), the input projection of every step one product, per step the recurrent
//! product and the gates, the hidden states stacked into `Y`.

use crate::error::Result;
use crate::node::Node;
use crate::support::Support;
use ndfuse::{DType, SliceArg, Tensor};

/// The operators of this file.
pub const OPS: &[Support] = &[
    Support::new(
        "LSTM",
        "forward, reverse, bidirectional; layout 0 and 1; B, sequence_lens (masked), \
         initial_h, initial_c, P (peepholes); activations (Relu, Tanh, Sigmoid, Affine, \
         LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus) with \
         activation_alpha/beta; clip; input_forget; outputs Y, Y_h, Y_c",
    ),
    Support::new("GRU", "as LSTM, with linear_before_reset; outputs Y, Y_h"),
    Support::new("RNN", "as LSTM; outputs Y, Y_h"),
];

/// The lowering of `n` when its operator is one of this file's.
pub fn map(n: &Node) -> Option<Result<Vec<Tensor>>> {
    Some(match n.op() {
        "LSTM" => recurrent(n, Cell::Lstm),
        "GRU" => recurrent(n, Cell::Gru),
        "RNN" => recurrent(n, Cell::Rnn),
        _ => return None,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    /// Gates per direction (rows of W in units of hidden_size).
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    /// Activation functions per direction and their defaults.
    fn defaults(self) -> &'static [&'static str] {
        match self {
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Rnn => &["Tanh"],
        }
    }
}

/// An activation function of the recurrent operators.
#[derive(Clone, Copy, Debug)]
enum Act {
    Relu,
    Tanh,
    Sigmoid,
    Affine(f64, f64),
    LeakyRelu(f64),
    ThresholdedRelu(f64),
    ScaledTanh(f64, f64),
    HardSigmoid(f64, f64),
    Elu(f64),
    Softsign,
    Softplus,
}

impl Act {
    fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Act::Relu => x.relu(),
            Act::Tanh => x.tanh(),
            Act::Sigmoid => x.sigmoid(),
            Act::Affine(a, b) => x.mul(a).add(b),
            Act::LeakyRelu(a) => x.lt(0.0).where_(x.mul(a), x),
            Act::ThresholdedRelu(a) => x.gt(a).where_(x, 0.0),
            Act::ScaledTanh(a, b) => x.mul(b).tanh().mul(a),
            Act::HardSigmoid(a, b) => x.mul(a).add(b).maximum(0.0).minimum(1.0),
            Act::Elu(a) => x.lt(0.0).where_(x.exp().sub(1.0).mul(a), x),
            Act::Softsign => x.div(x.abs().add(1.0)),
            Act::Softplus => x.relu().add(x.abs().neg().exp().log1p()),
        }
    }
}

/// The activations named by the node (`count` of them), taking alphas and betas in
/// order from the lists for those functions that have them.
fn activations(n: &Node, cell: Cell, dirs: usize) -> Result<Vec<Act>> {
    let names: Vec<String> = match n.strings("activations")? {
        Some(v) if !v.is_empty() => v,
        _ => (0..dirs)
            .flat_map(|_| cell.defaults().iter().map(|s| s.to_string()))
            .collect(),
    };
    let want = cell.defaults().len() * dirs;
    if names.len() != want {
        return Err(n.bad(format!("{} activations (need {want})", names.len())));
    }
    let alphas = n.floats("activation_alpha")?.unwrap_or_default();
    let betas = n.floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0, 0);
    let mut alpha = |d: f64| {
        ai += 1;
        alphas.get(ai - 1).copied().unwrap_or(d)
    };
    let mut beta = |d: f64| {
        bi += 1;
        betas.get(bi - 1).copied().unwrap_or(d)
    };
    names
        .iter()
        .map(|name| {
            Ok(match name.to_ascii_lowercase().as_str() {
                "relu" => Act::Relu,
                "tanh" => Act::Tanh,
                "sigmoid" => Act::Sigmoid,
                "affine" => Act::Affine(alpha(1.0), beta(0.0)),
                "leakyrelu" => Act::LeakyRelu(alpha(0.01)),
                "thresholdedrelu" => Act::ThresholdedRelu(alpha(1.0)),
                "scaledtanh" => Act::ScaledTanh(alpha(1.0), beta(1.0)),
                "hardsigmoid" => Act::HardSigmoid(alpha(0.2), beta(0.5)),
                "elu" => Act::Elu(alpha(1.0)),
                "softsign" => Act::Softsign,
                "softplus" => Act::Softplus,
                other => return Err(n.unsupported(format!("activation '{other}'"))),
            })
        })
        .collect()
}

/// Rows `from..to` of axis `axis` of `t`.
fn rows(t: &Tensor, axis: usize, from: usize, to: usize) -> Tensor {
    let mut args = vec![SliceArg::all(); axis];
    args.push(SliceArg::new(Some(from as i64), Some(to as i64), 1));
    t.slice(&args)
}

/// Entry `i` of the leading axis of `t`, without that axis.
fn at(t: &Tensor, i: usize) -> Tensor {
    rows(t, 0, i, i + 1).squeeze(&[0])
}

fn recurrent(n: &Node, cell: Cell) -> Result<Vec<Tensor>> {
    let xs = n.shape(0)?;
    if xs.len() != 3 {
        return Err(n.bad(format!("X {xs:?} must have rank 3")));
    }
    let layout = n.int_or("layout", 0)?;
    let batch_first = match layout {
        0 => false,
        1 => true,
        l => return Err(n.bad(format!("layout {l}"))),
    };
    let x = n.input(0)?;
    let (x, seq, batch) = if batch_first {
        (x.permute(&[1, 0, 2]), xs[1], xs[0])
    } else {
        (x.clone(), xs[0], xs[1])
    };
    let dtype = n.dtype(0)?;
    let direction = n.string("direction")?.unwrap_or_else(|| "forward".into());
    let dirs = match direction.as_str() {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        other => return Err(n.bad(format!("direction '{other}'"))),
    };
    let (ws, rs) = (n.shape(1)?, n.shape(2)?);
    let g = cell.gates();
    let hidden = match n.int("hidden_size")? {
        Some(h) if h > 0 => h as usize,
        Some(h) => return Err(n.bad(format!("hidden_size {h}"))),
        None => *rs
            .get(2)
            .ok_or_else(|| n.bad(format!("R {rs:?} must have rank 3")))?,
    };
    if ws.len() != 3 || ws[0] != dirs || ws[1] != g * hidden || ws[2] != xs[2] {
        return Err(n.bad(format!(
            "W {ws:?} for X {xs:?}, {dirs} directions, hidden_size {hidden}"
        )));
    }
    if rs != [dirs, g * hidden, hidden] {
        return Err(n.bad(format!(
            "R {rs:?} for {dirs} directions, hidden_size {hidden}"
        )));
    }
    let acts = activations(n, cell, dirs)?;
    let clip = n.float("clip")?;
    let clamp = |t: Tensor| match clip {
        Some(c) => t.maximum(-c).minimum(c),
        None => t,
    };
    let lbr = n.int_or("linear_before_reset", 0)? != 0;
    let input_forget = n.int_or("input_forget", 0)? != 0;
    let seq_lens = n
        .opt_input(4)
        .map(|s| s.cast(DType::I64).reshape(&[batch as i64, 1]));
    // Initial states as [dirs, batch, hidden].
    let state = |i: usize| -> Option<Tensor> {
        n.opt_input(i).map(|t| {
            if batch_first {
                t.permute(&[1, 0, 2])
            } else {
                t.clone()
            }
        })
    };
    let (init_h, init_c) = (state(5), state(6));
    let peep = if cell == Cell::Lstm {
        n.opt_input(7)
    } else {
        None
    };
    let zeros = n.ctx.full_dtype(&[batch, hidden], 0.0, dtype);
    let h = hidden;
    let mut ys = Vec::with_capacity(dirs);
    let mut hs = Vec::with_capacity(dirs);
    let mut cs = Vec::with_capacity(dirs);
    for d in 0..dirs {
        let reverse = direction == "reverse" || d == 1;
        let na = cell.defaults().len();
        let act = &acts[d * na..(d + 1) * na];
        let w = at(n.input(1)?, d);
        let r = at(n.input(2)?, d);
        // Every step's input projection at once: [seq, batch, g * hidden].
        let mut xw = x.matmul(&w.transpose());
        let mut rb_h = None;
        if let Some(b) = n.opt_input(3) {
            let b = at(b, d);
            let wb = rows(&b, 0, 0, g * h);
            let rb = rows(&b, 0, g * h, 2 * g * h);
            if cell == Cell::Gru && lbr {
                xw = xw.add(wb.add(ndfuse::concat(
                    &[&rows(&rb, 0, 0, 2 * h), &n.ctx.full_dtype(&[h], 0.0, dtype)],
                    0,
                )));
                rb_h = Some(rows(&rb, 0, 2 * h, 3 * h));
            } else {
                xw = xw.add(wb.add(&rb));
            }
        }
        let rt = r.transpose();
        let (p_i, p_o, p_f) = match peep {
            Some(p) => {
                let p = at(p, d);
                (
                    Some(rows(&p, 0, 0, h)),
                    Some(rows(&p, 0, h, 2 * h)),
                    Some(rows(&p, 0, 2 * h, 3 * h)),
                )
            }
            None => (None, None, None),
        };
        let mut hp = init_h.as_ref().map_or_else(|| zeros.clone(), |t| at(t, d));
        let mut cp = init_c.as_ref().map_or_else(|| zeros.clone(), |t| at(t, d));
        let mut outs: Vec<Option<Tensor>> = vec![None; seq];
        let order: Vec<usize> = if reverse {
            (0..seq).rev().collect()
        } else {
            (0..seq).collect()
        };
        for t in order {
            let xt = at(&xw, t);
            let gate = |v: &Tensor, k: usize| rows(v, 1, k * h, (k + 1) * h);
            let peephole = |v: Tensor, p: &Option<Tensor>, c: &Tensor| match p {
                Some(p) => v.add(p.mul(c)),
                None => v,
            };
            let (hn, cn) = match cell {
                Cell::Lstm => {
                    let z = xt.add(hp.matmul(&rt));
                    let i = act[0].apply(&clamp(peephole(gate(&z, 0), &p_i, &cp)));
                    let f = if input_forget {
                        i.neg().add(1.0)
                    } else {
                        act[0].apply(&clamp(peephole(gate(&z, 2), &p_f, &cp)))
                    };
                    let c = act[1].apply(&clamp(gate(&z, 3)));
                    let cn = f.mul(&cp).add(i.mul(&c));
                    let o = act[0].apply(&clamp(peephole(gate(&z, 1), &p_o, &cn)));
                    (o.mul(act[2].apply(&cn)), Some(cn))
                }
                Cell::Gru => {
                    let zr = hp.matmul(&rows(&rt, 1, 0, 2 * h));
                    let z = act[0].apply(&clamp(gate(&xt, 0).add(gate(&zr, 0))));
                    let rg = act[0].apply(&clamp(gate(&xt, 1).add(gate(&zr, 1))));
                    let rh = rows(&rt, 1, 2 * h, 3 * h);
                    let pre = if lbr {
                        let mut hr = hp.matmul(&rh);
                        if let Some(b) = &rb_h {
                            hr = hr.add(b);
                        }
                        gate(&xt, 2).add(rg.mul(&hr))
                    } else {
                        gate(&xt, 2).add(rg.mul(&hp).matmul(&rh))
                    };
                    let hh = act[1].apply(&clamp(pre));
                    (z.neg().add(1.0).mul(&hh).add(z.mul(&hp)), None)
                }
                Cell::Rnn => (act[0].apply(&clamp(xt.add(hp.matmul(&rt)))), None),
            };
            match &seq_lens {
                Some(len) => {
                    let live = len.gt(t as i64);
                    outs[t] = Some(live.where_(&hn, 0.0));
                    hp = live.where_(&hn, &hp);
                    if let Some(cn) = cn {
                        cp = live.where_(&cn, &cp);
                    }
                }
                None => {
                    outs[t] = Some(hn.clone());
                    hp = hn;
                    if let Some(cn) = cn {
                        cp = cn;
                    }
                }
            }
        }
        let outs: Vec<Tensor> = outs
            .into_iter()
            .map(|o| o.unwrap_or_else(|| zeros.clone()))
            .collect();
        let refs: Vec<&Tensor> = outs.iter().collect();
        ys.push(if refs.is_empty() {
            n.ctx.full_dtype(&[0, batch, hidden], 0.0, dtype)
        } else {
            ndfuse::stack(&refs, 0)
        });
        hs.push(hp);
        cs.push(cp);
    }
    let y = ndfuse::stack(&ys.iter().collect::<Vec<_>>(), 1);
    let yh = ndfuse::stack(&hs.iter().collect::<Vec<_>>(), 0);
    let yc = ndfuse::stack(&cs.iter().collect::<Vec<_>>(), 0);
    let mut outs = if batch_first {
        vec![
            y.permute(&[2, 0, 1, 3]),
            yh.permute(&[1, 0, 2]),
            yc.permute(&[1, 0, 2]),
        ]
    } else {
        vec![y, yh, yc]
    };
    if cell != Cell::Lstm {
        outs.pop();
    }
    Ok(outs)
}
