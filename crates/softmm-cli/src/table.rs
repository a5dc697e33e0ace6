//! The lab's terminal tables: columns that fit [`COLUMNS`] unless
//! `--wide` (the least needed left out and named), headings, notes, and a
//! legend built from the columns shown; and [`wrap`] for every other text.
//!
//! A leaf: it imports nothing else of the lab.

/// The widest a table or legend line gets without `--wide`.
pub const COLUMNS: usize = 100;

/// `--wide`: every column, however wide the table gets.
static WIDE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets `--wide` for every table of the run.
pub fn set_wide(wide: bool) {
    WIDE.store(wide, std::sync::atomic::Ordering::Relaxed);
}

thread_local! {
    /// A test's own `--wide`, which other tests' threads do not see.
    static WIDE_HERE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

fn wide() -> bool {
    WIDE_HERE.get().unwrap_or_else(|| WIDE.load(std::sync::atomic::Ordering::Relaxed))
}

/// Runs `f` with `--wide` set to `wide` on this thread only.
#[cfg(test)]
pub fn with_wide<T>(wide: bool, f: impl FnOnce() -> T) -> T {
    WIDE_HERE.set(Some(wide));
    let r = f();
    WIDE_HERE.set(None);
    r
}

/// `text` wrapped at [`COLUMNS`] on spaces, each of its lines on its own:
/// a line's leading spaces are kept, its continuation lines start with
/// `indent`; with a final newline.
pub fn wrap(text: &str, indent: &str) -> String {
    let mut out = String::new();
    for para in text.split('\n') {
        let mut line: String = para.chars().take_while(|c| *c == ' ').collect();
        let mut empty = true;
        // A glossed term (`name:`) stays on the line of its gloss's first word.
        let mut words: Vec<String> = Vec::new();
        for word in para.split_whitespace() {
            match words.last_mut() {
                Some(last) if last.ends_with(':') && !last.contains(' ') => {
                    last.push(' ');
                    last.push_str(word);
                }
                _ => words.push(word.to_string()),
            }
        }
        for word in &words {
            if !empty && line.chars().count() + 1 + word.chars().count() > COLUMNS {
                out.push_str(&line);
                out.push('\n');
                line = indent.to_string();
                empty = true;
            }
            if !empty {
                line.push(' ');
            }
            line.push_str(word);
            empty = false;
        }
        if !empty {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// One column of a [`Table`].
struct Column {
    head: String,
    left: bool,
    /// 0: always shown; otherwise left out (highest first) until the
    /// table fits [`COLUMNS`], unless `--wide`.
    drop: u8,
    /// What the column means, for the legend (`None`: it needs no gloss).
    gloss: Option<String>,
}

enum Line {
    Cells(Vec<String>),
    /// A heading above the rows that follow (a blank line before it).
    Heading(String),
    /// A note under the row above, indented.
    Note(String),
}

/// A table whose columns fit [`COLUMNS`] (the least needed ones are left
/// out and named) unless `--wide`, with a legend of the columns shown.
#[derive(Default)]
pub struct Table {
    columns: Vec<Column>,
    lines: Vec<Line>,
    notes: Vec<String>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table::default()
    }

    /// Adds a column: `drop` 0 for one always shown, else its rank among
    /// those left out of a narrow table (the highest first).
    pub fn column(&mut self, head: &str, left: bool, drop: u8, gloss: Option<&str>) -> &mut Table {
        self.columns.push(Column { head: head.to_string(), left, drop, gloss: gloss.map(str::to_string) });
        self
    }

    /// Adds a row, one cell per column.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.columns.len(), "one cell per column");
        self.lines.push(Line::Cells(cells));
    }

    /// Adds a heading line before the next rows.
    pub fn heading(&mut self, text: &str) {
        self.lines.push(Line::Heading(text.to_string()));
    }

    /// Adds a note under the last row.
    pub fn note(&mut self, text: &str) {
        self.lines.push(Line::Note(text.to_string()));
    }

    /// Adds a legend line after the columns' glosses.
    pub fn legend(&mut self, text: &str) {
        self.notes.push(text.to_string());
    }

    fn widths(&self) -> Vec<usize> {
        (0..self.columns.len())
            .map(|i| {
                self.lines
                    .iter()
                    .filter_map(|l| match l {
                        Line::Cells(c) => Some(c[i].chars().count()),
                        _ => None,
                    })
                    .chain([self.columns[i].head.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The table, then its legend; at most [`COLUMNS`] wide unless `--wide`.
    pub fn render(&self) -> String {
        self.render_as(wide())
    }

    /// [`Table::render`], wide or not.
    pub fn render_as(&self, wide: bool) -> String {
        let widths = self.widths();
        let mut shown: Vec<usize> = (0..self.columns.len()).collect();
        let width = |shown: &[usize]| shown.iter().map(|&i| widths[i] + 2).sum::<usize>().saturating_sub(2);
        let mut left_out = Vec::new();
        while !wide && width(&shown) > COLUMNS {
            // The highest drop rank, the rightmost of equals.
            let Some(pos) = shown
                .iter()
                .enumerate()
                .filter(|(_, &i)| self.columns[i].drop > 0)
                .max_by_key(|(pos, &i)| (self.columns[i].drop, *pos))
                .map(|(pos, _)| pos)
            else {
                break;
            };
            left_out.push(self.columns[shown.remove(pos)].head.clone());
        }
        let mut out = String::new();
        let fmt = |out: &mut String, cells: &[String]| {
            let mut line = String::new();
            for &i in &shown {
                let (c, w) = (&cells[i], widths[i]);
                if self.columns[i].left {
                    line.push_str(&format!("{c:<w$}  "));
                } else {
                    line.push_str(&format!("{c:>w$}  "));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        };
        fmt(&mut out, &self.columns.iter().map(|c| c.head.clone()).collect::<Vec<_>>());
        for l in &self.lines {
            match l {
                Line::Cells(c) => fmt(&mut out, c),
                Line::Heading(h) => {
                    if !out.ends_with("\n\n") && out.lines().count() > 1 {
                        out.push('\n');
                    }
                    out.push_str(&wrap(h, "  "));
                }
                Line::Note(n) => out.push_str(&wrap(&format!("    {n}"), "    ")),
            }
        }
        let glosses: Vec<String> = shown
            .iter()
            .filter_map(|&i| self.columns[i].gloss.as_ref().map(|g| format!("{}: {g}", self.columns[i].head)))
            .collect();
        if !glosses.is_empty() {
            out.push_str(&wrap(&format!("Columns: {}.", glosses.join("; ")), "  "));
        }
        for n in &self.notes {
            out.push_str(&wrap(n, "  "));
        }
        if !left_out.is_empty() {
            left_out.reverse();
            out.push_str(&wrap(&format!("(--wide adds the columns {})", left_out.join(", ")), "  "));
        }
        out
    }
}
