//! The address space (`mm_struct`): its VMA tree, page tables, `mmap_lock`,
//! TLB domain and statistics, and the syscalls that change it.
//!
//! # Locking
//!
//! * `mmap_lock` (a `crate::sync` rwlock, `parking_lot`'s or loom's, around
//!   [`MmState`]): every change to the VMA set holds it for write; a fault
//!   under [`FaultPolicy::MmapLock`] holds it for read. Each write section
//!   ends by publishing the new VMA tree version for lock-free readers.
//! * PTE locks (one per leaf table): every change of a leaf entry.
//! * Lock order: `mmap_lock` → file `invalidate_lock` → page-cache lock → PTE
//!   lock → TLB domain's CPU list. A TLB shootdown may wait while a PTE lock is
//!   held; that is safe because a CPU that blocks on a PTE lock or on
//!   `mmap_lock` is quiescent.

pub(crate) mod anon_rmap;
pub(crate) mod commit;
mod config;
mod gather;
#[cfg(test)]
pub(crate) mod hooks;
pub(crate) mod layout;
#[cfg(all(test, not(loom)))]
mod line_layout_tests;
mod linked_files;
#[cfg(all(test, not(loom)))]
mod lock_order_tests;
#[cfg(all(test, loom))]
mod loom_tests;
mod mkclean;
mod pin_state;
mod pmd_unshare;
pub(crate) mod range;
mod stack;
mod unmap;
mod vma;

use std::sync::{Arc, Weak};

pub(crate) use crate::vma::PublishedVmas;
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub use config::{ConfigError, MmConfig, TASK_SIZE, TASK_SIZE_32};
// The policies the core and its callers name through `mm` (they are
// `crate::policy`'s).
pub(crate) use crate::policy::{FaultPolicy, HugetlbPolicy, MadvisePolicy, PinPolicy, PlacementPolicy, UnmapPolicy};
pub(crate) use pin_state::PinState;
pub use range::RangeStats;
pub use unmap::UnmapStats;
pub(crate) use unmap::{ns_since, UnmapTimes};

use crate::file::{Inode, Mapper};
use crate::pgtable::{Leaf, PageTables, Pte};
use crate::phys::PhysMem;
use crate::rmap;
use crate::sync::range_writers::Blocked;
use crate::sync::rcu::Reclaimer;
use crate::sync::SeqCount;
use crate::tlb::{CpuSet, FlushRange, FlushTicket, ShootdownTargets, TlbDomain, TlbStats};
use crate::vma::{VmFlags, Vma, VmaTree};
use crate::WriterPolicy;
use crate::{PAGE_SHIFT, PAGE_SIZE};
pub(crate) use gather::{MmuGather, MAX_GATHER_FRAMES};

/// Pauses a writer spins for while `mmap_lock` is held before it parks
/// ([`WriterPolicy::ShortSpin`](crate::WriterPolicy::ShortSpin)): about 20-60 us on current x86 (a `pause`
/// is 10-40 ns), several write sections of mmap1.
#[cfg(not(loom))]
const WRITE_SPIN_LIMIT: u32 = 2048;

/// What `mmap_lock` protects.
pub(crate) struct MmState {
    pub(crate) vmas: VmaTree,
    pub(crate) start_brk: u64,
    pub(crate) brk: u64,
    /// The main thread's initial stack pointer (`mm->start_stack`), if the
    /// embedder declared one: the VMA holding it is `[stack]` in the maps.
    pub(crate) start_stack: Option<u64>,
    /// Ranges whose VMAs are gone but whose entries and page tables a
    /// lock-free unmap is still zapping ([`UnmapPolicy::LockFree`]): no
    /// mapping may be placed in one until it is released (`mm/unmap.rs`).
    pub(crate) reserved: Vec<unmap::Reservation>,
    /// The hugetlb VMAs entered in their files' reverse maps (kept in step
    /// with `vmas` when a write section ends, `sync_hugetlb_rmap`); empty,
    /// and never looked at, until a hugetlb VMA is mapped here.
    pub(crate) hugetlb_linked: Vec<Arc<Vma>>,
    /// A hugetlb VMA was mapped or inherited: write sections sync the reverse maps.
    pub(crate) hugetlb_seen: bool,
    /// Linux's `mm->def_flags`: flags every new mapping gets
    /// (`mlockall(MCL_FUTURE)`'s `VM_LOCKED_MASK`; `sys/mlock.rs`).
    pub(crate) def_flags: VmFlags,
    /// The MDWE bits of `mm->flags` (`MMF_HAS_MDWE`,
    /// `MMF_HAS_MDWE_NO_INHERIT`), as `PR_GET_MDWE` returns them
    /// (`sys/mdwe.rs`).
    pub(crate) mdwe: u64,
}

impl MmState {
    /// The state of an address space with `vmas` and its heap at
    /// `start_brk`: no stack yet, no reservation, no hugetlb window linked,
    /// no `def_flags`, no MDWE.
    fn with_vmas(vmas: VmaTree, start_brk: u64) -> MmState {
        MmState {
            vmas,
            start_brk,
            brk: start_brk,
            start_stack: None,
            reserved: Vec::new(),
            hugetlb_linked: Vec::new(),
            hugetlb_seen: false,
            def_flags: VmFlags::empty(),
            mdwe: 0,
        }
    }
}

/// Counters of one address space: those of every write section and of
/// every unmap per CPU slot (a writer writes only its own slot's lines),
/// the rest changed only on slow paths.
#[derive(Default)]
pub(crate) struct MmCounters {
    /// `mmap_lock` acquisitions, per slot.
    pub(crate) locks: crate::sync::percpu::PerCpu<LockCounts>,
    /// Pages `move_pages` moved (Linux's `pgmigrate_success`).
    pub(crate) pages_migrated: AtomicU64,
    /// PTE locks its migrations' isolation, unmap and remap walks took.
    pub(crate) migrate_ptl_locks: AtomicU64,
    /// Where the policy unmaps spent their time (`unmap.rs`).
    pub(crate) unmap: unmap::UnmapCounters,
    /// hugetlb faults that mapped a huge page.
    pub(crate) hugetlb_faults: AtomicU64,
}

/// One CPU slot's `mmap_lock` acquisitions ([`MmCounters::locks`]).
/// Statistics, read after the calls they count returned: `std`'s atomics,
/// Relaxed.
#[derive(Default)]
pub(crate) struct LockCounts {
    write: std::sync::atomic::AtomicU64,
    read: std::sync::atomic::AtomicU64,
}

impl MmCounters {
    /// The sums over the slots of (write, read) acquisitions.
    pub(crate) fn lock_counts(&self) -> (u64, u64) {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        self.locks.iter().fold((0, 0), |(w, r), s| (w + get(&s.write), r + get(&s.read)))
    }
}

