//! The fault kinds, shared by every [`FaultPolicy`](crate::FaultPolicy): each
//! works on a VMA the policy vouches for and commits under the PTE lock after
//! the policy's validation ([`FaultCtx::validate`]).

use crate::sync::Ordering;
use std::sync::Arc;

use crate::error::{Fault, SegvCode};
use crate::file::Inode;
use crate::mm::AddressSpace;
use crate::pgtable::{Leaf, Pte, PteKind, PMD_SIZE};
use crate::phys::{FrameRef, PG_ANON, PG_ANON_EXCLUSIVE, PG_DIRTY, PG_FILE};
use crate::rmap;
use crate::sync::shared_write;
use crate::vma::VmFlags;
use crate::vma::{AnonVma, Vma};
use crate::PAGE_SIZE;

use super::{Abort, Access, FaultError};

/// What must still hold, under the PTE lock, for a fault to commit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Check {
    /// Nothing: a lock (`mmap_lock` or the VMA's read reference) excludes writers.
    None,
    /// The address space's sequence count still has this value.
    MmSeq(u64),
    /// The VMA is still attached.
    VmaDetached,
}

/// One fault's context: the VMA and what the policy allows.
pub(crate) struct FaultCtx<'a> {
    pub(crate) mm: &'a AddressSpace,
    pub(crate) vma: &'a Vma,
    pub(crate) check: Check,
    /// `mmap_lock` is held: may wait for `invalidate_lock` and assign an anon_vma.
    pub(crate) may_sleep: bool,
    /// May allocate page tables: `mmap_lock` or the VMA's reference is held,
    /// so the writer that removes the VMA sees every table installed here.
    pub(crate) may_alloc_tables: bool,
    /// A `FOLL_FORCE` fault from gup (`AddressSpace::access_remote_write`
    /// and `_read`), whose caller checked the VMA with `check_vma_flags`:
    /// no MMU permission check (Linux's `handle_mm_fault` has none; x86's
    /// `access_error` runs before it only for a hardware fault), and every
    /// entry it makes keeps the VMA's protection ([`vm_page_prot`]).
    pub(crate) forced: bool,
}

type FaultResult<T> = Result<T, FaultError>;

impl FaultCtx<'_> {
    /// The policy's validation; call under the PTE lock.
    #[inline]
    fn validate(&self) -> FaultResult<()> {
        match self.check {
            Check::None => Ok(()),
            Check::MmSeq(s) if self.mm.seq.validate(s) => Ok(()),
            Check::MmSeq(_) => Err(FaultError::Abort(Abort::MmSeq)),
            Check::VmaDetached if !self.vma.lock.is_detached() => Ok(()),
            Check::VmaDetached => Err(FaultError::Abort(Abort::VmaChanged)),
        }
    }

    fn unsupported<T>(&self) -> FaultResult<T> {
        Err(FaultError::Abort(Abort::Unsupported))
    }
}

/// Resolves a fault at `addr` inside `ctx.vma`. A signal reports `addr`
/// itself, not its page.
pub(crate) fn handle_vma_fault(ctx: &FaultCtx<'_>, addr: u64, access: Access) -> FaultResult<()> {
    handle_page_fault(ctx, addr, access).map_err(|e| match e {
        FaultError::Signal(Fault::Bus { .. }) => Fault::Bus { addr }.into(),
        FaultError::Signal(Fault::Oom { .. }) => Fault::Oom { addr }.into(),
        e => e,
    })
}

