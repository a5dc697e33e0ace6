//! The published VMA set, one RCU version per 1 GiB window (one PMD
//! table's span): a lazily allocated two-level directory of [`Window`]s
//! with a bitmap of the windows that hold a VMA, for the fall-through of
//! a lookup and for ordered iteration. Each VMA is in the window of its
//! start only ([`crate::vma::WindowMap`]).
//!
//! # Protocol
//!
//! * A window's writer (the holder of `mmap_lock` for write) builds the
//!   window's new [`WindowMap`] privately ([`crate::vma::VmaTree`]), then
//!   publishes it with one swap of the window's pointer, and defers the old
//!   version's destruction past every epoch guard that may have loaded it,
//!   as the single tree was published before the set was sharded. An empty
//!   window publishes null.
//! * A lock-free reader pins the epoch and loads the pointer of the window
//!   holding the address it looks up; if no VMA starts there at or below
//!   the address, it takes the last VMA of the nearest window below whose
//!   bit is set. Each window it reads is at some version, its old or its
//!   new one. A VMA a write section removed or replaced is detached before
//!   any window is published ([`crate::vma::VmaTree::remove`]), so a reader
//!   that finds it in a window not yet republished sees it detached and
//!   aborts its per-VMA fault. The order in which a write section's windows
//!   are published ([`crate::vma::VmaTree::publish_changed`]) makes every
//!   mix of old and new windows answer each address with its old or its
//!   new VMA, never with a hole where both had one.
//! * A whole-set reader (the reverse walks) visits the windows one by one,
//!   each at some version: it may see a VMA a writer is moving between
//!   windows in neither or in both; those readers take what they find as
//!   candidates and confirm each under the entry's table lock.
//! * Leaves (each holding its windows inline) are installed once
//!   (compare-exchange, Release; the loser frees its copy) and freed only
//!   when the directory drops, so a `&Window` lives as long as the
//!   directory. The bitmap is a hint kept by the window's writer: a bit is
//!   set before its window's first non-empty version is published and
//!   cleared after its empty one, so a reader that finds a bit clear missed
//!   nothing newer than the versions it could have loaded, and one that
//!   finds a bit set may load null (an empty window, which it skips).
//! * Each window's pointer has a cache line of its own: a lock-free fault
//!   reads its window's pointer, and a writer publishing another window
//!   must not take that line away from it.
//!
//! The directory's leaf pointers and bitmaps are `std`'s atomics, not
//! loom's: they are install-once and hints; each window's tree pointer,
//! the protocol itself, is crossbeam-epoch's and modelled (with 4 windows
//! per leaf under loom, so that a leaf is few modelled atomics).

