//! `get_user_pages`: faulting the pages of a range in for a call that needs
//! them present, as Linux's `mm/gup.c` does. `MAP_POPULATE` and the populate
//! that `mprotect` and `mremap` do for locked mappings ([`mm_populate`] →
//! [`populate_vma_page_range`]), `MADV_POPULATE_READ`/`WRITE`
//! ([`faultin_page_range`]) and `MADV_COLLAPSE` all come down to
//! [`get_user_pages`], Linux's `__get_user_pages` on one VMA: a loop that
//! faults the pages in one by one through the fault handler's locked path,
//! with `mmap_lock` held for read.
//!
//! Layering: the syscalls (`crate::sys`) call this module, and this module
//! calls the fault handler (`crate::fault`); the handler never calls back.

use crate::error::{Errno, Fault, Result};
use crate::fault::Access;
use crate::mm::AddressSpace;
use crate::vma::VmFlags;
use crate::vma::Vma;

/// Linux's `__get_user_pages` on `[start, end)` of `vma` (page aligned and
/// inside it), for a caller holding `mmap_lock`: faults each page in for
/// `access`, in address order. Stops at the first page whose fault raises a
/// signal and returns it; the pages before it stay mapped.
pub(crate) fn get_user_pages(
    mm: &AddressSpace,
    vma: &Vma,
    start: u64,
    end: u64,
    access: Access,
) -> core::result::Result<(), Fault> {
    // check_vma_flags: raw memory without pages (`mmap_host`) cannot be
    // got, which the errno-returning callers turn into `EFAULT`.
    if vma.flags.intersects(VmFlags::IO | VmFlags::PFNMAP) {
        return Err(Fault::Segv { addr: start, code: crate::error::SegvCode::AccErr });
    }
    // A hugetlb fault maps a whole 2 MiB page: one per huge page.
    let step = vma.ops.pagesize(vma);
    let mut a = start;
    while a < end {
        mm.handle_mm_fault(vma, a, access)?;
        a = (a & !(step - 1)) + step;
    }
    Ok(())
}

/// [`get_user_pages`] with its signal turned into the errno a syscall
/// returns (`faultin_page`): `ENOMEM` when frames ran out (`VM_FAULT_OOM`),
/// `EFAULT` for any other signal (`SIGBUS` past the end of a file, a guard
/// marker's `SIGSEGV`).
pub(crate) fn populate_vma_page_range(
    mm: &AddressSpace,
    vma: &Vma,
    start: u64,
    end: u64,
    access: Access,
) -> Result<()> {
    get_user_pages(mm, vma, start, end, access).map_err(|f| match f {
        Fault::Oom { .. } => Errno::NoMem,
        _ => Errno::Fault,
    })
}

/// Linux's `mm_populate` (`MAP_POPULATE`, and `mprotect`/`mremap` of locked
/// mappings), called after `mmap_lock` was dropped: faults in the accessible
/// VMAs of `[start, end)`, private writable ones for write (so that they get
/// their own pages, as `populate_vma_page_range` asks with `FOLL_WRITE`),
/// others for read. Errors are ignored, as Linux's `__mm_populate(.., 1)`
/// does: the call that asked has already succeeded.
pub(crate) fn mm_populate(mm: &AddressSpace, start: u64, end: u64) {
    let _ = populate_range(mm, start, end, true);
}

/// Linux's `__mm_populate(start, len, ignore_errors)`: [`mm_populate`]'s
/// walk over the VMAs of `[start, end)` (holes skipped). A `VM_LOCKONFAULT`
/// VMA is left as it is (its pages lock as they fault); a `PROT_NONE` one
/// is `EFAULT`. Unless `ignore_errors`, the first VMA that fails ends the
/// walk with its errno (`mlock`'s populate).
pub(crate) fn populate_range(mm: &AddressSpace, start: u64, end: u64, ignore_errors: bool) -> Result<()> {
    let st = mm.read_lock();
    let mut a = start;
    while let Some(vma) = st.vmas.find_from(a).filter(|v| a < end && v.start < end) {
        let from = a.max(vma.start);
        a = vma.end.min(end);
        let res = if vma.flags.intersects(VmFlags::LOCKONFAULT | VmFlags::IO | VmFlags::PFNMAP) {
            // __mm_populate skips VM_IO and VM_PFNMAP VMAs (`mmap_host`).
            Ok(())
        } else if !vma.flags.intersects(VmFlags::ACCESS_FLAGS) {
            Err(Errno::Fault)
        } else {
            let write = vma.flags & (VmFlags::WRITE | VmFlags::SHARED) == VmFlags::WRITE;
            let access = if write { Access::Write } else { Access::Read };
            populate_vma_page_range(mm, vma, from, a, access)
        };
        if !ignore_errors {
            res?;
        }
    }
    Ok(())
}

/// Linux's `faultin_page_range` (`MADV_POPULATE_READ`/`WRITE`): faults in
/// `[start, end)` (page aligned) for read or write. `ENOMEM` for an unmapped
/// page, `EINVAL` for a VMA without the access or of device memory,
/// `EFAULT` for a page that would raise a signal (`ENOMEM` if frames ran
/// out); the pages before the failing one stay in.
pub(crate) fn faultin_page_range(mm: &AddressSpace, start: u64, end: u64, write: bool) -> Result<()> {
    let st = mm.read_lock();
    let (need, access) = if write { (VmFlags::WRITE, Access::Write) } else { (VmFlags::READ, Access::Read) };
    let mut a = start;
    while a < end {
        let vma = st.vmas.find(a).ok_or(Errno::NoMem)?;
        // `check_vma_flags` refuses device memory before anything else,
        // and `__get_user_pages` reports any refusal of a populate as
        // `EINVAL` (6.12 `mm/gup.c`, `FOLL_MADV_POPULATE`).
        if vma.flags.intersects(VmFlags::IO | VmFlags::PFNMAP) {
            return Err(Errno::Inval);
        }
        if !vma.flags.intersects(need) {
            return Err(Errno::Inval);
        }
        let stop = vma.end.min(end);
        populate_vma_page_range(mm, vma, a, stop, access)?;
        a = stop;
    }
    Ok(())
}
