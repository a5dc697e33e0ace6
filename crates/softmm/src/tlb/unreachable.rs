//! Ranges a lock-free unmap has made unreachable: no TLB fill creates a
//! translation inside one, so the unmap shoots the range down once, right
//! after its detach, and frees every later gather without another
//! shootdown (`sys/munmap.rs`, "One shootdown per lock-free unmap").
//!
//! Why that is enough: a TLB entry is the only translation in softmm that
//! holds no frame reference (a `with_slice` slice, a pin, `access_remote`
//! and gup-fast each take one; gup-fast re-reads the entry after taking
//! it), and entries are made only by a CPU's walk on a TLB miss
//! (`Cpu::translate_slow`), which looks here first and walks nothing in an
//! unreachable range (it faults instead, and the fault finds no VMA). A
//! walk does not consult the VMAs, so without this a CPU running during
//! the zap could cache an entry the zap has not cleared yet, after the
//! unmap's shootdown, and keep it past the free of its frame.
//!
//! The order that makes the one shootdown cover the whole range: the unmap
//! publishes the range here, then begins its shootdown (flush requests
//! bumped and marked, barrier); a CPU enters an access section (`inside`,
//! barrier), loads its pending mark, and on a miss loads this list. As with
//! the requests (`tlb/mod.rs`), either the shootdown sees the CPU inside
//! that section and waits for its end (entries it filled there are dropped
//! at its next section, which sees the request), or the section sees the
//! request and this list, and fills nothing in the range. After the wait,
//! no CPU holds or can make a translation into the range.

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use crate::sync::{Mutex, Ordering};

/// The unreachable ranges of one address space: an epoch-protected,
/// immutable list read by every TLB miss, null (one load) when there is
/// none, replaced whole by [`UnreachableRanges::add`] and
/// [`UnreachableRanges::remove`].
pub(crate) struct UnreachableRanges {
    /// `[start, end)` pairs; null when empty.
    pub(crate) list: Atomic<Vec<(u64, u64)>>,
    /// Serializes the replacements (a few per large unmap). Padded: every
    /// TLB miss reads `list`, and a lock-free unmap locks this while other
    /// CPUs fill.
    pub(crate) write: crossbeam_utils::CachePadded<Mutex<()>>,
}

impl Default for UnreachableRanges {
    fn default() -> Self {
        UnreachableRanges { list: Atomic::null(), write: crossbeam_utils::CachePadded::new(Mutex::new(())) }
    }
}

impl UnreachableRanges {
    /// True if `va` lies in an unreachable range: a TLB fill must not walk
    /// it. Called on every TLB miss, inside the access section.
    #[inline]
    pub(crate) fn contains(&self, va: u64, guard: &Guard) -> bool {
        // Acquire: pairs with the Release in `replace`, so the list's
        // contents are visible. Ordering against the unmap's shootdown is
        // the section barrier's (module docs).
        let p = self.list.load(Ordering::Acquire, guard);
        // SAFETY: a non-null list is freed only after every guard that
        // could have loaded it is dropped (`replace` defers it).
        match unsafe { p.as_ref() } {
            None => false,
            Some(list) => list.iter().any(|&(s, e)| s <= va && va < e),
        }
    }

    /// Makes `[start, end)` unreachable. The caller then begins a
    /// shootdown: only once it has been waited for does the range hold no
    /// translation on any CPU.
    pub(crate) fn add(&self, start: u64, end: u64) {
        self.replace(|list| list.push((start, end)));
    }

    /// Ends [`UnreachableRanges::add`]'s `[start, end)` (one entry). Call it
    /// only once the range has no present entry left, and before a mapping
    /// can be placed there again.
    pub(crate) fn remove(&self, start: u64, end: u64) {
        self.replace(|list| {
            if let Some(i) = list.iter().position(|&r| r == (start, end)) {
                list.swap_remove(i);
            }
        });
    }

    fn replace(&self, change: impl FnOnce(&mut Vec<(u64, u64)>)) {
        let _w = self.write.lock();
        // The mutex (lock and unlock) and the list pointer every fill reads.
        crate::sync::shared_write(3);
        let guard = crossbeam_epoch::pin();
        // Relaxed: replacements are serialized by `write`.
        let cur = self.list.load(Ordering::Relaxed, &guard);
        // SAFETY: as in `contains`; `write` keeps it from being replaced.
        let mut list = unsafe { cur.as_ref() }.cloned().unwrap_or_default();
        change(&mut list);
        let new = if list.is_empty() { Shared::null() } else { Owned::new(list).into_shared(&guard) };
        // Release: the new list's contents before its pointer.
        let old = self.list.swap(new, Ordering::Release, &guard);
        if !old.is_null() {
            // SAFETY: `old` is unreachable from `list` now; readers that
            // loaded it hold a guard the destruction waits for.
            unsafe { crate::sync::rcu::defer_destroy(&guard, old) };
        }
    }
}

impl Drop for UnreachableRanges {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer is left to protect.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        let p = self.list.load(Ordering::Relaxed, guard);
        if !p.is_null() {
            // SAFETY: owned by this list alone (see above).
            drop(unsafe { p.into_owned() });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn ranges_come_and_go() {
        let u = UnreachableRanges::default();
        let g = crossbeam_epoch::pin();
        assert!(!u.contains(0x1000, &g));
        u.add(0x1000, 0x3000);
        u.add(0x8000, 0x9000);
        assert!(u.contains(0x1000, &g) && u.contains(0x2fff, &g) && u.contains(0x8000, &g));
        assert!(!u.contains(0x3000, &g) && !u.contains(0xfff, &g) && !u.contains(0x9000, &g));
        u.remove(0x1000, 0x3000);
        assert!(!u.contains(0x1000, &g) && u.contains(0x8000, &g));
        u.remove(0x8000, 0x9000);
        assert!(!u.contains(0x8000, &g));
        u.add(0x1000, 0x2000); // dropped while non-empty: freed, not leaked (Miri)
    }
}
