//! The page-fault handler and the policies that keep it safe from concurrent
//! changes to the address space.
//!
//! # Protocol
//!
//! A fault is resolved against one VMA and committed under the PTE lock of
//! the leaf table that maps the address: the handler re-reads the entry under
//! the lock and installs its result only if the entry is still what its work
//! was based on. Lock-free policies additionally *validate* under that lock
//! that no writer changed the VMA since the fault looked it up; the writer
//! side of every policy is the same: an `mmap_lock` writer makes the address
//! space's sequence count odd and detaches every VMA it replaces or removes
//! before it touches a page-table entry of that VMA, and takes the PTE lock
//! to do so. Hence either the fault's locked commit comes first and the writer
//! undoes it, or the writer's comes first and the validation fails.
//!
//! # Policies (chosen per address space)
//!
//! * [`FaultPolicy::MmapLock`] — `mmap_lock` held for read across the fault.
//! * [`FaultPolicy::Speculative`] — seed 001: read the sequence count (odd:
//!   fall back), look the VMA up in the RCU-published tree, walk the existing
//!   page tables without locks, do the work, and commit only if the count is
//!   unchanged. Any writer anywhere in the address space aborts it. Tried only
//!   when more than one CPU is attached, unless
//!   [`MmConfig::force_speculative`](crate::MmConfig) is set (seed patch 33).
//! * [`FaultPolicy::PerVma`] — Linux 6.4: look the VMA up under RCU and take
//!   its read reference (one atomic write to the VMA); a writer's detach waits
//!   for readers. Falls back to `mmap_lock` if the VMA is being replaced.
//! * [`FaultPolicy::PerVmaSeq`] — beyond both: like `Speculative`, but the
//!   validation is the VMA's own detached bit, so only a writer that changes
//!   *this* VMA aborts the fault, and like `PerVma` without the reference, so
//!   the fault writes no shared memory before its PTE lock.
//!
//! What lock-free paths do not do, and leave to the `mmap_lock` fallback
//! (counted as "unsupported"): allocate page tables without the VMA's
//! reference (a table the fault installs may be one a racing writer's zap
//! never saw, and only the PTE lock orders the fault's commit after that zap;
//! see docs/architecture.md: `PerVma` holds the reference anyway, `PerVmaSeq`
//! takes it only for a fault that must allocate, `Speculative` falls back),
//! assign a VMA's first `anon_vma` (`fork` and merging must see it), grow a
//! stack, wait for a file's `invalidate_lock`, and resolve faults that end in
//! a signal.
//!
//! Fault kinds (all in [`handler`]): anonymous read (zero page), anonymous
//! write (zeroed frame), file read (page-cache page, read-only, with
//! fault-around), private file write (COW copy), shared file write (page-cache
//! page made writable and dirty), write-protect faults (COW after fork, reuse
//! of an exclusively owned page), and growsdown stack expansion, done with
//! `mmap_lock` held for write (the StackRot fix). hugetlb faults (a 2 MiB
//! PMD leaf, seed 000) are `hugetlb.rs`, under `mmap_lock` or (`PerVma`,
//! and `PerVmaSeq` through its reference) the VMA's read reference, with
//! the locks of their [`crate::HugetlbPolicy`].

mod handler;
pub(crate) mod host_window;
pub(crate) mod hugetlb;
#[cfg(all(test, loom))]
mod loom_tests;
mod mmap_lock;
mod per_vma;
mod speculative;
mod stats;

pub(crate) use per_vma::{VmaHint, VmaReadRef};
pub use stats::FaultStats;
// The access kind is vocabulary below the TLB (`crate::access`); faults
// name it here, where embedders meet it.
pub use crate::access::Access;

use crate::error::Fault;
use crate::mm::{AddressSpace, FaultPolicy};
use crate::vma::Vma;
use handler::{Check, FaultCtx};

/// Why a lock-free attempt gave up (it then retries under `mmap_lock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abort {
    /// The address space's sequence count moved (or was odd).
    MmSeq,
    /// The VMA was replaced or removed.
    VmaChanged,
    /// A case the lock-free path leaves to the fallback.
    Unsupported,
    /// A page table is missing and this path may not allocate one.
    NoPageTable,
    /// A lock it would have to wait for was held.
    Contended,
    /// A hugetlb fault's PMD table was unshared from this address space
    /// before its commit ([`crate::HugetlbPolicy::LockFree`]'s validation);
    /// the hugetlb fault retries itself, so this never leaves it.
    PmdUnshared,
    /// A hugetlb fault met a PMD migration entry; `hugetlb_fault` waits for
    /// it with its locks dropped, so this never leaves it either.
    HugeMigration,
    /// A hugetlb write-protect fault found its page locked (a migration of
    /// it is under way); `hugetlb_fault` waits for it with its locks
    /// dropped, so this never leaves it either.
    HugePageLocked,
}

/// A fault that did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultError {
    /// The access must raise this signal.
    Signal(Fault),
    /// A lock-free attempt gave up.
    Abort(Abort),
}

impl From<Fault> for FaultError {
    fn from(f: Fault) -> Self {
        FaultError::Signal(f)
    }
}

impl AddressSpace {
    /// Resolves a fault at `addr` for `access`, as the MMU would raise it.
    /// On success the page is mapped with at least the needed permission; on
    /// failure the signal Linux would deliver.
    pub fn handle_fault(&self, addr: u64, access: Access) -> Result<(), Fault> {
        let _q = crate::tlb::QuiescentGuard::enter();
        self.handle_fault_counted(addr, access, &mut FaultStats::default(), None)
    }

