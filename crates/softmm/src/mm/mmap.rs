//! `mmap` and `munmap` (Linux's `do_mmap`, `mmap_region`, `do_vmi_munmap`).

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::file::{File, OpenFile};
use crate::uapi::*;
use crate::vma::flags::*;
use crate::vma::{AnonVma, Vma};
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use super::layout::{get_unmapped_area, AreaKind};
use super::{AddressSpace, MmState, MmuGather};

/// Flags `MAP_SHARED_VALIDATE` accepts (Linux's `LEGACY_MAP_MASK`).
const LEGACY_MAP_MASK: i32 = MAP_SHARED
    | MAP_PRIVATE
    | MAP_FIXED
    | MAP_ANONYMOUS
    | MAP_DENYWRITE
    | MAP_EXECUTABLE
    | MAP_UNINITIALIZED
    | MAP_GROWSDOWN
    | MAP_LOCKED
    | MAP_NORESERVE
    | MAP_POPULATE
    | MAP_NONBLOCK
    | MAP_STACK
    | MAP_HUGETLB;

/// `VM_*` access bits for `PROT_*` bits (Linux's `calc_vm_prot_bits`).
pub(crate) fn calc_vm_prot_bits(prot: i32) -> u64 {
    let mut f = 0;
    if prot & PROT_READ != 0 {
        f |= VM_READ;
    }
    if prot & PROT_WRITE != 0 {
        f |= VM_WRITE;
    }
    if prot & PROT_EXEC != 0 {
        f |= VM_EXEC;
    }
    f
}

/// Linux's `accountable_mapping`: private writable memory is charged.
pub(crate) fn accountable(flags: u64) -> bool {
    flags & (VM_NORESERVE | VM_SHARED | VM_WRITE) == VM_WRITE
}

impl AddressSpace {
    /// `mmap(addr, len, prot, flags, fd, offset)`: maps anonymous memory
    /// (`MAP_ANONYMOUS`, `file` ignored) or `file`, and returns the address.
    ///
    /// Follows Linux's checks in order and returns the same errno: `EINVAL`
    /// for a zero length, an unaligned offset or fixed address, or no
    /// `MAP_SHARED`/`MAP_PRIVATE`; `EBADF` without a file for a file mapping;
    /// `EINVAL` for a file of another [`crate::PhysMem`]; `ENOMEM` when the length overflows, no room is left or there are too
    /// many mappings; `EEXIST` for `MAP_FIXED_NOREPLACE` over a mapping;
    /// `EACCES` for a protection the file's open mode forbids; `EOPNOTSUPP`
    /// for unknown flags with `MAP_SHARED_VALIDATE`; `EPERM` for a fixed
    /// address below `mmap_min_addr`. A failed call changes nothing.
    /// `MAP_POPULATE` faults the pages in after the mapping is made.
    pub fn mmap(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<&OpenFile>,
        offset: u64,
    ) -> Result<u64> {
        let _q = crate::cpu::QuiescentGuard::enter();
        if offset % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let file = if flags & MAP_ANONYMOUS != 0 { None } else { Some(file.ok_or(Errno::BadF)?) };
        if file.is_some_and(|f| !Arc::ptr_eq(&f.file.phys, &self.phys)) {
            // Its page cache holds frames of another arena, which this
            // address space's page tables cannot name.
            return Err(Errno::Inval);
        }
        if flags & MAP_HUGETLB != 0 && file.is_none() {
            // No hugetlb pool is configured: like a host with nr_hugepages = 0.
            return Err(Errno::NoMem);
        }
        let (addr, populate) = self.do_mmap(addr, len, prot, flags, file, offset >> PAGE_SHIFT)?;
        if let Some(len) = populate {
            // Linux's mm_populate: after mmap_lock is dropped; errors ignored.
            self.mm_populate(addr, addr + len);
        }
        Ok(addr)
    }

