//! Range-parallel writers ([`WriterPolicy::Range`](crate::WriterPolicy::Range),
//! issue 32 item 3, CortenMM's and RadixVM's point): a bounded-range call
//! whose footprint lies inside one 1 GiB window of the VMA set runs without
//! `mmap_lock`, beside the writers of other windows.
//!
//! # Protocol
//!
//! A range writer
//!
//! 1. enters the address-space lock's shared mode
//!    ([`RangeWriters::try_enter`]); refused (an `mmap_lock` holder blocks
//!    it), the call takes the `mmap_lock` path;
//! 2. takes its window's lock ([`WindowDir::lock_window`]); a range writer
//!    holds one window lock at a time, and never waits for anything else
//!    while inside (a VMA's detach waits only for faults, which wait for
//!    no range writer);
//! 3. loads the window's published version and checks that no VMA crosses
//!    the window's bounds and that nothing listed below sends the call to
//!    `mmap_lock`;
//! 4. unpins (the view owns its copy of the window: a writer preempted
//!    while pinned would hold back every thread's reclamation), and
//!    applies the change with the `mmap_lock` path's own code
//!    (`detach_vmas`, `mmap_region`'s insert and merge) to a
//!    [`VmaTree::window_view`] of the window: every VMA it removes is
//!    detached ([`VmaTree::remove`]) before anything is published, so a
//!    lock-free fault that found it aborts, exactly as under `mmap_lock`;
//! 5. zaps, frees the page tables (never beyond its window: the view's
//!    floor and ceiling stop at the window's bounds) and flushes, as the
//!    `mmap_lock` path does in its section; a `munmap` that empties its
//!    window and leaves its 512 GiB region without a VMA frees the
//!    region's PUD table under `mmap_lock` after it leaves
//!    ([`AddressSpace::range_munmap`]), as Linux's `free_pgtables` does;
//! 6. pins again, publishes the window, marks it for the next `mmap_lock`
//!    holder ([`WindowDir::mark_range_dirty`]) and counts its change of
//!    `map_count` in its slot; then unlocks the window and leaves.
//!
//! Every `mmap_lock` holder, read or write, blocks the shared mode and
//! waits for it to drain once it holds the lock ([`AddressSpace::write_lock`],
//! `read_lock`), then takes the windows the range writers published into
//! `MmState`'s version of the set ([`AddressSpace::sync_range_windows`]):
//! after that it runs alone, as under every other policy, and its end of
//! section publishes the map count and the mirrors below for the range
//! writers that come after it (whose entry synchronizes with its unblock).
//!
//! # What a range write writes
//!
//! With placement arenas, where each thread's calls stay in its own
//! window, only lines no other thread writes: its slot's `inside` count
//! ([`RangeWriters::try_enter`], entry and exit), its window's line (the
//! lock and the published version), its slot's `map_count` change and
//! statistics, its thread's epoch record and allocator pages; the leaf's
//! dirty bit once per `mmap_lock` section. It reads, besides its own
//! lines, `blockers` and the mirrors above (written by `mmap_lock`
//! sections only), the leaf bitmaps, and at its window's bounds the
//! neighbouring window's version (`window_is_closed`, the arena's
//! guard-gap check, [`AddressSpace::range_footprint_ok`]), which that
//! window's writer does write. The old versions it unpublishes are freed
//! by whichever thread's epoch collection comes first (so some of its VMAs
//! are dropped, and their slot's count written, by another thread). With
//! `shared-write-stats`, the window's and the `inside` slot's lines count as
//! shared only when another thread wrote them last
//! ([`crate::sync::LastWriter`]): `tests/writer_shared_writes.rs` holds an
//! mmap1 op to at most one shared-line write at 1 and 2 threads.
//!
//! # What falls back to `mmap_lock`
//!
//! Each of these takes the ordinary path, whose result is the reference:
//!
//! * a footprint that spans two windows, or touches a VMA crossing its
//!   window's bounds (stored in one window, it is seen from the other);
//!   for `mmap`, a new VMA that would merge with a neighbour in another
//!   window (the merged VMA would cross);
//! * the shared mode blocked (an `mmap_lock` holder in or waiting);
//! * a call that cannot make a VMA on a window that never held one (whose
//!   directory leaf it would allocate for nothing, [`Neighbours`]);
//! * `FaultPolicy::Speculative`, whose faults validate against the address
//!   space's sequence count, which range writers do not bump;
//! * a lock-free unmap's reservation in flight anywhere
//!   (`MmState::reserved`, mirrored), whose range `free_pgtables` and
//!   placement must honour;
//! * `mlockall(MCL_FUTURE)` (`MmState::def_flags`) or MDWE in force
//!   (mirrored), which `mmap` consults;
//! * any VMA in the footprint of hugetlb, a host file, host memory or a
//!   device (their reverse maps, reservations and `close` hooks live
//!   under `mmap_lock`), or `VM_LOCKED`/`VM_LOCKONFAULT` (`locked_vm` and
//!   the memlock limit); shared and private mappings of plain page-cache
//!   files and shmem are a range writer's to remove, split, merge, move
//!   and change, as private anonymous memory is ([`range_vma_ok`], which
//!   says why their reverse-map walkers need nothing more);
//! * an `mmap` of anything but anonymous memory or a plain page-cache
//!   file, shared or private (`sys/mmap.rs`, `range_mmap`): hugetlb, host
//!   and device files;
//! * `madvise` other than the advice that changes VMA flags
//!   (`sys/madvise/range.rs`; `MADV_DONTNEED` and `MADV_FREE` never take
//!   `mmap_lock` for write: a call inside one VMA runs under its read
//!   reference under the default `MadvisePolicy::PerVma`, the rest under
//!   `mmap_lock` for read, which blocks range writers as every holder does);
//! * `mremap` moving to where a search over more than its window puts it
//!   (under Linux placement, or outside the calling thread's arena), a
//!   moved or grown VMA that would reach its window's bounds, or an old
//!   range of more than one VMA, whose move adds a VMA per piece
//!   (`sys/mremap/range.rs`);
//! * its slot's share of the room below `max_map_count` used up
//!   ([`RangeState::map_count_share`], Linux's `percpu_counter` batch): a
//!   call the limit might refuse goes to `mmap_lock`, whose check is
//!   exact, and whose section splits the room among the slots again.

