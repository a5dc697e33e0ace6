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
mod migrate_host;
mod mremap_shrink_overflow;
