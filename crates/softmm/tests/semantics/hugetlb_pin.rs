//! Pins of hugetlb pages (Linux's `follow_huge_pmd` under
//! `pin_user_pages`): each 4 KiB subpage asked for is pinned on its huge
//! page, through a shared PMD table too; a read pin of a shared private page
//! unshares it first; `fork` copies a pinned private huge page into the
//! child, and with the pool empty the fork fails with `ENOMEM`, as
//! Linux's `copy_mm` does whatever `dup_mmap` failed with (the host
//! comparison is in `pin_host.rs`).

use softmm_testkit::common;

use std::sync::Arc;

use common::assert_no_leaks;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, File, Foll, MmConfig, OpenFile, PhysConfig, PhysMem, PAGE_SIZE};

const HP: u64 = 2 << 20;
const PUD: u64 = 1 << 30;
const RW: i32 = PROT_READ | PROT_WRITE;
const PRIVATE_HUGE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;

fn pool(huge: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new((8 << 20) + (huge + 1) * HP).hugepages(huge)).unwrap()
}

fn mm(phys: &Arc<PhysMem>) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default()).unwrap()
}

#[test]
fn pins_through_a_shared_pmd_table_count_on_the_huge_page_and_outlive_unshare_and_truncate() {
    let phys = pool(4);
    let f = File::create_hugetlbfs(&phys, "/db", PUD).unwrap();
    let parent = mm(&phys);
    let open = OpenFile::read_write(&f);
    let a = parent.mmap(4 * PUD, PUD, RW, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, Some(&open), 0).unwrap();
    let mut cpu = Cpu::attached(&parent);
    for i in 0..2 {
        cpu.write_u64(a + i * HP, 0x100 + i).unwrap();
    }
    drop(cpu);
    let child = parent.fork().unwrap();
    assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 0x100);
    assert_eq!(phys.huge_page_stats().pmd_shares, 1);
    // Three subpages across the boundary of pages 0 and 1, pinned by the
    // child through the parent's table (one fault: the pages are mapped).
    let pin = child.pin_user_pages(a + HP - 2 * PAGE_SIZE, 3, Foll::WRITE | Foll::LONGTERM).unwrap();
    assert_eq!((pin.len(), pin.stats().faults), (3, 0));
    assert!(parent.page_maybe_dma_pinned(a) && parent.page_maybe_dma_pinned(a + HP + 5 * PAGE_SIZE));
    // The device view is the subpages asked for: offset 2 pages is page 1's start.
    pin.write(2 * PAGE_SIZE, &0xd1ceu64.to_le_bytes()).unwrap();
    pin.write(0, &0xd0u64.to_le_bytes()).unwrap();
    assert_eq!(Cpu::attached(&parent).read_u64(a + HP).unwrap(), 0xd1ce);
    assert_eq!(Cpu::attached(&parent).read_u64(a + HP - 2 * PAGE_SIZE).unwrap(), 0xd0);
    // The child unshares (munmap elsewhere in the window): the pins stay.
    child.munmap(a + 3 * HP, HP).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 1);
    assert!(!child.page_maybe_dma_pinned(a), "the child's own table maps nothing yet");
    assert_eq!(Cpu::attached(&child).read_u64(a + HP).unwrap(), 0xd1ce);
    assert!(child.page_maybe_dma_pinned(a + HP) && parent.page_maybe_dma_pinned(a));
    // Truncate takes the pages out of the file and every mapping; the pin
    // keeps them out of the pool until it goes.
    f.set_len(0).unwrap();
    assert_eq!(phys.huge_page_stats().free, 2);
    let mut buf = [0u8; 8];
    pin.read(2 * PAGE_SIZE, &mut buf).unwrap();
    assert_eq!(u64::from_le_bytes(buf), 0xd1ce);
    drop(pin);
    assert_eq!(phys.huge_page_stats().free, 4);
    drop((parent, child, open, f));
    assert_no_leaks(&phys);
}

