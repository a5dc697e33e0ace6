//! Walking the tree: [`Leaf`] (a run of leaf entries of one table, readable
//! without a lock), [`PteGuard`] (the same run under the table's lock, the
//! only way to change a leaf entry) and [`Cursor`] (the leaves of a range, in
//! order, skipping what is not mapped), Linux's `walk_page_range`.
//!
//! All three borrow the [`PageTables`] and the grace-period guard for one
//! lifetime: a table a walk reached cannot be freed while anything derived
//! from it lives, because the only frees are dropping the tree (which needs
//! it unborrowed) and the deferred free of a detached table (which waits for
//! the guard).

use crossbeam_epoch::Guard;

use crate::sync::MutexGuard;
use crate::tlb::CpuSet;

use super::table::{Child, Table};
use super::{PageTables, Pte, PMD_SIZE, PTRS_PER_TABLE};
use crate::sync::Ordering;
use crate::PAGE_SHIFT;

/// Bytes covered by one entry at `level` (0 = PTE, 1 = PMD, 2 = PUD, 3 = PGD).
#[inline]
pub(super) const fn entry_span(level: u32) -> u64 {
    1 << (PAGE_SHIFT + 9 * level as u64)
}

/// The table index of `va` at `level`.
#[inline]
pub(super) const fn index(va: u64, level: u32) -> usize {
    ((va >> (PAGE_SHIFT + 9 * level as u64)) as usize) % PTRS_PER_TABLE
}

/// Where a walk for one address ended.
pub(super) enum Walk<'a> {
    /// At a table holding the address's leaf entry, at `level` (0 for a PTE
    /// table, 1 for a PMD table whose entry is a 2 MiB leaf).
    Leaf(&'a Table, u32),
    /// At an empty directory entry of `level`: nothing below is mapped.
    Hole(u32),
}

/// The leaf entries of `[start, end)` in one table, each covering
/// [`Leaf::entry_size`] bytes. Reads take no lock.
#[derive(Clone, Copy)]
pub(crate) struct Leaf<'a> {
    table: &'a Table,
    level: u32,
    start: u64,
    end: u64,
}

impl<'a> Leaf<'a> {
    pub(super) fn new(table: &'a Table, level: u32, start: u64, end: u64) -> Leaf<'a> {
        debug_assert!(start < end && index_span_ok(start, end));
        Leaf { table, level, start, end }
    }

    /// First address covered.
    #[inline]
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// One past the last address covered.
    #[inline]
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Whether this leaf's entries live in `table`.
    #[inline]
    pub(super) fn is_in(&self, table: &Table) -> bool {
        std::ptr::eq(self.table, table)
    }

    /// Bytes one entry maps: 4 KiB, or 2 MiB for a PMD leaf.
    #[inline]
    pub(crate) fn entry_size(&self) -> u64 {
        entry_span(self.level)
    }

    /// The same table's entries for `[start, end)`, clipped to the 2 MiB
    /// block of this leaf (a whole PTE table, or one PMD leaf).
    #[must_use]
    pub(crate) fn with_range(self, start: u64, end: u64) -> Leaf<'a> {
        let base = self.start & !(PMD_SIZE - 1);
        let (start, end) = (start.max(base), end.min(base + PMD_SIZE));
        Leaf::new(self.table, self.level, start, end)
    }

    /// The entry mapping `va`, read without the lock (Acquire, like a
    /// hardware walker: a page installed with Release is seen whole).
    #[inline]
    pub(crate) fn load(&self, va: u64) -> Pte {
        debug_assert!(self.start <= va && va < self.end);
        self.table.load(index(va, self.level), Ordering::Acquire)
    }

