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

use super::broken::rcu as broken;
use super::shared_write::Reclaiming;
use super::{AtomicU64, Ordering};
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

/// Who runs the frees a writer defers (`WriterPolicy` chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaimer {
    /// Whichever thread's collection comes first ([`defer_destroy`]).
    AnyThread,
    /// As `AnyThread`, and the writer flushes its bag to the global queue
    /// and collects after it publishes ([`Guard::flush`]): it runs what
    /// has expired by then, its own and others'.
    Flush,
    /// The writer's own thread ([`defer_destroy_own`], [`end_batch`],
    /// [`reclaim_own`]).
    ThisThread,
}

impl Reclaimer {
    /// Destroys `old` once every guard pinned now is gone, on the thread
    /// this reclaimer names.
    ///
    /// # Safety
    ///
    /// As [`defer_destroy`].
    pub(crate) unsafe fn defer_destroy<T>(self, guard: &Guard, old: Shared<'_, T>) {
        match self {
            // SAFETY: the caller's contract is the callee's.
            Reclaimer::AnyThread | Reclaimer::Flush => unsafe { defer_destroy(guard, old) },
            // SAFETY: as above.
            Reclaimer::ThisThread => unsafe { defer_destroy_own(guard, old) },
        }
    }

    /// Ends a write section's deferrals: under `Flush`, flushes and
    /// collects. (Under `ThisThread` the writer calls [`end_batch`] and
    /// [`reclaim_own`] once its lock is released.)
    pub(crate) fn end_section(self, guard: &Guard) {
        if self == Reclaimer::Flush {
            guard.flush();
        }
    }
}

/// A free queued on its thread's own list.
struct Garbage {
    ptr: *mut (),
    free: unsafe fn(*mut ()),
}

impl Garbage {
    fn new<T>(old: Box<T>) -> Garbage {
        /// Frees a box made by [`Garbage::new`] for `T`.
        unsafe fn free<T>(p: *mut ()) {
            // SAFETY: `p` came from `Box::<T>::into_raw` in `Garbage::new`,
            // and `Garbage::free` runs this once.
            drop(unsafe { Box::from_raw(p.cast::<T>()) });
        }
        Garbage { ptr: Box::into_raw(old).cast(), free: free::<T> }
    }

    /// Runs the free, counted as reclaim.
    fn free(self) {
        let _reclaiming = Reclaiming::enter();
        // SAFETY: `ptr` and `free` were made together in `Garbage::new`,
        // and `self` is consumed, so the box is freed once.
        unsafe { (self.free)(self.ptr) }
    }
}

/// The end of the last batch whose grace period ended, written by the
/// batches' markers (on whichever thread collects) and read by the owner.
/// On lines of its own: the markers write it, the owner's CPU reads it.
type Done = crossbeam_utils::CachePadded<AtomicU64>;

/// A thread's own RCU callbacks, Linux's per-CPU callback list
/// (`rcu_data::cblist` and `rcu_do_batch`): frees queued by
/// [`defer_destroy_own`] and run by the same thread ([`reclaim_own`]).
///
/// # Protocol
///
/// * The owner queues each free tagged with its open batch's number,
///   after the object was unlinked from every shared location.
/// * [`end_batch`] closes the open batch unless the last batch closed is
///   still waiting for its grace period (then the open one waits for the
///   next, as Linux's `RCU_NEXT_TAIL` segment does): it defers one marker
///   through the collector, `done.fetch_max(batch, Release)`, flushes it
///   to the global queue, and opens the next batch. The collector runs the
///   marker, on whichever thread collects, once every guard pinned before
///   the marker was deferred is gone; every free of the batch was unlinked
///   before that (program order on the owner), so no guard pinned since
///   can reach them and every guard that could is gone.
/// * [`reclaim_own`] loads `done` (Acquire, pairing with the marker's
///   Release) and frees, oldest first, each queued free of a batch at or
///   below it: the free happens after the marker ran, which happens after
///   the last guard that could reach the object was dropped.
/// * A collecting thread that runs a marker writes `done` and the count
///   of the `Arc` holding it, once per grace period of the owner's, instead
///   of freeing the owner's objects (their reference counts, their
///   allocator's lines).
/// * A thread that exits, or calls [`hand_over_own`], frees what has
///   expired and hands the rest to the collector as one deferred function
///   ([`defer_destroy`]'s way): Linux's callback migration off a CPU
///   going offline.
struct OwnCallbacks {
    /// The batch that frees queued now join.
    open: u64,
    /// How many frees joined `open` since it was opened.
    open_frees: usize,
    done: std::sync::Arc<Done>,
    /// Each queued free with its batch, oldest first.
    queue: std::collections::VecDeque<(u64, Garbage)>,
}

impl Default for OwnCallbacks {
    fn default() -> OwnCallbacks {
        OwnCallbacks {
            open: 1,
            open_frees: 0,
            done: std::sync::Arc::new(Done::new(AtomicU64::new(0))),
            queue: std::collections::VecDeque::new(),
        }
    }
}

