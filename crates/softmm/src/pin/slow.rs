//! The slow path of pinning (Linux's `__get_user_pages`): per page, the VMA
//! checks, a look at the entry under its PTE lock (`follow_page_pte`), and a
//! fault (`faultin_page`) or an unshare where the page cannot be pinned as it
//! is, then again. Which lock protocol it runs under is the [`PinPolicy`]:
//!
//! * `per-page` ([`take_locked`] with batches of 1): `mmap_lock` for read
//!   taken and dropped around every page, as VFIO's `vaddr_get_pfn` did
//!   before seed 004's patch 9;
//! * `batched` ([`take_locked`] with [`BATCH_PAGES`]): held across a batch
//!   of 512 pages and dropped between batches so that writers are not
//!   starved (seed 004, and VFIO's batching in Linux 5.12);
//! * `per-vma` ([`take_lock_free`], the default): gup-fast for what is
//!   present, and for the rest a fault under the fault path's own lock-free
//!   protocol (the address space's [`FaultPolicy`](crate::FaultPolicy))
//!   followed by gup-fast again; `mmap_lock` only for what neither can do
//!   (a VMA check that fails, an unshare), so pinning a populated or
//!   faultable range writes no shared line per page.
//!
//! [`PinPolicy`]: crate::PinPolicy

use std::sync::Arc;

use crate::error::{Errno, Fault, Result};
use crate::fault::{Access, FaultStats};
use crate::mm::AddressSpace;
use crate::pgtable::Pte;
use crate::phys::{Pfn, PG_ANON, PG_ANON_EXCLUSIVE, PG_DIRTY};
use crate::rmap;
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SIZE;

use super::{fast, Request, Taken};

/// Pages pinned under one hold of `mmap_lock` by the `batched` policy:
/// VFIO's `VFIO_BATCH_MAX_CAPACITY` (a page of page pointers).
pub(crate) const BATCH_PAGES: u64 = 512;

/// `faultin_page`'s errno for a fault's signal.
fn fault_errno(f: Fault) -> Errno {
    match f {
        Fault::Oom { .. } => Errno::NoMem,
        _ => Errno::Fault,
    }
}

/// Linux's `is_cow_mapping`: private and may become writable.
fn is_cow_mapping(vma: &Vma) -> bool {
    vma.flags & (VmFlags::SHARED | VmFlags::MAYWRITE) == VmFlags::MAYWRITE
}

/// Linux's `check_vma_flags` for the flags softmm has: `VM_IO`/`VM_PFNMAP`,
/// a long-term write pin of a mapping that needs dirty tracking
/// (`writable_file_mapping_allowed`), a write without `VM_WRITE` or a read
/// without `VM_READ` are `EFAULT` (there is no `FOLL_FORCE`).
fn check_vma_flags(vma: &Vma, req: &Request) -> Result<()> {
    if vma.flags.intersects(VmFlags::IO | VmFlags::PFNMAP) {
        return Err(Errno::Fault);
    }
    // A device writes through a long-term pin for as long as the pin
    // lives, into a page that writeback cleans and write-protects meanwhile,
    // unseen by the write faults that dirty tracking relies on (and that
    // Linux's filesystems allocate blocks in): the file would not get those
    // bytes before the unpin. Shared mappings of in-memory (shmem) and
    // hugetlbfs files need no tracking, and a private mapping's pin breaks
    // COW into anonymous memory first.
    if req.write && req.pin && req.longterm && (vma.needs_dirty_tracking() || host_file_needs_dirty_tracking(vma)) {
        return Err(Errno::Fault);
    }
    let need = if req.write { VmFlags::WRITE } else { VmFlags::READ };
    if !vma.flags.contains(need) {
        return Err(Errno::Fault);
    }
    Ok(())
}

