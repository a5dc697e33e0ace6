//! loom models of the TLB shootdown protocol of [`super`], on the real
//! [`TlbDomain`] and [`CpuTlbState`].
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p softmm --lib`.
//! The CPU side is modelled with the calls the `Cpu` makes; the property is
//! the one the frame allocator relies on: once `flush` returns, no CPU uses a
//! translation cached before it.

use std::sync::Arc;

use super::{CpuTlbState, TlbDomain};
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A CPU's view: its cached translation (if any) and the generation it is current for.
struct ModelCpu {
    state: Arc<CpuTlbState>,
    cached: bool,
    seen: u64,
}

impl ModelCpu {
    /// One MMU call: ack a moved generation, then translate (hit or walk) and
    /// access the frame, asserting that it has not been freed.
    fn access(&mut self, dom: &TlbDomain, pte: &AtomicU64, freed: &AtomicBool) {
        let gen = dom.generation();
        if gen != self.seen {
            self.cached = false;
            self.seen = gen;
            self.state.ack(gen);
        }
        if !self.cached {
            if pte.load(Ordering::Acquire) == 0 {
                return; // page fault: nothing accessed
            }
            self.cached = true;
        }
        assert!(!freed.load(Ordering::Relaxed), "access through a stale TLB entry to a freed frame");
    }
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

#[test]
fn running_cpu_acknowledges_before_the_frame_is_freed() {
    builder().check(|| {
        let dom = Arc::new(TlbDomain::new());
        let pte = Arc::new(AtomicU64::new(1));
        let freed = Arc::new(AtomicBool::new(false));
        let state = CpuTlbState::new();
        let seen = dom.attach(&state);
        let cpu = {
            let (dom, pte, freed) = (dom.clone(), pte.clone(), freed.clone());
            loom::thread::spawn(move || {
                let mut cpu = ModelCpu { state, cached: false, seen };
                for _ in 0..3 {
                    cpu.access(&dom, &pte, &freed);
                }
                // Leaving the address space: quiescent for good.
                cpu.state.enter_quiescent();
            })
        };
        // munmap: clear the PTE, shoot down, then free.
        pte.store(0, Ordering::Release);
        dom.flush(&[]);
        freed.store(true, Ordering::Relaxed);
        cpu.join().unwrap();
    });
}

#[test]
fn quiescent_cpu_is_not_waited_for_and_flushes_on_resume() {
    builder().check(|| {
        let dom = Arc::new(TlbDomain::new());
        let pte = Arc::new(AtomicU64::new(1));
        let freed = Arc::new(AtomicBool::new(false));
        let state = CpuTlbState::new();
        let seen = dom.attach(&state);
        let cpu = {
            let (dom, pte, freed) = (dom.clone(), pte.clone(), freed.clone());
            loom::thread::spawn(move || {
                let mut cpu = ModelCpu { state, cached: false, seen };
                cpu.access(&dom, &pte, &freed);
                // Blocked in softmm (a fault's slow path, or parked).
                cpu.state.enter_quiescent();
                cpu.state.exit_quiescent();
                cpu.access(&dom, &pte, &freed);
                cpu.state.enter_quiescent();
            })
        };
        pte.store(0, Ordering::Release);
        dom.flush(&[]);
        freed.store(true, Ordering::Relaxed);
        cpu.join().unwrap();
    });
}

#[test]
fn two_initiators_and_one_cpu() {
    builder().check(|| {
        let dom = Arc::new(TlbDomain::new());
        let pte = Arc::new(AtomicU64::new(1));
        let freed = Arc::new(AtomicBool::new(false));
        let state = CpuTlbState::new();
        let seen = dom.attach(&state);
        let cpu = {
            let (dom, pte, freed) = (dom.clone(), pte.clone(), freed.clone());
            loom::thread::spawn(move || {
                let mut cpu = ModelCpu { state, cached: false, seen };
                cpu.access(&dom, &pte, &freed);
                cpu.access(&dom, &pte, &freed);
                cpu.state.enter_quiescent();
            })
        };
        // A second initiator narrows something unrelated at the same time.
        let other = {
            let dom = dom.clone();
            loom::thread::spawn(move || dom.flush(&[]))
        };
        pte.store(0, Ordering::Release);
        dom.flush(&[]);
        freed.store(true, Ordering::Relaxed);
        other.join().unwrap();
        cpu.join().unwrap();
    });
}
