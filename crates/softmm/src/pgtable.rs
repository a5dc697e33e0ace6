//! Page tables: the x86-64 4-level radix tree of 512-entry tables.
//!
//! Entries are `AtomicU64`s. A non-leaf entry holds the address of the next
//! table with [`PTE_PRESENT`]; a leaf entry holds a frame number shifted by
//! [`PAGE_SHIFT`](crate::PAGE_SHIFT) and the x86 bits. Each table carries its
//! own lock (Linux's split PTE lock): a leaf entry changes only under its
//! table's lock. The walk takes no lock, like a hardware walker: it runs under
//! an epoch guard, and a table detached from the tree is freed only after that
//! grace period, and only after the TLB flush that follows the detach.

use crossbeam_epoch::Guard;
use parking_lot::Mutex;

use crate::phys::{Pfn, PhysMem};
use crate::sync::{AtomicU64, Ordering};
use crate::{PAGE_SHIFT, PAGE_SIZE};

/// Present: the entry translates.
pub const PTE_PRESENT: u64 = 1 << 0;
/// Writable.
pub const PTE_WRITE: u64 = 1 << 1;
/// User accessible (always set on user mappings).
pub const PTE_USER: u64 = 1 << 2;
/// Accessed: set by the walker on every TLB fill.
pub const PTE_ACCESSED: u64 = 1 << 5;
/// Dirty: set by the walker on a TLB fill for write.
pub const PTE_DIRTY: u64 = 1 << 6;
/// Software bit: `PROT_NONE` entry that keeps its frame but does not translate.
pub const PTE_PROTNONE: u64 = 1 << 9;
/// Frame-number field.
pub const PTE_PFN_MASK: u64 = 0x000f_ffff_ffff_f000;
/// A guard marker (`MADV_GUARD_INSTALL`, Linux's `PTE_MARKER_GUARD`): a
/// non-present leaf entry with no frame, and this software bit alone. An
/// access faults and the fault raises SIGSEGV; zapping for `MADV_DONTNEED` or
/// truncation keeps it, `munmap` and `MADV_GUARD_REMOVE` clear it, `fork`
/// copies it, `mremap` moves it.
pub const PTE_GUARD: u64 = 1 << 10;

/// Entries per table.
pub const PTRS_PER_TABLE: usize = 512;
/// Bytes mapped by one leaf (PTE) table: 2 MiB.
pub const PMD_SIZE: u64 = PAGE_SIZE * PTRS_PER_TABLE as u64;

/// A leaf entry's frame.
#[inline]
pub fn pte_pfn(pte: u64) -> Pfn {
    (pte & PTE_PFN_MASK) >> PAGE_SHIFT
}

/// Builds a leaf entry.
#[inline]
pub fn mk_pte(pfn: Pfn, flags: u64) -> u64 {
    (pfn << PAGE_SHIFT) | flags | PTE_USER
}

/// True if the entry holds a frame (present, or `PROT_NONE` but kept).
#[inline]
pub fn pte_has_frame(pte: u64) -> bool {
    pte & (PTE_PRESENT | PTE_PROTNONE) != 0
}

/// True if the entry is a guard marker ([`PTE_GUARD`]).
#[inline]
pub fn pte_is_guard(pte: u64) -> bool {
    pte == PTE_GUARD
}

/// One page-table page with its split lock.
#[repr(C, align(64))]
pub struct PageTable {
    entries: [AtomicU64; PTRS_PER_TABLE],
    /// The PTE lock: serializes changes to this table's leaf entries.
    lock: Mutex<()>,
}

impl PageTable {
    fn new_boxed() -> Box<PageTable> {
        Box::new(PageTable { entries: std::array::from_fn(|_| AtomicU64::new(0)), lock: Mutex::new(()) })
    }

    /// Entry `i` of this table.
    #[inline]
    pub fn entry(&self, i: usize) -> &AtomicU64 {
        &self.entries[i]
    }

    /// Locks the table's leaf entries.
    #[inline]
    pub fn lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.lock.lock()
    }
}

/// The table index of `va` at `level` (3 = PGD, 2 = PUD, 1 = PMD, 0 = PTE).
#[inline]
pub fn index(va: u64, level: u32) -> usize {
    ((va >> (PAGE_SHIFT + 9 * level as u64)) & 511) as usize
}

/// Bytes covered by one entry at `level`.
#[inline]
fn entry_span(level: u32) -> u64 {
    PAGE_SIZE << (9 * level)
}

#[inline]
fn table_of(entry: u64) -> *const PageTable {
    (entry & !PTE_PRESENT) as *const PageTable
}

/// The 4-level tree of one address space.
pub struct PageTables {
    root: Box<PageTable>,
}

impl PageTables {
    /// An empty tree: just the PGD.
    pub fn new(phys: &PhysMem) -> PageTables {
        phys.account_page_table(1);
        PageTables { root: PageTable::new_boxed() }
    }

