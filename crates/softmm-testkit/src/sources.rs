//! A crate's sources as its layering tests read them
//! (`crates/softmm/tests/semantics/layering.rs`, the lab's
//! `crates/softmm-cli/tests/layering.rs`): every file under `src/` with its
//! comments and unit tests removed, so that what is left is the code whose
//! `crate::` edges they check.

use std::path::Path;

/// One source file: its path under `src/` and its code without comments or
/// unit tests.
pub struct Source {
    /// The path under `src/`, with `/` separators (`mm/vma.rs`).
    pub path: String,
    /// The text without `//` comments and without the unit-test module that
    /// ends the file ([`code_of`]).
    pub code: String,
}

impl Source {
    /// The top-level module the file belongs to (`mm` for `mm/vma.rs`; the
    /// root file's name without `.rs` for it).
    pub fn module(&self) -> &str {
        let first = self.path.split('/').next().unwrap_or_default();
        first.strip_suffix(".rs").unwrap_or(first)
    }
}

/// Every `.rs` file under `manifest_dir/src`, sorted by path, as [`Source`]s,
/// without the unit-test modules kept in files of their own (`x/tests.rs`
/// beside `x.rs`). Panics if `root` (`lib.rs`, `main.rs`) is not among them.
pub fn sources(manifest_dir: &str, root: &str) -> Vec<Source> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<Source>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read src").map(|e| e.expect("entry").path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|e| e == "rs") && !p.ends_with("tests.rs") {
                let text = std::fs::read_to_string(&p).expect("read source");
                let path = p.strip_prefix(base).expect("under src").to_string_lossy().replace('\\', "/");
                out.push(Source { path, code: code_of(&text) });
            }
        }
    }
    let base = Path::new(manifest_dir).join("src");
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    assert!(out.iter().any(|s| s.path == root), "no {root} under {}", base.display());
    out
}

/// `text` without `//` comments and without the unit-test module that ends
/// a file (from a `#[cfg(` line mentioning `test` followed by `mod tests`).
pub fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| {
            let (attr, item) = (w[0].trim(), w[1].trim());
            attr.starts_with("#[cfg(") && attr.contains("test") && item.starts_with("mod tests")
        })
        .unwrap_or(lines.len());
    lines[..end].iter().map(|l| l.find("//").map_or(*l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}
