//! Page tables: the x86-64 4-level radix tree of 512-entry tables.
//!
//! # Layout
//!
//! A directory entry (PGD, PUD, PMD) leads to the next table, or at the PMD
//! level may be a 2 MiB leaf; a PTE-table entry is a leaf ([`Pte`]: a present
//! page, a `PROT_NONE` page, a guard marker, a migration entry, or nothing).
//! Each table carries its own lock (Linux's split PTE lock; at the PMD level
//! the split PMD lock that guards 2 MiB leaves).
//!
//! # Protocol
//!
//! * A leaf entry changes only under its table's lock, through a
//!   [`PteGuard`]; the one exception is the hardware walker's setting of the
//!   accessed and dirty bits ([`Leaf::set_accessed`]), a compare-exchange on
//!   the value it read, as on x86.
//! * A walk takes no lock, like a hardware walker: it runs under an epoch
//!   guard, and everything it returns borrows both the tree and the guard.
//! * Tables are allocated on demand by a compare-exchange on the empty
//!   directory entry (the loser frees its table) and leave the tree only by
//!   [`PageTables::detach_tables`] — serialized by the tree's own detach lock
//!   and, in every caller, done under `mmap_lock` (for write, or for read
//!   after an unmap downgraded it: writers, the only ones who add VMAs,
//!   wait meanwhile) after the entries below were zapped — as a
//!   [`DetachedTable`], which is freed only after the TLB flush and a grace
//!   period.
//! * Every loop over leaf entries is a [`Cursor`] (the leaves of a range) or
//!   a single [`Leaf`]; nothing outside this module indexes a table.
//!
//! # Coming mechanisms
//!
//! A 2 MiB leaf (hugetlb) is a [`Leaf`] at level 1 whose entries step by
//! 2 MiB, so every cursor user already visits it as one entry. A PMD table
//! shared between address spaces (hugetlb PMD sharing) will be a table with a
//! share count that detach drops instead of freeing. A migration entry is a
//! non-present [`PteKind::Migration`] that keeps the frame number.

mod cursor;
mod pte;
mod table;

// The loom models' broken switches: `sync/broken.rs`.
#[cfg(loom)]
pub(crate) use crate::sync::broken::pgtable as broken;

use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_epoch::Guard;

use crate::sync::Mutex;

pub(crate) use cursor::{Cursor, Leaf, PteGuard};
pub(crate) use pte::{Pte, PteKind};

use crate::phys::{FrameRef, PhysMem};
use crate::PAGE_SIZE;
use cursor::{entry_span, index, step, Walk};
use table::{Child, Table};

/// Entries per table.
pub(crate) const PTRS_PER_TABLE: usize = 512;
/// Bytes mapped by one PTE table (and by one PMD leaf): 2 MiB.
pub(crate) const PMD_SIZE: u64 = PAGE_SIZE * PTRS_PER_TABLE as u64;
// The one huge page size (`phys/hugetlb.rs`) is a PMD leaf.
const _: () = assert!(crate::phys::hugetlb::HPAGE_SIZE == PMD_SIZE);
/// Bytes one PUD entry maps: the window a PMD table covers.
pub(crate) const PUD_SIZE: u64 = PMD_SIZE * PTRS_PER_TABLE as u64;
/// Bytes one top-level entry maps: the region a PUD table covers, 512 GiB
/// (the P4D level folded, as on 4-level x86-64).
pub(crate) const PGDIR_SIZE: u64 = PUD_SIZE * PTRS_PER_TABLE as u64;

/// The 4-level tree of one address space.
pub(crate) struct PageTables {
    root: NonNull<Table>,
    phys: Arc<PhysMem>,
    /// Serializes detaches: two of them must never take the same table.
    detach: Mutex<()>,
    /// Set once a PMD table of this tree was shared with another tree
    /// (either way), so the unshare checks cost nothing in trees that never
    /// shared.
    ever_shared: crate::sync::AtomicBool,
}

// SAFETY: the tree is shared through atomics and per-table locks; `root` is
// owned by this value like a `Box`.
unsafe impl Send for PageTables {}
// SAFETY: as for `Send`.
unsafe impl Sync for PageTables {}

