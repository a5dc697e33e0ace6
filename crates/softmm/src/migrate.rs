//! Page migration (Linux's `mm/migrate.c`), with seed 003's batched TLB
//! flushing ("migrate_pages(): batch TLB flushing", Huang Ying, Linux 6.3).
//!
//! A page moves in four phases: **unmap** (every entry mapping it, found by
//! the anonymous reverse walk, becomes a migration entry under its table's
//! lock, and gives back its reference), **flush** (the TLBs of every
//! address space involved), **copy** (into a frame of the target node, or
//! for `mbind` of a node its policy allows: see [`migrate_pages`]), and
//! **remap** (every migration entry for the old frame, found by a second
//! walk, becomes a present entry of the new one). A fault on a migration
//! entry waits until the entry changes (see the fault handler), so a write
//! by another thread either lands before the unmap's flush and is copied, or
//! waits and lands in the new page.
//!
//! [`MigratePolicy::OneByOne`] runs the four phases per page: one flush per
//! page. [`MigratePolicy::Batched`] (seed 003) unmaps up to
//! [`NR_MAX_BATCHED_MIGRATION`] pages, then begins one flush per address
//! space involved and waits for all of them (`flush_tlb_begin` tickets: the
//! flushes of several address spaces proceed together), then copies and
//! remaps all.
//!
//! Page locks, and the deadlock found in review of seed 003 (Hugh Dickins):
//! a batch that holds several page locks must never sleep on another lock.
//! The batch takes the first page's lock with a blocking `lock_page` and
//! every later one with a trylock; a page whose trylock fails is left for
//! after the batch (which finishes with what it holds), and is then migrated
//! alone, holding one page lock while it may block (Linux's
//! `migrate_pages_sync`: an asynchronous batch first, then one by one).
//!
//! A page whose references are not all accounted for once it is unmapped (a
//! pin, a reference taken by `get_user_pages`, a mapping the walk could not
//! reach) is put back as it was and counted as failed (Linux's refcount
//! freeze, `-EAGAIN` until the pass limit). A page-cache page is found
//! through its file's `i_mmap` (shared mappings and the private ones that
//! still map it), and its page-cache entry switches to the new page under
//! the cache's lock, with the copy, once only the cache and the migrator
//! hold it (Linux's `folio_migrate_mapping`).

use std::sync::Arc;

use crate::error::Errno;
use crate::file::Inode;
use crate::mm::AddressSpace;
use crate::pgtable::{Pte, PMD_SIZE};
use crate::phys::{
    FrameRef, FrozenPage, Pfn, PhysMem, Placement, TlbFlushed, PG_ANON_EXCLUSIVE, PG_ISOLATED, PG_LOCKED,
};
use crate::sync::broken::migrate as broken;
use crate::sync::Ordering;
use crate::vma::{AnonFamily, VmFlags};
use crate::PAGE_SIZE;

pub(crate) mod hugetlb;
#[cfg(all(test, loom))]
mod loom_tests;

pub(crate) use crate::policy::MigratePolicy;

/// Most pages unmapped at once by [`MigratePolicy::Batched`] (Linux's
/// `NR_MAX_BATCHED_MIGRATION`, `HPAGE_PMD_NR`): it bounds how long a page
/// stays unmapped while a faulting thread waits for it.
pub const NR_MAX_BATCHED_MIGRATION: usize = 512;

/// Passes over pages whose unaccounted references may be transient (Linux's
/// `NR_MAX_MIGRATE_PAGES_RETRY`).
pub(crate) const NR_MAX_MIGRATE_PAGES_RETRY: usize = 10;

/// A page isolated for migration: the caller's reference keeps it, and its
/// owner and index find its mappings.
pub(crate) struct Isolated<'p> {
    pub(crate) page: FrameRef<'p>,
    pub(crate) owner: Owner,
    /// The anonymous page's linear index, or the file page's offset in pages.
    pub(crate) index: u64,
}

/// What a page's mappings are found through (Linux's `folio->mapping`).
pub(crate) enum Owner {
    /// An anonymous page: the address spaces of its anon family.
    Anon(Arc<AnonFamily>),
    /// A page-cache page: the address spaces mapping the file (`i_mmap`),
    /// private mappings included (their entries that still map the page
    /// cache's page, not a COW copy).
    File(Arc<Inode>),
}

/// The page lock (`PG_locked`), taken with a trylock.
fn trylock_page(phys: &PhysMem, pfn: Pfn) -> bool {
    // Acquire pairs with the Release of `unlock_page`.
    phys.desc(pfn).flags.fetch_or(PG_LOCKED, Ordering::Acquire) & PG_LOCKED == 0
}