    /// The TLB fill's update, as a hardware walker sets the accessed and
    /// dirty bits: stores `filled` (`seen` with accessed, dirty or fill-owner
    /// bits added: [`Pte::filled`]) into the entry of `va` if it still holds
    /// `seen`, without the lock; false if it changed meanwhile. A clear of
    /// the entry (a swap under the lock) then either comes after it, and
    /// returns the fill's owner, or before it, and the fill fails and walks
    /// again.
    #[inline]
    pub(crate) fn set_filled(&self, va: u64, seen: Pte, filled: Pte) -> bool {
        // Only accessed, dirty and fill-owner bits added (`with_pfn` drops the owners).
        let ad = Pte::ACCESSED | Pte::DIRTY;
        let zero = crate::phys::Pfn::new(0);
        debug_assert_eq!((filled.with_pfn(zero).clear(ad), filled.pfn()), (seen.with_pfn(zero).clear(ad), seen.pfn()));
        #[cfg(loom)]
        if crate::tlb::broken::FILL_STORES.with(std::cell::Cell::get) {
            self.table.store(index(va, self.level), filled, Ordering::Release);
            return true;
        }
        self.table.compare_exchange(index(va, self.level), seen, filled).is_ok()
    }

    /// Every entry of the range with its address, read without the lock.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, Pte)> + 'a {
        let Leaf { table, level, start, end } = *self;
        entry_addrs(start, end, level).map(move |va| (va, table.load(index(va, level), Ordering::Acquire)))
    }

    /// Takes the table's lock: the returned guard may change the entries.
    #[inline]
    pub(crate) fn lock(&self) -> PteGuard<'a> {
        #[cfg(loom)]
        if self.table.freed.load(std::sync::atomic::Ordering::Relaxed) {
            crate::phys::hugetlb::lock::broken::USED_FREED_TABLE.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        PteGuard { _lock: self.table.lock(), leaf: *self, owners: CpuSet::EMPTY }
    }
}

/// True if `[start, end)` lies within one 2 MiB block (one PTE table, or
/// one PMD leaf).
fn index_span_ok(start: u64, end: u64) -> bool {
    start & !(PMD_SIZE - 1) == (end - 1) & !(PMD_SIZE - 1)
}

/// The first address of each entry of `level` that overlaps `[start, end)`.
fn entry_addrs(start: u64, end: u64, level: u32) -> impl Iterator<Item = u64> {
    let step = entry_span(level);
    std::iter::successors(Some(start), move |&va| (va & !(step - 1)).checked_add(step)).take_while(move |&va| va < end)
}

/// A [`Leaf`] under its table's lock. Only through it do leaf entries change,
/// and the change is ordered before any lock-free reader that sees it
/// (stores are Release).
#[must_use = "the guard holds the PTE lock; dropping it unlocks"]
pub(crate) struct PteGuard<'a> {
    _lock: MutexGuard<'a, ()>,
    leaf: Leaf<'a>,
    /// The fill owners of the present entries this guard changed, as the
    /// changes returned them ([`PteGuard::take_fill_owners`]).
    owners: CpuSet,
}

impl<'a> PteGuard<'a> {
    /// The entry mapping `va` (in the guard's range).
    #[inline]
    pub(crate) fn get(&self, va: u64) -> Pte {
        debug_assert!(self.leaf.start <= va && va < self.leaf.end);
        // Relaxed: the lock orders it after every locked store; the only
        // lock-free store (`set_filled`) adds bits to a value we then see,
        // and every change below is a compare-exchange against it.
        self.leaf.table.load(index(va, self.leaf.level), Ordering::Relaxed)
    }

