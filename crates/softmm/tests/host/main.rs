//! Differential tests against the host kernel: random and fixed scenarios
//! and every bad-input class run in a runner child on Linux and on softmm
//! (`softmm_testkit::differential`), and `move_pages`/`migrate_pages(2)` on
//! a layout in this process.
//!
//! Kept apart from the tests that reserve the host's huge page pool: the
//! runner's `MAP_HUGETLB` cases read the pool's state once per process
//! (`bad_input`), and `migrate_host` unmaps a hole in its layout that only
//! these tests, whose other host mappings are made in runner children, leave
//! alone.

use softmm_testkit::differential::host;

/// The host runner's entry point (see `softmm_testkit::differential::host`):
/// at the crate root, so that the runner child runs it by its exact name.
#[test]
#[ignore = "entry point of the host child process, run by run_on_host"]
fn host_runner_entry() {
    if std::env::var_os(host::RUNNER_ENV).is_some() {
        host::host_runner_main()
    }
}

mod bad_input;
mod differential;
mod edge_cases;
mod map_count_limit;
mod migrate_host;
mod mremap_shrink_overflow;

/// `scripts/test.sh` runs this binary again under every writer policy
/// (`range` in its own stage, the others in `writer-policies`): a policy
/// added to `WriterPolicy::ALL` and not to the script would go untested
/// against the host.
#[test]
fn the_suite_runs_these_tests_under_every_writer_policy() {
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/test.sh")).unwrap();
    let looped = script
        .lines()
        .find_map(|l| l.trim().strip_prefix("for p in ").and_then(|l| l.strip_suffix("; do")))
        .expect("the writer-policies loop");
    for p in softmm::WriterPolicy::ALL {
        let covered = looped.split_whitespace().any(|q| q == p.name())
            || (p.name() == "range" && script.contains("SOFTMM_WRITER_POLICY=range"));
        assert!(covered, "scripts/test.sh runs no host tests under the writer policy {}", p.name());
    }
}
