//! The munmap policies' unit tests: the races of seed 002's approach #2
//! that the reservation (`mm/unmap.rs`) closes, driven step by step through
//! the core's detach, zap, reserve and release, and each policy's unmap of
//! guard markers, write sections and grace periods.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;
use crate::policy::WriterPolicy;
use crate::uapi::*;
use crate::{Cpu, PhysConfig, PhysMem, PAGE_SIZE};

const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const LEN: u64 = 4 * PAGE_SIZE;

fn pattern(va: u64) -> u64 {
    va ^ 0x5eed
}

/// Four written pages, mapped at a fixed address.
fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>, Cpu, u64) {
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, crate::MmConfig::default()).unwrap();
    let a = 0x1000_0000;
    assert_eq!(mm.mmap(a, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(a));
    let mut cpu = Cpu::attached(&mm);
    for va in (a..a + LEN).step_by(PAGE_SIZE as usize) {
        cpu.write_u64(va, pattern(va)).unwrap();
    }
    (phys, mm, cpu, a)
}

/// Seed 002's approach #2, dropping `mmap_lock` inside the zap
/// (`zap_pmd_range` → `up_write`) with nothing to keep the range: CPU B
/// runs a whole `mmap(MAP_FIXED)` over the half-zapped range, whose new,
/// zero-filled mapping then shows A's old data where A has not zapped
/// yet (the stale entry), and A, taking the lock back to go on with what
/// it was walking, zaps B's page (B's write is lost). In Linux the
/// walked VMAs would be freed under A (the use-after-free of the cover
/// letter); softmm's VMAs are reference counted, but the page-table
/// entries A walks are what B now uses.
#[test]
fn dropping_the_lock_inside_the_zap_shows_stale_entries_to_a_new_mapping() {
    let (phys, mm, mut cpu, a) = setup();
    let mut tlb = MmuGather::default();
    let mut st = mm.write_lock();
    let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
    mm.zap_range(lo, lo + 2 * PAGE_SIZE, &mut tlb, |_| true);
    // Even with what it zapped so far flushed and freed:
    tlb.flush_and_free(&mm);
    drop(st); // up_write in the middle of the zap
              // CPU B.
    assert_eq!(mm.mmap(a, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(a));
    assert_eq!(cpu.read_u64(a), Ok(0), "the zapped half reads as new");
    let stale = a + 3 * PAGE_SIZE;
    assert_eq!(cpu.read_u64(stale), Ok(pattern(stale)), "B's new mapping shows A's old data");
    cpu.write_u64(stale, 7).unwrap();
    // A takes the lock back and goes on where it was.
    let st = mm.write_lock();
    mm.zap_range(lo + 2 * PAGE_SIZE, hi, &mut tlb, |_| true);
    tlb.finish(&mm);
    drop(st);
    assert_eq!(cpu.read_u64(stale), Ok(0), "A's zap took B's page, and B's write");
    drop(cpu);
    drop(mm);
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
}

/// The lock-free unmap drops `mmap_lock` for its zap too, but only after
/// reserving the range: B's `mmap(MAP_FIXED)` there waits until the
/// entries and tables are gone, then reads zeros and keeps its write.
/// The steps are the real ones of [`AddressSpace::vm_munmap`], with B
/// started halfway through the zap.
#[test]
#[cfg_attr(
    miri,
    ignore = "a thread parks on the contended mmap_lock, and Miri rejects parking_lot_core's futex syscall (a reference passed as a variadic pointer argument)"
)]
fn a_fixed_mapping_waits_for_a_reserved_range_and_sees_no_stale_entry() {
    let (phys, mm, mut cpu, a) = setup();
    cpu.park();
    let mut tlb = MmuGather::default();
    let mut st = mm.write_lock();
    let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
    let done = Arc::new(Mutex::new(()));
    let held = done.lock();
    mm.reserve(st, lo, hi, &done);
    mm.zap_range(lo, lo + 2 * PAGE_SIZE, &mut tlb, |_| true);
    let stale = a + 3 * PAGE_SIZE;
    let b = {
        let mm = mm.clone();
        std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            assert_eq!(mm.mmap(a, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(a));
            assert_eq!(cpu.read_u64(stale), Ok(0), "B's new mapping shows old data");
            cpu.write_u64(stale, 7).unwrap();
        })
    };
    // A hint into the range is placed elsewhere meanwhile.
    let elsewhere = mm.mmap(a, PAGE_SIZE, RW, ANON, None, 0).unwrap();
    assert!(elsewhere + PAGE_SIZE <= lo || elsewhere >= hi, "{elsewhere:#x} inside the reserved range");
    mm.munmap(elsewhere, PAGE_SIZE).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(!b.is_finished(), "MAP_FIXED over a reserved range did not wait");
    mm.zap_range(lo + 2 * PAGE_SIZE, hi, &mut tlb, |_| true);
    mm.release(lo, hi, &done, &mut tlb, &mut UnmapTimes::new(true));
    tlb.finish(&mm);
    drop(held);
    b.join().unwrap();
    cpu.resume();
    assert_eq!(cpu.read_u64(stale), Ok(7), "B's page survived the unmap");
    drop(cpu);
    drop(mm);
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
}