use std::sync::atomic::{AtomicPtr as StdAtomicPtr, AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use crossbeam_utils::CachePadded;

use super::{VmaTree, WindowMap, Windows, WINDOW_SHIFT};
use crate::sync::broken::windows as broken;
use crate::sync::rcu::Reclaimer;
use crate::sync::{Ordering, SeqCount};

/// Windows per leaf of the directory: 256 (a 16 KiB leaf); 4 under loom,
/// where each window's pointer is a modelled atomic.
const LEAF_SHIFT: u32 = if cfg!(loom) { 2 } else { 8 };
const LEAF_WINDOWS: usize = 1 << LEAF_SHIFT;
/// Windows the directory covers: 2^47 bytes (`TASK_SIZE`).
const WINDOWS: u64 = 1 << 17;
/// Leaves of the directory.
const TOP_LEAVES: usize = (WINDOWS >> LEAF_SHIFT) as usize;

/// One past the last address the directory covers (`crate::mm` checks
/// that it covers `TASK_SIZE`).
pub(crate) const WINDOWS_END: u64 = WINDOWS << WINDOW_SHIFT;

/// How many times a lookup that fell through to nothing is repeated while
/// write sections publish several windows across it.
/// Unbounded under loom, whose scheduler runs the writer while the reader
/// yields: a bound there only adds executions where it gives up.
const MAX_RECHECKS: u32 = if cfg!(loom) { u32::MAX } else { 1 << 12 };

/// One window of the VMA set, on a cache line of its own (see the protocol).
#[repr(align(64))]
pub(crate) struct Window {
    /// The published version of the window's VMAs; null while it has none.
    tree: Atomic<WindowMap>,
    /// The window's writer lock under [`crate::WriterPolicy::Range`]: held
    /// by a range writer from before it loads the window's version until
    /// after it publishes the next (`mm/range.rs`). On the window's line:
    /// only the writers of this window take it.
    lock: crate::sync::Mutex<()>,
    /// Which thread last took `lock` (`shared-write-stats`): the line
    /// counts as shared when it moves between threads.
    written: crate::sync::LastWriter,
}

/// A leaf's windows are inline, so that a lookup loads the leaf pointer
/// and the window's version: two dependent loads.
struct Leaf {
    windows: Box<[Window]>,
    /// Bit `i`: window `i` of this leaf holds a VMA (a hint, see the protocol).
    nonempty: [StdAtomicU64; LEAF_WINDOWS.div_ceil(64)],
    /// Bit `i`: a range writer published window `i` since the last
    /// `mmap_lock` holder took the range writers' windows in
    /// ([`WindowDir::take_range_dirty`]). Set only when clear, so a range
    /// writer writes it once per `mmap_lock` section, not once per call.
    range_dirty: [StdAtomicU64; LEAF_WINDOWS.div_ceil(64)],
}

/// The published windows of one address space.
pub(crate) struct WindowDir {
    leaves: Box<[StdAtomicPtr<Leaf>]>,
    /// Bit `i`: leaf `i` is allocated.
    present: Box<[StdAtomicU64]>,
    /// Odd while a write section publishes several windows (see the
    /// protocol); written by those sections only (a split, merge or move
    /// across a window boundary), so its line stays shared in the readers'
    /// caches. Boxed: on a line of its own, off the address space.
    several: Box<CachePadded<SeqCount>>,
    /// Bit `i`: leaf `i` has a bit of `range_dirty` set.
    range_dirty: Box<[StdAtomicU64]>,
}

impl Default for WindowDir {
    fn default() -> WindowDir {
        WindowDir {
            leaves: (0..TOP_LEAVES).map(|_| StdAtomicPtr::new(std::ptr::null_mut())).collect(),
            present: (0..TOP_LEAVES.div_ceil(64)).map(|_| StdAtomicU64::new(0)).collect(),
            several: Box::default(),
            range_dirty: (0..TOP_LEAVES.div_ceil(64)).map(|_| StdAtomicU64::new(0)).collect(),
        }
    }
}

/// Installs `new` in `slot` if it is null and returns what the slot holds;
/// the loser of a race frees its copy.
fn install<T>(slot: &StdAtomicPtr<T>, new: impl FnOnce() -> Box<T>) -> &T {
    let cur = slot.load(StdOrdering::Acquire);
    if !cur.is_null() {
        // SAFETY: installed pointers come from `Box::into_raw` and are freed
        // only by the directory's `drop`, which `&self` outlives.
        return unsafe { &*cur };
    }
    let fresh = Box::into_raw(new());
    match slot.compare_exchange(std::ptr::null_mut(), fresh, StdOrdering::AcqRel, StdOrdering::Acquire) {
        // SAFETY: as above; `fresh` is now the installed pointer.
        Ok(_) => unsafe { &*fresh },
        Err(won) => {
            // SAFETY: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above.
            unsafe { &*won }
        }
    }
}

/// Sets `bit` in `word` unless it is set: a publication that changes no
/// bit writes no line readers of other windows read.
#[inline]
fn set_bit(word: &StdAtomicU64, bit: u64) {
    if word.load(StdOrdering::Relaxed) & bit == 0 {
        word.fetch_or(bit, StdOrdering::Release);
    }
}

/// The first set bit at or after `from` in `words`.
fn next_set(words: &[StdAtomicU64], from: usize) -> Option<usize> {
    let mut i = from / 64;
    let mut mask = u64::MAX << (from % 64);
    while i < words.len() {
        let bits = words[i].load(StdOrdering::Acquire) & mask;
        if bits != 0 {
            return Some(i * 64 + bits.trailing_zeros() as usize);
        }
        i += 1;
        mask = u64::MAX;
    }
    None
}

/// The set bits of `words` in order, each word read when the walk reaches
/// it (a bit cleared behind the walk is not revisited).
fn set_bits(words: &[StdAtomicU64]) -> impl Iterator<Item = usize> + '_ {
    let mut from = 0;
    std::iter::from_fn(move || {
        let i = next_set(words, from)?;
        from = i + 1;
        Some(i)
    })
}

