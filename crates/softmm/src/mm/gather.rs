//! `mmu_gather`: what leaves the page tables during an unmap is held here
//! until the TLB shootdown says no CPU can reach it any more.

use std::time::{Duration, Instant};

use crate::pgtable::DetachedTable;
use crate::phys::Pfn;
use crate::rmap::Unmapped;
use crate::tlb::{CpuSet, FlushRange};

use super::AddressSpace;

/// Frame numbers per batch: Linux's `MAX_GATHER_BATCH`, what one 4 KiB page
/// holds after the batch header, `(4096 - 16) / 8`.
const MAX_GATHER_BATCH: usize = 510;

/// Batches gathered before a forced flush: Linux's `MAX_GATHER_BATCH_COUNT`,
/// `10000 / MAX_GATHER_BATCH`, which Linux chose so that no more than about
/// 10,000 pages are freed at once after a flush.
const MAX_GATHER_BATCH_COUNT: usize = 10_000 / MAX_GATHER_BATCH;

/// The most frames an [`MmuGather`] holds before its zap loop must flush the
/// TLB and free them (19 batches of 510: 9,690 frames, 76 KiB of frame
/// numbers, 38 MiB of guest memory). The same bound as Linux's, for the same
/// reasons: an unmap of any size holds bounded memory between flushes (and
/// keeps up to ~38 MiB of memory unavailable to others only that long),
/// while a flush, one shootdown of every running CPU, is amortized over
/// thousands of pages.
///
/// One under loom, so that a model's two-page unmap frees two gathers.
pub(crate) const MAX_GATHER_FRAMES: usize = if cfg!(loom) { 1 } else { MAX_GATHER_BATCH * MAX_GATHER_BATCH_COUNT };

/// Frames and page tables removed from an address space, to be released only
/// after its TLB is flushed. Dropping it without [`MmuGather::finish`] leaks
/// the references, which the leak tests catch.
///
/// It holds at most [`MAX_GATHER_FRAMES`] frames: a zap loop adds frames with
/// [`MmuGather::add_cleared_frame`] while that returns `true`, then drops its PTE lock
/// and calls [`MmuGather::flush_if_full`] before gathering more, as Linux's
/// `zap_pte_range` sets `force_flush`, unlocks and calls `tlb_flush_mmu`.
#[must_use = "call finish() to flush the TLB and free what was unmapped"]
#[derive(Default)]
pub(crate) struct MmuGather {
    /// Frame references taken out of entries, owned by the gather.
    frames: Vec<Pfn>,
    pub(crate) tables: Vec<DetachedTable>,
    /// A translation was removed or narrowed, and its fill owners were not
    /// collected: a shootdown of every CPU is needed even if nothing is
    /// freed (e.g. mprotect to read-only).
    pub(crate) need_flush: bool,
    /// The fill owners of the entries [`MmuGather::add_cleared_frame`]'s
    /// callers cleared ([`MmuGather::add_fill_owners`]): the CPUs a
    /// shootdown must ask when nothing set `need_flush`.
    owners: CpuSet,
    /// The addresses those entries mapped, first and end, for a ranged
    /// request (`ShootdownTargets::FillOwnersRanges`).
    cleared: Option<(u64, u64)>,
    /// Where this gather's flushes spent their time, for [`super::UnmapStats`].
    pub(crate) times: GatherTimes,
    /// Set by [`MmuGather::shoot_down_unreachable`]: what the gather takes
    /// comes from a range no CPU has reached since a completed shootdown,
    /// so it is freed without another.
    shot_down: bool,
    /// Set by [`MmuGather::keep_tables`]: tables are not handed to the
    /// epoch collector after their flush but kept in `flushed_tables`, for
    /// [`MmuGather::free_tables_here`].
    keep_tables: bool,
    /// Detached tables whose flush is done, waiting for a grace period.
    flushed_tables: Vec<DetachedTable>,
}

