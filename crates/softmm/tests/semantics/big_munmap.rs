//! A large `munmap` racing faulters, mappers and probes of the range itself,
//! under every [`UnmapPolicy`] (seed 002), with data checks:
//!
//! * a probe of the range being unmapped reads the page's own pattern or gets
//!   `SIGSEGV` (`SEGV_MAPERR`), never anything else, and once `munmap` has
//!   returned every access faults, on every CPU (its TLB included);
//! * a `MAP_FIXED` mapping over part of the range, or a hinted one into it,
//!   reads zeros and keeps what it wrote: never the old pattern (a stale
//!   entry of the half-zapped range) and never lost to the zap;
//! * a growsdown stack right above the range grows into it only once it is
//!   empty (Linux 5.8's race);
//! * the frames are free when `munmap` returns, and nothing leaks.
//!
//! The range crosses a 1 GiB boundary so that `sectioned` has two sections.
//! Speed is never asserted; a watchdog catches a hang.

use softmm_testkit::common;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Barrier};
use std::thread;

use common::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Fault, FaultPolicy, MmConfig, SegvCode, UnmapPolicy};

/// The range: 40 MiB, from 24 MiB below a 1 GiB boundary.
const BIG_LEN: u64 = 40 << 20;
const BIG: u64 = (1 << 40) - (24 << 20);
/// The last 64 KiB of the range, where the mapper maps `MAP_FIXED`.
const WINDOW: u64 = BIG + BIG_LEN - (64 << 10);
const WINDOW_LEN: u64 = 64 << 10;
/// What each page of the range holds before the unmap.
fn pattern(va: u64) -> u64 {
    va ^ 0x5eed_0000_0000_0000
}

const WATCHDOG_SECS: u64 = 120;

fn mm_for(phys: &Arc<softmm::PhysMem>, unmap: UnmapPolicy, fault: FaultPolicy) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().policy(fault).unmap_policy(unmap)).expect("config")
}

fn is_maperr(r: &Result<u64, Fault>, addr: u64) -> bool {
    matches!(r, Err(Fault::Segv { addr: a, code: SegvCode::MapErr }) if *a == addr)
}

/// Maps and fills the range, page by page.
fn map_big(mm: &Arc<AddressSpace>, cpu: &mut Cpu) {
    assert_eq!(mm.mmap(BIG, BIG_LEN, RW, ANON | MAP_FIXED, None, 0).unwrap(), BIG);
    for va in (BIG..BIG + BIG_LEN).step_by(PAGE as usize) {
        cpu.write_u64(va, pattern(va)).unwrap();
    }
}

/// Shared flags of one round.
#[derive(Default)]
struct Round {
    /// Set (Release) once `munmap` has returned.
    returned: AtomicBool,
    stop: AtomicBool,
    /// Operations of the other threads, so a round ends only after each ran.
    ops: AtomicU64,
}

/// Reads (and rewrites) pages of the range while it is unmapped.
fn prober(mm: Arc<AddressSpace>, round: Arc<Round>, start: Arc<Barrier>) {
    let mut cpu = Cpu::attached(&mm);
    start.wait();
    let mut i = 0u64;
    let pages = (WINDOW - BIG) / PAGE;
    while !round.stop.load(Relaxed) {
        let va = BIG + (i * 97 % pages) * PAGE;
        i += 1;
        let after = round.returned.load(Acquire);
        let r = cpu.read_u64(va);
        match r {
            Ok(v) => {
                assert!(!after, "{va:#x} readable after munmap returned");
                assert_eq!(v, pattern(va), "{va:#x}: neither its data nor SIGSEGV");
                // A write fault or a dirty update racing the zap.
                let _ = cpu.write_u64(va, pattern(va));
            }
            Err(_) => assert!(is_maperr(&r, va), "{va:#x}: {r:?}"),
        }
        round.ops.fetch_add(1, Relaxed);
    }
}

/// Faults pages of its own region in and out (`MADV_DONTNEED`), checking them.
fn faulter(mm: Arc<AddressSpace>, round: Arc<Round>, start: Arc<Barrier>) {
    let mut cpu = Cpu::attached(&mm);
    let len = 1 << 20;
    let a = mm.mmap(0, len, RW, ANON, None, 0).unwrap();
    start.wait();
    let mut gen = 1u64;
    while !round.stop.load(Relaxed) {
        for va in (a..a + len).step_by(PAGE as usize) {
            assert_eq!(cpu.read_u64(va).unwrap(), 0, "a fresh page is zero");
            cpu.write_u64(va, gen ^ va).unwrap();
            assert_eq!(cpu.read_u64(va).unwrap(), gen ^ va);
        }
        mm.madvise(a, len, MADV_DONTNEED).unwrap();
        gen += 1;
        round.ops.fetch_add(1, Relaxed);
    }
    mm.munmap(a, len).unwrap();
}