fn handle_page_fault(ctx: &FaultCtx<'_>, addr: u64, access: Access) -> FaultResult<()> {
    let vma = ctx.vma;
    let write = access == Access::Write;
    // x86's `access_error` for a not-present entry: a write needs
    // `VM_WRITE`; a read or an instruction fetch only an accessible VMA.
    let allowed = if write { vma.flags.contains(VmFlags::WRITE) } else { vma.flags.intersects(VmFlags::ACCESS_FLAGS) };
    if !allowed && !ctx.forced {
        return Err(Fault::Segv { addr, code: SegvCode::AccErr }.into());
    }
    if access == Access::Execute && !vma.flags.contains(VmFlags::EXEC) && !ctx.forced {
        // On x86-64 the fetch from a not-present page of a readable,
        // non-executable VMA maps the page as a read would, and the retried
        // fetch then faults on the NX entry (`X86_PF_PROT`): the page ends
        // up mapped and the signal is `SEGV_ACCERR`. Do both here.
        handle_page_fault(ctx, addr, Access::Read)?;
        return Err(Fault::Segv { addr, code: SegvCode::AccErr }.into());
    }
    if crate::fault::host_window::window(vma).is_some() {
        // Embedder memory (`mmap_host`) and host-file windows have no
        // entry to install: the retried access fills its TLB from the VMA
        // (`cpu/host_mem.rs`). A host file's page wholly past its end is
        // Linux's `SIGBUS` (which gup turns into `EFAULT`).
        if crate::fault::host_window::page_of(vma, addr).is_none() {
            return Err(Fault::Bus { addr }.into());
        }
        return Ok(());
    }
    if vma.flags.contains(VmFlags::PFNMAP) {
        // Device memory (`crate::mmio`) has no page to map: Linux's
        // `do_fault` without `vm_ops->fault` (`SIGBUS`, which gup turns
        // into `EFAULT` as it does this). A CPU's access calls the device.
        return Err(Fault::Mmio { addr }.into());
    }
    if vma.flags.contains(VmFlags::HUGETLB) {
        // A hugetlb fault allocates its PMD table, so it needs `mmap_lock`
        // or the VMA's reference (`PerVmaSeq` then retries with it;
        // `Speculative` falls back); against unshare and truncate it
        // relies on its `HugetlbPolicy`'s locks, not on `mmap_lock`.
        if !ctx.may_alloc_tables {
            return Err(FaultError::Abort(Abort::NoPageTable));
        }
        // A forced fault (`access_remote_*`, gup's `faultin_page`) comes
        // here as any other: gup applied the forced-write rules before, and
        // a forced read of a VMA without `PROT_READ` maps the page as the
        // VMA's protection says.
        return super::hugetlb::hugetlb_fault(ctx, addr, write);
    }
    let accessible = vma.flags.intersects(VmFlags::ACCESS_FLAGS);
    let va = addr & !(PAGE_SIZE - 1);
    let guard = crossbeam_epoch::pin();
    let leaf = if ctx.may_alloc_tables {
        ctx.mm.pgtables.leaf_alloc(va, &guard)
    } else {
        ctx.mm.pgtables.leaf(va, &guard).ok_or(FaultError::Abort(Abort::NoPageTable))?
    };
    loop {
        let pte = leaf.load(va);
        let done = match pte.kind() {
            // Linux's VM_FAULT_SIGSEGV from a guard marker: SEGV_MAPERR.
            PteKind::Guard => return Err(Fault::Segv { addr, code: SegvCode::MapErr }.into()),
            // A forced access to a `PROT_NONE` VMA: the entry stays
            // `PROT_NONE`, and holds the page that gup follows.
            PteKind::ProtNone(_) if !accessible && write => do_wp_page(ctx, va, leaf, pte)?,
            PteKind::ProtNone(_) if !accessible => true,
            PteKind::ProtNone(_) => restore_protnone(ctx, leaf, va, pte)?,
            PteKind::None if vma.file.is_some() => do_file_fault(ctx, va, leaf, write)?,
            PteKind::None => do_anonymous_page(ctx, va, leaf, write)?,
            PteKind::Page(_) if write && !pte.has(Pte::WRITE) => do_wp_page(ctx, va, leaf, pte)?,
            PteKind::Page(_) => true,
            // A fault that holds a VMA lock (or nothing) must not wait
            // here: a writer holding `mmap_lock` may be waiting for that VMA
            // lock while the migrator waits for `mmap_lock` to restore the
            // entry. It falls back to the `mmap_lock` path, which waits.
            PteKind::Migration(_) if !ctx.may_sleep => ctx.unsupported()?,
            PteKind::Migration(_) => {
                migration_entry_wait(leaf, va, pte);
                false
            }
        };
        if done {
            return Ok(());
        }
    }
}

