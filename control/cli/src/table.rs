//! Aligned tables and kubectl-style ages.

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

pub use skiff_api::columns::age;

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
}
