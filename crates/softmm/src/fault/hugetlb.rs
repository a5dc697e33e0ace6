//! hugetlb faults (Linux's `hugetlb_fault`, `hugetlb_no_page`, `hugetlb_wp`):
//! a 2 MiB page mapped by one PMD leaf, installed through the page-table
//! cursor ([`crate::pgtable::PageTables::pmd_leaf_alloc`]).
//!
//! - Shared mappings map the file's page-cache page, allocating it on the
//!   first fault with the file's reservation for its index, or without one
//!   (`MAP_NORESERVE`): an empty pool is then `SIGBUS`. Writable and dirty if
//!   the VMA may write, as `make_huge_pte` makes it.
//! - Private mappings allocate an anonymous page (there is no zero page for
//!   hugetlb), consuming the mapping's reservation for the index when it
//!   still has one; a read of a hugetlbfs file's page maps the page-cache
//!   page read-only, and a write copies it (COW at 2 MiB).
//! - A write to a read-only private page reuses it when it is anonymous and
//!   ours alone, else copies it into a page taken without a reservation
//!   (what an owner does after `fork`); an owner that finds no page takes
//!   the page from its children instead (`hugetlb/cow.rs`), whose later
//!   faults in that mapping are `SIGBUS`.
//!
//! # Locking (seed 000, [`HugetlbPolicy`])
//!
//! Every fault runs under `mmap_lock` for read or, under the per-VMA fault
//! policies, the VMA's read reference (so the address space's own munmap,
//! mprotect and mremap wait for it), and holds the fault mutex of its page
//! (`phys/hugetlb/lock.rs`: file and huge page index hashed into a fixed table)
//! across the allocation and the install, so two faults on one page never
//! both allocate and truncate or hole punch, which take the same mutex to
//! remove the page, never see it mapped anew behind them. What each policy
//! adds against `huge_pmd_unshare`, which `MADV_DONTNEED` of this address
//! space or truncate from anywhere may run meanwhile (both hold `mmap_lock`
//! only for read):
//!
//! - [`HugetlbPolicy::IMmapRwsem`] (Linux 5.7–6.0): the file's `i_mmap`
//!   lock for read across the fault; an unshare holds it for write.
//! - [`HugetlbPolicy::VmaLock`] (seed 000, 6.1+): this address space's
//!   hugetlb VMA lock for read across the fault; an unshare holds it for
//!   write, then `i_mmap` for write; `i_mmap` is read only inside
//!   `huge_pmd_share`.
//! - [`HugetlbPolicy::LockFree`]: nothing more. A shared mapping's commit,
//!   under the PMD table's lock, first checks that this address space's PUD
//!   entry still links that table (the unshare clears it under the same
//!   lock) and retries the fault otherwise. A table an unshare left with no
//!   user is freed after the flush and a grace period, which the fault's
//!   epoch guard holds open, so the check never reads freed memory.
//!
//! Without any of them the cover letter's race is open: the fault's PMD
//! entry is in a table its address space no longer links, and its install
//! lands in a former sharer's table (which may have changed since: an
//! mprotect there, with the table no longer shared, made its entries
//! read-only without unsharing) — the loom models in
//! `hugetlb/loom_tests.rs` show it. A private mapping never shares its
//! tables (`want_pmd_share` needs `VM_MAYSHARE`), so its commits need no
//! check.

use super::handler::FaultCtx;
use super::{Abort, FaultError};
use crate::error::Fault;
use crate::hugetlb::lock::Kind;
use crate::hugetlb::pool::PG_HUGETLB_RESTORE_RESERVE;
use crate::migrate::LockedPage;
use crate::mm::HugetlbPolicy;
use crate::pgtable::{Leaf, Pte, PteGuard, PteKind};
use crate::phys::{FrameRef, PhysMem, PG_ANON, PG_ANON_EXCLUSIVE, PG_DIRTY, PG_FILE};
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};

use crate::hugetlb::{HPAGE_FRAMES, HPAGE_SHIFT, HPAGE_SIZE};

type FaultResult<T> = Result<T, FaultError>;

/// One hugetlb fault: the fault handler's context and whether its commits
/// must validate the PMD table's link ([`HugetlbPolicy::LockFree`]).
pub(crate) struct HugeFault<'a, 'c> {
    pub(crate) ctx: &'c FaultCtx<'a>,
    pub(crate) mm: &'a crate::mm::AddressSpace,
    pub(crate) vma: &'a Vma,
    validate: bool,
    /// Set by [`wp`] to the page the owner must take from its children
    /// (`unmap_ref_private`) once the fault's locks are dropped.
    unmap_ref: &'c std::cell::Cell<Option<crate::phys::Pfn>>,
}

