//! The crate's layering, checked on its sources: which module may name which.
//!
//! softmm's modules form layers (docs/architecture.md, "Layers"): `sync` and
//! `access` at the bottom, then `phys`, `pgtable` and `tlb`, then `file` and
//! `vma`, then the address space core (`mm`), `populate` and the fault
//! handler (`fault`), the system calls (`sys`) over them, and `cpu` on top.
//! Two cycles are by design: the syscalls and `populate` call the fault
//! handler, and the handler grows a stack (a change of the VMA tree, which
//! is `mm`'s). Every other upward reference
//! is an accident this test refuses, with the rule that replaces it.
//!
//! Only code counts: comments and the unit-test module at the end of a file
//! are left out. The sources are read from `$CARGO_MANIFEST_DIR/src` at run
//! time, so the compiled test can be pointed at another checkout.

use std::path::{Path, PathBuf};

/// One source file: its path under `src/` and its code without comments or
/// unit tests.
struct Source {
    path: String,
    code: String,
}

impl Source {
    /// The top-level module the file belongs to (`mm` for `mm/mmap.rs`).
    fn module(&self) -> &str {
        let first = self.path.split('/').next().unwrap_or_default();
        first.strip_suffix(".rs").unwrap_or(first)
    }

    /// The modules this file names as `crate::<module>`.
    fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut rest = self.code.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() && !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }
}

fn src_dir() -> PathBuf {
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    Path::new(&root).join("src")
}

/// Every `.rs` file under `src/`, comments and `#[cfg(..test..)] mod tests`
/// blocks (which end their files) removed, and without the unit-test
/// modules kept in files of their own (`x/tests.rs` beside `x.rs`).
fn sources() -> Vec<Source> {
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
    let base = src_dir();
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    assert!(out.iter().any(|s| s.path == "lib.rs"), "no lib.rs under {}", base.display());
    out
}

/// `text` without `//` comments and without the unit-test module that ends
/// a file (from a `#[cfg(` line mentioning `test` followed by `mod tests`).
fn code_of(text: &str) -> String {
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

#[track_caller]
fn assert_no_reference(sources: &[Source], from: impl Fn(&Source) -> bool, to: &str, rule: &str) {
    let offenders: Vec<&str> =
        sources.iter().filter(|s| from(s) && s.names().iter().any(|n| n == to)).map(|s| s.path.as_str()).collect();
    assert!(offenders.is_empty(), "{offenders:?} name crate::{to}: {rule}");
}

#[test]
fn frame_allocation_does_not_depend_on_the_fault_handler() {
    let s = sources();
    assert_no_reference(
        &s,
        |s| s.module() == "phys",
        "fault",
        "shared-write instrumentation lives in sync (sync::shared_write)",
    );
}

#[test]
fn files_do_not_depend_on_address_spaces() {
    let s = sources();
    assert_no_reference(
        &s,
        |s| s.module() == "file",
        "mm",
        "a file's reverse map holds its mappers as Weak<dyn file::Mapper>",
    );
}

#[test]
fn the_address_space_core_and_its_config_do_not_depend_on_the_fault_handler() {
    let s = sources();
    for core in ["mm/mod.rs", "mm/config.rs"] {
        assert!(s.iter().any(|f| f.path == core), "{core} is missing");
    }
    assert_no_reference(
        &s,
        |s| s.path == "mm/mod.rs" || s.path == "mm/config.rs",
        "fault",
        "FaultPolicy is configuration and lives beside MmConfig in mm/config.rs",
    );
}

#[test]
fn the_address_space_core_does_not_depend_on_the_syscalls() {
    let s = sources();
    assert!(s.iter().any(|f| f.path == "sys/mod.rs"), "sys/mod.rs is missing");
    assert_no_reference(
        &s,
        |s| s.module() == "mm",
        "sys",
        "the system calls sit above the core: a shared operation moves into mm/",
    );
}

#[test]
fn syscalls_reach_the_fault_handler_through_populate() {
    let s = sources();
    // Linux's populate_vma_page_range -> __get_user_pages: the syscalls
    // fault pages in through populate, never through the handler's internals.
    let inside = |f: &Source| f.module() == "fault";
    let offenders: Vec<&str> = s
        .iter()
        .filter(|f| !inside(f) && ["handle_vma_fault", "FaultCtx", "fault::handler"].iter().any(|w| f.code.contains(w)))
        .map(|f| f.path.as_str())
        .collect();
    assert!(offenders.is_empty(), "{offenders:?} use the fault handler's internals instead of crate::populate");
    let populate = s.iter().find(|f| f.path == "populate.rs").expect("src/populate.rs");
    assert!(populate.code.contains("fn get_user_pages"), "populate.rs has no get_user_pages loop");
    for caller in ["sys/mmap.rs", "sys/mprotect.rs", "sys/mremap.rs", "sys/madvise.rs"] {
        let f = s.iter().find(|f| f.path == caller).unwrap_or_else(|| panic!("{caller} is missing"));
        assert!(f.names().iter().any(|n| n == "populate"), "{caller} does not populate through crate::populate");
    }
}

#[test]
fn the_synchronization_primitives_depend_on_nothing_above_them() {
    let s = sources();
    for f in s.iter().filter(|f| f.module() == "sync") {
        let above: Vec<String> = f.names().into_iter().filter(|n| n != "sync").collect();
        assert!(above.is_empty(), "{} names {above:?}: sync is the bottom layer", f.path);
    }
}