/// The last set bit at or before `from` in `words`.
fn prev_set(words: &[StdAtomicU64], from: usize) -> Option<usize> {
    let mut i = from / 64;
    let mut mask = u64::MAX >> (63 - from % 64);
    loop {
        let bits = words[i].load(StdOrdering::Acquire) & mask;
        if bits != 0 {
            return Some(i * 64 + 63 - bits.leading_zeros() as usize);
        }
        i = i.checked_sub(1)?;
        mask = u64::MAX;
    }
}

impl WindowDir {
    fn leaf(&self, l: usize) -> Option<&Leaf> {
        let p = self.leaves[l].load(StdOrdering::Acquire);
        // SAFETY: see `install`.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Window `w`, if its leaf was ever used.
    #[inline]
    fn window(&self, w: u64) -> Option<&Window> {
        if w >= WINDOWS {
            return None;
        }
        let leaf = self.leaf((w >> LEAF_SHIFT) as usize)?;
        Some(&leaf.windows[w as usize % LEAF_WINDOWS])
    }

    /// Window `w`, its leaf allocated at its first use.
    fn window_or_alloc(&self, w: u64) -> (&Leaf, &Window) {
        assert!(w < WINDOWS, "window {w:#x} beyond TASK_SIZE");
        let l = (w >> LEAF_SHIFT) as usize;
        let leaf = install(&self.leaves[l], || {
            Box::new(Leaf {
                windows: (0..LEAF_WINDOWS)
                    .map(|_| Window {
                        tree: Atomic::null(),
                        lock: crate::sync::Mutex::new(()),
                        written: Default::default(),
                    })
                    .collect(),
                nonempty: [const { StdAtomicU64::new(0) }; LEAF_WINDOWS.div_ceil(64)],
                range_dirty: [const { StdAtomicU64::new(0) }; LEAF_WINDOWS.div_ceil(64)],
            })
        });
        set_bit(&self.present[l / 64], 1 << (l % 64));
        (leaf, &leaf.windows[w as usize % LEAF_WINDOWS])
    }

    /// Publishes `map` as window `w`'s version (`None`: the window holds no
    /// VMA any more), the old version freed by `reclaimer` after a grace
    /// period. Only the window's writer calls it.
    pub(crate) fn publish(&self, w: u64, map: Option<WindowMap>, guard: &Guard, reclaimer: Reclaimer) {
        self.publish_keeping(w, map, guard, reclaimer, false)
    }

    /// [`WindowDir::publish`]; with `keep_bit`, an emptied window keeps
    /// its bit in the bitmap of non-empty windows, which the protocol
    /// allows (a reader skips a listed window that reads empty): a range
    /// writer whose window empties and fills again on every call (an
    /// mmap/munmap loop alone in its arena) then never writes the bitmap
    /// word, which 64 windows share.
    pub(crate) fn publish_keeping(
        &self,
        w: u64,
        map: Option<WindowMap>,
        guard: &Guard,
        reclaimer: Reclaimer,
        keep_bit: bool,
    ) {
        let (leaf, window) = self.window_or_alloc(w);
        let i = w as usize % LEAF_WINDOWS;
        let (word, bit) = (&leaf.nonempty[i / 64], 1u64 << (i % 64));
        let new = match map {
            Some(map) => {
                set_bit(word, bit);
                Owned::new(map).into_shared(guard)
            }
            None => Shared::null(),
        };
        let old = window.tree.swap(new, Ordering::AcqRel, guard);
        if new.is_null() && !keep_bit && word.load(StdOrdering::Relaxed) & bit != 0 {
            word.fetch_and(!bit, StdOrdering::Release);
        }
        if !old.is_null() {
            // SAFETY: `old` was the published version; it is unreachable
            // from the window now, and readers that loaded it hold a guard
            // that the deferred destruction waits for.
            unsafe { reclaimer.defer_destroy(guard, old) };
        }
    }

    /// Publishes the windows of `tree` its write section changed, each as
    /// one RCU version, in the order of [`VmaTree::publish_changed`],
    /// inside a write section of the sequence count when there are
    /// several; `each` after each window; the old versions freed by
    /// `reclaimer` (whose section ends with the publication). Only the
    /// writer calls it.
    pub(crate) fn publish_changed(
        &self,
        tree: &mut VmaTree,
        guard: &Guard,
        reclaimer: Reclaimer,
        mut each: impl FnMut(u64),
    ) {
        let old = self.published(guard);
        let mut began = false;
        tree.publish_changed(
            old,
            || {
                self.several.write_begin();
                began = true;
            },
            |w, map| {
                self.publish(w, map.cloned(), guard, reclaimer);
                each(w);
            },
        );
        if began {
            self.several.write_end();
        }
        reclaimer.end_section(guard);
    }

    /// Takes window `w`'s writer lock (`mm/range.rs`); the flag is true
    /// when another writer held it. A window whose leaf was never allocated
    /// has never held a VMA: with `alloc` (a call that may make one there)
    /// its leaf is allocated now, else the answer is `None` and nothing is
    /// allocated. The window's line (its lock, then its version) counts as
    /// one shared write when another thread wrote it last.
    #[track_caller]
    pub(crate) fn lock_window(&self, w: u64, alloc: bool) -> Option<(Option<crate::sync::MutexGuard<'_, ()>>, bool)> {
        let window = if alloc { self.window_or_alloc(w).1 } else { self.window(w)? };
        window.written.write();
        if crate::sync::broken::range_writers::no_window_lock() {
            return Some((None, false));
        }
        Some(match window.lock.try_lock() {
            Some(g) => (Some(g), false),
            None => (Some(window.lock.lock()), true),
        })
    }

    /// Whether windows `a` and `b` share a directory leaf.
    pub(crate) fn same_leaf(a: u64, b: u64) -> bool {
        a >> LEAF_SHIFT == b >> LEAF_SHIFT
    }

    /// How many leaves the directory has allocated (for the tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn leaves_allocated(&self) -> usize {
        self.leaves.iter().filter(|l| !l.load(StdOrdering::Relaxed).is_null()).count()
    }

