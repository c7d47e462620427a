//! Shapes, strides and views: a view is a zero-copy index map from a logical index to an
//! element offset in a buffer (`offset + sum(index[d] * strides[d])`).
//!
//! Every view op of the graph (reshape, permute, slice, broadcast_to, expand_dims,
//! squeeze) is a function on [`View`], so a chain of them collapses into one index map
//! that a kernel applies when it loads. Strides are in elements, may be negative (reversed
//! slices) or zero (broadcast axes).

use std::fmt;

/// The extent of each axis of a tensor. `[]` is a scalar (one element).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// A shape from its dims.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The dims.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar, 0 if any dim is 0).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// `(outer, n, inner)`: the element counts before, at and after `axis`, the three
    /// extents an op along one axis (a gather, a scan, a sort) walks.
    pub fn around_axis(&self, axis: usize) -> (usize, usize, usize) {
        let d = self.dims();
        (
            d[..axis].iter().product(),
            d[axis],
            d[axis + 1..].iter().product(),
        )
    }

    /// The multi-index of row-major position `p` (for messages that name a position).
    pub fn unravel(&self, mut p: usize) -> Vec<usize> {
        let mut idx = vec![0; self.rank()];
        for (a, &d) in self.dims().iter().enumerate().rev() {
            if d > 0 {
                idx[a] = p % d;
                p /= d;
            }
        }
        idx
    }

    /// Row-major (C order) strides of a contiguous tensor of this shape.
    pub fn contiguous_strides(&self) -> Vec<isize> {
        let mut strides = vec![0isize; self.rank()];
        let mut acc = 1isize;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc = acc.saturating_mul(d.max(1) as isize);
        }
        strides
    }

    /// numpy broadcasting of two shapes (align right; equal dims or 1), `None` when
    /// they do not broadcast.
    pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out = vec![0; rank];
        for (i, o) in out.iter_mut().enumerate() {
            let da = dim_from_right(a, rank - 1 - i);
            let db = dim_from_right(b, rank - 1 - i);
            *o = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
        }
        Some(Shape(out))
    }

    /// Whether this shape broadcasts to `target` (numpy's `broadcast_to` rule).
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        self.rank() <= target.rank()
            && (0..self.rank()).all(|i| {
                let d = dim_from_right(self, i);
                d == 1 || d == dim_from_right(target, i)
            })
    }
}

/// The dim `i` places from the right, 1 when the shape has fewer axes.
fn dim_from_right(s: &Shape, i: usize) -> usize {
    if i < s.rank() {
        s.0[s.rank() - 1 - i]
    } else {
        1
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Shape {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Shape {
        Shape(d)
    }
}

/// One axis of a slice after numpy's normalisation: the elements
/// `start, start + step, ...`, `len` of them. `step` is never 0 and may be negative.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AxisSlice {
    /// First index taken (meaningless when `len == 0`).
    pub start: i64,
    /// Distance between taken indices; negative walks backwards.
    pub step: i64,
    /// Number of indices taken.
    pub len: usize,
}

impl AxisSlice {
    /// The whole axis of extent `dim`.
    pub fn full(dim: usize) -> AxisSlice {
        AxisSlice {
            start: 0,
            step: 1,
            len: dim,
        }
    }

    /// Normalises a Python-style `start:stop:step` over an axis of extent `dim`, with the
    /// exact rules of Python's `slice.indices` (negative indices count from the end,
    /// out-of-range bounds clamp). `None` when `step == 0`.
    pub fn normalize(
        dim: usize,
        start: Option<i64>,
        stop: Option<i64>,
        step: i64,
    ) -> Option<AxisSlice> {
        let n = dim as i64;
        let adjust = |v: i64, lo: i64, hi: i64| -> i64 {
            let v = if v < 0 { v + n } else { v };
            v.clamp(lo, hi)
        };
        let (start, len) = if step > 0 {
            let start = start.map_or(0, |s| adjust(s, 0, n));
            let stop = stop.map_or(n, |s| adjust(s, 0, n));
            let len = if stop > start {
                (stop - start - 1) / step + 1
            } else {
                0
            };
            (start, len)
        } else if step < 0 {
            let start = start.map_or(n - 1, |s| adjust(s, -1, n - 1));
            let stop = stop.map_or(-1, |s| adjust(s, -1, n - 1));
            let len = if start > stop {
                (start - stop - 1) / (-step) + 1
            } else {
                0
            };
            (start, len)
        } else {
            return None;
        };
        Some(AxisSlice {
            start,
            step,
            len: len as usize,
        })
    }

    /// Whether this slice takes the whole axis of extent `dim` in order.
    pub fn is_full(&self, dim: usize) -> bool {
        self.len == dim && self.step == 1 && (self.start == 0 || dim == 0)
    }
}

impl fmt::Display for AxisSlice {
    /// Prints a Python slice that selects exactly these indices (`1:9:2`, `3::-1`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == 0 {
            return write!(f, "0:0:{}", self.step);
        }
        let stop = self.start + self.len as i64 * self.step;
        if stop < 0 {
            write!(f, "{}::{}", self.start, self.step)
        } else {
            write!(f, "{}:{}:{}", self.start, stop, self.step)
        }
    }
}

