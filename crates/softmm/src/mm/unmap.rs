//! Unmapping huge ranges without stalling the rest of the address space
//! (seed 002, Yang Shi's "Drop mmap_sem during unmapping large map", and
//! what Linux 4.20 merged instead), as the address space's [`UnmapPolicy`].
//!
//! An unmap has three parts: *detach* (split the VMAs at the edges, take them
//! out of the tree, publish the tree: from then on a fault in the range finds
//! no VMA, and a lock-free fault that found one before aborts at its commit,
//! because the VMA is detached), *zap* (clear the entries, under their PTE
//! locks, into the bounded [`MmuGather`], flushing and freeing every full
//! gather) and *free the page tables* that only the range used. The policies
//! differ in what they hold meanwhile:
//!
//! | policy | detach | zap | free tables |
//! |---|---|---|---|
//! | `locked` | write | write | write |
//! | `sectioned` (seed 002 #3) | write, per 1 GiB section, dropped between sections | same | same |
//! | `downgrade` (Linux 4.20+) | write | read (downgraded) | read |
//! | `lock-free` (default) | write, + reserve the range | no `mmap_lock` | write (short), then drop the reservation |
//!
//! `sectioned` is not atomic: a writer that runs between two sections sees
//! the range half unmapped (a `MAP_FIXED` mapping it makes in a later
//! section is unmapped in turn), and faults there still succeed; seed 002
//! accepted that. `downgrade` and `lock-free` detach the whole range at once.
//!
//! In all of them the frames are put and the tables freed only after a TLB
//! flush (the gather's; under `lock-free`, the one before the zap), and the
//! call returns only after it, so a `munmap` that returned leaves no
//! translation of the range on any CPU.
//!
//! # Who frees the page tables
//!
//! A detached table may still be walked by a lock-free walker that loaded
//! its address before the detach, so it is freed after a grace period of
//! the epoch. Handed to the collector, its free runs on whichever thread
//! collects next: after a big unmap, another thread's `mmap` or fault ran
//! the frees of thousands of tables (a PMD table with its 512 PTE tables,
//! 0.3-0.9 ms on the lab's VM; 8 GiB has eight) and waited 4 ms. So every
//! policy, for an unmap of 32 MiB or more (`KEEP_TABLES_MIN_SPAN`), keeps
//! its tables in the gather ([`MmuGather::keep_tables`]) and,
//! once every lock is dropped, waits for a grace period itself and frees
//! them on the unmapping thread, as Linux frees them from an RCU callback
//! on the unmapping CPU. The wait is bounded (`GRACE_WAIT_LIMIT`): a guard
//! held long, even by the caller, sends them to the collector as before
//! ([`UnmapStats::tables_deferred`]).
//!
//! # The reservation (`lock-free`)
//!
//! Once the write lock is dropped, other writers run during the zap. The
//! range must not be handed out again before its old entries and tables are
//! gone — otherwise a new mapping's fault would find an old entry (and read
//! the old data), or the zap would clear the new mapping's entries, or the
//! table freeing would take a table the new mapping uses (seed 002's
//! approach #2 race, `tests` below). So the range stays in
//! [`MmState::reserved`] from the detach until the tables are freed:
//!
//! * placement without `MAP_FIXED` (a hint included) treats it as a VMA and
//!   places the mapping elsewhere (never waits);
//! * a call whose own range overlaps it — `MAP_FIXED`/`MAP_FIXED_NOREPLACE`,
//!   `munmap` (which must not return before the range is empty), `mremap`
//!   (source, in-place growth and fixed target), `brk`, and stack growth —
//!   waits for it with the write lock dropped and then starts again
//!   ([`AddressSpace::write_lock_clear_of`]), as it would have waited for the
//!   write or read lock under Linux;
//! * every `free_pgtables` counts it as mapped, so no other unmap frees a
//!   table the zap is walking.
//!
//! The tables are freed under the write lock (a second, short section,
//! after the zap's last flush) because that is what orders the freeing
//! against a VMA inserted next to the range meanwhile: `free_pgtables`
//! computes its floor and ceiling from the VMAs as they are then.
//!
//! # One shootdown per lock-free unmap
//!
//! A TLB fill walks the page tables without looking at the VMAs (as a
//! hardware walker does), so a range whose VMAs are detached stays
//! reachable through its entries until the zap clears them: Linux and the
//! other policies shoot down before freeing each full gather, and a
//! shootdown of a running CPU of another thread costs a process-wide
//! barrier (a `membarrier` IPI, ~17 µs on the lab's VM; 56 per 2 GiB).
//! `lock-free` instead makes the range unreachable to fills
//! (`mm/unmap_unreachable.rs`) once its tree is published, and shoots it
//! down once before the zap ([`MmuGather::shoot_down_unreachable`]): from
//! then on no CPU holds or can make a translation into it, so each full
//! gather (and the page tables at the end) is freed with no shootdown, no
//! barrier and no generation bump, still after that one shootdown and
//! still in bounded batches. The range becomes reachable again once it has
//! no entry left, before the reservation goes.
//!
//! # Faults in the range
//!
//! The VMAs are detached and the new tree published before the zap starts,
//! so a fault in the range gets `SIGSEGV` (`SEGV_MAPERR`) at once under
//! `downgrade` and `lock-free` (its `mmap_lock` fallback takes the read lock,
//! which neither holds for write during the zap); it never sees a
//! half-zapped page. The one fault that changes the VMA tree is growsdown
//! stack expansion, Linux 5.8's race (a stack growing into the range being
//! zapped under the read lock, 246c320a8cfe): in softmm `expand_stack`
//! always takes the write lock (`mm/stack.rs`), which waits for a
//! `downgrade` zap's read lock, and it waits for an overlapping reservation
//! under `lock-free`, so the stack can only grow into the range after its
//! tables are gone, as on Linux 6.5+.
//!
//! # Which calls
//!
//! `munmap`, the shrink of `mremap` and of `brk` go through
//! [`AddressSpace::vm_munmap`] with the policy (Linux downgrades for the
//! same three). A `MAP_FIXED` replacement and `mremap`'s fixed target unmap
//! through the same detach/zap/free steps ([`AddressSpace::do_munmap`]) in
//! one write section, seed 002's `atomic` caller: the new mapping must
//! appear in the same step, as Linux's `mmap_region` does.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::pgtable::PMD_SIZE;
use crate::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::gather::GatherTimes;
use super::{AddressSpace, MmState, MmapWriteGuard, MmuGather, UnmapPolicy};
#[cfg(all(test, not(loom)))]
use crate::policy::WriterPolicy;