use crate::error::Result;
use crate::sync::percpu::{PerCpu, SLOTS};
use crate::sync::range_writers::RangeWriters;
use crate::sync::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use crate::vma::{window_of, PublishedVmas, VmFlags, Vma, VmaTree, WindowDir, Windows};

use super::{AddressSpace, MmState, MmuGather};

/// The range writers' state of one address space.
pub(crate) struct RangeState {
    /// The shared mode.
    pub(crate) writers: RangeWriters,
    /// `map_count` as the last `mmap_lock` section left it, which the
    /// slots' shares were split from.
    map_count_base: AtomicUsize,
    /// Per slot: the range writers' change of `map_count` and their share
    /// of the room below `max_map_count` ([`RangeState::map_count_share`]).
    map_count: PerCpu<MapCountSlot>,
    /// Something under `mmap_lock` sends every range writer there
    /// (a reservation in flight, `def_flags`, MDWE: see the module).
    mmap_lock_only: AtomicBool,
    /// Statistics per slot.
    counts: PerCpu<RangeCounts>,
}

/// One slot's part of `map_count` under range writers (Linux's
/// `percpu_counter` with a batch: the slot's writers read and write only
/// this line, and a share used up sends them to `mmap_lock`, whose check
/// is exact and whose section splits the room again).
#[derive(Default)]
struct MapCountSlot {
    /// The slot's range writers' change of `map_count` since the last
    /// `mmap_lock` section; folded (reset) by the next one.
    delta: AtomicI64,
    /// How many VMAs the slot's range writers may add, all together,
    /// since the last `mmap_lock` section: its share of `max_map_count`
    /// less the base. Written only by `mmap_lock` holders, with the range
    /// writers blocked.
    share: AtomicI64,
    /// Which thread last changed `delta` (`shared-write-stats`).
    written: crate::sync::LastWriter,
}