/// A second `munmap` of a range a lock-free unmap is still zapping
/// waits for it: it must not return while an entry of the range still
/// translates (here, the half not zapped yet).
#[test]
#[cfg_attr(
    miri,
    ignore = "a thread parks on the contended mmap_lock, and Miri rejects parking_lot_core's futex syscall (a reference passed as a variadic pointer argument)"
)]
fn a_munmap_of_a_reserved_range_returns_only_once_it_is_empty() {
    let (phys, mm, mut cpu, a) = setup();
    cpu.park();
    let mut tlb = MmuGather::default();
    let mut st = mm.write_lock();
    let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
    let done = Arc::new(Mutex::new(()));
    let held = done.lock();
    mm.reserve(st, lo, hi, &done);
    mm.zap_range(lo, lo + 2 * PAGE_SIZE, &mut tlb, |_| true);
    let b = {
        let mm = mm.clone();
        std::thread::spawn(move || {
            mm.munmap(a, LEN).unwrap();
            (a..a + LEN).step_by(PAGE_SIZE as usize).all(|va| mm.pte_at(va).is_none())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(!b.is_finished(), "munmap over a reserved range returned before it was empty");
    mm.zap_range(lo + 2 * PAGE_SIZE, hi, &mut tlb, |_| true);
    mm.release(lo, hi, &done, &mut tlb, &mut UnmapTimes::new(true));
    tlb.finish(&mm);
    drop(held);
    assert!(b.join().unwrap(), "an entry was left when the second munmap returned");
    drop(cpu);
    drop(mm);
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
}

/// A lock-free unmap shoots its range down once, before the zap, and
/// frees the gathers after it without another shootdown. That is sound
/// only because no CPU can make a translation into the range after the
/// shootdown: a CPU reading the range then (here one of this thread's,
/// which the shootdown made drop its TLB) must fault, not walk the
/// entry the zap has not cleared yet; otherwise its TLB entry outlives
/// the frame's free and reads the frame's next user's data.
#[test]
fn no_translation_into_a_range_after_its_one_shootdown() {
    const REUSED: u8 = 0xee;
    let (phys, mm, mut cpu, a) = setup();
    let last = a + 3 * PAGE_SIZE;
    let old = mm.pte_at(last).pfn();
    let mut tlb = MmuGather::default();
    let mut st = mm.write_lock();
    let (lo, hi) = mm.detach_vmas(&mut st, a, a + LEN).unwrap().unwrap();
    let done = Arc::new(Mutex::new(()));
    let held = done.lock();
    mm.reserve(st, lo, hi, &done);
    tlb.shoot_down_unreachable(&mm);
    let segv = |r: &std::result::Result<u64, crate::Fault>| {
        matches!(r, Err(crate::Fault::Segv { code: crate::SegvCode::MapErr, .. }))
    };
    let during = cpu.read_u64(last);
    assert!(segv(&during), "a CPU filled a translation after the shootdown: {during:?}");
    mm.unmap_range(lo, hi, &mut tlb);
    tlb.flush_and_free(&mm);
    assert_eq!(tlb.times.flushes, 1, "the gather was freed after a shootdown of its own");
    assert_eq!(phys.stats().frames_used, 0);
    // The frame's next user writes it.
    phys.fill(old, 0, REUSED, PAGE_SIZE as usize);
    let after = cpu.read_u64(last);
    assert!(segv(&after), "a stale TLB entry read a freed, reused frame: {after:x?}");
    mm.release(lo, hi, &done, &mut tlb, &mut UnmapTimes::new(true));
    tlb.finish(&mm);
    drop(held);
    drop(cpu);
    drop(mm);
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
}

/// An unmap drops guard markers in its zap walk, under every policy and
/// on the lock-free path too (a span above one PTE table): here in a
/// page table that a neighbouring VMA keeps, so freeing the tables does
/// not drop them. A new mapping there then reads zeros, not `SIGSEGV`.
#[test]
#[cfg_attr(
    miri,
    ignore = "safe zap logic over thousands of entries; the page-table walks and frees it uses run under Miri in the pgtable and gather tests"
)]
fn an_unmap_drops_guard_markers_in_a_table_a_neighbour_keeps() {
    for &policy in UnmapPolicy::ALL {
        let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, crate::MmConfig::default().unmap_policy(policy)).unwrap();
        let a = 0x4000_0000;
        let gone = 2 * PMD_SIZE + 4 * PAGE_SIZE;
        let len = gone + 4 * PAGE_SIZE;
        assert_eq!(mm.mmap(a, len, RW, ANON | MAP_FIXED, None, 0), Ok(a));
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 1).unwrap();
        let marked = [a + PAGE_SIZE, a + 2 * PMD_SIZE + PAGE_SIZE, a + gone - PAGE_SIZE];
        for &va in &marked {
            mm.madvise(va, PAGE_SIZE, MADV_GUARD_INSTALL).unwrap();
            assert!(mm.pte_at(va).is_guard());
        }
        cpu.write_u64(a + len - PAGE_SIZE, 2).unwrap(); // the neighbour
        mm.munmap(a, gone).unwrap();
        for &va in &marked {
            assert!(mm.pte_at(va).is_none(), "{policy:?}: a marker at {va:#x} outlived the munmap");
        }
        assert_eq!(mm.mmap(a, gone, RW, ANON | MAP_FIXED, None, 0), Ok(a));
        for &va in &marked {
            assert_eq!(cpu.read_u64(va), Ok(0), "{policy:?}");
        }
        assert_eq!(cpu.read_u64(a + len - PAGE_SIZE), Ok(2), "{policy:?}");
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?} {s:?}");
    }
}

