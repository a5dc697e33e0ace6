//! loom models of the per-VMA `MADV_DONTNEED` ([`MadvisePolicy::PerVma`],
//! `sys/madvise.rs`) on the real code: the real [`AddressSpace::madvise`] on
//! one thread against a real fault or mapping call on another, on a tiny
//! address space.
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release
//! -p softmm --lib sys::` (scripts/test.sh). Page tables, PTE locks,
//! `mmap_lock`, the VMAs' read references, frame reference counts, the TLB
//! shootdown and crossbeam-epoch are all loom's here.
//!
//! The writer models run twice: as the code is, where no execution may
//! break the invariant, and with a `madvise::broken` switch set, where some
//! execution must: `NO_VMA_REF` (the per-VMA path zaps under the VMA it
//! found without taking its read reference), so that each model shows it
//! catches the race the reference closes.
//!
//! That the reference must also cover the TLB flush is not modelled here:
//! under loom a gather holds one frame, so a one-page zap flushes before the
//! reference could go; `madvise.rs`'s unit test
//! `a_writer_finding_the_entries_zapped_does_not_flush_them` shows the
//! stale translation that dropping it earlier would leave.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::fault::Access;
use crate::mm::{AddressSpace, MadvisePolicy, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::PAGE_SIZE;

use super::madvise::broken;

const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    // A table scan (is this table empty now?) is 512 atomic loads, each a
    // loom branch.
    b.max_branches = 100_000;
    b
}

/// A tiny address space under the per-VMA madvise with a private anonymous
/// VMA of two pages, both written (frames allocated, page tables present).
fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default().madvise_policy(MadvisePolicy::PerVma)).unwrap();
    let a = mm.mmap(0, 2 * PAGE_SIZE, RW, ANON, None, 0).unwrap();
    mm.handle_fault(a + PAGE_SIZE, Access::Write).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    (phys, mm, a)
}

/// `MADV_DONTNEED` of `a`'s page from the calling thread, with whether it
/// ran without `mmap_lock` (its `mmap_lock_read` count did not move).
fn dontneed(mm: &AddressSpace, a: u64) -> (Result<()>, bool) {
    let before = mm.counters.lock_counts().1;
    let r = mm.madvise(a, PAGE_SIZE, MADV_DONTNEED);
    (r, mm.counters.lock_counts().1 == before)
}

/// What one execution found wrong, reported rather than panicked (a panic
/// inside a loom execution aborts the process as loom objects unwind).
type Outcome = std::result::Result<(), String>;

/// Runs `model` as the code is (no execution may fail, and some must take
/// the per-VMA path), then with the `broken` switch set (some execution
/// must fail).
fn check(switch: &'static std::thread::LocalKey<std::cell::Cell<bool>>, model: fn() -> (Outcome, bool)) {
    check_with(|on| switch.with(|s| s.set(on)), model);
}

/// [`check`] with a switch that `set` turns on and off.
fn check_with(set: impl Fn(bool), model: fn() -> (Outcome, bool)) {
    set(false);
    let lock_free = Arc::new(AtomicBool::new(false));
    let seen = lock_free.clone();
    builder().check(move || {
        let (outcome, per_vma) = model();
        if let Err(e) = outcome {
            panic!("{e}");
        }
        if per_vma {
            seen.store(true, Relaxed);
        }
    });
    assert!(lock_free.load(Relaxed), "the per-VMA path never completed");
    set(true);
    let caught = crate::sync::broken::caught(2, builder, move || model().0.is_err());
    set(false);
    assert!(caught, "the model did not catch the broken variant");
}