#[test]
fn a_whole_huge_page_pinned_page_by_page_under_each_pin_policy() {
    for policy in [softmm::PinPolicy::PerPage, softmm::PinPolicy::Batched, softmm::PinPolicy::PerVma] {
        let phys = pool(2);
        let mm = AddressSpace::new(&phys, MmConfig::default().pin_policy(policy)).unwrap();
        let a = mm.mmap(0, 2 * HP, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
        let n = (HP / PAGE_SIZE) as usize + 1;
        let pin = mm.pin_user_pages(a, n, Foll::WRITE).unwrap();
        assert_eq!(pin.len(), n, "{policy:?}");
        assert_eq!(pin.stats().faults, 2, "{policy:?}: one fault per huge page");
        pin.write(HP, &7u64.to_le_bytes()).unwrap();
        assert_eq!(Cpu::attached(&mm).read_u64(a + HP).unwrap(), 7);
        drop(pin);
        assert!(!mm.page_maybe_dma_pinned(a) && !mm.page_maybe_dma_pinned(a + HP), "{policy:?}");
        drop(mm);
        assert_no_leaks(&phys);
    }
}

#[test]
fn fork_copies_a_pinned_private_huge_page_and_a_read_pin_unshares_one() {
    let phys = pool(4);
    let parent = mm(&phys);
    let a = parent.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&parent);
    cpu.write_u64(a, 1).unwrap();
    cpu.write_u64(a + HP, 2).unwrap();
    let pin = parent.pin_user_pages(a, 1, Foll::WRITE | Foll::LONGTERM).unwrap();
    // fork: the pinned page stays the parent's, writable; the child gets a
    // copy from outside the reservations. Page 1 is shared, COW.
    let free = phys.huge_page_stats().free;
    let child = parent.fork().unwrap();
    assert_eq!(phys.huge_page_stats().free, free - 1, "one copy for the child");
    pin.write(0, &0xdeu64.to_le_bytes()).unwrap();
    assert_eq!(cpu.read_u64(a).unwrap(), 0xde, "the parent sees the device's write");
    let mut ccpu = Cpu::attached(&child);
    assert_eq!(ccpu.read_u64(a).unwrap(), 1, "the child has its own copy");
    cpu.write_u64(a, 3).unwrap();
    assert_eq!(cpu.stats().fault.faults, 2, "no COW fault: the parent's pinned entry stayed writable");
    // A read pin of the shared page 1 in the child unshares it: the child
    // maps an exclusive copy, read-only; the parent's page is not pinned.
    let rpin = child.pin_user_pages(a + HP, 1, Foll::empty()).unwrap();
    assert!(child.page_maybe_dma_pinned(a + HP) && !parent.page_maybe_dma_pinned(a + HP));
    assert_eq!(ccpu.read_u64(a + HP).unwrap(), 2);
    assert!(ccpu.write_u64(a + HP, 5).is_ok(), "the exclusive copy is reused on write");
    let mut buf = [0u8; 8];
    rpin.read(0, &mut buf).unwrap();
    assert_eq!(u64::from_le_bytes(buf), 5, "the pin follows the child's page");
    assert_eq!(cpu.read_u64(a + HP).unwrap(), 2);
    drop((rpin, pin, ccpu, cpu, child, parent));
    assert_no_leaks(&phys);
}

/// `copy_hugetlb_page_range` finds no page for the child's copy
/// (`ENOSPC`), and `copy_mm` returns `ENOMEM` for any `dup_mm` failure.
#[test]
fn fork_fails_with_enomem_when_no_huge_page_is_left_for_a_pinned_copy() {
    let phys = pool(1);
    let parent = mm(&phys);
    let a = parent.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    Cpu::attached(&parent).write_u64(a, 1).unwrap();
    let pin = parent.pin_user_pages(a, 1, Foll::WRITE).unwrap();
    assert_eq!(parent.fork().err(), Some(Errno::NoMem));
    assert_eq!(Cpu::attached(&parent).read_u64(a).unwrap(), 1);
    drop((pin, parent));
    assert_no_leaks(&phys);
}

#[test]
fn an_owner_reuses_its_page_on_a_write_when_only_a_get_reference_shares_it() {
    // hugetlb_wp reuses an anonymous page mapped once, whatever other
    // references it has (a get_user_pages reference here, as vmsplice takes):
    // with the pool empty, a copy would be SIGBUS.
    let phys = pool(1);
    let owner = mm(&phys);
    let a = owner.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&owner);
    cpu.write_u64(a, 1).unwrap();
    drop(owner.fork().unwrap());
    let got = owner.get_user_pages(a + PAGE_SIZE, 1, Foll::empty()).unwrap();
    cpu.write_u64(a + PAGE_SIZE, 2).unwrap();
    let mut buf = [0u8; 8];
    got.read(0, &mut buf).unwrap();
    assert_eq!(u64::from_le_bytes(buf), 2, "the owner wrote the page it had");
    assert_eq!(phys.huge_page_stats().free, 0);
    drop((got, cpu, owner));
    assert_no_leaks(&phys);
}