    /// The leaf table covering `va`, if the tree has one. Takes no lock.
    #[inline]
    pub fn leaf<'g>(&self, va: u64, _guard: &'g Guard) -> Option<&'g PageTable> {
        let mut table: *const PageTable = &*self.root;
        for level in (1..=3).rev() {
            // SAFETY: `table` is the root (alive as long as `self`, which the
            // caller's guard cannot outlive in any use here) or a table read
            // from a present entry; detached tables are freed only after a
            // grace period, which `_guard` holds open.
            let e = unsafe { &*table }.entries[index(va, level)].load(Ordering::Acquire);
            if e & PTE_PRESENT == 0 {
                return None;
            }
            table = table_of(e);
        }
        // SAFETY: as above: a table reached under the guard outlives it.
        Some(unsafe { &*table })
    }

    /// The leaf table covering `va`, allocating missing tables. Concurrent
    /// callers race with compare-exchange; the loser frees its table.
    pub fn leaf_alloc<'g>(&self, va: u64, phys: &PhysMem, _guard: &'g Guard) -> &'g PageTable {
        let mut table: *const PageTable = &*self.root;
        for level in (1..=3).rev() {
            // SAFETY: see `leaf`.
            let slot = &unsafe { &*table }.entries[index(va, level)];
            let mut e = slot.load(Ordering::Acquire);
            if e & PTE_PRESENT == 0 {
                let new = Box::into_raw(PageTable::new_boxed());
                let new_e = new as u64 | PTE_PRESENT;
                // Release publishes the zeroed table to walkers (Acquire above).
                match slot.compare_exchange(e, new_e, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        phys.account_page_table(1);
                        e = new_e;
                    }
                    Err(cur) => {
                        // SAFETY: `new` came from Box::into_raw and was never published.
                        drop(unsafe { Box::from_raw(new) });
                        e = cur;
                    }
                }
            }
            table = table_of(e);
        }
        // SAFETY: see `leaf`.
        unsafe { &*table }
    }

    /// Calls `f(va, leaf_table)` for every existing leaf table overlapping
    /// `[start, end)`, with `va` the first address of the overlap.
    pub fn for_each_leaf<'g>(&self, start: u64, end: u64, guard: &'g Guard, mut f: impl FnMut(u64, &'g PageTable)) {
        let mut va = start;
        while va < end {
            match self.walk(va, guard) {
                Ok(t) => f(va, t),
                // No table at this level: nothing below it either, so the
                // walk skips the whole span it would have covered (a range
                // of terabytes with a few mappings costs a few lookups).
                Err(level) => {
                    let span = 1u64 << (PAGE_SHIFT + 9 * level as u64);
                    match (va & !(span - 1)).checked_add(span) {
                        Some(next) => va = next,
                        None => return,
                    }
                    continue;
                }
            }
            match (va & !(PMD_SIZE - 1)).checked_add(PMD_SIZE) {
                Some(next) => va = next,
                None => return,
            }
        }
    }

    /// Calls `f(va, entry)` for each leaf entry of `[start, end)` whose table
    /// exists, holding that table's PTE lock: the one loop through which
    /// zap, protection change, lazy free and guard-marker removal
    /// read-modify-write leaf entries.
    pub fn for_each_pte_locked(&self, start: u64, end: u64, guard: &Guard, mut f: impl FnMut(u64, &AtomicU64)) {
        self.for_each_leaf(start, end, guard, |va, t| {
            let stop = end.min((va & !(PMD_SIZE - 1)) + PMD_SIZE);
            let _ptl = t.lock();
            let mut a = va;
            while a < stop {
                f(a, t.entry(index(a, 0)));
                a += PAGE_SIZE;
            }
        });
    }

    /// The leaf table covering `va`, or the level (1..=3) of the table whose
    /// entry for `va` is empty.
    fn walk<'g>(&self, va: u64, _guard: &'g Guard) -> Result<&'g PageTable, u32> {
        let mut table: *const PageTable = &*self.root;
        for level in (1..=3).rev() {
            // SAFETY: as in `leaf`.
            let e = unsafe { &*table }.entries[index(va, level)].load(Ordering::Acquire);
            if e & PTE_PRESENT == 0 {
                return Err(level);
            }
            table = table_of(e);
        }
        // SAFETY: as in `leaf`.
        Ok(unsafe { &*table })
    }

    /// Detaches every table that maps only addresses inside `[floor, ceiling)`
    /// and overlaps `[start, end)`, Linux's `free_pgtables`. Their leaf entries
    /// must already be zapped. The detached tables go to `out`, to be freed
    /// after the TLB flush and a grace period.
    pub fn detach_tables(&self, start: u64, end: u64, floor: u64, ceiling: u64, out: &mut Vec<DetachedTable>) {
        if start >= end {
            return;
        }
        detach_level(&self.root, 3, 0, start, end, floor, ceiling, out);
    }

    /// Frees every table of the tree immediately, returning the frames that
    /// leaf entries still held. Only for a dying address space that no CPU
    /// and no walker can reach.
    pub fn free_all(&mut self, phys: &PhysMem, frames: &mut Vec<Pfn>) {
        fn free_level(t: &PageTable, level: u32, phys: &PhysMem, frames: &mut Vec<Pfn>) {
            for e in &t.entries {
                let v = e.swap(0, Ordering::Relaxed);
                if level == 0 {
                    if pte_has_frame(v) {
                        frames.push(pte_pfn(v));
                    }
                } else if v & PTE_PRESENT != 0 {
                    // SAFETY: a present non-leaf entry owns the table it points
                    // to (made by Box::into_raw in leaf_alloc); the tree is
                    // unreachable by anyone else, so we are its last user.
                    let child = unsafe { Box::from_raw(table_of(v) as *mut PageTable) };
                    free_level(&child, level - 1, phys, frames);
                    phys.account_page_table(-1);
                }
            }
        }
        free_level(&self.root, 3, phys, frames);
    }

    /// Frees the root at the end of the tree's life.
    pub fn release_root(&self, phys: &PhysMem) {
        phys.account_page_table(-1);
    }
}

