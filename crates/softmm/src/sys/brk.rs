//! `brk`: the heap.

use crate::vma::VmFlags;
use crate::vma::Vma;
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use super::mmap::accountable;
use crate::mm::commit::locked_vm;
use crate::mm::{AddressSpace, MmuGather};

impl AddressSpace {
    /// `brk(addr)`: moves the end of the heap and returns the new break, or
    /// the unchanged break when the request is refused (below the heap's
    /// start, into another mapping or its guard gap, or no memory) — Linux's
    /// brk never returns an errno.
    pub fn brk(&self, brk: u64) -> u64 {
        let _q = crate::tlb::QuiescentGuard::enter();
        let tlb = MmuGather::default();
        // Wait for a lock-free unmap still zapping what the heap would grow
        // into or shrink from.
        let mut st = self.write_lock_clear_of(|st| {
            let (lo, hi) = (brk.min(st.brk), brk.max(st.brk));
            [(lo & !(PAGE_SIZE - 1), page_align(hi).saturating_add(PAGE_SIZE)), (0, 0)]
        });
        let orig = st.brk;
        let mut shrink = None;
        let mut populate = None;
        let result = 'out: {
            if brk < st.start_brk || brk > self.config.task_size {
                break 'out orig;
            }
            let newbrk = page_align(brk);
            let oldbrk = page_align(st.brk);
            if newbrk == oldbrk {
                st.brk = brk;
                break 'out brk;
            }
            if brk <= st.brk {
                // Shrink: only the heap's own VMA may be cut.
                let Some(v) = st.vmas.find_from(newbrk).cloned() else { break 'out orig };
                if v.start >= oldbrk {
                    break 'out orig;
                }
                // The unmap policy's path, below, with the lock.
                shrink = Some((newbrk, oldbrk));
                break 'out brk;
            }
            // Grow: the new heap end plus a page must stay below the next
            // VMA's guard gap.
            if let Some(next) = st.vmas.find_from(oldbrk) {
                if newbrk + PAGE_SIZE > next.start_gap(self.config.stack_guard_gap) {
                    break 'out orig;
                }
            }
            if st.vmas.len() > self.config.max_map_count {
                break 'out orig;
            }
            // do_brk_flags charges the growth: brk(TASK_SIZE) asks for more
            // than the machine has and is refused.
            // check_brk_limits: with mlockall(MCL_FUTURE), the memlock limit.
            let def_flags = st.def_flags;
            if !self.config.mlock_future_ok(def_flags, newbrk - oldbrk, || locked_vm(&st.vmas)) {
                break 'out orig;
            }
            if self.phys.vm_enough_memory((newbrk - oldbrk) >> PAGE_SHIFT, || self.total_vm(&st.vmas)).is_err() {
                break 'out orig;
            }
            populate = def_flags.contains(VmFlags::LOCKED).then_some((oldbrk, newbrk));
            let mut flags =
                VmFlags::READ | VmFlags::WRITE | VmFlags::MAYREAD | VmFlags::MAYWRITE | VmFlags::MAYEXEC | def_flags;
            if accountable(flags) {
                flags |= VmFlags::ACCOUNT;
            }
            let heap = Vma::new(&self.phys, oldbrk, newbrk, flags, oldbrk >> PAGE_SHIFT, None, None);
            // do_brk_flags only expands `brkvma`, the VMA below the old
            // break that reaches past `start_brk` (`vma_prev_limit`), if it
            // ends at the old break; a new heap VMA merges with nothing (a
            // mapping ending at `start_brk` stays apart). Nothing lies at
            // the new break: the guard gap check above keeps a page free.
            let expands = st.vmas.prev_of(oldbrk).is_some_and(|v| v.end == oldbrk && v.end > st.start_brk);
            if expands {
                self.insert_merged(&mut st, heap);
            } else {
                st.vmas.insert(heap);
            }
            st.brk = brk;
            brk
        };
        if let Some((lo, hi)) = shrink {
            // do_vmi_align_munmap(..., unlock=true) after setting the break.
            tlb.finish(self);
            return match self.vm_munmap(st, lo, hi, |st| st.brk = brk) {
                Ok(()) => brk,
                Err(_) => orig,
            };
        }
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        drop(st);
        if let Some((lo, hi)) = populate {
            // brk: a heap grown under mlockall(MCL_FUTURE) is faulted in.
            crate::populate::mm_populate(self, lo, hi);
        }
        result
    }
}
