//! Kubernetes resource quantities (`500m`, `2`, `1.5`, `64Mi`, `1G`, `1e3`) as integers.
//!
//! CPU is counted in millicores ([`parse_milli`]), everything else in whole units
//! ([`parse_value`], rounded up as Kubernetes' `Quantity.Value()` does).

/// A quantity that does not parse, or does not fit in 64 bits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {text:?}: {reason}")]
pub struct QuantityError {
    pub text: String,
    pub reason: &'static str,
}

fn err(text: &str, reason: &'static str) -> QuantityError {
    QuantityError {
        text: text.to_string(),
        reason,
    }
}

/// Most significant digits accepted (enough for any i64 in milli-units with a fraction).
const MAX_DIGITS: usize = 30;

/// The value of `text` in thousandths of its unit, rounded up (`"0.5"` → 500, `"100m"` → 100,
/// `"1Ki"` → 1 024 000). Negative quantities are rejected: requests and capacities are never
/// negative.
pub fn parse_milli(text: &str) -> Result<i64, QuantityError> {
    parse_scaled(text, 1000)
}

/// The value of `text` in whole units, rounded up (`"64Mi"` → 67 108 864, `"1.5"` → 2,
/// `"100m"` → 1).
pub fn parse_value(text: &str) -> Result<i64, QuantityError> {
    parse_scaled(text, 1)
}

/// `text` times `unit`, rounded up.
fn parse_scaled(text: &str, unit: i128) -> Result<i64, QuantityError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(err(text, "empty"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(err(text, "must not be negative"));
    }
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err(text, "no digits"));
    }
    if frac_part.contains('.') {
        return Err(err(text, "more than one decimal point"));
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > MAX_DIGITS {
        return Err(err(text, "too many digits"));
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| err(text, "not a number"))?
    };
    // result = mantissa / 10^frac * suffix_num / suffix_den * unit.
    let frac_digits = u32::try_from(frac_part.len()).map_err(|_| err(text, "too many digits"))?;
    let pow10 = |e: u32| {
        10i128
            .checked_pow(e)
            .ok_or_else(|| err(text, "too many digits"))
    };
    let mut den = pow10(frac_digits)?;
    // (numerator, denominator) of the suffix.
    let (snum, sden): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(|| err(text, "unknown suffix"))?;
            let exp: i32 = exp
                .parse()
                .map_err(|_| err(text, "unknown suffix (bad exponent)"))?;
            if exp.unsigned_abs() > 30 {
                return Err(err(text, "exponent out of range"));
            }
            let p = pow10(exp.unsigned_abs())?;
            if exp >= 0 { (p, 1) } else { (1, p) }
        }
    };
    let num = unit
        .checked_mul(snum)
        .ok_or_else(|| err(text, "too large"))?;
    den = den
        .checked_mul(sden)
        .ok_or_else(|| err(text, "too many digits"))?;
    let scaled = mantissa
        .checked_mul(num)
        .ok_or_else(|| err(text, "too large"))?;
    // Round up, as Kubernetes does when it scales a quantity down.
    let out = (scaled + den - 1) / den;
    i64::try_from(out).map_err(|_| err(text, "too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_and_micro_suffixes() {
        assert_eq!(parse_milli("250000000n"), Ok(250));
        assert_eq!(parse_milli("1500u"), Ok(2), "rounded up, as MilliValue");
        assert_eq!(parse_milli("2m"), Ok(2));
    }

    #[test]
    fn cpu() {
        assert_eq!(parse_milli("500m"), Ok(500));
        assert_eq!(parse_milli("1"), Ok(1000));
        assert_eq!(parse_milli("4"), Ok(4000));
        assert_eq!(parse_milli("0.5"), Ok(500));
        assert_eq!(parse_milli("1.25"), Ok(1250));
        assert_eq!(parse_milli(".1"), Ok(100));
        assert_eq!(parse_milli("2."), Ok(2000));
        assert_eq!(parse_milli("0.0001"), Ok(1), "rounds up");
        assert_eq!(parse_milli("0"), Ok(0));
        assert_eq!(parse_milli(" 250m "), Ok(250));
        assert_eq!(parse_milli("+3"), Ok(3000));
        assert_eq!(parse_milli("1e3"), Ok(1_000_000));
        assert_eq!(parse_milli("1E-3"), Ok(1));
    }

    #[test]
    fn memory() {
        assert_eq!(parse_value("64Mi"), Ok(64 << 20));
        assert_eq!(parse_value("16Gi"), Ok(16 << 30));
        assert_eq!(parse_value("1Ki"), Ok(1024));
        assert_eq!(parse_value("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_value("1k"), Ok(1000));
        assert_eq!(parse_value("128M"), Ok(128_000_000));
        assert_eq!(parse_value("2G"), Ok(2_000_000_000));
        assert_eq!(parse_value("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_value("1Ti"), Ok(1 << 40));
        assert_eq!(parse_value("12345"), Ok(12345));
        assert_eq!(parse_value("100m"), Ok(1), "a fraction of a byte rounds up");
        assert_eq!(parse_value("110"), Ok(110));
        assert_eq!(parse_value("7Ei"), Ok(7 << 60));
    }

    #[test]
    fn errors() {
        for bad in [
            "", "abc", "1x", "1Mb", "--1", "-1", "1.2.3", ".", "1e", "1e99", "9Ei",
        ] {
            assert!(parse_milli(bad).is_err(), "{bad:?} should not parse");
        }
        let e = parse_milli("12q").unwrap_err();
        assert_eq!(e.to_string(), "invalid quantity \"12q\": unknown suffix");
        assert!(parse_milli("99999999999999999999999999999999").is_err());
    }
}
