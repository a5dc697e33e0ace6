//! `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED` and `MADV_FREE` give the same
//! result under every [`MadvisePolicy`]: the same errno, the same pages
//! left, the same contents, the same frames in use, for ranges inside one
//! VMA (which the per-VMA policy runs without `mmap_lock`) and for every
//! case it leaves to `mmap_lock` (holes, several VMAs, hugetlb, bad input).
//! The other test binaries run under the default policy, or under the one
//! `SOFTMM_MADVISE_POLICY` names (scripts/test.sh runs the semantic and
//! differential tests under each).

use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, File, MadvisePolicy, MmConfig, OpenFile, PhysConfig, PhysMem};
use softmm_testkit::common::{assert_no_leaks, ANON, PAGE, RW};

const HP: u64 = 2 << 20;
/// The small mappings, from here up.
const B: u64 = 0x10_0000_0000;
/// The hugetlb mapping.
const H: u64 = 0x20_0000_0000;

/// Pages of the small mappings' span `[B, B + SPAN)`.
const SPAN: u64 = 16;

/// Builds the layout: every writable page written with its index + 1.
///
/// | pages | mapping |
/// |---|---|
/// | 0-3 | private anonymous |
/// | 4-7 | private anonymous, `MAP_LOCKED` |
/// | 8 | hole |
/// | 9-11 | shared file |
/// | 12-13 | private file |
/// | 14-15 | private anonymous, read-only (zero pages mapped) |
///
/// and 2 MiB of private hugetlb at `H`, written.
fn layout(phys: &Arc<PhysMem>, policy: MadvisePolicy) -> (Arc<AddressSpace>, Arc<File>) {
    let config = MmConfig::default().madvise_policy(policy).memlock_limit(u64::MAX);
    let mm = AddressSpace::new(phys, config).unwrap();
    let f = File::create(phys, "/data", 8 * PAGE).unwrap();
    let of = OpenFile::read_write(&f);
    let fixed = MAP_FIXED;
    let p = |i: u64| B + i * PAGE;
    assert_eq!(mm.mmap(p(0), 4 * PAGE, RW, ANON | fixed, None, 0), Ok(p(0)));
    assert_eq!(mm.mmap(p(4), 4 * PAGE, RW, ANON | fixed | MAP_LOCKED, None, 0), Ok(p(4)));
    assert_eq!(mm.mmap(p(9), 3 * PAGE, RW, MAP_SHARED | fixed, Some(&of), 0), Ok(p(9)));
    assert_eq!(mm.mmap(p(12), 2 * PAGE, RW, MAP_PRIVATE | fixed, Some(&of), 3 * PAGE), Ok(p(12)));
    assert_eq!(mm.mmap(p(14), 2 * PAGE, PROT_READ, ANON | fixed, None, 0), Ok(p(14)));
    assert_eq!(mm.mmap(H, HP, RW, ANON | fixed | MAP_HUGETLB, None, 0), Ok(H));
    let mut cpu = Cpu::attached(&mm);
    for i in (0..14).filter(|&i| i != 8) {
        cpu.write_u8(p(i), i as u8 + 1).unwrap();
    }
    for i in 14..16 {
        assert_eq!(cpu.read_u8(p(i)), Ok(0));
    }
    cpu.write_u8(H + PAGE, 0x77).unwrap();
    (mm, f)
}

/// What a call left: its result, each page's contents (or the signal a
/// read raised), mincore's residency, the frames in use and the maps.
#[derive(Debug, PartialEq, Eq)]
struct After {
    result: Result<(), Errno>,
    contents: Vec<Result<u8, i32>>,
    resident: Vec<u8>,
    frames_used: u64,
    maps: String,
}

/// On a machine of its own (file and inode numbers in the maps included).
fn run(policy: MadvisePolicy, addr: u64, len: u64, advice: i32) -> After {
    let phys = &phys();
    let (mm, f) = layout(phys, policy);
    let result = mm.madvise(addr, len, advice);
    // Residency first: the reads below map the zero page where nothing is.
    let mut resident = vec![0; SPAN as usize];
    let _ = mm.mincore(B, SPAN * PAGE, &mut resident);
    let mut huge = vec![0; 2];
    mm.mincore(H, 2 * PAGE, &mut huge).unwrap();
    resident.extend(huge);
    let mut cpu = Cpu::attached(&mm);
    let pages = (0..SPAN).map(|i| B + i * PAGE).chain([H, H + PAGE]);
    let contents = pages.map(|a| cpu.read_u8(a).map_err(|e| e.signal())).collect();
    let after = After { result, contents, resident, frames_used: phys.stats().frames_used, maps: mm.maps_text() };
    drop((cpu, mm, f));
    assert_no_leaks(phys);
    after
}

fn phys() -> Arc<PhysMem> {
    let on_demand = std::env::var_os("SOFTMM_ON_DEMAND").is_some();
    PhysMem::new(PhysConfig::new((8 << 20) + 2 * HP).hugepages(1).on_demand(on_demand)).unwrap()
}

