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
//! In all of them the frames are put and the tables freed only after a TLB
//! flush (the gather's), and the call returns only after its last flush, so
//! a `munmap` that returned leaves no translation of the range on any CPU.
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

use crate::error::Result;
use crate::pgtable::PMD_SIZE;
use crate::sync::Mutex;

use super::{AddressSpace, MmState, MmapWriteGuard, MmuGather, UnmapPolicy};

/// Sections of [`UnmapPolicy::Sectioned`]: `HPAGE_PUD_SIZE`, as seed 002.
pub(crate) const SECTION_SIZE: u64 = 1 << 30;

/// [`UnmapPolicy::LockFree`] zaps without the lock only spans larger than
/// this (one PTE table): a smaller zap is a few microseconds under the write
/// lock, cheaper than a second write section. Zero under loom, so the
/// models run the lock-free path on a page or two.
const LOCK_FREE_MIN_SPAN: u64 = if cfg!(loom) { 0 } else { PMD_SIZE };

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

    /// The VMA tree a placement without `MAP_FIXED` searches: the mappings,
    /// plus a stand-in VMA for every reserved range, so no mapping is placed
    /// in one.
    pub(crate) fn placement_view(&self, st: &MmState) -> crate::vma::VmaTree {
        let mut view = st.vmas.clone();
        for r in &st.reserved {
            let flags = crate::vma::VmFlags::empty();
            view.insert(crate::vma::Vma::new(&self.phys, r.start, r.end, flags, 0, None, None));
        }
        view
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
        mut st: MmapWriteGuard<'_>,
        start: u64,
        end: u64,
        after_detach: impl FnOnce(&mut MmState),
    ) -> Result<()> {
        let mut tlb = MmuGather::default();
        match self.config.unmap_policy {
            UnmapPolicy::Sectioned => {
                let mut after_detach = Some(after_detach);
                let mut st = Some(st);
                let mut from = start;
                while from < end {
                    let to = (from & !(SECTION_SIZE - 1)).saturating_add(SECTION_SIZE).min(end);
                    let mut g = st.take().unwrap_or_else(|| self.write_lock());
                    let res = self.do_munmap(&mut g, from, to, &mut tlb);
                    if res.is_ok() {
                        if let Some(f) = after_detach.take() {
                            f(&mut g);
                        }
                    }
                    // Each section is whole before the lock is dropped:
                    // its flush, then the next writer.
                    tlb.flush_and_free(self);
                    drop(g);
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
                let st = st.downgrade();
                if let Some((lo, hi)) = span? {
                    self.zap_range(lo, hi, &mut tlb, |_| true);
                    self.clear_guard_markers(lo, hi);
                    // Writers wait for the read lock: the VMAs around the
                    // range, hence the floor and ceiling, cannot change.
                    self.free_pgtables(&st, lo, hi, &mut tlb);
                }
                tlb.finish(self);
                drop(st);
                Ok(())
            }
            UnmapPolicy::LockFree => {
                let span = self.detach_vmas(&mut st, start, end)?;
                after_detach(&mut st);
                let Some((lo, hi)) = span.filter(|&(lo, hi)| hi - lo > LOCK_FREE_MIN_SPAN) else {
                    if let Some((lo, hi)) = span {
                        self.zap_range(lo, hi, &mut tlb, |_| true);
                        self.clear_guard_markers(lo, hi);
                        self.free_pgtables(&st, lo, hi, &mut tlb);
                    }
                    tlb.finish(self);
                    drop(st);
                    return Ok(());
                };
                let done = Arc::new(Mutex::new(()));
                let held = done.lock();
                st.reserved.push(Reservation { start: lo, end: hi, done: done.clone() });
                drop(st);
                // No mmap_lock: the VMAs are detached and published, and the
                // reservation keeps every writer out of [lo, hi).
                self.zap_range(lo, hi, &mut tlb, |_| true);
                self.clear_guard_markers(lo, hi);
                // The last frames' flush before anyone may map here again.
                tlb.flush_and_free(self);
                let mut st = self.write_lock();
                st.reserved.retain(|r| !Arc::ptr_eq(&r.done, &done));
                self.free_pgtables(&st, lo, hi, &mut tlb);
                drop(st);
                drop(held);
                // Only detached tables are left: nothing translates through
                // them, and they are freed after this flush and a grace period.
                tlb.finish(self);
                Ok(())
            }
            _ => {
                let res = self.do_munmap(&mut st, start, end, &mut tlb);
                if res.is_ok() {
                    after_detach(&mut st);
                }
                // Flush before mmap_lock is released, as Linux's
                // tlb_finish_mmu does: once another thread can map this range
                // again, no CPU may still reach the old frames.
                tlb.finish(self);
                drop(st);
                res
            }
        }
    }
}