impl PageTables {
    /// An empty tree: just the PGD.
    pub(crate) fn new(phys: &Arc<PhysMem>) -> PageTables {
        phys.account_page_table(1);
        let root = NonNull::from(Box::leak(Table::new_boxed()));
        PageTables {
            root,
            phys: phys.clone(),
            detach: Mutex::new(()),
            ever_shared: crate::sync::AtomicBool::new(false),
        }
    }

    fn root(&self) -> &Table {
        // SAFETY: the root is allocated in `new`, freed only in `drop`, and
        // never detached.
        unsafe { self.root.as_ref() }
    }

    /// Walks to the table holding `va`'s leaf entry.
    fn walk<'a>(&'a self, va: u64, _guard: &'a Guard) -> Walk<'a> {
        let mut table = self.root();
        for level in (1..=3).rev() {
            match step(table, va, level) {
                Child::None => return Walk::Hole(level),
                Child::Leaf if level == 1 => return Walk::Leaf(table, 1),
                Child::Leaf => unreachable!("no leaf above the PMD level is ever made"),
                // SAFETY: a table reached from a present entry is freed only
                // (1) after it is detached, behind a grace period that
                // `_guard` holds open for as long as 'a, or (2) when the tree
                // is dropped, which needs `self` unborrowed for 'a.
                Child::Table(t) => table = unsafe { t.as_ref() },
            }
        }
        Walk::Leaf(table, 0)
    }

