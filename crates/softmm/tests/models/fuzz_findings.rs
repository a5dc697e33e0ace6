//! Minimized findings of the fuzz target `ops` (`fuzz/`) and of building its
//! reference model, each a test of what Linux does (checked on the host),
//! kept as regression tests. A new finding goes here `#[ignore]`d while it
//! is open. Where the reference model was wrong (`model_*`), the input runs
//! through the fuzz harness itself (`softmm_testkit::fuzz_ops`), softmm against the
//! model.

use softmm_testkit::common;

use common::*;
use softmm::uapi::*;
use softmm::{Cpu, Errno, FaultPolicy, File, OpenFile};

/// Fuzzer finding (first short run: crash, `attempt to multiply with overflow` at
/// `file.rs` `punch_hole`, `first * PAGE_SIZE`): a hole punch at an offset
/// in the last page of the 64-bit range panics with overflow checks on. The
/// offset is negative as an `off_t`, so Linux's `fallocate` returns
/// `EINVAL`.
#[test]
fn punch_hole_at_a_negative_offset_is_einval_not_a_panic() {
    let p = phys(4);
    let f = File::create(&p, "/tmp/f", PAGE).unwrap();
    assert_eq!(f.punch_hole(u64::MAX - 10, 5), Err(Errno::Inval));
    assert_eq!(f.punch_hole(1 << 63, PAGE), Err(Errno::Inval));
}

/// Fuzzer finding (hour run: 5 of its 19 crash inputs, e.g.
/// crash-f399b9a4…: `madvise(a, 10 pages, MADV_PAGEOUT)` over a locked
/// mapping = `Ok`, model `EINVAL`; checked on the Linux 6.18 host):
/// `MADV_COLD` and `MADV_PAGEOUT` refuse a `VM_LOCKED` VMA with `EINVAL`
/// (`can_madv_lru_vma`); softmm accepts them (and, over a range ending in a
/// hole, returns the hole's `ENOMEM` instead).
#[test]
fn madv_cold_and_pageout_refuse_locked_vmas() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, 4 * PAGE, RW, ANON | MAP_LOCKED, None, 0).unwrap();
    assert_eq!(mm.madvise(a, PAGE, MADV_COLD), Err(Errno::Inval));
    assert_eq!(mm.madvise(a, PAGE, MADV_PAGEOUT), Err(Errno::Inval));
}

/// Model finding (checked on the Linux 6.18 host): a forked child does not
/// inherit `VM_LOCKED` (`dup_mmap` clears `VM_LOCKED_MASK`), so
/// `MADV_DONTNEED` in the child succeeds; softmm copies the flag and the
/// child's `MADV_DONTNEED` fails with `EINVAL`.
#[test]
fn fork_does_not_inherit_mlock() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, 4 * PAGE, RW, ANON | MAP_LOCKED, None, 0).unwrap();
    let child = mm.fork().unwrap();
    assert_eq!(child.madvise(a, PAGE, MADV_DONTNEED), Ok(()));
    assert_eq!(mm.madvise(a, PAGE, MADV_DONTNEED), Err(Errno::Inval), "the parent's stays locked");
}

/// Model finding (checked on the Linux 6.18 host, where the mapping reads
/// `A`): making a locked private file mapping writable populates it for
/// write (`mprotect_fixup` calls `populate_vma_page_range`), so each page
/// gets its own copy and a later write to the file is not seen through the
/// mapping; softmm does not populate, and the mapping reads `B`.
#[test]
fn mprotect_making_a_locked_private_mapping_writable_populates_for_write() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let f = File::create(&p, "/tmp/f", 0).unwrap();
    f.write_at(0, &[b'A'; 2 * PAGE as usize]).unwrap();
    let a = mm.mmap(0, 2 * PAGE, PROT_READ, MAP_PRIVATE | MAP_LOCKED, Some(&OpenFile::read_write(&f)), 0).unwrap();
    mm.mprotect(a, 2 * PAGE, RW).unwrap();
    f.write_at(0, b"B").unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a).unwrap(), b'A');
}