/// A page held by a reference and locked with its page lock, taken with a
/// trylock under the entry's table lock by a fault about to reuse or copy
/// it (Linux's `folio_get` and `folio_trylock` in `hugetlb_fault`), and by
/// a migration for its target: a migration holds its pages' locks from the
/// unmap to the remap, so while a fault holds this no mapping of the page
/// turns into a migration entry or back, and a map count read under it is
/// not one that a migration in progress has lowered. Dropping it unlocks,
/// then drops the reference.
#[must_use = "dropping the guard releases the page lock"]
pub(crate) struct LockedPage<'p> {
    page: FrameRef<'p>,
    /// Under loom, false for a page a broken variant did not lock
    /// (`phys::hugetlb::lock::broken::UNLOCKED_PAGE_REF`).
    #[cfg(loom)]
    locked: bool,
}

impl<'p> LockedPage<'p> {
    /// `page` locked, or `page` back if someone holds its lock.
    pub(crate) fn try_lock(page: FrameRef<'p>) -> Result<LockedPage<'p>, FrameRef<'p>> {
        if !trylock_page(page.phys(), page.pfn()) {
            return Err(page);
        }
        Ok(LockedPage {
            page,
            #[cfg(loom)]
            locked: true,
        })
    }

    /// A broken variant's "locked" page that is not locked.
    #[cfg(loom)]
    pub(crate) fn unlocked(page: FrameRef<'p>) -> LockedPage<'p> {
        LockedPage { page, locked: false }
    }

    /// The page.
    pub(crate) fn page(&self) -> &FrameRef<'p> {
        &self.page
    }
}

impl Drop for LockedPage<'_> {
    fn drop(&mut self) {
        #[cfg(loom)]
        if !self.locked {
            return;
        }
        unlock_page(self.page.phys(), self.page.pfn());
    }
}

/// `folio_wait_locked`, bounded: spins up to `spins` times for the page
/// lock of `pfn` to be released, holding no lock its holder may need; the
/// caller then looks at the entry again. `pfn` may be a number read without
/// a lock: a descriptor outlives its frame's use, so the worst a stale one
/// costs is the wait.
pub(crate) fn wait_on_page_locked(phys: &PhysMem, pfn: Pfn, spins: u32) {
    for i in 0..spins {
        if phys.desc(pfn).flags.load(Ordering::Acquire) & PG_LOCKED == 0 {
            return;
        }
        crate::sync::spin_hint(i);
    }
}

/// `lock_page`: waits for the page lock.
pub(crate) fn lock_page(phys: &PhysMem, pfn: Pfn) {
    let mut i = 0;
    while !trylock_page(phys, pfn) {
        crate::sync::spin_hint(i);
        i = i.saturating_add(1);
    }
}

/// Releases the page lock.
pub(crate) fn unlock_page(phys: &PhysMem, pfn: Pfn) {
    phys.desc(pfn).flags.fetch_and(!PG_LOCKED, Ordering::Release);
}

/// Calls `f(k, ..)` on the entry of every address at which a VMA of `owner`
/// (of its anon family, or mapping its file) holds index `indices[k]`, for
/// every `k`, under that entry's table lock, with the member's `mmap_lock`
/// held for read (recursively, so that a writer queued behind a fault that
/// waits for this migration does not block us): no writer moves or copies
/// entries while we look (mremap, fork, munmap's VMA removal). `f` returns
/// the entry to store, if any. Returns the number of PTE locks taken.
///
/// One walk serves a whole batch of pages of one owner: the member list,
/// each member's `mmap_lock` and its VMA list are taken once per batch
/// instead of once per page (Linux walks the rmap per folio; here the
/// per-page walk was most of the batch's cost besides the copy, and its
/// `mmap_lock` read bounced the lock's line with the accessors' faults).
/// Within a VMA the batch's entries are visited by page table: one walk
/// down the tree and one PTE lock per table, not per page (Linux takes one
/// per PMD in `try_to_migrate_one`'s `page_vma_mapped_walk` too, for the
/// pages of a large folio).
///
/// The members are read again after each one is visited: a fork that was
/// copying the visited member's entries (under its `mmap_lock` for write,
/// which our read waited for) has made its child a member by then, and the
/// child's copies of the entries must be visited too.
///
/// A file's mappers are read the same way: fork records its child in
/// `i_mmap` under the parent's `mmap_lock` for write, before it copies.
fn walk_entries(
    owner: &Owner,
    indices: &[u64],
    mut f: impl FnMut(usize, &Arc<AddressSpace>, VmFlags, u64, Pte) -> Option<Pte>,
) -> u64 {
    let mut visited: Vec<*const AddressSpace> = Vec::new();
    let mut hits: Vec<(u64, usize)> = Vec::with_capacity(indices.len());
    let mut ptl_locks = 0;
    loop {
        let unvisited = |mm: &Arc<AddressSpace>| !visited.contains(&Arc::as_ptr(mm));
        let next = match owner {
            Owner::Anon(family) => family.members().into_iter().filter_map(|m| m.downcast().ok()).find(unvisited),
            Owner::File(file) => file.mappers().into_iter().filter_map(AddressSpace::from_mapper).find(unvisited),
        };
        let Some(mm) = next else { return ptl_locks };
        visited.push(Arc::as_ptr(&mm));
        let st = mm.read_lock_recursive();
        let guard = crossbeam_epoch::pin();
        for vma in st.vmas().iter() {
            let ours = match owner {
                Owner::Anon(family) => {
                    vma.anon_vma.get().is_some_and(|a| std::ptr::eq(Arc::as_ptr(&a.family), Arc::as_ptr(family)))
                }
                Owner::File(file) => vma.file.as_ref().is_some_and(|f| f.id() == file.id()),
            };
            if !ours {
                continue;
            }
            // The batch's addresses in this VMA, in address order, so that
            // the entries of one page table are visited under one walk and
            // one lock of that table (a batch's pages are mostly adjacent).
            hits.clear();
            let covered = vma.pgoff..vma.pgoff + vma.pages();
            hits.extend(
                indices
                    .iter()
                    .enumerate()
                    .filter(|&(_, index)| covered.contains(index))
                    .map(|(k, &index)| (vma.start + ((index - vma.pgoff) << crate::PAGE_SHIFT), k)),
            );
            if !hits.is_sorted_by_key(|&(addr, _)| addr) {
                hits.sort_by_key(|&(addr, _)| addr); // stable: a repeated index keeps its order
            }
            for table in hits.chunk_by(|a, b| a.0 & !(PMD_SIZE - 1) == b.0 & !(PMD_SIZE - 1)) {
                let (first, last) = (table[0].0, table[table.len() - 1].0);
                let Some(leaf) = mm.pgtables.leaf(first, &guard) else { continue };
                if leaf.entry_size() != PAGE_SIZE {
                    continue;
                }
                let mut ptl = leaf.with_range(first, last + PAGE_SIZE).lock();
                ptl_locks += 1;
                for &(addr, k) in table {
                    if let Some(new) = f(k, &mm, vma.flags, addr, ptl.get(addr)) {
                        ptl.replace(addr, new);
                    }
                }
            }
        }
    }
}

