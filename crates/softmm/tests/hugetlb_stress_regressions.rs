//! Minimal deterministic reproducers of failures `hugetlb_stress.rs` found.

mod common;

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