/// Statistics of an address space. More counters may come: read the fields,
/// never build one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MmStats {
    /// Number of VMAs (`map_count`).
    pub map_count: usize,
    /// `mmap_lock` taken for write.
    pub mmap_lock_write: u64,
    /// `mmap_lock` taken for read outside CPUs' faults (those count on the CPU).
    pub mmap_lock_read: u64,
    /// TLB shootdown traffic.
    pub tlb: TlbStats,
    /// Resident pages (present PTEs, zero page included), like `VmRSS`.
    pub rss_pages: u64,
    /// Pages this address space's `move_pages` moved (`pgmigrate_success`).
    pub pages_migrated: u64,
    /// PTE locks its `move_pages`, `mbind` and `migrate_pages` walks took to
    /// isolate, unmap and remap the pages (for unmap and remap, one per page
    /// table and batch when the pages are adjacent, two per page one by one).
    pub migrate_ptl_locks: u64,
    /// Where its unmaps (`munmap`, `mremap` and `brk` shrinks) spent their time.
    pub unmap: UnmapStats,
    /// 4 KiB pages mapped by hugetlb mappings (`/proc/pid/status`
    /// `HugetlbPages` over 4 KiB); not part of `rss_pages`, as in Linux.
    pub hugetlb_pages: u64,
    /// hugetlb faults that mapped a huge page (first touch, COW).
    pub hugetlb_faults: u64,
    /// Pages of locked VMAs (`mm->locked_vm`, `/proc/pid/status` `VmLck`
    /// over 4 KiB): what `mlock`, `mlockall` and `MAP_LOCKED` count against
    /// the memlock limit.
    pub locked_pages: u64,
    /// Range-parallel writers' calls, conflicts and fallbacks
    /// ([`WriterPolicy::Range`]; zero under every other policy).
    pub range: RangeStats,
}

/// How long [`AddressSpace::read_lock_recursive`] stays parked before it
/// tries `mmap_lock` again: a truncate meets it only when it would
/// otherwise stay parked beside a reader it could join.
const RECURSIVE_READ_RETRY: std::time::Duration = std::time::Duration::from_micros(200);

/// A virtual address space with Linux semantics.
pub struct AddressSpace {
    pub(crate) phys: Arc<PhysMem>,
    pub(crate) config: MmConfig,
    // Each writer-written word below is on cache lines of its own (see
    // `mm/line_layout_tests.rs`): the lock word and `MmState` (written by
    // every write section), `vmas_rcu` (swapped by every publication) and
    // `seq` (2 stores per write section) would otherwise take away from
    // every faulting CPU the line it reads `pgtables`' root, `mempolicy`,
    // `config` or `unreachable`'s list from, on each write section.
    mmap_lock: CachePadded<RwLock<MmState>>,
    /// The published VMA set for lock-free readers, one version per 1 GiB
    /// window, each window's pointer on a line of its own (`vma/windows.rs`).
    windows: crate::vma::WindowDir,
    pub(crate) pgtables: PageTables,
    pub(crate) tlb: TlbDomain,
    pub(crate) counters: MmCounters,
    /// Odd while an `mmap_lock` writer runs (seed 001's `mmap_seq`).
    /// Padded: written by every write section, read only by `speculative`
    /// faults, while every fault reads its neighbours.
    pub(crate) seq: CachePadded<SeqCount>,
    /// Files whose reverse map lists this address space, so that dying it
    /// can remove itself from them; a file dying first removes itself
    /// from here (`Mapper::forget_file`).
    pub(crate) linked_files: linked_files::LinkedFiles,
    self_weak: Weak<AddressSpace>,
    /// Pinning: `write_protect_seq`, `MMF_HAS_PINNED`, `pinned_vm` (`crate::pin`).
    pub(crate) pins: Arc<PinState>,
    /// The address space's memory policy (`set_mempolicy`); null for the
    /// default. Read by lock-free faults under an epoch guard.
    mempolicy: Atomic<Arc<crate::mempolicy::MemPolicy>>,
    /// Ranges a lock-free unmap is zapping, where no TLB fill may walk
    /// (`tlb/unreachable.rs`).
    pub(crate) unreachable: crate::tlb::UnreachableRanges,
    /// The hugetlb VMA lock and the windows whose PMD tables were shared
    /// (seed 000, `phys/hugetlb/lock.rs`).
    pub(crate) hugetlb_lock: crate::phys::hugetlb::lock::HugetlbVmaLock,
    /// The emulator's write watches and dirty log (`crate::watch`), read by
    /// the TLB fill.
    pub(crate) watches: crate::watch::Watches,
    /// Range-parallel writers (`range.rs`): the address-space lock's shared
    /// mode, which every `mmap_lock` holder blocks under
    /// [`WriterPolicy::Range`], and what range writers count.
    pub(crate) range: range::RangeState,
    /// The coherent host-file window pages mapped (smaps `Rss`), off this
    /// struct's lines: fills of those pages write it.
    pub(crate) host_present: Box<crate::host_mem::HostPresent>,
}

/// `mmap_lock` held for write. Dropping it publishes the VMA tree it left.
pub(crate) struct MmapWriteGuard<'a> {
    mm: &'a AddressSpace,
    /// `None` only inside [`MmapWriteGuard::downgrade`].
    st: Option<RwLockWriteGuard<'a, MmState>>,
    /// The range writers kept out (under [`WriterPolicy::Range`]), until
    /// the section's end is published.
    blocked: Option<Blocked<'a>>,
}

/// `mmap_lock` held for read, with the range writers kept out under
/// [`WriterPolicy::Range`] (its `MmState` is then up to date with their
/// windows).
pub(crate) struct MmapReadGuard<'a> {
    st: RwLockReadGuard<'a, MmState>,
    _blocked: Option<Blocked<'a>>,
}

impl std::ops::Deref for MmapReadGuard<'_> {
    type Target = MmState;
    fn deref(&self) -> &MmState {
        &self.st
    }
}

/// `mmap_lock` held for read recursively ([`AddressSpace::read_lock_recursive`]),
/// range writers kept out. Its VMA set is read through
/// [`MmapRecursiveGuard::vmas`]: under [`WriterPolicy::Range`] a copy
/// brought up to date with the range writers' windows when `MmState`'s is
/// behind them, since a recursive reader may not take the write lock that
/// updating `MmState` needs.
pub(crate) struct MmapRecursiveGuard<'a> {
    st: RwLockReadGuard<'a, MmState>,
    synced: Option<VmaTree>,
    _blocked: Option<Blocked<'a>>,
}

impl MmapRecursiveGuard<'_> {
    /// The VMA set, up to date.
    pub(crate) fn vmas(&self) -> &VmaTree {
        self.synced.as_ref().unwrap_or(&self.st.vmas)
    }
}

impl std::ops::Deref for MmapWriteGuard<'_> {
    type Target = MmState;
    fn deref(&self) -> &MmState {
        self.st.as_ref().expect("held until downgraded")
    }
}

impl std::ops::DerefMut for MmapWriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut MmState {
        self.st.as_mut().expect("held until downgraded")
    }
}

impl<'a> MmapWriteGuard<'a> {
    /// Ends the write section (publishing the VMA tree, as a drop does) and
    /// keeps `mmap_lock` for read without letting a writer in between
    /// (`mmap_write_downgrade`): readers may enter at once, writers wait for
    /// the returned guard.
    pub(crate) fn downgrade(mut self) -> MmapReadGuard<'a> {
        let mut st = self.st.take().expect("held until downgraded");
        let removed = self.mm.end_write_section(&mut st);
        let st = RwLockWriteGuard::downgrade(st);
        self.mm.after_write_section(removed);
        MmapReadGuard { st, _blocked: self.blocked.take() }
    }
}

impl Drop for MmapWriteGuard<'_> {
    fn drop(&mut self) {
        if let Some(mut st) = self.st.take() {
            let removed = self.mm.end_write_section(&mut st);
            drop(st);
            drop(self.blocked.take());
            self.mm.after_write_section(removed);
        }
    }
}

