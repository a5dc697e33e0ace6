//! `mmu_gather`: what leaves the page tables during an unmap is held here
//! until the TLB shootdown says no CPU can reach it any more.

use crate::pgtable::DetachedTable;
use crate::phys::{FrameRef, Pfn};

use super::AddressSpace;

/// Frames and page tables removed from an address space, to be released only
/// after its TLB is flushed. Dropping it without [`MmuGather::finish`] leaks
/// the references, which the leak tests catch.
#[must_use = "call finish() to flush the TLB and free what was unmapped"]
#[derive(Default)]
pub(crate) struct MmuGather {
    /// Frame references taken out of entries, owned by the gather.
    frames: Vec<Pfn>,
    pub(crate) tables: Vec<DetachedTable>,
    /// A translation was removed or narrowed: a shootdown is needed even if
    /// nothing is freed (e.g. mprotect to read-only).
    pub(crate) need_flush: bool,
}

impl MmuGather {
    /// Takes over the reference an entry held on `frame`, to be put after
    /// the flush.
    #[inline]
    pub(crate) fn add_frame(&mut self, frame: FrameRef<'_>) {
        self.frames.push(frame.into_raw());
    }

    /// Flushes `mm`'s TLBs if anything changed, then drops the frame
    /// references and schedules the tables for freeing after a grace period.
    pub(crate) fn finish(self, mm: &AddressSpace) {
        if self.need_flush || !self.frames.is_empty() || !self.tables.is_empty() {
            mm.flush_tlb();
        }
        for pfn in self.frames {
            // The reference `add_frame` took over; no CPU reaches the frame now.
            drop(FrameRef::from_raw(&mm.phys, pfn));
        }
        if !self.tables.is_empty() {
            let guard = crossbeam_epoch::pin();
            for t in self.tables {
                t.free_after_grace_period(&mm.phys, &guard);
            }
        }
    }
}