/// Every call of the table, under every policy, leaves the same state; a
/// few answers are pinned to Linux's.
#[test]
fn every_policy_gives_the_locked_results() {
    let p = |i: u64| B + i * PAGE;
    let ranges: &[(&str, u64, u64)] = &[
        ("one page", p(1), PAGE),
        ("the whole VMA", p(0), 4 * PAGE),
        ("into the locked VMA", p(2), 4 * PAGE),
        ("the locked VMA", p(4), 4 * PAGE),
        ("over the hole", p(6), 4 * PAGE),
        ("the hole", p(8), PAGE),
        ("the shared file", p(9), 3 * PAGE),
        ("the private file", p(12), 2 * PAGE),
        ("the read-only zero pages", p(14), 2 * PAGE),
        ("past the end", p(15), 2 * PAGE),
        ("an unaligned start", p(1) + 1, PAGE),
        ("length 0", p(1), 0),
        ("an unaligned length", p(1), 1),
        ("a wrapping length", p(1), u64::MAX - PAGE),
        ("hugetlb", H, HP),
        ("hugetlb, unaligned start", H + PAGE, PAGE),
        ("hugetlb, one small page", H, PAGE),
    ];
    for &advice in &[MADV_DONTNEED, MADV_DONTNEED_LOCKED, MADV_FREE] {
        for &(what, addr, len) in ranges {
            let locked = run(MadvisePolicy::MmapLock, addr, len, advice);
            for &policy in MadvisePolicy::ALL {
                let got = run(policy, addr, len, advice);
                assert_eq!(got, locked, "advice {advice}, {what}, {policy:?}");
            }
        }
    }
    let r = |addr, len, advice| run(MadvisePolicy::PerVma, addr, len, advice).result;
    assert_eq!(r(p(1), PAGE, MADV_DONTNEED), Ok(()));
    assert_eq!(r(p(4), PAGE, MADV_DONTNEED), Err(Errno::Inval));
    assert_eq!(r(p(4), PAGE, MADV_DONTNEED_LOCKED), Ok(()));
    assert_eq!(r(p(4), PAGE, MADV_FREE), Err(Errno::Inval));
    assert_eq!(r(p(9), PAGE, MADV_FREE), Err(Errno::Inval));
    assert_eq!(r(p(8), PAGE, MADV_DONTNEED), Err(Errno::NoMem));
    assert_eq!(r(H, HP, MADV_FREE), Err(Errno::Inval));
    assert_eq!(r(H + PAGE, PAGE, MADV_DONTNEED), Err(Errno::Inval));
    // The page dropped reads zero; its neighbours keep their data.
    let after = run(MadvisePolicy::PerVma, p(1), PAGE, MADV_DONTNEED);
    assert_eq!(&after.contents[..3], &[Ok(1), Ok(0), Ok(3)]);
    assert_eq!(&after.resident[..3], &[1, 0, 1]);
}

/// `mmap_lock` taken for read by one call (`stats()` takes it once itself).
fn read_locks(mm: &AddressSpace, call: impl FnOnce()) -> u64 {
    let before = mm.stats().mmap_lock_read;
    call();
    mm.stats().mmap_lock_read - before - 1
}

/// Under `PerVma` a range inside one VMA takes no `mmap_lock`; a range over
/// two VMAs, over a hole, on hugetlb, and anything under `MmapLock` takes it
/// once.
#[test]
fn per_vma_takes_mmap_lock_only_where_it_must() {
    let phys = phys();
    for &policy in MadvisePolicy::ALL {
        let (mm, _f) = layout(&phys, policy);
        let per_vma = policy == MadvisePolicy::PerVma;
        let p = |i: u64| B + i * PAGE;
        for advice in [MADV_DONTNEED, MADV_DONTNEED_LOCKED, MADV_FREE] {
            let n = read_locks(&mm, || mm.madvise(p(1), 2 * PAGE, advice).unwrap());
            assert_eq!(n, u64::from(!per_vma), "{policy:?}, advice {advice}");
        }
        // An error the VMA's flags give is as lock-free as a success.
        let n = read_locks(&mm, || assert_eq!(mm.madvise(p(4), PAGE, MADV_DONTNEED), Err(Errno::Inval)));
        assert_eq!(n, u64::from(!per_vma), "{policy:?}");
        for (addr, len) in [(p(2), 4 * PAGE), (p(6), 4 * PAGE), (H, HP)] {
            let n = read_locks(&mm, || {
                let _ = mm.madvise(addr, len, MADV_DONTNEED);
            });
            assert_eq!(n, 1, "{policy:?}, {addr:#x}+{len:#x}");
        }
        assert_eq!(mm.stats().mmap_lock_write, 6, "{policy:?}: only the layout's mmaps write");
    }
    assert_no_leaks(&phys);
}

/// A per-VMA `MADV_DONTNEED` of many pages at once (up to one gather) frees
/// every page and leaks nothing; past one gather it is left to `mmap_lock`
/// and does the same.
#[test]
fn large_ranges_free_everything_under_each_policy() {
    let phys = PhysMem::new(PhysConfig::new(64 << 20)).unwrap();
    for &policy in MadvisePolicy::ALL {
        let mm = AddressSpace::new(&phys, MmConfig::default().madvise_policy(policy)).unwrap();
        for pages in [512u64, 9690, 9691] {
            let len = pages * PAGE;
            let a = mm.mmap(0, len, RW, ANON | MAP_POPULATE, None, 0).unwrap();
            assert_eq!(phys.stats().frames_used, pages);
            let n = read_locks(&mm, || mm.madvise(a, len, MADV_DONTNEED).unwrap());
            let lock_free = policy == MadvisePolicy::PerVma && pages <= 9690;
            assert_eq!(n, u64::from(!lock_free), "{policy:?}, {pages} pages");
            assert_eq!(phys.stats().frames_used, 0, "{policy:?}, {pages} pages");
            mm.munmap(a, len).unwrap();
        }
        drop(mm);
        assert_no_leaks(&phys);
    }
}
