//! Bucket axes of the slack table and interpolation between buckets.

use crate::SchedError;

/// Strictly ascending token counts at which the table holds measured or modelled slack.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Axis(Vec<u32>);

/// Where a value falls on an axis: the two neighbouring buckets and the weight of the upper one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    pub lo: usize,
    pub hi: usize,
    /// In `[0, 1]`; 0 means exactly on `lo`.
    pub weight_hi: f64,
}

impl Position {
    /// The bucket closest to the value.
    pub fn nearest(&self) -> usize {
        if self.weight_hi >= 0.5 {
            self.hi
        } else {
            self.lo
        }
    }
}

impl Axis {
    pub fn new(points: Vec<u32>) -> Result<Self, SchedError> {
        if points.is_empty() {
            return Err(SchedError::InvalidTable("a bucket axis has no points".into()));
        }
        if let Some(w) = points.windows(2).find(|w| w[0] >= w[1]) {
            return Err(SchedError::InvalidTable(format!(
                "bucket axis not strictly ascending: {} then {}",
                w[0], w[1]
            )));
        }
        Ok(Axis(points))
    }

    /// Geometric grid from `min` to at least `max` with `per_octave` points per doubling,
    /// optionally starting with 0 (e.g. "no cached prefix").
    ///
    /// Slack grows convexly with length (attention is quadratic), so linear interpolation over
    /// wide buckets overestimates between them; several points per octave keep that bias small.
    pub fn geometric(min: u32, max: u32, per_octave: u32, with_zero: bool) -> Result<Self, SchedError> {
        if min == 0 || max < min || per_octave == 0 {
            return Err(SchedError::InvalidTable(format!(
                "geometric axis needs 0 < min <= max and per_octave > 0 (got {min}, {max}, {per_octave})"
            )));
        }
        let mut points = if with_zero { vec![0u32] } else { Vec::new() };
        let step = 2f64.powf(1.0 / f64::from(per_octave));
        let mut x = f64::from(min);
        loop {
            let p = x.round() as u32;
            if points.last().is_none_or(|&last| p > last) {
                points.push(p);
            }
            if p >= max {
                break;
            }
            x *= step;
        }
        Axis::new(points)
    }

    pub fn points(&self) -> &[u32] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Locate `x`. Values outside the axis clamp to the end buckets (no extrapolation).
    pub fn locate(&self, x: f64) -> Position {
        let pts = &self.0;
        let last = pts.len() - 1;
        if x <= f64::from(pts[0]) {
            return Position { lo: 0, hi: 0, weight_hi: 0.0 };
        }
        if x >= f64::from(pts[last]) {
            return Position { lo: last, hi: last, weight_hi: 0.0 };
        }
        let hi = pts.partition_point(|&p| f64::from(p) <= x);
        let lo = hi - 1;
        let (a, b) = (f64::from(pts[lo]), f64::from(pts[hi]));
        Position { lo, hi, weight_hi: (x - a) / (b - a) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometric_axis_is_ascending_and_covers_the_range() {
        let a = Axis::geometric(128, 262_144, 2, true).unwrap();
        assert_eq!(a.points()[0], 0);
        assert_eq!(a.points()[1], 128);
        assert!(*a.points().last().unwrap() >= 262_144);
        assert!(a.points().windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn locate_interpolates_and_clamps() {
        let a = Axis::new(vec![0, 100, 300]).unwrap();
        assert_eq!(a.locate(-5.0), Position { lo: 0, hi: 0, weight_hi: 0.0 });
        assert_eq!(a.locate(1000.0), Position { lo: 2, hi: 2, weight_hi: 0.0 });
        let p = a.locate(200.0);
        assert_eq!((p.lo, p.hi), (1, 2));
        assert!((p.weight_hi - 0.5).abs() < 1e-12);
        let on = a.locate(100.0);
        assert_eq!((on.lo, on.hi, on.weight_hi), (1, 2, 0.0));
        assert_eq!(a.locate(290.0).nearest(), 2);
    }

    #[test]
    fn rejects_unsorted_and_empty_axes() {
        assert!(Axis::new(vec![]).is_err());
        let e = Axis::new(vec![1, 5, 5]).unwrap_err().to_string();
        assert!(e.contains("5 then 5"), "{e}");
    }
}
