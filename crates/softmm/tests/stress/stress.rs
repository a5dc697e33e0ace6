//! Multithreaded stress tests of softmm's concurrency: TLB shootdowns against
//! running, parked and syscalling CPUs, mapping changes racing with accesses,
//! frame reuse after munmap, and fork under load, each under every
//! [`FaultPolicy`]. Each test runs a fixed number of iterations under a hang
//! detector (a watchdog, not a timing assertion) and ends with a leak check.
//!
//! `STRESS_SEED=<n>` changes the random choices, `STRESS_SCALE=<n>` multiplies
//! the iteration counts.
//!
//! Bugs these tests found have regression tests in `stress_regressions.rs`.

use softmm_testkit::common;

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use common::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, FaultPolicy, SegvCode};

// ---------------------------------------------------------------------------
// Helpers

/// Hang detector: a scenario not done after this long is a deadlock.
const WATCHDOG_SECS: u64 = 60;
const WORDS: usize = (PAGE / 8) as usize;

/// Runs `scenario` for every fault policy, each under its own watchdog.
fn for_each_policy(test: &str, scenario: fn(FaultPolicy, Shootdown, u64)) {
    let _serial = serial();
    let seed = stress_seed(0x5eed);
    for (policy, shootdown) in fault_and_shootdown_policies() {
        let name = format!("{}, {}", policy.name(), shootdown.name());
        eprintln!("{test} [{name}] STRESS_SEED={seed}");
        watchdog(&format!("{test}[{name}]"), WATCHDOG_SECS, move || scenario(policy, shootdown, seed));
    }
}

/// Every value of every shootdown axis is in some covering configuration,
/// the pairs with the fault policies take each, and the first covering
/// configuration is the default.
#[test]
fn the_covering_shootdown_configurations_take_every_value() {
    use softmm::{MmConfig, PostingPolicy, ShootdownPolicy, ShootdownTargets};
    let pairs: Vec<_> = fault_and_shootdown_policies().collect();
    for &p in ShootdownPolicy::ALL {
        assert!(pairs.iter().any(|(_, s)| s.policy == p), "{p:?}");
    }
    for &t in ShootdownTargets::ALL {
        assert!(pairs.iter().any(|(_, s)| s.targets == t), "{t:?}");
    }
    for &q in PostingPolicy::ALL {
        assert!(pairs.iter().any(|(_, s)| s.posting == q), "{q:?}");
    }
    for &f in FaultPolicy::ALL {
        assert!(pairs.iter().any(|&(g, _)| g == f), "{f:?}");
    }
    let default = MmConfig::default();
    let first = Shootdown::COVERING[0];
    assert_eq!(
        (first.policy, first.targets, first.posting),
        (default.shootdown_policy, default.shootdown_targets, default.posting_policy)
    );
}

fn map_err(addr: u64) -> Fault {
    Fault::Segv { addr, code: SegvCode::MapErr }
}

fn acc_err(addr: u64) -> Fault {
    Fault::Segv { addr, code: SegvCode::AccErr }
}

/// Blocking waits on conditions over atomics: an idle thread sleeps (its CPU
/// parked) instead of spinning, and leaves its core to the busy ones. (On an
/// oversubscribed machine a shootdown that needs a preempted running CPU
/// waits until that CPU runs again.)
struct Note {
    m: Mutex<()>,
    cv: Condvar,
}

impl Note {
    fn new() -> Note {
        Note { m: Mutex::new(()), cv: Condvar::new() }
    }

    /// Wakes the waiters; call after changing what they wait for.
    fn notify(&self) {
        drop(self.m.lock().unwrap_or_else(|e| e.into_inner()));
        self.cv.notify_all();
    }

    /// Waits, parked, until `cond` holds (re-checked at each notify).
    fn wait(&self, cpu: &mut Cpu, mut cond: impl FnMut() -> bool) {
        cpu.park();
        let mut g = self.m.lock().unwrap_or_else(|e| e.into_inner());
        while !cond() {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        drop(g);
        cpu.resume();
    }
}

/// Sets `failed` and wakes every waiter if dropped while panicking, so that
/// the other threads of a scenario stop waiting for the one that failed.
struct FailGuard<'a> {
    failed: &'a AtomicBool,
    notes: Vec<&'a Note>,
}

impl Drop for FailGuard<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.failed.store(true, SeqCst);
            self.notes.iter().for_each(|n| n.notify());
        }
    }
}

/// The stress tests run one at a time: each wants the whole machine.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A tagged guest word: who wrote it, where (page or word id) and when.
const MAGIC: u64 = 0x5a;

fn enc(who: u64, place: u64, seq: u64) -> u64 {
    debug_assert!(who < 16 && place < 4096 && seq < 1 << 40);
    (MAGIC << 56) | (who << 52) | (place << 40) | seq
}

fn dec(v: u64) -> Option<(u64, u64, u64)> {
    (v >> 56 == MAGIC).then_some(((v >> 52) & 0xf, (v >> 40) & 0xfff, v & ((1 << 40) - 1)))
}

fn read_page(cpu: &mut Cpu, addr: u64) -> Result<Vec<u64>, Fault> {
    let mut buf = vec![0u8; PAGE as usize];
    cpu.read(addr, &mut buf)?;
    Ok(buf.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

mod fork_load;
mod parked;
mod stale_tlb;
mod writers;