    fn do_mmap(
        &self,
        mut addr: u64,
        len: u64,
        prot: i32,
        mut flags: i32,
        file: Option<&OpenFile>,
        mut pgoff: u64,
    ) -> Result<(u64, Option<u64>)> {
        if len == 0 {
            return Err(Errno::Inval);
        }
        if flags & MAP_FIXED_NOREPLACE != 0 {
            flags |= MAP_FIXED;
        }
        let fixed = flags & MAP_FIXED != 0;
        if !fixed {
            addr &= !(PAGE_SIZE - 1);
            if addr != 0 && addr < self.config.mmap_min_addr {
                addr = page_align(self.config.mmap_min_addr);
            }
        }
        let len = page_align(len);
        if len == 0 {
            return Err(Errno::NoMem);
        }
        if pgoff.checked_add(len >> PAGE_SHIFT).is_none() {
            return Err(Errno::Overflow);
        }
        let mut st = self.write_lock();
        if st.vmas.len() > self.config.max_map_count {
            return Err(Errno::NoMem);
        }
        let shared = matches!(flags & MAP_TYPE, MAP_SHARED | MAP_SHARED_VALIDATE);
        let kind = if file.is_none() && !shared { AreaKind::Anon } else { AreaKind::Other };
        let addr = get_unmapped_area(&self.config, &st.vmas, kind, addr, len, fixed)?;
        if fixed && addr < self.config.mmap_min_addr {
            return Err(Errno::Perm);
        }
        if flags & MAP_FIXED_NOREPLACE != 0 && st.vmas.overlapping(addr, addr + len).next().is_some() {
            return Err(Errno::Exist);
        }
        let mut vm_flags = calc_vm_prot_bits(prot) | VM_MAYREAD | VM_MAYWRITE | VM_MAYEXEC;
        if flags & MAP_GROWSDOWN != 0 {
            vm_flags |= VM_GROWSDOWN;
        }
        if flags & MAP_LOCKED != 0 {
            vm_flags |= VM_LOCKED;
        }
        match file {
            Some(f) => {
                match flags & MAP_TYPE {
                    MAP_SHARED | MAP_SHARED_VALIDATE => {
                        if flags & MAP_TYPE == MAP_SHARED_VALIDATE && flags & !LEGACY_MAP_MASK != 0 {
                            return Err(Errno::OpNotSupp);
                        }
                        if prot & PROT_WRITE != 0 && !f.writable {
                            return Err(Errno::Acces);
                        }
                        vm_flags |= VM_SHARED | VM_MAYSHARE;
                        if !f.writable {
                            vm_flags &= !(VM_MAYWRITE | VM_SHARED);
                        }
                    }
                    MAP_PRIVATE => {}
                    _ => return Err(Errno::Inval),
                }
                if !f.readable {
                    return Err(Errno::Acces);
                }
                if vm_flags & VM_GROWSDOWN != 0 {
                    return Err(Errno::Inval);
                }
            }
            None => match flags & MAP_TYPE {
                MAP_SHARED => {
                    if vm_flags & VM_GROWSDOWN != 0 {
                        return Err(Errno::Inval);
                    }
                    pgoff = 0;
                    vm_flags |= VM_SHARED | VM_MAYSHARE;
                }
                MAP_PRIVATE => pgoff = addr >> PAGE_SHIFT,
                _ => return Err(Errno::Inval),
            },
        }
        if flags & MAP_NORESERVE != 0 {
            vm_flags |= VM_NORESERVE;
        }
        let backing = match file {
            Some(f) => Some(f.file.clone()),
            None if vm_flags & VM_SHARED != 0 => Some(File::create(&self.phys, "/dev/zero (deleted)", len)?),
            None => None,
        };
        let shared_anon = file.is_none() && backing.is_some();
        let mut tlb = MmuGather::default();
        let res = self.mmap_region(&mut st, backing, shared_anon, addr, len, vm_flags, pgoff, &mut tlb);
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        drop(st);
        res?;
        let populate =
            (flags & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE || vm_flags & VM_LOCKED != 0).then_some(len);
        Ok((addr, populate))
    }

