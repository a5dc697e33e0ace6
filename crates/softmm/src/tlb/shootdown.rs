//! The shootdown handshake of [`super`], free of the rest of the crate so that
//! loom can model it.

use std::sync::Arc;

use crate::sync::{fence, spin_hint, AtomicU64, Mutex, Ordering};

/// The shootdown state one CPU shares with the initiators.
///
/// A CPU is attached to at most one [`TlbDomain`] at a time.
pub struct CpuTlbState {
    /// The last flush generation this CPU acknowledged, of the domain it was
    /// attached to when it did.
    acked: AtomicU64,
    /// Non-zero while the CPU is parked or blocked in softmm.
    quiescent: AtomicU64,
    /// How many times the CPU left a domain. A pending [`FlushTicket`] keeps
    /// the count it read while the CPU was in its domain's list: once the
    /// count moves, the CPU holds no translation of that domain, whatever it
    /// has attached to since (its `acked` then counts another domain's
    /// generations, which the ticket's target says nothing about).
    detaches: AtomicU64,
}

impl CpuTlbState {
    /// A running CPU that has acknowledged nothing yet.
    pub fn new() -> Arc<CpuTlbState> {
        Arc::new(CpuTlbState { acked: AtomicU64::new(0), quiescent: AtomicU64::new(0), detaches: AtomicU64::new(0) })
    }

    /// Marks the CPU quiescent (parked or blocked in softmm); nests.
    #[inline]
    pub fn enter_quiescent(&self) {
        // SeqCst, hence Release: the CPU's accesses so far happen before an
        // initiator that reads this depth (SeqCst, hence Acquire) stops
        // waiting and frees what they touched.
        self.quiescent.fetch_add(1, Ordering::SeqCst);
    }

    /// Leaves one level of quiescence. The caller's next MMU call must check
    /// the generation with [`TlbDomain::generation`] before using its TLB.
    #[inline]
    pub fn exit_quiescent(&self) {
        let old = self.quiescent.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(old > 0);
        // Dekker with `TlbDomain::flush_begin`: our store to `quiescent`,
        // this fence, then our next load of `gen`; the initiator's store to
        // `gen`, its fence, then its loads of `quiescent`. With both fences
        // SeqCst, either we see the new generation or the initiator sees us
        // running.
        fence(Ordering::SeqCst);
    }

    /// Publishes that every entry cached before generation `gen` is gone.
    #[inline]
    pub fn ack(&self, gen: u64) {
        // Release: the flush of the CPU's entries happens before the
        // initiator, which loads `acked` with Acquire, frees anything.
        self.acked.store(gen, Ordering::Release);
    }

    /// True if the CPU cannot use a translation older than generation
    /// `target` of the domain it was attached to when it acknowledged.
    #[inline]
    fn done(&self, target: u64) -> bool {
        // Acquire on `acked` pairs with the CPU's Release in `ack`; SeqCst on
        // `quiescent` is the initiator's half of the Dekker handshake.
        self.acked.load(Ordering::Acquire) >= target || self.quiescent.load(Ordering::SeqCst) > 0
    }
}

/// Counters of shootdown traffic (the seeds count IPIs). More counters may
/// come: read the fields, never build one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlbStats {
    /// Flushes initiated.
    pub flushes: u64,
    /// Flush requests sent: one per CPU of another thread attached when the
    /// flush began (the IPIs Linux would send; the initiator flushes itself).
    pub flush_requests: u64,
    /// Requests that needed a wait for an acknowledgement: the CPU was
    /// running and had not acknowledged yet when the flush began.
    pub flush_waits: u64,
}

/// The CPUs attached to one address space and its flush generation.
pub struct TlbDomain {
    gen: AtomicU64,
    /// Number of attached CPUs, readable without the list's lock.
    nr_cpus: AtomicU64,
    /// Locked only to attach, to detach and to read the list at
    /// [`TlbDomain::flush_begin`]; never while waiting.
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