/// Small mmap/munmap pairs elsewhere, a hint into the range and `MAP_FIXED`
/// over its last 64 KiB, each checked to read zeros and keep its writes.
fn mapper(mm: Arc<AddressSpace>, round: Arc<Round>, start: Arc<Barrier>) {
    let mut cpu = Cpu::attached(&mm);
    start.wait();
    let mut n = 0u64;
    while !round.stop.load(Relaxed) {
        n += 1;
        let (hint, flags) = match n % 3 {
            0 => (0, ANON),
            1 => (WINDOW, ANON),
            _ => (WINDOW, ANON | MAP_FIXED),
        };
        let len = if flags & MAP_FIXED != 0 { WINDOW_LEN } else { 16 * PAGE };
        // A mapping in the range made before the munmap returned (fixed, or
        // at the hint once the mapper's own earlier munmap left a hole there)
        // may be unmapped again by it (the munmap came second, then).
        let before = !round.returned.load(Acquire);
        let a = mm.mmap(hint, len, RW, flags, None, 0).unwrap();
        let may_go = before && (BIG..BIG + BIG_LEN).contains(&a);
        for va in (a..a + len).step_by(PAGE as usize) {
            let r = cpu.read_u64(va);
            match r {
                Ok(v) => assert_eq!(v, 0, "{va:#x}: a new mapping shows old data (stale entry)"),
                Err(_) => {
                    assert!(may_go && is_maperr(&r, va), "{va:#x}: {r:?}");
                    continue;
                }
            }
            match cpu.write_u64(va, n ^ va) {
                Ok(()) => {}
                Err(f) => {
                    assert!(may_go, "{va:#x}: {f:?}");
                    continue;
                }
            }
            let r = cpu.read_u64(va);
            assert!(r == Ok(n ^ va) || (may_go && is_maperr(&r, va)), "{va:#x}: the zap took a new page: {r:?}");
        }
        mm.munmap(a, len).unwrap();
        round.ops.fetch_add(1, Relaxed);
    }
}