/// How many entries map frame `pfn`, a page of `owner` at `index`, as the
/// entries are now (Linux's `folio_mapcount`, which `move_pages`, `mbind`
/// and `migrate_pages(2)` read through `folio_likely_mapped_shared` to
/// refuse a page mapped more than once without `MPOL_MF_MOVE_ALL`).
///
/// softmm keeps no per-frame map count (it would be a shared write per
/// fault), so the count walks the reverse map: the anon family's members,
/// or the file's mappers, and each one's published VMA tree, reading the
/// entry at the page's address in every VMA of the owner covering `index`
/// (Linux's `rmap_walk` with `vma_address`). The reference count cannot
/// stand in for it: a transient reference (`get_user_pages`, a `Cpu` slice,
/// an unmap's gather, a `write(2)` in progress) would make a page mapped
/// once look shared. Like Linux's count it is read without a lock, so a
/// racing fault, fork or unmap may or may not be counted; the migration's
/// own reference check decides whether the page can move.
///
/// No lock is taken: the caller may hold an `mmap_lock` or a page lock.
pub(crate) fn page_mapcount(owner: &Owner, index: u64, pfn: Pfn) -> usize {
    let mut n = 0;
    let mut count = |mm: &AddressSpace, addr: u64| {
        let pte = mm.pte_at(addr);
        if pte.has_frame() && pte.pfn() == pfn {
            n += 1;
        }
    };
    match owner {
        Owner::Anon(family) => crate::mm::anon_rmap::for_each_anon_vma(family, index, |mm, _, addr| count(mm, addr)),
        Owner::File(file) => {
            for mapper in file.mappers() {
                let Some(mm) = AddressSpace::from_mapper(mapper) else { continue };
                let guard = crossbeam_epoch::pin();
                for v in mm.vmas_rcu(&guard).iter() {
                    let ours = v.file.as_ref().is_some_and(|f| f.id() == file.id());
                    if ours && (v.pgoff..v.pgoff + v.pages()).contains(&index) {
                        count(&mm, v.start + ((index - v.pgoff) << crate::PAGE_SHIFT));
                    }
                }
            }
        }
    }
    n
}

/// Turns every entry mapping one of `pages` (`(index, pfn)` of one owner;
/// present or `PROT_NONE`) into a migration entry, dropping the entries'
/// references; adds the address spaces involved to `mms`. Returns the PTE
/// locks taken.
fn try_to_migrate(phys: &PhysMem, owner: &Owner, pages: &[(u64, Pfn)], mms: &mut Vec<Arc<AddressSpace>>) -> u64 {
    let indices: Vec<u64> = pages.iter().map(|&(index, _)| index).collect();
    walk_entries(owner, &indices, |k, mm, _, _, pte| {
        // Present or PROT_NONE: both map the frame.
        if !pte.has_frame() || pte.pfn() != pages[k].1 {
            return None;
        }
        if !mms.iter().any(|m| Arc::ptr_eq(m, mm)) {
            mms.push(mm.clone());
        }
        // The entry's reference goes; ours keeps the frame.
        Some(crate::rmap::try_to_migrate_pte(phys, pte))
    })
}

