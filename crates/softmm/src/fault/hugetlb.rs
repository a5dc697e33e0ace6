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
//! Every fault holds `mmap_lock` (the lock-free policies fall back to it:
//! hugetlb's own locking schemes are the next step of seed 000) and the
//! file's fault mutex across the allocation and the install, so two faults
//! on one page never both allocate. Truncate and hole punch take
//! `invalidate_lock` for write, which the shared path holds for read.

use super::FaultError;
use crate::error::Fault;
use crate::pgtable::{Leaf, Pte, PteKind};
use crate::phys::{FrameRef, PG_ANON, PG_ANON_EXCLUSIVE, PG_DIRTY, PG_FILE};
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};

use crate::hugetlb::{HPAGE_FRAMES, HPAGE_SHIFT, HPAGE_SIZE};

type FaultResult<T> = Result<T, FaultError>;

/// What the fault needs from its caller (the fault handler's context).
pub(crate) struct HugeFault<'a> {
    pub(crate) mm: &'a crate::mm::AddressSpace,
    pub(crate) vma: &'a Vma,
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

/// Resolves a fault at `addr` in the hugetlb VMA `ctx.vma`, whose access
/// check the caller has made; `mmap_lock` is held.
pub(crate) fn hugetlb_fault(ctx: &HugeFault<'_>, addr: u64, write: bool) -> FaultResult<()> {
    let haddr = addr & !(HPAGE_SIZE - 1);
    let file = ctx.vma.file.as_ref().expect("a hugetlb VMA has its file");
    let resv = file.hugetlb.as_ref().expect("a hugetlb VMA maps a hugetlb file");
    let shared = ctx.vma.flags.contains(VmFlags::MAYSHARE);
    // Truncate and punch exclude faults (they drop the page cache, and a
    // private read maps a page-cache page too).
    let _inval = file.invalidate_lock.read();
    let _fault_mutex = resv.fault_mutex.lock();
    let guard = crossbeam_epoch::pin();
    // huge_pte_alloc: link another address space's PMD table when Linux
    // would (the first fault in a shareable window), else allocate one.
    ctx.mm.huge_pmd_share(ctx.vma, haddr, &guard);
    let leaf = ctx.mm.pgtables.pmd_leaf_alloc(haddr, &guard).ok_or(Fault::Oom { addr })?;
    let pte = leaf.load(haddr);
    match pte.kind() {
        PteKind::None if shared => no_page_shared(ctx, leaf, haddr, addr),
        PteKind::None => no_page_private(ctx, leaf, haddr, addr, write),
        PteKind::ProtNone(_) => {
            // An entry `mprotect(PROT_NONE)` hid, in a VMA accessible again.
            let mut ptl = leaf.lock();
            if ptl.get(haddr) == pte {
                let mut new = pte.unprotnone();
                if !ctx.vma.flags.contains(VmFlags::WRITE) {
                    new = new.clear(Pte::WRITE);
                }
                ptl.set(haddr, new);
            }
            Ok(())
        }
        PteKind::Page(_) if write && !pte.has(Pte::WRITE) => wp(ctx, leaf, haddr, pte, addr),
        PteKind::Page(_) => Ok(()),
        // hugetlb migration (`hugetlb/migrate.rs`): wait for the remap, then retry.
        PteKind::Migration(_) => {
            crate::hugetlb::migrate::migration_entry_wait_huge(leaf, haddr, pte);
            Ok(())
        }
        // No guard markers for hugetlb here.
        _ => Err(sigbus(addr)),
    }
}

/// `hugetlb_no_page` for a shared mapping: the page-cache page, allocated on
/// the first fault.
fn no_page_shared(ctx: &HugeFault<'_>, leaf: Leaf<'_>, haddr: u64, addr: u64) -> FaultResult<()> {
    let (mm, vma) = (ctx.mm, ctx.vma);
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
            let node = mm.placement(vma, haddr).node;
            let page = mm.phys.alloc_huge(node, reserved).ok_or_else(|| sigbus(addr))?;
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
    install(leaf, haddr, page, flags | nx(vma));
    mm.count_hugetlb_fault();
    Ok(())
}

/// `hugetlb_no_page` for a private mapping: a new anonymous page, or the
/// file's page read-only for a read of a hugetlbfs file.
fn no_page_private(ctx: &HugeFault<'_>, leaf: Leaf<'_>, haddr: u64, addr: u64, write: bool) -> FaultResult<()> {
    let (mm, vma) = (ctx.mm, ctx.vma);
    // HPAGE_RESV_UNMAPPED: the owner took a page of this mapping
    // (`unmap_ref_private`): "killed due to inadequate hugepage pool".
    if vma.hugetlb_unmapped.load(Ordering::Relaxed) {
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
        install(leaf, haddr, mm.phys.get(page.pfn()), nx(vma));
        mm.count_hugetlb_fault();
        return Ok(());
    }
    if !mm.anon_vma_prepare_locked(vma) {
        return Err(Fault::Oom { addr }.into());
    }
    let page = alloc_private(ctx, haddr, addr)?;
    if let Some(src) = cached {
        copy_huge(mm, &src, &page);
    }
    let flags = if write { Pte::WRITE | Pte::DIRTY } else { 0 };
    install(leaf, haddr, page, flags | nx(vma));
    mm.count_hugetlb_fault();
    Ok(())
}

