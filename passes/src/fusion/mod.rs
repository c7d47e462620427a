//! Fusion and lowering: groups the graph into the fewest kernels the rules allow, folds
//! views into the loads of the kernels that read them, and turns the result into a
//! [`Schedule`] of [`Kernel`] descriptions (see `ndfuse_ir::kernel` for the row program
//! a kernel with reductions runs).
//!
//! A group has a *domain* (the shape of its element values) and, once it holds a
//! reduction, *reduce axes*; each member is an element value or a row value. The rules,
//! in the order they are applied:
//!
//! 1. In topological order, an element-wise op (unary, binary, where, cast) joins the
//!    groups of its operands, merging them, when they agree on domain and reduce axes
//!    and the merged group stays *convex* (no path leaves it and comes back through
//!    another node: the kernel would wait for itself). Its level follows its operands:
//!    an element value if any operand is one, else a row value (an epilogue: mean's
//!    divide, std's sqrt, softmax's log). A value with several users is computed once.
//! 2. A reduction (or argmax/argmin) joins the group of its element-valued operand when
//!    the group reduces the same axes or none yet (prologue fusion: `sum(exp(a*b+c))`),
//!    and starts a group of its own otherwise.
//! 3. A view of a row value that only adds or removes size-1 axes, or that broadcasts
//!    the keepdims form back over the reduced axes, is the same value inside the kernel
//!    (row-local fusion: softmax, log_softmax, layernorm, var and std are ONE kernel).
//! 4. Sibling groups over the same domain and compatible reduce axes merge (again only
//!    when convex): one launch instead of several, and an input they share is read once.
//! 5. Constants are never loaded: every kernel that reads one gets it as an immediate.
//!    A random op (`random_uniform`) is never stored either: every kernel that reads it
//!    computes it from its key (a load of the 0-d key) at the op's own position, the
//!    views between them folded into that position's index map as into a load's. Only
//!    element-wise kernels (and matmul epilogues) compute one: a kernel with reductions
//!    reads it from a buffer an element-wise kernel fills (stored, "read by a kernel with
//!    reductions"), as the codegens' row programs have no lowering of it.
//! 6. Any other view is an index map: a chain of views over a buffer becomes one [`View`]
//!    in the reading kernel's load. When a reshape cannot be expressed over the strides
//!    it sees (flattening a transpose), the view below it is copied into a buffer first.
//! 7. A matrix product starts a group of its own whose element-wise consumers join it as
//!    its epilogue (rule 1, one consumer at a time); a reduction or a view of the product
//!    is a boundary. A widening cast of a half operand read only by products is no node
//!    of its own: the product reads the half buffer and widens it (exact). Nor are the
//!    steps of an operand's prologue (`ndfuse_ir::Prologue`): float casts and products or
//!    quotients by constants, read only by products (or by further steps), down to an
//!    operand in memory; the product applies them as it reads, each rounded as the op
//!    rounds.
//! 8. A value is stored (a kernel boundary) when it is an output of the graph, when a
//!    node outside its kernel reads it, or when it is read through a view (the view
//!    reads memory, not the registers of the kernel computing it). Each stored value
//!    records why.
//!
//! The cost rule for a value with several consumers: inside one kernel it is computed
//! once and reused (SSA); across kernels it is materialised (written once, read by each
//! consumer) and never recomputed. Recomputing a cheap element-wise producer inside each
//! consumer would save its write and read (e.g. `y = exp(x)` feeding reductions over two
//! different axes); that trade is not made yet.
//!
//! Composite reductions lower to primitives: mean = sum / n; norm1 = sum |x|; norm2 =
//! sqrt(sum x²); var = sum((x - mean)²) / n, two sweeps over a row rather than
//! sum(x²)/n - mean², which cancels catastrophically when the mean is large against the
//! spread; std = sqrt(var). Shared pieces (the sum inside mean and var) are emitted once.
//!
//! [`Kernel`]: ndfuse_ir::Kernel
//! [`View`]: ndfuse_ir::View

mod boundary;
mod convex;
mod group;
mod kernel;
mod lower;
mod rows;
mod rules;

use crate::plan::TargetDesc;
use crate::schedule::Schedule;
use group::Fuser;
use ndfuse_ir::Graph;

/// Fuses and lowers `g` (which must verify) into a schedule of kernels for its outputs,
/// with plans chosen for the CPU target.
pub fn schedule(g: &Graph) -> Schedule {
    schedule_for(g, &TargetDesc::cpu())
}

/// [`schedule`] with plans chosen for `target`.
pub fn schedule_for(g: &Graph, target: &TargetDesc) -> Schedule {
    schedule_with(g, target, true)
}

/// [`schedule_for`], with fusion turned off when `fuse` is false
/// (`NDFUSE_DISABLE_PASSES=fusion`): every op is its own kernel, views still fold into
/// loads. For bisecting a wrong result to fusion, and for measuring what it buys.
pub fn schedule_with(g: &Graph, target: &TargetDesc, fuse: bool) -> Schedule {
    // The rules' convexity checks prune their backward search by position (a group
    // placed wholly before the candidate is not followed), which a kernel whose members
    // span the graph (made by a sibling merge, or by a copy absorbed into a group) can
    // defeat: two kernels that read each other through a third. Lowering finds such a
    // circle when it orders the kernels; the grouping is then made again without sibling
    // merges and shared copies, and, failing that, unfused (always acyclic).
    let attempts = [(fuse, true), (fuse, false), (false, false)];
    for (fuse, share) in attempts {
        if let Some(s) = attempt(g, target, fuse, share) {
            return s;
        }
    }
    unreachable!("an unfused schedule follows the graph, which has no cycle (a bug otherwise)")
}

/// One grouping of `g`; `share` allows sibling merges and copies joining other groups.
/// `None` when the kernels would wait for each other (see [`schedule_with`]).
fn attempt(g: &Graph, target: &TargetDesc, fuse: bool, share: bool) -> Option<Schedule> {
    let mut f = Fuser::new(g, target.clone());
    f.fuse = fuse;
    f.share = share && fuse;
    if fuse {
        // Before grouping: a widened operand or a prologue step is never a group
        // member.
        f.mark_widened();
        f.mark_prologues();
    }
    f.form_groups();
    if f.share {
        f.merge_siblings();
    }
    f.mark_stores();
    f.absorb_copies();
    f.lower()
}