fn sigbus(addr: u64) -> FaultError {
    Fault::Bus { addr }.into()
}

fn nx(vma: &Vma) -> u64 {
    if vma.flags.contains(VmFlags::EXEC) {
        0
    } else {
        Pte::NX
    }
}

/// The policy a fault runs; under loom, the models' switch may break it.
fn policy(mm: &crate::mm::AddressSpace) -> (HugetlbPolicy, bool) {
    #[cfg(loom)]
    let broken = crate::hugetlb::lock::broken::skip_policy();
    #[cfg(not(loom))]
    let broken = false;
    (mm.config.hugetlb_policy, broken)
}

/// Resolves a fault at `addr` in the hugetlb VMA `ctx.vma`, whose access
/// check the caller has made; `ctx` holds `mmap_lock` for read or the
/// VMA's read reference (`ctx.may_alloc_tables`).
pub(crate) fn hugetlb_fault(ctx: &FaultCtx<'_>, addr: u64, write: bool) -> FaultResult<()> {
    // Address spaces `huge_pmd_share` looked at, dropped after every lock
    // of the fault (declared first, so dropped last): one may die in our
    // hands.
    let mut reap = Vec::new();
    let unmap_ref = std::cell::Cell::new(None);
    match hugetlb_fault_locked(ctx, addr, write, &mut reap, &unmap_ref) {
        // hugetlb_wp found no page for the owner's copy: take the page from
        // the children with no lock of the fault held (Linux drops the
        // fault mutex and the VMA lock around `unmap_ref_private`), then
        // the access retries whatever it unmapped, as Linux's `hugetlb_wp`
        // goes back to `retry_avoidcopy`: a child that dropped the page
        // meanwhile (its munmap, COW or exit) left it mapped once, and the
        // owner's fault reuses it.
        Ok(()) if unmap_ref.get().is_some() => {
            let pfn = unmap_ref.get().expect("checked");
            drop(reap);
            #[cfg(all(test, not(loom)))]
            crate::mm::hooks::before_unmap_ref_private();
            crate::hugetlb::cow::unmap_ref_private(ctx.mm, ctx.vma, addr & !(HPAGE_SIZE - 1), pfn);
            Ok(())
        }
        // A migration of the page is under way: its migration entry met
        // (`migration_entry_wait_huge`), or its page lock held when
        // hugetlb_wp wanted it (`folio_wait_locked`). Wait with none of the
        // fault's locks held, as Linux drops the VMA lock and the fault
        // mutex first (the migrator takes `i_mmap` for write, which an
        // `i-mmap-rwsem` fault holds for read), then the access retries.
        Err(FaultError::Abort(abort @ (Abort::HugeMigration | Abort::HugePageLocked))) => {
            let haddr = addr & !(HPAGE_SIZE - 1);
            let guard = crossbeam_epoch::pin();
            if let Some(leaf) = ctx.mm.pgtables.leaf(haddr, &guard).filter(|l| l.entry_size() == HPAGE_SIZE) {
                let pte = leaf.load(haddr);
                match abort {
                    Abort::HugeMigration if pte.is_migration() => {
                        crate::migrate::hugetlb::migration_entry_wait_huge(leaf, haddr, pte);
                    }
                    Abort::HugePageLocked if pte.has_frame() => {
                        let spins = crate::migrate::hugetlb::WAIT_SPINS;
                        crate::migrate::wait_on_page_locked(&ctx.mm.phys, pte.pfn(), spins);
                    }
                    _ => {}
                }
            }
            Ok(())
        }
        r => r,
    }
}

