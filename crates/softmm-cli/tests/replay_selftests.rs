//! Linux's own mm selftests (`tests/data/selftests`, see its README),
//! recorded on the host with their page faults, replay with every call
//! matching, or differing exactly where the test's `.expected` file says,
//! with Linux's reason; and as a workload (`--bench`), with the same
//! results under the `mmap-lock` and `per-vma` fault policies and under
//! every writer policy.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use softmm::WriterPolicy;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/selftests")
}

/// The policies the bench replays under: the two fault policies that differ
/// most, and every writer policy (each under the default fault policy).
fn policies() -> String {
    let mut names = vec!["mmap-lock", "per-vma"];
    names.extend(WriterPolicy::ALL.iter().map(|p| p.name()));
    names.join(",")
}

/// The log lines of `test`'s mismatches, and the replay's report.
fn replay(test: &str) -> (BTreeSet<usize>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_softmm"))
        .args(["replay", &format!("{test}.log"), "--faults", &format!("{test}.faults")])
        .args(["--bench", "--repeat", "1", "--policy", &policies()])
        .current_dir(dir())
        .output()
        .expect("run softmm");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("unparsed lines"), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let lines = out
        .lines()
        .filter_map(|l| l.strip_prefix("MISMATCH line "))
        .map(|l| l[..l.find(|c: char| !c.is_ascii_digit()).unwrap_or(l.len())].parse().expect("a line number"))
        .collect();
    (lines, out)
}

/// The lines `test.expected` lists (none without the file).
fn expected(test: &str) -> BTreeSet<usize> {
    let Ok(text) = std::fs::read_to_string(dir().join(format!("{test}.expected"))) else {
        return BTreeSet::new();
    };
    text.lines().filter_map(|l| l.strip_prefix("line ")).map(|n| n.trim().parse().expect("a line number")).collect()
}

/// The recorded tests (the README's table says what each calls and why the
/// tests it leaves out are not here).
const TESTS: &[&str] = &[
    "map_fixed_noreplace",
    "mremap_dontunmap",
    "map_populate",
    "mlock2-tests",
    "madv_populate",
    "mseal_test",
    "hugepage-mmap",
    "map_hugetlb",
    "hugepage-mremap",
    "hugepage-vmemmap",
    "hugetlb-madvise",
    "hugetlb_dio",
    "hugetlb_madv_vs_map",
    "gup_longterm",
    "thuge-gen",
    "mkdirty",
    "mdwe_test",
    "seal_elf",
    "droppable",
    "on-fault-limit",
];

#[test]
fn linux_mm_selftests_replay_as_recorded() {
    for test in TESTS {
        let (got, out) = replay(test);
        let want = expected(test);
        assert_eq!(got, want, "{test}: mismatches other than the expected ones:\n{out}");
        assert!(out.contains("0 unparsed lines"), "{test}:\n{out}");
        assert!(out.contains("page faults:") && out.contains(" replayed ("), "{test}: its faults replay:\n{out}");
        assert!(!out.contains("--bench:") && !out.contains("DIFFERS"), "{test}: the bench's results:\n{out}");
    }
}