/// Linux's `migration_entry_wait`: the page at `va` is being migrated;
/// wait, holding no page-table lock, until its entry changes (the migrator
/// restores it, or a zap clears it), then the caller retries the fault.
/// Only faults holding `mmap_lock` for read wait here (the lock-free and
/// VMA-locked ones fall back to that path first): the migrator reads the
/// VMA trees under `mmap_lock` taken for read recursively, which a queued
/// writer does not block and which only a writer's hold excludes (and no
/// writer can hold it while this fault holds it for read). The faulting CPU
/// is quiescent, so the migrator's TLB flush does not wait for it.
fn migration_entry_wait(leaf: Leaf<'_>, va: u64, pte: Pte) {
    let mut i = 0;
    while leaf.load(va) == pte {
        crate::sync::spin_hint(i);
        i = i.saturating_add(1);
    }
}

/// The anon_vma of `vma`, made on its first anonymous fault (only with
/// `mmap_lock` held: fork and merges must see it) or by `MADV_GUARD_INSTALL`.
pub(crate) fn anon_vma_prepare(ctx: &FaultCtx<'_>) -> FaultResult<Arc<AnonVma>> {
    if let Some(a) = ctx.vma.anon_vma.get() {
        return Ok(a.clone());
    }
    if !ctx.may_sleep {
        return ctx.unsupported();
    }
    let anon =
        ctx.vma.anon_vma.get_or_init(|| find_mergeable_anon_vma(ctx).unwrap_or_else(|| AnonVma::new(ctx.mm.weak())));
    Ok(anon.clone())
}

/// Linux's `find_mergeable_anon_vma`: the anon_vma of the next VMA, else of
/// the previous one, where that neighbour could merge with `vma` but for
/// their access flags, so that a later mprotect can merge them. A forked
/// (chained) anon_vma is never shared this way. Needs `mmap_lock`: the
/// published tree is then the current one.
fn find_mergeable_anon_vma(ctx: &FaultCtx<'_>) -> Option<Arc<AnonVma>> {
    let guard = crossbeam_epoch::pin();
    let tree = ctx.mm.vmas_rcu(&guard);
    let vma = ctx.vma;
    let reusable = |old: &Vma| old.anon_vma.get().filter(|a| !a.forked).cloned();
    let next = tree.first_starting_at(vma.end).filter(|n| vma.anon_vma_compatible(n)).and_then(|n| reusable(n));
    next.or_else(|| tree.prev_of(vma.start).filter(|p| p.anon_vma_compatible(vma)).and_then(|p| reusable(p)))
}

/// Linux's `maybe_mkwrite` and `vm_get_page_prot` for an entry a fault
/// makes: writable only in a `VM_WRITE` VMA, and `PROT_NONE` in a VMA
/// without access. A no-op for an MMU fault, which `access_error` allowed
/// only where the VMA permits the access; a forced (`FOLL_FORCE`) fault
/// breaks COW in a read-only private VMA and leaves the new page read-only.
#[inline]
fn vm_page_prot(vma: &Vma, pte: Pte) -> Pte {
    let pte = if vma.flags.contains(VmFlags::WRITE) { pte } else { pte.clear(Pte::WRITE) };
    if vma.flags.intersects(VmFlags::ACCESS_FLAGS) {
        pte
    } else {
        pte.protnone()
    }
}

/// The NX bit a new entry of `vma` gets: set unless the VMA is executable
/// (x86-64's `vm_get_page_prot`).
#[inline]
fn nx(vma: &Vma) -> u64 {
    if vma.flags.contains(VmFlags::EXEC) {
        0
    } else {
        Pte::NX
    }
}

fn oom(va: u64) -> FaultError {
    Fault::Oom { addr: va }.into()
}

/// A `PROT_NONE` entry in a VMA that is accessible again.
fn restore_protnone(ctx: &FaultCtx<'_>, leaf: Leaf<'_>, va: u64, pte: Pte) -> FaultResult<bool> {
    let mut ptl = leaf.lock();
    ctx.validate()?;
    if ptl.get(va) == pte {
        let mut new = pte.unprotnone();
        if !ctx.vma.flags.contains(VmFlags::WRITE) {
            new = new.clear(Pte::WRITE);
        }
        ptl.set(va, new);
    }
    Ok(false)
}

