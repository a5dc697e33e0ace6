use std::sync::Arc;

use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::{AddressSpace, MmConfig, PlacementPolicy, WriterPolicy, PAGE_SIZE};

const GIB: u64 = 1 << 30;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

fn mm(phys: &Arc<PhysMem>, writer: WriterPolicy, placement: PlacementPolicy) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().writer_policy(writer).placement(placement)).unwrap()
}

/// The VMAs as (start, end, flags), from the `mmap_lock` holder's view.
fn spans(mm: &AddressSpace) -> Vec<(u64, u64, String)> {
    mm.maps().into_iter().map(|e| (e.start, e.end, e.perms.clone())).collect()
}

/// The VMAs with all their flags (`madvise`'s are not in the maps'
/// permissions), from the `mmap_lock` holder's view.
fn vma_flags(mm: &AddressSpace) -> Vec<(u64, u64, crate::vma::VmFlags)> {
    mm.read_lock().vmas.iter().map(|v| (v.start, v.end, v.flags)).collect()
}

/// The advice the random calls give: the VMA-flag ones (range writes) and
/// two that change no VMA.
const ADVICE: [i32; 11] = [
    MADV_DONTFORK,
    MADV_DOFORK,
    MADV_WIPEONFORK,
    MADV_KEEPONFORK,
    MADV_HUGEPAGE,
    MADV_NOHUGEPAGE,
    MADV_NORMAL,
    MADV_RANDOM,
    MADV_SEQUENTIAL,
    MADV_DONTNEED,
    MADV_FREE,
];

/// A `munmap` inside one window runs without `mmap_lock`; the next
/// `mmap_lock` holder sees its result.
#[test]
fn a_munmap_inside_a_window_takes_no_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 8 * PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
    let writes = mm.counters.lock_counts().0;
    mm.munmap(a + 2 * PAGE_SIZE, PAGE_SIZE).unwrap();
    mm.munmap(a + 6 * PAGE_SIZE, 2 * PAGE_SIZE).unwrap();
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, 3, "the mmap and both unmaps");
    // Published, and taken in by the next mmap_lock holder.
    let guard = crossbeam_epoch::pin();
    assert!(mm.vmas_rcu(&guard).find(a + 2 * PAGE_SIZE).is_none());
    assert!(mm.vmas_rcu(&guard).find(a + 3 * PAGE_SIZE).is_some());
    let want = vec![(a, a + 2 * PAGE_SIZE), (a + 3 * PAGE_SIZE, a + 6 * PAGE_SIZE)];
    assert_eq!(mm.maps().iter().map(|e| (e.start, e.end)).collect::<Vec<_>>(), want);
    assert_eq!(mm.stats().map_count, 2);
    // A munmap across two windows falls back.
    let b = 0x102 * GIB - 2 * PAGE_SIZE;
    mm.mmap(b, 4 * PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    let fallbacks = mm.range.stats().fallbacks;
    mm.munmap(b, 4 * PAGE_SIZE).unwrap();
    assert_eq!(mm.range.stats().fallbacks, fallbacks + 1);
}

/// A `munmap` of file mappings inside a window (shared and private
/// mappings of a file, a shared anonymous mapping) runs without
/// `mmap_lock`: the file keeps the pages written through the shared
/// mapping, the private copies go, a truncate afterwards finds the rest
/// of the shared mapping (SIGBUS past the new end) and nothing leaks.
#[test]
fn a_munmap_of_file_mappings_takes_no_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let file = crate::File::create(&phys, "f", 8 * PAGE_SIZE).unwrap();
    let open = crate::OpenFile::new(&file, true, true);
    let rw = PROT_READ | PROT_WRITE;
    let (a, b, c) = (0x100 * GIB + 16 * PAGE_SIZE, 0x100 * GIB + 32 * PAGE_SIZE, 0x100 * GIB + 48 * PAGE_SIZE);
    mm.mmap(a, 8 * PAGE_SIZE, rw, MAP_SHARED | MAP_FIXED, Some(&open), 0).unwrap();
    mm.mmap(b, 8 * PAGE_SIZE, rw, MAP_PRIVATE | MAP_FIXED, Some(&open), 0).unwrap();
    mm.mmap(c, 4 * PAGE_SIZE, rw, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    let mut cpu = crate::Cpu::attached(&mm);
    cpu.write_u32(a, 1).unwrap();
    cpu.write_u32(a + 5 * PAGE_SIZE, 5).unwrap();
    cpu.write_u32(b + PAGE_SIZE, 2).unwrap();
    cpu.write_u32(c, 3).unwrap();
    let (writes, ranged) = (mm.counters.lock_counts().0, mm.range.stats().writes);
    mm.munmap(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE).unwrap();
    mm.munmap(b, 8 * PAGE_SIZE).unwrap();
    mm.munmap(c, 4 * PAGE_SIZE).unwrap();
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, ranged + 3, "the three unmaps");
    assert!(
        cpu.read_u32(b + PAGE_SIZE).is_err() && cpu.read_u32(c).is_err() && cpu.read_u32(a + 2 * PAGE_SIZE).is_err()
    );
    assert_eq!(cpu.read_u32(a), Ok(1));
    let mut page = [0u8; 4];
    file.read_at(PAGE_SIZE, &mut page).unwrap();
    assert_eq!(page, [0; 4], "the private copy never reached the file");
    let want = vec![(a, a + 2 * PAGE_SIZE), (a + 4 * PAGE_SIZE, a + 8 * PAGE_SIZE)];
    assert_eq!(mm.maps().iter().map(|e| (e.start, e.end)).collect::<Vec<_>>(), want);
    assert_eq!(mm.stats().map_count, 2);
    // The truncate's walk finds what is left of the shared mapping.
    file.set_len(4 * PAGE_SIZE).unwrap();
    assert!(matches!(cpu.read_u32(a + 5 * PAGE_SIZE), Err(crate::Fault::Bus { .. })));
    assert_eq!(cpu.read_u32(a), Ok(1));
    mm.munmap(a, 8 * PAGE_SIZE).unwrap();
    assert_eq!(mm.stats().map_count, 0);
    drop(cpu);
    drop(mm);
    drop(open);
    drop(file);
    assert_eq!(phys.stats().frames_used, 0);
}

