//! The crate's synchronization primitives, switched to `loom`'s under `cfg(loom)`.
//!
//! Every atomic and lock that takes part in a lock-free protocol is imported from
//! here, so the `loom` models (`loom_tests.rs` here and in `crate::tlb`,
//! unit-test modules built only with `--cfg loom`) explore the real code.
//! The protocol primitives built on them live in submodules, with the opt-in
//! count of writes to shared memory (`shared_write`), which every mechanism
//! below the fault handler reports to.
//!
//! What comes from here: the atomics (`AtomicU32`, `AtomicU64`, `AtomicI64`,
//! `AtomicUsize`, `AtomicPtr`, `AtomicBool`, `Ordering`, `fence`) and the
//! locks (`Mutex`, `RwLock` and their guards, with `parking_lot`'s API:
//! `lock`, `read`, `read_recursive`, `try_read`, `write`, `get_mut`, no
//! poisoning). They are `std`'s and `parking_lot`'s in a normal build and
//! `loom`'s under `cfg(loom)`, where `crossbeam-epoch` is built with its own
//! `loom` support too (`--cfg crossbeam_loom`), so a model runs the real
//! fault handler, page tables and mapping calls. Every lock and every atomic
//! of a protocol (frame reference and pin counts, PTE locks, `mmap_lock`,
//! the page cache's locks, the sequence counts, the TLB generations) is
//! imported from here. What may stay `std`'s: the guest-memory atomics of
//! the arena (`access.rs`, `cpu.rs`, `phys::copy_frame`: they carry the guest
//! program's data, not softmm's protocol), pure statistics counters, and
//! thread-local hints such as the frame-cache shard slot.

pub(crate) mod broken;
#[cfg(loom)]
mod loom_lock;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, loom))]
pub(crate) mod model;
pub(crate) mod percpu;
pub(crate) mod range_writers;
pub(crate) mod rcu;
mod seqcount;
mod shared_write;
mod vma_lock;

pub use seqcount::SeqCount;
pub(crate) use shared_write::{shared_write, shared_writes_so_far, LastWriter};
pub use shared_write::{shared_writes_by_site_this_thread, shared_writes_this_thread, SharedWriteSite};
pub use vma_lock::VmaLock;

// The whole set, used or not yet, so no file needs `std`'s for a protocol.
#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom_lock::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

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
