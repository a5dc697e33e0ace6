//! Adaptive fence mode ([`super::PostingPolicy::Adaptive`]): a CPU that is
//! shot down often switches its own section barrier from the light one
//! (a compiler barrier, which every shootdown of it must pair with a
//! process-wide `membarrier`) to a SeqCst fence, so that shootdowns of it
//! need no barrier at all; one that is seldom shot down switches back.
//!
//! # Protocol
//!
//! The mode lives in the CPU's pending mark: `PENDING_ALWAYS` set means
//! the CPU's entries fence (every entry takes the slow path, which fences
//! before it takes the mark and loads the requests), as in the process-wide
//! fallback. The CPU changes it only in a section entry's slow path, with
//! the swap that takes the mark ([`CpuTlbState::catch_up`]'s `always`).
//! An initiator learns the mode from the old value its post
//! (`flush_pending.fetch_or`) returns, and if every CPU of another thread
//! it posted to fences, it runs a SeqCst fence instead of the barrier.
//!
//! * **To fence mode**, in a light entry: the section was entered with the
//!   compiler barrier only, and its `inside` store comes before the swap
//!   (Release). An initiator whose post comes after the swap reads the
//!   mode, and its fence (acquiring what the swap released) makes it see
//!   `inside` at 1: it waits for the section, as a barrier would have made
//!   it. One whose post comes before reads no mode and runs the barrier;
//!   its request is also what this entry takes.
//! * **To light mode**, in a fenced entry: the swap puts 0; a request
//!   posted before it (whose initiator may have skipped the barrier) is in
//!   the value it takes and is caught up on at once, in a section whose
//!   entry fenced; an initiator whose post comes after reads no mode and
//!   runs the barrier.
//!
//! `tlb/loom_tests.rs` models a CPU switching to fence mode against an
//! initiator that skips the barrier, and shows that skipping it without
//! the initiator's own fence ([`broken::SKIP_WITHOUT_FENCE`]) lets the CPU
//! use a freed frame.

use std::time::{Duration, Instant};

use super::barrier;
use super::shootdown::CpuTlbState;

/// When a CPU switches, from the request rate it sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// Light mode: this many requests within `window` switch to fences.
    pub(crate) to_fence: u32,
    /// See `to_fence`.
    pub(crate) window: Duration,
    /// Fence mode: every `back_after` entries, the CPU goes back to the
    /// light barrier if fewer than `back_below` of them caught a request.
    pub(crate) back_after: u32,
    /// See `back_after`.
    pub(crate) back_below: u32,
}

/// The tuning `Cpu`s use. A fence costs a one-access section about 4 ns
/// (`docs/architecture.md`), a `membarrier` 1-2 µs on the lab's VMs: fence
/// mode pays from about one request per few hundred sections. Light mode
/// reads the clock once per `to_fence` requests; fence mode, never.
pub(crate) const TUNING: Tuning =
    Tuning { to_fence: 32, window: Duration::from_millis(10), back_after: 4096, back_below: 8 };

/// A CPU's section barrier as its own thread keeps it (in the `Cpu`): the
/// light one or a fence, and, in adaptive mode, when to switch.
#[derive(Debug)]
pub(crate) struct EntryBarrier {
    /// The entries fence; the mark keeps `PENDING_ALWAYS`.
    fence: bool,
    /// The process has the light barrier (`barrier::reader_is_light`).
    may_light: bool,
    /// The CPU switches by the request rate.
    adaptive: bool,
    tuning: Tuning,
    /// Slow entries (light mode: each for a request) in the window.
    entries: u32,
    /// Fence mode: entries of the window that caught a request.
    caught: u32,
    /// Light mode: when the window began.
    since: Instant,
}

impl EntryBarrier {
    /// The process's barrier for `state`, a CPU outside any section, not
    /// adaptive; sets the mark's mode to match.
    pub(crate) fn new(state: &CpuTlbState, light: bool) -> EntryBarrier {
        let mut b = EntryBarrier {
            fence: !light,
            may_light: light,
            adaptive: false,
            tuning: TUNING,
            entries: 0,
            caught: 0,
            since: Instant::now(),
        };
        b.reset(state, false, TUNING);
        b
    }