/// An `mmap` of a file inside a window, shared or private, fixed or
/// placed in the calling thread's arena, runs without `mmap_lock`: the
/// address space is linked to the file (a truncate afterwards finds the
/// shared mapping: SIGBUS past the new end), writes through the shared
/// mapping reach the file and the private copy's do not, a mapping
/// right after one of the same open merges with it, a mode the open
/// forbids gets `mmap_lock`'s errno, and nothing leaks.
#[test]
fn a_file_mmap_inside_a_window_takes_no_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Arenas);
    let file = crate::File::create(&phys, "f", 8 * PAGE_SIZE).unwrap();
    let (open, read_only) = (crate::OpenFile::new(&file, true, true), crate::OpenFile::new(&file, true, false));
    let rw = PROT_READ | PROT_WRITE;
    let writes = mm.counters.lock_counts().0;
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 4 * PAGE_SIZE, rw, MAP_SHARED | MAP_FIXED, Some(&open), 0).unwrap();
    mm.mmap(a + 4 * PAGE_SIZE, 4 * PAGE_SIZE, rw, MAP_SHARED | MAP_FIXED, Some(&open), 4 * PAGE_SIZE).unwrap();
    let b = mm.mmap(0, 8 * PAGE_SIZE, rw, MAP_PRIVATE, Some(&open), 0).unwrap();
    let refused = mm.mmap(a + 64 * PAGE_SIZE, PAGE_SIZE, rw, MAP_SHARED | MAP_FIXED, Some(&read_only), 0);
    assert_eq!(refused, Err(crate::Errno::Acces));
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, 4, "the three maps and the refused one");
    let mut cpu = crate::Cpu::attached(&mm);
    cpu.write_u32(a + 5 * PAGE_SIZE, 5).unwrap();
    cpu.write_u32(b + PAGE_SIZE, 2).unwrap();
    let maps: Vec<(u64, u64)> = mm.maps().iter().map(|e| (e.start, e.end)).collect();
    assert!(maps.contains(&(a, a + 8 * PAGE_SIZE)) && maps.len() == 2, "merged: {maps:x?}");
    let mut page = [0u8; 4];
    file.read_at(5 * PAGE_SIZE, &mut page).unwrap();
    assert_eq!(u32::from_le_bytes(page), 5, "the shared mapping's write reached the file");
    file.read_at(PAGE_SIZE, &mut page).unwrap();
    assert_eq!(page, [0; 4], "the private copy never reached the file");
    // The truncate's walk finds the mapping a range writer made.
    file.set_len(4 * PAGE_SIZE).unwrap();
    assert!(matches!(cpu.read_u32(a + 5 * PAGE_SIZE), Err(crate::Fault::Bus { .. })));
    assert_eq!(cpu.read_u32(a), Ok(0));
    // (The maps dump above took the range writers' windows in under
    // `mmap_lock`.)
    let writes = mm.counters.lock_counts().0;
    mm.munmap(a, 8 * PAGE_SIZE).unwrap();
    mm.munmap(b, 8 * PAGE_SIZE).unwrap();
    // Each leaves its 512 GiB region (the fixed address's, the arena's)
    // without a VMA: its PUD table is freed under `mmap_lock`.
    assert_eq!(mm.counters.lock_counts().0, writes + 2, "no mmap_lock write section but the PUD tables'");
    assert_eq!(mm.stats().map_count, 0);
    drop((cpu, mm, open, read_only, file));
    assert_eq!(phys.quiesce().frames_used, 0);
}

