//! The shared-write counts of the fault paths (build with
//! `--features shared-write-stats`): the default policy's anonymous fault
//! writes no shared cache line beyond the PTE and its lock, except the
//! amortized refill of the per-thread frame cache.
#![cfg(feature = "shared-write-stats")]

use softmm_testkit::common;

use common::*;
use softmm::{Cpu, FaultPolicy};

/// Shared writes per fault for steady-state anonymous write faults.
fn per_fault(policy: FaultPolicy) -> f64 {
    let p = phys(16);
    let mm = mm_with(&p, policy);
    const PAGES: u64 = 1024;
    let a = mm.mmap(0, PAGES * PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    // First touch of each 2 MiB creates the page tables and the anon_vma (locked path).
    for p in (0..PAGES).step_by(512) {
        cpu.write_u8(a + p * PAGE, 1).unwrap();
    }
    mm.madvise(a, PAGES * PAGE, softmm::uapi::MADV_DONTNEED).unwrap();
    let before = cpu.stats().fault;
    for p in 0..PAGES {
        cpu.write_u8(a + p * PAGE, 1).unwrap();
    }
    let after = cpu.stats().fault;
    assert_eq!(after.faults - before.faults, PAGES);
    (after.shared_writes - before.shared_writes) as f64 / PAGES as f64
}

#[test]
fn default_policy_anonymous_fault_writes_nothing_shared() {
    for &policy in FaultPolicy::ALL {
        // Printed for the record (`-- --nocapture`).
        eprintln!("{:12} {:.3} shared writes per anonymous fault", policy.name(), per_fault(policy));
    }
    let default = per_fault(FaultPolicy::default());
    assert!(default < 0.1, "{default} shared writes per fault");
    let per_vma = per_fault(FaultPolicy::PerVma);
    let locked = per_fault(FaultPolicy::MmapLock);
    assert!(per_vma >= 2.0, "the VMA reference is taken and dropped: {per_vma}");
    assert!(locked >= 2.0, "mmap_lock is taken and dropped: {locked}");
}
