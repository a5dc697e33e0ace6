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
    static SHARED_WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Records `n` writes to memory that other CPUs also write (a lock word, a
/// shared reference count or statistic). Compiles to nothing without the
/// `shared-write-stats` feature.
#[inline(always)]
pub(crate) fn shared_write(n: u64) {
    #[cfg(feature = "shared-write-stats")]
    SHARED_WRITES.with(|c| c.set(c.get() + n));
    #[cfg(not(feature = "shared-write-stats"))]
    let _ = n;
}

/// The calling thread's count of writes to memory that other CPUs also
/// write, so far: by its CPUs' faults and by its own calls (`mmap`,
/// `munmap` and the other writers of an address space: the `mmap_lock`
/// word and sequence count, the published VMA tree, the arena's commit
/// charge and VMA count, the reservations of a lock-free unmap). 0 without
/// the `shared-write-stats` feature. Not counted: the reference counts an
/// imbl node copy increments (one per `Arc<Vma>` of the copied node).
///
/// Read it before and after a call to see that call's count.
pub fn shared_writes_this_thread() -> u64 {
    shared_writes_so_far()
}

/// The calling thread's shared-write count so far (0 without the feature).
#[inline]
pub(crate) fn shared_writes_so_far() -> u64 {
    #[cfg(feature = "shared-write-stats")]
    return SHARED_WRITES.with(|c| c.get());
    #[cfg(not(feature = "shared-write-stats"))]
    0
}