    /// [`Self::walk`], allocating missing tables.
    fn walk_alloc<'a>(&'a self, va: u64, guard: &'a Guard) -> (&'a Table, u32) {
        self.walk_alloc_to(va, 0, guard)
    }

    /// [`Self::walk_alloc`] that stops at the table of `bottom` (0: the PTE
    /// table; 1: the PMD table, whose entry for `va` may be a 2 MiB leaf).
    fn walk_alloc_to<'a>(&'a self, va: u64, bottom: u32, _guard: &'a Guard) -> (&'a Table, u32) {
        let mut table = self.root();
        for level in (bottom + 1..=3).rev() {
            let mut child = step(table, va, level);
            if let Child::None = child {
                let new = NonNull::from(Box::leak(Table::new_boxed()));
                match table.install_child(index(va, level), new) {
                    Ok(()) => {
                        self.phys.account_page_table(1);
                        child = Child::Table(new);
                    }
                    Err(winner) => {
                        // SAFETY: `new` came from Box::leak above and was never published.
                        drop(unsafe { Box::from_raw(new.as_ptr()) });
                        child = winner;
                    }
                }
            }
            match child {
                Child::None => unreachable!("an entry that lost its install race holds a table"),
                Child::Leaf if level == 1 => return (table, 1),
                Child::Leaf => unreachable!("no leaf above the PMD level is ever made"),
                // SAFETY: as in `walk`.
                Child::Table(t) => table = unsafe { t.as_ref() },
            }
        }
        (table, bottom)
    }

    /// The leaf entry of `va`, if its table exists.
    #[inline]
    pub(crate) fn leaf<'a>(&'a self, va: u64, guard: &'a Guard) -> Option<Leaf<'a>> {
        match self.walk(va, guard) {
            Walk::Leaf(t, level) => Some(Leaf::new(t, level, va & !(entry_span(level) - 1), page_end(va, level))),
            Walk::Hole(_) => None,
        }
    }

    /// The leaf entry of `va`, allocating missing tables. Concurrent callers
    /// race with compare-exchange; the loser frees its table.
    pub(crate) fn leaf_alloc<'a>(&'a self, va: u64, guard: &'a Guard) -> Leaf<'a> {
        let (t, level) = self.walk_alloc(va, guard);
        Leaf::new(t, level, va & !(entry_span(level) - 1), page_end(va, level))
    }

    /// The PMD entry of `va` as a 2 MiB leaf (Linux's `huge_pte_alloc` for
    /// a PMD-sized hstate), allocating the PUD and PMD tables: empty or a
    /// huge entry, to be set under the PMD table's lock. `None` if a PTE
    /// table sits there (no hugetlb VMA ever has one: its range is 2 MiB
    /// aligned, so the unmap that freed it for the VMA detached any).
    pub(crate) fn pmd_leaf_alloc<'a>(&'a self, va: u64, guard: &'a Guard) -> Option<Leaf<'a>> {
        let (t, level) = self.walk_alloc_to(va, 1, guard);
        if let Child::Table(_) = step(t, va, level) {
            return None;
        }
        Some(Leaf::new(t, level, va & !(PMD_SIZE - 1), page_end(va, level)))
    }

    /// The PMD table linked by the PUD entry of `va`, if any.
    fn pmd_table<'a>(&'a self, va: u64, guard: &'a Guard) -> Option<&'a Table> {
        // SAFETY: as in `walk`: freed only behind `guard`'s grace period or
        // with the tree, which is borrowed for 'a.
        self.pmd_table_ptr(va, guard).map(|pmd| unsafe { pmd.as_ref() })
    }

    /// The PMD table the PUD entry of `va` links, as the entry's own
    /// pointer: a link made from it keeps the provenance with which the
    /// table's last user frees it (a pointer made from a `&Table` would
    /// be read-only).
    fn pmd_table_ptr(&self, va: u64, _guard: &Guard) -> Option<NonNull<Table>> {
        let Child::Table(pud) = step(self.root(), va, 3) else { return None };
        // SAFETY: as in `walk`: freed only behind `_guard`'s grace period or
        // with the tree, which the caller borrows.
        let pud = unsafe { pud.as_ref() };
        match step(pud, va, 2) {
            Child::Table(pmd) => Some(pmd),
            Child::None | Child::Leaf => None,
        }
    }

    /// True if the PUD entry of `va` links a PMD table that another address
    /// space links too (`hugetlb_pmd_shared`).
    pub(crate) fn pmd_is_shared(&self, va: u64, guard: &Guard) -> bool {
        self.pmd_table(va, guard).is_some_and(Table::is_shared)
    }

    /// True if a PMD table of this tree was ever shared with another tree.
    pub(crate) fn ever_shared(&self) -> bool {
        self.ever_shared.load(crate::sync::Ordering::Relaxed)
    }

    /// Whether the PUD entry of `va` still links the PMD table holding
    /// `leaf` (a PMD leaf from [`Self::pmd_leaf_alloc`]): the validation of
    /// a hugetlb fault that holds no lock against unshare. Call with the
    /// leaf's table locked ([`Leaf::lock`]): an unshare clears the link
    /// under that lock, so the answer holds until the guard is dropped.
    pub(crate) fn pmd_links(&self, va: u64, leaf: &Leaf<'_>, guard: &Guard) -> bool {
        self.pmd_table(va, guard).is_some_and(|t| leaf.is_in(t))
    }

    /// True if the top-level entry of `va` links a PUD table (`!pgd_none`).
    pub(crate) fn has_pud_table(&self, va: u64) -> bool {
        matches!(step(self.root(), va, 3), Child::Table(_))
    }

    /// True if the PUD entry of `va` links a PMD table (`!pud_none`).
    pub(crate) fn has_pmd_table(&self, va: u64, guard: &Guard) -> bool {
        self.pmd_table(va, guard).is_some()
    }

    /// `huge_pmd_share`'s link: makes this tree's empty PUD entry of `va`
    /// point at the PMD table that `source`'s PUD entry of `sva` links, with
    /// a share count on it (`ptdesc_pmd_pts_inc` + `pud_populate`).
    /// `source` may be this tree (two VMAs of one address space): the
    /// count is per link, not per tree, so each entry unshares or frees
    /// its own link. False,
    /// changing nothing, if `source` has no PMD table there or this entry
    /// is no longer empty. `va` and `sva` must lie at the same offset within
    /// their 1 GiB (`pmd_index` equal), so each entry maps the same page for
    /// both. The shared table counts once in the page-table accounting.
    ///
    /// The caller holds the lock that keeps `source`'s link from being
    /// dropped meanwhile (the file's `i_mmap` lock, which every unshare and
    /// every removal of a shareable table takes for write).
    pub(crate) fn pmd_share_from(&self, va: u64, source: &PageTables, sva: u64, guard: &Guard) -> bool {
        debug_assert_eq!(va % entry_span(2), sva % entry_span(2));
        let Some(spmd_ptr) = source.pmd_table_ptr(sva, guard) else { return false };
        // SAFETY: as in `walk`: `source` is borrowed and the table is freed
        // only behind `guard`'s grace period.
        let spmd = unsafe { spmd_ptr.as_ref() };
        let (pud, _) = self.walk_alloc_to(va, 2, guard);
        // Count before publishing: a sharer that sees the link must never
        // find the table counted as exclusive.
        spmd.share_inc();
        // Relaxed: read by this tree's and `source`'s unshare checks, which
        // come after this fault (its `mmap_lock` or VMA reference) and
        // after the source VMA's read reference held here is dropped (the
        // detach before any unshare waits for it), or under `i_mmap`.
        source.ever_shared.store(true, crate::sync::Ordering::Relaxed);
        match pud.install_child(index(va, 2), spmd_ptr) {
            Ok(()) => {
                self.ever_shared.store(true, crate::sync::Ordering::Relaxed);
                true
            }
            Err(_) => {
                let last = spmd.share_dec();
                debug_assert!(!last, "source still links the table");
                false
            }
        }
    }

    /// `__huge_pmd_unshare`'s page-table half: if the PUD entry of `va`
    /// links a shared PMD table, clears it and drops this tree's share
    /// (`pud_clear` + `ptdesc_pmd_pts_dec`). The caller flushes this
    /// address space's TLB for the whole 1 GiB before it drops the file's
    /// `i_mmap` lock (CVE-2021-4002), and frees a returned table (when the
    /// other users unshared concurrently and this one held the last link)
    /// through the shootdown path.
    pub(crate) fn pmd_unshare(&self, va: u64) -> PmdUnshare {
        let _serial = self.detach.lock();
        let Child::Table(pud) = step(self.root(), va, 3) else { return PmdUnshare::NotShared };
        // SAFETY: as in `walk`; the detach lock keeps it linked meanwhile.
        let pud = unsafe { pud.as_ref() };
        let Child::Table(pmd) = step(pud, va, 2) else { return PmdUnshare::NotShared };
        // SAFETY: as above.
        if !unsafe { pmd.as_ref() }.is_shared() {
            return PmdUnshare::NotShared;
        }
        {
            // Under the table's lock, as Linux's unshare runs under the
            // shared table's split PMD lock: a fault that checks its link
            // under that lock ([`Self::pmd_links`]) before it installs an
            // entry either installs before the link goes, or sees it gone.
            // SAFETY: as above.
            let _ptl = unsafe { pmd.as_ref() }.lock();
            pud.take_child(index(va, 2));
        }
        // SAFETY: reached from the entry just cleared: this tree's link, which
        // we now hold as a value, keeps it alive until the decrement.
        if unsafe { pmd.as_ref() }.share_dec() {
            // Every other user left between our check and our decrement:
            // the table is ours alone and out of every tree.
            return PmdUnshare::Last(DetachedTable { table: pmd, level: 1 });
        }
        PmdUnshare::Unshared
    }

    /// [`Self::leaf_alloc`] for an entry of `size` bytes: a PTE for 4 KiB,
    /// a PMD leaf ([`Self::pmd_leaf_alloc`]) for 2 MiB.
    pub(crate) fn leaf_alloc_sized<'a>(&'a self, va: u64, size: u64, guard: &'a Guard) -> Option<Leaf<'a>> {
        if size == PMD_SIZE {
            self.pmd_leaf_alloc(va, guard)
        } else {
            Some(self.leaf_alloc(va, guard))
        }
    }

    /// The leaves overlapping `[start, end)` whose tables exist.
    pub(crate) fn leaves<'a>(&'a self, start: u64, end: u64, guard: &'a Guard) -> Cursor<'a> {
        Cursor::new(self, guard, start, end, false)
    }

    /// The leaves of `[start, end)`, allocating missing tables.
    pub(crate) fn leaves_alloc<'a>(&'a self, start: u64, end: u64, guard: &'a Guard) -> Cursor<'a> {
        Cursor::new(self, guard, start, end, true)
    }

    /// Calls `f(va, pte)` for each leaf entry of `[start, end)` whose table
    /// exists, under that table's lock, storing what `f` returns when `Some`.
    pub(crate) fn update_range(&self, start: u64, end: u64, mut f: impl FnMut(u64, Pte) -> Option<Pte>) {
        let guard = crossbeam_epoch::pin();
        for leaf in self.leaves(start, end, &guard) {
            leaf.lock().update(&mut f);
        }
    }

    /// Detaches every table that maps only addresses inside `[floor, ceiling)`
    /// and overlaps `[start, end)`, Linux's `free_pgtables`. Their leaf
    /// entries must already be zapped (a frame left behind is put when the
    /// table is freed). The detached tables go to `out`, to be freed after
    /// the TLB flush and a grace period.
    pub(crate) fn detach_tables(&self, start: u64, end: u64, floor: u64, ceiling: u64, out: &mut Vec<DetachedTable>) {
        if start >= end {
            return;
        }
        let _serial = self.detach.lock();
        detach_level(self.root(), 3, 0, &Span { start, end, floor, ceiling }, out);
    }
}