/// A page for a private mapping at `haddr`: with its reservation if the
/// mapping still holds one for the index, else an unreserved one or `SIGBUS`.
pub(crate) fn alloc_private<'p>(ctx: &HugeFault<'p>, haddr: u64, addr: u64) -> FaultResult<FrameRef<'p>> {
    let (mm, vma) = (ctx.mm, ctx.vma);
    let reserved = vma.hugetlb_resv.as_ref().is_some_and(|r| r.take(vma.huge_index(haddr)));
    let node = mm.placement(vma, haddr).node;
    let page = mm.phys.alloc_huge(node, reserved).ok_or_else(|| sigbus(addr))?;
    let d = page.desc();
    d.flags.store(PG_ANON | PG_DIRTY | PG_ANON_EXCLUSIVE, Ordering::Relaxed);
    d.index.store(vma.huge_index(haddr), Ordering::Relaxed);
    Ok(page)
}

/// Copies a huge page's 512 frames.
pub(crate) fn copy_huge(mm: &crate::mm::AddressSpace, src: &FrameRef<'_>, dst: &FrameRef<'_>) {
    for i in 0..HPAGE_FRAMES {
        // SAFETY: both are huge pages of this arena (512 frames each from
        // their heads, inside the pool), held by the caller's references.
        unsafe { crate::phys::copy_frame(mm.phys.frame_ptr(src.pfn() + i), mm.phys.frame_ptr(dst.pfn() + i)) };
    }
}

/// Installs `page` as the 2 MiB leaf at `haddr`, which the fault mutex keeps
/// empty since the fault read it (only a zap may have run, leaving it empty).
fn install(leaf: Leaf<'_>, haddr: u64, page: FrameRef<'_>, flags: u64) {
    let mut ptl = leaf.lock();
    if !ptl.get(haddr).is_none() {
        // MADV_DONTNEED zaps without the fault mutex but never installs.
        return;
    }
    crate::rmap::map_page(&mut ptl, haddr, page, flags | Pte::HUGE | Pte::ACCESSED);
}

/// `hugetlb_wp`: a write to a read-only present page.
fn wp(ctx: &HugeFault<'_>, leaf: Leaf<'_>, haddr: u64, pte: Pte, addr: u64) -> FaultResult<()> {
    let (mm, vma) = (ctx.mm, ctx.vma);
    let phys = &mm.phys;
    let writable = pte.set(Pte::WRITE | Pte::DIRTY | Pte::ACCESSED);
    let d = phys.desc(pte.pfn());
    if vma.flags.contains(VmFlags::SHARED) {
        let mut ptl = leaf.lock();
        if ptl.get(haddr) == pte {
            d.flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
            ptl.set(haddr, writable);
        }
        return Ok(());
    }
    let flags = d.flags.load(Ordering::Relaxed);
    if flags & PG_ANON != 0 && flags & PG_FILE == 0 {
        let mut ptl = leaf.lock();
        // As `do_wp_page`: under the PMD lock no new mapping of the page
        // appears (fork copies under it), so refcount 1 means ours alone.
        let exclusive = d.flags.load(Ordering::Relaxed) & PG_ANON_EXCLUSIVE != 0;
        if ptl.get(haddr) == pte && (exclusive || d.refcount.load(Ordering::Acquire) == 1) {
            d.flags.fetch_or(PG_ANON_EXCLUSIVE, Ordering::Relaxed);
            ptl.set(haddr, writable);
            return Ok(());
        }
    }
    if !mm.anon_vma_prepare_locked(vma) {
        return Err(Fault::Oom { addr }.into());
    }
    let new = match alloc_private(ctx, haddr, addr) {
        Ok(page) => page,
        // unmap_ref_private: the owner of the reservations takes its
        // anonymous page back from the children and reuses it.
        Err(_)
            if vma.hugetlb_resv.is_some()
                && flags & PG_ANON != 0
                && flags & PG_FILE == 0
                && mm.unmap_ref_private(vma, haddr, pte.pfn()) =>
        {
            return wp(ctx, leaf, haddr, pte, addr);
        }
        Err(e) => return Err(e),
    };
    let old_page = phys.get(pte.pfn());
    copy_huge(mm, &old_page, &new);
    drop(old_page);
    let mut ptl = leaf.lock();
    if ptl.get(haddr) != pte {
        return Ok(());
    }
    // Clear, flush, then install: no CPU may read the old copy after a
    // write to the new one.
    let (_, old) = crate::rmap::unmap_page(&mut ptl, haddr, phys).expect("a present entry holds a page");
    mm.flush_tlb();
    crate::rmap::map_page(&mut ptl, haddr, new, Pte::WRITE | Pte::DIRTY | Pte::ACCESSED | Pte::HUGE | nx(vma));
    drop(ptl);
    drop(old);
    mm.count_hugetlb_fault();
    Ok(())
}