/// Puts the file uses of `removed`, VMAs that left the address space with
/// their entries zapped ([`Vma::put_file`]); after `mmap_lock` is released
/// or downgraded, as Linux's `fput` defers the final `__fput`, so that an
/// eviction (a host file's writeback takes each mapper's `mmap_lock` for
/// read) never runs under the write lock.
pub(crate) fn put_files(removed: Vec<Arc<Vma>>) {
    for v in removed {
        v.put_file();
    }
}

impl AddressSpace {
    /// An empty address space on `phys`, or `EINVAL` for a configuration
    /// Linux could not have (see [`MmConfig`]'s "Validity").
    pub fn new(phys: &Arc<PhysMem>, config: MmConfig) -> crate::Result<Arc<AddressSpace>> {
        let config = config.validate()?;
        let st = MmState::with_vmas(VmaTree::default(), config.start_brk);
        let (shootdown_policy, posting_policy) = (config.shootdown_policy, config.posting_policy);
        let max_map_count = config.max_map_count;
        Ok(Arc::new_cyclic(|w| AddressSpace {
            phys: phys.clone(),
            pgtables: PageTables::new(phys),
            config,
            mmap_lock: CachePadded::new(RwLock::new(st)),
            windows: crate::vma::WindowDir::default(),
            tlb: TlbDomain::with_policies(shootdown_policy, posting_policy),
            counters: MmCounters::default(),
            seq: CachePadded::new(SeqCount::new()),
            linked_files: Default::default(),
            self_weak: w.clone(),
            pins: Arc::default(),
            mempolicy: Atomic::null(),
            unreachable: Default::default(),
            hugetlb_lock: Default::default(),
            watches: crate::watch::Watches::new(),
            range: range::RangeState::new(max_map_count),
            host_present: Box::default(),
        }))
    }

    /// Ends a write section on `st`: syncs the hugetlb reverse maps,
    /// publishes the tree and ends the write sequence. Returns the VMAs with
    /// a file the section removed, whose file uses the caller puts once
    /// `mmap_lock` is released or downgraded ([`put_files`]).
    fn end_write_section(&self, st: &mut MmState) -> Vec<Arc<Vma>> {
        #[cfg(test)]
        hooks::before_publish();
        let fresh = self.sync_hugetlb_rmap(st);
        self.publish_carrying_marks(&mut st.vmas, &fresh);
        if self.config.writer_policy.range_writers() {
            self.range_end_section(st);
        }
        self.seq.write_end();
        // The sequence count, and the lock word the caller's unlock writes.
        crate::sync::shared_write(2);
        let removed = st.vmas.take_removed();
        self.shoot_down_host_mem(&removed);
        removed
    }

    /// Step 2 of `crate::host_mem`'s protocol: a TLB fill from a
    /// host-memory VMA records no owner in any entry, so once a tree
    /// without (part of) such a VMA is published, every CPU is shot down
    /// before the VMA's file use is put (which may run the embedder's
    /// release). Nothing for the VMAs of every other kind.
    fn shoot_down_host_mem(&self, removed: &[Arc<Vma>]) {
        #[cfg(loom)]
        if crate::sync::broken::host_mem::NO_SHOOTDOWN.with(std::cell::Cell::get) {
            return;
        }
        if removed.iter().any(|v| v.file.as_ref().is_some_and(|f| f.host_mem.is_some())) {
            let _ = self.flush_tlb();
        }
    }

    /// The physical memory this address space allocates from.
    pub fn phys(&self) -> &Arc<PhysMem> {
        &self.phys
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &MmConfig {
        &self.config
    }

    /// The fault policy.
    pub fn policy(&self) -> FaultPolicy {
        self.config.policy
    }

    /// This address space as an anon family member (see [`crate::vma::AnonFamily`]).
    pub(crate) fn weak(&self) -> crate::vma::AnonMember {
        self.self_weak.clone()
    }

    pub(crate) fn write_lock(&self) -> MmapWriteGuard<'_> {
        self.counters.locks.mine().write.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut st =
            if self.config.writer_policy.spin_handoff() { self.write_lock_spinning() } else { self.mmap_lock.write() };
        // Range writers out and drained, then their windows taken in: from
        // here this section runs alone (`range.rs`).
        let blocked = (self.config.writer_policy.range_writers() && !crate::sync::broken::range_writers::no_block())
            .then(|| self.range.writers.block());
        if blocked.is_some() {
            self.sync_range_windows(&mut st);
        }
        self.seq.write_begin();
        // The lock word and the sequence count, which every writer writes.
        crate::sync::shared_write(2);
        MmapWriteGuard { mm: self, st: Some(st), blocked }
    }