/// What [`PageTables::pmd_unshare`] did.
#[must_use = "an unshare needs the TLB flush of the whole PUD range"]
pub(crate) enum PmdUnshare {
    /// The entry did not link a shared table: nothing changed.
    NotShared,
    /// This tree no longer links the table; the other users still do.
    Unshared,
    /// This tree held the last link: the table is detached and must be
    /// freed after the flush and a grace period.
    Last(DetachedTable),
}

/// One past the last byte of the entry of `level` that maps `va`.
fn page_end(va: u64, level: u32) -> u64 {
    (va & !(entry_span(level) - 1)) + entry_span(level)
}

struct Span {
    start: u64,
    end: u64,
    floor: u64,
    ceiling: u64,
}

fn detach_level(t: &Table, level: u32, base: u64, span: &Span, out: &mut Vec<DetachedTable>) {
    let size = entry_span(level);
    // Only the entries that overlap the span: a munmap of a small range
    // looks at a handful of entries per level, not 512.
    let lo_va = span.start.max(base);
    let hi_va = span.end.min(base + size * PTRS_PER_TABLE as u64);
    if lo_va >= hi_va {
        return;
    }
    let (first, last) = (((lo_va - base) / size) as usize, ((hi_va - 1 - base) / size) as usize);
    for i in first..=last {
        let lo = base + i as u64 * size;
        let hi = lo + size;
        let Child::Table(child) = t.child(i) else { continue };
        if lo >= span.floor && hi <= span.ceiling {
            t.take_child(i);
            out.push(DetachedTable { table: child, level: level - 1 });
        } else if level > 1 {
            // SAFETY: reached from a present entry while the detach lock is
            // held, so no one detaches (and frees) it concurrently.
            detach_level(unsafe { child.as_ref() }, level - 1, lo, span, out);
        }
    }
}

