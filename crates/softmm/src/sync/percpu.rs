//! Per-CPU data in userspace (Linux's `DEFINE_PER_CPU` and `this_cpu_*`):
//! one cache-line-padded slot per CPU slot, each thread writing the slot of
//! its own [`this_slot`], a reader summing them all.
//!
//! A thread is not pinned to a CPU, so the slot is the thread's (handed out
//! round robin at its first use, from [`this_thread_number`]), and two
//! threads may share one when more threads than slots run: writes
//! to a slot are therefore atomic read-modify-writes, which cost a local
//! cache hit while a slot has one writer, and stay correct when it has
//! two. What this buys is that a writer never writes a line another
//! thread's writes keep taking away: the statistics of a write path cost no
//! coherence miss, where one shared counter costs one per write per thread.

use crossbeam_utils::CachePadded;

/// Slots per [`PerCpu`]: as many threads as this write to slots of their
/// own. Two under loom, whose models run two or three threads.
pub(crate) const SLOTS: usize = if cfg!(loom) { 2 } else { 16 };

/// The calling thread's number, the one source of every per-thread slot,
/// shard, stripe and arena of the crate (as a CPU's number is in Linux,
/// `raw_smp_processor_id`, or a per-mm concurrency id): the lowest number
/// no other live thread holds, taken at the thread's first call and given
/// back when it exits, so that threads alive together hold different
/// numbers and a user that takes the number modulo its count of slots
/// gives up to that many live threads a slot each. `None` while the thread
/// is being torn down (its thread-locals may be gone already).
///
/// The only shared write is the number table's lock, at a thread's first
/// call and at its exit, never per call. A hint only (which line a count
/// lands on, which free list is tried first, where a search starts), so
/// plain `std` state, under loom too: a loom model's threads share one OS
/// thread, and so one number ([`this_slot`] is loom's where a model needs a
/// slot per thread).
#[inline]
pub(crate) fn this_thread_number() -> Option<usize> {
    number::current()
}

/// Thread numbers: the lowest free one at a thread's first use, given back
/// at its exit.
mod number {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    /// Numbers given back by exited threads, and the next never used one.
    static NUMBERS: Mutex<Numbers> = Mutex::new(Numbers { freed: BTreeSet::new(), next: 0 });

    struct Numbers {
        freed: BTreeSet<usize>,
        next: usize,
    }

    /// The number a thread holds, given back when the thread-local is dropped.
    struct Held(usize);

    impl Held {
        fn take() -> Held {
            let mut numbers = NUMBERS.lock().unwrap_or_else(|e| e.into_inner());
            let n = match numbers.freed.pop_first() {
                Some(n) => n,
                None => {
                    numbers.next += 1;
                    numbers.next - 1
                }
            };
            Held(n)
        }
    }

    impl Drop for Held {
        fn drop(&mut self) {
            NUMBERS.lock().unwrap_or_else(|e| e.into_inner()).freed.insert(self.0);
        }
    }

    std::thread_local! {
        static NUMBER: Held = Held::take();
    }

    pub(super) fn current() -> Option<usize> {
        NUMBER.try_with(|h| h.0).ok()
    }
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

// Under loom the model's threads share one OS thread: loom's thread locals
// give each its own slot, as the protocols built on the slots assume.
#[cfg(loom)]
loom::thread_local! {
    static SLOT: usize = next_slot();
}

/// The calling thread's slot, below [`SLOTS`]: its
/// [`this_thread_number`] modulo [`SLOTS`]; slot 0 once the thread's
/// locals are being destroyed (a VMA dropped by an epoch collection at
/// thread exit still counts, in slot 0).
#[cfg(not(loom))]
#[inline]
pub(crate) fn this_slot() -> usize {
    this_thread_number().unwrap_or(0) % SLOTS
}

/// The calling thread's slot, below [`SLOTS`]: under loom, the model
/// thread's own ([`restart_slots`]).
#[cfg(loom)]
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

    /// Every slot, held alone (a teardown).
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().map(|s| &mut **s)
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

    /// A thread keeps its number, threads alive together hold different
    /// ones, a thread's slot is its number modulo [`SLOTS`], and an exited
    /// thread's number is taken again (by the lowest-first rule, some
    /// thread's number is at most the count of threads alive then).
    #[test]
    fn threads_alive_together_hold_different_numbers_and_exited_ones_are_reused() {
        let mine = this_thread_number().unwrap();
        assert_eq!(this_thread_number(), Some(mine));
        assert_eq!(this_slot(), mine % SLOTS);
        let barrier = std::sync::Barrier::new(4);
        let numbers: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let n = this_thread_number().unwrap();
                        assert_eq!(this_slot(), n % SLOTS);
                        barrier.wait(); // all four alive at once
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all = numbers.clone();
        all.push(mine);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{numbers:?} and {mine}");
        // Many threads one after the other: each takes a number an exited
        // one gave back, so the numbers stay bounded by the threads alive
        // at once (this test's and the test harness's), not the threads made.
        let most = (0..256).map(|_| std::thread::spawn(|| this_thread_number().unwrap()).join().unwrap()).max();
        assert!(most.unwrap() < 256, "numbers are not reused: {most:?}");
    }
}
