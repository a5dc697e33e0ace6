//! The per-VMA state that lock-free faults validate against.
//!
//! VMAs are immutable: a writer changes one by replacing it in the tree, and
//! *detaches* the old object. Detaching is permanent. Two fault policies use
//! it:
//!
//! * `PerVma` (Linux 6.4's per-VMA lock): a fault takes a read reference
//!   (`try_read`) that fails on a detached VMA; `detach` waits until every
//!   read reference is gone, so no fault works on a VMA a writer has replaced.
//! * `PerVmaSeq`: a fault takes no reference and writes nothing; it checks
//!   `is_detached` under the PTE lock before committing. As with the address
//!   space's sequence count, the writer detaches before it touches any PTE
//!   of the VMA's range, under the PTE lock, so either the fault commits first
//!   and the writer undoes it, or the fault sees the detach and aborts. A
//!   writer changing another VMA never disturbs the fault.
//!
//! Both sides use one atomic word: readers in the low bits, `DETACHED` on top,
//! so every transition is a single read-modify-write and the two sides are
//! ordered by the word's modification order alone.

use crate::sync::{spin_hint, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

const DETACHED: u64 = 1 << 63;

/// Reader count and detached bit of one VMA.
pub struct VmaLock {
    // On a cache line of its own: `per-vma` faults write it twice each, and
    // every fault on the VMA reads the VMA's other fields (Linux aligns its
    // per-VMA lock to a cache line for the same false sharing).
    state: CachePadded<AtomicU64>,
}

impl Default for VmaLock {
    fn default() -> Self {
        Self::new()
    }
}

impl VmaLock {
    /// Attached, no reader.
    pub fn new() -> VmaLock {
        VmaLock { state: CachePadded::new(AtomicU64::new(0)) }
    }

    /// Takes a read reference unless the VMA is detached.
    #[inline]
    pub fn try_read(&self) -> bool {
        // Acquire pairs with the writer's Release in `detach` only in the
        // failure case; success needs nothing more (the VMA is immutable).
        let old = self.state.fetch_add(1, Ordering::Acquire);
        if old & DETACHED != 0 {
            self.read_unlock();
            return false;
        }
        true
    }

    /// Drops a read reference taken by `try_read`.
    #[inline]
    pub fn read_unlock(&self) {
        // Release: the fault's work is done before the writer stops waiting.
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// True once a writer replaced or removed the VMA.
    #[inline]
    pub fn is_detached(&self) -> bool {
        self.state.load(Ordering::Acquire) & DETACHED != 0
    }

    /// Detaches the VMA and waits for every read reference to be dropped.
    pub fn detach(&self) {
        let mut old = self.state.fetch_or(DETACHED, Ordering::AcqRel);
        let mut i = 0;
        while old & !DETACHED != 0 {
            spin_hint(i);
            i = i.saturating_add(1);
            old = self.state.load(Ordering::Acquire);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn readers_block_detach_and_detach_blocks_readers() {
        let l = std::sync::Arc::new(VmaLock::new());
        assert!(l.try_read());
        let writer = {
            let l = l.clone();
            std::thread::spawn(move || l.detach())
        };
        while !l.is_detached() {
            std::thread::yield_now();
        }
        assert!(!writer.is_finished(), "detach returned while a reader held the VMA");
        assert!(!l.try_read(), "a reader got a detached VMA");
        l.read_unlock();
        writer.join().unwrap();
        assert!(!l.try_read());
    }
}
