//! Aligned tables and kubectl-style ages.

use chrono::{DateTime, TimeDelta, Utc};

/// Spaces between columns.
pub const GAP: usize = 3;

/// Column widths: the widest cell (or header) of each column, in characters.
pub fn widths(headers: &[String], rows: &[Vec<String>]) -> Vec<usize> {
    let mut w: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        grow(&mut w, row);
    }
    w
}

/// Widens `widths` so that `row` fits.
pub fn grow(widths: &mut Vec<usize>, row: &[String]) {
    for (i, cell) in row.iter().enumerate() {
        let n = cell.chars().count();
        match widths.get_mut(i) {
            Some(w) => *w = (*w).max(n),
            None => widths.push(n),
        }
    }
}

/// One line: every cell but the last padded to its column's width, [`GAP`] spaces between.
pub fn format_row(cells: &[String], widths: &[usize]) -> String {
    format_row_with(cells, widths, GAP)
}

/// [`format_row`] with `gap` spaces between columns.
pub fn format_row_with(cells: &[String], widths: &[usize], gap: usize) -> String {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        if i + 1 == cells.len() {
            line.push_str(cell);
        } else {
            let w = widths.get(i).copied().unwrap_or(0);
            line.push_str(cell);
            let pad = w.saturating_sub(cell.chars().count()) + gap;
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }
    line
}

/// A whole table, header first, one string per line (no trailing newline).
pub fn render(headers: &[String], rows: &[Vec<String>]) -> Vec<String> {
    let w = widths(headers, rows);
    std::iter::once(format_row(headers, &w))
        .chain(rows.iter().map(|r| format_row(r, &w)))
        .collect()
}

/// The age of an RFC 3339 timestamp at `now`, like kubectl (`45s`, `3m12s`, `5h`, `2d`);
/// `<unknown>` when the timestamp is missing or unreadable.
pub fn age(timestamp: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(timestamp) {
        Ok(t) => human_duration(now.signed_duration_since(t.with_timezone(&Utc))),
        Err(_) => "<unknown>".to_string(),
    }
}

/// kubectl's `duration.HumanDuration`: two significant units while they matter.
pub fn human_duration(d: TimeDelta) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    } else if seconds < 0 {
        return "0s".into();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    } else if hours < 48 {
        return format!("{hours}h");
    } else if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    } else if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    } else if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn columns_are_aligned_with_three_spaces() {
        let lines = render(
            &s(&["NAME", "READY", "AGE"]),
            &[s(&["web-1", "1/1", "5s"]), s(&["a", "10/10", "3m12s"])],
        );
        assert_eq!(
            lines,
            vec![
                "NAME    READY   AGE",
                "web-1   1/1     5s",
                "a       10/10   3m12s",
            ]
        );
    }

    #[test]
    fn later_rows_grow_but_never_shrink_columns() {
        let headers = s(&["NAME", "AGE"]);
        let mut w = widths(&headers, &[]);
        assert_eq!(format_row(&s(&["x", "1s"]), &w), "x      1s");
        grow(&mut w, &s(&["a-long-name", "1s"]));
        assert_eq!(format_row(&s(&["x", "1s"]), &w), "x             1s");
        // Multi-byte characters count as one column.
        assert_eq!(widths(&s(&["É"]), &[]), vec![1]);
    }

    #[test]
    fn ages_look_like_kubectl() {
        let d = TimeDelta::seconds;
        assert_eq!(human_duration(d(-5)), "<invalid>");
        assert_eq!(human_duration(d(-1)), "0s");
        assert_eq!(human_duration(d(45)), "45s");
        assert_eq!(human_duration(d(119)), "119s");
        assert_eq!(human_duration(d(192)), "3m12s");
        assert_eq!(human_duration(d(300)), "5m");
        assert_eq!(human_duration(d(11 * 60 + 5)), "11m");
        assert_eq!(human_duration(d(5 * 3600)), "5h");
        assert_eq!(human_duration(d(5 * 3600 + 60 * 7)), "5h7m");
        assert_eq!(human_duration(d(20 * 3600)), "20h");
        assert_eq!(human_duration(d(2 * 86400)), "2d");
        assert_eq!(human_duration(d(2 * 86400 + 3 * 3600)), "2d3h");
        assert_eq!(human_duration(d(30 * 86400)), "30d");
        assert_eq!(human_duration(d(3 * 365 * 86400 + 86400)), "3y1d");
        assert_eq!(human_duration(d(10 * 365 * 86400)), "10y");
    }

    #[test]
    fn age_of_timestamps() {
        let now = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(age("2024-05-01T11:59:15Z", now), "45s");
        assert_eq!(age("2024-05-01T13:59:15+02:00", now), "45s");
        assert_eq!(age("", now), "<unknown>");
        assert_eq!(age("yesterday", now), "<unknown>");
    }
}