/// For each `(index, old, new)` of one owner, turns every migration entry
/// for `old` into a present entry of `new` (Linux's
/// `remove_migration_ptes`), each taking a reference on `new`. Returns the
/// PTE locks taken.
fn remove_migration_ptes(phys: &PhysMem, owner: &Owner, moves: &[(u64, Pfn, Pfn)]) -> u64 {
    let indices: Vec<u64> = moves.iter().map(|&(index, ..)| index).collect();
    walk_entries(owner, &indices, |k, _, flags, _, pte| {
        let (_, old, new) = moves[k];
        if !pte.is_migration() || pte.pfn() != old {
            return None;
        }
        let entry = crate::rmap::remove_migration_pte(phys, new, pte);
        // The VMA's protection now: PROT_NONE set meanwhile hides the page.
        Some(if flags.intersects(VmFlags::ACCESS_FLAGS) { entry } else { entry.protnone() })
    })
}

/// The flushes of `mms`, where the pages to copy were unmapped, all begun
/// before any is waited for, and the proof of their completion that the
/// copies' freeze takes. Under loom with
/// `sync::broken::migrate::SKIP_FLUSH_WAIT`, begun only: the tickets come
/// back, to be waited for when the caller drops them after its copies.
fn flush_unmapped(mms: &[Arc<AddressSpace>]) -> (TlbFlushed, Vec<crate::tlb::FlushTicket>) {
    if broken::skip_flush_wait() {
        let late = mms.iter().map(|mm| mm.flush_tlb_begin()).collect();
        return (AddressSpace::flush_tlbs(&[]), late);
    }
    (AddressSpace::flush_tlbs(mms), Vec::new())
}

