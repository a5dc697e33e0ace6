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
//! try-lock model otherwise); it allocates a table of its own. The models
//! in which no thread takes an `mmap_lock` for write leave sharing on:
//! `dontneed_vs_resharing_fault` is the re-share after an unshare.
//!
//! `exit_vs_lock_free_fault` models a sharer exiting while a lock-free
//! fault holds the table it shares (the exit's grace period; broken by
//! `FREE_AT_ONCE`, which marks the table freed instead of freeing it, so
//! that the fault's later lock is seen).
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

fn builder(preemptions: usize) -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(preemptions);
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
    let config = MmConfig::model_default().hugetlb_policy(policy);
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
    crate::sync::model::spawn(move || mm.handle_fault(addr, Access::Write))
}

/// What a model found wrong in one execution, if anything.
type Outcome = Result<(), String>;

/// Runs `model` under `policy`, intact, then broken by `switch`: intact, no
/// execution may find anything wrong (a panic fails the test); broken, some
/// execution must. (A model reports rather than panics because a panic
/// inside a loom execution aborts the process while loom objects unwind.)
fn check(policy: HugetlbPolicy, switch: &'static std::sync::atomic::AtomicBool, model: fn(HugetlbPolicy) -> Outcome) {
    check_bounded(2, policy, switch, model);
}

