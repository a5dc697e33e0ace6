//! The scalable shared mode of the address-space lock (issue 32, W3): a
//! big-reader lock in the style of BRAVO and Linux's `percpu_rw_semaphore`,
//! whose shared side writes only its own CPU slot's line.
//!
//! Range writers (bounded-range `mmap`, `munmap`, ... each under the locks
//! of the 1 GiB windows it touches) enter the shared mode; a whole-space
//! operation (every `mmap_lock` holder under the range policy: fork, exit,
//! the maps dump, the fault fallback) *blocks* it after taking `mmap_lock`,
//! and waits until every slot has drained, so that it then runs alone
//! against range writers as it runs alone against other `mmap_lock`
//! users.
//!
//! # Protocol
//!
//! Dekker's: each side announces itself, issues a SeqCst fence, then looks
//! for the other.
//!
//! * A range writer adds one to its slot's `inside` count, fences, and
//!   loads `blockers` (Acquire). If it is zero the writer is in; otherwise
//!   it takes its count back (Release) and fails, and its caller takes the
//!   exclusive path. Leaving subtracts one (Release).
//! * A blocker adds one to `blockers`, fences, and waits until it loads
//!   (Acquire) zero from every slot. Unblocking subtracts one (Release).
//!
//! Of two fences in SeqCst order, the later one's side sees the other's
//! announcement: either the writer sees `blockers` nonzero and backs off,
//! or the blocker sees the writer's count and waits for its exit, whose
//! Release the blocker's Acquire load of zero synchronizes with (so the
//! writer's changes happen before the blocker's section). A writer that
//! enters after an unblock loads `blockers` with Acquire from the unblock's
//! Release, so the blocker's changes happen before the writer's section.
//! A blocker's wait is bounded by the range writers' sections, which take
//! no lock a blocker holds; a range writer never waits while inside.
//!
//! Model: `sync/loom_tests.rs`, `range_writer_vs_blocker`, seen failing
//! with [`broken::range_writers`](super::broken::range_writers)'
//! `NO_ENTER_FENCE` (the writer's fence skipped) and `NO_RECHECK` (the
//! writer never looks at `blockers`).

use super::broken::range_writers as broken;
use super::percpu::PerCpu;
use super::{fence, AtomicU64, Ordering};

/// The shared mode of one address space's lock.
#[derive(Default)]
pub(crate) struct RangeWriters {
    /// Range writers inside, per CPU slot (a thread's slot: two threads may
    /// share one, so the counts are read-modify-writes).
    inside: PerCpu<Inside>,
    /// Blockers: whole-space holders that keep range writers out.
    blockers: AtomicU64,
}

/// One slot's count of range writers inside, and (with the
/// `shared-write-stats` feature) which thread wrote it last: the slot is
/// its threads' own line, shared only when two threads share the slot.
#[derive(Default)]
struct Inside {
    count: AtomicU64,
    written: super::LastWriter,
}

/// A range writer inside the shared mode; leaving on drop.
#[must_use = "the shared mode is left when the guard drops"]
pub(crate) struct SharedGuard<'a> {
    slot: &'a AtomicU64,
}

impl Drop for SharedGuard<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::Release);
    }
}

/// The shared mode blocked, and drained of range writers; unblocked on drop.
#[must_use = "range writers are kept out until the guard drops"]
pub(crate) struct Blocked<'a> {
    lock: &'a RangeWriters,
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.lock.blockers.fetch_sub(1, Ordering::Release);
    }
}

impl RangeWriters {
    /// Enters the shared mode, or `None` without waiting while a blocker
    /// holds it (the caller takes the exclusive path). Writes only the caller's
    /// slot while no blocker runs.
    pub(crate) fn try_enter(&self) -> Option<SharedGuard<'_>> {
        let Inside { count: slot, written } = self.inside.mine();
        // Entry and exit: one write while the line stays this thread's.
        written.write();
        slot.fetch_add(1, Ordering::Relaxed);
        if !broken::no_enter_fence() {
            fence(Ordering::SeqCst);
        }
        if !broken::no_recheck() && self.blockers.load(Ordering::Acquire) != 0 {
            slot.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(SharedGuard { slot })
    }

