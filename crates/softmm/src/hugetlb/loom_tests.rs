//! loom models of seed 000's race on the real code, under each
//! [`HugetlbPolicy`]: the cover letter's "faulting thread / unsharing
//! thread" diagram, and a fault against truncate.
//!
//! Two address spaces `A` and `B` map one hugetlbfs file at 1 GiB-aligned
//! addresses and share `B`'s PMD table (the real `huge_pmd_share`); page 1
//! of the file is in the page cache, mapped by no one. One thread takes the
//! real write fault on page 1 in `A` (default fault policy: through the
//! VMA's read reference, no `mmap_lock`); the other runs the real syscalls.
//!
//! After the setup, `lock::broken::NO_SHARE` keeps a fault whose table was
//! unshared from linking one again (see there: a false deadlock of loom's
//! try-lock model otherwise); it allocates a table of its own.
//!
//! Run with the loom line of scripts/test.sh. Each model is run once as is
//! and once with `lock::broken::SKIP_POLICY` set (the fault skips its
//! policy's lock or validation) or `SKIP_REZAP` (truncate does not zap a
//! page that a fault mapped behind its first zap), and must find the race
//! in the broken variant: that is what shows the model can fail.

use std::sync::Arc;

use super::lock::broken;
use super::share::PUD_SIZE;
use super::HPAGE_SIZE as HP;
use crate::error::Fault;
use crate::fault::Access;
use crate::mm::{AddressSpace, HugetlbPolicy, MmConfig};
use crate::pgtable::Pte;
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::{File, OpenFile};

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    // Table scans are 512 loads each.
    b.max_branches = 200_000;
    b
}

/// The two sharers: `B` faulted page 0 (its PMD table), `A` read page 0 and
/// linked that table; page 1 is in the page cache. Returns `(phys, file, A,
/// B, a, b)`.
fn setup(policy: HugetlbPolicy) -> (Arc<PhysMem>, Arc<File>, Arc<AddressSpace>, Arc<AddressSpace>, u64, u64) {
    broken::NO_SHARE.store(false, std::sync::atomic::Ordering::Relaxed);
    let phys = PhysMem::new(PhysConfig::new(3 * HP).hugepages(2)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/db", PUD_SIZE).unwrap();
    f.fallocate(0, HP, HP).unwrap();
    let open = OpenFile::read_write(&f);
    let config = MmConfig::default().hugetlb_policy(policy);
    let map = |mm: &AddressSpace, at: u64| {
        let flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE;
        mm.mmap(at, PUD_SIZE, PROT_READ | PROT_WRITE, flags, Some(&open), 0).unwrap()
    };
    let mm_b = AddressSpace::new(&phys, config.clone()).unwrap();
    let b = map(&mm_b, 4 * PUD_SIZE);
    mm_b.handle_fault(b, Access::Write).unwrap();
    let mm_a = AddressSpace::new(&phys, config).unwrap();
    let a = map(&mm_a, 8 * PUD_SIZE);
    mm_a.handle_fault(a, Access::Read).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_shares, 1, "A links B's table");
    broken::NO_SHARE.store(true, std::sync::atomic::Ordering::Relaxed);
    (phys, f, mm_a, mm_b, a, b)
}

/// The write fault on page 1 of `A`, on its own thread.
fn spawn_fault(mm: &Arc<AddressSpace>, addr: u64) -> loom::thread::JoinHandle<Result<(), Fault>> {
    let mm = mm.clone();
    loom::thread::spawn(move || mm.handle_fault(addr, Access::Write))
}

/// What a model found wrong in one execution, if anything.
type Outcome = Result<(), String>;

