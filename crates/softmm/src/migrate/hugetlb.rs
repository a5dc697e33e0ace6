//! hugetlb page migration (`move_pages`, `mbind` with `MPOL_MF_MOVE`,
//! `migrate_pages(2)`): Linux's `isolate_hugetlb`, `migrate_hugetlbs` and
//! `unmap_and_move_huge_page`.
//!
//! A hugetlb page moves alone (Linux migrates hugetlb folios one at a time,
//! before any small page of the same call): its target is a free page that
//! nobody reserved, of the target node's pool for `move_pages` and
//! `migrate_pages(2)` (`alloc_hugetlb_folio_nodemask` with
//! `__GFP_THISNODE`), of the first pool with one in the zonelist of the
//! policy's node within its mask for `mbind` (none is `-ENOMEM`, which ends
//! the call as Linux's `migrate_pages` returns `-ENOMEM`), then
//!
//! 1. **unmap**: with the page locked, every PMD leaf mapping it (found
//!    through the file's `i_mmap`: shared mappings, and private ones, whose
//!    anonymous copies live at the file's index too) becomes a PMD-level
//!    migration entry (`set_huge_pte_at` with a migration entry), dropping
//!    its reference. A PMD table still shared when a sharer is reached is
//!    unshared in that sharer instead (Linux's `try_to_migrate_one`: the
//!    hugetlb VMA lock taken for write with a trylock, since it comes before
//!    `i_mmap` in the lock order, then `huge_pmd_unshare` and its flush),
//!    which unmaps the page there; the last sharer, whose table is no longer
//!    shared, gets the migration entry. A sharer whose VMA lock is busy keeps
//!    its link and the page stays mapped: the reference check fails and the
//!    page is put back (`-EAGAIN`, retried). An unshared sharer's next fault
//!    links the table again (or waits on its migration entry);
//! 2. **flush**: one TLB flush per address space reached, all begun before
//!    any is waited for;
//! 3. **copy** 2 MiB, once only the migrator (and, for a page-cache page,
//!    the cache) holds the page: a pin, a `get_user_pages` reference or a
//!    mapping the walk did not reach keeps it where it is (Linux's
//!    refcount freeze, `-EAGAIN`, retried up to the pass limit, then counted
//!    as not moved). A page-cache page's cache slot switches to the new
//!    page under the cache's lock with the copy;
//! 4. **remap**: every migration entry for the old page becomes a present
//!    entry of the new one (or of the old one, if it stayed).
//!
//! A hugetlb fault on a migration entry waits until the entry changes and
//! retries (`migration_entry_wait_huge`, [`migration_entry_wait_huge`]), so
//! a write either lands before the unmap's flush and is copied, or lands in
//! the new page.
//!
//! Locks: each address space's `mmap_lock` for read (taken recursively, as
//! the small-page walk does, so that a writer queued behind a fault that
//! waits for this migration does not block the remap), then the file's
//! `i_mmap` lock for write while the entries are changed, as every change
//! to a table that was shared takes it (`hugetlb/share.rs`): it waits out
//! the flush of an unsharer whose CPUs may still reach the table. A fault
//! that meets a migration entry waits with none of its locks held.

use std::sync::Arc;

use crate::error::Errno;
use crate::file::Inode;
use crate::mempolicy::MPOL_MF_MOVE_ALL;
use crate::migrate::{lock_page, unlock_page, Isolated, LockedPage, Outcome, Owner, NR_MAX_MIGRATE_PAGES_RETRY};
use crate::mm::AddressSpace;
use crate::pgtable::{Leaf, PageTables, Pte};
use crate::phys::{FrozenPage, PhysMem, Placement, PG_ANON_EXCLUSIVE, PG_FILE, PG_ISOLATED, PG_LOCKED};
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SHIFT;

use crate::hugetlb::{HPAGE_SHIFT, HPAGE_SIZE};