#[allow(clippy::too_many_arguments)]
fn detach_level(
    t: &PageTable,
    level: u32,
    base: u64,
    start: u64,
    end: u64,
    floor: u64,
    ceiling: u64,
    out: &mut Vec<DetachedTable>,
) {
    let span = entry_span(level);
    for i in 0..PTRS_PER_TABLE {
        let lo = base + i as u64 * span;
        let hi = lo + span;
        if hi <= start || lo >= end {
            continue;
        }
        let e = t.entries[i].load(Ordering::Acquire);
        if e & PTE_PRESENT == 0 || level == 0 {
            continue;
        }
        let child = table_of(e);
        if lo >= floor && hi <= ceiling {
            t.entries[i].store(0, Ordering::Release);
            out.push(DetachedTable { ptr: child as *mut PageTable, level: level - 1 });
        } else if level > 1 {
            // SAFETY: reached from a present entry while the caller holds
            // mmap_lock for write, so no one detaches it concurrently.
            detach_level(unsafe { &*child }, level - 1, lo, start, end, floor, ceiling, out);
        }
    }
}

/// A page table cut out of the tree, which may still be walked by CPUs that
/// loaded its address before the cut. Only the shootdown path frees it: after
/// the TLB flush, behind a grace period.
#[must_use = "a detached table must be freed through the mmu_gather"]
pub struct DetachedTable {
    ptr: *mut PageTable,
    level: u32,
}

// SAFETY: the table is owned by this value; moving ownership across threads is fine.
unsafe impl Send for DetachedTable {}

impl DetachedTable {
    /// Frees the table and its subtables once every current walker is done.
    pub fn free_after_grace_period(self, phys: &std::sync::Arc<PhysMem>, guard: &Guard) {
        let ptr = self.ptr as usize;
        let level = self.level;
        let phys = phys.clone();
        // SAFETY (of the deferred closure's body): the table was detached
        // before this call, so after the grace period no walker holds it and
        // we own it uniquely.
        guard.defer(move || {
            fn free_rec(t: Box<PageTable>, level: u32, phys: &PhysMem) {
                if level > 0 {
                    for e in &t.entries {
                        let v = e.load(Ordering::Relaxed);
                        if v & PTE_PRESENT != 0 {
                            // SAFETY: a present non-leaf entry owns its child.
                            free_rec(unsafe { Box::from_raw(table_of(v) as *mut PageTable) }, level - 1, phys);
                        }
                    }
                }
                drop(t);
                phys.account_page_table(-1);
            }
            // SAFETY: see the comment above `guard.defer`.
            free_rec(unsafe { Box::from_raw(ptr as *mut PageTable) }, level, &phys);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phys::PhysConfig;

    #[test]
    fn alloc_walk_and_detach() {
        let phys = PhysMem::new(PhysConfig { bytes: 1 << 20, nodes: 1 }).unwrap();
        let mut pt = PageTables::new(&phys);
        let g = crossbeam_epoch::pin();
        assert!(pt.leaf(0x40_0000, &g).is_none());
        let t = pt.leaf_alloc(0x40_0000, &phys, &g);
        t.entry(index(0x40_1000, 0)).store(mk_pte(5, PTE_PRESENT), Ordering::Relaxed);
        let t2 = pt.leaf(0x40_1000, &g).unwrap();
        assert_eq!(pte_pfn(t2.entry(1).load(Ordering::Relaxed)), 5);
        assert_eq!(phys.stats().page_tables, 4);
        // A leaf in another 2 MiB needs only a new PTE table.
        pt.leaf_alloc(0x60_0000, &phys, &g);
        assert_eq!(phys.stats().page_tables, 5);
        t2.entry(1).store(0, Ordering::Relaxed);
        let mut out = Vec::new();
        pt.detach_tables(0x40_0000, 0x60_0000, 0x40_0000, 0x60_0000, &mut out);
        assert_eq!(out.len(), 1, "only the PTE table for [4M,6M) lies inside the gap");
        for d in out {
            d.free_after_grace_period(&phys, &g);
        }
        drop(g);
        let mut frames = Vec::new();
        pt.free_all(&phys, &mut frames);
        pt.release_root(&phys);
        assert!(frames.is_empty());
        assert_eq!(phys.quiesce().page_tables, 0);
    }
}