    /// A new reference on the page the entry of `va` maps (present or
    /// `PROT_NONE`; `None` for any other entry). The only way to take one
    /// from an entry: the entry's own reference cannot go while its lock is
    /// held, where a reference taken on a frame number read without the lock
    /// may land on a page already freed (and reused).
    #[inline]
    pub(crate) fn page<'p>(&self, va: u64, phys: &'p crate::phys::PhysMem) -> Option<crate::phys::FrameRef<'p>> {
        let pte = self.get(va);
        pte.has_frame().then(|| phys.get(pte.pfn()))
    }

    /// Stores `pte` into the entry mapping `va`, as [`PteGuard::replace`].
    #[inline]
    pub(crate) fn set(&mut self, va: u64, pte: Pte) {
        self.replace(va, pte);
    }

    /// Stores `pte` into the entry mapping `va` and returns what it held,
    /// including the accessed, dirty and fill-owner bits a walker set up to
    /// the change. If the old entry was present, its fill owners are added
    /// to the guard's ([`PteGuard::take_fill_owners`]) and, if `pte` is
    /// present too, to `pte`'s: a CPU that cached the old entry stays
    /// recorded in the new one (a widening, which no flush follows; a
    /// narrowing keeps them too, harmlessly).
    ///
    /// A compare-exchange against the value last seen, so that no bit a
    /// fill sets in between is lost: each retry follows a fill that added
    /// a bit (accessed, dirty, its owner, or several owners), so there are
    /// at most four. Nothing changes a non-present entry without the lock:
    /// that is a plain store.
    #[inline]
    pub(crate) fn replace(&mut self, va: u64, pte: Pte) -> Pte {
        debug_assert!(self.leaf.start <= va && va < self.leaf.end);
        let (table, i) = (self.leaf.table, index(va, self.leaf.level));
        let mut old = self.get(va);
        if !old.is_present() {
            table.store(i, pte, Ordering::Release);
            return old;
        }
        loop {
            let new = if pte.is_present() { pte.with_fill_owners_of(old) } else { pte };
            match table.compare_exchange(i, old, new) {
                Ok(()) => break,
                Err(cur) => old = cur,
            }
        }
        #[cfg(loom)]
        if crate::tlb::broken::CLEAR_SKIPS_OWNERS.with(std::cell::Cell::get) {
            return old;
        }
        old.add_fill_owners(&mut self.owners);
        old
    }

    /// The fill owners of the present entries this guard has changed so
    /// far (since the last take): the CPUs that may cache what the changes
    /// removed or narrowed, the targets of their shootdown. Taken, so that
    /// a guard reused for another change starts empty.
    #[inline]
    pub(crate) fn take_fill_owners(&mut self) -> CpuSet {
        std::mem::take(&mut self.owners)
    }

    /// Calls `f(va, pte)` for each entry of the range in order and stores
    /// what it returns, when it returns `Some`. The store is a swap, so an
    /// accessed or dirty bit a walker sets meanwhile is not lost silently:
    /// the caller decided on the entry as it was without it.
    pub(crate) fn update(&mut self, mut f: impl FnMut(u64, Pte) -> Option<Pte>) {
        let Leaf { start, end, level, .. } = self.leaf;
        for va in entry_addrs(start, end, level) {
            if let Some(new) = f(va, self.get(va)) {
                self.replace(va, new);
            }
        }
    }
}

/// The leaves of a range in address order, Linux's `walk_page_range`: empty
/// directory entries are skipped a whole span at a time, so a sparse range of
/// terabytes costs a few loads. With [`PageTables::leaves_alloc`] missing
/// tables are allocated on the way instead.
pub(crate) struct Cursor<'a> {
    pt: &'a PageTables,
    guard: &'a Guard,
    va: u64,
    end: u64,
    alloc: bool,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(pt: &'a PageTables, guard: &'a Guard, start: u64, end: u64, alloc: bool) -> Cursor<'a> {
        Cursor { pt, guard, va: start, end, alloc }
    }
}

impl<'a> Iterator for Cursor<'a> {
    type Item = Leaf<'a>;

    fn next(&mut self) -> Option<Leaf<'a>> {
        while self.va < self.end {
            let va = self.va;
            let walk = if self.alloc {
                let (t, level) = self.pt.walk_alloc(va, self.guard);
                Walk::Leaf(t, level)
            } else {
                self.pt.walk(va, self.guard)
            };
            match walk {
                Walk::Leaf(table, level) => {
                    // A PTE table, or a PMD leaf: 2 MiB either way (the next
                    // PMD entry may be a table, so a PMD leaf is yielded alone).
                    let stop = (va & !(PMD_SIZE - 1)).checked_add(PMD_SIZE).map_or(self.end, |e| e.min(self.end));
                    self.va = stop;
                    return Some(Leaf::new(table, level, va, stop));
                }
                Walk::Hole(level) => {
                    let span = entry_span(level);
                    match (va & !(span - 1)).checked_add(span) {
                        Some(next) => self.va = next,
                        None => self.va = self.end,
                    }
                }
            }
        }
        None
    }
}

/// Decodes the walk through directory `table` at `level` for `va`.
pub(super) fn step(table: &Table, va: u64, level: u32) -> Child {
    table.child(index(va, level))
}