/// [`DetachedTable::tables_up_to`] for `table` at `level`.
///
/// # Safety
///
/// `table` stays allocated for the call.
unsafe fn count_tables(table: NonNull<Table>, level: u32, limit: usize) -> usize {
    let mut n = 1;
    if level == 0 {
        return n;
    }
    // SAFETY: allocated (the caller's contract).
    let t = unsafe { table.as_ref() };
    for i in 0..PTRS_PER_TABLE {
        if n >= limit {
            break;
        }
        if let Child::Table(c) = t.child(i) {
            // SAFETY: a present directory entry of a table that stays
            // allocated keeps its child allocated.
            n += unsafe { count_tables(c, level - 1, limit - n) };
        }
    }
    n
}

/// Frees `table` at `level` and every table below it, putting the frames
/// that leaf entries still hold. A shared PMD table only loses the caller's
/// link; its last user frees it. With `defer`, a PMD table whose last link
/// the caller held is freed after a grace period of that guard instead.
///
/// # Safety
///
/// The caller owns its link to `table`: the link is out of every tree and
/// no walker that followed it can still hold the table.
unsafe fn free_table(table: NonNull<Table>, level: u32, phys: &PhysMem, defer: Option<(&Guard, &Arc<PhysMem>)>) {
    // SAFETY: alive until freed below (the caller's contract).
    if level == 1 && !unsafe { table.as_ref() }.share_dec() {
        // A shared PMD table: another address space still links it and
        // frees it, with its entries, when it drops the last link.
        return;
    }
    if let (1, Some((guard, phys))) = (level, defer) {
        // The last link, out of every tree: no one can link it again, and
        // the deferred free's own `share_dec` finds it exclusive.
        DetachedTable { table, level }.free_after_grace_period(phys, guard);
        return;
    }
    #[cfg(loom)]
    if level == 1 && crate::phys::hugetlb::lock::broken::free_at_once() {
        // The model's "free": marked and left allocated (and its entries'
        // references held), so that a walker still holding it is seen.
        // SAFETY: alive (the caller's contract).
        unsafe { table.as_ref() }.freed.store(true, std::sync::atomic::Ordering::Relaxed);
        phys.account_page_table(-1);
        return;
    }
    // SAFETY: owned uniquely (the caller's contract), made by Box::leak.
    let t = unsafe { Box::from_raw(table.as_ptr()) };
    for i in 0..PTRS_PER_TABLE {
        if level == 0 {
            put_entry_frame(phys, t.load(i, crate::sync::Ordering::Relaxed));
            continue;
        }
        match t.child(i) {
            // SAFETY: a present directory entry owns its child, so we own it too.
            Child::Table(c) => unsafe { free_table(c, level - 1, phys, defer) },
            Child::Leaf => put_entry_frame(phys, t.load(i, crate::sync::Ordering::Relaxed)),
            Child::None => {}
        }
    }
    drop(t);
    phys.account_page_table(-1);
}