    /// Records that a range writer published window `w`, for the next
    /// `mmap_lock` holder ([`WindowDir::take_range_dirty`]). Called by the
    /// window's range writer after its publication, inside the shared
    /// mode, whose exit orders it before the blocker's look.
    pub(crate) fn mark_range_dirty(&self, w: u64) {
        let l = (w >> LEAF_SHIFT) as usize;
        let leaf = self.leaf(l).expect("a published window's leaf is allocated");
        let i = w as usize % LEAF_WINDOWS;
        set_bit(&leaf.range_dirty[i / 64], 1 << (i % 64));
        set_bit(&self.range_dirty[l / 64], 1 << (l % 64));
    }

    /// Whether a range writer published a window since the last
    /// [`WindowDir::take_range_dirty`]. Exact only while the range writers
    /// are blocked and drained.
    pub(crate) fn any_range_dirty(&self) -> bool {
        self.range_dirty.iter().any(|w| w.load(StdOrdering::Acquire) != 0)
    }

    /// Calls `f` with each window a range writer published since the last
    /// call, ascending, and clears the marks when `clear`. Only a holder of
    /// `mmap_lock` that has blocked and drained the range writers calls it
    /// (the marks cannot change meanwhile); a reader that may not change its
    /// view (`read_lock_recursive`) reads them without clearing.
    pub(crate) fn take_range_dirty(&self, clear: bool, mut f: impl FnMut(u64)) {
        for (lw, word) in self.range_dirty.iter().enumerate() {
            let mut leaves = word.load(StdOrdering::Acquire);
            if leaves == 0 {
                continue;
            }
            if clear {
                word.store(0, StdOrdering::Relaxed);
            }
            while leaves != 0 {
                let l = lw * 64 + leaves.trailing_zeros() as usize;
                leaves &= leaves - 1;
                let leaf = self.leaf(l).expect("a marked leaf is allocated");
                for (iw, wword) in leaf.range_dirty.iter().enumerate() {
                    let mut bits = wword.load(StdOrdering::Acquire);
                    if bits != 0 && clear {
                        wword.store(0, StdOrdering::Relaxed);
                    }
                    while bits != 0 {
                        let i = iw * 64 + bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        f(((l as u64) << LEAF_SHIFT) + i as u64);
                    }
                }
            }
        }
    }

