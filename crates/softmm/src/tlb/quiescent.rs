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

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use super::CpuTlbState;

type ThreadCpus = RefCell<Vec<Arc<CpuTlbState>>>;

#[cfg(not(loom))]
std::thread_local! {
    /// The shootdown state of every CPU made on this thread.
    static THREAD_CPUS: ThreadCpus = const { RefCell::new(Vec::new()) };
}

#[cfg(loom)]
loom::thread_local! {
    /// The shootdown state of every CPU made on this (modelled) thread.
    static THREAD_CPUS: ThreadCpus = RefCell::new(Vec::new());
}

/// Registers `cpu` as one of the calling thread's CPUs: from now on every
/// [`QuiescentGuard`] of this thread marks it quiescent, and this thread's
/// shootdowns neither count a request for it nor wait for it (see
/// [`with_thread_cpus`]).
pub(crate) fn register_thread_cpu(cpu: &Arc<CpuTlbState>) {
    THREAD_CPUS.with(|c| c.borrow_mut().push(cpu.clone()));
}

/// Undoes [`register_thread_cpu`] (the CPU is being dropped); a CPU that is
/// not registered is ignored, and so is a thread whose list is gone.
pub(crate) fn unregister_thread_cpu(cpu: &Arc<CpuTlbState>) {
    let _ = THREAD_CPUS.try_with(|c| c.borrow_mut().retain(|s| !Arc::ptr_eq(s, cpu)));
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
/// marked. A CPU registered while a guard is alive is not marked by it, and
/// must not be unregistered while one is: neither happens, since a `Cpu` is
/// made and dropped only by its owner, never inside a softmm call.
#[must_use = "the CPUs are quiescent only while the guard lives"]
pub(crate) struct QuiescentGuard(PhantomData<*const ()>);

impl QuiescentGuard {
    /// Marks every CPU of the calling thread quiescent.
    pub(crate) fn enter() -> QuiescentGuard {
        with_thread_cpus(|cpus| cpus.iter().for_each(|s| s.enter_quiescent()));
        QuiescentGuard(PhantomData)
    }
}

impl Drop for QuiescentGuard {
    fn drop(&mut self) {
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
