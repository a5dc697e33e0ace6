//! hugetlb (seed 000's foundation): the huge page pool and its `/proc/meminfo`
//! counts, `MAP_HUGETLB` mappings with Linux's reservations, the alignment
//! rules and errnos of the mapping calls on hugetlb VMAs, 2 MiB faults (one
//! PMD leaf, one TLB entry for all 512 frames), private COW and fork.
//! The differential half, against the host kernel, is `hugetlb_host.rs`.

use softmm_testkit::common;

use std::sync::Arc;

use common::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, FaultPolicy, MmConfig, PhysConfig, PhysMem};

const HP: u64 = 2 << 20;
const SHARED_HUGE: i32 = MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB;
const PRIVATE_HUGE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;

/// An arena with `huge` 2 MiB pages in its pool and 8 MiB of small frames.
fn pool(huge: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new((8 << 20) + huge * HP + HP).hugepages(huge)).expect("arena")
}

/// `(free, rsvd)` of the pool.
fn counts(phys: &PhysMem) -> (u64, u64) {
    let s = phys.huge_page_stats();
    (s.free, s.rsvd)
}

fn mm(phys: &Arc<PhysMem>) -> Arc<AddressSpace> {
    mm_with(phys, FaultPolicy::default())
}

#[test]
fn the_pool_shows_in_meminfo_counts_and_costs_no_small_frames() {
    let phys = pool(3);
    let s = phys.huge_page_stats();
    assert_eq!((s.total, s.free, s.rsvd, s.surp), (3, 3, 0, 0));
    assert_eq!(phys.stats().frames_used, 0);
    let none = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    assert_eq!(none.huge_page_stats().total, 0, "no pool unless asked for");
    // Two nodes: the count is per node.
    let two = PhysMem::new(PhysConfig::new(24 << 20).nodes(2).hugepages(2)).unwrap();
    assert_eq!(two.huge_page_stats().total, 4);
    assert_eq!(PhysMem::new(PhysConfig::new(4 << 20).hugepages(2)).err(), Some(Errno::Inval));
}

#[test]
fn a_shared_mapping_reserves_at_mmap_and_a_fault_consumes_its_reservation() {
    let phys = pool(4);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, SHARED_HUGE, None, 0).unwrap();
    assert_eq!(a % HP, 0, "hugetlb_get_unmapped_area aligns");
    assert_eq!(counts(&phys), (4, 2), "reserved, not allocated");
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 8, 7).unwrap();
    assert_eq!(counts(&phys), (3, 1), "the fault consumed one reservation");
    assert_eq!(mm.stats().hugetlb_faults, 1);
    // Every 4 KiB of the page is the same page: no more faults.
    cpu.write_u64(a + HP - 8, 9).unwrap();
    assert_eq!(cpu.read_u64(a + 8).unwrap(), 7);
    assert_eq!(mm.stats().hugetlb_faults, 1);
    assert_eq!(mm.stats().hugetlb_pages, 512);
    assert_eq!(mm.stats().rss_pages, 0, "hugetlb pages are not RSS");
    drop(cpu);
    mm.munmap(a, 2 * HP).unwrap();
    drop(mm);
    // The pseudo-file goes with the last VMA, after its grace period.
    phys.quiesce();
    assert_eq!(counts(&phys), (4, 0));
    assert_no_leaks(&phys);
}

