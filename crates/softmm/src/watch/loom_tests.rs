//! loom models of the write watch's arming (`super`'s `# Protocol`) on the
//! real code: a real `Cpu` with a page cached writable, or filling it,
//! against the real `AddressSpace::write_watch` (targeted, under the
//! default `ShootdownTargets::FillOwners`), `dirty_log` and
//! `watchpoint_insert`.
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release -p softmm --lib watch::`.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering};

use crate::mm::{AddressSpace, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::{Access, Cpu, Fault, PAGE_SIZE};

/// A `Cpu` on another thread stores to a page twice, the first store
/// filling its TLB with the page writable (the page is mapped and dirty:
/// no fault), the second in a section that then reads `armed`; meanwhile
/// the main thread watches the page for notify with the real
/// `write_watch`, then sets `armed`. A store made in a section that sees
/// `armed` set (the call returned while the store's section was open) is
/// the bug: `write_watch`'s shootdown must have
/// dropped the entry, so that the store misses, sees the watch and
/// returns `Fault::WriteWatch`.
///
/// Returns what went wrong in one execution, if anything (a panic inside
/// a loom execution aborts the process while loom objects unwind, so the
/// broken variant reports rather than panics).
fn a_store_cached_before_the_arm_does_not_land_after_it() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    // A loom atomic, so that the model sees the store's check conflict
    // with it.
    let armed = Arc::new(AtomicBool::new(false));
    let t = {
        let (mm, armed) = (mm.clone(), armed.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            let first = cpu.write_u8(a, 1);
            // The second store, in a section held open after it: whether
            // it was made, and the call had returned, before the section
            // ended (which the call's shootdown waits for).
            let mut s = cpu.section();
            let second = s.write_u8(a, 2).map(|()| armed.load(Ordering::Acquire));
            drop(s);
            (first, second)
        })
    };
    mm.write_watch(a, PAGE_SIZE, super::WatchMode::Notify).unwrap();
    armed.store(true, Ordering::Release);
    let (first, second) = t.join().unwrap();
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
    let watched = Err(Fault::WriteWatch { addr: a });
    if !(first == Ok(()) || first == watched) {
        return Err(format!("first store: {first:?}"));
    }
    match second {
        Ok(false) => Ok(()),
        Err(f) if f == (Fault::WriteWatch { addr: a }) => Ok(()),
        Ok(true) => Err("a store through an entry cached writable landed after write_watch returned".into()),
        Err(f) => Err(format!("second store: {f:?}")),
    }
}

/// The clear of the dirty log on the real code: a page is logged and
/// dirty, and a `Cpu` on another thread stores to it twice, the first
/// store filling its TLB with the page writable (its mark is set), the
/// second in a section that then reads `cleared`; meanwhile the main
/// thread reads and clears the log with the real `dirty_log`, then sets
/// `cleared`. A store made in a section that sees `cleared` set must be
/// in the next log: the clear's shootdown must have dropped the writable
/// entry, so that the store missed and marked the page again.
fn a_store_after_a_clear_is_in_the_next_log() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    mm.write_watch(a, PAGE_SIZE, super::WatchMode::Log).unwrap();
    let cleared = Arc::new(AtomicBool::new(false));
    let t = {
        let (mm, cleared) = (mm.clone(), cleared.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u8(a, 1).unwrap();
            let mut s = cpu.section();
            let late = s.write_u8(a, 2).map(|()| cleared.load(Ordering::Acquire));
            drop(s);
            late
        })
    };
    let mut bits = [0];
    mm.dirty_log(a, PAGE_SIZE, &mut bits, true).unwrap();
    cleared.store(true, Ordering::Release);
    let late = t.join().unwrap();
    mm.dirty_log(a, PAGE_SIZE, &mut bits, false).unwrap();
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
    match late {
        Ok(true) if bits[0] == 0 => Err("a store after the clear returned is in no log".into()),
        Ok(_) => Ok(()),
        Err(f) => Err(format!("second store: {f:?}")),
    }
}

/// The watchpoint's arming on the real code: a `Cpu` on another thread
/// reads a byte twice, the first load filling its TLB with the page
/// readable, the second in a section that then reads `armed`; meanwhile
/// the main thread inserts a read watchpoint on that byte with the real
/// `watchpoint_insert`, then sets `armed`. A load made in a section that
/// sees `armed` set is the bug: the insert's shootdown must have dropped
/// the entry, so that the load misses, sees the watchpoint and returns
/// `Fault::Watchpoint`.
fn a_load_cached_before_a_watchpoint_does_not_pass_after_it() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let t = {
        let (mm, armed) = (mm.clone(), armed.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            let first = cpu.read_u8(a + 5);
            let mut s = cpu.section();
            let second = s.read_u8(a + 5).map(|_| armed.load(Ordering::Acquire));
            drop(s);
            (first, second)
        })
    };
    mm.watchpoint_insert(a + 5, 1, super::WatchAccess::READ).unwrap();
    armed.store(true, Ordering::Release);
    let (first, second) = t.join().unwrap();
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
    let hit = Fault::Watchpoint { addr: a + 5 };
    if !(first == Ok(0) || first == Err(hit)) {
        return Err(format!("first load: {first:?}"));
    }
    match second {
        Ok(false) => Ok(()),
        Err(f) if f == hit => Ok(()),
        Ok(true) => Err("a load through an entry cached before watchpoint_insert passed after it returned".into()),
        Err(f) => Err(format!("second load: {f:?}")),
    }
}

/// The targeted arming's race on the real code: the page is mapped and
/// dirty but no CPU has filled from it, so its entry names no fill owner;
/// a `Cpu` on another thread makes its first store to it in a section that
/// then reads `armed`, while the main thread watches it with the real
/// `write_watch` (default `ShootdownTargets::FillOwners`), then sets
/// `armed`. The store's fill may check the watches before the arm and
/// record itself in the entry after the arm read the owners: the arm then
/// asks no CPU, and only the fill's own recheck, after its barrier, stops
/// the store. A store made in a section that sees `armed` set is the bug.
fn a_first_store_racing_a_targeted_arm_traps_or_lands_before_it_returns() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let t = {
        let (mm, armed) = (mm.clone(), armed.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            let mut s = cpu.section();
            let store = s.write_u8(a, 1).map(|()| armed.load(Ordering::Acquire));
            drop(s);
            store
        })
    };
    mm.write_watch(a, PAGE_SIZE, super::WatchMode::Notify).unwrap();
    armed.store(true, Ordering::Release);
    let store = t.join().unwrap();
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
    match store {
        Ok(false) => Ok(()),
        Err(f) if f == (Fault::WriteWatch { addr: a }) => Ok(()),
        Ok(true) => Err("a first store racing a targeted arm landed after write_watch returned".into()),
        Err(f) => Err(format!("store: {f:?}")),
    }
}

/// The model, and its variant where the fill does not look at the watches
/// again after naming itself in the entry
/// (`broken::FILL_WITHOUT_RECHECK`): the store checked before the arm,
/// the arm read the entry before the fill named its CPU and asked nobody,
/// and the store lands after the call returned.
#[test]
fn a_first_store_racing_a_targeted_arm_is_stopped_by_the_fills_recheck() {
    crate::sync::broken::check_model(
        a_first_store_racing_a_targeted_arm_traps_or_lands_before_it_returns,
        &super::broken::FILL_WITHOUT_RECHECK,
    );
}

/// The model, and its variant where `watchpoint_insert` returns without
/// its shootdown (`broken::POINT_WITHOUT_SHOOTDOWN`): the other CPU's
/// readable entry survives, and its second load passes after the call
/// returned.
#[test]
fn a_watchpoint_inserted_while_another_cpu_holds_the_page_takes_effect_before_the_call_returns() {
    crate::sync::broken::check_model(
        a_load_cached_before_a_watchpoint_does_not_pass_after_it,
        &super::broken::POINT_WITHOUT_SHOOTDOWN,
    );
}

/// The model, and its variant where `write_watch` returns without its
/// shootdown (`broken::ARM_WITHOUT_SHOOTDOWN`): the other CPU's writable
/// entry survives, and its second store lands after the call returned.
#[test]
fn a_watch_armed_while_another_cpu_holds_the_page_writable_takes_effect_before_the_call_returns() {
    crate::sync::broken::check_model(
        a_store_cached_before_the_arm_does_not_land_after_it,
        &super::broken::ARM_WITHOUT_SHOOTDOWN,
    );
}

/// The model, and its variant where `dirty_log` clears without its
/// shootdown (`broken::CLEAR_WITHOUT_SHOOTDOWN`): the other CPU's writable
/// entry survives, and its second store, made after the call returned,
/// marks nothing.
#[test]
fn a_store_after_the_dirty_log_is_cleared_marks_the_page_again() {
    crate::sync::broken::check_model(a_store_after_a_clear_is_in_the_next_log, &super::broken::CLEAR_WITHOUT_SHOOTDOWN);
}