/// A shared anonymous `mmap` inside a window, fixed or placed in the
/// calling thread's arena, runs without `mmap_lock`: its object is made
/// and linked on the window's view, its pages are shared with a child, a
/// `MADV_REMOVE` (the object's hole punch, whose reverse-map walk must
/// find the mapping) drops them, and once unmapped the object and its
/// link are gone and its charge returned.
#[test]
fn a_shared_anonymous_mmap_inside_a_window_takes_no_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Arenas);
    let (rw, shared) = (PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS);
    let committed = phys.committed_pages();
    let writes = mm.counters.lock_counts().0;
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 4 * PAGE_SIZE, rw, shared | MAP_FIXED, None, 0).unwrap();
    let b = mm.mmap(0, 4 * PAGE_SIZE, rw, shared, None, 0).unwrap();
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, 2);
    assert_eq!(phys.committed_pages(), committed + 8, "each object charged whole");
    assert_eq!(mm.linked_files.len(), 2);
    let mut cpu = crate::Cpu::attached(&mm);
    cpu.write_u32(a + PAGE_SIZE, 1).unwrap();
    cpu.write_u32(b + 2 * PAGE_SIZE, 2).unwrap();
    // A child shares the pages: its write is the parent's.
    let child = mm.fork().unwrap();
    let mut ccpu = crate::Cpu::attached(&child);
    ccpu.write_u32(a + PAGE_SIZE, 3).unwrap();
    assert_eq!(cpu.read_u32(a + PAGE_SIZE), Ok(3));
    drop((ccpu, child));
    // The hole punch finds the range writer's mapping.
    mm.madvise(b, 4 * PAGE_SIZE, MADV_REMOVE).unwrap();
    assert_eq!(cpu.read_u32(b + 2 * PAGE_SIZE), Ok(0));
    drop(cpu);
    let writes = mm.counters.lock_counts().0;
    mm.munmap(a, 4 * PAGE_SIZE).unwrap();
    mm.munmap(b, 4 * PAGE_SIZE).unwrap();
    // Each leaves its 512 GiB region (the fixed address's, the arena's)
    // without a VMA: its PUD table is freed under `mmap_lock`.
    assert_eq!(mm.counters.lock_counts().0, writes + 2, "no mmap_lock write section but the PUD tables'");
    // The objects' pages and charge went with the last unmap.
    assert_eq!(phys.committed_pages(), committed);
    assert_eq!(phys.stats().frames_used, 0);
    // Their memory goes with the last VMA that holds them: the `mmap_lock`
    // holder's copy of the window (from the fork's section) until the next
    // section takes the window in, as Linux frees VMAs and inodes after a
    // grace period. Each object then takes itself out of the list. (A
    // pass of reclamation may leave them to a later one while other
    // tests' threads hold the epoch back: passes until they are gone, or
    // 10 s, as `PhysMem::quiesce` waits.)
    assert_eq!(mm.stats().map_count, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while mm.linked_files.len() != 0 && std::time::Instant::now() < deadline {
        crate::sync::rcu::reclaim_now();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert_eq!(mm.linked_files.len(), 0, "the dead objects took themselves out");
}

/// A shared file mapping inside a window is split by `mprotect` and
/// `madvise`, merged back and moved by `mremap` without `mmap_lock`, as a
/// private anonymous one is: each call gives what the `mmap_lock` path
/// gives (the protection refused, the write through the shared mapping in
/// the file, the moved page at its new place), a truncate afterwards finds
/// the moved mapping (SIGBUS past the new end), and nothing leaks.
#[test]
fn a_file_mapping_is_changed_and_moved_without_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let file = crate::File::create(&phys, "f", 8 * PAGE_SIZE).unwrap();
    let open = crate::OpenFile::new(&file, true, true);
    let rw = PROT_READ | PROT_WRITE;
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 8 * PAGE_SIZE, rw, MAP_SHARED | MAP_FIXED, Some(&open), 0).unwrap();
    let mut cpu = crate::Cpu::attached(&mm);
    cpu.write_u32(a + 5 * PAGE_SIZE, 5).unwrap();
    let writes = mm.counters.lock_counts().0;
    mm.mprotect(a, 2 * PAGE_SIZE, PROT_READ).unwrap();
    mm.madvise(a + 4 * PAGE_SIZE, 2 * PAGE_SIZE, MADV_DONTFORK).unwrap();
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert!(matches!(cpu.write_u32(a, 1), Err(crate::Fault::Segv { .. })));
    cpu.write_u32(a + 3 * PAGE_SIZE, 3).unwrap();
    assert_eq!(mm.stats().map_count, 4, "split by both calls");
    // Back as they were: one VMA again, and the move takes it whole.
    mm.mprotect(a, 2 * PAGE_SIZE, rw).unwrap();
    mm.madvise(a + 4 * PAGE_SIZE, 2 * PAGE_SIZE, MADV_DOFORK).unwrap();
    assert_eq!(mm.stats().map_count, 1, "merged again");
    let writes = mm.counters.lock_counts().0;
    let c = a + 64 * PAGE_SIZE;
    assert_eq!(mm.mremap(a, 8 * PAGE_SIZE, 8 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, c), Ok(c));
    cpu.write_u32(c, 7).unwrap();
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, 6, "the mmap, two mprotects, two madvises and the mremap");
    assert_eq!(cpu.read_u32(c + 5 * PAGE_SIZE), Ok(5), "the page moved with its entry");
    let mut page = [0u8; 4];
    file.read_at(0, &mut page).unwrap();
    assert_eq!(u32::from_le_bytes(page), 7, "a write after the calls reached the file");
    file.read_at(3 * PAGE_SIZE, &mut page).unwrap();
    assert_eq!(u32::from_le_bytes(page), 3);
    // The truncate's walk finds the moved mapping.
    file.set_len(4 * PAGE_SIZE).unwrap();
    assert!(matches!(cpu.read_u32(c + 5 * PAGE_SIZE), Err(crate::Fault::Bus { .. })));
    assert!(matches!(cpu.read_u32(a), Err(crate::Fault::Segv { .. })), "nothing left at the old place");
    mm.munmap(c, 8 * PAGE_SIZE).unwrap();
    assert_eq!(mm.stats().map_count, 0);
    drop((cpu, mm, open, file));
    assert_eq!(phys.quiesce().frames_used, 0);
}

