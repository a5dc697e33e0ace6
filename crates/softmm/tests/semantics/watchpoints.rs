//! Watchpoints with an access mask (`AddressSpace::watchpoint_insert`,
//! QEMU's `cpu_watchpoint_insert`): which accesses they stop, at any size
//! and alignment, reported through `Cpu::last_fault`; that the guest's own
//! faults come first; that arming takes effect for a CPU that already
//! cached the page; passing one (`Cpu::pass_watchpoint`), removing one,
//! bad input; what fork and mremap do; and a watched hugetlb page.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{
    Access, AddressSpace, Cpu, Errno, Fault, MmConfig, PhysConfig, PhysMem, SegvCode, WatchAccess, WatchMode,
    MAX_WATCHPOINTS,
};
use softmm_testkit::common::{assert_no_leaks, last_fault};

const PAGE: u64 = 4096;
const HP: u64 = 2 << 20;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const RWX: i32 = PROT_READ | PROT_WRITE | PROT_EXEC;

fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>) {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    (phys, mm)
}

/// What a hit returns, whatever the accessor's value.
fn hit<T>(addr: u64) -> Result<T, Fault> {
    Err(Fault::Watchpoint { addr })
}

/// Each mask stops its kinds of access and only those, through every
/// accessor (scalars, copies, atomics, slices, sections, held
/// translations), and reports the access; the bytes are unchanged.
#[test]
fn a_watchpoint_stops_the_accesses_of_its_mask_only() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, PAGE, RWX, ANON, None, 0).unwrap();
    let w = a + 0x100;
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(w, 7).unwrap();

    mm.watchpoint_insert(w, 8, WatchAccess::READ).unwrap();
    assert_eq!(cpu.read_u64(w), hit(w));
    assert_eq!(last_fault(&cpu), (Access::Read, w, 8));
    assert_eq!(cpu.atomic_load::<u32>(w + 4, Ordering::Relaxed), hit(w + 4));
    let mut buf = [0; 16];
    assert_eq!(cpu.read(w - 8, &mut buf), hit(w - 8));
    assert_eq!(last_fault(&cpu), (Access::Read, w - 8, 16));
    assert_eq!(cpu.with_slice(w + 7, 1, |_, _| ()), hit(w + 7));
    assert_eq!(cpu.section().read_u8(w + 3), hit(w + 3));
    assert!(cpu.translate(a, Access::Read).is_err(), "the rest of the page holds it");
    assert_eq!(cpu.write_u64(w, 8), Ok(()), "stores pass");
    assert_eq!(cpu.fetch_u32(w), Ok(8), "fetches pass");
    mm.watchpoint_remove(w, 8, WatchAccess::READ).unwrap();

    mm.watchpoint_insert(w, 8, WatchAccess::WRITE).unwrap();
    assert_eq!(cpu.write_u16(w + 6, 1), hit(w + 6));
    assert_eq!(last_fault(&cpu), (Access::Write, w + 6, 2));
    assert_eq!(cpu.atomic_fetch_add::<u64>(w, 1, Ordering::Relaxed), hit(w));
    assert_eq!(cpu.atomic_compare_exchange::<u64>(w, 0, 1, Ordering::Relaxed, Ordering::Relaxed), hit(w));
    assert_eq!(cpu.write(w + 4, &[1; 64]), hit(w + 4));
    assert_eq!(cpu.with_slice_mut(w, 1, |_, _| ()), hit(w));
    assert_eq!(cpu.read_u64(w), Ok(8), "nothing was stored, and reads pass");
    mm.watchpoint_remove(w, 8, WatchAccess::WRITE).unwrap();

    mm.watchpoint_insert(w, 4, WatchAccess::FETCH).unwrap();
    assert_eq!(cpu.fetch_u32(w), hit(w));
    assert_eq!(last_fault(&cpu), (Access::Execute, w, 4));
    assert_eq!(cpu.read_u32(w), Ok(8));
    cpu.write_u32(w, 9).unwrap();
    mm.watchpoint_insert(w, 4, WatchAccess::ACCESS).unwrap();
    assert_eq!(cpu.read_u32(w), hit(w));
    assert_eq!(cpu.write_u32(w, 1), hit(w));
    assert_eq!(mm.watchpoints(), 2);
    mm.watchpoint_remove(w, 4, WatchAccess::ACCESS).unwrap();
    mm.watchpoint_remove(w, 4, WatchAccess::FETCH).unwrap();
    assert_eq!(cpu.fetch_u32(w), Ok(9));
    assert_eq!(mm.watchpoints(), 0);
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// Any length and alignment: an access hits when one of its bytes is
/// watched, and not when it only shares the page; an access across a
/// page boundary hits on either side.
#[test]
fn a_watchpoint_is_exact_to_the_byte() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, 2 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    // One byte at an odd address.
    let w = a + 0x203;
    mm.watchpoint_insert(w, 1, WatchAccess::ACCESS).unwrap();
    for (addr, size) in [(0x200, 2usize), (0x204, 4), (0x1f8, 8), (0x100, 8), (0x204, 8)] {
        assert_eq!(cpu.read(a + addr, &mut vec![0; size]), Ok(()), "{addr:#x} + {size}");
    }
    assert_eq!(cpu.read_u8(w), Err(Fault::Watchpoint { addr: w }));
    assert_eq!(cpu.read_u32(a + 0x200), Err(Fault::Watchpoint { addr: a + 0x200 }));
    assert_eq!(cpu.write_u16(a + 0x202, 0), Err(Fault::Watchpoint { addr: a + 0x202 }));
    assert_eq!(cpu.read_u64(a + 0x1fc), Err(Fault::Watchpoint { addr: a + 0x1fc }), "misaligned");
    assert_eq!(last_fault(&cpu), (Access::Read, a + 0x1fc, 8));
    mm.watchpoint_remove(w, 1, WatchAccess::ACCESS).unwrap();
    // A range across the page boundary; accesses across it.
    mm.watchpoint_insert(a + PAGE - 2, 3, WatchAccess::WRITE).unwrap();
    assert_eq!(cpu.write_u64(a + PAGE - 8, 1), Err(Fault::Watchpoint { addr: a + PAGE - 8 }));
    assert_eq!(cpu.write_u8(a + PAGE - 3, 1), Ok(()));
    assert_eq!(cpu.write_u8(a + PAGE, 1), Err(Fault::Watchpoint { addr: a + PAGE }));
    assert_eq!(cpu.write_u8(a + PAGE + 1, 1), Ok(()));
    // A store across the boundary whose first page's bytes are free: the
    // first page's part is made, as a copy faulting at its second page.
    assert_eq!(cpu.write_u32(a + PAGE - 3, 0x0202_0202), Err(Fault::Watchpoint { addr: a + PAGE - 3 }));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// The guest's own faults come first: a watched hole is `SEGV_MAPERR`, a