/// [`hugetlb_fault`] under the fault mutex and the policy's lock.
fn hugetlb_fault_locked(
    ctx: &FaultCtx<'_>,
    addr: u64,
    write: bool,
    reap: &mut Vec<std::sync::Arc<dyn crate::file::Mapper>>,
    unmap_ref: &std::cell::Cell<Option<crate::phys::Pfn>>,
) -> FaultResult<()> {
    let (mm, vma) = (ctx.mm, ctx.vma);
    debug_assert!(ctx.may_alloc_tables, "a hugetlb fault allocates its PMD table");
    let haddr = addr & !(HPAGE_SIZE - 1);
    let file = vma.file.as_ref().expect("a hugetlb VMA has its file");
    let inode = file.hugetlb.as_ref().expect("a hugetlb VMA maps a hugetlb file");
    let shared = vma.flags.contains(VmFlags::MAYSHARE);
    let hugetlb = &mm.phys.hugetlb;
    let _fault_mutex = hugetlb.fault_mutexes.lock(&hugetlb.locks, file.id(), vma.huge_index(haddr));
    // hugetlb_vma_lock_read of a private owner's VMA: no zap clears and
    // frees a page of it, restoring its reservation, while this fault runs
    // (`PrivateResv::vma_lock`).
    let _resv_lock = crate::hugetlb::vma_lock(vma).map(|l| l.read());
    let (policy, broken) = policy(mm);
    let mut f = HugeFault { ctx, mm, vma, validate: false, unmap_ref };
    match policy {
        HugetlbPolicy::IMmapRwsem if !broken => {
            let i_mmap = hugetlb.locks.read(Kind::IMmapRead, &inode.vmas.i_mmap);
            fault_once(&f, haddr, addr, write, Some(&i_mmap), reap)
        }
        HugetlbPolicy::VmaLock if !broken => {
            let _vma_lock = hugetlb.locks.read(Kind::VmaLockRead, mm.hugetlb_lock.stripe(haddr));
            fault_once(&f, haddr, addr, write, None, reap)
        }
        _ => {
            f.validate = shared && !broken;
            loop {
                match fault_once(&f, haddr, addr, write, None, reap) {
                    Err(FaultError::Abort(Abort::PmdUnshared)) => hugetlb.locks.count(Kind::ValidationRetry),
                    r => return r,
                }
            }
        }
    }
}

/// The fault itself, under the policy's lock (if any).
fn fault_once(
    f: &HugeFault<'_, '_>,
    haddr: u64,
    addr: u64,
    write: bool,
    i_mmap: Option<&crate::sync::RwLockReadGuard<'_, ()>>,
    reap: &mut Vec<std::sync::Arc<dyn crate::file::Mapper>>,
) -> FaultResult<()> {
    let shared = f.vma.flags.contains(VmFlags::MAYSHARE);
    let guard = crossbeam_epoch::pin();
    // huge_pte_alloc: link another address space's PMD table when Linux
    // would (the first fault in a shareable window), else allocate one.
    crate::hugetlb::share::huge_pmd_share(f.mm, f.vma, haddr, i_mmap, reap, &guard);
    let leaf = f.mm.pgtables.pmd_leaf_alloc(haddr, &guard).ok_or(Fault::Oom { addr })?;
    let pte = leaf.load(haddr);
    match pte.kind() {
        PteKind::None if shared => no_page_shared(f, leaf, haddr, addr, &guard),
        PteKind::None => no_page_private(f, leaf, haddr, addr, write, &guard),
        PteKind::ProtNone(_) => {
            // An entry `mprotect(PROT_NONE)` hid, in a VMA accessible again.
            let mut ptl = leaf.lock();
            validate(f, &leaf, haddr, &guard)?;
            if ptl.get(haddr) == pte {
                let mut new = pte.unprotnone();
                if !f.vma.flags.contains(VmFlags::WRITE) {
                    new = new.clear(Pte::WRITE);
                }
                ptl.set(haddr, new);
            }
            Ok(())
        }
        PteKind::Page(_) if write && !pte.has(Pte::WRITE) => wp(f, leaf, haddr, pte, addr, &guard),
        PteKind::Page(_) => Ok(()),
        // hugetlb migration: `hugetlb_fault` waits, with no lock held.
        PteKind::Migration(_) => Err(FaultError::Abort(Abort::HugeMigration)),
        // No guard markers for hugetlb here.
        _ => Err(sigbus(addr)),
    }
}

/// [`HugetlbPolicy::LockFree`]'s check, under the PMD table's lock: this
/// address space still links the table the fault is about to change.
#[inline]
fn validate(f: &HugeFault<'_, '_>, leaf: &Leaf<'_>, haddr: u64, guard: &crossbeam_epoch::Guard) -> FaultResult<()> {
    if f.validate && !f.mm.pgtables.pmd_links(haddr, leaf, guard) {
        return Err(FaultError::Abort(Abort::PmdUnshared));
    }
    Ok(())
}

