//! hugetlb PMD sharing (Linux's `want_pmd_share`, `huge_pmd_share`): address
//! spaces that map the same 1 GiB of a hugetlb file, each with a VMA covering
//! the whole PUD-aligned window, link one PMD table instead of one each, so
//! a second mapper's first fault in the window maps all 512 huge pages the
//! first mapper already faulted (seed 000).
//!
//! The table carries a share count of its own (`pt_share_count`, see
//! `pgtable`): a shared table counts once in the page-table accounting and
//! its last user frees it. `fork` copies nothing of shared hugetlb VMAs, so
//! a child's first fault in a window shares the parent's table.
//!
//! # State of the mechanism
//!
//! Sharing is off for every file ([`HugetlbInode::pmd_share`] false) until
//! every path that must unshare first does so (`munmap`, `mprotect`,
//! `mremap`, a VMA split, truncate and hole punch, `MADV_DONTNEED`: each
//! would otherwise change entries other address spaces map, without their
//! TLB flush). Only this module's tests turn it on, for their own files, in
//! address spaces that fault, fork and exit (exit drops its link through
//! the share count, which is exact).
//!
//! # Locks
//!
//! Fault: `mmap_lock` (read) → `invalidate_lock` (read) → fault mutex →
//! the file's `i_mmap_rwsem` (read, here) → the other address space's
//! `mmap_lock`, only tried: a writer there (munmap, mprotect, ...) may wait
//! for `i_mmap_rwsem` to unshare, so waiting for it could deadlock; a busy
//! candidate is skipped, which only means this fault does not share.

use crossbeam_epoch::Guard;

use super::resv::HugetlbInode;
use crate::mm::AddressSpace;
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SHIFT;

/// Bytes one PUD entry maps: the window a PMD table covers.
pub(crate) const PUD_SIZE: u64 = 1 << 30;

/// `want_pmd_share`: a `VM_MAYSHARE` VMA that covers the whole PUD-aligned
/// window around `addr`.
pub(crate) fn want_pmd_share(vma: &Vma, addr: u64) -> bool {
    let start = addr & !(PUD_SIZE - 1);
    vma.flags.contains(VmFlags::MAYSHARE)
        && start >= vma.start
        && start.checked_add(PUD_SIZE).is_some_and(|end| end <= vma.end)
}

/// The flags `page_table_shareable` compares: all but `VM_LOCKED_MASK`.
fn share_flags(vma: &Vma) -> VmFlags {
    vma.flags - VmFlags::LOCKED
}

impl HugetlbInode {
    /// Whether faults on this file may share PMD tables (see the module doc).
    pub(crate) fn pmd_share_enabled(&self) -> bool {
        self.pmd_share.load(Ordering::Relaxed)
    }
}

impl AddressSpace {
    /// `huge_pmd_share`: before the fault at `addr` in the hugetlb VMA `vma`
    /// allocates a PMD table, links the table of another address space
    /// whose VMA maps the same file page at the same offset within its PUD,
    /// with equal flags, covering its whole window too. True if it linked
    /// one (counted in [`crate::HugePageStats::pmd_shares`]). The caller
    /// holds `mmap_lock` for read and the file's fault mutex.
    pub(crate) fn huge_pmd_share(&self, vma: &Vma, addr: u64, guard: &Guard) -> bool {
        let Some(inode) = vma.file.as_ref().and_then(|f| f.hugetlb.as_ref()) else { return false };
        if !inode.pmd_share_enabled() || !want_pmd_share(vma, addr) || self.pgtables.has_pmd_table(addr, guard) {
            return false;
        }
        let idx = ((addr - vma.start) >> PAGE_SHIFT) + vma.pgoff;
        let _i_mmap = inode.i_mmap_rwsem.read();
        for svma in inode.vmas.covering(idx) {
            let saddr = svma.start + ((idx - svma.pgoff) << PAGE_SHIFT);
            // pmd_index(addr) == pmd_index(saddr): each entry of the table
            // then maps the same file page for both.
            if saddr % PUD_SIZE != addr % PUD_SIZE {
                continue;
            }
            let Some(smm) = svma.mm.upgrade() else { continue };
            let Ok(smm) = smm.as_any().downcast::<AddressSpace>() else { continue };
            if std::ptr::eq(&*smm, self) {
                // Our own other VMA: its VMA tree is under the lock we hold.
                // Linux shares here too; softmm does not yet.
                continue;
            }
            let Some(st) = smm.try_read_lock() else { continue };
            let Some(s) = st.vmas.find(saddr) else { continue };
            // The VMA as the reverse map names it (not one made since, whose
            // link is still to come), shareable, with the same flags.
            if s.start != svma.start
                || s.pgoff != svma.pgoff
                || !want_pmd_share(s, saddr)
                || !s.file.as_ref().is_some_and(|f| vma.file.as_ref().is_some_and(|g| std::sync::Arc::ptr_eq(f, g)))
                || share_flags(s) != share_flags(vma)
            {
                continue;
            }
            if self.pgtables.pmd_share_from(addr, &smm.pgtables, saddr, guard) {
                self.phys.hugetlb.pmd_shares.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::PUD_SIZE;
    use crate::sync::Ordering;
    use crate::uapi::*;
    use crate::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem};

    const HP: u64 = 2 << 20;
    /// Huge pages each test faults in a window: enough to tell one fault
    /// from one per page, small enough for the test machine.
    const TOUCHED: u64 = 8;

    fn arena() -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new((16 << 20) + (TOUCHED + 1) * HP).hugepages(TOUCHED)).expect("arena")
    }

