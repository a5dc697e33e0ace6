//! `mseal` (Linux 6.10+, `mm/mseal.c`): `VM_SEALED`, a flag no call can
//! clear, and the refusals it makes (`EPERM`): a sealed VMA is never
//! unmapped or split by `munmap`, `mmap(MAP_FIXED)`, `mremap`'s shrink or
//! fixed target or `brk` (the shared unmap check, `munmap_split_check`),
//! never moved or resized by `mremap`, never reprotected by `mprotect`,
//! and its pages are never discarded by `madvise` while it is anonymous
//! and read-only (`can_modify_vma_madv`). Every refusal comes where
//! Linux 6.12 checks it, per VMA: a call over several VMAs has changed
//! those before the sealed one, as on Linux (`mprotect`, `madvise`),
//! except the unmaps, which check the whole range before any change.
//!
//! A seal survives `fork` and goes with the address space.

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SIZE;

use crate::mm::AddressSpace;

/// Linux's `is_madv_discard`: the advice that discards or hides the
/// contents of pages.
fn is_madv_discard(advice: i32) -> bool {
    matches!(advice, MADV_FREE | MADV_DONTNEED | MADV_DONTNEED_LOCKED | MADV_REMOVE | MADV_DONTFORK | MADV_WIPEONFORK)
}

/// Linux's `can_modify_vma_madv`: `false` (the caller returns `EPERM`) for
/// discarding advice on a sealed anonymous private VMA that is not
/// writable — its contents cannot be rewritten, so a discard would change
/// them.
pub(crate) fn can_modify_vma_madv(vma: &Vma, advice: i32) -> bool {
    if !is_madv_discard(advice) || !vma.flags.contains(VmFlags::SEALED) {
        return true;
    }
    // is_ro_anon: a file or shared mapping (hugetlb's has a file in Linux)
    // is not anonymous.
    let anon = vma.file.is_none() && !vma.flags.intersects(VmFlags::SHARED | VmFlags::HUGETLB);
    !anon || vma.flags.contains(VmFlags::WRITE)
}

/// `can_modify_vma`: `EPERM` for a sealed VMA.
pub(crate) fn check_unsealed(vma: &Vma) -> Result<()> {
    if vma.flags.contains(VmFlags::SEALED) {
        return Err(Errno::Perm);
    }
    Ok(())
}

impl AddressSpace {
    /// `mseal(addr, len, flags)`: seals every VMA of `[addr, addr + len)`
    /// (the length rounded up to pages), splitting the VMAs at the edges.
    /// `EINVAL` for any flag, an unaligned address, a length that rounds up
    /// past 2^64 or a range that wraps; `ENOMEM` if part of the range is
    /// unmapped, checked before anything is sealed; `ENOMEM` if a split
    /// would pass `max_map_count`. A zero length succeeds. Sealing a
    /// sealed VMA again succeeds.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Errno, MmConfig, PhysConfig, PhysMem};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 2 << 12, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// mm.mseal(a, 4096, 0).unwrap();
    /// assert_eq!(mm.munmap(a, 2 << 12), Err(Errno::Perm));
    /// assert_eq!(mm.mprotect(a, 4096, PROT_READ | PROT_WRITE), Err(Errno::Perm));
    /// assert_eq!(mm.madvise(a, 4096, MADV_DONTNEED), Err(Errno::Perm));
    /// mm.munmap(a + 4096, 4096).unwrap(); // the unsealed page
    /// ```
    pub fn mseal(&self, addr: u64, len: u64, flags: u64) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        // can_do_mseal, then do_mseal's range checks.
        if flags != 0 || addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let end = super::aligned_end(addr, len)?;
        if end == addr {
            return Ok(());
        }
        let mut st = self.write_lock();
        // check_mm_seal: no hole anywhere, before anything changes.
        let mut next = addr;
        for v in st.vmas.overlapping(addr, end) {
            if v.start > next {
                return Err(Errno::NoMem);
            }
            next = v.end;
        }
        if next < end {
            return Err(Errno::NoMem);
        }
        // apply_mm_seal: each VMA part gets VM_SEALED (mseal_fixup).
        let mut tmp = addr;
        while tmp < end {
            let Some(v) = st.vmas.find_from(tmp).cloned() else { break };
            let stop = v.end.min(end);
            let (lo, flags) = (tmp.max(v.start), v.flags | VmFlags::SEALED);
            if flags != v.flags {
                let v = self.host_file_windows_merged(&mut st, &v, lo, stop, flags, v.policy.as_ref());
                self.vma_modify_flags(&mut st, &v, lo, stop, flags)?;
            }
            tmp = stop;
        }
        Ok(())
    }
}
