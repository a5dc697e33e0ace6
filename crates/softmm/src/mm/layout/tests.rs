use std::sync::Arc;

use super::*;
use crate::phys::{PhysConfig, PhysMem};
use crate::vma::VmFlags;
use crate::vma::Vma;

const MIB: u64 = 1 << 20;
const RW: VmFlags = VmFlags::READ.union(VmFlags::WRITE).union(VmFlags::MAYREAD).union(VmFlags::MAYWRITE);
/// The default `mmap_base`: 128 MiB below `TASK_SIZE`, not 2 MiB aligned.
const BASE: u64 = crate::mm::TASK_SIZE - 128 * MIB;

/// A tiny arena: VMAs only need it for their accounting.
fn phys() -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(64 << 10)).unwrap()
}

/// A tree holding a read-write VMA `[start, end)` for each pair, with `VM_GROWSDOWN` added where asked.
fn tree(phys: &Arc<PhysMem>, vmas: &[(u64, u64, bool)]) -> VmaTree {
    let mut t = VmaTree::default();
    for &(start, end, growsdown) in vmas {
        let flags = if growsdown { RW | VmFlags::GROWSDOWN } else { RW };
        t.insert(Vma::new(phys, start, end, flags, 0, None, None));
    }
    t
}

/// A small address space: 256 MiB `TASK_SIZE`, `mmap_base` at 192 MiB, a 1 MiB stack guard gap.
fn small() -> MmConfig {
    MmConfig {
        task_size: 256 * MIB,
        mmap_base: 192 * MIB,
        mmap_min_addr: 0x1_0000,
        stack_guard_gap: MIB,
        ..MmConfig::default()
    }
}

/// `get_unmapped_area` for a non-THP object (a file or shared mapping).
fn area(cfg: &MmConfig, t: &VmaTree, addr: u64, len: u64, fixed: bool) -> Result<u64> {
    get_unmapped_area(cfg, t, AreaKind::Other, addr, len, AreaFlags::fixed(fixed))
}

#[test]
fn empty_space_maps_just_below_mmap_base() {
    let cfg = MmConfig::default();
    let t = VmaTree::default();
    assert_eq!(area(&cfg, &t, 0, 0x1000, false), Ok(BASE - 0x1000));
    assert_eq!(area(&cfg, &t, 0, 3 * MIB, false), Ok(BASE - 3 * MIB));
    let cfg = small();
    assert_eq!(area(&cfg, &t, 0, 0x5000, false), Ok(192 * MIB - 0x5000));
}

#[test]
fn top_down_takes_the_highest_gap_that_fits() {
    let p = phys();
    let cfg = small();
    // [188M, 192M) is used; below it a 2 MiB hole [186M, 188M) above [180M, 186M).
    let t = tree(&p, &[(188 * MIB, 192 * MIB, false), (180 * MIB, 186 * MIB, false)]);
    assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(187 * MIB), "the top of the highest hole");
    assert_eq!(area(&cfg, &t, 0, 2 * MIB, false), Ok(186 * MIB), "a hole exactly as long");
    assert_eq!(area(&cfg, &t, 0, 2 * MIB + 0x1000, false), Ok(180 * MIB - 2 * MIB - 0x1000));
    // A VMA above mmap_base does not matter to the top-down search.
    let t = tree(&p, &[(200 * MIB, 210 * MIB, false), (191 * MIB, 195 * MIB, false)]);
    assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(190 * MIB), "below the VMA straddling mmap_base");
}

#[test]
fn top_down_keeps_the_guard_gap_below_a_stack() {
    let p = phys();
    let cfg = small();
    // A growsdown stack at [190M, 192M) reserves [189M, 190M) as its guard gap (vm_start_gap).
    let t = tree(&p, &[(190 * MIB, 192 * MIB, true)]);
    assert_eq!(area(&cfg, &t, 0, 0x1000, false), Ok(189 * MIB - 0x1000));
    // A plain VMA there gets no gap.
    let t = tree(&p, &[(190 * MIB, 192 * MIB, false)]);
    assert_eq!(area(&cfg, &t, 0, 0x1000, false), Ok(190 * MIB - 0x1000));
}