/// Installs `frame` into the empty entry of `va`: the entry takes over the
/// reference. `Ok(false)` if the entry is no longer empty (the reference is
/// dropped).
fn install(ctx: &FaultCtx<'_>, leaf: Leaf<'_>, va: u64, frame: FrameRef<'_>, flags: u64) -> FaultResult<bool> {
    let mut ptl = leaf.lock();
    ctx.validate()?;
    if !ptl.get(va).is_none() {
        return Ok(false);
    }
    ptl.set(va, vm_page_prot(ctx.vma, rmap::mapped(frame, flags | Pte::ACCESSED | nx(ctx.vma))));
    Ok(true)
}

fn new_anon_frame(ctx: &FaultCtx<'_>, frame: &FrameRef<'_>, va: u64) {
    let d = frame.desc();
    d.flags.store(PG_ANON | PG_DIRTY | PG_ANON_EXCLUSIVE, Ordering::Relaxed);
    d.index.store(ctx.vma.pgoff_at(va), Ordering::Relaxed);
}

fn do_anonymous_page(ctx: &FaultCtx<'_>, va: u64, leaf: Leaf<'_>, write: bool) -> FaultResult<bool> {
    if !write {
        return install(ctx, leaf, va, ctx.mm.phys.zero_page(), 0);
    }
    anon_vma_prepare(ctx)?;
    let at = ctx.mm.placement(ctx.vma, va);
    let frame = ctx.mm.phys.alloc_zeroed_at(&at).ok_or_else(|| oom(va))?;
    new_anon_frame(ctx, &frame, va);
    install(ctx, leaf, va, frame, Pte::WRITE | Pte::DIRTY)
}

fn do_file_fault(ctx: &FaultCtx<'_>, va: u64, leaf: Leaf<'_>, write: bool) -> FaultResult<bool> {
    let vma = ctx.vma;
    let file = vma.file.as_ref().expect("file VMA");
    let index = vma.pgoff_at(va);
    let shared = vma.flags.contains(VmFlags::MAYSHARE);
    if write && !shared {
        anon_vma_prepare(ctx)?;
    }
    // A lock-free fault must not wait here: truncate holds this lock for
    // write while it waits for `mmap_lock`, whose writer may wait for us.
    shared_write(2);
    let _inval = if ctx.may_sleep {
        file.invalidate_lock.read()
    } else {
        file.invalidate_lock.try_read().ok_or(FaultError::Abort(Abort::Contended))?
    };
    shared_write(3); // page-cache lock (twice) and the page's reference
                     // shmem_alloc_folio: the mapping's policy places a new page-cache page.
    let at = ctx.mm.placement(vma, va);
    let page = match file.get_page_at(index, &at) {
        Ok(Some(p)) => p,
        Ok(None) => return Err(Fault::Bus { addr: va }.into()),
        // A host-backed file's read failed: `VM_FAULT_SIGBUS`, as
        // `filemap_fault` answers an I/O error.
        Err(crate::error::Errno::Io) => return Err(Fault::Bus { addr: va }.into()),
        Err(_) => return Err(oom(va)),
    };
    if write && !shared {
        // Private write: the mapping gets its own copy (COW from the file).
        let copy = ctx.mm.phys.alloc_copy_at(page.pfn(), &at).ok_or_else(|| oom(va))?;
        drop(page);
        new_anon_frame(ctx, &copy, va);
        return install(ctx, leaf, va, copy, Pte::WRITE | Pte::DIRTY);
    }
    let flags = if write { Pte::WRITE | Pte::DIRTY } else { 0 };
    let pfn = page.pfn();
    if !install(ctx, leaf, va, page, flags)? {
        return Ok(false);
    }
    if write {
        // `fault_dirty_shared_page`, after the entry is writable: a
        // writeback that clears the flag before this leaves it set, one
        // that clears it after write-protects the entry first (see
        // `Inode::writeback`).
        ctx.mm.phys.desc(pfn).flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
    }
    if !write {
        fault_around(ctx, va, leaf, file);
    }
    Ok(true)
}