/// `mmap_lock` write sections of one `mmap` and one `munmap` of
/// `len` bytes (`touch`: its first and last pages written in between).
fn write_sections_of_map_and_unmap(policy: WriterPolicy, len: u64, touch: bool) -> u64 {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, crate::MmConfig::default().writer_policy(policy)).unwrap();
    let mut cpu = Cpu::attached(&mm);
    let before = mm.stats().mmap_lock_write;
    // Not charged: more than the arena's RAM.
    let a = mm.mmap(0, len, RW, ANON | MAP_NORESERVE, None, 0).unwrap();
    if touch {
        cpu.write_u64(a, 1).unwrap();
        cpu.write_u64(a + len - PAGE_SIZE, 1).unwrap();
    }
    mm.munmap(a, len).unwrap();
    let sections = mm.stats().mmap_lock_write - before;
    assert_eq!(mm.stats().map_count, 0);
    for va in (a..a + len).step_by(PMD_SIZE as usize) {
        assert!(mm.pte_at(va).is_none(), "{policy:?}: an entry outlived the munmap at {va:#x}");
    }
    drop(cpu);
    drop(mm);
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?} {s:?}");
    sections
}

/// will-it-scale's mmap1 op, a map and an unmap of 128 MiB never
/// touched: the short writer policies find nothing to zap under the
/// first write section of the unmap and end there (2 sections in all,
/// as Linux's 2 `mmap_write_lock`s); `reserve` takes the lock-free
/// path and its third section. A touched range takes the lock-free
/// path under every policy but `range`, whose unmap inside one window is a
/// range write, touched or not: its two sections are the mmap's and the
/// one the statistics' reader takes to take the unmap's window in.
#[test]
#[cfg_attr(
    miri,
    ignore = "maps and unmaps 128 MiB twice under each writer policy: a minute under Miri; its unsafe paths run in the other unmap tests"
)]
fn an_untouched_range_unmaps_in_one_write_section() {
    let len = 128 << 20;
    for &policy in WriterPolicy::ALL {
        let untouched = write_sections_of_map_and_unmap(policy, len, false);
        let (want, touched) = match policy {
            WriterPolicy::Range => (2, 2),
            p if p.short_unmap() => (2, 3),
            _ => (3, 3),
        };
        assert_eq!(untouched, want, "{policy:?}: write sections of an untouched map and unmap");
        assert_eq!(write_sections_of_map_and_unmap(policy, len, true), touched, "{policy:?}: a touched range");
    }
}

