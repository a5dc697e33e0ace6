//! hugetlb PMD sharing (Linux's `want_pmd_share`, `huge_pmd_share`): VMAs
//! that map the same 1 GiB of a hugetlb file, each covering the whole
//! PUD-aligned window, link one PMD table instead of one each, so a second
//! mapper's first fault in the window maps all 512 huge pages the first
//! mapper already faulted (seed 000). The VMAs may be in different address
//! spaces or in one (then one tree links the table at two PUD entries;
//! Linux skips only the faulting VMA itself).
//!
//! The table carries a share count of its own (`pt_share_count`, see
//! `pgtable`): a shared table counts once in the page-table accounting and
//! its last user frees it. `fork` copies nothing of shared hugetlb VMAs, so
//! a child's first fault in a window shares the parent's table.
//!
//! Sharing is always on, as in Linux (no switch: a `VM_MAYSHARE` mapping
//! of a whole PUD window shares whenever another one can be found). Every
//! path that changes entries unshares first, and so does a VMA split that
//! breaks a window; exit drops its link through the share count. Page
//! migration unshares the table in every sharer but the last, which alone
//! gets the migration entry (`migrate/hugetlb.rs`, Linux's
//! `try_to_migrate_one`), and a pin counts on the huge page, not on the
//! table (`pin/hugetlb.rs`).
//!
//! # Locks
//!
//! The file's `i_mmap` lock (`phys/hugetlb/lock.rs`), as Linux's: `huge_pmd_share`
//! holds it for read while it looks through the reverse map and links a
//! table (a fault under [`crate::HugetlbPolicy::IMmapRwsem`] already holds
//! it, across the whole fault); every unshare holds it for write, inside
//! this address space's hugetlb VMA lock (write), from the unlink to the end
//! of its TLB flush. As in Linux, `huge_pmd_share` takes no lock of the
//! address space it links from, whose `mmap_lock` may be held for write
//! (a fork, an `mmap` or `munmap` elsewhere in it) for as long as it
//! likes. The candidate VMA is found in that address space's published
//! VMA tree and held by its own read reference (tried, as a per-VMA fault
//! takes it: no writer can hold the try up), which keeps the source table
//! linked until the link is made: its owner unshares, zaps, moves or frees
//! it only after a write section detached the VMA (`detach` waits for the
//! reference; a detached VMA refuses it), under `i_mmap` for write (the
//! zaps under `mmap_lock` for read, migration), or at exit, when the
//! reverse map's weak reference no longer upgrades. The same holds for a
//! candidate of the faulting address space itself, whether the fault holds
//! `mmap_lock` for read or only its VMA's reference. A share records the
//! file's `i_mmap` lock for the window in both address spaces
//! (`HugetlbVmaLock::note_shared`), so that their unshares, which know the
//! window but not the VMA, find it. (Before, the share tried the other
//! address space's `mmap_lock` and skipped it when busy: seed 000's
//! faulters then met the forkers' locks held across their forks and
//! filled tables of their own, a fault per page where Linux takes one per
//! pass; `docs/architecture.md`, "hugetlb".)
//!
//! Unshare ([`AddressSpace::hugetlb_unshare_range`] in `mm/pmd_unshare.rs`, Linux's
//! `huge_pmd_unshare` + `huge_pmd_unshare_flush`): every path that changes
//! or removes the entries of a range (zap: munmap, `MADV_DONTNEED`,
//! truncate, hole punch, mremap's tails; `change_protection`: mprotect;
//! `move_ptes`: mremap) first unshares each PUD window of the range whose
//! PMD table is shared — the whole 1 GiB, as
//! `adjust_range_if_pmd_sharing_possible` widens it — and flushes this
//! address space's TLB before `i_mmap` is dropped (CVE-2021-4002). The PUD
//! entry is cleared under the shared table's own lock, which is what a
//! fault under [`crate::HugetlbPolicy::LockFree`] validates against. A VMA
//! split that breaks a window unshares it too (hugetlb's `VmaOps::split`,
//! Linux's `hugetlb_split`), whether or not the operation then
//! changes entries. A table left exclusive is changed only after its owner
//! took `i_mmap` for write too: that waits out the unsharer's flush, the
//! grace period for the unsharer's CPUs; its epoch-pinned walkers are done
//! by then (the flush waits for every access in progress), and a table
//! whose last link an unshare dropped is freed behind an epoch grace
//! period.
//!
//! Zaps under `mmap_lock` for read (`MADV_DONTNEED`, truncate, hole punch)
//! go through [`AddressSpace::zap_vma_range`] (Linux's
//! `__hugetlb_zap_begin`, with the lock hugetlb's `VmaOps::pmd_share_lock`
//! names): each window their VMA could share is unshared
//! and walked under the VMA lock and `i_mmap`, both for write, so that no
//! `huge_pmd_share` links the table between the unshare check and the
//! walk. Writers of `mmap_lock` need no more than the unshare: no other
//! address space links from them (`huge_pmd_share` only tries their
//! `mmap_lock`), their own faults in the VMAs they change wait, and their
//! own faults elsewhere link only from VMAs not detached (a VMA is detached
//! before its entries change).

