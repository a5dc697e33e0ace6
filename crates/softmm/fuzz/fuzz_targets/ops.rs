//! Sequences of mapping calls and guest accesses with hostile arguments,
//! run on softmm and on the reference model; any panic, disagreement or
//! leak is a crash. The decoding and checking live in
//! `softmm_testkit::fuzz_ops`, shared with the corpus replay test.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;

use softmm_testkit::fuzz_ops;

/// One arena for the whole run (prefaulting one per input would dominate);
/// each input must leave it empty, which `run` checks.
fn phys() -> &'static Arc<softmm::PhysMem> {
    static PHYS: OnceLock<Arc<softmm::PhysMem>> = OnceLock::new();
    PHYS.get_or_init(fuzz_ops::arena)
}

fuzz_target!(|data: &[u8]| {
    if let Err(e) = fuzz_ops::run_bytes(data, phys()) {
        panic!("{}", fuzz_ops::report(&e));
    }
});