    /// Publishes every window empty (exit: the VMAs go after the grace
    /// period of the readers that may still hold them). Only the writer
    /// calls it, to whom the bitmaps are exact (it sets a bit before its
    /// window's first version and clears it after its empty one), so it
    /// visits only the windows that hold a VMA.
    pub(crate) fn clear(&self) {
        let guard = crossbeam_epoch::pin();
        for l in set_bits(&self.present) {
            let Some(leaf) = self.leaf(l) else { continue };
            for i in set_bits(&leaf.nonempty) {
                self.publish(((l as u64) << LEAF_SHIFT) + i as u64, None, &guard, Reclaimer::AnyThread);
            }
        }
    }

    /// Whether window `w` has a published version, loaded under `guard`
    /// but not read: a model's check that a version is still reachable to
    /// this reader, which does not touch what a broken reclaim freed.
    #[cfg(all(test, loom))]
    pub(crate) fn has_version(&self, w: u64, guard: &Guard) -> bool {
        self.window(w).is_some_and(|win| !win.tree.load(Ordering::Acquire, guard).is_null())
    }

    /// The published windows, readable for as long as `guard` is held.
    pub(crate) fn published<'d, 'g>(&'d self, guard: &'g Guard) -> PublishedVmas<'d, 'g> {
        PublishedVmas { dir: self, guard }
    }
}

impl Drop for WindowDir {
    /// Frees the leaves and defers the windows' last versions. `&mut self`
    /// orders every publication before it, so plain reads of the leaf
    /// pointers and relaxed loads of the windows do: no read-modify-write
    /// per slot (a fork's child exits with 512 leaf slots and 256 windows a
    /// leaf, which swaps made microseconds of its exit; issue 27).
    fn drop(&mut self) {
        let guard = crossbeam_epoch::pin();
        for slot in self.leaves.iter_mut() {
            let leaf = std::mem::replace(slot.get_mut(), std::ptr::null_mut());
            if leaf.is_null() {
                continue;
            }
            // SAFETY: `&mut self`: no reader holds a `&Leaf` any more, and
            // the pointer came from `Box::into_raw`.
            let leaf = unsafe { Box::from_raw(leaf) };
            for window in leaf.windows.iter() {
                let old = window.tree.load(Ordering::Relaxed, &guard);
                if !old.is_null() {
                    // SAFETY: as in `publish`: a version a reader loaded
                    // under a guard outlives the guard, not the directory;
                    // the leaf is gone, so nothing else defers it.
                    unsafe { crate::sync::rcu::defer_destroy(&guard, old) };
                }
            }
        }
    }
}

/// The published VMA set as one reader sees it: each window at the version
/// it loads (see the module's protocol). The queries are
/// [`crate::vma::VmaTree`]'s. What it finds lives as long as the guard
/// (`'g`), even past the directory (`'d`): a version is freed only after
/// every guard that could have loaded it, the directory's drop included.
#[derive(Clone, Copy)]
pub(crate) struct PublishedVmas<'d, 'g> {
    dir: &'d WindowDir,
    guard: &'g Guard,
}

