//! Faulting ranges in ahead of use: `MAP_POPULATE`, `MADV_POPULATE_*`, and the
//! growsdown stack expansion that a fault below a stack needs.

use crate::error::{Errno, Fault, Result};
use crate::fault::handler::{self, Check, FaultCtx};
use crate::fault::{Access, FaultError};
use crate::vma::flags::*;
use crate::PAGE_SIZE;

use super::AddressSpace;

impl AddressSpace {
    /// Faults in `[start, end)` (page aligned) for read or write. With
    /// `best_effort` (`MAP_POPULATE`) errors are skipped; otherwise the
    /// errno of `MADV_POPULATE_*`: `ENOMEM` for an unmapped page, `EINVAL`
    /// for a VMA without the access, `EFAULT` for a page that would SIGBUS.
    pub(crate) fn populate(&self, start: u64, end: u64, write: bool, best_effort: bool) -> Result<()> {
        let st = self.read_lock();
        let mut a = start;
        while a < end {
            let Some(vma) = st.vmas.find(a) else {
                if best_effort {
                    a = st.vmas.find_from(a).map_or(end, |v| v.start);
                    continue;
                }
                return Err(Errno::NoMem);
            };
            let need = if write { VM_WRITE } else { VM_READ };
            if vma.flags & need == 0 {
                if best_effort {
                    a = vma.end;
                    continue;
                }
                return Err(Errno::Inval);
            }
            let stop = vma.end.min(end);
            while a < stop {
                let access = if write { Access::Write } else { Access::Read };
                let ctx = FaultCtx { mm: self, vma, check: Check::None, may_sleep: true, may_alloc_tables: true };
                match handler::handle_vma_fault(&ctx, a, access) {
                    Ok(()) => {}
                    Err(_) if best_effort => {}
                    Err(FaultError::Signal(Fault::Oom { .. })) => return Err(Errno::NoMem),
                    Err(_) => return Err(Errno::Fault),
                }
                a += PAGE_SIZE;
            }
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
        if vma.flags & VM_GROWSDOWN == 0 || new_start < self.config.mmap_min_addr {
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
        let grown = vma.rebound(new_start, vma.end, vma.pgoff.wrapping_sub(grow));
        st.vmas.replace(vma.start, grown);
        Ok(())
    }
}