/// `__add_folio_for_migration` for the hugetlb page mapped at `addr` of
/// the hugetlb VMA `vma` (the caller holds `mmap_lock`, and has already
/// answered for a page on the target node): `-ENOENT` for nothing
/// mapped (a page under migration included: its entry is not present);
/// `Ok(None)` (left where it is: `-EACCES` in `move_pages`, not a
/// failure in `mbind`) for a page mapped more than once without
/// `MPOL_MF_MOVE_ALL` (`folio_likely_mapped_shared`: one PMD entry maps
/// it per page table, so sharers through one shared table count once);
/// `-EBUSY` when another migration holds it (`isolate_hugetlb` failed);
/// else the page, isolated, found through its VMA's file at its huge
/// index.
pub(crate) fn hugetlb_isolate<'m>(
    mm: &'m AddressSpace,
    vma: &Vma,
    addr: u64,
    flags: u32,
) -> Result<Option<Isolated<'m>>, i32> {
    let guard = crossbeam_epoch::pin();
    let leaf = mm.pgtables.leaf(addr, &guard).ok_or(-libc::ENOENT)?;
    let ptl = leaf.lock();
    let pte = ptl.get(addr);
    if !pte.has_frame() {
        return Err(-libc::ENOENT);
    }
    // The entry holds the head frame; its counts are the huge page's.
    let d = mm.phys.desc(pte.pfn());
    let cached = vma.file.is_some() && d.flags.load(Ordering::Relaxed) & PG_FILE != 0;
    let own = 1 + u64::from(cached);
    let mapped_shared =
        u64::from(d.refcount.load(Ordering::Relaxed)) > own + u64::from(d.pincount.load(Ordering::Relaxed));
    if mapped_shared && flags & MPOL_MF_MOVE_ALL == 0 {
        return Ok(None);
    }
    let file = vma.file.clone().ok_or(-libc::EBUSY)?;
    // Our reference keeps the page (not its mappings) once the PMD
    // lock goes for the reverse walk.
    let page = ptl.page(addr, &mm.phys).expect("the entry holds a page");
    drop(ptl);
    if d.flags.fetch_or(PG_ISOLATED, Ordering::AcqRel) & PG_ISOLATED != 0 {
        return Err(-libc::EBUSY);
    }
    let index = vma.huge_index(addr & !(HPAGE_SIZE - 1));
    Ok(Some(Isolated { page, owner: Owner::File(file), index }))
}

/// `queue_folios_hugetlb`'s extra rule for `mbind` and `migrate_pages`:
/// without `MPOL_MF_MOVE_ALL`, a hugetlb page mapped through a shared
/// PMD table (`hugetlb_pmd_shared`) is left where it is, and that is
/// not a failure.
pub(crate) fn hugetlb_queue_skips(pgtables: &PageTables, addr: u64, flags: u32) -> bool {
    flags & MPOL_MF_MOVE_ALL == 0 && pgtables.pmd_is_shared(addr, &crossbeam_epoch::pin())
}

/// How long a hugetlb fault (or unshare) waits, with its locks dropped, for
/// a migration to move on (its entry to change, its page lock to go) before
/// it looks again: bounded, for the reason [`migration_entry_wait_huge`]
/// gives.
#[cfg(not(loom))]
pub(crate) const WAIT_SPINS: u32 = 128;
#[cfg(loom)]
pub(crate) const WAIT_SPINS: u32 = 1;

/// `migration_entry_wait_huge`: the hugetlb page at `haddr` is being
/// migrated; wait a while, holding no PMD lock, for its entry to change (the
/// migrator restores it, or a zap clears it), then the caller retries the
/// fault. The caller holds none of the hugetlb fault's locks (the migrator
/// takes `i_mmap` for write) but may hold the VMA's read reference or
/// `mmap_lock` for read, so the wait is bounded: the migrator takes each
/// mapper's `mmap_lock`, which a `fork` holding it for write may be unable
/// to hand on until our VMA reference goes, so the fault must return and
/// drop it rather than wait for the migrator without end.
pub(crate) fn migration_entry_wait_huge(leaf: Leaf<'_>, haddr: u64, pte: Pte) {
    for i in 0..WAIT_SPINS {
        if leaf.load(haddr) != pte {
            return;
        }
        crate::sync::spin_hint(i);
    }
}

/// Linux's `migrate_hugetlbs`: moves the hugetlb pages `todo` of `pages`
/// to a free unreserved page of a node `at` allows (its node first, then
/// the others in its zonelist order) one at a time, retrying a page that is
/// transiently held up to the pass limit, and writes each one's outcome.
/// Returns true when no allowed node had a free unreserved page (`-ENOMEM`): the pages not
/// tried yet are marked so, and the caller stops there as Linux does.
/// Adds the PMD locks the walks took to `ptl_locks`.
pub(crate) fn migrate_hugetlbs<'p>(
    phys: &'p PhysMem,
    pages: &mut [Isolated<'p>],
    todo: &[usize],
    at: &Placement,
    out: &mut [Outcome],
    ptl_locks: &mut u64,
) -> bool {
    for (n, &i) in todo.iter().enumerate() {
        let mut outcome = Outcome::Failed(Errno::Again);
        for _ in 0..NR_MAX_MIGRATE_PAGES_RETRY {
            outcome = unmap_and_move_huge_page(phys, &mut pages[i], at, ptl_locks);
            if outcome != Outcome::Failed(Errno::Again) {
                break;
            }
        }
        out[i] = outcome;
        if outcome == Outcome::Failed(Errno::NoMem) {
            for &j in &todo[n + 1..] {
                out[j] = Outcome::Failed(Errno::NoMem);
            }
            return true;
        }
    }
    false
}

