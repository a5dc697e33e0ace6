//! The address space's write sequence count (seed 001's `mmap_seq`).
//!
//! Every `mmap_lock` writer makes it odd before changing anything and even
//! after it is done. A speculative fault reads it (even) before looking the
//! VMA up and validates it under the PTE lock before committing. Validation
//! under the PTE lock is what makes the scheme sound: a writer that changes
//! the mapping of an address takes that address's PTE lock after making the
//! count odd (to zap or change the entry), so either the fault's locked
//! section comes first and the writer then undoes the fault's entry, or the
//! writer's comes first and the fault sees the odd or newer count and aborts.

use crate::sync::{AtomicU64, Ordering};

/// A sequence count whose readers never wait: they abort instead.
pub struct SeqCount {
    seq: AtomicU64,
}

impl Default for SeqCount {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqCount {
    /// An even count: no writer.
    pub fn new() -> SeqCount {
        SeqCount { seq: AtomicU64::new(0) }
    }

    /// Starts a write section (callers are serialized by `mmap_lock`).
    #[inline]
    pub fn write_begin(&self) {
        // AcqRel: the odd value is ordered before every change the writer makes.
        let old = self.seq.fetch_add(1, Ordering::AcqRel);
        debug_assert!(old % 2 == 0, "nested write section");
    }

    /// Ends a write section.
    #[inline]
    pub fn write_end(&self) {
        // Release: the writer's changes are visible to whoever sees the even value.
        let old = self.seq.fetch_add(1, Ordering::Release);
        debug_assert!(old % 2 == 1, "write_end without write_begin");
    }

    /// The count at the start of a read section, or `None` while a writer runs.
    #[inline]
    pub fn read_begin(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Acquire);
        (s % 2 == 0).then_some(s)
    }

    /// True if no writer started since `read_begin` returned `start`. Call it
    /// under the PTE lock of the entry about to be committed.
    #[inline]
    pub fn validate(&self, start: u64) -> bool {
        self.seq.load(Ordering::Acquire) == start
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn readers_see_writers() {
        let s = SeqCount::new();
        let start = s.read_begin().unwrap();
        assert!(s.validate(start));
        s.write_begin();
        assert_eq!(s.read_begin(), None);
        assert!(!s.validate(start));
        s.write_end();
        let again = s.read_begin().unwrap();
        assert_ne!(again, start);
    }
}