/// A zero-copy index map over a buffer: element `index` of the view lives at
/// `offset + sum(index[d] * strides[d])` in the buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct View {
    /// Logical shape of the view.
    pub shape: Shape,
    /// Stride of each axis in elements (0 for a broadcast axis, negative for reversed).
    pub strides: Vec<isize>,
    /// Offset of element `[0, 0, ...]` in the buffer, in elements.
    pub offset: isize,
}

impl View {
    /// The identity view of a contiguous (row-major) buffer of `shape`.
    pub fn contiguous(shape: Shape) -> View {
        let strides = shape.contiguous_strides();
        View {
            shape,
            strides,
            offset: 0,
        }
    }

    /// Whether the view reads a buffer in row-major order from offset 0 with no gaps
    /// (size-1 axes may have any stride).
    pub fn is_contiguous(&self) -> bool {
        if self.shape.numel() == 0 {
            return true;
        }
        let want = self.shape.contiguous_strides();
        self.offset == 0
            && self
                .shape
                .0
                .iter()
                .zip(self.strides.iter().zip(&want))
                .all(|(&d, (s, w))| d == 1 || s == w)
    }

    /// Buffer offset of a logical index.
    pub fn offset_of(&self, index: &[usize]) -> isize {
        debug_assert_eq!(index.len(), self.shape.rank(), "index rank is a bug");
        index
            .iter()
            .zip(&self.strides)
            .fold(self.offset, |acc, (&i, &s)| acc + i as isize * s)
    }

