//! Which CPUs arming a watch shoots down (`crate::watch`'s `# Protocol`):
//! under the fill-owner policies only those that may cache a translation
//! of the range, as a zap's shootdown; under `broadcast`, every attached
//! CPU, as before. Either way a store after the call returns traps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, ShootdownTargets, WatchAccess, WatchMode};
use softmm_testkit::common::assert_no_leaks;

const PAGE: u64 = 4096;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

fn setup(targets: ShootdownTargets) -> (Arc<PhysMem>, Arc<AddressSpace>) {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default().shootdown_targets(targets)).unwrap();
    (phys, mm)
}

fn flush_requests(mm: &AddressSpace) -> u64 {
    mm.stats().tlb.flush_requests
}

/// Two CPUs of other threads stay attached while the main thread arms
/// watches on page `w`: `owner` stored to it (its TLB holds it writable),
/// `stranger` only to page `o`. Each arming call (a notify watch, a log
/// watch, a write watchpoint) sends a flush request to
/// `owner` and, under the fill-owner policies, none to `stranger`; under
/// `broadcast` both get one. Afterwards both CPUs' stores to `w` trap:
/// the stranger's misses its TLB and sees the watch.
#[test]
fn arming_a_watch_asks_only_the_cpus_that_cached_the_range() {
    for &targets in ShootdownTargets::ALL {
        let (phys, mm) = setup(targets);
        let a = mm.mmap(0, 2 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
        let (w, o) = (a, a + PAGE);
        let per_call = if targets == ShootdownTargets::Broadcast { 2 } else { 1 };
        // Each thread: its store, then wait while the main thread arms,
        // then its store to `w` again, which must trap.
        let ready = Barrier::new(3);
        let armed = Barrier::new(3);
        let (ready, armed, mm2) = (&ready, &armed, &mm);
        std::thread::scope(|s| {
            let owner = s.spawn(move || {
                let mut cpu = Cpu::attached(mm2);
                cpu.write_u64(w, 1).unwrap();
                ready.wait();
                armed.wait();
                cpu.write_u64(w, 2)
            });
            let stranger = s.spawn(move || {
                let mut cpu = Cpu::attached(mm2);
                cpu.write_u64(o, 1).unwrap();
                ready.wait();
                armed.wait();
                (cpu.write_u64(w + 8, 2), cpu.write_u64(o, 3))
            });
            ready.wait();
            // The requests each call sent, asserted once the threads are
            // released (a failed assertion here would leave them waiting).
            let mut sent = Vec::new();
            let mut before = flush_requests(&mm);
            let mut requests = |call: &'static str| {
                let now = flush_requests(&mm);
                sent.push((call, now - before));
                before = now;
            };
            mm.write_watch(w, PAGE, WatchMode::Notify).unwrap();
            requests("write_watch");
            mm.write_watch(w, PAGE, WatchMode::Log).unwrap();
            requests("write_watch(log)");
            // Nothing was marked: a clear that clears nothing shoots nothing.
            let mut bits = [0u64];
            mm.dirty_log(w, PAGE, &mut bits, true).unwrap();
            requests("dirty_log");
            mm.watchpoint_insert(w + 100, 2, WatchAccess::WRITE).unwrap();
            requests("watchpoint_insert");
            armed.wait();
            assert_eq!(owner.join().unwrap(), Err(Fault::WriteWatch { addr: w }), "{targets:?}");
            assert_eq!(stranger.join().unwrap(), (Err(Fault::WriteWatch { addr: w + 8 }), Ok(())), "{targets:?}");
            let want = [
                ("write_watch", per_call),
                ("write_watch(log)", per_call),
                ("dirty_log", 0),
                ("watchpoint_insert", per_call),
            ];
            assert_eq!(sent, want, "{targets:?}: flush requests per call");
            assert_eq!(bits[0], 0);
        });
        mm.write_unwatch(w, PAGE, WatchMode::Notify).unwrap();
        drop(mm);
        assert_no_leaks(&phys);
    }
}

/// A thread stores to a page in a loop, each store in an access section
/// that then reads whether the watch is armed, while the main thread arms
/// a notify watch on the page, sets `armed`, waits for two more of the
/// thread's stores, clears `armed` and unwatches, 300 times; a third
/// thread's CPU stays attached, storing to another page. A store made in
/// a section that saw `armed` set landed after `write_watch` returned:
/// under every shootdown-target policy there is none, and the stores made
/// while the watch is armed trap.
#[test]
fn a_store_after_the_watch_is_armed_always_traps() {
    const ROUNDS: u64 = 300;
    for &targets in ShootdownTargets::ALL {
        let (phys, mm) = setup(targets);
        let a = mm.mmap(0, 2 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
        let armed = AtomicBool::new(false);
        let (round, attempts) = (AtomicU64::new(0), AtomicU64::new(0));
        let (armed, round, attempts, mm2) = (&armed, &round, &attempts, &mm);
        let (late, trapped) = std::thread::scope(|s| {
            let writer = s.spawn(move || {
                let mut cpu = Cpu::attached(mm2);
                let (mut late, mut trapped) = (0u64, 0u64);
                while round.load(Ordering::Acquire) < ROUNDS {
                    let mut sec = cpu.section();
                    match sec.write_u8(a + 3, 7) {
                        Ok(()) => late += u64::from(armed.load(Ordering::SeqCst)),
                        Err(Fault::WriteWatch { .. }) => trapped += 1,
                        Err(f) => panic!("{f:?}"),
                    }
                    drop(sec);
                    attempts.fetch_add(1, Ordering::SeqCst);
                }
                (late, trapped)
            });
            let bystander = s.spawn(move || {
                let mut cpu = Cpu::attached(mm2);
                while round.load(Ordering::Acquire) < ROUNDS {
                    cpu.write_u8(a + PAGE, 1).unwrap();
                    std::thread::yield_now();
                }
            });
            for i in 0..ROUNDS {
                mm.write_watch(a, PAGE, WatchMode::Notify).unwrap();
                armed.store(true, Ordering::SeqCst);
                // Two whole stores of the writer while armed (the first
                // may have begun before the arm).
                let seen = attempts.load(Ordering::SeqCst);
                while attempts.load(Ordering::SeqCst) < seen + 2 && !writer.is_finished() {
                    std::thread::yield_now();
                }
                armed.store(false, Ordering::SeqCst);
                mm.write_unwatch(a, PAGE, WatchMode::Notify).unwrap();
                round.store(i + 1, Ordering::Release);
            }
            bystander.join().unwrap();
            writer.join().unwrap()
        });
        assert_eq!(late, 0, "{targets:?}: stores landed after write_watch returned");
        assert!(trapped >= ROUNDS, "{targets:?}: {trapped} stores met the watch");
        drop(mm);
        assert_no_leaks(&phys);
    }
}