/// The most VMAs one range writer's call adds: an `mremap` move that
/// splits its source and its target each in three and inserts the moved
/// VMA (an `mmap`, `mprotect` or `madvise` splitting a VMA in three adds
/// two, a `munmap` one).
const MAX_VMAS_ADDED: i64 = 3;

/// One slot's range-writer statistics (`std`'s atomics: statistics).
#[derive(Default)]
struct RangeCounts {
    writes: std::sync::atomic::AtomicU64,
    conflicts: std::sync::atomic::AtomicU64,
    fallbacks: std::sync::atomic::AtomicU64,
}

/// Range-writer statistics of an address space (see [`MmStats`](crate::MmStats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeStats {
    /// Calls a range writer completed without `mmap_lock`.
    pub writes: u64,
    /// Range-writer conflicts: the shared mode refused (an `mmap_lock`
    /// holder blocked it) or the window's lock found held.
    pub conflicts: u64,
    /// Calls that could have been range writes but took `mmap_lock` (a
    /// footprint across windows, a VMA it may not handle, a limit near).
    pub fallbacks: u64,
}

impl RangeState {
    /// The statistics, summed over the slots.
    pub(crate) fn stats(&self) -> RangeStats {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        self.counts.iter().fold(RangeStats::default(), |s, c| RangeStats {
            writes: s.writes + get(&c.writes),
            conflicts: s.conflicts + get(&c.conflicts),
            fallbacks: s.fallbacks + get(&c.fallbacks),
        })
    }

