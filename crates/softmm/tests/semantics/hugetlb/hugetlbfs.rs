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
    assert_eq!(mm.mmap(0, 4096, RW, MAP_SHARED | MAP_HUGETLB, Some(&OpenFile::read_write(&t)), 0), Err(Errno::Inval));
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