/// What an [`MmuGather`]'s flushes cost, summed over its life: read by the
/// unmap policies after their last flush ([`super::UnmapStats`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct GatherTimes {
    /// Shootdowns done (one per flush that had something to flush).
    pub(crate) flushes: u64,
    /// Time from the start of each shootdown to the last acknowledgement.
    pub(crate) flush_ns: u64,
    /// The part of `flush_ns` spent waiting for other CPUs'
    /// acknowledgements ([`crate::tlb::FlushTicket::wait`]).
    pub(crate) flush_wait_ns: u64,
    /// Time putting frames and scheduling tables for freeing after a flush.
    pub(crate) free_ns: u64,
    /// Frame references put after a flush.
    pub(crate) frames: u64,
    /// Flushes that forced a barrier on the process's other running
    /// threads ([`crate::tlb::FlushTicket::forced_barrier`]): with
    /// `membarrier`, an IPI to each CPU running one of them.
    pub(crate) barriers: u64,
    /// Frees of gathered frames or tables (a full gather, and the last),
    /// with or without a shootdown before them.
    pub(crate) batches: u64,
    /// Time [`MmuGather::free_tables_here`] waited for a grace period and
    /// freed the tables.
    pub(crate) table_free_ns: u64,
    /// Page tables [`MmuGather::free_tables_here`] freed on the calling
    /// thread (subtables counted with their parent's one).
    pub(crate) tables_freed_here: u64,
    /// Page tables it handed to the epoch collector instead, the grace
    /// period taking longer than its limit.
    pub(crate) tables_deferred: u64,
}

/// The clock now if `mm` times its unmaps ([`crate::MmConfig::time_unmaps`]):
/// the gather's times are read by the unmap statistics only.
fn clock(mm: &AddressSpace) -> Option<Instant> {
    mm.config.time_unmaps.then(Instant::now)
}

