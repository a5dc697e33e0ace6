//! loom models of the fault protocol on the real code: the real
//! [`AddressSpace::handle_fault`] on one thread against a real mapping call
//! on another, on a tiny address space, under each fault policy whose
//! lock-free path races a writer (`PerVmaSeq`, `Speculative` forced with one
//! CPU, `PerVma`; `MmapLock` serializes everything on the rwlock).
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release
//! -p softmm --lib` (scripts/test.sh). Page tables, PTE locks, `mmap_lock`,
//! the sequence counts, frame reference counts, the TLB shootdown and
//! crossbeam-epoch are all loom's here, so every interleaving of the two
//! threads up to the preemption bound is explored.

use std::sync::Arc;

use crate::error::Fault;
use crate::fault::{Access, FaultStats};
use crate::mm::{AddressSpace, FaultPolicy, MmConfig};
use crate::pgtable::Pte;
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::PAGE_SIZE;

/// The policies with a lock-free path.
const POLICIES: [FaultPolicy; 3] = [FaultPolicy::PerVmaSeq, FaultPolicy::Speculative, FaultPolicy::PerVma];

/// Two preemptions: enough for the fault to be overtaken between its lookup
/// and its commit and for the writer to be overtaken inside its zap, while
/// keeping each model to seconds.
fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    // A table scan (is this table empty now?) is 512 atomic loads, each a
    // loom branch: far more than the default 1000 in one execution.
    b.max_branches = 100_000;
    b
}

/// A tiny address space with a private anonymous read-write VMA of two
/// pages: the second written once (so the VMA has its `anon_vma`, which the
/// lock-free paths do not assign), the first read once (so its page tables
/// exist, which the lock-free paths of `PerVmaSeq` and `Speculative` do not
/// allocate, and it maps the zero page). The racing write fault on the first
/// page is then a COW that allocates a frame and commits it under the PTE
/// lock without `mmap_lock`: the step the writer must not miss.
fn setup(policy: FaultPolicy) -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default().policy(policy).force_speculative(true)).unwrap();
    let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a + PAGE_SIZE, Access::Write).unwrap();
    mm.handle_fault(a, Access::Read).unwrap();
    (phys, mm, a)
}

/// A write fault on `a` from another thread, with its counts.
fn spawn_write_fault(mm: &Arc<AddressSpace>, a: u64) -> loom::thread::JoinHandle<(Result<(), Fault>, FaultStats)> {
    let mm = mm.clone();
    crate::sync::model::spawn(move || {
        let _q = crate::tlb::QuiescentGuard::enter();
        let mut stats = FaultStats::default();
        let r = mm.handle_fault_counted(a, Access::Write, &mut stats, None);
        (r, stats)
    })
}

/// Runs `body` under every policy, and fails unless in some execution of
/// each the fault completed on its lock-free path (else the model would only
/// check the `mmap_lock` fallback).
fn check_policies(body: impl Fn(FaultPolicy) -> FaultStats + Send + Sync + Clone + 'static) {
    for policy in POLICIES {
        let lock_free = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = lock_free.clone();
        let body = body.clone();
        builder().check(move || {
            if body(policy).spec_successes > 0 {
                seen.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        assert!(lock_free.load(std::sync::atomic::Ordering::Relaxed), "{policy:?}: the lock-free path never completed");
    }
}

/// munmap against a write fault: once munmap has returned and the fault's
/// thread is joined, nothing is mapped in the range and no frame is left
/// allocated (a fault that committed after the zap would leave both), and the
/// fault either succeeded (it came first) or raised `SIGSEGV` (it came after).
#[test]
fn fault_vs_munmap() {
    check_policies(|policy| {
        let (phys, mm, a) = setup(policy);
        let t = spawn_write_fault(&mm, a);
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        let (r, stats) = t.join().unwrap();
        assert!(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV), "{policy:?}: {r:?}");
        assert!(mm.pte_at(a).is_none(), "{policy:?}: an entry survived munmap");
        assert_eq!(phys.stats().frames_used, 0, "{policy:?}: a frame outlived its mapping");
        stats
    });
}

/// munmap of a shared anonymous mapping against a write fault that
/// allocates its page in the mapping's object: once munmap has returned and
/// the fault's thread is joined, no frame is left (the object is released
/// by munmap, not when its VMAs' memory is reclaimed, and a fault that ran
/// on the removed VMA after the release added no page to it).
#[test]
fn shared_fault_vs_munmap() {
    check_policies(|policy| {
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::model_default().policy(policy).force_speculative(true)).unwrap();
        let flags = MAP_SHARED | MAP_ANONYMOUS;
        let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
        // Its page table exists (the lock-free paths do not allocate one);
        // the racing fault's page is not cached yet.
        mm.handle_fault(a + PAGE_SIZE, Access::Write).unwrap();
        let t = spawn_write_fault(&mm, a);
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        let (r, stats) = t.join().unwrap();
        assert!(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV), "{policy:?}: {r:?}");
        assert!(mm.pte_at(a).is_none(), "{policy:?}: an entry survived munmap");
        assert_eq!(phys.stats().frames_used, 0, "{policy:?}: a page outlived its object");
        stats
    });
}

