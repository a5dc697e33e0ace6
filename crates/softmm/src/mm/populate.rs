//! Faulting ranges in ahead of use: `MAP_POPULATE`, `MADV_POPULATE_*`, and the
//! growsdown stack expansion that a fault below a stack needs.

use crate::error::{Errno, Fault, Result};
use crate::fault::handler::{self, Check, FaultCtx};
use crate::fault::{Access, FaultError};
use crate::vma::flags::*;
use crate::vma::Vma;
use crate::PAGE_SIZE;

use super::AddressSpace;

impl AddressSpace {
    /// Linux's `mm_populate` (`MAP_POPULATE`): faults in the accessible VMAs
    /// of `[start, end)`, private writable ones for write (so that they get
    /// their own pages, as `populate_vma_page_range` asks with `FOLL_WRITE`),
    /// others for read; errors are ignored.
    pub(crate) fn mm_populate(&self, start: u64, end: u64) {
        let st = self.read_lock();
        let mut a = start;
        while let Some(vma) = st.vmas.find_from(a).filter(|v| a < end && v.start < end) {
            let from = a.max(vma.start);
            a = vma.end.min(end);
            if vma.flags & VM_ACCESS_FLAGS == 0 {
                continue;
            }
            let write = vma.flags & (VM_WRITE | VM_SHARED) == VM_WRITE;
            let _ = self.fault_in(vma, from, a, if write { Access::Write } else { Access::Read });
        }
    }

    /// `MADV_POPULATE_READ`/`WRITE`: faults in `[start, end)` (page aligned);
    /// `ENOMEM` for an unmapped page, `EINVAL` for a VMA without the access,
    /// `EFAULT` for a page that would SIGBUS.
    pub(crate) fn populate(&self, start: u64, end: u64, write: bool) -> Result<()> {
        let st = self.read_lock();
        let mut a = start;
        while a < end {
            let vma = st.vmas.find(a).ok_or(Errno::NoMem)?;
            let need = if write { VM_WRITE } else { VM_READ };
            if vma.flags & need == 0 {
                return Err(Errno::Inval);
            }
            let stop = vma.end.min(end);
            self.fault_in(vma, a, stop, if write { Access::Write } else { Access::Read })?;
            a = stop;
        }
        Ok(())
    }

    /// Faults in `[start, end)` of `vma` (under `mmap_lock` for read).
    fn fault_in(&self, vma: &Vma, start: u64, end: u64, access: Access) -> Result<()> {
        let ctx = FaultCtx { mm: self, vma, check: Check::None, may_sleep: true, may_alloc_tables: true };
        let mut a = start;
        while a < end {
            match handler::handle_vma_fault(&ctx, a, access) {
                Ok(()) => {}
                Err(FaultError::Signal(Fault::Oom { .. })) => return Err(Errno::NoMem),
                Err(_) => return Err(Errno::Fault),
            }
            a += PAGE_SIZE;
        }
        Ok(())
    }

    /// Grows the growsdown VMA above `addr` down to cover it (Linux's
    /// `expand_downwards` under the write lock). `ENOMEM` if that would come
    /// within the guard gap of the VMA below, pass `mmap_min_addr`, or exceed
    /// the stack limit.
    pub(crate) fn expand_stack(&self, addr: u64) -> Result<()> {
        let mut st = self.write_lock();
        let new_start = addr & !(PAGE_SIZE - 1);
        let Some(vma) = st.vmas.find_from(addr).cloned() else {
            return Err(Errno::NoMem);
        };
        if vma.start <= addr {
            return Ok(()); // someone else grew it
        }
        if vma.flags & VM_GROWSDOWN == 0 || new_start < self.config.min_addr() {
            return Err(Errno::NoMem);
        }
        if let Some(prev) = st.vmas.prev_of(vma.start) {
            if prev.flags & VM_GROWSDOWN == 0
                && prev.flags & VM_ACCESS_FLAGS != 0
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
        if vma.flags & VM_ACCOUNT != 0 {
            self.phys.vm_enough_memory(grow, || super::commit::total_vm(&st.vmas))?;
        }
        let grown = vma.rebound(new_start, vma.end, vma.pgoff.wrapping_sub(grow));
        st.vmas.replace(vma.start, grown);
        Ok(())
    }
}