/// `hugetlb_no_page` for a shared mapping: the page-cache page, allocated on
/// the first fault.
fn no_page_shared(
    f: &HugeFault<'_, '_>,
    leaf: Leaf<'_>,
    haddr: u64,
    addr: u64,
    guard: &crossbeam_epoch::Guard,
) -> FaultResult<()> {
    let (mm, vma) = (f.mm, f.vma);
    let file = vma.file.as_ref().expect("file");
    let resv = file.hugetlb.as_ref().expect("hugetlb file");
    let idx = vma.huge_index(haddr);
    let page = match file.find_get_page(idx) {
        Some(p) => p,
        None => {
            if idx >= file.len() >> HPAGE_SHIFT {
                return Err(sigbus(addr));
            }
            // vma_has_reserves: a shared mapping has one for an index its
            // file's reserve map covers, MAP_NORESERVE or not.
            let reserved = resv.covers(idx);
            let page = mm.phys.alloc_huge(&mm.placement(vma, haddr), reserved).ok_or_else(|| sigbus(addr))?;
            if !reserved {
                resv.add(idx);
            }
            let added = file.add_huge_page(idx, &page);
            debug_assert!(added, "the fault mutex excludes a second instantiation");
            page
        }
    };
    let flags = if vma.flags.contains(VmFlags::WRITE) {
        page.desc().flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
        Pte::WRITE | Pte::DIRTY
    } else {
        0
    };
    // A retry after a failed validation finds the page in the page cache.
    install(f, leaf, haddr, page, flags | nx(vma), guard)?;
    mm.count_hugetlb_fault();
    Ok(())
}

/// `hugetlb_no_page` for a private mapping: a new anonymous page, or the
/// file's page read-only for a read of a hugetlbfs file.
fn no_page_private(
    f: &HugeFault<'_, '_>,
    leaf: Leaf<'_>,
    haddr: u64,
    addr: u64,
    write: bool,
    guard: &crossbeam_epoch::Guard,
) -> FaultResult<()> {
    let (mm, vma) = (f.mm, f.vma);
    // HPAGE_RESV_UNMAPPED: the owner took a page of this mapping
    // (`unmap_ref_private`): "killed due to inadequate hugepage pool".
    if vma.hugetlb_unmapped() {
        return Err(sigbus(addr));
    }
    let file = vma.file.as_ref().expect("file");
    let idx = vma.huge_index(haddr);
    // hugetlb_no_page: past i_size rounded down to huge pages.
    if idx >= file.len() >> HPAGE_SHIFT {
        return Err(sigbus(addr));
    }
    let cached = file.find_get_page(idx);
    if let (Some(page), false) = (&cached, write) {
        install(f, leaf, haddr, page.clone(), nx(vma), guard)?;
        mm.count_hugetlb_fault();
        return Ok(());
    }
    // The first anonymous page of the VMA: without `mmap_lock` this is the
    // fallback's to do (fork and merging must see the anon_vma).
    super::handler::anon_vma_prepare(f.ctx)?;
    let page = alloc_private(mm, vma, haddr, addr)?;
    if let Some(src) = cached {
        copy_huge(mm, &src, &page);
    }
    let flags = if write { Pte::WRITE | Pte::DIRTY } else { 0 };
    install(f, leaf, haddr, page, flags | nx(vma), guard)?;
    mm.count_hugetlb_fault();
    Ok(())
}

/// A page for a private mapping at `haddr`: with its reservation if the
/// mapping still holds one for the index, else an unreserved one or `SIGBUS`.
pub(crate) fn alloc_private<'p>(
    mm: &'p crate::mm::AddressSpace,
    vma: &Vma,
    haddr: u64,
    addr: u64,
) -> FaultResult<FrameRef<'p>> {
    let reserved = vma.hugetlb_resv.as_ref().is_some_and(|r| r.take(vma.huge_index(haddr)));
    let Some(page) = mm.phys.alloc_huge(&mm.placement(vma, haddr), reserved) else {
        // No page although reserved: the pool still owes the reservation
        // (see `PoolState::rsvd`). The map keeps it, as Linux's
        // `vma_end_reservation` after a failed `alloc_hugetlb_folio`: taken
        // out of it for nothing, no unmap would ever give it back.
        if reserved {
            vma.hugetlb_resv.as_ref().expect("taken from it").restore(vma.huge_index(haddr));
        }
        return Err(sigbus(addr));
    };
    let d = page.desc();
    // A page that consumed a reservation gives it back if it is freed
    // before it is mapped (alloc_hugetlb_folio's restore flag; mapping it
    // clears the flag, see `huge_entry`).
    let restore = if reserved { PG_HUGETLB_RESTORE_RESERVE } else { 0 };
    d.flags.store(PG_ANON | PG_DIRTY | PG_ANON_EXCLUSIVE | restore, Ordering::Relaxed);
    d.index.store(vma.huge_index(haddr), Ordering::Relaxed);
    Ok(page)
}

