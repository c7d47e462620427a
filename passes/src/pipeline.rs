//! The clean-up pipeline: the one list of graph passes run before fusion, with the
//! reason for every position, and [`optimize`], which runs it under the manager.

use crate::attention::FuseAttention;
use crate::cse::Cse;
use crate::dce::Dce;
use crate::fold::Fold;
use crate::gather_views::GatherViews;
use crate::manager::{PassLog, PassManager, PassOptions};
use crate::pass::{Pass, PassError};
use crate::simplify::Simplify;
use crate::sink_reshapes::SinkReshapes;
use crate::views::Views;
use ndfuse_ir::Graph;

/// The clean-up passes in the order [`crate::PassManager`] runs them. The manager
/// repeats the list until one full lap changes nothing, so a pass that enables an
/// earlier one (CSE making `where(c, x, x)` for simplify) is caught on the next lap;
/// the order below is the one that makes a second lap rare.
pub fn pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        // First: folding turns constant subexpressions into single fills, so the rules
        // after it see `x * (2.0 - 1.0)` as `x * 1.0`. It also absorbs views of
        // constants, which `views` would otherwise spend rewrites on.
        Box::new(Fold),
        // After fold (its rules match constant operands); before views, because
        // removing `neg(neg(.))` or an identity cast between two views makes the views
        // adjacent, and before CSE so that CSE compares canonical forms.
        Box::new(Simplify),
        // After simplify (see above); before CSE, because collapsing
        // `reshape(reshape(x))` to `reshape(x)` makes it a duplicate CSE can merge.
        Box::new(Views),
        // After views (one collapsed view of a gather moves in one rewrite), before CSE
        // (the gathers it makes can share their table and index views): a view of a
        // gather becomes a gather of views, so its consumer fuses with it.
        Box::new(GatherViews),
        // After the views settle (its pattern reads through the softmax's broadcasts and
        // the transposed keys), before CSE (which merges the attention it makes with the
        // one `grad` made from the same pattern, and the views in front of both):
        // `softmax(scale * q @ k^T + bias) @ v` becomes one attention node.
        Box::new(FuseAttention),
        // After attention (whose pattern it would otherwise have to read through
        // reshapes), before CSE (the reshapes and broadcasts it makes can merge with
        // existing ones): element-wise ops over a reshaped product move above the
        // reshape, onto the product's shape, so they join its epilogue (a convolution's
        // bias, batch norm, activation and residual add).
        Box::new(SinkReshapes),
        // After every rewrite that canonicalises, so more duplicates look alike. Its
        // merges (two equal constants, two equal subexpressions) can enable simplify
        // rules that need identical operands (`maximum(x, x)`, `where(c, x, x)`): the
        // next lap runs simplify again.
        Box::new(Cse),
        // Last: every pass above only redirects uses and leaves the replaced nodes
        // behind; one sweep at the end removes them all, and fusion receives a graph
        // with no dead nodes.
        Box::new(Dce),
    ]
}

/// Runs the clean-up [`pipeline()`] over `g`.
///
/// ```
/// use ndfuse_ir::{DType, Graph, Op, Scalar, Shape, UnaryOp};
/// use ndfuse_passes::{optimize, PassOptions};
/// let mut g = Graph::new();
/// let x = g.add_input("x", DType::F32, Shape::new([4]));
/// let n = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
/// let nn = g.add(Op::Unary(UnaryOp::Neg), &[n]).unwrap();
/// g.add_output(nn);
/// let log = optimize(&mut g, &PassOptions::default()).unwrap();
/// assert!(log.changed());
/// assert_eq!(g.to_string(), "%0 = input \"x\" : f32[4]\nreturn %0\n");
/// ```
pub fn optimize(g: &mut Graph, opts: &PassOptions) -> Result<PassLog, PassError> {
    PassManager::new(pipeline()).run(g, opts)
}
