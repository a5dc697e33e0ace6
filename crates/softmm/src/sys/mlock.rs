//! `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall` (Linux's
//! `mm/mlock.c`): the `VM_LOCKED`/`VM_LOCKONFAULT` flags of VMAs, split
//! and merged as any flag change (`mlock_fixup` → `vma_modify_flags`),
//! `mm->def_flags` for `MCL_FUTURE`, and the memlock limit.
//!
//! softmm has no page reclaim, so a lock changes no page's fate: what it
//! changes is what Linux shows and refuses — the flags (`lo`, `lf` in
//! [`MapEntry::vm_flags`](crate::MapEntry)), `locked_vm`
//! ([`MmStats::locked_pages`](crate::MmStats), `VmLck`), the pages faulted
//! in at once unless on fault, the limit on later locks and mappings
//! (`mlock_future_ok`), and the advice locked VMAs refuse (`MADV_DONTNEED`,
//! `MADV_PAGEOUT`, `MS_INVALIDATE`: `EINVAL`).

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::{VmFlags, Vma};
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use crate::mm::commit::locked_vm;
use crate::mm::{AddressSpace, MmState};
use std::sync::Arc;

/// Linux's `vma_supports_mlock`: special, droppable and hugetlb VMAs are
/// never locked (a lock over them succeeds and leaves them as they are).
pub(crate) fn vma_supports_mlock(flags: VmFlags) -> bool {
    !flags.intersects(VmFlags::SPECIAL | VmFlags::DROPPABLE | VmFlags::HUGETLB)
}