/// A VMA-flag `madvise` inside a window splits and merges VMAs without
/// `mmap_lock`, as `mprotect` does; one reaching a VMA at the window's
/// bounds falls back.
#[test]
fn a_madvise_inside_a_window_takes_no_mmap_lock() {
    use crate::vma::VmFlags;
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 8 * PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
    let writes = mm.counters.lock_counts().0;
    mm.madvise(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, MADV_DONTFORK).unwrap();
    mm.madvise(a + 4 * PAGE_SIZE, 2 * PAGE_SIZE, MADV_WIPEONFORK).unwrap();
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, 3, "the mmap and both madvises");
    let want = [
        (a, a + 2 * PAGE_SIZE, VmFlags::empty()),
        (a + 2 * PAGE_SIZE, a + 4 * PAGE_SIZE, VmFlags::DONTCOPY),
        (a + 4 * PAGE_SIZE, a + 6 * PAGE_SIZE, VmFlags::WIPEONFORK),
        (a + 6 * PAGE_SIZE, a + 8 * PAGE_SIZE, VmFlags::empty()),
    ];
    let advised = VmFlags::DONTCOPY | VmFlags::WIPEONFORK;
    let got: Vec<_> = vma_flags(&mm).into_iter().map(|(s, e, f)| (s, e, f & advised)).collect();
    assert_eq!(got, want);
    // Back as they were: the four merge into one again.
    mm.madvise(a, 8 * PAGE_SIZE, MADV_DOFORK).unwrap();
    mm.madvise(a, 8 * PAGE_SIZE, MADV_KEEPONFORK).unwrap();
    assert_eq!(mm.stats().map_count, 1);
    assert_eq!(mm.range.stats().writes, 5);
    // A hole: ENOMEM after advising the mapped part, as under mmap_lock.
    assert_eq!(mm.madvise(a, 9 * PAGE_SIZE, MADV_HUGEPAGE), Err(crate::Errno::NoMem));
    assert!(vma_flags(&mm)[0].2.contains(VmFlags::HUGEPAGE));
    // A VMA at the window's first address falls back.
    let b = 0x101 * GIB;
    mm.mmap(b, 4 * PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    let fallbacks = mm.range.stats().fallbacks;
    mm.madvise(b + PAGE_SIZE, PAGE_SIZE, MADV_DONTFORK).unwrap();
    assert_eq!(mm.range.stats().fallbacks, fallbacks + 1);
    assert_eq!(mm.stats().map_count, 4);
}

/// `mremap` inside a window shrinks, grows in place and moves
/// (`MREMAP_FIXED`) without `mmap_lock`, the pages going with the move; a
/// growth that would have to move without a fixed target falls back.
#[test]
fn a_mremap_inside_a_window_takes_no_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 8 * PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
    let mut cpu = crate::Cpu::attached(&mm);
    for i in 0..8 {
        cpu.write_u32(a + i * PAGE_SIZE, 100 + i as u32).unwrap();
    }
    let writes = mm.counters.lock_counts().0;
    assert_eq!(mm.mremap(a, 8 * PAGE_SIZE, 6 * PAGE_SIZE, 0, 0), Ok(a));
    // (A reader such as `stats` takes range writers' windows in under the
    // write lock: none before the count below.)
    assert_eq!(phys.stats().frames_used, 6, "the tail's pages went");
    assert_eq!(mm.mremap(a, 6 * PAGE_SIZE, 7 * PAGE_SIZE, 0, 0), Ok(a));
    let b = a + 64 * PAGE_SIZE;
    assert_eq!(mm.mremap(a, 7 * PAGE_SIZE, 7 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, b), Ok(b));
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    assert_eq!(mm.range.stats().writes, 4, "the mmap and the three mremaps");
    assert_eq!(spans(&mm), vec![(b, b + 7 * PAGE_SIZE, "rw-p".to_string())]);
    for i in 0..6 {
        assert_eq!(cpu.read_u32(b + i * PAGE_SIZE), Ok(100 + i as u32));
    }
    assert_eq!(cpu.read_u32(b + 6 * PAGE_SIZE), Ok(0), "the grown page is new");
    assert!(cpu.read_u32(a).is_err(), "the old range is unmapped");
    // Something in the way of a growth: MAYMOVE without a target falls back.
    mm.mmap(b + 7 * PAGE_SIZE, PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    let fallbacks = mm.range.stats().fallbacks;
    let moved = mm.mremap(b, 7 * PAGE_SIZE, 9 * PAGE_SIZE, MREMAP_MAYMOVE, 0).unwrap();
    assert_ne!(moved, b);
    assert_eq!(mm.range.stats().fallbacks, fallbacks + 1);
    assert_eq!(cpu.read_u32(moved + 5 * PAGE_SIZE), Ok(105));
    drop(cpu);
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
}

/// Under `PlacementPolicy::Arenas`, a growth that cannot stay in place
/// moves inside the calling thread's arena, and `MREMAP_DONTUNMAP` to a
/// hint moves the pages and leaves the source mapped and empty: both as
/// range writes, with the mappings, pages and map count of `short`.
#[test]
#[cfg_attr(
    miri,
    ignore = "safe placement and VMA-set logic; the range writers' table and window operations run under Miri in the other range tests"
)]
fn a_searched_mremap_move_inside_the_arena_is_a_range_write() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let run = |mm: &Arc<AddressSpace>| {
        let rw = PROT_READ | PROT_WRITE;
        // Placed at the arena's top: four pages off each end, and the
        // upper half read-only, in the way of the lower half's growth.
        let base = mm.mmap(0, 16 * PAGE_SIZE, rw, ANON, None, 0).unwrap();
        mm.munmap(base, 4 * PAGE_SIZE).unwrap();
        mm.munmap(base + 12 * PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
        mm.mprotect(base + 8 * PAGE_SIZE, 4 * PAGE_SIZE, PROT_READ).unwrap();
        let a = base + 4 * PAGE_SIZE;
        let mut cpu = crate::Cpu::attached(mm);
        for i in 0..4 {
            cpu.write_u32(a + i * PAGE_SIZE, 100 + i as u32).unwrap();
        }
        let grown = mm.mremap(a, 4 * PAGE_SIZE, 6 * PAGE_SIZE, MREMAP_MAYMOVE, 0).unwrap();
        let hint = grown - 16 * PAGE_SIZE;
        let kept = mm.mremap(grown, 6 * PAGE_SIZE, 6 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, hint).unwrap();
        let values: Vec<_> = (0..6).map(|i| cpu.read_u32(kept + i * PAGE_SIZE).unwrap()).collect();
        let source: Vec<_> = (0..6).map(|i| cpu.read_u32(grown + i * PAGE_SIZE).unwrap()).collect();
        drop(cpu);
        (a, grown, kept, hint, values, source, spans(mm), mm.stats().map_count)
    };
    let reference = run(&mm(&phys, WriterPolicy::Short, PlacementPolicy::Arenas));
    let range = mm(&phys, WriterPolicy::Range, PlacementPolicy::Arenas);
    let got = run(&range);
    // mmap, two munmaps, mprotect and the two mremaps.
    let stats = range.range.stats();
    assert_eq!((stats.writes, stats.fallbacks), (6, 0), "{stats:?}");
    assert_eq!(got, reference);
    let (a, grown, kept, hint, values, source, ..) = got;
    assert!(grown != a && kept == hint, "moved by the search, then to the hint");
    assert_eq!(values, [100, 101, 102, 103, 0, 0]);
    assert_eq!(source, [0; 6], "the source stays mapped, empty");
}