/// Puts the reference a leaf entry of a table being freed holds, if any,
/// and, for a 2 MiB leaf, its count in the huge page's mapcount.
fn put_entry_frame(phys: &PhysMem, pte: Pte) {
    if pte.has_frame() {
        if pte.has(Pte::HUGE) {
            phys.desc(pte.pfn()).dec_mapcount();
        }
        drop(FrameRef::from_raw(phys, pte.pfn()));
    }
}

impl Drop for PageTables {
    /// exit_mmap's `free_pgtables` with the frames: no CPU is attached and no
    /// walker can reach a dying tree, so nothing waits for a flush.
    fn drop(&mut self) {
        // A PMD table this tree shared may still be reached by a former
        // sharer's fault that walked its own tree before it unshared and
        // holds no lock against the unshare (the lock-free hugetlb policy):
        // such a walker is inside an epoch guard, so in a tree that ever
        // shared, each PMD table whose last link this drop holds is freed
        // after a grace period (its link goes at once).
        let guard = self.ever_shared().then(crossbeam_epoch::pin);
        #[cfg(loom)]
        let guard = guard.filter(|_| !crate::phys::hugetlb::lock::broken::free_at_once());
        let defer = guard.as_ref().map(|g| (g, &self.phys));
        // SAFETY: `&mut self`: nothing borrows the tree, so no walk of it
        // is in progress, and the root is never detached.
        unsafe { free_table(self.root, 3, &self.phys, defer) };
    }
}

/// A page table cut out of the tree, which may still be walked by CPUs that
/// loaded its address before the cut. Only the shootdown path frees it: after
/// the TLB flush, behind a grace period.
#[must_use = "a detached table must be freed through the mmu_gather"]
pub(crate) struct DetachedTable {
    table: NonNull<Table>,
    level: u32,
}

// SAFETY: the table is owned by this value; moving ownership across threads is fine.
unsafe impl Send for DetachedTable {}

impl DetachedTable {
    /// Frees the table and its subtables once every current walker is done.
    pub(crate) fn free_after_grace_period(self, phys: &Arc<PhysMem>, guard: &Guard) {
        let phys = phys.clone();
        // SAFETY: the table was detached before `defer`, so once the grace
        // period ends no walker holds it; `self` is its only owner.
        crate::sync::rcu::call_rcu(guard, move || unsafe { self.free_now(&phys) });
    }

