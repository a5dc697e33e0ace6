//! One process-wide barrier shared by concurrent initiators: userspace
//! RCU's batched grace periods applied to the initiator's half of the
//! section handshake ([`super::barrier::initiator_barrier`]).
//!
//! # Protocol
//!
//! `started` counts the barriers begun, `done` the number of the last one
//! finished; one initiator at a time, the leader, runs barriers. An
//! initiator that has posted its flush requests and fenced:
//!
//! 1. loads `started` = `s`: a barrier numbered `s + 1` or more begins
//!    after this load (its `fetch_add` took `started` past `s`);
//! 2. until `done >= s + 1`: if no other initiator leads, becomes the
//!    leader, `n = started.fetch_add(1) + 1`, runs the barrier, stores
//!    `done = n` (Release) and resigns; otherwise waits.
//!
//! Why a barrier that *starts* after the load covers the initiator: its
//! fence (the SeqCst fence `initiator_barrier` runs first) follows the
//! initiator's fence in the SeqCst order, since the initiator's load of
//! `started` read a value older than the leader's `fetch_add`. So the
//! initiator's requests come before the barrier that the leader forces on
//! every running thread: a CPU whose section entry passes that barrier
//! after its store of `inside` has made the store visible to the leader,
//! whose `done` store the initiator reads (Acquire) before it loads
//! `inside`; one that passes it before loads the mark after it and sees the
//! request. A barrier already running when the initiator posted covers
//! nothing of it: its IPI may have passed the CPU before the request was
//! stored and before the CPU stored `inside`.
//!
//! No lock is held across the barrier: the leader flag only elects who
//! runs it, and a waiter spins (then yields) on `done`; every waiter's
//! wait ends with the barrier that follows the one running, whose leader
//! may be itself. `tlb/loom_tests.rs` models this against a section
//! entry, and shows that joining a barrier already started
//! ([`broken::JOIN_RUNNING`]) lets a CPU use a freed frame.

use crossbeam_utils::CachePadded;

use crate::sync::{spin_hint, AtomicBool, AtomicU64, Ordering};

/// How an initiator's requests came to be covered by a barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Covered {
    /// It led and ran the barrier itself.
    Issued,
    /// Another initiator's barrier, begun after this one posted, covered it.
    Joined,
}

/// The process-wide shared barrier's state.
pub(crate) struct SharedBarrier {
    /// Barriers begun (the last one's number).
    started: CachePadded<AtomicU64>,
    /// The number of the last barrier finished.
    done: CachePadded<AtomicU64>,
    /// Set while an initiator leads (runs a barrier).
    leader: CachePadded<AtomicBool>,
}

impl SharedBarrier {
    /// No barrier run yet.
    #[cfg(not(loom))]
    const fn new() -> SharedBarrier {
        SharedBarrier {
            started: CachePadded::new(AtomicU64::new(0)),
            done: CachePadded::new(AtomicU64::new(0)),
            leader: CachePadded::new(AtomicBool::new(false)),
        }
    }

    #[cfg(loom)]
    fn new() -> SharedBarrier {
        SharedBarrier {
            started: CachePadded::new(AtomicU64::new(0)),
            done: CachePadded::new(AtomicU64::new(0)),
            leader: CachePadded::new(AtomicBool::new(false)),
        }
    }

    /// Returns once a barrier that began after this call's first load has
    /// finished, having run it or waited for another initiator's. The
    /// caller posted its requests and ran a SeqCst fence before the call.
    pub(crate) fn cover(&self) -> Covered {
        // SeqCst, after the caller's fence: see the module's protocol.
        let s = self.started.load(Ordering::SeqCst);
        let need = if broken::join_running() { s } else { s + 1 };
        let mut i = 0;
        loop {
            if self.done.load(Ordering::Acquire) >= need {
                return Covered::Joined;
            }
            if self.leader.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                // Barriers run one at a time: the one before ours is done.
                if self.done.load(Ordering::Acquire) >= need {
                    self.leader.store(false, Ordering::Release);
                    return Covered::Joined;
                }
                let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
                super::barrier::initiator_barrier();
                // Release: what the barrier made visible (the `inside`
                // stores of the CPUs it passed) happens before a waiter's
                // loads of `inside`.
                self.done.store(n, Ordering::Release);
                self.leader.store(false, Ordering::Release);
                crate::sync::shared_write(4);
                return Covered::Issued;
            }
            spin_hint(i);
            i = i.saturating_add(1);
        }
    }
}

/// The process's shared barrier.
#[cfg(not(loom))]
pub(crate) fn shared() -> &'static SharedBarrier {
    static SHARED: SharedBarrier = SharedBarrier::new();
    &SHARED
}

#[cfg(loom)]
loom::lazy_static! {
    static ref SHARED: SharedBarrier = SharedBarrier::new();
}

/// The process's shared barrier (one per loom execution).
#[cfg(loom)]
pub(crate) fn shared() -> &'static SharedBarrier {
    &SHARED
}

// The loom models' broken switches: `sync/broken.rs`.
pub(crate) use crate::sync::broken::shared_barrier as broken;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_lone_initiator_issues_and_a_later_one_needs_a_later_barrier() {
        let b = SharedBarrier::new();
        assert_eq!(b.cover(), Covered::Issued);
        // The barrier before is finished: it began before this call.
        assert_eq!(b.cover(), Covered::Issued);
        assert_eq!((b.started.load(Ordering::Relaxed), b.done.load(Ordering::Relaxed)), (2, 2));
    }

    #[test]
    fn concurrent_initiators_each_return_covered() {
        let b = std::sync::Arc::new(SharedBarrier::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..200).map(|_| b.cover()).filter(|&c| c == Covered::Issued).count())
            })
            .collect();
        let issued: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        // Every barrier issued is counted once, and every call returned.
        assert_eq!(issued as u64, b.done.load(Ordering::Relaxed));
        assert!(issued <= 800 && issued > 0);
    }
}