/// A long zap lets grace periods end while it runs: it drops its epoch
/// guard at each full gather's flush and walks on under a new one. A
/// running CPU of another thread (which every flush waits for, under
/// `ShootdownPolicy::NextAccess`) defers a
/// closure once the first flush has begun, and keeps collecting; the
/// closure must run before the zap's last gather is flushed. With one
/// guard held across the whole zap, it could run only after the zap.
#[test]
#[cfg_attr(miri, ignore = "maps and faults ~48,000 pages")]
fn a_long_zap_lets_grace_periods_end() {
    // Other tests of this binary pin the same global epoch collector
    // meanwhile, and one of them holding a guard can hold up the grace
    // period past the zap's end (seen once in a full run under load):
    // the zap must let one end in at least one of a few tries. With one
    // guard held across the zap, none ever would.
    let tries: Vec<(u64, u64)> = (0..4).map(|_| long_zap_once()).collect();
    let gathers = 5;
    assert!(
        tries.iter().any(|&(g0, ran)| ran > g0 && ran < g0 + gathers),
        "(generation before the zap, generation the deferred closure ran at) per try: {tries:?}"
    );
}

/// One try of [`a_long_zap_lets_grace_periods_end`]: the generation
/// before the zap, and the one the deferred closure ran at.
fn long_zap_once() -> (u64, u64) {
    use crate::sync::AtomicBool;
    let gathers = 5;
    let pages = (gathers * crate::mm::MAX_GATHER_FRAMES) as u64;
    let phys = PhysMem::new(PhysConfig::new((pages + 256) * PAGE_SIZE)).unwrap();
    // Under `NextAccess` every flush waits for the remote CPU's next
    // access, which paces the zap against the remote thread; with access
    // sections the zap may finish before the remote thread defers.
    // `downgrade`: a shootdown per gather (a lock-free unmap has one
    // only, before its zap), each marking a gather's end. `Broadcast`:
    // the remote CPU never filled from the zapped pages, so it is asked
    // only when every CPU is.
    let config = crate::MmConfig::default()
        .unmap_policy(UnmapPolicy::Downgrade)
        .shootdown_policy(crate::ShootdownPolicy::NextAccess)
        .shootdown_targets(crate::ShootdownTargets::Broadcast);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let a = mm.mmap(0, pages * PAGE_SIZE, RW, ANON | MAP_POPULATE, None, 0).unwrap();
    let probe = mm.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
    let g0 = mm.tlb.stats().flushes;
    let ran_at = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let remote = {
        let (mm, ran_at, stop) = (mm.clone(), ran_at.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(probe, 1).unwrap();
            ready_tx.send(()).unwrap();
            let mut deferred = false;
            while !stop.load(Ordering::Acquire) {
                // Acknowledges the flush under way, if any.
                assert_eq!(cpu.read_u64(probe), Ok(1));
                if !deferred && mm.tlb.stats().flushes > g0 {
                    let (mm, ran_at) = (mm.clone(), ran_at.clone());
                    crossbeam_epoch::pin().defer(move || ran_at.store(mm.tlb.stats().flushes, Ordering::Release));
                    deferred = true;
                }
                crossbeam_epoch::pin().flush();
            }
        })
    };
    ready.recv().unwrap();
    mm.munmap(a, pages * PAGE_SIZE).unwrap();
    stop.store(true, Ordering::Release);
    remote.join().unwrap();
    // Flush k of the zap made the flush count g0 + k.
    let ran = ran_at.load(Ordering::Acquire);
    drop(mm);
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{s:?}");
    (g0, ran)
}

