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

/// Held by every model that posts without the lock: the broken switches
/// its code reads are process-wide, and loom requires each model to replay
/// the same execution.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `model` under each posting policy, holding [`SERIAL`].
fn each_posting(model: impl Fn(PostingPolicy)) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for &posting in PostingPolicy::ALL {
        model(posting);
    }
}

/// A domain with the default shootdown policy and `posting`.
fn domain(posting: PostingPolicy) -> Arc<TlbDomain> {
    Arc::new(TlbDomain::with_policies(ShootdownPolicy::default(), posting))
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
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
                loom::thread::spawn(move || {
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
                loom::thread::spawn(move || {
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
                loom::thread::spawn(move || {
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
                loom::thread::spawn(move || {
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
                loom::thread::spawn(move || {
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
                loom::thread::spawn(move || {
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

/// The protocol on the real code: a `Cpu` with a cached translation holds it
/// open ([`crate::Cpu::translate`], one access section, with a scheduling
/// point inside, where a real CPU could be preempted) while the main thread
/// munmaps the page with the real `munmap` and then reuses the frame. The
/// access must read the old bytes (it finished before the free) and a later
/// access must fault; reading the reused frame's bytes is the bug.
#[test]
fn a_real_cpu_access_against_a_real_munmap() {
    use crate::mm::{AddressSpace, MmConfig};
    use crate::phys::{PhysConfig, PhysMem};
    use crate::uapi::*;
    use crate::{Access, Cpu, PAGE_SIZE};
    const OLD: u8 = 0xab;
    const REUSED: u8 = 0xee;
    // The default posting policy, whose switches `check_broken` flips.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    // The real munmap takes many loom steps (locks, epoch, frame counts).
    b.max_branches = 100_000;
    b.check(|| {
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        mm.handle_fault(a, Access::Write).unwrap();
        let old = mm.pte_at(a).pfn();
        // SAFETY: the frame is mapped at `a` and nothing else runs.
        unsafe { crate::access::fill_host(phys.frame_ptr(old), OLD, PAGE_SIZE as usize) };
        let t = {
            let mm = mm.clone();
            loom::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                // A walk fills the TLB (the entry is present: no fault).
                let first = cpu.read_u8(a);
                let held = cpu.translate(a, Access::Read).map(|t| {
                    // Preempted inside the access, its entry cached.
                    loom::thread::yield_now();
                    let mut byte = [0];
                    // SAFETY: inside the page, while the guard lives and
                    // the thread makes no call into softmm; atomic.
                    unsafe { crate::access::copy_from_host(t.as_ptr(), &mut byte) };
                    byte[0]
                });
                let after = cpu.read_u8(a);
                (first, held, after)
            })
        };
        mm.munmap(a, PAGE_SIZE).unwrap();
        // Reuse: the frame is free, and its bytes change.
        // SAFETY: arena memory, accessed atomically; no mapping refers to it.
        unsafe { crate::access::fill_host(phys.frame_ptr(old), REUSED, PAGE_SIZE as usize) };
        let (first, held, after) = t.join().unwrap();
        let segv = |r: Result<u8, crate::Fault>| r.is_err_and(|f| f.signal() == libc::SIGSEGV);
        assert!(first == Ok(OLD) || segv(first), "{first:?}");
        assert!(held == Ok(OLD) || segv(held), "an access read a freed, reused frame: {held:?}");
        assert!(after == Ok(OLD) || segv(after), "{after:?}");
        // Once an access faulted, the next ones do too.
        assert!(!segv(first) || segv(held));
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
    });
}

/// A multi-access [`crate::Section`] on the real `Cpu` against the real
/// `munmap` and a reuse of the frame. Inside the section the thread reads
/// the page, is preempted, calls into softmm (a [`QuiescentGuard`], as any
/// syscall or fault of the thread makes: its CPUs are quiescent, so the
/// munmap's flush may skip this one and free the frame), then reads again.
/// Every read must see the old bytes or fault; the reused frame's bytes are
/// the bug. Not publishing the section on entry, or not emptying the TLB of
/// a CPU whose section stayed open when its thread leaves softmm
/// (`QuiescentGuard`'s drop), fails this model.
#[test]
fn a_real_section_against_a_real_munmap() {
    use crate::mm::{AddressSpace, MmConfig};
    use crate::phys::{PhysConfig, PhysMem};
    use crate::uapi::*;
    use crate::{Access, Cpu, PAGE_SIZE};
    const OLD: u8 = 0xab;
    const REUSED: u8 = 0xee;
    // The default posting policy, whose switches `check_broken` flips.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b.check(|| {
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        mm.handle_fault(a, Access::Write).unwrap();
        let old = mm.pte_at(a).pfn();
        // SAFETY: the frame is mapped at `a` and nothing else runs.
        unsafe { crate::access::fill_host(phys.frame_ptr(old), OLD, PAGE_SIZE as usize) };
        let t = {
            let mm = mm.clone();
            loom::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                let mut s = cpu.section();
                // A walk fills the TLB (the entry is present: no fault).
                let first = s.read_u8(a);
                loom::thread::yield_now();
                let held = s.read_u8(a);
                // A call into softmm from inside the section.
                drop(QuiescentGuard::enter());
                let after_call = s.read_u8(a);
                drop(s);
                (first, held, after_call)
            })
        };
        mm.munmap(a, PAGE_SIZE).unwrap();
        // SAFETY: arena memory, accessed atomically; no mapping refers to it.
        unsafe { crate::access::fill_host(phys.frame_ptr(old), REUSED, PAGE_SIZE as usize) };
        let (first, held, after_call) = t.join().unwrap();
        let segv = |r: Result<u8, crate::Fault>| r.is_err_and(|f| f.signal() == libc::SIGSEGV);
        assert!(first == Ok(OLD) || segv(first), "{first:?}");
        assert!(held == Ok(OLD) || segv(held), "a section read a freed, reused frame: {held:?}");
        assert!(after_call == Ok(OLD) || segv(after_call), "a section read a freed, reused frame: {after_call:?}");
        assert!(!segv(first) || segv(held));
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
    });
}

/// Three shootdowns in a row, the last one unmapping: the second one's
/// mark may land after an entry (taking the first one's mark) has already
/// seen its request, a stale mark; the third one's request may then come
/// while the next entry takes that mark. The entry's catch-up
/// (`CpuTlbState::catch_up`) takes the mark before it loads the requests,
/// so the third request is either seen or left marked for the entry after;
/// loading them first loses it with the mark, keeps the cached translation
/// and reads the freed frame (this model fails so, with four preemptions;
/// three are not enough).
#[test]
fn a_request_sent_while_the_cpu_takes_a_stale_mark_is_not_lost() {
    three_accesses_against_an_unmap(2, 4);
}

/// Fill owners on the real code (`targets.rs`): a `Cpu` on another thread
/// reads a page twice, its first read filling the TLB (the walk records
/// the CPU in the entry with its compare-exchange), while the main thread
/// drops the page with the real `MADV_DONTNEED`, whose shootdown asks only
/// the CPUs the zap's swap returned, then reuses the frame. Each read must
/// see the old bytes or, once the page is gone, the zero page; the reused
/// frame's bytes are the bug. Either the fill's compare-exchange comes
/// first, and the swap returns the CPU (which the flush then asks), or the
/// swap does, and the fill fails and walks again to an empty entry.
///
/// Returns what went wrong in one execution, if anything (a panic inside a
/// loom execution aborts the process while loom objects unwind, so the
/// broken variants report rather than panic).
fn a_real_fill_against_a_real_dontneed() -> Result<(), String> {
    let page = DroppedPage::new(crate::mm::MmConfig::default().shootdown_targets(super::ShootdownTargets::FillOwners));
    let t = {
        let page = page.clone();
        loom::thread::spawn(move || {
            let mut cpu = crate::Cpu::attached(&page.mm);
            let (first, stale1) = page.read(&mut cpu);
            let (second, stale2) = page.read(&mut cpu);
            (first, second, stale1 || stale2)
        })
    };
    page.drop_and_reuse();
    let (first, second, stale) = t.join().unwrap();
    page.verdict(first, second, stale)?;
    // Once the page read as dropped, it stays so.
    assert!(first != Ok(0) || second == Ok(0));
    Ok(())
}

/// The page the fill-owner models drop: one written page of an address
/// space, its frame filled with [`DroppedPage::OLD`], which the main
/// thread drops with the real `MADV_DONTNEED` and reuses.
#[derive(Clone)]
struct DroppedPage {
    phys: Arc<crate::phys::PhysMem>,
    mm: Arc<crate::mm::AddressSpace>,
    a: u64,
    /// The old frame's host address.
    old_ptr: usize,
    /// Set once the zap's flush has returned: from then on no CPU may hold
    /// a translation to the old frame. A loom atomic, so that the model
    /// sees the reader's check conflict with it (the bytes of guest memory
    /// are plain atomics that loom does not track).
    freed: Arc<AtomicBool>,
}

impl DroppedPage {
    const OLD: u8 = 0xab;
    const REUSED: u8 = 0xee;

    fn new(config: crate::mm::MmConfig) -> DroppedPage {
        use crate::uapi::*;
        let phys = crate::phys::PhysMem::new(crate::phys::PhysConfig::new(16 * crate::PAGE_SIZE)).unwrap();
        let mm = crate::mm::AddressSpace::new(&phys, config).unwrap();
        let a = mm.mmap(0, crate::PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        mm.handle_fault(a, crate::Access::Write).unwrap();
        let old_ptr = phys.frame_ptr(mm.pte_at(a).pfn());
        // SAFETY: the frame is mapped at `a` and nothing else runs.
        unsafe { crate::access::fill_host(old_ptr, Self::OLD, crate::PAGE_SIZE as usize) };
        DroppedPage { phys, mm, a, old_ptr: old_ptr as usize, freed: Arc::new(AtomicBool::new(false)) }
    }

    /// One access of the page through `cpu` (a held translation): the byte
    /// it reads, and whether it translated to the old frame after the free.
    fn read(&self, cpu: &mut crate::Cpu) -> (Result<u8, crate::Fault>, bool) {
        match cpu.translate(self.a, crate::Access::Read) {
            Ok(t) => {
                let page = t.as_ptr() as usize & !(crate::PAGE_SIZE as usize - 1);
                let stale = page == self.old_ptr && self.freed.load(Ordering::Acquire);
                let mut byte = [0];
                // SAFETY: inside the page, while the guard lives and the
                // thread makes no call into softmm; atomic.
                unsafe { crate::access::copy_from_host(t.as_ptr(), &mut byte) };
                (Ok(byte[0]), stale)
            }
            Err(f) => (Err(f), false),
        }
    }

    /// The main thread's side: `MADV_DONTNEED` of the page, then the frame
    /// reused (its bytes change).
    fn drop_and_reuse(&self) {
        self.mm.madvise(self.a, crate::PAGE_SIZE, crate::uapi::MADV_DONTNEED).unwrap();
        self.freed.store(true, Ordering::Release);
        // SAFETY: arena memory, accessed atomically; no mapping refers to it.
        unsafe { crate::access::fill_host(self.old_ptr as *mut u8, Self::REUSED, crate::PAGE_SIZE as usize) };
    }

    /// Each read saw the old bytes or the zero page, never the reused
    /// frame's, and none went through a stale entry. Consumes the page and
    /// checks that its frames are all free.
    fn verdict(
        self,
        first: Result<u8, crate::Fault>,
        second: Result<u8, crate::Fault>,
        stale: bool,
    ) -> Result<(), String> {
        let DroppedPage { phys, mm, .. } = self;
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
        let ok = |r: Result<u8, crate::Fault>| r == Ok(Self::OLD) || r == Ok(0);
        if stale || !ok(first) || !ok(second) {
            return Err(format!("a read through a stale entry of a freed frame: {first:?}, {second:?}, {stale}"));
        }
        Ok(())
    }
}

/// Posting against a detach, on the real code: a `Cpu` on another thread
/// reads a page of `mm` (its walk records it as the entry's fill owner),
/// switches to another address space and back (`Cpu::attach`: out of the
/// attached list and in again) and reads the page again, while the main
/// thread drops the page with the real `MADV_DONTNEED` under `posting` and
/// reuses the frame. The shootdown asks the CPU only if it finds it in the
/// list it loads; a CPU out of the list holds no entry (a switch empties
/// the TLB), and one back in took its request count on attach, after any
/// request posted to it, so that entry must be gone. Each read sees the old
/// bytes or the zero page; the reused frame's bytes are the bug, which
/// `broken::SWITCH_KEEPS_TLB` (a switch that keeps the TLB) shows.
fn a_real_cpu_switching_against_a_real_dontneed(posting: PostingPolicy) -> Result<(), String> {
    let config = crate::mm::MmConfig::default().posting_policy(posting);
    let page = DroppedPage::new(config.clone());
    let other = crate::mm::AddressSpace::new(&page.phys, config).unwrap();
    let t = {
        let (page, other) = (page.clone(), other.clone());
        loom::thread::spawn(move || {
            let mut cpu = crate::Cpu::attached(&page.mm);
            let (first, stale1) = page.read(&mut cpu);
            cpu.attach(&other);
            cpu.attach(&page.mm);
            let (second, stale2) = page.read(&mut cpu);
            (first, second, stale1 || stale2)
        })
    };
    page.drop_and_reuse();
    let (first, second, stale) = t.join().unwrap();
    drop(other);
    page.verdict(first, second, stale).map_err(|e| format!("{posting:?}: {e}"))
}

/// The model under the lock-free list and under the default (adaptive)
/// posting, and its variant where a switch keeps the TLB
/// (`broken::SWITCH_KEEPS_TLB`).
#[test]
fn a_cpu_that_left_the_list_holds_no_entry_a_shootdown_skipped() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    crate::sync::broken::check_model(
        || a_real_cpu_switching_against_a_real_dontneed(PostingPolicy::LockFree),
        &super::broken::SWITCH_KEEPS_TLB,
    );
    crate::sync::broken::check_model(
        || a_real_cpu_switching_against_a_real_dontneed(PostingPolicy::Adaptive),
        &super::broken::SWITCH_KEEPS_TLB,
    );
}

/// The model, and its variant where the zap collects no owner
/// (`broken::CLEAR_SKIPS_OWNERS`): its flush asks no CPU, and the reader
/// keeps using its cached translation of the freed frame.
#[test]
fn a_fill_racing_a_clear_is_seen_by_the_clear_or_sees_the_cleared_entry() {
    crate::sync::broken::check_model(a_real_fill_against_a_real_dontneed, &super::broken::CLEAR_SKIPS_OWNERS);
}

/// The model, and its variant where the fill stores the entry instead of a
/// compare-exchange (`broken::FILL_STORES`): a store after the zap's clear
/// maps the freed frame again.
#[test]
fn a_fill_that_stores_without_a_compare_exchange_is_caught() {
    crate::sync::broken::check_model(a_real_fill_against_a_real_dontneed, &super::broken::FILL_STORES);
}

/// Ranged requests on the real `CpuTlbState` and `TlbDomain` (one range
/// slot under loom): the CPU caches page `A` and makes two accesses to it,
/// each entry catching up on whatever was requested (the fence form, where
/// every entry looks); the initiator asks it to drop page `B`, then unmaps
/// `A`, asks it to drop `A`, waits and frees `A`. No access may hit `A`
/// once it is freed. A catch-up that loads the second request's number
/// before its initiator stored its range finds the first request's range in
/// the slot: the tag tells them apart, and the CPU drops everything. With
/// `broken::RANGE_WITHOUT_TAG` it drops `B` only, acknowledges, and keeps
/// `A` past the free.
fn ranged_requests_against_a_catch_up() -> Result<(), String> {
    use super::{CpuSet, FlushRange};
    use crate::{Access, PAGE_SIZE};
    const A: u64 = 0x10_0000;
    const B: u64 = 0x20_0000;
    let dom = Arc::new(TlbDomain::new());
    let state = CpuTlbState::new();
    let mut seen = dom.attach(&state);
    let mut frame = [0u8; 8];
    state.tlb.fill(A, frame.as_mut_ptr(), Access::Read.bit());
    let freed = Arc::new(AtomicBool::new(false));
    let t = {
        let (state, freed) = (state.clone(), freed.clone());
        loom::thread::spawn(move || {
            let mut stale = false;
            for _ in 0..2 {
                state.section_begin(false);
                state.catch_up(&mut seen, true);
                stale |= state.tlb.hit(A, Access::Read).is_some() && freed.load(Ordering::Acquire);
                state.section_end();
            }
            stale
        })
    };
    let mut targets = CpuSet::EMPTY;
    targets.insert(state.slot().expect("a slot"));
    dom.flush_begin_targets(&[], &targets, FlushRange::new(B, B + PAGE_SIZE)).wait();
    dom.flush_begin_targets(&[], &targets, FlushRange::new(A, A + PAGE_SIZE)).wait();
    freed.store(true, Ordering::Release);
    let stale = t.join().unwrap();
    dom.detach(&state);
    if stale {
        return Err("an access hit a page dropped by a ranged request after its free".into());
    }
    Ok(())
}

/// The model above, and its variant that trusts a range slot without its
/// tag (`broken::RANGE_WITHOUT_TAG`).
#[test]
fn a_ranged_request_is_never_mistaken_for_an_older_one() {
    crate::sync::broken::check_model(ranged_requests_against_a_catch_up, &super::broken::RANGE_WITHOUT_TAG);
}

/// Runs `model` with the loom-only switch `switch` clear, where no
/// execution may find anything wrong, then set, where some execution must.
/// A model reports rather than panics: a panic inside a loom execution
/// aborts the process as loom objects unwind.
fn check_broken(switch: &'static std::sync::atomic::AtomicBool, preemptions: usize, model: fn() -> bool) {
    use std::sync::atomic::Ordering::Relaxed;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = builder();
    b.preemption_bound = Some(preemptions);
    switch.store(false, Relaxed);
    b.check(move || assert!(model(), "a CPU used a freed frame"));
    let caught = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = caught.clone();
    let mut b = builder();
    b.preemption_bound = Some(preemptions);
    switch.store(true, Relaxed);
    b.check(move || {
        if !model() {
            seen.store(true, Relaxed);
        }
    });
    switch.store(false, Relaxed);
    assert!(caught.load(Relaxed), "the model did not catch the broken variant");
}

/// Lock-free posting against an attach: a CPU attaches to the address
/// space and accesses the page while the main thread unmaps it, shoots it
/// down with the published list and frees the frame. Either the shootdown
/// saw the CPU in the list, or the CPU's walk sees the cleared PTE. Without
/// the initiator's fence before it loads the list (`NO_LIST_FENCE`) both
/// may miss: the store-buffering race the list's lock used to close.
/// (Seen to fail so.)
#[test]
fn lock_free_posting_against_an_attach() {
    check_broken(&super::shootdown::broken::NO_LIST_FENCE, 2, || {
        let dom = domain(PostingPolicy::LockFree);
        let page = Page::mapped();
        let t = {
            let (dom, page) = (dom.clone(), page.clone());
            loom::thread::spawn(move || {
                let mut cpu = ModelCpu::attached(&dom);
                cpu.access_checked(&page, false)
            })
        };
        // Pinned already, as a zap is: the flush's own pin then runs no
        // fence of its own (crossbeam-epoch fences only the outermost).
        let _zap = crossbeam_epoch::pin();
        page.unmap();
        dom.flush(&[]);
        page.free();
        t.join().unwrap()
    });
}

/// Lock-free posting against a detach: the CPU a shootdown finds in the
/// published list detaches and attaches elsewhere meanwhile; the shootdown
/// still ends (the detach acknowledged), and the CPU's accesses to the
/// page come before the free.
#[test]
fn lock_free_posting_against_a_detach() {
    builder().check(|| {
        let (dom, elsewhere) = (domain(PostingPolicy::LockFree), domain(PostingPolicy::LockFree));
        let page = Page::mapped();
        let mut cpu = ModelCpu::attached(&dom);
        let t = {
            let (dom, elsewhere, page) = (dom.clone(), elsewhere.clone(), page.clone());
            loom::thread::spawn(move || {
                cpu.access(&page);
                cpu.switch(&dom, &elsewhere);
                cpu.access(&Page::mapped());
            })
        };
        page.unmap();
        dom.flush(&[]);
        page.free();
        t.join().unwrap();
    });
}

/// Two initiators share barriers while a CPU with the light section
/// barrier (membarrier's reader side, modelled in `barrier.rs`) accesses
/// the page twice: one initiator shoots down another address space (whose
/// idle CPU makes it run a barrier), the main thread unmaps the page,
/// shoots it down and frees the frame. A barrier that started before the
/// main thread posted must not cover it: joining one (`JOIN_RUNNING`) lets
/// the CPU miss the request while the initiator misses the CPU's section.
#[test]
fn a_shared_barrier_against_a_light_section_entry() {
    check_broken(&super::shared_barrier::broken::JOIN_RUNNING, 3, || {
        let (dom, other) = (domain(PostingPolicy::SharedBarrier), domain(PostingPolicy::SharedBarrier));
        let page = Page::mapped();
        let mut cpu = ModelCpu::attached(&dom);
        let _idle = ModelCpu::attached(&other);
        let t = {
            let page = page.clone();
            loom::thread::spawn(move || cpu.access_checked(&page, true) & cpu.access_checked(&page, true))
        };
        let i = {
            let other = other.clone();
            loom::thread::spawn(move || other.flush(&[]))
        };
        page.unmap();
        dom.flush(&[]);
        page.free();
        i.join().unwrap();
        t.join().unwrap()
    });
}

/// A CPU with the light barrier, in adaptive mode with a hair trigger,
/// switches to fence mode at the entry that catches an earlier request
/// while the main thread unmaps the page, shoots it down (skipping the
/// barrier if it reads the fence mode in the mark its post returns) and
/// frees the frame; the CPU then makes a second access, fenced. An
/// initiator that skips the barrier must still fence: without
/// (`SKIP_WITHOUT_FENCE`) it may read the switching section's `inside`
/// as 0 while that section walked before the unmap.
#[test]
fn a_switch_to_fence_mode_against_an_initiator() {
    use super::fence_mode::{EntryBarrier, Tuning};
    check_broken(&super::fence_mode::broken::SKIP_WITHOUT_FENCE, 3, || {
        let dom = domain(PostingPolicy::Adaptive);
        let page = Page::mapped();
        let mut cpu = ModelCpu::attached(&dom);
        let mut barrier = EntryBarrier::new(&cpu.state, true);
        let hair =
            Tuning { to_fence: 1, window: std::time::Duration::from_secs(3600), back_after: 1 << 20, back_below: 1 };
        barrier.reset(&cpu.state, true, hair);
        // An earlier shootdown, while the CPU was idle: its first entry
        // catches it, and switches.
        dom.flush(&[]);
        let t = {
            let page = page.clone();
            loom::thread::spawn(move || {
                let mut ok = true;
                for _ in 0..2 {
                    // `Cpu`'s entry: the light barrier, then the slow path
                    // if the mark is set (always, once fencing).
                    cpu.state.section_begin(true);
                    if cpu.state.flush_pending() != 0 && barrier.slow_entry(&cpu.state, &mut cpu.seen) {
                        cpu.cached = false;
                    }
                    if !cpu.cached && page.pte.load(Ordering::Acquire) != 0 {
                        cpu.cached = true;
                    }
                    ok &= !(cpu.cached && page.freed.load(Ordering::Relaxed));
                    cpu.state.section_end();
                }
                assert!(barrier.fences(), "the hair trigger switched");
                ok
            })
        };
        page.unmap();
        dom.flush(&[]);
        page.free();
        t.join().unwrap()
    });
}
