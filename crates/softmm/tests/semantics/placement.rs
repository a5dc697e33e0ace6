//! Placement policies (issue 32, item 4): under `PlacementPolicy::Arenas` a
//! non-fixed mapping may land elsewhere than under Linux placement, and
//! nothing else may differ: hints, `MAP_FIXED`, `MAP_32BIT`, guard gaps,
//! `ENOMEM` when full, `max_map_count`, mremap moves, brk and the stack.
//! Each test runs the same calls on an address space of each policy.

use std::sync::{Arc, Barrier};

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, MmConfig, PhysMem, PlacementPolicy};
use softmm_testkit::common::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// An address space of each policy on `p`, from `config`: Linux's first.
fn pair(p: &Arc<PhysMem>, config: MmConfig) -> [Arc<AddressSpace>; 2] {
    [PlacementPolicy::Linux, PlacementPolicy::Arenas]
        .map(|placement| AddressSpace::new(p, config.clone().placement(placement)).expect("valid config"))
}

/// The 1 GiB window holding `addr`.
fn window(addr: u64) -> u64 {
    addr & !(GIB - 1)
}

/// The calling thread's arena in `mm` (an address space under arena
/// placement with nothing mapped): where its first small mapping goes.
fn my_arena(mm: &AddressSpace) -> (u64, u64) {
    let a = mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
    mm.munmap(a, PAGE).unwrap();
    assert_eq!((a + PAGE) % GIB, 0, "a fresh arena is searched from its top: {a:#x}");
    (a + PAGE - GIB, a + PAGE)
}

#[test]
fn the_default_is_linux_placement() {
    assert_eq!(MmConfig::default().placement, PlacementPolicy::Linux);
    assert_eq!(PlacementPolicy::default(), PlacementPolicy::Linux);
    for &p in PlacementPolicy::ALL {
        assert_eq!(PlacementPolicy::from_name(p.name()), Some(p));
    }
    assert_eq!(PlacementPolicy::from_name("nope"), None);
}

#[test]
fn non_fixed_mappings_go_to_the_thread_arena_below_mmap_base() {
    let p = phys(8);
    let [linux, arenas] = pair(&p, MmConfig::default());
    let base = MmConfig::default().mmap_base;
    assert_eq!(linux.mmap(0, 3 * PAGE, RW, ANON, None, 0), Ok(base - 3 * PAGE));
    let a = arenas.mmap(0, 3 * PAGE, RW, ANON, None, 0).unwrap();
    assert_eq!((a + 3 * PAGE) % GIB, 0, "the top of an arena: {a:#x}");
    assert!(a + 3 * PAGE <= window(base), "below mmap_base's window: {a:#x}");
    // Top-down inside the arena, merging with the thread's own neighbour.
    let b = arenas.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    assert_eq!(b, a - PAGE);
    assert_eq!(arenas.maps().len(), 1, "{}", arenas.maps_text());
    // THP alignment inside the arena too; the memory works.
    let h = arenas.mmap(0, 4 * MIB, RW, ANON, None, 0).unwrap();
    assert_eq!((h % (2 * MIB), window(h)), (0, window(a)));
    let mut cpu = Cpu::attached(&arenas);
    cpu.write_u32(h + 4 * MIB - 4, 7).unwrap();
    assert_eq!(cpu.read_u32(h + 4 * MIB - 4), Ok(7));
    drop(cpu);
    drop((linux, arenas));
    assert_no_leaks(&p);
}

#[test]
fn threads_get_disjoint_arenas_and_their_mappings_do_not_merge() {
    const THREADS: usize = 4;
    let p = phys(8);
    for mm in pair(&p, MmConfig::default()) {
        let barrier = Barrier::new(THREADS);
        let addrs: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait(); // all alive at once: each holds its own slot
                        let a = mm.mmap(0, 128 * MIB, RW, ANON | MAP_NORESERVE, None, 0).unwrap();
                        barrier.wait();
                        a
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut windows: Vec<u64> = addrs.iter().map(|&a| window(a)).collect();
        windows.sort_unstable();
        windows.dedup();
        match mm.config().placement {
            PlacementPolicy::Linux => {
                // Stacked under one another, merged into one VMA.
                assert_eq!(mm.maps().len(), 1, "{}", mm.maps_text());
            }
            _ => {
                assert_eq!(windows.len(), THREADS, "{addrs:#x?}");
                assert_eq!(mm.maps().len(), THREADS, "{}", mm.maps_text());
                assert!(addrs.iter().all(|&a| (a + 128 * MIB) % GIB == 0), "{addrs:#x?}");
            }
        }
        for a in addrs {
            mm.munmap(a, 128 * MIB).unwrap();
        }
        assert!(mm.maps().is_empty());
    }
    assert_no_leaks(&p);
}

