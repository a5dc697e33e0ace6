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
//! ([`UnmapStats::tables_deferred`](crate::UnmapStats::tables_deferred)).
//! So do fewer than 16 tables, subtables included (a 1 GiB hugetlb area's
//! PUD table, a sparse range), which cost the collector microseconds: the
//! wait lasts as long as the longest guard pinned meanwhile, and seed 000's
//! forker spent most of each `munmap` in it (`mm/gather.rs`).
//!
//! # The reservation (`lock-free`)
//!
//! Once the write lock is dropped, other writers run during the zap; the
//! range stays reserved from the detach until its tables are freed, so
//! that nobody maps it again meanwhile. The reservation is the core's
//! (`mm/unmap.rs`, which states its rules), as every writer must honour it.
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
//! (`tlb/unreachable.rs`) once its tree is published, and shoots it
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

use crate::error::{Errno, Result};
use crate::mm::{ns_since, put_files, AddressSpace, MmState, MmapWriteGuard, MmuGather, UnmapPolicy, UnmapTimes};
use crate::pgtable::PMD_SIZE;
use crate::sync::Mutex;
use crate::{page_align, PAGE_SIZE};

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

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
impl AddressSpace {
    /// `munmap(addr, len)`: `EINVAL` for an unaligned address, a zero length or
    /// a range outside the user address space; unmapping nothing succeeds.
    pub fn munmap(&self, addr: u64, len: u64) -> Result<()> {
        let _q = crate::tlb::QuiescentGuard::enter();
        let task = self.config.task_size;
        if addr % PAGE_SIZE != 0 || addr > task || len > task - addr {
            return Err(Errno::Inval);
        }
        let len = page_align(len);
        if len == 0 {
            return Err(Errno::Inval);
        }
        // Range-parallel writers: inside one window, without mmap_lock.
        if let Some(res) = self.range_munmap(addr, addr + len) {
            return res;
        }
        // A range still being zapped by a lock-free unmap is waited for:
        // this call must not return before it is empty either.
        let st = self.write_lock_clear_of(|_| [(addr, addr + len), (0, 0)]);
        self.vm_munmap(st, addr, addr + len, |_| {})
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
                put_files(removed);
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
                put_files(removed);
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
}
