//! Summaries over seeds.

use serde::Serialize;

/// Median and 95th percentile of a sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The middle value.
    pub median: f64,
    /// The nearest-rank 95th percentile.
    pub p95: f64,
}

impl Summary {
    /// The median is the middle value (the mean of the two middle ones for an even count); the
    /// 95th percentile is the nearest-rank one: the smallest value at or above 95% of the sample.
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let rank = (0.95 * n as f64).ceil() as usize;
        let p95 = sorted[rank.clamp(1, n) - 1];
        Self { median, p95 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_nearest_rank_percentile() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.p95), (2.0, 3.0));
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(s.median, 2.5);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&hundred);
        assert_eq!((s.median, s.p95), (50.5, 95.0));
        assert_eq!(Summary::of(&[]), Summary::default());
    }
}
