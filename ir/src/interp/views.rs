//! Index maps: the buffer offsets a view walks, and the view each view op makes.

use crate::op::ViewOp;
use crate::shape::{Shape, View};

/// Buffer offsets of the indices of `dims` in row-major order, under `strides` from
/// `base`: the index map of a view, walked with an odometer so each step is O(1)
/// amortised.
pub(super) struct Offsets<'a> {
    dims: &'a [usize],
    strides: &'a [isize],
    index: Vec<usize>,
    cur: isize,
    left: usize,
}

impl<'a> Offsets<'a> {
    /// The offsets from row-major position `first` on.
    pub(super) fn starting_at(
        dims: &'a [usize],
        strides: &'a [isize],
        base: isize,
        first: usize,
    ) -> Self {
        let numel: usize = dims.iter().product();
        let mut index = vec![0; dims.len()];
        let mut rest = first;
        for (i, &d) in index.iter_mut().zip(dims).rev() {
            if d > 0 {
                *i = rest % d;
                rest /= d;
            }
        }
        let cur = index
            .iter()
            .zip(strides)
            .fold(base, |acc, (&i, &s)| acc + i as isize * s);
        Offsets {
            dims,
            strides,
            index,
            cur,
            left: numel.saturating_sub(first),
        }
    }

    pub(super) fn new(dims: &'a [usize], strides: &'a [isize], base: isize) -> Self {
        Offsets::starting_at(dims, strides, base, 0)
    }

    pub(super) fn of_view(view: &'a View) -> Self {
        Offsets::new(view.shape.dims(), &view.strides, view.offset)
    }
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        let out = self.cur;
        self.left -= 1;
        if self.left > 0 {
            for d in (0..self.dims.len()).rev() {
                self.index[d] += 1;
                self.cur += self.strides[d];
                if self.index[d] < self.dims[d] {
                    break;
                }
                self.cur -= self.strides[d] * self.dims[d] as isize;
                self.index[d] = 0;
            }
        }
        Some(usize::try_from(out).expect("a checked view never reaches before its buffer (a bug)"))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// The view `op` makes of a contiguous operand of `shape`.
pub(super) fn view_of(op: &ViewOp, shape: &Shape) -> View {
    let base = View::contiguous(shape.clone());
    match op {
        // A contiguous operand reshapes to the contiguous layout of the new shape.
        ViewOp::Reshape(to) => base
            .reshape(to)
            .unwrap_or_else(|| View::contiguous(to.clone())),
        ViewOp::Permute(perm) => base.permute(perm),
        ViewOp::Slice(slices) => base.slice(slices),
        ViewOp::BroadcastTo(to) => base.broadcast_to(to),
        ViewOp::ExpandDims(axis) => base.expand_dims(*axis),
        ViewOp::Squeeze(axes) => base.squeeze(axes),
    }
}