#[test]
fn free_hint_is_honoured_even_above_mmap_base() {
    let p = phys();
    let cfg = small();
    let t = tree(&p, &[(100 * MIB, 110 * MIB, false)]);
    assert_eq!(area(&cfg, &t, 50 * MIB, MIB, false), Ok(50 * MIB));
    assert_eq!(area(&cfg, &t, 99 * MIB, MIB, false), Ok(99 * MIB), "ends exactly at the next VMA");
    assert_eq!(area(&cfg, &t, 110 * MIB, MIB, false), Ok(110 * MIB), "starts exactly at a VMA's end");
    assert_eq!(area(&cfg, &t, 200 * MIB, MIB, false), Ok(200 * MIB));
    assert_eq!(area(&cfg, &t, 255 * MIB, MIB, false), Ok(255 * MIB), "ends exactly at TASK_SIZE");
    // An unaligned hint is rounded down to its page.
    assert_eq!(area(&cfg, &t, 50 * MIB + 0x123, 0x1000, false), Ok(50 * MIB));
}

#[test]
fn occupied_or_impossible_hint_falls_back_to_top_down() {
    let p = phys();
    let cfg = small();
    let t = tree(&p, &[(100 * MIB, 110 * MIB, false), (150 * MIB, 160 * MIB, true)]);
    let top_down = Ok(192 * MIB - MIB);
    assert_eq!(area(&cfg, &t, 105 * MIB, MIB, false), top_down, "inside a VMA");
    assert_eq!(area(&cfg, &t, 99 * MIB + 0x1000, MIB, false), top_down, "overlaps the next VMA");
    // The stack at 150M keeps [149M, 150M) free as its guard gap.
    let page_top_down = Ok(192 * MIB - 0x1000);
    assert_eq!(area(&cfg, &t, 150 * MIB - 0x1000, 0x1000, false), page_top_down, "in a stack's guard gap");
    assert_eq!(area(&cfg, &t, 148 * MIB + 0x1000, MIB, false), top_down, "reaches into the guard gap");
    assert_eq!(area(&cfg, &t, 148 * MIB, MIB, false), Ok(148 * MIB), "ends where the guard gap starts");
    assert_eq!(area(&cfg, &t, 255 * MIB + 0x1000, MIB, false), top_down, "would cross TASK_SIZE");
}

#[test]
fn map_fixed_is_taken_as_is_over_existing_vmas() {
    let p = phys();
    let cfg = small();
    let t = tree(&p, &[(100 * MIB, 110 * MIB, false)]);
    // MAP_FIXED replaces whatever is there: no address checking.
    assert_eq!(area(&cfg, &t, 105 * MIB, MIB, true), Ok(105 * MIB));
    assert_eq!(area(&cfg, &t, 255 * MIB, MIB, true), Ok(255 * MIB));
    assert_eq!(area(&cfg, &t, 255 * MIB + 0x1000, MIB, true), Err(Errno::NoMem), "past TASK_SIZE");
    assert_eq!(area(&cfg, &t, 100 * MIB + 0x10, 0x1000, true), Err(Errno::Inval), "not page aligned");
    // A fixed 2 MiB anonymous mapping is not moved for THP alignment.
    let anon = get_unmapped_area(&cfg, &t, AreaKind::Anon, 101 * MIB, 2 * MIB, AreaFlags::fixed(true));
    assert_eq!(anon, Ok(101 * MIB));
}

