//! Printed tables: every benchmark prints its results as a markdown table
//! (pasteable into the README as it is), through `comfy-table`, with text
//! columns on the left and numbers right-aligned.

use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};

/// An empty table with `header`; its first `text` columns are left-aligned,
/// the others (numbers) right-aligned.
pub(crate) fn new<I, S>(header: I, text: usize) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut t = Table::new();
    t.load_style(ASCII_MARKDOWN).set_header(header);
    for (i, column) in t.column_iter_mut().enumerate() {
        column.set_cell_alignment(if i < text { CellAlignment::Left } else { CellAlignment::Right });
    }
    t
}

/// `v` with `digits` decimals, or `-` for none.
pub(crate) fn or_dash(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_are_right_aligned_in_a_markdown_table() {
        let mut t = super::new(["name", "value"], 1);
        t.add_row(vec!["a".to_string(), "1.5".to_string()]);
        t.add_row(vec!["bbb".to_string(), "10.25".to_string()]);
        let text = t.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("| name"), "{text}");
        assert!(lines[2].contains("|   1.5 |"), "{text}");
        assert!(lines[3].contains("| 10.25 |"), "{text}");
        assert_eq!(super::or_dash(None, 2), "-");
    }
}
