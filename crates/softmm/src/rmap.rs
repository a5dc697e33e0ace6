//! The reverse map's side of mapping and unmapping a page: where a frame
//! reference enters a page-table entry and where it leaves one (Linux's
//! `folio_add_*_rmap_pte`, `folio_remove_rmap_pte` and `folio_try_dup_anon_rmap`).
//!
//! A present (or `PROT_NONE`) entry holds one reference on its frame; these
//! are the only functions that move a reference into or out of an entry, so
//! the count stays right on every path. The frame's owner for a reverse walk
//! is in its descriptor (`mapping`: the file, or 0 for anonymous memory, and
//! `index`); the address spaces that may map it are found through the file's
//! `i_mmap` or, for anonymous memory, the address spaces sharing its
//! anon_vma. softmm keeps no map count for small frames: the count of
//! references answers "is it shared" for their COW and lazy free, and a
//! count written on every map and unmap would be a shared write on the fault
//! path. Migration, which must find every entry of a frame, adds the walk.
//! A huge page counts its 2 MiB leaf entries (`FrameDesc::mapcount`), as
//! `hugetlb_wp` reuses an anonymous page mapped once whatever other
//! references it has (a `get_user_pages` reference, a migration's
//! isolation), where copying would fail with the pool empty.

use crate::pgtable::{Pte, PteGuard};
use crate::phys::{FrameRef, PhysMem};

/// Maps `frame` at `va` with the extra entry bits `flags`: the entry takes
/// over the reference. The entry must be empty.
#[inline]
pub(crate) fn map_page(ptl: &mut PteGuard<'_>, va: u64, frame: FrameRef<'_>, flags: u64) {
    debug_assert!(ptl.get(va).is_none(), "mapping over a live entry at {va:#x}");
    ptl.set(va, mapped(frame, flags));
}

/// The entry that maps `frame` with the extra bits `flags` and takes over its
/// reference, for a caller that stores it into an empty entry under its
/// table's lock (in [`PteGuard::update`]).
#[inline]
pub(crate) fn mapped(frame: FrameRef<'_>, flags: u64) -> Pte {
    if flags & Pte::HUGE != 0 {
        frame.desc().inc_mapcount();
    }
    Pte::page(frame.into_raw(), flags)
}

/// Installs a copy of a frame-holding entry `pte` at `va` in another table
/// (fork, mremap's move keeps its own reference): the new entry takes over
/// `frame`, which must be a reference on `pte`'s frame or the copy of it
/// that `pte.with_pfn` names.
#[inline]
pub(crate) fn map_pte(ptl: &mut PteGuard<'_>, va: u64, frame: FrameRef<'_>, pte: Pte) {
    debug_assert!(pte.has_frame() && pte.pfn() == frame.pfn());
    debug_assert!(ptl.get(va).is_none(), "mapping over a live entry at {va:#x}");
    if pte.has(Pte::HUGE) {
        frame.desc().inc_mapcount();
    }
    ptl.set(va, pte.with_pfn(frame.into_raw()));
}

/// A frame reference taken out of a page-table entry that was just cleared
/// (Asterinas's `PageTableFrag`: "the caller is responsible for dropping it
/// after TLB coherence"), with the entry it was taken from.
///
/// # Invariant
///
/// Until the TLB of the address space whose entry was cleared is flushed,
/// a CPU may still read and write the frame through a translation it
/// cached from that entry. So the reference is put only after such a
/// flush, by one of the two consumers:
///
/// * an `MmuGather` (`MmuGather::add_cleared_frame`), which puts it after
///   its own flush (the zaps);
/// * [`Unmapped::release`], given the [`TlbFlushed`] that a flush of the
///   address space returned, begun after the clear (the single-page
///   replacements: clear, flush, install, unlock, release).
///
/// Dropped any other way, it is leaked, never put (a debug assertion
/// fails, and the leak tests catch it in a release build): a frame reused
/// while a stale translation still reaches it would be written through
/// that translation. Safe code cannot free the frame early.
#[must_use = "a stale TLB entry may still reach the frame: hand it to an MmuGather or release it after the flush"]
pub(crate) struct Unmapped<'p> {
    pte: Pte,
    /// `None` once consumed.
    frame: Option<FrameRef<'p>>,
}

/// Proof that a TLB flush completed (defined with the frozen page that
/// also takes it, in `phys`, below this module).
pub(crate) use crate::phys::TlbFlushed;

impl<'p> Unmapped<'p> {
    /// Puts the reference now that `flushed`, a flush of the address space
    /// begun after the entry was cleared, has completed.
    pub(crate) fn release(mut self, flushed: TlbFlushed) {
        let _ = flushed;
        drop(self.frame.take());
    }

    /// The reference as a frame number, for the gather that puts it after
    /// its flush (`MmuGather::add_cleared_frame`, the only caller, with
    /// `FrameRef::from_raw`).
    pub(crate) fn into_gathered(mut self) -> crate::phys::Pfn {
        self.frame.take().expect("not consumed yet").into_raw()
    }
}

impl Drop for Unmapped<'_> {
    fn drop(&mut self) {
        if let Some(frame) = self.frame.take() {
            // Leaked: no flush was shown, so a CPU may still reach it.
            let pfn = frame.into_raw();
            debug_assert!(
                std::thread::panicking(),
                "the reference of the entry {:?} (frame {pfn}) was dropped without a TLB flush",
                self.pte
            );
        }
    }
}