#[test]
fn bottom_up_fallback_when_below_mmap_base_is_full() {
    let p = phys();
    let cfg = small();
    let t = tree(&p, &[(0x1_0000, 192 * MIB, false)]);
    // Linux retries bottom-up from TASK_UNMAPPED_BASE (TASK_SIZE / 3) when top-down fails.
    assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(192 * MIB));
    let t = tree(&p, &[(0x1_0000, 192 * MIB, false), (192 * MIB, 200 * MIB, true)]);
    assert_eq!(area(&cfg, &t, 0, MIB, false), Ok(200 * MIB), "the lowest free address above the base");
}

#[test]
fn enomem_when_nothing_fits() {
    let p = phys();
    let cfg = small();
    let full = tree(&p, &[(0x1_0000, 256 * MIB, false)]);
    assert_eq!(area(&cfg, &full, 0, 0x1000, false), Err(Errno::NoMem));
    assert_eq!(area(&cfg, &full, 50 * MIB, 0x1000, false), Err(Errno::NoMem), "occupied hint");
    assert_eq!(get_unmapped_area(&cfg, &full, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Err(Errno::NoMem));
    let t = VmaTree::default();
    assert_eq!(area(&cfg, &t, 0, 256 * MIB + 0x1000, false), Err(Errno::NoMem), "longer than TASK_SIZE");
    assert_eq!(area(&cfg, &t, 0, 256 * MIB, false), Err(Errno::NoMem), "longer than above mmap_min_addr");
    // Exactly the room between mmap_min_addr and mmap_base.
    assert_eq!(area(&cfg, &t, 0, 192 * MIB - 0x1_0000, false), Ok(0x1_0000));
    // One page more: neither top-down below mmap_base nor bottom-up from TASK_UNMAPPED_BASE
    // (TASK_SIZE / 3) has room, though the whole space would.
    assert_eq!(area(&cfg, &t, 0, 192 * MIB - 0x1_0000 + 0x1000, false), Err(Errno::NoMem));
    // Free space below mmap_min_addr is never used.
    let t = tree(&p, &[(0x2_0000, 256 * MIB, false)]);
    assert_eq!(area(&cfg, &t, 0, 0x1_0000, false), Ok(0x1_0000));
    assert_eq!(area(&cfg, &t, 0, 0x2_0000, false), Err(Errno::NoMem));
}

#[test]
fn anonymous_2mib_multiples_are_2mib_aligned_without_a_hint() {
    let cfg = MmConfig::default();
    let t = VmaTree::default();
    for len in [2 * MIB, 4 * MIB, 6 * MIB] {
        let a = get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, len, AreaFlags::fixed(false)).unwrap();
        assert_eq!(a % (2 * MIB), 0, "len {len:#x} at {a:#x}");
        // The highest aligned start that still ends below mmap_base.
        assert_eq!(a, (BASE - len) & !(2 * MIB - 1), "len {len:#x}");
    }
    // Neither other lengths, nor file/shared mappings, nor hinted ones, nor with THP alignment off.
    let unaligned = BASE - 2 * MIB;
    assert_ne!(unaligned % (2 * MIB), 0);
    assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 3 * MIB, AreaFlags::fixed(false)), Ok(BASE - 3 * MIB));
    assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Other, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(unaligned));
    let hint = 0x7000_0000_1000;
    assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, hint, 2 * MIB, AreaFlags::fixed(false)), Ok(hint));
    let off = MmConfig { thp_align: false, ..MmConfig::default() };
    assert_eq!(get_unmapped_area(&off, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(unaligned));
}