    fn count(&self, f: impl Fn(&RangeCounts) -> &std::sync::atomic::AtomicU64) {
        f(self.counts.mine()).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A new address space's state: each slot's share of `max_map_count`
    /// split from an empty set.
    pub(crate) fn new(max_map_count: usize) -> RangeState {
        let share = (max_map_count / SLOTS) as i64;
        RangeState {
            writers: RangeWriters::default(),
            map_count_base: AtomicUsize::new(0),
            map_count: PerCpu::from_fn(|_| MapCountSlot { share: AtomicI64::new(share), ..Default::default() }),
            mmap_lock_only: AtomicBool::new(false),
            counts: PerCpu::default(),
        }
    }

    /// For a range writer inside the shared mode that may add one VMA: the
    /// `map_count` its view stands for, at most `max_map_count - 2` so
    /// that the `mmap_lock` path's checks it runs pass (each refuses only
    /// a count that `max_map_count` bounds), or `None` when its slot's
    /// share may not cover it (the call takes `mmap_lock`, whose check is
    /// exact). It reads only its own slot's lines.
    ///
    /// Why the set stays below `max_map_count - 1`: each `mmap_lock`
    /// section leaves `base` VMAs and splits the room above it,
    /// `max_map_count - base`, into the slots' shares. A slot's writers
    /// together stay within its share less one: a writer counts its slot's
    /// change so far, [`MAX_VMAS_ADDED`] for every other writer inside in
    /// its slot and two for itself (its own VMA and the margin every check
    /// keeps; a call that may add more checks its own room in its view),
    /// and goes ahead only if that fits. The
    /// inside count is read after the writer's announcement and fence; of
    /// two writers of one slot, the later to announce (the count is one
    /// read-modify-write chain) reads the other inside, or gone, with its
    /// change (written, Release, before it left). So the last writer's
    /// check bounds its slot's total, and the set is at most `base` plus
    /// the shares less one each. The shares change only while the range
    /// writers are blocked and drained.
    fn map_count_share(&self, max_map_count: usize) -> Option<usize> {
        let slot = self.map_count.mine();
        let others = if crate::sync::broken::range_writers::no_count_others() {
            0
        } else {
            MAX_VMAS_ADDED * self.writers.inside_mine().saturating_sub(1) as i64
        };
        let used = slot.delta.load(Ordering::Acquire) + others + 2;
        let room = slot.share.load(Ordering::Relaxed) - used;
        (room >= 0).then(|| max_map_count.saturating_sub(2 + room as usize))
    }

    /// Counts a range writer's change of `map_count` in its slot.
    fn add_map_count(&self, delta: i64) {
        let slot = self.map_count.mine();
        slot.written.write();
        slot.delta.fetch_add(delta, Ordering::Release);
    }
}

/// The window next to its own whose lock a range writer takes too, before
/// its own (address order): the one below, when its new mapping starts at
/// its window's first address and might merge with a VMA of that window
/// ending there.
///
/// Why one side suffices: two VMAs that meet at a window bound, one
/// ending there and one starting there, are made by writers of the two
/// windows; the one making the VMA that starts at the bound holds both
/// windows' locks, so it is serialized with the other, and whichever runs
/// second sees the first's VMA and falls back (a merge across the bound is
/// `mmap_lock`'s). No other range writer makes a VMA that starts at a bound:
/// `mprotect` changes VMAs in place and never one at a bound
/// ([`AddressSpace::range_touch_ok`]), and `munmap`'s pieces keep their
/// ends. So a writer whose new mapping ends at the bound above reads the
/// window above without its lock: a VMA starting at the bound is there or
/// not for as long as it holds its own window's lock (a munmap may remove
/// one meanwhile, which only makes a fallback needless).
///
/// It also says whether the call makes a new VMA (`mmap`): only such a
/// call allocates the directory leaf of its own window if that window
/// never held a VMA (`WindowDir::lock_window`), and never the leaf of the
/// window below where that is another leaf; any other finds nothing of its own there, and goes to
/// `mmap_lock` rather than allocate 16 KiB that nothing frees before the
/// address space goes. (`mmap` refuses the arguments it can refuse without
/// a view before it comes here: `range_mmap`.)
#[derive(Clone, Copy, Default)]
pub(crate) struct Neighbours {
    /// The window below.
    pub(crate) below: bool,
    /// The call makes a new VMA in its window.
    pub(crate) new_vma: bool,
}

impl Neighbours {
    /// The neighbour a new mapping of `[start, end)` (inside one window)
    /// locks.
    pub(crate) fn of(start: u64) -> Neighbours {
        let lo = window_of(start) << crate::vma::WINDOW_SHIFT;
        Neighbours { below: start == lo, new_vma: true }
    }
}

/// The VMAs a range writer may remove, split, merge with, move or change:
/// private anonymous memory, and mappings, shared or private, of a file
/// whose pages live only in softmm's page cache (a [`crate::File`] made by
/// `File::create`, a memfd, the object behind a shared anonymous mapping),
/// with the default hooks; not hugetlb, host files, host memory or
/// devices, nor locked or special VMAs (`locked_vm` and the memlock limit
/// are `mmap_lock`'s).
///
/// Why a file's reverse-map walkers need nothing more: a range write
/// changes no file's `i_mmap` entry here (an address space stays listed
/// until it or the file dies, `AddressSpace::link_file`, and an `mmap`
/// links it before publishing), and every walker of an address space's
/// VMAs of a file (truncate and hole punch through
/// `Mapper::unmap_file_range`, `page_mkclean`, the migration walks) takes
/// `mmap_lock` for read, recursively, which blocks the shared mode and
/// waits for the range writers inside to leave (`read_lock_recursive`).
/// So a walker sees a range write whole (its VMAs detached and published,
/// its entries zapped, moved or changed and flushed: all before the writer
/// leaves) or not at all (the writer, refused, takes `mmap_lock` for
/// write, which waits for the walker), as Linux's walkers under
/// `i_mmap_rwsem` see an `unlink_file_vma`, a `vma_merge` or a
/// `move_ptes` under its `i_mmap` lock before or after them. The file's
/// use is put after the writer leaves ([`super::put_files`]), as the
/// `mmap_lock` path puts it after its section; the last one evicts the
/// file's pages.
pub(crate) fn range_vma_ok(v: &Vma) -> bool {
    let plain_file = |f: &crate::file::Inode| f.is_plain_memory() && v.ops.name() == "default";
    v.hugetlb_resv.is_none()
        && !v.flags.intersects(VmFlags::LOCKED_MASK | VmFlags::HUGETLB | VmFlags::SPECIAL)
        && v.file.as_deref().is_none_or(plain_file)
}

/// Whether `published`'s window `w`, loaded as `map`, can be a range
/// writer's whole world: no VMA of a lower window reaches into it and none
/// of its own reaches beyond it.
fn window_is_closed(published: PublishedVmas<'_, '_>, w: u64, map: Option<&crate::vma::WindowMap>) -> bool {
    let (lo, hi) = (w << crate::vma::WINDOW_SHIFT, (w + 1) << crate::vma::WINDOW_SHIFT);
    // A VMA from below that reaches `lo` is stable while this writer is
    // inside: only an `mmap_lock` holder, blocked now, makes or changes a
    // VMA across a window's bounds.
    if lo > 0 && crate::vma::query::last_at_or_below(published, lo - 1).is_some_and(|v| v.end > lo) {
        return false;
    }
    map.and_then(|m| m.get_max()).is_none_or(|(_, v)| v.end <= hi)
}

impl AddressSpace {
    /// Whether `[start, end)` may be a range write at all: the policy, the
    /// fault policy and one window.
    fn range_candidate(&self, start: u64, end: u64) -> bool {
        self.config.writer_policy.range_writers()
            && self.config.policy != crate::FaultPolicy::Speculative
            && start < end
            && end <= self.config.task_size
            && window_of(start) == window_of(end - 1)
    }