    /// How many tables freeing this one would free, itself and its
    /// subtables, counted no further than `limit`: what a free costs,
    /// without scanning more than `limit` tables to find out. A shared PMD
    /// table counts as one (freeing it may only drop a link).
    pub(crate) fn tables_up_to(&self, limit: usize) -> usize {
        // SAFETY: `self` owns the table (detached, so no tree links it
        // and no one frees it meanwhile); walkers may still read it, and
        // other sharers of a PMD table change its leaf entries only, all
        // through atomics, so reading its entries is sound.
        unsafe { count_tables(self.table, self.level, limit) }
    }

    /// Frees the table now.
    ///
    /// # Safety
    ///
    /// No walker may still hold the table (a grace period has passed since
    /// it was detached).
    pub(crate) unsafe fn free_now(self, phys: &PhysMem) {
        // SAFETY: the caller's contract, and `self` owned the table.
        unsafe { free_table(self.table, self.level, phys, None) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phys::PhysConfig;

    fn arena() -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(1 << 20)).unwrap()
    }

    #[test]
    fn alloc_walk_and_detach() {
        let phys = arena();
        let pt = PageTables::new(&phys);
        let g = crossbeam_epoch::pin();
        assert!(pt.leaf(0x40_0000, &g).is_none());
        let l = pt.leaf_alloc(0x40_1000, &g);
        l.lock().set(0x40_1000, Pte::page(phys.zero_pfn(), 0));
        let l2 = pt.leaf(0x40_1000, &g).unwrap();
        assert_eq!(l2.load(0x40_1000).kind(), PteKind::Page(phys.zero_pfn()));
        assert_eq!(phys.stats().page_tables, 4);
        // A leaf in another 2 MiB needs only a new PTE table.
        pt.leaf_alloc(0x60_0000, &g);
        assert_eq!(phys.stats().page_tables, 5);
        l2.lock().set(0x40_1000, Pte::NONE);
        let mut out = Vec::new();
        pt.detach_tables(0x40_0000, 0x60_0000, 0x40_0000, 0x60_0000, &mut out);
        assert_eq!(out.len(), 1, "only the PTE table for [4M,6M) lies inside the gap");
        for d in out {
            d.free_after_grace_period(&phys, &g);
        }
        drop(g);
        drop(pt);
        assert_eq!(phys.quiesce().page_tables, 0);
    }

    #[test]
    fn a_cursor_visits_existing_leaves_in_order_and_skips_holes() {
        let phys = arena();
        let pt = PageTables::new(&phys);
        let g = crossbeam_epoch::pin();
        for va in [0x1000, 0x20_3000, 0x40_0000_0000] {
            pt.leaf_alloc(va, &g).lock().set(va, Pte::GUARD_MARKER);
        }
        let seen: Vec<(u64, u64)> = pt.leaves(0, 1 << 47, &g).map(|l| (l.start(), l.end())).collect();
        assert_eq!(seen, vec![(0, 0x20_0000), (0x20_0000, 0x40_0000), (0x40_0000_0000, 0x40_0020_0000)]);
        let guards: Vec<u64> = pt
            .leaves(0x800, 1 << 47, &g)
            .flat_map(|l| l.iter())
            .filter(|(_, p)| p.is_guard())
            .map(|(va, _)| va)
            .collect();
        assert_eq!(guards, vec![0x1000, 0x20_3000, 0x40_0000_0000]);
        // A range ending at the top of the address space does not overflow.
        assert_eq!(pt.leaves(u64::MAX - 0x1fff, u64::MAX, &g).count(), 0);
        let mut cleared = 0;
        pt.update_range(0, 1 << 47, |_, p| {
            cleared += p.is_guard() as u32;
            p.is_guard().then_some(Pte::NONE)
        });
        assert_eq!(cleared, 3);
        assert!(pt.leaves(0, 1 << 47, &g).flat_map(|l| l.iter()).all(|(_, p)| p.is_none()));
    }

