//! Groups of threads on rows: the strategies, how a group's lanes walk a row, and
//! their accumulators, updated per element and combined over the group (warp
//! shuffles, shared memory) in a fixed order.

use super::source::Gen;
use crate::scalar::{self, Helper};
use ndfuse_ir::{ArgReduceOp, Expr};
use std::fmt::Write as _;

/// How a group of threads is laid out over rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Strategy {
    Thread,
    Warp,
    Block(u32),
    ColumnTile,
}

pub(super) const TILE_X: u32 = 32;
/// Threads down each column of a tile at most (a 32 x 8 block of 256 threads), fewer
/// when `max_block_size` is smaller.
pub(super) const TILE_Y: u32 = 8;

/// How lanes walk a row in a loop.
#[derive(Clone)]
pub(super) struct Lanes {
    pub(super) group: u32,
    pub(super) strat: Strategy,
    /// Elements per lane kept in registers, when the row is cached.
    pub(super) cached: Option<usize>,
    /// First element index of this lane.
    pub(super) start: String,
    /// One past the last element index of the row (or chunk).
    pub(super) end: String,
}

impl Gen<'_> {
    /// Threads down each column of a tile: `TILE_Y`, or fewer to fit `max_block_size`.
    pub(super) fn tile_y(&self) -> u32 {
        (self.opts.max_block_size / TILE_X).clamp(1, TILE_Y)
    }

    /// Declares the accumulators of reductions `reds` at their identities.
    pub(super) fn init_accs(&mut self, reds: &[usize], ind: &str) {
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            match &self.k.body[i].expr {
                Expr::Reduce(op, a) => {
                    let id = scalar::identity(*op, self.k.body[a.index()].dtype);
                    let _ = writeln!(self.body, "{ind}{t} acc{i} = {id};");
                }
                _ => {
                    debug_assert!(arg);
                    self.needs.insert(Helper::Arg);
                    let _ = writeln!(self.body, "{ind}{t} acc{i} = 0; long long idx{i} = -1;");
                }
            }
        }
    }

    /// `acc{i}` updated with the current element `j`.
    pub(super) fn update_acc(&mut self, i: usize, ind: &str) {
        match self.k.body[i].expr.clone() {
            Expr::Reduce(op, a) => {
                let d = self.k.body[a.index()].dtype.compute_dtype();
                let e = scalar::accumulate(
                    op,
                    d,
                    &format!("acc{i}"),
                    &format!("v{}", a.0),
                    &mut self.needs,
                );
                let _ = writeln!(self.body, "{ind}acc{i} = {e};");
            }
            Expr::ArgReduce(op, a) => {
                let max = op == ArgReduceOp::ArgMax;
                let _ = writeln!(
                    self.body,
                    "{ind}if (nd_arg_better<{max}>(v{a}, (long long)j, acc{i}, idx{i})) {{ acc{i} = v{a}; idx{i} = j; }}",
                    a = a.0
                );
            }
            _ => unreachable!("update_acc of a reduction"),
        }
    }

    /// `acc{i} (+)= other` for reduction `i`, as a statement; `other` names the other
    /// partial's value, and `other_idx` its index for an arg-reduction.
    pub(super) fn combine_stmt(
        &mut self,
        i: usize,
        other: &str,
        other_idx: &str,
        ind: &str,
    ) -> String {
        match self.k.body[i].expr.clone() {
            Expr::Reduce(op, x) => {
                let d = self.k.body[x.index()].dtype.compute_dtype();
                let e = scalar::accumulate(op, d, &format!("acc{i}"), other, &mut self.needs);
                format!("{ind}acc{i} = {e};\n")
            }
            Expr::ArgReduce(op, _) => {
                let max = op == ArgReduceOp::ArgMax;
                format!(
                    "{ind}if (nd_arg_better<{max}>({other}, {other_idx}, acc{i}, idx{i})) {{ acc{i} = {other}; idx{i} = {other_idx}; }}\n"
                )
            }
            _ => unreachable!("combine of a reduction"),
        }
    }

    /// Combines the lanes' accumulators of `reds` over the group; every lane ends with
    /// the row's result.
    pub(super) fn group_combine(&mut self, reds: &[usize], lanes: &Lanes, ind: &str) {
        match lanes.strat {
            Strategy::Thread => {}
            Strategy::Warp => self.warp_combine(reds, ind),
            Strategy::Block(t) => {
                self.warp_combine(reds, ind);
                let warps = t / 32;
                if warps > 1 {
                    self.smem_combine(
                        reds,
                        ind,
                        warps,
                        "(threadIdx.x >> 5)",
                        "(threadIdx.x & 31) == 0",
                        "",
                    );
                }
            }
            Strategy::ColumnTile => {
                let ty = self.tile_y();
                self.smem_combine(reds, ind, ty, "threadIdx.y", "true", "[threadIdx.x]");
            }
        }
    }

    /// Butterfly over the 32 lanes of a warp: every lane ends with the same value, since
    /// each step combines the same two partials (in either order, and every combine is
    /// commutative).
    fn warp_combine(&mut self, reds: &[usize], ind: &str) {
        let _ = writeln!(self.body, "{ind}#pragma unroll");
        let _ = writeln!(self.body, "{ind}for (int o = 16; o > 0; o >>= 1) {{");
        let ind2 = format!("{ind}  ");
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            if t == "bool" {
                let _ = writeln!(
                    self.body,
                    "{ind2}const bool oth{i} = __shfl_xor_sync(0xffffffffu, (int)acc{i}, o) != 0;"
                );
            } else {
                let _ = writeln!(
                    self.body,
                    "{ind2}const {t} oth{i} = __shfl_xor_sync(0xffffffffu, acc{i}, o);"
                );
            }
            if arg {
                let _ = writeln!(
                    self.body,
                    "{ind2}const long long othidx{i} = __shfl_xor_sync(0xffffffffu, idx{i}, o);"
                );
            }
            let st = self.combine_stmt(i, &format!("oth{i}"), &format!("othidx{i}"), &ind2);
            self.body.push_str(&st);
        }
        let _ = writeln!(self.body, "{ind}}}");
    }

    /// Partials through shared memory: slot `slot` of `n` writes (when `writer`), then
    /// every thread combines slots `0..n` in order. `col` indexes a second dimension
    /// (the column tile's x).
    fn smem_combine(
        &mut self,
        reds: &[usize],
        ind: &str,
        n: u32,
        slot: &str,
        writer: &str,
        col: &str,
    ) {
        let width = if col.is_empty() {
            String::new()
        } else {
            format!("[{TILE_X}]")
        };
        let _ = writeln!(self.body, "{ind}{{");
        let ind2 = format!("{ind}  ");
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            let _ = writeln!(self.body, "{ind2}__shared__ {t} sm{i}[{n}]{width};");
            if arg {
                let _ = writeln!(self.body, "{ind2}__shared__ long long smi{i}[{n}]{width};");
            }
        }
        let _ = writeln!(self.body, "{ind2}__syncthreads();");
        let guarded = writer != "true";
        let wind = if guarded {
            format!("{ind2}  ")
        } else {
            ind2.clone()
        };
        if guarded {
            let _ = writeln!(self.body, "{ind2}if ({writer}) {{");
        }
        for &i in reds {
            let (_, arg) = self.acc_types(i);
            let _ = writeln!(self.body, "{wind}sm{i}[{slot}]{col} = acc{i};");
            if arg {
                let _ = writeln!(self.body, "{wind}smi{i}[{slot}]{col} = idx{i};");
            }
        }
        if guarded {
            let _ = writeln!(self.body, "{ind2}}}");
        }
        let _ = writeln!(self.body, "{ind2}__syncthreads();");
        for &i in reds {
            let (t, arg) = self.acc_types(i);
            let _ = writeln!(self.body, "{ind2}acc{i} = sm{i}[0]{col};");
            if arg {
                let _ = writeln!(self.body, "{ind2}idx{i} = smi{i}[0]{col};");
            }
            let _ = writeln!(self.body, "{ind2}for (int s = 1; s < {n}; ++s) {{");
            let _ = writeln!(self.body, "{ind2}  const {t} othacc{i} = sm{i}[s]{col};");
            if arg {
                let _ = writeln!(
                    self.body,
                    "{ind2}  const long long othidx{i} = smi{i}[s]{col};"
                );
            }
            let st = self.combine_stmt(
                i,
                &format!("othacc{i}"),
                &format!("othidx{i}"),
                &format!("{ind2}  "),
            );
            self.body.push_str(&st);
            let _ = writeln!(self.body, "{ind2}}}");
        }
        let _ = writeln!(self.body, "{ind}}}");
    }
}