    /// `mmap_lock` for write under [`WriterPolicy::ShortSpin`](crate::WriterPolicy::ShortSpin): while the
    /// lock stays held, spin (reading the lock word only, so the owner's
    /// unlock is not slowed by our RMWs) for up to [`WRITE_SPIN_LIMIT`]
    /// pauses, taking it as soon as it is seen free; then park as
    /// [`RwLock::write`] does. Linux's rwsem writers spin the same way while
    /// the owner runs (`rwsem_optimistic_spin`); a write section lasts a few
    /// microseconds, while a park costs a futex sleep, a wakeup and a
    /// reschedule. The spin is bounded, so a preempted owner costs a waiter
    /// at most the limit before it sleeps. Under loom the spin is left out:
    /// it changes no outcome and would only multiply the interleavings.
    fn write_lock_spinning(&self) -> RwLockWriteGuard<'_, MmState> {
        #[cfg(not(loom))]
        for _ in 0..WRITE_SPIN_LIMIT {
            if !self.mmap_lock.is_locked() {
                if let Some(st) = self.mmap_lock.try_write() {
                    return st;
                }
            }
            std::hint::spin_loop();
        }
        self.mmap_lock.write()
    }

    /// `mmap_lock` for read, counted in [`MmStats::mmap_lock_read`].
    pub(crate) fn read_lock(&self) -> MmapReadGuard<'_> {
        // The lock word, at the lock and at the unlock.
        crate::sync::shared_write(2);
        self.counters.locks.mine().read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.read_lock_blocking()
    }

    /// `mmap_lock` for read; under [`WriterPolicy::Range`] with the range
    /// writers blocked and drained, and `MmState` up to date with their
    /// windows: when it is behind, through a write section that takes them
    /// in, downgraded.
    fn read_lock_blocking(&self) -> MmapReadGuard<'_> {
        let st = self.mmap_lock.read();
        if !self.config.writer_policy.range_writers() || crate::sync::broken::range_writers::no_block() {
            return MmapReadGuard { st, _blocked: None };
        }
        let blocked = self.range.writers.block();
        if !self.windows.any_range_dirty() {
            return MmapReadGuard { st, _blocked: Some(blocked) };
        }
        drop(blocked);
        drop(st);
        self.write_lock().downgrade()
    }

    /// `mmap_lock` for read in a fault: counted by the faulting CPU instead
    /// ([`crate::FaultStats::mmap_lock_acquisitions`]), so that the fault
    /// writes no shared counter besides the lock word itself.
    pub(crate) fn read_lock_fault(&self) -> MmapReadGuard<'_> {
        self.read_lock_blocking()
    }

    /// `mmap_lock` for read even while a writer waits; only for paths that
    /// already hold a lock a fault under `mmap_lock` may wait for (truncate
    /// under `invalidate_lock`).
    ///
    /// `read_recursive` enters beside a writer that waits for readers only
    /// if it finds readers inside when it tries. Parked before (while a
    /// writer held the lock), it is woken only by an exclusive unlock, and
    /// parking_lot's unlock or downgrade wakes the waiters queued up to the
    /// first writer and that writer, none queued after it. So a truncate
    /// parked behind a writer's section could stay parked while a fault
    /// that entered `mmap_lock` for read as the section ended waits for the
    /// truncate's `invalidate_lock`, and the writer woken waits for the
    /// fault. The wait here is timed, and tries again at each timeout: it
    /// then finds the fault inside and enters (`lock_order_tests`). Bounded
    /// as the plain wait: a writer holding the lock never waits for
    /// `invalidate_lock`.
    pub(crate) fn read_lock_recursive(&self) -> MmapRecursiveGuard<'_> {
        let st = loop {
            if let Some(st) = self.mmap_lock.try_read_recursive_for(RECURSIVE_READ_RETRY) {
                break st;
            }
        };
        if !self.config.writer_policy.range_writers() {
            return MmapRecursiveGuard { st, synced: None, _blocked: None };
        }
        // The loom switch reads the published windows beside the range
        // writers inside, as a walker that took no part in the lock would.
        let blocked = (!crate::sync::broken::range_writers::no_block()).then(|| self.range.writers.block());
        let synced = self.range_synced_copy(&st);
        MmapRecursiveGuard { st, synced, _blocked: blocked }
    }

    /// Publishes the windows of `tree` its write section changed, one by
    /// one, each as one RCU version, in the order that never shows a
    /// lock-free reader a hole (see `vma/windows.rs`).
    fn publish(&self, tree: &mut VmaTree) {
        let guard = crossbeam_epoch::pin();
        self.windows.publish_changed(tree, &guard, self.reclaimer(), |_w| {
            // The window's pointer, which the lock-free faults in it read.
            crate::sync::shared_write(1);
            #[cfg(test)]
            hooks::after_window_published(_w);
        });
    }

    /// Who frees the old versions of the windows a write section
    /// unpublishes (`WriterPolicy`).
    fn reclaimer(&self) -> Reclaimer {
        match self.config.writer_policy {
            WriterPolicy::ShortCollect => Reclaimer::Flush,
            WriterPolicy::ShortOwnRcu | WriterPolicy::Range => Reclaimer::ThisThread,
            _ => Reclaimer::AnyThread,
        }
    }

    /// What ends every write section once `mmap_lock` is released or
    /// downgraded: the file uses of the VMAs it removed are put
    /// ([`put_files`]), and under [`WriterPolicy::ShortOwnRcu`] the writer
    /// closes its batch of old versions and frees those whose grace period
    /// has ended ([`crate::sync::rcu::end_batch`],
    /// [`crate::sync::rcu::reclaim_own`]).
    fn after_write_section(&self, removed: Vec<Arc<Vma>>) {
        put_files(removed);
        if self.reclaimer() == Reclaimer::ThisThread {
            crate::sync::rcu::end_batch();
            crate::sync::rcu::reclaim_own();
        }
    }

    /// The address space's memory policy (`None`: the default).
    pub(crate) fn mm_policy(&self) -> Option<Arc<crate::mempolicy::MemPolicy>> {
        let guard = crossbeam_epoch::pin();
        let p = self.mempolicy.load(Ordering::Acquire, &guard);
        // SAFETY: non-null pointers in `mempolicy` are freed only after every
        // guard that could have loaded them is dropped (`set_mm_policy`).
        unsafe { p.as_ref() }.cloned()
    }

    /// Where a new page for `va` of `vma` goes: the VMA's policy, else the
    /// address space's, else local (Linux's `get_vma_policy` and
    /// `policy_nodemask`). Writes no shared memory.
    pub(crate) fn placement(&self, vma: &Vma, va: u64) -> crate::phys::Placement {
        let ilx = vma.pgoff_at(va);
        match &vma.policy {
            Some(p) => crate::mempolicy::MemPolicy::placement(Some(p), ilx),
            None => {
                let guard = crossbeam_epoch::pin();
                let p = self.mempolicy.load(Ordering::Acquire, &guard);
                // SAFETY: as in `mm_policy`; the reference does not outlive `guard`.
                let p = unsafe { p.as_ref() };
                crate::mempolicy::MemPolicy::placement(p.map(|a| &**a), ilx)
            }
        }
    }

    /// Replaces the address space's memory policy.
    pub(crate) fn set_mm_policy(&self, policy: Option<Arc<crate::mempolicy::MemPolicy>>) {
        let guard = crossbeam_epoch::pin();
        let new = policy.map_or(Shared::null(), |p| Owned::new(p).into_shared(&guard));
        let old = self.mempolicy.swap(new, Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: `old` is unreachable from `mempolicy` now; readers that
            // loaded it hold a guard the deferred destruction waits for.
            unsafe { crate::sync::rcu::defer_destroy(&guard, old) };
        }
    }

    /// The published VMA set, readable without `mmap_lock` for as long as
    /// `guard` is held: each 1 GiB window at the version the reader loads
    /// (see `vma/windows.rs`).
    pub(crate) fn vmas_rcu<'d, 'g>(&'d self, guard: &'g Guard) -> PublishedVmas<'d, 'g> {
        self.windows.published(guard)
    }

    /// Shoots down every CPU's TLB for this address space (see [`crate::tlb`]).
    /// The calling thread's own CPUs are quiescent (it is inside softmm) and
    /// are not sent a request. Returns the proof that releases what the
    /// caller unmapped before it ([`rmap::Unmapped::release`]).
    pub(crate) fn flush_tlb(&self) -> rmap::TlbFlushed {
        crate::tlb::with_thread_cpus(|mine| self.tlb.flush(mine));
        rmap::TlbFlushed::completed()
    }

    /// Begins a shootdown of every CPU's TLB for this address space and
    /// returns without waiting, so that a caller can begin those of several
    /// address spaces and then wait for all (batched migration), or time
    /// the wait apart (`MmuGather`); see
    /// [`crate::tlb::TlbDomain::flush_begin`]. The calling thread's own CPUs
    /// are quiescent and neither counted nor waited for, as in
    /// [`AddressSpace::flush_tlb`].
    pub(crate) fn flush_tlb_begin(&self) -> FlushTicket {
        crate::tlb::with_thread_cpus(|mine| self.tlb.flush_begin(mine))
    }

    /// Flushes the TLBs of every address space of `mms`, all begun before
    /// any is waited for (the flushes proceed together), and returns the
    /// proof that they completed: what a migration's copy of the pages it
    /// unmapped in them before the call takes (`phys::FrozenPage`).
    pub(crate) fn flush_tlbs(mms: &[Arc<AddressSpace>]) -> rmap::TlbFlushed {
        let tickets: Vec<_> = mms.iter().map(|mm| mm.flush_tlb_begin()).collect();
        for t in tickets {
            t.wait();
        }
        rmap::TlbFlushed::completed()
    }

    /// [`AddressSpace::flush_tlb_begin`] for the CPUs that may cache what
    /// the caller removed: `owners`, the fill owners its locked changes
    /// collected (`PteGuard::take_fill_owners`), under
    /// [`crate::ShootdownTargets::FillOwners`]; every CPU under
    /// [`crate::ShootdownTargets::Broadcast`]. See
    /// [`crate::tlb::TlbDomain::flush_begin_targets`]: with no owner but
    /// the caller's CPUs, no request, no barrier and no wait.
    ///
    /// `range` is what the changes covered; under
    /// [`crate::ShootdownTargets::FillOwnersRanges`] the requests ask for
    /// it alone, else for every entry.
    pub(crate) fn flush_tlb_begin_owners(&self, owners: &CpuSet, range: FlushRange) -> FlushTicket {
        let (targets, range) = match self.config.shootdown_targets {
            ShootdownTargets::Broadcast => (CpuSet::all(), FlushRange::ALL),
            ShootdownTargets::FillOwners => (*owners, FlushRange::ALL),
            _ => (*owners, range),
        };
        crate::tlb::with_thread_cpus(|mine| self.tlb.flush_begin_targets(mine, &targets, range))
    }

    /// [`AddressSpace::flush_tlb_begin_owners`], waited for: the proof that
    /// releases what the caller unmapped in `range` before it
    /// ([`rmap::Unmapped::release`]).
    pub(crate) fn flush_tlb_owners(&self, owners: &CpuSet, range: FlushRange) -> rmap::TlbFlushed {
        self.flush_tlb_begin_owners(owners, range).wait();
        rmap::TlbFlushed::completed()
    }

    /// Current statistics.
    pub fn stats(&self) -> MmStats {
        let _q = crate::tlb::QuiescentGuard::enter();
        let st = self.read_lock();
        let map_count = st.vmas.len();
        let (huge, small): (Vec<_>, Vec<_>) = st.vmas.iter().partition(|v| v.flags.contains(VmFlags::HUGETLB));
        let rss_pages = small.iter().map(|v| self.vma_resident_pages(v)).sum();
        let hugetlb_pages = huge.iter().map(|v| self.resident_pages(v.start, v.end)).sum();
        let (mmap_lock_write, mmap_lock_read) = self.counters.lock_counts();
        MmStats {
            map_count,
            mmap_lock_write,
            mmap_lock_read,
            tlb: self.tlb.stats(),
            rss_pages,
            pages_migrated: self.counters.pages_migrated.load(Ordering::Relaxed),
            migrate_ptl_locks: self.counters.migrate_ptl_locks.load(Ordering::Relaxed),
            unmap: self.counters.unmap.stats(),
            hugetlb_pages,
            hugetlb_faults: self.counters.hugetlb_faults.load(Ordering::Relaxed),
            locked_pages: commit::locked_vm(&st.vmas),
            range: self.range.stats(),
        }
    }

    /// Counts a hugetlb fault that mapped a page.
    pub(crate) fn count_hugetlb_fault(&self) {
        self.counters.hugetlb_faults.fetch_add(1, Ordering::Relaxed);
    }

    /// Present pages in `[start, end)` (smaps `Rss` in pages).
    pub(crate) fn resident_pages(&self, start: u64, end: u64) -> u64 {
        let guard = crossbeam_epoch::pin();
        let pages = |leaf: Leaf<'_>| {
            // A page being migrated still counts (Linux keeps its RSS counter).
            leaf.iter().filter(|(_, pte)| pte.has_frame() || pte.is_migration()).count() as u64
                * (leaf.entry_size() / PAGE_SIZE)
        };
        self.pgtables.leaves(start, end, &guard).map(pages).sum()
    }

    /// Present pages of `v` (smaps `Rss` in pages): its entries', and for
    /// a coherent host-file window, which has none, the pages its fills,
    /// gup and remote accesses mapped (`HostPresent`) that the host still
    /// caches (`mincore` of those pages only: one it truncated or punched
    /// away is unmapped on Linux), counted for such a VMA only.
    pub(crate) fn vma_resident_pages(&self, v: &Vma) -> u64 {
        let window = v.file.as_ref().and_then(|f| f.host_mem.as_ref()).filter(|m| m.is_file());
        let mapped = window.map_or(0, |mem| {
            self.host_present.count(v.start, v.end, |va, n| mem.try_cached(v.pgoff + (va - v.start) / PAGE_SIZE, n))
        });
        self.resident_pages(v.start, v.end) + mapped
    }

    /// The entry mapping `va` (none if no table), read without locks.
    pub(crate) fn pte_at(&self, va: u64) -> Pte {
        let guard = crossbeam_epoch::pin();
        self.pgtables.leaf(va, &guard).map_or(Pte::NONE, |leaf| leaf.load(va))
    }

    /// Clears every entry holding a frame in `[start, end)` for which
    /// `filter(pte)` holds, gathering the frames; Linux's `zap_page_range`.
    ///
    /// When the gather fills, the zap stops, drops the PTE lock, flushes and
    /// frees what it gathered, and goes on where it stopped, as
    /// `zap_pte_range` does with `force_flush`: an unmap of any size holds at
    /// most `MAX_GATHER_FRAMES` frames between flushes.
    ///
    /// The epoch guard that keeps the walked tables alive is also dropped
    /// at each of those stops and taken again for the rest (a new walk from
    /// the root), so a zap of any size holds up the grace periods of the
    /// whole process for one gather's worth of entries at most: a guard held
    /// across a multi-GiB zap would keep every deferred free of every other
    /// thread (VMA trees, page tables) waiting, and the thread that then
    /// collects them all pays for it in one operation's latency. Each walk
    /// starts from the root under its own guard, so it only reaches tables
    /// that are attached or whose freeing waits for that guard.
    ///
    /// Guard markers (`MADV_GUARD_INSTALL`) stay: `MADV_DONTNEED` and the
    /// like keep them. An unmap drops them in the same walk with
    /// [`Self::unmap_range`].
    pub(crate) fn zap_range(&self, start: u64, end: u64, tlb: &mut MmuGather, filter: impl FnMut(Pte) -> bool) {
        self.zap_range_markers(start, end, tlb, filter, false);
    }

    /// The zap of an unmap (Linux's `unmap_vmas`): every entry of
    /// `[start, end)` goes, frames into `tlb` as [`Self::zap_range`], guard
    /// markers dropped in the same walk (`ZAP_FLAG_DROP_MARKER`) rather
    /// than by a second walk of the range, which cost 5-9% of a large
    /// munmap (`docs/results/big-munmap-cause.txt` section 6, in git at d35c665).
    pub(crate) fn unmap_range(&self, start: u64, end: u64, tlb: &mut MmuGather) {
        self.zap_range_markers(start, end, tlb, |_| true, true);
    }

    /// [`Self::zap_range`], dropping guard markers too if `drop_markers`.
    fn zap_range_markers(
        &self,
        start: u64,
        end: u64,
        tlb: &mut MmuGather,
        filter: impl FnMut(Pte) -> bool,
        drop_markers: bool,
    ) {
        // huge_pmd_unshare: never change entries other address spaces map.
        self.hugetlb_unshare_range(start, end);
        self.zap_walk(start, end, tlb, filter, drop_markers);
    }

    /// The walk of [`Self::zap_range_markers`], without its unshare: for a
    /// caller that has unshared the range under the locks that keep it
    /// unshared ([`Self::zap_vma_range`]).
    pub(crate) fn zap_walk(
        &self,
        start: u64,
        end: u64,
        tlb: &mut MmuGather,
        mut filter: impl FnMut(Pte) -> bool,
        drop_markers: bool,
    ) {
        // The window pages of the range go with its entries.
        self.host_present.clear(start, end);
        let mut from = start;
        while from < end {
            let guard = crossbeam_epoch::pin();
            let mut stopped = None;
            for leaf in self.pgtables.leaves(from, end, &guard) {
                #[cfg(loom)]
                let unlocked: Vec<_> = match crate::pgtable::broken::ZAP_READS_UNLOCKED.with(std::cell::Cell::get) {
                    true => leaf.iter().collect(),
                    false => Vec::new(),
                };
                let mut ptl = leaf.lock();
                ptl.update(|va, pte| {
                    #[cfg(loom)]
                    let pte = unlocked.iter().find(|&&(v, _)| v == va).map_or(pte, |&(_, p)| p);
                    if stopped.is_some() {
                        return None;
                    }
                    // zap_nonpresent_ptes: a marker goes only on unmap; it
                    // maps nothing, so it needs no flush.
                    if pte.is_guard() {
                        return drop_markers.then_some(Pte::NONE);
                    }
                    // zap_nonpresent_ptes: a migration entry holds no
                    // reference; it goes, and the migrator's remap finds
                    // nothing to restore here.
                    if pte.is_migration() {
                        return filter(pte).then_some(Pte::NONE);
                    }
                    if !pte.has_frame() || !filter(pte) {
                        return None;
                    }
                    if !tlb.add_cleared_frame(rmap::unmapped(&self.phys, pte), va, leaf.entry_size()) {
                        stopped = Some(va + leaf.entry_size());
                    }
                    Some(Pte::NONE)
                });
                // The CPUs that filled from what the update cleared, as its
                // swaps returned them. A 2 MiB leaf is hugetlb's, whose PMD
                // tables may be shared across address spaces: the zaps
                // unshare first, but its shootdowns stay broadcasts all the
                // same (the scaling design keeps them so).
                let mut owners = ptl.take_fill_owners();
                drop(ptl);
                if leaf.entry_size() > PAGE_SIZE && !owners.is_empty() {
                    owners.insert_all();
                }
                tlb.add_fill_owners(&owners);
                if stopped.is_some() {
                    break;
                }
            }
            // The PTE lock and the guard are dropped: flush and free a full
            // gather, then walk the rest under a new guard.
            drop(guard);
            tlb.flush_if_full(self);
            from = stopped.unwrap_or(end);
        }
    }

    /// Applies the protection of `flags` (`VM_*`) to the entries of
    /// `[start, end)` that hold a frame: `PROT_NONE` hides them, read-only
    /// drops write access, and NX is set or cleared with `VM_EXEC`. Write
    /// access is never added here; a write fault grants it (and breaks COW
    /// where needed).
    pub(crate) fn change_protection(&self, start: u64, end: u64, flags: VmFlags, tlb: &mut MmuGather) {
        // huge_pmd_unshare: never change entries other address spaces map.
        self.hugetlb_unshare_range(start, end);
        let accessible = flags.intersects(VmFlags::ACCESS_FLAGS);
        let writable = flags.contains(VmFlags::WRITE);
        self.pgtables.update_range(start, end, |_, pte| {
            if pte.is_migration() {
                // change_pte_range: a writable migration entry becomes a
                // readable one; the remap applies the VMA's access then.
                let new = if writable { pte } else { pte.clear(Pte::WRITE) };
                let new = if flags.contains(VmFlags::EXEC) { new.clear(Pte::NX) } else { new.set(Pte::NX) };
                return (new != pte).then_some(new);
            }
            if !pte.has_frame() {
                return None;
            }
            let new = match (accessible, writable) {
                (false, _) => pte.protnone(),
                (true, true) => pte.unprotnone(),
                (true, false) => pte.unprotnone().clear(Pte::WRITE),
            };
            // NX follows `VM_EXEC` both ways (x86-64's `pte_modify`).
            let new = if flags.contains(VmFlags::EXEC) { new.clear(Pte::NX) } else { new.set(Pte::NX) };
            // Narrowing (losing present, write or execute) needs a shootdown.
            if (pte.is_present() && !new.is_present())
                || (pte.has(Pte::WRITE) && !new.has(Pte::WRITE))
                || (!pte.has(Pte::NX) && new.has(Pte::NX))
            {
                tlb.need_flush = true;
            }
            (new != pte).then_some(new)
        });
    }

    /// Moves the entries of `[old, old+len)` to `[new, new+len)` (mremap).
    /// The destination must have no entries. Old translations need a flush.
    pub(crate) fn move_ptes(&self, old: u64, new: u64, len: u64, tlb: &mut MmuGather) {
        // huge_pmd_unshare: never move entries other address spaces map.
        self.hugetlb_unshare_range(old, old.saturating_add(len));
        self.host_present.moved(old, new, len);
        let guard = crossbeam_epoch::pin();
        let mut moved = Vec::new();
        for leaf in self.pgtables.leaves(old, old + len, &guard) {
            // Taken under the source table's lock, stored under the
            // destination's: the two may be one table, and each lock is held
            // alone (mmap_lock for write keeps the entries from changing in
            // between: the VMA is detached, so no fault installs one).
            moved.clear();
            leaf.lock().update(|va, pte| {
                if pte.is_none() {
                    return None;
                }
                moved.push((va, pte));
                Some(Pte::NONE)
            });
            for &(va, pte) in &moved {
                tlb.need_flush = true;
                let dst = new + (va - old);
                // A 2 MiB leaf (hugetlb) moves to a PMD leaf; hugetlb VMAs
                // never hold PTE tables, so the destination has room.
                let Some(dleaf) = self.pgtables.leaf_alloc_sized(dst, leaf.entry_size(), &guard) else {
                    unreachable!("a hugetlb destination holds a PTE table")
                };
                let prev = dleaf.lock().replace(dst, pte);
                debug_assert!(prev.is_none(), "mremap destination had an entry");
            }
        }
    }

    /// Removes `[start, end)`'s mappings from the VMA tree (splitting VMAs at
    /// the edges), zaps their pages and frees page tables no VMA needs any
    /// more; Linux's `do_vmi_align_munmap`. `start`/`end` are page aligned.
    pub(crate) fn do_munmap(&self, st: &mut MmState, start: u64, end: u64, tlb: &mut MmuGather) -> crate::Result<()> {
        if let Some((lo, hi)) = self.detach_vmas(st, start, end)? {
            self.unmap_range(lo, hi, tlb);
            self.free_pgtables(st, lo, hi, tlb);
        }
        Ok(())
    }

    /// Removes `[start, end)` from the VMA tree, splitting the VMAs at its
    /// edges, and returns the span the removed mappings covered (`None` if
    /// nothing was mapped). Their page-table entries are left for the caller:
    /// once this returns no fault can install one there any more, because
    /// every removed VMA is detached (lock-free faults abort) and `mmap_lock`
    /// is held for write (locked faults wait and then find no VMA).
    /// `ENOMEM` without change if a split would exceed `max_map_count`.
    pub(crate) fn detach_vmas(&self, st: &mut MmState, start: u64, end: u64) -> crate::Result<Option<(u64, u64)>> {
        let accounted = commit::accounted_pages(&st.vmas, start, end);
        // vm_ops->close of the parts that go (hugetlb: their private
        // reservations); only a VMA with something to close is kept for it.
        let closing: Vec<(Arc<Vma>, u64, u64)> = st
            .vmas
            .overlapping(start, end)
            .filter(|v| v.hugetlb_resv.is_some())
            .map(|v| (v.clone(), start.max(v.start), end.min(v.end)))
            .collect();
        let span = self.detach_vmas_keep_charge(st, start, end)?;
        for (v, lo, hi) in closing {
            v.ops.close(&v, lo, hi);
        }
        // vms_complete_munmap_vmas: the removed mappings' commit charge goes.
        self.phys.vm_unacct_memory(accounted);
        Ok(span)
    }

    /// [`Self::detach_vmas`] leaving the commit charge of the removed
    /// mappings in place, for a move whose destination takes it over.
    pub(crate) fn detach_vmas_keep_charge(
        &self,
        st: &mut MmState,
        start: u64,
        end: u64,
    ) -> crate::Result<Option<(u64, u64)>> {
        if start >= end {
            // mremap of a shared mapping with old_len 0 duplicates it and
            // unmaps nothing.
            return Ok(None);
        }
        let victims: Vec<Arc<Vma>> = st.vmas.overlapping(start, end).cloned().collect();
        let (Some(first), Some(last)) = (victims.first(), victims.last()) else {
            return Ok(None);
        };
        self.munmap_gather_check(st, start, end)?;
        // Each goes from the tree; the first and last put back what lies
        // outside the range (`split_vma`).
        for v in &victims {
            self.split_vma(st, v, start.max(v.start), end.min(v.end));
        }
        Ok(Some((start.max(first.start), end.min(last.end))))
    }

    /// [`Self::munmap_split_check`] with what Linux leaves of a call it
    /// refuses after the first VMA's split at `start` (a sealed VMA past
    /// the first, the tail's `may_split`): `vms_gather_munmap_vmas` has
    /// split the first VMA by then and does not merge it back, so neither
    /// does this (the maps show two VMAs where there was one; on the host,
    /// a hugetlb `munmap` whose end is inside a huge page). A refusal of
    /// the head split itself (the map count, the first VMA sealed, its
    /// `may_split` at `start`) changes nothing.
    pub(crate) fn munmap_gather_check(&self, st: &mut MmState, start: u64, end: u64) -> crate::Result<()> {
        let res = self.munmap_split_check(&st.vmas, start, end);
        if res.is_err() {
            let first = st.vmas.overlapping(start, end).next().cloned();
            // The head split's own checks, in `munmap_split_check`'s order.
            let max = self.config.max_map_count;
            let head_split = first.filter(|f| {
                f.start < start
                    && !(end < f.end && st.vmas.len() >= max)
                    && !f.flags.contains(VmFlags::SEALED)
                    && f.ops.may_split(f, start).is_ok()
            });
            if let Some(first) = head_split {
                self.split_vma(st, &first, start, first.end);
                st.vmas.insert(first.slice(start, first.end, first.flags));
            }
        }
        res
    }

    /// The refusals of [`Self::detach_vmas`] for `[start, end)`, checked
    /// without changing anything (Linux's `vms_gather_munmap_vmas` before
    /// its splits): `ENOMEM` if splitting one VMA in two would exceed
    /// `max_map_count`, `EPERM` if a VMA is sealed (`mseal`; the first VMA
    /// before its split is checked, the others after), then `EINVAL` if a
    /// VMA cannot be split at an edge
    /// (`vm_ops->may_split`: hugetlb inside a huge page). `mmap` checks them
    /// before a file's mmap hook runs, as `mmap_region` gathers the VMAs it
    /// replaces first.
    pub(crate) fn munmap_split_check(&self, vmas: &VmaTree, start: u64, end: u64) -> crate::Result<()> {
        let mut victims = vmas.overlapping(start, end);
        let Some(first) = victims.next() else {
            return Ok(());
        };
        let last = victims.last().unwrap_or(first);
        if start > first.start && end < first.end && vmas.len() >= self.config.max_map_count {
            return Err(crate::Errno::NoMem);
        }
        // A sealed VMA (mseal) is never unmapped nor split: EPERM, after
        // the map count and before the split (vms_gather_munmap_vmas).
        if first.flags.contains(VmFlags::SEALED) {
            return Err(crate::Errno::Perm);
        }
        // __split_vma: vm_ops->may_split (hugetlb), after the map count.
        Self::split_vma_check(first, start, end)?;
        if Arc::ptr_eq(first, last) {
            return Ok(());
        }
        if vmas.overlapping(start, end).any(|v| v.flags.contains(VmFlags::SEALED)) {
            return Err(crate::Errno::Perm);
        }
        Self::split_vma_check(last, start, end)
    }

    /// Detaches the page tables that only the now-empty `[start, end)` used.
    /// A reserved range counts as used: a lock-free unmap may still be
    /// zapping its tables, and frees them itself.
    pub(crate) fn free_pgtables(&self, st: &MmState, start: u64, end: u64, tlb: &mut MmuGather) {
        let below = st.reserved.iter().filter(|r| r.end <= start).map(|r| r.end);
        let above = st.reserved.iter().filter(|r| r.start >= end).map(|r| r.start);
        // A range writer's one-window view stops at its window's bounds.
        let (bottom, top) = st.vmas.table_bounds(self.config.task_size.next_power_of_two());
        let floor = st.vmas.prev_of(start).map_or(bottom, |v| v.end).max(below.max().unwrap_or(0));
        let ceiling = st.vmas.find_from(end).map_or(top, |v| v.start).min(above.min().unwrap_or(u64::MAX));
        self.pgtables.detach_tables(start, end, floor, ceiling, &mut tlb.tables);
    }

    /// Brings the hugetlb files' reverse maps (by VMA) in step with the VMA
    /// tree a write section leaves: VMAs that went are removed, new ones
    /// (mapped, split, moved, inherited) added. Linux links and unlinks
    /// each VMA where it changes; here the write section's end does it for
    /// all, before the tree is published, so the map is exact whenever
    /// `mmap_lock` is free. Costs nothing until a hugetlb VMA is mapped.
    /// Returns the new VMAs copied from one `unmap_ref_private` may have
    /// marked since the copy ([`Vma::hugetlb_unmapped_from`]), for
    /// [`Self::publish_carrying_marks`].
    fn sync_hugetlb_rmap(&self, st: &mut MmState) -> Vec<Arc<Vma>> {
        if !st.hugetlb_seen {
            return Vec::new();
        }
        let mut fresh = Vec::new();
        let now: Vec<Arc<Vma>> = st.vmas.iter().filter(|v| v.flags.contains(VmFlags::HUGETLB)).cloned().collect();
        let me: Weak<dyn Mapper> = self.self_weak.clone();
        let id = crate::file::interval_tree::mm_id(&me);
        for old in &st.hugetlb_linked {
            if !now.iter().any(|v| Arc::ptr_eq(v, old)) {
                unlink_hugetlb_vma(&self.phys, id, old);
            }
        }
        for v in &now {
            if !st.hugetlb_linked.iter().any(|old| Arc::ptr_eq(v, old)) {
                if v.hugetlb_unmapped_from.is_some() {
                    fresh.push(v.clone());
                }
                if let Some(inode) = v.file.as_ref().and_then(|f| f.hugetlb.as_ref()) {
                    let entry = crate::file::interval_tree::RmapVma {
                        mm: me.clone(),
                        start: v.start,
                        end: v.end,
                        pgoff: v.pgoff,
                    };
                    inode.vmas.insert(&self.phys, entry);
                }
            }
        }
        st.hugetlb_linked = now;
        fresh
    }

    /// Publishes `tree`; with `fresh` VMAs (copies of VMAs the owner of
    /// their reservations may have marked `HPAGE_RESV_UNMAPPED` since the
    /// copy), under their files' `i_mmap` locks for read, after carrying
    /// each such mark over to the copies. `unmap_ref_private` marks the VMA
    /// it finds in the published tree, under `i_mmap` for write and no lock
    /// of ours: before this it finds the VMA copied from (whose mark is then
    /// carried over here), after it the copy; no mark is lost in between.
    /// Linux's split changes the VMA it keeps in place under `i_mmap` for
    /// write (`vma_prepare`) until the new one is in the tree, so that one
    /// keeps a mark set meanwhile; softmm replaces every piece, so each
    /// piece carries the mark over. No fault reaches a copy before it is
    /// published.
    fn publish_carrying_marks(&self, tree: &mut VmaTree, fresh: &[Arc<Vma>]) {
        if fresh.is_empty() {
            return self.publish(tree);
        }
        let mut locks: Vec<&crate::phys::hugetlb::lock::IMmapLock> =
            fresh.iter().filter_map(|v| v.file.as_ref()?.hugetlb.as_ref()).map(|inode| &inode.vmas.i_mmap).collect();
        // One order for several files' locks (a write section may split
        // mappings of two), and each once.
        locks.sort_by_key(|l| Arc::as_ptr(l));
        locks.dedup_by(|a, b| Arc::ptr_eq(a, b));
        let held: Vec<_> = locks
            .iter()
            .map(|l| self.phys.hugetlb.locks.read(crate::phys::hugetlb::lock::Kind::IMmapRead, l))
            .collect();
        for v in fresh {
            if v.hugetlb_unmapped_from.as_ref().is_some_and(|from| from.load(Ordering::Relaxed)) {
                v.mark_hugetlb_unmapped();
            }
        }
        self.publish(tree);
        drop(held);
    }

    /// Records in `file`'s reverse map that this address space maps it.
    ///
    /// The file's own set answers whether the link exists, under the file's
    /// lock (Linux's `i_mmap_rwsem`, which every file mmap takes), which
    /// only the mappers of that file write: threads mapping different files
    /// share no line here. Only a new link takes this address space's list,
    /// which its teardown walks to unlink itself (at most once per file;
    /// the caller holds the address space, so no teardown can run between
    /// the two). A link already there costs no write to the address
    /// space's own reference counts, which every thread of the process
    /// shares: the weak reference is made only for a new link.
    pub(crate) fn link_file(&self, file: &Arc<Inode>) {
        if file.add_mapping(self as *const AddressSpace as *const (), || self.self_weak.clone()) {
            self.linked_files.link(Arc::downgrade(file));
        }
    }
}

