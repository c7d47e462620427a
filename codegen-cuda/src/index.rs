//! Index arithmetic: a flat position decomposed over the axes of a space, and each
//! view's offset as a sum of index times stride.
//!
//! Axes that every view walks as one run (`stride[a] == stride[a + 1] * dim[a + 1]` for
//! all of them) merge first, and size-1 axes drop, so a contiguous 4-d load costs no
//! division at all and a broadcast `b[M]` over `[N, M]` costs one `%`.

/// A space of `dims` (row-major) and the strides of each view over it, after merging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Space {
    /// Extents of the merged axes, outermost first (no 1s; empty for one element).
    pub dims: Vec<usize>,
    /// Per view: its stride along each merged axis.
    pub strides: Vec<Vec<isize>>,
}

/// Merges the axes of `dims` that every view in `views` (strides per axis) walks as one.
pub(crate) fn coalesce(dims: &[usize], views: &[Vec<isize>]) -> Space {
    // Drop size-1 axes: their index is always 0.
    let keep: Vec<usize> = (0..dims.len()).filter(|&a| dims[a] != 1).collect();
    let mut mdims: Vec<usize> = keep.iter().map(|&a| dims[a]).collect();
    let mut mstrides: Vec<Vec<isize>> = views
        .iter()
        .map(|s| keep.iter().map(|&a| s[a]).collect())
        .collect();
    // Merge from the innermost pair outward.
    let mut a = mdims.len();
    while a >= 2 {
        let (o, i) = (a - 2, a - 1);
        let mergeable = mstrides
            .iter()
            .all(|s| s[o] == s[i].saturating_mul(mdims[i] as isize));
        if mergeable {
            mdims[o] *= mdims[i];
            mdims.remove(i);
            for s in &mut mstrides {
                s[o] = s[i];
                s.remove(i);
            }
        }
        a -= 1;
    }
    Space {
        dims: mdims,
        strides: mstrides,
    }
}

impl Space {
    /// Statements decomposing `flat` into per-axis indices named `{prefix}{a}`, for the
    /// axes some view needs, each line indented by `ind`. Nothing when `flat` is used as
    /// it is (one axis) or no view needs the axes.
    pub fn decompose(&self, flat: &str, prefix: &str, ind: &str) -> String {
        let n = self.dims.len();
        if n <= 1 || !self.needs_axes() {
            return String::new();
        }
        let mut s = format!("{ind}nd_idx {prefix}t = {flat};\n");
        for a in (1..n).rev() {
            s.push_str(&format!(
                "{ind}const nd_idx {prefix}{a} = {prefix}t % {d}; {prefix}t /= {d};\n",
                d = self.dims[a]
            ));
        }
        s.push_str(&format!("{ind}const nd_idx {prefix}0 = {prefix}t;\n"));
        s
    }

    /// Whether some view needs per-axis indices (is not the plain row-major walk).
    fn needs_axes(&self) -> bool {
        (0..self.strides.len()).any(|v| !self.is_row_major(v) && !self.is_fixed(v))
    }

    /// Whether view `v` walks the space row-major with unit inner stride.
    pub fn is_row_major(&self, v: usize) -> bool {
        let mut acc = 1isize;
        for a in (0..self.dims.len()).rev() {
            if self.strides[v][a] != acc {
                return false;
            }
            acc = acc.saturating_mul(self.dims[a] as isize);
        }
        true
    }

    /// Whether view `v` stays put (every stride 0).
    pub fn is_fixed(&self, v: usize) -> bool {
        self.strides[v].iter().all(|&s| s == 0)
    }

    /// The offset expression of view `v` at flat position `flat` (whose axes are
    /// `{prefix}{a}` when decomposed), plus the constant `offset`.
    pub fn offset(&self, v: usize, flat: &str, prefix: &str, offset: isize) -> String {
        let mut terms: Vec<String> = Vec::new();
        if self.is_row_major(v) && !self.dims.is_empty() {
            terms.push(flat.to_string());
        } else if self.dims.len() == 1 {
            match self.strides[v][0] {
                0 => {}
                1 => terms.push(flat.to_string()),
                s => terms.push(format!("{flat} * {s}")),
            }
        } else {
            for (a, &st) in self.strides[v].iter().enumerate() {
                match st {
                    0 => {}
                    1 => terms.push(format!("{prefix}{a}")),
                    s => terms.push(format!("{prefix}{a} * {s}")),
                }
            }
        }
        if offset != 0 || terms.is_empty() {
            terms.push(offset.to_string());
        }
        let s = terms.join(" + ");
        s.replace("+ -", "- ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_views_merge_to_one_axis() {
        let s = coalesce(&[4, 8, 2], &[vec![16, 2, 1], vec![16, 2, 1]]);
        assert_eq!(s.dims, vec![64]);
        assert_eq!(s.offset(0, "p", "i", 0), "p");
        assert_eq!(s.decompose("p", "i", ""), "");
    }

    #[test]
    fn broadcasts_keep_their_axes() {
        // a[N,M] * b[M] + c[N,1]
        let s = coalesce(&[3, 4], &[vec![4, 1], vec![0, 1], vec![1, 0]]);
        assert_eq!(s.dims, vec![3, 4]);
        assert_eq!(s.offset(0, "p", "i", 0), "p");
        assert_eq!(s.offset(1, "p", "i", 0), "i1");
        assert_eq!(s.offset(2, "p", "i", 5), "i0 + 5");
        assert!(s.decompose("p", "i", "").contains("i1 = it % 4"));
    }

    #[test]
    fn reversed_and_unit_axes() {
        let s = coalesce(&[1, 5], &[vec![7, -1]]);
        assert_eq!(s.dims, vec![5]);
        assert_eq!(s.offset(0, "j", "r", 4), "j * -1 + 4");
    }
}