impl<'g> Windows<'g> for PublishedVmas<'_, 'g> {
    #[inline]
    fn window(self, w: u64) -> Option<&'g WindowMap> {
        let p: Shared<'g, WindowMap> = self.dir.window(w)?.tree.load(Ordering::Acquire, self.guard);
        // SAFETY: a non-null version is freed only after every guard that
        // could have loaded it is dropped (`WindowDir::publish`, `drop`).
        unsafe { p.as_ref() }
    }

    fn next_window(self, w: u64) -> Option<u64> {
        let mut w = w;
        while w < WINDOWS {
            let l = next_set(&self.dir.present, (w >> LEAF_SHIFT) as usize)?;
            w = w.max((l as u64) << LEAF_SHIFT);
            if let Some(leaf) = self.dir.leaf(l) {
                if let Some(i) = next_set(&leaf.nonempty, w as usize % LEAF_WINDOWS) {
                    return Some(((l as u64) << LEAF_SHIFT) + i as u64);
                }
            }
            w = (l as u64 + 1) << LEAF_SHIFT;
        }
        None
    }

    fn prev_window(self, w: u64) -> Option<u64> {
        let mut w = w.min(WINDOWS - 1);
        loop {
            let l = prev_set(&self.dir.present, (w >> LEAF_SHIFT) as usize)?;
            let last = ((l as u64 + 1) << LEAF_SHIFT) - 1;
            w = w.min(last);
            if let Some(leaf) = self.dir.leaf(l) {
                if let Some(i) = prev_set(&leaf.nonempty, w as usize % LEAF_WINDOWS) {
                    return Some(((l as u64) << LEAF_SHIFT) + i as u64);
                }
            }
            w = ((l as u64) << LEAF_SHIFT).checked_sub(1)?;
        }
    }
}

