//! The core of an unmap that every policy shares (seed 002; the policies
//! and the `munmap` call are `sys/munmap.rs`): where unmaps spend their
//! time ([`UnmapStats`]), and the reservation of a range being zapped
//! without `mmap_lock` (`UnmapPolicy::LockFree`), which every writer of
//! the core honours ([`AddressSpace::write_lock_clear_of`]).
//!
//! # The reservation (`lock-free`)
//!
//! Once the write lock is dropped, other writers run during the zap. The
//! range must not be handed out again before its old entries and tables are
//! gone — otherwise a new mapping's fault would find an old entry (and read
//! the old data), or the zap would clear the new mapping's entries, or the
//! table freeing would take a table the new mapping uses (seed 002's
//! approach #2 race, `sys/munmap/tests.rs`). So the range stays in
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

use std::sync::Arc;
use std::time::Instant;

use crate::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::gather::GatherTimes;
use super::{AddressSpace, MmState, MmapWriteGuard, MmuGather};

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
    /// (`tlb/unreachable.rs`): at most one barrier per unmap.
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
    /// Page tables left to the epoch collector instead: too few to be
    /// worth a wait (under 16 with their subtables), or the grace period
    /// outlasted the wait's limit (a guard held long somewhere).
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
    pub(crate) fn add(&self, t: &UnmapTimes, g: &GatherTimes) {
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

pub(crate) fn ns_since(t: Option<Instant>) -> u64 {
    t.map_or(0, |t| u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX))
}
/// One unmap's times, outside its gather's. Read from the clock only when
/// the address space asks for them ([`crate::MmConfig::time_unmaps`]): a
/// small unmap's dozen clock reads cost as much as its write section.
pub(crate) struct UnmapTimes {
    /// The clock at entry; `None` when the unmap is not timed, and then
    /// every time stays 0.
    pub(crate) entry: Option<Instant>,
    pub(crate) write_hold_ns: u64,
    pub(crate) read_hold_ns: u64,
    pub(crate) lock_wait_ns: u64,
    pub(crate) zap_ns: u64,
    pub(crate) pgtable_ns: u64,
    /// The thread's shared-write count at entry, then (at the end) the
    /// unmap's own.
    pub(crate) shared_writes: u64,
}

impl UnmapTimes {
    /// Times from now if `timed`, else none.
    pub(crate) fn new(timed: bool) -> UnmapTimes {
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
    pub(crate) fn now(&self) -> Option<Instant> {
        self.entry.map(|_| Instant::now())
    }

    /// Runs `f`, adding its time to the field `at` selects.
    pub(crate) fn time<R>(&mut self, at: fn(&mut UnmapTimes) -> &mut u64, f: impl FnOnce() -> R) -> R {
        let t = self.now();
        let r = f();
        let v = at(self);
        *v = v.saturating_add(ns_since(t));
        r
    }
}
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
    /// Publishes the reservation of `[lo, hi)` (whose VMAs `st` detached),
    /// ends the write section (publishing the tree without them), and then
    /// makes the range unreachable to TLB fills
    /// ([`AddressSpace::unreachable`]; after the tree, so a CPU that sees
    /// the range unreachable and faults finds no VMA there). The caller
    /// holds `done`'s lock until after [`Self::release`].
    pub(crate) fn reserve(&self, mut st: MmapWriteGuard<'_>, lo: u64, hi: u64, done: &Arc<Mutex<()>>) {
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
    pub(crate) fn release(&self, lo: u64, hi: u64, done: &Arc<Mutex<()>>, tlb: &mut MmuGather, t: &mut UnmapTimes) {
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
