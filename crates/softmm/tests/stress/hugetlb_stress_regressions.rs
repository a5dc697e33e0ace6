//! Minimal deterministic reproducers of failures `hugetlb_stress.rs` found.

use softmm_testkit::common;

use std::sync::Arc;

use common::assert_no_leaks;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Fault, File, Foll, MmConfig, PhysConfig, PhysMem};

const HP: u64 = 2 << 20;
const RW: i32 = PROT_READ | PROT_WRITE;
const PRIVATE_HUGE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;

fn pool(huge: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new((8 << 20) + (huge + 1) * HP).hugepages(huge)).unwrap()
}

/// A reserved fault that finds no page (the pool still owes the
/// reservation: `MADV_DONTNEED` gave it back to the owner's map, but the
/// page a pin holds has not been freed, and an unreserved allocation took
/// the last free page meanwhile) is `SIGBUS`, as on Linux; but the
/// mapping's reservation must stay in its map (Linux's
/// `vma_end_reservation` on the failed `alloc_hugetlb_folio`), so that
/// `munmap` gives it back once the pool has it. Taking it out of the map
/// before the allocation and not putting it back left `HugePages_Rsvd` at
/// 1 with nothing mapped or allocated.
#[test]
fn a_reserved_fault_that_finds_no_page_keeps_its_reservation() {
    let phys = pool(2);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let pin = mm.pin_user_pages(a, 1, Foll::WRITE).unwrap();
    mm.madvise(a, HP, MADV_DONTNEED).unwrap();
    let s = phys.huge_page_stats();
    assert_eq!((s.free, s.rsvd), (1, 0), "the reservation is owed until the pinned page is freed");
    // An unreserved allocation takes the last free page.
    let f = File::create_hugetlbfs(&phys, "/f", HP).unwrap();
    f.fallocate(0, 0, HP).unwrap();
    assert_eq!(Cpu::attached(&mm).write_u64(a, 1), Err(Fault::Bus { addr: a }), "no page for the reserved fault");
    drop(pin);
    assert_eq!(phys.huge_page_stats().rsvd, 1, "the pool has the reservation back");
    mm.munmap(a, HP).unwrap();
    assert_eq!(phys.huge_page_stats().rsvd, 0, "munmap gave the mapping's reservation back");
    drop((f, mm));
    assert_no_leaks(&phys);
}

/// A read pin of a private page the owner shares with a child since `fork`
/// unshares it (`hugetlb_wp` with `FAULT_FLAG_UNSHARE`); with the pool
/// empty the owner takes the page back from the child
/// (`unmap_ref_private`), as its write would, since Linux's
/// `outside_reserve` does not look at the unshare flag: the pin succeeds
/// and the child's next access is `SIGBUS`. The unshare returned `EFAULT`
/// for the owner instead.
#[test]
fn an_owners_read_pin_takes_a_shared_page_back_from_the_child_when_the_pool_is_empty() {
    for flags in [Foll::empty(), Foll::LONGTERM] {
        let phys = pool(1);
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 7).unwrap();
        let child = mm.fork().unwrap();
        let mut ccpu = Cpu::attached(&child);
        assert_eq!(ccpu.read_u64(a), Ok(7));
        assert_eq!(phys.huge_page_stats().free, 0);
        let pin = mm.pin_user_pages(a, 1, flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
        let mut buf = [0u8; 8];
        pin.read(0, &mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), 7, "{flags:?}");
        assert_eq!(cpu.read_u64(a), Ok(7), "{flags:?}");
        assert!(mm.page_maybe_dma_pinned(a), "{flags:?}: the owner's mapped page is the pinned one");
        assert_eq!(ccpu.read_u64(a), Err(Fault::Bus { addr: a }), "{flags:?}: the child lost it");
        drop((pin, ccpu, child, cpu, mm));
        assert_no_leaks(&phys);
    }
}
