//! `madvise`.

use crate::error::{Errno, Result};
use crate::fault::Access;
use crate::file::Inode;
use crate::pgtable::{Pte, PMD_SIZE};
use crate::phys::{PG_ANON, PG_DIRTY, PG_LAZYFREE};
use crate::populate;
use crate::uapi::*;
use crate::vma::VmFlags;
use crate::{PAGE_SHIFT, PAGE_SIZE};

use crate::fault::VmaReadRef;
use crate::mm::{AddressSpace, MadvisePolicy, MmuGather, MAX_GATHER_FRAMES};
use crate::sync::Ordering;
use crate::vma::{Vma, VmaTree, ZapDetails};
use std::sync::Arc;

/// The cursor of `madvise_walk_vmas`: the next VMA part of a range, noting
/// whether an unmapped hole was skipped.
struct VmaWalk {
    next: u64,
    end: u64,
    unmapped: bool,
}

impl VmaWalk {
    /// The next `(vma, start, stop)` part; `ENOMEM` at once if no VMA is left
    /// at all, as in Linux.
    fn step(&mut self, vmas: &VmaTree) -> Result<Option<(Arc<Vma>, u64, u64)>> {
        if self.next >= self.end {
            return Ok(None);
        }
        let vma = vmas.find_from(self.next).cloned().ok_or(Errno::NoMem)?;
        if vma.start >= self.end {
            self.unmapped = true;
            return Ok(None);
        }
        if self.next < vma.start {
            self.unmapped = true;
            self.next = vma.start;
        }
        let (start, stop) = (self.next, vma.end.min(self.end));
        self.next = stop;
        Ok(Some((vma, start, stop)))
    }

    fn result(&self) -> Result<()> {
        if self.unmapped {
            Err(Errno::NoMem)
        } else {
            Ok(())
        }
    }
}

mod range;

// The loom models' broken switches: `sync/broken.rs`.
pub(crate) use crate::sync::broken::madvise as broken;

/// KSM's `vma_ksm_compatible` for the flags softmm has: KSM never merges
/// shared, special, hugetlb or droppable mappings, so `MADV_MERGEABLE`
/// leaves them alone.
fn ksm_compatible(flags: VmFlags) -> bool {
    let never = VmFlags::SHARED | VmFlags::MAYSHARE | VmFlags::SPECIAL | VmFlags::HUGETLB | VmFlags::DROPPABLE;
    !flags.intersects(never)
}

