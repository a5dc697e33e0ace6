//! `mremap`: shrink, grow in place, or move (Linux 6.x `mm/mremap.c`).

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::VmFlags;
use crate::vma::{Vma, VmaTree};
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use crate::mm::commit::locked_vm;
use crate::mm::layout::{get_unmapped_area_avoiding, AreaFlags, AreaKind, Obstacles};
use crate::mm::{AddressSpace, MmState, MmuGather};

mod range;

impl AddressSpace {
    /// `mremap(old_addr, old_len, new_len, flags, new_addr)`; returns the new address.
    ///
    /// `EINVAL` for unknown flags, an unaligned address, a zero new length,
    /// `MREMAP_FIXED` or `MREMAP_DONTUNMAP` without `MREMAP_MAYMOVE`,
    /// `MREMAP_DONTUNMAP` with a size change, overlapping source and
    /// destination (fixed, or a `MREMAP_DONTUNMAP` hint), or a shrink whose
    /// unmapped tail passes `task_size`; `EFAULT` if `old_addr` is unmapped
    /// or the old range crosses the end of its VMA; `EPERM` for a destination
    /// below `mmap_min_addr`; `EAGAIN` if a locked mapping would grow past
    /// the memlock limit; `ENOMEM` if growing in place is impossible without
    /// `MREMAP_MAYMOVE`, no room is left or the commit limit refuses the
    /// growth. Arithmetic on the lengths wraps where Linux's does and never
    /// panics.
    pub fn mremap(&self, old_addr: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64> {
        let _q = crate::tlb::QuiescentGuard::enter();
        // check_mremap_params (Linux 6.17+ checks the new range up front).
        let task = self.config.task_size;
        if flags & !(MREMAP_FIXED | MREMAP_MAYMOVE | MREMAP_DONTUNMAP) != 0 {
            return Err(Errno::Inval);
        }
        if old_addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        // PAGE_ALIGN wraps a length within a page of 2^64 to 0, as in Linux.
        let old_len = page_align(old_len);
        let new_len = page_align(new_len);
        if new_len == 0 || new_len > task {
            return Err(Errno::Inval);
        }
        let implies_new_addr = flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0;
        if implies_new_addr {
            if new_addr > task - new_len || new_addr % PAGE_SIZE != 0 {
                return Err(Errno::Inval);
            }
            if flags & MREMAP_MAYMOVE == 0 {
                return Err(Errno::Inval);
            }
            if flags & MREMAP_DONTUNMAP != 0 && old_len != new_len {
                return Err(Errno::Inval);
            }
            // vrm_overlaps, for a fixed target and a DONTUNMAP hint alike,
            // with Linux's unsigned (wrapping) end of the old range.
            if old_addr.wrapping_add(old_len) > new_addr && new_addr + new_len > old_addr {
                return Err(Errno::Inval);
            }
        }
        // Range-parallel writers: inside one window, without mmap_lock.
        if let Some(res) = self.range_mremap(old_addr, old_len, new_len, flags, new_addr) {
            return res;
        }
        let mut tlb = MmuGather::default();
        // Wait for a lock-free unmap still zapping the source, its in-place
        // growth or a fixed target (a moved mapping goes around one).
        let source = (old_addr, old_addr.saturating_add(old_len.max(new_len)));
        let target = if implies_new_addr { (new_addr, new_addr + new_len) } else { (0, 0) };
        let mut st = self.write_lock_clear_of(|_| [source, target]);
        let mut tail = None;
        let res = if implies_new_addr && st.vmas.len() + 2 >= self.config.max_map_count.saturating_sub(3) {
            // move_vma needs four maps below the limit and both ranges may
            // split in three: refuse before unmapping anything.
            Err(Errno::NoMem)
        } else {
            self.do_mremap(&mut st, old_addr, old_len, new_len, flags, new_addr, &mut tlb, &mut tail)
        };
        if let (Ok(a), Some((start, end))) = (res, tail) {
            // An in-place shrink: the tail goes through the unmap policy,
            // as Linux's mremap downgrades for it.
            tlb.finish(self);
            return self.vm_munmap(st, start, end, |_| {}).map(|()| a);
        }
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        drop(st);
        if let Ok(a) = res {
            // A grown locked mapping has its new pages faulted in, after
            // mmap_lock is dropped (mremap's mm_populate).
            let grown =
                new_len > old_len && self.read_lock().vmas.find(a).is_some_and(|v| v.flags.contains(VmFlags::LOCKED));
            if grown {
                crate::populate::mm_populate(self, a + old_len, a + new_len);
            }
        }
        res
    }

    /// The call under `mmap_lock` for write, or as a range writer on its
    /// window's view (`range.rs`); an in-place shrink leaves its
    /// tail in `tail` for the caller to unmap.
    #[allow(clippy::too_many_arguments)]
    fn do_mremap(
        &self,
        st: &mut MmState,
        addr: u64,
        mut old_len: u64,
        mut new_len: u64,
        flags: i32,
        new_addr: u64,
        tlb: &mut MmuGather,
        tail: &mut Option<(u64, u64)>,
    ) -> Result<u64> {
        // A sealed VMA is never moved or resized (sys/mseal.rs), checked
        // right after the lookup.
        if let Some(v) = st.vmas.find(addr) {
            super::mseal::check_unsealed(v)?;
        }
        if st.vmas.find(addr).is_some_and(|v| v.flags.contains(VmFlags::HUGETLB)) {
            // Lengths rounded up to huge pages, both addresses aligned, and
            // no expansion: the reservations cannot follow a split one.
            let huge = crate::hugetlb::HPAGE_SIZE;
            old_len = old_len.checked_add(huge - 1).ok_or(Errno::Inval)? & !(huge - 1);
            new_len = new_len.checked_add(huge - 1).ok_or(Errno::Inval)? & !(huge - 1);
            if addr % huge != 0 || new_addr % huge != 0 || new_len > old_len {
                return Err(Errno::Inval);
            }
        }
        if flags & MREMAP_FIXED != 0 && old_len == new_len {
            return self.remap_move(st, addr, old_len, flags, new_addr, tlb);
        }
        let vma = st.vmas.find(addr).cloned().ok_or(Errno::Fault)?;
        if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 {
            // Linux 6.17+ validates the VMA (check_prep_vma) before it
            // unmaps the target; a shrink may cross VMA boundaries in the
            // part it unmaps.
            self.remap_is_valid(&st.vmas, &vma, addr, old_len.min(new_len), new_len, flags)?;
            return self.mremap_to(st, addr, old_len, new_len, flags, new_addr, tlb);
        }
        if new_len == old_len {
            return Ok(addr);
        }
        if new_len < old_len {
            // shrink_vma: do_vmi_munmap with its range checks; the start
            // wraps as Linux's unsigned sum does.
            let start = addr.wrapping_add(new_len);
            *tail = Some((start, Self::munmap_end(self.config.task_size, start, old_len - new_len)?));
            return Ok(addr);
        }
        // expand_vma: in place if the old range ends the VMA and the space
        // after it is free, else move.
        self.remap_is_valid(&st.vmas, &vma, addr, old_len, new_len, flags)?;
        // A coherent window onto a host file first gets one over all the
        // VMA will map.
        self.grow_host_file_window(st, addr, new_len)?;
        let vma = st.vmas.find(addr).cloned().ok_or(Errno::Fault)?;
        let delta = new_len - old_len;
        let in_place = vma.end - addr == old_len
            && vma.end.checked_add(delta).is_some_and(|e| e <= self.config.task_size)
            && st.vmas.overlapping(vma.end, vma.end + delta).next().is_none();
        if in_place {
            if vma.flags.contains(VmFlags::ACCOUNT) {
                self.phys.vm_enough_memory(delta >> PAGE_SHIFT, || self.total_vm(&st.vmas))?;
            }
            // vma_merge_extend: the extension joins this VMA, and the next one
            // too when it becomes adjacent and compatible.
            let grown = vma.rebound(vma.start, vma.end + delta, vma.pgoff);
            st.vmas.remove(vma.start);
            self.insert_merged(st, grown);
            return Ok(addr);
        }
        if flags & MREMAP_MAYMOVE == 0 {
            return Err(Errno::NoMem);
        }
        let dst = self.mremap_target(st, addr, new_len, flags, 0)?;
        self.move_vma(st, addr, old_len, new_len, dst, false, tlb)
    }

    /// `do_vmi_munmap(start, len)` with its checks: `EINVAL` for an
    /// unaligned start, a range past `task_size` or an empty one.
    fn munmap_checked(&self, st: &mut MmState, start: u64, len: u64, tlb: &mut MmuGather) -> Result<()> {
        let end = Self::munmap_end(self.config.task_size, start, len)?;
        self.do_munmap(st, start, end, tlb)
    }

    /// The end of `do_vmi_munmap(start, len)`'s range, or its `EINVAL`.
    fn munmap_end(task: u64, start: u64, len: u64) -> Result<u64> {
        if start % PAGE_SIZE != 0 || start > task || len > task - start {
            return Err(Errno::Inval);
        }
        let len = page_align(len);
        if len == 0 {
            return Err(Errno::Inval);
        }
        Ok(start + len)
    }

    /// Linux's `remap_is_valid`: the checks of a resize or move that need
    /// the VMA at `addr`.
    fn remap_is_valid(
        &self,
        vmas: &VmaTree,
        vma: &Vma,
        addr: u64,
        old_len: u64,
        new_len: u64,
        flags: i32,
    ) -> Result<()> {
        super::mseal::check_unsealed(vma)?;
        if old_len == 0 && !vma.flags.intersects(VmFlags::SHARED | VmFlags::MAYSHARE) {
            return Err(Errno::Inval);
        }
        if flags & MREMAP_DONTUNMAP != 0 && vma.flags.contains(VmFlags::DONTEXPAND) {
            return Err(Errno::Inval);
        }
        if old_len > vma.end - addr {
            return Err(Errno::Fault);
        }
        if new_len == old_len {
            return Ok(());
        }
        if vma.pgoff_at(addr).checked_add(new_len >> PAGE_SHIFT).is_none() {
            return Err(Errno::Inval);
        }
        if vma.flags.contains(VmFlags::DONTEXPAND) {
            return Err(Errno::Fault);
        }
        let delta = new_len.abs_diff(old_len);
        if !self.config.mlock_future_ok(vma.flags, delta, || locked_vm(vmas)) {
            return Err(Errno::Again);
        }
        Ok(())
    }

    /// Linux's `mremap_to`: a move to `new_addr` (fixed, or a hint with
    /// `MREMAP_DONTUNMAP`), unmapping the target first when fixed.
    #[allow(clippy::too_many_arguments)]
    fn mremap_to(
        &self,
        st: &mut MmState,
        addr: u64,
        mut old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
        tlb: &mut MmuGather,
    ) -> Result<u64> {
        if flags & MREMAP_FIXED != 0 {
            self.do_munmap(st, new_addr, new_addr + new_len, tlb)?;
            st.vmas.find(addr).ok_or(Errno::Fault)?;
        }
        if new_len < old_len {
            self.munmap_checked(st, addr.wrapping_add(new_len), old_len - new_len, tlb)?;
            old_len = new_len;
        }
        let vma = st.vmas.find(addr).cloned().ok_or(Errno::Fault)?;
        self.remap_is_valid(&st.vmas, &vma, addr, old_len, new_len, flags)?;
        if new_len > old_len {
            self.grow_host_file_window(st, addr, new_len)?;
        }
        let dst = self.mremap_target(st, addr, new_len, flags, new_addr)?;
        self.move_vma(st, addr, old_len, new_len, dst, flags & MREMAP_DONTUNMAP != 0, tlb)
    }

    /// Linux 6.17's `remap_move`: a fixed move of unchanged size may span
    /// several VMAs (but may not start in a hole); each is moved to the same
    /// offset from the previous one's new end, so the gaps between them are
    /// kept, and only the targets of VMAs are unmapped first.
    fn remap_move(
        &self,
        st: &mut MmState,
        start: u64,
        len: u64,
        flags: i32,
        new_addr: u64,
        tlb: &mut MmuGather,
    ) -> Result<u64> {
        // Unsigned, as in Linux: an end past 2^64 wraps (and then no VMA lies
        // below it).
        let end = start.wrapping_add(len);
        let mut res = Err(Errno::Fault);
        let mut target = new_addr;
        let mut last_end = 0;
        let mut cursor = start;
        // Linux's for_each_vma_range resumes after the VMA as it was found, and
        // only below `end`: a moved piece that merged back into its source
        // (MREMAP_DONTUNMAP next to the source) is not visited again.
        while let Some(vma) = st.vmas.find_from(cursor).filter(|v| cursor < end && v.start < end).cloned() {
            let seen = res.is_ok();
            let addr = vma.start.max(start);
            let part = end.min(vma.end) - addr;
            if !seen && start < vma.start {
                return Err(Errno::Fault);
            }
            // Unsigned, as in Linux: VMAs are visited in address order.
            let offset = if seen { vma.start.wrapping_sub(last_end) } else { 0 };
            last_end = vma.end;
            self.remap_is_valid(&st.vmas, &vma, addr, part, part, flags)?;
            let moved = self.mremap_to(st, addr, part, part, flags, target.wrapping_add(offset), tlb)?;
            if !seen {
                res = Ok(moved);
            }
            target = moved + part;
            cursor = vma.end;
        }
        res
    }

    /// Linux's `vrm_set_new_addr`: where a moving mremap goes (`EPERM` below
    /// `mmap_min_addr`, as `get_unmapped_area` checks for mmap).
    fn mremap_target(&self, st: &MmState, addr: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64> {
        let vma = st.vmas.find(addr).ok_or(Errno::Fault)?;
        let kind = if vma.flags.contains(VmFlags::HUGETLB) {
            AreaKind::Huge(crate::hugetlb::HPAGE_SIZE)
        } else if vma.file.is_none() && !vma.flags.contains(VmFlags::MAYSHARE) {
            AreaKind::Anon
        } else {
            AreaKind::Other
        };
        let hint = if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 { new_addr } else { 0 };
        let fixed = flags & MREMAP_FIXED != 0;
        // A fixed target was waited for; any other goes around reserved ranges.
        let reserved = if fixed { &[][..] } else { &st.reserved[..] };
        let obstacles = Obstacles { vmas: &st.vmas, reserved };
        get_unmapped_area_avoiding(&self.config, obstacles, kind, hint, new_len, AreaFlags::fixed(fixed))
    }

    /// Linux's `move_vma`: a copy of the VMA part `[addr, addr+old_len)` grown
    /// to `new_len` at `dst`, its page-table entries moved there, then the old
    /// range unmapped (or, with `MREMAP_DONTUNMAP`, left mapped and empty).
    #[allow(clippy::too_many_arguments)]
    fn move_vma(
        &self,
        st: &mut MmState,
        addr: u64,
        old_len: u64,
        new_len: u64,
        dst: u64,
        dontunmap: bool,
        tlb: &mut MmuGather,
    ) -> Result<u64> {
        let vma = st.vmas.find(addr).cloned().ok_or(Errno::Fault)?;
        // do_munmap of the source may split it in three.
        if st.vmas.len() >= self.config.max_map_count.saturating_sub(3) {
            return Err(Errno::NoMem);
        }
        // vrm_calc_charge: the growth, or the whole copy when the source
        // stays; the moved part keeps the source's charge.
        let accounted = vma.flags.contains(VmFlags::ACCOUNT);
        if accounted {
            let charge = if dontunmap { new_len } else { new_len - old_len };
            self.phys.vm_enough_memory(charge >> PAGE_SHIFT, || self.total_vm(&st.vmas))?;
        }
        // Never-faulted anonymous memory takes the linear index of its new home.
        let pgoff =
            if vma.is_anonymous() && vma.anon_vma.get().is_none() { dst >> PAGE_SHIFT } else { vma.pgoff_at(addr) };
        let moved = vma.rebound(dst, dst + new_len, pgoff);
        // The source VMA is detached before its entries move (Linux
        // write-locks it, `vma_start_write`): a lock-free fault that found it
        // aborts instead of installing a page behind the move, and one that
        // finds its replacement (MREMAP_DONTUNMAP) is ordered after the move.
        // The destination gets its VMA only once its entries are in place, so
        // no fault can fill it meanwhile.
        let span = if !dontunmap {
            // Cannot fail: the map count was checked above.
            self.detach_vmas_keep_charge(st, addr, addr + old_len)?
        } else {
            let mut stays = vma.rebound(vma.start, vma.end, vma.pgoff);
            // move_vma: the source VMA, all of it, is never locked after.
            stays.flags &= !VmFlags::LOCKED_MASK;
            if vma.start == addr && vma.end == addr + old_len {
                // The whole VMA moved: the empty source leaves its anon_vma
                // behind (unlink_anon_vmas), which decides its later merges.
                stays.set_anon(None);
            }
            st.vmas.replace(vma.start, stays);
            None
        };
        self.move_ptes(addr, dst, old_len, tlb);
        self.insert_merged(st, moved);
        if let Some((lo, hi)) = span {
            self.free_pgtables(st, lo, hi, tlb);
        }
        Ok(dst)
    }
}
