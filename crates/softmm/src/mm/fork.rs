//! `fork`: a child address space sharing private memory copy-on-write.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::Result;
use crate::pgtable::{self, mk_pte, pte_pfn, PTE_PRESENT, PTE_PROTNONE, PTE_WRITE};
use crate::phys::{PG_ANON, PG_DIRTY};
use crate::vma::flags::*;
use crate::vma::{AnonVma, Vma};
use crate::{Errno, PAGE_SIZE};

use super::{AddressSpace, MmState, MmuGather};

impl AddressSpace {
    /// `fork()`'s `dup_mmap`: a child with the same mappings. Private pages
    /// are shared copy-on-write (write-protected in both; the parent's TLBs
    /// are shot down), shared mappings stay shared, `MADV_DONTFORK` VMAs are
    /// left out and `MADV_WIPEONFORK` VMAs are empty in the child. Pinned
    /// pages are copied at once, never shared. `ENOMEM` if frames run out.
    pub fn fork(&self) -> Result<Arc<AddressSpace>> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let child = AddressSpace::new(&self.phys, self.config.clone())?;
        let mut tlb = MmuGather::default();
        let mut st = self.write_lock();
        let res = self.dup_mmap(&mut st, &child, &mut tlb);
        // Write-protecting the parent's entries narrowed its translations.
        // Flush before any fault can run again on those VMAs: a COW copy made
        // while a CPU still writes through its old writable entry would lose
        // that write (the Linux 6.4 fork corruption).
        tlb.finish(self);
        drop(st);
        res.map(|()| child)
    }

    fn dup_mmap(&self, st: &mut MmState, child: &Arc<AddressSpace>, tlb: &mut MmuGather) -> Result<()> {
        // Keep lock-free faults off every VMA whose entries we write-protect,
        // until the flush above: replace each by an identical copy, which
        // detaches (and, for per-VMA readers, drains) the old one.
        let cow: Vec<Arc<Vma>> = st
            .vmas
            .iter()
            .filter(|v| v.flags & (VM_DONTCOPY | VM_WIPEONFORK | VM_MAYSHARE) == 0 && v.anon_vma.get().is_some())
            .cloned()
            .collect();
        for v in cow {
            st.vmas.replace(v.start, v.rebound(v.start, v.end, v.pgoff));
        }
        let mut cst = child.write_lock();
        cst.start_brk = st.start_brk;
        cst.brk = st.brk;
        for v in st.vmas.iter() {
            if v.flags & VM_DONTCOPY != 0 {
                continue;
            }
            if v.flags & VM_ACCOUNT != 0 {
                // dup_mmap charges the child's copy; the child's exit returns it.
                self.phys.vm_enough_memory(v.pages(), || super::commit::total_vm(&st.vmas))?;
            }
            let wipe = v.flags & VM_WIPEONFORK != 0;
            let anon = match v.anon_vma.get() {
                Some(_) if !wipe => Some(Arc::new(AnonVma { id: self.phys.next_id(), forked: true })),
                _ => None,
            };
            // dup_mmap: memory locks are not inherited (VM_LOCKED_MASK).
            let flags = v.flags & !VM_LOCKED;
            let cv = Vma::new(&self.phys, v.start, v.end, flags, v.pgoff, v.file.clone(), anon, v.shared_anon);
            if let Some(f) = &v.file {
                child.link_file(f);
            }
            cst.vmas.insert(cv);
            // Like Linux's vma_needs_copy: only VMAs with anonymous pages need
            // their entries copied; file pages are faulted back in.
            if !wipe && v.anon_vma.get().is_some() {
                child.copy_page_range(self, v, tlb)?;
            }
        }
        Ok(())
    }

    /// Copies the entries of `vma` from `parent` into `self` (the child).
    fn copy_page_range(&self, parent: &AddressSpace, vma: &Vma, tlb: &mut MmuGather) -> Result<()> {
        let guard = crossbeam_epoch::pin();
        let phys = &self.phys;
        let private = vma.flags & VM_MAYSHARE == 0;
        let mut err = Ok(());
        parent.pgtables.for_each_leaf(vma.start, vma.end, &guard, |va, t| {
            if err.is_err() {
                return;
            }
            let stop = vma.end.min((va & !(pgtable::PMD_SIZE - 1)) + pgtable::PMD_SIZE);
            let ct = self.pgtables.leaf_alloc(va, phys, &guard);
            let _ptl = t.lock();
            let _cptl = ct.lock();
            let mut a = va;
            while a < stop {
                let e = t.entry(pgtable::index(a, 0));
                let pte = e.load(Ordering::Relaxed);
                if pgtable::pte_has_frame(pte) {
                    let pfn = pte_pfn(pte);
                    let d = phys.desc(pfn);
                    let mut cpte = pte;
                    if private && pfn != phys.zero_pfn() && d.pincount.load(Ordering::Relaxed) > 0 {
                        // A pinned page must stay the parent's: the child gets a copy.
                        let Some(copy) = phys.alloc_copy(pfn, 0) else {
                            err = Err(Errno::NoMem);
                            return;
                        };
                        let cd = phys.desc(copy);
                        cd.flags.store(PG_ANON | PG_DIRTY, Ordering::Relaxed);
                        cd.index.store(d.index.load(Ordering::Relaxed), Ordering::Relaxed);
                        cd.mapcount.store(1, Ordering::Relaxed);
                        cpte = mk_pte(copy, pte & !pgtable::PTE_PFN_MASK & !pgtable::PTE_USER);
                    } else {
                        phys.get(pfn);
                        self.map_frame(pfn);
                        if private && pte & PTE_WRITE != 0 {
                            e.store(pte & !PTE_WRITE, Ordering::Release);
                            tlb.need_flush = true;
                            cpte &= !PTE_WRITE;
                        }
                    }
                    debug_assert!(cpte & (PTE_PRESENT | PTE_PROTNONE) != 0);
                    ct.entry(pgtable::index(a, 0)).store(cpte, Ordering::Release);
                } else if pgtable::pte_is_guard(pte) {
                    // copy_nonpresent_pte: guard markers go to the child.
                    ct.entry(pgtable::index(a, 0)).store(pte, Ordering::Release);
                }
                a += PAGE_SIZE;
            }
        });
        err
    }
}