/// A VMA a range writer removes is detached before its window is
/// published, and a fault in it aborts; a lock-free fault after the
/// munmap finds nothing.
#[test]
fn a_range_munmap_detaches_before_it_publishes() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 4 * PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
    let mut cpu = crate::Cpu::attached(&mm);
    cpu.write_u32(a, 7).unwrap();
    let guard = crossbeam_epoch::pin();
    let old = mm.vmas_rcu(&guard).find(a).unwrap().clone();
    mm.munmap(a, 4 * PAGE_SIZE).unwrap();
    assert!(old.lock.is_detached());
    assert!(cpu.read_u32(a).is_err());
    drop(cpu);
    assert_eq!(mm.stats().rss_pages, 0);
}

/// Every call under `range` gives the errno and the mappings it gives
/// under `short`, over random calls around the bounds of a few windows
/// (most range writes, some falling back), and then inside them (`interior`:
/// 256 pages above a bound, no call longer than 8 pages, where most
/// `madvise` and `mremap` calls are range writes), and the published set
/// always equals what the next `mmap_lock` holder holds.
#[test]
#[cfg_attr(miri, ignore = "hundreds of system calls across 1 GiB windows")]
fn range_writers_give_the_mappings_and_errnos_of_mmap_lock() {
    let runs = [(PlacementPolicy::Linux, false), (PlacementPolicy::Arenas, false), (PlacementPolicy::Linux, true)];
    for (placement, interior) in runs {
        let phys = PhysMem::new(PhysConfig::new(256 * PAGE_SIZE)).unwrap();
        let (reference, range) = (mm(&phys, WriterPolicy::Short, placement), mm(&phys, WriterPolicy::Range, placement));
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let base = 0x100 * GIB;
        let above = if interior { 256 * PAGE_SIZE } else { 0 };
        let addr =
            |next: &mut dyn FnMut(u64) -> u64| base + next(3) * GIB + above + next(24) * PAGE_SIZE - 8 * PAGE_SIZE;
        let prots = [PROT_READ, PROT_READ | PROT_WRITE, PROT_NONE];
        // Range writes per kind of call (`op`).
        let mut ranged = [0u64; 16];
        let file = crate::File::create(&phys, "f", 48 * PAGE_SIZE).unwrap();
        let open = crate::OpenFile::new(&file, true, true);
        // Range writes that found a file mapping: munmaps, and mprotect,
        // madvise and mremap calls.
        let mut file_writes = [0u64; 2];
        for round in 0..600 {
            let a = addr(&mut next);
            let len = match next(4) {
                0 if !interior => GIB + next(8) * PAGE_SIZE,
                _ => (1 + next(8)) * PAGE_SIZE,
            };
            let prot = prots[next(3) as usize];
            let advice = ADVICE[next(ADVICE.len() as u64) as usize];
            // mremap: mostly a part of a VMA there is, a new length, a
            // fixed target (mostly near, in the same window) and whether
            // the mapping may move.
            let vmas = spans(&reference);
            let (old_addr, old_len) = match (next(4), vmas.len() as u64) {
                (0, _) | (_, 0) => (a, (1 + next(8)) * PAGE_SIZE),
                (_, n) => {
                    let (start, end, _) = vmas[next(n) as usize];
                    let pages = (end - start) / PAGE_SIZE;
                    let skip = next(pages.min(4));
                    (start + skip * PAGE_SIZE, (1 + next((pages - skip).min(8))) * PAGE_SIZE)
                }
            };
            let new_len = (1 + next(8)) * PAGE_SIZE;
            let target = match next(4) {
                0 => addr(&mut next),
                // Mostly near the old range, in its window.
                _ => (old_addr + next(32) * PAGE_SIZE).saturating_sub(16 * PAGE_SIZE),
            };
            let may_move = if next(2) == 0 { MREMAP_MAYMOVE } else { 0 };
            // File and shared anonymous mappings only inside windows: at
            // the bounds they would send most later calls there to
            // `mmap_lock` (a VMA across a bound, one range writers may not
            // replace).
            let op = next(if interior { 16 } else { 14 });
            let file_flags = if next(2) == 0 { MAP_SHARED } else { MAP_PRIVATE };
            // File mappings at the offset their address gives (so that
            // neighbours merge), most inside the file, some past its end.
            let offset = (a / PAGE_SIZE % 64) * PAGE_SIZE;
            let run = |mm: &AddressSpace| match op {
                0..=2 => mm.mmap(a, len, prot, ANON | MAP_FIXED, None, 0),
                3 => mm.mmap(a, len, prot, ANON | MAP_FIXED_NOREPLACE, None, 0),
                4 => mm.mmap(0, len, prot, ANON, None, 0).map(|_| 0),
                5 | 6 => mm.munmap(a, len).map(|_| 0),
                7 => mm.mprotect(a, len, prot).map(|_| 0),
                8 | 9 => mm.madvise(a, len, advice).map(|_| 0),
                10 => mm.mremap(old_addr, old_len, new_len, may_move, 0),
                11 => mm.mremap(old_addr, old_len, new_len, MREMAP_MAYMOVE | MREMAP_FIXED, target),
                // MREMAP_DONTUNMAP: the target a hint, or fixed.
                12 => mm.mremap(old_addr, old_len, old_len, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, target),
                13 => mm.mremap(old_addr, old_len, old_len, MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED, target),
                14 => mm.mmap(a, len, prot, file_flags | MAP_FIXED, Some(&open), offset),
                _ => mm.mmap(a, len, prot, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, None, 0),
            };
            let before = range.range.stats().writes;
            let (at, span) = if (10..=13).contains(&op) { (old_addr, old_len) } else { (a, len) };
            let had_file = (5..=13).contains(&op)
                && range.read_lock().vmas.overlapping(at, at.saturating_add(span)).any(|v| v.file.is_some());
            let (want, got) = (run(&reference), run(&range));
            ranged[op as usize] += range.range.stats().writes - before;
            if had_file && range.range.stats().writes > before {
                file_writes[usize::from(op > 6)] += 1;
            }
            assert_eq!(got, want, "{placement:?} round {round}: op {op} at {a:#x}+{len:#x}");
            let guard = crossbeam_epoch::pin();
            let published: Vec<(u64, u64)> =
                crate::vma::query::iter(range.vmas_rcu(&guard)).map(|v| (v.start, v.end)).collect();
            // Lock-free faults' view first, then the mmap_lock holder's.
            let held: Vec<(u64, u64)> = range.read_lock().vmas.iter().map(|v| (v.start, v.end)).collect();
            assert_eq!(published, held, "{placement:?} round {round}");
            // Arenas place non-fixed calls per thread: one thread here, so
            // the same addresses under both policies.
            assert_eq!(spans(&range), spans(&reference), "{placement:?} round {round}");
            assert_eq!(vma_flags(&range), vma_flags(&reference), "{placement:?} round {round}");
            assert_eq!(range.stats().map_count, reference.stats().map_count);
        }
        let s = range.range.stats();
        assert!(!interior || file_writes[0] > 20, "{placement:?}: {file_writes:?} range writes of file mappings");
        drop((reference, range, open, file));
        let left = phys.quiesce();
        assert_eq!((left.vmas, left.frames_used), (0, 0), "{placement:?}: nothing leaked");
        if !interior {
            // Both paths exercised around the bounds (75 range writes and
            // 446 fallbacks in 600 calls with this stream, Linux placement).
            assert!(s.writes > 50 && s.fallbacks > 50, "{placement:?}: {s:?}");
            continue;
        }
        // madvise, mremap in place and mremap moves each ran as range
        // writes, not only their fallbacks.
        let (madvised, resized, moved) = (ranged[8] + ranged[9], ranged[10], ranged[11]);
        // This stream: 33, 7, 6, and 7 and 16 MREMAP_DONTUNMAP moves.
        assert!(madvised > 15 && resized > 3 && moved > 3, "{placement:?}: {ranged:?}");
        assert!(ranged[12] > 3 && ranged[13] > 3, "MREMAP_DONTUNMAP, {placement:?}: {ranged:?}");
        // And file mmaps (41 of this stream's), and calls that changed
        // or moved file mappings (64; 35 range munmaps of them above).
        assert!(ranged[14] > 20, "file mmaps, {placement:?}: {ranged:?}");
        // And shared anonymous ones (33).
        assert!(ranged[15] > 10, "shared anonymous mmaps, {placement:?}: {ranged:?}");
        assert!(file_writes[1] > 20, "file changes, {placement:?}: {file_writes:?}");
    }
}

