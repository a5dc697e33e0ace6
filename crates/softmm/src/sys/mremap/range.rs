//! `mremap` as a range writer: a private anonymous mapping, or a mapping
//! of a plain page-cache file or shmem (`mm/range.rs`, `range_vma_ok`),
//! shrunk in place, grown in place, or moved (with `MREMAP_MAYMOVE | MREMAP_FIXED`;
//! by a growth that cannot stay in place, to where the search puts it;
//! with `MREMAP_DONTUNMAP`, to its hint or fixed target or where the
//! search puts it, the source left mapped and empty), where the old
//! range, the new one and every VMA the call removes, splits or merges
//! with lie in one window. It runs the `mmap_lock`
//! path's own code (`do_mremap`: `remap_is_valid`, `vma_merge_extend`'s
//! insert, `move_vma` with its detach, `move_ptes` and `free_pgtables`)
//! on the window's view, so the result and the errno are that code's.
//!
//! The page-table move keeps the `mmap_lock` path's order: the source VMA
//! is detached ([`VmaTree::remove`](crate::vma::VmaTree)) before its
//! entries move, so a lock-free fault that found it aborts instead of
//! installing a page behind the move (which no VMA would then map), and
//! the destination gets its VMA only in the window version published after
//! the entries are in place. The anonymous reverse map needs nothing more:
//! a moved VMA keeps its `pgoff` and `anon_vma`, and the walk
//! (`mm/anon_rmap.rs`) reads the published windows and confirms each
//! candidate under its entry's lock, as it does beside an `mmap_lock`
//! writer. A file's walkers (truncate, `page_mkclean`, migration) block
//! the range writers and wait for the ones inside, so they see a move
//! whole or not at all (`mm/loom_tests.rs`,
//! `a_range_mremap_of_a_file_against_truncate`).
//!
//! `MREMAP_DONTUNMAP` keeps the same order: the source VMA is replaced
//! (detached, `VmaTree::replace`) by one without its pages before they
//! move, so a fault that found it aborts, and one that finds the
//! replacement comes after the move (a fresh page in the source).
//!
//! A target the search picks (`range_search_ok`) is the whole set's only
//! where the window decides it: a `MREMAP_DONTUNMAP` hint taken as given,
//! or, under `PlacementPolicy::Arenas`, room in the calling thread's
//! arena when that is the window.
//!
//! Falls back to `mmap_lock` (besides the cases of `mm/range.rs`):
//! a move whose target the search picks elsewhere (under Linux placement,
//! or outside the calling thread's arena, or a THP-aligned search of a
//! multiple of 2 MiB: the search covers the whole address space); a
//! footprint (the old range with its growth, the fixed target) across
//! two windows; a VMA in it that a range writer may not change (hugetlb,
//! host files and memory, devices, locked VMAs), or that reaches its
//! window's bounds, or a moved or grown VMA that would reach
//! them (it could merge with a VMA of the next window); no VMA at the old
//! address; a view whose `map_count` leaves fewer
//! than 8 below the limit (its slot's share short of 6 more VMAs than the
//! range writer's usual 2: a move may split both ranges in three).

use crate::error::Result;
use crate::uapi::*;
use crate::vma::{window_of, WINDOW_SHIFT};

use crate::mm::range::{range_vma_ok, Neighbours};
use crate::mm::{AddressSpace, MmState};

impl AddressSpace {
    /// `mremap` as a range writer (see the module), or `None` (nothing
    /// changed) for the `mmap_lock` path. The arguments passed
    /// `check_mremap_params`: lengths page aligned, `new_len` not zero.
    pub(crate) fn range_mremap(
        &self,
        old_addr: u64,
        old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
    ) -> Option<Result<u64>> {
        if !self.config.writer_policy.range_writers() {
            return None;
        }
        // A fixed target, or `MREMAP_DONTUNMAP`'s hint: in the footprint.
        let targeted = flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 && new_addr != 0;
        let old_end = old_addr.checked_add(old_len.max(new_len))?;
        let (lo, hi) = if targeted {
            let new_end = new_addr.checked_add(new_len)?;
            (old_addr.min(new_addr), old_end.max(new_end))
        } else {
            (old_addr, old_end)
        };
        let res = self.range_write_span(lo, hi, Neighbours::default(), |mm, st, tlb| {
            if !mm.range_mremap_ok(st, old_addr, old_len, new_len, flags, new_addr) {
                return None;
            }
            let mut tail = None;
            let res = mm.do_mremap(st, old_addr, old_len, new_len, flags, new_addr, tlb, &mut tail);
            if let (Ok(_), Some((start, end))) = (&res, tail) {
                // The shrink's tail, as `vm_munmap` unmaps it under
                // `mmap_lock`: inside the old range, so in this window.
                if let Err(e) = mm.do_munmap(st, start, end, tlb) {
                    return Some(Err(e));
                }
            }
            Some(res)
        });
        self.range_count_fallback(res.is_none());
        res
    }

