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
    /// The thread's counts by the site that made them ([`SharedWriteSite`]).
    static BY_SITE: std::cell::RefCell<std::collections::BTreeMap<(&'static str, u32, bool), u64>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// Records `n` writes to memory that other CPUs also write (a lock word, a
/// shared reference count or statistic). Compiles to nothing without the
/// `shared-write-stats` feature. Inside a deferred free ([`Reclaiming`]),
/// counted apart from the thread's own. Each count is also kept by the
/// source line that called ([`shared_writes_by_site_this_thread`]).
#[inline(always)]
#[track_caller]
pub(crate) fn shared_write(n: u64) {
    #[cfg(feature = "shared-write-stats")]
    {
        // `try_with`: a collection at thread exit may free after the
        // thread's locals are gone, uncounted then.
        let reclaiming = RECLAIMING.try_with(|r| r.get()).unwrap_or(false);
        let count = if reclaiming { &RECLAIM_WRITES } else { &SHARED_WRITES };
        let _ = count.try_with(|c| c.set(c.get() + n));
        let at = std::panic::Location::caller();
        let _ = BY_SITE.try_with(|m| {
            if let Ok(mut m) = m.try_borrow_mut() {
                *m.entry((at.file(), at.line(), reclaiming)).or_default() += n;
            }
        });
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

/// One source line's share of the calling thread's shared-write count
/// ([`shared_writes_by_site_this_thread`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharedWriteSite {
    /// The source file of the write (`crates/softmm/src/...`).
    pub file: &'static str,
    /// Its line.
    pub line: u32,
    /// Made by a deferred free the thread's collection ran (another
    /// call's garbage, possibly another thread's), not by its own call.
    pub reclaim: bool,
    /// Shared-line writes counted there so far.
    pub writes: u64,
}

/// The calling thread's [`shared_writes_this_thread`] broken down by the
/// source line that counted each write, in file and line order: what a
/// call writes, site by site (the difference of two readings). Empty
/// without the `shared-write-stats` feature.
pub fn shared_writes_by_site_this_thread() -> Vec<SharedWriteSite> {
    #[cfg(feature = "shared-write-stats")]
    return BY_SITE
        .try_with(|m| {
            m.borrow()
                .iter()
                .map(|(&(file, line, reclaim), &writes)| SharedWriteSite { file, line, reclaim, writes })
                .collect()
        })
        .unwrap_or_default();
    #[cfg(not(feature = "shared-write-stats"))]
    Vec::new()
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

/// The thread that last wrote a line which is normally one thread's (a
/// per-CPU slot, a window that one arena's writer owns), kept beside it
/// with the `shared-write-stats` feature (empty without): a write to the
/// line is counted as shared ([`shared_write`]) only when another thread
/// wrote it last, that is when the line moves between CPUs, as a
/// coherence miss does. Two threads sharing a slot, or writing one window,
/// count every write that takes the line from the other.
#[derive(Default)]
pub(crate) struct LastWriter {
    /// The last writer's thread number plus one; 0 before the first write.
    #[cfg(feature = "shared-write-stats")]
    thread: std::sync::atomic::AtomicUsize,
}

impl LastWriter {
    /// Records a write to the line by the calling thread, counted at the
    /// caller's site when the line was another thread's.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn write(&self) {
        #[cfg(feature = "shared-write-stats")]
        {
            let me = super::percpu::this_thread_number().map_or(usize::MAX, |n| n + 1);
            let was = self.thread.swap(me, std::sync::atomic::Ordering::Relaxed);
            if was != 0 && was != me {
                shared_write(1);
            }
        }
    }
}