#[test]
fn hugetlb_hints_round_up_and_map_32bit_keeps_to_its_window() {
    let p = phys();
    let cfg = MmConfig::default();
    let huge = |t: &VmaTree, addr: u64, low32: bool| {
        get_unmapped_area(&cfg, t, AreaKind::Huge(2 * MIB), addr, 2 * MIB, AreaFlags { fixed: false, low32 })
    };
    let t = VmaTree::default();
    assert_eq!(huge(&t, 0x7000_0000_1000, false), Ok(0x7000_0020_0000), "rounded up");
    // A hint whose rounding wraps is no hint, as Linux's ALIGN: the
    // highest aligned room below mmap_base.
    assert_eq!(huge(&t, u64::MAX - 0xfff, false), Ok((BASE - 2 * MIB) & !(2 * MIB - 1)));
    assert_eq!(huge(&t, 0, true), Ok(1 << 30), "the window's bottom");
    // Padded to the next 2 MiB boundary above a small mapping; a 2 MiB
    // gap that is not aligned does not fit, and nothing is found outside.
    let t = tree(&p, &[((1 << 30), (1 << 30) + 0x1000, false)]);
    assert_eq!(huge(&t, 0, true), Ok((1 << 30) + 2 * MIB));
    let t = tree(&p, &[((1 << 30), (1 << 30) + 0x1000, false), ((1 << 30) + 2 * MIB + 0x1000, 2 << 30, false)]);
    assert_eq!(huge(&t, 0, true), Err(Errno::NoMem));
    let small = get_unmapped_area(&cfg, &t, AreaKind::Other, 0, 2 * MIB, AreaFlags { fixed: false, low32: true });
    assert_eq!(small, Ok((1 << 30) + 0x1000), "the same gap holds a small mapping");
}

#[test]
fn thp_alignment_of_an_aligned_gap_ends_at_its_top() {
    // With mmap_base 2 MiB aligned, the padded search returns an aligned address, which
    // __thp_get_unmapped_area moves up by 2 MiB so the mapping ends at mmap_base.
    let cfg = small();
    let t = VmaTree::default();
    assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(190 * MIB));
    assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 4 * MIB, AreaFlags::fixed(false)), Ok(188 * MIB));
}

const GIB: u64 = 1 << 30;

/// The default layout under arena placement.
fn arenas() -> MmConfig {
    MmConfig { placement: PlacementPolicy::Arenas, ..MmConfig::default() }
}

/// Every search of the calling thread under `cfg`, against Linux's on the same tree.
fn both(
    cfg: &MmConfig,
    t: &VmaTree,
    kind: AreaKind,
    addr: u64,
    len: u64,
    flags: AreaFlags,
) -> (Result<u64>, Result<u64>) {
    let linux = MmConfig { placement: PlacementPolicy::Linux, ..cfg.clone() };
    (get_unmapped_area(cfg, t, kind, addr, len, flags), get_unmapped_area(&linux, t, kind, addr, len, flags))
}

#[test]
fn arenas_are_aligned_gib_slices_below_mmap_base_counted_down() {
    let cfg = MmConfig::default();
    let high = cfg.mmap_base & !(GIB - 1);
    assert_eq!(arena(&cfg, 0), Some((high - GIB, high)));
    assert_eq!(arena(&cfg, 5), Some((high - 6 * GIB, high - 5 * GIB)));
    let n = ((high - GIB) / GIB) as usize; // the lowest slice starts at 1 GiB (mmap_min_addr rounded up)
    assert_eq!(arena(&cfg, n - 1), Some((GIB, 2 * GIB)));
    assert_eq!(arena(&cfg, n), arena(&cfg, 0), "slots wrap around");
    // No whole aligned slice between mmap_min_addr and mmap_base: no arena.
    assert_eq!(arena(&small(), 0), None);
    let two = MmConfig { task_size: 4 * GIB, mmap_base: 3 * GIB + 0x5000, ..MmConfig::default() };
    assert_eq!(arena(&two, 0), Some((2 * GIB, 3 * GIB)));
    assert_eq!(arena(&two, 1), Some((GIB, 2 * GIB)));
    assert_eq!(arena(&two, 2), Some((2 * GIB, 3 * GIB)));
}

#[test]
fn a_thread_keeps_its_slot_and_threads_alive_together_hold_different_ones() {
    let mine = thread_slot().unwrap();
    assert_eq!(thread_slot(), Some(mine));
    let barrier = std::sync::Barrier::new(4);
    let slots: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let slot = thread_slot().unwrap();
                    barrier.wait(); // all four alive at once
                    slot
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = slots.clone();
    all.push(mine);
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 5, "{slots:?} and {mine}");
}