/// Model finding (checked on the Linux 6.18 host, where the new page reads
/// `A`): growing a locked private file mapping with `mremap` populates the
/// new part (`mm_populate` after `move_vma` or `vma_merge_extend`), for
/// write since the mapping is writable; softmm does not, and the new page
/// shows the later file write (`C`).
#[test]
fn mremap_growth_of_a_locked_private_mapping_populates_for_write() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let f = File::create(&p, "/tmp/f", 0).unwrap();
    f.write_at(0, &[b'A'; 4 * PAGE as usize]).unwrap();
    let a = mm.mmap(0, PAGE, RW, MAP_PRIVATE | MAP_LOCKED, Some(&OpenFile::read_write(&f)), 0).unwrap();
    let b = mm.mremap(a, PAGE, 2 * PAGE, MREMAP_MAYMOVE, 0).unwrap();
    f.write_at(PAGE, b"C").unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(b + PAGE).unwrap(), b'A');
}

/// Fuzzer finding (hour run, crash-88db5df3…, checked on the Linux 6.18
/// host): `MADV_REMOVE` refuses a `VM_LOCKED` VMA with `EINVAL`
/// (`madvise_remove`'s first check); softmm punches the hole, discarding
/// the file's data.
#[test]
fn madv_remove_refuses_a_locked_vma() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let f = File::create(&p, "/tmp/f", 0).unwrap();
    f.write_at(0, &[b'A'; 4 * PAGE as usize]).unwrap();
    let a = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED | MAP_LOCKED, Some(&OpenFile::read_write(&f)), 0).unwrap();
    assert_eq!(mm.madvise(a, PAGE, MADV_REMOVE), Err(Errno::Inval));
    let mut b = [0; 1];
    f.read_at(0, &mut b).unwrap();
    assert_eq!(b[0], b'A', "the file keeps its data");
}

/// Found while teaching the fuzz model `MAP_DROPPABLE` (checked on the
/// Linux 6.18 host: both calls fail with `EINVAL`): `madvise_vma_behavior`
/// refuses `MADV_KEEPONFORK` and `MADV_DODUMP` on a `VM_DROPPABLE` VMA, so a
/// droppable mapping stays wipe-on-fork and out of core dumps; softmm
/// clears `VM_WIPEONFORK` and `VM_DONTDUMP`, and a child then inherits the
/// page. The fuzz target skips the class while this is open.
#[test]
fn keeponfork_and_dodump_refuse_a_droppable_mapping() {
    const MAP_DROPPABLE: i32 = 0x08;
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, PAGE, RW, MAP_DROPPABLE | MAP_ANONYMOUS, None, 0).unwrap();
    Cpu::attached(&mm).write_u8(a, 7).unwrap();
    assert_eq!(mm.madvise(a, PAGE, MADV_KEEPONFORK), Err(Errno::Inval));
    assert_eq!(mm.madvise(a, PAGE, MADV_DODUMP), Err(Errno::Inval));
    let child = mm.fork().unwrap();
    assert_eq!(Cpu::attached(&child).read_u8(a), Ok(0), "still wiped in a child");
}

use softmm_testkit::fuzz_ops;

use fuzz_ops::{Addr, FileArg, Input, Len, MapFlags, Off, Op, ProtArg};

/// Runs `ops` through the fuzz harness (softmm against the reference model).
fn model_agrees(ops: Vec<Op>) {
    let phys = fuzz_ops::arena();
    let input = Input { policy: FaultPolicy::MmapLock, files: [0, 0], ops };
    if let Err(e) = fuzz_ops::run(&input, &phys) {
        panic!("{}", fuzz_ops::report(&e));
    }
}

/// An anonymous `mmap` at the first page of the harness's window.
fn mmap_anon(ty: u8, len: Len) -> Op {
    Op::Mmap {
        asi: 0,
        addr: Addr::Win(0),
        len,
        prot: ProtArg::Bits(3),
        flags: MapFlags { ty, bits: 1 << 1, raw: 0, raw_on: false },
        file: FileArg { file: 0, mode: 0, none: true },
        off: Off::Page(0),
    }
}

