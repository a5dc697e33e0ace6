//! Unsharing the PMD tables this address space shares with others
//! (Linux's `huge_pmd_unshare` + `huge_pmd_unshare_flush`): every path of
//! the core that changes or removes the entries of a range unshares it
//! first. Only hugetlb VMAs link shared tables (`hugetlb/share.rs`,
//! `huge_pmd_share`, which documents the protocol), but a shared table is
//! a property of the address space's page tables, which the core changes,
//! so the unshare is the core's: it costs one load in an address space
//! that never shared a table.

use crossbeam_epoch::Guard;

use crate::pgtable::{PmdUnshare, PUD_SIZE};
use crate::phys::hugetlb::lock::Kind;
use crate::sync::Ordering;

use super::AddressSpace;

impl AddressSpace {
    /// Unshares every PUD window overlapping `[start, end)` whose PMD table
    /// this address space shares, flushing its TLB before the lock is
    /// released (the protocol: `hugetlb/share.rs`). Called by every path that changes the
    /// entries of a range, with `mmap_lock` held, before it changes them;
    /// with `mmap_lock` held only for read, a shareable window also needs
    /// the locks of [`Self::hugetlb_zap_range`] across the change, or a
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