/// `hugetlb_fault`'s `folio_get` and `folio_trylock` of the page that the
/// entry at `haddr`, locked in `ptl`, maps, for a write-protect fault or an
/// unshare about to reuse or copy it: both under the PMD lock, as a frame
/// number read without it may name a page freed since. `None` when the
/// page's lock is held (a migration of it is under way): the caller drops
/// its locks and waits ([`crate::migrate::wait_on_page_locked`]).
pub(crate) fn lock_mapped_page<'p>(ptl: &PteGuard<'_>, haddr: u64, phys: &'p PhysMem) -> Option<LockedPage<'p>> {
    let page = ptl.page(haddr, phys).expect("the entry holds a page");
    #[cfg(loom)]
    if crate::hugetlb::lock::broken::unlocked_page_ref() {
        return Some(LockedPage::unlocked(page));
    }
    LockedPage::try_lock(page).ok()
}

/// Under loom's `UNLOCKED_PAGE_REF`, the order before [`lock_mapped_page`]:
/// once the PMD lock is gone the reference is dropped and taken again from
/// the frame number, so a migration that freed the page in between leaves
/// it on a free page. Otherwise `page` as it is.
#[cfg(loom)]
pub(crate) fn broken_late_ref(page: LockedPage<'_>) -> LockedPage<'_> {
    if !crate::hugetlb::lock::broken::unlocked_page_ref() {
        return page;
    }
    let (phys, pfn) = (page.page().phys(), page.page().pfn());
    drop(page);
    LockedPage::unlocked(phys.get(pfn))
}

/// Linux's `restore_reserve_on_error`: `page`, taken by [`alloc_private`]
/// for `haddr` of `vma`, is dropped unmapped (the fault lost a race). A
/// reservation it consumed goes back to the mapping's reserve map, and the
/// page gives the pool's count back when it is freed; if the map has the
/// index unused again already (a `MADV_DONTNEED` restored it meanwhile,
/// on a page of its own), the page gives nothing back.
pub(crate) fn restore_reserve_on_error(vma: &Vma, haddr: u64, page: &FrameRef<'_>) {
    let d = page.desc();
    if d.flags.load(Ordering::Relaxed) & PG_HUGETLB_RESTORE_RESERVE == 0 {
        return;
    }
    if !vma.hugetlb_resv.as_ref().is_some_and(|r| r.restore(vma.huge_index(haddr))) {
        d.flags.fetch_and(!PG_HUGETLB_RESTORE_RESERVE, Ordering::Relaxed);
    }
}

/// The 2 MiB leaf entry mapping `page` with the extra bits `flags`, taking
/// over its reference; a page [`alloc_private`] took for a reservation is
/// now in use, so freeing it later restores nothing (Linux's
/// `hugetlb_add_new_anon_rmap` clears the restore flag).
pub(crate) fn huge_entry(page: FrameRef<'_>, flags: u64) -> Pte {
    page.desc().flags.fetch_and(!PG_HUGETLB_RESTORE_RESERVE, Ordering::Relaxed);
    crate::rmap::mapped(page, flags | Pte::HUGE)
}

/// Copies a huge page's 512 frames.
pub(crate) fn copy_huge(mm: &crate::mm::AddressSpace, src: &FrameRef<'_>, dst: &FrameRef<'_>) {
    mm.phys.copy_frames(src.pfn(), dst.pfn(), HPAGE_FRAMES as usize);
}

/// Installs `page` as the 2 MiB leaf at `haddr`, which the fault mutex keeps
/// empty since the fault read it (only a zap may have run, leaving it empty),
/// after the policy's validation. The entry gets the VMA's protection as
/// `make_huge_pte` takes `vm_page_prot`: writable only in a `VM_WRITE` VMA,
/// and `PROT_NONE` in a VMA without access, which only a forced (`FOLL_FORCE`)
/// fault reaches: the page it brings in stays out of the guest's reach.
fn install(
    f: &HugeFault<'_, '_>,
    leaf: Leaf<'_>,
    haddr: u64,
    page: FrameRef<'_>,
    flags: u64,
    guard: &crossbeam_epoch::Guard,
) -> FaultResult<()> {
    let mut ptl = leaf.lock();
    if let Err(e) = validate(f, &leaf, haddr, guard) {
        restore_reserve_on_error(f.vma, haddr, &page);
        return Err(e);
    }
    if !ptl.get(haddr).is_none() {
        // MADV_DONTNEED zaps without the fault mutex but never installs.
        restore_reserve_on_error(f.vma, haddr, &page);
        return Ok(());
    }
    let flags = if f.vma.flags.contains(VmFlags::WRITE) { flags } else { flags & !Pte::WRITE };
    let entry = huge_entry(page, flags | Pte::ACCESSED);
    ptl.set(haddr, if f.vma.flags.intersects(VmFlags::ACCESS_FLAGS) { entry } else { entry.protnone() });
    Ok(())
}

/// `hugetlb_wp`: a write to a read-only present page.
///
/// Everything it decides on the page, and the reference it takes for the
/// copy, happens under the PMD lock with the entry checked again: the entry
/// read without the lock may name a page that migration, `MADV_DONTNEED` or
/// `unmap_ref_private` has freed since (and the pool handed out again).
fn wp(
    f: &HugeFault<'_, '_>,
    leaf: Leaf<'_>,
    haddr: u64,
    pte: Pte,
    addr: u64,
    guard: &crossbeam_epoch::Guard,
) -> FaultResult<()> {
    let (mm, vma) = (f.mm, f.vma);
    let phys = &mm.phys;
    let writable = pte.set(Pte::WRITE | Pte::DIRTY | Pte::ACCESSED);
    let mut ptl = leaf.lock();
    validate(f, &leaf, haddr, guard)?;
    if ptl.get(haddr) != pte {
        // Changed since the fault read it: the access retries.
        return Ok(());
    }
    let d = phys.desc(pte.pfn());
    if vma.flags.contains(VmFlags::SHARED) {
        d.flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
        ptl.set(haddr, writable);
        return Ok(());
    }
    // hugetlb_fault's folio_trylock: a migration holds the lock from its
    // unmap to its remap, during which the page's other mappings are
    // migration entries its map count does not show.
    let Some(old_page) = lock_mapped_page(&ptl, haddr, phys) else {
        return Err(FaultError::Abort(Abort::HugePageLocked));
    };
    let flags = d.flags.load(Ordering::Relaxed);
    let anon = flags & PG_ANON != 0 && flags & PG_FILE == 0;
    // Reuse an anonymous page this entry alone maps, whatever other
    // references it has (a get_user_pages reference, an isolation): Linux
    // relies on the mapcount, not the refcount, so that a fork()+exit()
    // user with the pool empty is not killed by a transient reference.
    // Under the PMD lock no new mapping of the page appears (fork copies
    // under it).
    if anon && d.mapcount() == 1 {
        d.flags.fetch_or(PG_ANON_EXCLUSIVE, Ordering::Relaxed);
        ptl.set(haddr, writable);
        return Ok(());
    }
    drop(ptl);
    #[cfg(loom)]
    let old_page = broken_late_ref(old_page);
    super::handler::anon_vma_prepare(f.ctx)?;
    let new = match alloc_private(mm, vma, haddr, addr) {
        Ok(page) => page,
        // unmap_ref_private: the owner of the reservations takes its
        // anonymous page back from the children and reuses it, once this
        // fault's locks are dropped (`hugetlb_fault`).
        Err(_) if vma.hugetlb_resv.is_some() && anon => {
            f.unmap_ref.set(Some(pte.pfn()));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    copy_huge(mm, old_page.page(), &new);
    let mut ptl = leaf.lock();
    if ptl.get(haddr) != pte {
        restore_reserve_on_error(vma, haddr, &new);
        return Ok(());
    }
    // Clear, flush, then install: no CPU may read the old copy after a
    // write to the new one.
    let old = crate::rmap::unmap_page(&mut ptl, haddr, phys).expect("a present entry holds a page");
    let flushed = mm.flush_tlb();
    ptl.set(haddr, huge_entry(new, Pte::WRITE | Pte::DIRTY | Pte::ACCESSED | nx(vma)));
    drop(ptl);
    old.release(flushed);
    mm.count_hugetlb_fault();
    Ok(())
}