    /// `munmap(start, end - start)` as a range writer (see the module), or
    /// `None` when the call must take `mmap_lock` (nothing changed then).
    /// `[start, end)` is page aligned and inside the user address space.
    pub(crate) fn range_munmap(&self, start: u64, end: u64) -> Option<Result<()>> {
        // The zap comes before the window is published and the writer
        // leaves the shared mode: a file's reverse-map walker (truncate)
        // that finds the published set without the VMAs must find their
        // entries gone too (`range_vma_ok`). The loom switch moves
        // it after (`mm/loom_tests.rs`).
        let late = crate::sync::broken::range_writers::zap_after_leave();
        let mut late_span = None;
        let mut emptied = false;
        let res = self.range_write_span(start, end, Neighbours::default(), |mm, st, tlb| {
            if !st.vmas.overlapping(start, end).all(|v| range_vma_ok(v)) {
                return None;
            }
            let res = mm.detach_vmas(st, start, end);
            emptied = matches!(res, Ok(Some(_))) && st.vmas.iter().next().is_none();
            if let (true, Ok(Some(span))) = (late, &res) {
                late_span = Some(*span);
                return Some(res.map(|_| ()));
            }
            if let Ok(Some((lo, hi))) = res {
                // A window with no page table at all has nothing to zap or
                // free (a fault that allocates one meanwhile does so for a
                // VMA outside the range, whose VMAs are detached), and its
                // writers need not meet on the tables' detach lock.
                // Unpinned before the zap: its walks pin for themselves,
                // and a pin held through it would hold back every other
                // thread's reclaim for as long as the zap runs.
                let has_tables = mm.pgtables.has_pmd_table(lo, &crossbeam_epoch::pin());
                if has_tables {
                    mm.unmap_range(lo, hi, tlb);
                    mm.free_pgtables(st, lo, hi, tlb);
                }
            }
            Some(res.map(|_| ()))
        });
        if let Some((lo, hi)) = late_span {
            let mut tlb = MmuGather::default();
            self.unmap_range(lo, hi, &mut tlb);
            tlb.flush_and_free(self);
            tlb.finish(self);
        }
        self.range_count_fallback(res.is_none());
        if emptied {
            self.range_free_emptied_region(start);
        }
        res
    }