#[test]
fn arenas_search_the_thread_arena_top_down_first() {
    let p = phys();
    let cfg = arenas();
    let (bottom, top) = arena(&cfg, thread_slot().unwrap()).unwrap();
    let t = VmaTree::default();
    let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x3000, AreaFlags::default());
    assert_eq!(a, Ok(top - 0x3000));
    // THP alignment and hugetlb alignment inside the arena.
    let (a, _) = both(&cfg, &t, AreaKind::Anon, 0, 4 * MIB, AreaFlags::default());
    assert_eq!(a, Ok(top - 4 * MIB));
    let (a, _) = both(&cfg, &t, AreaKind::Huge(2 * MIB), 0, 2 * MIB, AreaFlags::default());
    assert_eq!(a, Ok(top - 2 * MIB));
    // A stack above the arena keeps its guard gap, which reaches into it.
    let t = tree(&p, &[(top, top + MIB, true)]);
    let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x1000, AreaFlags::default());
    assert_eq!(a, Ok(top - cfg.stack_guard_gap - 0x1000));
    // A stack inside the arena too.
    let t = tree(&p, &[(top - MIB, top, true)]);
    let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x1000, AreaFlags::default());
    assert_eq!(a, Ok(top - MIB - cfg.stack_guard_gap - 0x1000));
    // Room only at the arena's bottom.
    let t = tree(&p, &[(bottom + 0x2000, top, false)]);
    let (a, _) = both(&cfg, &t, AreaKind::Other, 0, 0x2000, AreaFlags::default());
    assert_eq!(a, Ok(bottom));
}

#[test]
fn arenas_change_nothing_but_where_the_search_starts() {
    let p = phys();
    let cfg = arenas();
    let (bottom, top) = arena(&cfg, thread_slot().unwrap()).unwrap();
    let no = AreaFlags::default();
    let cases: Vec<(VmaTree, AreaKind, u64, u64, AreaFlags)> = vec![
        // A full arena: Linux's search, whatever it finds.
        (tree(&p, &[(bottom, top, false)]), AreaKind::Other, 0, 0x1000, no),
        (tree(&p, &[(bottom + 0x1000, top, false)]), AreaKind::Other, 0, 0x2000, no),
        (tree(&p, &[(bottom, top, false)]), AreaKind::Anon, 0, 2 * MIB, no),
        // Longer than an arena.
        (VmaTree::default(), AreaKind::Other, 0, GIB + 0x1000, no),
        // A free hint, an occupied one, MAP_FIXED, MAP_32BIT.
        (VmaTree::default(), AreaKind::Other, 0x1234_5000, 0x1000, no),
        (tree(&p, &[(bottom, top, false)]), AreaKind::Other, bottom, 0x1000, no),
        (VmaTree::default(), AreaKind::Other, 0x1234_5000, 0x1000, AreaFlags::fixed(true)),
        (VmaTree::default(), AreaKind::Other, 0, 0x1000, AreaFlags { fixed: false, low32: true }),
        (VmaTree::default(), AreaKind::Huge(2 * MIB), 0, 2 * MIB, AreaFlags { fixed: false, low32: true }),
        // Nothing fits anywhere.
        (tree(&p, &[(0x1000, crate::mm::TASK_SIZE, false)]), AreaKind::Other, 0, 0x1000, no),
        (VmaTree::default(), AreaKind::Other, 0, crate::mm::TASK_SIZE, no),
    ];
    for (i, (t, kind, addr, len, flags)) in cases.iter().enumerate() {
        let (a, linux) = both(&cfg, t, *kind, *addr, *len, *flags);
        assert_eq!(a, linux, "case {i}");
    }
    // An occupied hint: the arena, where Linux goes below mmap_base.
    let t = tree(&p, &[(0x1234_5000, 0x1234_6000, false)]);
    let (a, linux) = both(&cfg, &t, AreaKind::Other, 0x1234_5000, 0x1000, no);
    assert_eq!((a, linux), (Ok(top - 0x1000), Ok(cfg.mmap_base - 0x1000)));
}

