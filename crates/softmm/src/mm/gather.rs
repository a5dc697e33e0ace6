//! `mmu_gather`: what leaves the page tables during an unmap is held here
//! until the TLB shootdown says no CPU can reach it any more.

use crate::pgtable::DetachedTable;
use crate::phys::Pfn;

use super::AddressSpace;

/// Frames and page tables removed from an address space, to be released only
/// after its TLB is flushed. Dropping it without [`MmuGather::finish`] leaks
/// the references, which the leak tests catch.
#[must_use = "call finish() to flush the TLB and free what was unmapped"]
#[derive(Default)]
pub(crate) struct MmuGather {
    pub(crate) frames: Vec<Pfn>,
    pub(crate) tables: Vec<DetachedTable>,
    /// A translation was removed or narrowed: a shootdown is needed even if
    /// nothing is freed (e.g. mprotect to read-only).
    pub(crate) need_flush: bool,
}

impl MmuGather {
    /// Flushes `mm`'s TLBs if anything changed, then drops the frame
    /// references and schedules the tables for freeing after a grace period.
    pub(crate) fn finish(self, mm: &AddressSpace) {
        if self.need_flush || !self.frames.is_empty() || !self.tables.is_empty() {
            mm.flush_tlb();
        }
        for pfn in self.frames {
            mm.phys.put(pfn);
        }
        if !self.tables.is_empty() {
            let guard = crossbeam_epoch::pin();
            for t in self.tables {
                t.free_after_grace_period(&mm.phys, &guard);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::tlb::FlushTicket;
    use crate::uapi::*;
    use crate::{Cpu, MmConfig, PhysConfig, PhysMem, PAGE_SIZE};

    /// `flush_tlb_begin` on two address spaces, then both waits: each CPU of
    /// another thread gets its request, and each wait ends once its CPU
    /// acknowledged.
    #[test]
    fn flushes_of_two_address_spaces_begin_then_wait() {
        let phys = PhysMem::new(PhysConfig { bytes: 1 << 20, nodes: 1 }).unwrap();
        let mms = [
            AddressSpace::new(&phys, MmConfig::default()).unwrap(),
            AddressSpace::new(&phys, MmConfig::default()).unwrap(),
        ];
        let addrs: Vec<u64> = mms
            .iter()
            .map(|mm| mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap())
            .collect();
        let (ready_tx, ready) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel::<()>();
        let remote = {
            let mms = mms.clone();
            let addrs = addrs.clone();
            std::thread::spawn(move || {
                // Two running CPUs on one thread: each access acknowledges
                // whatever shootdown its address space began.
                let mut cpus = [Cpu::attached(&mms[0]), Cpu::attached(&mms[1])];
                for (c, &a) in cpus.iter_mut().zip(&addrs) {
                    c.write_u8(a, 1).unwrap();
                }
                ready_tx.send(()).unwrap();
                while stop_rx.try_recv().is_err() {
                    for (c, &a) in cpus.iter_mut().zip(&addrs) {
                        assert_eq!(c.read_u8(a).unwrap(), 1);
                    }
                    std::thread::yield_now();
                }
            })
        };
        ready.recv().unwrap();
        let tickets = [mms[0].flush_tlb_begin(), mms[1].flush_tlb_begin()];
        tickets.into_iter().for_each(FlushTicket::wait);
        for mm in &mms {
            let s = mm.stats().tlb;
            assert_eq!((s.flushes, s.flush_requests), (1, 1), "{s:?}");
        }
        stop.send(()).unwrap();
        remote.join().unwrap();
        drop(mms);
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
    }
}
