//! The opt-in count of writes to memory that other CPUs also write (lock
//! words, shared reference counts and statistics, node free lists, the
//! shootdown generation): the instrument behind `tests/shared_writes.rs`.
//!
//! It lives beside the primitives whose writes it counts, below every
//! mechanism that reports one (frame allocation, the fault handler), so that
//! none of them depends on another to count. Each thread keeps its own count;
//! a [`Cpu`](crate::Cpu) adds the difference made by each fault to its
//! [`FaultStats::shared_writes`](crate::FaultStats::shared_writes).

#[cfg(feature = "shared-write-stats")]
thread_local! {
    /// The thread's own writes.
    static SHARED_WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The writes of the deferred frees its collections ran ([`Reclaiming`]).
    static RECLAIM_WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Whether a deferred free is running on the thread.
    static RECLAIMING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Records `n` writes to memory that other CPUs also write (a lock word, a
/// shared reference count or statistic). Compiles to nothing without the
/// `shared-write-stats` feature. Inside a deferred free ([`Reclaiming`]),
/// counted apart from the thread's own.
#[inline(always)]
pub(crate) fn shared_write(n: u64) {
    #[cfg(feature = "shared-write-stats")]
    {
        // `try_with`: a collection at thread exit may free after the
        // thread's locals are gone, uncounted then.
        let reclaiming = RECLAIMING.try_with(|r| r.get()).unwrap_or(false);
        let count = if reclaiming { &RECLAIM_WRITES } else { &SHARED_WRITES };
        let _ = count.try_with(|c| c.set(c.get() + n));
    }
    #[cfg(not(feature = "shared-write-stats"))]
    let _ = n;
}

/// Marks the thread as running a deferred free (`super::rcu`) until
/// dropped: the shared writes it makes meanwhile are the garbage of
/// whichever thread queued it, not the work of the call whose pin collected.
pub(crate) struct Reclaiming {
    #[cfg(feature = "shared-write-stats")]
    was: bool,
}

impl Reclaiming {
    /// Enters a deferred free (nested ones too: a free that drops the last
    /// reference of something freed the same way).
    pub(crate) fn enter() -> Reclaiming {
        #[cfg(feature = "shared-write-stats")]
        return Reclaiming { was: RECLAIMING.try_with(|r| r.replace(true)).unwrap_or(false) };
        #[cfg(not(feature = "shared-write-stats"))]
        Reclaiming {}
    }
}

impl Drop for Reclaiming {
    fn drop(&mut self) {
        #[cfg(feature = "shared-write-stats")]
        let _ = RECLAIMING.try_with(|r| r.set(self.was));
    }
}

/// The calling thread's count of writes to memory that other CPUs also
/// write, so far: by its CPUs' faults and by its own calls (`mmap`,
/// `munmap` and the other writers of an address space: the `mmap_lock`
/// word and sequence count, the published VMA tree, the arena's commit
/// charge and VMA count, the reservations of a lock-free unmap), and by
/// the deferred frees its epoch collections ran, whichever thread queued
/// them (another thread's VMAs and tables freed after a grace period). 0
/// without the `shared-write-stats` feature. Not counted: the reference
/// counts an imbl node copy increments (one per `Arc<Vma>` of the copied
/// node).
///
/// Read it before and after a call to see that call's count.
pub fn shared_writes_this_thread() -> u64 {
    #[cfg(feature = "shared-write-stats")]
    return shared_writes_so_far() + RECLAIM_WRITES.try_with(|c| c.get()).unwrap_or(0);
    #[cfg(not(feature = "shared-write-stats"))]
    0
}

/// The calling thread's own shared-write count so far, without the deferred
/// frees its collections ran (0 without the feature): what a call's own
/// count (a fault's, an unmap's) is the difference of.
#[inline]
pub(crate) fn shared_writes_so_far() -> u64 {
    #[cfg(feature = "shared-write-stats")]
    return SHARED_WRITES.try_with(|c| c.get()).unwrap_or(0);
    #[cfg(not(feature = "shared-write-stats"))]
    0
}