#[test]
fn a_mapping_the_pool_cannot_cover_is_enomem_and_changes_nothing() {
    let phys = pool(2);
    let mm = mm(&phys);
    let before = mm.maps_text();
    assert_eq!(mm.mmap(0, 3 * HP, RW, SHARED_HUGE, None, 0), Err(Errno::NoMem));
    assert_eq!(mm.mmap(0, 3 * HP, RW, PRIVATE_HUGE, None, 0), Err(Errno::NoMem));
    // A read-only private mapping reserves too (mprotect could make it writable).
    assert_eq!(mm.mmap(0, 3 * HP, PROT_READ, PRIVATE_HUGE, None, 0), Err(Errno::NoMem));
    assert_eq!(mm.maps_text(), before);
    assert_eq!(counts(&phys), (2, 0));
    // Two mappings of two pages each do not both fit.
    let a = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    assert_eq!(mm.mmap(0, HP, RW, SHARED_HUGE, None, 0), Err(Errno::NoMem));
    mm.munmap(a, 2 * HP).unwrap();
    assert_eq!(counts(&phys), (2, 0), "a private mapping gives its reservations back at munmap");
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn noreserve_defers_to_the_fault_where_an_empty_pool_is_sigbus() {
    let phys = pool(1);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, SHARED_HUGE | MAP_NORESERVE, None, 0).unwrap();
    assert_eq!(counts(&phys), (1, 0), "nothing reserved");
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(a, 1).unwrap();
    assert_eq!(cpu.write_u8(a + HP + 5, 1), Err(Fault::Bus { addr: a + HP + 5 }));
    // Refused once, or twice where a lock-free fault policy's attempt
    // ended in the signal and its `mmap_lock` fallback asked again.
    assert!((1..=2).contains(&phys.huge_page_stats().alloc_failures));
    // Private, too.
    let p = mm.mmap(0, HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
    assert_eq!(cpu.read_u8(p), Err(Fault::Bus { addr: p }), "no zero page for hugetlb");
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn a_private_mapping_reserves_for_its_own_pages_and_a_partial_munmap_returns_its_part() {
    let phys = pool(4);
    let mm = mm(&phys);
    let a = mm.mmap(0, 4 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    assert_eq!(counts(&phys), (4, 4));
    let mut cpu = Cpu::attached(&mm);
    // A read allocates too: hugetlb has no zero page.
    assert_eq!(cpu.read_u64(a).unwrap(), 0);
    cpu.write_u64(a + HP, 5).unwrap();
    assert_eq!(counts(&phys), (2, 2));
    drop(cpu);
    // Unmap a touched and an untouched page: one page and one reservation back.
    mm.munmap(a + HP, 2 * HP).unwrap();
    assert_eq!(counts(&phys), (3, 1));
    mm.munmap(a, 4 * HP).unwrap();
    assert_eq!(counts(&phys), (4, 0));
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn exit_gives_back_pages_and_reservations() {
    let phys = pool(4);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let b = mm.mmap(0, 2 * HP, RW, SHARED_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(a, 1).unwrap();
    cpu.write_u8(b, 1).unwrap();
    drop(cpu);
    assert_eq!(counts(&phys), (2, 2));
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn lengths_round_up_and_fixed_addresses_must_be_aligned() {
    let phys = pool(2);
    let mm = mm(&phys);
    let a = mm.mmap(0, 4096, RW, SHARED_HUGE, None, 0).unwrap();
    assert_eq!(mm.maps()[0].end - mm.maps()[0].start, HP, "rounded up to a huge page");
    mm.munmap(a, HP).unwrap();
    assert_eq!(mm.mmap(a + 4096, HP, RW, SHARED_HUGE | MAP_FIXED, None, 0), Err(Errno::Inval));
    assert_eq!(mm.mmap(0, HP, RW, PRIVATE_HUGE | (22 << 26), None, 0), Err(Errno::Inval), "MAP_HUGE_4MB");
    assert_eq!(mm.mmap(0, HP, RW, PRIVATE_HUGE | (30 << 26), None, 0), Err(Errno::NoMem), "no 1 GiB pool");
    // A hint is rounded up to the huge page size (hugetlb_get_unmapped_area's
    // ALIGN, Linux 6.13+; 6.12's x86 function rounded it down).
    let hint = 0x7000_0000_0000 + 4096;
    assert_eq!(mm.mmap(hint, HP, RW, SHARED_HUGE, None, 0), Ok(hint - 4096 + HP));
    drop(mm);
    assert_no_leaks(&phys);
}

/// An anonymous `MAP_HUGETLB` mapping at a file offset maps its
/// pseudo-file (`len` bytes) from there: `hugetlbfs_file_mmap` grows the
/// file to `offset + len` for a writable mapping, so its pages fault in; a
/// read-only one reads past the end (`SIGBUS`).
#[test]
fn an_anonymous_mapping_at_an_offset_grows_its_pseudo_file_when_writable() {
    let phys = pool(2);
    let mm = mm(&phys);
    let mut cpu = Cpu::attached(&mm);
    for flags in [PRIVATE_HUGE, SHARED_HUGE] {
        let a = mm.mmap(0, HP, RW, flags, None, HP).unwrap();
        assert_eq!(mm.maps().iter().find(|e| e.start == a).map(|e| e.offset), Some(HP), "{flags:#x}");
        cpu.write_u64(a + 8, 1).unwrap();
        assert_eq!(cpu.read_u64(a + 8).unwrap(), 1);
        let r = mm.mmap(0, HP, PROT_READ, flags, None, HP).unwrap();
        assert_eq!(cpu.read_u8(r), Err(Fault::Bus { addr: r }), "{flags:#x}");
        mm.munmap(a, HP).unwrap();
        mm.munmap(r, HP).unwrap();
    }
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

/// Where `MAP_32BIT` puts mappings: `[1 GiB, 2 GiB)` (x86-64's
/// `find_start_end`, without the host's randomized start).
const LOW32: u64 = 1 << 30;

/// `MAP_HUGETLB | MAP_32BIT`: since Linux 6.13 hugetlb placement is the
/// arch's search with the huge page size as alignment, so `MAP_32BIT` puts
/// the mapping bottom-up in `[1 GiB, 2 GiB)`, padded to a 2 MiB boundary,
/// and where no aligned room is left there the call is `ENOMEM` (no search
/// outside the window). A hint, rounded up to 2 MiB, is taken where it is
/// free below 2 GiB.
#[test]
fn map_32bit_places_a_hugetlb_mapping_aligned_in_the_low_window() {
    let phys = pool(2);
    let mm = mm(&phys);
    let flags = PRIVATE_HUGE | MAP_NORESERVE | MAP_32BIT;
    // A small mapping takes the window's first page; the huge one the next
    // 2 MiB boundary.
    assert_eq!(mm.mmap(0, PAGE, RW, ANON | MAP_32BIT, None, 0), Ok(LOW32));
    assert_eq!(mm.mmap(0, HP, RW, flags, None, 0), Ok(LOW32 + HP));
    // A hint below the window, unaligned: rounded up and taken.
    assert_eq!(mm.mmap(0x1000_0000 + PAGE, HP, RW, flags, None, 0), Ok(0x1000_0000 + HP));
    // The rest of the window full but for an unaligned 2 MiB hole: no room
    // for the huge mapping, room for a small one of the same length.
    let rest = LOW32 + 2 * HP;
    let none = ANON | MAP_FIXED | MAP_NORESERVE;
    assert_eq!(mm.mmap(rest, 2 * LOW32 - rest, PROT_NONE, none, None, 0), Ok(rest));
    let hole = LOW32 + (64 << 20) + PAGE;
    mm.munmap(hole, HP).unwrap();
    assert_eq!(mm.mmap(0, HP, RW, flags, None, 0), Err(Errno::NoMem));
    assert_eq!(mm.mmap(0, HP, RW, ANON | MAP_32BIT, None, 0), Ok(hole));
    // A hint above the window is not taken: the window is full.
    assert_eq!(mm.mmap(3 << 30, HP, RW, flags, None, 0), Err(Errno::NoMem));
    assert!(mm.maps().iter().all(|e| e.end <= 2 * LOW32), "nothing outside the window");
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn munmap_mprotect_and_madvise_split_only_at_huge_boundaries() {
    let phys = pool(2);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, SHARED_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 4096, 0x55).unwrap();
    let maps = mm.maps_text();
    assert_eq!(mm.munmap(a, 4096), Err(Errno::Inval));
    assert_eq!(mm.munmap(a + 4096, HP), Err(Errno::Inval));
    assert_eq!(mm.munmap(a + HP, 1), Err(Errno::Inval), "the end splits inside the second page");
    assert_eq!(mm.munmap(a, HP + 4096), Err(Errno::Inval));
    assert_eq!(mm.mprotect(a, 4096, PROT_READ), Err(Errno::Inval));
    assert_eq!(mm.mprotect(a + HP, 4096, PROT_READ), Err(Errno::Inval));
    assert_eq!(mm.madvise(a, 4096, MADV_DONTFORK), Err(Errno::Inval));
    assert_eq!(mm.madvise(a + 4096, HP, MADV_DONTNEED), Err(Errno::Inval), "unaligned start");
    assert_eq!(mm.madvise(a, HP, MADV_FREE), Err(Errno::Inval));
    assert_eq!(mm.maps_text(), maps, "nothing changed");
    // The end of MADV_DONTNEED is rounded down: a 4 KiB advice drops nothing.
    mm.madvise(a, 4096, MADV_DONTNEED).unwrap();
    assert_eq!(cpu.read_u64(a + 4096).unwrap(), 0x55);
    // Splitting at 2 MiB works.
    mm.mprotect(a + HP, HP, PROT_READ).unwrap();
    assert_eq!(mm.maps().len(), 2);
    assert_eq!(cpu.write_u8(a + HP, 1), Err(Fault::Segv { addr: a + HP, code: softmm::SegvCode::AccErr }));
    // The end of a munmap past the VMA needs no split; inside the next
    // hugetlb VMA it does.
    let b = mm.mmap(a - HP, HP, RW, PRIVATE_HUGE | MAP_NORESERVE | MAP_FIXED, None, 0).unwrap();
    assert_eq!(mm.munmap(b, HP + 4096), Err(Errno::Inval), "splits the VMA at `a`");
    let c = mm.mmap(0x5000_0000_0000, HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
    mm.munmap(c, HP + 4096).unwrap();
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn mremap_rounds_lengths_refuses_growth_and_moves_whole_pages() {
    let phys = pool(2);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + HP + 64, 0xabc).unwrap();
    assert_eq!(mm.mremap(a, 2 * HP, 3 * HP, MREMAP_MAYMOVE, 0), Err(Errno::Inval), "no expansion");
    assert_eq!(mm.mremap(a + 4096, HP, HP, 0, 0), Err(Errno::Inval));
    let far = 0x6000_0000_0000;
    assert_eq!(mm.mremap(a, 2 * HP, 2 * HP, MREMAP_MAYMOVE | MREMAP_FIXED, far + 4096), Err(Errno::Inval));
    // Rounded up: old_len 1 byte is one huge page; a shrink of 2 pages to 1.
    assert_eq!(mm.mremap(a, 2 * HP, 1, 0, 0), Ok(a));
    assert_eq!(counts(&phys), (2, 1), "the tail's reservation went with it");
    let b = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
    cpu.write_u64(b + HP + 8, 0xdef).unwrap();
    let moved = mm.mremap(b, 2 * HP, 2 * HP, MREMAP_MAYMOVE | MREMAP_FIXED, far).unwrap();
    assert_eq!(moved, far);
    assert_eq!(cpu.read_u64(far + HP + 8).unwrap(), 0xdef, "the PMD leaf moved");
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn maps_names_an_anonymous_hugetlb_mapping_as_linux_does() {
    let phys = pool(2);
    let mm = mm(&phys);
    mm.mmap(0, HP, RW, SHARED_HUGE, None, 0).unwrap();
    mm.mmap(0, HP, PROT_READ, PRIVATE_HUGE, None, 0).unwrap();
    let lines: Vec<String> = mm.maps().iter().map(|e| e.to_line()).collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].contains(" r--p 00000000 ") && lines[0].ends_with("/anon_hugepage (deleted)"), "{lines:?}");
    assert!(lines[1].contains(" rw-s 00000000 ") && lines[1].ends_with("/anon_hugepage (deleted)"), "{lines:?}");
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn one_tlb_entry_serves_all_512_frames_of_a_huge_page() {
    let phys = pool(1);
    let mm = mm(&phys);
    let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    let misses = cpu.stats().tlb_misses;
    for i in 0..512 {
        cpu.write_u64(a + i * 4096 + 16, i).unwrap();
    }
    assert_eq!(cpu.stats().tlb_misses, misses, "every 4 KiB hit the 2 MiB entry");
    for i in 0..512 {
        assert_eq!(cpu.read_u64(a + i * 4096 + 16).unwrap(), i);
    }
    let mut v = vec![0u8; 512];
    mm.mincore(a, HP, &mut v).unwrap();
    assert!(v.iter().all(|&b| b == 1));
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn private_pages_copy_on_write_at_2_mib_across_fork() {
    let phys = pool(4);
    let parent = mm(&phys);
    let a = parent.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut pc = Cpu::attached(&parent);
    pc.write_u64(a + 4096, u64::from(b'P')).unwrap();
    let child = parent.fork().unwrap();
    let mut cc = Cpu::attached(&child);
    assert_eq!(cc.read_u64(a + 4096).unwrap(), u64::from(b'P'), "the child's tables were copied");
    assert_eq!(child.stats().hugetlb_faults, 0);
    cc.write_u64(a + 4096, u64::from(b'C')).unwrap();
    assert_eq!(pc.read_u64(a + 4096).unwrap(), u64::from(b'P'));
    assert_eq!(cc.read_u64(a + 4096).unwrap(), u64::from(b'C'));
    assert_eq!(child.stats().hugetlb_faults, 1, "one COW of 2 MiB");
    // The parent's page is its own again: written in place.
    pc.write_u64(a + 8, 3).unwrap();
    assert_eq!(phys.huge_page_stats().free, 2);
    drop((pc, cc));
    drop(child);
    drop(parent);
    assert_no_leaks(&phys);
}

/// `unmap_ref_private`: the owner of a private mapping's reservations that
/// writes a page shared with its children, with the pool empty, takes the
/// page from the children instead of failing; a child's next fault in that
/// mapping needing a page is `SIGBUS`, wherever it is in the VMA.
#[test]
fn an_owner_cow_with_an_empty_pool_takes_the_page_and_the_children_get_sigbus() {
    let phys = pool(2);
    let parent = mm(&phys);
    let a = parent.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut pc = Cpu::attached(&parent);
    pc.write_u64(a, 1).unwrap();
    pc.write_u64(a + HP, 2).unwrap();
    assert_eq!(counts(&phys), (0, 0), "both pages taken, both reservations used");
    let child = parent.fork().unwrap();
    let mut cc = Cpu::attached(&child);
    assert_eq!(cc.read_u64(a).unwrap(), 1);
    // A second mapping in the child, not shared with the parent, is not
    // touched by what follows.
    let other = child.mmap(0, HP, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
    cc.write_u64(other, 9).unwrap();
    // The parent's COW finds no page: it takes page 0 back and writes it.
    pc.write_u64(a, 3).unwrap();
    assert_eq!(pc.read_u64(a).unwrap(), 3);
    assert_eq!(counts(&phys), (0, 0), "no page was allocated");
    // The child lost page 0 (SIGBUS, not the parent's new data nor a zeroed
    // page), and, as Linux marks the whole VMA, page 1 after it goes too.
    assert_eq!(cc.read_u64(a), Err(Fault::Bus { addr: a }));
    assert_eq!(cc.read_u64(a + HP).unwrap(), 2, "page 1 is still mapped in the child");
    child.madvise(a + HP, HP, MADV_DONTNEED).unwrap();
    parent.munmap(a + HP, HP).unwrap();
    assert_eq!(counts(&phys), (1, 0), "page 1 is free again");
    assert_eq!(cc.read_u64(a + HP), Err(Fault::Bus { addr: a + HP }), "marked, even with a page free");
    assert_eq!(cc.read_u64(other).unwrap(), 9);
    // A child forked now starts without the mark.
    let grandchild = child.fork().unwrap();
    assert_eq!(Cpu::attached(&grandchild).read_u64(a + HP).unwrap(), 0, "a fresh page");
    drop((pc, cc));
    drop((grandchild, child, parent));
    assert_no_leaks(&phys);
}

#[test]
fn a_shared_mapping_is_not_copied_at_fork_and_the_child_faults_it_in() {
    let phys = pool(2);
    let parent = mm(&phys);
    let a = parent.mmap(0, 2 * HP, RW, SHARED_HUGE, None, 0).unwrap();
    let mut pc = Cpu::attached(&parent);
    pc.write_u64(a, 11).unwrap();
    let child = parent.fork().unwrap();
    let mut cc = Cpu::attached(&child);
    assert_eq!(child.stats().hugetlb_pages, 0, "no page tables copied");
    assert_eq!(cc.read_u64(a).unwrap(), 11);
    assert_eq!(child.stats().hugetlb_faults, 1);
    cc.write_u64(a + HP, 22).unwrap();
    assert_eq!(pc.read_u64(a + HP).unwrap(), 22, "one shared page cache");
    assert_eq!(counts(&phys), (0, 0));
    drop((pc, cc));
    drop(parent);
    drop(child);
    assert_no_leaks(&phys);
}

#[test]
fn prot_none_hides_a_huge_page_and_keeps_it() {
    let phys = pool(1);
    let mm = mm(&phys);
    let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 100 * 4096, 77).unwrap();
    mm.mprotect(a, HP, PROT_NONE).unwrap();
    assert!(matches!(cpu.read_u64(a), Err(Fault::Segv { .. })));
    mm.mprotect(a, HP, RW).unwrap();
    assert_eq!(cpu.read_u64(a + 100 * 4096).unwrap(), 77);
    drop(cpu);
    mm.munmap(a, HP).unwrap();
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn every_fault_policy_resolves_hugetlb_faults() {
    for policy in FaultPolicy::ALL.iter().copied() {
        let phys = pool(1);
        let mm = AddressSpace::new(&phys, MmConfig::default().policy(policy).force_speculative(true)).unwrap();
        let a = mm.mmap(0, HP, RW, SHARED_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a + 3 * 4096, 1).unwrap();
        assert_eq!(cpu.read_u64(a + 3 * 4096).unwrap(), 1, "{policy:?}");
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

mod hugetlbfs {
    use super::*;
    use softmm::{File, OpenFile};

    const ZERO_RANGE: i32 = 0x10;

    #[test]
    fn sizes_are_huge_aligned_and_write_does_not_exist() {
        let phys = pool(2);
        assert_eq!(File::create_hugetlbfs(&phys, "/hp", 4096).err(), Some(Errno::Inval));
        let f = File::create_hugetlbfs(&phys, "/hp", HP).unwrap();
        assert!(f.is_hugetlbfs());
        assert_eq!(f.write_at(0, b"x"), Err(Errno::Inval));
        assert_eq!(f.set_len(HP + 4096), Err(Errno::Inval));
        assert_eq!(f.fallocate(ZERO_RANGE, 0, HP), Err(Errno::OpNotSupp));
        assert_eq!(f.fallocate(FALLOC_FL_PUNCH_HOLE, 0, HP), Err(Errno::OpNotSupp), "punch needs KEEP_SIZE");
        assert_eq!(f.fallocate(0, 0, 0), Err(Errno::Inval));
        let mut b = [1u8; 8];
        assert_eq!(f.read_at(HP - 4, &mut b), Ok(4), "a hole reads zeros up to the size");
        assert_eq!(&b[..4], &[0; 4]);
        // A tmpfs file is not hugetlbfs: MAP_HUGETLB with it is EINVAL.
        let mm = mm(&phys);
        let t = File::create(&phys, "/t", 4096).unwrap();
        assert_eq!(
            mm.mmap(0, 4096, RW, MAP_SHARED | MAP_HUGETLB, Some(&OpenFile::read_write(&t)), 0),
            Err(Errno::Inval)
        );
        drop((f, t, mm));
        assert_no_leaks(&phys);
    }

    #[test]
    fn fallocate_takes_pages_until_the_pool_is_empty_then_enospc() {
        let phys = pool(2);
        let f = File::create_hugetlbfs(&phys, "/hp", 0).unwrap();
        f.fallocate(FALLOC_FL_KEEP_SIZE, 0, 1).unwrap();
        assert_eq!((f.len(), f.cached_pages()), (0, 1), "KEEP_SIZE keeps the size");
        assert_eq!(f.fallocate(0, HP - 1, 2 * HP), Err(Errno::NoSpc), "three pages, two in the pool");
        assert_eq!(f.cached_pages(), 2, "what was allocated stays");
        assert_eq!(counts(&phys), (0, 0));
        f.fallocate(0, 100, HP).unwrap();
        assert_eq!(f.len(), HP + 100, "the size becomes offset + len");
        drop(f);
        assert_no_leaks(&phys);
    }

    #[test]
    fn shared_mappings_of_one_file_reserve_once_and_see_one_page_cache() {
        let phys = pool(3);
        let f = File::create_hugetlbfs(&phys, "/db", 2 * HP).unwrap();
        let open = OpenFile::read_write(&f);
        let (m1, m2) = (mm(&phys), mm(&phys));
        assert_eq!(m1.mmap(0, 4 * HP, RW, MAP_SHARED, Some(&open), 0), Err(Errno::NoMem), "beyond the pool");
        assert_eq!(m1.mmap(0, HP, RW, MAP_SHARED, Some(&open), 4096), Err(Errno::Inval), "unaligned offset");
        let a = m1.mmap(0, 4096, RW, MAP_SHARED, Some(&open), 0).unwrap();
        assert_eq!(m1.maps()[0].end - a, HP, "rounded up");
        let b = m2.mmap(0, 2 * HP, RW, MAP_SHARED, Some(&open), 0).unwrap();
        assert_eq!(counts(&phys), (3, 2), "index 0 is reserved once for both");
        let (mut c1, mut c2) = (Cpu::attached(&m1), Cpu::attached(&m2));
        c1.write_u64(a + 4096, 0x1234).unwrap();
        assert_eq!(c2.read_u64(b + 4096).unwrap(), 0x1234);
        let mut v = [0u8; 8];
        f.read_at(4096, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), 0x1234);
        assert_eq!(counts(&phys), (2, 1));
        assert!(m1.maps_text().contains("/db"));
        drop((c1, c2));
        drop((m1, m2));
        drop(open);
        phys.quiesce();
        assert_eq!(counts(&phys), (2, 1), "the file keeps its page and its reservation");
        drop(f);
        assert_no_leaks(&phys);
    }

    #[test]
    fn a_hole_punch_zeroes_partial_pages_and_frees_whole_ones() {
        let phys = pool(2);
        let f = File::create_hugetlbfs(&phys, "/hp", 2 * HP).unwrap();
        let m = mm(&phys);
        let open = OpenFile::read_write(&f);
        let a = m.mmap(0, 2 * HP, RW, MAP_SHARED, Some(&open), 0).unwrap();
        let mut cpu = Cpu::attached(&m);
        for off in (96..208).step_by(8).chain([HP + 8]) {
            cpu.write_u64(a + off, u64::MAX).unwrap();
        }
        f.fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 100).unwrap();
        assert_eq!(cpu.read_u64(a + 96).unwrap(), 0xffff_ffff, "bytes 96..100 stay");
        assert_eq!(cpu.read_u64(a + 192).unwrap(), 0, "bytes 100..200 are zero");
        assert_eq!(cpu.read_u64(a + 200).unwrap(), u64::MAX, "200 is past the hole");
        let mut b = [9u8; 100];
        f.read_at(100, &mut b).unwrap();
        assert_eq!(b, [0u8; 100]);
        let free = counts(&phys).0;
        f.punch_hole(HP, HP).unwrap();
        assert_eq!(counts(&phys).0, free + 1, "the whole page went back to the pool");
        assert_eq!(cpu.read_u64(a + HP + 8).unwrap(), 0, "a new, zeroed page after the punch");
        assert_eq!(f.len(), 2 * HP);
        drop(cpu);
        drop((m, open, f));
        assert_no_leaks(&phys);
    }

    #[test]
    fn truncate_unmaps_every_mapping_private_copies_too_and_returns_reservations() {
        let phys = pool(4);
        let f = File::create_hugetlbfs(&phys, "/hp", 2 * HP).unwrap();
        let m = mm(&phys);
        let open = OpenFile::read_write(&f);
        let s = m.mmap(0, 2 * HP, RW, MAP_SHARED, Some(&open), 0).unwrap();
        let p = m.mmap(0, 2 * HP, RW, MAP_PRIVATE, Some(&open), 0).unwrap();
        let mut cpu = Cpu::attached(&m);
        cpu.write_u64(s + HP, 5).unwrap();
        assert_eq!(cpu.read_u64(p + HP).unwrap(), 5, "a private read maps the file's page");
        cpu.write_u64(p + HP, 6).unwrap();
        assert_eq!(cpu.read_u64(s + HP).unwrap(), 5, "the private write copied the page");
        assert_eq!(counts(&phys), (2, 2), "two pages; the file's and the copy's reservations used");
        f.set_len(HP).unwrap();
        // Both pages free; the private copy's reservation restored (its
        // owner's last unmap of an anonymous page), as __unmap_hugepage_range
        // does for truncate too.
        assert_eq!(counts(&phys), (4, 3));
        assert_eq!(cpu.read_u64(s + HP), Err(Fault::Bus { addr: s + HP }));
        assert_eq!(cpu.read_u64(p + HP), Err(Fault::Bus { addr: p + HP }), "the private copy went too");
        assert_eq!(cpu.read_u64(s).unwrap(), 0);
        drop(cpu);
        m.munmap(p, 2 * HP).unwrap();
        assert_eq!(counts(&phys), (3, 0), "the mapping's reservations went with it");
        drop((m, open));
        phys.quiesce();
        drop(f);
        assert_no_leaks(&phys);
    }

    /// A `MAP_FIXED` mapping of a hugetlbfs file whose unmap would split a
    /// VMA past `max_map_count` is `ENOMEM` before the file's mmap hook runs
    /// (`mmap_region` gathers the VMAs to unmap, their splits checked,
    /// before `hugetlbfs_file_mmap` reserves and grows): nothing reserved,
    /// the file not grown, the VMAs as they were.
    #[test]
    fn a_fixed_mapping_refused_for_the_map_count_reserves_and_grows_nothing() {
        let phys = pool(4);
        let mm = AddressSpace::new(&phys, MmConfig::default().max_map_count(3)).unwrap();
        let f = File::create_hugetlbfs(&phys, "/f", 0).unwrap();
        let open = OpenFile::read_write(&f);
        let v = mm.mmap(0, 4 * HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
        let small = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
        assert_eq!(mm.maps().len(), 3);
        let before = mm.maps_text();
        let fixed = MAP_SHARED | MAP_FIXED;
        assert_eq!(mm.mmap(v + HP, 2 * HP, RW, fixed, Some(&open), 6 * HP), Err(Errno::NoMem));
        assert_eq!((counts(&phys), f.len()), ((4, 0), 0), "HugePages_Rsvd and the file's size");
        assert_eq!(mm.maps_text(), before);
        // With one VMA fewer the split fits, and the same call maps.
        mm.munmap(small, PAGE).unwrap();
        assert_eq!(mm.mmap(v + HP, 2 * HP, RW, fixed, Some(&open), 6 * HP), Ok(v + HP));
        assert_eq!((counts(&phys), f.len()), ((4, 2), 8 * HP));
        drop(mm);
        drop(open);
        phys.quiesce();
        drop(f);
        assert_no_leaks(&phys);
    }
}

/// The same calls on the host kernel, with huge pages reserved and hugetlbfs
/// mounted by `softmm-hostsys`'s guard, and on softmm with a pool as large as
/// the host's free one: errnos, alignment, the maps line, reservation counts
/// and the fault that finds the pool empty must agree. Skipped, saying why,
/// where the host refuses (not root, no hugetlb, too few pages).
mod host {
    use super::*;
    use softmm::{File, OpenFile};
    use softmm_hostsys::{pool_counters, HugePages};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    /// Pages the test reserves on the host.
    const PAGES: usize = 4;

    /// Host setup in one place: the reservation and its mount, or why not.
    fn host_pool() -> Option<HugePages> {
        match HugePages::reserve_with_mount(PAGES) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("skipping the hugetlb host comparison: {e}");
                None
            }
        }
    }

    /// A host call's outcome as softmm reports one: the value or the errno.
    fn host<T>(ok: bool, v: T) -> Result<T, Errno> {
        if ok {
            Ok(v)
        } else {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            Err(errno(e))
        }
    }

    fn errno(e: i32) -> Errno {
        match e {
            libc::EINVAL => Errno::Inval,
            libc::ENOMEM => Errno::NoMem,
            libc::EOPNOTSUPP => Errno::OpNotSupp,
            libc::ENOSPC => Errno::NoSpc,
            libc::EBADF => Errno::BadF,
            libc::EFAULT => Errno::Fault,
            other => panic!("host errno {other} not expected by this test"),
        }
    }

    fn h_mmap(addr: u64, len: u64, prot: i32, flags: i32, fd: i32, off: u64) -> Result<u64, Errno> {
        // SAFETY: a new mapping; MAP_FIXED is used only at addresses this
        // test mapped itself (or inside a window it reserved).
        let p = unsafe { libc::mmap(addr as *mut libc::c_void, len as usize, prot, flags, fd, off as i64) };
        host(p != libc::MAP_FAILED, p as u64)
    }

    fn h_munmap(a: u64, len: u64) -> Result<(), Errno> {
        // SAFETY: ranges of mappings this test made.
        host(unsafe { libc::munmap(a as *mut libc::c_void, len as usize) } == 0, ())
    }

    fn h_mprotect(a: u64, len: u64, prot: i32) -> Result<(), Errno> {
        // SAFETY: as for munmap.
        host(unsafe { libc::mprotect(a as *mut libc::c_void, len as usize, prot) } == 0, ())
    }

    fn h_madvise(a: u64, len: u64, advice: i32) -> Result<(), Errno> {
        // SAFETY: as for munmap; the advice drops only this test's pages.
        host(unsafe { libc::madvise(a as *mut libc::c_void, len as usize, advice) } == 0, ())
    }

    fn h_mremap(a: u64, old: u64, new: u64, flags: i32, to: u64) -> Result<u64, Errno> {
        // SAFETY: as for munmap.
        let p =
            unsafe { libc::mremap(a as *mut libc::c_void, old as usize, new as usize, flags, to as *mut libc::c_void) };
        host(p != libc::MAP_FAILED, p as u64)
    }

    /// The host's maps lines: (start, end, perms, name).
    fn host_maps() -> Vec<(u64, u64, String, String)> {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (range, perms) = (f.next()?, f.next()?);
                let (s, e) = range.split_once('-')?;
                let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
                let name = f.nth(3).map(|_| l.splitn(6, char::is_whitespace).last().unwrap_or("").trim().to_string());
                Some((s, e, perms.to_string(), name.unwrap_or_default()))
            })
            .collect()
    }

    /// The host's maps line for the mapping at `a`: (length, perms, name).
    fn h_maps(a: u64) -> Option<(u64, String, String)> {
        host_maps().into_iter().find(|m| m.0 == a).map(|(s, e, perms, name)| (e - s, perms, name))
    }

    fn s_maps(mm: &AddressSpace, a: u64) -> Option<(u64, String, String)> {
        mm.maps().into_iter().find(|e| e.start == a).map(|e| (e.end - e.start, e.perms.clone(), e.name.clone()))
    }

    /// The host pool's (free, rsvd) beyond what it had at `base`.
    fn h_counts(base: (u64, u64)) -> (i64, i64) {
        let c = pool_counters().unwrap();
        (c.free as i64 - base.0 as i64, c.rsvd as i64 - base.1 as i64)
    }

    fn s_counts(phys: &PhysMem, pages: u64) -> (i64, i64) {
        let s = phys.huge_page_stats();
        (s.free as i64 - pages as i64, s.rsvd as i64)
    }

    /// How many of `n` huge pages of a fresh `MAP_NORESERVE` mapping a child
    /// process touches before it dies of SIGBUS (`n` if none).
    fn h_noreserve_touches(n: u64, shared: bool) -> u64 {
        let mut fds = [0; 2];
        // SAFETY: a pipe for the child's progress; fork in a test is safe
        // because the child only touches memory and writes to the pipe.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            if pid == 0 {
                let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
                let flags = kind | MAP_ANONYMOUS | MAP_HUGETLB | MAP_NORESERVE;
                let p = libc::mmap(std::ptr::null_mut(), (n * HP) as usize, RW, flags, -1, 0);
                if p == libc::MAP_FAILED {
                    libc::_exit(2);
                }
                for i in 0..n {
                    std::ptr::write_volatile((p as *mut u8).add((i * HP) as usize), 1);
                    libc::write(fds[1], b"x".as_ptr().cast(), 1);
                }
                libc::_exit(0);
            }
            libc::close(fds[1]);
            let mut done = 0u64;
            let mut b = [0u8; 64];
            loop {
                let r = libc::read(fds[0], b.as_mut_ptr().cast(), b.len());
                if r <= 0 {
                    break;
                }
                done += r as u64;
            }
            libc::close(fds[0]);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
                    || libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
                "child status {status:#x}"
            );
            done
        }
    }

    /// Runs `f` in a forked child that exits with what `f` returns, and
    /// says how the child ended: `Ok(exit status)` or `Err(signal)`. `f`
    /// makes system calls and touches memory only: another thread of the
    /// test may have held a lock (the allocator's) at the fork.
    fn h_in_child(f: impl FnOnce() -> i32) -> Result<i32, i32> {
        // SAFETY: the child runs `f` and exits; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
            if pid == 0 {
                libc::_exit(f());
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            if libc::WIFSIGNALED(status) {
                Err(libc::WTERMSIG(status))
            } else {
                Ok(libc::WEXITSTATUS(status))
            }
        }
    }

    /// The host pool as [`host_pool`] leaves it, with every page but
    /// `left` taken by a populated private mapping (returned, to unmap), or
    /// `None` (saying why) where the host had free huge pages of its own,
    /// which would change the outcomes.
    fn host_pool_with(guard: &HugePages, left: u64) -> Option<(u64, u64)> {
        let c = pool_counters().unwrap();
        if c.free != guard.pages() as u64 || c.rsvd != 0 {
            eprintln!("skipped: the host pool had free or reserved pages of its own: {c:?}");
            return None;
        }
        let n = guard.pages() as u64 - left;
        let filler = h_mmap(0, n * HP, RW, PRIVATE_HUGE | MAP_POPULATE, -1, 0).unwrap();
        Some((filler, n))
    }

    /// A child process that waits until the returned pipe end is closed,
    /// then exits; the caller waits for it with [`reap`].
    fn h_fork_waiting() -> (libc::pid_t, i32) {
        let mut fds = [0; 2];
        // SAFETY: the child only blocks on the pipe and exits
        // (async-signal-safe calls only, as a fork of a threaded test needs).
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            if pid == 0 {
                libc::close(fds[1]);
                let mut b = [0u8; 1];
                libc::read(fds[0], b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
            libc::close(fds[0]);
            (pid, fds[1])
        }
    }

    /// Lets the child of [`h_fork_waiting`] exit and waits for it.
    fn reap((pid, fd): (libc::pid_t, i32)) {
        let mut status = 0;
        // SAFETY: our pipe end and our child.
        unsafe {
            libc::close(fd);
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        }
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
    }

    /// The owner of a private mapping zaps (`MADV_DONTNEED`) a page its
    /// child still maps, then the child exits: the page comes back to the
    /// pool reserved for the owner, so a mapping that needs both free pages
    /// is `ENOMEM` and the owner's refault finds its page. (free, rsvd)
    /// beyond the filler after each step, and the two calls' results.
    #[test]
    fn a_zap_in_the_owner_restores_a_shared_page_s_reservation_as_on_the_host() {
        let Some(guard) = host_pool() else { return };
        let Some((filler, n)) = host_pool_with(&guard, 2) else { return };
        // The pool holds only the guard's pages (checked): counts are absolute.
        let base = (0, 0);
        let a = h_mmap(0, HP, RW, PRIVATE_HUGE, -1, 0).unwrap();
        // SAFETY: the mapping just made.
        unsafe { std::ptr::write_volatile(a as *mut u64, 7) };
        let child = h_fork_waiting();
        h_madvise(a, HP, MADV_DONTNEED).unwrap();
        let zapped = h_counts(base);
        reap(child);
        let exited = h_counts(base);
        let both = h_mmap(0, 2 * HP, RW, PRIVATE_HUGE, -1, 0).map(|b| h_munmap(b, 2 * HP).map(|_| 0));
        // SAFETY: as above.
        let refault = unsafe { std::ptr::read_volatile(a as *const u64) };
        let after = h_counts(base);
        h_munmap(a, HP).unwrap();
        h_munmap(filler, n * HP).unwrap();
        let host = (zapped, exited, both.is_err(), refault, after);

        let phys = pool(PAGES as u64);
        let owner = super::mm(&phys);
        let fill = owner.mmap(0, n * HP, RW, PRIVATE_HUGE | MAP_POPULATE, None, 0).unwrap();
        // Both pools hold only this test's pages: counts are absolute.
        let counts = |phys: &PhysMem| {
            let s = phys.huge_page_stats();
            (s.free as i64, s.rsvd as i64)
        };
        let a = owner.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&owner);
        cpu.write_u64(a, 7).unwrap();
        let child = owner.fork().unwrap();
        owner.madvise(a, HP, MADV_DONTNEED).unwrap();
        let zapped = counts(&phys);
        drop(child);
        let exited = counts(&phys);
        let both = owner.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0);
        let refault = cpu.read_u64(a).unwrap();
        let after = counts(&phys);
        let soft = (zapped, exited, both.is_err(), refault, after);
        assert_eq!(host, ((1, 0), (2, 1), true, 0, (1, 0)), "the host's own outcome changed");
        assert_eq!(soft, host);
        drop(cpu);
        owner.munmap(fill, n * HP).unwrap();
        drop(guard);
    }

    /// With the pool empty, an owner's write to its page after its child
    /// exited reuses the page even while a `vmsplice` (a `get_user_pages`
    /// reference) holds part of it, and the reference sees the write: the
    /// page is mapped once (`hugetlb_wp` reads the map count, not the
    /// reference count).
    #[test]
    fn an_owner_reuses_a_page_a_gup_reference_holds_as_on_the_host() {
        let Some(guard) = host_pool() else { return };
        let Some((filler, n)) = host_pool_with(&guard, 1) else { return };
        let a = h_mmap(0, HP, RW, PRIVATE_HUGE, -1, 0).unwrap();
        // SAFETY: the mapping just made; the child of `h_fork_waiting`
        // exits without touching it; the pipe holds the spliced page.
        let host = unsafe {
            std::ptr::write_volatile(a as *mut u64, 1);
            reap(h_fork_waiting());
            let mut fds = [0; 2];
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let iov = libc::iovec { iov_base: (a + PAGE) as *mut libc::c_void, iov_len: PAGE as usize };
            assert_eq!(libc::vmsplice(fds[1], &iov, 1, 0), PAGE as isize);
            std::ptr::write_volatile((a + PAGE) as *mut u64, 2);
            let mut b = [0u8; 8];
            assert_eq!(libc::read(fds[0], b.as_mut_ptr().cast(), 8), 8);
            libc::close(fds[0]);
            libc::close(fds[1]);
            (u64::from_le_bytes(b), pool_counters().unwrap().free)
        };
        h_munmap(a, HP).unwrap();
        h_munmap(filler, n * HP).unwrap();

        let phys = pool(PAGES as u64);
        let owner = super::mm(&phys);
        let fill = owner.mmap(0, n * HP, RW, PRIVATE_HUGE | MAP_POPULATE, None, 0).unwrap();
        let a = owner.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&owner);
        cpu.write_u64(a, 1).unwrap();
        drop(owner.fork().unwrap());
        let got = owner.get_user_pages(a + PAGE, 1, softmm::Foll::empty()).unwrap();
        cpu.write_u64(a + PAGE, 2).unwrap();
        let mut b = [0u8; 8];
        got.read(0, &mut b).unwrap();
        let soft = (u64::from_le_bytes(b), phys.huge_page_stats().free);
        assert_eq!(host, (2, 0), "the host's own outcome changed");
        assert_eq!(soft, host);
        drop((got, cpu));
        owner.munmap(fill, n * HP).unwrap();
        drop(guard);
    }

    /// An anonymous `MAP_HUGETLB` mapping at a file offset: the first
    /// access of a writable one (a write) and of a read-only one (a read),
    /// each in a child on the host: the write finds its page, the read is
    /// past the pseudo-file's end.
    #[test]
    fn an_anonymous_mapping_at_an_offset_faults_as_on_the_host() {
        let Some(guard) = host_pool() else { return };
        let phys = pool(PAGES as u64);
        let mm = super::mm(&phys);
        let mut cpu = Cpu::attached(&mm);
        for flags in [PRIVATE_HUGE, SHARED_HUGE] {
            for prot in [RW, PROT_READ] {
                let write = prot & PROT_WRITE != 0;
                let host = h_in_child(|| {
                    // SAFETY: a new mapping of the child's, accessed inside.
                    unsafe {
                        let p = libc::mmap(std::ptr::null_mut(), HP as usize, prot, flags, -1, HP as i64);
                        if p == libc::MAP_FAILED {
                            return 2;
                        }
                        if write {
                            std::ptr::write_volatile(p as *mut u8, 1);
                        } else {
                            std::ptr::read_volatile(p as *const u8);
                        }
                    }
                    0
                });
                let a = mm.mmap(0, HP, prot, flags, None, HP).unwrap();
                let access = if write { cpu.write_u8(a, 1) } else { cpu.read_u8(a).map(drop) };
                let soft = match access {
                    Ok(()) => Ok(0),
                    Err(Fault::Bus { .. }) => Err(libc::SIGBUS),
                    Err(f) => panic!("{f:?}"),
                };
                assert_eq!(soft, host, "flags {flags:#x}, prot {prot}");
                mm.munmap(a, HP).unwrap();
            }
        }
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
        drop(guard);
    }

    /// `MAP_HUGETLB | MAP_32BIT` and an unaligned hint, on the host and on
    /// softmm: the mapping lands 2 MiB aligned in `[1 GiB, 2 GiB)` (the host
    /// starts the window's search at a random page of its first 32 MiB, so
    /// the range is compared, not the address); with the window full, or
    /// with only an unaligned 2 MiB hole left (above the random start),
    /// `ENOMEM`, while a small mapping of the same length fills that hole;
    /// and a hint is rounded up to 2 MiB.
    #[test]
    fn map_32bit_and_hints_place_hugetlb_mappings_as_on_the_host() {
        let Some(guard) = host_pool() else { return };
        let phys = pool(PAGES as u64);
        let mm = super::mm(&phys);
        let flags = PRIVATE_HUGE | MAP_NORESERVE | MAP_32BIT;
        let in_window = |a: Result<u64, Errno>| a.map(|a| a >= LOW32 && a + HP <= 2 * LOW32 && a % HP == 0);
        let (h, s) = (h_mmap(0, HP, RW, flags, -1, 0), mm.mmap(0, HP, RW, flags, None, 0));
        assert_eq!(in_window(h), Ok(true), "the host's own placement changed: {h:x?}");
        assert_eq!(in_window(s), Ok(true), "{s:x?}");
        assert_eq!(h_munmap(h.unwrap(), HP), mm.munmap(s.unwrap(), HP));
        // The window full: one mapping over all of it, where the host has
        // nothing there.
        let none = ANON | MAP_FIXED_NOREPLACE | MAP_NORESERVE;
        match h_mmap(LOW32, LOW32, PROT_NONE, none, -1, 0) {
            Ok(a) => {
                let window = HostWindow { base: a, len: LOW32 };
                assert_eq!(a, LOW32, "MAP_FIXED_NOREPLACE placed its mapping elsewhere");
                assert_eq!(mm.mmap(LOW32, LOW32, PROT_NONE, none, None, 0), Ok(LOW32));
                let (h, s) = (h_mmap(0, HP, RW, flags, -1, 0), mm.mmap(0, HP, RW, flags, None, 0));
                assert_eq!(h, Err(Errno::NoMem), "the host's own outcome changed");
                assert_eq!(s, h, "the window full");
                let hole = LOW32 + (64 << 20) + PAGE;
                assert_eq!(window.munmap(hole, HP), mm.munmap(hole, HP));
                let (h, s) = (h_mmap(0, HP, RW, flags, -1, 0), mm.mmap(0, HP, RW, flags, None, 0));
                assert_eq!(s, h, "an unaligned 2 MiB hole");
                let small = ANON | MAP_32BIT | MAP_NORESERVE;
                let (h, s) = (h_mmap(0, HP, PROT_NONE, small, -1, 0), mm.mmap(0, HP, PROT_NONE, small, None, 0));
                assert_eq!((h, s), (Ok(hole), Ok(hole)), "a small mapping fills the hole");
                assert_eq!(window.munmap(LOW32, LOW32), mm.munmap(LOW32, LOW32));
            }
            Err(e) => eprintln!("skipping the full window: [1 GiB, 2 GiB) is in use on the host ({e:?})"),
        }
        // An unaligned hint far from anything either side maps: rounded up.
        let hint = 0x5000_0000_0000 + PAGE;
        let flags = PRIVATE_HUGE | MAP_NORESERVE;
        let (h, s) = (h_mmap(hint, HP, RW, flags, -1, 0), mm.mmap(hint, HP, RW, flags, None, 0));
        assert_eq!(h, Ok(hint - PAGE + HP), "the host's own outcome changed");
        assert_eq!(s, h, "a hint");
        assert_eq!(h_munmap(h.unwrap(), HP), mm.munmap(s.unwrap(), HP));
        drop(mm);
        assert_no_leaks(&phys);
        drop(guard);
    }

    /// A `MAP_FIXED` mapping of a hugetlbfs file over the middle of a
    /// hugetlb VMA, its split refused by the map count: on the host in a
    /// child brought to `vm.max_map_count` (single pages of alternating
    /// protection until `mmap` refuses, one unmapped again), on softmm with a
    /// limit of 3. The errno, then `HugePages_Free/Rsvd` and the file's size
    /// once the child is gone (a file's reservations and size outlive its
    /// mappings), must agree: nothing reserved, the file not grown.
    #[test]
    fn a_fixed_mapping_refused_for_the_map_count_changes_nothing_as_on_the_host() {
        let Some(guard) = host_pool() else { return };
        let dir = guard.mount_dir().expect("mounted").to_path_buf();
        let host_file = HostFile::create(&dir, "count");
        let fd = host_file.fd;
        let c = pool_counters().unwrap();
        let base = (c.free, c.rsvd);
        let fixed = MAP_SHARED | MAP_FIXED;
        let host_errno = h_in_child(|| {
            // SAFETY: the child's own mappings; MAP_FIXED only inside `v`.
            unsafe {
                let flags = PRIVATE_HUGE | MAP_NORESERVE;
                let v = libc::mmap(std::ptr::null_mut(), 4 * HP as usize, RW, flags, -1, 0);
                if v == libc::MAP_FAILED {
                    return 100;
                }
                let (mut last, mut prot) = (std::ptr::null_mut(), PROT_READ);
                loop {
                    let p = libc::mmap(std::ptr::null_mut(), PAGE as usize, prot, ANON, -1, 0);
                    if p == libc::MAP_FAILED {
                        break;
                    }
                    (last, prot) = (p, prot ^ PROT_READ);
                }
                if *libc::__errno_location() != libc::ENOMEM || libc::munmap(last, PAGE as usize) != 0 {
                    return 101;
                }
                let at = (v as *mut u8).add(HP as usize).cast();
                let r = libc::mmap(at, 2 * HP as usize, RW, fixed, fd, 6 * HP as i64);
                if r == libc::MAP_FAILED {
                    *libc::__errno_location()
                } else {
                    0
                }
            }
        });
        // SAFETY: `stat` is plain old data, valid all zeroes.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the file this test opened; fstat writes `st`.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        let host = (host_errno, h_counts(base), st.st_size as u64);
        assert_eq!(host.0, Ok(libc::ENOMEM), "the host's own outcome changed");

        let phys = pool(PAGES as u64);
        let mm = AddressSpace::new(&phys, MmConfig::default().max_map_count(3)).unwrap();
        let f = File::create_hugetlbfs(&phys, "/count", 0).unwrap();
        let open = OpenFile::read_write(&f);
        let v = mm.mmap(0, 4 * HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
        mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
        let r = mm.mmap(v + HP, 2 * HP, RW, fixed, Some(&open), 6 * HP);
        let soft = (Ok(r.err().map_or(0, |e| e.code())), s_counts(&phys, PAGES as u64), f.len());
        assert_eq!(soft, host, "(errno, HugePages_Free/Rsvd, the file's size)");
        drop(mm);
        drop(open);
        phys.quiesce();
        drop(f);
        assert_no_leaks(&phys);
        drop(host_file);
        drop(guard);
    }

    fn s_noreserve_touches(pages: u64, n: u64, shared: bool) -> u64 {
        let phys = pool(pages);
        let mm = mm(&phys);
        let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
        let a = mm.mmap(0, n * HP, RW, kind | MAP_ANONYMOUS | MAP_HUGETLB | MAP_NORESERVE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        (0..n).take_while(|i| cpu.write_u8(a + i * HP, 1).is_ok()).count() as u64
    }

    /// A file created in the test's hugetlbfs mount, closed and removed
    /// (its pages back to the host's pool) when dropped.
    struct HostFile {
        fd: i32,
        path: CString,
    }

    impl HostFile {
        fn create(dir: &std::path::Path, name: &str) -> HostFile {
            let path = CString::new(dir.join(name).as_os_str().as_bytes()).unwrap();
            // SAFETY: a new file in the mount this test owns.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600) };
            assert!(fd >= 0);
            HostFile { fd, path }
        }
    }

    impl Drop for HostFile {
        fn drop(&mut self) {
            // SAFETY: the descriptor and the path this test created.
            unsafe {
                libc::close(self.fd);
                libc::unlink(self.path.as_ptr());
            }
        }
    }

    /// A `PROT_NONE` range of the host's address space that a test reserves
    /// and maps into with `MAP_FIXED`. Its `munmap` refuses a range it does
    /// not hold: in a test binary whose other tests run on other threads, an
    /// unmap past the reservation takes their mappings (or the allocator's)
    /// from under them. It has no `Drop`: once the test has unmapped it, the
    /// range may be another thread's.
    struct HostWindow {
        base: u64,
        len: u64,
    }

    impl HostWindow {
        fn reserve(len: u64) -> HostWindow {
            let base = h_mmap(0, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
            HostWindow { base, len }
        }

        /// The first `align`-aligned address of the window.
        fn aligned(&self, align: u64) -> u64 {
            self.base.next_multiple_of(align)
        }

        fn munmap(&self, a: u64, len: u64) -> Result<(), Errno> {
            assert!(
                a >= self.base && a + len <= self.base + self.len,
                "munmap of {a:#x}+{len:#x} reaches outside the window {:#x}+{:#x}",
                self.base,
                self.len
            );
            h_munmap(a, len)
        }
    }

    /// The VMAs of `[a, a + len)` in the host's maps, as (start - a, end - a, perms).
    fn h_vmas(a: u64, len: u64) -> Vec<(u64, u64, String)> {
        host_maps()
            .into_iter()
            .filter(|&(s, e, _, _)| s < a + len && e > a)
            .map(|(s, e, p, _)| (s - a, e - a, p))
            .collect()
    }

    fn s_vmas(mm: &AddressSpace, a: u64, len: u64) -> Vec<(u64, u64, String)> {
        mm.maps()
            .into_iter()
            .filter(|e| e.start < a + len && e.end > a)
            .map(|e| (e.start - a, e.end - a, e.perms.clone()))
            .collect()
    }

    /// hugetlb VMAs never merge: `hugetlbfs_file_mmap` sets
    /// `VM_DONTEXPAND`, one of `VM_SPECIAL`. Neither a mapping of a file's
    /// middle page between its two neighbours, nor a protection put back
    /// to match both neighbours, joins them (so no merge has to carry a
    /// VMA's `HPAGE_RESV_UNMAPPED` mark or reserve map into another).
    #[test]
    fn hugetlb_vmas_never_merge_as_on_the_host() {
        let Some(guard) = host_pool() else { return };
        let dir = guard.mount_dir().expect("mounted").to_path_buf();
        let phys = pool(PAGES as u64);
        let mm = super::mm(&phys);
        let host_file = HostFile::create(&dir, "merge");
        let fd = host_file.fd;
        let f = File::create_hugetlbfs(&phys, "/merge", 0).unwrap();
        let open = OpenFile::read_write(&f);
        // SAFETY: the file just opened.
        assert_eq!(host(unsafe { libc::ftruncate(fd, 3 * HP as i64) } == 0, ()), f.set_len(3 * HP));
        // A 2 MiB-aligned run of 3 pages inside a 4-page PROT_NONE window.
        let window = HostWindow::reserve(4 * HP);
        let h = window.aligned(HP);
        let s_base = mm.mmap(0, 4 * HP, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let s = s_base.next_multiple_of(HP);
        let fixed = MAP_SHARED | MAP_FIXED;
        for page in [0, 2, 1] {
            let (ha, sa) = (h + page * HP, s + page * HP);
            assert_eq!(h_mmap(ha, HP, RW, fixed, fd, page * HP), Ok(ha));
            assert_eq!(mm.mmap(sa, HP, RW, fixed, Some(&open), page * HP), Ok(sa));
        }
        assert_eq!(h_vmas(h, 3 * HP), s_vmas(&mm, s, 3 * HP), "the middle page mapped last");
        assert_eq!(h_mprotect(h + HP, HP, PROT_READ), mm.mprotect(s + HP, HP, PROT_READ));
        assert_eq!(h_mprotect(h, 3 * HP, RW), mm.mprotect(s, 3 * HP, RW));
        assert_eq!(h_vmas(h, 3 * HP), s_vmas(&mm, s, 3 * HP), "after mprotect there and back");
        assert_eq!(h_mprotect(h + HP, HP, PROT_READ), mm.mprotect(s + HP, HP, PROT_READ));
        assert_eq!(h_mprotect(h + HP, HP, RW), mm.mprotect(s + HP, HP, RW));
        assert_eq!(h_vmas(h, 3 * HP), s_vmas(&mm, s, 3 * HP), "after mprotect of the middle VMA alone");
        assert_eq!(window.munmap(window.base, 4 * HP), mm.munmap(s_base, 4 * HP));
        drop(host_file);
        drop(open);
        drop(f);
        drop(mm);
        assert_no_leaks(&phys);
        drop(guard);
    }

    #[test]
    fn hugetlb_rules_match_the_host() {
        let Some(guard) = host_pool() else { return };
        let dir = guard.mount_dir().expect("mounted").to_path_buf();
        let c = pool_counters().unwrap();
        let base = (c.free, c.rsvd);
        let pages = c.free - c.rsvd;
        if pages > 64 {
            eprintln!("skipping the hugetlb host comparison: {pages} free host pages, more than the arena models");
            return;
        }
        let phys = pool(pages);
        let mm = mm(&phys);
        let shared = SHARED_HUGE;

        // mmap: rounding, placement alignment, the maps line.
        let h = h_mmap(0, 4096, RW, shared, -1, 0).unwrap();
        let s = mm.mmap(0, 4096, RW, shared, None, 0).unwrap();
        assert_eq!((h % HP, s % HP), (0, 0));
        let (hl, sl) = (h_maps(h).unwrap(), s_maps(&mm, s).unwrap());
        assert_eq!(hl, sl, "maps line (length, perms, name)");
        assert_eq!(h_counts(base), s_counts(&phys, pages), "one page reserved");
        // Faults consume the reservation.
        // SAFETY: the host mapping made above, 2 MiB long.
        unsafe { std::ptr::write_volatile(h as *mut u8, 1) };
        Cpu::attached(&mm).write_u8(s, 1).unwrap();
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after the fault");
        // Split rules on a 2 MiB VMA.
        assert_eq!(h_munmap(h, 4096), mm.munmap(s, 4096));
        assert_eq!(h_munmap(h + 4096, HP), mm.munmap(s + 4096, HP));
        assert_eq!(h_mprotect(h, 4096, PROT_READ), mm.mprotect(s, 4096, PROT_READ));
        assert_eq!(h_madvise(h + 4096, HP, MADV_DONTNEED), mm.madvise(s + 4096, HP, MADV_DONTNEED));
        assert_eq!(h_madvise(h, 4096, MADV_DONTNEED), mm.madvise(s, 4096, MADV_DONTNEED));
        assert_eq!(h_madvise(h, HP, MADV_FREE), mm.madvise(s, HP, MADV_FREE));
        assert_eq!(h_mremap(h, HP, 2 * HP, MREMAP_MAYMOVE, 0), mm.mremap(s, HP, 2 * HP, MREMAP_MAYMOVE, 0));
        assert_eq!(
            h_mremap(h + 4096, 4096, 4096, MREMAP_MAYMOVE, 0).map(|_| ()),
            mm.mremap(s + 4096, 4096, 4096, MREMAP_MAYMOVE, 0).map(|_| ())
        );
        assert_eq!(h_munmap(h, HP), mm.munmap(s, HP));
        // The pseudo-file goes after the VMA's grace period.
        drop(mm);
        phys.quiesce();
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after munmap");
        let mm = super::mm(&phys);

        // MADV_DONTNEED of a private page gives its reservation back.
        let flags = PRIVATE_HUGE;
        let (hp, sp) = (h_mmap(0, 2 * HP, RW, flags, -1, 0).unwrap(), mm.mmap(0, 2 * HP, RW, flags, None, 0).unwrap());
        let mut cpu = Cpu::attached(&mm);
        for i in 0..2 {
            // SAFETY: the host mapping made above, 4 MiB long.
            unsafe { std::ptr::write_volatile((hp + i * HP) as *mut u8, 1) };
            cpu.write_u8(sp + i * HP, 1).unwrap();
        }
        assert_eq!(h_counts(base), s_counts(&phys, pages), "private pages faulted");
        assert_eq!(h_madvise(hp, HP, MADV_DONTNEED), mm.madvise(sp, HP, MADV_DONTNEED));
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after MADV_DONTNEED of a private page");
        drop(cpu);
        assert_eq!(h_munmap(hp, 2 * HP), mm.munmap(sp, 2 * HP));
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after munmap of the private mapping");

        // Sizes and alignment of mmap itself.
        for (len, flags) in [(HP, shared | (22 << 26)), (HP, shared | MAP_FIXED)] {
            let fixed_at = if flags & MAP_FIXED != 0 { 0x7e00_0000_0000 + 4096 } else { 0 };
            let hr = h_mmap(fixed_at, len, RW, flags, -1, 0).map(|_| ());
            let sr = mm.mmap(fixed_at, len, RW, flags, None, 0).map(|_| ());
            assert_eq!(hr, sr, "mmap(len {len:#x}, flags {flags:#x})");
        }
        // Reservations: one page more than the pool is ENOMEM, shared or private.
        for kind in [MAP_SHARED, MAP_PRIVATE] {
            let flags = kind | MAP_ANONYMOUS | MAP_HUGETLB;
            let len = (pages + 1) * HP;
            assert_eq!(h_mmap(0, len, RW, flags, -1, 0).map(|_| ()), mm.mmap(0, len, RW, flags, None, 0).map(|_| ()));
        }
        // MAP_NORESERVE: the fault past the pool is SIGBUS.
        for shared in [true, false] {
            assert_eq!(
                h_noreserve_touches(pages + 1, shared),
                s_noreserve_touches(pages, pages + 1, shared),
                "touches before SIGBUS, shared {shared}"
            );
        }

        // hugetlbfs files.
        let host_file = HostFile::create(&dir, "f");
        let fd = host_file.fd;
        let f = File::create_hugetlbfs(&phys, "/f", 0).unwrap();
        let open = OpenFile::read_write(&f);
        // SAFETY: the file just opened.
        unsafe {
            assert_eq!(host(libc::ftruncate(fd, 4096) == 0, ()), f.set_len(4096));
            assert_eq!(host(libc::ftruncate(fd, 2 * HP as i64) == 0, ()), f.set_len(2 * HP));
            assert_eq!(host(libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) == 1, ()), f.write_at(0, b"x").map(|_| ()));
            assert_eq!(host(libc::fallocate(fd, 0x10, 0, HP as i64) == 0, ()), f.fallocate(0x10, 0, HP));
            assert_eq!(
                host(libc::fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, HP as i64) == 0, ()),
                f.fallocate(FALLOC_FL_PUNCH_HOLE, 0, HP)
            );
        }
        assert_eq!(
            h_mmap(0, HP, RW, MAP_SHARED, fd, 4096).map(|_| ()),
            mm.mmap(0, HP, RW, MAP_SHARED, Some(&open), 4096).map(|_| ())
        );
        let (hf, sf) = (
            h_mmap(0, 4096, RW, MAP_SHARED, fd, 0).unwrap(),
            mm.mmap(0, 4096, RW, MAP_SHARED, Some(&open), 0).unwrap(),
        );
        assert_eq!(h_maps(hf).unwrap().0, s_maps(&mm, sf).unwrap().0, "file mapping rounded up");
        assert_eq!(h_counts(base), s_counts(&phys, pages), "a shared file mapping reserves its pages");
        // A partial punch zeroes exactly its bytes.
        let mut cpu = Cpu::attached(&mm);
        for off in (0..512).step_by(8) {
            // SAFETY: inside the host file mapping, 2 MiB long.
            unsafe { std::ptr::write_volatile((hf + off) as *mut u64, u64::MAX) };
            cpu.write_u64(sf + off, u64::MAX).unwrap();
        }
        // SAFETY: the file opened above.
        let hr = host(unsafe { libc::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 100) } == 0, ());
        assert_eq!(hr, f.fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 100));
        for off in (0..512).step_by(8) {
            // SAFETY: as above.
            let hv = unsafe { std::ptr::read_volatile((hf + off) as *const u64) };
            assert_eq!(hv, cpu.read_u64(sf + off).unwrap(), "offset {off}");
        }
        drop(cpu);
        assert_eq!(h_munmap(hf, HP), mm.munmap(sf, HP));
        // Truncate under a private copy: the copy goes, and its owner gets
        // the reservation back (__unmap_hugepage_range, the last unmap of an
        // anonymous page in the mapping that owns the reserve map).
        let (hp, sp) = (
            h_mmap(0, 2 * HP, RW, MAP_PRIVATE, fd, 0).unwrap(),
            mm.mmap(0, 2 * HP, RW, MAP_PRIVATE, Some(&open), 0).unwrap(),
        );
        let mut cpu = Cpu::attached(&mm);
        // SAFETY: inside the host's private mapping of 2 MiB pages.
        unsafe { std::ptr::write_volatile((hp + HP) as *mut u64, 7) };
        cpu.write_u64(sp + HP, 7).unwrap();
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after a private write");
        // SAFETY: the file opened above.
        assert_eq!(host(unsafe { libc::ftruncate(fd, HP as i64) } == 0, ()), f.set_len(HP));
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after truncating the private copy's page");
        // The same for a hole punch, of a page the file has and the
        // private mapping copied.
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(hp as *mut u64, 8) };
        cpu.write_u64(sp, 8).unwrap();
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after a private copy of a file page");
        let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        // SAFETY: the file opened above.
        let hr = host(unsafe { libc::fallocate(fd, punch, 0, HP as i64) } == 0, ());
        assert_eq!(hr, f.fallocate(punch, 0, HP));
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after punching the copied page");
        drop(cpu);
        assert_eq!(h_munmap(hp, 2 * HP), mm.munmap(sp, 2 * HP));
        assert_eq!(h_counts(base), s_counts(&phys, pages), "after munmap of the private mapping");
        // fallocate beyond the pool: ENOSPC.
        let len = (pages + 2) * HP;
        // SAFETY: the file opened above.
        let hr = host(unsafe { libc::fallocate(fd, 0, 0, len as i64) } == 0, ());
        assert_eq!(hr, f.fallocate(0, 0, len));
        // Closing and removing the file frees its pages on the host.
        drop(host_file);
        drop(open);
        drop(f);
        drop(mm);
        assert_no_leaks(&phys);
        assert_eq!(h_counts(base), (0, 0), "the host's pool is back as it was");
        drop(guard);
    }
}

#[test]
fn populate_faults_each_huge_page_once_and_pins_take_no_further_fault() {
    let phys = pool(2);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, SHARED_HUGE | MAP_POPULATE, None, 0).unwrap();
    assert_eq!(mm.stats().hugetlb_faults, 2, "MAP_POPULATE: one fault per huge page");
    assert_eq!(counts(&phys), (0, 0));
    mm.madvise(a, 2 * HP, MADV_POPULATE_WRITE).unwrap();
    assert_eq!(mm.stats().hugetlb_faults, 2);
    // A long-term pin of the populated pages: counted in pinned_vm per
    // 4 KiB page, no fault (more in hugetlb_pin.rs).
    let pin = mm.pin_user_pages(a + HP, 3, softmm::Foll::WRITE | softmm::Foll::LONGTERM).unwrap();
    assert_eq!((pin.stats().faults, mm.pinned_vm()), (0, 3));
    drop(pin);
    assert_eq!(mm.pinned_vm(), 0);
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn madv_dontneed_of_a_private_page_restores_its_reservation() {
    let phys = pool(2);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(a, 1).unwrap();
    cpu.write_u8(a + HP, 1).unwrap();
    assert_eq!(counts(&phys), (0, 0));
    mm.madvise(a, HP, MADV_DONTNEED).unwrap();
    assert_eq!(counts(&phys), (1, 1), "the page is free and reserved for this mapping again");
    // So a MAP_NORESERVE mapping cannot take it, and the refault finds it.
    let n = mm.mmap(0, HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
    assert_eq!(cpu.write_u8(n, 1), Err(Fault::Bus { addr: n }));
    assert_eq!(cpu.read_u8(a).unwrap(), 0, "a fresh zeroed page");
    assert_eq!(counts(&phys), (0, 0));
    drop(cpu);
    mm.munmap(a, 2 * HP).unwrap();
    assert_eq!(counts(&phys), (2, 0));
    drop(mm);
    assert_no_leaks(&phys);
}

#[test]
fn madv_dontneed_in_an_owner_restores_the_reservation_of_a_page_a_child_still_maps() {
    // Linux's __unmap_hugepage_range restores the reservation of every
    // anonymous page the owner of a private mapping zaps, shared or not:
    // the page gives it back to the pool when its last user frees it.
    let phys = pool(2);
    let owner = mm(&phys);
    let a = owner.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&owner);
    cpu.write_u64(a, 7).unwrap();
    let child = owner.fork().unwrap();
    owner.madvise(a, HP, MADV_DONTNEED).unwrap();
    assert_eq!(counts(&phys), (1, 0), "the child still maps the page");
    assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 7);
    drop(child);
    assert_eq!(counts(&phys), (2, 1), "freed, and reserved for the owner again");
    // So another mapping cannot have both pages, and the owner's refault succeeds.
    assert_eq!(owner.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0), Err(Errno::NoMem));
    assert_eq!(cpu.read_u64(a).unwrap(), 0, "a fresh zeroed page");
    assert_eq!(counts(&phys), (1, 0));
    drop(cpu);
    drop(owner);
    assert_no_leaks(&phys);
}

#[test]
fn hugetlb_pages_are_not_migrated_yet_and_stay_intact() {
    let phys = PhysMem::new(PhysConfig::new(24 << 20).nodes(2).hugepages(1)).unwrap();
    let mm = mm(&phys);
    let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 4096, 42).unwrap();
    let mut status = [0i32; 2];
    let node = phys.huge_page_stats(); // both nodes have one page
    assert_eq!(node.total, 2);
    // Ask to move both 4 KiB addresses of the huge page to each node: none moves.
    for to in [0, 1] {
        let moved = mm.move_pages(&[a, a + 4096], Some(&[to, to]), &mut status, softmm::MPOL_MF_MOVE);
        assert!(moved.is_ok(), "{moved:?}");
    }
    assert_eq!(cpu.read_u64(a + 4096).unwrap(), 42);
    assert_eq!(phys.huge_page_stats().free, 1);
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}
