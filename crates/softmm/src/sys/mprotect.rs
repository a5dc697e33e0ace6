//! `mprotect`, and the VMA flag change it shares with `madvise` (Linux's
//! `vma_modify_flags`: merge with a neighbour where possible, else split).

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::VmFlags;
use crate::vma::{anon_compatible, Vma};
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use crate::mm::commit::total_vm;
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
            let range_end = v.end.min(end);
            // Linux's mprotect_fixup accounting: a private mapping turning
            // writable is charged, an untouched anonymous one turning
            // read-only is uncharged.
            let nrpages = (range_end - tmp) >> PAGE_SHIFT;
            let mut charged = 0;
            if newflags.contains(VmFlags::WRITE) {
                if !v.flags.intersects(VmFlags::ACCOUNT | VmFlags::WRITE | VmFlags::SHARED | VmFlags::NORESERVE) {
                    self.phys.vm_enough_memory(nrpages, || total_vm(&st.vmas))?;
                    charged = nrpages;
                    newflags |= VmFlags::ACCOUNT;
                }
            } else if v.flags.contains(VmFlags::ACCOUNT) && v.is_anonymous() && v.anon_vma.get().is_none() {
                newflags &= !VmFlags::ACCOUNT;
            }
            if newflags != v.flags {
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

    /// Gives `[start, end)` of `vma` the flags `newflags`, merging with the
    /// previous or next VMA when the range touches it and they become
    /// compatible, splitting `vma` otherwise. `ENOMEM` if a split would exceed
    /// `max_map_count`; nothing changes then.
    pub(crate) fn vma_modify_flags(
        &self,
        st: &mut MmState,
        vma: &Arc<Vma>,
        start: u64,
        end: u64,
        newflags: VmFlags,
    ) -> Result<()> {
        if newflags == vma.flags {
            return Ok(());
        }
        let file = vma.file_id();
        let anon = vma.anon_vma.get();
        let pgoff = vma.pgoff_at(start);
        let pages = (end - start) / PAGE_SIZE;
        let prev = st.vmas.prev_of(vma.start).filter(|p| p.end == start && start == vma.start).cloned();
        let next = st.vmas.first_starting_at(vma.end).filter(|n| n.start == end && end == vma.end).cloned();
        let left = prev.as_ref().is_some_and(|p| p.can_merge_after(newflags, file, anon, pgoff));
        let mut right = next.as_ref().is_some_and(|n| n.can_merge_before(newflags, file, anon, pgoff, pages));
        if left && right {
            right = anon_compatible(
                prev.as_ref().and_then(|p| p.anon_vma.get()),
                next.as_ref().and_then(|n| n.anon_vma.get()),
            );
        }
        let union = |vs: &[Option<&Arc<Vma>>]| vs.iter().flatten().find_map(|v| v.anon_vma.get().cloned());
        // Splits needed when no merge absorbs an edge.
        let splits = (start > vma.start && !left) as usize + (end < vma.end && !right) as usize;
        if splits > 0 && st.vmas.len() + splits > self.config.max_map_count {
            return Err(Errno::NoMem);
        }
        // __split_vma: vm_ops->may_split (hugetlb splits only at 2 MiB).
        if start > vma.start && !left {
            vma.may_split(start)?;
        }
        if end < vma.end && !right {
            vma.may_split(end)?;
        }
        st.vmas.remove(vma.start);
        // __split_vma: hugetlb_split, once both splits are allowed and the
        // VMA is detached (Linux write-locks it first, `vma_start_write`):
        // a fault through it could link the window's table again.
        if start > vma.start && !left {
            self.hugetlb_split(vma, start);
        }
        if end < vma.end && !right {
            self.hugetlb_split(vma, end);
        }
        let mut lo = start;
        let mut hi = end;
        let mut anon_new = vma.anon_vma.get().cloned();
        let mut pg = pgoff;
        if left {
            let p = prev.as_ref().expect("left");
            st.vmas.remove(p.start);
            lo = p.start;
            pg = p.pgoff;
            anon_new = union(&[Some(p), Some(vma)]);
        } else if start > vma.start {
            st.vmas.insert(vma.slice(vma.start, start, vma.flags));
        }
        if right {
            let n = next.as_ref().expect("right");
            st.vmas.remove(n.start);
            hi = n.end;
            anon_new = anon_new.or_else(|| union(&[Some(n)]));
        } else if end < vma.end {
            st.vmas.insert(vma.slice(end, vma.end, vma.flags));
        }
        let mut merged = vma.rebound(lo, hi, pg);
        merged.flags = newflags;
        merged.set_anon(anon_new);
        st.vmas.insert(merged);
        Ok(())
    }
}
