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

std::thread_local! {
    /// This thread's slot, the next one round robin at its first use. A hint
    /// only (which line a statistic lands on), so `std`'s atomic even under loom.
    static SLOT: usize = {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SLOTS
    };
}

/// The calling thread's slot, below [`SLOTS`].
#[inline]
pub(crate) fn this_slot() -> usize {
    SLOT.with(|s| *s)
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
