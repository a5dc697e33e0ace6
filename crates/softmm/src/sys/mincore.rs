//! `mincore`: which pages of a range are resident.

use crate::error::{Errno, Result};
use crate::vma::VmFlags;
use crate::PAGE_SIZE;

use crate::mm::AddressSpace;

/// Pages reported per round under `mmap_lock` (Linux: one page of results).
const PAGES_PER_ROUND: u64 = PAGE_SIZE;

impl AddressSpace {
    /// `mincore(addr, len, vec)`: writes one byte per page of
    /// `[addr, addr + len)` into `vec`, 1 if resident. Anonymous pages are
    /// resident when mapped; file pages when in the page cache.
    ///
    /// As Linux, the range is examined a VMA (and at most 4096 pages) at a
    /// time, each part under `mmap_lock` for read, and its results copied
    /// before the next: `EINVAL` for an unaligned address; `ENOMEM` for a
    /// range outside the user address space, or at the first unmapped page
    /// (the bytes for the pages before it are written); `EFAULT` when `vec`
    /// is too short for the part being copied (the bytes that fit are
    /// written, as `copy_to_user` stops at the first bad byte). Memory use is
    /// bounded whatever `len` is.
    pub fn mincore(&self, addr: u64, len: u64, vec: &mut [u8]) -> Result<()> {
        if addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let task = self.config.task_size;
        if addr > task || len > task - addr {
            return Err(Errno::NoMem);
        }
        // `len <= task_size`, so neither this nor `addr + len` overflows.
        let mut pages = len.div_ceil(PAGE_SIZE);
        let _q = crate::tlb::QuiescentGuard::enter();
        let mut a = addr;
        let mut out = 0usize;
        while pages > 0 {
            let round = self.do_mincore(a, pages.min(PAGES_PER_ROUND), &mut vec[out..])?;
            pages -= round;
            a += round * PAGE_SIZE;
            out += round as usize;
        }
        Ok(())
    }

    /// One round of `mincore` from `addr` within a single VMA: the number of
    /// pages examined (at least 1), their bytes copied to `vec`.
    fn do_mincore(&self, addr: u64, pages: u64, vec: &mut [u8]) -> Result<u64> {
        let st = self.read_lock();
        let vma = st.vmas.find(addr).ok_or(Errno::NoMem)?;
        let end = vma.end.min(addr + pages * PAGE_SIZE);
        let n = (end - addr) / PAGE_SIZE;
        let fits = vec.len().min(n as usize);
        for (i, byte) in vec[..fits].iter_mut().enumerate() {
            let a = addr + i as u64 * PAGE_SIZE;
            let resident =
                // A migration entry counts as resident (mincore_pte_range).
                self.pte_at(a).has_frame() || self.pte_at(a).is_migration()
                // mincore_hugetlb looks at the page table only.
                || (!vma.flags.contains(VmFlags::HUGETLB) && vma.file.as_ref().is_some_and(|f| f.is_cached(vma.pgoff_at(a))));
            *byte = resident as u8;
        }
        if fits < n as usize {
            return Err(Errno::Fault);
        }
        Ok(n)
    }
}