#[test]
fn a_full_arena_falls_back_to_linux_placement() {
    let p = phys(8);
    let [linux, arenas] = pair(&p, MmConfig::default());
    let (bottom, top) = my_arena(&arenas);
    // Fill the arena but its lowest page, in both.
    let flags = ANON | MAP_NORESERVE | MAP_FIXED;
    for mm in [&linux, &arenas] {
        assert_eq!(mm.mmap(bottom + PAGE, GIB - PAGE, PROT_NONE, flags, None, 0), Ok(bottom + PAGE));
    }
    // One page still fits in the arena; two go where Linux puts them.
    assert_eq!(arenas.mmap(0, PAGE, PROT_READ, ANON, None, 0), Ok(bottom));
    assert_eq!(linux.mmap(bottom, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0), Ok(bottom));
    for len in [PAGE, 2 * PAGE, 2 * MIB, GIB + PAGE] {
        let want = linux.mmap(0, len, PROT_READ, ANON | MAP_NORESERVE, None, 0);
        assert_eq!(arenas.mmap(0, len, PROT_READ, ANON | MAP_NORESERVE, None, 0), want, "len {len:#x}");
    }
    assert_eq!(linux.maps(), arenas.maps());
    assert!(!arenas.maps().is_empty() && window(arenas.maps()[0].start) != window(top));
    drop((linux, arenas));
    assert_no_leaks(&p);
}

#[test]
fn hints_map_fixed_and_map_32bit_are_placed_as_by_linux() {
    let p = phys(8);
    let [linux, arenas] = pair(&p, MmConfig::default());
    let (bottom, _) = my_arena(&arenas);
    let calls: &[(u64, u64, i32)] = &[
        (0x1234_5000, PAGE, ANON),                       // a free hint
        (0x1234_5000, 2 * PAGE, ANON | MAP_FIXED),       // fixed over it
        (0x1234_6000, PAGE, ANON | MAP_FIXED_NOREPLACE), // EEXIST
        (0x1234_8000, PAGE, ANON | MAP_FIXED_NOREPLACE),
        (bottom + 5 * PAGE, PAGE, ANON),              // a free hint inside the arena
        (0, PAGE, ANON | MAP_32BIT),                  // [1 GiB, 2 GiB), bottom-up
        (0, 2 * MIB, ANON | MAP_32BIT | MAP_HUGETLB), // ENOMEM: no huge pages, but placed first
        (0x10_0000, PAGE, ANON | MAP_32BIT),          // a hint below the window
        (0x800, PAGE, ANON | MAP_FIXED),              // EPERM below mmap_min_addr
        (0x1235_0123, PAGE, ANON | MAP_FIXED),        // EINVAL, unaligned
        (TASK_SIZE_END, PAGE, ANON | MAP_FIXED),      // ENOMEM past TASK_SIZE
    ];
    for &(addr, len, flags) in calls {
        let want = linux.mmap(addr, len, RW, flags, None, 0);
        assert_eq!(arenas.mmap(addr, len, RW, flags, None, 0), want, "mmap({addr:#x}, {len:#x}, {flags:#x})");
    }
    assert_eq!(linux.maps(), arenas.maps());
    drop((linux, arenas));
    assert_no_leaks(&p);
}

/// An address past which nothing may be mapped (`TASK_SIZE`).
const TASK_SIZE_END: u64 = softmm::TASK_SIZE;