/// Model finding (`ops`, 30-minute run, checked on the Linux 6.18 host):
/// a shrinking `mremap` unmaps `[addr + new_len, addr + old_len)` with
/// `do_vmi_munmap`, which refuses a range crossing `TASK_SIZE` with
/// `EINVAL`, however little of it is mapped; the model took the call for a
/// plain shrink of the 2 MiB mapping and expected the address back.
#[test]
fn model_a_shrinking_mremap_whose_old_range_crosses_task_size_is_einval() {
    model_agrees(vec![
        // mmap(0x7ffff7f7f000, 2 MiB, rw, private anonymous)
        mmap_anon(0, Len::Special(11)),
        // mremap(0x7ffff7f7f000, 1 GiB, 0xf000, 0)
        Op::Mremap {
            asi: 0,
            addr: Addr::Win(0),
            old: Len::Special(12),
            new: Len::Bytes(0xf000),
            flags: 0,
            raw_flags: None,
            new_addr: Addr::Win(0),
        },
    ]);
}

/// Model finding (`ops`, 30-minute run, checked on the Linux 6.18 host): a
/// `MAP_DROPPABLE` mapping is `VM_WIPEONFORK`, so a forked child reads
/// zeros where the parent wrote; the model copied the page into the child.
#[test]
fn model_a_droppable_mapping_is_wiped_in_a_forked_child() {
    model_agrees(vec![
        // mmap(0x7ffff7f7f000, 1 page, rw, MAP_DROPPABLE | MAP_ANONYMOUS)
        mmap_anon(6, Len::Pages(1)),
        Op::Write { asi: 0, cpu: false, addr: Addr::Win(0), len: 16, val: 1 },
        Op::Fork { asi: 0 },
        Op::Read { asi: 1, cpu: false, addr: Addr::Win(0), len: 16 },
    ]);
}

// ---------------------------------------------------------------------------
// Findings of the fuzz target `hugetlb` (`softmm_testkit::fuzz_ops::huge`): two
// nodes with a pool of two huge pages each.

const HP: u64 = 2 << 20;
const HUGE_PRIVATE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;

/// The node of the page at `addr` (`move_pages` without nodes).
fn node_of(mm: &softmm::AddressSpace, addr: u64) -> i32 {
    let mut st = [0];
    mm.move_pages(&[addr], None, &mut st, 0).unwrap();
    st[0]
}

/// Fuzzer finding (`hugetlb`, first runs; Linux 6.12's
/// `dequeue_hugetlb_folio_vma`, read, not run: the host has one node): a
/// hugetlb fault of an `MPOL_BIND` mapping takes a page only from the
/// mask's nodes (`huge_node` gives the mask to
/// `dequeue_hugetlb_folio_nodemask`), and with none free there the fault is
/// `SIGBUS`, reservation or not (no surplus pages by default). softmm's
/// `HugePool::dequeue` fell back to every node, so the third page landed on
/// node 0; `fork`'s copy of a pinned page fell back the same way where
/// Linux fails the fork (`ENOMEM`). Fixed.
#[test]
fn a_hugetlb_fault_under_mpol_bind_takes_no_page_outside_the_mask() {
    let p = fuzz_ops::huge::arena();
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, 3 * HP, RW, HUGE_PRIVATE, None, 0).unwrap();
    mm.mbind(a, 3 * HP, softmm::MPOL_BIND, Some(&[1 << 1]), 3, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    cpu.write_u64(a + HP, 2).unwrap();
    assert_eq!((node_of(&mm, a), node_of(&mm, a + HP)), (1, 1));
    assert_eq!(cpu.write_u64(a + 2 * HP, 3), Err(softmm::Fault::Bus { addr: a + 2 * HP }));
}