    /// Linux's `mmap_region`: replaces whatever is in `[addr, addr+len)` by a
    /// new mapping, merged with its neighbours where Linux would merge.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mmap_region(
        &self,
        st: &mut MmState,
        file: Option<Arc<File>>,
        shared_anon: bool,
        addr: u64,
        len: u64,
        mut vm_flags: u64,
        pgoff: u64,
        tlb: &mut MmuGather,
    ) -> Result<()> {
        let end = addr + len;
        self.do_munmap(st, addr, end, tlb)?;
        if accountable(vm_flags) {
            vm_flags |= VM_ACCOUNT;
        }
        if let Some(f) = &file {
            self.arc().link_file(f);
        }
        self.insert_merged(st, Vma::new(&self.phys, addr, end, vm_flags, pgoff, file, None, shared_anon));
        Ok(())
    }

    /// Inserts `new` into a free range, merging it with the VMA ending at its
    /// start and the one starting at its end where Linux's
    /// `vma_merge_new_range` would. Returns the VMA now covering `new`.
    pub(crate) fn insert_merged(&self, st: &mut MmState, new: Vma) -> Arc<Vma> {
        let file = new.file.as_ref().map(|f| f.id());
        let anon: Option<Arc<AnonVma>> = new.anon_vma.get().cloned();
        let prev = st.vmas.prev_of(new.start).filter(|p| p.end == new.start).cloned();
        let next = st.vmas.first_starting_at(new.end).filter(|n| n.start == new.end).cloned();
        // A new shared anonymous mapping has a file of its own and so never
        // merges; pieces of one (moved by mremap) merge like file mappings.
        let left = prev.as_ref().is_some_and(|p| p.can_merge_after(new.flags, file, anon.as_ref(), new.pgoff));
        let mut right =
            next.as_ref().is_some_and(|n| n.can_merge_before(new.flags, file, anon.as_ref(), new.pgoff, new.pages()));
        if left && right {
            let (p, n) = (prev.as_ref().expect("left"), next.as_ref().expect("right"));
            right = crate::vma::anon_compatible(p.anon_vma.get(), n.anon_vma.get());
        }
        let anon_of = |vs: &[&Arc<Vma>]| vs.iter().find_map(|v| v.anon_vma.get().cloned()).or(anon.clone());
        match (left, right) {
            (true, true) => {
                let (p, n) = (prev.expect("left"), next.expect("right"));
                st.vmas.remove(n.start);
                let mut merged = p.rebound(p.start, n.end, p.pgoff);
                merged.set_anon(anon_of(&[&p, &n]));
                st.vmas.replace(p.start, merged)
            }
            (true, false) => {
                let p = prev.expect("left");
                let mut merged = p.rebound(p.start, new.end, p.pgoff);
                merged.set_anon(anon_of(&[&p]));
                st.vmas.replace(p.start, merged)
            }
            (false, true) => {
                let n = next.expect("right");
                let mut merged = n.rebound(new.start, n.end, new.pgoff);
                merged.set_anon(anon_of(&[&n]));
                st.vmas.replace(n.start, merged)
            }
            (false, false) => st.vmas.insert(new),
        }
    }

    /// `munmap(addr, len)`: `EINVAL` for an unaligned address, a zero length or
    /// a range outside the user address space; unmapping nothing succeeds.
    pub fn munmap(&self, addr: u64, len: u64) -> Result<()> {
        let _q = crate::cpu::QuiescentGuard::enter();
        let task = self.config.task_size;
        if addr % PAGE_SIZE != 0 || addr > task || len > task - addr {
            return Err(Errno::Inval);
        }
        let len = page_align(len);
        if len == 0 {
            return Err(Errno::Inval);
        }
        let mut tlb = MmuGather::default();
        let mut st = self.write_lock();
        let res = self.do_munmap(&mut st, addr, addr + len, &mut tlb);
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        drop(st);
        res
    }
}
