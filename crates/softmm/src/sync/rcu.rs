//! Frees after a grace period (Linux's `call_rcu` and `kfree_rcu`), on
//! crossbeam-epoch: the one way softmm defers a free.
//!
//! Linux runs an RCU callback on the CPU that queued it, so a fault on
//! another CPU never frees what a writer unmapped. crossbeam-epoch runs a
//! deferred function in whichever thread's collection reaches it first
//! (every 128th pin collects), often a faulter's. The writes such a free
//! makes (the reference counts of a writer's VMAs, its slot's VMA count)
//! are real, but they are the writer's garbage, not the work of the call
//! that happened to pin: [`shared_write`](super::shared_write) counts them
//! apart while a deferred free runs, so that a fault's count is its own
//! and the thread's whole count ([`super::shared_writes_this_thread`])
//! still holds them.

use super::shared_write::Reclaiming;
use crossbeam_epoch::{Guard, Shared};

/// Destroys `old` once every guard pinned now is gone.
///
/// # Safety
///
/// As [`Guard::defer_destroy`]: `old` is unreachable from every shared
/// location, so no guard pinned after this call can load it, and nothing
/// else destroys it.
pub(crate) unsafe fn defer_destroy<T>(guard: &Guard, old: Shared<'_, T>) {
    // SAFETY: the caller's contract is `defer_destroy`'s, which defers
    // exactly this (`into_owned` once the grace period ends).
    unsafe {
        guard.defer_unchecked(move || {
            let _reclaiming = Reclaiming::enter();
            drop(old.into_owned());
        })
    }
}

/// Runs `f` once every guard pinned now is gone (Linux's `call_rcu`), its
/// shared writes counted as reclaim.
pub(crate) fn call_rcu(guard: &Guard, f: impl FnOnce() + Send + 'static) {
    guard.defer(move || {
        let _reclaiming = Reclaiming::enter();
        f()
    });
}
