//! Growsdown stack expansion (Linux's `expand_downwards`), which a fault
//! below a stack VMA asks for: the one change of the VMA tree that the fault
//! handler makes, always with `mmap_lock` held for write (never an upgrade of
//! the read lock: the StackRot fix).

use crate::error::{Errno, Result};
use crate::vma::VmFlags;
use crate::PAGE_SIZE;

use super::AddressSpace;

impl AddressSpace {
    /// Grows the growsdown VMA above `addr` down to cover it (Linux's
    /// `expand_downwards` under the write lock). `ENOMEM` if that would come
    /// within the guard gap of the VMA below, pass `mmap_min_addr`, or exceed
    /// the stack limit.
    pub(crate) fn expand_stack(&self, addr: u64) -> Result<()> {
        let new_start = addr & !(PAGE_SIZE - 1);
        // Never into a range a lock-free unmap is still zapping (Linux 5.8's
        // race): wait until its tables are gone, as the write lock waits for
        // a downgraded zap.
        let mut st = self.write_lock_clear_of(|st| match st.vmas.find_from(addr) {
            Some(v) if v.start > new_start => [(new_start, v.start), (0, 0)],
            _ => [(0, 0); 2],
        });
        let Some(vma) = st.vmas.find_from(addr).cloned() else {
            return Err(Errno::NoMem);
        };
        if vma.start <= addr {
            return Ok(()); // someone else grew it
        }
        if !vma.flags.contains(VmFlags::GROWSDOWN) || new_start < self.config.min_addr() {
            return Err(Errno::NoMem);
        }
        if let Some(prev) = st.vmas.prev_of(vma.start) {
            if !prev.flags.contains(VmFlags::GROWSDOWN)
                && prev.flags.intersects(VmFlags::ACCESS_FLAGS)
                && new_start.saturating_sub(prev.end) < self.config.stack_guard_gap
            {
                return Err(Errno::NoMem);
            }
            if prev.end > new_start {
                return Err(Errno::NoMem);
            }
        }
        if vma.end - new_start > self.config.stack_limit {
            return Err(Errno::NoMem);
        }
        let grow = (vma.start - new_start) / PAGE_SIZE;
        // acct_stack_growth: the memlock limit, then the commit charge.
        if !self.config.mlock_future_ok(vma.flags, grow * PAGE_SIZE, || super::commit::locked_vm(&st.vmas)) {
            return Err(Errno::NoMem);
        }
        if vma.flags.contains(VmFlags::ACCOUNT) {
            self.phys.vm_enough_memory(grow, || self.total_vm(&st.vmas))?;
        }
        let grown = vma.rebound(new_start, vma.end, vma.pgoff.wrapping_sub(grow));
        st.vmas.replace(vma.start, grown);
        Ok(())
    }
}
