//! hugetlb pages under `pin_user_pages` / `get_user_pages` (Linux's
//! `follow_huge_pmd` and `__get_user_pages`'s `page_mask` step, and
//! `hugetlb_wp` with `FAULT_FLAG_UNSHARE`, on a present or a `PROT_NONE`
//! entry).
//!
//! A pin of a 4 KiB subpage of a 2 MiB page counts on the huge page, as on a
//! large folio: one reference and one `pincount` on the head frame per
//! subpage asked for (`try_grab_folio(folio, refs, FOLL_PIN)`), and the
//! subpage's own frame is the one handed out. So a page pinned through a
//! shared PMD table is pinned for every sharer, and unsharing the table
//! changes nothing of the pin.

use crate::error::{Errno, Result};
use crate::fault::hugetlb::{alloc_private, copy_huge, huge_entry, lock_mapped_page, restore_reserve_on_error};
use crate::migrate::wait_on_page_locked;
use crate::mm::AddressSpace;
use crate::pgtable::{Leaf, Pte};
use crate::phys::{Pfn, PG_ANON, PG_ANON_EXCLUSIVE, PG_FILE};
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SHIFT;

use crate::hugetlb::HPAGE_SIZE;

/// The frame `gup` hands out for `va` in the huge page `head` maps.
pub(crate) fn subpage(head: Pfn, va: u64) -> Pfn {
    head + ((va & (HPAGE_SIZE - 1)) >> PAGE_SHIFT)
}

/// `FAULT_FLAG_UNSHARE` on the read-only hugetlb page mapped at `va` of
/// the private hugetlb VMA `vma` (`hugetlb_wp` with `unshare`), for a
/// pin that needs an exclusive anonymous page: an anonymous page only
/// this entry maps is marked exclusive as it is; any other (an
/// anonymous page shared since `fork`, a page-cache page) is replaced by
/// an exclusive anonymous copy, mapped read-only as before; the owner of
/// the mapping's reservations with no page for the copy takes the page
/// back from its children instead (`unmap_ref_private`, as a write
/// does). The caller holds `mmap_lock` and looks again whatever
/// happened. `EFAULT` when no huge page can be had for the copy (the
/// fault's `SIGBUS`), `ENOMEM` for no anon_vma.
pub(crate) fn hugetlb_unshare(mm: &AddressSpace, vma: &Vma, va: u64) -> Result<()> {
    let haddr = va & !(HPAGE_SIZE - 1);
    let file = vma.file.as_ref().expect("a hugetlb VMA has its file");
    // As the fault: truncate and punch excluded, one instantiation at a time.
    let _inval = file.invalidate_lock.read();
    let hugetlb = &mm.phys.hugetlb;
    let _fault_mutex = hugetlb.fault_mutexes.lock(&hugetlb.locks, file.id(), vma.huge_index(haddr));
    let _resv_lock = crate::hugetlb::vma_lock(vma).map(|l| l.read());
    let guard = crossbeam_epoch::pin();
    let Some(leaf) = mm.pgtables.leaf(haddr, &guard).filter(|l| l.entry_size() == HPAGE_SIZE) else {
        return Ok(());
    };
    // Everything decided on the page, and the reference for the copy,
    // under the PMD lock: an entry read without it may name a page that
    // migration or a zap freed since.
    let ptl = leaf.lock();
    let pte = ptl.get(haddr);
    // A `PROT_NONE` entry holds its page as a present one does
    // (`pmd_present` is true for it on x86): unshared the same way.
    if !pte.has_frame() {
        return Ok(());
    }
    let d = mm.phys.desc(pte.pfn());
    // As `hugetlb_wp`: the page lock keeps a migration, which hides the
    // page's other mappings in migration entries, from under the map
    // count; held, wait for it with every lock but `mmap_lock` dropped.
    let Some(old_page) = lock_mapped_page(&ptl, haddr, &mm.phys) else {
        drop(ptl);
        drop((_resv_lock, _fault_mutex, _inval));
        wait_on_page_locked(&mm.phys, pte.pfn(), crate::migrate::hugetlb::WAIT_SPINS);
        return Ok(());
    };
    let flags = d.flags.load(Ordering::Relaxed);
    let anon = flags & PG_ANON != 0 && flags & PG_FILE == 0;
    if anon && flags & PG_ANON_EXCLUSIVE != 0 {
        return Ok(());
    }
    // As `hugetlb_wp`'s reuse: an anonymous page this entry alone maps
    // is this process's, whatever else references it; under the PMD
    // lock no new mapping of it appears.
    if anon && d.mapcount() == 1 {
        d.flags.fetch_or(PG_ANON_EXCLUSIVE, Ordering::Relaxed);
        return Ok(());
    }
    if pte.has(Pte::PRESENT | Pte::WRITE) {
        // A writable entry maps an exclusive anonymous page: the caller
        // faults or looks again.
        return Ok(());
    }
    drop(ptl);
    #[cfg(loom)]
    let old_page = crate::fault::hugetlb::broken_late_ref(old_page);
    if !mm.anon_vma_prepare_locked(vma) {
        return Err(Errno::NoMem);
    }
    let new = match alloc_private(mm, vma, haddr, va) {
        Ok(page) => page,
        // As `hugetlb_wp` for an unshare too (`outside_reserve` does not
        // look at `FAULT_FLAG_UNSHARE`): the owner of the reservations
        // takes its anonymous page back from the children
        // (`unmap_ref_private`) with none of this call's locks but
        // `mmap_lock` held, and the caller looks again and reuses it.
        Err(_) if vma.hugetlb_resv.is_some() && anon => {
            let pfn = pte.pfn();
            drop(old_page);
            drop((_resv_lock, _fault_mutex, _inval, guard));
            // Whatever it unmapped: a child that dropped the page
            // meanwhile left it mapped once (Linux's retry_avoidcopy).
            crate::hugetlb::cow::unmap_ref_private(mm, vma, haddr, pfn);
            return Ok(());
        }
        Err(_) => return Err(Errno::Fault),
    };
    copy_huge(mm, old_page.page(), &new);
    replace_huge(mm, leaf, haddr, pte, new, vma);
    Ok(())
}

/// Replaces the entry `pte` at `haddr` (if it is still there) by a
/// read-only mapping of `new` (a `PROT_NONE` one if `pte` was): clear,
/// flush, install, so that no CPU reads the old page once the pin's
/// device writes the new one.
fn replace_huge(mm: &AddressSpace, leaf: Leaf<'_>, haddr: u64, pte: Pte, new: crate::phys::FrameRef<'_>, vma: &Vma) {
    let mut ptl = leaf.lock();
    if ptl.get(haddr) != pte {
        restore_reserve_on_error(vma, haddr, &new);
        return;
    }
    let old = crate::rmap::unmap_page(&mut ptl, haddr, &mm.phys).expect("a present entry holds a page");
    let flushed = mm.flush_tlb();
    let nx = if vma.flags.contains(VmFlags::EXEC) { 0 } else { Pte::NX };
    let entry = huge_entry(new, Pte::ACCESSED | nx);
    ptl.set(haddr, if pte.is_present() { entry } else { entry.protnone() });
    drop(ptl);
    old.release(flushed);
    mm.count_hugetlb_fault();
}