/// A write fault in the same VMA (a write to the zero page: a COW that
/// allocates a frame and commits it under the PTE lock, lock-free) against
/// `MADV_DONTNEED` of that page: both succeed, and once both are done the
/// page either holds the fault's frame or nothing, and no frame is left
/// that nothing maps (a zap that missed the fault's commit, or a commit over
/// a zapped entry, would leave one or free a mapped one). No writer changes
/// the VMA here: the PTE lock orders the two, which the model shows by
/// catching the zap that decides from a read taken before the lock
/// (`pgtable::broken::ZAP_READS_UNLOCKED`: the fault's commit lands between
/// the zap's read of the entry and its clear, and the committed frame is
/// dropped from the table without its reference).
#[test]
fn dontneed_vs_fault() {
    // Per OS thread, which runs every thread of the model.
    check_with(
        |on| crate::pgtable::broken::ZAP_READS_UNLOCKED.with(|c| c.set(on)),
        || {
            let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
            let mm = AddressSpace::new(&phys, MmConfig::model_default().madvise_policy(MadvisePolicy::PerVma)).unwrap();
            let a = mm.mmap(0, 2 * PAGE_SIZE, RW, ANON, None, 0).unwrap();
            // The VMA's anon_vma and page table exist; `a` maps the zero page.
            mm.handle_fault(a + PAGE_SIZE, Access::Write).unwrap();
            mm.handle_fault(a, Access::Read).unwrap();
            let t = {
                let mm = mm.clone();
                crate::sync::model::spawn(move || {
                    let _q = crate::tlb::QuiescentGuard::enter();
                    mm.handle_fault(a, Access::Write)
                })
            };
            let (r, per_vma) = dontneed(&mm, a);
            let f = t.join().unwrap();
            assert_eq!((r, f), (Ok(()), Ok(())));
            let pte = mm.pte_at(a);
            let mine = u64::from(pte.has_frame() && pte.pfn() != phys.zero_pfn());
            let used = phys.stats().frames_used;
            let outcome = if !(pte.is_none() || mine == 1) {
                Err(format!("{pte:?}"))
            } else if used != 1 + mine {
                Err(format!("{used} frames used for {} mapped: a frame nothing maps, or a mapped one freed", 1 + mine))
            } else {
                Ok(())
            };
            (outcome, per_vma)
        },
    );
}

/// `munmap` of the VMA and a `MAP_LOCKED` mapping in its place (populated
/// by the `mmap`) against `MADV_DONTNEED` of its first page: whichever came
/// first, the locked page is resident afterwards (`MADV_DONTNEED` of a
/// locked VMA is `EINVAL`; of the old VMA, it zapped the old page; of the
/// hole between, `ENOMEM`). Without the reference, a `MADV_DONTNEED` that
/// found the old VMA zaps the new mapping's locked page.
#[test]
fn dontneed_vs_munmap_and_locked_remap() {
    check(&broken::NO_VMA_REF, || {
        let (phys, mm, a) = setup();
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let _q = crate::tlb::QuiescentGuard::enter();
                mm.munmap(a, 2 * PAGE_SIZE).unwrap();
                mm.mmap(a, PAGE_SIZE, RW, ANON | MAP_FIXED | MAP_LOCKED, None, 0).unwrap();
            })
        };
        let (r, per_vma) = dontneed(&mm, a);
        t.join().unwrap();
        let outcome = if !matches!(r, Ok(()) | Err(Errno::Inval) | Err(Errno::NoMem)) {
            Err(format!("madvise: {r:?}"))
        } else if !mm.pte_at(a).has_frame() {
            Err(format!("the locked page was dropped (madvise: {r:?})"))
        } else if phys.stats().frames_used != 1 {
            Err(format!("{} frames for one locked page", phys.stats().frames_used))
        } else {
            Ok(())
        };
        (outcome, per_vma && r.is_ok())
    });
}

/// `mremap` moving the VMA against `MADV_DONTNEED` of its first page: the
/// call succeeds if and only if it came first, and then the page it dropped
/// is not at the destination; if the move came first, the old address is a
/// hole (`ENOMEM`) and the page arrived intact. Without the reference, a
/// `MADV_DONTNEED` that found the VMA before the move zaps the emptied old
/// range and succeeds while the page lives on at the destination.
#[test]
fn dontneed_vs_mremap() {
    check(&broken::NO_VMA_REF, || {
        let (phys, mm, a) = setup();
        let b = a + 16 * PAGE_SIZE;
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let _q = crate::tlb::QuiescentGuard::enter();
                mm.mremap(a, 2 * PAGE_SIZE, 2 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, b)
            })
        };
        let (r, per_vma) = dontneed(&mm, a);
        assert_eq!(t.join().unwrap(), Ok(b));
        let moved = mm.pte_at(b).has_frame();
        let outcome = match r {
            Ok(()) if moved => Err("MADV_DONTNEED succeeded but the page survived at the destination".to_string()),
            Err(Errno::NoMem) if !moved => Err("ENOMEM, yet the page was dropped".to_string()),
            Ok(()) | Err(Errno::NoMem) => Ok(()),
            Err(e) => Err(format!("madvise: {e:?}")),
        };
        let outcome = outcome.and_then(|()| match phys.stats().frames_used {
            n if n == 1 + u64::from(moved) => Ok(()),
            n => Err(format!("{n} frames, {} mapped", 1 + u64::from(moved))),
        });
        (outcome, per_vma && r.is_ok())
    });
}