impl<'d, 'g> PublishedVmas<'d, 'g> {
    /// The VMA containing `addr`: found in `addr`'s window, or as the last
    /// VMA of the nearest non-empty window below.
    ///
    /// A lookup that falls through to the windows below and finds nothing
    /// is confirmed: it may have paired `addr`'s window before a write
    /// section publishing several windows with a lower one after it (see
    /// the protocol), so it is repeated until no such section ran across
    /// it. The repeat waits only for a writer inside its publication loop,
    /// which takes no lock; a lookup inside a window, or one that finds a
    /// VMA, is exact as it is.
    #[inline]
    pub(crate) fn find(self, addr: u64) -> Option<&'g std::sync::Arc<crate::vma::Vma>> {
        let w = crate::vma::window_of(addr);
        if let Some((_, v)) = self.window(w).and_then(|m| m.get_prev(&addr)) {
            return Some(v).filter(|v| v.end > addr);
        }
        for i in 0.. {
            let seq = self.dir.several.read_begin();
            let found = crate::vma::query::last_at_or_below(self, addr).filter(|v| v.end > addr);
            let confirmed = seq.is_some_and(|s| self.dir.several.validate(s));
            // Bounded against writers publishing several windows back to
            // back: a lock-free fault takes a `None` to `mmap_lock`.
            if found.is_some() || confirmed || broken::no_fall_through_recheck() || i == MAX_RECHECKS {
                return found;
            }
            crate::sync::spin_hint(i);
        }
        unreachable!()
    }

    /// The first VMA starting at or above `addr`.
    pub(crate) fn first_starting_at(self, addr: u64) -> Option<&'g std::sync::Arc<crate::vma::Vma>> {
        crate::vma::query::first_starting_at(self, addr)
    }

    /// The last VMA with `end <= addr`.
    pub(crate) fn prev_of(self, addr: u64) -> Option<&'g std::sync::Arc<crate::vma::Vma>>
    where
        'd: 'g,
    {
        crate::vma::query::prev_of(self, addr)
    }

    /// Every VMA in address order, each window at the version it loads.
    pub(crate) fn iter(self) -> impl Iterator<Item = &'g std::sync::Arc<crate::vma::Vma>>
    where
        'd: 'g,
    {
        crate::vma::query::iter(self)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::phys::{PhysConfig, PhysMem};
    use crate::vma::{VmFlags, Vma, VmaTree};

    const GIB: u64 = 1 << WINDOW_SHIFT;

    fn spans<'a>(it: impl Iterator<Item = &'a Arc<Vma>>) -> Vec<(u64, u64)> {
        it.map(|v| (v.start, v.end)).collect()
    }

    /// The published windows answer as the writer's version they were
    /// published from, across bitmap words and leaves, after inserts and
    /// after removals that empty windows.
    #[test]
    fn the_published_windows_answer_as_the_writers_version() {
        let phys = PhysMem::new(PhysConfig::new(64 << 10)).unwrap();
        let dir = WindowDir::default();
        let mut t = VmaTree::default();
        let publish = |t: &mut VmaTree| {
            let guard = crossbeam_epoch::pin();
            dir.publish_changed(t, &guard, Reclaimer::AnyThread, |_| ());
        };
        let vma = |s: u64, e: u64| Vma::new(&phys, s, e, VmFlags::READ, 0, None, None);
        // Across bitmap word 0/1 (window 63/64), across leaves (255/256),
        // near the top of the directory, and a lone one in window 0.
        let vmas = [
            (0x1000, 0x2000),
            (63 * GIB + 0x5000, 65 * GIB),
            (255 * GIB, 256 * GIB + 0x1000),
            (300 * GIB, 300 * GIB + 0x1000),
            ((WINDOWS - 2) * GIB, WINDOWS * GIB - 0x1000),
        ];
        for &(s, e) in &vmas {
            t.insert(vma(s, e));
        }
        publish(&mut t);
        let check = |t: &VmaTree| {
            let guard = crossbeam_epoch::pin();
            let p = dir.published(&guard);
            assert_eq!(spans(p.iter()), spans(t.iter()));
            let probes = [0, 0x1000, 0x2000, 63 * GIB, 64 * GIB, 65 * GIB, 200 * GIB, 256 * GIB, 256 * GIB + 0x1000];
            let top = [301 * GIB, (WINDOWS - 1) * GIB, WINDOWS * GIB, u64::MAX];
            for a in probes.into_iter().chain(top) {
                let one = |v: Option<&Arc<Vma>>| v.map(|v| (v.start, v.end));
                assert_eq!(one(p.find(a)), one(t.find(a)), "find {a:#x}");
                assert_eq!(one(p.prev_of(a)), one(t.prev_of(a)), "prev_of {a:#x}");
                assert_eq!(one(p.first_starting_at(a)), one(t.first_starting_at(a)), "first_starting_at {a:#x}");
            }
        };
        check(&t);
        t.remove(255 * GIB).unwrap();
        t.remove(0x1000).unwrap();
        publish(&mut t);
        check(&t);
        for &(s, _) in &vmas[1..] {
            t.remove(s);
        }
        publish(&mut t);
        check(&t);
        let guard = crossbeam_epoch::pin();
        assert_eq!(dir.published(&guard).next_window(0), None, "every bit cleared");
    }

    /// `clear` (exit) empties every window that holds a VMA, in every leaf,
    /// though it visits only the windows whose bits are set; the last
    /// versions go with the directory's drop, whose unsafe code Miri runs.
    #[test]
    fn clear_empties_every_window_it_finds_by_the_bitmaps() {
        let phys = PhysMem::new(PhysConfig::new(64 << 10)).unwrap();
        let dir = WindowDir::default();
        let mut t = VmaTree::default();
        for (s, e) in [
            (0x1000, 0x2000),
            (63 * GIB, 65 * GIB),
            (255 * GIB, 256 * GIB + 0x1000),
            ((WINDOWS - 1) * GIB, WINDOWS * GIB),
        ] {
            t.insert(Vma::new(&phys, s, e, VmFlags::READ, 0, None, None));
        }
        let guard = crossbeam_epoch::pin();
        dir.publish_changed(&mut t, &guard, Reclaimer::AnyThread, |_| ());
        drop(guard);
        dir.clear();
        let guard = crossbeam_epoch::pin();
        let p = dir.published(&guard);
        assert_eq!(p.iter().count(), 0, "a VMA left published after clear");
        for w in (0..WINDOWS).step_by(1 << LEAF_SHIFT).chain([0, 63, 64, 255, 256, WINDOWS - 1]) {
            let version = dir.window(w).map(|win| win.tree.load(Ordering::Acquire, &guard));
            assert!(version.is_none_or(|v| v.is_null()), "window {w} still published");
        }
        assert_eq!(p.next_window(0), None, "every bit cleared");
    }
}
