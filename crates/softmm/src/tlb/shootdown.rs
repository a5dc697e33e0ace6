//! The shootdown handshake of [`super`], free of the rest of the crate so that
//! loom can model it.

use std::sync::Arc;

use crate::sync::{fence, spin_hint, AtomicU64, Ordering};

#[cfg(not(loom))]
use parking_lot::Mutex;

#[cfg(loom)]
struct Mutex<T>(loom::sync::Mutex<T>);
#[cfg(loom)]
impl<T> Mutex<T> {
    fn new(v: T) -> Self {
        Mutex(loom::sync::Mutex::new(v))
    }
    fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap()
    }
}

/// The shootdown state one CPU shares with the initiators.
pub struct CpuTlbState {
    /// The last flush generation this CPU acknowledged.
    acked: AtomicU64,
    /// Non-zero while the CPU is parked or blocked in softmm.
    quiescent: AtomicU64,
}

impl CpuTlbState {
    /// A running CPU that has acknowledged nothing yet.
    pub fn new() -> Arc<CpuTlbState> {
        Arc::new(CpuTlbState { acked: AtomicU64::new(0), quiescent: AtomicU64::new(0) })
    }

    /// Marks the CPU quiescent (parked or blocked in softmm); nests.
    #[inline]
    pub fn enter_quiescent(&self) {
        self.quiescent.fetch_add(1, Ordering::SeqCst);
    }

    /// Leaves one level of quiescence. The caller's next MMU call must check
    /// the generation with [`TlbDomain::generation`] before using its TLB.
    #[inline]
    pub fn exit_quiescent(&self) {
        let old = self.quiescent.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(old > 0);
        // Dekker with `TlbDomain::flush`: our store to `quiescent`, this
        // fence, then our next load of `gen`; the initiator's store to `gen`,
        // its fence, then its load of `quiescent`. With both fences SeqCst,
        // either we see the new generation or the initiator sees us running.
        fence(Ordering::SeqCst);
    }

    /// Publishes that every entry cached before generation `gen` is gone.
    #[inline]
    pub fn ack(&self, gen: u64) {
        // Release: the flush of the CPU's entries happens before the
        // initiator, which loads `acked` with Acquire, frees anything.
        self.acked.store(gen, Ordering::Release);
    }
}

/// Counters of shootdown traffic (the seeds count IPIs). More counters may
/// come: read the fields, never build one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlbStats {
    /// Flushes initiated.
    pub flushes: u64,
    /// Flush requests sent: one per CPU of another thread attached at the
    /// time (the IPIs Linux would send; the initiator flushes itself).
    pub flush_requests: u64,
    /// Requests that needed a wait for an acknowledgement (the CPU was running).
    pub flush_waits: u64,
}

/// The CPUs attached to one address space and its flush generation.
pub struct TlbDomain {
    gen: AtomicU64,
    /// Number of attached CPUs, readable without the list's lock.
    nr_cpus: AtomicU64,
    cpus: Mutex<Vec<Arc<CpuTlbState>>>,
    flushes: AtomicU64,
    flush_requests: AtomicU64,
    flush_waits: AtomicU64,
}

impl Default for TlbDomain {
    fn default() -> Self {
        Self::new()
    }
}

impl TlbDomain {
    /// A domain with no CPU attached.
    pub fn new() -> TlbDomain {
        TlbDomain {
            gen: AtomicU64::new(0),
            nr_cpus: AtomicU64::new(0),
            cpus: Mutex::new(Vec::new()),
            flushes: AtomicU64::new(0),
            flush_requests: AtomicU64::new(0),
            flush_waits: AtomicU64::new(0),
        }
    }

    /// The current flush generation, loaded at every MMU call.
    #[inline]
    pub fn generation(&self) -> u64 {
        // Acquire suffices: the Dekker ordering against the initiator is
        // carried by the SeqCst fence in `exit_quiescent`, which precedes
        // every load made after the CPU resumes.
        self.gen.load(Ordering::Acquire)
    }

    /// Attaches a CPU; returns the generation its (empty) TLB is current for.
    pub fn attach(&self, cpu: &Arc<CpuTlbState>) -> u64 {
        let mut cpus = self.cpus.lock();
        let gen = self.gen.load(Ordering::SeqCst);
        cpu.ack(gen);
        cpus.push(cpu.clone());
        self.nr_cpus.store(cpus.len() as u64, Ordering::Relaxed);
        gen
    }

    /// Detaches a CPU; it must hold no translation of this domain afterwards.
    pub fn detach(&self, cpu: &Arc<CpuTlbState>) {
        let mut cpus = self.cpus.lock();
        cpus.retain(|c| !Arc::ptr_eq(c, cpu));
        self.nr_cpus.store(cpus.len() as u64, Ordering::Relaxed);
    }

    /// Number of attached CPUs (a racy snapshot; takes no lock).
    #[inline]
    pub fn attached(&self) -> usize {
        self.nr_cpus.load(Ordering::Relaxed) as usize
    }

    /// Shoots down every attached CPU's TLB and returns once each has either
    /// acknowledged or is quiescent. `mine` are the caller's own CPUs, which
    /// get no request (they flush at their next MMU call).
    pub fn flush(&self, mine: &[Arc<CpuTlbState>]) {
        let target = self.gen.fetch_add(1, Ordering::SeqCst) + 1;
        // Pairs with the fence in `CpuTlbState::exit_quiescent`.
        fence(Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let cpus = self.cpus.lock();
        let mut requests = 0;
        let mut waits = 0;
        for cpu in cpus.iter() {
            if mine.iter().any(|m| Arc::ptr_eq(m, cpu)) {
                continue;
            }
            requests += 1;
            let mut waited = false;
            let mut i = 0;
            // Acquire on `acked` pairs with the CPU's Release in `ack`.
            while cpu.acked.load(Ordering::Acquire) < target && cpu.quiescent.load(Ordering::SeqCst) == 0 {
                waited = true;
                spin_hint(i);
                i = i.saturating_add(1);
            }
            waits += waited as u64;
        }
        drop(cpus);
        self.flush_requests.fetch_add(requests, Ordering::Relaxed);
        self.flush_waits.fetch_add(waits, Ordering::Relaxed);
    }

    /// Shootdown counters so far.
    pub fn stats(&self) -> TlbStats {
        TlbStats {
            flushes: self.flushes.load(Ordering::Relaxed),
            flush_requests: self.flush_requests.load(Ordering::Relaxed),
            flush_waits: self.flush_waits.load(Ordering::Relaxed),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn flush_waits_for_a_running_cpu_and_skips_a_quiescent_one() {
        let dom = Arc::new(TlbDomain::new());
        let running = CpuTlbState::new();
        let parked = CpuTlbState::new();
        dom.attach(&running);
        dom.attach(&parked);
        parked.enter_quiescent();
        assert_eq!(dom.attached(), 2);
        let cpu = {
            let (dom, running) = (dom.clone(), running.clone());
            std::thread::spawn(move || {
                // The CPU's MMU calls: acknowledge whatever generation it sees.
                let mut seen = 0;
                while seen < 1 {
                    let g = dom.generation();
                    if g != seen {
                        seen = g;
                        running.ack(g);
                    }
                    std::thread::yield_now();
                }
            })
        };
        dom.flush(&[]);
        cpu.join().unwrap();
        let s = dom.stats();
        assert_eq!((s.flushes, s.flush_requests), (1, 2));
        dom.detach(&running);
        dom.detach(&parked);
        assert_eq!(dom.attached(), 0);
    }
}