/// `vma_needs_dirty_tracking` of a coherent shared mapping of a host file:
/// a shared writable mapping of a file the host writes back, as the same
/// file under `HostFileCoherence::Cache` is.
fn host_file_needs_dirty_tracking(vma: &Vma) -> bool {
    vma.flags.contains(VmFlags::SHARED | VmFlags::WRITE) && crate::fault::host_window::is_host_file_window(vma)
}

/// What `follow_page` found.
enum Follow {
    /// Pinned (or referenced).
    Got(Pfn),
    /// Not mapped as needed: fault it in.
    Fault,
    /// Mapped, but a pin needs an exclusive anonymous page (`gup_must_unshare`).
    Unshare,
}

/// Linux's `follow_page_pte` (and `follow_huge_pmd` for a hugetlb page's
/// 2 MiB leaf, whose head frame counts the reference and the pin while the
/// subpage of `va` is handed out): takes the page mapped at `va` under its
/// PTE lock, if it can be taken as it is.
fn follow_page(mm: &AddressSpace, vma: &Vma, req: &Request, va: u64) -> Follow {
    let guard = crossbeam_epoch::pin();
    let Some(leaf) = mm.pgtables.leaf(va, &guard) else { return Follow::Fault };
    let huge = leaf.entry_size() != PAGE_SIZE;
    if huge && !vma.flags.contains(VmFlags::HUGETLB) {
        return Follow::Fault;
    }
    let ptl = leaf.lock();
    let pte = ptl.get(va);
    if !pte.is_present() || (req.write && !pte.has(Pte::WRITE)) {
        return Follow::Fault;
    }
    let phys = &mm.phys;
    let pfn = pte.pfn();
    if pfn == phys.zero_pfn() {
        // Never counted; a long-term read pin in a COW mapping unshares it.
        return if req.pin && req.longterm && is_cow_mapping(vma) { Follow::Unshare } else { Follow::Got(pfn) };
    }
    let d = phys.desc(pfn);
    if req.pin {
        // Under the PTE lock: fork clears the exclusive bit under it.
        let flags = d.flags.load(Ordering::Relaxed);
        let anon = flags & PG_ANON != 0;
        let must_unshare =
            if anon { flags & PG_ANON_EXCLUSIVE == 0 } else { !req.write && req.longterm && is_cow_mapping(vma) };
        if must_unshare {
            return Follow::Unshare;
        }
    }
    let frame = ptl.page(va, phys).expect("a present entry holds a frame");
    if req.pin {
        d.pincount.fetch_add(1, Ordering::Relaxed);
    }
    let head = frame.into_raw();
    Follow::Got(if huge { crate::pin::hugetlb::subpage(head, va) } else { head })
}