    /// The lowest and highest buffer offsets the view touches, `None` when it is empty.
    /// A buffer of `hi + 1` elements (with `lo >= 0`) is enough to back the view.
    /// Computed in i128, so no shape or stride can overflow the answer; a view whose
    /// stride count differs from its rank spans nothing meaningful and gives `None` too.
    pub fn span(&self) -> Option<(i128, i128)> {
        if self.shape.numel() == 0 || self.strides.len() != self.shape.rank() {
            return None;
        }
        let (mut lo, mut hi) = (self.offset as i128, self.offset as i128);
        for (&d, &s) in self.shape.0.iter().zip(&self.strides) {
            let reach = (d as i128 - 1) * s as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        Some((lo, hi))
    }

    /// The view with its axes reordered: axis `i` of the result is axis `perm[i]` of
    /// `self`. `perm` must be a permutation (checked by shape inference).
    pub fn permute(&self, perm: &[usize]) -> View {
        View {
            shape: Shape(perm.iter().map(|&p| self.shape.0[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// The view restricted by one normalised slice per axis.
    pub fn slice(&self, slices: &[AxisSlice]) -> View {
        let mut v = self.clone();
        for (d, s) in slices.iter().enumerate() {
            if s.len > 0 {
                v.offset += s.start as isize * self.strides[d];
            }
            v.strides[d] = self.strides[d] * s.step as isize;
            v.shape.0[d] = s.len;
        }
        v
    }

    /// The view broadcast to `target` (new leading axes and size-1 axes get stride 0).
    /// `self.shape` must broadcast to `target` (checked by shape inference).
    pub fn broadcast_to(&self, target: &Shape) -> View {
        let extra = target.rank() - self.shape.rank();
        let strides = (0..target.rank())
            .map(|i| {
                if i < extra || self.shape.0[i - extra] != target.0[i] {
                    0
                } else {
                    self.strides[i - extra]
                }
            })
            .collect();
        View {
            shape: target.clone(),
            strides,
            offset: self.offset,
        }
    }

    /// The view with a new size-1 axis inserted at `axis` (`0..=rank`).
    pub fn expand_dims(&self, axis: usize) -> View {
        let mut v = self.clone();
        v.shape.0.insert(axis, 1);
        v.strides.insert(axis, 0);
        v
    }

    /// The view without the given size-1 axes (sorted, unique, checked by inference).
    pub fn squeeze(&self, axes: &[usize]) -> View {
        let keep = |i: &usize| !axes.contains(i);
        View {
            shape: Shape(
                (0..self.shape.rank())
                    .filter(keep)
                    .map(|i| self.shape.0[i])
                    .collect(),
            ),
            strides: (0..self.shape.rank())
                .filter(keep)
                .map(|i| self.strides[i])
                .collect(),
            offset: self.offset,
        }
    }

    /// The view reinterpreted with shape `new` (same element count) without copying,
    /// or `None` when the strides cannot express it (e.g. flattening a transpose); the
    /// caller then materialises the data first. numpy's no-copy reshape rule.
    pub fn reshape(&self, new: &Shape) -> Option<View> {
        debug_assert_eq!(self.shape.numel(), new.numel(), "reshape size is a bug");
        if self.shape.numel() == 0 || self.is_contiguous_ignoring_offset() {
            let mut v = View::contiguous(new.clone());
            v.offset = self.offset;
            return Some(v);
        }
        // Size-1 axes carry no layout; drop them from the old view.
        let old: Vec<(usize, isize)> = self
            .shape
            .0
            .iter()
            .copied()
            .zip(self.strides.iter().copied())
            .filter(|&(d, _)| d != 1)
            .collect();
        let new_dims = &new.0;
        let mut strides = vec![0isize; new_dims.len()];
        let (mut oi, mut oj, mut ni, mut nj) = (0, 1, 0, 1);
        while ni < new_dims.len() && oi < old.len() {
            let mut np = new_dims[ni];
            let mut op = old[oi].0;
            while np != op {
                if np < op {
                    np *= new_dims[nj];
                    nj += 1;
                } else {
                    op *= old[oj].0;
                    oj += 1;
                }
            }
            // The old axes oi..oj must form one evenly strided block.
            for k in oi..oj - 1 {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 as isize {
                    return None;
                }
            }
            strides[nj - 1] = old[oj - 1].1;
            for k in (ni + 1..nj).rev() {
                strides[k - 1] = strides[k] * new_dims[k] as isize;
            }
            ni = nj;
            nj += 1;
            oi = oj;
            oj += 1;
        }
        // Trailing size-1 axes of the new shape keep stride 0.
        Some(View {
            shape: new.clone(),
            strides,
            offset: self.offset,
        })
    }

    fn is_contiguous_ignoring_offset(&self) -> bool {
        let mut v = self.clone();
        v.offset = 0;
        v.is_contiguous()
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} strides=(", self.shape)?;
        for (i, s) in self.strides.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{s}")?;
        }
        write!(f, ") offset={}", self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        let s = |d: &[usize]| Shape(d.to_vec());
        assert_eq!(Shape::broadcast(&s(&[4, 1]), &s(&[3])), Some(s(&[4, 3])));
        assert_eq!(Shape::broadcast(&s(&[]), &s(&[2, 3])), Some(s(&[2, 3])));
        assert_eq!(Shape::broadcast(&s(&[0, 1]), &s(&[1, 5])), Some(s(&[0, 5])));
        assert_eq!(Shape::broadcast(&s(&[4, 8]), &s(&[3])), None);
        assert!(s(&[3, 1]).broadcasts_to(&s(&[2, 3, 4])));
        assert!(!s(&[3, 2]).broadcasts_to(&s(&[3, 4])));
    }

    #[test]
    fn python_slice_normalisation() {
        let n = |dim, a, b, st| AxisSlice::normalize(dim, a, b, st).expect("step != 0");
        // x[1:9:2] over 10 -> 1,3,5,7
        assert_eq!(
            n(10, Some(1), Some(9), 2),
            AxisSlice {
                start: 1,
                step: 2,
                len: 4
            }
        );
        // x[::-1] over 5 -> 4,3,2,1,0
        assert_eq!(
            n(5, None, None, -1),
            AxisSlice {
                start: 4,
                step: -1,
                len: 5
            }
        );
        // x[-2:] over 5 -> 3,4
        assert_eq!(
            n(5, Some(-2), None, 1),
            AxisSlice {
                start: 3,
                step: 1,
                len: 2
            }
        );
        // x[3:0:-2] over 5 -> 3,1
        assert_eq!(
            n(5, Some(3), Some(0), -2),
            AxisSlice {
                start: 3,
                step: -2,
                len: 2
            }
        );
        // x[10:20] over 5 -> empty; x[-100:2] -> 0,1
        assert_eq!(n(5, Some(10), Some(20), 1).len, 0);
        assert_eq!(
            n(5, Some(-100), Some(2), 1),
            AxisSlice {
                start: 0,
                step: 1,
                len: 2
            }
        );
        // x[:-100:-1] over 5 -> all, reversed
        assert_eq!(n(5, None, Some(-100), -1).len, 5);
        assert_eq!(AxisSlice::normalize(5, None, None, 0), None);
        assert_eq!(n(10, Some(1), Some(9), 2).to_string(), "1:9:2");
        assert_eq!(n(5, None, None, -1).to_string(), "4::-1");
        assert_eq!(n(5, Some(3), Some(0), -2).to_string(), "3::-2");
    }

    #[test]
    fn reshape_without_copy() {
        let v = View::contiguous(Shape(vec![4, 6]));
        let r = v
            .reshape(&Shape(vec![2, 2, 3, 2]))
            .expect("contiguous reshapes");
        assert!(r.is_contiguous());
        // A transpose cannot be flattened without a copy...
        let t = v.permute(&[1, 0]);
        assert!(t.reshape(&Shape(vec![24])).is_none());
        // ...but splitting one of its axes can.
        // Element (i,j,k) is transposed element (3i+j, k), at offset (3i+j) + 6k.
        let s = t.reshape(&Shape(vec![2, 3, 4])).expect("split axis");
        assert_eq!(s.strides, vec![3, 1, 6]);
        // Column slice [:, 1:3] then reshape rows: [4,2] -> [2,2,2] keeps strides.
        let c = v.slice(&[
            AxisSlice::full(4),
            AxisSlice {
                start: 1,
                step: 1,
                len: 2,
            },
        ]);
        let cr = c.reshape(&Shape(vec![2, 2, 2])).expect("split rows");
        assert_eq!((cr.strides.clone(), cr.offset), (vec![12, 6, 1], 1));
        assert!(c.reshape(&Shape(vec![8])).is_none());
    }

    #[test]
    fn span_and_negative_strides() {
        let v = View::contiguous(Shape(vec![3, 4]));
        let r = v.slice(&[
            AxisSlice {
                start: 2,
                step: -1,
                len: 3,
            },
            AxisSlice::full(4),
        ]);
        assert_eq!(r.offset_of(&[0, 0]), 8);
        assert_eq!(r.span(), Some((0, 11)));
        let b = View::contiguous(Shape(vec![4])).broadcast_to(&Shape(vec![5, 4]));
        assert_eq!(b.strides, vec![0, 1]);
        assert_eq!(b.span(), Some((0, 3)));
    }
}
