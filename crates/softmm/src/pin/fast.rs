//! gup-fast: pinning present pages without `mmap_lock`, a VMA or a PTE lock
//! (Linux's `gup_fast`, `gup_fast_pte_range`).
//!
//! # Protocol
//!
//! The walk runs under an epoch guard, so no page table it reaches is freed
//! under it (detached tables wait for a grace period). For each entry it
//! reads the value without a lock, takes a reference on the frame with a
//! try-get (an increment that fails on a zero count: the frame was freed),
//! counts the pin, and then re-reads the entry: if it changed, an `munmap`,
//! `MADV_DONTNEED` or COW replaced it meanwhile and the reference is put
//! again (possibly freeing a frame that was reused: the reference was a real
//! one). If it is unchanged the pin was taken while the page was mapped, and
//! a later unmap leaves the frame to the pin.
//!
//! Against `fork`: a `FOLL_PIN` walk reads `write_protect_seq` first (odd:
//! fall back at once) and re-reads it after its pins, with a SeqCst fence
//! between each pin count increment and that read; `fork` makes it odd and
//! fences before it reads pin counts. By the store-buffering argument one of
//! them sees the other: either `fork` sees the pin (and copies the page into
//! the child), or gup-fast sees the count moved and undoes every pin of the
//! walk (and the slow path, under `mmap_lock`, waits for `fork`).
//!
//! What gup-fast leaves to the slow path, stopping at the first such page:
//! no entry or table, a non-present entry, a write to a read-only entry, a
//! 2 MiB leaf, a failed try-get, an anonymous page that is not exclusive
//! (`gup_must_unshare`), the zero page for a write or long-term pin, any
//! non-anonymous page for a read-only long-term pin (which needs its VMA to
//! know whether to unshare), and a host-backed file's page for a long-term
//! write pin (`gup_fast_folio_allowed`: its VMA check refuses it).

use crate::mm::AddressSpace;
use crate::pgtable::{Leaf, Pte};
use crate::phys::{FrameDesc, Pfn, PG_ANON, PG_ANON_EXCLUSIVE, PG_HOST_FILE};
use crate::sync::{fence, Ordering};
use crate::PAGE_SIZE;

use super::{release, Request, Taken};

/// Takes a reference unless the count is zero (`folio_try_get`).
fn try_get(d: &FrameDesc) -> bool {
    let mut cur = d.refcount.load(Ordering::Relaxed);
    loop {
        if cur == 0 || cur == u32::MAX {
            return false;
        }
        match d.refcount.compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Pins (or references) the pages of `[start, end)` from `start` on while
/// they can be taken lock-free, appending them to `out`; returns the address
/// of the first page not taken (`end` if all were).
pub(crate) fn gup_fast(mm: &AddressSpace, req: &Request, start: u64, end: u64, out: &mut Taken<'_>) -> u64 {
    let seq = if req.pin {
        match mm.pins.write_protect_seq.read_begin() {
            Some(s) => s,
            None => return start,
        }
    } else {
        0
    };
    let first = out.pfns.len();
    let guard = crossbeam_epoch::pin();
    let mut va = start;
    'walk: for leaf in mm.pgtables.leaves(start, end, &guard) {
        if leaf.start() != va || leaf.entry_size() != PAGE_SIZE {
            break; // a hole, or a 2 MiB leaf
        }
        while va < leaf.end() {
            match try_grab(mm, req, &leaf, va) {
                Some(pfn) => out.pfns.push(pfn),
                None => break 'walk,
            }
            va += PAGE_SIZE;
        }
    }
    if req.pin && out.pfns.len() > first {
        // Every pin count increment above is followed by a SeqCst fence
        // (in try_grab), so this load is ordered after all of them.
        if !mm.pins.write_protect_seq.validate(seq) {
            for pfn in out.pfns.drain(first..) {
                release(&mm.phys, pfn, true);
            }
            return start;
        }
    }
    out.stats.fast_pages += (out.pfns.len() - first) as u64;
    va
}

/// The frame of the entry at `va`, pinned or referenced, if gup-fast may
/// take it (see the module's list).
fn try_grab(mm: &AddressSpace, req: &Request, leaf: &Leaf<'_>, va: u64) -> Option<Pfn> {
    let pte = leaf.load(va);
    if !pte.is_present() || (req.write && !pte.has(Pte::WRITE)) {
        return None;
    }
    let phys = &mm.phys;
    let pfn = pte.pfn();
    if pfn == phys.zero_pfn() {
        // No reference is taken on the zero page (try_grab_folio); a
        // long-term read pin in a COW mapping must unshare it (slow path).
        return (!req.write && !req.longterm).then_some(pfn);
    }
    let d = phys.desc(pfn);
    if !try_get(d) {
        return None;
    }
    if req.pin {
        d.pincount.fetch_add(1, Ordering::Relaxed);
        // Orders the pin count before the re-check of the entry and of
        // `write_protect_seq` (the store-buffering pair with fork).
        fence(Ordering::SeqCst);
    }
    let undo = || {
        release(phys, pfn, req.pin);
        None
    };
    // gup_fast_pte_range: the entry must still be the one we took it from.
    if leaf.load(va) != pte {
        return undo();
    }
    if req.pin {
        let flags = d.flags.load(Ordering::Acquire);
        let anon = flags & PG_ANON != 0;
        // gup_must_unshare: an anonymous page is pinned only while
        // exclusive; a read-only long-term pin of any other page needs the
        // VMA (the slow path) to know whether it must unshare.
        if (anon && flags & PG_ANON_EXCLUSIVE == 0) || (!anon && req.longterm && !req.write) {
            return undo();
        }
        // gup_fast_folio_allowed: a long-term write pin of a page whose
        // file writes back is refused by the VMA check
        // (`writable_file_mapping_allowed`), which only the slow path has.
        if req.longterm && req.write && flags & PG_HOST_FILE != 0 {
            return undo();
        }
    }
    Some(pfn)
}
