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

use super::broken;

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

/// Under loom, restarts the slots' round robin: called first in every
/// model's execution (`sync::model::Builder::check`), it gives the thread
/// that counts first slot 0 and the next one slot 1, so that the model's
/// two threads count in slots of their own, the same in every replay.
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

/// Numbers handed out per CPU slot in batches, as Linux's `get_next_ino`
/// numbers inodes: a slot takes [`PercpuIds::BATCH`] numbers at a time from
/// the one shared counter and hands them out from its own line, so a
/// caller writes the shared line once per batch. Unique, never zero, and
/// not in order across slots (a batch taken by a caller that loses its
/// slot's race is dropped: numbers are only ever skipped).
#[derive(Default)]
pub(crate) struct PercpuIds {
    /// The start of the next batch.
    shared: CachePadded<crate::sync::AtomicU64>,
    /// Per slot, the last number it handed out; a multiple of `BATCH`
    /// (zero at first) when its batch is used up.
    last: PerCpu<crate::sync::AtomicU64>,
}

impl PercpuIds {
    /// Numbers per batch (Linux's `LAST_INO_BATCH`).
    pub(crate) const BATCH: u64 = 1024;

    /// A number no other call has returned, from the calling thread's
    /// slot.
    pub(crate) fn next(&self) -> u64 {
        self.next_from(self.last.mine())
    }

    /// [`Self::next`] from `slot`, one of `self.last`, which other threads
    /// may be taking from at once. Relaxed: the number is unique by the
    /// atomicity of the slot's compare-exchange and of the shared counter's
    /// add, and orders nothing else. The loop retries only when another
    /// thread of the slot took a number meanwhile (no lock held).
    fn next_from(&self, slot: &crate::sync::AtomicU64) -> u64 {
        use crate::sync::Ordering::Relaxed;
        let mut last = slot.load(Relaxed);
        loop {
            let base = if last % Self::BATCH == 0 {
                crate::sync::shared_write(1);
                self.shared.fetch_add(Self::BATCH, Relaxed)
            } else {
                last
            };
            // A batch from `base` hands out `base + 1 ..= base + BATCH`:
            // never zero, and never another batch's.
            let id = base + 1;
            if broken::percpu_ids::store_without_compare() {
                slot.store(id, Relaxed);
                return id;
            }
            match slot.compare_exchange_weak(last, id, Relaxed, Relaxed) {
                Ok(_) => return id,
                Err(now) => last = now,
            }
        }
    }
}

/// Two threads of one slot take numbers at once, across a batch's end:
/// every number differs. Seen failing with the slot stored without the
/// compare-exchange (`broken::percpu_ids::STORE_WITHOUT_COMPARE`): both
/// threads return the number after the one they loaded.
#[cfg(all(test, loom))]
#[test]
fn two_threads_of_one_slot_take_different_numbers() {
    fn model() -> Result<(), String> {
        use crate::sync::Ordering::Relaxed;
        let ids = std::sync::Arc::new(PercpuIds::default());
        // One number left in slot 0's batch: the second call of the two
        // threads takes a new batch.
        ids.last.slots[0].store(PercpuIds::BATCH - 1, Relaxed);
        ids.shared.store(PercpuIds::BATCH, Relaxed);
        let t = {
            let ids = ids.clone();
            crate::sync::model::spawn(move || [ids.next_from(&ids.last.slots[0]), ids.next_from(&ids.last.slots[0])])
        };
        let mine = [ids.next_from(&ids.last.slots[0]), ids.next_from(&ids.last.slots[0])];
        let theirs = t.join().unwrap();
        let mut all = [mine, theirs].concat();
        all.sort_unstable();
        match all.windows(2).all(|w| w[0] != w[1]) && all[0] != 0 {
            true => Ok(()),
            false => Err(format!("two calls returned one number: {all:?}")),
        }
    }
    broken::check_model(model, &broken::percpu_ids::STORE_WITHOUT_COMPARE);
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

    /// Threads two to a slot, each taking numbers across several batches'
    /// ends: every number differs from every other and none is zero.
    #[test]
    // 98,304 calls and no `unsafe`: nothing for Miri but time.
    #[cfg_attr(miri, ignore)]
    fn per_cpu_numbers_are_unique_across_threads_sharing_slots() {
        let ids: std::sync::Arc<PercpuIds> = Default::default();
        let per_thread = 3 * PercpuIds::BATCH as usize;
        let threads: Vec<_> = (0..2 * SLOTS)
            .map(|_| {
                let ids = ids.clone();
                std::thread::spawn(move || (0..per_thread).map(|_| ids.next()).collect::<Vec<u64>>())
            })
            .collect();
        let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n, "a number was handed out twice");
        assert_ne!(all[0], 0);
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
