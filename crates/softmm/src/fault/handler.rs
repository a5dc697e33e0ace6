//! The fault kinds, shared by every [`FaultPolicy`](super::FaultPolicy): each
//! takes a VMA the policy has made stable and commits under the PTE lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Errno, Fault, SegvCode};
use crate::mm::AddressSpace;
use crate::pgtable::{self, mk_pte, pte_pfn, PageTable, PTE_ACCESSED, PTE_DIRTY, PTE_PRESENT, PTE_PROTNONE, PTE_WRITE};
use crate::phys::{Pfn, PG_ANON, PG_DIRTY, PG_FILE};
use crate::sync::AtomicU64;
use crate::vma::flags::*;
use crate::vma::{AnonVma, Vma};
use crate::PAGE_SIZE;

use super::Access;

/// Resolves a fault at `addr` inside `vma`.
pub(crate) fn handle_vma_fault(mm: &AddressSpace, vma: &Arc<Vma>, addr: u64, access: Access) -> Result<(), Fault> {
    let write = access == Access::Write;
    let allowed = if write { vma.flags & VM_WRITE != 0 } else { vma.flags & VM_ACCESS_FLAGS != 0 };
    if !allowed {
        return Err(Fault::Segv { addr, code: SegvCode::AccErr });
    }
    let va = addr & !(PAGE_SIZE - 1);
    let guard = crossbeam_epoch::pin();
    let table = mm.pgtables.leaf_alloc(va, &mm.phys, &guard);
    let entry = table.entry(pgtable::index(va, 0));
    loop {
        let pte = entry.load(Ordering::Acquire);
        let done = if pte & PTE_PRESENT == 0 {
            if pte & PTE_PROTNONE != 0 {
                restore_protnone(table, entry, pte, vma)
            } else if vma.file.is_some() {
                do_file_fault(mm, vma, va, table, entry, write)?
            } else {
                do_anonymous_page(mm, vma, va, table, entry, write)?
            }
        } else if write && pte & PTE_WRITE == 0 {
            do_wp_page(mm, vma, va, table, entry, pte)?
        } else {
            true
        };
        if done {
            return Ok(());
        }
    }
}

/// The anon_vma of `vma`, made on its first anonymous fault.
pub(crate) fn anon_vma_prepare(mm: &AddressSpace, vma: &Vma) -> Arc<AnonVma> {
    vma.anon_vma.get_or_init(|| Arc::new(AnonVma { id: mm.phys.next_id(), forked: false })).clone()
}

fn oom(va: u64) -> Fault {
    Fault::Oom { addr: va }
}

/// A `PROT_NONE` entry in a VMA that is accessible again.
fn restore_protnone(table: &PageTable, entry: &AtomicU64, pte: u64, vma: &Vma) -> bool {
    let _ptl = table.lock();
    if entry.load(Ordering::Relaxed) == pte {
        let mut new = (pte & !PTE_PROTNONE) | PTE_PRESENT;
        if vma.flags & VM_WRITE == 0 {
            new &= !PTE_WRITE;
        }
        entry.store(new, Ordering::Release);
    }
    false
}

fn install(mm: &AddressSpace, table: &PageTable, entry: &AtomicU64, pfn: Pfn, flags: u64) -> bool {
    let ptl = table.lock();
    if entry.load(Ordering::Relaxed) != 0 {
        drop(ptl);
        mm.phys.put(pfn);
        return false;
    }
    mm.map_frame(pfn);
    entry.store(mk_pte(pfn, flags | PTE_PRESENT | PTE_ACCESSED), Ordering::Release);
    true
}

fn do_anonymous_page(
    mm: &AddressSpace,
    vma: &Vma,
    va: u64,
    table: &PageTable,
    entry: &AtomicU64,
    write: bool,
) -> Result<bool, Fault> {
    if !write {
        return Ok(install(mm, table, entry, mm.phys.zero_pfn(), 0));
    }
    anon_vma_prepare(mm, vma);
    let pfn = mm.phys.alloc_zeroed(0).ok_or_else(|| oom(va))?;
    let d = mm.phys.desc(pfn);
    d.flags.store(PG_ANON | PG_DIRTY, Ordering::Relaxed);
    d.index.store(vma.pgoff_at(va), Ordering::Relaxed);
    Ok(install(mm, table, entry, pfn, PTE_WRITE | PTE_DIRTY))
}

