//! hugetlb: 2 MiB pages from a pool set aside when the arena is made (seed 000,
//! Mike Kravetz's "hugetlb: Change huge pmd sharing synchronization again").
//!
//! - `pool.rs`: the pool itself (Linux's `struct hstate` for the one 2 MiB
//!   size: per-node free lists, `nr_huge_pages`, `free_huge_pages`,
//!   `resv_huge_pages`, `surplus_huge_pages` under one `hugetlb_lock`) and
//!   the counts `/proc/meminfo` shows, [`HugePageStats`].
//!
//! - `resv.rs`: reservations (Linux's `resv_map`): per file for shared
//!   mappings, per mapping for private ones.
//! - `rmap.rs`: a hugetlb file's reverse map by VMA (`i_mmap`'s interval
//!   tree), kept by the address spaces when their write sections end.
//! - `share.rs`: PMD sharing (`want_pmd_share`, `huge_pmd_share`,
//!   `hugetlb_split`, the read-locked zap) and its protocol; the unshare
//!   every change of a range starts with is the core's
//!   (`mm/pmd_unshare.rs`).
//! - `migrate.rs`: hugetlb page migration (`isolate_hugetlb`,
//!   `unmap_and_move_huge_page`): PMD-level migration entries, a target
//!   from the target node's pool, the page cache switched for files.
//! - `cow.rs`: the owner's copy-on-write with the pool empty
//!   (`unmap_ref_private`: the children lose the page).
//! - `gup.rs`: pins of hugetlb pages (counted on the head frame, one per
//!   4 KiB subpage) and their unshare.
//! - `vm_ops.rs`: the hooks through which the core maps, splits, closes,
//!   zaps and copies at fork hugetlb VMAs (`hugetlb_vm_ops`,
//!   `hugetlbfs_file_mmap`, `copy_hugetlb_page_range`).
//! - `lock.rs`: the locks of the seed's schemes (the file's `i_mmap` lock,
//!   the fault mutex table, the per-address-space hugetlb VMA lock) and
//!   their counters, [`HugetlbLockStats`].
//!
//! The faults that map these pages are `crate::fault`'s (`fault/hugetlb.rs`).
//!
//! The locking schemes and what is left are described in
//! `docs/architecture.md`, "hugetlb".

pub(crate) mod cow;
pub(crate) mod gup;
pub(crate) mod lock;
#[cfg(all(test, loom))]
mod loom_tests;
pub(crate) mod migrate;
pub(crate) mod pool;
pub(crate) mod resv;
pub(crate) mod rmap;
pub(crate) mod share;
mod vm_ops;

pub use lock::HugetlbLockStats;
pub use pool::HugePageNodeStats;
pub use pool::HugePageStats;
pub(crate) use vm_ops::HUGETLB_VM_OPS;

/// The one huge page size softmm supports: 2 MiB, a PMD leaf on x86-64
/// (Linux's default hstate).
pub(crate) const HPAGE_SIZE: u64 = crate::pgtable::PMD_SIZE;
/// `log2(HPAGE_SIZE)`.
pub(crate) const HPAGE_SHIFT: u64 = 21;
/// 4 KiB frames per huge page (`pages_per_huge_page`).
pub(crate) const HPAGE_FRAMES: u64 = HPAGE_SIZE / crate::PAGE_SIZE;

/// `hugetlb_vm_op_close` for the part `[start, end)` of `vma` that is going
/// away: a private mapping's unused reservations there return to the pool.
pub(crate) fn close_vma_range(vma: &crate::vma::Vma, start: u64, end: u64) {
    if let Some(resv) = &vma.hugetlb_resv {
        resv.close(vma.huge_index(start), vma.huge_index(end));
    }
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
        Some(resv::HugetlbInode::default()),
    ))
}

/// `__unmap_hugepage_range`'s reservation restore, before `[start,
/// end)` of the hugetlb VMA `vma` of `mm` is zapped (`MADV_DONTNEED`,
/// truncate): in a private mapping that owns its reserve map, each
/// anonymous page mapped there gets its index's reservation back in the
/// map at once and in the pool when the page is freed (by this zap, or
/// later by the last child that still maps it), so a later fault there
/// is as sure to find a page as the first was. The caller holds
/// `mmap_lock` (no fork copies an entry meanwhile).
pub(crate) fn restore_reserves(mm: &crate::mm::AddressSpace, vma: &crate::vma::Vma, start: u64, end: u64) {
    use crate::phys::{PG_ANON, PG_FILE};
    use crate::sync::Ordering;
    let Some(resv) = &vma.hugetlb_resv else { return };
    let guard = crossbeam_epoch::pin();
    for leaf in mm.pgtables.leaves(start, end, &guard) {
        if leaf.entry_size() != HPAGE_SIZE {
            continue;
        }
        let ptl = leaf.lock();
        for (va, pte) in leaf.iter() {
            if !pte.has_frame() {
                continue;
            }
            let d = mm.phys.desc(pte.pfn());
            let flags = d.flags.load(Ordering::Relaxed);
            if flags & PG_ANON != 0 && flags & PG_FILE == 0 && resv.restore(vma.huge_index(va)) {
                d.flags.fetch_or(pool::PG_HUGETLB_RESTORE_RESERVE, Ordering::Relaxed);
            }
        }
        drop(ptl);
    }
}