fn ns_since(t: Option<Instant>) -> u64 {
    t.map_or(0, |t| u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

impl MmuGather {
    /// Holds `frame` until the flush; false once the gather is full.
    fn push_frame(&mut self, frame: Unmapped<'_>) -> bool {
        debug_assert!(!self.is_full(), "frame added to a full gather");
        let cap = self.frames.capacity();
        if self.frames.len() == cap {
            // Grow as `Vec` does, but never past the bound: a one-page unmap
            // allocates little, a huge one at most MAX_GATHER_FRAMES entries.
            self.frames.reserve_exact(
                cap.saturating_mul(2).clamp(MAX_GATHER_FRAMES.min(8), MAX_GATHER_FRAMES).saturating_sub(cap),
            );
        }
        self.frames.push(frame.into_gathered());
        !self.is_full()
    }

    /// Takes over the reference an entry that was just cleared held on
    /// `frame`; it is put after the flush (the gather is one of
    /// [`Unmapped`]'s two consumers). Returns `false` once the gather
    /// is full: the caller must then stop clearing entries, drop its PTE
    /// lock and call [`MmuGather::flush_if_full`] before it adds another.
    /// `va` and `size` are the cleared entry's address and size.
    ///
    /// The caller must also add the fill owners its PTE guard collected
    /// ([`MmuGather::add_fill_owners`]): they are the only CPUs the flush
    /// asks (unless something sets `need_flush`). A caller that does not
    /// collect them sets `need_flush`, and every CPU is asked.
    #[must_use = "a full gather must be flushed before more frames are added"]
    pub(crate) fn add_cleared_frame(&mut self, frame: Unmapped<'_>, va: u64, size: u64) -> bool {
        let end = va.saturating_add(size);
        self.cleared = Some(self.cleared.map_or((va, end), |(s, e)| (s.min(va), e.max(end))));
        self.push_frame(frame)
    }

    /// Adds CPUs the next flush must ask: the fill owners of entries the
    /// caller cleared, taken from their PTE guard after the change and
    /// before the guard is dropped (`PteGuard::take_fill_owners`).
    pub(crate) fn add_fill_owners(&mut self, owners: &CpuSet) {
        self.owners.union(owners);
    }

    /// True if no frame waits for a flush.
    pub(crate) fn frames_is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// True once [`MAX_GATHER_FRAMES`] frames wait for a flush.
    pub(crate) fn is_full(&self) -> bool {
        self.frames.len() >= MAX_GATHER_FRAMES
    }

    /// If the gather is full, flushes `mm`'s TLB and frees what it holds,
    /// leaving it empty for more (Linux's `tlb_flush_mmu`). Call it with no
    /// PTE lock held: [`MmuGather::add_cleared_frame`] never flushes by itself
    /// because its caller holds one, and a shootdown under it would make
    /// every fault on that table wait for the slowest CPU's acknowledgement
    /// (safe, since a CPU blocked on the lock is quiescent, but needless).
    pub(crate) fn flush_if_full(&mut self, mm: &AddressSpace) {
        if self.is_full() {
            self.flush_and_free(mm);
        }
    }

    /// Flushes `mm`'s TLBs if anything changed, then drops the frame
    /// references and schedules the tables for freeing after a grace period.
    /// After [`MmuGather::keep_tables`], it also frees the kept tables
    /// ([`MmuGather::free_tables_here`]: call it with no lock held then).
    pub(crate) fn finish(mut self, mm: &AddressSpace) {
        self.flush_and_free(mm);
        self.free_tables_here(mm);
    }

    /// Shoots down `mm`'s TLBs once for a range that
    /// [`super::AddressSpace::unreachable`] holds (published before this
    /// call): once it returns, no CPU holds or can make a translation into
    /// the range, so every frame and table the gather takes from the range
    /// afterwards is freed at each full gather and at the end without
    /// another shootdown (`tlb/unreachable.rs`). The caller must gather
    /// nothing else into it afterwards.
    pub(crate) fn shoot_down_unreachable(&mut self, mm: &AddressSpace) {
        self.need_flush = true;
        self.flush_and_free(mm);
        self.shot_down = true;
    }

    /// Flushes `mm`'s TLBs if anything changed, then frees what the gather
    /// holds, leaving it empty for more (Linux's `tlb_flush_mmu`). After
    /// [`MmuGather::shoot_down_unreachable`], it only frees.
    pub(crate) fn flush_and_free(&mut self, mm: &AddressSpace) {
        if !(self.need_flush || !self.owners.is_empty() || !self.frames.is_empty() || !self.tables.is_empty()) {
            return;
        }
        if !self.shot_down {
            let begin = clock(mm);
            // Only the collected owners when every change collected them.
            // Detached tables ask every CPU too: their entries were zapped
            // before, but not necessarily through this gather.
            let everyone = self.need_flush || !self.tables.is_empty();
            let ticket = if everyone {
                mm.flush_tlb_begin()
            } else {
                let range = self.cleared.map_or(FlushRange::ALL, |(start, end)| FlushRange::new(start, end));
                mm.flush_tlb_begin_owners(&self.owners, range)
            };
            let barrier = ticket.forced_barrier();
            let wait = clock(mm);
            ticket.wait();
            let t = &mut self.times;
            t.flushes += 1;
            t.barriers += u64::from(barrier);
            t.flush_wait_ns = t.flush_wait_ns.saturating_add(ns_since(wait));
            t.flush_ns = t.flush_ns.saturating_add(ns_since(begin));
        }
        let t = &mut self.times;
        t.batches += u64::from(!self.frames.is_empty() || !self.tables.is_empty());
        let free = clock(mm);
        self.need_flush = false;
        self.owners = CpuSet::EMPTY;
        self.cleared = None;
        t.frames += self.frames.len() as u64;
        // The references `add_cleared_frame` took over; no CPU reaches the frames
        // now. One batch: thousands of frames per flush, each freed with
        // its own lock round trips would cost most of the unmap.
        mm.phys.put_batch(&mut self.frames);
        if self.keep_tables {
            self.flushed_tables.append(&mut self.tables);
        } else if !self.tables.is_empty() {
            let guard = crossbeam_epoch::pin();
            for t in self.tables.drain(..) {
                t.free_after_grace_period(&mm.phys, &guard);
            }
        }
        self.times.free_ns = self.times.free_ns.saturating_add(ns_since(free));
    }

    /// From now on the tables this gather detaches are kept after their
    /// flush until [`MmuGather::free_tables_here`], instead of going to the
    /// epoch collector, which runs a deferred free on whichever thread
    /// collects next: a big unmap's tables (a PMD table and its 512 PTE
    /// tables, 2 MiB of entries to scan, take 0.3-0.9 ms to free on the
    /// lab's VM; 8 GiB has eight) would stall another thread's `mmap` or
    /// fault for milliseconds, the unmap's cost paid by someone else.
    pub(crate) fn keep_tables(&mut self) {
        self.keep_tables = true;
    }

    /// Frees, on the calling thread, the tables kept since
    /// [`MmuGather::keep_tables`] (all flushed: call it after the last
    /// [`MmuGather::flush_and_free`]), once a grace period has ended; Linux
    /// frees an unmap's tables from an RCU callback on the unmapping CPU
    /// (`tlb_remove_table_rcu`). Call it with no lock held that a thread
    /// pinned in the epoch may be waiting for: it waits for every guard
    /// pinned now to be dropped, [`GRACE_WAIT_LIMIT`] at most (a guard held
    /// long, the caller's own included, cannot block it), and hands what is
    /// left to the collector after that, as before. Fewer than
    /// [`FREE_HERE_MIN_TABLES`] tables go to the collector at once.
    pub(crate) fn free_tables_here(&mut self, mm: &AddressSpace) {
        if self.flushed_tables.is_empty() {
            return;
        }
        let t0 = clock(mm);
        let tables = std::mem::take(&mut self.flushed_tables);
        let n = tables.len() as u64;
        // Only frees worth a wait: a few tables (a 1 GiB hugetlb area's
        // PUD table, a sparse range) cost the collector microseconds, while
        // the wait lasts as long as the longest guard pinned meanwhile, up
        // to the limit when a pinned thread is preempted. Linux never waits
        // here (its RCU callback frees them later), and seed 000's forker,
        // which unmaps a 1 GiB area per fork, spent most of its munmap in
        // that wait: its shared PMD table went unlinked three times as long.
        let mut count = 0;
        for t in &tables {
            count += t.tables_up_to(FREE_HERE_MIN_TABLES - count);
            if count >= FREE_HERE_MIN_TABLES {
                break;
            }
        }
        if count >= FREE_HERE_MIN_TABLES && wait_for_grace_period(GRACE_WAIT_LIMIT) {
            for t in tables {
                // SAFETY: each table was detached before this call, so the
                // grace period that ended since then ended every walk that
                // could still hold it; the gather owned it alone.
                unsafe { t.free_now(&mm.phys) };
            }
            self.times.tables_freed_here += n;
        } else {
            let guard = crossbeam_epoch::pin();
            for t in tables {
                t.free_after_grace_period(&mm.phys, &guard);
            }
            self.times.tables_deferred += n;
        }
        self.times.table_free_ns = self.times.table_free_ns.saturating_add(ns_since(t0));
    }
}

/// The fewest tables (subtables included) that [`MmuGather::free_tables_here`]
/// waits for a grace period to free itself; fewer go to the collector. As
/// `sys/munmap.rs`'s span rule: 16 PTE tables take about 15 us to free.
const FREE_HERE_MIN_TABLES: usize = 16;

/// How long [`MmuGather::free_tables_here`] waits for a grace period before
/// it leaves the tables to the collector. Other threads pin for
/// microseconds (a walk, a fault); a longer wait means a guard held across
/// something slow (or the caller's own), which the unmap must not wait
/// for.
pub(crate) const GRACE_WAIT_LIMIT: Duration = Duration::from_millis(2);

/// Waits until every epoch guard pinned when it is called has been dropped
/// (a grace period, `synchronize_rcu`): true once one has, false after
/// `limit` without. Always false under loom, whose models keep to the
/// collector (a bounded spin would multiply their interleavings).
pub(crate) fn wait_for_grace_period(limit: Duration) -> bool {
    if cfg!(loom) {
        return false;
    }
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let guard = crossbeam_epoch::pin();
        let e = ended.clone();
        // The collector runs it once every guard pinned before this defer
        // is gone, on whichever thread collects (this one, below, mostly).
        crate::sync::rcu::call_rcu(&guard, move || e.store(true, std::sync::atomic::Ordering::Release));
        guard.flush();
    }
    let start = Instant::now();
    let mut tries = 0u32;
    loop {
        if ended.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        // Each flush tries to advance the epoch and runs what expired.
        crossbeam_epoch::pin().flush();
        tries += 1;
        if tries > 64 {
            // Someone pinned is slow or descheduled: let it run.
            std::thread::yield_now();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::tlb::FlushTicket;
    use crate::uapi::*;
    use crate::{Cpu, MmConfig, PhysConfig, PhysMem, PAGE_SIZE};

    #[test]
    fn a_gather_is_full_at_the_bound() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let mut tlb = MmuGather::default();
        // The zero page's references are not counted: any number will do.
        let zero = || crate::rmap::unmapped(&phys, crate::pgtable::Pte::page(phys.zero_pfn(), 0));
        for _ in 0..MAX_GATHER_FRAMES - 1 {
            assert!(tlb.add_cleared_frame(zero(), 0, PAGE_SIZE));
        }
        assert!(!tlb.is_full());
        assert!(!tlb.add_cleared_frame(zero(), 0, PAGE_SIZE), "the last frame under the bound reports the gather full");
        assert!(tlb.is_full());
        assert!(tlb.frames.capacity() <= MAX_GATHER_FRAMES + 8, "the batch grew past its bound");
        std::mem::forget(tlb); // frame numbers only: nothing to free
    }

    /// An munmap of more resident pages than one gather holds flushes once
    /// per full gather (the TLB statistics show each, with a request to a
    /// CPU of another thread), frees everything, and leaks nothing.
    #[test]
    #[cfg_attr(miri, ignore = "maps and faults ~10,000 pages")]
    fn a_huge_munmap_flushes_each_full_gather() {
        for policy in crate::UnmapPolicy::ALL {
            a_huge_munmap_flushes_each_full_gather_under(*policy);
        }
    }

    fn a_huge_munmap_flushes_each_full_gather_under(policy: crate::UnmapPolicy) {
        let pages = MAX_GATHER_FRAMES as u64 + 1;
        let phys = PhysMem::new(PhysConfig::new((pages + 64) * PAGE_SIZE)).unwrap();
        // Every flush asks every CPU: the pages are never filled from, so
        // under `FillOwners` only the flush of the page tables would.
        let config = MmConfig::default()
            .unmap_policy(policy)
            .time_unmaps(true)
            .shootdown_targets(crate::ShootdownTargets::Broadcast);
        let mm = AddressSpace::new(&phys, config).unwrap();
        let len = pages * PAGE_SIZE;
        let a = mm.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, None, 0).unwrap();
        assert_eq!(mm.stats().rss_pages, pages);
        // A parked CPU of another thread: every flush sends it a request.
        let (attached_tx, attached) = mpsc::channel();
        let (done, done_rx) = mpsc::channel::<()>();
        let remote = {
            let mm = mm.clone();
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.park();
                attached_tx.send(()).unwrap();
                done_rx.recv().unwrap();
            })
        };
        attached.recv().unwrap();
        let before = mm.stats().tlb;
        let (unmap_before, mine_before) = (mm.stats().unmap, crate::UnmapStats::this_thread());
        mm.munmap(a, len).unwrap();
        let after = mm.stats().tlb;
        let flushes = after.flushes - before.flushes;
        // The unmap statistics count the same flushes, and every frame.
        let (u, mine) = (mm.stats().unmap, crate::UnmapStats::this_thread());
        for (b, a) in [(unmap_before, u), (mine_before, mine)] {
            assert_eq!(
                (a.unmaps - b.unmaps, a.flushes - b.flushes, a.frames - b.frames),
                (1, flushes, pages),
                "{policy:?}"
            );
            assert!(a.flush_ns - b.flush_ns >= a.flush_wait_ns - b.flush_wait_ns, "{policy:?}");
            assert!(a.zap_ns - b.zap_ns > 0 && a.total_ns - b.total_ns >= a.zap_ns - b.zap_ns, "{policy:?}");
            assert!(a.write_hold_ns - b.write_hold_ns > 0, "{policy:?}");
            // The other thread's CPU is attached: every flush forces a
            // barrier on the process's running threads.
            assert_eq!(a.barriers - b.barriers, flushes, "{policy:?}");
            assert!(a.pgtable_ns > b.pgtable_ns, "{policy:?}");
        }
        assert_eq!(u.read_hold_ns > 0, policy == crate::UnmapPolicy::Downgrade, "{policy:?}");
        // One free when the gather fills, one at the end for the rest and
        // the page tables; without the bound, a single one. The lock-free
        // unmap frees the last frames before it drops its reservation and
        // the page tables after (no writer waits for those).
        let lock_free = policy == crate::UnmapPolicy::LockFree;
        let batches = pages.div_ceil(MAX_GATHER_FRAMES as u64) + u64::from(lock_free);
        assert_eq!(u.batches - unmap_before.batches, batches, "{policy:?}");
        assert_eq!(mine.batches - mine_before.batches, batches, "{policy:?}");
        // A shootdown before each free, except under lock-free: one for the
        // whole range, before the zap (`tlb/unreachable.rs`).
        assert_eq!(flushes, if lock_free { 1 } else { batches }, "{policy:?}");
        assert!(batches >= 2);
        assert_eq!(after.flush_requests - before.flush_requests, flushes);
        assert_eq!(phys.stats().frames_used, 0, "every unmapped frame is free once munmap returns");
        done.send(()).unwrap();
        remote.join().unwrap();
        // With no CPU of another thread left, a flush forces no barrier.
        let a = mm.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, None, 0).unwrap();
        let (b, f) = (mm.stats().unmap, mm.stats().tlb.flushes);
        mm.munmap(a, len).unwrap();
        let u = mm.stats().unmap;
        assert!(u.flushes > b.flushes && mm.stats().tlb.flushes > f, "{policy:?}");
        assert_eq!(u.barriers, b.barriers, "{policy:?}: a barrier with no other thread to shoot down");
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
    }

    /// `flush_tlb_begin` on two address spaces, then both waits: each CPU of
    /// another thread gets its request, and each wait ends once its CPU
    /// acknowledged.
    #[test]
    fn flushes_of_two_address_spaces_begin_then_wait() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let mms = [
            AddressSpace::new(&phys, MmConfig::default()).unwrap(),
            AddressSpace::new(&phys, MmConfig::default()).unwrap(),
        ];
        let addrs: Vec<u64> = mms
            .iter()
            .map(|mm| mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap())
            .collect();
        let (ready_tx, ready) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel::<()>();
        let remote = {
            let mms = mms.clone();
            let addrs = addrs.clone();
            std::thread::spawn(move || {
                // Two running CPUs on one thread: each access acknowledges
                // whatever shootdown its address space began.
                let mut cpus = [Cpu::attached(&mms[0]), Cpu::attached(&mms[1])];
                for (c, &a) in cpus.iter_mut().zip(&addrs) {
                    c.write_u8(a, 1).unwrap();
                }
                ready_tx.send(()).unwrap();
                while stop_rx.try_recv().is_err() {
                    for (c, &a) in cpus.iter_mut().zip(&addrs) {
                        assert_eq!(c.read_u8(a).unwrap(), 1);
                    }
                    std::thread::yield_now();
                }
            })
        };
        ready.recv().unwrap();
        let tickets = [mms[0].flush_tlb_begin(), mms[1].flush_tlb_begin()];
        tickets.into_iter().for_each(FlushTicket::wait);
        for mm in &mms {
            let s = mm.stats().tlb;
            assert_eq!((s.flushes, s.flush_requests), (1, 1), "{s:?}");
        }
        stop.send(()).unwrap();
        remote.join().unwrap();
        drop(mms);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
    }
}
