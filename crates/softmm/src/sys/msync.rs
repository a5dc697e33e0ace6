//! `msync`: writing a shared file mapping's pages back to their file
//! (`mm/msync.c`). Only host-backed files have somewhere to write them
//! (`crate::host_file`); for in-memory files `MS_SYNC` has nothing to do,
//! as on tmpfs. Also writeback's `folio_mkclean` walk of one address space
//! ([`AddressSpace::page_mkclean`]), which makes the next store to a
//! written-back page fault and mark it dirty again.

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::file::Inode;
use crate::pgtable::Pte;
use crate::phys::Pfn;
use crate::uapi::{MS_ASYNC, MS_INVALIDATE, MS_SYNC};
use crate::vma::VmFlags;
use crate::{PAGE_SHIFT, PAGE_SIZE};

use crate::mm::AddressSpace;

impl AddressSpace {
    /// Linux's `msync(start, len, flags)`, in its order of checks: `EINVAL`
    /// for unknown flags, an unaligned `start`, or `MS_ASYNC` with
    /// `MS_SYNC`; `ENOMEM` if the page-rounded range wraps; `Ok` for an empty
    /// one. Then over the VMAs of the range: `EBUSY` for `MS_INVALIDATE` on a
    /// locked VMA; with `MS_SYNC` each shared file mapping's file is written
    /// back ([`crate::File::sync`]: the dirty pages of a host-backed file go to the
    /// host, and its error is returned); holes in the range give `ENOMEM`
    /// at the end (at once for `MS_ASYNC` alone). Changes no mapping.
    pub fn msync(&self, start: u64, len: u64, flags: i32) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        if flags & !(MS_ASYNC | MS_INVALIDATE | MS_SYNC) != 0
            || start % PAGE_SIZE != 0
            || (flags & MS_ASYNC != 0 && flags & MS_SYNC != 0)
        {
            return Err(Errno::Inval);
        }
        let len = len.checked_add(PAGE_SIZE - 1).map_or(0, |l| l & !(PAGE_SIZE - 1));
        // Linux's `(len + ~PAGE_MASK) & PAGE_MASK` wraps to 0 for a length
        // near 2^64, and then `end == start`.
        let end = start.wrapping_add(len);
        if end < start {
            return Err(Errno::NoMem);
        }
        if end == start {
            return Ok(());
        }
        let mut unmapped = false;
        let mut start = start;
        loop {
            let st = self.read_lock();
            let Some(vma) = st.vmas.find_from(start) else { return Err(Errno::NoMem) };
            if start < vma.start {
                if flags == MS_ASYNC {
                    return Err(Errno::NoMem);
                }
                start = vma.start;
                if start >= end {
                    return Err(Errno::NoMem);
                }
                unmapped = true;
            }
            if flags & MS_INVALIDATE != 0 && vma.flags.contains(VmFlags::LOCKED) {
                return Err(Errno::Busy);
            }
            start = vma.end;
            let sync: Option<Arc<Inode>> =
                if flags & MS_SYNC != 0 && vma.flags.contains(VmFlags::SHARED) { vma.file.clone() } else { None };
            drop(st);
            if let Some(file) = sync {
                // vfs_fsync_range, without mmap_lock.
                file.sync()?;
            }
            if start >= end {
                return if unmapped { Err(Errno::NoMem) } else { Ok(()) };
            }
        }
    }

    /// Linux's `folio_mkclean` (`page_mkclean_one` over `rmap_walk_file`)
    /// for this address space: every writable entry of a VMA of `file` that
    /// maps one of the page-cache pages `pages` (`(index, pfn)`, by
    /// index) is made read-only and clean, then the TLB is shot down (and
    /// the shootdown waited for) if any was. A store to the page then takes
    /// the write-protect fault, whose shared case (`wp_page_shared`) marks
    /// the page dirty and the entry writable again. Private mappings hold
    /// the page read-only (a write copies it), so only shared ones change.
    /// Takes `mmap_lock` for read, recursively (the caller holds the file's
    /// `invalidate_lock`, as truncate does before its zap).
    pub(crate) fn page_mkclean(&self, file: &Inode, pages: &[(u64, Pfn)]) {
        let st = self.read_lock_recursive();
        let mut cleaned = false;
        for v in st.vmas.iter() {
            if v.file.as_ref().is_none_or(|f| f.id() != file.id()) {
                continue;
            }
            let (first, last) = (v.pgoff, v.pgoff + v.pages());
            let from = pages.partition_point(|&(i, _)| i < first);
            for &(index, pfn) in pages[from..].iter().take_while(|&&(i, _)| i < last) {
                let va = v.start + ((index - first) << PAGE_SHIFT);
                self.pgtables.update_range(va, va + PAGE_SIZE, |_, pte| {
                    let writable = pte.is_present() && pte.has(Pte::WRITE) && pte.pfn() == pfn;
                    cleaned |= writable;
                    writable.then(|| pte.clear(Pte::WRITE | Pte::DIRTY))
                });
            }
        }
        // Before the copy is taken: no CPU may keep a writable translation
        // of the page once writeback reads it.
        if cleaned && !crate::file::broken::skip_mkclean_flush() {
            self.flush_tlb();
        }
        drop(st);
    }
}
