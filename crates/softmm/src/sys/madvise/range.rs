//! `madvise` as a range writer: the advice that changes VMA flags
//! (`MADV_NORMAL`, `RANDOM`, `SEQUENTIAL`, `DONTFORK`, `DOFORK`,
//! `WIPEONFORK`, `KEEPONFORK`, `DONTDUMP`, `DODUMP`, `HUGEPAGE`,
//! `NOHUGEPAGE`, `MERGEABLE`, `UNMERGEABLE`), which splits and merges VMAs
//! as `mprotect` does, runs the `mmap_lock` path's own code
//! ([`AddressSpace::madvise_vma_behavior`]) on the window's view.
//!
//! `MADV_DONTNEED`, `DONTNEED_LOCKED` and `FREE` change no VMA and never
//! take `mmap_lock` for write: under `MadvisePolicy::PerVma` (the default)
//! a call inside one VMA runs under that VMA's read reference, beside range
//! writers of every window; the rest take `mmap_lock` for read, as Linux
//! does. Every other advice keeps its `mmap_lock` path.

use crate::error::Result;

use crate::mm::range::Neighbours;
use crate::mm::AddressSpace;

impl AddressSpace {
    /// A VMA-flag `madvise` of `[start, end)` as a range writer, or `None`
    /// (nothing changed) for the `mmap_lock` path: also when a VMA in the
    /// range is one a range writer may not change (see the module of
    /// `mm/range.rs`) or touches its window's bounds, where it could merge
    /// with a VMA of the next window.
    pub(crate) fn range_madvise_behavior(&self, start: u64, end: u64, advice: i32) -> Option<Result<()>> {
        if !self.config.writer_policy.range_writers() {
            return None;
        }
        let res = self.range_write_span(start, end, Neighbours::default(), |mm, st, _tlb| {
            if !mm.range_touch_ok(st, start, end) {
                return None;
            }
            Some(mm.madvise_vma_behavior(st, start, end, advice))
        });
        self.range_count_fallback(res.is_none());
        res
    }
}