/// `FAULT_FLAG_UNSHARE` for a read-only pin: marks the anonymous page mapped
/// at `va` exclusive if its entry holds its only reference, else replaces
/// the page (a shared anonymous page, the zero page, or a file page in a
/// private mapping) by an exclusive anonymous copy, mapped read-only as
/// before.
/// Needs `mmap_lock` (it may give the VMA its anon_vma). The caller looks
/// again whatever happened.
fn unshare(mm: &AddressSpace, vma: &Vma, va: u64) -> Result<()> {
    if vma.flags.contains(VmFlags::HUGETLB) {
        return crate::pin::hugetlb::hugetlb_unshare(mm, vma, va);
    }
    if !mm.anon_vma_prepare_locked(vma) {
        return Err(Errno::NoMem);
    }
    let phys = &mm.phys;
    let guard = crossbeam_epoch::pin();
    let Some(leaf) = mm.pgtables.leaf(va, &guard) else { return Ok(()) };
    // The page to copy, referenced under the PTE lock: a frame number read
    // without it may name a page freed (and reused) since.
    let ptl = leaf.lock();
    let pte = ptl.get(va);
    if !pte.is_present() {
        return Ok(());
    }
    // do_wp_page's reuse (wp_can_reuse_anon_folio): an anonymous page whose
    // one reference is this entry's is this process's alone, so it is
    // marked exclusive where it is rather than copied. Under the PTE lock
    // no new mapping of it appears (fork copies under it).
    let d = phys.desc(pte.pfn());
    if pte.pfn() != phys.zero_pfn()
        && d.flags.load(Ordering::Relaxed) & PG_ANON != 0
        && d.refcount.load(Ordering::Acquire) == 1
    {
        d.flags.fetch_or(PG_ANON_EXCLUSIVE, Ordering::Relaxed);
        return Ok(());
    }
    let old_page = ptl.page(va, phys).expect("a present entry holds a frame");
    drop(ptl);
    let at = mm.placement(vma, va);
    let new = if pte.pfn() == phys.zero_pfn() { phys.alloc_zeroed_at(&at) } else { phys.alloc_copy_at(pte.pfn(), &at) };
    drop(old_page);
    let new = new.ok_or(Errno::NoMem)?;
    let d = new.desc();
    d.flags.store(PG_ANON | PG_DIRTY | PG_ANON_EXCLUSIVE, Ordering::Relaxed);
    d.index.store(vma.pgoff_at(va), Ordering::Relaxed);
    let mut ptl = leaf.lock();
    if ptl.get(va) != pte {
        return Ok(());
    }
    // As a COW break: clear, shoot down, install, so that no CPU reads the
    // old page after the pin's device writes the new one.
    let old = rmap::unmap_page(&mut ptl, va, phys).expect("a present entry holds a frame");
    let flushed = mm.flush_tlb();
    rmap::map_page(&mut ptl, va, new, Pte::ACCESSED);
    drop(ptl);
    old.release(flushed);
    Ok(())
}

/// How many times [`take_one_locked`] faults or unshares one page before it
/// gives up with `EAGAIN`. Each round makes the page pinnable unless
/// something else changes it meanwhile (a migration, a concurrent zap), so a
/// page that still cannot be pinned after this many is changing faster
/// than it can be pinned, or its state is one no fault can mend: either way
/// the caller, which holds `mmap_lock`, must not spin on it.
const FOLLOW_TRIES: u32 = 64;

/// Pins the page at `va` of `vma` (checked) for a caller holding
/// `mmap_lock`, faulting or unsharing it first where needed; `EAGAIN` after
/// [`FOLLOW_TRIES`] rounds that did not make it pinnable.
fn take_one_locked(mm: &AddressSpace, vma: &Vma, req: &Request, va: u64, out: &mut Taken<'_>) -> Result<()> {
    if crate::fault::host_window::is_host_file_window(vma) {
        // A coherent shared mapping of a host file: the host's page, held
        // mapped; past the file's end the fault's `SIGBUS` (`EFAULT`).
        let held = crate::fault::host_window::hold_page(vma, va, req.write, req.pin).ok_or(Errno::Fault)?;
        // gup faults the page in on Linux: it is mapped from now on.
        crate::fault::host_window::mapped(mm, vma, va, req.write);
        out.push_host(held);
        return Ok(());
    }
    let access = if req.write { Access::Write } else { Access::Read };
    for _ in 0..FOLLOW_TRIES {
        match follow_page(mm, vma, req, va) {
            Follow::Got(pfn) => {
                out.pfns.push(pfn);
                return Ok(());
            }
            Follow::Fault => {
                out.stats.faults += 1;
                mm.handle_mm_fault(vma, va, access).map_err(fault_errno)?;
            }
            Follow::Unshare => unshare(mm, vma, va)?,
        }
    }
    Err(Errno::Again)
}