impl std::fmt::Debug for Unmapped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unmapped({:?})", self.pte)
    }
}

/// Clears the entry at `va` and returns its reference, to be put after the
/// TLB flush ([`Unmapped`]), if it held a frame; any other entry (a guard
/// marker) is left alone.
#[inline]
pub(crate) fn unmap_page<'p>(ptl: &mut PteGuard<'_>, va: u64, phys: &'p PhysMem) -> Option<Unmapped<'p>> {
    if !ptl.get(va).has_frame() {
        return None;
    }
    let old = ptl.replace(va, Pte::NONE);
    Some(unmapped(phys, old))
}

/// The reference that `pte`, an entry holding a frame which the caller has
/// just cleared under its table's lock (in [`PteGuard::update`]), held: to
/// be put after the TLB flush ([`Unmapped`]).
#[inline]
pub(crate) fn unmapped(phys: &PhysMem, pte: Pte) -> Unmapped<'_> {
    Unmapped { pte, frame: Some(entry_reference(phys, pte)) }
}

/// The reference the frame-holding entry `pte` held, with a huge page's
/// map count dropped.
#[inline]
fn entry_reference(phys: &PhysMem, pte: Pte) -> FrameRef<'_> {
    debug_assert!(pte.has_frame());
    let frame = FrameRef::from_raw(phys, pte.pfn());
    if pte.has(Pte::HUGE) {
        frame.desc().dec_mapcount();
    }
    frame
}

/// The reference a duplicated entry (fork's child) needs: another one on
/// the frame of `pte`, which the caller holds locked.
#[inline]
pub(crate) fn dup_page<'p>(phys: &'p PhysMem, pte: Pte) -> FrameRef<'p> {
    debug_assert!(pte.has_frame());
    phys.get(pte.pfn())
}

/// The present entry that the migration entry `pte` becomes once its page
/// is `new` (the page moved to, or the old one if it stayed), which the
/// migrator holds locked: a new reference on `new` for the entry (Linux's
/// `remove_migration_pte` maps the new folio with a reference per entry),
/// and, when the entry recorded an exclusive anonymous page, `new` marked
/// exclusive again (`RMAP_EXCLUSIVE`). The caller applies the VMA's
/// protection.
#[inline]
pub(crate) fn remove_migration_pte(phys: &PhysMem, new: crate::phys::Pfn, pte: Pte) -> Pte {
    let frame = phys.get(new);
    if pte.is_exclusive_migration() {
        frame.desc().flags.fetch_or(crate::phys::PG_ANON_EXCLUSIVE, crate::sync::Ordering::Relaxed);
    }
    if pte.has(Pte::HUGE) {
        frame.desc().inc_mapcount();
    }
    pte.restored(frame.into_raw())
}

/// The migration entry replacing `pte`, a present or `PROT_NONE` entry
/// which the caller replaces under its table's lock: the entry's reference goes (the
/// migrator holds its own), and an exclusive anonymous page gives up its
/// exclusivity to the entry, so that a `fork` that copies the entry leaves
/// neither copy exclusive (Linux's `try_to_migrate_one` with
/// `folio_try_share_anon_rmap`).
#[inline]
pub(crate) fn try_to_migrate_pte(phys: &PhysMem, pte: Pte) -> Pte {
    let d = phys.desc(pte.pfn());
    let exclusive = d.flags.fetch_and(!crate::phys::PG_ANON_EXCLUSIVE, crate::sync::Ordering::Relaxed)
        & crate::phys::PG_ANON_EXCLUSIVE
        != 0;
    // No flush first: the migrator holds a reference of its own, so this
    // put cannot free the frame; the migration's flush comes before the copy.
    drop(entry_reference(phys, pte));
    pte.to_migration(exclusive)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{PhysConfig, PhysMem};

    fn mapped_frame(phys: &PhysMem) -> Pte {
        Pte::page(phys.alloc(0).expect("a frame").into_raw(), Pte::WRITE)
    }

    /// The invariant's consumer for the single-page replacements: released
    /// with a flush's proof, the entry's reference is put.
    #[test]
    fn an_unmapped_page_released_after_the_flush_is_put() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let pte = mapped_frame(&phys);
        assert_eq!(phys.stats().frames_used, 1);
        unmapped(&phys, pte).release(TlbFlushed::completed());
        assert_eq!(phys.stats().frames_used, 0, "the reference was put");
    }

    /// Dropped without a flush, the reference is leaked, never put, so no
    /// stale translation can reach a reused frame; a debug build says so
    /// at once.
    #[test]
    fn an_unmapped_page_dropped_without_a_flush_is_leaked_not_freed() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let pte = mapped_frame(&phys);
        let old = unmapped(&phys, pte);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(old)));
        assert_eq!(dropped.is_err(), cfg!(debug_assertions), "the debug assertion fires in a debug build only");
        assert_eq!(phys.stats().frames_used, 1, "the frame was freed without a flush");
        assert_eq!(phys.desc(pte.pfn()).refcount.load(crate::sync::Ordering::Relaxed), 1);
        drop(FrameRef::from_raw(&phys, pte.pfn()));
        assert_eq!(phys.stats().frames_used, 0);
    }
}