    /// After a range `munmap` that left its window without a VMA: Linux's
    /// `free_pgtables` also frees the PUD table of a 512 GiB region that
    /// the unmap leaves without any VMA, which the window's view cannot
    /// (its floor and ceiling stop at the window's bounds). If the
    /// published set holds no VMA in the region of `va` and its PUD table
    /// is still there, frees it under `mmap_lock` before the call returns
    /// ([`Self::free_empty_region_tables`]).
    fn range_free_emptied_region(&self, va: u64) {
        use crate::pgtable::PGDIR_SIZE;
        let lo = va & !(PGDIR_SIZE - 1);
        let hi = lo + PGDIR_SIZE;
        // `free_pgtables`' ceiling never passes the table bounds' top: a
        // smaller address space keeps its PUD table to the end, as under
        // `mmap_lock`.
        if hi > self.config.task_size.next_power_of_two() {
            return;
        }
        // Dekker with the range writer emptying another window of the
        // region: each published its window (a swap), then looks at the
        // other's; with a fence between on both sides, one of them sees
        // both windows empty. (The pin below fences too, but only when it
        // is the thread's outermost; loom model
        // `two_range_munmaps_that_empty_a_region_free_its_pud_table`.)
        if !crate::sync::broken::range_writers::no_region_fence() {
            crate::sync::fence(Ordering::SeqCst);
        }
        {
            let guard = crossbeam_epoch::pin();
            let published = self.vmas_rcu(&guard);
            if !self.pgtables.has_pud_table(va)
                || crate::vma::query::last_at_or_below(published, hi - 1).is_some_and(|v| v.end > lo)
            {
                return;
            }
        }
        self.free_empty_region_tables(lo, hi);
    }

    /// Under `mmap_lock` for write, frees the page tables of `[lo, hi)`,
    /// a 512 GiB region, if it is still empty: no VMA overlaps it (one may
    /// have been made since the caller looked, by a range writer that
    /// published before the lock drained it, or by the holder the lock
    /// waited for) and no lock-free unmap's reservation does (its zap
    /// still walks the tables; `free_pgtables` honours only reservations
    /// outside the span it is given).
    pub(crate) fn free_empty_region_tables(&self, lo: u64, hi: u64) {
        let st = self.write_lock();
        if st.vmas.overlapping(lo, hi).next().is_some() || st.reserved.iter().any(|r| r.start < hi && lo < r.end) {
            return;
        }
        let mut tlb = MmuGather::default();
        self.free_pgtables(&st, lo, hi, &mut tlb);
        tlb.flush_and_free(self);
        drop(st);
        tlb.free_tables_here(self);
        tlb.finish(self);
    }

    /// Counts a call the range policy sent to `mmap_lock` (`fell`).
    pub(crate) fn range_count_fallback(&self, fell: bool) {
        if fell && self.config.writer_policy.range_writers() {
            self.range.count(|c| &c.fallbacks);
        }
    }

    /// Whether a new mapping of `[start, end)` may be made by a range
    /// writer whose view is `st`: every VMA it replaces is one a range
    /// writer's `munmap` may remove ([`range_vma_ok`]: the mapping's
    /// unmap zaps them in the view before it is published, as `munmap`
    /// does), and where it reaches its window's bounds, no VMA
    /// of the next window touches it there (it would merge across the
    /// bound). The caller holds the lock of the window below if it starts
    /// at its window's first address ([`Neighbours`]).
    pub(crate) fn range_footprint_ok(&self, st: &MmState, start: u64, end: u64) -> bool {
        let w = window_of(start);
        let (lo, hi) = (w << crate::vma::WINDOW_SHIFT, (w + 1) << crate::vma::WINDOW_SHIFT);
        let guard = crossbeam_epoch::pin();
        let published = self.vmas_rcu(&guard);
        let below_clear =
            start > lo || lo == 0 || crate::vma::query::last_at_or_below(published, lo - 1).is_none_or(|v| v.end != lo);
        let above_clear = end < hi || published.first_starting_at(hi).is_none_or(|v| v.start != hi);
        below_clear && above_clear && st.vmas.overlapping(start, end).all(|v| range_vma_ok(v))
    }

