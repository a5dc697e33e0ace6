//! `mmap` and `munmap` (Linux's `do_mmap`, `mmap_region`, `do_vmi_munmap`).

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::file::{Inode, OpenFile};
use crate::uapi::*;
use crate::vma::VmFlags;
use crate::vma::{AnonVma, Vma, VmaDesc, VmaOps, DEFAULT_VM_OPS};
use crate::{page_align, PAGE_SHIFT, PAGE_SIZE};

use crate::mm::commit::accounted_pages;
use crate::mm::layout::{get_unmapped_area_avoiding, AreaFlags, AreaKind, Obstacles};
use crate::mm::range::Neighbours;
use crate::mm::{AddressSpace, MmState, MmuGather};
use crate::phys::OvercommitMode;

/// `MAP_ABOVE4G`: keep the mapping above 4 GiB (x86-64).
const MAP_ABOVE4G: i32 = 0x80;
/// `MAP_DROPPABLE` (Linux 6.11+): a mapping type whose pages may be dropped.
pub(crate) const MAP_DROPPABLE: i32 = 0x08;
/// Shift of the huge page size log in the flags (`MAP_HUGE_SHIFT`).
const MAP_HUGE_SHIFT: i32 = 26;
/// `MAP_HUGE_2MB`.
const MAP_HUGE_2MB: i32 = 21 << MAP_HUGE_SHIFT;
/// `MAP_HUGE_1GB`.
const MAP_HUGE_1GB: i32 = 30 << MAP_HUGE_SHIFT;

/// Flags `MAP_SHARED_VALIDATE` accepts (Linux's `LEGACY_MAP_MASK`, 6.12+).
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
    | MAP_HUGETLB
    | MAP_32BIT
    | MAP_ABOVE4G
    | MAP_HUGE_2MB
    | MAP_HUGE_1GB;

/// `MAX_LFS_FILESIZE`: the largest offset of a regular file (memfds included).
const MAX_LFS_FILESIZE: u64 = i64::MAX as u64;

/// Linux's `file_mmap_ok` for a regular file: `len` bytes from page `pgoff`
/// stay below `MAX_LFS_FILESIZE`.
fn file_mmap_ok(pgoff: u64, len: u64) -> bool {
    len <= MAX_LFS_FILESIZE && pgoff <= (MAX_LFS_FILESIZE - len) >> PAGE_SHIFT
}

/// Why a mapping is being made, for the checks that differ: an anonymous
/// `MAP_HUGETLB` mapping goes through a hugetlbfs file in Linux.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backing {
    Anon,
    File,
    /// Anonymous `MAP_HUGETLB` with this huge page size.
    Hugetlb(u64),
}

/// Where the search for a mapping of `backing` with `flags` places it
/// (`get_unmapped_area`'s choice of alignment).
fn area_kind(backing: Backing, flags: i32) -> AreaKind {
    let shared = matches!(flags & MAP_TYPE, MAP_SHARED | MAP_SHARED_VALIDATE);
    match backing {
        Backing::Anon if !shared => AreaKind::Anon,
        Backing::Hugetlb(size) => AreaKind::Huge(size),
        _ => AreaKind::Other,
    }
}

/// Linux's `accountable_mapping`: private writable memory is charged.
pub(crate) fn accountable(flags: VmFlags) -> bool {
    // hugetlb pages are reserved from their pool, never charged.
    flags & (VmFlags::NORESERVE | VmFlags::SHARED | VmFlags::WRITE | VmFlags::HUGETLB) == VmFlags::WRITE
}