    /// A 1 GiB + 2 MiB hugetlbfs file with sharing on (this module's tests
    /// only: see the module doc).
    fn shared_file(phys: &Arc<PhysMem>) -> Arc<File> {
        let f = File::create_hugetlbfs(phys, "/db", PUD_SIZE + HP).unwrap();
        f.hugetlb.as_ref().unwrap().pmd_share.store(true, Ordering::Relaxed);
        f
    }

    /// Maps `len` bytes of `f` from `off` at the PUD-aligned address `at`
    /// plus `shift`.
    fn map(mm: &AddressSpace, f: &Arc<File>, at: u64, shift: u64, len: u64, off: u64, flags: i32) -> u64 {
        let open = OpenFile::read_write(f);
        mm.mmap(at + shift, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED | MAP_NORESERVE, Some(&open), off).unwrap()
    }

    /// Faults taken by a fresh CPU of `mm` reading the first `TOUCHED`
    /// huge pages from `a`, each checked against what `write_all` wrote.
    fn touch(mm: &Arc<AddressSpace>, a: u64) -> u64 {
        let mut cpu = Cpu::attached(mm);
        for i in 0..TOUCHED {
            assert_eq!(cpu.read_u64(a + i * HP + 8).unwrap(), 0x5eed + i, "page {i}");
        }
        cpu.stats().fault.faults
    }

    fn write_all(mm: &Arc<AddressSpace>, a: u64) {
        let mut cpu = Cpu::attached(mm);
        for i in 0..TOUCHED {
            cpu.write_u64(a + i * HP + 8, 0x5eed + i).unwrap();
        }
    }

    #[test]
    fn a_forked_child_shares_the_parents_pmd_table_and_takes_one_fault() {
        let phys = arena();
        let f = shared_file(&phys);
        let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
        write_all(&parent, a);
        let tables = phys.stats().page_tables;
        let child = parent.fork().unwrap();
        assert_eq!(touch(&child, a), 1, "one fault links the table that maps every page");
        assert_eq!(phys.huge_page_stats().pmd_shares, 1);
        // The child has a PGD and a PUD table of its own, and no PMD table.
        assert_eq!(phys.stats().page_tables, tables + 2);
        // A second process mapping the file at another 1 GiB shares too.
        let other = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let b = map(&other, &f, 9 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
        assert_eq!(touch(&other, b), 1);
        assert_eq!(phys.stats().page_tables, tables + 4, "still one PMD table for the window");
        assert_eq!(phys.huge_page_stats().pmd_shares, 2);
        // A write through one sharer is seen by the others.
        Cpu::attached(&other).write_u64(b + 8, 0xbeef).unwrap();
        assert_eq!(Cpu::attached(&parent).read_u64(a + 8).unwrap(), 0xbeef);
        // Exits in any order: the table goes once, with its last user.
        drop(parent);
        assert_eq!(Cpu::attached(&child).read_u64(a + HP + 8).unwrap(), 0x5eed + 1);
        drop((child, other, f));
        let s = phys.quiesce();
        assert_eq!((s.page_tables, s.rmap_entries, s.frames_used), (0, 0, 0));
        assert_eq!(phys.huge_page_stats().free, TOUCHED);
    }

    #[test]
    fn misaligned_private_or_partial_windows_do_not_share() {
        let phys = arena();
        let f = shared_file(&phys);
        let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
        write_all(&parent, a);
        let cases: [(u64, u64, u64, i32); 3] = [
            // Same file page at another offset within the PUD.
            (HP, PUD_SIZE, 0, MAP_SHARED),
            // A private mapping never shares.
            (0, PUD_SIZE, 0, MAP_PRIVATE),
            // A VMA that does not cover the whole window.
            (0, PUD_SIZE - HP, 0, MAP_SHARED),
        ];
        for (shift, len, off, flags) in cases {
            let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
            let b = map(&mm, &f, 8 * PUD_SIZE, shift, len, off, flags);
            assert_eq!(touch(&mm, b), TOUCHED, "one fault per page ({shift:#x}, {len:#x}, {flags:#x})");
        }
        // The child of a parent whose window is misaligned faults per page too.
        let mis = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let m = map(&mis, &f, 8 * PUD_SIZE, HP, PUD_SIZE, 0, MAP_SHARED);
        let child = mis.fork().unwrap();
        assert_eq!(touch(&child, m), TOUCHED);
        assert_eq!(phys.huge_page_stats().pmd_shares, 0);
        drop((parent, mis, child, f));
        let s = phys.quiesce();
        assert_eq!((s.page_tables, s.rmap_entries, s.frames_used), (0, 0, 0));
    }

    #[test]
    fn sharing_is_off_unless_the_file_allows_it() {
        let phys = arena();
        let f = File::create_hugetlbfs(&phys, "/db", PUD_SIZE).unwrap();
        let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
        write_all(&parent, a);
        let child = parent.fork().unwrap();
        assert_eq!(touch(&child, a), TOUCHED);
        assert_eq!(phys.huge_page_stats().pmd_shares, 0);
    }
}