/// Runs `model` under `policy`, intact, then broken by `switch`: intact, no
/// execution may find anything wrong (a panic fails the test); broken, some
/// execution must. (A model reports rather than panics because a panic
/// inside a loom execution aborts the process while loom objects unwind.)
fn check(policy: HugetlbPolicy, switch: &'static std::sync::atomic::AtomicBool, model: fn(HugetlbPolicy) -> Outcome) {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    // The switches are process-wide: one model at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    switch.store(false, Relaxed);
    builder().check(move || {
        if let Err(e) = model(policy) {
            panic!("{policy:?}: {e}");
        }
    });
    let caught = Arc::new(AtomicBool::new(false));
    let seen = caught.clone();
    switch.store(true, Relaxed);
    builder().check(move || {
        if model(policy).is_err() {
            seen.store(true, Relaxed);
        }
    });
    switch.store(false, Relaxed);
    assert!(caught.load(Relaxed), "{policy:?}: the model did not catch the broken variant");
}

/// The cover letter's race. While `A`'s fault holds its PMD entry in the
/// shared table, `MADV_DONTNEED` in `A` unshares it (`huge_pmd_unshare`),
/// and then `B`, the table's only user now, write-protects it in place
/// (`mprotect(PROT_READ)`, which needs no unshare of an exclusive table).
/// Once both are done, no entry of `B`'s is writable: a fault that
/// installed its writable entry into the table after `A` let go of it
/// would leave one, a write through a read-only mapping of `B`.
fn fault_vs_unshare(policy: HugetlbPolicy) -> Outcome {
    let (phys, f, mm_a, mm_b, a, b) = setup(policy);
    let t = spawn_fault(&mm_a, a + HP);
    mm_a.madvise(a, HP, MADV_DONTNEED).unwrap();
    mm_b.mprotect(b, PUD_SIZE, PROT_READ).unwrap();
    let r = t.join().unwrap();
    if r.is_err() {
        return Err(format!("the fault failed: {r:?}"));
    }
    for page in [b, b + HP] {
        let pte = mm_b.pte_at(page);
        if pte.has(Pte::WRITE) {
            return Err(format!("B's entry {pte:?} at {page:#x} is writable after mprotect"));
        }
    }
    // (The leak checks are the unit tests': here the VMA trees, which hold
    // the file and so its pages, wait for grace periods the model does not
    // run to the end.)
    drop((phys, mm_a, mm_b, f));
    Ok(())
}

/// A fault against truncate: once `set_len` has returned and the fault's
/// thread is joined, no address space maps page 1 and its frames are back
/// in the pool (a fault that mapped it behind truncate's zap, and was not
/// zapped again, would leave it mapped in a table, reachable after
/// truncate returned).
fn fault_vs_truncate(policy: HugetlbPolicy) -> Outcome {
    let (phys, f, mm_a, mm_b, a, b) = setup(policy);
    let t = spawn_fault(&mm_a, a + HP);
    f.set_len(HP).unwrap();
    let r = t.join().unwrap();
    if !(r.is_ok() || r == Err(Fault::Bus { addr: a + HP })) {
        return Err(format!("the fault ended in {r:?}"));
    }
    if mm_a.pte_at(a + HP).has_frame() || mm_b.pte_at(b + HP).has_frame() {
        return Err("a truncated page is still mapped".into());
    }
    if phys.huge_page_stats().free != 1 {
        return Err("the truncated page is still held".into());
    }
    // (The leak checks are the unit tests': here the VMA trees, which hold
    // the file and so its pages, wait for grace periods the model does not
    // run to the end.)
    drop((phys, mm_a, mm_b, f));
    Ok(())
}

#[test]
fn fault_vs_unshare_i_mmap_rwsem() {
    check(HugetlbPolicy::IMmapRwsem, &broken::SKIP_POLICY, fault_vs_unshare);
}

#[test]
fn fault_vs_unshare_vma_lock() {
    check(HugetlbPolicy::VmaLock, &broken::SKIP_POLICY, fault_vs_unshare);
}

#[test]
fn fault_vs_unshare_lock_free() {
    check(HugetlbPolicy::LockFree, &broken::SKIP_POLICY, fault_vs_unshare);
}

#[test]
fn fault_vs_truncate_every_policy() {
    for &policy in HugetlbPolicy::ALL {
        check(policy, &broken::SKIP_REZAP, fault_vs_truncate);
    }
}