impl AddressSpace {
    /// `madvise(addr, len, advice)`.
    ///
    /// Supported: `MADV_NORMAL`, `RANDOM`, `SEQUENTIAL`, `WILLNEED`,
    /// `DONTNEED`, `DONTNEED_LOCKED`, `FREE`, `REMOVE`, `DONTFORK`, `DOFORK`,
    /// `WIPEONFORK`, `KEEPONFORK`, `DONTDUMP`, `DODUMP`, `HUGEPAGE`,
    /// `NOHUGEPAGE`, `COLD`, `PAGEOUT`, `POPULATE_READ`, `POPULATE_WRITE`,
    /// `MERGEABLE`, `UNMERGEABLE` (the `VM_MERGEABLE` flag, as KSM's
    /// `ksm_madvise` sets it; nothing is merged), `COLLAPSE` (Linux 6.18's
    /// outcome: `EINVAL` unless the VMA is private anonymous, not
    /// `NOHUGEPAGE` and holds an aligned 2 MiB block; each whole block that
    /// is writable and holds an anonymous page and no guard marker is made
    /// present, private and writable, as a huge page would be, and any other
    /// block makes the result `EINVAL`), `GUARD_INSTALL`, `GUARD_REMOVE`
    /// (guard markers: an access to a marked page raises `SIGSEGV` with
    /// `SEGV_MAPERR`; `MADV_DONTNEED` and truncation keep them, `munmap` and
    /// `GUARD_REMOVE` clear them, `fork` copies and `mremap` moves them).
    /// `EINVAL` for other advice, an unaligned address, a wrapping range or
    /// advice the VMA does not support; `ENOMEM` if part of the range is
    /// unmapped (after advising the mapped parts, as Linux does).
    ///
    /// `DONTNEED`, `DONTNEED_LOCKED` and `FREE` run under the
    /// [`MadvisePolicy`](crate::MadvisePolicy) of the address space's
    /// configuration; the others under `mmap_lock`, for read or (advice that
    /// changes VMA flags) for write, or, under `WriterPolicy::Range`, as a
    /// range writer inside one window (`sys/madvise/range.rs`). Every policy
    /// gives the same result.
    pub fn madvise(&self, addr: u64, len: u64, advice: i32) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let known = matches!(
            advice,
            MADV_NORMAL
                | MADV_RANDOM
                | MADV_SEQUENTIAL
                | MADV_WILLNEED
                | MADV_DONTNEED
                | MADV_DONTNEED_LOCKED
                | MADV_FREE
                | MADV_REMOVE
                | MADV_DONTFORK
                | MADV_DOFORK
                | MADV_WIPEONFORK
                | MADV_KEEPONFORK
                | MADV_DONTDUMP
                | MADV_DODUMP
                | MADV_HUGEPAGE
                | MADV_NOHUGEPAGE
                | MADV_COLD
                | MADV_PAGEOUT
                | MADV_POPULATE_READ
                | MADV_POPULATE_WRITE
                | MADV_MERGEABLE
                | MADV_UNMERGEABLE
                | MADV_COLLAPSE
                | MADV_GUARD_INSTALL
                | MADV_GUARD_REMOVE
        );
        if !known || addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let end = super::aligned_end(addr, len)?;
        if end == addr {
            return Ok(());
        }
        match advice {
            MADV_POPULATE_READ | MADV_POPULATE_WRITE => {
                return crate::populate::faultin_page_range(self, addr, end, advice == MADV_POPULATE_WRITE)
            }
            MADV_REMOVE => return self.madvise_remove(addr, end),
            MADV_DONTNEED | MADV_DONTNEED_LOCKED | MADV_FREE if self.config.madvise_policy == MadvisePolicy::PerVma => {
                if let Some(res) = self.madvise_dontneed_free_per_vma(addr, end, advice) {
                    return res;
                }
            }
            _ => {}
        }
        let flag_change = matches!(
            advice,
            MADV_NORMAL
                | MADV_RANDOM
                | MADV_SEQUENTIAL
                | MADV_DONTFORK
                | MADV_DOFORK
                | MADV_WIPEONFORK
                | MADV_KEEPONFORK
                | MADV_DONTDUMP
                | MADV_DODUMP
                | MADV_HUGEPAGE
                | MADV_NOHUGEPAGE
                | MADV_MERGEABLE
                | MADV_UNMERGEABLE
        );
        let mut tlb = MmuGather::default();
        if flag_change {
            // Range-parallel writers: inside one window, without mmap_lock.
            if let Some(res) = self.range_madvise_behavior(addr, end, advice) {
                return res;
            }
            let mut st = self.write_lock();
            let res = self.madvise_vma_behavior(&mut st, addr, end, advice);
            std::mem::take(&mut tlb).finish(self);
            drop(st);
            res
        } else {
            let st = self.read_lock();
            let res = self.walk_vmas_read(&st, addr, end, |mm, vma, start, stop| match advice {
                MADV_DONTNEED | MADV_DONTNEED_LOCKED | MADV_FREE => {
                    mm.madvise_dontneed_free(vma, start, stop, advice, &mut tlb)
                }
                MADV_GUARD_INSTALL => mm.guard_install(vma, start, stop, &mut tlb),
                MADV_GUARD_REMOVE => mm.guard_remove(vma, start, stop),
                MADV_COLLAPSE => mm.madvise_collapse(vma, start, stop),
                // can_madv_lru_vma: locked pages stay on their LRU, and
                // hugetlb and PFN-mapped pages are on none.
                MADV_COLD | MADV_PAGEOUT
                    if vma.flags.intersects(VmFlags::LOCKED | VmFlags::PFNMAP | VmFlags::HUGETLB) =>
                {
                    Err(Errno::Inval)
                }
                _ => Ok(()), // WILLNEED, COLD, PAGEOUT: hints with no effect on contents
            });
            // Flush while mmap_lock is still held (see `munmap`).
            std::mem::take(&mut tlb).finish(self);
            drop(st);
            res
        }
    }

    /// The advice of `madvise` that changes VMA flags (Linux's
    /// `madvise_vma_behavior` for them), over `[start, end)`: each VMA part
    /// is split off or merged by `vma_modify_flags`, as `mprotect` does.
    /// Runs under `mmap_lock` for write or as a range writer on its
    /// window's view (`range.rs`), with the same result.
    fn madvise_vma_behavior(&self, st: &mut crate::mm::MmState, start: u64, end: u64, advice: i32) -> Result<()> {
        self.walk_vmas(st, start, end, |mm, st, vma, start, stop| {
            if !super::mseal::can_modify_vma_madv(vma, advice) {
                return Err(Errno::Perm);
            }
            let mut f = vma.flags;
            match advice {
                MADV_NORMAL => f &= !(VmFlags::SEQ_READ | VmFlags::RAND_READ),
                MADV_RANDOM => f = (f & !VmFlags::SEQ_READ) | VmFlags::RAND_READ,
                MADV_SEQUENTIAL => f = (f & !VmFlags::RAND_READ) | VmFlags::SEQ_READ,
                MADV_DONTFORK => f |= VmFlags::DONTCOPY,
                MADV_DOFORK => {
                    // A device mapping stays out of children.
                    if vma.flags.contains(VmFlags::IO) {
                        return Err(Errno::Inval);
                    }
                    f &= !VmFlags::DONTCOPY;
                }
                MADV_WIPEONFORK => {
                    if vma.file.is_some() || vma.flags.contains(VmFlags::SHARED) {
                        return Err(Errno::Inval);
                    }
                    f |= VmFlags::WIPEONFORK;
                }
                // A droppable mapping stays wipe-on-fork and out of
                // core dumps (Linux 6.12+'s madvise_vma_behavior).
                MADV_KEEPONFORK | MADV_DODUMP if vma.flags.contains(VmFlags::DROPPABLE) => {
                    return Err(Errno::Inval);
                }
                // A device mapping stays out of core dumps.
                MADV_DODUMP if !f.contains(VmFlags::HUGETLB) && f.intersects(VmFlags::SPECIAL) => {
                    return Err(Errno::Inval);
                }
                MADV_KEEPONFORK => f &= !VmFlags::WIPEONFORK,
                MADV_DONTDUMP => f |= VmFlags::DONTDUMP,
                MADV_DODUMP => f &= !VmFlags::DONTDUMP,
                MADV_HUGEPAGE => f = (f & !VmFlags::NOHUGEPAGE) | VmFlags::HUGEPAGE,
                MADV_NOHUGEPAGE => f = (f & !VmFlags::HUGEPAGE) | VmFlags::NOHUGEPAGE,
                // ksm_madvise: advice on a VMA KSM cannot merge is ignored.
                MADV_MERGEABLE if ksm_compatible(f) => f |= VmFlags::MERGEABLE,
                MADV_MERGEABLE => {}
                MADV_UNMERGEABLE => f &= !VmFlags::MERGEABLE,
                _ => unreachable!(),
            }
            if f == vma.flags {
                return Ok(());
            }
            let vma = mm.host_file_windows_merged(st, vma, start, stop, f, vma.policy.as_ref());
            // "madvise() returns EAGAIN if kernel resources, such as slab,
            // are temporarily unavailable" (`madvise_vma_behavior`): the
            // map count limit's `ENOMEM` too.
            mm.vma_modify_flags(st, &vma, start, stop, f).map_err(|e| if e == Errno::NoMem { Errno::Again } else { e })
        })
    }

    /// `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED` or `MADV_FREE` on one VMA part
    /// (Linux's `madvise_dontneed_free`), under `mmap_lock` or the VMA's read
    /// reference: `EINVAL` for a VMA the advice does not apply to
    /// (`madvise_dontneed_free_valid_vma`: `VM_PFNMAP`, `VM_LOCKED` unless
    /// `DONTNEED_LOCKED`, `FREE` of hugetlb; `madvise_free_single_vma`: `FREE`
    /// of a file mapping), checked before anything changes; else the pages go
    /// into `tlb`, for the caller to flush and free before it lets a writer
    /// change the VMA.
    fn madvise_dontneed_free(&self, vma: &Vma, start: u64, stop: u64, advice: i32, tlb: &mut MmuGather) -> Result<()> {
        // madvise_vma_behavior: a sealed read-only anonymous VMA keeps its pages.
        if !super::mseal::can_modify_vma_madv(vma, advice) {
            return Err(Errno::Perm);
        }
        if vma.flags.contains(VmFlags::HUGETLB) {
            // Under mmap_lock only: the per-VMA path leaves hugetlb to it
            // (the reserves and the unshare rely on it).
            // Only MADV_DONTNEED may free hugetlb pages.
            if advice == MADV_FREE {
                return Err(Errno::Inval);
            }
            // madvise_dontneed_free_valid_vma: an aligned start, the end
            // rounded down ("avoid unexpected data loss").
            let huge = vma.ops.pagesize(vma);
            if start % huge != 0 {
                return Err(Errno::Inval);
            }
            let stop = stop & !(huge - 1);
            if start < stop {
                // The backing's zap (hugetlb's restores a private owner's
                // reservations and keeps shareable windows unshared), of
                // every entry, private copies included.
                let details = ZapDetails { even_cows: true, filter: &mut |_| true };
                self.zap_vma_range(vma, start, stop, tlb, details);
            }
            return Ok(());
        }
        let forbidden =
            if advice == MADV_DONTNEED_LOCKED { VmFlags::PFNMAP } else { VmFlags::PFNMAP | VmFlags::LOCKED };
        if vma.flags.intersects(forbidden) {
            return Err(Errno::Inval);
        }
        if advice == MADV_FREE {
            if vma.file.is_some() {
                return Err(Errno::Inval);
            }
            self.madvise_free(start, stop, tlb);
        } else {
            self.zap_range(start, stop, tlb, |_| true);
            if crate::fault::host_window::is_host_file_window(vma) {
                // A window onto a host file has no entries to zap: its
                // translations live only in TLBs, which record no owner,
                // so every CPU is shot down. The bytes stay in the file;
                // the next access fills from it again.
                tlb.need_flush = true;
            }
        }
        Ok(())
    }

    /// [`MadvisePolicy::PerVma`]: `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED` or
    /// `MADV_FREE` of `[start, end)` without `mmap_lock`, as Linux 6.16's
    /// `madvise_lock` does for these three (`lock_vma_under_rcu`, falling
    /// back to `mmap_read_lock`). `None`, having changed nothing, where the
    /// `mmap_lock` path must decide.
    ///
    /// # Protocol
    ///
    /// The VMA holding `start` is looked up in the published tree and its
    /// read reference taken ([`VmaReadRef`], as a `FaultPolicy::PerVma`
    /// fault takes it); the reference fails on
    /// a VMA a writer has detached, and a writer's detach waits for it. Every
    /// writer that changes a VMA (its range, flags or entries: `munmap`,
    /// `mmap` over it, `mprotect`, `mremap`, `mlock`, `madvise` flag changes,
    /// `fork`'s write-protection) detaches it before touching its entries,
    /// under `mmap_lock` for write. So under the reference:
    ///
    /// * the VMA is current: its flags give the locked path's answer, and a
    ///   range inside it has no hole (else: `None`, and the locked walk
    ///   reports holes and visits several VMAs);
    /// * the zap comes before any writer's change of the range, and so does
    ///   its TLB flush, which is done before the reference is dropped: a
    ///   writer that then removes the VMA and maps something else there (or
    ///   a `munmap` that returns) finds no CPU still reaching a frame this
    ///   call cleared. Without the reference, validating the VMA's detached
    ///   bit under each PTE lock (as `FaultPolicy::PerVmaSeq` faults do)
    ///   would order the clears but not the flush: a writer finding the
    ///   entries already empty has nothing to flush and may return while a
    ///   CPU still holds a translation of this call's frame;
    /// * page tables are not freed under it: `free_pgtables` of a
    ///   neighbouring unmap counts the VMA as mapped, and the walk holds
    ///   an epoch guard against any other free (the lock-free unmap's).
    ///
    /// Faults in the VMA run concurrently, ordered with the zap by the PTE
    /// lock, as under `mmap_lock` for read.
    ///
    /// Left to `mmap_lock`: ranges over one VMA, hugetlb VMAs and address
    /// spaces that ever shared a PMD table (the unshare needs the locks of
    /// `zap_vma_range`), and ranges of more than one gather
    /// ([`MAX_GATHER_FRAMES`] pages), because the epoch guard that keeps the
    /// VMA alive is held across the zap: a long one would hold up every
    /// grace period of the process (`AddressSpace::zap_range`); for those
    /// `mmap_lock` costs nothing per page.
    fn madvise_dontneed_free_per_vma(&self, start: u64, end: u64, advice: i32) -> Option<Result<()>> {
        if end - start > MAX_GATHER_FRAMES as u64 * PAGE_SIZE || self.pgtables.ever_shared() {
            return None;
        }
        let guard = crossbeam_epoch::pin();
        // Linux's `lock_vma_under_rcu`, with the range and hugetlb checks
        // first, so that a call left to `mmap_lock` writes nothing: they
        // hold for the VMA found, which is immutable, and the reference
        // then says that it is still the address space's.
        let vma = self.vmas_rcu(&guard).find(start)?;
        if end > vma.end || vma.flags.contains(VmFlags::HUGETLB) {
            return None;
        }
        let held = if broken::no_vma_ref() { None } else { Some(VmaReadRef::try_new(vma)?) };
        let mut tlb = MmuGather::default();
        let res = self.madvise_dontneed_free(vma, start, end, advice, &mut tlb);
        // Flushed before the reference goes (see "Protocol").
        tlb.finish(self);
        drop(held);
        Some(res)
    }

    /// Linux's `madvise_walk_vmas`: visits each VMA part in `[start, end)`;
    /// an unmapped part makes the result `ENOMEM` after the visits.
    fn walk_vmas(
        &self,
        st: &mut crate::mm::MmState,
        start: u64,
        end: u64,
        mut visit: impl FnMut(&Self, &mut crate::mm::MmState, &Arc<Vma>, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let mut walk = VmaWalk { next: start, end, unmapped: false };
        while let Some((vma, a, stop)) = walk.step(&st.vmas)? {
            visit(self, st, &vma, a, stop)?;
        }
        walk.result()
    }

    /// [`Self::walk_vmas`] under `mmap_lock` held for read.
    fn walk_vmas_read(
        &self,
        st: &crate::mm::MmState,
        start: u64,
        end: u64,
        mut visit: impl FnMut(&Self, &Arc<Vma>, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let mut walk = VmaWalk { next: start, end, unmapped: false };
        while let Some((vma, a, stop)) = walk.step(&st.vmas)? {
            visit(self, &vma, a, stop)?;
        }
        walk.result()
    }

    /// `MADV_FREE`: exclusively owned anonymous pages become lazily freeable:
    /// clean them (so a later write re-dirties them through a fault-free TLB
    /// refill) and mark them; pages shared with another mapping are left alone,
    /// as Linux does.
    fn madvise_free(&self, start: u64, end: u64, tlb: &mut MmuGather) {
        let phys = &self.phys;
        self.pgtables.update_range(start, end, |_, pte| {
            if !pte.is_present() || pte.pfn() == phys.zero_pfn() {
                return None; // Nothing to free: the zero page stays mapped.
            }
            let d = phys.desc(pte.pfn());
            let exclusive = d.refcount.load(Ordering::Relaxed) == 1 && d.flags.load(Ordering::Relaxed) & PG_ANON != 0;
            if !exclusive {
                return None;
            }
            d.flags.fetch_and(!PG_DIRTY, Ordering::Relaxed);
            d.flags.fetch_or(PG_LAZYFREE, Ordering::Relaxed);
            tlb.need_flush = true;
            Some(pte.clear(Pte::DIRTY | Pte::WRITE))
        });
    }

    /// `MADV_REMOVE`, Linux's `madvise_walk_vmas` visiting `madvise_remove`:
    /// each VMA part of `[start, end)` in turn is checked (`EINVAL` for a
    /// locked VMA or one without a file, `EACCES` unless it is shared and may
    /// write) and its file range punched with `mmap_lock` dropped, as Linux
    /// drops it around `vfs_fallocate`; the walk then looks the next VMA up
    /// afresh. The first error ends the walk (earlier parts stay punched);
    /// holes are skipped and reported as `ENOMEM` at the end.
    fn madvise_remove(&self, start: u64, end: u64) -> Result<()> {
        let mut walk = VmaWalk { next: start, end, unmapped: false };
        loop {
            let (file, offset, len) = {
                let st = self.read_lock();
                let Some((vma, a, stop)) = walk.step(&st.vmas)? else { break };
                if !super::mseal::can_modify_vma_madv(&vma, MADV_REMOVE) {
                    return Err(Errno::Perm);
                }
                if vma.flags.contains(VmFlags::LOCKED) {
                    return Err(Errno::Inval);
                }
                let Some(file) = vma.file.clone() else { return Err(Errno::Inval) };
                if vma.flags & (VmFlags::SHARED | VmFlags::MAYWRITE) != (VmFlags::SHARED | VmFlags::MAYWRITE) {
                    return Err(Errno::Acces);
                }
                // `vfs_fallocate` of a device file (`crate::mmio`).
                if file.mmio.is_some() {
                    return Err(Errno::NoDev);
                }
                // Linux's `(start - vm_start) + (vm_pgoff << PAGE_SHIFT)` as a
                // loff_t. Where it does not overflow, this is the same value;
                // where it would (only for VMAs Linux's mmap refuses with
                // EOVERFLOW), the offset is past any file: EINVAL, as
                // vfs_fallocate gives a negative offset, rather than a
                // wrapped offset that punches the start of the file.
                let offset = vma
                    .pgoff
                    .checked_mul(PAGE_SIZE)
                    .and_then(|o| o.checked_add(a - vma.start))
                    .filter(|&o| o <= crate::file::MAX_FILE_SIZE)
                    .ok_or(Errno::Inval)?;
                (file, offset, stop - a)
            };
            file.punch_hole(offset, len)?;
        }
        walk.result()
    }

    /// `MADV_GUARD_INSTALL` on one VMA part (Linux's `madvise_guard_install`):
    /// `EINVAL` for a locked or special VMA; otherwise the VMA gets an
    /// anon_vma (as Linux's `anon_vma_prepare`, so that `fork` copies its
    /// entries), the pages of the range are zapped and every entry becomes a
    /// guard marker. A fault racing in between installs a page that the next
    /// round zaps again (Linux retries, then restarts the call).
    fn guard_install(&self, vma: &Arc<Vma>, start: u64, end: u64, tlb: &mut MmuGather) -> Result<()> {
        if vma.flags.intersects(VmFlags::LOCKED | VmFlags::SPECIAL) {
            return Err(Errno::Inval);
        }
        if !self.anon_vma_prepare_locked(vma) {
            return Err(Errno::NoMem);
        }
        loop {
            self.zap_range(start, end, tlb, |_| true);
            if self.set_guard_markers(start, end) {
                return Ok(());
            }
        }
    }

    /// Turns every empty entry of `[start, end)` into a guard marker; false
    /// if some entry holds a frame (a fault raced with the zap).
    fn set_guard_markers(&self, start: u64, end: u64) -> bool {
        let guard = crossbeam_epoch::pin();
        let mut all = true;
        for leaf in self.pgtables.leaves_alloc(start, end, &guard) {
            leaf.lock().update(|_, pte| {
                all &= pte.is_none() || pte.is_guard();
                pte.is_none().then_some(Pte::GUARD_MARKER)
            });
        }
        all
    }

    /// `MADV_GUARD_REMOVE` on one VMA part (Linux's `madvise_guard_remove`):
    /// `EINVAL` for a special VMA; locked VMAs are allowed, removing markers
    /// destroys nothing.
    fn guard_remove(&self, vma: &Vma, start: u64, end: u64) -> Result<()> {
        if vma.flags.intersects(VmFlags::SPECIAL) {
            return Err(Errno::Inval);
        }
        self.clear_guard_markers(start, end);
        Ok(())
    }

    /// Clears the guard markers of `[start, end)` (`MADV_GUARD_REMOVE`; an
    /// unmap drops them in its zap walk instead, `AddressSpace::unmap_range`,
    /// since its range must end up empty even in page tables that a
    /// neighbouring VMA keeps). Markers never translate, so no TLB flush is
    /// needed.
    pub(crate) fn clear_guard_markers(&self, start: u64, end: u64) {
        self.pgtables.update_range(start, end, |_, pte| pte.is_guard().then_some(Pte::NONE));
    }

    /// `MADV_COLLAPSE` on one VMA part. `EINVAL` where Linux's
    /// `thp_vma_allowable_order` refuses: `MADV_NOHUGEPAGE`, special and
    /// hugetlb VMAs, a VMA without an aligned 2 MiB block below its end, a
    /// file other than shmem (a host file), and for shmem a start address
    /// and file offset not congruent modulo 2 MiB. Then each whole 2 MiB
    /// block of the range, in order:
    ///
    /// * anonymous memory, with the outcome Linux 6.18 gives (THP `madvise`
    ///   mode, checked on the host): the block collapses if the VMA is
    ///   writable and the block holds an anonymous page (not only the zero
    ///   page) and no guard marker; a block that does not makes the result
    ///   `EINVAL` (the errno of `SCAN_PMD_NULL`, `SCAN_PAGE_RO`,
    ///   `SCAN_PTE_NON_PRESENT`, …) but does not stop the others;
    /// * shmem ([`AddressSpace::madvise_collapse_shmem`]), as Linux 6.12.
    ///
    /// A range with no whole block is `Ok`. softmm has no huge pages: a
    /// collapsed block is every page of it made present (anonymous: private
    /// and writable, missing pages zero, shared ones copied), which is what
    /// the host's huge page shows to mincore, `Rss` and the program;
    /// `ENOMEM` if frames run out part way.
    fn madvise_collapse(&self, vma: &Vma, start: u64, end: u64) -> Result<()> {
        let pmd = PMD_SIZE;
        let has_block = vma.end.checked_sub(pmd).is_some_and(|last| last & !(pmd - 1) >= vma.start);
        if !has_block || vma.flags.intersects(VmFlags::NOHUGEPAGE | VmFlags::SPECIAL | VmFlags::HUGETLB) {
            return Err(Errno::Inval);
        }
        // start < end <= task size, so neither rounding overflows.
        let hstart = (start + pmd - 1) & !(pmd - 1);
        let hend = end & !(pmd - 1);
        if let Some(file) = &vma.file {
            // thp_vma_suitable_order: a file's huge page maps at an address
            // congruent with its offset.
            let shmem = file.host_backing().is_none() && file.hugetlb.is_none();
            if !shmem || (vma.start >> PAGE_SHIFT).wrapping_sub(vma.pgoff) % (pmd / PAGE_SIZE) != 0 {
                return Err(Errno::Inval);
            }
            return self.madvise_collapse_shmem(vma, file, hstart, hend);
        }
        if vma.flags.intersects(VmFlags::SHARED | VmFlags::MAYSHARE) {
            return Err(Errno::Inval);
        }
        let mut res = Ok(());
        let mut block = hstart;
        while block < hend {
            if vma.flags.contains(VmFlags::WRITE) && self.block_collapsible(block) {
                populate::get_user_pages(self, vma, block, block + pmd, Access::Write).map_err(|_| Errno::NoMem)?;
            } else {
                res = Err(Errno::Inval);
            }
            block += pmd;
        }
        res
    }

    /// `MADV_COLLAPSE` of the whole 2 MiB blocks `[hstart, hend)` of a shmem
    /// VMA (a memfd, a [`crate::File::create`] file, shared anonymous
    /// memory) as Linux 6.12 does it: `hpage_collapse_scan_file` and
    /// `collapse_file` replace the file's 512 pages with one huge page
    /// (holes filled with zeros; a forced collapse ignores `shmem_enabled`
    /// but `deny`, which softmm does not have), then
    /// `collapse_pte_mapped_thp` maps it by a PMD. Per block, in order:
    ///
    /// * no page of the extent cached: `SCAN_TRUNCATED`, `EINVAL`, and the
    ///   walk stops;
    /// * the page cache collapses: every page of the extent within the
    ///   file's size is cached (`ENOMEM`, stopping, if frames run out);
    /// * a guard marker in the block: `SCAN_PTE_NON_PRESENT`, not mapped,
    ///   `EINVAL` at the end, the walk goes on;
    /// * a private copy mapped in the block (a private mapping written to):
    ///   the PMD is not installed, `EINVAL`, and the walk stops;
    /// * else the block is mapped, as the PMD maps it (an inaccessible VMA
    ///   maps nothing that could be seen).
    ///
    /// softmm has no huge page cache folio, so two things differ from Linux
    /// and are left so: past the end of the file nothing is cached or
    /// mapped (an access there raises `SIGBUS`, where Linux's huge page
    /// covers it), and a pinned page does not refuse the collapse (Linux:
    /// `SCAN_PAGE_COUNT`, `EAGAIN`). Linux 6.18 returns `EINVAL` for a
    /// block that had holes, having collapsed its page cache all the same.
    fn madvise_collapse_shmem(&self, vma: &Vma, file: &Arc<Inode>, hstart: u64, hend: u64) -> Result<()> {
        let pmd = PMD_SIZE;
        let size_pages = file.len().div_ceil(PAGE_SIZE);
        let mut res = Ok(());
        let mut block = hstart;
        while block < hend {
            let index = vma.pgoff + ((block - vma.start) >> PAGE_SHIFT);
            let extent = index..index + pmd / PAGE_SIZE;
            if !extent.clone().any(|i| file.is_cached(i)) {
                return Err(Errno::Inval);
            }
            {
                let _inval = file.invalidate_lock.read();
                for i in extent.clone().take_while(|&i| i < size_pages) {
                    let at = self.placement(vma, vma.start + ((i - vma.pgoff) << PAGE_SHIFT));
                    file.get_page_at(i, &at)?;
                }
            }
            match self.shmem_block_mapped(block, file, index) {
                BlockPtes::Guard => res = Err(Errno::Inval),
                BlockPtes::PrivateCopy => return Err(Errno::Inval),
                BlockPtes::Mappable if vma.flags.intersects(VmFlags::ACCESS_FLAGS) => {
                    let last = block + (size_pages.saturating_sub(index).min(pmd / PAGE_SIZE) << PAGE_SHIFT);
                    populate::get_user_pages(self, vma, block, last, Access::Read).map_err(|_| Errno::NoMem)?;
                }
                BlockPtes::Mappable => {}
            }
            block += pmd;
        }
        res
    }

    /// What `collapse_pte_mapped_thp` finds in the page table of the block
    /// at `block`, whose first page is the file's page `index`.
    fn shmem_block_mapped(&self, block: u64, file: &Inode, index: u64) -> BlockPtes {
        let guard = crossbeam_epoch::pin();
        let Some(leaf) = self.pgtables.leaf(block, &guard) else { return BlockPtes::Mappable };
        for (va, pte) in leaf.with_range(block, block + PMD_SIZE).iter() {
            if pte.is_guard() {
                return BlockPtes::Guard;
            }
            if pte.is_present() {
                let i = index + ((va - block) >> PAGE_SHIFT);
                if file.find_get_page(i).is_none_or(|p| p.pfn() != pte.pfn()) {
                    return BlockPtes::PrivateCopy;
                }
            }
        }
        BlockPtes::Mappable
    }

    /// True if the 2 MiB block at `block` holds an anonymous page and no
    /// guard marker (a missing page table holds neither).
    fn block_collapsible(&self, block: u64) -> bool {
        let guard = crossbeam_epoch::pin();
        let Some(leaf) = self.pgtables.leaf(block, &guard) else { return false };
        let mut page = false;
        for (_, pte) in leaf.with_range(block, block + PMD_SIZE).iter() {
            if pte.is_guard() {
                return false;
            }
            page |= pte.is_present() && pte.pfn() != self.phys.zero_pfn();
        }
        page
    }
}

/// What a shmem block's page table holds, for `MADV_COLLAPSE`.
enum BlockPtes {
    /// Nothing, or the file's own pages: the PMD can map the block.
    Mappable,
    /// A guard marker (`SCAN_PTE_NON_PRESENT`).
    Guard,
    /// A page that is not the file's (a private mapping's copy).
    PrivateCopy,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::mm::MmuGather;
    use crate::uapi::*;
    use crate::{Access, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, PAGE_SIZE};

    /// Why the per-VMA `MADV_DONTNEED` flushes before it drops the VMA's
    /// reference: a writer that finds the entries already zapped gathers
    /// nothing and does not flush, so a CPU's translation of the zapped
    /// page outlives the writer's `mmap(MAP_FIXED)` until the zapper's own
    /// flush, and reads the old page through the new mapping. Here the zap's
    /// flush is held back by hand, as it would be with the reference dropped
    /// first; with the reference held, the `mmap` waits for that flush.
    #[test]
    fn a_writer_finding_the_entries_zapped_does_not_flush_them() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let (rw, anon) = (PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
        let a = mm.mmap(0, 2 * PAGE_SIZE, rw, anon, None, 0).unwrap();
        // The second page keeps the page table, whose free would flush.
        mm.handle_fault(a + PAGE_SIZE, Access::Write).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(a, 1).unwrap();
        let mut tlb = MmuGather::default();
        mm.zap_range(a, a + PAGE_SIZE, &mut tlb, |_| true);
        let flushes = mm.stats().tlb.flushes;
        assert_eq!(mm.mmap(a, PAGE_SIZE, rw, anon | MAP_FIXED, None, 0), Ok(a));
        assert_eq!(mm.stats().tlb.flushes, flushes, "the mmap flushed: nothing to show");
        assert_eq!(cpu.read_u8(a), Ok(1), "the old page, through the new mapping");
        tlb.finish(&mm);
        assert_eq!(cpu.read_u8(a), Ok(0), "the new mapping, once the zap's flush is done");
        drop((cpu, mm));
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    }
}