/// Calls `f` on the PMD leaf entry at huge index `hidx` of `file` in every
/// VMA mapping it, in every address space that maps the file, under that
/// address space's `mmap_lock` (read, recursive), the file's `i_mmap`
/// lock (write) and the PMD lock; `f` returns the entry to store, if any. The
/// mappers are read again after each one is visited: a fork that was
/// copying the visited one's entries (under its `mmap_lock` for write) has
/// recorded its child by then. An entry in a shared PMD table is reached
/// once per sharer, unless `unshare`: then a sharer reached while its table
/// is still shared unshares it instead (see the module doc) and `f` is not
/// called for it.
fn walk_huge(
    phys: &PhysMem,
    file: &Arc<Inode>,
    hidx: u64,
    unshare: bool,
    ptl_locks: &mut u64,
    mut f: impl FnMut(&Arc<AddressSpace>, VmFlags, Pte) -> Option<Pte>,
) {
    let first = hidx << (HPAGE_SHIFT - PAGE_SHIFT);
    let mut visited: Vec<*const AddressSpace> = Vec::new();
    loop {
        let next = file
            .mappers()
            .into_iter()
            .filter_map(AddressSpace::from_mapper)
            .find(|mm| !visited.contains(&Arc::as_ptr(mm)));
        let Some(mm) = next else { return };
        visited.push(Arc::as_ptr(&mm));
        let st = mm.read_lock_recursive();
        // `i_mmap` for write, as every change to a table that was shared
        // (`hugetlb/share.rs`): it waits out an unsharer's flush.
        let inode = file.hugetlb.as_ref().expect("a hugetlb page's file is a hugetlb file");
        phys.hugetlb.locks.count(crate::hugetlb::lock::Kind::IMmapWrite);
        let _i_mmap = inode.vmas.i_mmap.write();
        let guard = crossbeam_epoch::pin();
        for vma in st.vmas().iter() {
            let ours = vma.file.as_ref().is_some_and(|f| f.id() == file.id());
            if !ours || !(vma.pgoff..vma.pgoff + vma.pages()).contains(&first) {
                continue;
            }
            let haddr = vma.start + ((first - vma.pgoff) << PAGE_SHIFT);
            if unshare && crate::vma::want_pmd_share(vma, haddr) {
                // try_to_migrate_one, a file page: the VMA lock is taken
                // before i_mmap elsewhere, so only tried here; busy, the
                // page stays mapped in this address space and the move
                // fails its reference check. Under both locks no sharer
                // links or unlinks the table, so the check holds.
                let w = haddr & !(crate::hugetlb::share::PUD_SIZE - 1);
                let Some(_vma_lock) = mm.hugetlb_lock.stripe(w).try_write() else { continue };
                phys.hugetlb.locks.count(crate::hugetlb::lock::Kind::VmaLockWrite);
                if mm.pgtables.pmd_is_shared(haddr, &guard) {
                    // Unmaps the page here, and flushes this address space.
                    mm.huge_pmd_unshare_locked(w, &guard);
                    continue;
                }
            }
            let Some(leaf) = mm.pgtables.leaf(haddr, &guard) else { continue };
            if leaf.entry_size() != HPAGE_SIZE {
                continue;
            }
            let mut ptl = leaf.lock();
            *ptl_locks += 1;
            if let Some(new) = f(&mm, vma.flags, ptl.get(haddr)) {
                ptl.replace(haddr, new);
            }
        }
    }
}