impl AddressSpace {
    /// The address space that `mapper`, an entry of a file's reverse map
    /// (`Inode::mappers`, hugetlb's reverse map by VMA), is: every
    /// `file::Mapper` is one, so this is `None` for no mapper the crate
    /// makes. The one place that turns a reverse-map entry back into its
    /// type, for the walks above the core that need the whole address space
    /// (migration's, hugetlb's PMD sharing and `unmap_ref_private`).
    pub(crate) fn from_mapper(mapper: Arc<dyn Mapper>) -> Option<Arc<AddressSpace>> {
        mapper.as_any().downcast().ok()
    }
}

/// The identity of the address space behind `w` in a reverse map.
fn mapper_weak_id(w: &Weak<AddressSpace>) -> usize {
    let w: Weak<dyn Mapper> = w.clone();
    crate::file::interval_tree::mm_id(&w)
}

/// Removes `v`, a hugetlb VMA of the address space `mm`, from its file's
/// reverse map.
fn unlink_hugetlb_vma(phys: &PhysMem, mm: usize, v: &Vma) {
    if let Some(inode) = v.file.as_ref().and_then(|f| f.hugetlb.as_ref()) {
        inode.vmas.remove(phys, mm, v.start, v.pgoff);
    }
}

impl Mapper for AddressSpace {
    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }

    /// Zaps the mappings of file pages `[first, last)` of `file` (truncate and
    /// hole punch); see [`crate::File::set_len`].
    fn unmap_file_range(&self, file: &Inode, first: u64, last: u64, even_cows: bool) {
        let st = self.read_lock_recursive();
        let mut tlb = MmuGather::default();
        for v in st.vmas().iter() {
            if v.file.as_ref().is_none_or(|f| f.id() != file.id()) {
                continue;
            }
            let vfirst = v.pgoff;
            let vlast = v.pgoff + v.pages();
            let lo = first.max(vfirst);
            let hi = last.min(vlast);
            if lo >= hi {
                continue;
            }
            let start = v.start + ((lo - vfirst) << PAGE_SHIFT);
            let end = v.start + ((hi - vfirst) << PAGE_SHIFT);
            let file_id = file.id();
            let phys = &self.phys;
            let mut filter = |pte: Pte| even_cows || phys.desc(pte.pfn()).mapping.load(Ordering::Relaxed) == file_id;
            // unmap_single_vma, through the backing: under `mmap_lock` for
            // read only, a shareable hugetlb window needs the locks that
            // keep it unshared, and a private copy's owner gets its
            // reservation back.
            self.zap_vma_range(v, start, end, &mut tlb, crate::vma::ZapDetails { even_cows, filter: &mut filter });
        }
        // A coherent shared mapping of the file (its own `[host]`-like
        // inode, a window onto the host's pages) records no fill owners:
        // every CPU goes, before the host file shrinks under it.
        for v in st.vmas().iter() {
            if v.file.as_ref().and_then(|f| f.host_mem.as_ref()?.origin()) != Some(file.id()) {
                continue;
            }
            tlb.need_flush = true;
            // Its pages in the range leave this address space, as the
            // zap takes a shared file mapping's entries.
            let (lo, hi) = (first.max(v.pgoff), last.min(v.pgoff + v.pages()));
            if lo < hi {
                self.host_present
                    .clear(v.start + ((lo - v.pgoff) << PAGE_SHIFT), v.start + ((hi - v.pgoff) << PAGE_SHIFT));
            }
        }
        // Flush before mmap_lock is released, as Linux's tlb_finish_mmu
        // does: once another thread can map this range again, no CPU may
        // still reach the old frames through its TLB.
        tlb.finish(self);
        drop(st);
    }

    fn mkclean_file_pages(&self, file: &Inode, pages: &[(u64, crate::phys::Pfn)]) {
        self.page_mkclean(file, pages);
    }

    fn forget_file(&self, file: *const Inode) {
        self.linked_files.forget(file);
    }
}

