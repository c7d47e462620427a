//! Products of one row, `[1, k] @ [k, n]` (a recurrent step's, a decode step's), read in
//! place: the GEMM packs its right-hand side first, which for one row cost more than the
//! row itself (silero-vad's 313 LSTM steps: 15 ms of 70 on the 2-core Xeon).

use crate::gemm_tier::ProductTier;

/// Products whose right-hand side holds more elements than this go to the GEMM (its
/// threads pay there).
const GEMV_MAX: usize = 1 << 20;

/// `dst[j] = sum_l x[x0 + l * xs] * r[r0 + l * rs + j * cs]`: dot products when each
/// column of the right-hand side is contiguous (`rs == 1`), else its rows scaled and
/// added when those are (`cs == 1`). `false`, with nothing written, for any other
/// layout, a left-hand row that is not contiguous, a product over [`GEMV_MAX`], or
/// offsets outside the slices. Sums run in 16 lanes in a fixed order (fused on the
/// AVX2 and AVX-512 tiers), so the bits depend on the tier, never on the thread count.
pub(crate) fn row_product(
    (x, x0, xs): (&[f32], usize, isize),
    (r, r0, rs, cs): (&[f32], usize, isize, isize),
    (k, n): (usize, usize),
    dst: &mut [f32],
) -> bool {
    if xs != 1 || k == 0 || k * n > GEMV_MAX || dst.len() != n {
        return false;
    }
    let Some(x) = x.get(x0..x0 + k) else {
        return false;
    };
    if rs == 1 {
        let Ok(cs) = usize::try_from(cs) else {
            return false;
        };
        if n > 0 && r.len() < r0 + (n - 1) * cs + k {
            return false;
        }
        let cols = Cols { x, r, r0, cs, k };
        match ProductTier::current() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `ProductTier::current` picks AVX-512F only where the host has it
            // and FMA.
            ProductTier::Avx512 => unsafe { dots_avx512(&cols, dst) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `ProductTier::current` picks AVX2+FMA only where the host has them.
            ProductTier::Fma => unsafe { dots_fma(&cols, dst) },
            _ => dots::<false>(&cols, dst),
        }
        true
    } else if cs == 1 {
        let Ok(rs) = usize::try_from(rs) else {
            return false;
        };
        if r.len() < r0 + (k - 1) * rs + n {
            return false;
        }
        dst.fill(0.0);
        for (l, &a) in x.iter().enumerate() {
            let row = &r[r0 + l * rs..r0 + l * rs + n];
            for (d, &v) in dst.iter_mut().zip(row) {
                *d += a * v;
            }
        }
        true
    } else {
        false
    }
}

/// A row and the columns it multiplies: column `j` is `r[r0 + j * cs..][..k]`, checked
/// inside `r` by the caller.
struct Cols<'a> {
    x: &'a [f32],
    r: &'a [f32],
    r0: usize,
    cs: usize,
    k: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn dots_avx512(c: &Cols<'_>, dst: &mut [f32]) {
    dots::<true>(c, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dots_fma(c: &Cols<'_>, dst: &mut [f32]) {
    dots::<true>(c, dst)
}

/// Every column's dot product with the row; inlined into the wrappers above so that the
/// 16 lanes become the tier's vectors (and `FMA` fused multiply-adds).
#[inline(always)]
fn dots<const FMA: bool>(c: &Cols<'_>, dst: &mut [f32]) {
    for (j, d) in dst.iter_mut().enumerate() {
        let col = &c.r[c.r0 + j * c.cs..c.r0 + j * c.cs + c.k];
        *d = dot16::<FMA>(c.x, col);
    }
}

/// `sum(a[i] * b[i])` in 16 interleaved partial sums, then added pairwise.
#[inline(always)]
fn dot16<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        let x: &[f32; 16] = x.try_into().expect("chunks of 16");
        let y: &[f32; 16] = y.try_into().expect("chunks of 16");
        for i in 0..16 {
            acc[i] = if FMA {
                x[i].mul_add(y[i], acc[i])
            } else {
                acc[i] + x[i] * y[i]
            };
        }
    }
    for (i, (x, y)) in ta.iter().zip(tb).enumerate() {
        acc[i] = if FMA {
            x.mul_add(*y, acc[i])
        } else {
            acc[i] + x * y
        };
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::row_product;

    #[test]
    fn both_layouts_match_the_textbook_sum() {
        let (k, n) = (37, 5);
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        // r as [k, n] row-major (rows contiguous) and as its transpose (columns).
        let rows: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let cols: Vec<f32> = (0..n * k).map(|i| rows[(i % k) * n + i / k]).collect();
        let want: Vec<f64> = (0..n)
            .map(|j| {
                (0..k)
                    .map(|l| f64::from(x[l]) * f64::from(rows[l * n + j]))
                    .sum()
            })
            .collect();
        for (r, rs, cs) in [(&rows, n as isize, 1), (&cols, 1, k as isize)] {
            let mut d = vec![0.0f32; n];
            assert!(row_product((&x, 0, 1), (r, 0, rs, cs), (k, n), &mut d));
            for (g, w) in d.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
            }
        }
        let mut d = vec![0.0f32; n];
        assert!(!row_product(
            (&x, 0, 2),
            (&rows, 0, n as isize, 1),
            (k / 2, n),
            &mut d
        ));
        assert!(!row_product((&x, 0, 1), (&rows, 0, 2, 3), (k, n), &mut d));
    }
}
