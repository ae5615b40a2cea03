//! Non-negative least squares for a handful of features, by trying every feature subset.
//!
//! Compute time is a sum of non-negative costs (fixed overhead, per-token linear work, attention
//! work), so a fit with a negative coefficient is physically wrong; with at most three features
//! the exhaustive subset search is exact and cheap.

/// One observation: feature values and the measured time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample<const K: usize> {
    pub x: [f64; K],
    pub y: f64,
}

/// Coefficients minimising the *relative* squared error (each row weighted by 1/y, so short
/// layers count as much as long ones), all `>= 0`. `None` if no subset is solvable.
pub(crate) fn nnls_relative<const K: usize>(samples: &[Sample<K>]) -> Option<[f64; K]> {
    let rows: Vec<Sample<K>> = samples.iter().filter(|s| s.y > 0.0).copied().collect();
    if rows.is_empty() {
        return None;
    }
    // Scale features to comparable magnitudes so the normal equations stay well conditioned.
    let mut scale = [0f64; K];
    for r in &rows {
        for (s, x) in scale.iter_mut().zip(&r.x) {
            *s = s.max((x / r.y).abs());
        }
    }
    let mut best: Option<([f64; K], f64)> = None;
    for mask in 1u32..(1 << K) {
        let cols: Vec<usize> = (0..K).filter(|k| mask & (1 << k) != 0 && scale[*k] > 0.0).collect();
        if cols.len() != mask.count_ones() as usize || cols.len() > rows.len() {
            continue;
        }
        let Some(coef) = solve_subset(&rows, &cols, &scale) else { continue };
        if coef.iter().any(|&c| c < 0.0) {
            continue;
        }
        let mut full = [0f64; K];
        for (&k, &c) in cols.iter().zip(&coef) {
            full[k] = c / scale[k];
        }
        let sse: f64 = rows.iter().map(|r| (predict(&full, &r.x) / r.y - 1.0).powi(2)).sum();
        if best.is_none_or(|(_, b)| sse < b) {
            best = Some((full, sse));
        }
    }
    best.map(|(c, _)| c)
}

pub(crate) fn predict<const K: usize>(coef: &[f64; K], x: &[f64; K]) -> f64 {
    coef.iter().zip(x).map(|(c, v)| c * v).sum()
}

/// Least squares of `1 ≈ Σ c_k · x_k / (y · scale_k)` over the chosen columns.
fn solve_subset<const K: usize>(rows: &[Sample<K>], cols: &[usize], scale: &[f64; K]) -> Option<Vec<f64>> {
    let m = cols.len();
    let mut a = vec![vec![0f64; m + 1]; m];
    for r in rows {
        let z: Vec<f64> = cols.iter().map(|&k| r.x[k] / r.y / scale[k]).collect();
        for i in 0..m {
            for j in 0..m {
                a[i][j] += z[i] * z[j];
            }
            a[i][m] += z[i];
        }
    }
    gauss(a)
}

/// Solve an augmented m×(m+1) system with partial pivoting; `None` if singular.
fn gauss(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let m = a.len();
    let norm = a.iter().flat_map(|r| r[..m].iter()).fold(0f64, |acc, v| acc.max(v.abs()));
    if norm == 0.0 {
        return None;
    }
    for col in 0..m {
        let pivot = (col..m).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() <= 1e-10 * norm {
            return None;
        }
        a.swap(col, pivot);
        for row in 0..m {
            if row != col {
                let f = a[row][col] / a[col][col];
                let pivot_row = a[col].clone();
                for (v, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                    *v -= f * p;
                }
            }
        }
    }
    Some((0..m).map(|i| a[i][m] / a[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_exact_coefficients() {
        let truth = [20_000.0, 1000.0, 0.25];
        let samples: Vec<Sample<3>> = [(100.0, 5.0), (1000.0, 2e6), (5000.0, 9e7), (300.0, 4e5)]
            .iter()
            .map(|&(a, b)| {
                let x = [1.0, a, b];
                Sample { x, y: predict(&truth, &x) }
            })
            .collect();
        let c = nnls_relative(&samples).unwrap();
        for k in 0..3 {
            assert!((c[k] - truth[k]).abs() / truth[k] < 1e-6, "{c:?}");
        }
    }

    #[test]
    fn never_returns_negative_coefficients() {
        // y decreasing in x would need a negative slope: the fit drops the feature instead.
        let samples: Vec<Sample<2>> =
            [(1.0, 10.0), (2.0, 9.0), (3.0, 8.0)].iter().map(|&(x, y)| Sample { x: [1.0, x], y }).collect();
        let c = nnls_relative(&samples).unwrap();
        assert!(c.iter().all(|&v| v >= 0.0), "{c:?}");
        assert_eq!(c[1], 0.0);
    }

    #[test]
    fn unsolvable_input_gives_none() {
        assert!(nnls_relative::<2>(&[]).is_none());
        assert!(nnls_relative(&[Sample { x: [0.0, 0.0], y: 5.0 }]).is_none());
    }
}
