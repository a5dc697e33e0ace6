//! hugetlb: 2 MiB pages from a pool set aside when the arena is made (seed 000,
//! Mike Kravetz's "hugetlb: Change huge pmd sharing synchronization again").
//!
//! The state these mechanisms share with the layers below the core is
//! theirs: the pool, the locks and the reserve maps are
//! `phys/hugetlb.rs`'s (with the huge page size), a file's reverse map by
//! VMA `file/interval_tree.rs`'s and its inode state
//! `file/hugetlbfs.rs`'s.
//!
//! - `share.rs`: PMD sharing (`huge_pmd_share`) and its protocol; the
//!   unshare every change of a range starts with, and the read-locked zap,
//!   are the core's (`mm/pmd_unshare.rs`).
//! - `cow.rs`: the owner's copy-on-write with the pool empty
//!   (`unmap_ref_private`: the children lose the page).
//! - `vm_ops.rs`: the hooks through which the core maps, splits, closes,
//!   zaps and copies at fork hugetlb VMAs (`hugetlb_vm_ops`,
//!   `hugetlbfs_file_mmap`, `copy_hugetlb_page_range`).
//!
//! Its migration is `migrate/hugetlb.rs`'s, its pins `pin/hugetlb.rs`'s.
//! The faults that map these pages are `crate::fault`'s (`fault/hugetlb.rs`).
//!
//! The locking schemes and what is left are described in
//! `docs/architecture.md`, "hugetlb".

pub(crate) mod cow;
#[cfg(all(test, loom))]
mod loom_tests;
pub(crate) mod share;
mod vm_ops;

// The state below the core, by the paths the features above it use.
pub(crate) use crate::phys::hugetlb::{lock, pool, resv, HPAGE_FRAMES, HPAGE_SHIFT, HPAGE_SIZE};
pub(crate) use vm_ops::HUGETLB_VM_OPS;

/// `hugetlb_vm_op_close` for the part `[start, end)` of `vma` that is going
/// away: a private mapping's unused reservations there return to the pool.
pub(crate) fn close_vma_range(vma: &crate::vma::Vma, start: u64, end: u64) {
    if let Some(resv) = &vma.hugetlb_resv {
        resv.close(vma.huge_index(start), vma.huge_index(end));
    }
}

/// The hugetlb VMA lock of `vma` (Linux's `hugetlb_vma_lock_read`/`_write`
/// on a private owner's `resv_map->rw_sema`, [`resv::PrivateResv::vma_lock`]),
/// `None` for a VMA without a private reservation map. Faults and gup's
/// unshare hold it for read; a zap holds it for write through
/// [`crate::vma::VmaOps::zap_lock`], whose hugetlb answer is this one.
pub(crate) fn vma_lock(vma: &crate::vma::Vma) -> Option<&crate::sync::RwLock<()>> {
    vma.hugetlb_resv.as_ref().map(|r| &r.vma_lock)
}

/// The hugetlbfs pseudo-file behind an anonymous `MAP_HUGETLB` mapping of
/// `len` bytes (Linux's `hugetlb_file_setup(HUGETLB_ANON_FILE, ..)`, made
/// with `VM_NORESERVE`: the mapping reserves, not the file). Its name is what
/// `/proc/pid/maps` shows for it.
pub(crate) fn anon_file(phys: &std::sync::Arc<crate::PhysMem>, len: u64) -> std::sync::Arc<crate::file::Inode> {
    std::sync::Arc::new(crate::file::Inode::new(
        phys,
        "/anon_hugepage (deleted)",
        len,
        Some(crate::file::HugetlbInode::default()),
    ))
}

/// `__unmap_hugepage_range`'s reservation restore, before `[start,
/// end)` of the hugetlb VMA `vma`, mapped by `pgtables`, is zapped (`MADV_DONTNEED`,
/// truncate): in a private mapping that owns its reserve map, each
/// anonymous page mapped there gets its index's reservation back in the
/// map at once and in the pool when the page is freed (by this zap, or
/// later by the last child that still maps it), so a later fault there
/// is as sure to find a page as the first was. The caller holds
/// `mmap_lock` (no fork copies an entry meanwhile).
pub(crate) fn restore_reserves(
    pgtables: &crate::pgtable::PageTables,
    phys: &crate::phys::PhysMem,
    vma: &crate::vma::Vma,
    start: u64,
    end: u64,
) {
    use crate::phys::{PG_ANON, PG_FILE};
    use crate::sync::Ordering;
    let Some(resv) = &vma.hugetlb_resv else { return };
    let guard = crossbeam_epoch::pin();
    for leaf in pgtables.leaves(start, end, &guard) {
        if leaf.entry_size() != HPAGE_SIZE {
            continue;
        }
        let ptl = leaf.lock();
        for (va, pte) in leaf.iter() {
            if !pte.has_frame() {
                continue;
            }
            let d = phys.desc(pte.pfn());
            let flags = d.flags.load(Ordering::Relaxed);
            if flags & PG_ANON != 0 && flags & PG_FILE == 0 && resv.restore(vma.huge_index(va)) {
                d.flags.fetch_or(pool::PG_HUGETLB_RESTORE_RESERVE, Ordering::Relaxed);
            }
        }
        drop(ptl);
    }
}
