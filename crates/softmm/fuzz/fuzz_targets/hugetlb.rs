//! hugetlb mappings, small pages, forks, pins, `move_pages` and `mbind` on
//! two NUMA nodes with a pool of four huge pages, run on softmm and on the
//! hugetlb model; any panic, disagreement, pool count that differs, or leak
//! is a crash. The decoding and checking live in `softmm_testkit::fuzz_ops::huge`,
//! shared with the corpus replay test.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;

use softmm_testkit::fuzz_ops;

/// One arena for the whole run; each input must leave it empty and its pool
/// whole, which `run` checks.
fn phys() -> &'static Arc<softmm::PhysMem> {
    static PHYS: OnceLock<Arc<softmm::PhysMem>> = OnceLock::new();
    PHYS.get_or_init(fuzz_ops::huge::arena)
}

fuzz_target!(|data: &[u8]| {
    if let Err(e) = fuzz_ops::huge::run_bytes(data, phys()) {
        panic!("{}", fuzz_ops::huge::report(&e));
    }
});