/// One round: map and fill the range, start the threads, unmap it, check.
fn round(unmap: UnmapPolicy, fault: FaultPolicy) {
    let phys = phys(128);
    let mm = mm_for(&phys, unmap, fault);
    let mut cpu = Cpu::attached(&mm);
    map_big(&mm, &mut cpu);
    // Shootdowns must not wait for this CPU while the thread spins below.
    cpu.park();
    let round = Arc::new(Round::default());
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = [prober as fn(_, _, _), faulter, mapper]
        .into_iter()
        .map(|f| {
            let (mm, round, start) = (mm.clone(), round.clone(), start.clone());
            thread::spawn(move || f(mm, round, start))
        })
        .collect();
    start.wait();
    let running = |ts: &[thread::JoinHandle<()>]| ts.iter().all(|t| !t.is_finished());
    while round.ops.load(Relaxed) < 20 && running(&threads) {
        thread::yield_now();
    }
    let before = phys.stats().frames_used;
    mm.munmap(BIG, BIG_LEN).unwrap();
    let after = phys.stats().frames_used;
    round.returned.store(true, Release);
    // The other threads hold at most 256 + 16 + 16 frames.
    assert!(after + BIG_LEN / PAGE <= before + 512, "{unmap:?}: frames not freed on return: {before} -> {after}");
    // Every page faults at once on this CPU, whose TLB held them all.
    cpu.resume();
    for va in (BIG..WINDOW).step_by(PAGE as usize) {
        let r = cpu.read_u64(va);
        assert!(is_maperr(&r, va), "{unmap:?}: {va:#x} after munmap: {r:?}");
    }
    cpu.park();
    let seen = round.ops.load(Relaxed);
    while round.ops.load(Relaxed) < seen + 20 && running(&threads) {
        thread::yield_now();
    }
    round.stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(mm.stats().map_count, 0, "{unmap:?}: the mapper and faulter unmapped theirs");
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

fn each_policy(name: &str, body: fn(UnmapPolicy, FaultPolicy)) {
    for &unmap in UnmapPolicy::ALL {
        for fault in [FaultPolicy::PerVmaSeq, FaultPolicy::MmapLock] {
            eprintln!("{name} [{} / {}]", unmap.name(), fault.name());
            watchdog(&format!("{name}[{}]", unmap.name()), WATCHDOG_SECS, move || body(unmap, fault));
        }
    }
}

#[test]
fn a_big_munmap_against_probes_faulters_and_mappers() {
    each_policy("big_munmap", |unmap, fault| {
        for _ in 0..3 {
            round(unmap, fault);
        }
    });
}

/// A growsdown stack right above the range: a fault below it, in the range,
/// grows the stack only once the whole range is empty (Linux 5.8's race: a
/// stack grown under a downgraded or dropped lock into the range being
/// zapped covers pages the zap has not reached, whose old entries it then
/// shows, and loses its own pages to the zap). The probe walks the top
/// 4 MiB, where the ascending zap ends: once it has seen the stack grow, no
/// page may show the old data any more.
#[test]
fn a_stack_above_the_range_grows_into_it_only_once_it_is_empty() {
    each_policy("stack_growth", |unmap, fault| {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, fault);
        let mut cpu = Cpu::attached(&mm);
        map_big(&mm, &mut cpu);
        let top = BIG + BIG_LEN;
        assert_eq!(mm.mmap(top, PAGE, RW, ANON | MAP_FIXED | MAP_GROWSDOWN, None, 0).unwrap(), top);
        let low = top - (4 << 20);
        cpu.park();
        let round = Arc::new(Round::default());
        let start = Arc::new(Barrier::new(2));
        let t = {
            let (mm, round, start) = (mm.clone(), round.clone(), start.clone());
            thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                start.wait();
                let mut grown = false;
                let mut i = 0u64;
                while !round.stop.load(Relaxed) {
                    let va = low + (i * 61 % ((top - low) / PAGE)) * PAGE;
                    i += 1;
                    let v = cpu.read_u64(va).expect("the range's page, or the stack grown into it");
                    if v == pattern(va) {
                        assert!(!grown, "{va:#x} shows the old data after the stack grew");
                    } else {
                        assert!(v == 0 || v == !va, "{va:#x}: {v:#x}");
                        grown = true;
                        cpu.write_u64(va, !va).unwrap();
                        assert_eq!(cpu.read_u64(va).unwrap(), !va, "the zap took the grown stack's page");
                    }
                    round.ops.fetch_add(1, Relaxed);
                }
                grown
            })
        };
        start.wait();
        while round.ops.load(Relaxed) < 10 && !t.is_finished() {
            thread::yield_now();
        }
        mm.munmap(BIG, BIG_LEN).unwrap();
        let seen = round.ops.load(Relaxed);
        while round.ops.load(Relaxed) < seen + 100_000 && !t.is_finished() {
            thread::yield_now();
        }
        round.stop.store(true, Relaxed);
        assert!(t.join().unwrap(), "{unmap:?}: the stack never grew");
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    });
}