    /// Whether a change to the VMAs overlapping `[start, end)` (their
    /// flags: `mprotect`) may be made by a range writer whose view is `st`:
    /// each is one a range writer may change, and none touches its
    /// window's bounds, where it could merge with a VMA of the next window.
    pub(crate) fn range_touch_ok(&self, st: &MmState, start: u64, end: u64) -> bool {
        let w = window_of(start);
        let (lo, hi) = (w << crate::vma::WINDOW_SHIFT, (w + 1) << crate::vma::WINDOW_SHIFT);
        st.vmas.overlapping(start, end).all(|v| range_vma_ok(v) && v.start > lo && v.end < hi)
    }

    /// Whether a non-fixed search inside the window ending at `hi` sees
    /// all it would see in the whole set: the VMA above the window, if its
    /// stack guard gap reaches into the window, would shorten the room
    /// below it.
    pub(crate) fn range_arena_is_closed(&self, hi: u64) -> bool {
        let guard = crossbeam_epoch::pin();
        crate::vma::query::first_starting_at(self.vmas_rcu(&guard), hi)
            .is_none_or(|v| v.start_gap(self.config.stack_guard_gap) >= hi)
    }

    /// [`Self::range_write`] for a footprint `[start, end)`, if the
    /// policy and the footprint allow a range writer at all.
    pub(crate) fn range_write_span<T>(
        &self,
        start: u64,
        end: u64,
        neighbours: Neighbours,
        op: impl FnOnce(&AddressSpace, &mut MmState, &mut MmuGather) -> Option<Result<T>>,
    ) -> Option<Result<T>> {
        if !self.range_candidate(start, end) {
            return None;
        }
        self.range_write(start, neighbours, op)
    }

    /// Runs `op` as a range writer of window `window_of(start)` on a view
    /// of that window (steps 1-6 of the protocol); `op` returns `None`,
    /// having changed nothing, to send the call to `mmap_lock`.
    fn range_write<T>(
        &self,
        start: u64,
        neighbours: Neighbours,
        op: impl FnOnce(&AddressSpace, &mut MmState, &mut MmuGather) -> Option<Result<T>>,
    ) -> Option<Result<T>> {
        let w = window_of(start);
        let Some(inside) = self.range.writers.try_enter() else {
            self.range.count(|c| &c.conflicts);
            return None;
        };
        if self.range.mmap_lock_only.load(Ordering::Acquire) {
            return None;
        }
        // In address order, the neighbours' locks around this window's:
        // see `Neighbours`.
        let mut locked = Vec::with_capacity(2);
        let below = (neighbours.below && w > 0).then(|| w - 1);
        for lw in below.into_iter().chain([w]) {
            // The window below, if its leaf is not this window's, holds no
            // VMA to merge with unless that leaf was allocated: a call
            // that would allocate it for its lock alone goes to `mmap_lock`.
            let alloc = neighbours.new_vma && WindowDir::same_leaf(lw, w);
            let (g, contended) = self.windows.lock_window(lw, alloc)?;
            if contended {
                self.range.count(|c| &c.conflicts);
            }
            locked.push(g);
        }
        let guard = crossbeam_epoch::pin();
        let published = self.vmas_rcu(&guard);
        let map = published.window(w);
        if !window_is_closed(published, w, map) {
            return None;
        }
        let len = self.range.map_count_share(self.config.max_map_count)?;
        let mut st = MmState::range_view(VmaTree::window_view(w, map.cloned(), len));
        // The view owns its copy: unpinned while the call runs, and pinned
        // again only to publish. A writer preempted while pinned holds back
        // every thread's reclamation (the epoch cannot advance past it), and
        // range writers, unlike `mmap_lock` writers, run while another
        // writer is preempted. Pinned across the whole call, two mmap1
        // threads (arenas) on the lab's oversubscribed 2-CPU VM peaked 28 MB
        // above one thread (garbage waiting for the epoch) and ran at
        // 451-457k ops per CPU-second against 568-637k at one thread;
        // pinned only to read and to publish, 18 MB and 587-617k against
        // 619-669k (`docs/results/range-writers-2cpu.txt`, run E).
        drop(guard);
        let mut tlb = MmuGather::default();
        let res = op(self, &mut st, &mut tlb)?;
        tlb.flush_and_free(self);
        let new_len = st.vmas.len();
        let (map, changed, removed) = std::mem::take(&mut st.vmas).into_window(w);
        if changed {
            // The published version it replaces was loaded under this
            // window's lock, which every writer of the window holds.
            // An emptied window keeps its bit (see `publish_keeping`).
            // Its old version was loaded under the lock, so it is still the
            // published one.
            let guard = crossbeam_epoch::pin();
            self.windows.publish_keeping(w, map, &guard, self.reclaimer(), true);
            self.windows.mark_range_dirty(w);
            if new_len != len {
                self.range.add_map_count(new_len as i64 - len as i64);
            }
        }
        drop(locked);
        self.range.count(|c| &c.writes);
        drop(inside);
        self.after_write_section(removed);
        tlb.free_tables_here(self);
        tlb.finish(self);
        Some(res)
    }

