//! The owner's copy-on-write when the pool is empty (Linux's
//! `unmap_ref_private`).
//!
//! A private hugetlb mapping reserves a page per index for its owner (the
//! process that mapped it, `HPAGE_RESV_OWNER`), not for the children that
//! share its pages after `fork`. When the owner writes to such a shared
//! page and no page is left for the copy, Linux does not fail the owner: it
//! unmaps the page from the children, marks their VMAs
//! (`HPAGE_RESV_UNMAPPED`), and reuses the page, now its own; a child that
//! later faults there (or anywhere in that VMA) gets `SIGBUS`, which is
//! what "the children may be killed" in the hugetlb documentation means.

use crate::mm::{AddressSpace, MmuGather};
use crate::phys::Pfn;
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SHIFT;

use super::HPAGE_SIZE;

impl AddressSpace {
    /// `unmap_ref_private`: unmaps the huge page `head`, which the owner's
    /// VMA `vma` maps at `haddr`, from every other private mapping of the
    /// same file page that holds no reservations of its own (a child since
    /// `fork`), marking each VMA it unmapped from. True if it unmapped it
    /// anywhere (the caller's copy-on-write then retries and finds the page
    /// its own). The caller holds this address space's `mmap_lock` and the
    /// file's fault mutex.
    ///
    /// Each other address space is locked only if its `mmap_lock` is free
    /// for read (it may be waiting for our fault mutex while holding it), so
    /// a busy one keeps the page and the owner's fault fails as before
    /// (`SIGBUS`); Linux, holding the file's `i_mmap` lock instead, always
    /// gets through.
    pub(crate) fn unmap_ref_private(&self, vma: &Vma, haddr: u64, head: Pfn) -> bool {
        let Some(file) = vma.file.as_ref() else { return false };
        let Some(inode) = file.hugetlb.as_ref() else { return false };
        let pgoff = vma.pgoff_at(haddr);
        let mut unmapped = false;
        // The list is taken under `i_mmap` and walked without it: an address
        // space upgraded below may die in our hands, and its exit unlinks
        // its VMAs under `i_mmap` for write.
        let mappers = {
            let i_mmap = self.phys.hugetlb.locks.read(super::lock::Kind::IMmapRead, &inode.vmas.i_mmap);
            inode.vmas.covering(&i_mmap, pgoff)
        };
        for r in mappers {
            let Some(smm) = r.mm.upgrade() else { continue };
            let Ok(smm) = smm.as_any().downcast::<AddressSpace>() else { continue };
            if std::ptr::eq(&*smm, self) {
                continue;
            }
            let saddr = r.start + ((pgoff - r.pgoff) << PAGE_SHIFT);
            let Some(st) = smm.try_read_lock() else { continue };
            let Some(sv) = st.vmas.find(saddr) else { continue };
            // Shared mappings map the page cache, and another owner's
            // pages are its own; only reserve-less private mappings lose it.
            if sv.flags.contains(VmFlags::MAYSHARE)
                || sv.hugetlb_resv.is_some()
                || !sv.file.as_ref().is_some_and(|f| std::sync::Arc::ptr_eq(f, file))
            {
                continue;
            }
            let mut tlb = MmuGather::default();
            smm.zap_range(saddr, saddr + HPAGE_SIZE, &mut tlb, |pte| {
                let ours = pte.pfn() == head;
                if ours {
                    // Before the entry goes (its store is Release): a fault
                    // that finds it gone sees the mark.
                    sv.hugetlb_unmapped.store(true, Ordering::Relaxed);
                    unmapped = true;
                }
                ours
            });
            tlb.finish(&smm);
        }
        unmapped
    }
}