/// `mremap` shrink and `brk` shrink go through the same policy path: the
/// tail is gone and its frames free when the call returns.
#[test]
fn mremap_and_brk_shrink_unmap_through_the_policy() {
    for &unmap in UnmapPolicy::ALL {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, FaultPolicy::default());
        let mut cpu = Cpu::attached(&mm);
        map_big(&mm, &mut cpu);
        let keep = 4 << 20;
        assert_eq!(mm.mremap(BIG, BIG_LEN, keep, 0, 0).unwrap(), BIG);
        assert_eq!(phys.stats().frames_used, keep / PAGE, "{unmap:?}");
        assert!(is_maperr(&cpu.read_u64(BIG + keep), BIG + keep));
        assert_eq!(cpu.read_u64(BIG + keep - PAGE).unwrap(), pattern(BIG + keep - PAGE));
        mm.munmap(BIG, keep).unwrap();
        let base = mm.brk(0);
        let grown = mm.brk(base + (8 << 20));
        assert_eq!(grown, base + (8 << 20));
        for va in (base..grown).step_by(PAGE as usize) {
            cpu.write_u64(va, 1).unwrap();
        }
        assert_eq!(mm.brk(base + PAGE), base + PAGE);
        assert_eq!(phys.stats().frames_used, 1, "{unmap:?}");
        assert!(is_maperr(&cpu.read_u64(base + PAGE), base + PAGE));
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// A `MAP_FIXED` mapping over a populated range replaces it through the
/// unmap's steps (detach, zap with the bounded gather, flush, then free), in
/// one write section under every policy, as Linux's `mmap_region` does: the
/// old frames go, a CPU that had translations reads the new mapping's
/// zeros, and every gather was flushed before its frames were freed.
#[test]
fn a_map_fixed_replacement_of_a_big_range_frees_it_like_a_munmap() {
    for &unmap in UnmapPolicy::ALL {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, FaultPolicy::default());
        let mut cpu = Cpu::attached(&mm);
        map_big(&mm, &mut cpu);
        assert_eq!(phys.stats().frames_used, BIG_LEN / PAGE, "{unmap:?}");
        let flushes = mm.stats().tlb.flushes;
        let sections = mm.stats().mmap_lock_write;
        assert_eq!(mm.mmap(BIG, BIG_LEN, RW, ANON | MAP_FIXED, None, 0).unwrap(), BIG, "{unmap:?}");
        assert_eq!(mm.stats().mmap_lock_write - sections, 1, "{unmap:?}: one write section");
        assert!(mm.stats().tlb.flushes > flushes, "{unmap:?}: the old entries were shot down");
        assert_eq!(phys.stats().frames_used, 0, "{unmap:?}: the old frames are freed");
        for va in (BIG..BIG + BIG_LEN).step_by(97 * PAGE as usize) {
            assert_eq!(cpu.read_u64(va).unwrap(), 0, "{unmap:?}: {va:#x} is the new mapping's");
        }
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// What each policy holds, in `mmap_lock` write sections of one `munmap`
/// of a populated range crossing a 1 GiB boundary: `locked` and
/// `downgrade` one (the downgrade keeps it), `sectioned` one per section,
/// `lock-free` two (detach and reserve, then free the tables and release).
#[test]
fn each_policy_takes_its_write_sections() {
    for &unmap in UnmapPolicy::ALL {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, FaultPolicy::default());
        let mut cpu = Cpu::attached(&mm);
        map_big(&mm, &mut cpu);
        let before = mm.stats().mmap_lock_write;
        mm.munmap(BIG, BIG_LEN).unwrap();
        let sections = mm.stats().mmap_lock_write - before;
        let want = match unmap {
            UnmapPolicy::Sectioned | UnmapPolicy::LockFree => 2,
            _ => 1,
        };
        assert_eq!(sections, want, "{unmap:?}");
        assert_eq!(phys.stats().frames_used, 0, "{unmap:?}");
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// Every policy frees the page tables of the range on the unmapping thread
/// before `munmap` returns (after a grace period it waits for itself), not
/// in the epoch collector, which would run those frees on the next thread
/// to collect: another thread's `mmap` stalled 4 ms on an 8 GiB unmap's
/// tables that way. Other tests of this binary pin the epoch meanwhile,
/// and one holding its guard past the wait's limit sends the tables to the
/// collector as before: one of a few tries must free them here.
#[test]
fn each_policy_frees_its_page_tables_before_munmap_returns() {
    for &unmap in UnmapPolicy::ALL {
        let tries: Vec<(u64, u64, u64)> = (0..4)
            .map(|_| {
                let phys = phys(128);
                let mm = mm_for(&phys, unmap, FaultPolicy::default());
                let mut cpu = Cpu::attached(&mm);
                let base = phys.stats().page_tables;
                map_big(&mm, &mut cpu);
                let mapped = phys.stats().page_tables;
                let before = softmm::UnmapStats::this_thread();
                mm.munmap(BIG, BIG_LEN).unwrap();
                let u = softmm::UnmapStats::this_thread();
                let left = phys.stats().page_tables;
                assert!(mapped > base + 20, "{unmap:?}: {base} -> {mapped} tables");
                drop(cpu);
                drop(mm);
                assert_no_leaks(&phys);
                (
                    left - base,
                    u.tables_freed_here - before.tables_freed_here,
                    u.tables_deferred - before.tables_deferred,
                )
            })
            .collect();
        // (tables left when munmap returned, freed here, deferred) per try.
        assert!(
            tries.iter().any(|&(left, here, deferred)| left == 0 && here > 0 && deferred == 0),
            "{unmap:?}: {tries:?}"
        );
    }
}

/// A big range with few page tables (one page touched: a PTE table and
/// the tables above it) does not wait for a grace period to free them
/// itself: they go to the collector, which frees them in microseconds,
/// while the wait lasts as long as the longest guard pinned meanwhile
/// (seed 000's forker, which unmaps a 1 GiB hugetlb area per fork, spent
/// most of each munmap in it). Nothing is left once the collector ran.
#[test]
fn a_big_munmap_with_few_page_tables_leaves_them_to_the_collector() {
    for &unmap in UnmapPolicy::ALL {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, FaultPolicy::default());
        let mut cpu = Cpu::attached(&mm);
        let a = mm.mmap(0, BIG_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        cpu.write_u64(a + BIG_LEN / 2, 1).unwrap();
        let before = softmm::UnmapStats::this_thread();
        mm.munmap(a, BIG_LEN).unwrap();
        let u = softmm::UnmapStats::this_thread();
        let (here, deferred) =
            (u.tables_freed_here - before.tables_freed_here, u.tables_deferred - before.tables_deferred);
        assert_eq!((here, deferred > 0), (0, true), "{unmap:?}: tables freed here {here}, deferred {deferred}");
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// A munmap of a range in which nothing was ever mapped (no page table, so
/// no translation any CPU could hold) shoots nothing down, under every
/// policy: Linux's `tlb_flush_mmu_tlbonly` returns early when the gather
/// cleared no entry and freed no table. will-it-scale's `mmap1` is this
/// loop; with a shootdown per munmap its threads spent their time in
/// process-wide barriers. A range with one page touched is shot down.
#[test]
fn a_munmap_of_a_range_never_touched_shoots_nothing_down() {
    for &unmap in UnmapPolicy::ALL {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, FaultPolicy::default());
        let mut cpu = Cpu::attached(&mm);
        // Another thread's CPU, attached: a shootdown would have to ask it.
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let other = {
            let mm = mm.clone();
            thread::spawn(move || {
                let _cpu = Cpu::attached(&mm);
                ready_tx.send(()).unwrap();
                done.recv().unwrap();
            })
        };
        ready.recv().unwrap();
        let flushes = |mm: &AddressSpace| mm.stats().tlb.flushes;
        assert_eq!(mm.mmap(BIG, BIG_LEN, RW, ANON | MAP_FIXED, None, 0).unwrap(), BIG);
        let before = flushes(&mm);
        mm.munmap(BIG, BIG_LEN).unwrap();
        assert_eq!(flushes(&mm), before, "{unmap:?}: a shootdown for a range never touched");
        assert_eq!(mm.mmap(BIG, BIG_LEN, RW, ANON | MAP_FIXED, None, 0).unwrap(), BIG);
        cpu.write_u64(BIG + BIG_LEN / 2, 1).unwrap();
        let before = flushes(&mm);
        mm.munmap(BIG, BIG_LEN).unwrap();
        assert!(flushes(&mm) > before, "{unmap:?}: no shootdown for a range with a page");
        assert!(is_maperr(&cpu.read_u64(BIG + BIG_LEN / 2), BIG + BIG_LEN / 2));
        done_tx.send(()).unwrap();
        other.join().unwrap();
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// The tables are freed only after a grace period: a walker pinned in the
/// epoch before the unmap (here a bare guard on another thread, as a TLB
/// fill or lock-free fault holds while it walks) keeps them alive however
/// long it holds on, and the munmap returns anyway after its bounded wait,
/// leaving them to the collector. Freeing them at once would let the
/// walker read freed tables.
#[test]
fn a_guard_held_across_the_munmap_keeps_the_tables_and_does_not_block_it() {
    for &unmap in UnmapPolicy::ALL {
        let phys = phys(128);
        let mm = mm_for(&phys, unmap, FaultPolicy::default());
        let mut cpu = Cpu::attached(&mm);
        map_big(&mm, &mut cpu);
        let mapped = phys.stats().page_tables;
        let (pinned_tx, pinned) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let walker = thread::spawn(move || {
            let guard = crossbeam_epoch::pin();
            pinned_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(guard);
        });
        pinned.recv().unwrap();
        let before = mm.stats().unmap;
        watchdog_munmap(&mm);
        let u = mm.stats().unmap;
        assert_eq!(phys.stats().frames_used, 0, "{unmap:?}");
        // Still there while the walker is pinned, whatever collects.
        for _ in 0..8 {
            crossbeam_epoch::pin().flush();
        }
        assert_eq!(phys.stats().page_tables, mapped, "{unmap:?}: tables freed under a guard");
        assert!(u.tables_deferred > before.tables_deferred, "{unmap:?}: no table left to the collector");
        assert_eq!(u.tables_freed_here, before.tables_freed_here, "{unmap:?}: tables freed under a guard");
        release.send(()).unwrap();
        walker.join().unwrap();
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// `munmap` of the big range, under the watchdog: a wait for a grace
/// period that never ends would hang here.
fn watchdog_munmap(mm: &Arc<AddressSpace>) {
    let mm = mm.clone();
    watchdog("munmap under a guard", WATCHDOG_SECS, move || mm.munmap(BIG, BIG_LEN).unwrap());
}
