//! Fork's copy of a VMA's entries (Linux's `copy_page_range` in
//! `mm/memory.c`), the page-table walk every backing shares; a backing
//! differs only in how it copies a pinned page, which its
//! [`crate::vma::VmaOps::copy_pinned`] hook does.

use crate::sync::Ordering;

use crate::error::{Errno, Result};
use crate::pgtable::Pte;
use crate::phys::{FrameRef, Pfn, PG_ANON, PG_ANON_EXCLUSIVE, PG_DIRTY};
use crate::rmap;
use crate::vma::{VmFlags, Vma};

use crate::mm::{AddressSpace, MmuGather};

/// Copies the entries of `vma` from `src` (the parent) into `dst` (the
/// child), Linux's `copy_page_range`: private pages become read-only in
/// both (COW) and anonymous ones lose their exclusive mark; pinned
/// anonymous pages are copied into the child at once and stay the
/// parent's, writable (`copy_present_pte` since 5.19:
/// `folio_needs_cow_for_dma`, the CVE-2020-29374 fix); guard markers are
/// copied as they are. A 2 MiB leaf goes to a PMD leaf of the child.
///
/// `copy_pinned(va, pfn)` is the backing's copy of the pinned page `pfn`
/// mapped at `va`: a new page with its contents, or the errno that fails
/// the fork. On an error the entries copied so far stay (the child is torn
/// down by its caller); write-protected parent entries are in `tlb`'s
/// flush. The caller holds both `mmap_lock`s for write, the parent's
/// `write_protect_seq` odd.
pub(super) fn copy_page_range<'p>(
    dst: &AddressSpace,
    src: &'p AddressSpace,
    vma: &Vma,
    tlb: &mut MmuGather,
    copy_pinned: &dyn Fn(u64, Pfn) -> Result<FrameRef<'p>>,
) -> Result<()> {
    let guard = crossbeam_epoch::pin();
    let phys = &src.phys;
    let private = !vma.flags.contains(VmFlags::MAYSHARE);
    // MMF_HAS_PINNED: pin counts matter only once something was pinned.
    let has_pinned = src.pins.has_pinned();
    let mut err = Ok(());
    for sleaf in src.pgtables.leaves(vma.start, vma.end, &guard) {
        // The parent's lock first, as everywhere (the child is not
        // reachable by anyone else yet, so its lock is never contended).
        let mut sptl = sleaf.lock();
        let Some(dleaf) = dst.pgtables.leaf_alloc_sized(sleaf.start(), sleaf.entry_size(), &guard) else {
            return Err(Errno::NoMem);
        };
        let mut dptl = dleaf.with_range(sleaf.start(), sleaf.end()).lock();
        sptl.update(|va, pte| {
            if err.is_err() {
                return None;
            }
            if pte.is_guard() {
                // copy_nonpresent_pte: guard markers go to the child.
                dptl.set(va, pte);
                return None;
            }
            if pte.is_migration() {
                // copy_nonpresent_pte: the child gets the entry too (the
                // migrator's remap finds it: the child joined the anon
                // family); a writable or exclusive one in a COW mapping
                // becomes readable and shared in both, as the page is
                // shared now.
                if private && (pte.has(Pte::WRITE) || pte.is_exclusive_migration()) {
                    dptl.set(va, pte.shared_migration());
                    return Some(pte.shared_migration());
                }
                dptl.set(va, pte);
                return None;
            }
            if !pte.has_frame() {
                return None;
            }
            let d = phys.desc(pte.pfn());
            let anon = private && pte.pfn() != phys.zero_pfn() && d.flags.load(Ordering::Relaxed) & PG_ANON != 0;
            // Ordered after write_protect_seq's odd value by the fence in
            // `fork`: a gup-fast pin not seen here sees the count move.
            if anon && has_pinned && d.pincount.load(Ordering::Relaxed) > 0 {
                // folio_needs_cow_for_dma: the pinned page stays the
                // parent's, writable; the child gets a copy.
                let copy = match copy_pinned(va, pte.pfn()) {
                    Ok(c) => c,
                    Err(e) => {
                        err = Err(e);
                        return None;
                    }
                };
                let cd = copy.desc();
                cd.flags.store(PG_ANON | PG_DIRTY | PG_ANON_EXCLUSIVE, Ordering::Relaxed);
                cd.index.store(d.index.load(Ordering::Relaxed), Ordering::Relaxed);
                let cpte = pte.with_pfn(copy.pfn());
                rmap::map_pte(&mut dptl, va, copy, cpte);
                return None;
            }
            if anon {
                // folio_try_dup_anon_rmap: shared now, so not pinnable
                // until a write or an unshare makes it exclusive again.
                d.flags.fetch_and(!PG_ANON_EXCLUSIVE, Ordering::Relaxed);
            }
            let frame = rmap::dup_page(phys, pte);
            if private && pte.has(Pte::WRITE) {
                tlb.need_flush = true;
                rmap::map_pte(&mut dptl, va, frame, pte.clear(Pte::WRITE));
                return Some(pte.clear(Pte::WRITE));
            }
            rmap::map_pte(&mut dptl, va, frame, pte);
            None
        });
        err?;
    }
    Ok(())
}
