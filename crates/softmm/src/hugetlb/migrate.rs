//! hugetlb pages against page migration (`move_pages`, `mbind` with
//! `MPOL_MF_MOVE`, `migrate_pages`).
//!
//! softmm does not migrate hugetlb pages: Linux does (`isolate_hugetlb`, a
//! 2 MiB copy, a PMD migration entry, and `try_to_migrate_one` unsharing a
//! shared PMD table first), none of which exists here. So every hugetlb page
//! that Linux would isolate is reported as one whose isolation failed, as
//! Linux reports an unmovable page: `-EBUSY` in `move_pages`'s status, a
//! failure that `MPOL_MF_STRICT` turns into `EIO` in `mbind`. The checks
//! before isolation are Linux's, in its order, so that a page Linux leaves
//! alone (nothing mapped, on the node already, mapped more than once
//! without `MPOL_MF_MOVE_ALL`) is reported as Linux reports it.
//!
//! Nothing here writes an entry: a migration never reaches a PMD table,
//! shared or not, so no sharer can see a migration entry or a stale one.

use crate::mempolicy::MPOL_MF_MOVE_ALL;
use crate::migrate::Isolated;
use crate::mm::AddressSpace;
use crate::phys::PG_FILE;
use crate::sync::Ordering;
use crate::vma::Vma;

impl AddressSpace {
    /// `__add_folio_for_migration` for the hugetlb page mapped at `addr` of
    /// the hugetlb VMA `vma` (the caller holds `mmap_lock`, and has already
    /// answered for a page on the target node): `-ENOENT` for nothing
    /// mapped; `Ok(None)` (left where it is: `-EACCES` in `move_pages`, not
    /// a failure in `mbind`) for a page mapped more than once without
    /// `MPOL_MF_MOVE_ALL` (`folio_likely_mapped_shared`: one PMD entry maps
    /// it per page table, so sharers through one shared table count once);
    /// `-EBUSY` (`isolate_hugetlb` failed) for every other page. Never
    /// isolates.
    pub(crate) fn hugetlb_isolate(&self, vma: &Vma, addr: u64, flags: u32) -> Result<Option<Isolated<'_>>, i32> {
        let guard = crossbeam_epoch::pin();
        let leaf = self.pgtables.leaf(addr, &guard).ok_or(-libc::ENOENT)?;
        let ptl = leaf.lock();
        let pte = ptl.get(addr);
        if !pte.has_frame() {
            return Err(-libc::ENOENT);
        }
        // The entry holds the head frame; its counts are the huge page's.
        let d = self.phys.desc(pte.pfn());
        let cached = vma.file.is_some() && d.flags.load(Ordering::Relaxed) & PG_FILE != 0;
        let own = 1 + u64::from(cached);
        let mapped_shared =
            u64::from(d.refcount.load(Ordering::Relaxed)) > own + u64::from(d.pincount.load(Ordering::Relaxed));
        if mapped_shared && flags & MPOL_MF_MOVE_ALL == 0 {
            return Ok(None);
        }
        Err(-libc::EBUSY)
    }

    /// `queue_folios_hugetlb`'s extra rule for `mbind` and `migrate_pages`:
    /// without `MPOL_MF_MOVE_ALL`, a hugetlb page mapped through a shared
    /// PMD table (`hugetlb_pmd_shared`) is left where it is, and that is
    /// not a failure.
    pub(crate) fn hugetlb_queue_skips(&self, addr: u64, flags: u32) -> bool {
        flags & MPOL_MF_MOVE_ALL == 0 && self.pgtables.pmd_is_shared(addr, &crossbeam_epoch::pin())
    }
}