impl OwnCallbacks {
    /// Hands the queued frees over: runs those whose grace period has
    /// ended and defers the rest, as one function, through the collector
    /// (`defer_destroy`'s way), which runs it once every guard pinned now
    /// is gone. Leaves the list empty.
    fn hand_over(queue: &mut std::collections::VecDeque<(u64, Garbage)>, done: u64) {
        while queue.front().is_some_and(|(b, _)| *b <= done) {
            let (_, g) = queue.pop_front().expect("checked");
            g.free();
        }
        if queue.is_empty() {
            return;
        }
        let rest = std::mem::take(queue);
        let guard = crossbeam_epoch::pin();
        // SAFETY: each free was unlinked before now and waits, as the
        // markers would have, for every guard pinned now; the pointers are
        // the queue's own (`Garbage` is not `Send` only because it holds a
        // raw pointer, freed once, on one thread).
        unsafe {
            guard.defer_unchecked(move || {
                for (_, g) in rest {
                    g.free();
                }
            })
        };
    }
}

impl Drop for OwnCallbacks {
    /// A thread that exits with frees queued hands them over
    /// ([`hand_over_own`]'s way).
    fn drop(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        // loom drops a model thread's locals in no fixed order (a hash
        // map's), after the model's lazy statics for its first thread: a
        // hand-over here would pin through crossbeam's own thread-local or
        // its collector while they may be gone, and an execution would
        // differ from its replay. A model's thread hands its list over
        // where its work ends instead (`sync::model`); leaking it would
        // leak the arenas its VMAs hold.
        if cfg!(loom) {
            if !std::thread::panicking() {
                panic!(
                    "a loom model thread exited with {} RCU callbacks queued: spawn and check models \
                     through `sync::model`, which hand a thread's list over where its work ends",
                    self.queue.len()
                );
            }
            std::mem::forget(std::mem::take(&mut self.queue));
            return;
        }
        let done = self.done.load(Ordering::Acquire);
        OwnCallbacks::hand_over(&mut self.queue, done);
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static OWN: std::cell::RefCell<OwnCallbacks> = std::cell::RefCell::default();
}

#[cfg(loom)]
loom::thread_local! {
    static OWN: std::cell::RefCell<OwnCallbacks> = std::cell::RefCell::default();
}

/// Destroys `old` on the calling thread once every guard pinned before the
/// next [`end_batch`] of this thread is gone: at a [`reclaim_own`] of this
/// thread after that (or, at its exit, by the collector).
///
/// # Safety
///
/// As [`defer_destroy`]: `old` is unreachable from every shared location,
/// and nothing else destroys it.
pub(crate) unsafe fn defer_destroy_own<T>(guard: &Guard, old: Shared<'_, T>) {
    // SAFETY: the caller's contract: `old` is ours to destroy.
    let mut g = Some(Garbage::new(unsafe { old.into_owned() }.into_box()));
    let _ = OWN.try_with(|own| {
        let mut own = own.borrow_mut();
        let b = own.open;
        own.open_frees += 1;
        own.queue.push_back((b, g.take().expect("once")));
    });
    if let Some(g) = g {
        // The thread is exiting and its list is gone: the collector's way.
        // SAFETY: as in `OwnCallbacks::drop`.
        unsafe { guard.defer_unchecked(move || g.free()) };
    }
}

/// Frees an open batch gathers before a write section closes it
/// ([`end_batch`]). Closing a batch pushes the thread's epoch bag to the
/// collector's global queue and collects, which reads the epoch of every
/// thread of the process: closed at every write section (two frees under
/// `mmap1`), that was 10-20 % of a writer's CPU once two address spaces
/// wrote at once, and the part of a writer's cost that grows with the
/// threads of the process. Linux's `call_rcu` likewise only appends to
/// the CPU's list, and a grace period serves every callback queued
/// before it began. What the batch holds meanwhile is the writer's old
/// window versions, which no caller can observe (the architecture doc's
/// "Who frees a writer's garbage"); [`PhysMem::quiesce`] closes the batch
/// whatever it holds ([`end_batch_now`]), and so does the loom model of
/// this protocol. The other models, whose threads queue fewer frees, hand
/// them over where each thread's work ends (`sync::model`), as a thread's
/// exit does.
///
/// [`PhysMem::quiesce`]: crate::PhysMem::quiesce
const BATCH_FREES: usize = 32;

/// Closes the calling thread's open batch of [`defer_destroy_own`] frees
/// once it holds [`BATCH_FREES`] frees, unless the batch closed before it
/// still waits for its grace period: its marker runs once every guard
/// pinned now is gone. Call it with no lock held (it flushes the thread's
/// epoch bag, which collects).
pub(crate) fn end_batch() {
    close_batch(BATCH_FREES);
}

/// [`end_batch`] whatever the open batch holds (at least one free).
pub(crate) fn end_batch_now() {
    close_batch(1);
}

fn close_batch(min_frees: usize) {
    let _ = OWN.try_with(|own| {
        let mut own = own.borrow_mut();
        if own.open_frees < min_frees || own.done.load(Ordering::Acquire) + 1 < own.open {
            return;
        }
        let (b, done, owner) = (own.open, own.done.clone(), counting_slot());
        own.open += 1;
        own.open_frees = 0;
        drop(own);
        let guard = crossbeam_epoch::pin();
        call_rcu(&guard, move || {
            done.fetch_max(b, Ordering::Release);
            if counting_slot() != owner {
                // `done`, and the count of the `Arc` that holds it: the
                // owner's lines, written by another thread's collection.
                super::shared_write(2);
            }
        });
        // To the global queue now: the thread's bag may not fill for long,
        // and the marker's grace period starts only there.
        guard.flush();
    });
}

/// The slot a marker's shared writes are counted against. Not under loom,
/// where a marker may run while a model thread's locals are being
/// destroyed (crossbeam's `Local::finalize`), and a first use of the
/// slot's loom thread-local there is not deterministic; the count is
/// statistics only.
#[inline]
fn counting_slot() -> usize {
    #[cfg(loom)]
    return 0;
    #[cfg(not(loom))]
    super::percpu::this_slot()
}

/// Hands the calling thread's queued frees over, as Linux hands an
/// offlined CPU's callbacks to a live CPU (`rcutree_migrate_callbacks`):
/// runs those whose grace period has ended and defers the rest through
/// the collector, which runs them once every guard pinned now is gone.
/// What a thread that exits does from its locals' destructor; a loom
/// model's thread calls it where its work ends (`sync::model`), since
/// loom cannot replay a destructor that pins. Call it with no lock held.
#[cfg(all(test, loom))]
pub(crate) fn hand_over_own() {
    let taken = OWN.try_with(|own| {
        let mut own = own.borrow_mut();
        own.open_frees = 0;
        if own.queue.is_empty() {
            return None;
        }
        Some((std::mem::take(&mut own.queue), own.done.load(Ordering::Acquire)))
    });
    // The frees run with the list not borrowed.
    if let Ok(Some((mut queue, done))) = taken {
        OwnCallbacks::hand_over(&mut queue, done);
    }
}

/// How many frees the calling thread has queued and not yet run.
#[cfg(all(test, loom))]
pub(crate) fn own_queued() -> usize {
    OWN.with(|own| own.borrow().queue.len())
}

/// One pass of everything the calling thread can do towards running the
/// frees waiting for a grace period, its own and its epoch bag's: closes
/// its open batch whatever it holds, flushes its epoch bag (a collection,
/// which advances the epoch and runs what is due), and runs its own frees
/// whose grace period ended. What `PhysMem::quiesce` repeats until nothing
/// is left; call it with no lock held.
pub(crate) fn reclaim_now() {
    end_batch_now();
    crossbeam_epoch::pin().flush();
    reclaim_own();
}

/// Runs the calling thread's queued frees whose batch's grace period has
/// ended, oldest first; returns how many. Call it with no lock held: a
/// free drops the last references of what it frees.
pub(crate) fn reclaim_own() -> usize {
    let mut n = 0;
    loop {
        // One free at a time, the list not borrowed while it runs.
        let next = OWN.try_with(|own| {
            let mut own = own.borrow_mut();
            let done = own.done.load(Ordering::Acquire);
            let done = if broken::free_without_grace_period() { u64::MAX } else { done };
            if own.queue.front().is_some_and(|(b, _)| *b <= done) {
                own.queue.pop_front().map(|(_, g)| g)
            } else {
                None
            }
        });
        match next {
            Ok(Some(g)) => {
                g.free();
                n += 1;
            }
            _ => return n,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crossbeam_epoch::Owned;

    /// Closes a batch (a marker deferred and the bag flushed, which
    /// collects) per `BATCH_FREES` frees, not per write section: a
    /// writer's cost must not include a global collection per section.
    /// Seen failing with a close at every section (`BATCH_FREES` 1): 251
    /// batches for 256 sections of two frees.
    #[test]
    fn a_writer_closes_a_batch_per_batch_of_frees_not_per_section() {
        let (sections, per_section) = (256, 2);
        let before = OWN.with(|o| o.borrow().open);
        for _ in 0..sections {
            let guard = crossbeam_epoch::pin();
            for _ in 0..per_section {
                let old = Owned::new(0u64).into_shared(&guard);
                // SAFETY: `old` was never shared; only this call frees it.
                unsafe { defer_destroy_own(&guard, old) };
            }
            drop(guard);
            // Grace periods end as fast as they can: each collection
            // advances the epoch (a busy process collects often).
            crossbeam_epoch::pin().flush();
            // What `AddressSpace::after_write_section` runs.
            end_batch();
            reclaim_own();
        }
        let closed = OWN.with(|o| o.borrow().open) - before;
        // One close per 16 sections at 32 frees a batch; a close per
        // section whose batch before it had ended is what this forbids.
        let most = sections as u64 / 8;
        assert!(closed <= most, "{closed} batches closed for {sections} sections, at most {most} expected");
        // `quiesce`'s way: whatever the open batch holds is closed, and
        // every free runs once its grace period ends.
        for _ in 0..10_000 {
            reclaim_now();
            if OWN.with(|o| o.borrow().queue.is_empty()) {
                return;
            }
        }
        panic!("{} frees still queued", OWN.with(|o| o.borrow().queue.len()));
    }
}
