//! loom models of the TLB shootdown protocol of [`super`], on the real
//! [`TlbDomain`], [`CpuTlbState`] and thread quiescence.
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release -p softmm --lib`.
//! The CPU side is modelled with the calls the `Cpu` makes (`ModelCpu`), and
//! in the last models it is the real `Cpu` against the real `munmap`; the
//! property is the one the frame allocator relies on: once a flush's wait
//! returns, no CPU uses a translation cached before it began.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{with_thread_cpus, CpuTlbState, PostingPolicy, QuiescentGuard, ShootdownPolicy, TlbDomain};

mod posting;
mod real;

/// One page of one address space: its PTE (non-zero while mapped) and
/// whether its frame was freed.
#[derive(Clone)]
struct Page {
    pte: Arc<AtomicU64>,
    freed: Arc<AtomicBool>,
}

impl Page {
    fn mapped() -> Page {
        Page { pte: Arc::new(AtomicU64::new(1)), freed: Arc::new(AtomicBool::new(false)) }
    }

    /// munmap's order: clear the PTE before the shootdown begins.
    fn unmap(&self) {
        self.pte.store(0, Ordering::Release);
    }

    /// Frees the frame, which only a completed shootdown allows.
    fn free(&self) {
        self.freed.store(true, Ordering::Relaxed);
    }
}

/// A CPU's view: its cached translation (if any) and the flush requests it
/// is current for, as in `Cpu`.
struct ModelCpu {
    state: Arc<CpuTlbState>,
    cached: bool,
    seen: u64,
}

impl ModelCpu {
    fn attached(dom: &TlbDomain) -> ModelCpu {
        let state = CpuTlbState::new();
        let seen = dom.attach(&state);
        ModelCpu { state, cached: false, seen }
    }

    /// One access: [`ModelCpu::access_checked`], asserting that it did not
    /// touch a freed frame.
    fn access(&mut self, page: &Page) {
        assert!(self.access_checked(page, false), "access through a stale TLB entry to a freed frame");
    }

    /// One access, as `Cpu` makes it: enter the section; if a request is
    /// marked pending, take the mark and drop the TLB if the flush requests
    /// moved (and acknowledge them); translate (hit or walk) and access the frame,
    /// leave the section; false if the frame had been freed. `light`: the
    /// section's barrier is the light one (`barrier.rs` models membarrier
    /// against it under loom), else a fence.
    fn access_checked(&mut self, page: &Page, light: bool) -> bool {
        self.state.section_begin(light);
        // The light entry's logic (the real `Cpu` under loom takes the
        // fence path, where the mark is never clear), on the real catch-up.
        if self.state.flush_pending() != 0 && self.state.catch_up(&mut self.seen, false) {
            self.cached = false;
        }
        if !self.cached && page.pte.load(Ordering::Acquire) != 0 {
            self.cached = true;
        }
        let ok = !(self.cached && page.freed.load(Ordering::Relaxed));
        self.state.section_end();
        ok
    }

    /// `Cpu::attach` to another domain: leave this one, drop every entry
    /// (which acknowledges every request of the one left).
    fn switch(&mut self, from: &TlbDomain, to: &TlbDomain) {
        from.detach(&self.state);
        self.cached = false;
        self.state.passed_quiescent_point();
        self.seen = to.attach(&self.state);
    }
}

/// Runs `model` under each posting policy. (The broken switches its code
/// reads are per OS thread, `crate::sync::broken`: models run side by
/// side.)
fn each_posting(model: impl Fn(PostingPolicy)) {
    for &posting in PostingPolicy::ALL {
        model(posting);
    }
}

/// A domain with the default shootdown policy and `posting`.
fn domain(posting: PostingPolicy) -> Arc<TlbDomain> {
    Arc::new(TlbDomain::with_policies(ShootdownPolicy::default(), posting))
}

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// A CPU makes three accesses to a page while the main thread makes
/// `flushes_before` shootdowns that change nothing, then unmaps the page,
/// shoots it down and frees the frame; explored with up to `preemptions`
/// preemptions.
fn three_accesses_against_an_unmap(flushes_before: usize, preemptions: usize) {
    each_posting(|posting| {
        let mut b = builder();
        b.preemption_bound = Some(preemptions);
        b.check(move || {
            let dom = domain(posting);
            let page = Page::mapped();
            let mut cpu = ModelCpu::attached(&dom);
            let t = {
                let page = page.clone();
                crate::sync::model::spawn(move || {
                    for _ in 0..3 {
                        cpu.access(&page);
                    }
                })
            };
            for _ in 0..flushes_before {
                dom.flush(&[]);
            }
            page.unmap();
            dom.flush(&[]);
            page.free();
            t.join().unwrap();
        });
    });
}

#[test]
fn a_cpu_in_an_access_finishes_it_before_the_frame_is_freed() {
    three_accesses_against_an_unmap(0, 3);
}

/// A CPU parked, or whose thread is inside softmm, between two accesses.
#[test]
fn quiescent_cpu_is_not_waited_for_and_flushes_on_resume() {
    each_posting(|posting| {
        builder().check(move || {
            let dom = domain(posting);
            let page = Page::mapped();
            let mut cpu = ModelCpu::attached(&dom);
            let t = {
                let page = page.clone();
                crate::sync::model::spawn(move || {
                    cpu.access(&page);
                    // Blocked in softmm (a fault's slow path, or parked).
                    cpu.state.enter_quiescent();
                    cpu.state.exit_quiescent();
                    cpu.access(&page);
                })
            };
            page.unmap();
            dom.flush(&[]);
            page.free();
            t.join().unwrap();
        });
    });
}

/// Two initiators request flushes concurrently: the main thread unmaps
/// the page while the CPU's own thread, between two accesses, makes a
/// syscall that shoots down something unrelated (its CPU quiescent and
/// passed as its own, so that flush waits for nobody). The page's flush must
/// still keep the CPU's next access off the freed frame.
///
/// (Two initiators that both spin for the same running CPU cannot be
/// modelled: loom explores the schedule in which the two spinners yield to
/// each other forever, loom issue #191. Before flushes were split into
/// begin and wait, the second one blocked on the CPU-list lock instead.)
#[test]
fn two_initiators_and_one_cpu() {
    each_posting(|posting| {
        builder().check(move || {
            let dom = domain(posting);
            let page = Page::mapped();
            let mut cpu = ModelCpu::attached(&dom);
            let t = {
                let (dom, page) = (dom.clone(), page.clone());
                crate::sync::model::spawn(move || {
                    cpu.access(&page);
                    cpu.state.enter_quiescent();
                    dom.flush(std::slice::from_ref(&cpu.state));
                    cpu.state.exit_quiescent();
                    cpu.access(&page);
                })
            };
            page.unmap();
            dom.flush(&[]);
            page.free();
            t.join().unwrap();
        });
    });
}

/// The CPU a ticket waits for leaves the domain while the ticket is pending
/// and attaches to another, where it keeps accessing: the wait ends with
/// the section it noted, and the CPU's accesses to the first domain's frame
/// come before the free.
#[test]
fn cpu_detaches_while_a_ticket_is_pending() {
    each_posting(|posting| {
        builder().check(move || {
            let dom = domain(posting);
            let elsewhere = domain(posting);
            let page = Page::mapped();
            let other_page = Page::mapped();
            let mut cpu = ModelCpu::attached(&dom);
            let t = {
                let (dom, elsewhere, page, other_page) =
                    (dom.clone(), elsewhere.clone(), page.clone(), other_page.clone());
                crate::sync::model::spawn(move || {
                    cpu.access(&page);
                    cpu.access(&page);
                    cpu.switch(&dom, &elsewhere);
                    cpu.access(&other_page);
                    // Its owner goes on elsewhere: still running, never acking `dom`.
                })
            };
            page.unmap();
            let ticket = dom.flush_begin(&[]);
            ticket.wait();
            page.free();
            t.join().unwrap();
        });
    });
}

/// Batched shootdown: flushes of two address spaces are begun, then both
/// waited for. One thread runs a CPU in each (an emulator switching vCPUs);
/// neither frame may be freed while that thread can still reach it.
#[test]
fn two_domains_flushed_with_two_tickets() {
    each_posting(|posting| {
        builder().check(move || {
            let doms = [domain(posting), domain(posting)];
            let pages = [Page::mapped(), Page::mapped()];
            let mut cpus = [ModelCpu::attached(&doms[0]), ModelCpu::attached(&doms[1])];
            let t = {
                let pages = pages.clone();
                crate::sync::model::spawn(move || {
                    for i in [0, 1, 0, 1] {
                        cpus[i].access(&pages[i]);
                    }
                })
            };
            pages.iter().for_each(Page::unmap);
            let tickets = [doms[0].flush_begin(&[]), doms[1].flush_begin(&[])];
            tickets.into_iter().for_each(|t| t.wait());
            pages.iter().for_each(Page::free);
            t.join().unwrap();
        });
    });
}

/// A thread with two CPUs of one address space (an emulator switching
/// vCPUs) unmaps a page from a syscall while a CPU on another thread runs:
/// `with_thread_cpus` keeps the flush from waiting for the caller's own
/// CPUs, and those CPUs still drop the stale entry at their next access.
#[test]
fn a_syscall_does_not_wait_for_its_own_threads_cpus() {
    each_posting(|posting| {
        builder().check(move || {
            let dom = domain(posting);
            let page = Page::mapped();
            let mut remote = ModelCpu::attached(&dom);
            let t = {
                let page = page.clone();
                crate::sync::model::spawn(move || {
                    remote.access(&page);
                    remote.access(&page);
                })
            };
            let mut mine = [ModelCpu::attached(&dom), ModelCpu::attached(&dom)];
            mine.iter().for_each(|c| super::register_thread_cpu(&c.state));
            mine.iter_mut().for_each(|c| c.access(&page));
            {
                let _syscall = QuiescentGuard::enter();
                page.unmap();
                with_thread_cpus(|own| dom.flush(own));
                page.free();
            }
            mine.iter_mut().for_each(|c| c.access(&page));
            mine.iter().for_each(|c| super::unregister_thread_cpu(&c.state));
            t.join().unwrap();
        });
    });
}