    /// Attaches a CPU (attached to no other domain); returns the generation
    /// its (empty) TLB is current for.
    pub fn attach(&self, cpu: &Arc<CpuTlbState>) -> u64 {
        let mut cpus = self.cpus.lock();
        let gen = self.gen.load(Ordering::SeqCst);
        cpu.ack(gen);
        cpus.push(cpu.clone());
        self.nr_cpus.store(cpus.len() as u64, Ordering::Relaxed);
        gen
    }

    /// Detaches a CPU; it must hold no translation of this domain afterwards.
    /// A CPU that is not attached here is left alone.
    pub fn detach(&self, cpu: &Arc<CpuTlbState>) {
        let mut cpus = self.cpus.lock();
        if let Some(i) = cpus.iter().position(|c| Arc::ptr_eq(c, cpu)) {
            cpus.swap_remove(i);
            // Release: the CPU's accesses through this domain happen before
            // a pending ticket that sees the new count (Acquire) completes.
            cpu.detaches.fetch_add(1, Ordering::Release);
        }
        self.nr_cpus.store(cpus.len() as u64, Ordering::Relaxed);
    }

    /// Number of attached CPUs (a racy snapshot; takes no lock).
    #[inline]
    pub fn attached(&self) -> usize {
        self.nr_cpus.load(Ordering::Relaxed) as usize
    }