    /// Takes the windows range writers published since the last
    /// `mmap_lock` section into `st`'s version of the set and folds their
    /// `map_count` changes. Called by every `mmap_lock` holder under the
    /// range policy once it has blocked and drained the range writers.
    pub(crate) fn sync_range_windows(&self, st: &mut MmState) {
        self.sync_range_windows_into(&mut st.vmas);
    }

    /// [`Self::sync_range_windows`] into `vmas` (the address space's drop,
    /// which holds `MmState` through `&mut self`).
    pub(crate) fn sync_range_windows_into(&self, vmas: &mut VmaTree) {
        if !self.windows.any_range_dirty() {
            return;
        }
        let guard = crossbeam_epoch::pin();
        let published = self.vmas_rcu(&guard);
        self.windows.take_range_dirty(true, |w| vmas.sync_window(w, published.window(w).cloned()));
        for slot in self.range.map_count.iter() {
            if slot.delta.load(Ordering::Relaxed) != 0 {
                slot.delta.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The set `st` holds, brought up to date from the range writers'
    /// windows without changing `st` (a recursive reader, which may not
    /// take the write lock): `None` when it is up to date.
    pub(crate) fn range_synced_copy(&self, st: &MmState) -> Option<VmaTree> {
        if !self.windows.any_range_dirty() {
            return None;
        }
        let mut copy = st.vmas.clone();
        let guard = crossbeam_epoch::pin();
        let published = self.vmas_rcu(&guard);
        self.windows.take_range_dirty(false, |w| copy.sync_window(w, published.window(w).cloned()));
        Some(copy)
    }

    /// The end of an `mmap_lock` write section under the range policy,
    /// before the range writers are unblocked: what they read of `st`.
    /// Each word is written only when it changes.
    pub(crate) fn range_end_section(&self, st: &MmState) {
        // The slots' shares, split again from the new base (their changes
        // were folded into it when this section began).
        let len = st.vmas.len();
        if self.range.map_count_base.load(Ordering::Relaxed) != len {
            self.range.map_count_base.store(len, Ordering::Relaxed);
            let share = (self.config.max_map_count.saturating_sub(len) / SLOTS) as i64;
            for slot in self.range.map_count.iter() {
                slot.share.store(share, Ordering::Relaxed);
            }
        }
        let only = !st.reserved.is_empty() || !st.def_flags.is_empty() || st.mdwe != 0;
        if self.range.mmap_lock_only.load(Ordering::Relaxed) != only {
            self.range.mmap_lock_only.store(only, Ordering::Release);
        }
    }
}

impl MmState {
    /// A range writer's state: `vmas` its window's view, the rest as the
    /// range writer may assume it (no reservation, no `def_flags`, no
    /// MDWE: it checked their mirror). Never reaches `mmap_lock`.
    fn range_view(vmas: VmaTree) -> MmState {
        MmState::with_vmas(vmas, 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