/// watched read-only page's store `SEGV_ACCERR`, a fetch of a page without
/// `PROT_EXEC` `SEGV_ACCERR`.
#[test]
fn the_guests_own_faults_come_before_a_watchpoint() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, 2 * PAGE, PROT_READ, ANON, None, 0).unwrap();
    mm.munmap(a + PAGE, PAGE).unwrap();
    let all = WatchAccess::ACCESS.union(WatchAccess::FETCH);
    mm.watchpoint_insert(a, 2 * PAGE, all).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a + PAGE), Err(Fault::Segv { addr: a + PAGE, code: SegvCode::MapErr }));
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    assert_eq!(cpu.fetch_u32(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    assert_eq!(cpu.read_u8(a), Err(Fault::Watchpoint { addr: a }));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// Arming takes effect when the call returns for a CPU that holds the page
/// in its TLB for the watched kind (the pages are shot down); accesses of
/// other kinds keep the hit path (no TLB miss).
#[test]
fn arming_reaches_a_cpu_that_cached_the_page_and_spares_other_kinds() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, 2 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    cpu.write_u64(a + PAGE, 1).unwrap();
    let (cached_tx, cached_rx) = std::sync::mpsc::channel();
    let (armed_tx, armed_rx) = std::sync::mpsc::channel();
    let other = {
        let mm = mm.clone();
        std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a + 8, 2).unwrap();
            // Cached writable; the main thread arms meanwhile.
            cached_tx.send(()).unwrap();
            armed_rx.recv().unwrap();
            (cpu.write_u64(a + 8, 3), cpu.read_u64(a + 8))
        })
    };
    cached_rx.recv().unwrap();
    mm.watchpoint_insert(a + 8, 8, WatchAccess::WRITE).unwrap();
    armed_tx.send(()).unwrap();
    assert_eq!(other.join().unwrap(), (Err(Fault::Watchpoint { addr: a + 8 }), Ok(2)));
    // Reads of the watched page, and everything on the other page, hit.
    cpu.read_u64(a).unwrap();
    cpu.write_u64(a + PAGE, 2).unwrap();
    let misses = cpu.stats().tlb_misses;
    for _ in 0..4 {
        cpu.read_u64(a).unwrap();
        cpu.write_u64(a + PAGE, 2).unwrap();
    }
    assert_eq!(cpu.stats().tlb_misses, misses);
    // Stores to the watched page, even to bytes not watched, take the
    // miss path and are checked there.
    cpu.write_u64(a, 5).unwrap();
    cpu.write_u64(a, 6).unwrap();
    assert_eq!(cpu.stats().tlb_misses, misses + 2);
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// `pass_watchpoint` lets the next access that hits one be made, once;
/// removing is by exact bounds and mask; bad input changes nothing.
#[test]
fn passing_removing_and_bad_input() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    mm.watchpoint_insert(a, 4, WatchAccess::WRITE).unwrap();
    cpu.pass_watchpoint();
    cpu.write_u32(a + 4, 1).unwrap(); // hits none: the pass stays
    cpu.write_u32(a, 2).unwrap();
    assert_eq!(cpu.write_u32(a, 3), Err(Fault::Watchpoint { addr: a }));
    assert_eq!(cpu.read_u32(a), Ok(2));
    // A pass is used up by the access it lets through, not by one that
    // stops for another reason (here a notify write watch on the page).
    mm.write_watch(a, PAGE, WatchMode::Notify).unwrap();
    cpu.pass_watchpoint();
    assert_eq!(cpu.write_u32(a, 3), Err(Fault::WriteWatch { addr: a }));
    mm.write_unwatch(a, PAGE, WatchMode::Notify).unwrap();
    cpu.write_u32(a, 3).unwrap();
    assert_eq!(cpu.write_u32(a, 2), Err(Fault::Watchpoint { addr: a }));
    assert_eq!(cpu.read_u32(a), Ok(3));
    assert_eq!(mm.watchpoint_remove(a, 4, WatchAccess::READ), Err(Errno::NoEnt));
    assert_eq!(mm.watchpoint_remove(a, 2, WatchAccess::WRITE), Err(Errno::NoEnt));
    mm.watchpoint_remove(a, 4, WatchAccess::WRITE).unwrap();
    assert_eq!(mm.watchpoint_remove(a, 4, WatchAccess::WRITE), Err(Errno::NoEnt));
    let task = MmConfig::default().task_size;
    assert_eq!(mm.watchpoint_insert(a, 0, WatchAccess::READ), Err(Errno::Inval));
    assert_eq!(mm.watchpoint_insert(task - 4, 8, WatchAccess::READ), Err(Errno::Inval));
    assert_eq!(mm.watchpoint_insert(u64::MAX, 1, WatchAccess::READ), Err(Errno::Inval));
    assert_eq!(WatchAccess::from_bits(0), None);
    assert_eq!(WatchAccess::from_bits(8), None);
    assert_eq!(WatchAccess::from_bits(3), Some(WatchAccess::ACCESS));
    for i in 0..MAX_WATCHPOINTS as u64 {
        mm.watchpoint_insert(a + i % PAGE, 1, WatchAccess::FETCH).unwrap();
    }
    assert_eq!(mm.watchpoint_insert(a, 1, WatchAccess::FETCH), Err(Errno::NoSpc));
    assert_eq!(mm.watchpoints(), MAX_WATCHPOINTS);
    assert_eq!(cpu.write_u32(a, 4), Ok(()));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// Watchpoints belong to the addresses of one address space: a fork's