use crossbeam_epoch::Guard;

use super::lock::Kind;
use crate::mm::AddressSpace;
use crate::sync::Ordering;
use crate::vma::{want_pmd_share, VmFlags, Vma};
use crate::PAGE_SHIFT;

pub(crate) use crate::pgtable::PUD_SIZE;

/// The flags `page_table_shareable` compares: all but `VM_LOCKED_MASK`.
fn share_flags(vma: &Vma) -> VmFlags {
    vma.flags - VmFlags::LOCKED
}

/// `huge_pmd_share`: before the fault at `addr` in the hugetlb VMA `vma`
/// allocates a PMD table, links the table of another VMA, of another
/// address space or of this one, that maps the same file page at the
/// same offset within its PUD, with equal flags, covering its whole
/// window too. True if it linked
/// one (counted in [`crate::HugePageStats::pmd_shares`]). The caller
/// holds `mmap_lock` for read or the VMA's read reference, the fault
/// mutex of the page, and, if `i_mmap` is `Some`, the file's `i_mmap`
/// lock for read (else this takes it). The address spaces it looked at
/// go into `reap`, for the caller to drop once it holds no lock (the
/// last reference's drop unlinks VMAs under `i_mmap`).
pub(crate) fn huge_pmd_share(
    mm: &AddressSpace,
    vma: &Vma,
    addr: u64,
    i_mmap: Option<&crate::sync::RwLockReadGuard<'_, ()>>,
    reap: &mut Vec<std::sync::Arc<dyn crate::file::Mapper>>,
    guard: &Guard,
) -> bool {
    let Some(inode) = vma.file.as_ref().and_then(|f| f.hugetlb.as_ref()) else { return false };
    if !want_pmd_share(vma, addr) || mm.pgtables.has_pmd_table(addr, guard) {
        return false;
    }
    #[cfg(loom)]
    if super::lock::broken::no_share() {
        return false;
    }
    let idx = ((addr - vma.start) >> PAGE_SHIFT) + vma.pgoff;
    let taken;
    let i_mmap = match i_mmap {
        Some(held) => held,
        None => {
            taken = mm.phys.hugetlb.locks.read(Kind::IMmapRead, &inode.vmas.i_mmap);
            &taken
        }
    };
    for svma in inode.vmas.covering(i_mmap, idx) {
        let saddr = svma.start + ((idx - svma.pgoff) << PAGE_SHIFT);
        // pmd_index(addr) == pmd_index(saddr): each entry of the table
        // then maps the same file page for both.
        if saddr % PUD_SIZE != addr % PUD_SIZE {
            continue;
        }
        let Some(smm) = svma.mm.upgrade() else { continue };
        // Kept until the caller has dropped every lock: ours may be the
        // last reference, and an address space that dies unlinks its
        // VMAs under `i_mmap` for write, which we hold for read.
        reap.push(smm.clone());
        let Some(smm) = AddressSpace::from_mapper(smm) else { continue };
        // Our own other VMA: Linux skips only `svma == vma` (the reverse
        // map names a VMA of ours by its start). The table is then linked
        // at two PUD entries of this tree.
        if std::ptr::eq(&*smm, mm) && svma.start == vma.start {
            continue;
        }
        // As Linux's, no lock of the other address space: its `mmap_lock`
        // may be held for write for as long as a fork (every fork instance
        // of seed 000 holds it most of the time), and a fault that skipped
        // it would fill a table of its own. The VMA as published, held by
        // its own read reference (only tried: no writer can hold that up),
        // keeps its table linked until we let go: every writer detaches the
        // VMAs it replaces or removes before it changes their entries or
        // frees their tables (a split's unshare too comes after the
        // detach), and the zaps that run without a detach (`MADV_DONTNEED`,
        // truncate, hole punch, migration) take `i_mmap` for write, which we
        // hold for read. Exit cannot come while `reap` holds the address
        // space. For this address space, the same holds whether the fault
        // holds `mmap_lock` for read or only its VMA's reference.
        let Some(s) = smm.vmas_rcu(guard).find(saddr) else { continue };
        #[cfg(loom)]
        if super::lock::broken::share_without_vma_ref() {
            if !std::ptr::eq(&**s, vma) && link_shared(mm, vma, addr, &smm, s, &svma, guard) {
                return true;
            }
            continue;
        }
        if std::ptr::eq(&**s, vma) || !s.lock.try_read() {
            continue;
        }
        let linked = link_shared(mm, vma, addr, &smm, s, &svma, guard);
        s.lock.read_unlock();
        if linked {
            return true;
        }
    }
    false
}

