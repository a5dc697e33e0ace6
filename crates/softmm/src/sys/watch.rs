//! Write watches and the dirty log of an address space (`crate::watch`):
//! the calls an emulator makes to learn that the guest wrote a page it
//! translated (self-modifying code) or which pages the guest wrote since a
//! point (snapshots, live migration, a fuzzer's reset).

use crate::error::{Errno, Result};
use crate::mm::AddressSpace;
use crate::tlb::{CpuSet, FlushRange, QuiescentGuard, ShootdownTargets};
use crate::watch::{WatchAccess, WatchMode};
use crate::PAGE_SIZE;

/// The most pages whose entries [`AddressSpace::watch_fill_owners`] reads
/// (1 GiB): a larger watch shoots every CPU down, as the zaps' gather
/// flushes everything past its own bound.
const OWNER_SCAN_PAGES: u64 = 1 << 18;

impl AddressSpace {
    /// Watches the stores to the pages of `[addr, addr + len)` in `mode`
    /// (see `crate::watch`), whatever is mapped there now or later; a page
    /// watched in the other mode keeps it too. The guest sees nothing: its
    /// mappings, `/proc/pid/maps`, `mprotect` results and faults are
    /// unchanged, and its loads, fetches and stores to other pages keep the
    /// TLB's hit path.
    ///
    /// The watch is in force when the call returns, for every CPU: a store
    /// through a TLB entry another CPU filled writable before the call
    /// lands before it returns (the range is shot down: under the default
    /// [`crate::ShootdownTargets`], only the CPUs that filled from its
    /// entries), and a later store misses the TLB and is checked. The one
    /// exception is a store through an entry that a concurrent `munmap`,
    /// `mremap` or `MADV_DONTNEED` has already cleared: it is ordered
    /// before that change, which waits for it.
    ///
    /// A [`WatchMode::Notify`] store returns [`crate::Fault::WriteWatch`]
    /// at the store's address after the fault handling a write needs
    /// (so the guest's own `SIGSEGV` comes first, and a copy-on-write page
    /// is broken as the store would) and before the store itself: the
    /// page's bytes are unchanged, and the store is the embedder's to
    /// retry once it has unwatched the page. A [`WatchMode::Log`] store is
    /// made, and marks its page for [`AddressSpace::dirty_log`].
    ///
    /// `EINVAL` for an `addr` not page aligned or a range past the user
    /// address space (`task_size`); `ENOMEM` if more than
    /// [`crate::MAX_WATCHED_PAGES`] pages would be watched. `len` is
    /// rounded up to pages, and 0 does nothing. A failed call changes
    /// nothing.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, WatchMode};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let code = mm.mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// cpu.write_u32(code, 0x90).unwrap();
    /// // The emulator translated the page: it watches it.
    /// mm.write_watch(code, 4096, WatchMode::Notify).unwrap();
    /// assert_eq!(cpu.read_u32(code), Ok(0x90));
    /// assert_eq!(cpu.write_u32(code, 0xc3), Err(Fault::WriteWatch { addr: code }));
    /// assert_eq!(cpu.read_u32(code), Ok(0x90)); // not stored
    /// // It drops its translation, unwatches, and retries the store.
    /// mm.write_unwatch(code, 4096, WatchMode::Notify).unwrap();
    /// cpu.write_u32(code, 0xc3).unwrap();
    /// ```
    pub fn write_watch(&self, addr: u64, len: u64, mode: WatchMode) -> Result<()> {
        let _q = QuiescentGuard::enter();
        let Some((first, end)) = self.watch_range(addr, len)? else { return Ok(()) };
        self.watches.watch(first, end, mode)?;
        if crate::watch::broken::ARM_WITHOUT_SHOOTDOWN.with(std::cell::Cell::get) {
            return Ok(());
        }
        self.shoot_down_watched(first * PAGE_SIZE, end * PAGE_SIZE);
        Ok(())
    }

    /// Removes `mode` from the watches of `[addr, addr + len)`; removing
    /// [`WatchMode::Log`] drops the pages' dirty bits. Pages not watched in
    /// `mode` are left alone. Errors as [`AddressSpace::write_watch`].
    pub fn write_unwatch(&self, addr: u64, len: u64, mode: WatchMode) -> Result<()> {
        let _q = QuiescentGuard::enter();
        let Some((first, end)) = self.watch_range(addr, len)? else { return Ok(()) };
        self.watches.unwatch(first, end, mode);
        Ok(())
    }

