//! Kubernetes resource quantities (`500m`, `128Mi`, `2`, `1e3`) as far as a downward-API
//! `resourceFieldRef` needs them: a value in milli-units, and the kubelet's rounding up when
//! divided by a divisor.

/// Parses a quantity into thousandths of its unit (`"500m"` is 500, `"1Ki"` 1,024,000).
pub fn parse_milli(text: &str) -> Option<u128> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (whole, fraction) = number
        .trim_start_matches('+')
        .split_once('.')
        .unwrap_or((number.trim_start_matches('+'), ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // The number as an integer scaled by 10^digits of its fraction.
    let digits = u32::try_from(fraction.len()).ok()?;
    let mantissa: u128 = format!("{whole}{fraction}").parse().ok()?;
    let (multiplier, exponent10): (u128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse().ok()?),
        _ => return None,
    };
    // Milli-units: three more powers of ten, less the fraction's digits.
    let power = exponent10 + 3 - i32::try_from(digits).ok()?;
    let scaled = mantissa.checked_mul(multiplier)?;
    if power >= 0 {
        scaled.checked_mul(10u128.checked_pow(u32::try_from(power).ok()?)?)
    } else {
        let divisor = 10u128.checked_pow(u32::try_from(-power).ok()?)?;
        // Below a milli-unit rounds up, as Kubernetes does when it keeps milli-units.
        Some(scaled.div_ceil(divisor))
    }
}

/// `value / divisor`, rounded up, as the kubelet writes a `resourceFieldRef`.
pub fn divide_up(value_milli: u128, divisor_milli: u128) -> Option<u128> {
    (divisor_milli > 0).then(|| value_milli.div_ceil(divisor_milli))
}

#[cfg(test)]
mod tests {
    use super::{divide_up, parse_milli};

    #[test]
    fn quantities_parse_into_milli_units() {
        assert_eq!(parse_milli("500m"), Some(500));
        assert_eq!(parse_milli("2"), Some(2_000));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("1Ki"), Some(1_024_000));
        assert_eq!(parse_milli("128Mi"), Some(128 * 1024 * 1024 * 1000));
        assert_eq!(parse_milli("1k"), Some(1_000_000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("1n"), Some(1));
        assert_eq!(parse_milli("1.5Gi"), Some(1_610_612_736_000));
        for bad in ["", "m", "12q", "1.2.3", "Mi"] {
            assert_eq!(parse_milli(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_divided_quantity_rounds_up() {
        // 100m of CPU with the default divisor 1 is 1 CPU, as the kubelet writes it.
        assert_eq!(divide_up(100, 1_000), Some(1));
        assert_eq!(divide_up(100, 1), Some(100));
        assert_eq!(
            divide_up(512 * 1024 * 1024 * 1000, 1024 * 1024 * 1000),
            Some(512)
        );
        assert_eq!(divide_up(1, 0), None);
    }
}