/// mprotect(PROT_READ) against a write fault: once mprotect has returned and
/// the fault's thread is joined, the entry is not writable (a fault that
/// committed a writable entry after mprotect's change would leave one).
#[test]
fn fault_vs_mprotect() {
    check_policies(|policy| {
        let (_phys, mm, a) = setup(policy);
        let t = spawn_write_fault(&mm, a);
        mm.mprotect(a, PAGE_SIZE, PROT_READ).unwrap();
        let (r, stats) = t.join().unwrap();
        assert!(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV), "{policy:?}: {r:?}");
        let pte = mm.pte_at(a);
        assert!(!pte.has(Pte::WRITE), "{policy:?}: writable entry {pte:?} after mprotect(PROT_READ)");
        stats
    });
}

/// mremap moving the VMA against a write fault on its first page: once
/// mremap has returned and the fault's thread is joined, nothing is mapped at
/// the old address, and every allocated frame is mapped at the new one (a
/// fault that committed into the old range after the move would leave an
/// entry there, or a frame nobody maps).
#[test]
fn fault_vs_mremap_move() {
    check_policies(|policy| {
        let (phys, mm, a) = setup(policy);
        let t = spawn_write_fault(&mm, a);
        let b = a + 16 * PAGE_SIZE;
        assert_eq!(mm.mremap(a, 2 * PAGE_SIZE, 2 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, b), Ok(b));
        let (r, stats) = t.join().unwrap();
        assert!(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV), "{policy:?}: {r:?}");
        for page in [a, a + PAGE_SIZE] {
            assert!(mm.pte_at(page).is_none(), "{policy:?}: an entry survived the move at {page:#x}");
        }
        let mapped = [b, b + PAGE_SIZE]
            .iter()
            .filter(|&&p| mm.pte_at(p).has_frame() && mm.pte_at(p).pfn() != phys.zero_pfn())
            .count();
        assert_eq!(phys.stats().frames_used, mapped as u64, "{policy:?}: a frame nobody maps");
        stats
    });
}

/// fork against a write fault on a page that maps the zero page: once fork
/// has returned and the fault's thread is joined, no parent entry is writable
/// while its frame is also the child's (the parent would write into the
/// child), whichever of fork's copy and the fault's commit took the PTE lock
/// first, and once both address spaces are gone no frame is left allocated.
#[test]
fn fault_vs_fork() {
    check_policies(|policy| {
        let (phys, mm, a) = setup(policy);
        let t = spawn_write_fault(&mm, a);
        let child = mm.fork().unwrap();
        let (r, stats) = t.join().unwrap();
        assert_eq!(r, Ok(()), "{policy:?}");
        for page in [a, a + PAGE_SIZE] {
            let (p, c) = (mm.pte_at(page), child.pte_at(page));
            if p.has(Pte::WRITE) && c.has_frame() {
                assert_ne!(p.pfn(), c.pfn(), "{policy:?}: parent writes the child's frame at {page:#x}");
            }
        }
        drop(child);
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0, "{policy:?}: a frame outlived both address spaces");
        stats
    });
}