/// The end of `huge_pmd_share` for one candidate `svma` of the reverse
/// map, found as `s` in `smm` (this address space or another): if `s`
/// is still the VMA the reverse map names and `page_table_shareable`
/// holds, links its PMD table at `addr` and counts the share. The
/// caller holds what keeps `s` and its table in place (`s`'s read
/// reference) and the file's `i_mmap` lock for read, and checked that
/// `svma` maps the page at `addr` at the same offset within its PUD.
fn link_shared(
    mm: &AddressSpace,
    vma: &Vma,
    addr: u64,
    smm: &AddressSpace,
    s: &Vma,
    svma: &crate::file::interval_tree::RmapVma,
    guard: &Guard,
) -> bool {
    let Some(inode) = vma.file.as_ref().and_then(|f| f.hugetlb.as_ref()) else { return false };
    let idx = ((addr - vma.start) >> PAGE_SHIFT) + vma.pgoff;
    let saddr = svma.start + ((idx - svma.pgoff) << PAGE_SHIFT);
    let i_mmap = &inode.vmas.i_mmap;
    // The VMA as the reverse map names it (not one made since, whose
    // link is still to come), shareable, with the same flags.
    if s.start != svma.start
        || s.pgoff != svma.pgoff
        || !want_pmd_share(s, saddr)
        || !s.file.as_ref().is_some_and(|f| vma.file.as_ref().is_some_and(|g| std::sync::Arc::ptr_eq(f, g)))
        || share_flags(s) != share_flags(vma)
    {
        return false;
    }
    // Recorded before the link exists, so neither side's unshare can
    // find the table shared without its `i_mmap` lock (both windows
    // of this address space, when `smm` is this one).
    mm.hugetlb_lock.note_shared(addr & !(PUD_SIZE - 1), i_mmap);
    smm.hugetlb_lock.note_shared(saddr & !(PUD_SIZE - 1), i_mmap);
    if mm.pgtables.pmd_share_from(addr, &smm.pgtables, saddr, guard) {
        mm.phys.hugetlb.pmd_shares.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    false
}

#[cfg(all(test, not(loom)))]
mod tests;
