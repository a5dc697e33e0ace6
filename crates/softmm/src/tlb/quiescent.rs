//! Thread quiescence: which CPUs a thread owns, so that while the thread is
//! inside softmm (a syscall, a fault's slow path, attaching a CPU) every one
//! of them is quiescent and no shootdown waits for it.
//!
//! A CPU acknowledges a shootdown only at its own next MMU call, which its
//! thread makes. A thread blocked inside softmm makes none, so any of its
//! CPUs a shootdown waited for would never acknowledge: the waiting
//! initiator may be this very thread (a syscall that unmaps, with a second
//! CPU of the thread attached), or another thread that holds a lock this
//! thread waits on (a PTE lock during a COW break). Marking all the thread's
//! CPUs quiescent for the duration of every entry into softmm removes both
//! cases, and is sound because a thread inside softmm is not using any
//! translation of its CPUs. A CPU is therefore registered with the thread
//! that made it, which is why the `Cpu` that owns it is not `Send`.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::Arc;

use super::CpuTlbState;

type ThreadCpus = RefCell<Vec<Arc<CpuTlbState>>>;

#[cfg(not(loom))]
std::thread_local! {
    /// The shootdown state of every CPU made on this thread.
    static THREAD_CPUS: ThreadCpus = const { RefCell::new(Vec::new()) };
    /// How many [`QuiescentGuard`]s of this thread are alive.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

#[cfg(loom)]
loom::thread_local! {
    /// The shootdown state of every CPU made on this (modelled) thread.
    static THREAD_CPUS: ThreadCpus = RefCell::new(Vec::new());
    /// How many [`QuiescentGuard`]s of this (modelled) thread are alive.
    static DEPTH: Cell<usize> = Cell::new(0);
}

/// How many [`QuiescentGuard`]s of the calling thread are alive (0 once
/// its locals are being destroyed).
fn depth() -> usize {
    DEPTH.try_with(Cell::get).unwrap_or(0)
}

/// Registers `cpu` as one of the calling thread's CPUs: from now on every
/// [`QuiescentGuard`] of this thread marks it quiescent, and this thread's
/// shootdowns neither count a request for it nor wait for it (see
/// [`with_thread_cpus`]). Made while guards of the thread are alive (by a
/// callback that softmm runs inside a call: a device's, a host memory
/// release), it enters each of them now, as if it had been there when they
/// began, so that each one's end leaves the level it entered.
pub(crate) fn register_thread_cpu(cpu: &Arc<CpuTlbState>) {
    THREAD_CPUS.with(|c| c.borrow_mut().push(cpu.clone()));
    (0..depth()).for_each(|_| cpu.enter_quiescent());
}

/// Undoes [`register_thread_cpu`] (the CPU is being dropped), leaving the
/// levels of the guards alive, which will not visit it again; a CPU that
/// is not registered is ignored, and so is a thread whose list is gone.
pub(crate) fn unregister_thread_cpu(cpu: &Arc<CpuTlbState>) {
    let listed = THREAD_CPUS.try_with(|c| {
        let mut c = c.borrow_mut();
        let before = c.len();
        c.retain(|s| !Arc::ptr_eq(s, cpu));
        c.len() != before
    });
    if matches!(listed, Ok(true)) {
        (0..depth()).for_each(|_| cpu.exit_quiescent());
    }
}

/// Runs `f` on the shootdown state of the calling thread's CPUs (the `mine`
/// argument of [`super::TlbDomain::flush_begin`]).
///
/// A thread that is exiting may call into softmm after its list of CPUs was
/// destroyed (thread-local destructors run in no set order: crossbeam-epoch's
/// runs deferred frees, and the last reference to a VMA may drop a
/// host-backed file, whose writeback shoots down). Such a thread has no CPU
/// left to mark or to spare from a shootdown: `f` gets an empty list.
pub(crate) fn with_thread_cpus<R>(f: impl FnOnce(&[Arc<CpuTlbState>]) -> R) -> R {
    let mut f = Some(f);
    match THREAD_CPUS.try_with(|c| (f.take().expect("called once"))(&c.borrow())) {
        Ok(r) => r,
        Err(_) => (f.take().expect("not called"))(&[]),
    }
}

/// Marks the calling thread's CPUs quiescent for the life of the guard.
/// Guards nest. Not `Send`: it must be dropped on the thread whose CPUs it
/// marked. A CPU registered or unregistered while guards are alive (a
/// callback's, inside a softmm call) enters or leaves their levels then
/// ([`register_thread_cpu`]), so that each guard's end leaves exactly the
/// levels it entered.
#[must_use = "the CPUs are quiescent only while the guard lives"]
pub(crate) struct QuiescentGuard(PhantomData<*const ()>);

impl QuiescentGuard {
    /// Marks every CPU of the calling thread quiescent.
    pub(crate) fn enter() -> QuiescentGuard {
        with_thread_cpus(|cpus| cpus.iter().for_each(|s| s.enter_quiescent()));
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        QuiescentGuard(PhantomData)
    }
}

impl Drop for QuiescentGuard {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        with_thread_cpus(|cpus| {
            cpus.iter().for_each(|s| {
                s.exit_quiescent();
                // A CPU whose section stayed open across the call (a
                // multi-access `Section`, a `with_slice` callback): while it
                // was quiescent a shootdown may have skipped it and freed
                // what it cached, and this thread's own flushes never wait
                // for it; its accesses check the flush requests only when a
                // section begins, so its TLB is emptied here, after the end of the
                // quiescent state (whose fence orders the walks that refill
                // it after the PTE changes that the skipped flush covered).
                if s.in_section() {
                    s.tlb.clear();
                }
            })
        });
    }
}
