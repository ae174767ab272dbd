//! Plain text tables: a header and rows, each column as wide as its widest cell.

pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Self {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut s = String::new();
            for (i, (cell, w)) in cells.zip(&widths).enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                s.push_str(cell);
                if i + 1 < widths.len() {
                    s.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
                }
            }
            s.truncate(s.trim_end().len());
            s.push('\n');
            s
        };
        let mut out = line(&mut self.header.iter().copied());
        for row in &self.rows {
            out.push_str(&line(&mut row.iter().map(String::as_str)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = Table::new(&["NAME", "N"]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["longer".into(), "22".into()]);
        assert_eq!(t.render(), "NAME    N\na       1\nlonger  22\n");
    }
}