impl AddressSpace {
    /// `mmap(addr, len, prot, flags, fd, offset)`: maps anonymous memory
    /// (`MAP_ANONYMOUS`, `file` ignored) or `file`, and returns the address.
    ///
    /// Follows Linux's checks in order (`ksys_mmap_pgoff`, `do_mmap`,
    /// `mmap_region`) and returns the same errno: `EINVAL` for a zero length,
    /// an unaligned offset or fixed address, an unknown mapping type, a
    /// `MAP_HUGETLB` size other than 2 MiB or 1 GiB, or a file with
    /// `MAP_HUGETLB`; `EBADF` without a file for a file mapping; `EINVAL` for a
    /// file of another [`crate::PhysMem`]; `ENOMEM`
    /// when the length overflows, no room is left, there are too many
    /// mappings or the commit limit refuses the charge (see
    /// [`PhysMem::set_overcommit`](crate::PhysMem::set_overcommit));
    /// `EOVERFLOW` when offset plus length passes the
    /// largest file offset; `EEXIST` for `MAP_FIXED_NOREPLACE` over a mapping;
    /// `EPERM` for a fixed address below `mmap_min_addr` or `MAP_LOCKED` with
    /// a zero memlock limit, `EAGAIN` past it; `EACCES` for a protection the
    /// file's open mode forbids; `EOPNOTSUPP` for unknown flags with
    /// `MAP_SHARED_VALIDATE`. `MAP_32BIT` places the mapping in
    /// `[1 GiB, 2 GiB)` (`ENOMEM` when it does not fit there),
    /// `MAP_DROPPABLE` makes a private anonymous mapping that is never
    /// charged nor copied to a child. `MAP_HUGETLB` maps 2 MiB pages of the
    /// pool ([`PhysConfig::hugepages`](crate::PhysConfig::hugepages)): the
    /// length rounds up to 2 MiB, a fixed address must be 2 MiB aligned
    /// (`EINVAL`), a hint rounds up to 2 MiB, a chosen address is 2 MiB
    /// aligned, and the pages are reserved at `mmap` (`ENOMEM` when the
    /// pool cannot cover them) unless `MAP_NORESERVE`, whose faults find a
    /// page or raise `SIGBUS`; `MAP_HUGE_1GB` is `ENOMEM` (no 1 GiB pool),
    /// any other size `EINVAL`. A failed call
    /// changes nothing. `MAP_POPULATE` faults the pages in after the mapping
    /// is made.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Cpu, Errno, File, MmConfig, OpenFile, PhysConfig, PhysMem};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// // Anonymous memory: the address is chosen top-down, as on x86-64.
    /// let heap = mm.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// // A file, shared: writes through the mapping reach the file.
    /// let f = File::create(&phys, "/data", 4096).unwrap();
    /// let shared = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// cpu.write_u32(shared, 0xfeed).unwrap();
    /// let mut back = [0; 4];
    /// f.read_at(0, &mut back).unwrap();
    /// assert_eq!(u32::from_le_bytes(back), 0xfeed);
    /// // The same errno as Linux, and nothing changed.
    /// assert_eq!(mm.mmap(heap, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, None, 0), Err(Errno::Exist));
    /// let ro = OpenFile::read_only(&f);
    /// assert_eq!(mm.mmap(0, 4096, PROT_WRITE, MAP_SHARED, Some(&ro), 0), Err(Errno::Acces));
    /// ```
    pub fn mmap(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<&OpenFile>,
        offset: u64,
    ) -> Result<u64> {
        let _q = crate::tlb::QuiescentGuard::enter();
        if offset % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        // ksys_mmap_pgoff: the file, then the hugetlb size and length.
        let file = if flags & MAP_ANONYMOUS != 0 { None } else { Some(file.ok_or(Errno::BadF)?) };
        if file.is_some_and(|f| !Arc::ptr_eq(&f.file.inode().phys, &self.phys)) {
            // Its page cache holds frames of another arena, which this
            // address space's page tables cannot name.
            return Err(Errno::Inval);
        }
        // A coherent shared mapping of a host file (`sys/mmap_host.rs`).
        if let Some(f) = file.filter(|f| {
            self.config.host_file_coherence == crate::HostFileCoherence::Shared
                && f.file.inode().host_backing().is_some()
                && matches!(flags & MAP_TYPE, MAP_SHARED | MAP_SHARED_VALIDATE)
        }) {
            return self.mmap_host_file(addr, len, prot, flags, f, offset);
        }
        let mut len = len;
        let backing = if file.is_some_and(|f| f.file.is_hugetlbfs()) {
            // A hugetlbfs file: the length rounds up, MAP_HUGETLB or not.
            let size = crate::hugetlb::HPAGE_SIZE;
            len = len.wrapping_add(size - 1) & !(size - 1);
            Backing::Hugetlb(size)
        } else if flags & MAP_HUGETLB == 0 {
            if file.is_some() {
                Backing::File
            } else {
                Backing::Anon
            }
        } else if file.is_some() {
            // MAP_HUGETLB with a file not on hugetlbfs.
            return Err(Errno::Inval);
        } else {
            // hstate_sizelog: the default (2 MiB), 2 MiB or 1 GiB.
            let size = match (flags >> MAP_HUGE_SHIFT) & 0x3f {
                0 | 21 => 2 << 20,
                30 => 1 << 30,
                _ => return Err(Errno::Inval),
            };
            len = len.wrapping_add(size - 1) & !(size - 1);
            Backing::Hugetlb(size)
        };
        let (addr, populate) = self.do_mmap(addr, len, prot, flags, file, backing, offset >> PAGE_SHIFT)?;
        if let Some(len) = populate {
            // Linux's mm_populate: after mmap_lock is dropped; errors ignored.
            crate::populate::mm_populate(self, addr, addr + len);
        }
        Ok(addr)
    }

