//! hugetlb's hooks (Linux's `hugetlb_vm_ops` and `hugetlbfs_file_mmap`):
//! how the core maps, splits, closes, zaps and copies (at fork) a hugetlb
//! VMA without naming hugetlb.

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::mm::{AddressSpace, MmuGather};
use crate::phys::PhysMem;
use crate::vma::{VmFlags, Vma, VmaDesc, VmaOps, ZapDetails};
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

    fn split(&self, mm: &AddressSpace, vma: &Vma, addr: u64) {
        super::share::hugetlb_split(mm, vma, addr);
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
    fn copy_page_range(&self, dst: &AddressSpace, src: &AddressSpace, vma: &Vma, tlb: &mut MmuGather) -> Result<()> {
        crate::mm::copy_page_range(dst, src, vma, tlb, &|va, pfn| {
            let copy = src.phys.alloc_huge(&src.placement(vma, va), false).ok_or(Errno::NoSpc)?;
            src.phys.copy_frames(pfn, copy.pfn(), super::HPAGE_FRAMES as usize);
            Ok(copy)
        })
    }

    /// `hugetlb_vmdelete_list` → `__unmap_hugepage_range`: with
    /// `even_cows`, a private mapping's owner gets its reservations back
    /// for the pages that go ([`super::restore_reserves`]);
    /// the zap takes the locks that keep a shareable window unshared
    /// ([`super::share::hugetlb_zap_range`]).
    fn zap(&self, mm: &AddressSpace, vma: &Vma, start: u64, end: u64, tlb: &mut MmuGather, details: ZapDetails<'_>) {
        if details.even_cows {
            super::restore_reserves(mm, vma, start, end);
        }
        super::share::hugetlb_zap_range(mm, vma, start, end, tlb, details.filter);
    }
}
