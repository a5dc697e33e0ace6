//! `mincore`: which pages of a range are resident.

use crate::error::{Errno, Result};
use crate::{page_align, PAGE_SIZE};

use super::AddressSpace;

impl AddressSpace {
    /// `mincore(addr, len)`: one byte per page, 1 if resident. Anonymous
    /// pages are resident when mapped; file pages when in the page cache.
    /// `EINVAL` for an unaligned address; `ENOMEM` for a range outside the
    /// user address space or containing unmapped pages.
    pub fn mincore(&self, addr: u64, len: u64) -> Result<Vec<u8>> {
        if addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let task = self.config.task_size;
        if addr > task || len > task - addr {
            return Err(Errno::NoMem);
        }
        let end = addr + page_align(len);
        let _q = crate::cpu::QuiescentGuard::enter();
        let st = self.read_lock();
        let mut out = Vec::with_capacity(((end - addr) / PAGE_SIZE) as usize);
        let mut a = addr;
        while a < end {
            let vma = st.vmas.find(a).ok_or(Errno::NoMem)?;
            let stop = vma.end.min(end);
            while a < stop {
                let resident = crate::pgtable::pte_has_frame(self.pte_at(a))
                    || vma.file.as_ref().is_some_and(|f| f.is_cached(vma.pgoff_at(a)));
                out.push(resident as u8);
                a += PAGE_SIZE;
            }
        }
        Ok(out)
    }
}
