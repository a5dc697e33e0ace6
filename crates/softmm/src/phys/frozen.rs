//! A page frozen for migration, and the proof of a completed TLB flush
//! that freezing takes: the one place where a migrator's bulk copy is
//! `unsafe`, so that the migrators above hold none.
//!
//! # Protocol
//!
//! A migrator copies a page with the host's `memcpy` (not word-atomic, so
//! nothing may write the source or touch the destination meanwhile) after
//! the steps of Linux's `migrate_folio_unmap`, `try_to_unmap_flush` and
//! `folio_ref_freeze`:
//!
//! 1. it holds the page's lock and its isolation reference;
//! 2. every entry mapping the page becomes a migration entry, whose
//!    reference goes (a fault or `get_user_pages` meeting one waits for the
//!    remap);
//! 3. the TLB of every address space that had such an entry is flushed and
//!    the flush waited for: a stale translation, which holds no reference,
//!    could otherwise still write the page. The flush's completion is a
//!    [`TlbFlushed`], which only the core's flushes make;
//! 4. [`FrozenPage::freeze`] (or [`FrozenPage::freeze_cached`]) finds no
//!    pin and no reference besides the migrator's (and the page cache's).
//!    No new one can appear: a reference is only ever taken from another
//!    (`PhysMem::get`), from an entry (a migration entry has none), or
//!    from the page cache under its lock, which `freeze_cached`'s caller
//!    holds;
//! 5. [`FrozenPage::copy_to`] copies it into a frame that has no other
//!    reference (a fresh one), which no translation reaches either (a
//!    frame is freed only after the flush that follows its last unmap).
//!
//! The type checks 4 and 5 and requires the proof of 3; 2 is the
//! migrator's (its reverse walk), and the proof does not say which address
//! spaces were flushed: a migrator that flushed the wrong ones still holds
//! one. The loom model `migrate/loom_tests.rs`
//! `a_frozen_copy_comes_after_the_flush` runs the real migration against a
//! write through a cached translation, and is seen failing with the copy
//! made before the flush completed
//! (`sync::broken::migrate::SKIP_FLUSH_WAIT`).

use super::{FrameRef, PhysMem, PAGE_SIZE, PG_FILE};
use crate::sync::Ordering;

/// Proof that a TLB flush of an address space completed: every CPU that
/// could cache a translation of the flushed range has dropped it. Returned
/// by the address space's synchronous flushes (`AddressSpace::flush_tlb`,
/// `AddressSpace::flush_tlb_owners`, `AddressSpace::flush_tlbs`), consumed
/// by `rmap::Unmapped::release` and borrowed by [`FrozenPage::freeze`].
/// Only `mm/` makes one (`tests/semantics/layering.rs`).
#[derive(Debug)]
pub(crate) struct TlbFlushed(());

impl TlbFlushed {
    /// The proof, for a flush of `mm/` that has just completed.
    pub(crate) fn completed() -> TlbFlushed {
        TlbFlushed(())
    }
}

/// A page, 4 KiB or huge, that nothing but its migrator can read or write
/// (see the module's protocol): the migrator's reference, borrowed while
/// the page is frozen.
#[must_use = "a frozen page is for one copy"]
pub(crate) struct FrozenPage<'r, 'p> {
    page: &'r FrameRef<'p>,
    /// 1, or a huge page's frames.
    frames: usize,
}

impl<'r, 'p> FrozenPage<'r, 'p> {
    /// `page`, the migrator's reference, frozen once `flushed` (a flush of
    /// every address space whose entries of the page became migration
    /// entries, begun after they did) has completed: `None` if the page is
    /// pinned or has a reference besides the migrator's (Linux's
    /// `folio_ref_freeze` failing: a `get_user_pages` or `write(2)`
    /// reference, an entry the walk missed, a page-cache page).
    pub(crate) fn freeze(page: &'r FrameRef<'p>, flushed: &TlbFlushed) -> Option<FrozenPage<'r, 'p>> {
        Self::freeze_with(page, flushed, 1)
    }

    /// [`FrozenPage::freeze`] for a page-cache page, whose second reference
    /// is the cache's: the caller lends the guard of the page cache's lock,
    /// under which the page is still in the cache (`File::migrate_page`,
    /// the only caller: `tests/semantics/layering.rs`), so that no
    /// reference is taken from the cache meanwhile. `None` also for a page
    /// that is not a page-cache page.
    pub(crate) fn freeze_cached<T>(
        page: &'r FrameRef<'p>,
        flushed: &TlbFlushed,
        _cache: &crate::sync::MutexGuard<'_, T>,
    ) -> Option<FrozenPage<'r, 'p>> {
        if page.desc().flags.load(Ordering::Relaxed) & PG_FILE == 0 {
            return None;
        }
        Self::freeze_with(page, flushed, 2)
    }

    fn freeze_with(page: &'r FrameRef<'p>, flushed: &TlbFlushed, refs: u32) -> Option<FrozenPage<'r, 'p>> {
        let _ = flushed;
        let d = page.desc();
        // Acquire pairs with the Release of a put: what the reference's
        // holder wrote through it happened before.
        if d.pincount.load(Ordering::Acquire) != 0 || d.refcount.load(Ordering::Acquire) != refs {
            return None;
        }
        let phys = page.phys();
        let frames = if phys.is_huge(page.pfn()) { super::hugetlb::HPAGE_FRAMES as usize } else { 1 };
        Some(FrozenPage { page, frames })
    }