    #[allow(clippy::too_many_arguments)]
    fn do_mmap(
        &self,
        mut addr: u64,
        len: u64,
        prot: i32,
        mut flags: i32,
        file: Option<&OpenFile>,
        backing: Backing,
        pgoff: u64,
    ) -> Result<(u64, Option<u64>)> {
        if len == 0 {
            return Err(Errno::Inval);
        }
        if flags & MAP_FIXED_NOREPLACE != 0 {
            flags |= MAP_FIXED;
        }
        let fixed = flags & MAP_FIXED != 0;
        if !fixed {
            // round_hint_to_min
            addr &= !(PAGE_SIZE - 1);
            let min = self.config.min_addr();
            if addr != 0 && addr < min {
                addr = page_align(min);
            }
        }
        let len = page_align(len);
        if len == 0 {
            return Err(Errno::NoMem);
        }
        if pgoff.checked_add(len >> PAGE_SHIFT).is_none() {
            return Err(Errno::Overflow);
        }
        // MAP_FIXED waits for a range a lock-free unmap still zaps; any
        // other placement goes around it (`Obstacles`).
        let fixed_range = if fixed { (addr, addr.saturating_add(len)) } else { (0, 0) };
        // Range-parallel writers: inside one window, without mmap_lock.
        let res = match self.range_mmap(addr, len, prot, flags, file, backing, pgoff) {
            Some(res) => res,
            None => {
                let mut st = self.write_lock_clear_of(|_| [fixed_range, (0, 0)]);
                self.mmap_locked(&mut st, addr, len, prot, flags, file, backing, pgoff)
            }
        };
        // The loom switch moves the link `mmap_region` makes to here,
        // after the new VMA is published (`mm/loom_tests.rs`).
        if let (true, Ok(_), Some(f)) = (crate::sync::broken::range_writers::link_after_leave(), &res, file) {
            self.link_file(f.file.inode());
        }
        res
    }

