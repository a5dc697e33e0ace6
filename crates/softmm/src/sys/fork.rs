//! `fork`: a child address space sharing private memory copy-on-write.

use crate::sync::Ordering;
use std::sync::Arc;

use crate::error::Result;
use crate::vma::VmFlags;
use crate::vma::Vma;
use crate::Errno;

use crate::mm::{AddressSpace, MmState, MmuGather};

mod copy;

impl AddressSpace {
    /// `fork()`'s `dup_mmap`: a child with the same mappings. Private pages
    /// are shared copy-on-write (write-protected in both; the parent's TLBs
    /// are shot down), shared mappings stay shared, `MADV_DONTFORK` VMAs are
    /// left out and `MADV_WIPEONFORK` VMAs are empty in the child. Pinned
    /// pages are copied at once, never shared. `ENOMEM` if frames, huge
    /// pages for those copies or the commit limit run out (Linux's
    /// `copy_mm` returns `ENOMEM` whatever `dup_mmap` failed with).
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = parent.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&parent);
    /// cpu.write_u64(a, 1).unwrap();
    /// let child = parent.fork().unwrap();
    /// // The child runs on a CPU of its own (or this one, re-attached).
    /// let mut child_cpu = Cpu::attached(&child);
    /// child_cpu.write_u64(a, 2).unwrap(); // copy on write
    /// assert_eq!((cpu.read_u64(a).unwrap(), child_cpu.read_u64(a).unwrap()), (1, 2));
    /// ```
    pub fn fork(&self) -> Result<Arc<AddressSpace>> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let child = AddressSpace::new(&self.phys, self.config.clone())?;
        // copy_process's mpol_dup: the child starts with the parent's policy.
        child.set_mm_policy(self.mm_policy());
        let mut tlb = MmuGather::default();
        let mut st = self.write_lock();
        // write_protect_seq: gup-fast pins racing with the write-protect
        // below either are seen here (pin count read after this fence) or
        // see the count move and fall back to the slow path, which waits
        // for mmap_lock (see crate::pin's fast.rs).
        self.pins.write_protect_seq.write_begin();
        crate::sync::fence(Ordering::SeqCst);
        let res = self.dup_mmap(&mut st, &child, &mut tlb);
        // Write-protecting the parent's entries narrowed its translations.
        // Flush before any fault can run again on those VMAs: a COW copy made
        // while a CPU still writes through its old writable entry would lose
        // that write (the Linux 6.4 fork corruption).
        tlb.finish(self);
        self.pins.write_protect_seq.write_end();
        drop(st);
        // copy_mm: a failed dup_mm is ENOMEM, whatever dup_mmap returned
        // (copy_hugetlb_page_range's ENOSPC for a pinned page's copy).
        res.map(|()| child).map_err(|_| Errno::NoMem)
    }

    fn dup_mmap(&self, st: &mut MmState, child: &Arc<AddressSpace>, tlb: &mut MmuGather) -> Result<()> {
        // Keep lock-free faults off every VMA whose entries we write-protect,
        // until the flush above: replace each by an identical copy, which
        // detaches (and, for per-VMA readers, drains) the old one.
        let cow: Vec<Arc<Vma>> = st
            .vmas
            .iter()
            .filter(|v| {
                !v.flags.intersects(VmFlags::DONTCOPY | VmFlags::WIPEONFORK | VmFlags::MAYSHARE)
                    && v.anon_vma.get().is_some()
            })
            .cloned()
            .collect();
        for v in cow {
            st.vmas.replace(v.start, v.rebound(v.start, v.end, v.pgoff));
        }
        let mut cst = child.write_lock();
        cst.start_brk = st.start_brk;
        cst.brk = st.brk;
        cst.start_stack = st.start_stack;
        cst.hugetlb_seen = st.hugetlb_seen;
        // mm_init: def_flags keep only VM_INIT_DEF_MASK (no lock), the MDWE
        // bits go unless PR_MDWE_NO_INHERIT (mmf_init_flags).
        cst.def_flags = st.def_flags & VmFlags::NOHUGEPAGE;
        cst.mdwe = if st.mdwe & crate::uapi::PR_MDWE_NO_INHERIT != 0 { 0 } else { st.mdwe };
        for v in st.vmas.iter() {
            if v.flags.contains(VmFlags::DONTCOPY) {
                continue;
            }
            if v.flags.contains(VmFlags::ACCOUNT) {
                // dup_mmap charges the child's copy; the child's exit returns it.
                self.phys.vm_enough_memory(v.pages(), || self.total_vm(&st.vmas))?;
            }
            let wipe = v.flags.contains(VmFlags::WIPEONFORK);
            let anon = match v.anon_vma.get() {
                Some(a) if !wipe => Some(a.fork(child.weak())),
                _ => None,
            };
            // dup_mmap: memory locks are not inherited (VM_LOCKED_MASK);
            // a seal is.
            let flags = v.flags & !VmFlags::LOCKED_MASK;
            let mut cv = Vma::new(&self.phys, v.start, v.end, flags, v.pgoff, v.file.clone(), anon).with_open(v.open);
            // vma_dup_policy: the child's VMA keeps the parent's policy.
            cv.policy = v.policy.clone();
            // vm_area_dup: the same backing's hooks (hugetlb's reserve map
            // stays the parent's: the child's VMA starts without one,
            // hugetlb_dup_vma_private).
            cv.ops = v.ops;
            if let Some(f) = &v.file {
                child.link_file(f);
            }
            cst.vmas.insert(cv);
            // Like Linux's vma_needs_copy: only VMAs with anonymous pages need
            // their entries copied; file pages are faulted back in.
            if !wipe && v.anon_vma.get().is_some() {
                // The backing copies a pinned page (hugetlb: into a pool page).
                copy::copy_page_range(child, self, v, tlb, &|va, pfn| {
                    v.ops.copy_pinned(&self.phys, v, &self.placement(v, va), pfn)
                })?;
            }
        }
        Ok(())
    }
}
