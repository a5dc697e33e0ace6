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

/// Clears the entry at `va` and returns it with the reference it held, if it
/// held a frame; any other entry (a guard marker) is left alone.
#[inline]
pub(crate) fn unmap_page<'p>(ptl: &mut PteGuard<'_>, va: u64, phys: &'p PhysMem) -> Option<(Pte, FrameRef<'p>)> {
    if !ptl.get(va).has_frame() {
        return None;
    }
    let old = ptl.replace(va, Pte::NONE);
    Some((old, unmapped(phys, old)))
}

/// The reference that `pte`, an entry holding a frame which the caller has
/// just cleared under its table's lock (in [`PteGuard::update`]), held.
#[inline]
pub(crate) fn unmapped(phys: &PhysMem, pte: Pte) -> FrameRef<'_> {
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
    drop(unmapped(phys, pte));
    pte.to_migration(exclusive)
}