#[test]
fn thp_alignment_falls_back_to_an_exact_fit() {
    let p = phys();
    let cfg = small();
    // The only room below mmap_base is an aligned 2 MiB hole [100M, 102M): no room for the
    // padding, so Linux retries without it and the mapping fills the hole.
    let t = tree(&p, &[(0x1_0000, 100 * MIB, false), (102 * MIB, 256 * MIB, false)]);
    assert_eq!(get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)), Ok(100 * MIB));
    // An unaligned 2 MiB hole still fits the mapping, unaligned.
    let t = tree(&p, &[(0x1_0000, 100 * MIB + 0x1000, false), (102 * MIB + 0x1000, 256 * MIB, false)]);
    assert_eq!(
        get_unmapped_area(&cfg, &t, AreaKind::Anon, 0, 2 * MIB, AreaFlags::fixed(false)),
        Ok(100 * MIB + 0x1000)
    );
}

/// Skipping reserved ranges in place finds the address the search of a
/// copy of the tree with a stand-in VMA per range (the old
/// `AddressSpace::placement_view`, now gone) found, for every kind of search: top-down with
/// and without THP alignment, hints, hugetlb, `MAP_32BIT`'s bottom-up
/// window and the bottom-up fallback.
#[test]
#[cfg_attr(miri, ignore = "safe placement arithmetic, 1,500 searches of each kind: most of a minute under Miri")]
fn skipping_reserved_ranges_in_place_finds_what_stand_ins_found() {
    let p = phys();
    let cfg = small();
    let vmas = [(188 * MIB, 190 * MIB, false), (150 * MIB, 170 * MIB, false), (60 * MIB, 61 * MIB, false)];
    let reserved_sets: [&[(u64, u64)]; 5] = [
        &[],
        &[(186 * MIB, 188 * MIB)],
        &[(190 * MIB, 191 * MIB), (180 * MIB, 186 * MIB)],
        &[(171 * MIB, 172 * MIB), (176 * MIB, 187 * MIB), (140 * MIB, 149 * MIB)],
        &[(62 * MIB, 150 * MIB), (170 * MIB, 188 * MIB), (1024 * MIB + 4096, 1100 * MIB)],
    ];
    let big = MmConfig { task_size: 4096 * MIB, mmap_base: 192 * MIB, ..small() };
    for reserved in reserved_sets {
        let t = tree(&p, &vmas);
        let mut stand_ins = t.clone();
        for &(start, end) in reserved {
            stand_ins.insert(Vma::new(&p, start, end, VmFlags::empty(), 0, None, None));
        }
        let res: Vec<_> = reserved.iter().map(|&(s, e)| crate::mm::unmap::Reservation::for_test(s, e)).collect();
        let obstacles = Obstacles { vmas: &t, reserved: &res };
        for cfg in [&cfg, &big] {
            for len in [PAGE_SIZE, 2 * MIB, 3 * MIB, 10 * MIB, 40 * MIB] {
                for hint in [0, 100 * MIB, 185 * MIB, 187 * MIB, 1030 * MIB] {
                    for kind in [AreaKind::Anon, AreaKind::Other, AreaKind::Huge(2 * MIB)] {
                        for low32 in [false, true] {
                            let flags = AreaFlags { fixed: false, low32 };
                            let want = get_unmapped_area(cfg, &stand_ins, kind, hint, len, flags);
                            let got = get_unmapped_area_avoiding(cfg, obstacles, kind, hint, len, flags);
                            assert_eq!(
                                got, want,
                                "reserved {reserved:x?}, len {len:#x}, hint {hint:#x}, {kind:?}, low32 {low32}"
                            );
                        }
                    }
                }
            }
        }
    }
}