    /// Waits, holding nothing, until no blocker holds the shared mode (as
    /// seen now: another may come at once). The range writers themselves
    /// take the `mmap_lock` path at once instead (`mm/range.rs`).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn wait_unblocked(&self) {
        let mut i = 0;
        while self.blockers.load(Ordering::Acquire) != 0 {
            super::spin_hint(i);
            i = i.wrapping_add(1);
        }
    }

    /// How many range writers are inside in the caller's slot (itself
    /// included, once entered), for `mm/range.rs`'s share of the map
    /// count, which explains why that suffices; Acquire, so that a writer
    /// seen gone is seen with what it wrote before leaving. Reads only the
    /// caller's slot.
    pub(crate) fn inside_mine(&self) -> u64 {
        self.inside.mine().count.load(Ordering::Acquire)
    }

    /// Blocks the shared mode and waits until every range writer inside has
    /// left. Called holding `mmap_lock`, which no range writer waits for.
    pub(crate) fn block(&self) -> Blocked<'_> {
        self.blockers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        for Inside { count: slot, .. } in self.inside.iter() {
            let mut i = 0;
            while slot.load(Ordering::Acquire) != 0 {
                super::spin_hint(i);
                i = i.wrapping_add(1);
            }
        }
        Blocked { lock: self }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A writer is refused while a blocker holds the mode, and enters once
    /// it is unblocked; a blocker counts every writer that is inside.
    #[test]
    fn a_blocker_keeps_writers_out_until_it_unblocks() {
        let l = RangeWriters::default();
        let w = l.try_enter().expect("no blocker");
        drop(w);
        let b = l.block();
        assert!(l.try_enter().is_none(), "blocked");
        let b2 = l.block();
        drop(b);
        assert!(l.try_enter().is_none(), "one blocker left");
        drop(b2);
        l.wait_unblocked();
        let w1 = l.try_enter().expect("unblocked");
        let w2 = l.try_enter().expect("writers share the mode");
        assert_eq!(l.inside.iter().map(|s| s.count.load(Ordering::Relaxed)).sum::<u64>(), 2);
        drop((w1, w2));
        assert_eq!(l.inside.iter().map(|s| s.count.load(Ordering::Relaxed)).sum::<u64>(), 0);
    }

    /// A blocker waits for the writers inside: with writers entering and
    /// leaving in threads, no writer is ever inside while a blocker holds
    /// the mode.
    #[test]
    fn no_writer_is_inside_while_blocked() {
        use std::sync::atomic::{AtomicBool, AtomicU64 as Count};
        use std::sync::Arc;
        let l = Arc::new(RangeWriters::default());
        let (exclusive, inside, stop) =
            (Arc::new(AtomicBool::new(false)), Arc::new(Count::new(0)), Arc::new(AtomicBool::new(false)));
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let (l, exclusive, inside, stop) = (l.clone(), exclusive.clone(), inside.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut entered = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Some(g) = l.try_enter() {
                            inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            assert!(!exclusive.load(std::sync::atomic::Ordering::SeqCst), "writer beside a blocker");
                            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                            drop(g);
                            entered += 1;
                        } else {
                            l.wait_unblocked();
                        }
                    }
                    entered
                })
            })
            .collect();
        // Under Miri, which interprets the four threads on one, a tenth
        // (the test's 2,000 rounds took 23.5 s of Miri's clock, its most).
        for _ in 0..if cfg!(miri) { 200 } else { 2000 } {
            let b = l.block();
            exclusive.store(true, std::sync::atomic::Ordering::SeqCst);
            assert_eq!(inside.load(std::sync::atomic::Ordering::SeqCst), 0, "blocker beside a writer");
            exclusive.store(false, std::sync::atomic::Ordering::SeqCst);
            drop(b);
            std::thread::yield_now();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
    }
}