impl Drop for AddressSpace {
    fn drop(&mut self) {
        // exit_mmap: the page tables, and the frames their entries hold, go
        // when `pgtables` drops after this: no CPU is attached (each holds an
        // Arc) and no walker can reach the tree, so nothing waits for a flush.
        let me: *const dyn Mapper = self as *const AddressSpace;
        for file in self.linked_files.drain_live() {
            file.remove_mapping(me);
        }
        // The windows range writers changed since the last mmap_lock
        // section: exit tears down (and uncharges) what is mapped now.
        let mut vmas = std::mem::take(&mut self.mmap_lock.get_mut().vmas);
        self.sync_range_windows_into(&mut vmas);
        let st = self.mmap_lock.get_mut();
        st.vmas = vmas;
        // exit_mmap's unlink_file_vma: out of the hugetlb files' reverse maps.
        let me = mapper_weak_id(&self.self_weak);
        for v in st.hugetlb_linked.drain(..) {
            unlink_hugetlb_vma(&self.phys, me, &v);
        }
        // exit_mmap: the commit charge of what is left goes.
        self.phys.vm_unacct_memory(commit::accounted_pages(&st.vmas, 0, u64::MAX));
        // remove_vma → vm_ops->close (hugetlb: private reservations) now, not
        // after the VMAs' grace period; and its fput: the last mapping of a
        // shared anonymous object or of a file without a handle evicts it
        // now (pages still mapped go when the page tables drop, below).
        for v in st.vmas.iter() {
            v.ops.close(v, v.start, v.end);
            v.put_file();
        }
        put_files(st.vmas.take_removed());
        st.vmas = VmaTree::default();
        self.windows.clear();
        self.set_mm_policy(None);
    }
}
