//! Unsharing the PMD tables this address space shares with others
//! (Linux's `huge_pmd_unshare` + `huge_pmd_unshare_flush`): every path of
//! the core that changes or removes the entries of a range unshares it
//! first. Only hugetlb VMAs link shared tables (`hugetlb/share.rs`,
//! `huge_pmd_share`, which documents the protocol), but a shared table is
//! a property of the address space's page tables, which the core changes,
//! so the unshare is the core's: it costs one load in an address space
//! that never shared a table. So is the zap under `mmap_lock` for read
//! that keeps a shareable window unshared ([`AddressSpace::zap_vma_range`]),
//! with the lock the VMA's backing names.

use crossbeam_epoch::Guard;

use crate::pgtable::{PmdUnshare, PUD_SIZE};
use crate::phys::hugetlb::lock::Kind;
use crate::sync::Ordering;
use crate::vma::{want_pmd_share, Vma, ZapDetails};

use super::{AddressSpace, MmuGather};

impl AddressSpace {
    /// Unshares every PUD window overlapping `[start, end)` whose PMD table
    /// this address space shares, flushing its TLB before the lock is
    /// released (the protocol: `hugetlb/share.rs`). Called by every path that changes the
    /// entries of a range, with `mmap_lock` held, before it changes them;
    /// with `mmap_lock` held only for read, a shareable window also needs
    /// the locks of [`Self::zap_vma_range`] across the change, or a
    /// link made after this check would be walked through.
    /// Costs one load in an address space that never shared a table.
    pub(crate) fn hugetlb_unshare_range(&self, start: u64, end: u64) {
        if start >= end || !self.pgtables.ever_shared() {
            return;
        }
        let guard = crossbeam_epoch::pin();
        let mut w = start & !(PUD_SIZE - 1);
        while w < end {
            if self.pgtables.has_pmd_table(w, &guard) {
                self.huge_pmd_unshare(w, &guard);
            }
            match w.checked_add(PUD_SIZE) {
                Some(next) => w = next,
                None => break,
            }
        }
    }

    /// `huge_pmd_unshare` of the window at `w` and its flush, under the
    /// hugetlb VMA lock and the file's `i_mmap` lock for write; with a table
    /// that is not shared (any more), only the wait for an unsharer's flush.
    /// A window whose table was never shared has no unsharer to wait for.
    fn huge_pmd_unshare(&self, w: u64, guard: &Guard) {
        let Some(i_mmap) = self.hugetlb_lock.shared_i_mmap(w) else { return };
        let locks = &self.phys.hugetlb.locks;
        let _vma_lock = locks.write(Kind::VmaLockWrite, self.hugetlb_lock.stripe(w));
        let _i_mmap = locks.write(Kind::IMmapWrite, &i_mmap);
        self.huge_pmd_unshare_locked(w, guard);
    }

