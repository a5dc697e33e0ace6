//! The posting, barrier and fence-mode protocols against an attach, a
//! detach and a section entry, each with the broken switch it must catch.

use super::*;

/// Runs `model` with the loom-only switch `switch` clear, where no
/// execution may find anything wrong, then set, where some execution must.
/// A model reports rather than panics: a panic inside a loom execution
/// aborts the process as loom objects unwind.
fn check_broken(
    switch: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    preemptions: usize,
    model: fn() -> bool,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut b = builder();
    b.preemption_bound = Some(preemptions);
    switch.with(|s| s.set(false));
    b.check(move || assert!(model(), "a CPU used a freed frame"));
    let caught = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = caught.clone();
    let mut b = builder();
    b.preemption_bound = Some(preemptions);
    switch.with(|s| s.set(true));
    b.check(move || {
        if !model() {
            seen.store(true, Relaxed);
        }
    });
    switch.with(|s| s.set(false));
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
    check_broken(&crate::tlb::shootdown::broken::NO_LIST_FENCE, 2, || {
        let dom = domain(PostingPolicy::LockFree);
        let page = Page::mapped();
        let t = {
            let (dom, page) = (dom.clone(), page.clone());
            crate::sync::model::spawn(move || {
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
            crate::sync::model::spawn(move || {
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
    check_broken(&crate::tlb::shared_barrier::broken::JOIN_RUNNING, 3, || {
        let (dom, other) = (domain(PostingPolicy::SharedBarrier), domain(PostingPolicy::SharedBarrier));
        let page = Page::mapped();
        let mut cpu = ModelCpu::attached(&dom);
        let _idle = ModelCpu::attached(&other);
        let t = {
            let page = page.clone();
            crate::sync::model::spawn(move || cpu.access_checked(&page, true) & cpu.access_checked(&page, true))
        };
        let i = {
            let other = other.clone();
            crate::sync::model::spawn(move || other.flush(&[]))
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
    use crate::tlb::fence_mode::{EntryBarrier, Tuning};
    check_broken(&crate::tlb::fence_mode::broken::SKIP_WITHOUT_FENCE, 3, || {
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
            crate::sync::model::spawn(move || {
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
