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
//! anon_vma. softmm keeps no per-frame map count: nothing reads one yet (the
//! count of references answers "is it shared" for COW and lazy free), and a
//! count written on every map and unmap would be a shared write on the fault
//! path. Migration, which must find every entry of a frame, adds the walk.

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
    Some((old, FrameRef::from_raw(phys, old.pfn())))
}

/// The reference that `pte`, an entry holding a frame which the caller has
/// just cleared under its table's lock (in [`PteGuard::update`]), held.
#[inline]
pub(crate) fn unmapped(phys: &PhysMem, pte: Pte) -> FrameRef<'_> {
    debug_assert!(pte.has_frame());
    FrameRef::from_raw(phys, pte.pfn())
}

/// The reference a duplicated entry (fork's child) needs: another one on
/// the frame of `pte`, which the caller holds locked.
#[inline]
pub(crate) fn dup_page<'p>(phys: &'p PhysMem, pte: Pte) -> FrameRef<'p> {
    debug_assert!(pte.has_frame());
    phys.get(pte.pfn())
}

/// The frame number a restored migration entry takes over: a new reference
/// on `pfn`, the page the migrator holds locked (Linux's
/// `remove_migration_pte` maps the new folio with a reference per entry).
#[inline]
pub(crate) fn map_migrated(phys: &PhysMem, pfn: crate::phys::Pfn) -> crate::phys::Pfn {
    phys.get(pfn).into_raw()
}
