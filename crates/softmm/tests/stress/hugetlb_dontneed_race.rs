//! Linux's `hugetlb_madv_vs_map` selftest as a stress test: with one huge
//! page in the pool, the owner of a private `MAP_HUGETLB` mapping loops
//! `MADV_DONTNEED` over it while a second thread writes it and a third
//! tries to map another huge page. The mapping holds the pool's one
//! reservation throughout, so every one of the third thread's `mmap`s is
//! `ENOMEM` and every write succeeds: the page flips between mapped and
//! reserved, never free for the taking.
//!
//! A zap restores the owner's reservation for each page it clears; a fault
//! that mapped a page after the restore looked and before the zap cleared
//! it let the page go back to the pool unreserved, and the third thread's
//! `mmap` took it (3 of 4 runs of this test, or a write raised `SIGBUS`).
//! Linux's zap holds the private mapping's
//! reservation lock (`resv_map->rw_sema`, `hugetlb_vma_lock_write`) from
//! before the restore until the pages are freed, and its faults hold it for
//! read. Which interleaving a run meets is the scheduler's: the loop runs
//! enough rounds that the race, when present, is met.

use softmm_testkit::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use softmm::uapi::*;
use softmm::{Cpu, FaultPolicy, PhysConfig, PhysMem};

const HP: u64 = 2 << 20;
const RW: i32 = PROT_READ | PROT_WRITE;
const PRIVATE_HUGE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
/// The selftest's rounds and calls per round (`max`, `INLOOP_ITER`).
const ROUNDS: u64 = 400;
const CALLS: usize = 100;

/// One run of the selftest's rounds under `policy`; the number of the
/// third thread's `mmap`s that succeeded and of writes that faulted.
fn run(policy: FaultPolicy) -> (usize, usize) {
    let phys = PhysMem::new(PhysConfig::new((8 << 20) + 2 * HP).hugepages(1)).unwrap();
    let mm = mm_with(&phys, policy);
    let (mut mapped, mut faulted) = (0, 0);
    for _ in 0..scaled(ROUNDS) {
        let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let go = Arc::new(AtomicBool::new(false));
        let start = |go: &Arc<AtomicBool>| {
            while !go.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        };
        let (m, g) = (mm.clone(), go.clone());
        let madv = spawn("madv".into(), move || {
            start(&g);
            for _ in 0..CALLS {
                m.madvise(a, HP, MADV_DONTNEED).unwrap();
            }
        });
        let (m, g) = (mm.clone(), go.clone());
        let touch = spawn("touch".into(), move || {
            start(&g);
            let mut cpu = Cpu::attached(&m);
            (0..CALLS).filter(|_| cpu.write_u8(a, b'.').is_err()).count()
        });
        let (m, g) = (mm.clone(), go.clone());
        let map_extra = spawn("map_extra".into(), move || {
            start(&g);
            let mut got = 0;
            for _ in 0..CALLS {
                if let Ok(b) = m.mmap(0, HP, RW, PRIVATE_HUGE, None, 0) {
                    got += 1;
                    m.munmap(b, HP).unwrap();
                }
            }
            got
        });
        go.store(true, Ordering::Release);
        madv.join().unwrap();
        faulted += touch.join().unwrap();
        mapped += map_extra.join().unwrap();
        mm.munmap(a, HP).unwrap();
        let s = phys.huge_page_stats();
        assert_eq!((s.free, s.rsvd), (1, 0), "{}: after munmap the pool has its page, unreserved", policy.name());
    }
    drop(mm);
    assert_no_leaks(&phys);
    (mapped, faulted)
}

#[test]
fn dontneed_beside_a_fault_never_frees_the_owners_reserved_page() {
    for policy in [FaultPolicy::MmapLock, FaultPolicy::PerVma] {
        let (mapped, faulted) = watchdog("hugetlb_madv_vs_map", 120, move || run(policy));
        assert_eq!(mapped, 0, "{}: another mapping took the owner's reserved page", policy.name());
        assert_eq!(faulted, 0, "{}: a write to the reserved mapping faulted", policy.name());
    }
}