/// [`check`] with `preemptions` as loom's preemption bound.
fn check_bounded(
    preemptions: usize,
    policy: HugetlbPolicy,
    switch: &'static std::sync::atomic::AtomicBool,
    model: fn(HugetlbPolicy) -> Outcome,
) {
    use std::sync::atomic::Ordering::Relaxed;
    // The switches are process-wide: one model at a time.
    let _serial = broken::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    switch.store(false, Relaxed);
    builder(preemptions).check(move || {
        if let Err(e) = model(policy) {
            panic!("{policy:?}: {e}");
        }
    });
    switch.store(true, Relaxed);
    let caught = crate::sync::broken::caught(preemptions, || builder(preemptions), move || model(policy).is_err());
    switch.store(false, Relaxed);
    assert!(caught, "{policy:?}: the model did not catch the broken variant");
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

/// Two mappers of one file, neither sharing yet: `A` faulted page 1 into a
/// PMD table of its own (never shared), `B` maps the same 1 GiB with no
/// table, and sharing stays allowed (no `NO_SHARE`: no `mmap_lock` writer
/// runs in these models, so loom's try-lock cannot report a false
/// deadlock). With `b_faulted`, `B` instead faulted pages 0 and 1 into its
/// own table and `A` has none. Returns `(phys, file, A, B, a, b)`.
fn setup_unshared(
    policy: HugetlbPolicy,
    b_faulted: bool,
) -> (Arc<PhysMem>, Arc<File>, Arc<AddressSpace>, Arc<AddressSpace>, u64, u64) {
    setup_unshared_config(MmConfig::model_default().hugetlb_policy(policy), b_faulted)
}

/// [`setup_unshared`] with both address spaces made with `config`.
fn setup_unshared_config(
    config: MmConfig,
    b_faulted: bool,
) -> (Arc<PhysMem>, Arc<File>, Arc<AddressSpace>, Arc<AddressSpace>, u64, u64) {
    broken::NO_SHARE.store(false, std::sync::atomic::Ordering::Relaxed);
    let phys = PhysMem::new(PhysConfig::new(3 * HP).hugepages(2)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/db", PUD_SIZE).unwrap();
    f.fallocate(0, 0, 2 * HP).unwrap();
    let open = OpenFile::read_write(&f);
    let map = |mm: &AddressSpace, at: u64| {
        let flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE;
        mm.mmap(at, PUD_SIZE, PROT_READ | PROT_WRITE, flags, Some(&open), 0).unwrap()
    };
    // `B` maps first, so that truncate zaps it first: a zap of `B` after
    // the link would unshare it (and flush `B`) whatever `A`'s zap did.
    let mm_b = AddressSpace::new(&phys, config.clone()).unwrap();
    let b = map(&mm_b, 8 * PUD_SIZE);
    let mm_a = AddressSpace::new(&phys, config).unwrap();
    let a = map(&mm_a, 4 * PUD_SIZE);
    if b_faulted {
        mm_b.handle_fault(b, Access::Write).unwrap();
        mm_b.handle_fault(b + HP, Access::Write).unwrap();
    } else {
        mm_a.handle_fault(a + HP, Access::Write).unwrap();
    }
    assert_eq!(phys.huge_page_stats().pmd_shares, 0, "nothing shared yet");
    (phys, f, mm_a, mm_b, a, b)
}

/// Race 1 of the unshare side: truncate's zap of `A`'s window, whose table
/// was never shared, against `B`'s fault linking that very table
/// (`huge_pmd_share`) and its CPU reading page 1 through it. Once truncate
/// has returned, `B`'s CPU must not read page 1 (its frames are back in
/// the pool): it takes `SIGBUS`. A zap that took no `i_mmap` lock for the
/// window would clear the entry in a table `B` had just linked and flush
/// only `A`, and `B`'s CPU would keep a translation to the freed page.
fn truncate_vs_sharing_fault(policy: HugetlbPolicy) -> Outcome {
    use loom::sync::atomic::{AtomicBool, Ordering};
    let (phys, f, mm_a, mm_b, _a, b) = setup_unshared(policy, false);
    let done = Arc::new(AtomicBool::new(false));
    let t = {
        let (mm_b, done) = (mm_b.clone(), done.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = crate::Cpu::attached(&mm_b);
            let first = cpu.read_u64(b + HP + 8);
            // Quiescent meanwhile (outside any access), as a thread that
            // waits: truncate's flushes do not wait for this CPU.
            while !done.load(Ordering::Acquire) {
                loom::thread::yield_now();
            }
            (first, cpu.read_u64(b + HP + 8))
        })
    };
    f.set_len(HP).unwrap();
    done.store(true, Ordering::Release);
    let (first, second) = t.join().unwrap();
    if !(first.is_ok() || first == Err(Fault::Bus { addr: b + HP + 8 })) {
        return Err(format!("B's first read ended in {first:?}"));
    }
    if second != Err(Fault::Bus { addr: b + HP + 8 }) {
        return Err(format!("B's CPU read {second:?} from a page truncate had freed"));
    }
    drop((phys, mm_a, mm_b, f));
    Ok(())
}

/// Race 2: `MADV_DONTNEED` of pages 0 and 1 in `A`, whose window has no
/// table yet, against `A`'s own fault linking `B`'s table there. `A`'s
/// advice must never clear `B`'s entries: either the link came first and
/// the zap unshares it, or the zap came first and the fault links `B`'s
/// table after. A zap that decided "never shared, nothing to unshare"
/// before its walk would walk into `B`'s table once linked, and clear
/// entries `B` maps (flushing only `A`).
fn dontneed_vs_own_sharing_fault(policy: HugetlbPolicy) -> Outcome {
    let (phys, f, mm_a, mm_b, a, b) = setup_unshared(policy, true);
    let t = {
        let mm_a = mm_a.clone();
        crate::sync::model::spawn(move || mm_a.handle_fault(a + HP, Access::Read))
    };
    mm_a.madvise(a, 2 * HP, MADV_DONTNEED).unwrap();
    let r = t.join().unwrap();
    if r.is_err() {
        return Err(format!("A's fault failed: {r:?}"));
    }
    for page in [b, b + HP] {
        if !mm_b.pte_at(page).has_frame() {
            return Err(format!("A's MADV_DONTNEED cleared B's entry at {page:#x}"));
        }
    }
    drop((phys, mm_a, mm_b, f));
    Ok(())
}

#[test]
fn truncate_vs_sharing_fault_vma_lock() {
    // One preemption is enough for the race (truncate preempted between
    // its zap of `B` and its zap of `A`; `B`'s thread then waits), and
    // keeps the model to seconds: with two it explores for minutes (a
    // CPU's read and a truncate of two address spaces).
    check_bounded(1, HugetlbPolicy::VmaLock, &broken::SKIP_ZAP_LOCK, truncate_vs_sharing_fault);
}

#[test]
fn dontneed_vs_own_sharing_fault_every_policy() {
    for &policy in HugetlbPolicy::ALL {
        check(policy, &broken::SKIP_ZAP_LOCK, dontneed_vs_own_sharing_fault);
    }
}

/// A re-share after an unshare: `A` and `B` share `B`'s table (page 0
/// faulted by `B`, linked by `A`); `MADV_DONTNEED` of page 0 in `A`
/// unshares `A`'s window while `A`'s write fault on page 1 runs, and that
/// fault, finding its table unlinked (or no table at all), links `B`'s
/// table again through `huge_pmd_share` (sharing stays allowed: no
/// `mmap_lock` writer runs here, so loom's try-lock cannot report its false
/// deadlock, see `broken::NO_SHARE`). `A`'s advice must never clear `B`'s
/// entry of page 0: a zap that unshared and then walked without holding the
/// window's locks would walk into `B`'s table once the fault re-linked it.
fn dontneed_vs_resharing_fault(policy: HugetlbPolicy) -> Outcome {
    let (phys, f, mm_a, mm_b, a, b) = setup(policy);
    broken::NO_SHARE.store(false, std::sync::atomic::Ordering::Relaxed);
    let t = spawn_fault(&mm_a, a + HP);
    mm_a.madvise(a, HP, MADV_DONTNEED).unwrap();
    let r = t.join().unwrap();
    if r.is_err() {
        return Err(format!("A's fault failed: {r:?}"));
    }
    if !mm_b.pte_at(b).has_frame() {
        return Err("A's MADV_DONTNEED cleared B's entry of page 0".into());
    }
    drop((phys, mm_a, mm_b, f));
    Ok(())
}

#[test]
fn dontneed_vs_resharing_fault_every_policy() {
    for &policy in HugetlbPolicy::ALL {
        check(policy, &broken::SKIP_ZAP_LOCK, dontneed_vs_resharing_fault);
    }
}

/// A sharer exits during a lock-free fault that found the shared table:
/// `A`'s write fault on page 1 walks to `B`'s table through `A`'s link;
/// meanwhile `MADV_DONTNEED` in `A` unshares it (`B` is then its only
/// user) and `B`'s address space dies, dropping the table's last link.
/// The fault then locks the table to validate its link (which fails, and
/// it retries in a table of its own): the dying tree frees such a table
/// only after a grace period, which the fault's epoch guard holds open.
/// Broken with `FREE_AT_ONCE` (the table freed at the exit), the fault
/// locks a freed table.
fn exit_vs_lock_free_fault(policy: HugetlbPolicy) -> Outcome {
    use std::sync::atomic::Ordering::Relaxed;
    let (phys, f, mm_a, mm_b, a, _b) = setup(policy);
    broken::USED_FREED_TABLE.store(false, Relaxed);
    let t = spawn_fault(&mm_a, a + HP);
    mm_a.madvise(a, HP, MADV_DONTNEED).unwrap();
    drop(mm_b);
    let r = t.join().unwrap();
    if broken::USED_FREED_TABLE.swap(false, Relaxed) {
        return Err("A's fault locked a PMD table B's exit had freed".into());
    }
    if r.is_err() {
        return Err(format!("A's fault failed: {r:?}"));
    }
    drop((phys, mm_a, f));
    Ok(())
}

#[test]
fn exit_vs_lock_free_fault_on_the_shared_table() {
    // Two preemptions (the default): with one, loom never runs the fault
    // up to its walk and then the other thread through the unshare and
    // the drop, and the broken variant goes uncaught (seen).
    check(HugetlbPolicy::LockFree, &broken::FREE_AT_ONCE, exit_vs_lock_free_fault);
}

/// `huge_pmd_share` from an address space whose writer is unmapping the
/// window: `B` faulted page 0 into a table of its own, never shared; `A`,
/// with the window mapped and no table, read-faults page 0 (linking `B`'s
/// table through the real `huge_pmd_share`, which takes no lock of `B`)
/// while `B` unmaps the whole window under `UnmapPolicy::Locked` (one
/// write section: the VMA detached, the unshare check, the zap, the tables
/// freed, and only then the tree published and the reverse map updated,
/// so `i_mmap` does not order the zap against the link). `A`'s fault must
/// leave page 0 mapped in `A`: either it linked before `B`'s detach
/// (which waits for the read reference of `B`'s VMA that the share holds),
/// and `B`'s unmap then finds the table shared and only drops its link;
/// or the detached VMA refused the reference and `A` faulted into a table
/// of its own. Broken by `SHARE_WITHOUT_VMA_REF` (the share links without
/// that reference), `B`'s unmap, having found its table never shared,
/// zaps the entry `A` just mapped through the link. (Under the lock-free
/// and downgrade unmaps the tree is published and the reverse map updated,
/// under `i_mmap` for write, before the zap, so there `i_mmap` alone
/// orders them, as in Linux.)
fn munmap_vs_sharing_fault(policy: HugetlbPolicy) -> Outcome {
    let config = MmConfig::model_default().hugetlb_policy(policy).unmap_policy(crate::UnmapPolicy::Locked);
    let (phys, f, mm_a, mm_b, a, b) = setup_unshared_config(config, true);
    let t = {
        let mm_a = mm_a.clone();
        crate::sync::model::spawn(move || mm_a.handle_fault(a, Access::Read))
    };
    mm_b.munmap(b, PUD_SIZE).unwrap();
    let r = t.join().unwrap();
    if r.is_err() {
        return Err(format!("A's fault failed: {r:?}"));
    }
    if !mm_a.pte_at(a).has_frame() {
        return Err("B's munmap cleared the entry A's fault had mapped through B's table".into());
    }
    drop((phys, mm_a, mm_b, f));
    Ok(())
}

#[test]
fn munmap_vs_sharing_fault_from_another_address_space() {
    check(HugetlbPolicy::default(), &broken::SHARE_WITHOUT_VMA_REF, munmap_vs_sharing_fault);
}
