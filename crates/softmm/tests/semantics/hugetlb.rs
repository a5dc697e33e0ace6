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
    assert_eq!(mm.munmap(a, HP + 4096), Err(Errno::Inval));
    assert_eq!(mm.mprotect(a, 4096, PROT_READ), Err(Errno::Inval));
    assert_eq!(mm.madvise(a, 4096, MADV_DONTFORK), Err(Errno::Inval));
    assert_eq!(mm.madvise(a + 4096, HP, MADV_DONTNEED), Err(Errno::Inval), "unaligned start");
    assert_eq!(mm.madvise(a, HP, MADV_FREE), Err(Errno::Inval));
    assert_eq!(mm.maps_text(), maps, "nothing changed");
    // A call whose head split is aligned and tail split is not: the head
    // split stays, nothing else changes (as on the host, Linux 6.18:
    // `vms_gather_munmap_vmas` and `vma_modify` split the head, then
    // `hugetlb_vm_op_split` refuses the tail). Either call leaves the same.
    let split = [(a, a + HP, "rw-s".to_string()), (a + HP, a + 2 * HP, "rw-s".to_string())];
    let lines = |mm: &AddressSpace| -> Vec<(u64, u64, String)> {
        mm.maps().into_iter().map(|m| (m.start, m.end, m.perms)).collect()
    };
    assert_eq!(mm.munmap(a + HP, 1), Err(Errno::Inval), "the end splits inside the second page");
    assert_eq!(lines(&mm), split);
    assert_eq!(mm.mprotect(a + HP, 4096, PROT_READ), Err(Errno::Inval));
    assert_eq!(lines(&mm), split);
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

mod hugetlbfs;

/// The same calls on the host kernel, with huge pages reserved and hugetlbfs
/// mounted by `softmm-hostsys`'s guard, and on softmm with a pool as large as
/// the host's free one: errnos, alignment, the maps line, reservation counts
/// and the fault that finds the pool empty must agree. Skipped, saying why,
/// where the host refuses (not root, no hugetlb, too few pages).
mod host;

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

/// Linux's `remove_vma` runs `hugetlb_vm_op_close` before `munmap`
/// returns: the reservations a private mapping still holds go back to the
/// pool then, and its pages with the zap, so the next `mmap` of the pool's
/// only page succeeds, on any thread. Only the VMA's memory may wait for a
/// grace period; under `short-own-rcu` that wait ends at the writer's next
/// write section, after the next `mmap` has reserved. Each round leaves the
/// mapping's index reserved again (another thread's `MADV_DONTNEED`) or its
/// page mapped (another thread's fault) when the writer unmaps it. Seen
/// failing with the `vm_ops->close` of `detach_vmas` left out, so that the
/// reservation went only with the VMA's deferred free: `(1, 1)` after the
/// `munmap`, under the first policy tried.
#[test]
fn munmap_gives_the_pool_back_before_it_returns_under_every_writer_policy() {
    for &policy in softmm::WriterPolicy::ALL {
        let phys = pool(1);
        let mm = AddressSpace::new(&phys, MmConfig::default().writer_policy(policy)).unwrap();
        for round in 0..8 {
            let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
            let dontneed = round % 2 == 0;
            std::thread::scope(|s| {
                s.spawn(|| {
                    Cpu::attached(&mm).write_u64(a, 7).unwrap();
                    if dontneed {
                        mm.madvise(a, HP, MADV_DONTNEED).unwrap();
                    }
                });
            });
            let held = if dontneed { (1, 1) } else { (0, 0) };
            assert_eq!(counts(&phys), held, "{policy:?} round {round}: freed and reserved again, or mapped");
            mm.munmap(a, HP).unwrap();
            assert_eq!(counts(&phys), (1, 0), "{policy:?} round {round}: munmap gave the pool back before it returned");
            std::thread::scope(|s| {
                s.spawn(|| {
                    let b = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).expect("the pool's page is free");
                    Cpu::attached(&mm).write_u64(b, 1).unwrap();
                    mm.munmap(b, HP).unwrap();
                });
            });
            assert_eq!(counts(&phys), (1, 0), "{policy:?} round {round}: the other thread's munmap too");
        }
        drop(mm);
        phys.quiesce();
        assert_no_leaks(&phys);
    }
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

/// A private hugetlb mapping made read-only and then writable is not
/// charged to the commit (Linux's `mprotect_fixup` leaves out
/// `VM_HUGETLB`, whose pages the pool's reservation covers, as it does
/// `VM_SHARED` and `VM_NORESERVE`): the charge is unchanged, and under
/// `OVERCOMMIT_NEVER` with no room for the mapping's length in small pages
/// the `mprotect` still succeeds. Before, it charged 512 pages per 2 MiB
/// and failed with `ENOMEM` there.
#[test]
fn mprotect_of_a_private_hugetlb_mapping_to_writable_charges_nothing() {
    let phys = pool(2);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, PROT_READ, PRIVATE_HUGE, None, 0).unwrap();
    let committed = phys.committed_pages();
    assert_eq!(mm.mprotect(a, HP, PROT_READ | PROT_WRITE), Ok(()));
    assert_eq!(phys.committed_pages(), committed, "the writable half was charged");
    // No room left for 2 MiB of small pages: the second half still turns writable.
    let limit = phys.overcommit().mode(softmm::OvercommitMode::Never).kbytes(0).ratio(0);
    phys.set_overcommit(limit);
    assert!(phys.overcommit().commit_limit() < committed + HP / 4096);
    assert_eq!(mm.mprotect(a + HP, HP, PROT_READ | PROT_WRITE), Ok(()));
    assert_eq!(phys.committed_pages(), committed);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + HP, 7).unwrap();
    assert_eq!(cpu.read_u64(a + HP), Ok(7));
    drop(cpu);
    mm.munmap(a, 2 * HP).unwrap();
    assert_eq!(phys.committed_pages(), committed);
}