    /// The dirty log of `[addr, addr + len)`: bit `i` of `bits` (bit
    /// `i % 64` of `bits[i / 64]`) is set if page `i` of the range is
    /// logged ([`WatchMode::Log`]) and a [`crate::Cpu`] stored to it since
    /// its log was last cleared (or since it was logged); the other bits
    /// are cleared. With `clear`, the pages' marks are cleared and the
    /// range is shot down, so that the next store to each is marked again.
    ///
    /// Copy the pages the log names after the call: a store that was under
    /// way through a TLB entry filled before it lands before the call
    /// returns, and is then in the copy (KVM's `KVM_GET_DIRTY_LOG` order).
    ///
    /// `EINVAL` for an `addr` not page aligned, a range past the user
    /// address space, or `bits` shorter than the range's pages; `len` is
    /// rounded up to pages.
    ///
    /// ```
    /// use softmm::{uapi::*, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, WatchMode};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// mm.write_watch(a, 4 * 4096, WatchMode::Log).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// cpu.write_u8(a + 4096, 1).unwrap();
    /// cpu.write_u64(a + 3 * 4096 + 8, 2).unwrap();
    /// let mut bits = [0u64; 1];
    /// mm.dirty_log(a, 4 * 4096, &mut bits, true).unwrap();
    /// assert_eq!(bits[0], 0b1010);
    /// mm.dirty_log(a, 4 * 4096, &mut bits, false).unwrap();
    /// assert_eq!(bits[0], 0);
    /// ```
    pub fn dirty_log(&self, addr: u64, len: u64, bits: &mut [u64], clear: bool) -> Result<()> {
        let _q = QuiescentGuard::enter();
        let Some((first, end)) = self.watch_range(addr, len)? else { return Ok(()) };
        let words = (end - first).div_ceil(64);
        if (bits.len() as u64) < words {
            return Err(Errno::Inval);
        }
        if self.watches.dirty_log(first, end, &mut bits[..words as usize], clear)
            && !crate::watch::broken::CLEAR_WITHOUT_SHOOTDOWN.with(std::cell::Cell::get)
        {
            self.shoot_down_watched(first * PAGE_SIZE, end * PAGE_SIZE);
        }
        Ok(())
    }

    /// Number of pages under a write watch, in either mode.
    pub fn write_watched_pages(&self) -> u64 {
        self.watches.pages() as u64
    }

    /// Inserts a watchpoint (QEMU's `cpu_watchpoint_insert`): an access
    /// through a [`crate::Cpu`] of a kind in `mask` whose bytes overlap
    /// `[addr, addr + len)` returns [`crate::Fault::Watchpoint`] before it
    /// is made, after the guest's own faults (its `SIGSEGV` comes first);
    /// [`crate::Cpu::last_fault`] says its kind, first byte and size. Any
    /// length and alignment; watchpoints may overlap. Like a write watch,
    /// it belongs to the addresses (munmap, mremap and mprotect leave it, a
    /// fork's child has none) and the guest sees nothing of it; accesses
    /// of other kinds and to other pages keep the TLB's hit path, those of
    /// a watched kind to its pages take the miss path.
    ///
    /// In force when the call returns, for every CPU: an access through a
    /// TLB entry filled before the call is made before it returns (the
    /// pages are shot down). Resume with [`crate::Cpu::pass_watchpoint`],
    /// or remove it with [`AddressSpace::watchpoint_remove`].
    ///
    /// `EINVAL` for `len` 0 or a range past the user address space
    /// (`task_size`); `ENOSPC` past [`crate::MAX_WATCHPOINTS`]. A failed
    /// call changes nothing.
    ///
    /// ```
    /// use softmm::{uapi::*, Access, AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, WatchAccess};
    /// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// mm.watchpoint_insert(a + 4093, 5, WatchAccess::ACCESS).unwrap();
    /// assert_eq!(cpu.read_u32(a + 4088), Ok(0));
    /// // A load across the page boundary: its second page's bytes hit.
    /// assert_eq!(cpu.read_u64(a + 4090), Err(Fault::Watchpoint { addr: a + 4090 }));
    /// let hit = cpu.last_fault().unwrap();
    /// assert_eq!((hit.access, hit.addr, hit.size), (Access::Read, a + 4090, 8));
    /// mm.watchpoint_remove(a + 4093, 5, WatchAccess::ACCESS).unwrap();
    /// assert_eq!(cpu.read_u64(a + 4090), Ok(0));
    /// ```
    pub fn watchpoint_insert(&self, addr: u64, len: u64, mask: WatchAccess) -> Result<()> {
        let _q = QuiescentGuard::enter();
        let end = self.watchpoint_range(addr, len)?;
        self.watches.insert_point(addr, end, mask)?;
        if crate::watch::broken::POINT_WITHOUT_SHOOTDOWN.with(std::cell::Cell::get) {
            return Ok(());
        }
        // As `write_watch`, for the pages that hold the bytes.
        self.shoot_down_watched(addr & !(PAGE_SIZE - 1), end.div_ceil(PAGE_SIZE) * PAGE_SIZE);
        Ok(())
    }