/// child has none; mremap leaves them where they were.
#[test]
fn fork_and_mremap() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    mm.watchpoint_insert(a, 8, WatchAccess::READ).unwrap();
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    assert_eq!(ccpu.read_u64(a), Ok(1));
    assert_eq!(cpu.read_u64(a), Err(Fault::Watchpoint { addr: a }));
    let b = mm.mremap(a, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a + 16 * PAGE).unwrap();
    assert_eq!(cpu.read_u64(b), Ok(1), "the page moved, the watchpoint did not");
    let c = mm.mmap(a, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(cpu.read_u64(c), Err(Fault::Watchpoint { addr: a }));
    drop((cpu, ccpu, mm, child));
    assert_no_leaks(&phys);
}

/// A watchpoint in a 2 MiB hugetlb page: the page is cached in the 2 MiB
/// TLB before the watchpoint, shot down by arming, and then filled without
/// the watched kind; accesses elsewhere in the huge page pass.
#[test]
fn a_watchpoint_in_a_hugetlb_page() {
    let phys = PhysMem::new(PhysConfig::new((8 << 20) + 2 * HP).hugepages(1)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, HP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + HP - 8, 1).unwrap();
    cpu.write_u64(a + 8, 2).unwrap();
    mm.watchpoint_insert(a + HP / 2, 2, WatchAccess::WRITE).unwrap();
    assert_eq!(cpu.write_u64(a + HP / 2, 3), Err(Fault::Watchpoint { addr: a + HP / 2 }));
    cpu.write_u64(a + HP - 8, 4).unwrap();
    assert_eq!(cpu.read_u64(a + HP / 2), Ok(0));
    assert_eq!(cpu.read_u64(a + 8), Ok(2));
    mm.watchpoint_remove(a + HP / 2, 2, WatchAccess::WRITE).unwrap();
    cpu.write_u64(a + HP / 2, 3).unwrap();
    assert_eq!(cpu.read_u64(a + HP / 2), Ok(3));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}