/// An address space dropped right after range writes (no `mmap_lock`
/// section took their windows in) returns the commit charge of what they
/// mapped, and frees everything.
#[test]
fn exit_after_range_writes_returns_their_charge() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let before = phys.committed_pages();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let a = 0x100 * GIB + 16 * PAGE_SIZE;
    mm.mmap(a, 8 * PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
    mm.munmap(a, 2 * PAGE_SIZE).unwrap();
    assert_eq!(mm.range.stats().writes, 2);
    assert_eq!(phys.committed_pages(), before + 6);
    drop(mm);
    assert_eq!(phys.committed_pages(), before);
}

/// `max_map_count` is exact under range writers: a range writer goes
/// ahead only within its slot's share of the room below the limit, and
/// near it the call takes `mmap_lock`, whose check is exact. Maps (and
/// a munmap that splits) up to the limit give the errnos and the map
/// count of `short`, call by call, and most calls before the limit are
/// range writes.
#[test]
#[cfg_attr(miri, ignore = "hundreds of calls and maps dumps; safe code above the windows' tests")]
fn the_map_count_limit_is_exact_under_range_writers() {
    const MAX: usize = 64;
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let config = |w| MmConfig::default().writer_policy(w).max_map_count(MAX);
    let reference = AddressSpace::new(&phys, config(WriterPolicy::Short)).unwrap();
    let range = AddressSpace::new(&phys, config(WriterPolicy::Range)).unwrap();
    let a = 0x100 * GIB;
    let mut refused = 0;
    for i in 0..MAX as u64 + 8 {
        // One page apart: no two merge. Every third call punches a hole
        // in the last mapping made two pages wide instead (a split).
        let at = a + 4 * i * PAGE_SIZE;
        let call = |mm: &AddressSpace| {
            mm.mmap(at, 2 * PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).map(|_| ())?;
            if i % 3 == 2 {
                mm.munmap(at + PAGE_SIZE, PAGE_SIZE)?;
                mm.mmap(at + PAGE_SIZE, PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).map(|_| ())?;
                mm.munmap(at, PAGE_SIZE)?;
            }
            Ok::<_, crate::Errno>(())
        };
        let (want, got) = (call(&reference), call(&range));
        assert_eq!(got, want, "call {i}");
        refused += u32::from(got.is_err());
        assert_eq!(range.stats().map_count, reference.stats().map_count, "after call {i}");
        assert_eq!(spans(&range), spans(&reference), "after call {i}");
    }
    assert!(refused > 0, "the limit was never reached");
    let stats = range.range.stats();
    assert!(stats.writes > 16 && stats.fallbacks > 0, "{stats:?}");
}