    /// Linux's `handle_mm_fault` for a caller that holds `mmap_lock` (for
    /// read or write) and found `vma` at `addr`: resolves the fault on the
    /// locked path, which never aborts. For `get_user_pages` (`crate::populate`).
    pub(crate) fn handle_mm_fault(&self, vma: &Vma, addr: u64, access: Access) -> Result<(), Fault> {
        mmap_lock::locked(self, vma, addr, access)
    }

    /// [`AddressSpace::handle_mm_fault`] for `get_user_pages` with
    /// `FOLL_FORCE`, for a caller that checked `vma` with gup's
    /// `check_vma_flags`: the VMA's protection is not checked, a write to a
    /// read-only private VMA breaks COW and leaves the new page read-only,
    /// and a `PROT_NONE` VMA gets `PROT_NONE` entries.
    pub(crate) fn handle_mm_fault_forced(&self, vma: &Vma, addr: u64, access: Access) -> Result<(), Fault> {
        let ctx = FaultCtx { mm: self, vma, check: Check::None, may_sleep: true, may_alloc_tables: true, forced: true };
        match handler::handle_vma_fault(&ctx, addr, access) {
            Ok(()) => Ok(()),
            Err(FaultError::Signal(f)) => Err(f),
            Err(FaultError::Abort(a)) => unreachable!("locked fault aborted: {a:?}"),
        }
    }

    /// Linux's `anon_vma_prepare` for a caller that holds `mmap_lock`:
    /// gives `vma` its anon_vma if it has none yet (`MADV_GUARD_INSTALL`,
    /// so that `fork` copies its markers). False only if that could not be
    /// done, which the locked path never meets.
    pub(crate) fn anon_vma_prepare_locked(&self, vma: &Vma) -> bool {
        let ctx =
            FaultCtx { mm: self, vma, check: Check::None, may_sleep: true, may_alloc_tables: true, forced: false };
        handler::anon_vma_prepare(&ctx).is_ok()
    }

    /// [`AddressSpace::handle_fault`], counting into `stats` (a CPU's own),
    /// trying first the VMA of `hint` (a CPU's own, [`VmaHint`]) under the
    /// per-VMA fault policies.
    pub(crate) fn handle_fault_counted(
        &self,
        addr: u64,
        access: Access,
        stats: &mut FaultStats,
        hint: Option<&mut VmaHint>,
    ) -> Result<(), Fault> {
        stats.faults += 1;
        let attempt = match self.policy() {
            FaultPolicy::MmapLock => None,
            FaultPolicy::Speculative => (self.config.force_speculative || self.tlb.attached() > 1)
                .then(|| speculative::handle(self, addr, access)),
            FaultPolicy::PerVma => Some(per_vma::handle(self, addr, access, true, hint)),
            FaultPolicy::PerVmaSeq => Some(per_vma::handle(self, addr, access, false, hint)),
        };
        if let Some(result) = attempt {
            stats.spec_attempts += 1;
            match result {
                Ok(()) => {
                    stats.spec_successes += 1;
                    return Ok(());
                }
                Err(FaultError::Abort(cause)) => stats.count_abort(cause),
                Err(FaultError::Signal(_)) => stats.count_abort(Abort::Unsupported),
            }
            stats.fallbacks += 1;
        }
        stats.mmap_lock_acquisitions += 1;
        mmap_lock::handle(self, addr, access)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::mm::MmConfig;
    use crate::phys::{PhysConfig, PhysMem};
    use crate::uapi::*;
    use crate::PAGE_SIZE;

    /// A lock-free fault that found a shared anonymous VMA before `munmap`
    /// removed it may go on after the `munmap` returned and released the
    /// object: it must not add a page to the released object (nothing would
    /// free it before the VMA's memory is reclaimed), and it must not
    /// commit. Here the fault, under each lock-free validation, runs on the
    /// VMA it loaded before the `munmap`.
    #[test]
    fn a_lock_free_fault_adds_no_page_to_an_object_released_under_it() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default().policy(FaultPolicy::PerVmaSeq)).unwrap();
        let rw = PROT_READ | PROT_WRITE;
        let a = 0x1000_0000;
        // A neighbour keeps the page table, which a lock-free fault does not
        // allocate, after the munmap.
        let b = a + PAGE_SIZE;
        assert_eq!(mm.mmap(b, PAGE_SIZE, rw, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0), Ok(b));
        mm.handle_fault(b, Access::Write).unwrap();
        for check in ["vma", "seq"] {
            assert_eq!(mm.mmap(a, PAGE_SIZE, rw, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, None, 0), Ok(a));
            let guard = crossbeam_epoch::pin();
            let seq = mm.seq.read_begin().unwrap();
            let vma = mm.vmas_rcu(&guard).find(a).unwrap().clone();
            mm.munmap(a, PAGE_SIZE).unwrap();
            assert_eq!(phys.stats().frames_used, 1, "the neighbour's page alone");
            let check = if check == "vma" { Check::VmaDetached } else { Check::MmSeq(seq) };
            let ctx = FaultCtx { mm: &mm, vma: &vma, check, may_sleep: false, may_alloc_tables: false, forced: false };
            let r = handler::handle_vma_fault(&ctx, a, Access::Write);
            assert!(r.is_err(), "{check:?}: a fault on a removed VMA committed");
            assert_eq!(phys.stats().frames_used, 1, "{check:?}: a page was added to the released object");
            assert!(mm.pte_at(a).is_none(), "{check:?}");
        }
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    }
}
