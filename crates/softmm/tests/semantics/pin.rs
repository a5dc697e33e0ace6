//! Page pinning (`pin_user_pages`, `get_user_pages`): the device view, COW
//! and fork (CVE-2020-29374), munmap and MADV_DONTNEED of pinned pages, the
//! memlock limit, argument errors, parallel pinning, and a stress run.

use softmm_testkit::common;

use std::sync::Arc;

use common::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, FaultPolicy, Foll, MmConfig, PhysMem, PinPolicy};

/// An address space with `pin` and `fault` policies.
fn mm_pin(phys: &Arc<PhysMem>, pin: PinPolicy, fault: FaultPolicy) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().policy(fault).pin_policy(pin).memlock_limit(u64::MAX)).unwrap()
}

/// Every pin policy with the default fault policy, and the default pin
/// policy with every fault policy.
fn configs() -> Vec<(PinPolicy, FaultPolicy)> {
    let mut v: Vec<_> = PinPolicy::ALL.iter().map(|&p| (p, FaultPolicy::default())).collect();
    v.extend(FaultPolicy::ALL.iter().map(|&f| (PinPolicy::default(), f)));
    v
}

fn dev_u64(p: &softmm::PinnedPages, off: u64) -> u64 {
    let mut b = [0u8; 8];
    p.read(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

fn dev_write_u64(p: &softmm::PinnedPages, off: u64, v: u64) {
    p.write(off, &v.to_ne_bytes()).unwrap();
}

#[test]
fn a_write_pin_and_the_process_see_the_same_frames() {
    for (pin, fault) in configs() {
        let phys = phys(8);
        let mm = mm_pin(&phys, pin, fault);
        let n = 40u64;
        let a = mm.mmap(0, n * PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        // Some pages present, some never touched, one only read (zero page).
        for i in (0..n).step_by(3) {
            cpu.write_u64(a + i * PAGE, 1000 + i).unwrap();
        }
        cpu.read_u64(a + PAGE).unwrap();
        let p = mm.pin_user_pages(a + 5, n as usize, Foll::WRITE).unwrap();
        assert_eq!((p.addr(), p.len(), p.is_pin()), (a, n as usize, true), "{pin:?}/{fault:?}");
        assert_eq!(p.stats().pages, n);
        for i in 0..n {
            assert!(mm.page_maybe_dma_pinned(a + i * PAGE), "{pin:?}/{fault:?} page {i}");
            let want = if i % 3 == 0 { 1000 + i } else { 0 };
            assert_eq!(dev_u64(&p, i * PAGE), want, "{pin:?}/{fault:?}: device reads page {i}");
            dev_write_u64(&p, i * PAGE + 8, 7000 + i);
            assert_eq!(cpu.read_u64(a + i * PAGE + 8).unwrap(), 7000 + i, "device write reaches the process");
            cpu.write_u64(a + i * PAGE + 16, 9000 + i).unwrap();
            assert_eq!(dev_u64(&p, i * PAGE + 16), 9000 + i, "process write reaches the device");
        }
        // Unaligned device access across a page boundary.
        p.write(PAGE - 3, b"across").unwrap();
        let mut b = [0u8; 6];
        p.read(PAGE - 3, &mut b).unwrap();
        assert_eq!(&b, b"across");
        assert_eq!(mm.stats().rss_pages, n);
        drop(p);
        assert!((0..n).all(|i| !mm.page_maybe_dma_pinned(a + i * PAGE)));
        drop(cpu);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

#[test]
fn the_lock_counts_are_the_policies() {
    let phys = phys(16);
    let n = 2048u64; // 4 batches
    for pin in PinPolicy::ALL.iter().copied() {
        let mm = mm_pin(&phys, pin, FaultPolicy::PerVmaSeq);
        let a = mm.mmap(0, n * PAGE, RW, ANON, None, 0).unwrap();
        mm.handle_fault(a, softmm::Access::Write).unwrap(); // the anon_vma and first table
        let p = mm.pin_user_pages(a, n as usize, Foll::WRITE).unwrap();
        let s = p.stats();
        assert_eq!(s.pages, n);
        match pin {
            PinPolicy::PerPage => assert_eq!(s.mmap_lock_acquisitions, n),
            PinPolicy::Batched => assert_eq!(s.mmap_lock_acquisitions, n / 512),
            _ => assert!(s.mmap_lock_acquisitions <= n / 512, "{s:?}"),
        }
        drop(p);
        // A populated range: the default takes every page lock-free.
        let p = mm.pin_user_pages(a, n as usize, Foll::WRITE).unwrap();
        if pin == PinPolicy::PerVma {
            assert_eq!((p.stats().fast_pages, p.stats().mmap_lock_acquisitions, p.stats().faults), (n, 0, 0));
        }
        drop(p);
    }
    assert_no_leaks(&phys);
}

/// CVE-2020-29374, as Linux since 5.19: the parent pins a page, forks, the
/// child writes: neither the pinned frame nor the parent sees the child's
/// write, and the parent's writes still reach the pinned frame.
#[test]
fn cve_2020_29374_fork_copies_pinned_pages_into_the_child() {
    for (pin, fault) in configs() {
        for flags in [Foll::WRITE | Foll::LONGTERM, Foll::empty()] {
            let phys = phys(8);
            let mm = mm_pin(&phys, pin, fault);
            let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
            let mut cpu = Cpu::attached(&mm);
            for i in 0..4 {
                cpu.write_u64(a + i * PAGE, 0x50).unwrap(); // 'P'
            }
            let p = mm.pin_user_pages(a, 2, flags | Foll::WRITE).unwrap();
            let child = mm.fork().unwrap();
            let mut ccpu = Cpu::attached(&child);
            assert_eq!(ccpu.read_u64(a).unwrap(), 0x50, "the child's copy holds the parent's data");
            ccpu.write_u64(a, 0x43).unwrap(); // 'C'
            ccpu.write_u64(a + 2 * PAGE, 0x43).unwrap(); // an unpinned page: COW as usual
            assert_eq!(dev_u64(&p, 0), 0x50, "{pin:?}/{fault:?}: the pinned frame saw the child's write");
            assert_eq!(cpu.read_u64(a).unwrap(), 0x50, "the parent saw the child's write");
            assert_eq!(cpu.read_u64(a + 2 * PAGE).unwrap(), 0x50);
            cpu.write_u64(a, 0x51).unwrap();
            assert_eq!(dev_u64(&p, 0), 0x51, "{pin:?}/{fault:?}: the parent's write missed the pinned frame");
            dev_write_u64(&p, PAGE, 0x44);
            assert_eq!(cpu.read_u64(a + PAGE).unwrap(), 0x44, "the device's write missed the parent");
            assert_eq!(ccpu.read_u64(a + PAGE).unwrap(), 0x50, "the device's write reached the child");
            assert_eq!(ccpu.read_u64(a).unwrap(), 0x43);
            assert!(mm.page_maybe_dma_pinned(a) && !child.page_maybe_dma_pinned(a));
            drop((ccpu, child, p, cpu, mm));
            assert_no_leaks(&phys);
        }
    }
}

#[test]
fn a_write_pin_of_a_cow_shared_page_breaks_cow_first() {
    let phys = phys(8);
    let mm = mm_pin(&phys, PinPolicy::default(), FaultPolicy::default());
    let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    let child = mm.fork().unwrap();
    let p = mm.pin_user_pages(a, 1, Foll::WRITE).unwrap();
    dev_write_u64(&p, 0, 2);
    assert_eq!(cpu.read_u64(a).unwrap(), 2);
    assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 1, "the device wrote the child's page");
    drop((p, child, cpu, mm));
    assert_no_leaks(&phys);
}

/// A read-only pin of a page shared copy-on-write unshares it (5.19's
/// FAULT_FLAG_UNSHARE), so the parent's later write lands in the pinned
/// frame instead of a COW copy; likewise a long-term read pin of the zero
/// page, and of a private file page.
#[test]
fn read_only_pins_unshare_so_later_writes_reach_the_pinned_frame() {
    for pin in PinPolicy::ALL.iter().copied() {
        let phys = phys(8);
        let mm = mm_pin(&phys, pin, FaultPolicy::default());
        let a = mm.mmap(0, 3 * PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 1).unwrap();
        let child = mm.fork().unwrap();
        cpu.read_u64(a + PAGE).unwrap(); // the zero page
        let p = mm.pin_user_pages(a, 2, Foll::LONGTERM).unwrap();
        assert_eq!(p.write(0, &[0]), Err(Errno::Perm), "a read-only pin gives a read-only device view");
        cpu.write_u64(a, 5).unwrap();
        cpu.write_u64(a + PAGE, 6).unwrap();
        assert_eq!((dev_u64(&p, 0), dev_u64(&p, PAGE)), (5, 6), "{pin:?}: a write after the pin went elsewhere");
        assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 1);
        drop(p);
        // A short-term read pin of the zero page takes it as it is.
        cpu.read_u64(a + 2 * PAGE).unwrap();
        let rss = mm.stats().rss_pages;
        let p = mm.pin_user_pages(a + 2 * PAGE, 1, Foll::empty()).unwrap();
        assert_eq!(dev_u64(&p, 0), 0);
        assert_eq!(mm.stats().rss_pages, rss);
        drop((p, child, cpu, mm));
        assert_no_leaks(&phys);
    }
}

#[test]
fn a_long_term_read_pin_of_a_private_file_page_unshares_it() {
    let phys = phys(8);
    let mm = mm_pin(&phys, PinPolicy::default(), FaultPolicy::default());
    let f = softmm::File::create(&phys, "f", PAGE).unwrap();
    f.write_at(0, &7u64.to_ne_bytes()).unwrap();
    let a = mm.mmap(0, PAGE, RW, MAP_PRIVATE, Some(&softmm::OpenFile::read_write(&f)), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u64(a).unwrap(), 7);
    let p = mm.pin_user_pages(a, 1, Foll::LONGTERM).unwrap();
    cpu.write_u64(a, 8).unwrap();
    assert_eq!(dev_u64(&p, 0), 8, "the pin held the page-cache page the write copied away from");
    let mut b = [0u8; 8];
    f.read_at(0, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 7, "the private write reached the file");
    drop((p, cpu, mm, f));
    assert_no_leaks(&phys);
}

/// A pinned page keeps its frame through mprotect (read-only, then
/// writable again: the write fault reuses the exclusive page instead of
/// copying it away from the pin) and through an mremap move.
#[test]
fn pinned_pages_stay_coherent_through_mprotect_and_mremap() {
    let phys = phys(8);
    let mm = mm_pin(&phys, PinPolicy::default(), FaultPolicy::default());
    let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    let p = mm.pin_user_pages(a, 4, Foll::WRITE | Foll::LONGTERM).unwrap();
    mm.mprotect(a, 4 * PAGE, PROT_READ).unwrap();
    assert!(cpu.write_u64(a, 2).is_err());
    mm.mprotect(a, 4 * PAGE, RW).unwrap();
    cpu.write_u64(a, 3).unwrap();
    assert_eq!(dev_u64(&p, 0), 3, "the write after mprotect copied the pinned page away");
    let b = mm.mremap(a, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a + 64 * PAGE).unwrap();
    cpu.write_u64(b + PAGE, 4).unwrap();
    assert_eq!(dev_u64(&p, PAGE), 4, "the moved mapping lost the pinned frame");
    dev_write_u64(&p, 2 * PAGE, 5);
    assert_eq!(cpu.read_u64(b + 2 * PAGE).unwrap(), 5);
    assert!(mm.page_maybe_dma_pinned(b) && !mm.page_maybe_dma_pinned(a));
    drop((p, cpu, mm));
    assert_no_leaks(&phys);
}

#[test]
fn pins_of_shared_mappings_are_shared_with_the_child() {
    let phys = phys(8);
    let mm = mm_pin(&phys, PinPolicy::default(), FaultPolicy::default());
    let a = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    let p = mm.pin_user_pages(a, 2, Foll::WRITE | Foll::LONGTERM).unwrap();
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    ccpu.write_u64(a, 2).unwrap();
    assert_eq!(dev_u64(&p, 0), 2, "a shared page is the child's too");
    dev_write_u64(&p, PAGE, 3);
    assert_eq!((cpu.read_u64(a + PAGE).unwrap(), ccpu.read_u64(a + PAGE).unwrap()), (3, 3));
    drop((ccpu, child, p, cpu, mm));
    assert_no_leaks(&phys);
}

/// Linux's `writable_file_mapping_allowed` (`check_vma_flags`) and
/// gup-fast's `gup_fast_folio_allowed`: a long-term write pin of a shared
/// mapping of a file that needs dirty tracking (a host-backed file, as one
/// on ext4) is `EFAULT` under every policy and in parallel, whether its
/// pages are present and writable (gup-fast could take them) or not, and
/// when the range starts in anonymous memory, with nothing left pinned or
/// charged. A short-term or read-only pin of it, a private mapping of it
/// (the pin breaks COW first), and shared mappings of an in-memory file
/// (shmem) or of anonymous memory are pinned.
#[test]
fn a_long_term_write_pin_of_a_shared_host_file_mapping_is_efault() {
    let w = Foll::WRITE | Foll::LONGTERM;
    for pin in PinPolicy::ALL.iter().copied() {
        let host = TempFile::new(&format!("pin-longterm-{}", pin.name()), &[0x11; 4 * PAGE as usize]);
        let phys = phys(8);
        let mm = mm_pin(&phys, pin, FaultPolicy::default());
        let f = softmm::OpenFile::from_host(&phys, host.open(true), "data").unwrap();
        let a = mm.mmap(0, 5 * PAGE, RW, ANON, None, 0).unwrap();
        let s = mm.mmap(a + PAGE, 4 * PAGE, RW, MAP_SHARED | MAP_FIXED, Some(&f), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        for va in [a, s, s + PAGE] {
            cpu.write_u8(va, 0x22).unwrap();
        }
        for (addr, n, what) in [(s, 2, "present"), (s + 2 * PAGE, 2, "not present"), (a, 5, "from anonymous memory")] {
            assert_eq!(mm.pin_user_pages(addr, n, w).err(), Some(Errno::Fault), "{pin:?}: {what}");
            assert_eq!(
                mm.pin_user_pages_parallel(addr, n, w, 2).err(),
                Some(Errno::Fault),
                "{pin:?}: {what}, parallel"
            );
            assert!(!mm.page_maybe_dma_pinned(a) && !mm.page_maybe_dma_pinned(s), "{pin:?}: {what}: left pinned");
            assert_eq!(mm.pinned_vm(), 0, "{pin:?}: {what}: left charged");
        }
        drop(mm.pin_user_pages(s, 4, Foll::WRITE).unwrap());
        drop(mm.pin_user_pages(s, 4, Foll::LONGTERM).unwrap());
        drop(mm.pin_user_pages_parallel(s, 4, Foll::LONGTERM, 2).unwrap());
        // Private: the pin holds an anonymous copy, which the file never sees.
        let p = mm.mmap(0, 2 * PAGE, RW, MAP_PRIVATE, Some(&f), 0).unwrap();
        cpu.read_u8(p).unwrap();
        let pp = mm.pin_user_pages(p, 2, w).unwrap();
        dev_write_u64(&pp, 8, 0x33);
        assert_eq!(cpu.read_u64(p + 8).unwrap(), 0x33);
        drop(pp);
        // shmem and shared anonymous memory need no dirty tracking.
        let mem = softmm::File::create(&phys, "mem", 2 * PAGE).unwrap();
        let m = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&softmm::OpenFile::read_write(&mem)), 0).unwrap();
        let sa = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
        for va in [m, sa] {
            cpu.write_u8(va, 0x44).unwrap();
            drop(mm.pin_user_pages(va, 2, w).unwrap());
            drop(mm.pin_user_pages_parallel(va, 2, w, 2).unwrap());
        }
        assert_eq!(mm.pinned_vm(), 0);
        drop((cpu, mm, f, mem));
        assert_no_leaks(&phys);
        assert!(host.read()[8..16].iter().all(|&b| b == 0x11), "{pin:?}: the private pin's write reached the file");
    }
}

#[test]
fn munmap_and_dontneed_of_pinned_pages_leave_the_frames_to_the_pin() {
    for pin in PinPolicy::ALL.iter().copied() {
        let phys = phys(8);
        let mm = mm_pin(&phys, pin, FaultPolicy::default());
        let a = mm.mmap(0, 8 * PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        for i in 0..8 {
            cpu.write_u64(a + i * PAGE, 100 + i).unwrap();
        }
        let p = mm.pin_user_pages(a, 8, Foll::WRITE | Foll::LONGTERM).unwrap();
        let used = phys.stats().frames_used;
        mm.madvise(a, 4 * PAGE, MADV_DONTNEED).unwrap();
        assert_eq!(cpu.read_u64(a).unwrap(), 0, "MADV_DONTNEED: the process faults a new page");
        mm.munmap(a + 4 * PAGE, 4 * PAGE).unwrap();
        assert!(cpu.read_u64(a + 4 * PAGE).is_err());
        for i in 0..8 {
            assert_eq!(dev_u64(&p, i * PAGE), 100 + i, "{pin:?}: the device lost page {i}");
            dev_write_u64(&p, i * PAGE, 200 + i);
            assert_eq!(dev_u64(&p, i * PAGE), 200 + i);
        }
        assert_eq!(cpu.read_u64(a + PAGE).unwrap(), 0, "the device's write reached the new page");
        assert_eq!(mm.pinned_vm(), 8, "munmap keeps the charge (VmPin)");
        assert!(phys.stats().frames_used >= used, "a pinned frame was freed");
        drop(p);
        assert_eq!(mm.pinned_vm(), 0);
        drop((cpu, mm));
        assert_no_leaks(&phys);
    }
}

#[test]
fn pins_outlive_their_address_space() {
    let phys = phys(8);
    let mm = mm_pin(&phys, PinPolicy::default(), FaultPolicy::default());
    let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    let p = mm.pin_user_pages(a, 2, Foll::WRITE | Foll::LONGTERM).unwrap();
    drop(mm);
    dev_write_u64(&p, PAGE, 3);
    assert_eq!(dev_u64(&p, PAGE), 3);
    assert_eq!(phys.quiesce().frames_used, 2);
    drop(p);
    assert_no_leaks(&phys);
}

#[test]
fn bad_requests_fail_with_linux_errnos_and_pin_nothing() {
    for pin in PinPolicy::ALL.iter().copied() {
        let phys = phys(8);
        let mm = mm_pin(&phys, pin, FaultPolicy::default());
        let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
        let ro = mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
        let none = mm.mmap(0, PAGE, PROT_NONE, ANON, None, 0).unwrap();
        let wo = mm.mmap(0, PAGE, PROT_WRITE, ANON, None, 0).unwrap();
        mm.munmap(a + 2 * PAGE, PAGE).unwrap(); // a hole in the middle
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 1).unwrap();
        mm.madvise(a + 3 * PAGE, PAGE, MADV_GUARD_INSTALL).unwrap();
        let used = phys.stats().frames_used;
        let w = Foll::WRITE | Foll::LONGTERM;
        let cases: Vec<(u64, usize, Foll, Errno)> = vec![
            (a, 4, w, Errno::Fault),                  // runs into the hole
            (a + 3 * PAGE, 1, w, Errno::Fault),       // a guard marker
            (ro, 1, w, Errno::Fault),                 // write without VM_WRITE
            (none, 1, Foll::empty(), Errno::Fault),   // read without VM_READ
            (wo, 1, Foll::empty(), Errno::Fault),     // PROT_WRITE alone has no VM_READ
            (0x1000, 1, w, Errno::Fault),             // nothing mapped
            (u64::MAX - PAGE, 2, w, Errno::Overflow), // wraps
            (softmm::TASK_SIZE - PAGE, 2, w, Errno::Fault),
            (a, usize::MAX, w, Errno::Overflow),
            (0x1000, 1 << 34, w, Errno::Fault), // far more pages than exist: no huge reservation
        ];
        for (addr, n, flags, want) in cases {
            assert_eq!(mm.pin_user_pages(addr, n, flags).err(), Some(want), "{pin:?} {addr:#x} {n}");
            assert_eq!(mm.pin_user_pages_parallel(addr, n, flags, 3).err(), Some(want), "{pin:?} parallel");
            assert!(!mm.page_maybe_dma_pinned(a), "a failed pin left page 0 pinned");
            assert_eq!(mm.pinned_vm(), 0, "a failed pin left a charge");
        }
        assert_eq!(phys.stats().frames_used, used + 1, "only the hole's neighbour was faulted in");
        assert_eq!(mm.get_user_pages(a, 1, Foll::LONGTERM).err(), Some(Errno::Inval));
        assert_eq!(mm.pin_user_pages(a, 1, Foll::from_bits_retain(1 << 1)).err(), Some(Errno::Inval), "FOLL_GET");
        assert_eq!(mm.pin_user_pages_parallel(a, 1, Foll::WRITE, 0).err(), Some(Errno::Inval));
        assert_eq!(mm.pin_user_pages_parallel(0x1000, 1 << 30, Foll::WRITE, usize::MAX).err(), Some(Errno::Fault));
        drop(mm.pin_user_pages_parallel(a, 2, Foll::WRITE, usize::MAX).unwrap());
        let empty = mm.pin_user_pages(a, 0, Foll::WRITE).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.read(0, &mut [0u8; 1]), Err(Errno::Fault));
        let p = mm.pin_user_pages(a, 1, Foll::WRITE).unwrap();
        assert_eq!(p.read(PAGE - 1, &mut [0u8; 2]), Err(Errno::Fault));
        assert_eq!(p.write(u64::MAX, &[0u8; 2]), Err(Errno::Fault));
        assert_eq!(p.read(PAGE, &mut []), Ok(()));
        drop((p, empty, cpu, mm));
        assert_no_leaks(&phys);
    }
}

#[test]
fn long_term_pins_are_charged_to_pinned_vm_against_rlimit_memlock() {
    let phys = phys(8);
    let config = MmConfig::default().memlock_limit(16 * PAGE);
    let mm = AddressSpace::new(&phys, config.clone()).unwrap();
    let a = mm.mmap(0, 64 * PAGE, RW, ANON, None, 0).unwrap();
    let lt = Foll::WRITE | Foll::LONGTERM;
    let p = mm.pin_user_pages(a, 12, lt).unwrap();
    assert_eq!(mm.pinned_vm(), 12);
    let used = phys.stats().frames_used;
    assert_eq!(mm.pin_user_pages(a + 12 * PAGE, 5, lt).err(), Some(Errno::NoMem));
    assert_eq!(mm.pin_user_pages_parallel(a + 12 * PAGE, 5, lt, 2).err(), Some(Errno::NoMem));
    assert_eq!(mm.pinned_vm(), 12, "a refused pin was charged");
    assert_eq!(phys.stats().frames_used, used, "a refused pin faulted pages in");
    assert!(!mm.page_maybe_dma_pinned(a + 12 * PAGE));
    let q = mm.pin_user_pages(a + 12 * PAGE, 4, lt).unwrap();
    assert_eq!(mm.pinned_vm(), 16, "up to the limit exactly");
    // Short-term pins and references are not charged; a page pinned twice is charged twice.
    let s = mm.pin_user_pages(a + 20 * PAGE, 30, Foll::WRITE).unwrap();
    let g = mm.get_user_pages(a + 20 * PAGE, 30, Foll::WRITE).unwrap();
    assert_eq!(mm.pinned_vm(), 16);
    drop(q);
    assert_eq!(mm.pinned_vm(), 12);
    let twice = mm.pin_user_pages(a, 4, lt).unwrap();
    assert_eq!(mm.pinned_vm(), 16);
    // A failure after the charge returns it.
    mm.munmap(a + 40 * PAGE, PAGE).unwrap();
    drop(twice);
    assert_eq!(mm.pin_user_pages(a + 38 * PAGE, 3, lt).err(), Some(Errno::Fault));
    assert_eq!(mm.pinned_vm(), 12);
    drop((p, s, g));
    assert_eq!(mm.pinned_vm(), 0);
    // CAP_IPC_LOCK: charged, never refused.
    let cap = AddressSpace::new(&phys, config.cap_ipc_lock(true)).unwrap();
    let b = cap.mmap(0, 32 * PAGE, RW, ANON, None, 0).unwrap();
    let big = cap.pin_user_pages(b, 32, lt).unwrap();
    assert_eq!(cap.pinned_vm(), 32);
    drop((big, cap, mm));
    assert_no_leaks(&phys);
}

#[test]
fn references_are_not_pins_and_fork_shares_them() {
    let phys = phys(8);
    let mm = mm_pin(&phys, PinPolicy::default(), FaultPolicy::default());
    let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    let g = mm.get_user_pages(a, 2, Foll::WRITE).unwrap();
    assert!(!g.is_pin() && !mm.page_maybe_dma_pinned(a));
    assert_eq!(dev_u64(&g, 0), 1);
    let used = phys.stats().frames_used;
    let child = mm.fork().unwrap();
    assert_eq!(phys.stats().frames_used, used, "fork copied a page that was only referenced");
    drop((g, child, cpu, mm));
    assert_no_leaks(&phys);
}

#[test]
fn parallel_pinning_pins_the_same_pages_in_order() {
    for pin in PinPolicy::ALL.iter().copied() {
        let phys = phys(32);
        let mm = mm_pin(&phys, pin, FaultPolicy::default());
        let n = 3 * 512 + 77;
        let a = mm.mmap(0, (n + 10) * PAGE, RW, ANON, None, 0).unwrap() + 5 * PAGE;
        let mut cpu = Cpu::attached(&mm);
        for i in (0..n).step_by(7) {
            cpu.write_u64(a + i * PAGE, i + 1).unwrap();
        }
        for threads in [1, 2, 3, 8] {
            let p = mm.pin_user_pages_parallel(a, n as usize, Foll::WRITE, threads).unwrap();
            assert_eq!((p.len(), p.stats().pages), (n as usize, n));
            for i in 0..n {
                let want = if i % 7 == 0 { i + 1 } else { 0 };
                assert_eq!(dev_u64(&p, i * PAGE), want, "{pin:?} threads={threads} page {i}");
            }
            dev_write_u64(&p, (n - 1) * PAGE + 8, 42);
            assert_eq!(cpu.read_u64(a + (n - 1) * PAGE + 8).unwrap(), 42);
        }
        drop((cpu, mm));
        assert_no_leaks(&phys);
    }
}

/// Pins, unpins, forks, munmaps, MADV_DONTNEED and device writes from
/// several threads; every pin's device view must agree with the process
/// while the range stays mapped, and nothing may leak.
#[test]
fn stress_pins_against_fork_munmap_and_dontneed() {
    for pin in PinPolicy::ALL.iter().copied() {
        let phys = phys(64);
        let mm = mm_pin(&phys, pin, FaultPolicy::default());
        let n = 64u64;
        let a = mm.mmap(0, n * PAGE, RW, ANON, None, 0).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            // Pinners: each owns 8 pages, pins them, checks coherence both ways.
            let pinners: Vec<_> = (0..4u64)
                .map(|t| {
                    let mm = &mm;
                    s.spawn(move || {
                        let mut cpu = Cpu::attached(mm);
                        let base = a + t * 8 * PAGE;
                        for round in 0..150u64 {
                            let p = match mm.pin_user_pages(base, 8, Foll::WRITE | Foll::LONGTERM) {
                                Ok(p) => p,
                                Err(e) => panic!("pin failed: {e:?}"),
                            };
                            let v = (t << 32) | round;
                            dev_write_u64(&p, (round % 8) * PAGE, v);
                            assert_eq!(cpu.read_u64(base + (round % 8) * PAGE).unwrap(), v, "{pin:?}");
                            cpu.write_u64(base + (round % 8) * PAGE + 8, v).unwrap();
                            assert_eq!(dev_u64(&p, (round % 8) * PAGE + 8), v, "{pin:?}");
                        }
                    })
                })
                .collect();
            // Forks and frees the children.
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let c = mm.fork().unwrap();
                    Cpu::attached(&c).write_u64(a, 1).unwrap();
                    drop(c);
                }
            });
            // MADV_DONTNEED and munmap/mmap of a range nobody pins.
            s.spawn(|| {
                let b = mm.mmap(0, 16 * PAGE, RW, ANON, None, 0).unwrap();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = mm.pin_user_pages(b, 16, Foll::WRITE).unwrap();
                    mm.madvise(b, 16 * PAGE, MADV_DONTNEED).unwrap();
                    if i % 2 == 0 {
                        mm.munmap(b, 16 * PAGE).unwrap();
                        dev_write_u64(&p, 15 * PAGE, 5);
                        mm.mmap(b, 16 * PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
                    }
                    drop(p);
                    i += 1;
                }
            });
            // The pinners end by themselves; then stop the rest (before
            // reporting a pinner's panic, so the scope can end).
            let results: Vec<_> = pinners.into_iter().map(|h| h.join()).collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for r in results {
                if let Err(p) = r {
                    std::panic::resume_unwind(p);
                }
            }
        });
        assert_eq!(mm.pinned_vm(), 0);
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// Migration (issue 12) must refuse pinned pages: `move_pages` leaves a
/// pinned page where it is and counts it as not moved (Linux's positive
/// return with the status unwritten, not a `-EBUSY` status: a pinned page
/// isolates, and its migration fails on the reference count).
#[test]
fn migration_refuses_pinned_pages() {
    // Linux (reference 3.4): a pinned page is retried for the pass limit and
    // counted as failed: move_pages returns the number not moved, leaving
    // that run's statuses unwritten; the page stays where the device sees it.
    let phys = softmm::PhysMem::new(softmm::PhysConfig::new(2 << 20).nodes(2)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    let pin = mm.pin_user_pages(a, 1, Foll::WRITE | Foll::LONGTERM).unwrap();
    let mut status = [i32::MIN];
    assert_eq!(mm.move_pages(&[a], Some(&[1]), &mut status, softmm::MPOL_MF_MOVE), Ok(1));
    assert_eq!(status, [i32::MIN], "the failed run's status is left unwritten");
    mm.pages_stat(&[a], &mut status).unwrap();
    assert_eq!(status, [0], "still on node 0");
    // The device and the process still share the frame.
    cpu.write_u64(a, 2).unwrap();
    assert_eq!(dev_u64(&pin, 0), 2);
    drop(pin);
    assert_eq!(mm.move_pages(&[a], Some(&[1]), &mut status, softmm::MPOL_MF_MOVE), Ok(0));
    assert_eq!(status, [1]);
    assert_eq!(cpu.read_u64(a).unwrap(), 2);
}
