//! Minimized failures of the model test (`tests/models/model.rs`) that were softmm
//! bugs: ignored while open, plain regression tests once fixed.

use softmm_testkit::common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use softmm::uapi::*;
use softmm::{Cpu, Fault, FaultPolicy, File, OpenFile};

/// Runs `f` on its own thread (a `Cpu` is not `Send`) and fails if it does
/// not finish in time, so that a deadlock fails the test instead of hanging it.
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish in {secs} s: deadlock"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the test thread panicked"),
    }
}

/// Fixed in 770f4a4; was: File::set_len deadlocked: its TLB shootdown waited for the caller's own attached Cpu.
#[test]
fn truncate_with_a_cpu_attached_on_the_same_thread() {
    within(10, || {
        let p = phys(8);
        let mm = mm_with(&p, FaultPolicy::MmapLock);
        let f = File::create(&p, "/tmp/f", 2 * PAGE).unwrap();
        let a = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(a + PAGE, 1).unwrap();
        f.set_len(PAGE).unwrap();
        assert_eq!(cpu.read_u8(a + PAGE), Err(Fault::Bus { addr: a + PAGE }));
    });
}

/// Fixed in 770f4a4; was: File::punch_hole deadlocked the same way.
#[test]
fn punch_hole_with_a_cpu_attached_on_the_same_thread() {
    within(10, || {
        let p = phys(8);
        let mm = mm_with(&p, FaultPolicy::MmapLock);
        let f = File::create(&p, "/tmp/f", 2 * PAGE).unwrap();
        let a = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(a + PAGE, 1).unwrap();
        f.punch_hole(PAGE, PAGE).unwrap();
        assert_eq!(cpu.read_u8(a + PAGE), Ok(0));
    });
}

/// Fixed in 770f4a4; was: mprotect starting inside a VMA failed with ENOMEM.
#[test]
fn mprotect_from_the_middle_of_a_vma() {
    let p = phys(8);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, 3 * PAGE, RW, ANON, None, 0).unwrap();
    // Linux splits the VMA: [a, a+1p) rw-p, [a+1p, a+2p) r--p, [a+2p, a+3p) rw-p.
    assert_eq!(mm.mprotect(a + PAGE, PAGE, PROT_READ), Ok(()));
    let perms: Vec<String> = mm.maps().into_iter().map(|e| e.perms).collect();
    assert_eq!(perms, ["rw-p", "r--p", "rw-p"]);
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.write_u8(a + PAGE, 1), Err(Fault::Segv { addr: a + PAGE, code: softmm::SegvCode::AccErr }));
}

/// Fixed in 770f4a4; was: SIGBUS reported the page address instead of the faulting one.
#[test]
fn sigbus_reports_the_faulting_address() {
    let p = phys(8);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let f = File::create(&p, "/tmp/f", 0).unwrap();
    let a = mm.mmap(0, PAGE, PROT_READ, MAP_PRIVATE, Some(&OpenFile::read_write(&f)), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    // Linux's si_addr is the address accessed (as softmm does for SIGSEGV).
    assert_eq!(cpu.read_u8(a + 1), Err(Fault::Bus { addr: a + 1 }));
}

/// Fixed in 770f4a4; was: mprotect failed with ENOMEM when a VMA it changed merged with the next.
#[test]
fn mprotect_across_vmas_that_merge() {
    let p = phys(8);
    let mm = mm_with(&p, FaultPolicy::MmapLock);
    let a = mm.mmap(0, 3 * PAGE, RW, ANON, None, 0).unwrap();
    mm.mmap(a, PAGE, PROT_NONE, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(mm.maps().len(), 2);
    // The first VMA becomes rw-p and merges with the second; the loop then
    // finds the merged VMA starting before where it left off.
    assert_eq!(mm.mprotect(a, 2 * PAGE, RW), Ok(()));
    assert_eq!(mm.maps().len(), 1);
}

/// Was: a fault's TLB shootdown waited forever for another `Cpu` of the same
/// thread on the same address space (only the faulting CPU was quiescent).
#[test]
fn two_cpus_of_one_thread_on_one_address_space() {
    within(10, || {
        let p = phys(8);
        let mm = mm_with(&p, FaultPolicy::MmapLock);
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut c0 = Cpu::attached(&mm);
        let mut c1 = Cpu::attached(&mm);
        // c1 caches the zero page; c0's write fault replaces it and shoots
        // down c1, which can never ack: its thread is the one waiting.
        assert_eq!(c1.read_u8(a), Ok(0));
        assert_eq!(c0.write_u8(a, 1), Ok(()));
        assert_eq!(c1.read_u8(a), Ok(1));
    });
}