    /// Back to the process's barrier, switching by `tuning` from now on if
    /// `adaptive` (and the process has the light barrier). Only outside any
    /// section, before the CPU reads its requests for an empty TLB (an
    /// attach): the mark is taken, and a request in it is in the count the
    /// CPU reads next.
    pub(crate) fn reset(&mut self, state: &CpuTlbState, adaptive: bool, tuning: Tuning) {
        self.adaptive = adaptive && self.may_light;
        self.fence = !self.may_light;
        self.tuning = tuning;
        (self.entries, self.caught, self.since) = (0, 0, Instant::now());
        state.take_flush_pending(self.fence);
    }

    /// True while the CPU's entries fence.
    #[cfg(test)]
    pub(crate) fn fences(&self) -> bool {
        self.fence
    }

    /// A section entry's slow path on `state` (a request is marked, or the
    /// entries fence): fences if the mode says so, chooses the mode for the
    /// next entries, and catches up on the requests against `seen` (the
    /// swap that takes the mark sets the mode chosen). Returns whether it
    /// emptied the TLB. On the CPU's own thread, inside the section.
    pub(crate) fn slow_entry(&mut self, state: &CpuTlbState, seen: &mut u64) -> bool {
        let fenced = self.fence;
        if fenced {
            barrier::reader_barrier(false);
        }
        if self.adaptive {
            self.choose();
        }
        let emptied = state.catch_up(seen, self.fence);
        // A request caught by a fenced entry that stays fenced: the window
        // the choice reads (the switching entry's starts a new one).
        if emptied && fenced && self.fence && self.entries != 0 {
            self.caught += 1;
        }
        emptied
    }

    /// Chooses the mode from the window's counts (see [`Tuning`]).
    fn choose(&mut self) {
        self.entries += 1;
        let t = self.tuning;
        if self.fence {
            if self.entries >= t.back_after {
                self.fence = self.caught >= t.back_below;
                (self.entries, self.caught, self.since) = (0, 0, Instant::now());
            }
        } else if self.entries >= t.to_fence {
            let now = Instant::now();
            self.fence = now.duration_since(self.since) < t.window;
            (self.entries, self.caught, self.since) = (0, 0, now);
        }
    }
}

// The loom models' broken switches: `sync/broken.rs`.
pub(crate) use crate::sync::broken::fence_mode as broken;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A CPU with the light barrier: `n` requests, each caught by an entry.
    fn requests(b: &mut EntryBarrier, state: &CpuTlbState, seen: &mut u64, n: u32) {
        for _ in 0..n {
            state.request_flush(crate::tlb::FlushRange::ALL);
            state.section_begin(true);
            assert_ne!(state.flush_pending(), 0);
            assert!(b.slow_entry(state, seen));
            state.section_end();
        }
    }

    #[test]
    fn a_cpu_shot_down_often_fences_and_one_left_alone_goes_back() {
        let state = CpuTlbState::new();
        let mut b = EntryBarrier::new(&state, true);
        let fast = Tuning { to_fence: 4, window: Duration::from_secs(3600), back_after: 16, back_below: 2 };
        let mut seen = 0;
        // Not adaptive: never switches.
        requests(&mut b, &state, &mut seen, 8);
        assert!(!b.fences());
        b.reset(&state, true, fast);
        requests(&mut b, &state, &mut seen, 3);
        assert!(!b.fences());
        requests(&mut b, &state, &mut seen, 1);
        assert!(b.fences(), "4 requests within the window");
        // The mark says so: every entry takes the slow path, and an
        // initiator's post reads the mode.
        assert_ne!(state.flush_pending(), 0);
        // Quiet: 16 fenced entries with one request among them.
        requests(&mut b, &state, &mut seen, 1);
        for _ in 0..15 {
            state.section_begin(true);
            assert_ne!(state.flush_pending(), 0, "a fenced entry always takes the slow path");
            assert!(!b.slow_entry(&state, &mut seen));
            state.section_end();
        }
        assert!(!b.fences(), "one request in 16 entries");
        assert_eq!(state.flush_pending(), 0);
    }

    #[test]
    fn slow_requests_keep_the_light_barrier() {
        let state = CpuTlbState::new();
        let mut b = EntryBarrier::new(&state, true);
        let slow = Tuning { to_fence: 2, window: Duration::ZERO, back_after: 16, back_below: 2 };
        b.reset(&state, true, slow);
        let mut seen = 0;
        requests(&mut b, &state, &mut seen, 6);
        assert!(!b.fences());
    }

    #[test]
    fn without_the_light_barrier_a_cpu_always_fences() {
        let state = CpuTlbState::new();
        let mut b = EntryBarrier::new(&state, false);
        b.reset(&state, true, TUNING);
        assert!(b.fences());
        assert_ne!(state.flush_pending(), 0);
    }
}