    /// Whether the window's view `st` lets a range writer run this
    /// `mremap` (see the module): decided before anything changes.
    fn range_mremap_ok(
        &self,
        st: &MmState,
        old_addr: u64,
        old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
    ) -> bool {
        let w = window_of(old_addr);
        let (lo, hi) = (w << WINDOW_SHIFT, (w + 1) << WINDOW_SHIFT);
        // Room for a move's splits of both ranges, and for a shrink's: the
        // view's `map_count` stands at `max_map_count` less 2 and the
        // slot's room (`RangeState::map_count_share`).
        if st.vmas.len() + 8 > self.config.max_map_count {
            return false;
        }
        let Some(vma) = st.vmas.find(old_addr) else { return false };
        // One VMA in the old range: a move of several moves each (Linux
        // 6.17's multi-VMA move), each piece adding up to one VMA, more
        // than a range write's share of the room below `max_map_count`
        // allows for (`MAX_VMAS_ADDED`); `mmap_lock`'s check is exact.
        if st.vmas.overlapping(old_addr, old_addr.saturating_add(old_len.max(1))).nth(1).is_some() {
            return false;
        }
        // Every VMA of the old range may be split or removed, and none
        // reaches the window's bounds.
        if !self.range_touch_ok(st, old_addr, old_addr + old_len.max(1)) || !self.range_touch_ok(st, vma.start, vma.end)
        {
            return false;
        }
        if flags & MREMAP_FIXED != 0 {
            // The target's VMAs are unmapped (their pieces keep their
            // ends); the moved VMA, which may merge, stays off the bounds.
            return new_addr > lo
                && new_addr + new_len < hi
                && st.vmas.overlapping(new_addr, new_addr + new_len).all(|v| range_vma_ok(v));
        }
        if flags & MREMAP_DONTUNMAP != 0 {
            // A move (same length) to where the search puts it.
            return self.range_search_ok(st, old_addr, new_len, flags, new_addr, (lo, hi));
        }
        if new_len <= old_len {
            return true;
        }
        // A growth: in place (`expand_vma`'s test) if the grown VMA stays
        // off the window's upper bound, else moved by the search.
        let delta = new_len - old_len;
        if vma.end - old_addr == old_len {
            if vma.end + delta >= hi {
                return false;
            }
            if st.vmas.overlapping(vma.end, vma.end + delta).next().is_none() {
                return true;
            }
        }
        flags & MREMAP_MAYMOVE != 0 && self.range_search_ok(st, old_addr, new_len, flags, new_addr, (lo, hi))
    }

    /// Whether the target `mremap_target`'s search picks on the window's
    /// view `st` is the one it picks on the whole set, inside the window
    /// `[lo, hi)` and off its bounds: a `MREMAP_DONTUNMAP` hint taken as it
    /// is (a hint is checked against the VMAs around it, which are the
    /// window's, and against the stack guard gap of the VMA above the
    /// window), or, under `PlacementPolicy::Arenas`, room found in the
    /// calling thread's arena when that is this window (the arena is
    /// searched before the rest of the space, as a non-fixed `mmap` is:
    /// room found there is the whole set's answer). Anything else (the
    /// search below `mmap_base`, the THP-aligned search of a multiple of
    /// 2 MiB) covers the whole space, which the view does not hold.
    fn range_search_ok(
        &self,
        st: &MmState,
        old_addr: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
        (lo, hi): (u64, u64),
    ) -> bool {
        let hint = if flags & MREMAP_DONTUNMAP != 0 { new_addr } else { 0 };
        if hint == 0 && self.config.thp_align && new_len % crate::pgtable::PMD_SIZE == 0 {
            return false;
        }
        let Ok(a) = self.mremap_target(st, old_addr, new_len, flags, new_addr) else { return false };
        let in_arena = || {
            self.config.placement == crate::PlacementPolicy::Arenas
                && crate::mm::layout::thread_slot()
                    .and_then(|slot| crate::mm::layout::arena(&self.config, slot))
                    .is_some_and(|(bottom, _)| window_of(bottom) == window_of(lo))
        };
        a > lo
            && a.checked_add(new_len).is_some_and(|e| e < hi)
            && ((hint != 0 && a == hint) || in_arena())
            && self.range_arena_is_closed(hi)
    }
}