fn do_file_fault(
    mm: &AddressSpace,
    vma: &Vma,
    va: u64,
    table: &PageTable,
    entry: &AtomicU64,
    write: bool,
) -> Result<bool, Fault> {
    let file = vma.file.as_ref().expect("file VMA");
    let index = vma.pgoff_at(va);
    let shared = vma.flags & VM_MAYSHARE != 0;
    let _inval = file.invalidate_lock.read();
    let page = match file.get_page(index) {
        Ok(Some(p)) => p,
        Ok(None) => return Err(Fault::Bus { addr: va }),
        Err(Errno::NoMem) | Err(_) => return Err(oom(va)),
    };
    if write && !shared {
        // Private write: the mapping gets its own copy (COW from the file).
        anon_vma_prepare(mm, vma);
        let copy = mm.phys.alloc_copy(page, 0);
        mm.phys.put(page);
        let copy = copy.ok_or_else(|| oom(va))?;
        let d = mm.phys.desc(copy);
        d.flags.store(PG_ANON | PG_DIRTY, Ordering::Relaxed);
        d.index.store(index, Ordering::Relaxed);
        return Ok(install(mm, table, entry, copy, PTE_WRITE | PTE_DIRTY));
    }
    let flags = if write {
        mm.phys.desc(page).flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
        PTE_WRITE | PTE_DIRTY
    } else {
        0
    };
    if !install(mm, table, entry, page, flags) {
        return Ok(false);
    }
    if !write {
        fault_around(mm, vma, va, table, file);
    }
    Ok(true)
}

/// Maps the cached pages around a file read fault, read-only, in one go
/// (Linux's `filemap_map_pages` over `fault_around_bytes`).
fn fault_around(mm: &AddressSpace, vma: &Vma, va: u64, table: &PageTable, file: &crate::file::File) {
    let window = mm.config.fault_around_pages * PAGE_SIZE;
    if window <= PAGE_SIZE {
        return;
    }
    let table_start = va & !(pgtable::PMD_SIZE - 1);
    let start = (va & !(window - 1)).max(vma.start).max(table_start);
    let end = ((va & !(window - 1)) + window).min(vma.end).min(table_start + pgtable::PMD_SIZE);
    let _ptl = table.lock();
    let mut a = start;
    while a < end {
        let e = table.entry(pgtable::index(a, 0));
        if a != va && e.load(Ordering::Relaxed) == 0 {
            if let Some(p) = file.find_get_page(vma.pgoff_at(a)) {
                mm.map_frame(p);
                e.store(mk_pte(p, PTE_PRESENT), Ordering::Release);
            }
        }
        a += PAGE_SIZE;
    }
}

/// A write to a present, write-protected page: make it writable in place when
/// the page is shared-mapped or exclusively ours, else copy it (COW).
fn do_wp_page(
    mm: &AddressSpace,
    vma: &Vma,
    va: u64,
    table: &PageTable,
    entry: &AtomicU64,
    pte: u64,
) -> Result<bool, Fault> {
    let pfn = pte_pfn(pte);
    let phys = &mm.phys;
    if vma.flags & VM_SHARED != 0 {
        let _ptl = table.lock();
        if entry.load(Ordering::Relaxed) == pte {
            phys.desc(pfn).flags.fetch_or(PG_DIRTY, Ordering::Relaxed);
            entry.store(pte | PTE_WRITE | PTE_DIRTY | PTE_ACCESSED, Ordering::Release);
        }
        return Ok(false);
    }
    if pfn != phys.zero_pfn() {
        let d = phys.desc(pfn);
        let flags = d.flags.load(Ordering::Relaxed);
        if flags & PG_ANON != 0 && flags & PG_FILE == 0 {
            let _ptl = table.lock();
            // Under the PTE lock no new mapping of this frame can appear
            // (fork copies entries under this lock), so refcount 1 means ours.
            if entry.load(Ordering::Relaxed) == pte
                && d.refcount.load(Ordering::Acquire) == 1
                && d.pincount.load(Ordering::Relaxed) == 0
            {
                entry.store(pte | PTE_WRITE | PTE_DIRTY | PTE_ACCESSED, Ordering::Release);
                return Ok(true);
            }
        }
    }
    anon_vma_prepare(mm, vma);
    let new = if pfn == phys.zero_pfn() { phys.alloc_zeroed(0) } else { phys.alloc_copy(pfn, 0) };
    let new = new.ok_or_else(|| oom(va))?;
    let d = phys.desc(new);
    d.flags.store(PG_ANON | PG_DIRTY, Ordering::Relaxed);
    d.index.store(vma.pgoff_at(va), Ordering::Relaxed);
    let ptl = table.lock();
    if entry.load(Ordering::Relaxed) != pte {
        drop(ptl);
        phys.put(new);
        return Ok(false);
    }
    // Other CPUs may cache the read-only translation of the old frame: clear,
    // flush, then install, so no CPU reads the old copy after a write to the new.
    entry.store(0, Ordering::Release);
    mm.flush_tlb();
    mm.map_frame(new);
    entry.store(mk_pte(new, PTE_PRESENT | PTE_WRITE | PTE_DIRTY | PTE_ACCESSED), Ordering::Release);
    drop(ptl);
    if pfn != phys.zero_pfn() {
        phys.desc(pfn).mapcount.fetch_sub(1, Ordering::Relaxed);
        phys.put(pfn);
    }
    Ok(true)
}