    /// An `mmap` of anonymous memory, shared or private, or of a file whose
    /// pages live only in softmm's page cache
    /// ([`crate::file::Inode::is_plain_memory`]: files, memfds), shared or
    /// private, as a range writer
    /// (`mm/range.rs`), or `None` (nothing changed) for the `mmap_lock`
    /// path: `MAP_FIXED` inside one window, or, under
    /// [`crate::PlacementPolicy::Arenas`], a call without a hint whose
    /// search finds room in the calling thread's arena (one window).
    /// Everything else falls back: hints, `MAP_LOCKED`, `MAP_GROWSDOWN`
    /// (the stack guard gap and expansion), `MAP_32BIT`, `MAP_HUGETLB`,
    /// `MAP_DROPPABLE`, hugetlbfs, host and device files. Never-mode
    /// overcommit's charge reads the whole address space's size
    /// ([`AddressSpace::total_vm`]).
    ///
    /// A file mapping's reverse-map walkers need nothing more than they
    /// do for a range `munmap` ([`crate::mm::range::range_vma_ok`]):
    /// the address space is linked to the file before the window is
    /// published, and every walker takes `mmap_lock` for read, which waits
    /// for the range writers inside; so a truncate sees the new VMA whole,
    /// or the call, falling back, waits for it, as Linux's `mmap_region`
    /// links the VMA under `i_mmap_rwsem`. The checks of the open file's
    /// modes are `mmap_locked`'s, run on the window's view: an errno there
    /// changes nothing.
    #[allow(clippy::too_many_arguments)]
    fn range_mmap(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<&OpenFile>,
        backing: Backing,
        pgoff: u64,
    ) -> Option<Result<(u64, Option<u64>)>> {
        const NOT_RANGE: i32 = MAP_LOCKED | MAP_GROWSDOWN | MAP_32BIT | MAP_HUGETLB;
        let backing_ok = match backing {
            // Shared anonymous memory too: its object is made on the view
            // and linked in the thread's own list (`mm/linked_files.rs`).
            Backing::Anon => matches!(flags & MAP_TYPE, MAP_PRIVATE | MAP_SHARED),
            Backing::File => file.is_some_and(|f| f.file.inode().is_plain_memory()),
            Backing::Hugetlb(_) => false,
        };
        if !self.config.writer_policy.range_writers() || !backing_ok || flags & NOT_RANGE != 0 {
            return None;
        }
        let fixed = flags & MAP_FIXED != 0;
        let (lo, hi, neighbours) = if fixed {
            // An address `get_unmapped_area` refuses whatever is mapped
            // (unaligned, below `mmap_min_addr`) goes to `mmap_lock`, which
            // refuses it allocating nothing: here it could allocate its
            // window's leaf (`Neighbours`).
            if addr % PAGE_SIZE != 0 || addr < self.config.min_addr() {
                return None;
            }
            let end = addr.checked_add(len)?;
            (addr, end, Neighbours::of(addr))
        } else if addr == 0 && self.config.placement == crate::PlacementPolicy::Arenas {
            // A mapping the search puts at the arena's bottom falls back
            // (it would need the lock of the window below).
            let (lo, hi) = crate::mm::layout::arena(&self.config, crate::mm::layout::thread_slot()?)?;
            (lo, hi, Neighbours { below: false, new_vma: true })
        } else {
            return None;
        };
        let res = self.range_write_span(lo, hi, neighbours, |mm, st, _tlb| {
            let a = if fixed {
                addr
            } else {
                // The arena's search on the window alone is the whole
                // set's: the window is the arena, closed at its bounds.
                let obstacles = Obstacles { vmas: &st.vmas, reserved: &[] };
                let area_flags = AreaFlags { fixed: false, low32: false };
                let kind = area_kind(backing, flags);
                // A THP-aligned search (`thp_get_unmapped_area`) looks for
                // 2 MiB more than `len`: where the arena has no room for
                // that, it goes on over the whole space, which the view
                // does not hold (it could align its way back into the
                // window, below a VMA above it that the view lacks).
                if kind == AreaKind::Anon && mm.config.thp_align && len % crate::pgtable::PMD_SIZE == 0 {
                    let padded = len.checked_add(crate::pgtable::PMD_SIZE)?;
                    crate::mm::layout::unmapped_area_topdown(&st.vmas, padded, lo, hi, mm.config.stack_guard_gap)?;
                }
                let a = get_unmapped_area_avoiding(&mm.config, obstacles, kind, 0, len, area_flags).ok()?;
                if a <= lo || a + len > hi || !mm.range_arena_is_closed(hi) {
                    return None;
                }
                a
            };
            if !mm.range_footprint_ok(st, a, a + len) {
                return None;
            }
            // Placed, the call is MAP_FIXED's at `a`, as in do_mmap.
            Some(mm.mmap_locked(st, a, len, prot, flags | MAP_FIXED, file, backing, pgoff))
        });
        self.range_count_fallback(res.is_none());
        res
    }

