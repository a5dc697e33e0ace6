//! hugetlb's hooks (Linux's `hugetlb_vm_ops` and `hugetlbfs_file_mmap`):
//! how the core maps, splits, closes, zaps and copies (at fork) a hugetlb
//! VMA without naming hugetlb.

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::pgtable::{PageTables, PUD_SIZE};
use crate::phys::hugetlb::lock::IMmapLock;
use crate::phys::{FrameRef, Pfn, PhysMem, Placement};
use crate::sync::RwLock;
use crate::vma::{VmFlags, Vma, VmaDesc, VmaOps};
use crate::PAGE_SHIFT;

use super::{HPAGE_SHIFT, HPAGE_SIZE};

/// The hooks of every hugetlb VMA, shared or private, of a hugetlbfs file
/// or of `MAP_HUGETLB`.
pub(crate) struct HugetlbVmOps;

/// hugetlb's [`VmaOps`] (Linux's `hugetlb_vm_ops`).
pub(crate) static HUGETLB_VM_OPS: HugetlbVmOps = HugetlbVmOps;

impl VmaOps for HugetlbVmOps {
    fn name(&self) -> &'static str {
        "hugetlb"
    }

    /// `hugetlbfs_file_mmap` (and `do_mmap`'s hugetlb rules): strict
    /// reservations unless `MAP_NORESERVE`, whatever the overcommit mode;
    /// `VM_HUGETLB | VM_DONTEXPAND`; `EINVAL` for an offset that is not a
    /// huge page's, `ENOMEM` for a page size without a pool (no 1 GiB pool:
    /// as a host with no 1 GiB pages reserved) or reservations the pool
    /// cannot give. An anonymous mapping gets the pseudo-file of
    /// `hugetlb_file_setup(HUGETLB_ANON_FILE)`, `len` bytes long (a shared
    /// mapping's page cache; a private one's faults allocate anonymous
    /// pages but stop at its size too). A writable mapping past the end of
    /// its file grows the file to cover it.
    fn mmap_prepare(&self, phys: &Arc<PhysMem>, desc: &mut VmaDesc) -> Result<()> {
        if desc.map_noreserve {
            desc.flags |= VmFlags::NORESERVE;
        }
        desc.flags |= VmFlags::HUGETLB | VmFlags::DONTEXPAND;
        if desc.pgoff % (desc.page_size >> PAGE_SHIFT) != 0 {
            return Err(Errno::Inval);
        }
        if desc.page_size != HPAGE_SIZE {
            return Err(Errno::NoMem);
        }
        let len = desc.end - desc.start;
        let shift = HPAGE_SHIFT - PAGE_SHIFT;
        let (from, to) = (desc.pgoff >> shift, (desc.pgoff >> shift) + (len >> HPAGE_SHIFT));
        let reserve = !desc.flags.contains(VmFlags::NORESERVE);
        let f = match desc.file.take() {
            Some(f) => f,
            None => super::anon_file(phys, len),
        };
        if desc.flags.contains(VmFlags::MAYSHARE) {
            // The file's reserve map.
            if reserve {
                f.hugetlb.as_ref().expect("a hugetlb file").reserve(phys, from, to)?;
            }
        } else if reserve {
            desc.hugetlb_resv = Some(super::resv::PrivateResv::new(phys, from, to)?);
        }
        if desc.flags.contains(VmFlags::WRITE) {
            f.hugetlbfs_cover((desc.pgoff << PAGE_SHIFT) + len);
        }
        desc.file = Some(f);
        Ok(())
    }

    /// `hugetlb_vm_op_split`: only at a huge page boundary, else `EINVAL`.
    fn may_split(&self, _vma: &Vma, addr: u64) -> Result<()> {
        if addr % HPAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        Ok(())
    }

    /// `hugetlb_split` (Linux 6.16+, backported to 6.12): if the PUD window
    /// around `addr` lies wholly inside `vma` and `addr` is not its start,
    /// neither piece will cover it after the split, so
    /// [`crate::vma::want_pmd_share`]
    /// would no longer hold: the window's table is unshared now (by the
    /// core, with the flush, as every unshare), not left linked until some
    /// later change of the window. A split on a PUD boundary keeps each
    /// window whole and unshares nothing. Asked for every split, including
    /// those that change no entry (`madvise`'s flag changes, `mbind`).
    fn split(&self, vma: &Vma, addr: u64) -> Option<Range<u64>> {
        if !vma.flags.contains(VmFlags::HUGETLB) || addr % PUD_SIZE == 0 {
            return None;
        }
        let floor = addr & !(PUD_SIZE - 1);
        let ceil = floor.checked_add(PUD_SIZE).filter(|&c| floor >= vma.start && c <= vma.end)?;
        Some(floor..ceil)
    }

    /// `hugetlb_vm_op_close` for the part that goes: a private mapping's
    /// unused reservations there return to the pool.
    fn close(&self, vma: &Vma, start: u64, end: u64) {
        super::close_vma_range(vma, start, end);
    }

    /// `hugetlb_vm_op_pagesize`.
    fn pagesize(&self, _vma: &Vma) -> u64 {
        HPAGE_SIZE
    }

    /// `copy_hugetlb_page_range`: a pinned page's copy for the child is a
    /// pool page outside any reservation; none left fails the fork
    /// (`ENOSPC`, which `copy_mm` turns into `ENOMEM`).
    fn copy_pinned<'p>(&self, phys: &'p PhysMem, _vma: &Vma, placement: &Placement, pfn: Pfn) -> Result<FrameRef<'p>> {
        let copy = phys.alloc_huge(placement, false).ok_or(Errno::NoSpc)?;
        phys.copy_frames(pfn, copy.pfn(), super::HPAGE_FRAMES as usize);
        Ok(copy)
    }

    /// `__unmap_hugepage_range`: with `even_cows`, a private mapping's owner
    /// gets its reservations back for the pages that go
    /// ([`super::restore_reserves`]).
    fn zap_begin(&self, pgtables: &PageTables, phys: &PhysMem, vma: &Vma, start: u64, end: u64, even_cows: bool) {
        if even_cows {
            super::restore_reserves(pgtables, phys, vma, start, end);
        }
    }

    /// `__hugetlb_zap_begin`'s lock of a private owner's VMA: its
    /// reservation map's `rw_sema`, which the faults hold for read.
    fn zap_lock<'v>(&self, vma: &'v Vma) -> Option<&'v RwLock<()>> {
        super::vma_lock(vma)
    }

    /// `__hugetlb_zap_begin`'s lock: a shared mapping's windows may link
    /// another address space's PMD table, so a zap under `mmap_lock` for
    /// read holds the file's `i_mmap` lock for write over each window it
    /// may share (the protocol: `hugetlb/share.rs`).
    fn pmd_share_lock<'v>(&self, vma: &'v Vma) -> Option<&'v IMmapLock> {
        let i_mmap = vma
            .file
            .as_ref()
            .and_then(|f| f.hugetlb.as_ref())
            .filter(|_| vma.flags.contains(VmFlags::MAYSHARE))
            .map(|inode| &inode.vmas.i_mmap);
        #[cfg(loom)]
        let i_mmap = i_mmap.filter(|_| !super::lock::broken::skip_zap_lock());
        i_mmap
    }
}