/// Fuzzer finding (`hugetlb`, first runs; Linux 6.12's
/// `unmap_and_move_huge_page`, read): a huge page that moved goes back to
/// the pool at once (`folio_putback_active_hugetlb(src)` on success), so
/// the next huge page of the same `mbind` can move into the room it made.
/// softmm keeps every moved page's source until the call ends: with one
/// unreserved page free on node 1, the second page finds none (`ENOMEM`,
/// which ends the migration; `mbind` still succeeds without
/// `MPOL_MF_STRICT`) and stays on node 0.
#[test]
fn mbind_gives_a_moved_huge_pages_source_back_before_the_next() {
    let p = fuzz_ops::huge::arena();
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, 2 * HP, RW, HUGE_PRIVATE | MAP_NORESERVE, None, 0).unwrap();
    // One page reserved elsewhere: of node 1's two free pages, one is available.
    let _b = mm.mmap(0, HP, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    cpu.write_u64(a + HP, 2).unwrap();
    assert_eq!((node_of(&mm, a), node_of(&mm, a + HP)), (0, 0));
    mm.mbind(a, 2 * HP, softmm::MPOL_BIND, Some(&[1 << 1]), 3, softmm::MPOL_MF_MOVE).unwrap();
    assert_eq!((node_of(&mm, a), node_of(&mm, a + HP)), (1, 1));
    assert_eq!((cpu.read_u64(a), cpu.read_u64(a + HP)), (Ok(1), Ok(2)));
}

/// Fuzzer finding (`hugetlb`, first runs; Linux 6.12's `hugetlb_wp`, read):
/// a read pin of a private huge page that the reservation owner shares
/// with a child since `fork` unshares it the way a write copies it: with
/// no free unreserved page for the copy the owner takes the page back from
/// the child (`unmap_ref_private`, the child's next fault there is
/// `SIGBUS`) and pins it. softmm's `hugetlb_unshare` only tries the copy,
/// and the pin fails with `EFAULT`.
#[test]
fn an_owners_read_pin_takes_a_shared_huge_page_back_from_the_child() {
    let p = fuzz_ops::huge::arena();
    let parent = mm_with(&p, FaultPolicy::MmapLock);
    let a = parent.mmap(0, HP, RW, HUGE_PRIVATE, None, 0).unwrap();
    let mut pc = Cpu::attached(&parent);
    pc.write_u64(a, 7).unwrap();
    let child = parent.fork().unwrap();
    // The other three pages reserved: none is left for a copy.
    let _rest = parent.mmap(0, 3 * HP, RW, HUGE_PRIVATE, None, 0).unwrap();
    let pin = parent.pin_user_pages(a, 1, softmm::Foll::empty()).unwrap();
    let mut b = [0; 8];
    pin.read(0, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 7);
    assert_eq!(Cpu::attached(&child).read_u64(a), Err(softmm::Fault::Bus { addr: a }));
}

/// Fuzzer finding (`hugetlb`, first runs and the 26-minute run; Linux
/// 6.12's `do_wp_page` with `FAULT_FLAG_UNSHARE`, read): a read pin of a
/// private page that is not exclusive (shared since `fork`, the child gone
/// now) unshares it, and `wp_can_reuse_anon_folio` reuses a page whose only
/// reference is the entry: it is marked exclusive and pinned where it is.
/// softmm's `unshare` always copies, here onto the node the mapping is now
/// bound to.
#[test]
fn a_read_pin_of_a_page_only_this_process_holds_reuses_it() {
    let p = fuzz_ops::huge::arena();
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    Cpu::attached(&mm).write_u64(a, 5).unwrap();
    drop(mm.fork().unwrap());
    // A copy would now go to node 1.
    mm.mbind(a, PAGE, softmm::MPOL_BIND, Some(&[1 << 1]), 3, 0).unwrap();
    assert_eq!(node_of(&mm, a), 0);
    let _pin = mm.pin_user_pages(a, 1, softmm::Foll::empty()).unwrap();
    assert_eq!(node_of(&mm, a), 0, "pinned where it is, not copied");
}

/// Inputs of the fuzz target `hugetlb` kept for softmm defects, fixed now
/// (`fuzz/regressions/hugetlb/`, each named after its defect), which the
/// target skipped while they were open.
#[test]
fn hugetlb_inputs_of_known_defects() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/hugetlb");
    let mut failed = Vec::new();
    for f in std::fs::read_dir(dir).expect("the regression inputs") {
        let f = f.expect("dir entry").path();
        let data = std::fs::read(&f).expect("input");
        let phys = fuzz_ops::huge::arena();
        if let Err(e) = fuzz_ops::huge::run_bytes(&data, &phys) {
            failed.push(format!("{}: {e}", f.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