    /// The rest of [`Self::do_mmap`] with `mmap_lock` held for write (`st`)
    /// or as a range writer (`st` its window's view).
    #[allow(clippy::too_many_arguments)]
    fn mmap_locked(
        &self,
        st: &mut MmState,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<&OpenFile>,
        backing: Backing,
        mut pgoff: u64,
    ) -> Result<(u64, Option<u64>)> {
        let fixed = flags & MAP_FIXED != 0;
        if st.vmas.len() > self.config.max_map_count {
            return Err(Errno::NoMem);
        }
        // calc_vm_prot_bits | calc_vm_flag_bits | mm->def_flags | VM_MAY*.
        let mut vm_flags: VmFlags =
            VmFlags::from_prot(prot) | st.def_flags | VmFlags::MAYREAD | VmFlags::MAYWRITE | VmFlags::MAYEXEC;
        if flags & MAP_GROWSDOWN != 0 {
            vm_flags |= VmFlags::GROWSDOWN;
        }
        if flags & MAP_LOCKED != 0 {
            vm_flags |= VmFlags::LOCKED;
        }
        if flags & MAP_STACK != 0 {
            vm_flags |= VmFlags::NOHUGEPAGE;
        }
        let kind = area_kind(backing, flags);
        let area_flags = AreaFlags { fixed, low32: flags & MAP_32BIT != 0 };
        // A fixed range was waited for; any other goes around reserved ranges.
        let reserved = if fixed { &[][..] } else { &st.reserved[..] };
        let obstacles = Obstacles { vmas: &st.vmas, reserved };
        let addr = get_unmapped_area_avoiding(&self.config, obstacles, kind, addr, len, area_flags)?;
        if flags & MAP_FIXED_NOREPLACE != 0 && st.vmas.overlapping(addr, addr + len).next().is_some() {
            return Err(Errno::Exist);
        }
        if flags & MAP_LOCKED != 0 && !self.config.can_do_mlock() {
            return Err(Errno::Perm);
        }
        if !self.config.mlock_future_ok(vm_flags, len, || crate::mm::commit::locked_vm(&st.vmas)) {
            return Err(Errno::Again);
        }
        if backing != Backing::Anon {
            if !file_mmap_ok(pgoff, len) {
                return Err(Errno::Overflow);
            }
            // A hugetlbfs file is opened read-write.
            let (readable, writable) = file.map_or((true, true), |f| (f.readable, f.writable));
            match flags & MAP_TYPE {
                t @ (MAP_SHARED | MAP_SHARED_VALIDATE) => {
                    // Unknown flags are dropped with MAP_SHARED, refused with
                    // MAP_SHARED_VALIDATE.
                    if t == MAP_SHARED_VALIDATE && flags & !LEGACY_MAP_MASK != 0 {
                        return Err(Errno::OpNotSupp);
                    }
                    if prot & PROT_WRITE != 0 && !writable {
                        return Err(Errno::Acces);
                    }
                    vm_flags |= VmFlags::SHARED | VmFlags::MAYSHARE;
                    if !writable {
                        vm_flags &= !(VmFlags::MAYWRITE | VmFlags::SHARED);
                    }
                }
                MAP_PRIVATE => {}
                _ => return Err(Errno::Inval),
            }
            if !readable {
                return Err(Errno::Acces);
            }
            if vm_flags.contains(VmFlags::GROWSDOWN) {
                return Err(Errno::Inval);
            }
        } else {
            match flags & MAP_TYPE {
                // Not MAP_SHARED_VALIDATE: Linux refuses it for anonymous memory.
                MAP_SHARED => {
                    if vm_flags.contains(VmFlags::GROWSDOWN) {
                        return Err(Errno::Inval);
                    }
                    pgoff = 0;
                    vm_flags |= VmFlags::SHARED | VmFlags::MAYSHARE;
                }
                t @ (MAP_PRIVATE | MAP_DROPPABLE) => {
                    if t == MAP_DROPPABLE {
                        // A locked or stack area makes no sense droppable.
                        if flags & (MAP_LOCKED | MAP_HUGETLB) != 0 || vm_flags.contains(VmFlags::GROWSDOWN) {
                            return Err(Errno::Inval);
                        }
                        // Never reserved, never copied to a child or dumped.
                        vm_flags |= VmFlags::DROPPABLE | VmFlags::NORESERVE | VmFlags::WIPEONFORK | VmFlags::DONTDUMP;
                    }
                    pgoff = addr >> PAGE_SHIFT;
                }
                _ => return Err(Errno::Inval),
            }
        }
        if flags & MAP_NORESERVE != 0 && self.phys.overcommit().mode != OvercommitMode::Never {
            vm_flags |= VmFlags::NORESERVE;
        }
        // mmap_region gathers the VMAs it replaces, their splits checked,
        // before it charges the mapping or calls the file's mmap hook (for
        // hugetlb, hugetlbfs_file_mmap's reservation and growth below): a
        // split refused here finds nothing reserved, charged or grown. The
        // unmap in mmap_region then cannot fail, and a hugetlb mapping is
        // never charged, so nothing after the hook can refuse the call.
        // mmap_region: memory-deny-write-execute (sys/mdwe.rs), before the
        // VMAs it replaces are gathered (a sealed one: EPERM).
        if super::mdwe::map_deny_write_exec(st.mdwe, vm_flags, vm_flags) {
            return Err(Errno::Acces);
        }
        self.munmap_gather_check(st, addr, addr + len)?;
        // The backing's preparation (Linux's `f_op->mmap`; for hugetlb,
        // `hugetlbfs_file_mmap`'s flags, reservations and growth).
        let ops: &'static dyn VmaOps = match backing {
            Backing::Hugetlb(_) => &crate::hugetlb::HUGETLB_VM_OPS,
            // A window onto a host file (`HostFileCoherence::Shared`): a
            // shared file mapping's flags.
            Backing::File if file.is_some_and(|f| f.file.inode().host_mem.as_ref().is_some_and(|m| m.is_file())) => {
                &super::mmap_host::HOST_FILE_VM_OPS
            }
            // Embedder memory (`mmap_host`): `VM_PFNMAP`-like.
            Backing::File if file.is_some_and(|f| f.file.inode().host_mem.is_some()) => {
                &super::mmap_host::HOST_MEM_VM_OPS
            }
            // A device's registers (`AddressSpace::mmap_io`).
            Backing::File if file.is_some_and(|f| f.file.inode().mmio.is_some()) => &super::mmio::MMIO_VM_OPS,
            Backing::Anon | Backing::File => &DEFAULT_VM_OPS,
        };
        let mut desc = VmaDesc {
            start: addr,
            end: addr + len,
            pgoff,
            flags: vm_flags,
            file: file.map(|f| f.file.inode().clone()),
            page_size: match backing {
                Backing::Hugetlb(size) => size,
                Backing::Anon | Backing::File => PAGE_SIZE,
            },
            map_noreserve: flags & MAP_NORESERVE != 0,
            hugetlb_resv: None,
        };
        ops.mmap_prepare(&self.phys, &mut desc)?;
        vm_flags = desc.flags;
        if vm_flags.contains(VmFlags::HUGETLB) {
            st.hugetlb_seen = true;
        }
        let backing = match desc.file {
            Some(f) => Some(f),
            None if vm_flags.contains(VmFlags::SHARED) => {
                // shmem_zero_setup charges the whole object unless
                // MAP_NORESERVE (shmem_acct_size); the object returns it.
                let pages = if !vm_flags.contains(VmFlags::NORESERVE) { len >> PAGE_SHIFT } else { 0 };
                if pages != 0 {
                    self.phys.vm_enough_memory(pages, || self.total_vm(&st.vmas))?;
                }
                // shmem_file_setup: a size past the largest file size is EINVAL.
                if len > crate::file::MAX_FILE_SIZE {
                    self.phys.vm_unacct_memory(pages);
                    return Err(Errno::Inval);
                }
                // The object's first use is the VMA made below; if that
                // fails, dropping it evicts it, which returns the charge.
                let f = Inode::new(&self.phys, "/dev/zero (deleted)", len, None);
                f.shmem_acct.store(pages, crate::sync::Ordering::Relaxed);
                Some(Arc::new(f))
            }
            None => None,
        };
        let mut tlb = MmuGather::default();
        let open = file.map_or(0, OpenFile::open_id);
        // __mmap_region: a hugetlb mapping is never locked (mlock's
        // vma_supports_mlock), though do_mmap still populates it below.
        let mut region_flags = vm_flags;
        if vm_flags.intersects(VmFlags::SPECIAL | VmFlags::HUGETLB) {
            region_flags &= !VmFlags::LOCKED_MASK;
        }
        let res = self.mmap_region(st, backing, open, addr, len, region_flags, pgoff, ops, desc.hugetlb_resv, &mut tlb);
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        res?;
        let populate = (flags & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE || vm_flags.contains(VmFlags::LOCKED))
            .then_some(len);
        Ok((addr, populate))
    }

    /// Linux's `mmap_region`: replaces whatever is in `[addr, addr+len)` by a
    /// new mapping, merged with its neighbours where Linux would merge.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mmap_region(
        &self,
        st: &mut MmState,
        file: Option<Arc<Inode>>,
        open: u64,
        addr: u64,
        len: u64,
        mut vm_flags: VmFlags,
        pgoff: u64,
        ops: &'static dyn VmaOps,
        hugetlb_resv: Option<Arc<crate::hugetlb::resv::PrivateResv>>,
        tlb: &mut MmuGather,
    ) -> Result<()> {
        let end = addr + len;
        // Linux charges the new mapping less what it replaces, before the
        // replaced mappings go; failing, nothing has changed.
        let replaced = accounted_pages(&st.vmas, addr, end);
        let charged = if accountable(vm_flags) { (len >> PAGE_SHIFT) - replaced } else { 0 };
        if charged != 0 {
            self.phys.vm_enough_memory(charged, || self.total_vm(&st.vmas))?;
        }
        if let Err(e) = self.do_munmap(st, addr, end, tlb) {
            self.phys.vm_unacct_memory(charged);
            return Err(e);
        }
        if accountable(vm_flags) {
            // do_munmap returned the replaced mappings' charge; the new one keeps it.
            self.phys.vm_acct_memory(replaced);
            vm_flags |= VmFlags::ACCOUNT;
        }
        // Linked before the VMA is published: a truncate's reverse-map walk
        // that finds no link must find no VMA of the file either.
        if let Some(f) = file.as_ref().filter(|_| !crate::sync::broken::range_writers::link_after_leave()) {
            self.link_file(f);
        }
        let mut vma = Vma::new(&self.phys, addr, end, vm_flags, pgoff, file, None).with_open(open);
        vma.ops = ops;
        vma.hugetlb_resv = hugetlb_resv;
        self.insert_merged(st, vma);
        Ok(())
    }

    /// Inserts `new` into a free range, merging it with the VMA ending at its
    /// start and the one starting at its end where Linux's
    /// `vma_merge_new_range` would. Returns the VMA now covering `new`.
    pub(crate) fn insert_merged(&self, st: &mut MmState, mut new: Vma) -> Arc<Vma> {
        // Coherent windows onto one host file first get one window.
        if let Some(over) = self.merge_host_file_windows(st, &new) {
            new = over;
        }
        let file = new.file_id();
        let anon: Option<Arc<AnonVma>> = new.anon_vma.get().cloned();
        let prev = st.vmas.prev_of(new.start).filter(|p| p.end == new.start).cloned();
        let next = st.vmas.first_starting_at(new.end).filter(|n| n.start == new.end).cloned();
        // A new shared anonymous mapping has a file of its own and so never
        // merges; pieces of one (moved by mremap) merge like file mappings.
        let pol = new.policy.as_ref();
        let left = prev
            .as_ref()
            .is_some_and(|p| p.can_merge_after(new.flags, file, anon.as_ref(), new.pgoff) && p.same_policy(pol));
        let mut right = next.as_ref().is_some_and(|n| {
            n.can_merge_before(new.flags, file, anon.as_ref(), new.pgoff, new.pages()) && n.same_policy(pol)
        });
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
}