    /// Starts a shootdown of every attached CPU's TLB: bumps the generation
    /// (CPUs start dropping their entries at their next MMU call) and notes
    /// the CPUs that must still acknowledge. `mine` are the caller's own
    /// CPUs, which get no request (they flush at their next MMU call).
    ///
    /// The flush is complete only when the returned ticket has been waited
    /// for (or dropped); the caller may begin flushes of other domains
    /// meanwhile, so that their CPUs acknowledge in parallel. No lock is
    /// held between the two: CPUs may attach and detach in between.
    pub fn flush_begin(&self, mine: &[Arc<CpuTlbState>]) -> FlushTicket {
        let target = self.gen.fetch_add(1, Ordering::SeqCst) + 1;
        // Pairs with the fence in `CpuTlbState::exit_quiescent`.
        fence(Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let mut pending = Vec::new();
        let mut requests = 0;
        {
            let cpus = self.cpus.lock();
            for cpu in cpus.iter() {
                if mine.iter().any(|m| Arc::ptr_eq(m, cpu)) {
                    continue;
                }
                requests += 1;
                // A CPU seen quiescent here stays safe after it resumes (the
                // Dekker handshake); one that acknowledged is done.
                if !cpu.done(target) {
                    // Relaxed: the count changes only under the lock of the
                    // domain the CPU leaves, and it is in ours, which we hold.
                    let detaches = cpu.detaches.load(Ordering::Relaxed);
                    pending.push(PendingCpu { cpu: cpu.clone(), detaches });
                }
            }
        }
        self.flush_requests.fetch_add(requests, Ordering::Relaxed);
        self.flush_waits.fetch_add(pending.len() as u64, Ordering::Relaxed);
        FlushTicket { target, pending }
    }

    /// Shoots down every attached CPU's TLB and returns once each CPU that
    /// was attached and running has acknowledged, become quiescent or
    /// detached: [`TlbDomain::flush_begin`] then [`FlushTicket::wait`].
    pub fn flush(&self, mine: &[Arc<CpuTlbState>]) {
        self.flush_begin(mine).wait();
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

/// A CPU a ticket waits for, with its detach count while it was attached.
struct PendingCpu {
    cpu: Arc<CpuTlbState>,
    detaches: u64,
}

/// A shootdown begun by [`TlbDomain::flush_begin`]. Once [`FlushTicket::wait`]
/// returns, no CPU uses a translation that was removed before the flush
/// began, so what it pointed to may be freed.
///
/// Dropping the ticket waits as well, so a ticket never lets a caller go on
/// believing a flush complete that is not (including on unwinding).
#[must_use = "the flush is complete only after FlushTicket::wait"]
pub struct FlushTicket {
    target: u64,
    /// The CPUs that were attached, not the initiator's, running and not yet
    /// acknowledged when the flush began.
    pending: Vec<PendingCpu>,
}

impl FlushTicket {
    /// Waits until each CPU that was attached and running when the flush
    /// began has acknowledged its generation, is quiescent, or has detached
    /// from the domain since.
    pub fn wait(self) {
        drop(self);
    }

    fn wait_pending(&mut self) {
        for p in self.pending.drain(..) {
            let mut i = 0;
            // Acquire on `detaches` pairs with the Release in `detach`.
            while !p.cpu.done(self.target) && p.cpu.detaches.load(Ordering::Acquire) == p.detaches {
                spin_hint(i);
                i = i.saturating_add(1);
            }
        }
    }
}

impl Drop for FlushTicket {
    fn drop(&mut self) {
        self.wait_pending();
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

    /// Runs `f` on another thread and fails if it does not return within a
    /// generous delay (a ticket that waits for a CPU that will never
    /// acknowledge would otherwise hang the test).
    #[track_caller]
    fn returns(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok(), "the wait never returned");
    }

    #[test]
    fn a_ticket_ends_when_its_cpu_moves_to_another_domain() {
        let (dom, elsewhere) = (TlbDomain::new(), Arc::new(TlbDomain::new()));
        let cpu = CpuTlbState::new();
        dom.attach(&cpu);
        for _ in 0..2 {
            let t = dom.flush_begin(&[]);
            cpu.ack(dom.generation());
            t.wait();
        }
        let ticket = dom.flush_begin(&[]);
        assert_eq!(dom.stats().flush_waits, 3, "a running CPU that has not acknowledged is waited for");
        // The CPU leaves while the ticket is pending (begin holds no lock)
        // and runs elsewhere, acknowledging that domain's generations only.
        dom.detach(&cpu);
        elsewhere.attach(&cpu);
        elsewhere.flush(std::slice::from_ref(&cpu));
        cpu.ack(elsewhere.generation());
        assert!(elsewhere.generation() < dom.generation(), "its ack must not reach the ticket's target");
        returns(move || ticket.wait());
        elsewhere.detach(&cpu);
    }

    #[test]
    fn flushes_of_two_domains_begin_together_and_are_waited_for() {
        let doms = [Arc::new(TlbDomain::new()), Arc::new(TlbDomain::new())];
        let cpus = [CpuTlbState::new(), CpuTlbState::new()];
        doms.iter().zip(&cpus).for_each(|(d, c)| _ = d.attach(c));
        let tickets = [doms[0].flush_begin(&[]), doms[1].flush_begin(&[])];
        // Both generations moved before either wait: the CPUs can
        // acknowledge in parallel.
        for (d, c) in doms.iter().zip(&cpus) {
            assert_eq!(d.generation(), 1);
            c.ack(d.generation());
        }
        returns(move || tickets.into_iter().for_each(FlushTicket::wait));
        let s = doms[1].stats();
        assert_eq!((s.flushes, s.flush_requests, s.flush_waits), (1, 1, 1));
    }

    #[test]
    fn a_dropped_ticket_waits_too() {
        let dom = Arc::new(TlbDomain::new());
        let cpu = CpuTlbState::new();
        dom.attach(&cpu);
        let ticket = dom.flush_begin(&[]);
        let acked = Arc::new(AtomicU64::new(0));
        let waiter = {
            let acked = acked.clone();
            std::thread::spawn(move || {
                drop(ticket);
                // Only the ack below can have let the drop return.
                assert_eq!(acked.load(Ordering::SeqCst), 1);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        acked.store(1, Ordering::SeqCst);
        cpu.ack(dom.generation());
        waiter.join().unwrap();
    }
}
