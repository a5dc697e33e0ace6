//! Regression tests for the defects an adversarial review found in the safe
//! API (one test or more per defect, named after what must hold). Each failed
//! before its fix.

mod common;

use common::*;
use softmm::uapi::*;
use softmm::{Errno, FaultPolicy};

/// `mincore` over a huge valid range used to allocate a result byte per page
/// up front (25 GiB here: the process aborted). It now works a bounded round
/// at a time into the caller's buffer and fails with `EFAULT` where the
/// buffer ends, as Linux's `copy_to_user` does.
#[test]
fn mincore_of_a_huge_range_uses_bounded_memory() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::default());
    let len = 100 << 40;
    let a = mm.mmap(0, len, PROT_NONE, ANON | MAP_NORESERVE, None, 0).unwrap();
    let mut vec = [7u8; 10_000];
    assert_eq!(mm.mincore(a, len, &mut vec), Err(Errno::Fault));
    assert!(vec.iter().all(|&b| b == 0), "the bytes that fit are written");
    // A hole after a valid part: ENOMEM, the valid part's bytes written.
    mm.munmap(a + 2 * PAGE, PAGE).unwrap();
    let mut vec = [7u8; 4];
    assert_eq!(mm.mincore(a, 4 * PAGE, &mut vec), Err(Errno::NoMem));
    assert_eq!(vec, [0, 0, 7, 7]);
    mm.munmap(a, len).unwrap();
    drop(mm);
    assert_no_leaks(&p);
}
