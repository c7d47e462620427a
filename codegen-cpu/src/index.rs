//! Index maps: how each load turns the flat row-major position `i` of the domain into
//! an element offset in its buffer.
//!
//! Shapes and strides are constants of the kernel, so the plan is made here, at compile
//! time, and `lower` only emits it. Three kinds of access, cheapest first:
//!
//! | access       | when                                        | offset                   |
//! |--------------|---------------------------------------------|--------------------------|
//! | `Contiguous` | `View::is_contiguous`                        | `i`                      |
//! | `Fixed`      | every axis of extent > 1 has stride 0        | `offset` (loop-invariant) |
//! | `Strided`    | anything else                               | `offset + sum(idx[g] * stride[g])` |
//!
//! For strided loads, `i` is decomposed into per-axis indices by division by constant
//! extents. Adjacent axes are merged first wherever *every* strided load allows it
//! (`stride[outer] == stride[inner] * extent[inner]`), and extent-1 axes are dropped,
//! so that the chain of divisions is as short as the views permit: a sliced but
//! otherwise contiguous view needs none, a transposed 2-d view needs one.

use ndfuse_ir::{Shape, View};

/// How one load computes its element offset from the flat position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The offset is the flat position itself.
    Contiguous,
    /// Every position reads the same element (a broadcast scalar).
    Fixed(i64),
    /// `offset + sum(idx[g] * strides[g])` over the groups of the [`IndexPlan`].
    Strided {
        /// Offset of the first element.
        offset: i64,
        /// One stride per group of [`IndexPlan::extents`].
        strides: Vec<i64>,
    },
}

/// The shared decomposition of the flat position into group indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexPlan {
    /// Extent of each group of merged axes, outermost first.
    pub extents: Vec<i64>,
    /// Whether some strided load reads with a non-zero stride along the group, i.e.
    /// whether its index must be computed at all.
    pub needed: Vec<bool>,
}

impl IndexPlan {
    /// The outermost group whose index is needed; the division chain stops there.
    pub fn outermost_needed(&self) -> Option<usize> {
        self.needed.iter().position(|&n| n)
    }
}

/// Plans the index maps of `views` (each of shape `domain`), returning the shared plan
/// and one access per view, in order. Strides must have one entry per axis (checked by
/// `supports`).
pub(crate) fn plan(domain: &Shape, views: &[&View]) -> (IndexPlan, Vec<Access>) {
    let dims = domain.dims();
    let kinds: Vec<Option<Access>> = views
        .iter()
        .map(|v| {
            if v.is_contiguous() {
                Some(Access::Contiguous)
            } else if dims.iter().zip(&v.strides).all(|(&d, &s)| d == 1 || s == 0) {
                Some(Access::Fixed(v.offset as i64))
            } else {
                None
            }
        })
        .collect();
    let strided: Vec<&View> = views
        .iter()
        .zip(&kinds)
        .filter(|(_, k)| k.is_none())
        .map(|(v, _)| *v)
        .collect();

    // Groups of merged axes, outermost first: (extent, innermost stride of each view).
    let mut groups: Vec<(i64, Vec<i64>)> = Vec::new();
    if !strided.is_empty() {
        for (k, &d) in dims.iter().enumerate() {
            if d == 1 {
                continue; // its index is always 0
            }
            let d = d as i64;
            let inner: Vec<i64> = strided.iter().map(|v| v.strides[k] as i64).collect();
            if let Some((extent, outer)) = groups.last_mut() {
                let mergeable = outer
                    .iter()
                    .zip(&inner)
                    .all(|(&o, &s)| s.checked_mul(d) == Some(o));
                if mergeable {
                    *extent *= d;
                    *outer = inner;
                    continue;
                }
            }
            groups.push((d, inner));
        }
    }

    let index_plan = IndexPlan {
        extents: groups.iter().map(|(e, _)| *e).collect(),
        needed: (0..groups.len())
            .map(|g| groups[g].1.iter().any(|&s| s != 0))
            .collect(),
    };
    let mut next_strided = 0;
    let accesses = views
        .iter()
        .zip(kinds)
        .map(|(v, kind)| {
            kind.unwrap_or_else(|| {
                let j = next_strided;
                next_strided += 1;
                Access::Strided {
                    offset: v.offset as i64,
                    strides: groups.iter().map(|(_, s)| s[j]).collect(),
                }
            })
        })
        .collect();
    (index_plan, accesses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndfuse_ir::AxisSlice;

    fn view(dims: &[usize], strides: &[isize], offset: isize) -> View {
        View {
            shape: Shape::new(dims),
            strides: strides.to_vec(),
            offset,
        }
    }

    #[test]
    fn contiguous_and_fixed_need_no_divisions() {
        let d = Shape::new([4, 8]);
        let (p, a) = plan(
            &d,
            &[&View::contiguous(d.clone()), &view(&[4, 8], &[0, 0], 5)],
        );
        assert_eq!(a, vec![Access::Contiguous, Access::Fixed(5)]);
        assert!(p.extents.is_empty());
    }

    #[test]
    fn transposed_view_decomposes_into_two_groups() {
        let d = Shape::new([3, 4]);
        let t = View::contiguous(Shape::new([4, 3])).permute(&[1, 0]);
        let (p, a) = plan(&d, &[&t]);
        assert_eq!(p.extents, vec![3, 4]);
        assert_eq!(p.needed, vec![true, true]);
        assert_eq!(
            a,
            vec![Access::Strided {
                offset: 0,
                strides: vec![1, 3]
            }]
        );
    }

    #[test]
    fn sliced_rows_merge_into_one_group() {
        // x[1:, :] of a [5, 6] buffer: contiguous rows at offset 6, no division needed.
        let d = Shape::new([4, 6]);
        let v = View::contiguous(Shape::new([5, 6])).slice(&[
            AxisSlice {
                start: 1,
                step: 1,
                len: 4,
            },
            AxisSlice::full(6),
        ]);
        let (p, a) = plan(&d, &[&v]);
        assert_eq!(p.extents, vec![24]);
        assert_eq!(
            a,
            vec![Access::Strided {
                offset: 6,
                strides: vec![1]
            }]
        );
    }

    #[test]
    fn a_merge_needs_every_strided_view_to_allow_it() {
        // A reversed [2,3,4] view merges all axes alone, but a second view broadcast
        // along the middle axis only allows merging nothing with it.
        let d = Shape::new([2, 3, 4]);
        let rev = view(&[2, 3, 4], &[-12, -4, -1], 23);
        let (p, _) = plan(&d, &[&rev]);
        assert_eq!(p.extents, vec![24]);
        let bc = view(&[2, 3, 4], &[4, 0, 1], 0);
        let (p, a) = plan(&d, &[&rev, &bc]);
        assert_eq!(p.extents, vec![2, 3, 4]);
        assert_eq!(p.needed, vec![true, true, true]);
        assert_eq!(
            a[1],
            Access::Strided {
                offset: 0,
                strides: vec![4, 0, 1]
            }
        );
    }

    #[test]
    fn extent_one_axes_are_dropped_and_broadcast_groups_not_needed() {
        let d = Shape::new([4, 1, 8]);
        let (p, a) = plan(&d, &[&view(&[4, 1, 8], &[0, 7, 1], 0)]);
        assert_eq!(p.extents, vec![4, 8]);
        assert_eq!(p.needed, vec![false, true]);
        assert_eq!(p.outermost_needed(), Some(1));
        assert_eq!(
            a,
            vec![Access::Strided {
                offset: 0,
                strides: vec![0, 1]
            }]
        );
    }
}