/// An address space that maps and unmaps shared anonymous memory in a
/// loop (each `mmap` makes an object, linked to the address space) keeps
/// no link to the objects that died, under every writer policy: each
/// object's drop makes the address space forget it, as Linux frees the
/// shmem inode at its last `munmap`. Before, every call left a weak
/// reference to its dead object in the address space's list until exit
/// (65 links after 64 calls). A file that stays alive keeps its one link.
#[test]
#[cfg_attr(miri, ignore = "hundreds of system calls under every writer policy; no unsafe code of its own")]
fn dead_files_leave_no_link_behind() {
    for &policy in WriterPolicy::ALL {
        let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
        let mm = AddressSpace::new(&phys, crate::MmConfig::default().writer_policy(policy)).unwrap();
        let file = crate::File::create(&phys, "kept", PAGE_SIZE).unwrap();
        let open = crate::OpenFile::new(&file, true, true);
        let rw = PROT_READ | PROT_WRITE;
        let mut cpu = Cpu::attached(&mm);
        let mut objects: Vec<std::sync::Weak<crate::file::Inode>> = Vec::new();
        for _ in 0..64 {
            let a = mm.mmap(0, 4 * PAGE_SIZE, rw, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
            let object = mm.read_lock().vmas.overlapping(a, a + 1).next().and_then(|v| v.file.clone());
            objects.push(Arc::downgrade(&object.expect("a shared anonymous mapping has its object")));
            cpu.write_u32(a, 1).unwrap();
            mm.munmap(a, 4 * PAGE_SIZE).unwrap();
            let b = mm.mmap(0, PAGE_SIZE, rw, MAP_SHARED, Some(&open), 0).unwrap();
            mm.munmap(b, PAGE_SIZE).unwrap();
        }
        drop(cpu);
        // The objects die with the last VMA versions that hold them, after
        // a grace period, maybe on another thread: wait for the links to go.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let links = || mm.linked_files.len();
        while (objects.iter().any(|o| o.strong_count() != 0) || links() != 1) && std::time::Instant::now() < deadline {
            crate::sync::rcu::reclaim_now();
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(objects.iter().all(|o| o.strong_count() == 0), "{}: an object outlived its mapping", policy.name());
        assert_eq!(links(), 1, "{}: the kept file's link alone", policy.name());
        drop((mm, open, file));
        let left = phys.quiesce();
        assert_eq!((left.vmas, left.frames_used), (0, 0), "{}", policy.name());
    }
}