/// Where the unmaps of [`AddressSpace::munmap`] (and the
/// shrinks of `mremap` and `brk`) spent their time, summed over the address
/// space's life ([`crate::MmStats::unmap`]): what a large unmap costs, and
/// what it makes others wait for. The times are wall-clock (a descheduled
/// thread's time counts), measured around each part with `Instant` in an
/// address space that asks for them ([`crate::MmConfig::time_unmaps`]; 0
/// otherwise). More
/// counters may come: read the fields, never build one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnmapStats {
    /// Unmaps that went through the policy.
    pub unmaps: u64,
    /// Time spent in them, from entry (with `mmap_lock` held for write) to
    /// return.
    pub total_ns: u64,
    /// Time they held `mmap_lock` for write: what every other writer, and
    /// every fault that takes `mmap_lock`, may have waited for.
    pub write_hold_ns: u64,
    /// Time they held it for read (`downgrade`'s zap): writers wait for it.
    pub read_hold_ns: u64,
    /// Time they waited to take `mmap_lock` for write again (`sectioned`
    /// between sections, `lock-free` before freeing the page tables).
    pub lock_wait_ns: u64,
    /// Time in the zap loop (clearing entries, with the flushes and frees of
    /// every full gather); `locked` and `sectioned` count their detach here
    /// too.
    pub zap_ns: u64,
    /// Time detaching the page tables only the range used
    /// (`free_pgtables`), before their flush.
    pub pgtable_ns: u64,
    /// TLB shootdowns of their gathers: one before each free of a full
    /// gather and of the last, except under `lock-free`, which shoots its
    /// range down once before the zap and frees with none.
    pub flushes: u64,
    /// Time in those shootdowns, from the request to the last acknowledgement.
    pub flush_ns: u64,
    /// The part of `flush_ns` spent waiting for other threads' running CPUs
    /// to acknowledge (a CPU blocked in softmm or parked is not waited for).
    pub flush_wait_ns: u64,
    /// Time putting the gathered frames and scheduling the page tables for
    /// freeing, after each flush.
    pub free_ns: u64,
    /// Frames put after a flush.
    pub frames: u64,
    /// Flushes that forced a barrier on the process's other running
    /// threads: with `membarrier` (the default), an IPI to each CPU running
    /// one, which a flush pays only while another thread has a CPU attached.
    /// A `lock-free` unmap shoots its range down once, before the zap
    /// (`mm/unmap_unreachable.rs`): at most one barrier per unmap.
    pub barriers: u64,
    /// Frees of gathered frames or page tables: one per full gather and
    /// one at the end. Under `locked`, `sectioned` and `downgrade` each
    /// follows a shootdown of its own (`flushes`); under `lock-free` none
    /// does, the range having been shot down before the zap.
    pub batches: u64,
    /// Writes to cache lines other CPUs also write, made by the unmapping
    /// thread during the unmaps (lock words, free lists, the shootdown
    /// generation): counted only in builds with the `shared-write-stats`
    /// feature, 0 otherwise.
    pub shared_writes: u64,
    /// Time the unmapping thread spent, after dropping every lock, waiting
    /// for a grace period and freeing the page tables the unmaps detached
    /// (Linux's RCU table free on the unmapping CPU), so that no other
    /// thread's collection of the epoch's garbage runs those frees.
    pub table_free_ns: u64,
    /// Page tables freed that way (subtables counted with their parent).
    pub tables_freed_here: u64,
    /// Page tables left to the epoch collector instead, because the grace
    /// period outlasted the wait's limit (a guard held long somewhere).
    pub tables_deferred: u64,
}

impl UnmapStats {
    /// The sums over the unmaps the calling thread made, in every address
    /// space: what a caller reads before and after one `munmap` to see that
    /// call alone while other threads unmap too.
    pub fn this_thread() -> UnmapStats {
        THIS_THREAD.with(|c| c.get())
    }

    /// Adds `o`'s sums.
    fn merge(&mut self, o: &UnmapStats) {
        let add = |a: &mut u64, v: u64| *a = a.saturating_add(v);
        add(&mut self.unmaps, o.unmaps);
        add(&mut self.total_ns, o.total_ns);
        add(&mut self.write_hold_ns, o.write_hold_ns);
        add(&mut self.read_hold_ns, o.read_hold_ns);
        add(&mut self.lock_wait_ns, o.lock_wait_ns);
        add(&mut self.zap_ns, o.zap_ns);
        add(&mut self.pgtable_ns, o.pgtable_ns);
        add(&mut self.flushes, o.flushes);
        add(&mut self.flush_ns, o.flush_ns);
        add(&mut self.flush_wait_ns, o.flush_wait_ns);
        add(&mut self.free_ns, o.free_ns);
        add(&mut self.frames, o.frames);
        add(&mut self.barriers, o.barriers);
        add(&mut self.batches, o.batches);
        add(&mut self.shared_writes, o.shared_writes);
        add(&mut self.table_free_ns, o.table_free_ns);
        add(&mut self.tables_freed_here, o.tables_freed_here);
        add(&mut self.tables_deferred, o.tables_deferred);
    }