/// A fixed `mremap` whose source spans several VMAs moves each of them
/// (each piece may add a VMA), more than the three a range write's share
/// of the room below `max_map_count` allows for: it takes `mmap_lock`,
/// whose check is exact, and gives `short`'s result. Before, the range
/// writer ran it on a view whose count stands near the limit, and failed
/// part-way with `ENOMEM` (29 VMAs left where `short` gives 40).
#[test]
#[cfg_attr(
    miri,
    ignore = "safe VMA-set logic over hundreds of VMAs; the range writers' table and window operations run under Miri in the other range tests"
)]
fn a_fixed_mremap_of_many_vmas_takes_mmap_lock() {
    let run = |writer: WriterPolicy| {
        let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
        let config = MmConfig::default().writer_policy(writer).max_map_count(200);
        let mm = AddressSpace::new(&phys, config).unwrap();
        let a = 0x100 * GIB + 16 * PAGE_SIZE;
        for i in 0..20 {
            mm.mmap(a + 2 * i * PAGE_SIZE, PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
        }
        let to = a + 64 * PAGE_SIZE;
        mm.mmap(to, 64 * PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
        let _ = mm.stats();
        let r = mm.mremap(a, 39 * PAGE_SIZE, 39 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, to + 8 * PAGE_SIZE);
        (r, spans(&mm))
    };
    let short = run(WriterPolicy::Short);
    assert_eq!(short.0, Ok(0x100 * GIB + 88 * PAGE_SIZE));
    assert_eq!(run(WriterPolicy::Range), short);
}

/// A range `munmap` that leaves its 512 GiB region without a VMA frees the
/// region's PUD table before it returns, as Linux's `free_pgtables` does
/// (the window's view alone frees only the window's tables); one that
/// leaves a VMA in another window of the region keeps it. Before, the PUD
/// table stayed until a later `mmap_lock` unmap or the exit.
#[test]
fn a_range_munmap_that_empties_its_region_frees_the_pud_table() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    // Freed tables are counted once their grace period is over: waited
    // for (another test thread may hold it back a while), up to 10 s.
    let tables_reach = |want: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            crate::sync::rcu::reclaim_now();
            let now = phys.stats().page_tables;
            if now == want || std::time::Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    let base = phys.stats().page_tables;
    let (a, b) = (0x101 * GIB, 0x105 * GIB);
    for at in [a, b] {
        mm.mmap(at, PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
        mm.handle_fault(at, crate::Access::Write).unwrap();
    }
    assert_eq!(phys.stats().page_tables, base + 5, "a PUD table, two PMD tables, two PTE tables");
    let writes = mm.counters.lock_counts().0;
    mm.munmap(b, PAGE_SIZE).unwrap();
    assert_eq!(tables_reach(base + 3), base + 3, "the region keeps its PUD table for the VMA at a");
    assert_eq!(mm.counters.lock_counts().0, writes, "no mmap_lock write section");
    mm.munmap(a, PAGE_SIZE).unwrap();
    assert_eq!(mm.range.stats().fallbacks, 0);
    assert_eq!(mm.counters.lock_counts().0, writes + 1, "one mmap_lock write section, the PUD table's");
    assert_eq!(tables_reach(base), base, "the emptied region's PUD table is freed");
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
}

/// A range call that cannot make a VMA, on a window that never held one,
/// allocates nothing for it (its directory leaf, 16 KiB): it goes to
/// `mmap_lock`, with the same answers. So does an `mmap` refused for its
/// address (unaligned: `EINVAL`), and one at a leaf's first window, whose
/// lock of the window below would allocate the leaf below (no VMA in its
/// 256 GiB). Before, each such window's leaf was allocated and kept until
/// the address space went.
#[test]
fn a_range_call_on_a_window_that_never_held_a_vma_allocates_nothing() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let leaves = mm.windows.leaves_allocated();
    let at = 0x7000 * GIB + 16 * PAGE_SIZE;
    assert_eq!(mm.munmap(at, PAGE_SIZE), Ok(()));
    assert_eq!(mm.mprotect(at, PAGE_SIZE, PROT_READ), Err(crate::Errno::NoMem));
    assert_eq!(mm.madvise(at, PAGE_SIZE, MADV_DONTFORK), Err(crate::Errno::NoMem));
    assert_eq!(mm.mremap(at, PAGE_SIZE, 2 * PAGE_SIZE, 0, 0), Err(crate::Errno::Fault));
    assert_eq!(mm.mmap(at + 1, PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0), Err(crate::Errno::Inval));
    assert_eq!(mm.windows.leaves_allocated(), leaves, "no leaf for a window that holds nothing");
    assert_eq!(mm.range.stats().fallbacks, 4);
    // A mapping there makes one.
    mm.mmap(at, PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(mm.windows.leaves_allocated(), leaves + 1);
    // Window 0x6000 is the first of its leaf: its lock takes window 0x5fff's.
    let b = 0x6000 * GIB;
    assert_eq!(mm.mmap(b, PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0), Ok(b));
    assert_eq!(mm.windows.leaves_allocated(), leaves + 2, "no leaf for the window below");
    assert_eq!(mm.range.stats().fallbacks, 5, "the mapping at the leaf's first window took mmap_lock");
}

/// The free of an emptied region's tables looks again under `mmap_lock`:
/// a VMA made in the region since the range writer looked (another range
/// writer's, published before the lock drained it) keeps its tables and
/// its pages. Before, the locked free detached the whole PUD table, and
/// the VMA's written page read back 0.
#[test]
fn the_free_of_an_emptied_region_looks_again_under_mmap_lock() {
    let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
    let mm = mm(&phys, WriterPolicy::Range, PlacementPolicy::Linux);
    let b = 0x105 * GIB;
    mm.mmap(b, PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
    let mut cpu = crate::Cpu::attached(&mm);
    cpu.write_u64(b, 0x1234).unwrap();
    let tables = phys.stats().page_tables;
    // What the range writer that emptied the region runs once it holds the
    // lock, after the mapping at `b` was made.
    mm.free_empty_region_tables(0, crate::pgtable::PGDIR_SIZE);
    assert_eq!(phys.stats().page_tables, tables, "the live VMA's tables are kept");
    assert_eq!(cpu.read_u64(b), Ok(0x1234), "the live VMA's page is kept");
    drop(cpu);
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
}

/// Under never-mode overcommit a range writer charges as the `mmap_lock`
/// path does: its view holds one window, but the user reserve it takes
/// off the limit is `total_vm / 32` of the whole address space (128 MiB
/// mapped read-only in window 2: 1,024 pages), so a private writable
/// mapping that fits only without that reserve is refused with `ENOMEM`
/// under both, one that fits with it is made under both, and both are
/// range writes. Before, a never-mode call took `mmap_lock` (its check
/// read the whole set's size), and a range call that read another mode
/// before a switch to never charged with its window's size alone.
#[test]
fn a_never_mode_charge_counts_the_whole_address_space() {
    use crate::phys::OvercommitMode;
    let run = |writer: WriterPolicy| {
        let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
        // A commit limit of 2,048 pages, no admin reserve, a user reserve
        // larger than `total_vm / 32`.
        let policy = phys.overcommit().mode(OvercommitMode::Never).kbytes(8192).admin_reserve_kbytes(0);
        phys.set_overcommit(policy.user_reserve_kbytes(1 << 20));
        let mm = mm(&phys, writer, PlacementPolicy::Linux);
        let other = 2 * GIB;
        assert_eq!(mm.mmap(other, 32768 * PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0), Ok(other));
        let rw = PROT_READ | PROT_WRITE;
        let (big, small) = (5 * GIB, 6 * GIB);
        let refused = mm.mmap(big, 1500 * PAGE_SIZE, rw, ANON | MAP_FIXED, None, 0);
        let made = mm.mmap(small, 1000 * PAGE_SIZE, rw, ANON | MAP_FIXED, None, 0);
        ((refused, made, phys.committed_pages()), mm.range.stats().writes)
    };
    let (short, _) = run(WriterPolicy::Short);
    assert_eq!(short, (Err(crate::Errno::NoMem), Ok(6 * GIB), 1000));
    assert_eq!(run(WriterPolicy::Range), (short, 3), "the same answers and charge, each call a range write");
}

/// With a `task_size` of 256 MiB, a range `munmap` frees the page tables
/// that `mmap_lock`'s frees: the PTE table alone, as `free_pgtables`'
/// ceiling is the table bounds' top (`task_size.next_power_of_two()`).
/// Before, a window's view set its ceiling at the window's end, 1 GiB,
/// above that top, and freed the PMD table too.
#[test]
fn a_range_munmap_in_a_small_address_space_frees_what_mmap_lock_frees() {
    let run = |writer: WriterPolicy| {
        let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
        let config =
            MmConfig::default().writer_policy(writer).task_size(256 << 20).mmap_base(192 << 20).start_brk(64 << 20);
        let mm = AddressSpace::new(&phys, config).unwrap();
        let a = 16 << 20;
        mm.mmap(a, PAGE_SIZE, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, None, 0).unwrap();
        mm.handle_fault(a, crate::Access::Write).unwrap();
        let faulted = phys.stats().page_tables;
        mm.munmap(a, PAGE_SIZE).unwrap();
        // Freed tables count once their grace period is over (one batch:
        // one `free_pgtables`): waited for until some went, up to 10 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            crate::sync::rcu::reclaim_now();
            let now = phys.stats().page_tables;
            if now < faulted || std::time::Instant::now() > deadline {
                return (faulted - now, mm.range.stats().writes);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    assert_eq!(run(WriterPolicy::Short), (1, 0), "mmap_lock frees the PTE table alone");
    assert_eq!(run(WriterPolicy::Range), (1, 2), "the range munmap frees what mmap_lock frees");
}

/// A non-fixed anonymous `mmap` of a multiple of 2 MiB under arenas (the
/// THP-aligned search, for 2 MiB more than its length) lands where it
/// does under `mmap_lock`: here the arena (window 1, `mmap_base` just
/// above it, a VMA between) has 3 MiB left at its top, too little for
/// the padded search, which goes on below the arena. Before, the range
/// writer's search on its window's view, which lacks the VMA above,
/// aligned its way back to the window's top.
#[test]
fn a_thp_aligned_arena_mmap_is_placed_as_under_mmap_lock() {
    let run = |writer: WriterPolicy| {
        let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
        let config =
            MmConfig::default().writer_policy(writer).placement(PlacementPolicy::Arenas).mmap_base(2 * GIB + (1 << 20));
        let mm = AddressSpace::new(&phys, config).unwrap();
        mm.mmap(2 * GIB + PAGE_SIZE, PAGE_SIZE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
        mm.mmap(GIB + PAGE_SIZE, GIB - PAGE_SIZE - (3 << 20), PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
        let got = mm.mmap(0, 2 << 20, PROT_READ, ANON, None, 0);
        (got, spans(&mm))
    };
    let short = run(WriterPolicy::Short);
    assert_eq!(short.0, Ok(GIB - (2 << 20)));
    assert_eq!(run(WriterPolicy::Range), short);
}
