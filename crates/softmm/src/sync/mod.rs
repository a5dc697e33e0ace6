//! The crate's synchronization primitives, switched to `loom`'s under `cfg(loom)`.
//!
//! Every atomic and lock that takes part in a lock-free protocol is imported from
//! here, so the `loom` models (`loom_tests.rs` here and in `crate::tlb`,
//! unit-test modules built only with `--cfg loom`) explore the real code.
//! The protocol primitives built on them live in submodules, with the opt-in
//! count of writes to shared memory (`shared_write`), which every mechanism
//! below the fault handler reports to.

#[cfg(all(test, loom))]
mod loom_tests;
mod seqcount;
#[cfg(not(loom))]
mod shared_write;
mod vma_lock;

pub use seqcount::SeqCount;
#[cfg(not(loom))]
pub(crate) use shared_write::{shared_write, shared_writes_so_far};
pub use vma_lock::VmaLock;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};

/// Spin-wait hint: a CPU pause on hardware, a yield under `loom` so the model
/// checker can schedule the thread we are waiting for.
#[inline]
pub(crate) fn spin_hint(iteration: u32) {
    #[cfg(loom)]
    {
        let _ = iteration;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if iteration < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