    /// Removes one watchpoint inserted with the same `addr`, `len` and
    /// `mask` (QEMU's `cpu_watchpoint_remove`). `ENOENT` if there is none,
    /// `EINVAL` as [`AddressSpace::watchpoint_insert`].
    pub fn watchpoint_remove(&self, addr: u64, len: u64, mask: WatchAccess) -> Result<()> {
        let _q = QuiescentGuard::enter();
        let end = self.watchpoint_range(addr, len)?;
        self.watches.remove_point(addr, end, mask)
    }

    /// Number of watchpoints.
    pub fn watchpoints(&self) -> usize {
        self.watches.points()
    }

    /// The shootdown of a watch armed, or of dirty marks cleared, on the
    /// pages `[start, end)`, called after the change to the watches: when
    /// it returns, no CPU holds an entry filled before the change that
    /// lets an access through which the change now traps, and every later
    /// fill sees the change (`crate::watch`'s `# Protocol`).
    ///
    /// Under [`ShootdownTargets::Broadcast`], every CPU. Otherwise, as
    /// the zaps do, only the CPUs that may cache a translation of the
    /// range: a barrier (the fills' recheck's other half), then the fill
    /// owners of the range's entries ([`AddressSpace::watch_fill_owners`]);
    /// a CPU that never filled from them gets no request.
    fn shoot_down_watched(&self, start: u64, end: u64) {
        let range = FlushRange::new(start, end);
        if self.config.shootdown_targets == ShootdownTargets::Broadcast {
            self.flush_tlb_owners(&CpuSet::all(), range);
            return;
        }
        // The fills' recheck's other half. Under `membarrier` the fills
        // run only a compiler barrier, and this one is what orders them;
        // with fences on both sides (loom's only mode for a real `Cpu`)
        // the epoch pin below fences as well.
        crate::tlb::initiator_barrier();
        let owners = self.watch_fill_owners(start, end);
        self.flush_tlb_owners(&owners, range);
    }

    /// The CPUs that may cache a translation of `[start, end)` (page
    /// aligned), read after the barrier of
    /// [`AddressSpace::shoot_down_watched`]: the fill owners of its
    /// entries that hold a frame (present, or hidden by `PROT_NONE`, which
    /// keeps them). Every CPU where the owners are not recorded: a 2 MiB
    /// entry (hugetlb, whose tables may be shared, as the zaps do),
    /// embedder memory (`mmap_host`, filled from its VMA), or a range of
    /// more than [`OWNER_SCAN_PAGES`] pages, where one broadcast is
    /// cheaper than the scan.
    ///
    /// Not the CPUs of an entry a concurrent change (`munmap`, `mremap`,
    /// `MADV_DONTNEED`) has already cleared: that change shoots them down
    /// before it returns, and a store through such an entry is ordered
    /// before the change and so before this call (see `crate::watch`).
    fn watch_fill_owners(&self, start: u64, end: u64) -> CpuSet {
        if (end - start) / PAGE_SIZE > OWNER_SCAN_PAGES {
            return CpuSet::all();
        }
        // The published VMAs, not `mmap_lock`: a watch may be armed where
        // a writer waits for the caller (an MMIO callback's VMA reference).
        // A fill of embedder memory found its VMA before its barrier.
        let guard = crossbeam_epoch::pin();
        if crate::vma::query::overlapping(self.vmas_rcu(&guard), start, end)
            .any(|v| v.file.as_ref().is_some_and(|f| f.host_mem.is_some()))
        {
            return CpuSet::all();
        }
        let mut owners = CpuSet::EMPTY;
        for leaf in self.pgtables.leaves(start, end, &guard) {
            for (_, pte) in leaf.iter().filter(|(_, pte)| pte.has_frame()) {
                if leaf.entry_size() > PAGE_SIZE {
                    return CpuSet::all();
                }
                pte.add_fill_owners(&mut owners);
            }
            if owners.is_all() {
                break;
            }
        }
        owners
    }

    /// The end of a watchpoint's bytes; `EINVAL` for an empty range or one
    /// past `task_size`.
    fn watchpoint_range(&self, addr: u64, len: u64) -> Result<u64> {
        let task = self.config.task_size;
        if len == 0 || addr >= task || len > task - addr {
            return Err(Errno::Inval);
        }
        Ok(addr + len)
    }

    /// The page numbers `[first, end)` of a watch call's range, `None` for
    /// an empty one; `EINVAL` for an unaligned `addr` or a range past
    /// `task_size`.
    fn watch_range(&self, addr: u64, len: u64) -> Result<Option<(u64, u64)>> {
        if addr % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        if len == 0 {
            return Ok(None);
        }
        let task = self.config.task_size;
        if addr > task || len > task - addr {
            return Err(Errno::Inval);
        }
        // `addr + len <= task_size`: no overflow, and rounding up stays below 2^64.
        Ok(Some((addr / PAGE_SIZE, (addr + len).div_ceil(PAGE_SIZE))))
    }
}