/// Maps the cached pages around a file read fault, read-only, in one go
/// (Linux's `filemap_map_pages` over `fault_around_bytes`).
fn fault_around(ctx: &FaultCtx<'_>, va: u64, leaf: Leaf<'_>, file: &Inode) {
    let (mm, vma) = (ctx.mm, ctx.vma);
    let window = mm.config.fault_around_pages * PAGE_SIZE;
    if window <= PAGE_SIZE {
        return;
    }
    let table_start = va & !(PMD_SIZE - 1);
    let start = (va & !(window - 1)).max(vma.start).max(table_start);
    // do_fault_around: a whole window from the (clamped) start, so a VMA
    // starting inside the aligned window gets its full window, not the rest
    // of the aligned one (`tests/semantics/fork_host.rs` checks it against the host).
    let end = (start + window).min(vma.end).min(table_start + PMD_SIZE);
    let mut ptl = leaf.with_range(start, end).lock();
    if ctx.validate().is_err() {
        return;
    }
    ptl.update(|a, pte| {
        if a == va || !pte.is_none() {
            return None;
        }
        file.find_get_page(vma.pgoff_at(a)).map(|page| vm_page_prot(vma, rmap::mapped(page, nx(vma))))
    });
}

/// A write to a present, write-protected page: make it writable in place when
/// the page is shared-mapped or exclusively ours, else copy it (COW).
fn do_wp_page(ctx: &FaultCtx<'_>, va: u64, leaf: Leaf<'_>, pte: Pte) -> FaultResult<bool> {
    let (mm, vma) = (ctx.mm, ctx.vma);
    let phys = &mm.phys;
    let pfn = pte.pfn();
    let writable = vm_page_prot(vma, pte.set(Pte::WRITE | Pte::DIRTY | Pte::ACCESSED));
    if vma.flags.contains(VmFlags::SHARED) {
        let mut ptl = leaf.lock();
        ctx.validate()?;
        if ptl.get(va) == pte {
            phys.desc(pfn).flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
            ptl.set(va, writable);
        }
        return Ok(false);
    }
    if pfn != phys.zero_pfn() {
        let d = phys.desc(pfn);
        let flags = d.flags.load(Ordering::Relaxed);
        if flags & PG_ANON != 0 && flags & PG_FILE == 0 {
            let mut ptl = leaf.lock();
            ctx.validate()?;
            // Under the PTE lock no new mapping of this frame can appear
            // (fork copies entries under this lock), so refcount 1 means
            // ours; an exclusive page (PG_anon_exclusive, which fork clears
            // under this lock) is ours whatever pins or references hold it,
            // and must be reused: a pinned page copied here would leave the
            // device writing a page the process no longer maps.
            let exclusive = d.flags.load(Ordering::Relaxed) & PG_ANON_EXCLUSIVE != 0;
            if ptl.get(va) == pte && (exclusive || d.refcount.load(Ordering::Acquire) == 1) {
                d.flags.fetch_or(PG_ANON_EXCLUSIVE, Ordering::Relaxed);
                ptl.set(va, writable);
                return Ok(true);
            }
        }
    }
    anon_vma_prepare(ctx)?;
    let at = ctx.mm.placement(ctx.vma, va);
    let new = if pfn == phys.zero_pfn() { phys.alloc_zeroed_at(&at) } else { phys.alloc_copy_at(pfn, &at) };
    let new = new.ok_or_else(|| oom(va))?;
    new_anon_frame(ctx, &new, va);
    let mut ptl = leaf.lock();
    ctx.validate()?;
    if ptl.get(va) != pte {
        return Ok(false);
    }
    // Other CPUs may cache the read-only translation of the old frame: clear,
    // flush, then install, so no CPU reads the old copy after a write to the new.
    let old = rmap::unmap_page(&mut ptl, va, phys).expect("a present entry holds a frame");
    shared_write(1); // the shootdown generation
                     // Only the CPUs that filled from the old entry, as the clear returned
                     // them: none but this thread's in the common case, and then no request
                     // and no barrier under the PTE lock.
    let flushed = mm.flush_tlb_owners(&ptl.take_fill_owners(), crate::tlb::FlushRange::new(va, va + PAGE_SIZE));
    ptl.set(va, vm_page_prot(vma, rmap::mapped(new, Pte::WRITE | Pte::DIRTY | Pte::ACCESSED | nx(vma))));
    drop(ptl);
    old.release(flushed);
    Ok(true)
}