/// Whether two isolated pages' mappings are found through the same owner
/// (so one walk serves both).
fn same_owner(a: &Owner, b: &Owner) -> bool {
    match (a, b) {
        (Owner::Anon(x), Owner::Anon(y)) => Arc::ptr_eq(x, y),
        (Owner::File(x), Owner::File(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Calls `f` on each maximal run of consecutive `items` whose pages (found
/// by `page`) share an owner: the walks of a batch go one per run.
fn for_each_owner_run<'a, T>(
    pages: &'a [Isolated<'_>],
    items: &[T],
    page: impl Fn(&T) -> usize,
    mut f: impl FnMut(&'a Owner, &[T]),
) {
    let mut start = 0;
    while start < items.len() {
        let owner = &pages[page(&items[start])].owner;
        let len = items[start..].iter().take_while(|t| same_owner(&pages[page(t)].owner, owner)).count();
        f(owner, &items[start..start + len]);
        start += len;
    }
}

/// Ends the isolation of `pages` (Linux's `putback_movable_pages`); their
/// references go when the caller drops them.
pub(crate) fn putback_movable_pages(pages: &[Isolated<'_>]) {
    for p in pages {
        p.page.desc().flags.fetch_and(!PG_ISOLATED, Ordering::AcqRel);
    }
}

/// What became of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// On a node the target allows now.
    Moved,
    /// Not moved (pinned, an extra reference, no memory on the node): the
    /// page stays where it was, mapped as before.
    Failed(Errno),
}

/// Counts of one `migrate_pages` call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MigrateCounts {
    pub(crate) moved: u64,
    pub(crate) failed: u64,
    /// PTE locks the unmap and remap walks took (one per page table and
    /// batch when the pages are adjacent, where a walk per page took one
    /// per page).
    pub(crate) ptl_locks: u64,
    /// The target's nodes had no free frame (or, for a hugetlb page, its
    /// node no free unreserved huge page) for a page: Linux's `migrate_pages` returns
    /// `-ENOMEM` then. The pages already unmapped in that batch were moved;
    /// no other page was tried.
    pub(crate) enomem: bool,
}

/// Linux's `migrate_pages`: moves each isolated page to a frame allocated
/// where `at` says (its node first, then the other nodes it allows:
/// Linux's `new_folio_t` callback, `alloc_migration_target` with
/// `__GFP_THISNODE` for `move_pages` and `migrate_pages(2)`, a one-node
/// [`Placement::this_node`], or `alloc_migration_target_by_mpol` for
/// `mbind`, the policy's placement) with `policy`; returns each page's
/// outcome in order. The pages'
/// references and isolation are the caller's to release (it drops `pages`);
/// a huge page that moved is held by the page it moved to instead, its
/// source back in the pool at once.
pub(crate) fn migrate_pages<'p>(
    phys: &'p PhysMem,
    pages: &mut [Isolated<'p>],
    at: &Placement,
    policy: MigratePolicy,
) -> (Vec<Outcome>, MigrateCounts) {
    let mut out = vec![Outcome::Failed(Errno::Again); pages.len()];
    let batch = match policy {
        MigratePolicy::OneByOne => 1,
        MigratePolicy::Batched => NR_MAX_BATCHED_MIGRATION,
    };
    let mut ptl_locks = 0;
    // migrate_hugetlbs: hugetlb pages first, one at a time
    // (`migrate/hugetlb.rs`); the target's pools running dry ends the call.
    let (huge, mut todo): (Vec<usize>, Vec<usize>) = (0..pages.len()).partition(|&i| phys.is_huge(pages[i].page.pfn()));
    if hugetlb::migrate_hugetlbs(phys, pages, &huge, at, &mut out, &mut ptl_locks) {
        for i in todo {
            out[i] = Outcome::Failed(Errno::NoMem);
        }
        let moved = out.iter().filter(|o| **o == Outcome::Moved).count() as u64;
        return (out, MigrateCounts { moved, failed: pages.len() as u64 - moved, ptl_locks, enomem: true });
    }
    // migrate_pages_batch: "when memory is low, don't bother to try to
    // migrate other folios, move unmapped folios, then exit" with -ENOMEM,
    // which migrate_pages_sync and migrate_pages pass up at once (no later
    // batch, no one-by-one retry, no further pass).
    let mut enomem = false;
    'passes: for pass in 0..NR_MAX_MIGRATE_PAGES_RETRY {
        let mut again = Vec::new();
        let mut backed_off = Vec::new();
        for chunk in todo.chunks(batch) {
            ptl_locks += migrate_batch(phys, pages, chunk, at, &mut out, &mut again, &mut backed_off, &mut enomem);
            if enomem {
                break 'passes;
            }
        }
        // The pages whose lock a batch could not take: one at a time, each
        // holding only its own lock while it may wait.
        for i in backed_off {
            ptl_locks += migrate_batch(phys, pages, &[i], at, &mut out, &mut again, &mut Vec::new(), &mut enomem);
            if enomem {
                break 'passes;
            }
        }
        if again.is_empty() || pass + 1 == NR_MAX_MIGRATE_PAGES_RETRY {
            break;
        }
        todo = again;
    }
    let moved = out.iter().filter(|o| **o == Outcome::Moved).count() as u64;
    (out, MigrateCounts { moved, failed: pages.len() as u64 - moved, ptl_locks, enomem })
}

/// One batch: the first page locked with a wait, the others with a trylock
/// (a failure goes to `backed_off`); unmap all (one reverse walk per run of
/// pages of one owner), flush once, copy all, remap all (one walk per run
/// again), unlock all. Returns the PTE locks the walks took.
///
/// When the target's nodes cannot give every locked page a frame, the pages
/// that got one still move, the first that did not is `-ENOMEM`, the rest
/// are left untried, and `enomem` is set: the caller stops there.
#[allow(clippy::too_many_arguments)]
fn migrate_batch(
    phys: &PhysMem,
    pages: &[Isolated<'_>],
    chunk: &[usize],
    at: &Placement,
    out: &mut [Outcome],
    again: &mut Vec<usize>,
    backed_off: &mut Vec<usize>,
    enomem: &mut bool,
) -> u64 {
    let mut locked: Vec<usize> = Vec::with_capacity(chunk.len());
    for &i in chunk {
        let pfn = pages[i].page.pfn();
        if locked.is_empty() && backed_off.is_empty() {
            lock_page(phys, pfn);
        } else if !trylock_page(phys, pfn) {
            backed_off.push(i);
            continue;
        }
        let d = phys.desc(pfn);
        if d.pincount.load(Ordering::Acquire) > 0 {
            // A pinned page cannot move (3.4 of the reference: counted failed).
            unlock_page(phys, pfn);
            out[i] = Outcome::Failed(Errno::Again);
            again.push(i);
            continue;
        }
        locked.push(i);
    }
    // The batch's new frames in one allocation (one cache and one free-list
    // lock per node tried, not one per page), from the nodes `at` allows.
    // Linux allocates each page's frame just before unmapping it, so the
    // first page it cannot serve is `-ENOMEM` and the pages after it are
    // never unmapped; here they stay as they are, untried.
    let mut frames = phys.alloc_bulk_at(at, locked.len()).into_iter();
    let mut unmapped: Vec<(usize, FrameRef<'_>)> = Vec::with_capacity(locked.len());
    for i in locked {
        match frames.next() {
            Some(dst) => unmapped.push((i, dst)),
            None => {
                unlock_page(phys, pages[i].page.pfn());
                out[i] = Outcome::Failed(if *enomem { Errno::Again } else { Errno::NoMem });
                *enomem = true;
            }
        }
    }
    if unmapped.is_empty() {
        return 0;
    }
    // Every page of the batch is locked: unmap them all.
    let mut mms: Vec<Arc<AddressSpace>> = Vec::new();
    let mut ptl_locks = 0;
    for_each_owner_run(
        pages,
        &unmapped,
        |&(i, _)| i,
        |owner, run| {
            let run: Vec<(u64, Pfn)> = run.iter().map(|&(i, _)| (pages[i].index, pages[i].page.pfn())).collect();
            ptl_locks += try_to_migrate(phys, owner, &run, &mut mms);
        },
    );
    // One flush per address space involved, all begun before any is waited
    // for; the proof of their completion lets the copies freeze the pages.
    let (flushed, _late) = flush_unmapped(&mms);
    // Copy each page, or find it still referenced: `(page, old, new)` for
    // the remap, `new == old` putting a page back where it was.
    let mut moves: Vec<(usize, Pfn, Pfn)> = Vec::with_capacity(unmapped.len());
    for (i, dst) in &unmapped {
        let i = *i;
        let p = &pages[i];
        let old = p.page.pfn();
        let d = phys.desc(old);
        // Our reference is the only one left once every entry is a
        // migration entry (besides the page cache's, which a file page's
        // switch freezes under the cache's lock); anything more (a pin or a
        // get_user_pages reference taken meanwhile, a write(2) in progress,
        // an entry the walk missed) keeps the page where it is: the freeze
        // fails (`phys/frozen.rs`, Linux's `folio_ref_freeze`).
        let moved = match &p.owner {
            Owner::Anon(_) => FrozenPage::freeze(&p.page, &flushed).map(|page| page.copy_to(dst)).is_some(),
            Owner::File(file) => file.migrate_page(p.index, &p.page, dst, &flushed),
        };
        if !moved {
            moves.push((i, old, old));
            continue;
        }
        let nd = dst.desc();
        // Exclusivity is not copied here: the unmap moved it into the
        // migration entry, and the remap gives it to the new page unless a
        // fork copied the entry meanwhile (which made it shared).
        let flags = d.flags.load(Ordering::Relaxed) & !(PG_LOCKED | PG_ISOLATED | PG_ANON_EXCLUSIVE);
        nd.flags.store(flags, Ordering::Relaxed);
        nd.index.store(d.index.load(Ordering::Relaxed), Ordering::Relaxed);
        nd.mapping.store(d.mapping.load(Ordering::Relaxed), Ordering::Relaxed);
        moves.push((i, old, dst.pfn()));
    }
    for_each_owner_run(
        pages,
        &moves,
        |&(i, ..)| i,
        |owner, run| {
            let run: Vec<(u64, Pfn, Pfn)> = run.iter().map(|&(i, old, new)| (pages[i].index, old, new)).collect();
            ptl_locks += remove_migration_ptes(phys, owner, &run);
        },
    );
    for (i, old, new) in moves {
        unlock_page(phys, old);
        if new == old {
            out[i] = Outcome::Failed(Errno::Again);
            again.push(i);
        } else {
            out[i] = Outcome::Moved;
        }
    }
    // Each `dst`'s allocation reference goes with `unmapped`; the restored
    // entries hold theirs, and a page that stayed frees its unused `dst`.
    ptl_locks
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phys::PhysConfig;
    use crate::uapi::*;
    use crate::{Cpu, MmConfig};

    /// The page at `addr` of `mm`, isolated (our reference) and unmapped
    /// everywhere into migration entries.
    fn unmap_for_migration<'p>(phys: &'p PhysMem, mm: &AddressSpace, addr: u64) -> Isolated<'p> {
        let pte = mm.pte_at(addr);
        let st = mm.read_lock();
        let family = st.vmas.find(addr).unwrap().anon_vma.get().unwrap().family.clone();
        drop(st);
        let index = phys.desc(pte.pfn()).index.load(Ordering::Relaxed);
        let p = Isolated { page: phys.get(pte.pfn()), owner: Owner::Anon(family), index };
        lock_page(phys, p.page.pfn());
        try_to_migrate(phys, &p.owner, &[(p.index, p.page.pfn())], &mut Vec::new());
        p
    }

    #[test]
    fn every_path_treats_migration_entries_as_linux() {
        let phys = PhysMem::new(PhysConfig::new(8 << 20).nodes(2)).unwrap();
        {
            let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
            let a = mm.mmap(0, 4 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
            let mut cpu = Cpu::attached(&mm);
            for i in 0..4 {
                cpu.write_u64(a + i * PAGE_SIZE, 10 + i).unwrap();
            }
            let p0 = unmap_for_migration(&phys, &mm, a);
            let p1 = unmap_for_migration(&phys, &mm, a + PAGE_SIZE);
            let p2 = unmap_for_migration(&phys, &mm, a + 2 * PAGE_SIZE);
            let p3 = unmap_for_migration(&phys, &mm, a + 3 * PAGE_SIZE);
            assert!(mm.pte_at(a).is_migration() && mm.pte_at(a).has(Pte::WRITE));
            // mincore, RSS and the maps dump's Rss (smaps_pte_entry accounts
            // a migration entry's page) count them as resident.
            let mut vec = [0u8; 4];
            mm.mincore(a, 4 * PAGE_SIZE, &mut vec).unwrap();
            assert_eq!(vec, [1; 4]);
            assert_eq!(mm.stats().rss_pages, 4);
            assert_eq!(mm.maps().iter().map(|m| m.rss).sum::<u64>(), 4 * PAGE_SIZE);
            // mremap moves a migration entry with its page's index, so the
            // remap finds it at the new address.
            let b = mm.mremap(a + 2 * PAGE_SIZE, PAGE_SIZE, PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, 1 << 30).unwrap();
            assert!(mm.pte_at(b).is_migration() && mm.pte_at(a + 2 * PAGE_SIZE).is_none());
            remove_migration_ptes(&phys, &p2.owner, &[(p2.index, p2.page.pfn(), p2.page.pfn())]);
            assert_eq!(cpu.read_u64(b).unwrap(), 12);
            // mprotect read-only makes a writable migration entry readable.
            mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, PROT_READ).unwrap();
            assert!(mm.pte_at(a + PAGE_SIZE).is_migration() && !mm.pte_at(a + PAGE_SIZE).has(Pte::WRITE));
            // fork copies the entry, readable in both (COW).
            let child = mm.fork().unwrap();
            assert!(child.pte_at(a).is_migration() && !child.pte_at(a).has(Pte::WRITE));
            assert!(!mm.pte_at(a).has(Pte::WRITE));
            // munmap zaps the fourth page's migration entry. (Before the
            // waiter below: its fault waits holding mmap_lock for read.)
            mm.munmap(a + 3 * PAGE_SIZE, PAGE_SIZE).unwrap();
            assert!(mm.pte_at(a + 3 * PAGE_SIZE).is_none());
            // A fault on a migration entry waits until the page is back.
            let waiter = {
                let mm = mm.clone();
                std::thread::spawn(move || Cpu::attached(&mm).read_u64(a).unwrap())
            };
            std::thread::sleep(std::time::Duration::from_millis(30));
            assert!(!waiter.is_finished(), "the fault did not wait for the migration");
            // Remap the first page onto a new frame: parent and child both map it.
            let new = phys.alloc_copy(p0.page.pfn(), 1).unwrap();
            remove_migration_ptes(&phys, &p0.owner, &[(p0.index, p0.page.pfn(), new.pfn())]);
            assert_eq!(mm.pte_at(a).pfn(), new.pfn());
            assert_eq!(child.pte_at(a).pfn(), new.pfn());
            assert_eq!(waiter.join().unwrap(), 10);
            // The second page back in place, read-only as mprotect left it.
            remove_migration_ptes(&phys, &p1.owner, &[(p1.index, p1.page.pfn(), p1.page.pfn())]);
            assert!(mm.pte_at(a + PAGE_SIZE).is_present() && !mm.pte_at(a + PAGE_SIZE).has(Pte::WRITE));
            assert_eq!(cpu.read_u64(a + PAGE_SIZE).unwrap(), 11);
            // The unmapped page's restore finds nothing: it goes with our reference.
            remove_migration_ptes(&phys, &p3.owner, &[(p3.index, p3.page.pfn(), p3.page.pfn())]);
            for p in [&p0, &p1, &p2, &p3] {
                unlock_page(&phys, p.page.pfn());
            }
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
    }

    /// Seed 003's deadlock (Hugh Dickins' review): thread T holds page B's
    /// lock and waits for page A's, which the migrator holds as the first
    /// page of its batch. A batch that slept on B's lock would never end;
    /// with the trylock it finishes A, releases it, and moves B alone after.
    #[test]
    fn a_batch_never_sleeps_on_a_second_page_lock() {
        for policy in MigratePolicy::ALL {
            let phys = PhysMem::new(PhysConfig::new(8 << 20).nodes(2)).unwrap();
            let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
            let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a, 1).unwrap();
            cpu.write_u64(a + PAGE_SIZE, 2).unwrap();
            let (pa, pb) = (mm.pte_at(a).pfn(), mm.pte_at(a + PAGE_SIZE).pfn());
            // A running CPU is waited for by every flush: this one sleeps below.
            cpu.park();
            lock_page(&phys, pb);
            let t = {
                let (phys, mm) = (phys.clone(), mm.clone());
                std::thread::spawn(move || {
                    // Wait until the migrator holds A (its first page) or is
                    // done with it (one-by-one), then ask for it.
                    while phys.desc(pa).flags.load(Ordering::Acquire) & PG_LOCKED == 0 && mm.pte_at(a).pfn() == pa {
                        std::thread::yield_now();
                    }
                    lock_page(&phys, pa);
                    unlock_page(&phys, pb);
                    unlock_page(&phys, pa);
                })
            };
            let migrator = {
                let (phys, mm) = (phys.clone(), mm.clone());
                std::thread::spawn(move || {
                    let st = mm.read_lock();
                    let family = st.vmas.find(a).unwrap().anon_vma.get().unwrap().family.clone();
                    drop(st);
                    let iso = |pfn: Pfn| Isolated {
                        page: phys.get(pfn),
                        owner: Owner::Anon(family.clone()),
                        index: phys.desc(pfn).index.load(Ordering::Relaxed),
                    };
                    let mut pages = [iso(pa), iso(pb)];
                    migrate_pages(&phys, &mut pages, &Placement::this_node(1), policy).1
                })
            };
            // Under Miri the clock is its own, and the migration alone takes
            // several of its seconds (7.6 s of 10 in one run), more when the
            // other tests of the same process load its scheduler.
            let limit = if cfg!(miri) { 120 } else { 10 };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(limit);
            while !migrator.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(migrator.is_finished(), "{policy:?}: the migrator deadlocked on a second page lock");
            let counts = migrator.join().unwrap();
            assert_eq!((counts.moved, counts.failed), (2, 0), "{policy:?}");
            t.join().unwrap();
            cpu.resume();
            assert_eq!((cpu.read_u64(a).unwrap(), cpu.read_u64(a + PAGE_SIZE).unwrap()), (1, 2));
            assert_eq!(phys.node_of(mm.pte_at(a).pfn()), 1);
        }
    }

    /// The pages mapped at `[a, a + n pages)` of `mm`, isolated as
    /// `move_pages` isolates them.
    fn isolate_range<'p>(mm: &'p AddressSpace, a: u64, n: u64) -> Vec<Isolated<'p>> {
        let st = mm.read_lock();
        let vma = st.vmas.find(a).unwrap().clone();
        drop(st);
        (0..n)
            .map(|i| mm.isolate_at(&vma, a + i * PAGE_SIZE, crate::mempolicy::MPOL_MF_MOVE).unwrap().unwrap())
            .collect()
    }

    fn release(isolated: Vec<Isolated<'_>>) {
        for p in &isolated {
            p.page.desc().flags.fetch_and(!PG_ISOLATED, Ordering::AcqRel);
        }
    }

    /// A batch's unmap and remap take each page table's lock once, where
    /// one-by-one (and the per-page walk before) takes one per page and walk.
    #[test]
    #[cfg_attr(miri, ignore = "migrates hundreds of pages: minutes under Miri")]
    fn a_batch_locks_each_page_table_once_per_walk() {
        let phys = PhysMem::new(PhysConfig::new(16 << 20).nodes(2)).unwrap();
        {
            let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
            // Two whole page tables' worth, 2 MiB aligned: two batches of 512.
            let a = mm
                .mmap(
                    1 << 30,
                    1024 * PAGE_SIZE,
                    PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                    None,
                    0,
                )
                .unwrap();
            let mut cpu = Cpu::attached(&mm);
            for i in 0..1024 {
                cpu.write_u64(a + i * PAGE_SIZE, i).unwrap();
            }
            for (policy, node, locks) in [(MigratePolicy::Batched, 1, 4), (MigratePolicy::OneByOne, 0, 2048)] {
                let mut pages = isolate_range(&mm, a, 1024);
                let (out, counts) = migrate_pages(&phys, &mut pages, &Placement::this_node(node), policy);
                assert!(out.iter().all(|o| *o == Outcome::Moved), "{policy:?}");
                assert_eq!((counts.moved, counts.ptl_locks), (1024, locks), "{policy:?}");
                release(pages);
            }
            for i in 0..1024 {
                assert_eq!(cpu.read_u64(a + i * PAGE_SIZE).unwrap(), i);
            }
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
    }

    /// The batch's one allocation serves as many pages as the node has
    /// frames for; the first page it cannot serve is `-ENOMEM` and the call
    /// ends there (Linux's "move unmapped folios, then exit"), the others
    /// left where they are, mapped, untried. One by one, the same pages move.
    #[test]
    #[cfg_attr(miri, ignore = "migrates hundreds of pages: minutes under Miri")]
    fn a_batch_short_of_frames_moves_what_the_node_can_take() {
        for policy in MigratePolicy::ALL {
            let phys = PhysMem::new(PhysConfig::new(4 << 20).nodes(2)).unwrap();
            {
                let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
                let a =
                    mm.mmap(0, 300 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
                let mut cpu = Cpu::attached(&mm);
                for i in 0..300 {
                    cpu.write_u64(a + i * PAGE_SIZE, i).unwrap();
                }
                let free1 = phys.node_stats()[1].frames_free as usize;
                let hold = phys.alloc_bulk_on(1, free1 - 100);
                let mut pages = isolate_range(&mm, a, 300);
                let (out, counts) = migrate_pages(&phys, &mut pages, &Placement::this_node(1), policy);
                assert_eq!((counts.moved, counts.failed, counts.enomem), (100, 200, true), "{policy:?}");
                assert!(out[..100].iter().all(|o| *o == Outcome::Moved), "{policy:?}");
                assert_eq!(out[100], Outcome::Failed(Errno::NoMem), "{policy:?}");
                assert!(out[101..].iter().all(|o| *o == Outcome::Failed(Errno::Again)), "{policy:?}");
                release(pages);
                drop(hold);
                for i in 0..300 {
                    let moved = out[i as usize] == Outcome::Moved;
                    assert_eq!(phys.node_of(mm.pte_at(a + i * PAGE_SIZE).pfn()), usize::from(moved));
                    assert_eq!(cpu.read_u64(a + i * PAGE_SIZE).unwrap(), i);
                }
            }
            let s = phys.quiesce();
            assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
        }
    }
}