    #[test]
    fn a_shared_pmd_table_counts_once_and_is_freed_once_by_its_last_user() {
        const GIB: u64 = 1 << 30;
        for last_unshares in [false, true] {
            let phys = arena();
            let (a, b, c) = (PageTables::new(&phys), PageTables::new(&phys), PageTables::new(&phys));
            let g = crossbeam_epoch::pin();
            // The entry holds the frame's reference from here on.
            let pfn = phys.alloc(0).expect("a frame").into_raw();
            let leaf = a.pmd_leaf_alloc(GIB + 0x20_0000, &g).expect("a PMD entry");
            leaf.lock().set(GIB + 0x20_0000, Pte::page(pfn, Pte::HUGE | Pte::WRITE));
            phys.desc(pfn).inc_mapcount();
            assert_eq!(phys.stats().page_tables, 3 + 2);
            assert!(!b.pmd_share_from(3 * GIB, &a, 0x4000_0000_0000, &g), "no table at the source");
            assert!(b.pmd_share_from(3 * GIB, &a, GIB, &g));
            assert!(c.pmd_share_from(5 * GIB, &a, GIB, &g));
            assert!(!c.pmd_share_from(5 * GIB, &a, GIB, &g), "the entry is taken");
            assert_eq!(phys.stats().page_tables, 3 + 2 + 1 + 1, "one PUD table each, one PMD table in all");
            assert!(a.pmd_is_shared(GIB, &g) && b.pmd_is_shared(3 * GIB, &g));
            let seen = b.leaf(3 * GIB + 0x20_0000, &g).expect("the shared leaf").load(3 * GIB + 0x20_0000);
            assert_eq!(seen.pfn(), pfn);
            assert!(matches!(b.pmd_unshare(3 * GIB), PmdUnshare::Unshared));
            assert!(matches!(b.pmd_unshare(3 * GIB), PmdUnshare::NotShared), "nothing left to unshare");
            assert!(b.leaf(3 * GIB, &g).is_none());
            drop(b);
            if last_unshares {
                // `a` leaves first: `c` is left the only user, still linked.
                drop(a);
                assert!(!c.pmd_is_shared(5 * GIB, &g));
                assert!(matches!(c.pmd_unshare(5 * GIB), PmdUnshare::NotShared), "exclusive: nothing to unshare");
                assert_eq!(c.leaf(5 * GIB + 0x20_0000, &g).unwrap().load(5 * GIB + 0x20_0000).pfn(), pfn);
                drop(c);
            } else {
                drop(c);
                assert!(!a.pmd_is_shared(GIB, &g));
                drop(a);
            }
            drop(g);
            let s = phys.quiesce();
            assert_eq!((s.page_tables, s.frames_used), (0, 0), "the table and its frame went once");
        }
    }

    #[test]
    fn a_pmd_leaf_is_one_entry_of_two_mib() {
        let phys = arena();
        let pt = PageTables::new(&phys);
        let g = crossbeam_epoch::pin();
        // Build the path to a PMD table, then make its entry for [2M, 4M) a leaf.
        pt.leaf_alloc(0, &g);
        let pmd = match pt.walk(0, &g) {
            Walk::Leaf(_, 0) => {
                let mut t = pt.root();
                for level in [3, 2] {
                    let Child::Table(c) = step(t, 0, level) else { panic!("path was allocated") };
                    // SAFETY: reached under `g`, tree alive.
                    t = unsafe { c.as_ref() };
                }
                t
            }
            _ => panic!("leaf_alloc made a PTE table"),
        };
        pmd.store(1, Pte::page(phys.zero_pfn(), 0).set(Pte::HUGE), crate::sync::Ordering::Release);
        // A 2 MiB leaf counts in its page's map count; the teardown takes it off.
        phys.desc(phys.zero_pfn()).inc_mapcount();
        let leaves: Vec<(u64, u64, u64)> =
            pt.leaves(0x1000, 0x50_0000, &g).map(|l| (l.start(), l.end(), l.entry_size())).collect();
        assert_eq!(leaves, vec![(0x1000, 0x20_0000, PAGE_SIZE), (0x20_0000, 0x40_0000, PMD_SIZE)]);
        let huge = pt.leaf(0x30_0000, &g).unwrap();
        assert_eq!((huge.start(), huge.entry_size()), (0x20_0000, PMD_SIZE));
        assert!(huge.load(0x30_0000).is_present());
        assert_eq!(huge.iter().count(), 1);
        drop(g);
        drop(pt);
        assert_eq!(phys.quiesce().page_tables, 0);
    }
}