/// The `per-page` (`batch` 1) and `batched` policies: `[start, end)` page by
/// page with `mmap_lock` held for read across `batch` pages at a time.
pub(crate) fn take_locked(
    mm: &AddressSpace,
    req: &Request,
    start: u64,
    end: u64,
    batch: u64,
    out: &mut Taken<'_>,
) -> Result<()> {
    let mut va = start;
    while va < end {
        let stop = end.min(va.saturating_add(batch * PAGE_SIZE));
        let st = mm.read_lock();
        out.stats.mmap_lock_acquisitions += 1;
        let mut vma: Option<&Arc<Vma>> = None;
        while va < stop {
            let v = match vma {
                Some(v) if va < v.end => v,
                _ => {
                    let v = st.vmas.find(va).ok_or(Errno::Fault)?;
                    check_vma_flags(v, req)?;
                    vma = Some(v);
                    v
                }
            };
            take_one_locked(mm, v, req, va, out)?;
            va += PAGE_SIZE;
        }
    }
    out.stats.pages = out.pfns.len() as u64;
    Ok(())
}

/// A fault at `va` under the fault path's own protocol, if `va` lies in a
/// VMA the request may use (else the locked path reports the error). True
/// if it succeeded.
fn fault_lock_free(mm: &AddressSpace, req: &Request, va: u64, out: &mut Taken<'_>) -> bool {
    {
        let guard = crossbeam_epoch::pin();
        match mm.vmas_rcu(&guard).find(va) {
            // hugetlb faults take `mmap_lock` anyway: the locked path does
            // them, once per 2 MiB page.
            Some(v) if check_vma_flags(v, req).is_ok() && !v.flags.contains(VmFlags::HUGETLB) => {}
            _ => return false,
        }
    }
    let access = if req.write { Access::Write } else { Access::Read };
    let mut fs = FaultStats::default();
    let ok = mm.handle_fault_counted(va, access, &mut fs, None).is_ok();
    out.stats.faults += fs.faults;
    out.stats.mmap_lock_acquisitions += fs.mmap_lock_acquisitions;
    ok
}

/// Pages faulted in ahead, lock-free, when gup-fast stops at a page that
/// is not present, so that one gup-fast walk takes them all.
const FAULT_AHEAD: u64 = 16;

/// The `per-vma` policy: gup-fast; where it stops, lock-free faults for up
/// to [`FAULT_AHEAD`] pages (not past the first that fails or is present,
/// nor out of the leaf table) and gup-fast again; the locked path for a
/// page neither can take.
pub(crate) fn take_lock_free(
    mm: &AddressSpace,
    req: &Request,
    start: u64,
    end: u64,
    out: &mut Taken<'_>,
) -> Result<()> {
    let mut va = start;
    while va < end {
        va = fast::gup_fast(mm, req, va, end, out);
        if va >= end {
            break;
        }
        if fault_lock_free(mm, req, va, out) {
            let table_end = (va | (crate::pgtable::PMD_SIZE - 1)) + 1;
            let ahead = end.min(table_end).min(va + FAULT_AHEAD * PAGE_SIZE);
            let mut f = va + PAGE_SIZE;
            while f < ahead && !mm.pte_at(f).is_present() && fault_lock_free(mm, req, f, out) {
                f += PAGE_SIZE;
            }
            let next = fast::gup_fast(mm, req, va, end, out);
            if next > va {
                va = next;
                continue;
            }
        }
        let st = mm.read_lock();
        out.stats.mmap_lock_acquisitions += 1;
        let vma = st.vmas.find(va).ok_or(Errno::Fault)?;
        check_vma_flags(vma, req)?;
        // gup-fast leaves 2 MiB leaves here: the rest of a hugetlb page
        // under this one hold of the lock.
        let stop = if vma.flags.contains(VmFlags::HUGETLB) {
            end.min((va | (crate::hugetlb::HPAGE_SIZE - 1)) + 1)
        } else {
            va + PAGE_SIZE
        };
        while va < stop {
            take_one_locked(mm, vma, req, va, out)?;
            va += PAGE_SIZE;
        }
        drop(st);
    }
    out.stats.pages = out.pfns.len() as u64;
    Ok(())
}