    /// Adds one unmap's times.
    fn add(&mut self, t: &UnmapTimes, g: &GatherTimes, total_ns: u64) {
        let add = |a: &mut u64, v: u64| *a = a.saturating_add(v);
        add(&mut self.unmaps, 1);
        add(&mut self.total_ns, total_ns);
        add(&mut self.write_hold_ns, t.write_hold_ns);
        add(&mut self.read_hold_ns, t.read_hold_ns);
        add(&mut self.lock_wait_ns, t.lock_wait_ns);
        add(&mut self.zap_ns, t.zap_ns);
        add(&mut self.pgtable_ns, t.pgtable_ns);
        add(&mut self.flushes, g.flushes);
        add(&mut self.flush_ns, g.flush_ns);
        add(&mut self.flush_wait_ns, g.flush_wait_ns);
        add(&mut self.free_ns, g.free_ns);
        add(&mut self.frames, g.frames);
        add(&mut self.barriers, g.barriers);
        add(&mut self.batches, g.batches);
        add(&mut self.shared_writes, t.shared_writes);
        add(&mut self.table_free_ns, g.table_free_ns);
        add(&mut self.tables_freed_here, g.tables_freed_here);
        add(&mut self.tables_deferred, g.tables_deferred);
    }
}

std::thread_local! {
    /// [`UnmapStats::this_thread`]: plain memory of this thread, so the
    /// per-thread sums cost no shared write.
    static THIS_THREAD: std::cell::Cell<UnmapStats> = const { std::cell::Cell::new(UnmapStats {
        unmaps: 0, total_ns: 0, write_hold_ns: 0, read_hold_ns: 0, lock_wait_ns: 0, zap_ns: 0,
        pgtable_ns: 0, flushes: 0, flush_ns: 0, flush_wait_ns: 0, free_ns: 0, frames: 0,
        barriers: 0, batches: 0, shared_writes: 0, table_free_ns: 0, tables_freed_here: 0, tables_deferred: 0,
    }) };
}

/// The sums behind [`UnmapStats`], one per address space, kept per CPU
/// slot: an unmap adds to its own slot's lines only.
#[derive(Default)]
pub(crate) struct UnmapCounters {
    slots: crate::sync::percpu::PerCpu<UnmapSlot>,
}

/// One CPU slot's sums ([`UnmapCounters`]). Statistics, read after the
/// unmaps they count returned: `std`'s atomics, Relaxed.
#[derive(Default)]
struct UnmapSlot {
    unmaps: AtomicU64,
    total_ns: AtomicU64,
    write_hold_ns: AtomicU64,
    read_hold_ns: AtomicU64,
    lock_wait_ns: AtomicU64,
    zap_ns: AtomicU64,
    pgtable_ns: AtomicU64,
    flushes: AtomicU64,
    flush_ns: AtomicU64,
    flush_wait_ns: AtomicU64,
    free_ns: AtomicU64,
    frames: AtomicU64,
    barriers: AtomicU64,
    batches: AtomicU64,
    shared_writes: AtomicU64,
    table_free_ns: AtomicU64,
    tables_freed_here: AtomicU64,
    tables_deferred: AtomicU64,
}

impl UnmapCounters {
    /// Adds one unmap's times, to the address space's sums and the
    /// calling thread's.
    fn add(&self, t: &UnmapTimes, g: &GatherTimes) {
        let total_ns = ns_since(t.entry);
        THIS_THREAD.with(|c| {
            let mut s = c.get();
            s.add(t, g, total_ns);
            c.set(s);
        });
        let s = self.slots.mine();
        // Relaxed: statistics, read after the unmaps they count returned.
        // A field that did not change is not written.
        let add = |c: &AtomicU64, v: u64| {
            if v != 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        };
        add(&s.unmaps, 1);
        add(&s.total_ns, total_ns);
        add(&s.write_hold_ns, t.write_hold_ns);
        add(&s.read_hold_ns, t.read_hold_ns);
        add(&s.lock_wait_ns, t.lock_wait_ns);
        add(&s.zap_ns, t.zap_ns);
        add(&s.pgtable_ns, t.pgtable_ns);
        add(&s.flushes, g.flushes);
        add(&s.flush_ns, g.flush_ns);
        add(&s.flush_wait_ns, g.flush_wait_ns);
        add(&s.free_ns, g.free_ns);
        add(&s.frames, g.frames);
        add(&s.barriers, g.barriers);
        add(&s.batches, g.batches);
        add(&s.shared_writes, t.shared_writes);
        add(&s.table_free_ns, g.table_free_ns);
        add(&s.tables_freed_here, g.tables_freed_here);
        add(&s.tables_deferred, g.tables_deferred);
    }

    /// The sums so far.
    pub(crate) fn stats(&self) -> UnmapStats {
        let mut sum = UnmapStats::default();
        for slot in self.slots.iter() {
            sum.merge(&slot.stats());
        }
        sum
    }
}

impl UnmapSlot {
    /// This slot's sums.
    fn stats(&self) -> UnmapStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UnmapStats {
            unmaps: get(&self.unmaps),
            total_ns: get(&self.total_ns),
            write_hold_ns: get(&self.write_hold_ns),
            read_hold_ns: get(&self.read_hold_ns),
            lock_wait_ns: get(&self.lock_wait_ns),
            zap_ns: get(&self.zap_ns),
            pgtable_ns: get(&self.pgtable_ns),
            flushes: get(&self.flushes),
            flush_ns: get(&self.flush_ns),
            flush_wait_ns: get(&self.flush_wait_ns),
            free_ns: get(&self.free_ns),
            frames: get(&self.frames),
            barriers: get(&self.barriers),
            batches: get(&self.batches),
            shared_writes: get(&self.shared_writes),
            table_free_ns: get(&self.table_free_ns),
            tables_freed_here: get(&self.tables_freed_here),
            tables_deferred: get(&self.tables_deferred),
        }
    }
}