    /// Linux's `unmap_single_vma` (for hugetlb between `__hugetlb_zap_begin`
    /// and `__hugetlb_zap_end`): clears the entries of `[start, end)`, a
    /// range of `vma`, for which `details.filter` holds, as
    /// [`Self::zap_range`], for the callers that hold `mmap_lock` only for
    /// read (`MADV_DONTNEED`, truncate, hole punch). The backing goes first
    /// ([`crate::vma::VmaOps::zap_begin`]: hugetlb restores a private
    /// owner's reservations). If the backing names a lock that orders the
    /// sharing of the VMA's tables ([`crate::vma::VmaOps::pmd_share_lock`],
    /// hugetlb's `i_mmap`), each PUD window of the range that `vma` covers
    /// whole, where a PMD table may be shared, is unshared and zapped under
    /// this address space's hugetlb VMA lock and that lock, both for write,
    /// as an unshare. Under them no fault
    /// of any address space links the window's table (`huge_pmd_share`
    /// holds `i_mmap` for read), so the zap never clears an entry through a
    /// table another address space links: without them, another address
    /// space could link a table never shared while this zap clears it and
    /// flushes only this address space, or this address space's own fault
    /// could link another's table after the unshare check, and the walk
    /// would clear that one's entries. Other windows, and every other VMA,
    /// zap as [`AddressSpace::zap_range`] (no lock: no sharing can reach
    /// them), so a zap of 4 KiB pages never meets these locks.
    ///
    /// The gathered frames are flushed and freed by the caller after the
    /// locks go, as before: an entry cleared here maps nothing once the
    /// locks are dropped, so a later link sees none, and its frame is held
    /// by the gather until this address space's flush. A backing with a
    /// zap lock ([`crate::vma::VmaOps::zap_lock`], a private hugetlb
    /// owner's) has its zap run under that lock for write and `tlb`
    /// flushed and freed before the lock goes, as Linux's
    /// `zap_page_range_single` calls `tlb_finish_mmu` before
    /// `hugetlb_zap_end`: a fault of the range waits until the pages whose
    /// reservations the zap restored are back in the pool.
    pub(crate) fn zap_vma_range(&self, vma: &Vma, start: u64, end: u64, tlb: &mut MmuGather, details: ZapDetails<'_>) {
        let Some(lock) = vma.ops.zap_lock(vma) else {
            return self.zap_vma_range_unlocked(vma, start, end, tlb, details);
        };
        let _zap = lock.write();
        self.zap_vma_range_unlocked(vma, start, end, tlb, details);
        std::mem::take(tlb).finish(self);
    }

    /// [`Self::zap_vma_range`] without the backing's zap lock.
    fn zap_vma_range_unlocked(&self, vma: &Vma, start: u64, end: u64, tlb: &mut MmuGather, details: ZapDetails<'_>) {
        vma.ops.zap_begin(&self.pgtables, &self.phys, vma, start, end, details.even_cows);
        let filter = details.filter;
        let Some(i_mmap) = vma.ops.pmd_share_lock(vma) else { return self.zap_range(start, end, tlb, filter) };
        let mut from = start;
        while from < end {
            let w = from & !(PUD_SIZE - 1);
            let to = w.checked_add(PUD_SIZE).map_or(end, |e| e.min(end));
            if want_pmd_share(vma, w) {
                let locks = &self.phys.hugetlb.locks;
                let _vma_lock = locks.write(Kind::VmaLockWrite, self.hugetlb_lock.stripe(w));
                let _i_mmap = locks.write(Kind::IMmapWrite, i_mmap);
                let guard = crossbeam_epoch::pin();
                if self.pgtables.has_pmd_table(w, &guard) {
                    self.huge_pmd_unshare_locked(w, &guard);
                }
                drop(guard);
                self.zap_walk(from, to, tlb, &mut *filter, false);
            } else {
                self.zap_range(from, to, tlb, &mut *filter);
            }
            from = to;
        }
    }

    /// The unshare of [`Self::huge_pmd_unshare`], for a caller holding this
    /// address space's hugetlb VMA lock for the window at `w` and the
    /// file's `i_mmap` lock, both for write: nothing if the table is not
    /// shared; else the link goes and this address space's TLB is flushed
    /// before the caller drops `i_mmap`. Page migration calls it too
    /// (`migrate/hugetlb.rs`, Linux's `try_to_migrate_one`).
    pub(crate) fn huge_pmd_unshare_locked(&self, w: u64, guard: &Guard) {
        let freed = match self.pgtables.pmd_unshare(w) {
            PmdUnshare::NotShared => return,
            PmdUnshare::Unshared => None,
            PmdUnshare::Last(table) => Some(table),
        };
        self.phys.hugetlb.pmd_unshares.fetch_add(1, Ordering::Relaxed);
        // Before `i_mmap` goes: no CPU of ours may keep a translation
        // through the table once another user may change it.
        self.flush_tlb();
        if let Some(table) = freed {
            table.free_after_grace_period(&self.phys, guard);
        }
    }
}
