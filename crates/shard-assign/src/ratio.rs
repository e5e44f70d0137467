//! Exact decimal ratios, so that parameters such as a load factor of 1.25 give the same cap on
//! every platform (no floating point in placement decisions).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ParseError;

const SCALE: u64 = 1_000_000;

/// A non-negative decimal number with six digits after the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ratio {
    millionths: u64,
}

impl Ratio {
    /// Exactly 1.
    pub const ONE: Ratio = Ratio { millionths: SCALE };

    /// `whole + thousandths / 1000`, for constants.
    pub const fn from_thousandths(thousandths: u64) -> Self {
        Self {
            millionths: thousandths * 1000,
        }
    }

    /// The value in millionths: 1.25 is 1,250,000.
    pub const fn millionths(self) -> u64 {
        self.millionths
    }

    /// The nearest `f64`, for reports and for comparing with measured figures; placement
    /// itself never uses it.
    pub fn as_f64(self) -> f64 {
        self.millionths as f64 / SCALE as f64
    }

    /// `ceil(self * value / divisor)`, exactly. `divisor` must be non-zero.
    pub fn mul_div_ceil(self, value: u64, divisor: u64) -> u64 {
        let num = u128::from(self.millionths) * u128::from(value);
        let den = u128::from(SCALE) * u128::from(divisor);
        u64::try_from(num.div_ceil(den)).unwrap_or(u64::MAX)
    }

    /// True when `numerator / denominator <= self`, exactly. A zero denominator compares as 1.
    pub fn bounds(self, numerator: u64, denominator: u64) -> bool {
        if denominator == 0 {
            return self >= Self::ONE;
        }
        u128::from(numerator) * u128::from(SCALE)
            <= u128::from(self.millionths) * u128::from(denominator)
    }
}

impl FromStr for Ratio {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseError::InvalidRatio(s.to_string());
        let text = s.trim();
        let (whole, frac) = match text.split_once('.') {
            Some((w, f)) => (w, f),
            None => (text, ""),
        };
        let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !all_digits(whole) || !all_digits(frac) || frac.len() > 6 {
            return Err(invalid());
        }
        let whole: u64 = whole.parse().map_err(|_| invalid())?;
        let mut frac_value: u64 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| invalid())?
        };
        for _ in frac.len()..6 {
            frac_value *= 10;
        }
        whole
            .checked_mul(SCALE)
            .and_then(|w| w.checked_add(frac_value))
            .map(|millionths| Ratio { millionths })
            .ok_or_else(invalid)
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.millionths / SCALE;
        let frac = self.millionths % SCALE;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:06}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

impl Serialize for Ratio {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_decimals_exactly() {
        for (text, millionths, shown) in [
            ("1.25", 1_250_000, "1.25"),
            ("1", 1_000_000, "1"),
            ("1.030", 1_030_000, "1.03"),
            ("0.000001", 1, "0.000001"),
            (" 2.5 ", 2_500_000, "2.5"),
        ] {
            let r: Ratio = text.parse().unwrap();
            assert_eq!(r.millionths(), millionths, "{text}");
            assert_eq!(r.to_string(), shown);
        }
    }

    #[test]
    fn rejects_what_is_not_a_plain_decimal() {
        for text in [
            "",
            ".5",
            "-1",
            "+1",
            "1.+5",
            "1.2.3",
            "1e3",
            "abc",
            "1.0000001",
            "99999999999999999999",
        ] {
            assert!(
                text.parse::<Ratio>().is_err(),
                "{text:?} should be rejected"
            );
        }
    }

    #[test]
    fn ceiling_is_exact() {
        let c: Ratio = "1.25".parse().unwrap();
        // 1.25 * 10000 / 9 = 1388.88.. -> 1389
        assert_eq!(c.mul_div_ceil(10_000, 9), 1389);
        // 1.25 * 10000 / 10 = 1250 exactly -> 1250, not 1251
        assert_eq!(c.mul_div_ceil(10_000, 10), 1250);
    }

    #[test]
    fn bounds_compares_exactly() {
        let t: Ratio = "1.03".parse().unwrap();
        assert!(t.bounds(103, 100));
        assert!(!t.bounds(10_301, 10_000));
        assert!(t.bounds(0, 0));
    }
}