impl AddressSpace {
    /// `mlock(addr, len)`: locks the pages of `[addr & PAGE_MASK, addr + len)`
    /// and faults them in. Linux's errors, in its order: `EPERM` if the
    /// memlock limit is zero without `CAP_IPC_LOCK`
    /// ([`MmConfig::cap_ipc_lock`](crate::MmConfig::cap_ipc_lock)); `ENOMEM`
    /// if the locked pages would pass the limit
    /// ([`MmConfig::memlock_limit`](crate::MmConfig::memlock_limit), pages
    /// already locked in the range counted once), then `EINVAL` if the
    /// range wraps, `ENOMEM` if part of it is unmapped (the VMAs before the
    /// hole stay locked, as on Linux) or a split would pass
    /// `max_map_count`; after the lock, `ENOMEM` if a page could not be
    /// faulted in (a `PROT_NONE` VMA, a page past the end of its file) and
    /// `EAGAIN` if memory ran out — the range stays locked then. Hugetlb
    /// VMAs are faulted in but never locked, as on Linux.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, MmConfig, PhysConfig, PhysMem};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4 << 12, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// mm.mlock(a + 4096, 4096).unwrap();
    /// assert_eq!(mm.stats().locked_pages, 1);
    /// assert_eq!(mm.maps().len(), 3); // split around the locked page
    /// mm.munlock(a, 4 << 12).unwrap();
    /// assert_eq!(mm.maps().len(), 1); // merged back
    /// ```
    pub fn mlock(&self, addr: u64, len: u64) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        self.do_mlock(addr, len, VmFlags::LOCKED)
    }

    /// `mlock2(addr, len, flags)`: [`AddressSpace::mlock`], or with
    /// `MLOCK_ONFAULT` a lock of the pages as they are faulted in (nothing
    /// is populated). `EINVAL` for any other flag, before anything else.
    pub fn mlock2(&self, addr: u64, len: u64, flags: i32) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        if flags & !MLOCK_ONFAULT != 0 {
            return Err(Errno::Inval);
        }
        let mut vm_flags = VmFlags::LOCKED;
        if flags & MLOCK_ONFAULT != 0 {
            vm_flags |= VmFlags::LOCKONFAULT;
        }
        self.do_mlock(addr, len, vm_flags)
    }

    /// `munlock(addr, len)`: unlocks `[addr & PAGE_MASK, addr + len)`.
    /// `EINVAL` if the range wraps, `ENOMEM` if part of it is unmapped (the
    /// VMAs before the hole are unlocked) or a split would pass
    /// `max_map_count`. Never refused for the limit.
    pub fn munlock(&self, addr: u64, len: u64) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let (start, len) = lock_range(addr, len);
        let mut st = self.write_lock();
        self.apply_vma_lock_flags(&mut st, start, len, VmFlags::empty())
    }

    /// `mlockall(flags)`: `MCL_CURRENT` locks every mapping now (and faults
    /// them in unless `MCL_ONFAULT`), `MCL_FUTURE` makes every later mapping
    /// locked (`mm->def_flags`: `mmap`, `brk`, stack growth, with the limit
    /// checked for each: `EAGAIN` for `mmap`, a refused `brk`, `ENOMEM` for
    /// the stack). `EINVAL` for no flag, an unknown flag or `MCL_ONFAULT`
    /// alone; `EPERM` if the memlock limit is zero without `CAP_IPC_LOCK`;
    /// `ENOMEM` with `MCL_CURRENT` if every mapped page (`total_vm`) passes
    /// the limit. A call replaces the previous `MCL_FUTURE` state; errors of
    /// single VMAs (a split past `max_map_count`) are ignored, as Linux does.
    pub fn mlockall(&self, flags: i32) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        if flags == 0 || flags & !(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0 || flags == MCL_ONFAULT {
            return Err(Errno::Inval);
        }
        if !self.config.can_do_mlock() {
            return Err(Errno::Perm);
        }
        let mut st = self.write_lock();
        let limit = self.config.memlock_limit >> PAGE_SHIFT;
        if flags & MCL_CURRENT != 0 && self.total_vm(&st.vmas) > limit && !self.config.cap_ipc_lock {
            return Err(Errno::NoMem);
        }
        self.apply_mlockall_flags(&mut st, flags);
        drop(st);
        if flags & MCL_CURRENT != 0 {
            crate::populate::mm_populate(self, 0, self.config.task_size);
        }
        Ok(())
    }

    /// `munlockall()`: unlocks every mapping and clears `MCL_FUTURE`.
    /// Always succeeds.
    pub fn munlockall(&self) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let mut st = self.write_lock();
        self.apply_mlockall_flags(&mut st, 0);
        Ok(())
    }

    /// Linux's `do_mlock`.
    fn do_mlock(&self, addr: u64, len: u64, flags: VmFlags) -> Result<()> {
        if !self.config.can_do_mlock() {
            return Err(Errno::Perm);
        }
        let (start, len) = lock_range(addr, len);
        let limit = self.config.memlock_limit >> PAGE_SHIFT;
        let mut st = self.write_lock();
        let mut locked = (len >> PAGE_SHIFT).saturating_add(locked_vm(&st.vmas));
        if locked > limit && !self.config.cap_ipc_lock {
            // Pages of the range already locked are not locked twice.
            locked = locked.saturating_sub(count_mm_mlocked_page_nr(&st, start, len));
        }
        if locked > limit && !self.config.cap_ipc_lock {
            return Err(Errno::NoMem);
        }
        self.apply_vma_lock_flags(&mut st, start, len, flags)?;
        drop(st);
        // __mlock_posix_error_return: a page that cannot be faulted in is
        // ENOMEM, memory running out EAGAIN.
        let end = start.wrapping_add(len);
        crate::populate::populate_range(self, start, end, false).map_err(|e| match e {
            Errno::NoMem => Errno::Again,
            _ => Errno::NoMem,
        })
    }

    /// Linux's `apply_vma_lock_flags`: gives each VMA of `[start, start +
    /// len)` the lock flags `flags` (`VM_LOCKED_MASK` bits), stopping with
    /// `ENOMEM` at a hole.
    fn apply_vma_lock_flags(&self, st: &mut MmState, start: u64, len: u64, flags: VmFlags) -> Result<()> {
        let end = start.wrapping_add(len);
        if end < start {
            return Err(Errno::Inval);
        }
        if end == start {
            return Ok(());
        }
        // vma_iter_load: the VMA containing `start`.
        if st.vmas.find(start).is_none() {
            return Err(Errno::NoMem);
        }
        // `tmp` is where the next VMA must start; a VMA the previous step
        // merged forward starts before it.
        let mut tmp = start;
        while tmp < end {
            let Some(v) = st.vmas.find_from(tmp).cloned() else { break };
            if v.start >= end {
                break;
            }
            if v.start > tmp {
                return Err(Errno::NoMem);
            }
            let newflags = (v.flags & !VmFlags::LOCKED_MASK) | flags;
            let stop = v.end.min(end);
            self.mlock_fixup(st, &v, tmp, stop, newflags)?;
            tmp = stop;
        }
        if tmp < end {
            return Err(Errno::NoMem);
        }
        Ok(())
    }

    /// Linux's `apply_mlockall_flags`: sets `def_flags` for `MCL_FUTURE`
    /// and, with `MCL_CURRENT` or for `munlockall` (`flags` 0), gives every
    /// VMA the lock flags, ignoring a VMA that fails.
    fn apply_mlockall_flags(&self, st: &mut MmState, flags: i32) {
        st.def_flags &= !VmFlags::LOCKED_MASK;
        let onfault = if flags & MCL_ONFAULT != 0 { VmFlags::LOCKONFAULT } else { VmFlags::empty() };
        if flags & MCL_FUTURE != 0 {
            st.def_flags |= VmFlags::LOCKED | onfault;
            if flags & MCL_CURRENT == 0 {
                return;
            }
        }
        let to_add = if flags & MCL_CURRENT != 0 { VmFlags::LOCKED | onfault } else { VmFlags::empty() };
        let mut a = 0;
        while let Some(v) = st.vmas.find_from(a).cloned() {
            let start = a.max(v.start);
            a = v.end;
            let newflags = (v.flags & !VmFlags::LOCKED_MASK) | to_add;
            let _ = self.mlock_fixup(st, &v, start, v.end, newflags);
        }
    }

    /// Linux's `mlock_fixup`: `[start, end)` of `vma` gets `newflags`,
    /// split from or merged with its neighbours; nothing for a VMA that
    /// cannot be locked.
    fn mlock_fixup(&self, st: &mut MmState, vma: &Arc<Vma>, start: u64, end: u64, newflags: VmFlags) -> Result<()> {
        if newflags == vma.flags || !vma_supports_mlock(vma.flags) {
            return Ok(());
        }
        let vma = self.host_file_windows_merged(st, vma, start, end, newflags, vma.policy.as_ref());
        self.vma_modify_flags(st, &vma, start, end, newflags)
    }
}

/// `do_mlock`'s and `munlock`'s range: the start rounded down to its page,
/// the length grown by the offset in the page and rounded up, wrapping as
/// Linux's unsigned arithmetic does.
fn lock_range(addr: u64, len: u64) -> (u64, u64) {
    let len = page_align(len.wrapping_add(addr & (PAGE_SIZE - 1)));
    (addr & !(PAGE_SIZE - 1), len)
}

/// Linux's `count_mm_mlocked_page_nr`: pages of `VM_LOCKED` VMAs within
/// `[start, start + len)` (the end saturating).
fn count_mm_mlocked_page_nr(st: &MmState, start: u64, len: u64) -> u64 {
    let end = start.saturating_add(len);
    crate::mm::commit::pages_with(&st.vmas, start, end, VmFlags::LOCKED)
}