#[test]
fn an_occupied_hint_goes_to_the_arena_where_linux_goes_below_mmap_base() {
    let p = phys(8);
    let [linux, arenas] = pair(&p, MmConfig::default());
    let (_, top) = my_arena(&arenas);
    for mm in [&linux, &arenas] {
        mm.mmap(0x1234_5000, PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
    }
    let base = MmConfig::default().mmap_base;
    assert_eq!(linux.mmap(0x1234_5000, PAGE, PROT_READ, ANON, None, 0), Ok(base - PAGE));
    assert_eq!(arenas.mmap(0x1234_5000, PAGE, PROT_READ, ANON, None, 0), Ok(top - PAGE));
}

#[test]
fn the_guard_gap_of_a_stack_in_the_arena_is_kept() {
    let p = phys(8);
    let [_, arenas] = pair(&p, MmConfig::default());
    let gap = MmConfig::default().stack_guard_gap;
    let (_, top) = my_arena(&arenas);
    let stack = top - MIB;
    let flags = ANON | MAP_GROWSDOWN | MAP_FIXED;
    assert_eq!(arenas.mmap(stack, MIB, RW, flags, None, 0), Ok(stack));
    assert_eq!(arenas.mmap(0, PAGE, RW, ANON, None, 0), Ok(stack - gap - PAGE));
    // A hint inside the guard gap is refused as by Linux: the arena's search instead.
    assert_eq!(arenas.mmap(stack - PAGE, PAGE, PROT_READ, ANON, None, 0), Ok(stack - gap - 2 * PAGE));
}

#[test]
fn enomem_when_full_and_max_map_count_are_as_linux() {
    let p = phys(8);
    // A 4 GiB address space: arenas [2 GiB, 3 GiB) and [1 GiB, 2 GiB).
    let config = MmConfig::default().task_size(4 * GIB).mmap_base(3 * GIB).start_brk(0x10_0000);
    let [linux, arenas] = pair(&p, config.clone());
    let full = ANON | MAP_NORESERVE | MAP_FIXED;
    let min = config.mmap_min_addr;
    for mm in [&linux, &arenas] {
        assert_eq!(mm.mmap(min, 4 * GIB - min, PROT_NONE, full, None, 0), Ok(min));
        assert_eq!(mm.mmap(0, PAGE, RW, ANON, None, 0), Err(Errno::NoMem));
        assert_eq!(mm.mmap(0, 2 * MIB, RW, ANON, None, 0), Err(Errno::NoMem));
        // One hole, above mmap_base (only the bottom-up fallback reaches it).
        mm.munmap(3 * GIB + 16 * PAGE, 4 * PAGE).unwrap();
    }
    for len in [PAGE, 4 * PAGE, 5 * PAGE] {
        let want = linux.mmap(0, len, RW, ANON, None, 0);
        assert_eq!(arenas.mmap(0, len, RW, ANON, None, 0), want, "len {len:#x}");
    }
    assert_eq!(linux.maps(), arenas.maps());
    drop((linux, arenas));

    let config = MmConfig::default().max_map_count(8);
    let [linux, arenas] = pair(&p, config);
    let mut results = [Vec::new(), Vec::new()];
    for (mm, out) in [&linux, &arenas].into_iter().zip(&mut results) {
        for i in 0..12 {
            // Alternate protections so that nothing merges.
            let prot = if i % 2 == 0 { PROT_READ } else { RW };
            out.push(mm.mmap(0, PAGE, prot, ANON, None, 0).map(|_| ()));
        }
    }
    assert_eq!(results[0], results[1]);
    assert!(results[0].contains(&Err(Errno::NoMem)));
    drop((linux, arenas));
    assert_no_leaks(&p);
}

#[test]
fn mremap_moves_keep_their_contents_and_errnos() {
    let p = phys(8);
    let [linux, arenas] = pair(&p, MmConfig::default());
    let (_, top) = my_arena(&arenas);
    let fixed = 0x2000_0000;
    let mut moved = Vec::new();
    for mm in [&linux, &arenas] {
        let mut cpu = Cpu::attached(mm);
        assert_eq!(mm.mmap(fixed, 2 * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(fixed));
        assert_eq!(mm.mmap(fixed + 2 * PAGE, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0), Ok(fixed + 2 * PAGE));
        cpu.write_u32(fixed + PAGE, 0xabcd).unwrap();
        // Cannot grow in place: without MAYMOVE ENOMEM, with it a move.
        assert_eq!(mm.mremap(fixed, 2 * PAGE, 4 * PAGE, 0, 0), Err(Errno::NoMem));
        let to = mm.mremap(fixed, 2 * PAGE, 4 * PAGE, MREMAP_MAYMOVE, 0).unwrap();
        assert_eq!(cpu.read_u32(to + PAGE), Ok(0xabcd));
        assert_eq!(mm.mremap(to, 4 * PAGE, PAGE, MREMAP_FIXED, fixed), Err(Errno::Inval), "FIXED without MAYMOVE");
        // An explicit destination is taken as by Linux.
        let back = mm.mremap(to, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, fixed + 8 * PAGE);
        assert_eq!(back, Ok(fixed + 8 * PAGE));
        assert_eq!(cpu.read_u32(fixed + 9 * PAGE), Ok(0xabcd));
        moved.push(to);
    }
    assert_eq!(moved[0], MmConfig::default().mmap_base - 4 * PAGE);
    assert_eq!(moved[1], top - 4 * PAGE, "the move went to the arena");
    assert_eq!(linux.maps(), arenas.maps());
    drop((linux, arenas));
    assert_no_leaks(&p);
}

#[test]
fn brk_and_the_stack_do_not_use_placement() {
    let p = phys(8);
    let [linux, arenas] = pair(&p, MmConfig::default());
    let start = MmConfig::default().start_brk;
    let mut sp = Vec::new();
    for mm in [&linux, &arenas] {
        assert_eq!(mm.brk(0), start);
        assert_eq!(mm.brk(start + 5 * PAGE), start + 5 * PAGE);
        assert_eq!(mm.brk(start + 2 * PAGE), start + 2 * PAGE);
        // A growsdown stack placed as the loader does (fixed), grown by a fault below it.
        let stack = 0x7ffe_0000_0000;
        assert_eq!(mm.mmap(stack, 8 * PAGE, RW, ANON | MAP_GROWSDOWN | MAP_FIXED, None, 0), Ok(stack));
        mm.set_start_stack(stack + 8 * PAGE - 64);
        let mut cpu = Cpu::attached(mm);
        cpu.write_u8(stack - 3 * PAGE, 1).unwrap();
        sp.push(mm.maps());
    }
    assert_eq!(sp[0], sp[1]);
    assert!(sp[0].iter().any(|e| e.name == "[stack]" && e.start == 0x7ffe_0000_0000 - 3 * PAGE), "{:?}", sp[0]);
    assert!(sp[0].iter().any(|e| e.name == "[heap]"), "{:?}", sp[0]);
    drop((linux, arenas));
    assert_no_leaks(&p);
}

/// One step of [`a_single_thread_arena_is_linux_placement_shifted`]: the
/// same call on each address space, on the same mapping (by index) and
/// offset, or at the same fixed address.
#[derive(Debug, Clone, Copy)]
enum Call {
    Map { pages: u64, prot: i32 },
    MapFixed { addr: u64, pages: u64 },
    Unmap { map: usize, page: u64, pages: u64 },
    Protect { map: usize, page: u64, pages: u64, prot: i32 },
    Grow { map: usize, pages: u64 },
}

#[test]
fn a_single_thread_arena_is_linux_placement_shifted() {
    // One thread's mappings smaller than 2 MiB (no THP alignment, which
    // depends on where the search starts): its arena is searched exactly as
    // Linux searches below mmap_base, so the same calls give the same
    // results and the same layout, moved by the distance between the two
    // tops; fixed mappings far below both stay where they are.
    const FIXED: u64 = 0x1000_0000;
    let p = phys(64);
    for seed in 0..scaled(8) {
        let [linux, arenas] = pair(&p, MmConfig::default());
        let (_, top) = my_arena(&arenas);
        let shift = MmConfig::default().mmap_base - top;
        let mut rng = Rng::new(stress_seed(0x9a7e) + seed);
        let mut maps: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let prots = [PROT_READ, RW, PROT_NONE];
        for step in 0..300 {
            let call = match rng.below(6) {
                0 | 1 => Call::Map { pages: 1 + rng.below(64), prot: prots[rng.below(3) as usize] },
                2 => Call::MapFixed { addr: FIXED + rng.below(256) * PAGE, pages: 1 + rng.below(16) },
                _ if maps[0].is_empty() => continue,
                3 => Call::Unmap {
                    map: rng.below(maps[0].len() as u64) as usize,
                    page: rng.below(8),
                    pages: 1 + rng.below(16),
                },
                4 => Call::Protect {
                    map: rng.below(maps[0].len() as u64) as usize,
                    page: rng.below(8),
                    pages: 1 + rng.below(16),
                    prot: prots[rng.below(3) as usize],
                },
                _ => Call::Grow { map: rng.below(maps[0].len() as u64) as usize, pages: 1 + rng.below(32) },
            };
            let mut got = Vec::new();
            for (mm, maps) in [&linux, &arenas].into_iter().zip(&mut maps) {
                let r = match call {
                    Call::Map { pages, prot } => {
                        mm.mmap(0, pages * PAGE, prot, ANON, None, 0).inspect(|&a| maps.push(a))
                    }
                    Call::MapFixed { addr, pages } => mm.mmap(addr, pages * PAGE, RW, ANON | MAP_FIXED, None, 0),
                    Call::Unmap { map, page, pages } => mm.munmap(maps[map] + page * PAGE, pages * PAGE).map(|()| 0),
                    Call::Protect { map, page, pages, prot } => {
                        mm.mprotect(maps[map] + page * PAGE, pages * PAGE, prot).map(|()| 0)
                    }
                    Call::Grow { map, pages } => {
                        let r = mm.mremap(maps[map], PAGE, (1 + pages) * PAGE, MREMAP_MAYMOVE, 0);
                        if let Ok(a) = r {
                            maps[map] = a;
                        }
                        r
                    }
                };
                // Addresses in the arena as Linux's, moved up by the shift.
                got.push(r.map(|a| if a >= top - GIB && a < top { a + shift } else { a }));
            }
            assert_eq!(got[0], got[1], "seed {seed} step {step}: {call:?}");
        }
        let moved: Vec<_> = arenas
            .maps()
            .into_iter()
            .map(|mut e| {
                if e.start >= top - GIB && e.start < top {
                    (e.start, e.end) = (e.start + shift, e.end + shift);
                }
                e
            })
            .collect();
        assert_eq!(linux.maps(), moved, "seed {seed}");
    }
    assert_no_leaks(&p);
}