/// Linux's `unmap_and_move_huge_page` for one isolated hugetlb page (found
/// through its file): see the module's comment. `Failed(NoMem)` before
/// anything is unmapped when no node `at` allows has a free unreserved
/// page (Linux's `alloc_hugetlb_folio_nodemask`: the zonelist of the
/// target node within the policy's mask for `mbind`, the target node only
/// with `__GFP_THISNODE` for `move_pages` and `migrate_pages(2)`);
/// `Failed(Again)` when the page is pinned or otherwise still referenced
/// once unmapped (it is then mapped again where it was).
fn unmap_and_move_huge_page<'p>(
    phys: &'p PhysMem,
    p: &mut Isolated<'p>,
    at: &Placement,
    ptl_locks: &mut u64,
) -> Outcome {
    let Owner::File(file) = &p.owner else {
        // Every hugetlb page is isolated through its VMA's file.
        return Outcome::Failed(Errno::Busy);
    };
    let old = p.page.pfn();
    let d = phys.desc(old);
    if d.refcount.load(Ordering::Acquire) == 1 {
        // Freed from under us (unmapped and out of the cache): done.
        return Outcome::Moved;
    }
    let dst = at.zonelist(phys.nodes()).find_map(|n| phys.alloc_huge_on(n));
    let Some(dst) = dst else { return Outcome::Failed(Errno::NoMem) };
    // The target is locked too until every entry is remapped (Linux's
    // `folio_trylock(dst)`): a write fault on an entry already remapped to
    // it would otherwise find its map count 1 while the page's other
    // mappings are still migration entries, and reuse it.
    let Ok(target) = LockedPage::try_lock(dst) else { unreachable!("a page fresh from the pool is not locked") };
    let dst = target.page();
    lock_page(phys, old);
    if d.pincount.load(Ordering::Acquire) > 0 {
        // folio_ref_freeze would fail: a pinned page stays (-EAGAIN).
        unlock_page(phys, old);
        return Outcome::Failed(Errno::Again);
    }
    let is_file = d.flags.load(Ordering::Relaxed) & PG_FILE != 0;
    // Unmap: each entry mapping the page becomes a migration entry.
    let mut mms: Vec<Arc<AddressSpace>> = Vec::new();
    walk_huge(phys, file, p.index, true, ptl_locks, |mm, _, pte| {
        let maps_old = (pte.has_frame() || pte.is_migration()) && pte.pfn() == old;
        if maps_old && !mms.iter().any(|m| Arc::ptr_eq(m, mm)) {
            mms.push(mm.clone());
        }
        if !maps_old || pte.is_migration() {
            return None;
        }
        // The entry's reference goes; ours keeps the page.
        Some(crate::rmap::try_to_migrate_pte(phys, pte))
    });
    let (flushed, _late) = super::flush_unmapped(&mms);
    // Frozen and copied once only our reference (and the cache's, under
    // its lock) is left, as in `migrate_batch`; `dst` is fresh from the
    // pool, reachable through its reference alone.
    let moved = if is_file {
        file.migrate_page(p.index, &p.page, dst, &flushed)
    } else {
        FrozenPage::freeze(&p.page, &flushed).map(|page| page.copy_to(dst)).is_some()
    };
    let new = if moved { dst.pfn() } else { old };
    if moved {
        // move_hugetlb_state: the new page takes the old one's state (a
        // pending reservation restore included); the old one goes back to
        // its node's pool as a plain free page. Exclusivity travels in the
        // migration entry, which a fork meanwhile made shared.
        let nd = dst.desc();
        let flags = d.flags.load(Ordering::Relaxed);
        // Still locked (`target`) until the remap is done.
        nd.flags.store(flags & !(PG_ISOLATED | PG_ANON_EXCLUSIVE) | PG_LOCKED, Ordering::Relaxed);
        nd.index.store(d.index.load(Ordering::Relaxed), Ordering::Relaxed);
        nd.mapping.store(d.mapping.load(Ordering::Relaxed), Ordering::Relaxed);
        d.flags.store(flags & (PG_LOCKED | PG_ISOLATED), Ordering::Relaxed);
    }
    // Remap: every migration entry of the old page maps `new`.
    walk_huge(phys, file, p.index, false, ptl_locks, |_, flags, pte| {
        if !pte.is_migration() || pte.pfn() != old {
            return None;
        }
        let entry = crate::rmap::remove_migration_pte(phys, new, pte);
        // The VMA's protection now: PROT_NONE set meanwhile hides the page.
        Some(if flags.intersects(VmFlags::ACCESS_FLAGS) { entry } else { entry.protnone() })
    });
    unlock_page(phys, old);
    if moved {
        // folio_putback_active_hugetlb(src): the source goes back to the
        // pool now, so that the call's next huge page can move into the room
        // it made; the isolation holds the target instead.
        p.page = dst.clone();
    }
    // The target's lock and then its allocation reference go here: the
    // entries and the cache hold theirs, and a page that stayed frees its
    // unused target.
    drop(target);
    if moved {
        Outcome::Moved
    } else {
        Outcome::Failed(Errno::Again)
    }
}
