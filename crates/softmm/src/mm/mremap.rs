//! `mremap`: shrink, grow in place, or move (Linux 6.x `mm/mremap.c`).

use crate::error::{Errno, Result};
use crate::uapi::*;
use crate::vma::flags::*;
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use super::layout::{get_unmapped_area, AreaKind};
use super::{AddressSpace, MmState, MmuGather};

impl AddressSpace {
    /// `mremap(old_addr, old_len, new_len, flags, new_addr)`; returns the new address.
    ///
    /// `EINVAL` for unknown flags, an unaligned address, a zero new length,
    /// `MREMAP_FIXED` or `MREMAP_DONTUNMAP` without `MREMAP_MAYMOVE`,
    /// `MREMAP_DONTUNMAP` with a size change, or overlapping source and
    /// destination; `EFAULT` if `old_addr` is unmapped or the old range
    /// crosses the end of its VMA; `ENOMEM` if growing in place is impossible
    /// without `MREMAP_MAYMOVE` or no room is left.
    pub fn mremap(&self, old_addr: u64, old_len: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64> {
        let _q = crate::cpu::QuiescentGuard::enter();
        let task = self.config.task_size;
        if flags & !(MREMAP_FIXED | MREMAP_MAYMOVE | MREMAP_DONTUNMAP) != 0 {
            return Err(Errno::Inval);
        }
        if old_addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
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
            if flags & MREMAP_FIXED != 0 && old_addr < new_addr + new_len && new_addr < old_addr + old_len {
                return Err(Errno::Inval);
            }
        }
        let mut tlb = MmuGather::default();
        let mut st = self.write_lock();
        let res = self.do_mremap(&mut st, old_addr, old_len, new_len, flags, new_addr, &mut tlb);
        drop(st);
        tlb.finish(self);
        res
    }

    #[allow(clippy::too_many_arguments)]
    fn do_mremap(
        &self,
        st: &mut MmState,
        addr: u64,
        mut old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
        tlb: &mut MmuGather,
    ) -> Result<u64> {
        let implies_new_addr = flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0;
        if implies_new_addr && st.vmas.len() + 2 >= self.config.max_map_count - 3 {
            return Err(Errno::NoMem);
        }
        let vma = st.vmas.find(addr).cloned().ok_or(Errno::Fault)?;
        if old_len == 0 && vma.flags & VM_MAYSHARE == 0 {
            return Err(Errno::Inval);
        }
        let expand = new_len > old_len;
        if expand || implies_new_addr {
            if old_len > vma.end - addr {
                return Err(Errno::Fault);
            }
            if new_len != old_len {
                let pgoff = vma.pgoff_at(addr);
                if pgoff.checked_add(new_len >> PAGE_SHIFT).is_none() {
                    return Err(Errno::Inval);
                }
                if vma.flags & VM_DONTEXPAND != 0 {
                    return Err(Errno::Fault);
                }
            }
        }
        if implies_new_addr {
            if flags & MREMAP_FIXED != 0 {
                self.do_munmap(st, new_addr, new_addr + new_len, tlb)?;
            }
            if new_len < old_len {
                self.do_munmap(st, addr + new_len, addr + old_len, tlb)?;
                old_len = new_len;
            }
            let dst = self.mremap_target(st, addr, new_len, flags, new_addr)?;
            return self.move_vma(st, addr, old_len, new_len, dst, flags & MREMAP_DONTUNMAP != 0, tlb);
        }
        if new_len == old_len {
            return Ok(addr);
        }
        if new_len < old_len {
            self.do_munmap(st, addr + new_len, addr + old_len, tlb)?;
            return Ok(addr);
        }
        // Grow: in place if the old range ends the VMA and the space after is free.
        let delta = new_len - old_len;
        let in_place = addr + old_len == vma.end
            && vma.end.checked_add(delta).is_some_and(|e| e <= self.config.task_size)
            && st.vmas.overlapping(vma.end, vma.end + delta).next().is_none();
        if in_place {
            let grown = vma.rebound(vma.start, vma.end + delta, vma.pgoff);
            let start = vma.start;
            st.vmas.remove(start);
            self.insert_merged(st, grown);
            return Ok(addr);
        }
        if flags & MREMAP_MAYMOVE == 0 {
            return Err(Errno::NoMem);
        }
        let dst = self.mremap_target(st, addr, new_len, flags, 0)?;
        self.move_vma(st, addr, old_len, new_len, dst, false, tlb)
    }

    /// Linux's `vrm_set_new_addr`: where a moving mremap goes.
    fn mremap_target(&self, st: &MmState, addr: u64, new_len: u64, flags: i32, new_addr: u64) -> Result<u64> {
        let vma = st.vmas.find(addr).expect("checked by caller");
        let kind = if vma.file.is_none() && vma.flags & VM_MAYSHARE == 0 { AreaKind::Anon } else { AreaKind::Other };
        let hint = if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 { new_addr } else { 0 };
        get_unmapped_area(&self.config, &st.vmas, kind, hint, new_len, flags & MREMAP_FIXED != 0)
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
        let vma = st.vmas.find(addr).cloned().expect("source VMA");
        if st.vmas.len() >= self.config.max_map_count {
            return Err(Errno::NoMem);
        }
        // Never-faulted anonymous memory takes the linear index of its new home.
        let pgoff =
            if vma.is_anonymous() && vma.anon_vma.get().is_none() { dst >> PAGE_SHIFT } else { vma.pgoff_at(addr) };
        let moved = vma.rebound(dst, dst + new_len, pgoff);
        self.insert_merged(st, moved);
        self.move_ptes(addr, dst, old_len, tlb);
        if !dontunmap {
            self.do_munmap(st, addr, addr + old_len, tlb)?;
        }
        Ok(dst)
    }
}
