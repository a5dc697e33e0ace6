//! `mprotect`. The VMA change it shares with `madvise` and `mbind`
//! (`vma_modify_flags`: merge or split) is `mm/vma.rs`'s.

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::VmFlags;
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use crate::mm::{AddressSpace, MmState, MmuGather};

impl AddressSpace {
    /// `mprotect(addr, len, prot)`.
    ///
    /// In Linux's order: `EINVAL` for both `PROT_GROWSDOWN` and
    /// `PROT_GROWSUP`, then for an unaligned address, then (after a zero
    /// length, which succeeds, and a wrapping range, `ENOMEM`) for unknown
    /// `prot` bits; `ENOMEM` if any part of the range is unmapped; `EINVAL`
    /// for `PROT_GROWSUP` (x86 has no upward stacks) or `PROT_GROWSDOWN` on a
    /// VMA that does not grow down; `EACCES` if a file mapping's open mode
    /// forbids the protection; `ENOMEM` if making a private mapping writable
    /// exceeds the commit limit. As on Linux, VMAs before the first failure
    /// keep their new protection.
    pub fn mprotect(&self, addr: u64, len: u64, prot: i32) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        // do_mprotect_pkey's order: the grows bits, alignment, length, then
        // the remaining bits (arch_validate_prot).
        let grows = prot & (PROT_GROWSDOWN | PROT_GROWSUP);
        let prot = prot & !grows;
        if grows == (PROT_GROWSDOWN | PROT_GROWSUP) {
            return Err(Errno::Inval);
        }
        if addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        if len == 0 {
            return Ok(());
        }
        let len = page_align(len);
        let end = addr.wrapping_add(len);
        if end <= addr {
            return Err(Errno::NoMem);
        }
        if prot & !(PROT_READ | PROT_WRITE | PROT_EXEC | 0x8/* PROT_SEM */) != 0 {
            return Err(Errno::Inval);
        }
        let prot = prot | grows;
        // Range-parallel writers: inside one window, without mmap_lock.
        if let Some(res) = self.range_mprotect(addr, end, prot) {
            return res;
        }
        let mut tlb = MmuGather::default();
        let mut st = self.write_lock();
        let mut populate = Vec::new();
        let res = self.do_mprotect(&mut st, addr, end, prot, &mut tlb, &mut populate);
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        drop(st);
        // mprotect_fixup: a locked private mapping made writable is faulted
        // in for write, so it gets its own pages as mlock promised (Linux
        // does it under the lock; faults here take it for read).
        for (start, end) in populate {
            crate::populate::mm_populate(self, start, end);
        }
        res
    }

    /// `mprotect` of `[start, end)` as a range writer (`mm/range.rs`), or
    /// `None` (nothing changed) for the `mmap_lock` path: also for
    /// `PROT_GROWSDOWN`/`PROT_GROWSUP` and a VMA at its window's bounds,
    /// which could merge with one of the next window.
    fn range_mprotect(&self, start: u64, end: u64, prot: i32) -> Option<Result<()>> {
        if !self.config.writer_policy.range_writers() || prot & (PROT_GROWSDOWN | PROT_GROWSUP) != 0 {
            return None;
        }
        let res = self.range_write_span(start, end, crate::mm::range::Neighbours::default(), |mm, st, tlb| {
            if !mm.range_touch_ok(st, start, end) {
                return None;
            }
            let mut populate = Vec::new();
            let res = mm.do_mprotect(st, start, end, prot, tlb, &mut populate);
            // Only a locked VMA is populated, and none is a range writer's.
            debug_assert!(populate.is_empty());
            Some(res)
        });
        self.range_count_fallback(res.is_none());
        res
    }

    fn do_mprotect(
        &self,
        st: &mut MmState,
        mut start: u64,
        end: u64,
        prot: i32,
        tlb: &mut MmuGather,
        populate: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let Some(first) = st.vmas.find_from(start).cloned() else {
            return Err(Errno::NoMem);
        };
        if prot & PROT_GROWSDOWN != 0 {
            if first.start >= end {
                return Err(Errno::NoMem);
            }
            if !first.flags.contains(VmFlags::GROWSDOWN) {
                return Err(Errno::Inval);
            }
            start = first.start;
        } else {
            if first.start > start {
                return Err(Errno::NoMem);
            }
            if prot & PROT_GROWSUP != 0 {
                // x86 has no VM_GROWSUP.
                return Err(Errno::Inval);
            }
        }
        // `tmp` is where the next VMA must start (a hole is ENOMEM); a VMA
        // that the previous step merged forward may start before it.
        let mut tmp = start;
        let want = VmFlags::from_prot(prot);
        while tmp < end {
            let Some(v) = st.vmas.find_from(tmp).cloned() else { break };
            if v.start >= end {
                break;
            }
            if v.start > tmp {
                return Err(Errno::NoMem);
            }
            let mut newflags = want | (v.flags & !VmFlags::ACCESS_FLAGS);
            // VM_MAY* sit four bits above VM_*: a bit without its MAY twin is refused.
            if !newflags.access_without_may().is_empty() {
                return Err(Errno::Acces);
            }
            // Memory-deny-write-execute (sys/mdwe.rs), then mprotect_fixup's
            // seal (sys/mseal.rs), even for no change.
            if super::mdwe::map_deny_write_exec(st.mdwe, v.flags, newflags) {
                return Err(Errno::Acces);
            }
            super::mseal::check_unsealed(&v)?;
            let range_end = v.end.min(end);
            // Linux's mprotect_fixup accounting: a private mapping turning
            // writable is charged, an untouched anonymous one turning
            // read-only is uncharged. hugetlb is never charged: its pool
            // reservation covers its pages, writable or not.
            let nrpages = (range_end - tmp) >> PAGE_SHIFT;
            let mut charged = 0;
            if newflags.contains(VmFlags::WRITE) {
                let uncharged =
                    VmFlags::ACCOUNT | VmFlags::WRITE | VmFlags::HUGETLB | VmFlags::SHARED | VmFlags::NORESERVE;
                if !v.flags.intersects(uncharged) {
                    self.phys.vm_enough_memory(nrpages, || self.total_vm(&st.vmas))?;
                    charged = nrpages;
                    newflags |= VmFlags::ACCOUNT;
                }
            } else if v.flags.contains(VmFlags::ACCOUNT) && v.is_anonymous() && v.anon_vma.get().is_none() {
                newflags &= !VmFlags::ACCOUNT;
            }
            if newflags != v.flags {
                let v = self.host_file_windows_merged(st, &v, tmp, range_end, newflags, v.policy.as_ref());
                if let Err(e) = self.vma_modify_flags(st, &v, tmp, range_end, newflags) {
                    self.phys.vm_unacct_memory(charged);
                    return Err(e);
                }
                if v.flags.contains(VmFlags::ACCOUNT) && !newflags.contains(VmFlags::ACCOUNT) {
                    self.phys.vm_unacct_memory(nrpages);
                }
                self.change_protection(tmp, range_end, newflags, tlb);
                if v.flags & (VmFlags::WRITE | VmFlags::SHARED | VmFlags::LOCKED) == VmFlags::LOCKED
                    && newflags.contains(VmFlags::WRITE)
                {
                    populate.push((tmp, range_end));
                }
            }
            tmp = range_end;
        }
        if tmp < end {
            return Err(Errno::NoMem);
        }
        Ok(())
    }
}