fn ns_since(t: Option<Instant>) -> u64 {
    t.map_or(0, |t| u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// One unmap's times, outside its gather's. Read from the clock only when
/// the address space asks for them ([`crate::MmConfig::time_unmaps`]): a
/// small unmap's dozen clock reads cost as much as its write section.
struct UnmapTimes {
    /// The clock at entry; `None` when the unmap is not timed, and then
    /// every time stays 0.
    entry: Option<Instant>,
    write_hold_ns: u64,
    read_hold_ns: u64,
    lock_wait_ns: u64,
    zap_ns: u64,
    pgtable_ns: u64,
    /// The thread's shared-write count at entry, then (at the end) the
    /// unmap's own.
    shared_writes: u64,
}

impl UnmapTimes {
    fn new(timed: bool) -> UnmapTimes {
        UnmapTimes {
            entry: timed.then(Instant::now),
            write_hold_ns: 0,
            read_hold_ns: 0,
            lock_wait_ns: 0,
            zap_ns: 0,
            pgtable_ns: 0,
            shared_writes: crate::sync::shared_writes_so_far(),
        }
    }

    /// The clock now, if this unmap is timed.
    fn now(&self) -> Option<Instant> {
        self.entry.map(|_| Instant::now())
    }

    /// Runs `f`, adding its time to the field `at` selects.
    fn time<R>(&mut self, at: fn(&mut UnmapTimes) -> &mut u64, f: impl FnOnce() -> R) -> R {
        let t = self.now();
        let r = f();
        let v = at(self);
        *v = v.saturating_add(ns_since(t));
        r
    }
}

/// Sections of [`UnmapPolicy::Sectioned`]: `HPAGE_PUD_SIZE`, as seed 002.
pub(crate) const SECTION_SIZE: u64 = 1 << 30;

/// [`UnmapPolicy::LockFree`] zaps without the lock only spans larger than
/// this (one PTE table): a smaller zap is a few microseconds under the write
/// lock, cheaper than a second write section. Zero under loom, so the
/// models run the lock-free path on a page or two.
const LOCK_FREE_MIN_SPAN: u64 = if cfg!(loom) { 0 } else { PMD_SIZE };

/// Unmaps of at least this span free their page tables themselves after a
/// grace period ([`MmuGather::keep_tables`]); smaller ones leave them to the
/// epoch collector. A small unmap's tables (16 PTE tables at most below
/// this, ~15 us to free) cost whoever collects little, while its own wait
/// for a grace period would last as long as the longest guard held
/// meanwhile: a big zap holds one per gather, ~0.3 ms, which the other
/// thread's 64 KiB `munmap`s of the lab waited for (p99 0.1 -> 0.27 ms).
const KEEP_TABLES_MIN_SPAN: u64 = 16 * PMD_SIZE;

/// A range being zapped without `mmap_lock` ([`MmState::reserved`]). The
/// unmap holds `done`'s lock from before it publishes the reservation until
/// after it removes it, so a waiter blocks on it instead of spinning.
pub(crate) struct Reservation {
    pub(crate) start: u64,
    pub(crate) end: u64,
    done: Arc<Mutex<()>>,
}

impl Reservation {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        start < self.end && self.start < end
    }

    /// A reservation of `[start, end)` nobody waits on, for placement tests.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn for_test(start: u64, end: u64) -> Reservation {
        Reservation { start, end, done: Arc::default() }
    }
}

