//! RFC 3339 timestamps (UTC) for the fields controllers write (Lease times, Event times).

use std::time::{SystemTime, UNIX_EPOCH};

/// (year, month, day) of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// `t` as `2024-05-01T12:00:00Z`, or with microseconds (`...T12:00:00.123456Z`, Kubernetes'
/// MicroTime) when `micros`.
pub(crate) fn format(t: SystemTime, micros: bool) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if micros {
        format!(
            "{y:04}-{m:02}-{day:02}T{hh:02}:{mm:02}:{ss:02}.{:06}Z",
            d.subsec_micros()
        )
    } else {
        format!("{y:04}-{m:02}-{day:02}T{hh:02}:{mm:02}:{ss:02}Z")
    }
}

/// Now, with second precision.
pub(crate) fn now() -> String {
    format(SystemTime::now(), false)
}

/// Now, with microsecond precision.
pub(crate) fn now_micros() -> String {
    format(SystemTime::now(), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format(UNIX_EPOCH, false), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_micros(951_782_400_000_042); // 2000-02-29
        assert_eq!(format(t, true), "2000-02-29T00:00:00.000042Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_718_454_896); // 2024-06-15T12:34:56Z
        assert_eq!(format(t, false), "2024-06-15T12:34:56Z");
        assert_eq!(now().len(), 20);
        assert_eq!(now_micros().len(), 27);
    }
}
