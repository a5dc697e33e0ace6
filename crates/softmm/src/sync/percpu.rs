//! Per-CPU data in userspace (Linux's `DEFINE_PER_CPU` and `this_cpu_*`):
//! one cache-line-padded slot per CPU slot, each thread writing the slot of
//! its own [`this_slot`], a reader summing them all.
//!
//! A thread is not pinned to a CPU, so the slot is the thread's (handed out
//! round robin at its first use, as the frame allocator's shard slot is),
//! and two threads may share one when more threads than slots run: writes
//! to a slot are therefore atomic read-modify-writes, which cost a local
//! cache hit while a slot has one writer, and stay correct when it has
//! two. What this buys is that a writer never writes a line another
//! thread's writes keep taking away: the statistics of a write path cost no
//! coherence miss, where one shared counter costs one per write per thread.

use crossbeam_utils::CachePadded;

/// Slots per [`PerCpu`]: as many threads as this write to slots of their
/// own. Two under loom, whose models run two or three threads.
pub(crate) const SLOTS: usize = if cfg!(loom) { 2 } else { 16 };

/// The next slot, round robin. A hint only (which line a count lands on),
/// so `std`'s atomic.
#[cfg(not(loom))]
fn next_slot() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SLOTS
}

#[cfg(loom)]
std::thread_local! {
    /// Under loom, the next slot of the model running on this OS thread
    /// (loom runs a model's threads on the OS thread of its test, so
    /// models running beside it do not take from it).
    static NEXT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(loom)]
fn next_slot() -> usize {
    NEXT.try_with(|n| {
        let slot = n.get();
        n.set(slot + 1);
        slot % SLOTS
    })
    .unwrap_or(0)
}

/// Under loom, restarts the slots' round robin: called first in a model's
/// execution, it gives the thread that counts first slot 0 and the next one
/// slot 1, so that the model's two threads count in slots of their own.
#[cfg(all(test, loom))]
pub(crate) fn restart_slots() {
    NEXT.with(|n| n.set(0));
}

#[cfg(not(loom))]
std::thread_local! {
    /// This thread's slot, the next one at its first use.
    static SLOT: usize = next_slot();
}

// Under loom the model's threads share one OS thread: loom's thread locals
// give each its own slot, as the protocols built on the slots assume.
#[cfg(loom)]
loom::thread_local! {
    static SLOT: usize = next_slot();
}

/// The calling thread's slot, below [`SLOTS`]; slot 0 once the thread's
/// locals are being destroyed (a VMA dropped by an epoch collection at
/// thread exit still counts, in slot 0).
#[inline]
pub(crate) fn this_slot() -> usize {
    SLOT.try_with(|s| *s).unwrap_or(0)
}

/// One `T` per slot, each on cache lines of its own.
pub(crate) struct PerCpu<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T: Default> Default for PerCpu<T> {
    fn default() -> Self {
        PerCpu { slots: (0..SLOTS).map(|_| CachePadded::new(T::default())).collect() }
    }
}

impl<T> PerCpu<T> {
    /// Slot `i` holds `f(i)`.
    pub(crate) fn from_fn(f: impl FnMut(usize) -> T) -> Self {
        PerCpu { slots: (0..SLOTS).map(f).map(CachePadded::new).collect() }
    }

    /// The calling thread's slot (`this_cpu_ptr`).
    #[inline]
    pub(crate) fn mine(&self) -> &T {
        &self.slots[this_slot()]
    }

    /// Every slot, for a sum (`for_each_possible_cpu`).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }
}

/// A count kept per CPU slot (Linux's `percpu_counter` without the fold:
/// see `phys/commit.rs` for why none is needed): an add writes the caller's
/// slot only; [`PercpuCounter::sum`] reads every slot. Its atomics are the
/// crate's (loom's under loom): a protocol (the commit charge) is built on it.
#[derive(Default)]
pub(crate) struct PercpuCounter {
    slots: PerCpu<crate::sync::AtomicI64>,
}

impl PercpuCounter {
    /// Adds `delta` to the calling thread's slot. Relaxed: a reader that
    /// must see it is ordered after it by a lock of its own (the commit
    /// charge's `never` mutex), or reads a statistic.
    #[inline]
    pub(crate) fn add(&self, delta: i64) {
        self.slots.mine().fetch_add(delta, crate::sync::Ordering::Relaxed);
    }

    /// The sum of every slot: exact once the adds it must count happen
    /// before the call (`percpu_counter_sum`).
    pub(crate) fn sum(&self) -> i64 {
        self.slots.iter().map(|s| s.load(crate::sync::Ordering::Relaxed)).sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Each thread adds to its own slot, and the sum over the slots is
    /// every thread's adds, whichever slots they shared.
    #[test]
    fn the_sum_of_the_slots_counts_every_add() {
        let c: std::sync::Arc<PerCpu<AtomicU64>> = Default::default();
        let threads: Vec<_> = (0..2 * SLOTS as u64)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        c.mine().fetch_add(i, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = 2 * SLOTS as u64;
        assert_eq!(c.iter().map(|s| s.load(Ordering::Relaxed)).sum::<u64>(), 100 * n * (n - 1) / 2);
    }
}