    /// Copies the page into `dst`, a page of the same size in the same
    /// arena whose only reference is `dst` (a fresh one), with one bulk copy
    /// (the host's `memcpy`, which writes whole destination lines without
    /// reading them: on the 2-CPU development VM a cached 4 KiB page took
    /// 98 ns against 145–196 ns word by word, a cached 2 MiB page 46 µs
    /// against 77–103 µs; `docs/architecture.md`, "NUMA memory policies
    /// and migration"). Panics if `dst` is another arena's, of another
    /// size, or referenced elsewhere.
    pub(crate) fn copy_to(self, dst: &FrameRef<'_>) {
        let phys: &PhysMem = self.page.phys();
        assert!(std::ptr::eq(phys, dst.phys()), "a copy into another arena");
        let (src, to) = (self.page.pfn(), dst.pfn());
        let dst_frames = if phys.is_huge(to) { super::hugetlb::HPAGE_FRAMES as usize } else { 1 };
        assert_eq!(dst_frames, self.frames, "a copy of frame {src} into a page of another size ({to})");
        // Acquire: as in `freeze`. A frame whose one reference is ours is
        // mapped by no entry, pinned by no one, and reached by no
        // translation (frames are freed after the flush of their last unmap).
        assert_eq!(dst.desc().refcount.load(Ordering::Acquire), 1, "a copy into frame {to}, referenced elsewhere");
        let len = self.frames * PAGE_SIZE as usize;
        let (s, d) = (phys.range_ptr(src, 0, len), phys.range_ptr(to, 0, len));
        // SAFETY: both runs lie in the arena (`range_ptr` checked), which
        // stays mapped while `phys` lives. They do not overlap: two
        // different pages of one size (each a frame, or an aligned huge
        // page), `dst` is referenced and `self.page` frozen. Nothing writes
        // the source or touches the destination during the copy: the
        // source is frozen (the protocol's steps 2-4: no entry but
        // migration entries, every TLB that could hold a translation
        // flushed, no pin, no reference besides the migrator's and, under
        // its lock, the cache's, so no new one), and the destination's only
        // reference is the caller's. Concurrent reads of the source (a
        // `read(2)` before the cache's lock, writeback) are allowed.
        unsafe { std::ptr::copy_nonoverlapping(s, d, len) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phys::{PhysConfig, Placement};
    use crate::sync::Mutex;

    fn arena() -> std::sync::Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap()
    }

    /// A frame of `phys` filled with `byte`.
    fn page(phys: &PhysMem, byte: u8) -> FrameRef<'_> {
        let f = phys.alloc(0).unwrap();
        phys.fill(f.pfn(), 0, byte, PAGE_SIZE as usize);
        f
    }

    #[test]
    fn a_page_freezes_with_the_migrators_reference_alone_and_copies_whole() {
        let phys = arena();
        let flushed = TlbFlushed::completed();
        let (src, dst) = (page(&phys, 0x5a), page(&phys, 0));
        let other = src.clone();
        assert!(FrozenPage::freeze(&src, &flushed).is_none(), "a second reference");
        drop(other);
        src.desc().pincount.store(1, Ordering::Relaxed);
        assert!(FrozenPage::freeze(&src, &flushed).is_none(), "a pin");
        src.desc().pincount.store(0, Ordering::Relaxed);
        FrozenPage::freeze(&src, &flushed).expect("only ours").copy_to(&dst);
        let mut b = vec![0u8; PAGE_SIZE as usize];
        dst.read(0, &mut b);
        assert!(b.iter().all(|&x| x == 0x5a));
    }

    #[test]
    fn a_cached_page_freezes_with_the_caches_reference_under_its_lock() {
        let phys = arena();
        let flushed = TlbFlushed::completed();
        let cache = Mutex::new(());
        let src = page(&phys, 1);
        let cached = src.clone();
        assert!(FrozenPage::freeze_cached(&src, &flushed, &cache.lock()).is_none(), "not a page-cache page");
        src.desc().flags.store(PG_FILE, Ordering::Relaxed);
        assert!(FrozenPage::freeze(&src, &flushed).is_none(), "the cache's reference is not the migrator's");
        assert!(FrozenPage::freeze_cached(&src, &flushed, &cache.lock()).is_some());
        let third = src.clone();
        assert!(FrozenPage::freeze_cached(&src, &flushed, &cache.lock()).is_none(), "a reference besides");
        drop((cached, third));
    }

    #[test]
    #[should_panic(expected = "referenced elsewhere")]
    fn a_copy_into_a_referenced_frame_panics() {
        let phys = arena();
        let flushed = TlbFlushed::completed();
        let (src, dst) = (page(&phys, 1), page(&phys, 0));
        let _mapped = dst.clone();
        FrozenPage::freeze(&src, &flushed).unwrap().copy_to(&dst);
    }

    #[test]
    #[should_panic(expected = "another size")]
    fn a_copy_into_a_page_of_another_size_panics() {
        let huge = crate::phys::hugetlb::HPAGE_SIZE;
        let phys = PhysMem::new(PhysConfig::new(2 * huge + 16 * PAGE_SIZE).hugepages(1)).unwrap();
        let flushed = TlbFlushed::completed();
        let src = phys.alloc_huge(&Placement::new(0, None), false).unwrap();
        let dst = page(&phys, 0);
        FrozenPage::freeze(&src, &flushed).unwrap().copy_to(&dst);
    }
}