impl AddressSpace {
    /// `mmap_lock` for write, once none of the ranges `footprint` computes
    /// from the state overlaps a [`Reservation`]; waits (without the lock)
    /// for each one that does and tries again. Empty ranges never overlap.
    pub(crate) fn write_lock_clear_of(&self, footprint: impl Fn(&MmState) -> [(u64, u64); 2]) -> MmapWriteGuard<'_> {
        loop {
            let st = self.write_lock();
            if st.reserved.is_empty() {
                return st;
            }
            let ranges = footprint(&st);
            let busy = st.reserved.iter().find(|r| ranges.iter().any(|&(s, e)| r.overlaps(s, e)));
            let Some(done) = busy.map(|r| r.done.clone()) else {
                return st;
            };
            drop(st);
            // The unmap holds it until its reservation is gone.
            drop(done.lock());
        }
    }

    /// Unmaps `[start, end)` (page aligned, non-empty) with the address
    /// space's [`UnmapPolicy`], starting with `st` held; Linux's
    /// `do_vmi_align_munmap(..., unlock=true)`. `after_detach` runs under the
    /// write lock once the range is detached (`brk` sets the new break
    /// there). Returns once everything in the range is unmapped, flushed
    /// and freed, with `mmap_lock` released. `ENOMEM` without change if a
    /// split would exceed `max_map_count`.
    pub(crate) fn vm_munmap(
        &self,
        st: MmapWriteGuard<'_>,
        start: u64,
        end: u64,
        after_detach: impl FnOnce(&mut MmState),
    ) -> Result<()> {
        let mut t = UnmapTimes::new(self.config.time_unmaps);
        let mut tlb = MmuGather::default();
        if end - start >= KEEP_TABLES_MIN_SPAN {
            tlb.keep_tables();
        }
        let res = self.vm_munmap_timed(st, start, end, after_detach, &mut tlb, &mut t);
        // Every lock is dropped: the tables are freed here, not by whichever
        // thread collects the epoch's garbage next.
        tlb.free_tables_here(self);
        t.shared_writes = crate::sync::shared_writes_so_far().wrapping_sub(t.shared_writes);
        self.counters.unmap.add(&t, &tlb.times);
        // Every path flushed and emptied the gather before it returned.
        debug_assert!(tlb.frames_is_empty() && tlb.tables.is_empty());
        tlb.finish(self);
        res
    }

    /// [`Self::vm_munmap`] into `tlb`, which it leaves flushed and empty,
    /// with its times in `t`.
    fn vm_munmap_timed(
        &self,
        mut st: MmapWriteGuard<'_>,
        start: u64,
        end: u64,
        after_detach: impl FnOnce(&mut MmState),
        tlb: &mut MmuGather,
        t: &mut UnmapTimes,
    ) -> Result<()> {
        match self.config.unmap_policy {
            UnmapPolicy::Sectioned => {
                let mut after_detach = Some(after_detach);
                let mut st = Some(st);
                let mut from = start;
                while from < end {
                    let to = (from & !(SECTION_SIZE - 1)).saturating_add(SECTION_SIZE).min(end);
                    let mut g = match st.take() {
                        Some(g) => g,
                        None => t.time(|t| &mut t.lock_wait_ns, || self.write_lock()),
                    };
                    let held = t.now();
                    let res = self.do_munmap_timed(&mut g, from, to, tlb, t);
                    if res.is_ok() {
                        if let Some(f) = after_detach.take() {
                            f(&mut g);
                        }
                    }
                    // Each section is whole before the lock is dropped:
                    // its flush, then the next writer.
                    tlb.flush_and_free(self);
                    drop(g);
                    t.write_hold_ns += ns_since(held);
                    res?;
                    from = to;
                }
                Ok(())
            }
            UnmapPolicy::Downgrade => {
                let span = self.detach_vmas(&mut st, start, end);
                if span.is_ok() {
                    after_detach(&mut st);
                }
                // Their files' uses go after the zap, not at the downgrade.
                let removed = st.vmas.take_removed();
                let st = st.downgrade();
                t.write_hold_ns += ns_since(t.entry);
                let held = t.now();
                if let Some((lo, hi)) = span? {
                    // Writers wait for the read lock: the VMAs around the
                    // range, hence the floor and ceiling, cannot change.
                    self.zap_span_timed(&st, lo, hi, tlb, t);
                }
                tlb.flush_and_free(self);
                drop(st);
                t.read_hold_ns += ns_since(held);
                super::put_files(removed);
                Ok(())
            }
            UnmapPolicy::LockFree => {
                let span = self.detach_vmas(&mut st, start, end)?;
                after_detach(&mut st);
                // Under `WriterPolicy::Short*`, a range with no leaf table
                // has nothing to zap and finishes here, in this section (its
                // empty walk and `free_pgtables` cost less than the two
                // sections and the reservation of the lock-free path). The
                // answer cannot change while the write lock is held: the
                // VMAs are detached, and a fault allocates a table only
                // under mmap_lock or the per-VMA lock, which the detach
                // waited for. Were it wrong, the in-section path would still
                // be right (it zaps whatever it finds), only slower.
                let lock_free = |&(lo, hi): &(u64, u64)| {
                    hi - lo > LOCK_FREE_MIN_SPAN
                        && (!self.config.writer_policy.short_unmap() || self.has_leaf_tables(lo, hi))
                };
                let Some((lo, hi)) = span.filter(lock_free) else {
                    if let Some((lo, hi)) = span {
                        self.zap_span_timed(&st, lo, hi, tlb, t);
                    }
                    tlb.flush_and_free(self);
                    drop(st);
                    t.write_hold_ns += ns_since(t.entry);
                    return Ok(());
                };
                // Their files' uses go after the zap, not when the write
                // section ends in `reserve`.
                let removed = st.vmas.take_removed();
                let done = Arc::new(Mutex::new(()));
                let held = done.lock();
                self.reserve(st, lo, hi, &done);
                t.write_hold_ns += ns_since(t.entry);
                // One shootdown for the whole range, before anything is
                // zapped: `reserve` made it unreachable to TLB fills, so
                // after this no CPU reaches it, and each full gather of the
                // zap is freed without a shootdown of its own. None where
                // the range has no leaf table: no CPU can hold a
                // translation there, and none can appear (the VMAs are
                // detached, and a fault that allocated a table did so under
                // the mmap_lock or a VMA reference, both of which the detach
                // waited for), as Linux's gather flushes nothing when it
                // cleared nothing (will-it-scale's mmap1, whose threads
                // otherwise spent their time in process-wide barriers).
                if self.has_leaf_tables(lo, hi) {
                    tlb.shoot_down_unreachable(self);
                }
                // No mmap_lock: the VMAs are detached and published, and the
                // reservation keeps every writer out of [lo, hi).
                t.time(|t| &mut t.zap_ns, || self.unmap_range(lo, hi, tlb));
                self.release(lo, hi, &done, tlb, t);
                drop(held);
                super::put_files(removed);
                Ok(())
            }
            _ => {
                let res = self.do_munmap_timed(&mut st, start, end, tlb, t);
                if res.is_ok() {
                    after_detach(&mut st);
                }
                // Flush before mmap_lock is released, as Linux's
                // tlb_finish_mmu does: once another thread can map this range
                // again, no CPU may still reach the old frames.
                tlb.flush_and_free(self);
                drop(st);
                t.write_hold_ns += ns_since(t.entry);
                res
            }
        }
    }

    /// True if some PTE table or PMD leaf of `[lo, hi)` exists.
    fn has_leaf_tables(&self, lo: u64, hi: u64) -> bool {
        let guard = crossbeam_epoch::pin();
        self.pgtables.leaves(lo, hi, &guard).next().is_some()
    }

    /// [`AddressSpace::do_munmap`] with its parts timed in `t`: the detach
    /// and the zap loop in `zap_ns`, the page tables in `pgtable_ns`.
    fn do_munmap_timed(
        &self,
        st: &mut MmState,
        start: u64,
        end: u64,
        tlb: &mut MmuGather,
        t: &mut UnmapTimes,
    ) -> Result<()> {
        if let Some((lo, hi)) = t.time(|t| &mut t.zap_ns, || self.detach_vmas(st, start, end))? {
            self.zap_span_timed(st, lo, hi, tlb, t);
        }
        Ok(())
    }

    /// Zaps the detached span `[lo, hi)` (guard markers included) and
    /// detaches its page tables into `tlb` (the rest of
    /// [`AddressSpace::do_munmap`]), each part timed in `t`. `st` keeps the
    /// VMAs around the span, hence the page-table floor and ceiling, fixed.
    fn zap_span_timed(&self, st: &MmState, lo: u64, hi: u64, tlb: &mut MmuGather, t: &mut UnmapTimes) {
        t.time(|t| &mut t.zap_ns, || self.unmap_range(lo, hi, tlb));
        t.time(|t| &mut t.pgtable_ns, || self.free_pgtables(st, lo, hi, tlb));
    }

    /// Publishes the reservation of `[lo, hi)` (whose VMAs `st` detached),
    /// ends the write section (publishing the tree without them), and then
    /// makes the range unreachable to TLB fills
    /// ([`AddressSpace::unreachable`]; after the tree, so a CPU that sees
    /// the range unreachable and faults finds no VMA there). The caller
    /// holds `done`'s lock until after [`Self::release`].
    fn reserve(&self, mut st: MmapWriteGuard<'_>, lo: u64, hi: u64, done: &Arc<Mutex<()>>) {
        st.reserved.push(Reservation { start: lo, end: hi, done: done.clone() });
        drop(st);
        self.unreachable.add(lo, hi);
    }

    /// Ends a lock-free unmap of `[lo, hi)` whose entries are all zapped
    /// into `tlb`: frees the last frames (after a flush, unless `tlb` shot
    /// the range down already), makes the range reachable again (it has no
    /// entry left), then in a short write section removes the reservation
    /// and detaches the page tables only the range used, and frees those
    /// after a grace period (and a flush, likewise).
    fn release(&self, lo: u64, hi: u64, done: &Arc<Mutex<()>>, tlb: &mut MmuGather, t: &mut UnmapTimes) {
        // The last frames' flush before anyone may map here again.
        tlb.flush_and_free(self);
        // Before the reservation goes, so that no fill refuses a new
        // mapping's entries (its faults would find them present, forever).
        self.unreachable.remove(lo, hi);
        let mut st = t.time(|t| &mut t.lock_wait_ns, || self.write_lock());
        let held = t.now();
        st.reserved.retain(|r| !Arc::ptr_eq(&r.done, done));
        t.time(|t| &mut t.pgtable_ns, || self.free_pgtables(&st, lo, hi, tlb));
        drop(st);
        t.write_hold_ns += ns_since(held);
        // Only detached tables are left: nothing translates through them
        // (a TLB entry holds a frame, never a table), and they are freed
        // after a grace period (and a flush, if the range was not shot
        // down before the zap).
        tlb.flush_and_free(self);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::uapi::*;
    use crate::{Cpu, PhysConfig, PhysMem, PAGE_SIZE};

    const RW: i32 = PROT_READ | PROT_WRITE;
    const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
    const LEN: u64 = 4 * PAGE_SIZE;

    fn pattern(va: u64) -> u64 {
        va ^ 0x5eed
    }

    /// Four written pages, mapped at a fixed address.
    fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>, Cpu, u64) {
        let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, crate::MmConfig::default()).unwrap();
        let a = 0x1000_0000;
        assert_eq!(mm.mmap(a, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(a));
        let mut cpu = Cpu::attached(&mm);
        for va in (a..a + LEN).step_by(PAGE_SIZE as usize) {
            cpu.write_u64(va, pattern(va)).unwrap();
        }
        (phys, mm, cpu, a)
    }

    /// Seed 002's approach #2, dropping `mmap_lock` inside the zap
    /// (`zap_pmd_range` → `up_write`) with nothing to keep the range: CPU B
    /// runs a whole `mmap(MAP_FIXED)` over the half-zapped range, whose new,
    /// zero-filled mapping then shows A's old data where A has not zapped
    /// yet (the stale entry), and A, taking the lock back to go on with what
    /// it was walking, zaps B's page (B's write is lost). In Linux the
    /// walked VMAs would be freed under A (the use-after-free of the cover
    /// letter); softmm's VMAs are reference counted, but the page-table
    /// entries A walks are what B now uses.
    #[test]
    fn dropping_the_lock_inside_the_zap_shows_stale_entries_to_a_new_mapping() {
        let (phys, mm, mut cpu, a) = setup();
        let mut tlb = MmuGather::default();
        let mut st = mm.write_lock();
        let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
        mm.zap_range(lo, lo + 2 * PAGE_SIZE, &mut tlb, |_| true);
        // Even with what it zapped so far flushed and freed:
        tlb.flush_and_free(&mm);
        drop(st); // up_write in the middle of the zap
                  // CPU B.
        assert_eq!(mm.mmap(a, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(a));
        assert_eq!(cpu.read_u64(a), Ok(0), "the zapped half reads as new");
        let stale = a + 3 * PAGE_SIZE;
        assert_eq!(cpu.read_u64(stale), Ok(pattern(stale)), "B's new mapping shows A's old data");
        cpu.write_u64(stale, 7).unwrap();
        // A takes the lock back and goes on where it was.
        let st = mm.write_lock();
        mm.zap_range(lo + 2 * PAGE_SIZE, hi, &mut tlb, |_| true);
        tlb.finish(&mm);
        drop(st);
        assert_eq!(cpu.read_u64(stale), Ok(0), "A's zap took B's page, and B's write");
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    }

    /// The lock-free unmap drops `mmap_lock` for its zap too, but only after
    /// reserving the range: B's `mmap(MAP_FIXED)` there waits until the
    /// entries and tables are gone, then reads zeros and keeps its write.
    /// The steps are the real ones of [`AddressSpace::vm_munmap`], with B
    /// started halfway through the zap.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a thread parks on the contended mmap_lock, and Miri rejects parking_lot_core's futex syscall (a reference passed as a variadic pointer argument)"
    )]
    fn a_fixed_mapping_waits_for_a_reserved_range_and_sees_no_stale_entry() {
        let (phys, mm, mut cpu, a) = setup();
        cpu.park();
        let mut tlb = MmuGather::default();
        let mut st = mm.write_lock();
        let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
        let done = Arc::new(Mutex::new(()));
        let held = done.lock();
        mm.reserve(st, lo, hi, &done);
        mm.zap_range(lo, lo + 2 * PAGE_SIZE, &mut tlb, |_| true);
        let stale = a + 3 * PAGE_SIZE;
        let b = {
            let mm = mm.clone();
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                assert_eq!(mm.mmap(a, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(a));
                assert_eq!(cpu.read_u64(stale), Ok(0), "B's new mapping shows old data");
                cpu.write_u64(stale, 7).unwrap();
            })
        };
        // A hint into the range is placed elsewhere meanwhile.
        let elsewhere = mm.mmap(a, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        assert!(elsewhere + PAGE_SIZE <= lo || elsewhere >= hi, "{elsewhere:#x} inside the reserved range");
        mm.munmap(elsewhere, PAGE_SIZE).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!b.is_finished(), "MAP_FIXED over a reserved range did not wait");
        mm.zap_range(lo + 2 * PAGE_SIZE, hi, &mut tlb, |_| true);
        mm.release(lo, hi, &done, &mut tlb, &mut UnmapTimes::new(true));
        tlb.finish(&mm);
        drop(held);
        b.join().unwrap();
        cpu.resume();
        assert_eq!(cpu.read_u64(stale), Ok(7), "B's page survived the unmap");
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    }

    /// A second `munmap` of a range a lock-free unmap is still zapping
    /// waits for it: it must not return while an entry of the range still
    /// translates (here, the half not zapped yet).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a thread parks on the contended mmap_lock, and Miri rejects parking_lot_core's futex syscall (a reference passed as a variadic pointer argument)"
    )]
    fn a_munmap_of_a_reserved_range_returns_only_once_it_is_empty() {
        let (phys, mm, mut cpu, a) = setup();
        cpu.park();
        let mut tlb = MmuGather::default();
        let mut st = mm.write_lock();
        let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
        let done = Arc::new(Mutex::new(()));
        let held = done.lock();
        mm.reserve(st, lo, hi, &done);
        mm.zap_range(lo, lo + 2 * PAGE_SIZE, &mut tlb, |_| true);
        let b = {
            let mm = mm.clone();
            std::thread::spawn(move || {
                mm.munmap(a, LEN).unwrap();
                (a..a + LEN).step_by(PAGE_SIZE as usize).all(|va| mm.pte_at(va).is_none())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!b.is_finished(), "munmap over a reserved range returned before it was empty");
        mm.zap_range(lo + 2 * PAGE_SIZE, hi, &mut tlb, |_| true);
        mm.release(lo, hi, &done, &mut tlb, &mut UnmapTimes::new(true));
        tlb.finish(&mm);
        drop(held);
        assert!(b.join().unwrap(), "an entry was left when the second munmap returned");
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    }

    /// A lock-free unmap shoots its range down once, before the zap, and
    /// frees the gathers after it without another shootdown. That is sound
    /// only because no CPU can make a translation into the range after the
    /// shootdown: a CPU reading the range then (here one of this thread's,
    /// which the shootdown made drop its TLB) must fault, not walk the
    /// entry the zap has not cleared yet; otherwise its TLB entry outlives
    /// the frame's free and reads the frame's next user's data.
    #[test]
    fn no_translation_into_a_range_after_its_one_shootdown() {
        const REUSED: u8 = 0xee;
        let (phys, mm, mut cpu, a) = setup();
        let last = a + 3 * PAGE_SIZE;
        let old = mm.pte_at(last).pfn();
        let mut tlb = MmuGather::default();
        let mut st = mm.write_lock();
        let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
        let done = Arc::new(Mutex::new(()));
        let held = done.lock();
        mm.reserve(st, lo, hi, &done);
        tlb.shoot_down_unreachable(&mm);
        let segv = |r: &std::result::Result<u64, crate::Fault>| {
            matches!(r, Err(crate::Fault::Segv { code: crate::SegvCode::MapErr, .. }))
        };
        let during = cpu.read_u64(last);
        assert!(segv(&during), "a CPU filled a translation after the shootdown: {during:?}");
        mm.unmap_range(lo, hi, &mut tlb);
        tlb.flush_and_free(&mm);
        assert_eq!(tlb.times.flushes, 1, "the gather was freed after a shootdown of its own");
        assert_eq!(phys.stats().frames_used, 0);
        // The frame's next user writes it.
        phys.fill(old, 0, REUSED, PAGE_SIZE as usize);
        let after = cpu.read_u64(last);
        assert!(segv(&after), "a stale TLB entry read a freed, reused frame: {after:x?}");
        mm.release(lo, hi, &done, &mut tlb, &mut UnmapTimes::new(true));
        tlb.finish(&mm);
        drop(held);
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    }

    /// An unmap drops guard markers in its zap walk, under every policy and
    /// on the lock-free path too (a span above one PTE table): here in a
    /// page table that a neighbouring VMA keeps, so freeing the tables does
    /// not drop them. A new mapping there then reads zeros, not `SIGSEGV`.
    #[test]
    fn an_unmap_drops_guard_markers_in_a_table_a_neighbour_keeps() {
        for &policy in UnmapPolicy::ALL {
            let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
            let mm = AddressSpace::new(&phys, crate::MmConfig::default().unmap_policy(policy)).unwrap();
            let a = 0x4000_0000;
            let gone = 2 * PMD_SIZE + 4 * PAGE_SIZE;
            let len = gone + 4 * PAGE_SIZE;
            assert_eq!(mm.mmap(a, len, RW, ANON | MAP_FIXED, None, 0), Ok(a));
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a, 1).unwrap();
            let marked = [a + PAGE_SIZE, a + 2 * PMD_SIZE + PAGE_SIZE, a + gone - PAGE_SIZE];
            for &va in &marked {
                mm.madvise(va, PAGE_SIZE, MADV_GUARD_INSTALL).unwrap();
                assert!(mm.pte_at(va).is_guard());
            }
            cpu.write_u64(a + len - PAGE_SIZE, 2).unwrap(); // the neighbour
            mm.munmap(a, gone).unwrap();
            for &va in &marked {
                assert!(mm.pte_at(va).is_none(), "{policy:?}: a marker at {va:#x} outlived the munmap");
            }
            assert_eq!(mm.mmap(a, gone, RW, ANON | MAP_FIXED, None, 0), Ok(a));
            for &va in &marked {
                assert_eq!(cpu.read_u64(va), Ok(0), "{policy:?}");
            }
            assert_eq!(cpu.read_u64(a + len - PAGE_SIZE), Ok(2), "{policy:?}");
            drop(cpu);
            drop(mm);
            let s = phys.quiesce();
            assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?} {s:?}");
        }
    }

    /// `mmap_lock` write sections of one `mmap` and one `munmap` of
    /// `len` bytes (`touch`: its first and last pages written in between).
    fn write_sections_of_map_and_unmap(policy: WriterPolicy, len: u64, touch: bool) -> u64 {
        let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, crate::MmConfig::default().writer_policy(policy)).unwrap();
        let mut cpu = Cpu::attached(&mm);
        let before = mm.stats().mmap_lock_write;
        // Not charged: more than the arena's RAM.
        let a = mm.mmap(0, len, RW, ANON | MAP_NORESERVE, None, 0).unwrap();
        if touch {
            cpu.write_u64(a, 1).unwrap();
            cpu.write_u64(a + len - PAGE_SIZE, 1).unwrap();
        }
        mm.munmap(a, len).unwrap();
        let sections = mm.stats().mmap_lock_write - before;
        assert_eq!(mm.stats().map_count, 0);
        for va in (a..a + len).step_by(PMD_SIZE as usize) {
            assert!(mm.pte_at(va).is_none(), "{policy:?}: an entry outlived the munmap at {va:#x}");
        }
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?} {s:?}");
        sections
    }

    /// will-it-scale's mmap1 op, a map and an unmap of 128 MiB never
    /// touched: the short writer policies find nothing to zap under the
    /// first write section of the unmap and end there (2 sections in all,
    /// as Linux's 2 `mmap_write_lock`s); `reserve` takes the lock-free
    /// path and its third section. A touched range takes the lock-free
    /// path under every policy.
    #[test]
    fn an_untouched_range_unmaps_in_one_write_section() {
        let len = 128 << 20;
        for &policy in WriterPolicy::ALL {
            let untouched = write_sections_of_map_and_unmap(policy, len, false);
            let want = if policy.short_unmap() { 2 } else { 3 };
            assert_eq!(untouched, want, "{policy:?}: write sections of an untouched map and unmap");
            assert_eq!(write_sections_of_map_and_unmap(policy, len, true), 3, "{policy:?}: a touched range");
        }
    }

    /// A long zap lets grace periods end while it runs: it drops its epoch
    /// guard at each full gather's flush and walks on under a new one. A
    /// running CPU of another thread (which every flush waits for, under
    /// `ShootdownPolicy::NextAccess`) defers a
    /// closure once the first flush has begun, and keeps collecting; the
    /// closure must run before the zap's last gather is flushed. With one
    /// guard held across the whole zap, it could run only after the zap.
    #[test]
    #[cfg_attr(miri, ignore = "maps and faults ~48,000 pages")]
    fn a_long_zap_lets_grace_periods_end() {
        // Other tests of this binary pin the same global epoch collector
        // meanwhile, and one of them holding a guard can hold up the grace
        // period past the zap's end (seen once in a full run under load):
        // the zap must let one end in at least one of a few tries. With one
        // guard held across the zap, none ever would.
        let tries: Vec<(u64, u64)> = (0..4).map(|_| long_zap_once()).collect();
        let gathers = 5;
        assert!(
            tries.iter().any(|&(g0, ran)| ran > g0 && ran < g0 + gathers),
            "(generation before the zap, generation the deferred closure ran at) per try: {tries:?}"
        );
    }

    /// One try of [`a_long_zap_lets_grace_periods_end`]: the generation
    /// before the zap, and the one the deferred closure ran at.
    fn long_zap_once() -> (u64, u64) {
        use crate::sync::AtomicBool;
        let gathers = 5;
        let pages = (gathers * super::super::gather::MAX_GATHER_FRAMES) as u64;
        let phys = PhysMem::new(PhysConfig::new((pages + 256) * PAGE_SIZE)).unwrap();
        // Under `NextAccess` every flush waits for the remote CPU's next
        // access, which paces the zap against the remote thread; with access
        // sections the zap may finish before the remote thread defers.
        // `downgrade`: a shootdown per gather (a lock-free unmap has one
        // only, before its zap), each marking a gather's end. `Broadcast`:
        // the remote CPU never filled from the zapped pages, so it is asked
        // only when every CPU is.
        let config = crate::MmConfig::default()
            .unmap_policy(UnmapPolicy::Downgrade)
            .shootdown_policy(crate::ShootdownPolicy::NextAccess)
            .shootdown_targets(crate::ShootdownTargets::Broadcast);
        let mm = AddressSpace::new(&phys, config).unwrap();
        let a = mm.mmap(0, pages * PAGE_SIZE, RW, ANON | MAP_POPULATE, None, 0).unwrap();
        let probe = mm.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        let g0 = mm.tlb.stats().flushes;
        let ran_at = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let remote = {
            let (mm, ran_at, stop) = (mm.clone(), ran_at.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.write_u64(probe, 1).unwrap();
                ready_tx.send(()).unwrap();
                let mut deferred = false;
                while !stop.load(Ordering::Acquire) {
                    // Acknowledges the flush under way, if any.
                    assert_eq!(cpu.read_u64(probe), Ok(1));
                    if !deferred && mm.tlb.stats().flushes > g0 {
                        let (mm, ran_at) = (mm.clone(), ran_at.clone());
                        crossbeam_epoch::pin().defer(move || ran_at.store(mm.tlb.stats().flushes, Ordering::Release));
                        deferred = true;
                    }
                    crossbeam_epoch::pin().flush();
                }
            })
        };
        ready.recv().unwrap();
        mm.munmap(a, pages * PAGE_SIZE).unwrap();
        stop.store(true, Ordering::Release);
        remote.join().unwrap();
        // Flush k of the zap made the flush count g0 + k.
        let ran = ran_at.load(Ordering::Acquire);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
        (g0, ran)
    }
}
