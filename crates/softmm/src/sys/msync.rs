//! `msync`: writing a shared file mapping's pages back to their file
//! (`mm/msync.c`). Only host-backed files have somewhere to write them
//! (`crate::host_file`); for in-memory files `MS_SYNC` has nothing to do,
//! as on tmpfs. Writeback's `folio_mkclean` walk of one address space is
//! `mm/mkclean.rs`'s.

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::file::Inode;
use crate::uapi::{MS_ASYNC, MS_INVALIDATE, MS_SYNC};
use crate::vma::VmFlags;
use crate::PAGE_SIZE;

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
}
